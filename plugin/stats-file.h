/* The stats= file's format: zram's mm_stat and io_stat lines, then one
 * "key: value" per line, of one sample (stats-sample.h); and the writing
 * of an output file, atomically (temporary file + rename), which the
 * housekeeper (housekeeper.h) does for it and for the metrics= file
 * (metrics.h) every second and at exit.
 */

#ifndef ZRAM_STATS_FILE_H
#define ZRAM_STATS_FILE_H

#include <stdio.h>
#include <sys/types.h>

#include <stdbool.h>

#include "block-store.h"
#include "stats-sample.h"

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
/* The same of the server's totals (stats_sample_totals): store is the
 * default export's.
 */
extern int stats_print_zram_file_totals (struct block_store *store,
                                         const char *name, FILE *fp);
/* Whether a file can be written at path (a file beside it can be
 * created, and what is at path, if anything, is a regular file or a
 * symbolic link): 0, or -1 with errno (EISDIR: a directory; EEXIST:
 * another kind of file, such as a FIFO, a socket or a device).
 */
extern int stats_file_check (const char *path);
/* Write an output file (the stats file, the metrics file) at path, what
 * print prints of sample, atomically (a temporary file beside it,
 * created exclusively with mode 0644, renamed over it): 0, or -1 with
 * errno.  A failure is logged, once until a write succeeds again (which
 * is logged too; *failed, the caller's, remembers): the housekeeper
 * tries each round.  what names the file in the log.
 */
/* The file a write put in place (its device and inode), to tell later
 * whether what is at the path is still it.
 */
struct output_file {
  dev_t device;
  ino_t inode;
  bool written;
};
extern int stats_output_write (const char *what, const char *path,
                               bool *failed,
                               void (*print) (const struct stats_sample *sample,
                                              FILE *fp),
                               const struct stats_sample *sample,
                               struct output_file *written);
/* Remove the file at path if it is still the one written (nothing else
 * is removed: a file a later server put there, a link, another file):
 * the metrics at exit, so that a textfile collector stops reporting a
 * stopped device as alive.
 */
extern void stats_output_remove (const char *path,
                                 const struct output_file *written);
#endif /* ZRAM_STATS_FILE_H */
