/* One sample of the server's figures: see stats-sample.h. */

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "proc-files.h"
#include "stats-sample.h"

static uint64_t
process_rss_bytes (void)
{
  unsigned long pages_total, pages_resident;
  FILE *fp = fopen ("/proc/self/statm", "r");
  if (!fp)
    return 0;
  int n = fscanf (fp, "%lu %lu", &pages_total, &pages_resident);
  fclose (fp);
  return n == 2 ? (uint64_t) pages_resident * sysconf (_SC_PAGESIZE) : 0;
}

/* RssFile, in bytes (0 when unknown).  Not statm's shared pages: those
 * include shared memory, where region= keeps the pool.
 */
static uint64_t
process_rss_files_bytes (void)
{
  int64_t kib = self_status_number ("RssFile", 10);
  return kib > 0 ? (uint64_t) kib * 1024 : 0;
}

static double
ratio (uint64_t numerator, uint64_t denominator)
{
  return denominator ? (double) numerator / denominator : 0;
}

/* devices_each's visit: one more device's figures (a device that cannot
 * be added for want of memory is left out).
 */
static void
device_figures_add (struct device *device, void *opaque)
{
  struct stats_sample *sample = opaque;
  struct device_figures *grown = realloc (sample->devices,
                                          (sample->device_count + 1)
                                          * sizeof *grown);
  if (!grown)
    return;
  sample->devices = grown;
  struct device_figures *figures = &grown[sample->device_count++];
  snprintf (figures->name, sizeof figures->name, "%s", device->spec.name);
  store_stats (device->store, &figures->store);
}

/* Samples taken, ever: the number of the next. */
static _Atomic uint64_t samples;

void
stats_sample_take (struct block_store *store, bool with_classes,
                   struct stats_sample *sample)
{
  sample->number = atomic_fetch_add (&samples, 1) + 1;
  store_stats (store, &sample->store);
  sample->process_rss = process_rss_bytes ();
  sample->process_rss_files = process_rss_files_bytes ();
  sample->process_rss_beyond_store = (int64_t) sample->process_rss
    - (int64_t) sample->process_rss_files
    - (int64_t) store_stats_memory (&sample->store);
  sample->compression_ratio = ratio (sample->store.orig_data_size,
                                     sample->store.compr_data_size);
  sample->memory_ratio = ratio (sample->store.orig_data_size,
                                sample->store.mem_used_total);
  swap_mode_status (&sample->swap);
  swap_full_status (&sample->swap_full);
  handover_status_get (&sample->handover);
  sample->devices = NULL;
  sample->device_count = 0;
  devices_each (device_figures_add, sample);
  sample->classes = NULL;
  sample->class_count = 0;
  if (!with_classes)
    return;
  unsigned count = store_class_count (store);
  sample->classes = calloc (count, sizeof *sample->classes);
  if (!sample->classes)
    return;
  sample->class_count = count;
  for (unsigned i = 0; i < count; i++)
    if (store_class_stats (store, i, &sample->classes[i]) == -1)
      sample->classes[i].pages_used = 0;        /* left out */
}

void
stats_sample_release (struct stats_sample *sample)
{
  free (sample->classes);
  sample->classes = NULL;
  sample->class_count = 0;
  free (sample->devices);
  sample->devices = NULL;
  sample->device_count = 0;
}

void
stats_sample_totals (const struct stats_sample *sample,
                     struct store_stats *total)
{
  *total = sample->store;
  for (unsigned i = 0; i < sample->device_count; i++) {
    const struct store_stats *d = &sample->devices[i].store;
#define ADD(field) total->field += d->field
    ADD (disk_size); ADD (orig_data_size); ADD (compr_data_size);
    ADD (same_pages); ADD (huge_pages); ADD (huge_pages_since);
    ADD (failed_reads); ADD (failed_writes); ADD (invalid_io);
    ADD (notify_free); ADD (reads); ADD (writes); ADD (table_bytes);
    ADD (codec_bytes); ADD (recomp_blocks); ADD (recomp_bytes_saved);
    ADD (packed_blocks); ADD (pack_units); ADD (pack_dictionaries);
    ADD (pack_dictionary_bytes); ADD (decode_cache_bytes);
    ADD (decode_cache_hits); ADD (decode_cache_misses);
    ADD (bd_count); ADD (bd_reads); ADD (bd_writes); ADD (bd_bytes);
    ADD (bd_failed_reads); ADD (bd_readbacks);
#undef ADD
  }
}
