/* The housekeeper thread: see housekeeper.h. */

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "handover.h"
#include "housekeeper.h"
#include "block-store-internal.h"   /* store_decode_cache_sweep */
#include "monotonic.h"
#include "metrics.h"
#include "stats-file.h"

#define HOUSEKEEPING_INTERVAL_SECONDS 1

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards stopping,
                                                            stats_due,
                                                            refills_done and
                                                            the waits of
                                                            wake, stats_wake,
                                                            reserve_wake and
                                                            refilled */
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;   /* signals stopping
                                                            or a refill */
/* Swap mode (policy.reserve_always): the reserve is kept by a thread of
 * its own, the reserve keeper, which refills it every RESERVE_TICK_MS
 * or at once when a request finds it low, and calls policy.reserve_tick:
 * a housekeeping round (compaction, packing) that waits on the kernel
 * never delays a refill.
 */
#define RESERVE_TICK_MS 250
static pthread_cond_t reserve_wake = PTHREAD_COND_INITIALIZER; /* signals
                                                            stopping or a
                                                            refill */
static bool keeper_running;
static pthread_t keeper_thread;
/* Refills ended (store_reserve_refill calls, by either thread), for
 * housekeeper_wait_refill; refilled signals each, and stopping.
 */
static uint64_t refills_done;
static pthread_cond_t refilled = PTHREAD_COND_INITIALIZER;
static bool stopping;
/* Swap mode (policy.reserve_always): the stats file is written by a
 * thread of its own, woken each round, so that a write stuck in direct
 * reclaim (a page of the file's tmpfs, with memory gone) never keeps the
 * housekeeper from refilling the reserve the swap-outs take.
 */
static pthread_cond_t stats_wake = PTHREAD_COND_INITIALIZER; /* signals
                                                            stats_due or
                                                            stopping */
static bool stats_due;
static bool stats_thread_running;
static pthread_t stats_thread;
/* A request found the swap reserve low: set by housekeeper_wake, cleared
 * by the thread before it refills, so a burst of requests wakes it once.
 */
static atomic_bool refill_requested;
/* The reserve is kept from the first wake on, so that an idle server that
 * was never written to holds no reserve; with policy.reserve_always
 * (swap mode) from the start: the first swap-out must not find it empty.
 */
static atomic_bool reserve_active;
static bool running;
static pthread_t thread;
static struct block_store *store;
static const char *stats_path, *metrics_path;
static int compact_threshold;           /* percent, or -1: never */
static struct housekeeper_policy policy; /* 0s: off */

/* What the policy may do in one round (a second), so that I/O keeps its
 * pace: this many blocks, and this much time.
 */
#define POLICY_BLOCKS_PER_ROUND 2048
#define POLICY_NS_PER_ROUND (50 * 1000000ull)

static bool
within_round_budget (void *opaque)
{
  const uint64_t *deadline = opaque;
  return monotonic_ns () < *deadline;
}

/* The automatic policy: mark what was not accessed for idle_after
 * seconds idle, and recompress the idle blocks not accessed for
 * recompress_after seconds, a bounded number per round.
 */
/* Above writeback_watermark percent of mem_limit, write the coldest
 * blocks back until 10 points below it, within a round's budget (four
 * times the others': this one frees memory the data needs).
 */
static void
writeback_above_watermark (void)
{
  struct store_stats stats;
  store_stats (store, &stats);
  if (!stats.mem_limit
      || stats.limit_used * 100 <= stats.mem_limit * policy.writeback_watermark)
    return;
  uint64_t target = stats.mem_limit / 100 * (policy.writeback_watermark - 10);
  uint64_t deadline = monotonic_ns () + 4 * POLICY_NS_PER_ROUND;
  struct store_writeback_result result;
  store_writeback_until (store, target, 4 * POLICY_BLOCKS_PER_ROUND,
                         within_round_budget, &deadline, &result);
}

