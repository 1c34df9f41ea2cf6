/* Swap mode (swap=on|try): what a server that the kernel swaps to must
 * do so as not to deadlock the host (man page, "Swap").
 *
 * The danger: the kernel, short of memory, swaps pages out to this
 * device; to store them the server needs memory; if getting it means
 * reclaiming memory by swapping to this device, nothing moves.  So:
 *
 * - PR_SET_IO_FLUSHER (Linux 5.6, CAP_SYS_RESOURCE): the kernel lets the
 *   process allocate during reclaim without recursing into I/O.  Set in
 *   .get_ready, before nbdkit starts any thread, so every worker thread,
 *   the housekeeper and the process nbdkit forks into the background
 *   inherit it.
 * - oom_score_adj -1000 (CAP_SYS_RESOURCE): the OOM killer picks the
 *   programs whose pages the server holds, not the server.  Set in
 *   .get_ready; a fork inherits it.
 * - mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT): the server's own
 *   pages are never swapped out - onto itself - yet only what it touches
 *   is resident (MCL_FUTURE alone populates every new mapping in full:
 *   thread stacks, malloc arenas).  In .after_fork: memory locks do not
 *   survive fork.  The kernel counts every locked mapping in full against
 *   RLIMIT_MEMLOCK, so it must be unlimited unless the process has
 *   CAP_IPC_LOCK.
 * - SCHED_RR at priority 1 (CAP_SYS_NICE or RLIMIT_RTPRIO): the page
 *   allocator lets a real-time task in process context dip below the min
 *   watermark - by a quarter of it on Linux 6.1 (ALLOC_HARDER), by half
 *   of it from 6.3 (ALLOC_MIN_RESERVE) - which is where the allocations
 *   the server cannot avoid (socket buffers for its replies) must come
 *   from when a spike has taken everything above it.  Set in .get_ready:
 *   threads and the forked server inherit it.
 * - vm.min_free_kbytes of at least 12288: a host setting, warned about.
 * - A reserve sized from the machine (swap_mode_default_reserve),
 *   filled at start and kept by a thread of its own (housekeeper.h,
 *   reserve_always).  The allocator runs resident_only: a write takes
 *   only pages that are resident already, and metadata only from heap
 *   the keeper has made resident (zs_pool_metadata_ready), or fails at
 *   once (EAGAIN, sent as ENOMEM: the kernel keeps the page and tries
 *   again).  The keeper also keeps the whole heap resident with room at
 *   its top (swap_mode_heap_ready) and makes each new thread's stack
 *   resident before its first request (swap_mode_ready_stacks); the
 *   heap is touched at start for the requests' buffers and the
 *   allocator's metadata at the device's size, and the faults taken
 *   inside requests are counted (swap_write_faults: 0 is the target).
 * - A full device lets the machine recover (swap-full.h): the kernel's
 *   OOM killer is asked to act when writes are refused for room while
 *   memory is short.
 * - mem_limit is required: a swap device that grows without bound is how
 *   a host dies.
 *
 * swap=on refuses to start when any of these cannot be had, naming every
 * one that is missing; swap=try warns and goes on with what it got.
 *
 * Without swap=, a server started with nbdkit --swap (mlockall with
 * MCL_FUTURE but not MCL_ONFAULT) is detected in .after_fork from
 * /proc/self/status (VmLck) and switched to MCL_ONFAULT, so the threads
 * and arenas made after it are not populated in full.
 */
#ifndef ZRAM_SWAP_MODE_H
#define ZRAM_SWAP_MODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum swap_mode { SWAP_OFF, SWAP_ON, SWAP_TRY };

/* The swap= parameter: 0, or -1 after nbdkit_error. */
extern int swap_mode_parse (const char *value);
extern enum swap_mode swap_mode;

/* In .config_complete: swap=on|try needs mem_limit. */
extern int swap_mode_check_config (uint64_t mem_limit);

