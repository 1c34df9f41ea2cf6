/* The stats= file's format, and the writing of an output file: see
 * stats-file.h.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "error-text.h"
#include "stats-file.h"
#include "swap-mode.h"

/* zram's own column orders (Documentation/admin-guide/blockdev/zram.rst). */
static void
print_mm_stat (const struct store_stats *s, FILE *fp)
{
  fprintf (fp, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
           " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
           s->orig_data_size, s->compr_data_size, s->mem_used_total,
           s->mem_limit, s->mem_used_max, s->same_pages, s->pages_compacted,
           s->huge_pages, s->huge_pages_since);
}

static void
print_io_stat (const struct store_stats *s, FILE *fp)
{
  fprintf (fp, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
           s->failed_reads, s->failed_writes, s->invalid_io, s->notify_free);
}

/* zram's bd_stat: bd_count bd_reads bd_writes, in 4 KiB units. */
static void
print_bd_stat (const struct store_stats *s, FILE *fp)
{
  fprintf (fp, "%" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
           s->bd_count, s->bd_reads, s->bd_writes);
}

/* One of zram's files, of s. */
static int
print_zram_file (const struct store_stats *s, const char *name, FILE *fp)
{
  if (strcmp (name, "mm_stat") == 0)
    print_mm_stat (s, fp);
  else if (strcmp (name, "io_stat") == 0)
    print_io_stat (s, fp);
  else if (strcmp (name, "bd_stat") == 0)
    print_bd_stat (s, fp);
  else
    return -1;
  return 0;
}

int
stats_print_zram_file (struct block_store *store, const char *name, FILE *fp)
{
  struct store_stats s;
  store_stats (store, &s);
  return print_zram_file (&s, name, fp);
}

int
stats_print_zram_file_totals (struct block_store *store, const char *name,
                              FILE *fp)
{
  struct stats_sample sample;
  struct store_stats total;
  stats_sample_take (store, false, &sample);
  stats_sample_totals (&sample, &total);
  stats_sample_release (&sample);
  return print_zram_file (&total, name, fp);
}

void
stats_print (struct block_store *store, FILE *fp)
{
  struct stats_sample sample;
  stats_sample_take (store, false, &sample);
  stats_print_sample (&sample, fp);
  stats_sample_release (&sample);
}

void
stats_print_sample (const struct stats_sample *sample, FILE *fp)
{
  struct store_stats s = sample->store;

  fprintf (fp, "mm_stat ");
  print_mm_stat (&s, fp);
  fprintf (fp, "io_stat ");
  print_io_stat (&s, fp);
  fprintf (fp, "bd_stat ");
  print_bd_stat (&s, fp);

#define FIELD(name) fprintf (fp, #name ": %" PRIu64 "\n", s.name)
  fprintf (fp, "sample: %" PRIu64 "\n", sample->number);
  FIELD (disk_size);
  FIELD (orig_data_size);
  FIELD (compr_data_size);
  FIELD (mem_used_total);
  FIELD (mem_limit);
  FIELD (limit_used);
  FIELD (mem_used_max);
  FIELD (same_pages);
  FIELD (pages_compacted);
  FIELD (pages_freeable);
  FIELD (compact_ms);
  FIELD (huge_pages);
  FIELD (huge_pages_since);
  FIELD (failed_reads);
  FIELD (failed_writes);
  FIELD (invalid_io);
  FIELD (notify_free);
  FIELD (reads);
  FIELD (writes);
  FIELD (table_bytes);
  FIELD (metadata_bytes);
  FIELD (codec_bytes);
  FIELD (reserve_bytes);
  FIELD (reserve_refills);
  FIELD (reserve_misses);
  FIELD (reserve_metadata_misses);
  FIELD (recomp_blocks);
  FIELD (recomp_bytes_saved);
  FIELD (packed_blocks);
  FIELD (pack_units);
  FIELD (pack_dictionaries);
  FIELD (pack_dictionary_bytes);
  FIELD (decode_cache_bytes);
  FIELD (decode_cache_hits);
  FIELD (decode_cache_misses);
  FIELD (bd_count);
  FIELD (bd_reads);
  FIELD (bd_writes);
  FIELD (bd_bytes);
  FIELD (bd_failed_reads);
  FIELD (bd_readbacks);
  FIELD (backing_capacity);
  FIELD (backing_used);
  FIELD (backing_map_bytes);
  FIELD (backing_failed);
  FIELD (backing_reconnects);
  FIELD (backing_timeouts);
  FIELD (backing_corrupt);
  FIELD (backing_abandoned);
  FIELD (backing_quarantined_bytes);
  FIELD (backing_errors_nospace);
  FIELD (backing_errors_io);
  FIELD (cap);
  FIELD (floor);
  FIELD (quota_bytes);
  FIELD (refused_for_budget);
  FIELD (budget_floors);
  FIELD (budget_unmet_floors);
#undef FIELD
  if (s.writeback_limit_left != UINT64_MAX)
    fprintf (fp, "writeback_limit: %" PRIu64 "\n", s.writeback_limit_left);
  fprintf (fp, "process_rss: %" PRIu64 "\n", sample->process_rss);
  fprintf (fp, "process_rss_files: %" PRIu64 "\n", sample->process_rss_files);
  fprintf (fp, "process_rss_beyond_store: %" PRId64 "\n",
           sample->process_rss_beyond_store);
  swap_mode_print (&sample->swap, fp);
  swap_full_print (&sample->swap_full, fp);
  handover_print (&sample->handover, fp);
  fprintf (fp, "compression_ratio: %.2f\n", sample->compression_ratio);
  fprintf (fp, "memory_ratio: %.2f\n", sample->memory_ratio);
}

