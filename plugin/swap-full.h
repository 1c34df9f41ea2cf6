/* A full swap device: letting the machine recover (swap=on|try).
 *
 * The trap: when the pool reaches mem_limit (too small a limit, or data
 * that compresses worse than the device was sized for), every swap-out
 * fails with ENOSPC; when the machine has no memory left to make ready
 * for writes (swap mode takes only resident memory), every swap-out
 * fails as not ready.  The kernel puts a page whose swap-out failed back
 * on its lists as dirty and tries again later; it still sees free slots
 * on the device, so it never decides it is out of memory, and its OOM
 * killer never acts.  The machine spins on failed writes: a livelock,
 * where without swap it would have killed a process and gone on.
 *
 * The answer, as earlyoom and systemd-oomd do it from user space: the
 * server itself watches for the livelock and asks the kernel's own OOM
 * killer to act (sysrq 'f': it picks the victim by oom_score, as it
 * would when out of memory; the server, at oom_score_adj -1000, is never
 * picked).  The victim's swapped pages are freed, the kernel discards
 * them (swapon --discard=pages), the pool has room again, and the
 * machine goes on.  No page already stored is touched.
 *
 * Why the reserve opens then: the victim is often inside the kernel's
 * direct reclaim when it is killed, and stays there until that pass
 * ends - a pass that writes out every dirty page it scans and frees one
 * only when a write succeeds.  With every write refused, the pass scans
 * the whole of the inactive list, twice over, each write a round trip
 * to this server (seen: a 1 GiB guest, 430 MiB of such pages, the
 * victims in reclaim 85 s after the kill, their tmpfs pages - what would
 * have ended the pressure - held until they exit).  So with the kill the
 * data may take the reserve's pages (resident already: nothing more is
 * asked of the machine), the writes it stores free the machine's pages,
 * the pass ends, the victim exits, and the refill closes the reserve
 * once the victim's pages are gone and it is whole again.
 *
 * When: writes have been refused for lack of room for at least
 * SWAP_FULL_AFTER_MS with no pause longer than SWAP_FULL_PAUSE_MS, and
 * the machine is short of memory (MemAvailable below twice
 * vm.min_free_kbytes, or a thirty-second of RAM, whichever is more).  A
 * full device on a machine with memory to spare is no livelock (the
 * kernel keeps the pages in RAM and reclaims elsewhere): nothing is
 * killed.  After a kill, SWAP_FULL_SETTLE_MS pass before another, so
 * that the victim's memory and swap come back first.
 *
 * Or when stores have stayed in flight with none done for
 * SWAP_FULL_STALL_MS and then as long again, with
 * memory short: the server itself stuck behind the kernel's reclaim
 * (seen: its reserve keeper throttled in reclaim while populating, other
 * threads queued behind it on the mmap lock), which only memory coming
 * back can free - the OOM killer's victim, whose memory the kernel's
 * OOM reaper frees even while the victim is stuck.
 *
 * The clocks run only while the watcher looks: a gap of
 * SWAP_FULL_GAP_MS or more between two looks (the process was stopped:
 * SIGSTOP, a frozen cgroup, a debugger) starts them again, so that a
 * pause of the whole server is not taken for its stall, nor refusals
 * on both sides of it for one long episode: what comes after the pause
 * is judged by its own length (a server SIGSTOPped for 40 s in the guest
 * had processes killed once, the cause not pinned down; this is the part
 * that a pause surely falsified).
 *
 * Threads: swap_full_note_refusal and the store counts are called by
 * any request thread (one atomic add); swap_full_watch by one thread
 * only, the watcher (swap_full_start), every SWAP_FULL_TICK_MS; its
 * state is that thread's alone.  The watcher is not the reserve keeper,
 * which may be the thread stuck.  The sysrq file is opened in swap_full_prepare (before
 * nbdkit drops privileges, before any request), so acting needs no
 * open, and no memory, under pressure.
 */
#ifndef ZRAM_SWAP_FULL_H
#define ZRAM_SWAP_FULL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SWAP_FULL_AFTER_MS 2000
#define SWAP_FULL_PAUSE_MS 1000
#define SWAP_FULL_SETTLE_MS 5000
#define SWAP_FULL_TICK_MS 250
#define SWAP_FULL_RECENT_MS 30000
#define SWAP_FULL_STALL_MS 10000
#define SWAP_FULL_GAP_MS 10000

