/* Swap mode: see swap-mode.h. */

#include <alloca.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "error-text.h"
#include "swap-full.h"
#include "proc-files.h"
#include "stack-touch.h"
#include "swap-mode.h"

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57
#define PR_GET_IO_FLUSHER 58
#endif
#ifndef MCL_ONFAULT
#define MCL_ONFAULT 4
#endif

#define CAP_IPC_LOCK_BIT 14
#define CAP_SYS_RESOURCE_BIT 24

enum swap_mode swap_mode = SWAP_OFF;

/* The real-time priority of the server's threads (SCHED_RR): the lowest
 * one, enough for the page allocator's allowance (swap-mode.h).
 */
#define SWAP_RT_PRIORITY 1
/* vm.min_free_kbytes below this, the kernel's reserve is too thin for a
 * server's socket buffers under a sudden spike (seen in a 384 MiB guest:
 * hangs at 5,000 KiB, passes at 12,288 with SCHED_RR).
 */
#define SWAP_MIN_FREE_KBYTES 12288

/* What swap_mode_prepare and swap_mode_lock got, for the start line and
 * the stats (written before the threads that read them are started).
 */
static bool got_io_flusher, got_oom_score, got_realtime, got_locked;

/* PR_GET_IO_FLUSHER as the first request's thread saw it: -1 before. */
static atomic_int worker_io_flusher = -1;

/* Page faults the serving threads took inside requests (swap_mode_request_
 * start and _done): writes (and trims, zeroes), and reads.
 */
static _Atomic uint64_t write_faults, read_faults;
/* Of those, the faults of the first request's stack touch (a stack the
 * keeper had not made ready).
 */
static _Atomic uint64_t stack_touch_faults;

static const char *const mode_names[] = { "off", "on", "try" };

int
swap_mode_parse (const char *value)
{
  for (int mode = SWAP_OFF; mode <= SWAP_TRY; mode++)
    if (strcmp (value, mode_names[mode]) == 0) {
      swap_mode = mode;
      return 0;
    }
  nbdkit_error ("swap: '%s' is not one of on|try|off", value);
  return -1;
}

int
swap_mode_check_config (uint64_t mem_limit)
{
  if (swap_mode != SWAP_OFF && mem_limit == 0) {
    nbdkit_error ("swap=%s needs mem_limit=SIZE (or mem_budget=SIZE): a swap "
                  "device whose memory can grow without bound takes the "
                  "host down with it",
                  mode_names[swap_mode]);
    return -1;
  }
  return 0;
}

static bool
has_capability (int bit)
{
  int64_t effective = self_status_number ("CapEff", 16);
  return effective != -1 && (effective >> bit & 1);
}

/* Append a missing requirement to the message. */
static void
add_missing (char *message, size_t size, const char *what)
{
  size_t used = strlen (message);
  snprintf (message + used, size - used, "%s%s", used ? "; " : "", what);
}

/* The kernel counts a locked mapping in full against RLIMIT_MEMLOCK,
 * touched or not (MCL_ONFAULT included): nbdkit's thread stacks and
 * malloc's arenas alone come to about a GiB with 16 threads, and with
 * MCL_FUTURE a mapping past the limit fails.  So no finite limit is safe
 * to promise: true (and the message in item) unless the limit is
 * unlimited or the process has CAP_IPC_LOCK.
 */
static bool
memlock_problem (char *item, size_t size)
{
  struct rlimit memlock;
  if (has_capability (CAP_IPC_LOCK_BIT)
      || getrlimit (RLIMIT_MEMLOCK, &memlock) == -1
      || memlock.rlim_cur == RLIM_INFINITY)
    return false;
  snprintf (item, size,
            "RLIMIT_MEMLOCK is %" PRIu64 " KiB and there is no "
            "CAP_IPC_LOCK: every mapping locked counts in full (thread "
            "stacks, malloc arenas), so the server would fail to map "
            "memory; make it unlimited (ulimit -l unlimited, "
            "LimitMEMLOCK=infinity) or grant CAP_IPC_LOCK",
            (uint64_t) memlock.rlim_cur / 1024);
  return true;
}

