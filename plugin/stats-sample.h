/* One sample of every figure the server reports, taken at one moment:
 * the stats file (stats-file.h) and the metrics (metrics.h) are two
 * formats of it, as zram's mm_stat, io_stat and bd_stat are show
 * functions over one set of counters.  The housekeeper takes one a round
 * and writes both files from it; the control channel takes one for its
 * stats and metrics commands.
 */
#ifndef ZRAM_STATS_SAMPLE_H
#define ZRAM_STATS_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "block-store.h"
#include "devices.h"
#include "handover.h"
#include "swap-full.h"
#include "swap-mode.h"
#include "zsalloc.h"

struct stats_sample {
  uint64_t number;                /* 1 for the first sample taken, +1 each
                                     (the stats file's "sample") */
  struct store_stats store;
  uint64_t process_rss;           /* bytes resident */
  uint64_t process_rss_files;     /* of them, mapped files: nbdkit, the
                                     plugin, the libraries (RssFile) */
  int64_t process_rss_beyond_store; /* of them, neither files nor what the
                                     store counts (store_stats_memory):
                                     nbdkit's and the requests' buffers,
                                     the C library's free heap, stacks -
                                     the `memory` command says which */
  /* Bytes stored over what the objects take (compression) and over what
   * the pool's pages take (memory: zram users quote it as "memory
   * saved"); 0 while nothing is stored.
   */
  double compression_ratio, memory_ratio;
  struct swap_mode_status swap;
  struct swap_full_status swap_full;
  struct handover_status handover;
  /* The allocator's size classes (with_classes; else NULL, 0): a class
   * whose figures could not be read has pages_used 0.
   */
  struct zs_class_stats *classes;
  unsigned class_count;
  /* The server's devices (devices.h) at the same moment, each its own
   * store's figures (the pool's are the default store's above); NULL, 0
   * when there are none.
   */
  struct device_figures *devices;
  unsigned device_count;
};

struct device_figures {
  char name[DEVICE_NAME_MAX + 1];
  struct store_stats store;
};

/* Take a sample of store; with_classes: the per-class table too (the
 * metrics show it).  stats_sample_release frees what it holds.
 */
extern void stats_sample_take (struct block_store *store, bool with_classes,
                               struct stats_sample *sample);
extern void stats_sample_release (struct stats_sample *sample);
/* The server's totals (device=* on the control channel): the default
 * export's figures with every device's added, where they are a store's
 * own (data, objects, requests, failures, the cold tier's); the pool's
 * (mem_used_total, mem_limit, limit_used, mem_used_max, compaction,
 * metadata, the reserve) once, as the devices share the default's pool.
 */
extern void stats_sample_totals (const struct stats_sample *sample,
                                 struct store_stats *total);

#endif /* ZRAM_STATS_SAMPLE_H */
