/* The bench drivers' input: a file read whole into memory, cut to whole
 * blocks.  Exits with a message if it cannot be read.
 */

#ifndef ZRAM_BENCH_LOAD_IMAGE_H
#define ZRAM_BENCH_LOAD_IMAGE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "block-store.h"

static unsigned char *
load_image (const char *path, uint64_t *size)
{
  FILE *fp = fopen (path, "rb");
  if (!fp) {
    perror (path);
    exit (1);
  }
  fseek (fp, 0, SEEK_END);
  *size = ftell (fp) / STORE_BLOCK_SIZE * STORE_BLOCK_SIZE;
  rewind (fp);
  unsigned char *data = malloc (*size);
  if (!data || fread (data, 1, *size, fp) != *size) {
    fprintf (stderr, "%s: cannot read it\n", path);
    exit (1);
  }
  fclose (fp);
  return data;
}

#endif /* ZRAM_BENCH_LOAD_IMAGE_H */