int
swap_mode_prepare (void)
{
  if (swap_mode == SWAP_OFF)
    return 0;

  char missing[1024] = "";
  char item[512];

  /* Before any thread exists: all of them inherit it. */
  got_io_flusher = prctl (PR_SET_IO_FLUSHER, 1, 0, 0, 0) == 0;
  if (!got_io_flusher) {
    snprintf (item, sizeof item,
              "PR_SET_IO_FLUSHER refused (it needs CAP_SYS_RESOURCE and "
              "Linux 5.6): %s", error_text (errno));
    add_missing (missing, sizeof missing, item);
  }

  /* Transparent huge pages off, for the process (Linux 3.15; kept across
   * fork).  khugepaged collapses small pages of the heap and of the data
   * segments into huge ones, and a request that touches a range while it
   * is collapsed faults and waits (seen: the only faults left inside
   * swap writes in a 1 GiB guest, in the heap and in nbdkit's data
   * segment, whose 192 MiB of .bss is mostly never touched); and a
   * collapsed range is 2 MiB locked where a few pages were touched.  The
   * pool's chunks are MADV_NOHUGEPAGE already.  Warned about, not
   * refused: without it, a rare fault.
   */
  if (prctl (PR_SET_THP_DISABLE, 1, 0, 0, 0) == -1)
    nbdkit_error ("zram: warning: swap=%s: PR_SET_THP_DISABLE refused (%s): "
                  "the kernel may collapse the server's pages into huge "
                  "pages while requests touch them", mode_names[swap_mode],
                  error_text (errno));

  /* Before any thread exists too: threads and the forked server inherit
   * the policy.
   */
  struct sched_param param = { .sched_priority = SWAP_RT_PRIORITY };
  int policy = sched_getscheduler (0);
  got_realtime = policy == SCHED_RR || policy == SCHED_FIFO   /* chrt: kept */
    || sched_setscheduler (0, SCHED_RR, &param) == 0;
  if (!got_realtime) {
    snprintf (item, sizeof item,
              "SCHED_RR refused (it needs CAP_SYS_NICE, or RLIMIT_RTPRIO of "
              "at least %d: ulimit -r %d, LimitRTPRIO=%d): %s",
              SWAP_RT_PRIORITY, SWAP_RT_PRIORITY, SWAP_RT_PRIORITY,
              error_text (errno));
    add_missing (missing, sizeof missing, item);
  }

  FILE *fp = fopen ("/proc/self/oom_score_adj", "w");
  bool oom_set = fp && fprintf (fp, "-1000\n") > 0;
  if (fp && fclose (fp) != 0)
    oom_set = false;
  got_oom_score = oom_set;
  if (!oom_set)
    add_missing (missing, sizeof missing,
                 "oom_score_adj -1000 refused: it needs CAP_SYS_RESOURCE");

  /* A host setting: warned about, never refused. */
  int64_t min_free = sysctl_number ("/proc/sys/vm/min_free_kbytes");
  if (min_free >= 0 && min_free < SWAP_MIN_FREE_KBYTES)
    nbdkit_error ("zram: warning: swap=%s: vm.min_free_kbytes is %" PRId64
                  ": a sudden memory spike can starve the server of the "
                  "socket buffers it needs to answer; set it to at least "
                  "%d (sysctl -w vm.min_free_kbytes=%d)",
                  mode_names[swap_mode], min_free, SWAP_MIN_FREE_KBYTES,
                  SWAP_MIN_FREE_KBYTES);

  if (memlock_problem (item, sizeof item))
    add_missing (missing, sizeof missing, item);

  if (swap_full_prepare (item, sizeof item) == -1)
    add_missing (missing, sizeof missing, item);

  if (!*missing)
    return 0;
  if (swap_mode == SWAP_ON) {
    nbdkit_error ("swap=on: cannot make this server safe to swap to: %s.  "
                  "Grant what is named, or use swap=try to go on without",
                  missing);
    return -1;
  }
  nbdkit_error ("zram: warning: swap=try: going on without: %s", missing);
  return 0;
}