/* The policy's idle marking, recompression and packing for one store,
 * which shares each step's budget (blocks and time) with shares - 1
 * others: the server's devices share one store's budget, so that a
 * round takes as long with 64 devices as with one.
 */
static void
policy_store_round (struct block_store *the_store, unsigned shares)
{
  uint64_t blocks = POLICY_BLOCKS_PER_ROUND / shares;
  uint64_t ns = POLICY_NS_PER_ROUND / shares;
  if (blocks < 64)
    blocks = 64;
  if (ns < 200000)
    ns = 200000;
  if (policy.idle_after)
    store_mark_idle (the_store, policy.idle_after, NULL, NULL);
  if (policy.recompress_after) {
    struct store_recompress_request request = {
      .type = RECOMPRESS_IDLE,
      .max_blocks = blocks,
      .min_age = policy.recompress_after,
    };
    struct store_recompress_result result;
    uint64_t deadline = monotonic_ns () + ns;
    store_recompress (the_store, &request, within_round_budget, &deadline,
                      &result);
  }
  if (policy.pack_after) {
    /* Each its own age: idle_after may mark blocks idle sooner. */
    uint64_t deadline = monotonic_ns () + ns;
    store_pack_dissolve (the_store, 50, within_round_budget, &deadline);
    struct store_pack_result result;
    deadline = monotonic_ns () + ns;
    store_pack (the_store, blocks, policy.pack_after, within_round_budget,
                &deadline, &result);
  }
}

static void
policy_round (void)
{
  policy_store_round (store, 1);
  if (policy.writeback_watermark)
    writeback_above_watermark ();
}

/* A device's share of the round (policy.devices_round): its deferred
 * frees, and unless it is the last round (*opaque: housekeeping_round's
 * last), its decode cache's stale slots and the policy, on its share of
 * the policy's budget (one of devices).
 */
static void
device_round (struct block_store *device_store, unsigned devices, void *opaque)
{
  bool last = *(const bool *) opaque;
  store_flush (device_store);
  if (!last) {
    store_decode_cache_sweep (device_store);
    policy_store_round (device_store, devices);
  }
}

/* Compact when the pages compaction could free are at least
 * compact_threshold percent of the pool's pages.
 */
static void
compact_if_wasteful (void)
{
  uint64_t pages;
  uint64_t freeable = store_freeable (store, &pages);
  if (freeable > 0
      && freeable * 100 >= (uint64_t) compact_threshold * pages
      && store_compact (store) > 0) {
    store_flush (store);        /* the emptied zspages' pages go back now */
    store_release_idle_memory (store);
  }
}

/* The stats file and the metrics file (either path may be NULL), from
 * one sample.  One thread at a time: the housekeeper's, or its stats
 * writer (swap mode); failed is that thread's memory of the last write.
 */
static struct output_file metrics_written;

static void
output_files_write (void)
{
  static bool failed[2];
  struct stats_sample sample;
  stats_sample_take (store, metrics_path != NULL, &sample);
  if (stats_path)
    stats_output_write ("stats", stats_path, &failed[0], stats_print_sample,
                        &sample, NULL);
  if (metrics_path)
    stats_output_write ("metrics", metrics_path, &failed[1],
                        metrics_print_sample, &sample, &metrics_written);
  stats_sample_release (&sample);
}

