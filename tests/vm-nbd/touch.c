/* touch: the workload of the nbd swap guest (tests/test-vm-nbd-swap.sh,
 * run by tests/vm-nbd/init).  Built statically on the host:
 *
 *   cc -static -O2 -o touch tests/vm-nbd/touch.c
 *
 * Usage: touch [-f FILE [-u]] [-p PROGRESS] [-n NAME] [-r RAND] [-x TEXT]
 *              MIB SEED
 *        touch -d MIB SEED        (write the pages to stdout: to measure
 *                                  how they compress, on the host)
 *        touch -o [-n NAME] MIB SEED   (each side of swap alone, timed)
 *
 * Maps MIB MiB (anonymous, or with -f a file of that size mapped shared:
 * on a tmpfs its pages are the tmpfs's; with -u the file is unlinked once
 * open, so that its pages, swapped out or not, die with the process, as
 * the OOM killer needs to make room), fills every page with a pattern
 * made from (SEED, page index), then reads every page back and checks it
 * against the pattern, twice.  Exits 0 when every page matched, 1 on any
 * mismatch, 2 on a usage or system error.
 *
 * A page: a 16-byte header (SEED and the index: no two pages are alike, so
 * a page swapped in from the wrong slot is caught), RAND bytes of random
 * data (default 96), TEXT bytes of text made of words (default 384),
 * then zeros with a pointer-like value every 256 bytes: roughly what a
 * program's heap looks like.  Page by page (4 KiB), the defaults compress
 * 8.1:1 with lz4 and 9.1:1 with zstd level 1, so that a full 1 GiB device
 * fits the guest test's mem_limit of 160M (RAND 128 and TEXT 512: 6.6:1
 * and 7.5:1, which overfill it; RAND 256 and TEXT 768: 4.5:1 and 5.2:1).
 *
 * With -o (swap out, swap in): the anonymous pages are filled, then all
 * pushed out to swap at once with madvise (MADV_PAGEOUT: the kernel
 * reclaims them now, whatever the memory pressure) and the writes waited
 * for (Writeback: 0 in /proc/meminfo: a device that completes writes
 * later, as nbd does, is timed to their end), which is the swap-out side
 * alone.  The pages still in the swap cache once written are reclaimed
 * (the root cgroup's memory.reclaim, when cgroup2 is mounted at
 * /sys/fs/cgroup), so that each read comes from the device.  Then every
 * page is read back in order and checked once, each read a fault that
 * brings the page in from swap, the swap-in side alone.  Pages found
 * resident (mincore) before the reads are counted: a page that was not
 * swapped out is not timed as one that was.
 * Its line:
 *   ZRAM-VM: touch NAME: sides pages=P out=O pageout_s=S swapin_s=T bad=B
 *
 * Output, on stdout (the guest's console), lines the host reads:
 *   ZRAM-VM: touch NAME: PHASE N MiB          every 32 MiB of each phase
 *   ZRAM-VM: touch NAME: done pages=P verified=V bad=B fill_s=F verify_s=S
 * where V counts the page checks that passed (2 per page when all is
 * well).  With -p, PROGRESS (a file on a filesystem that never swaps, the
 * guest's ramfs root) is rewritten in place with "PHASE PAGES" after every
 * 1 MiB, for the guest's watchdog to see that the workload moves.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096

static unsigned rand_bytes = 96;
static unsigned text_bytes = 384;

static uint64_t
splitmix (uint64_t *s)
{
  uint64_t z = (*s += UINT64_C (0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C (0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static const char *const words[64] = {
  "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was",
  "with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from",
  "at", "which", "but", "have", "an", "had", "they", "you", "were", "their",
  "one", "all", "we", "can", "her", "has", "there", "been", "if", "more",
  "when", "will", "would", "who", "so", "no", "memory", "swap", "page",
  "kernel", "server", "device", "block", "write", "read", "data", "error",
  "return", "struct", "value", "buffer", "size",
};

/* The page (SEED, IDX) into P. */
static void
make_page (uint8_t *p, uint64_t seed, uint64_t idx)
{
  uint64_t s = seed * UINT64_C (0x100000001b3) ^ idx * UINT64_C (0x9e3779b97f4a7c15);
  unsigned off = 0, i;

  memcpy (p, &seed, 8);
  memcpy (p + 8, &idx, 8);
  off = 16;
  for (i = 0; i < rand_bytes && off + 8 <= PAGE; i += 8, off += 8) {
    uint64_t r = splitmix (&s);
    memcpy (p + off, &r, 8);
  }
  /* Text: words, spaces, a newline about every 64 characters. */
  {
    unsigned end = off + text_bytes < PAGE ? off + text_bytes : PAGE;
    unsigned col = 0;
    uint64_t r = 0;
    int bits = 0;
    while (off < end) {
      const char *w;
      size_t n;
      if (bits < 6) { r = splitmix (&s); bits = 64; }
      w = words[r & 63];
      r >>= 6; bits -= 6;
      n = strlen (w);
      if (off + n + 1 > end) {
        memset (p + off, ' ', end - off);
        off = end;
        break;
      }
      memcpy (p + off, w, n);
      off += n;
      col += n + 1;
      p[off++] = col >= 64 ? (col = 0, '\n') : ' ';
    }
  }
  /* Zeros, with a pointer-like value every 256 bytes. */
  memset (p + off, 0, PAGE - off);
  for (i = (off + 255) & ~255u; i + 8 <= PAGE; i += 256) {
    uint64_t v = UINT64_C (0x7f0000000000) | (idx << 12) | i;
    memcpy (p + i, &v, 8);
  }
}