int
swap_mode_lock (void)
{
  if (swap_mode == SWAP_OFF) {
    /* nbdkit --swap locked everything, future mappings in full: keep the
     * lock, but only on the pages touched.
     */
    if (self_status_number ("VmLck", 10) > 0
        && mlockall (MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) == 0)
      nbdkit_debug ("zram: memory is locked (nbdkit --swap): "
                    "now locked as it is touched (MCL_ONFAULT)");
    return 0;
  }
  /* Again: nbdkit -u/-g may have dropped capabilities since .get_ready. */
  char problem[512];
  if (memlock_problem (problem, sizeof problem)) {
    if (swap_mode == SWAP_ON) {
      nbdkit_error ("swap=on: cannot lock memory: %s", problem);
      return -1;
    }
    nbdkit_error ("zram: warning: swap=try: going on with memory not "
                  "locked: %s", problem);
    return 0;
  }
  if (mlockall (MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) == -1) {
    int err = errno;
    if (swap_mode == SWAP_ON) {
      nbdkit_error ("swap=on: mlockall: %s (RLIMIT_MEMLOCK or CAP_IPC_LOCK)",
                    error_text (err));
      return -1;
    }
    nbdkit_error ("zram: warning: swap=try: going on with memory not "
                  "locked: mlockall: %s", error_text (err));
    return 0;
  }
  got_locked = true;
  return 0;
}

/* The machine's RAM (MemTotal), in bytes; 0 when unknown. */
static uint64_t
machine_ram_bytes (void)
{
  char text[4096];
  FILE *fp = fopen ("/proc/meminfo", "r");
  size_t length = fp ? fread (text, 1, sizeof text - 1, fp) : 0;
  if (fp)
    fclose (fp);
  text[length] = '\0';
  int64_t ram_kib = meminfo_kib (text, "MemTotal:");
  return ram_kib > 0 ? (uint64_t) ram_kib * 1024 : 0;
}

/* value within [low, high]. */
static uint64_t
within (uint64_t value, uint64_t low, uint64_t high)
{
  return value < low ? low : value > high ? high : value;
}

/* Swap mode's fixed memory scales with the machine: the bigger it is,
 * the bigger the kernel's bursts of swap-outs (it reclaims in
 * proportion), and the less a MiB of it matters.  The reserve gets a
 * sixty-fourth of RAM, the heap's room for requests a hundred and
 * twenty-eighth: 4 and 2 MiB on a 256 MiB machine, where the server's
 * whole fixed cost is to stay within 16 MiB (at a thirty-second, 8 MiB
 * of heap made ready and more for the device's whole metadata, it was
 * 25 MiB).
 */
#define RESERVE_SHARE_OF_RAM 64
#define HEAP_SHARE_OF_RAM 128

/* The default reserve: a sixty-fourth of RAM, within SWAP_RESERVE_MIN
 * and SWAP_RESERVE_MAX, at most an eighth of mem_limit, in whole
 * reserve_unit bytes (and at least one).  What it must cover is the
 * swap-outs that arrive between a miss and the refill.
 */
#define SWAP_RESERVE_MIN ((uint64_t) 4 << 20)
#define SWAP_RESERVE_MAX ((uint64_t) 64 << 20)

uint64_t
swap_mode_default_reserve (uint64_t mem_limit, uint64_t reserve_unit)
{
  uint64_t reserve = within (machine_ram_bytes () / RESERVE_SHARE_OF_RAM,
                             SWAP_RESERVE_MIN, SWAP_RESERVE_MAX);
  if (reserve > mem_limit / 8)
    reserve = mem_limit / 8;
  reserve -= reserve % reserve_unit;
  return reserve ? reserve : reserve_unit;
}