/* In .get_ready: IO flusher, OOM score, and the memory-lock limit.
 * swap=on: -1 (after nbdkit_error naming what is missing) if any of them
 * cannot be had; swap=try: warns.
 */
extern int swap_mode_prepare (void);

/* In .after_fork: lock memory as it is touched (swap=on|try), or switch
 * nbdkit --swap's lock to lock-on-fault.
 */
extern int swap_mode_lock (void);

/* The reserve swap mode keeps when swap_reserve= is not given. */
extern uint64_t swap_mode_default_reserve (uint64_t mem_limit,
                                           uint64_t reserve_unit);

/* After swap_mode_lock, before any connection: the C library's heap for
 * the mode.  swap_mode_heap_settings, before the store's process parts
 * are made: swap=on|try: one arena, requests up to 2 MiB from the heap,
 * never trimmed; otherwise glibc's mmap and trim thresholds fixed at
 * 128 KiB, so that freed memory goes back, and an arena per CPU.
 * swap_mode_prepare_heap, after them (the compression contexts took
 * their own heap already): the heap ready for the requests of every
 * thread, a 128th of RAM within 2 and 8 MiB, touched now, so locked and
 * kept.  Returns the bytes touched.
 */
extern void swap_mode_heap_settings (void);
extern size_t swap_mode_prepare_heap (void);

/* After those, the line saying what was done (reserve_bytes: the
 * populated reserve; prepared_bytes: the table, the contexts and the
 * heap made ready).
 */
extern void swap_mode_report (uint64_t reserve_bytes, uint64_t prepared_bytes);

/* Around each data request in swap mode: start returns the thread's
 * fault count (and, on a thread's first request, touches its stack and
 * notes whether it runs as an IO flusher); done adds the faults taken
 * since to the write (stores: write, trim, zero) or read count.
 */
extern uint64_t swap_mode_request_start (void);
extern void swap_mode_request_done (bool stores, uint64_t start);

/* For the reserve keeper (not the request path), in swap mode:
 *
 * swap_mode_heap_ready: grow the heap's free top, touched (so locked),
 * to at least wanted bytes beyond what other heap users need; returns
 * what it has ready for the allocator's metadata
 * (store_metadata_ready), which may be less when memory is short.
 *
 * swap_mode_ready_stacks: every thread of the process seen for the first
 * time (nbdkit's workers, started when a client connects: long before
 * the memory spike that brings their first swap-out) gets the stack its
 * requests will reach locked and populated, found below where the
 * thread is blocked (/proc/self/task/TID/syscall).  Returns how many it
 * made ready this time; a thread running at the call is tried again at
 * the next.
 */
extern size_t swap_mode_heap_ready (size_t wanted);
extern unsigned swap_mode_ready_stacks (void);

/* What the stats file's swap_* lines and the swap metrics say. */
struct swap_mode_status {
  const char *mode;               /* "off", "on" or "try" */
  int mode_number;                /* 0, 1, 2: the same */
  int64_t locked_bytes;           /* Locked of smaps_rollup */
  int64_t locked_mappings_bytes;  /* VmLck */
  int memory_locked;              /* 1: swap mode locked memory as it is
                                     touched (mlockall MCL_ONFAULT) */
  int realtime_priority;          /* 0: not real-time */
  int io_flusher;                 /* 1: swap mode made the server an IO
                                     flusher at start (its threads
                                     inherit it) */
  int io_flusher_worker;          /* 1, 0, or -1 before a write */
  int oom_score_adj;
  uint64_t write_faults;          /* page faults inside stores, ever */
  uint64_t read_faults;           /* page faults inside reads, ever */
  uint64_t stacks_ready;          /* threads' stacks made ready, ever */
  uint64_t stack_faults;          /* of the request faults, those of a
                                     first request's stack touch */
};
extern void swap_mode_status (struct swap_mode_status *status);
/* The swap_* lines of the stats file. */
extern void swap_mode_print (const struct swap_mode_status *status, FILE *fp);

#endif /* ZRAM_SWAP_MODE_H */
