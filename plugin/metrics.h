/* The metrics: every figure of the stats file (stats-file.h), the
 * allocator's per-class table and the policies' counters, in the
 * Prometheus text exposition format (version 0.0.4, which node_exporter's
 * textfile collector and Prometheus itself read): names in the
 * nbdkit_zram_ namespace with their unit (_bytes, _seconds, _total for
 * counters), a # HELP and a # TYPE line for each, and a device label (the
 * plugin's name= parameter) on every sample.  Written to metrics=PATH by
 * the housekeeper with the stats file, from the same sample, and printed
 * by the control channel's "metrics" command.  man/nbdkit-zram-metrics.pod
 * lists them (METRICS).
 */

#ifndef ZRAM_METRICS_H
#define ZRAM_METRICS_H

#include <stdio.h>

#include "block-store.h"
#include "stats-sample.h"

/* Before any print: the device label's value, and what the
 * nbdkit_zram_info family says of the device (its compression algorithm
 * and level), copied.  0, or -1 with errno.
 */
extern int metrics_configure (const char *device, const char *algorithm,
                              int level);
extern void metrics_unconfigure (void);

/* Print the exposition of a sample taken already (its per-class table
 * if it has one), or of a new one of store's.
 */
extern void metrics_print_sample (const struct stats_sample *sample, FILE *fp);
extern void metrics_print (struct block_store *store, FILE *fp);

#endif /* ZRAM_METRICS_H */