/* The heap made ready for requests (nbdkit's buffers): a hundred and
 * twenty-eighth of RAM in HEAP_BUFFER_BYTES buffers, within HEAP_READY_MIN and
 * HEAP_READY_MAX (room for a request of each of nbdkit's 16 default
 * worker threads, 256 KiB each, twice over).  The allocator's metadata
 * gets no room here: the reserve keeper keeps the heap's top ready for
 * it as the data grows (metadata_headroom in zram.c); made ready at the
 * device's size at start it cost an empty server 24 bytes a block (1.7
 * MiB for 288 MiB, 48 MiB for an 8 GiB device).
 */
#define HEAP_BUFFER_BYTES (256 << 10)
#define HEAP_READY_MIN ((uint64_t) 2 << 20)
#define HEAP_READY_MAX ((uint64_t) 8 << 20)
/* Requests up to this size come from the heap, not a mapping of their
 * own: the kernel's nbd client sends up to max_sectors_kb (1280 KiB by
 * default) in one request.
 */
#define HEAP_MMAP_THRESHOLD (2 << 20)

/* Outside swap mode: glibc's thresholds fixed at their starting values.
 * Left dynamic, each freed mapped chunk raises them, after which the
 * plugin's large buffers (units, writeback batches) and nbdkit's come
 * from per-thread arenas, whose free tops malloc_trim does not give
 * back: tens of MiB stayed after the data was trimmed.
 */
#define PLAIN_MMAP_THRESHOLD (128 << 10)
#define PLAIN_TRIM_THRESHOLD (128 << 10)

void
swap_mode_heap_settings (void)
{
  if (swap_mode == SWAP_OFF) {
    mallopt (M_MMAP_THRESHOLD, PLAIN_MMAP_THRESHOLD);
    mallopt (M_TRIM_THRESHOLD, PLAIN_TRIM_THRESHOLD);
    /* An arena for two CPUs, not glibc's eight a CPU: each of
     * nbdkit's 16 workers got one of its own, and after a copy each held
     * 200-500 KiB of freed request buffers and allocator metadata that
     * malloc_trim cannot give back whole (5 MiB on 2 CPUs; 2 MiB with an
     * arena a CPU).  On 2 CPUs, one arena: 0.9 MiB less again after
     * idle all and pack of a 256 MiB image, random 4 KiB IOPS the same
     * (run-plugin-bench.sh, three rounds alternating with an arena a
     * CPU); on more CPUs, the same two CPUs a lock as measured.
     */
    long cpus = sysconf (_SC_NPROCESSORS_ONLN);
    mallopt (M_ARENA_MAX, cpus > 2 ? (int) (cpus / 2) : 1);
    return;
  }
  /* One arena: the pages touched by swap_mode_prepare_heap serve every
   * thread, including the workers nbdkit starts later.  The heap's free
   * top is never given back (a request would fault it in again, maybe
   * with memory gone).
   */
  mallopt (M_ARENA_MAX, 1);
  mallopt (M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD);
  mallopt (M_TRIM_THRESHOLD, INT_MAX);
}

size_t
swap_mode_prepare_heap (void)
{
  if (swap_mode == SWAP_OFF)
    return 0;
  size_t count = within (machine_ram_bytes () / HEAP_SHARE_OF_RAM,
                         HEAP_READY_MIN, HEAP_READY_MAX) / HEAP_BUFFER_BYTES;
  void **buffers = calloc (count, sizeof *buffers);
  if (!buffers)
    return 0;
  size_t touched = 0;
  for (size_t i = 0; i < count; i++) {
    if ((buffers[i] = malloc (HEAP_BUFFER_BYTES))) {
      memset (buffers[i], 0, HEAP_BUFFER_BYTES);
      touched += HEAP_BUFFER_BYTES;
    }
  }
  /* Freed, they merge into free heap that stays: touched and locked. */
  for (size_t i = 0; i < count; i++)
    free (buffers[i]);
  free (buffers);
  return touched;
}