static void
housekeeping_round (bool last)
{
  handover_alive ();            /* a crash's downtime counts from here */
  store_flush (store);          /* first: pending frees are waste too */
  if (policy.devices_round)
    policy.devices_round (device_round, &last);
  /* The decode cache is charged to mem_limit and serves runs of reads:
   * a slot not read for a round goes (kept in swap mode), and one left
   * holding no unit goes in any case.
   */
  if (!last) {
    store_decode_cache_sweep (store);
    policy_round ();
  }
  if (compact_threshold >= 0)
    compact_if_wasteful ();
  /* Swap mode's reserve: kept while the store holds data, given back
   * when it holds none (the next write takes it up again), unless it is
   * kept always.
   */
  if (atomic_load (&reserve_active) && !last && !keeper_running) {
    if (!policy.reserve_always && store_reserve_release_if_empty (store))
      atomic_store (&reserve_active, false);
    else
      store_reserve_refill (store);
  }
  if ((stats_path || metrics_path) && stats_thread_running && !last) {
    pthread_mutex_lock (&lock);
    stats_due = true;
    pthread_cond_signal (&stats_wake);
    pthread_mutex_unlock (&lock);
  }
  else if (stats_path || metrics_path)
    output_files_write ();
}

static void *
stats_writer_main (void *arg)
{
  pthread_mutex_lock (&lock);
  for (;;) {
    while (!stats_due && !stopping)
      pthread_cond_wait (&stats_wake, &lock);
    if (stopping)
      break;                    /* housekeeper_stop writes the last one */
    stats_due = false;
    pthread_mutex_unlock (&lock);
    output_files_write ();
    pthread_mutex_lock (&lock);
  }
  pthread_mutex_unlock (&lock);
  return NULL;
}

/* A refill ended: for the requests waiting on one.  lock is held. */
static void
refill_ended (void)
{
  refills_done++;
  pthread_cond_broadcast (&refilled);
}

static void *
reserve_keeper_main (void *arg)
{
  pthread_mutex_lock (&lock);
  while (!stopping) {
    atomic_store (&refill_requested, false);
    pthread_mutex_unlock (&lock);
    store_reserve_refill (store);
    pthread_mutex_lock (&lock);
    refill_ended ();
    pthread_mutex_unlock (&lock);
    if (policy.reserve_tick)
      policy.reserve_tick ();
    pthread_mutex_lock (&lock);
    if (stopping || atomic_load (&refill_requested))
      continue;
    struct timespec deadline;
    clock_gettime (CLOCK_MONOTONIC, &deadline);
    deadline.tv_nsec += RESERVE_TICK_MS * 1000000l;
    if (deadline.tv_nsec >= 1000000000l) {
      deadline.tv_sec++;
      deadline.tv_nsec -= 1000000000l;
    }
    pthread_cond_clockwait (&reserve_wake, &lock, CLOCK_MONOTONIC, &deadline);
  }
  pthread_mutex_unlock (&lock);
  return NULL;
}

