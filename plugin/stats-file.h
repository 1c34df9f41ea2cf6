/* The stats= file: zram's mm_stat and io_stat lines, then one
 * "key: value" per line, rewritten atomically (temporary file + rename);
 * the housekeeper (housekeeper.h) rewrites it, and the metrics= file
 * (metrics.h), every second and at exit.
 */

#ifndef ZRAM_STATS_FILE_H
#define ZRAM_STATS_FILE_H

#include <stdio.h>

#include "block-store.h"
#include "swap-full.h"
#include "swap-mode.h"

/* Everything the stats file and the metrics (metrics.h) show, taken at
 * one moment: the two files a round writes come from one sample.
 */
struct stats_sample {
  uint64_t number;                /* 1 for the first sample taken, +1 each
                                     (the stats file's "sample") */
  struct store_stats store;
  uint64_t process_rss;           /* bytes resident */
  /* Bytes stored over what the objects take (compression) and over what
   * the pool's pages take (memory: zram users quote it as "memory
   * saved"); 0 while nothing is stored.
   */
  double compression_ratio, memory_ratio;
  struct swap_mode_status swap;
  struct swap_full_status swap_full;
};
extern void stats_sample_take (struct block_store *store,
                               struct stats_sample *sample);

/* Print the statistics in the stats file format: a new sample, or one
 * taken already.
 */
extern void stats_print (struct block_store *store, FILE *fp);
extern void stats_print_sample (const struct stats_sample *sample, FILE *fp);
/* Print one of zram's sysfs files as zram does ("mm_stat", "io_stat",
 * "bd_stat"): 0, or -1 for another name.
 */
extern int stats_print_zram_file (struct block_store *store, const char *name,
                                  FILE *fp);
/* Whether a file can be written at path (a file beside it can be
 * created, and what is at path, if anything, is a regular file or a
 * symbolic link): 0, or -1 with errno (EISDIR: a directory; EEXIST:
 * another kind of file, such as a FIFO, a socket or a device).
 */
extern int stats_file_check (const char *path);
/* Write the stats file and the metrics file (either path may be NULL)
 * now, from one sample, each atomically (a temporary file beside it,
 * created exclusively with mode 0644, renamed over it): 0, or -1 with
 * errno.  A failure is logged, once until a write succeeds again (which
 * is logged too): the housekeeper tries each round.  One thread at a
 * time: the housekeeper's, or its stats writer (swap mode).
 */
extern int stats_files_write (struct block_store *store, const char *stats_path,
                              const char *metrics_path);
#endif /* ZRAM_STATS_FILE_H */