void
swap_mode_report (uint64_t reserve_bytes, uint64_t prepared_bytes)
{
  if (swap_mode == SWAP_OFF)
    return;
  /* All as asked: a debug line (-v), since nbdkit has no level between
   * debug and error, and an error at every start (every restart under
   * the supervisor, whose log swap status shows) would cry wolf.  The
   * stats file and the metrics say the same without -v
   * (swap_memory_locked, swap_realtime_priority, swap_io_flusher,
   * swap_oom_score_adj, reserve_bytes).  Only swap=try gets this far
   * with something missing (swap=on refuses to start): then an error
   * naming each measure it serves without.
   */
  char missing[256] = "";
  if (!got_locked)
    add_missing (missing, sizeof missing, "memory locked as it is touched");
  if (!got_realtime)
    add_missing (missing, sizeof missing, "real-time priority (SCHED_RR)");
  if (!got_io_flusher)
    add_missing (missing, sizeof missing, "IO flusher");
  if (!got_oom_score)
    add_missing (missing, sizeof missing, "oom_score_adj -1000");
  if (*missing)
    nbdkit_error ("zram: warning: swap=%s: serving without: %s.  Reserve of "
                  "%" PRIu64 " MiB populated, %" PRIu64 " MiB of table, "
                  "contexts and heap made ready", mode_names[swap_mode],
                  missing, reserve_bytes >> 20, prepared_bytes >> 20);
  else
    nbdkit_debug ("zram: swap=%s: memory locked as it is touched, reserve "
                  "of %" PRIu64 " MiB populated, %" PRIu64 " MiB of table, "
                  "contexts and heap made ready, real-time, IO flusher, "
                  "oom_score_adj -1000", mode_names[swap_mode],
                  reserve_bytes >> 20, prepared_bytes >> 20);
}

/* Stack each serving thread touches on its first request, so that no
 * request faults a new stack page in later: three times the deepest
 * worker measured (16 KiB serving reads, writes, trims and zeroes of
 * lz4, zstd and packed data; the housekeeper, packing, 28 KiB):
 * compression contexts and buffers live on the heap.  The reserve
 * keeper makes STACK_READY_BYTES ready below where a new thread waits
 * (swap_mode_ready_stacks): that covers the touch, which starts a few
 * frames deeper (nbdkit's request handling, the plugin's entry).
 */
#define STACK_TOUCH_BYTES (48 << 10)
#define STACK_READY_BYTES (64 << 10)

/* Minor and major faults of the calling thread so far. */
static uint64_t
thread_faults (void)
{
  struct rusage usage;
  if (getrusage (RUSAGE_THREAD, &usage) == -1)
    return 0;
  return (uint64_t) usage.ru_minflt + (uint64_t) usage.ru_majflt;
}

uint64_t
swap_mode_request_start (void)
{
  static __thread bool thread_ready;
  /* Counted from before the stack's touch: a stack the keeper has not
   * made ready (swap_mode_ready_stacks) shows as faults.
   */
  uint64_t faults = thread_faults ();
  if (!thread_ready) {
    thread_ready = true;
    stack_touch (STACK_TOUCH_BYTES);
    uint64_t touched = thread_faults () - faults;
    if (touched)
      atomic_fetch_add_explicit (&stack_touch_faults, touched,
                                 memory_order_relaxed);
    if (atomic_load_explicit (&worker_io_flusher, memory_order_relaxed) == -1) {
      int flusher = prctl (PR_GET_IO_FLUSHER, 0, 0, 0, 0);
      int expected = -1;
      atomic_compare_exchange_strong (&worker_io_flusher, &expected,
                                      flusher == 1 ? 1 : 0);
    }
  }
  return faults;
}

/* ---- kept by the reserve keeper ---------------------------------------- */

/* What of the heap's free memory is not offered to the allocator's
 * metadata: room for everything else a request takes from the heap -
 * nbdkit's request buffers, freed again, but up to 16 threads' at once,
 * each as big as the nbd driver's merged swap writes (128 KiB seen), and
 * the allocator's chunk headers - and the top's own page.  (With 512
 * KiB: one fault in 1.8 million swap writes in a 1 GiB guest, glibc
 * splitting a top the requests had moved past what the keeper made
 * ready a quarter of a second before.)
 */
#define HEAP_FREE_MARGIN (4 << 20)
/* The pieces the top is grown by: under the mmap threshold, so that
 * they come from the heap.
 */
