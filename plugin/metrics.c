/* The metrics exposition: see metrics.h. */

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zsalloc.h"
#include "metrics.h"

static char *device_label;      /* escaped for a label value */
static char info_algorithm[16];
static int info_level;

/* The device label's value: "zram" until metrics_configure. */
static const char *
label (void)
{
  return device_label ? device_label : "zram";
}

enum metric_type { GAUGE, COUNTER };

/* A metric taken from one field of struct store_stats. */
struct field_metric {
  const char *name;               /* counters end in _total */
  enum metric_type type;
  size_t offset;                  /* in struct store_stats */
  double scale;                   /* 0: the integer as it is */
  const char *help;
};

#define STORE(field) offsetof (struct store_stats, field)

/* In the stats file's order; the stats key each comes from is the field's
 * name.
 */
static const struct field_metric fields[] = {
  { "nbdkit_zram_disk_size_bytes", GAUGE, STORE (disk_size), 0,
    "Size of the device." },
  { "nbdkit_zram_orig_data_bytes", GAUGE, STORE (orig_data_size), 0,
    "Bytes of the blocks stored, same-filled ones included (zram's orig_data_size)." },
  { "nbdkit_zram_compr_data_bytes", GAUGE, STORE (compr_data_size), 0,
    "Compressed bytes of the blocks stored (zram's compr_data_size)." },
  { "nbdkit_zram_mem_used_bytes", GAUGE, STORE (mem_used_total), 0,
    "Bytes of the allocator's pages (zram's mem_used_total)." },
  { "nbdkit_zram_mem_limit_bytes", GAUGE, STORE (mem_limit), 0,
    "The memory limit (mem_limit; 0: none)." },
  { "nbdkit_zram_mem_limit_used_bytes", GAUGE, STORE (limit_used), 0,
    "Bytes the memory limit counts now." },
  { "nbdkit_zram_mem_used_max_bytes", GAUGE, STORE (mem_used_max), 0,
    "Most bytes of the allocator's pages since the start or a reset (zram's mem_used_max)." },
  { "nbdkit_zram_same_blocks", GAUGE, STORE (same_pages), 0,
    "Blocks stored as one repeated word, taking no memory (zram's same_pages)." },
  { "nbdkit_zram_compacted_pages_total", COUNTER, STORE (pages_compacted), 0,
    "Pages compaction freed (zram's pages_compacted)." },
  { "nbdkit_zram_freeable_pages", GAUGE, STORE (pages_freeable), 0,
    "Pages compaction could free now." },
  { "nbdkit_zram_compact_seconds_total", COUNTER, STORE (compact_ms), 0.001,
    "Time spent compacting." },
  { "nbdkit_zram_huge_blocks", GAUGE, STORE (huge_pages), 0,
    "Blocks stored uncompressed (zram's huge_pages)." },
  { "nbdkit_zram_huge_blocks_stored_total", COUNTER, STORE (huge_pages_since), 0,
    "Blocks stored uncompressed, ever (zram's huge_pages_since)." },
  { "nbdkit_zram_failed_reads_total", COUNTER, STORE (failed_reads), 0,
    "Reads that failed (zram's failed_reads)." },
  { "nbdkit_zram_failed_writes_total", COUNTER, STORE (failed_writes), 0,
    "Writes that failed, for memory or otherwise (zram's failed_writes)." },
  { "nbdkit_zram_invalid_io_total", COUNTER, STORE (invalid_io), 0,
    "Requests refused as invalid (zram's invalid_io)." },
  { "nbdkit_zram_notify_free_total", COUNTER, STORE (notify_free), 0,
    "Blocks freed by trims and zeroes (zram's notify_free)." },
  { "nbdkit_zram_reads_total", COUNTER, STORE (reads), 0,
    "Block reads served." },
  { "nbdkit_zram_writes_total", COUNTER, STORE (writes), 0,
    "Block writes served." },
  { "nbdkit_zram_table_bytes", GAUGE, STORE (table_bytes), 0,
    "Bytes of the block table." },
  { "nbdkit_zram_metadata_bytes", GAUGE, STORE (metadata_bytes), 0,
    "Bytes of the allocator's metadata." },
  { "nbdkit_zram_codec_bytes", GAUGE, STORE (codec_bytes), 0,
    "Bytes of compression contexts and batched writes' scratch." },
  { "nbdkit_zram_reserve_bytes", GAUGE, STORE (reserve_bytes), 0,
    "Swap mode: populated pages ready in the reserve." },
  { "nbdkit_zram_reserve_refilled_bytes_total", COUNTER, STORE (reserve_refills), 0,
    "Swap mode: bytes the reserve was topped up with." },
  { "nbdkit_zram_reserve_misses_total", COUNTER, STORE (reserve_misses), 0,
    "Swap mode: times a write asked the system for pages with the reserve empty." },
  { "nbdkit_zram_reserve_metadata_misses_total", COUNTER, STORE (reserve_metadata_misses), 0,
    "Swap mode: writes refused because the heap had no room ready for the allocator's metadata." },
  { "nbdkit_zram_recompressed_blocks", GAUGE, STORE (recomp_blocks), 0,
    "Blocks stored recompressed now." },
  { "nbdkit_zram_recompress_saved_bytes_total", COUNTER, STORE (recomp_bytes_saved), 0,
    "Bytes recompression saved." },
  { "nbdkit_zram_packed_blocks", GAUGE, STORE (packed_blocks), 0,
    "Blocks in packed units now." },
  { "nbdkit_zram_pack_units", GAUGE, STORE (pack_units), 0,
    "Packed units now." },
  { "nbdkit_zram_pack_dictionaries", GAUGE, STORE (pack_dictionaries), 0,
    "Trained dictionaries packed units use now." },
  { "nbdkit_zram_pack_dictionary_bytes", GAUGE, STORE (pack_dictionary_bytes), 0,
    "Bytes of packing's dictionaries and their decoders." },
  { "nbdkit_zram_decode_cache_bytes", GAUGE, STORE (decode_cache_bytes), 0,
    "Bytes of decoded packed units kept for reads." },
  { "nbdkit_zram_decode_cache_hits_total", COUNTER, STORE (decode_cache_hits), 0,
    "Reads of packed blocks the decode cache served." },
  { "nbdkit_zram_decode_cache_misses_total", COUNTER, STORE (decode_cache_misses), 0,
    "Reads of packed blocks that decoded their unit." },
  { "nbdkit_zram_backing_blocks", GAUGE, STORE (bd_count), 0,
    "Blocks written back, in the backing store now (zram's bd_count)." },
  { "nbdkit_zram_backing_block_reads_total", COUNTER, STORE (bd_reads), 0,
    "Blocks read from the backing store (zram's bd_reads)." },
  { "nbdkit_zram_backing_block_writes_total", COUNTER, STORE (bd_writes), 0,
    "Blocks written to the backing store (zram's bd_writes)." },
  { "nbdkit_zram_backing_stored_bytes", GAUGE, STORE (bd_bytes), 0,
    "Compressed bytes of the blocks in the backing store." },
  { "nbdkit_zram_backing_failed_reads_total", COUNTER, STORE (bd_failed_reads), 0,
    "Reads of written-back blocks that failed." },
  { "nbdkit_zram_backing_readbacks_total", COUNTER, STORE (bd_readbacks), 0,
    "Written-back blocks brought back into memory by reads." },
  { "nbdkit_zram_backing_capacity_bytes", GAUGE, STORE (backing_capacity), 0,
    "Bytes the backing store's space map covers (0: no backing store)." },
  { "nbdkit_zram_backing_used_bytes", GAUGE, STORE (backing_used), 0,
    "Bytes of the backing store in use." },
  { "nbdkit_zram_backing_map_bytes", GAUGE, STORE (backing_map_bytes), 0,
    "Bytes of the backing store's space map." },
  { "nbdkit_zram_backing_failed_total", COUNTER, STORE (backing_failed), 0,
    "Backing store requests that failed." },
  { "nbdkit_zram_backing_reconnects_total", COUNTER, STORE (backing_reconnects), 0,
    "Connections to an NBD backing store made again." },
  { "nbdkit_zram_backing_timeouts_total", COUNTER, STORE (backing_timeouts), 0,
    "NBD backing requests past their deadline (backing_timeout)." },
  { "nbdkit_zram_backing_corrupt_total", COUNTER, STORE (backing_corrupt), 0,
    "Written-back blocks whose checksum did not match." },
  { "nbdkit_zram_backing_abandoned_total", COUNTER, STORE (backing_abandoned), 0,
    "Backing writes and trims given up on after they were sent." },
  { "nbdkit_zram_backing_quarantined_bytes", GAUGE,
    STORE (backing_quarantined_bytes), 0,
    "Bytes of the backing store kept from reuse: abandoned requests may land there." },
  { "nbdkit_zram_backing_errors_nospace_total", COUNTER,
    STORE (backing_errors_nospace), 0,
    "Backing requests refused for space (the store is full)." },
  { "nbdkit_zram_backing_errors_io_total", COUNTER, STORE (backing_errors_io), 0,
    "Backing requests that failed otherwise (I/O errors, timeouts)." },
  { "nbdkit_zram_cap_bytes", GAUGE, STORE (cap), 0,
    "The device's cap: most bytes of objects it may hold (0: none)." },
  { "nbdkit_zram_floor_bytes", GAUGE, STORE (floor), 0,
    "The device's floor: bytes of objects no other device may take from it (0: none)." },
  { "nbdkit_zram_quota_bytes", GAUGE, STORE (quota_bytes), 0,
    "Bytes of the device's objects its cap and floor count (0 without either)." },
  { "nbdkit_zram_refused_for_budget_total", COUNTER, STORE (refused_for_budget), 0,
    "Allocations refused for the device's cap or another device's floor." },
  { "nbdkit_zram_budget_floors_bytes", GAUGE, STORE (budget_floors), 0,
    "The devices' floors, summed." },
  { "nbdkit_zram_budget_unmet_floors_bytes", GAUGE, STORE (budget_unmet_floors), 0,
    "The floors' room the devices have not used yet: kept from the others." },
};

