/* The stats= file: zram's mm_stat and io_stat lines, then one
 * "key: value" per line, rewritten atomically (temporary file + rename);
 * the housekeeper (housekeeper.h) rewrites it every second and at exit.
 */

#ifndef ZRAM_STATS_FILE_H
#define ZRAM_STATS_FILE_H

#include <stdio.h>

#include "block-store.h"

/* Print the statistics in the stats file format. */
extern void stats_print (struct block_store *store, FILE *fp);

/* Print one of zram's sysfs files as zram does ("mm_stat", "io_stat",
 * "bd_stat"): 0, or -1 for another name.
 */
extern int stats_print_zram_file (struct block_store *store, const char *name,
                                  FILE *fp);

/* Whether the file can be written (a file beside it can be created):
 * 0, or -1 with errno.
 */
extern int stats_file_check (const char *path);

/* Write the file now: 0, or -1 with errno.  A failure is logged, once
 * until a write succeeds again (which is logged too): the housekeeper
 * tries each round.  One thread at a time: the housekeeper's, or its
 * stats writer (swap mode).
 */
extern int stats_file_write (struct block_store *store, const char *path);

#endif /* ZRAM_STATS_FILE_H */
