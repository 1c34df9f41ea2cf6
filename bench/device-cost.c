/* What a device costs, for many devices under one server (issue 44's
 * shared pool or a pool each): the same data held by one store, and
 * split evenly over N stores, each with a pool of its own; and N idle
 * stores.  Each layout runs in a process of its own, so that one's heap
 * does not carry into the next.
 *
 *   bench/device-cost IMAGE lz4|zstd N...
 *
 * For each N: the process's resident memory grown by the stores (after
 * their writes, the deferred frees drained and a compaction), the
 * pool's pages (mem_used_total), what mem_limit counts (limit_used), the
 * table and the allocator's metadata, summed over the stores; and the
 * same for N empty stores of the same sizes (a device declared and not
 * yet written).  The difference from N = 1 is the price of a pool each.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "block-store.h"
#include "load-image.h"

/* The process's resident bytes (/proc/self/statm's second field). */
static uint64_t
resident_bytes (void)
{
  unsigned long size = 0, resident = 0;
  FILE *fp = fopen ("/proc/self/statm", "r");
  if (fp) {
    if (fscanf (fp, "%lu %lu", &size, &resident) != 2)
      resident = 0;
    fclose (fp);
  }
  return (uint64_t) resident * (uint64_t) sysconf (_SC_PAGESIZE);
}

struct totals {
  uint64_t rss, pages, limit_used, table, metadata;
};

/* N stores, the image split evenly over them (whole blocks; the last
 * takes the rest), written if fill; their totals.
 */
static int
layout_measure (const unsigned char *data, uint64_t size, unsigned n,
                enum codec_algorithm algorithm, int fill, struct totals *t)
{
  uint64_t blocks = size / STORE_BLOCK_SIZE, share = blocks / n;
  struct block_store **stores = calloc (n, sizeof *stores);
  if (!stores || share == 0)
    return -1;
  uint64_t before = resident_bytes ();
  for (unsigned i = 0; i < n; i++) {
    uint64_t first = share * i;
    uint64_t count = i == n - 1 ? blocks - first : share;
    struct store_config config = {
      .size = count * STORE_BLOCK_SIZE, .algorithm = algorithm,
      .level = algorithm == CODEC_ZSTD ? 3 : 1,
    };
    zs_pool_config_init (&config.pool);
    if (!(stores[i] = store_create (&config)))
      return -1;
    if (fill && store_write (stores[i], data + first * STORE_BLOCK_SIZE,
                             count * STORE_BLOCK_SIZE, 0) == -1)
      return -1;
  }
  memset (t, 0, sizeof *t);
  for (unsigned i = 0; i < n; i++) {
    store_flush (stores[i]);
    store_compact (stores[i]);
    store_release_idle_memory (stores[i]);
    struct store_stats s;
    store_stats (stores[i], &s);
    t->pages += s.mem_used_total;
    t->limit_used += s.limit_used;
    t->table += s.table_bytes;
    t->metadata += s.metadata_bytes;
  }
  t->rss = resident_bytes () - before;
  for (unsigned i = 0; i < n; i++)
    store_destroy (stores[i]);
  free (stores);
  return 0;
}

static void
row (unsigned n, const char *what, const struct totals *t)
{
  printf ("| %5u | %-6s | %10.2f | %10.2f | %10.2f | %8.2f | %8.2f |\n", n,
          what, t->rss / 1048576.0, t->pages / 1048576.0,
          t->limit_used / 1048576.0, t->table / 1048576.0,
          t->metadata / 1048576.0);
}

int
main (int argc, char **argv)
{
  if (argc < 4) {
    fprintf (stderr, "usage: %s IMAGE lz4|zstd N...\n", argv[0]);
    return 2;
  }
  uint64_t size;
  unsigned char *data = load_image (argv[1], &size);
  enum codec_algorithm algorithm = strcmp (argv[2], "zstd") == 0
    ? CODEC_ZSTD : CODEC_LZ4;
  printf ("%s: %.1f MiB, %s; MiB summed over the stores\n\n", argv[1],
          size / 1048576.0, argv[2]);
  printf ("| stores | data | RSS grown | pool pages | limit_used | table | metadata |\n"
          "|---:|---|---:|---:|---:|---:|---:|\n");
  fflush (stdout);
  for (int a = 3; a < argc; a++) {
    unsigned n = (unsigned) atoi (argv[a]);
    for (int fill = 1; fill >= 0; fill--) {
      pid_t child = fork ();
      if (child == 0) {
        struct totals t;
        if (layout_measure (data, size, n, algorithm, fill, &t) == -1) {
          perror ("store");
          _exit (1);
        }
        row (n, fill ? "image" : "none", &t);
        fflush (stdout);
        _exit (0);
      }
      int status;
      if (child == -1 || waitpid (child, &status, 0) == -1
          || !WIFEXITED (status) || WEXITSTATUS (status) != 0)
        return 1;
    }
  }
  free (data);
  return 0;
}