int
metrics_configure (const char *device, const char *algorithm, int level)
{
  snprintf (info_algorithm, sizeof info_algorithm, "%s", algorithm);
  info_level = level;
  /* A label value escapes backslash, double quote and newline. */
  char *escaped = malloc (strlen (device) * 2 + 1), *out = escaped;
  if (!escaped)
    return -1;
  for (const char *in = device; *in; in++) {
    if (*in == '\\' || *in == '"')
      *out++ = '\\', *out++ = *in;
    else if (*in == '\n')
      *out++ = '\\', *out++ = 'n';
    else
      *out++ = *in;
  }
  *out = '\0';
  free (device_label);
  device_label = escaped;
  return 0;
}

void
metrics_unconfigure (void)
{
  free (device_label);
  device_label = NULL;
}

static void
family (FILE *fp, const char *name, enum metric_type type, const char *help)
{
  fprintf (fp, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
           type == COUNTER ? "counter" : "gauge");
}

static void
sample_integer (FILE *fp, const char *name, uint64_t value)
{
  fprintf (fp, "%s{device=\"%s\"} %" PRIu64 "\n", name, label (), value);
}

static void
sample_number (FILE *fp, const char *name, double value)
{
  fprintf (fp, "%s{device=\"%s\"} %.17g\n", name, label (), value);
}

