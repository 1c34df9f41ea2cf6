/* Read a memory image back from a block store, packed or not, and say
 * what a read cost: the driver behind the cold-read profile in
 * bench/README.md.  Under callgrind (--toggle-collect=store_read) the
 * instructions per read come out alone; plain, the time of the reads.
 *
 *   bench/store-read FILE packed|unpacked random|runs8|seq READS
 *
 * The image is written with lz4 (the hot codec), then, for packed,
 * marked idle and packed at the defaults.  random reads 4 KiB at random
 * blocks, runs8 reads 8 neighbours from a random block one at a time,
 * seq reads the device in order; a fixed seed, so every run reads the
 * same blocks.  Before the reads it prints where the memory is: the
 * process's RSS, the pool's pages and compressed bytes, the block table,
 * the allocator's metadata, the C library's heap in use and free.
 */

#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block-store.h"
#include "load-image.h"

int
main (int argc, char **argv)
{
  if (argc != 5) {
    fprintf (stderr, "usage: %s FILE packed|unpacked random|runs8|seq READS\n",
             argv[0]);
    return 2;
  }
  uint64_t size;
  unsigned char *data = load_image (argv[1], &size);
  bool packed = strcmp (argv[2], "packed") == 0;
  const char *pattern = argv[3];
  uint64_t reads = strtoull (argv[4], NULL, 10);
  uint64_t blocks = size / STORE_BLOCK_SIZE;

  struct store_config config = {
    .size = size, .algorithm = CODEC_LZ4, .level = 1,
  };
  zs_pool_config_init (&config.pool);
  struct block_store *store = store_create (&config);
  if (!store || store_write (store, data, size, 0) == -1) {
    perror ("store");
    return 1;
  }
  if (packed) {
    struct store_pack_result result;
    store_mark_idle (store, 0, NULL, NULL);
    if (store_pack (store, 0, 0, NULL, NULL, &result) == -1) {
      perror ("store_pack");
      return 1;
    }
  }

  store_compact (store);
  store_release_idle_memory (store);
  struct store_stats held;
  store_stats (store, &held);
  struct mallinfo2 heap = mallinfo2 ();
  long rss_pages = 0;
  FILE *statm = fopen ("/proc/self/statm", "r");
  long total_pages;
  if (!statm || fscanf (statm, "%ld %ld", &total_pages, &rss_pages) != 2)
    rss_pages = 0;
  if (statm)
    fclose (statm);
  printf ("memory (KiB): RSS %ld (the image itself %" PRIu64 "), pool %" PRIu64
          " (compressed %" PRIu64 "), table %" PRIu64 ", metadata %" PRIu64
          ", heap in use %zu, heap free %zu, %" PRIu64 " units\n",
          rss_pages * 4, size / 1024, held.mem_used_total / 1024,
          held.compr_data_size / 1024, held.table_bytes / 1024,
          held.metadata_bytes / 1024, (heap.uordblks + heap.hblkhd) / 1024,
          heap.fordblks / 1024, held.pack_units);

  unsigned char block[STORE_BLOCK_SIZE];
  uint64_t seed = 88172645463325252ull, next = 0, bad = 0;
  struct timespec start, end;
  clock_gettime (CLOCK_MONOTONIC, &start);
  for (uint64_t i = 0; i < reads; i++) {
    uint64_t b;
    if (strcmp (pattern, "seq") == 0)
      b = i % blocks;
    else if (strcmp (pattern, "runs8") == 0 && i % 8 != 0)
      b = (next + 1) % blocks;
    else {
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      b = seed % blocks;
    }
    next = b;
    if (store_read (store, block, STORE_BLOCK_SIZE, b * STORE_BLOCK_SIZE) == -1
        || memcmp (block, data + b * STORE_BLOCK_SIZE, STORE_BLOCK_SIZE) != 0)
      bad++;
  }
  clock_gettime (CLOCK_MONOTONIC, &end);

  struct store_stats stats;
  store_stats (store, &stats);
  double seconds = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
  printf ("%s %s: %" PRIu64 " reads, %.2f us a read, %" PRIu64 " wrong; "
          "decode cache %" PRIu64 " hits, %" PRIu64 " misses\n",
          argv[2], pattern, reads, seconds / reads * 1e6, bad,
          stats.decode_cache_hits, stats.decode_cache_misses);
  store_destroy (store);
  free (data);
  return bad != 0;
}
