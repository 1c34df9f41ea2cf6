/* The housekeeper: one background thread that, every second, frees the
 * block table's empty leaves and drains the allocator's deferred frees
 * and resident free pages (store_flush), so memory comes back within a
 * second of being freed even when no request arrives, frees the decode
 * cache's slots not read since the last round (store_decode_cache_sweep;
 * kept in swap mode), compacts the pool when enough of it is waste
 * (compact=auto), runs the automatic idle, recompression and packing
 * policy (housekeeper_set_policy) on the default store and on every
 * device (sharing one store's budget), tops up the swap reserve
 * (swap mode), then rewrites the stats= file when there is one.  A
 * request that finds the reserve below half wakes it early
 * (housekeeper_wake).
 *
 * Threads do not survive nbdkit's fork: start it in .after_fork, stop it
 * in .cleanup (a thread started in .config_complete is lost when
 * nbdkit forks into the background).
 */

#ifndef ZRAM_HOUSEKEEPER_H
#define ZRAM_HOUSEKEEPER_H

#include "block-store.h"

/* stats_path and metrics_path (the stats= and metrics= files, written
 * from one sample each round: stats-file.h) may be NULL.  compact_threshold: compact the pool when the
 * pages compaction could free reach this percent of its pages (-1:
 * never).  With policy.reserve_always, fills the reserve before it
 * returns.  0, or -1 with errno.
 */
extern int housekeeper_start (struct block_store *store, const char *stats_path,
                              const char *metrics_path, int compact_threshold);
/* The automatic policy (off by default): every round, mark the blocks
 * not accessed for idle_after seconds idle, and recompress (with the
 * store's recompression algorithms) idle blocks not accessed for
 * recompress_after seconds, at most a few thousand per round.  0: off.
 * Before housekeeper_start.
 */
struct housekeeper_policy {
  uint32_t idle_after;
  uint32_t recompress_after;
  uint32_t pack_after;            /* pack idle blocks this old; and
                                     dissolve units under half live */
  unsigned writeback_watermark;   /* percent of mem_limit: above it, write
                                     the coldest blocks back until 10
                                     points below it (0: off) */
  bool reserve_always;            /* swap mode: the reserve is filled by
                                     housekeeper_start, before the first
                                     request, and kept (else it is kept
                                     from the first wake, and given back
                                     while the store is empty); and the
                                     stats file is written by a thread of
                                     its own, so that a write stuck in
                                     reclaim never stops the refills; and
                                     the reserve is kept by a thread of
                                     its own, the reserve keeper */
  bool reserve_later;             /* with reserve_always: not filled by
                                     housekeeper_start but by the keeper
                                     once serving (a server that took its
                                     device over: the kernel waits on it,
                                     and memory populated before it
                                     serves may be what only swapping,
                                     through it, can give back) */
  /* Each round, after the store's frees: visit(device's store, number
   * of devices, opaque) for each of the server's other devices
   * (devices.h), or NULL.
   */
  void (*devices_round) (void (*visit) (struct block_store *store,
                                        unsigned devices, void *opaque),
                         void *opaque);
  void (*reserve_tick) (void);   /* with reserve_always: called
                                     by the reserve keeper after each
                                     refill, a few times a second (the
                                     heap's and new threads' stacks'
                                     readiness, zram.c); or NULL */
};
extern void housekeeper_set_policy (const struct housekeeper_policy *policy);

/* Wake the thread now (the reserve keeper, with reserve_always): the
 * swap reserve is low (the first wake starts keeping it).
 */
extern void housekeeper_wake (void);
/* Wake the thread for a refill, as housekeeper_wake, and wait until one
 * ends (true), or timeout_ms pass or the thread stops (false).  Waits on
 * the thread only, never on memory itself: a refill held in the
 * kernel's reclaim costs the caller timeout_ms, not a deadlock.
 */
extern bool housekeeper_wait_refill (unsigned timeout_ms);
/* Stop the thread, then flush and write the stats file one last time. */
extern void housekeeper_stop (void);

#endif /* ZRAM_HOUSEKEEPER_H */