#define HEAP_GROW_PIECE (1 << 20)
#define HEAP_GROW_PIECES_MAX 64

/* Populate [start, end) for writing, keeping what is there, without
 * taking the process's mmap lock for writing: MADV_POPULATE_WRITE (Linux
 * 5.14) faults the pages in (and, under mlockall, locks them) holding it
 * for reading.  Not mlock: it takes the lock for writing, and a waiting
 * writer holds up every page fault of the process behind it - with one
 * thread of the server in reclaim under pressure, the requests' faults
 * too (seen: a 384 MiB guest hung, the keeper in mlock, a request thread
 * in a fault behind it, another thread in reclaim).  Without
 * MADV_POPULATE_WRITE: nothing (what is in use cannot be touched from
 * here without racing its owner).
 */
static bool
populate_for_write (uintptr_t start, uintptr_t end)
{
#ifdef MADV_POPULATE_WRITE
  return madvise ((void *) start, end - start, MADV_POPULATE_WRITE) == 0;
#else
  (void) start, (void) end;
  return false;
#endif
}

/* The span of the process's mappings (/proc/self/maps) named name (the
 * first's start to the last's end), or with name NULL the mapping that
 * holds address: false if there is none.
 */
static bool
mappings_find (const char *name, uintptr_t address, uintptr_t *start,
               uintptr_t *end)
{
  FILE *maps = fopen ("/proc/self/maps", "r");
  if (!maps)
    return false;
  char line[512];
  uintptr_t low, high;
  bool found = false;
  while (fgets (line, sizeof line, maps))
    if (sscanf (line, "%" SCNxPTR "-%" SCNxPTR, &low, &high) == 2
        && (name ? strstr (line, name) != NULL
            : low <= address && address < high)) {
      if (!found)
        *start = low;
      *end = high;
      found = true;
      if (!name)
        break;
    }
  fclose (maps);
  return found;
}

/* Make the whole heap resident: free chunks below the top that no one
 * touched since they were carved (seen: 128 KiB holes every 256 KiB),
 * and the parts of live allocations their owners have not touched yet
 * (the compression libraries' workspaces).  The heap may be more than
 * one mapping (seen: split where mlockall found it, and the part grown
 * later never populated - 600 faults inside swap writes): all of them,
 * from the first's start to the last's end.  Only what grew since the
 * last call: on pages already there the kernel only walks them, but
 * there is no need to.
 */
static void
heap_populate (void)
{
  uintptr_t heap_start, heap_end;
  static uintptr_t populated_start, populated_end; /* the keeper's own */
  if (!mappings_find ("[heap]", 0, &heap_start, &heap_end))
    return;
  if (heap_start != populated_start || heap_end < populated_end)
    populated_end = heap_start; /* a heap not seen before */
  if (heap_end > populated_end && populate_for_write (populated_end, heap_end)) {
    populated_start = heap_start;
    populated_end = heap_end;
  }
}

/* Grow the heap's top by at least bytes: pieces carved (from free space
 * big enough, then from the top, which moves the break), touched, and
 * freed again - what came from the top merges into it, which is never
 * trimmed (swap_mode_prepare_heap), so it stays resident and locked.
 * sbrk (0) only reads where the break is.
 */
static void
heap_top_grow (size_t bytes)
{
  uintptr_t target = (uintptr_t) sbrk (0) + bytes;
  void *pieces[HEAP_GROW_PIECES_MAX];
  unsigned n = 0;
  while (n < HEAP_GROW_PIECES_MAX && (uintptr_t) sbrk (0) < target) {
    if (!(pieces[n] = malloc (HEAP_GROW_PIECE)))
      break;
    memset (pieces[n++], 0, HEAP_GROW_PIECE);
  }
  while (n > 0)
    free (pieces[--n]);
}