static void *
housekeeper_main (void *arg)
{
  pthread_mutex_lock (&lock);
  while (!stopping) {
    pthread_mutex_unlock (&lock);
    housekeeping_round (false);
    pthread_mutex_lock (&lock);

    /* A monotonic deadline: a step of the wall clock (NTP, an operator's
     * date -s) must neither stall the housekeeper nor make it spin.
     */
    struct timespec deadline;
    clock_gettime (CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += HOUSEKEEPING_INTERVAL_SECONDS;
    while (!stopping) {
      /* Woken early for the reserve: top it up only, then wait on.  The
       * flag is looked at under the lock before each wait, so a wake
       * that comes during a round is not lost.
       */
      if (!keeper_running && atomic_exchange (&refill_requested, false)) {
        atomic_store (&reserve_active, true);
        pthread_mutex_unlock (&lock);
        store_reserve_refill (store);
        pthread_mutex_lock (&lock);
        refill_ended ();
        continue;
      }
      if (pthread_cond_clockwait (&wake, &lock, CLOCK_MONOTONIC,
                                  &deadline) == ETIMEDOUT)
        break;
    }
  }
  pthread_mutex_unlock (&lock);
  return NULL;
}

/* Stop the stats writer and the reserve keeper, if they run. */
static void
housekeeper_stop_helpers (void)
{
  pthread_mutex_lock (&lock);
  stopping = true;
  pthread_cond_signal (&stats_wake);
  pthread_cond_signal (&reserve_wake);
  pthread_mutex_unlock (&lock);
  if (stats_thread_running)
    pthread_join (stats_thread, NULL);
  if (keeper_running)
    pthread_join (keeper_thread, NULL);
  stats_thread_running = keeper_running = false;
}

int
housekeeper_start (struct block_store *the_store, const char *the_stats_path,
                   const char *the_metrics_path, int the_compact_threshold)
{
  store = the_store;
  stats_path = the_stats_path;
  metrics_path = the_metrics_path;
  compact_threshold = the_compact_threshold;
  stopping = false;
  atomic_store (&refill_requested, false);
  atomic_store (&reserve_active, policy.reserve_always);
  if (policy.reserve_always && !policy.reserve_later)
    store_reserve_refill (store);
  stats_due = false;
  stats_thread_running = keeper_running = false;
  int err = 0;
  if (policy.reserve_always && (stats_path || metrics_path)) {
    if ((err = pthread_create (&stats_thread, NULL, stats_writer_main, NULL)))
      goto failed;
    stats_thread_running = true;
    pthread_setname_np (stats_thread, "zram-stats");
  }
  if (policy.reserve_always) {
    if ((err = pthread_create (&keeper_thread, NULL, reserve_keeper_main, NULL)))
      goto failed;
    keeper_running = true;
    pthread_setname_np (keeper_thread, "zram-reserve");
  }
  if ((err = pthread_create (&thread, NULL, housekeeper_main, NULL)))
    goto failed;
  /* Named, so that ps -L, perf and the kernel's traces tell them from
   * nbdkit's serving threads.
   */
  pthread_setname_np (thread, "zram-housekeep");
  running = true;
  return 0;

 failed:
  housekeeper_stop_helpers ();
  errno = err;
  return -1;
}

void
housekeeper_set_policy (const struct housekeeper_policy *the_policy)
{
  policy = *the_policy;
}

void
housekeeper_wake (void)
{
  if (atomic_load_explicit (&refill_requested, memory_order_relaxed)
      || atomic_exchange (&refill_requested, true))
    return;
  pthread_mutex_lock (&lock);
  pthread_cond_signal (keeper_running ? &reserve_wake : &wake);
  pthread_mutex_unlock (&lock);
}

bool
housekeeper_wait_refill (unsigned timeout_ms)
{
  struct timespec deadline;
  clock_gettime (CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += (timeout_ms % 1000) * 1000000l;
  if (deadline.tv_nsec >= 1000000000l) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000l;
  }
  pthread_mutex_lock (&lock);
  uint64_t seen = refills_done;
  bool ended = false;
  if (!stopping) {
    /* As housekeeper_wake, whatever the flag: this request waits. */
    atomic_store (&refill_requested, true);
    pthread_cond_signal (keeper_running ? &reserve_wake : &wake);
    while (refills_done == seen && !stopping
           && pthread_cond_clockwait (&refilled, &lock, CLOCK_MONOTONIC,
                                      &deadline) != ETIMEDOUT)
      ;
    ended = refills_done != seen;
  }
  pthread_mutex_unlock (&lock);
  return ended;
}

void
housekeeper_stop (void)
{
  if (!running)
    return;
  pthread_mutex_lock (&lock);
  stopping = true;
  pthread_cond_signal (&wake);
  pthread_cond_broadcast (&refilled);
  pthread_mutex_unlock (&lock);
  pthread_join (thread, NULL);
  housekeeper_stop_helpers ();
  running = false;
  housekeeping_round (true);    /* no refill: the store is going away */
  /* The stats file keeps the last figures; the metrics go with the
   * server, if the file there is still the one it wrote (a server that
   * took over since writes its own): a textfile collector would report
   * the device alive with its last values for ever.  After a crash the
   * file stays, and the collector's node_textfile_mtime_seconds shows it
   * growing old.
   */
  if (metrics_path)
    stats_output_remove (metrics_path, &metrics_written);
}
