/* gen-sizes: turn files into a list of zram object sizes.
 *
 *   gen-sizes [-a lz4|zstd] [-l LEVEL] [-H HUGE] FILE...
 *
 * Every FILE is cut into 4096-byte pages (the last partial page of a file
 * is padded with zeros) and each page is treated the way zram treats a
 * written page:
 *
 *   - a page that is one repeated 8-byte word (all zeros included) is
 *     "same-filled": zram keeps the word in its slot table and allocates
 *     nothing, so no size is printed (the page is counted);
 *   - a page that compresses to HUGE bytes or more is stored raw: 4096 is
 *     printed;
 *   - otherwise the compressed size is printed.
 *
 * One size per line on stdout (the input of zsbench -s), a summary on
 * stderr.  lz4 uses LZ4_compress_default (or LZ4_compress_fast with
 * acceleration LEVEL when -l is given); zstd uses level LEVEL (default 1).
 */

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lz4.h>
#include <zstd.h>

#include "block-store-internal.h"

#define PAGE 4096

enum algo { ALGO_LZ4, ALGO_ZSTD };

static const char *progname = "gen-sizes";

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: %s [-a lz4|zstd] [-l LEVEL] [-H HUGE] FILE...\n"
           "  -a ALGO   compressor: lz4 (default) or zstd\n"
           "  -l LEVEL  zstd level (default 1); for lz4 the acceleration\n"
           "            of LZ4_compress_fast (default: LZ4_compress_default)\n"
           "  -H HUGE   pages compressing to >= HUGE bytes are stored raw\n"
           "            and printed as 4096 (default 3632, 1..4096)\n"
           "Prints the stored size of every page that is not same-filled,\n"
           "one per line, and a summary on stderr.\n",
           progname);
}