size_t
swap_mode_heap_ready (size_t wanted)
{
  if (swap_mode == SWAP_OFF)
    return 0;
  wanted += HEAP_FREE_MARGIN;
  struct mallinfo2 info = mallinfo2 ();
  if (info.arena == 0)
    /* Not the C library's allocator (a sanitizer's replaces it, and
     * reports nothing): no heap to make ready, no bound to give.
     */
    return SIZE_MAX / 4;
  /* The room is kept at the top (keepcost: the top chunk), in one piece:
   * a request's buffer or a burst of metadata that fits no free chunk
   * below is carved from it, where it would otherwise move the break - a
   * memory-map call, and new pages faulted in, on the write path (seen:
   * the only faults left inside swap writes, the heap's fresh top).
   */
  if (info.keepcost < wanted)
    heap_top_grow (wanted - info.keepcost);
  heap_populate ();
  /* What the allocator's metadata may take: all the heap's free memory,
   * not only the top - the whole heap is resident (heap_populate), so a
   * free chunk anywhere serves without a fault.  (Counting the top alone
   * starved the allocator when the free memory sat in chunks below it -
   * nbdkit's freed request buffers: 3.5 million writes refused in a row,
   * CI's check-vm.)
   */
  size_t free_bytes = mallinfo2 ().fordblks;
  return free_bytes > HEAP_FREE_MARGIN ? free_bytes - HEAP_FREE_MARGIN : 0;
}

/* The threads whose stacks swap_mode_ready_stacks made ready.  Only the
 * reserve keeper's thread reads or writes these (no lock).  A thread that
 * exits leaves the list at the next call, so a new thread that reuses
 * its ID is taken for ready only if the kernel hands the ID out again
 * within one call's interval (it hands IDs out in order, wrapping at
 * pid_max).
 */
#define STACKS_TRACKED 1024
static pid_t stacks_ready[STACKS_TRACKED];
static unsigned stacks_ready_count;
static _Atomic uint64_t stacks_readied; /* stacks made ready, ever */

/* The stack pointer of thread tid, blocked in a system call or not
 * running (the last but one field of /proc/self/task/TID/syscall):
 * 0 while it runs.
 */
static uintptr_t
thread_stack_pointer (pid_t tid)
{
  char path[64], line[512];
  snprintf (path, sizeof path, "/proc/self/task/%d/syscall", (int) tid);
  FILE *fp = fopen (path, "r");
  if (!fp)
    return 0;
  char *got = fgets (line, sizeof line, fp);
  fclose (fp);
  if (!got || strncmp (line, "running", 7) == 0)
    return 0;
  char *fields[16];
  unsigned n = 0;
  for (char *saveptr, *field = strtok_r (line, " \n", &saveptr);
       field && n < 16; field = strtok_r (NULL, " \n", &saveptr))
    fields[n++] = field;
  return n >= 3 ? strtoull (fields[n - 2], NULL, 16) : 0;
}

/* Populate (so lock) STACK_READY_BYTES of the stack below sp, within the
 * mapping that holds sp: what the thread's requests will reach.
 */
static bool
stack_below_ready (uintptr_t sp)
{
  uintptr_t start, end;
  if (!mappings_find (NULL, sp, &start, &end))
    return false;
  uintptr_t page = sp & ~(uintptr_t) 4095;
  uintptr_t low = page - start > STACK_READY_BYTES
    ? page - STACK_READY_BYTES : start;
  return populate_for_write (low, page + 4096);
}

static bool
stack_is_ready (pid_t tid)
{
  for (unsigned i = 0; i < stacks_ready_count; i++)
    if (stacks_ready[i] == tid)
      return true;
  return false;
}

unsigned
swap_mode_ready_stacks (void)
{
  if (swap_mode == SWAP_OFF)
    return 0;
  DIR *dir = opendir ("/proc/self/task");
  if (!dir)
    return 0;
  pid_t live[STACKS_TRACKED];
  unsigned live_count = 0, readied = 0;
  pid_t self = syscall (SYS_gettid);
  struct dirent *entry;
  while ((entry = readdir (dir)) && live_count < STACKS_TRACKED) {
    pid_t tid = atoi (entry->d_name);
    if (tid <= 0)
      continue;
    if (tid == self || stack_is_ready (tid)) {
      live[live_count++] = tid;
      continue;
    }
    uintptr_t sp = thread_stack_pointer (tid);
    if (sp && stack_below_ready (sp)) {
      live[live_count++] = tid;
      readied++;
    }
  }
  closedir (dir);
  memcpy (stacks_ready, live, live_count * sizeof *live);
  stacks_ready_count = live_count;
  atomic_fetch_add (&stacks_readied, readied);
  return readied;
}

