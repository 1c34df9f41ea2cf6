/* Write a file into a block store, in requests of N blocks, and say what
 * it cost: the driver of bench/run-batch-bench.sh.  Under callgrind
 * (--toggle-collect=store_write) the instructions per block of the write
 * path come out alone; plain, the wall time of the writes.
 *
 *   bench/store-write FILE lz4|zstd BLOCKS-PER-REQUEST [ROUNDS]
 *
 * Each round overwrites the whole device (the first one fills it): the
 * rounds after the first free an old object per block, as a running
 * server does.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block-store.h"
#include "load-image.h"

int
main (int argc, char **argv)
{
  if (argc < 4 || argc > 5) {
    fprintf (stderr, "usage: %s FILE lz4|zstd BLOCKS-PER-REQUEST [ROUNDS]\n",
             argv[0]);
    return 2;
  }
  uint64_t size;
  unsigned char *data = load_image (argv[1], &size);
  unsigned per_request = atoi (argv[3]);
  unsigned rounds = argc == 5 ? atoi (argv[4]) : 1;
  if (per_request < 1 || rounds < 1) {
    fprintf (stderr, "blocks per request and rounds must be >= 1\n");
    return 2;
  }

  struct store_config config = {
    .size = size,
    .algorithm = strcmp (argv[2], "zstd") == 0 ? CODEC_ZSTD : CODEC_LZ4,
    .level = 1,
  };
  zs_pool_config_init (&config.pool);
  struct block_store *store = store_create (&config);
  if (!store) {
    perror ("store_create");
    return 1;
  }

  uint64_t request = (uint64_t) per_request * STORE_BLOCK_SIZE;
  struct timespec start, end;
  clock_gettime (CLOCK_MONOTONIC, &start);
  for (unsigned round = 0; round < rounds; round++)
    for (uint64_t offset = 0; offset < size; offset += request) {
      uint64_t count = size - offset < request ? size - offset : request;
      if (store_write (store, data + offset, count, offset) == -1) {
        perror ("store_write");
        return 1;
      }
    }
  clock_gettime (CLOCK_MONOTONIC, &end);

  struct store_stats stats;
  store_stats (store, &stats);
  double seconds = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
  uint64_t blocks = size / STORE_BLOCK_SIZE * rounds;
  printf ("%s %u blocks per request: %" PRIu64 " blocks written, %.3f s, "
          "%.0f MB/s, compr_data_size %" PRIu64 ", mem_used_total %" PRIu64
          "\n", argv[2], per_request, blocks, seconds,
          blocks * STORE_BLOCK_SIZE / seconds / 1e6, stats.compr_data_size,
          stats.mem_used_total);
  store_destroy (store);
  free (data);
  return 0;
}