static void
integer_metric (FILE *fp, const char *name, enum metric_type type,
                const char *help, uint64_t value)
{
  family (fp, name, type, help);
  sample_integer (fp, name, value);
}

/* A gauge that may be negative or a fraction. */
static void
number_metric (FILE *fp, const char *name, const char *help, double value)
{
  family (fp, name, GAUGE, help);
  sample_number (fp, name, value);
}

/* The allocator's per-class table: a sample per size class in use, all
 * from one read of each class's figures.
 */
static void
print_classes (const struct stats_sample *sample, FILE *fp)
{
  static const struct {
    const char *name, *help;
    size_t offset;
  } columns[] = {
    { "nbdkit_zram_class_objects", "Live objects in the size class.",
      offsetof (struct zs_class_stats, objs_used) },
    { "nbdkit_zram_class_object_slots", "Object slots in the size class's zspages.",
      offsetof (struct zs_class_stats, objs_allocated) },
    { "nbdkit_zram_class_pages", "Pages of the size class's zspages.",
      offsetof (struct zs_class_stats, pages_used) },
    { "nbdkit_zram_class_freeable_pages", "Pages compaction could free in the size class.",
      offsetof (struct zs_class_stats, pages_freeable) },
  };
  const struct zs_class_stats *classes = sample->classes;
  unsigned count = sample->class_count;
  for (size_t c = 0; c < sizeof columns / sizeof columns[0]; c++) {
    family (fp, columns[c].name, GAUGE, columns[c].help);
    for (unsigned i = 0; classes && i < count; i++) {
      if (classes[i].pages_used == 0)
        continue;
      uint64_t value;
      memcpy (&value, (const char *) &classes[i] + columns[c].offset,
              sizeof value);
      fprintf (fp, "%s{device=\"%s\",class=\"%u\",size=\"%u\"} %" PRIu64 "\n",
               columns[c].name, label (), i, classes[i].size, value);
    }
  }
}

/* The figures that are each device's own (its store's counters), with
 * a sample per device (device="LABEL/NAME") after the default export's;
 * the others are the shared pool's or the server's, once.
 */