void
swap_mode_request_done (bool stores, uint64_t start)
{
  uint64_t faults = thread_faults () - start;
  if (faults)
    atomic_fetch_add_explicit (stores ? &write_faults : &read_faults, faults,
                               memory_order_relaxed);
}

/* The resident locked memory, in KiB ("Locked:" of smaps_rollup; VmLck
 * is the size of the locked mappings, touched or not), or -1.
 */
static int64_t
resident_locked_kib (void)
{
  FILE *fp = fopen ("/proc/self/smaps_rollup", "r");
  if (!fp)
    return -1;
  char line[256];
  int64_t value = -1;
  while (fgets (line, sizeof line, fp))
    if (strncmp (line, "Locked:", 7) == 0) {
      value = strtoll (line + 7, NULL, 10);
      break;
    }
  fclose (fp);
  return value;
}

void
swap_mode_status (struct swap_mode_status *status)
{
  int64_t locked_kib = resident_locked_kib ();
  int64_t mapped_kib = self_status_number ("VmLck", 10);
  status->mode = mode_names[swap_mode];
  status->mode_number = swap_mode;
  status->locked_bytes = locked_kib < 0 ? 0 : locked_kib * 1024;
  status->locked_mappings_bytes = mapped_kib < 0 ? 0 : mapped_kib * 1024;
  struct sched_param param;
  int policy = sched_getscheduler (0);
  status->realtime_priority = policy == SCHED_RR || policy == SCHED_FIFO
    ? (sched_getparam (0, &param) == 0 ? param.sched_priority : 0) : 0;
  status->memory_locked = got_locked;
  status->io_flusher = got_io_flusher;
  status->io_flusher_worker = atomic_load (&worker_io_flusher);
  status->write_faults = atomic_load_explicit (&write_faults, memory_order_relaxed);
  status->read_faults = atomic_load_explicit (&read_faults, memory_order_relaxed);
  status->stacks_ready = atomic_load_explicit (&stacks_readied, memory_order_relaxed);
  status->stack_faults = atomic_load_explicit (&stack_touch_faults, memory_order_relaxed);
  FILE *oom = fopen ("/proc/self/oom_score_adj", "r");
  status->oom_score_adj = 0;
  if (oom) {
    if (fscanf (oom, "%d", &status->oom_score_adj) != 1)
      status->oom_score_adj = 0;
    fclose (oom);
  }
}

void
swap_mode_print (const struct swap_mode_status *status, FILE *fp)
{
  fprintf (fp, "swap_mode: %s\n", status->mode);
  fprintf (fp, "swap_locked_bytes: %" PRId64 "\n", status->locked_bytes);
  fprintf (fp, "swap_locked_mappings_bytes: %" PRId64 "\n",
           status->locked_mappings_bytes);
  fprintf (fp, "swap_memory_locked: %d\n", status->memory_locked);
  fprintf (fp, "swap_realtime_priority: %d\n", status->realtime_priority);
  fprintf (fp, "swap_io_flusher: %d\n", status->io_flusher);
  fprintf (fp, "swap_io_flusher_worker: %d\n", status->io_flusher_worker);
  fprintf (fp, "swap_oom_score_adj: %d\n", status->oom_score_adj);
  fprintf (fp, "swap_write_faults: %" PRIu64 "\n", status->write_faults);
  fprintf (fp, "swap_read_faults: %" PRIu64 "\n", status->read_faults);
  fprintf (fp, "swap_stacks_ready: %" PRIu64 "\n", status->stacks_ready);
  fprintf (fp, "swap_stack_faults: %" PRIu64 "\n", status->stack_faults);
}
