/* The stats= file: see stats-file.h. */

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "stats-file.h"

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

static double
ratio (uint64_t numerator, uint64_t denominator)
{
  return denominator ? (double) numerator / denominator : 0;
}

void
stats_print (struct block_store *store, FILE *fp)
{
  struct store_stats s;
  store_stats (store, &s);

  /* zram's own column order (Documentation/admin-guide/blockdev/zram.rst). */
  fprintf (fp, "mm_stat %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
           " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
           s.orig_data_size, s.compr_data_size, s.mem_used_total,
           s.mem_limit, s.mem_used_max, s.same_pages, s.pages_compacted,
           s.huge_pages, s.huge_pages_since);
  fprintf (fp, "io_stat %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
           s.failed_reads, s.failed_writes, s.invalid_io, s.notify_free);

#define FIELD(name) fprintf (fp, #name ": %" PRIu64 "\n", s.name)
  FIELD (orig_data_size);
  FIELD (compr_data_size);
  FIELD (mem_used_total);
  FIELD (mem_limit);
  FIELD (mem_used_max);
  FIELD (same_pages);
  FIELD (pages_compacted);
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
#undef FIELD
  fprintf (fp, "process_rss: %" PRIu64 "\n", process_rss_bytes ());
  /* Data ratio: what the objects take; memory ratio: what the pool's
   * pages take (zram users quote the latter as "memory saved").
   */
  fprintf (fp, "compression_ratio: %.2f\n",
           ratio (s.orig_data_size, s.compr_data_size));
  fprintf (fp, "memory_ratio: %.2f\n",
           ratio (s.orig_data_size, s.mem_used_total));
}

int
stats_file_write (struct block_store *store, const char *path)
{
  char *temporary;
  if (asprintf (&temporary, "%s.tmp.%ld", path, (long) getpid ()) == -1)
    return -1;
  FILE *fp = fopen (temporary, "w");
  if (!fp) {
    free (temporary);
    return -1;
  }
  stats_print (store, fp);
  int r = fclose (fp) == 0 ? rename (temporary, path) : -1;
  if (r == -1) {
    int saved = errno;
    unlink (temporary);
    errno = saved;
  }
  free (temporary);
  return r;
}

/* The writer thread.  lock guards stop; wake signals it. */
static pthread_mutex_t writer_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t writer_wake = PTHREAD_COND_INITIALIZER;
static bool writer_stop;
static bool writer_running;
static pthread_t writer_thread;
static struct block_store *writer_store;
static const char *writer_path;

static void *
writer_main (void *arg)
{
  pthread_mutex_lock (&writer_lock);
  while (!writer_stop) {
    pthread_mutex_unlock (&writer_lock);
    stats_file_write (writer_store, writer_path);
    pthread_mutex_lock (&writer_lock);

    struct timespec deadline;
    clock_gettime (CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 1;
    while (!writer_stop
           && pthread_cond_timedwait (&writer_wake, &writer_lock,
                                      &deadline) != ETIMEDOUT)
      ;
  }
  pthread_mutex_unlock (&writer_lock);
  return NULL;
}

int
stats_writer_start (struct block_store *store, const char *path)
{
  writer_store = store;
  writer_path = path;
  writer_stop = false;
  int err = pthread_create (&writer_thread, NULL, writer_main, NULL);
  if (err) {
    errno = err;
    return -1;
  }
  writer_running = true;
  return 0;
}

void
stats_writer_stop (void)
{
  if (!writer_running)
    return;
  pthread_mutex_lock (&writer_lock);
  writer_stop = true;
  pthread_cond_signal (&writer_wake);
  pthread_mutex_unlock (&writer_lock);
  pthread_join (writer_thread, NULL);
  writer_running = false;
  stats_file_write (writer_store, writer_path);
}