enum swap_full_action {
  SWAP_FULL_OOM,                /* ask the kernel's OOM killer (default) */
  SWAP_FULL_FAIL,               /* only refuse the writes */
};

/* swap_full=oom|fail: 0, or -1 after nbdkit_error. */
extern int swap_full_parse (const char *value);
extern enum swap_full_action swap_full_action;

/* The thresholds, as parameters (beside systemd-oomd or earlyoom a user
 * may want the server slower, or quicker, to act than they are):
 * swap_full_after=MILLISECONDS, how long writes are refused before the
 * device counts as full (SWAP_FULL_AFTER_MS by default, 250 to 600000);
 * swap_full_available=SIZE, MemAvailable below which memory counts as
 * short (0, the default: twice vm.min_free_kbytes or a thirty-second of
 * RAM, whichever is more).  Each 0, or -1 after nbdkit_error naming it.
 */
extern int swap_full_after_parse (const char *value);
extern int swap_full_available_parse (const char *value);
extern unsigned swap_full_after_ms;
extern uint64_t swap_full_available_kib;

/* Open the sysrq file for swap_full=oom: 0, or -1 with a message saying
 * why in problem.
 */
extern int swap_full_prepare (char *problem, size_t size);

/* Around each store in swap mode: the watch also takes stores that stay
 * in flight with none done for as long as refusals (the server itself
 * stuck behind reclaim: only memory coming back frees it).
 */
extern void swap_full_store_start (void);
extern void swap_full_store_done (void);

/* The watcher thread (swap mode), calling swap_full_watch every
 * SWAP_FULL_TICK_MS: 0, or -1 with errno.  Stop joins it.  after_kill
 * (may be NULL) is called on the watcher's thread each time the OOM
 * killer was asked to act: the server opens its reserve to the writes
 * then (zs_pool_open_reserve).
 */
extern int swap_full_start (void (*after_kill) (void));
extern void swap_full_stop (void);

/* A write was refused for lack of room (ENOSPC), or because no memory
 * was ready for it (EAGAIN: the reserve keeper cannot make any while the
 * machine has none, the same livelock).
 */
extern void swap_full_note_refusal (void);

/* One look, at monotonic time now_ns: acts if the device is full and
 * the machine short of memory.  From one thread only.
 */
extern void swap_full_watch (uint64_t now_ns);
/* A server that took its device over from another (a restart, region=)
 * meets at once every write the kernel kept while no server ran, with
 * its reserve being made ready on a machine that could not swap
 * meanwhile: refused writes then are the restart's, not a full device's.
 * No OOM kill before until_ns (CLOCK_MONOTONIC).  45 s: in the guest a
 * restarted server under 2.25x its RAM of pressure could stall past 15 s
 * and have a process killed that the machine did not need to lose.
 */
#define SWAP_FULL_RESTART_GRACE_MS 45000
/* Or asked for (the control channel's grace): the supervisor makes a
 * standby ready beside this server, whose memory, faulted in on a
 * machine short of it, is taken from the writes' reserve for a while
 * (seen in the guest: a swap restart's standby, made ready at 2.25x,
 * left this server's writes refused and a process was killed).  At most
 * SWAP_FULL_ASKED_GRACE_MAX_S; a new ask replaces the last (0 ends it).
 * The two are kept apart: the later deadline holds.
 */
enum swap_full_grace_reason {
  SWAP_FULL_GRACE_RESTART,
  SWAP_FULL_GRACE_ASKED,
  SWAP_FULL_GRACE_REASONS       /* how many */
};
#define SWAP_FULL_ASKED_GRACE_MAX_S 300
extern void swap_full_grace (enum swap_full_grace_reason reason,
                             uint64_t until_ns);

/* What the stats file's swap_full_* lines say. */
struct swap_full_status {
  uint64_t refusals;            /* writes refused for room, ever */
  uint64_t kills;               /* times the OOM killer was asked */
  uint64_t kill_delay_max_ms;   /* longest time from the start of the
                                   refusals to the request */
  int full;                     /* 1: refusals go on now */
};
extern void swap_full_status (struct swap_full_status *status);
extern void swap_full_print (const struct swap_full_status *status, FILE *fp);

#endif /* ZRAM_SWAP_FULL_H */
