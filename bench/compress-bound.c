/* compress-bound: how small zstd can make a memory image in units of a
 * given size, and what decoding costs: the floor under any all-in RSS
 * target for packed data (bench/README.md, "How far packing can go").
 *
 *   compress-bound IMAGE [UNIT_KIB:LEVEL ...]
 *
 * The image is cut into 4096-byte pages.  Pages that are one repeated
 * 8-byte word take no memory in zram or here (same-filled) and are left
 * out; the others are taken in order, UNIT_KIB at a time, and each unit
 * is compressed alone at LEVEL (one zstd frame, as a packed unit or
 * one page of nbdkit memory allocator=zstd is).  A unit that does not
 * shrink counts its plain size (stored raw).  For each row: the sum of
 * the units' compressed bytes, and the mean time to decode one unit
 * whole, per 4 KiB page of it (what a random read of a packed page pays
 * at most, on top of the request itself).
 *
 * UNIT_KIB:LEVEL:dict compresses each unit with a dictionary trained as
 * packing trains one (STORE_DICTIONARY_SAMPLES pages spread over the
 * image, codec_dictionary_train).  Rows by default: 4:3 (zram's zstd,
 * one page at a time), 16:6 alone and with a dictionary (packing's
 * frames), 32:3 (nbdkit memory allocator=zstd), 64:6 (packing's units
 * before frames), then larger units and higher levels.
 */

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zstd.h>

#include "block-store-internal.h"

#define PAGE 4096