/* Create the temporary file a write goes through, beside the real one so
 * that rename() is atomic: a random name (mkostemp), created exclusively
 * (O_EXCL: a symbolic link planted at the name is never followed), mode
 * 0644.  The rename replaces whatever is at path, a planted link
 * included, without following it.  A stream, with *temporary the name to
 * free; NULL with errno on failure.
 */
static FILE *
temporary_create (const char *path, char **temporary)
{
  if (asprintf (temporary, "%s.tmp.XXXXXX", path) == -1)
    return NULL;
  int fd = mkostemp (*temporary, O_CLOEXEC);
  FILE *fp = NULL;
  if (fd != -1 && fchmod (fd, 0644) == 0)
    fp = fdopen (fd, "w");
  if (!fp) {
    int saved = errno;
    if (fd != -1) {
      close (fd);
      unlink (*temporary);
    }
    free (*temporary);
    *temporary = NULL;
    errno = saved;
  }
  return fp;
}

int
stats_file_check (const char *path)
{
  /* Each write renames a new file over path: a directory there refuses
   * every rename (EISDIR, so the file would never be written), and a
   * FIFO, socket or device would be replaced by a plain file, which is
   * not what whoever named it meant.  A regular file, or a symbolic
   * link (replaced, never followed), is fine; so is nothing.
   */
  struct stat st;
  if (lstat (path, &st) == 0
      && !S_ISREG (st.st_mode) && !S_ISLNK (st.st_mode)) {
    errno = S_ISDIR (st.st_mode) ? EISDIR : EEXIST;
    return -1;
  }
  char *temporary;
  FILE *fp = temporary_create (path, &temporary);
  if (!fp)
    return -1;
  fclose (fp);
  unlink (temporary);
  free (temporary);
  return 0;
}

/* Write one file at path through a temporary: what print prints; the
 * file put in place into *written.
 */
static int
file_write_once (const char *path,
                 void (*print) (const struct stats_sample *sample, FILE *fp),
                 const struct stats_sample *sample, struct output_file *written)
{
  char *temporary;
  FILE *fp = temporary_create (path, &temporary);
  if (!fp)
    return -1;
  print (sample, fp);
  struct stat st;
  int r = fstat (fileno (fp), &st);
  r = fclose (fp) == 0 && r == 0 ? rename (temporary, path) : -1;
  if (r == 0 && written)
    *written = (struct output_file) {
      .device = st.st_dev, .inode = st.st_ino, .written = true,
    };
  if (r == -1) {
    int saved = errno;
    unlink (temporary);
    errno = saved;
  }
  free (temporary);
  return r;
}

int
stats_output_write (const char *what, const char *path, bool *failed,
                    void (*print) (const struct stats_sample *sample, FILE *fp),
                    const struct stats_sample *sample,
                    struct output_file *written)
{
  int r = file_write_once (path, print, sample, written);
  if (r == -1 && !*failed)
    nbdkit_error ("%s file '%s': cannot write it: %s (trying again each "
                  "round)", what, path, error_text (errno));
  else if (r == 0 && *failed)
    nbdkit_error ("%s file '%s': written again", what, path);
  *failed = r == -1;
  return r;
}

void
stats_output_remove (const char *path, const struct output_file *written)
{
  struct stat st;
  if (written->written && lstat (path, &st) == 0 && S_ISREG (st.st_mode)
      && st.st_dev == written->device && st.st_ino == written->inode)
    unlink (path);
}