static bool
per_device (size_t offset)
{
  static const size_t own[] = {
    STORE (disk_size), STORE (orig_data_size), STORE (compr_data_size),
    STORE (same_pages), STORE (huge_pages), STORE (huge_pages_since),
    STORE (failed_reads), STORE (failed_writes), STORE (invalid_io),
    STORE (notify_free), STORE (reads), STORE (writes), STORE (table_bytes),
    STORE (cap), STORE (floor), STORE (quota_bytes),
    STORE (refused_for_budget),
    /* Each device's blocks in the one cold tier; the tier's own figures
     * (capacity, map, errors) are the server's, once.
     */
    STORE (bd_count), STORE (bd_reads), STORE (bd_writes), STORE (bd_bytes),
    STORE (bd_failed_reads), STORE (bd_readbacks),
  };
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
    if (own[i] == offset)
      return true;
  return false;
}

void
metrics_print_sample (const struct stats_sample *sample, FILE *fp)
{
  const struct store_stats *s = &sample->store;

  /* The device's constants as labels, value 1 (Prometheus' _info
   * convention): joined to any other series by its device label.
   */
  static const char *const swap_modes[] = { "off", "on", "try" };
  unsigned mode = sample->swap.mode_number;
  family (fp, "nbdkit_zram_info", GAUGE,
          "The device: its compression algorithm and level, the plugin's "
          "version, swap mode (value 1).");
  fprintf (fp, "nbdkit_zram_info{device=\"%s\",algorithm=\"%s\",level=\"%d\","
           "version=\"%s\",swap_mode=\"%s\"} 1\n", label (), info_algorithm,
           info_level, PACKAGE_VERSION,
           mode < sizeof swap_modes / sizeof *swap_modes ? swap_modes[mode] : "?");
  integer_metric (fp, "nbdkit_zram_samples_total", COUNTER,
                  "Samples of the figures taken (the stats file's sample).",
                  sample->number);
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    uint64_t value;
    memcpy (&value, (const char *) s + fields[i].offset, sizeof value);
    family (fp, fields[i].name, fields[i].type, fields[i].help);
    if (fields[i].scale)
      sample_number (fp, fields[i].name, value * fields[i].scale);
    else
      sample_integer (fp, fields[i].name, value);
    for (unsigned d = 0; per_device (fields[i].offset)
           && d < sample->device_count; d++) {
      memcpy (&value, (const char *) &sample->devices[d].store
              + fields[i].offset, sizeof value);
      fprintf (fp, "%s{device=\"%s/%s\"} %" PRIu64 "\n", fields[i].name,
               label (), sample->devices[d].name, value);
    }
  }
  /* Borrowed: what the exports hold beyond an even share of mem_limit
   * each, which a split of the budget (kernel zram's mem_limit per
   * device) would have refused them.
   */
  {
    uint64_t share = s->mem_limit / (sample->device_count + 1), borrowed = 0;
    for (unsigned d = 0; s->mem_limit && d <= sample->device_count; d++) {
      uint64_t held = d ? sample->devices[d - 1].store.compr_data_size
        : s->compr_data_size;
      borrowed += held > share ? held - share : 0;
    }
    integer_metric (fp, "nbdkit_zram_budget_borrowed_bytes", GAUGE,
                    "Bytes the exports hold beyond an even share of "
                    "mem_limit each (what a split budget would refuse).",
                    borrowed);
  }
  if (s->writeback_limit_left != UINT64_MAX)
    integer_metric (fp, "nbdkit_zram_writeback_limit_bytes", GAUGE,
                    "Bytes writeback may still write (writeback_limit).",
                    s->writeback_limit_left);
  integer_metric (fp, "nbdkit_zram_process_resident_bytes", GAUGE,
                  "Resident memory of the server process.",
                  sample->process_rss);
  integer_metric (fp, "nbdkit_zram_process_resident_file_bytes", GAUGE,
                  "Of it, mapped files: nbdkit, the plugin, the libraries.",
                  sample->process_rss_files);
  number_metric (fp, "nbdkit_zram_process_resident_beyond_store_bytes",
                 "Of it, neither files nor what the store counts: "
                 "buffers, free heap, stacks.",
                 (double) sample->process_rss_beyond_store);
  integer_metric (fp, "nbdkit_zram_swap_mode", GAUGE,
                  "Swap mode: 0 off, 1 on, 2 try.", sample->swap.mode_number);
  integer_metric (fp, "nbdkit_zram_swap_locked_bytes", GAUGE,
                  "Locked memory that is resident.", sample->swap.locked_bytes);
  integer_metric (fp, "nbdkit_zram_swap_locked_mappings_bytes", GAUGE,
                  "Locked mappings in full, touched or not (VmLck).",
                  sample->swap.locked_mappings_bytes);
  integer_metric (fp, "nbdkit_zram_swap_memory_locked", GAUGE,
                  "Whether swap mode locked memory as it is touched (1, 0).",
                  (uint64_t) sample->swap.memory_locked);
  number_metric (fp, "nbdkit_zram_swap_realtime_priority",
                 "Real-time priority of the server (0: not real-time).",
                 sample->swap.realtime_priority);
  integer_metric (fp, "nbdkit_zram_swap_io_flusher", GAUGE,
                  "Whether swap mode made the server an IO flusher at start (1, 0).",
                  (uint64_t) sample->swap.io_flusher);
  number_metric (fp, "nbdkit_zram_swap_io_flusher_worker",
                 "Whether the first request's worker runs as an IO flusher (1, 0; -1 before a write in swap mode).",
                 sample->swap.io_flusher_worker);
  number_metric (fp, "nbdkit_zram_swap_oom_score_adj",
                 "The server's oom_score_adj.", sample->swap.oom_score_adj);
  integer_metric (fp, "nbdkit_zram_swap_write_faults_total", COUNTER,
                  "Page faults taken inside writes, trims and zeroes (swap mode; the target is 0).",
                  sample->swap.write_faults);
  integer_metric (fp, "nbdkit_zram_swap_read_faults_total", COUNTER,
                  "Page faults taken inside reads (swap mode).",
                  sample->swap.read_faults);
  integer_metric (fp, "nbdkit_zram_swap_stacks_ready_total", COUNTER,
                  "Serving threads whose stacks the reserve keeper made resident before their first request (swap mode).",
                  sample->swap.stacks_ready);
  integer_metric (fp, "nbdkit_zram_swap_stack_faults_total", COUNTER,
                  "Of the request faults, those of a thread's first request touching a stack the keeper had not made ready (swap mode).",
                  sample->swap.stack_faults);
  integer_metric (fp, "nbdkit_zram_swap_full_refusals_total", COUNTER,
                  "Writes refused for lack of room (mem_limit), swap mode.",
                  sample->swap_full.refusals);
  integer_metric (fp, "nbdkit_zram_swap_full_now", GAUGE,
                  "Whether writes are being refused for lack of room now (1, 0).",
                  (uint64_t) sample->swap_full.full);
  integer_metric (fp, "nbdkit_zram_swap_full_oom_kills_total", COUNTER,
                  "Times the kernel's OOM killer was asked to act for a full device (swap_full=oom).",
                  sample->swap_full.kills);
  number_metric (fp, "nbdkit_zram_swap_full_kill_delay_max_seconds",
                 "Longest time from the start of refused writes to asking the OOM killer.",
                 sample->swap_full.kill_delay_max_ms / 1000.0);
  if (sample->handover.enabled) {
    integer_metric (fp, "nbdkit_zram_generation", GAUGE,
                    "Servers that have served this device's region, this one included (region=).",
                    sample->handover.generation);
    integer_metric (fp, "nbdkit_zram_restarts_total", COUNTER,
                    "Servers that took the device's region over from an earlier one (region=).",
                    sample->handover.restarts);
    integer_metric (fp, "nbdkit_zram_recoveries_total", COUNTER,
                    "Of them, those that took it over after its server died (region=).",
                    sample->handover.recoveries);
    integer_metric (fp, "nbdkit_zram_recovery_restarts_total", COUNTER,
                    "Recoveries that started over a recovery that was itself cut short (region=).",
                    sample->handover.recovery_restarts);
    integer_metric (fp, "nbdkit_zram_recovered_blocks", GAUGE,
                    "Blocks this server found in the region when it took it over (region=).",
                    sample->handover.recovered_blocks);
    number_metric (fp, "nbdkit_zram_recovery_seconds",
                   "Time this server took to take the region over (region=).",
                   sample->handover.recovery_ms / 1000.0);
    number_metric (fp, "nbdkit_zram_downtime_seconds",
                   "From the last server's stop to this one serving (region=; 0 for the first).",
                   sample->handover.downtime_ms / 1000.0);
  }
  number_metric (fp, "nbdkit_zram_compression_ratio",
                 "Bytes stored over compressed bytes.",
                 sample->compression_ratio);
  number_metric (fp, "nbdkit_zram_memory_ratio",
                 "Bytes stored over the allocator's pages.",
                 sample->memory_ratio);
  if (sample->classes)
    print_classes (sample, fp);
}

void
metrics_print (struct block_store *store, FILE *fp)
{
  struct stats_sample sample;
  stats_sample_take (store, true, &sample);
  metrics_print_sample (&sample, fp);
  stats_sample_release (&sample);
}