static double
now (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int progress_fd = -1;

/* Rewrite the progress file in place: no new page, no allocation. */
static void
progress (const char *phase, uint64_t pages)
{
  char buf[32];
  int n;
  if (progress_fd < 0)
    return;
  n = snprintf (buf, sizeof buf, "%-7s %12" PRIu64 "\n", phase, pages);
  if (pwrite (progress_fd, buf, n, 0) < 0) { /* a watchdog aid: ignore */ }
}

/* Whether /proc/meminfo says pages are under writeback. */
static int
writeback_pending (void)
{
  char line[128];
  long kib = 0;
  FILE *f = fopen ("/proc/meminfo", "r");
  if (!f)
    return 0;
  while (fgets (line, sizeof line, f))
    if (sscanf (line, "Writeback: %ld", &kib) == 1)
      break;
  fclose (f);
  return kib > 0;
}

/* -o: the swap-out side alone, then the swap-in side alone (see the top). */
static int
swap_sides (const char *name, uint64_t mib, uint64_t seed, uint64_t pages)
{
  uint8_t *mem = mmap (NULL, mib << 20, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  unsigned char *resident = malloc (pages);
  uint8_t expect[PAGE];
  uint64_t i, out = 0, bad = 0;
  double t0, t1, t1_reads, t2;

  if (mem == MAP_FAILED || !resident) {
    fprintf (stderr, "touch: -o %" PRIu64 " MiB: %m\n", mib);
    return 2;
  }
  for (i = 0; i < pages; i++)
    make_page (mem + i * PAGE, seed, i);
  t0 = now ();
  if (madvise (mem, mib << 20, MADV_PAGEOUT) < 0) {
    fprintf (stderr, "touch: madvise MADV_PAGEOUT: %m\n");
    return 2;
  }
  while (writeback_pending ())
    usleep (1000);
  t1 = now ();
  {
    FILE *reclaim = fopen ("/sys/fs/cgroup/memory.reclaim", "w");
    if (reclaim) {
      fprintf (reclaim, "%" PRIu64 "M\n", mib);
      fclose (reclaim);             /* a partial reclaim fails: counted below */
    }
  }
  if (mincore (mem, mib << 20, resident) < 0) {
    fprintf (stderr, "touch: mincore: %m\n");
    return 2;
  }
  for (i = 0; i < pages; i++)
    out += !(resident[i] & 1);
  t1_reads = now ();
  for (i = 0; i < pages; i++) {
    make_page (expect, seed, i);
    if (memcmp (mem + i * PAGE, expect, PAGE) != 0) {
      if (bad < 10)
        printf ("ZRAM-VM: touch %s: MISMATCH swap-in page %" PRIu64 "\n",
                name, i);
      bad++;
    }
  }
  t2 = now ();
  printf ("ZRAM-VM: touch %s: sides pages=%" PRIu64 " out=%" PRIu64
          " pageout_s=%.3f swapin_s=%.3f bad=%" PRIu64 "\n",
          name, pages, out, t1 - t0, t2 - t1_reads, bad);
  return bad ? 1 : 0;
}

static void
usage (void)
{
  fprintf (stderr, "usage: touch [-f FILE] [-p PROGRESS] [-n NAME] "
           "[-r RAND] [-x TEXT] MIB SEED\n"
           "       touch [-r RAND] [-x TEXT] -d MIB SEED\n"
           "       touch [-n NAME] [-r RAND] [-x TEXT] -o MIB SEED\n");
  exit (2);
}

int
main (int argc, char **argv)
{
  const char *file = NULL, *progress_file = NULL, *name = NULL;
  int dump = 0, unlink_file = 0, sides = 0, c;
  uint64_t mib, seed, pages, i, bad = 0, verified = 0;
  uint8_t *mem, expect[PAGE];
  double t0, t1, t2;
  int pass;

  while ((c = getopt (argc, argv, "df:n:op:r:ux:")) != -1) {
    switch (c) {
    case 'd': dump = 1; break;
    case 'f': file = optarg; break;
    case 'n': name = optarg; break;
    case 'o': sides = 1; break;
    case 'p': progress_file = optarg; break;
    case 'r': rand_bytes = strtoul (optarg, NULL, 0); break;
    case 'u': unlink_file = 1; break;
    case 'x': text_bytes = strtoul (optarg, NULL, 0); break;
    default: usage ();
    }
  }
  if (argc - optind != 2)
    usage ();
  mib = strtoull (argv[optind], NULL, 0);
  seed = strtoull (argv[optind + 1], NULL, 0);
  pages = mib * (1048576 / PAGE);
  if (pages == 0)
    usage ();
  if (!name)
    name = file ? file : "anon";
  setvbuf (stdout, NULL, _IOLBF, 0);

  if (dump) {
    for (i = 0; i < pages; i++) {
      make_page (expect, seed, i);
      if (fwrite (expect, PAGE, 1, stdout) != 1)
        return 2;
    }
    return 0;
  }

  if (sides)
    return swap_sides (name, mib, seed, pages);

  if (progress_file) {
    progress_fd = open (progress_file, O_WRONLY | O_CREAT, 0644);
    if (progress_fd < 0) {
      fprintf (stderr, "touch: %s: %m\n", progress_file);
      return 2;
    }
    progress ("start", 0);
  }

  if (file) {
    int fd = open (file, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate (fd, mib << 20) < 0
        || (unlink_file && unlink (file) < 0)) {
      fprintf (stderr, "touch: %s: %m\n", file);
      return 2;
    }
    mem = mmap (NULL, mib << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close (fd);
  }
  else
    mem = mmap (NULL, mib << 20, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) {
    fprintf (stderr, "touch: mmap %" PRIu64 " MiB: %m\n", mib);
    return 2;
  }

  t0 = now ();
  for (i = 0; i < pages; i++) {
    make_page (mem + i * PAGE, seed, i);
    if ((i + 1) % 256 == 0)
      progress ("fill", i + 1);
    if ((i + 1) % 8192 == 0)
      printf ("ZRAM-VM: touch %s: fill %" PRIu64 " MiB\n", name, (i + 1) / 256);
  }
  t1 = now ();

  for (pass = 1; pass <= 2; pass++) {
    const char *phase = pass == 1 ? "verify1" : "verify2";
    for (i = 0; i < pages; i++) {
      make_page (expect, seed, i);
      if (memcmp (mem + i * PAGE, expect, PAGE) == 0)
        verified++;
      else {
        if (bad < 10) {
          unsigned j = 0;
          while (j < PAGE && mem[i * PAGE + j] == expect[j])
            j++;
          printf ("ZRAM-VM: touch %s: MISMATCH pass %d page %" PRIu64
                  " at byte %u\n", name, pass, i, j);
        }
        bad++;
      }
      if ((i + 1) % 256 == 0)
        progress (phase, i + 1);
      if ((i + 1) % 8192 == 0)
        printf ("ZRAM-VM: touch %s: %s %" PRIu64 " MiB\n", name, phase,
                (i + 1) / 256);
    }
  }
  t2 = now ();
  progress ("done", pages);

  printf ("ZRAM-VM: touch %s: done pages=%" PRIu64 " verified=%" PRIu64
          " bad=%" PRIu64 " fill_s=%.1f verify_s=%.1f\n",
          name, pages, verified, bad, t1 - t0, t2 - t1);
  return bad ? 1 : 0;
}