static int
parse_long (const char *s, long min, long max, long *out)
{
  char *end;
  long v;

  errno = 0;
  v = strtol (s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
    return -1;
  *out = v;
  return 0;
}

/* Read up to PAGE bytes; returns the count (0 at end of file), or -1. */
static ssize_t
read_page (FILE *fp, unsigned char *buf)
{
  size_t got = 0;

  while (got < PAGE) {
    size_t n = fread (buf + got, 1, PAGE - got, fp);
    if (n == 0) {
      if (ferror (fp))
        return -1;
      break;
    }
    got += n;
  }
  return (ssize_t) got;
}

int
main (int argc, char *argv[])
{
  enum algo algo = ALGO_LZ4;
  long level = 0;
  int level_set = 0;
  long huge = 3632;
  int opt, i;
  unsigned char page[PAGE];
  char *dst;
  size_t dst_cap;
  ZSTD_CCtx *zctx = NULL;
  uint64_t pages = 0, same = 0, huge_pages = 0, stored_pages = 0;
  uint64_t compressed_bytes = 0, stored_bytes = 0;
  char algo_desc[64];

  if (argc > 0 && argv[0] && argv[0][0]) {
    const char *slash = strrchr (argv[0], '/');
    progname = slash ? slash + 1 : argv[0];
  }

  while ((opt = getopt (argc, argv, "a:l:H:h")) != -1) {
    switch (opt) {
    case 'a':
      if (strcmp (optarg, "lz4") == 0)
        algo = ALGO_LZ4;
      else if (strcmp (optarg, "zstd") == 0)
        algo = ALGO_ZSTD;
      else {
        fprintf (stderr, "%s: -a: unknown algorithm '%s' (lz4 or zstd)\n",
                 progname, optarg);
        return 1;
      }
      break;
    case 'l':
      if (parse_long (optarg, -131072, 1000000, &level) == -1) {
        fprintf (stderr, "%s: -l: bad level '%s'\n", progname, optarg);
        return 1;
      }
      level_set = 1;
      break;
    case 'H':
      if (parse_long (optarg, 1, PAGE, &huge) == -1) {
        fprintf (stderr, "%s: -H: bad huge size '%s' (1..%d)\n",
                 progname, optarg, PAGE);
        return 1;
      }
      break;
    case 'h':
      usage (stdout);
      return 0;
    default:
      usage (stderr);
      return 1;
    }
  }

  if (optind >= argc) {
    fprintf (stderr, "%s: no input files\n", progname);
    usage (stderr);
    return 1;
  }

  if (algo == ALGO_ZSTD) {
    if (!level_set)
      level = 1;
    if (level < ZSTD_minCLevel () || level > ZSTD_maxCLevel ()) {
      fprintf (stderr, "%s: -l: zstd level %ld out of range %d..%d\n",
               progname, level, ZSTD_minCLevel (), ZSTD_maxCLevel ());
      return 1;
    }
    dst_cap = ZSTD_compressBound (PAGE);
    zctx = ZSTD_createCCtx ();
    if (zctx == NULL) {
      fprintf (stderr, "%s: ZSTD_createCCtx failed\n", progname);
      return 1;
    }
  }
  else {
    if (level_set && level < 1) {
      fprintf (stderr, "%s: -l: lz4 acceleration must be >= 1\n", progname);
      return 1;
    }
    dst_cap = (size_t) LZ4_compressBound (PAGE);
  }

  dst = malloc (dst_cap);
  if (dst == NULL) {
    fprintf (stderr, "%s: out of memory\n", progname);
    return 1;
  }

  /* Check every file can be opened before printing anything. */
  for (i = optind; i < argc; i++) {
    if (access (argv[i], R_OK) == -1) {
      fprintf (stderr, "%s: %s: %s\n", progname, argv[i], strerror (errno));
      return 1;
    }
  }

  for (i = optind; i < argc; i++) {
    FILE *fp = fopen (argv[i], "rb");
    ssize_t n;

    if (fp == NULL) {
      fprintf (stderr, "%s: %s: %s\n", progname, argv[i], strerror (errno));
      return 1;
    }

    while ((n = read_page (fp, page)) > 0) {
      size_t csize;
      uint64_t fill_word;

      if (n < PAGE)
        memset (page + n, 0, PAGE - (size_t) n);
      pages++;

      if (block_is_same_filled (page, &fill_word)) {
        same++;
        continue;
      }

      if (algo == ALGO_LZ4) {
        int r = level_set
          ? LZ4_compress_fast ((const char *) page, dst, PAGE,
                               (int) dst_cap, (int) level)
          : LZ4_compress_default ((const char *) page, dst, PAGE,
                                  (int) dst_cap);
        csize = r > 0 ? (size_t) r : PAGE;      /* failure: store raw */
      }
      else {
        size_t r = ZSTD_compressCCtx (zctx, dst, dst_cap, page, PAGE,
                                      (int) level);
        csize = ZSTD_isError (r) ? PAGE : r;
      }

      compressed_bytes += csize;
      stored_pages++;
      if (csize >= (size_t) huge) {
        huge_pages++;
        csize = PAGE;
      }
      stored_bytes += csize;
      printf ("%zu\n", csize);
    }

    if (n < 0) {
      fprintf (stderr, "%s: %s: read error: %s\n",
               progname, argv[i], strerror (errno));
      fclose (fp);
      return 1;
    }
    fclose (fp);
  }

  if (fflush (stdout) == EOF || ferror (stdout)) {
    fprintf (stderr, "%s: error writing output: %s\n",
             progname, strerror (errno));
    return 1;
  }

  if (algo == ALGO_LZ4 && !level_set)
    snprintf (algo_desc, sizeof algo_desc, "lz4");
  else
    snprintf (algo_desc, sizeof algo_desc, "%s %ld",
              algo == ALGO_LZ4 ? "lz4 acceleration" : "zstd level", level);
  fprintf (stderr,
           "%s: %s: %" PRIu64 " pages (%.1f MiB), "
           "%" PRIu64 " same-filled (%.1f%%), %" PRIu64 " huge (%.1f%%, "
           ">= %ld B)\n",
           progname, algo_desc,
           pages, pages * (double) PAGE / 1048576.0,
           same, pages ? 100.0 * (double) same / (double) pages : 0.0,
           huge_pages,
           pages ? 100.0 * (double) huge_pages / (double) pages : 0.0,
           huge);
  fprintf (stderr,
           "%s: %" PRIu64 " sizes printed, compressed %.1f MiB, "
           "stored (huge raw) %.1f MiB, mean stored object %.0f B, "
           "ratio %.2fx (all pages / stored bytes)\n",
           progname, stored_pages, compressed_bytes / 1048576.0,
           stored_bytes / 1048576.0,
           stored_pages ? (double) stored_bytes / (double) stored_pages : 0.0,
           stored_bytes ? (double) pages * PAGE / (double) stored_bytes : 0.0);

  free (dst);
  ZSTD_freeCCtx (zctx);
  return 0;
}