static double
now_seconds (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A dictionary trained as the store trains packing's (pack.c): from
 * STORE_DICTIONARY_SAMPLES pages spread evenly over the image.  Returns
 * its size (0: none could be made).
 */
static size_t
train (const unsigned char *pages, size_t count, unsigned char *dictionary)
{
  size_t samples = count < STORE_DICTIONARY_SAMPLES ? count
    : STORE_DICTIONARY_SAMPLES;
  unsigned char *sample = malloc (samples * PAGE);
  size_t *sizes = malloc (samples * sizeof *sizes);
  if (!sample || !sizes) {
    fprintf (stderr, "compress-bound: out of memory\n");
    exit (1);
  }
  for (size_t i = 0; i < samples; i++) {
    memcpy (sample + i * PAGE, pages + i * (count / samples) * PAGE, PAGE);
    sizes[i] = PAGE;
  }
  size_t size = codec_dictionary_train (dictionary, STORE_DICTIONARY_BYTES,
                                        sample, sizes, samples);
  free (sample);
  free (sizes);
  return size;
}

/* One row: units of unit_pages pages at level, each compressed alone or
 * (dictionary_size not 0) with the dictionary.
 */
static void
row (const unsigned char *pages, size_t count, size_t unit_pages, int level,
     const unsigned char *dictionary, size_t dictionary_size)
{
  size_t unit_bytes = unit_pages * PAGE;
  size_t capacity = ZSTD_compressBound (unit_bytes);
  unsigned char *compressed = malloc (capacity);
  unsigned char *plain = malloc (unit_bytes);
  ZSTD_CCtx *cctx = ZSTD_createCCtx ();
  ZSTD_DCtx *dctx = ZSTD_createDCtx ();
  ZSTD_CDict *cdict = dictionary_size
    ? ZSTD_createCDict (dictionary, dictionary_size, level) : NULL;
  ZSTD_DDict *ddict = dictionary_size
    ? ZSTD_createDDict (dictionary, dictionary_size) : NULL;
  if (!compressed || !plain || !cctx || !dctx
      || (dictionary_size && (!cdict || !ddict))) {
    fprintf (stderr, "compress-bound: out of memory\n");
    exit (1);
  }
  uint64_t total = 0, raw = 0, units = 0;
  double decode_seconds = 0;
  for (size_t first = 0; first < count; first += unit_pages) {
    size_t n = count - first < unit_pages ? count - first : unit_pages;
    size_t length = n * PAGE;
    size_t r = cdict
      ? ZSTD_compress_usingCDict (cctx, compressed, capacity,
                                  pages + first * PAGE, length, cdict)
      : ZSTD_compressCCtx (cctx, compressed, capacity,
                           pages + first * PAGE, length, level);
    if (ZSTD_isError (r)) {
      fprintf (stderr, "compress-bound: %s\n", ZSTD_getErrorName (r));
      exit (1);
    }
    units++;
    if (r >= length) {
      total += length;
      raw += length;
      continue;
    }
    total += r;
    double start = now_seconds ();
    size_t out = ddict
      ? ZSTD_decompress_usingDDict (dctx, plain, unit_bytes, compressed, r,
                                    ddict)
      : ZSTD_decompressDCtx (dctx, plain, unit_bytes, compressed, r);
    decode_seconds += now_seconds () - start;
    if (ZSTD_isError (out) || out != length
        || memcmp (plain, pages + first * PAGE, length) != 0) {
      fprintf (stderr, "compress-bound: a unit did not decode back\n");
      exit (1);
    }
  }
  printf ("| %4zu KiB%s | %2d | %9.2f MiB | %6.2f MiB | %8.2f us |\n",
          unit_bytes / 1024, dictionary_size ? " + dictionary" : "", level,
          total / 1048576.0, raw / 1048576.0,
          units ? decode_seconds * 1e6 / units / unit_pages : 0.0);
  ZSTD_freeCDict (cdict);
  ZSTD_freeDDict (ddict);
  ZSTD_freeCCtx (cctx);
  ZSTD_freeDCtx (dctx);
  free (compressed);
  free (plain);
}

int
main (int argc, char *argv[])
{
  if (argc < 2) {
    fprintf (stderr, "usage: compress-bound IMAGE [UNIT_KIB:LEVEL[:dict] ...]\n");
    return 2;
  }
  FILE *fp = fopen (argv[1], "rb");
  if (!fp) {
    perror (argv[1]);
    return 1;
  }
  unsigned char page[PAGE];
  unsigned char *pages = NULL;
  size_t count = 0, capacity = 0, same = 0;
  uint64_t fill_word;
  while (fread (page, 1, PAGE, fp) == PAGE) {
    if (block_is_same_filled (page, &fill_word)) {
      same++;
      continue;
    }
    if (count == capacity) {
      capacity = capacity ? capacity * 2 : 4096;
      pages = realloc (pages, capacity * PAGE);
      if (!pages) {
        fprintf (stderr, "compress-bound: out of memory\n");
        return 1;
      }
    }
    memcpy (pages + count * PAGE, page, PAGE);
    count++;
  }
  fclose (fp);
  printf ("%s: %zu pages stored, %zu same-filled left out\n\n",
          argv[1], count, same);
  printf ("| unit | level | compressed | of it raw | decode per page |\n");
  printf ("|---:|---:|---:|---:|---:|\n");

  static const char *const defaults[] = {
    "4:3", "16:6", "16:6:dict", "16:9:dict", "32:3", "64:6", "64:9",
    "64:6:dict", "128:6", "256:6", "256:19", "1024:19",
  };
  unsigned char *dictionary = malloc (STORE_DICTIONARY_BYTES);
  size_t dictionary_size = 0;
  if (!dictionary) {
    fprintf (stderr, "compress-bound: out of memory\n");
    return 1;
  }
  int rows = argc > 2 ? argc - 2 : (int) (sizeof defaults / sizeof *defaults);
  for (int i = 0; i < rows; i++) {
    const char *spec = argc > 2 ? argv[i + 2] : defaults[i];
    unsigned kib;
    int level, end = 0;
    char with[8] = "";
    int fields = sscanf (spec, "%u:%d%n:%7s", &kib, &level, &end, with);
    bool dict = fields == 3 && strcmp (with, "dict") == 0;
    if (fields < 2 || (fields == 2 && spec[end]) || (fields == 3 && !dict)
        || kib < 4 || kib % 4 || level < 1 || level > ZSTD_maxCLevel ()) {
      fprintf (stderr, "compress-bound: '%s' is not UNIT_KIB:LEVEL[:dict] "
               "(UNIT_KIB a multiple of 4, LEVEL 1..%d)\n", spec,
               ZSTD_maxCLevel ());
      return 2;
    }
    if (dict && !dictionary_size
        && !(dictionary_size = train (pages, count, dictionary))) {
      fprintf (stderr, "compress-bound: no dictionary could be trained\n");
      return 1;
    }
    row (pages, count, kib / 4, level, dictionary, dict ? dictionary_size : 0);
  }
  free (dictionary);
  free (pages);
  return 0;
}
