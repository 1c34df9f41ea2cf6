/* zsbench: A/B benchmark of the zsalloc allocator.
 *
 *   zsbench [-s SIZES_FILE] [-t THREAD_LIST] [-n OBJECTS_PER_THREAD]
 *           [-r REPEATS] [-m MIB] [-M MIB] [-c CHAIN_LIST] [-T TABLES]
 *
 * Three tables, each value the median of REPEATS runs, the runs of the
 * variants alternating (A, B, A, B, ...) so machine noise hits both:
 *
 *   1. allocation scaling: T threads each zs_malloc + zs_write N objects,
 *      then zs_free their own; pool lock vs class locks.
 *   2. free of M MiB worth of objects per "process" (thread), 1, 2 and 4
 *      of them freeing concurrently from one pool: immediate vs batched
 *      frees, with the time until the pages are back and the CPU time.
 *   3. memory overhead per zspage chain limit, before and after freeing
 *      a random half of the objects.
 *
 * Object sizes come from a file (one size per line, as printed by
 * gen-sizes) or from a built-in synthetic distribution.  Sizes at or above
 * the pool's huge class size are stored as 4096 bytes, as zram stores
 * such pages raw.  Every run checks the pool statistics and a sample of
 * the objects' contents outside the timed regions, and stops with an
 * error when they are wrong.
 */

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "zsalloc.h"

#define MAX_LIST 32
#define MIB (1024.0 * 1024.0)
#define OBJS_PER_MIB 256        /* 4 KiB pages per MiB */
#define VERIFY_STRIDE 97        /* check every 97th object's content */

/* ---- options --------------------------------------------------------- */

static const char *sizes_file;
static unsigned threads_list[MAX_LIST] = { 1, 2, 4, 8 };
static size_t threads_count = 4;
static unsigned chain_list[MAX_LIST] = { 4, 8, 16 };
static size_t chain_count = 3;
static size_t objs_per_thread = 200000;
static unsigned repeats = 5;
static unsigned free_mib = 256;
static unsigned overhead_mib = 256;
static int run_table[4] = { 0, 1, 1, 1 };

/* ---- helpers --------------------------------------------------------- */

static void __attribute__ ((noreturn, format (printf, 1, 2)))
fatal (const char *fmt, ...)
{
  va_list ap;

  fflush (stdout);
  fputs ("zsbench: ", stderr);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  exit (1);
}

static double
now (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* User + system CPU seconds of the whole process (all threads). */
static double
cpu_seconds (void)
{
  struct rusage ru;

  if (getrusage (RUSAGE_SELF, &ru) == -1)
    fatal ("getrusage: %s", strerror (errno));
  return (double) ru.ru_utime.tv_sec + (double) ru.ru_utime.tv_usec * 1e-6
    + (double) ru.ru_stime.tv_sec + (double) ru.ru_stime.tv_usec * 1e-6;
}

/* Resident set size in bytes, from /proc/self/statm. */
static double
rss_bytes (void)
{
  static long page_size;
  unsigned long size, resident;
  FILE *fp;

  if (page_size == 0)
    page_size = sysconf (_SC_PAGESIZE);
  fp = fopen ("/proc/self/statm", "r");
  if (fp == NULL)
    return 0;
  if (fscanf (fp, "%lu %lu", &size, &resident) != 2)
    resident = 0;
  fclose (fp);
  return (double) resident * (double) page_size;
}

static int
cmp_double (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;

  return (x > y) - (x < y);
}

static double
median (const double *v, size_t n)
{
  double tmp[n > 0 ? n : 1];

  if (n == 0)
    return 0;
  memcpy (tmp, v, n * sizeof *v);
  qsort (tmp, n, sizeof *tmp, cmp_double);
  return n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2;
}

static void *
xmalloc (size_t n)
{
  void *p = malloc (n ? n : 1);

  if (p == NULL)
    fatal ("out of memory (%zu bytes)", n);
  return p;
}

static uint64_t
splitmix64 (uint64_t *x)
{
  uint64_t z = (*x += UINT64_C (0x9e3779b97f4a7c15));

  z = (z ^ (z >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C (0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* xorshift64* */
static inline uint64_t
rng_next (uint64_t *s)
{
  uint64_t x = *s;

  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * UINT64_C (0x2545f4914f6cdd1d);
}

static uint64_t
rng_seed (uint64_t a, uint64_t b)
{
  uint64_t x = a * UINT64_C (1000003) + b, s;

  s = splitmix64 (&x);
  return s ? s : 1;
}

static double
rng_unit (uint64_t *s)          /* in (0, 1) */
{
  return ((double) (rng_next (s) >> 11) + 0.5) / 9007199254740992.0;
}

/* ---- size distribution and data ----------------------------------------- */

static uint16_t *dist;          /* sizes, drawn uniformly */
static size_t dist_n;
static char dist_source[512];

/* Written into objects: object i gets data[off(i) .. off(i) + size). */
static unsigned char data[2 * ZS_PAGE_SIZE];

static inline size_t
data_offset (size_t i)
{
  return (size_t) ((i * UINT64_C (2654435761)) & (ZS_PAGE_SIZE - 1));
}

static inline size_t
draw_size (uint64_t *rng, size_t huge)
{
  size_t s = dist[rng_next (rng) % dist_n];

  return s >= huge ? ZS_PAGE_SIZE : s;
}

static void
synthetic_distribution (void)
{
  uint64_t rng = rng_seed (42, 0);
  size_t i;

  dist_n = 65536;
  dist = xmalloc (dist_n * sizeof *dist);
  for (i = 0; i < dist_n; i++) {
    if (rng_unit (&rng) < 0.05)
      dist[i] = ZS_PAGE_SIZE;
    else {
      /* Box-Muller: normal around 1700, sd 700. */
      double u1 = rng_unit (&rng), u2 = rng_unit (&rng);
      double z = sqrt (-2.0 * log (u1)) * cos (2.0 * M_PI * u2);
      long v = lround (1700.0 + 700.0 * z);

      if (v < 16)
        v = 16;
      if (v > ZS_PAGE_SIZE - 1)
        v = ZS_PAGE_SIZE - 1;
      dist[i] = (uint16_t) v;
    }
  }
  snprintf (dist_source, sizeof dist_source,
            "synthetic (5%% 4096 B, rest normal mean 1700 sd 700 "
            "clamped to 16..4095, seed 42, %zu samples)", dist_n);
}

static void
load_distribution (const char *path)
{
  FILE *fp = fopen (path, "r");
  char *line = NULL;
  size_t cap = 0, alloc = 0;
  unsigned long lineno = 0;
  ssize_t len;

  if (fp == NULL)
    fatal ("%s: %s", path, strerror (errno));
  while ((len = getline (&line, &cap, fp)) != -1) {
    char *p = line, *end;
    long v;

    lineno++;
    while (*p == ' ' || *p == '\t')
      p++;
    if (*p == '\n' || *p == '\0' || *p == '#')
      continue;
    errno = 0;
    v = strtol (p, &end, 10);
    while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')
      end++;
    if (errno != 0 || end == p || *end != '\0' || v < 1 || v > ZS_PAGE_SIZE)
      fatal ("%s:%lu: bad size (want one integer 1..%d per line)",
             path, lineno, ZS_PAGE_SIZE);
    if (dist_n == alloc) {
      alloc = alloc ? alloc * 2 : 65536;
      dist = realloc (dist, alloc * sizeof *dist);
      if (dist == NULL)
        fatal ("out of memory reading %s", path);
    }
    dist[dist_n++] = (uint16_t) v;
  }
  if (ferror (fp))
    fatal ("%s: read error: %s", path, strerror (errno));
  free (line);
  fclose (fp);
  if (dist_n == 0)
    fatal ("%s: no sizes in file", path);
  snprintf (dist_source, sizeof dist_source, "file %s (%zu sizes)",
            path, dist_n);
}

static void
fill_data (void)
{
  uint64_t rng = rng_seed (7, 7);
  size_t i;

  /* High-entropy bytes, like compressed data. */
  for (i = 0; i < sizeof data; i += 8) {
    uint64_t v = rng_next (&rng);
    memcpy (data + i, &v, 8);
  }
}

/* ---- pools ------------------------------------------------------------ */

static struct zs_pool *
make_pool (unsigned chain, enum zs_lock_mode lock, enum zs_free_mode fm)
{
  struct zs_pool_config cfg;
  struct zs_pool *pool;

  zs_pool_config_init (&cfg);
  cfg.chain_pages = chain;
  cfg.mem_limit = 0;
  cfg.lock_mode = lock;
  cfg.free_mode = fm;
  pool = zs_pool_create (&cfg);
  if (pool == NULL)
    fatal ("zs_pool_create (chain %u, %s lock, %s free): %s", chain,
           lock == ZS_LOCK_POOL ? "pool" : "class",
           fm == ZS_FREE_IMMEDIATE ? "immediate" : "batched",
           strerror (errno));
  return pool;
}

/* Allocate and write n objects; on failure record it and stop. */
struct objset {
  zs_handle_t *handles;
  uint16_t *sizes;
  size_t n;
  uint64_t bytes;
  int err;
  const char *what;
  size_t err_index;
};

static void
objset_init (struct objset *os, size_t n)
{
  memset (os, 0, sizeof *os);
  os->n = n;
  os->handles = xmalloc (n * sizeof *os->handles);
  os->sizes = xmalloc (n * sizeof *os->sizes);
  /* Touch the arrays now so their page faults stay out of the timings. */
  memset (os->handles, 0, n * sizeof *os->handles);
  memset (os->sizes, 0, n * sizeof *os->sizes);
}

static void
objset_free (struct objset *os)
{
  free (os->handles);
  free (os->sizes);
  os->handles = NULL;
  os->sizes = NULL;
}

static void
objset_fill (struct zs_pool *pool, struct objset *os, uint64_t *rng,
             size_t huge)
{
  size_t i;

  for (i = 0; i < os->n; i++) {
    size_t size = draw_size (rng, huge);
    zs_handle_t h = zs_malloc (pool, size);

    if (h == 0) {
      os->err = errno;
      os->what = "zs_malloc";
      os->err_index = i;
      return;
    }
    os->handles[i] = h;
    os->sizes[i] = (uint16_t) size;
    os->bytes += size;
    if (zs_write (pool, h, data + data_offset (i), size) == -1) {
      os->err = errno;
      os->what = "zs_write";
      os->err_index = i;
      return;
    }
  }
}

static void
objset_check_error (const struct objset *os, const char *where)
{
  if (os->what)
    fatal ("%s: %s failed at object %zu of %zu: %s (no memory limit is "
           "set, so this should not happen)", where, os->what,
           os->err_index, os->n, strerror (os->err));
}

/* Check a sample of the objects: size and content. */
static void
objset_verify (struct zs_pool *pool, const struct objset *os,
               size_t stride, const char *where)
{
  unsigned char copy[ZS_PAGE_SIZE];
  size_t i;

  for (i = 0; i < os->n; i += stride) {
    zs_handle_t h = os->handles[i];
    size_t size, got;
    const unsigned char *p;

    if (h == 0)
      continue;
    size = os->sizes[i];
    got = zs_object_size (pool, h);
    if (got != size)
      fatal ("%s: object %zu: zs_object_size = %zu, allocated %zu",
             where, i, got, size);
    p = zs_read_begin (pool, h, copy);
    if (p == NULL)
      fatal ("%s: object %zu: zs_read_begin returned NULL", where, i);
    if (memcmp (p, data + data_offset (i), size) != 0)
      fatal ("%s: object %zu (size %zu): content differs from what was "
             "written", where, i, size);
    zs_read_end (pool, h, p);
  }
}

static void
check_stats_live (struct zs_pool *pool, uint64_t objects, uint64_t bytes,
                  const char *where, struct zs_pool_stats *out)
{
  struct zs_pool_stats st;

  zs_pool_stats (pool, &st);
  if (st.objects != objects || st.bytes_stored != bytes)
    fatal ("%s: zs_pool_stats reports %" PRIu64 " objects / %" PRIu64
           " bytes stored, expected %" PRIu64 " / %" PRIu64,
           where, st.objects, st.bytes_stored, objects, bytes);
  if (st.pages_used * ZS_PAGE_SIZE < st.bytes_stored)
    fatal ("%s: zs_pool_stats reports %" PRIu64 " pages for %" PRIu64
           " bytes stored", where, st.pages_used, st.bytes_stored);
  if (st.frees_pending != 0)
    fatal ("%s: zs_pool_stats reports %" PRIu64 " frees pending after "
           "its own drain", where, st.frees_pending);
  if (st.pages_used_max < st.pages_used)
    fatal ("%s: pages_used_max %" PRIu64 " < pages_used %" PRIu64,
           where, st.pages_used_max, st.pages_used);
  if (out)
    *out = st;
}

/* ---- threaded runs (tables 1 and 2) ------------------------------------ */

struct shared {
  struct zs_pool *pool;
  pthread_barrier_t barrier;
  size_t huge;
};

struct worker {
  pthread_t tid;
  struct shared *sh;
  uint64_t rng;
  struct objset os;
  double t_free_end;
};

static void
barrier (pthread_barrier_t *b)
{
  int r = pthread_barrier_wait (b);

  if (r != 0 && r != PTHREAD_BARRIER_SERIAL_THREAD)
    fatal ("pthread_barrier_wait: %s", strerror (r));
}

static void *
worker_main (void *arg)
{
  struct worker *w = arg;
  struct shared *sh = w->sh;
  size_t i;

  barrier (&sh->barrier);                 /* 1: start allocating */
  objset_fill (sh->pool, &w->os, &w->rng, sh->huge);
  barrier (&sh->barrier);                 /* 2: allocation done */
  barrier (&sh->barrier);                 /* 3: start freeing */
  for (i = 0; i < w->os.n; i++)
    zs_free (sh->pool, w->os.handles[i]);  /* zs_free (0) is a no-op */
  w->t_free_end = now ();
  barrier (&sh->barrier);                 /* 4: freeing done */
  return NULL;
}

struct run_result {
  double alloc_s;       /* alloc + write phase, wall */
  double free_s;        /* start of frees .. every thread returned */
  double free_flush_s;  /* start of frees .. zs_pool_flush returned */
  double back_s;        /* start of frees .. stats show pages_used == 0 */
  double free_cpu_s;    /* process CPU time over the free phase */
  double rss_base;      /* RSS before the pool was created */
  double rss_peak;      /* RSS with every object stored */
  double rss_after;     /* RSS after the flush */
  uint64_t pages_peak;
};

static void
run_threads (unsigned nthreads, size_t n, unsigned chain,
             enum zs_lock_mode lock, enum zs_free_mode fm, uint64_t seed,
             const char *where, struct run_result *res)
{
  struct shared sh;
  struct worker *w = xmalloc (nthreads * sizeof *w);
  struct zs_pool_stats st;
  uint64_t objects = 0, bytes = 0;
  double t0, t1, t2, t3, t4, cpu0, cpu1;
  unsigned i;
  int r;

  memset (res, 0, sizeof *res);
  for (i = 0; i < nthreads; i++) {
    w[i].sh = &sh;
    w[i].rng = rng_seed (seed, i);
    w[i].t_free_end = 0;
    objset_init (&w[i].os, n);
  }
  res->rss_base = rss_bytes ();
  sh.pool = make_pool (chain, lock, fm);
  sh.huge = zs_huge_class_size (sh.pool);
  r = pthread_barrier_init (&sh.barrier, NULL, nthreads + 1);
  if (r != 0)
    fatal ("pthread_barrier_init: %s", strerror (r));
  for (i = 0; i < nthreads; i++) {
    r = pthread_create (&w[i].tid, NULL, worker_main, &w[i]);
    if (r != 0)
      fatal ("pthread_create: %s", strerror (r));
  }

  barrier (&sh.barrier);                  /* 1 */
  t0 = now ();
  barrier (&sh.barrier);                  /* 2 */
  t1 = now ();

  /* Untimed: check everything is stored as it should be. */
  for (i = 0; i < nthreads; i++) {
    objset_check_error (&w[i].os, where);
    objects += w[i].os.n;
    bytes += w[i].os.bytes;
  }
  check_stats_live (sh.pool, objects, bytes, where, &st);
  for (i = 0; i < nthreads; i++)
    objset_verify (sh.pool, &w[i].os, VERIFY_STRIDE, where);
  res->pages_peak = st.pages_used;
  res->rss_peak = rss_bytes ();

  cpu0 = cpu_seconds ();
  barrier (&sh.barrier);                  /* 3 */
  t2 = now ();
  barrier (&sh.barrier);                  /* 4 */
  zs_pool_flush (sh.pool);
  t3 = now ();
  zs_pool_stats (sh.pool, &st);
  t4 = now ();
  cpu1 = cpu_seconds ();
  res->rss_after = rss_bytes ();

  if (st.objects != 0 || st.bytes_stored != 0 || st.pages_used != 0
      || st.frees_pending != 0)
    fatal ("%s: after freeing every object and zs_pool_flush, "
           "zs_pool_stats reports %" PRIu64 " objects, %" PRIu64
           " bytes, %" PRIu64 " pages used, %" PRIu64 " frees pending "
           "(all should be 0)", where, st.objects, st.bytes_stored,
           st.pages_used, st.frees_pending);

  res->alloc_s = t1 - t0;
  res->free_s = 0;
  for (i = 0; i < nthreads; i++)
    if (w[i].t_free_end - t2 > res->free_s)
      res->free_s = w[i].t_free_end - t2;
  res->free_flush_s = t3 - t2;
  res->back_s = t4 - t2;
  res->free_cpu_s = cpu1 - cpu0;

  for (i = 0; i < nthreads; i++) {
    r = pthread_join (w[i].tid, NULL);
    if (r != 0)
      fatal ("pthread_join: %s", strerror (r));
    objset_free (&w[i].os);
  }
  pthread_barrier_destroy (&sh.barrier);
  zs_pool_destroy (sh.pool);
  free (w);
}

/* ---- table 1: allocation scaling ---------------------------------------- */

static void
table_scaling (void)
{
  size_t ti;
  unsigned r;

  printf ("## Table 1: allocation scaling, pool lock vs class locks\n\n");
  printf ("T threads each zs_malloc + zs_write %zu objects (start together "
          "on a barrier),\nthen each zs_free its own objects; the free "
          "phase ends when zs_pool_flush returns.\n", objs_per_thread);
  printf ("Free mode: batched (ZS_FREE_BATCHED) in both variants; chain "
          "%u pages.\nMops/s = T x %zu / wall seconds; median of %u runs, "
          "variants alternating pool,class,pool,class,...\n\n",
          ZS_CHAIN_DEFAULT, objs_per_thread, repeats);
  printf ("| threads | pool-lock alloc+write Mops/s "
          "| class-lock alloc+write Mops/s | speedup "
          "| pool-lock free Mops/s | class-lock free Mops/s | speedup |\n");
  printf ("|--------:|------------------------------:"
          "|-------------------------------:|--------:"
          "|----------------------:|-----------------------:|--------:|\n");
  fflush (stdout);

  for (ti = 0; ti < threads_count; ti++) {
    unsigned t = threads_list[ti];
    double a_pool[repeats], a_class[repeats];
    double f_pool[repeats], f_class[repeats];
    double ops = (double) t * (double) objs_per_thread;
    double ap, ac, fp, fc;
    char where[64];

    for (r = 0; r < repeats; r++) {
      struct run_result res;

      snprintf (where, sizeof where, "table 1, %u threads, pool lock", t);
      run_threads (t, objs_per_thread, ZS_CHAIN_DEFAULT, ZS_LOCK_POOL,
                   ZS_FREE_BATCHED, 1000 + r, where, &res);
      a_pool[r] = ops / res.alloc_s / 1e6;
      f_pool[r] = ops / res.free_flush_s / 1e6;

      snprintf (where, sizeof where, "table 1, %u threads, class lock", t);
      run_threads (t, objs_per_thread, ZS_CHAIN_DEFAULT, ZS_LOCK_CLASS,
                   ZS_FREE_BATCHED, 1000 + r, where, &res);
      a_class[r] = ops / res.alloc_s / 1e6;
      f_class[r] = ops / res.free_flush_s / 1e6;
    }
    ap = median (a_pool, repeats);
    ac = median (a_class, repeats);
    fp = median (f_pool, repeats);
    fc = median (f_class, repeats);
    printf ("| %7u | %29.2f | %30.2f | %6.2fx | %21.2f | %22.2f | %6.2fx |\n",
            t, ap, ac, ac / ap, fp, fc, fc / fp);
    fflush (stdout);
  }
  printf ("\n");
}

/* ---- table 2: free of M MiB worth of objects ---------------------------- */

static void
table_free (void)
{
  static const unsigned procs[] = { 1, 2, 4 };
  size_t n = (size_t) free_mib * OBJS_PER_MIB;
  size_t pi;
  unsigned r;

  printf ("## Table 2: free of %u MiB worth of objects per process, "
          "immediate vs batched\n\n", free_mib);
  printf ("Each of P threads (\"processes\") stores %zu objects (%u MiB of "
          "4 KiB pages) in one\nshared pool (class locks, chain %u), then "
          "all free theirs concurrently.\n", n, free_mib, ZS_CHAIN_DEFAULT);
  printf ("time = start .. every thread returned from its last zs_free;\n"
          "back = start .. zs_pool_flush returned and zs_pool_stats shows "
          "pages_used == 0;\n"
          "CPU = process user+sys time (getrusage) from start to back, all "
          "threads;\nRSS = resident MiB of the whole process before the pool "
          "was created / with every\nobject stored -> after the flush "
          "(before zs_pool_destroy).\n");
  printf ("Median of %u runs, variants alternating immediate,batched,...\n\n",
          repeats);
  printf ("| mode | immediate ms | batched ms | speedup "
          "| immediate: ms until pages back | batched: ms until pages back "
          "| immediate CPU ms | batched CPU ms "
          "| immediate RSS base / peak -> after MiB "
          "| batched RSS base / peak -> after MiB |\n");
  printf ("|-----:|-------------:|-----------:|--------:"
          "|-------------------------------:|-----------------------------:"
          "|-----------------:|---------------:"
          "|---------------------------------------:"
          "|-------------------------------------:|\n");
  fflush (stdout);

  for (pi = 0; pi < sizeof procs / sizeof procs[0]; pi++) {
    unsigned p = procs[pi];
    double it[repeats], bt[repeats], ib[repeats], bb[repeats];
    double ic[repeats], bc[repeats];
    double ipk[repeats], iaf[repeats], bpk[repeats], baf[repeats];
    double ibs[repeats], bbs[repeats];
    double mi, mb;
    char where[64], mode[16], irss[48], brss[48];

    for (r = 0; r < repeats; r++) {
      struct run_result res;

      snprintf (where, sizeof where, "table 2, %up, immediate", p);
      run_threads (p, n, ZS_CHAIN_DEFAULT, ZS_LOCK_CLASS, ZS_FREE_IMMEDIATE,
                   2000 + r, where, &res);
      it[r] = res.free_s * 1e3;
      ib[r] = res.back_s * 1e3;
      ic[r] = res.free_cpu_s * 1e3;
      ibs[r] = res.rss_base / MIB;
      ipk[r] = res.rss_peak / MIB;
      iaf[r] = res.rss_after / MIB;

      snprintf (where, sizeof where, "table 2, %up, batched", p);
      run_threads (p, n, ZS_CHAIN_DEFAULT, ZS_LOCK_CLASS, ZS_FREE_BATCHED,
                   2000 + r, where, &res);
      bt[r] = res.free_s * 1e3;
      bb[r] = res.back_s * 1e3;
      bc[r] = res.free_cpu_s * 1e3;
      bbs[r] = res.rss_base / MIB;
      bpk[r] = res.rss_peak / MIB;
      baf[r] = res.rss_after / MIB;
    }
    mi = median (it, repeats);
    mb = median (bt, repeats);
    snprintf (mode, sizeof mode, "%up", p);
    snprintf (irss, sizeof irss, "%.0f / %.0f -> %.0f", median (ibs, repeats),
              median (ipk, repeats), median (iaf, repeats));
    snprintf (brss, sizeof brss, "%.0f / %.0f -> %.0f", median (bbs, repeats),
              median (bpk, repeats), median (baf, repeats));
    printf ("| %4s | %12.2f | %10.2f | %6.2fx | %30.2f | %28.2f "
            "| %16.1f | %14.1f | %38s | %36s |\n",
            mode, mi, mb, mi / mb, median (ib, repeats), median (bb, repeats),
            median (ic, repeats), median (bc, repeats), irss, brss);
    fflush (stdout);
  }
  printf ("\n");
}

/* ---- table 3: memory overhead -------------------------------------------- */

static void
table_overhead (void)
{
  size_t n = (size_t) overhead_mib * OBJS_PER_MIB;
  size_t ci;

  printf ("## Table 3: memory overhead by zspage chain limit\n\n");
  printf ("A fresh pool (class locks, batched frees) is filled with %zu "
          "objects (%u MiB of 4 KiB\npages) from one thread; then a random "
          "50%% of them is freed (zs_pool_stats drains).\n", n, overhead_mib);
  printf ("overhead = pages x 4096 / sum of object sizes - 1; + meta adds "
          "metadata_bytes;\nRSS growth = resident MiB with the pool full "
          "minus before the pool was created.\nOne run per chain: the "
          "sizes are drawn with a fixed seed, so the numbers repeat.\n\n");
  printf ("| chain | huge >= B | objects MiB | pages MiB | overhead "
          "| metadata MiB | overhead + meta | RSS growth MiB "
          "| after 50%% free: objects MiB | pages MiB | overhead "
          "| after zs_compact: pages MiB | overhead | compact ms |\n");
  printf ("|------:|----------:|------------:|----------:|---------:"
          "|-------------:|----------------:|---------------:"
          "|-----------------------------:|----------:|---------:"
          "|---------------------------:|---------:|-----------:|\n");
  fflush (stdout);

  for (ci = 0; ci < chain_count; ci++) {
    unsigned chain = chain_list[ci];
    struct objset os;
    struct zs_pool *pool;
    struct zs_pool_stats st1, st2, st3;
    uint32_t *order = xmalloc (n * sizeof *order);
    uint64_t rng = rng_seed (3000, 0), bytes_left;
    size_t huge, i, half = n / 2;
    double rss0, rss1;
    char where[64];

    snprintf (where, sizeof where, "table 3, chain %u", chain);
    objset_init (&os, n);
    for (i = 0; i < n; i++)
      order[i] = (uint32_t) i;

    rss0 = rss_bytes ();
    pool = make_pool (chain, ZS_LOCK_CLASS, ZS_FREE_BATCHED);
    huge = zs_huge_class_size (pool);
    objset_fill (pool, &os, &rng, huge);
    objset_check_error (&os, where);
    check_stats_live (pool, n, os.bytes, where, &st1);
    objset_verify (pool, &os, VERIFY_STRIDE, where);
    rss1 = rss_bytes ();

    /* Free a random half: shuffle the indices, free the first half. */
    for (i = n - 1; i > 0; i--) {
      size_t j = (size_t) (rng_next (&rng) % (i + 1));
      uint32_t tmp = order[i];
      order[i] = order[j];
      order[j] = tmp;
    }
    bytes_left = os.bytes;
    for (i = 0; i < half; i++) {
      size_t k = order[i];
      zs_free (pool, os.handles[k]);
      bytes_left -= os.sizes[k];
      os.handles[k] = 0;
    }
    check_stats_live (pool, n - half, bytes_left, where, &st2);
    objset_verify (pool, &os, 13, where);    /* survivors intact */
    if (st2.pages_used > st1.pages_used)
      fatal ("%s: pages_used grew from %" PRIu64 " to %" PRIu64
             " by freeing objects", where, st1.pages_used, st2.pages_used);

    /* Compact, per class before and after (for the default chain). */
    bool show_classes = chain == ZS_CHAIN_DEFAULT;
    unsigned classes = zs_class_count (pool);
    struct zs_class_stats *before = xmalloc (classes * sizeof *before);
    for (unsigned c = 0; c < classes; c++)
      zs_class_stats (pool, c, &before[c]);
    double t0 = now ();
    uint64_t compacted = zs_compact (pool);
    double compact_s = now () - t0;
    check_stats_live (pool, n - half, bytes_left, where, &st3);
    objset_verify (pool, &os, 1, where);      /* every survivor, moved */
    if (st3.pages_used + compacted != st2.pages_used)
      fatal ("%s: compaction freed %" PRIu64 " pages but pages_used went "
             "from %" PRIu64 " to %" PRIu64, where, compacted,
             st2.pages_used, st3.pages_used);

    printf ("| %5u | %9zu | %11.1f | %9.1f | %7.2f%% | %12.2f "
            "| %14.2f%% | %14.1f | %28.1f | %9.1f | %7.2f%% ",
            chain, huge,
            st1.bytes_stored / MIB, st1.pages_used * (double) ZS_PAGE_SIZE / MIB,
            100.0 * (st1.pages_used * (double) ZS_PAGE_SIZE
                     / (double) st1.bytes_stored - 1.0),
            st1.metadata_bytes / MIB,
            100.0 * ((st1.pages_used * (double) ZS_PAGE_SIZE
                      + (double) st1.metadata_bytes)
                     / (double) st1.bytes_stored - 1.0),
            (rss1 - rss0) / MIB,
            st2.bytes_stored / MIB, st2.pages_used * (double) ZS_PAGE_SIZE / MIB,
            st2.bytes_stored
            ? 100.0 * (st2.pages_used * (double) ZS_PAGE_SIZE
                       / (double) st2.bytes_stored - 1.0) : 0.0);
    printf ("| %26.1f | %7.2f%% | %10.1f |\n",
            st3.pages_used * (double) ZS_PAGE_SIZE / MIB,
            st3.bytes_stored
            ? 100.0 * (st3.pages_used * (double) ZS_PAGE_SIZE
                       / (double) st3.bytes_stored - 1.0) : 0.0,
            compact_s * 1000);
    if (show_classes) {
      printf ("\nchain %u, per class (the ten with most pages to free): "
              "size | objects | pages before | freeable before | pages after "
              "| freeable after\n", chain);
      for (unsigned shown = 0; shown < 10; shown++) {
        unsigned best = classes;
        for (unsigned c = 0; c < classes; c++)
          if (before[c].pages_freeable > 0
              && (best == classes
                  || before[c].pages_freeable > before[best].pages_freeable))
            best = c;
        if (best == classes)
          break;
        struct zs_class_stats after;
        zs_class_stats (pool, best, &after);
        printf ("  %5u | %8" PRIu64 " | %6" PRIu64 " | %6" PRIu64 " | %6" PRIu64
                " | %6" PRIu64 "\n", before[best].size, before[best].objs_used,
                before[best].pages_used, before[best].pages_freeable,
                after.pages_used, after.pages_freeable);
        before[best].pages_freeable = 0;
      }
      printf ("\n");
    }
    free (before);
    fflush (stdout);

    zs_pool_destroy (pool);
    objset_free (&os);
    free (order);
  }
  printf ("\n");
}

/* ---- main ---------------------------------------------------------------- */

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: zsbench [-s SIZES_FILE] [-t THREAD_LIST] "
           "[-n OBJECTS_PER_THREAD]\n"
           "               [-r REPEATS] [-m MIB] [-M MIB] [-c CHAIN_LIST] "
           "[-T TABLES]\n"
           "  -s FILE   object sizes, one per line (1..4096), e.g. from "
           "gen-sizes;\n"
           "            default: a built-in synthetic distribution\n"
           "  -t LIST   thread counts for table 1 (default 1,2,4,8)\n"
           "  -n N      objects per thread in table 1 (default 200000)\n"
           "  -r R      runs per value, the median is printed (default 5)\n"
           "  -m MIB    MiB of pages per process in table 2 (default 256)\n"
           "  -M MIB    MiB of pages in table 3 (default 256)\n"
           "  -c LIST   zspage chain limits for table 3 (default 4,8,16)\n"
           "  -T LIST   tables to run (default 1,2,3)\n");
}

static unsigned long
parse_ulong (int opt, const char *s, unsigned long min, unsigned long max)
{
  char *end;
  unsigned long v;

  errno = 0;
  if (*s == '-' || *s == '\0')
    fatal ("-%c: bad number '%s'", opt, s);
  v = strtoul (s, &end, 10);
  if (errno != 0 || *end != '\0' || v < min || v > max)
    fatal ("-%c: bad value '%s' (want %lu..%lu)", opt, s, min, max);
  return v;
}

static size_t
parse_list (int opt, const char *s, unsigned *out, unsigned min, unsigned max)
{
  char *copy = strdup (s), *tok, *save = NULL;
  size_t n = 0;

  if (copy == NULL)
    fatal ("out of memory");
  for (tok = strtok_r (copy, ",", &save); tok;
       tok = strtok_r (NULL, ",", &save)) {
    if (n == MAX_LIST)
      fatal ("-%c: more than %d values", opt, MAX_LIST);
    out[n++] = (unsigned) parse_ulong (opt, tok, min, max);
  }
  free (copy);
  if (n == 0)
    fatal ("-%c: empty list", opt);
  return n;
}

/* How expensive the kernel's side is here: zspage pages are faulted in on
 * first use and given back with madvise or munmap, so on a virtual machine
 * these costs can dominate every table.
 */
static void
print_calibration (void)
{
  const size_t bytes = 64u << 20, run = 4 * ZS_PAGE_SIZE;
  const size_t pages = bytes / ZS_PAGE_SIZE;
  unsigned char *p;
  double t0, t1, t2, t3;
  size_t i;

  p = mmap (NULL, bytes, PROT_READ | PROT_WRITE,
            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    printf ("- page cost calibration: mmap failed: %s\n", strerror (errno));
    return;
  }
#ifdef MADV_NOHUGEPAGE
  madvise (p, bytes, MADV_NOHUGEPAGE);
#endif
  t0 = now ();
  for (i = 0; i < bytes; i += ZS_PAGE_SIZE)
    p[i] = 1;
  t1 = now ();
  for (i = 0; i < bytes; i += run)
    madvise (p + i, run, MADV_DONTNEED);
  t2 = now ();
  for (i = 0; i < bytes; i += ZS_PAGE_SIZE)
    p[i] = 1;
  t3 = now ();
  munmap (p, bytes);
  printf ("- kernel page costs here (64 MiB, one thread): first-touch fault "
          "%.2f us/page, madvise(MADV_DONTNEED) of 4 pages %.2f us/call, "
          "re-fault %.2f us/page\n",
          (t1 - t0) / (double) pages * 1e6,
          (t2 - t1) / (double) (bytes / run) * 1e6,
          (t3 - t2) / (double) pages * 1e6);
}

static void
print_config (void)
{
  struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT, ZS_LOCK_CLASS,
                                    ZS_FREE_BATCHED);
  size_t huge = zs_huge_class_size (pool);
  uint16_t *sorted = xmalloc (dist_n * sizeof *sorted);
  size_t i, nhuge = 0, j;
  double sum = 0;
  time_t t = time (NULL);
  char date[64];

  for (i = 0; i < dist_n; i++) {
    size_t s = dist[i] >= huge ? ZS_PAGE_SIZE : dist[i];
    sum += (double) s;
    nhuge += s == ZS_PAGE_SIZE;
    sorted[i] = (uint16_t) s;
  }
  /* Counting sort for the percentiles. */
  {
    size_t count[ZS_PAGE_SIZE + 1] = { 0 };
    for (i = 0; i < dist_n; i++)
      count[sorted[i]]++;
    for (i = 0, j = 0; i <= ZS_PAGE_SIZE; i++)
      while (count[i]--)
        sorted[j++] = (uint16_t) i;
  }
  strftime (date, sizeof date, "%Y-%m-%d %H:%M:%S", localtime (&t));

  printf ("# zsbench: zsalloc allocator benchmark\n\n");
  {
    char load[64] = "?";
    FILE *fp = fopen ("/proc/loadavg", "r");
    if (fp) {
      if (fgets (load, sizeof load, fp) == NULL)
        strcpy (load, "?");
      fclose (fp);
    }
    load[strcspn (load, "\n")] = '\0';
    printf ("- date: %s; online CPUs (nproc): %ld; /proc/loadavg at start: "
            "%s\n", date, sysconf (_SC_NPROCESSORS_ONLN), load);
  }
  printf ("- sizes: %s\n", dist_source);
  printf ("- huge class size (zs_huge_class_size, chain %u): %zu B; sizes "
          ">= it are stored as 4096 B\n", ZS_CHAIN_DEFAULT, huge);
  printf ("- object size after that: mean %.0f B, p10 %u, median %u, "
          "p90 %u; huge (4096 B) %.1f%%\n",
          sum / (double) dist_n, sorted[dist_n / 10], sorted[dist_n / 2],
          sorted[dist_n * 9 / 10], 100.0 * (double) nhuge / (double) dist_n);
  printf ("- zs_read_needs_copy: %d; size classes (chain %u): %u\n",
          zs_read_needs_copy (pool), ZS_CHAIN_DEFAULT, zs_class_count (pool));
  printf ("- repeats: %u (median printed); table 1: threads ", repeats);
  for (i = 0; i < threads_count; i++)
    printf ("%s%u", i ? "," : "", threads_list[i]);
  printf (", %zu objects per thread; table 2: %u MiB per process; "
          "table 3: %u MiB, chains ", objs_per_thread, free_mib,
          overhead_mib);
  for (i = 0; i < chain_count; i++)
    printf ("%s%u", i ? "," : "", chain_list[i]);
  printf ("\n");
  print_calibration ();
  printf ("- clock: CLOCK_MONOTONIC; content and statistics are checked "
          "outside the timed phases\n\n");
  fflush (stdout);
  free (sorted);
  zs_pool_destroy (pool);
}

int
main (int argc, char *argv[])
{
  int opt;

  while ((opt = getopt (argc, argv, "s:t:n:r:m:M:c:T:h")) != -1) {
    switch (opt) {
    case 's':
      sizes_file = optarg;
      break;
    case 't':
      threads_count = parse_list (opt, optarg, threads_list, 1, 1024);
      break;
    case 'n':
      objs_per_thread = parse_ulong (opt, optarg, 1, UINT32_MAX);
      break;
    case 'r':
      repeats = (unsigned) parse_ulong (opt, optarg, 1, 1001);
      break;
    case 'm':
      free_mib = (unsigned) parse_ulong (opt, optarg, 1, 1 << 20);
      break;
    case 'M':
      overhead_mib = (unsigned) parse_ulong (opt, optarg, 1, 1 << 20);
      break;
    case 'c':
      chain_count = parse_list (opt, optarg, chain_list,
                                ZS_CHAIN_MIN, ZS_CHAIN_MAX);
      break;
    case 'T': {
      unsigned tl[MAX_LIST];
      size_t k, cnt = parse_list (opt, optarg, tl, 1, 3);
      run_table[1] = run_table[2] = run_table[3] = 0;
      for (k = 0; k < cnt; k++)
        run_table[tl[k]] = 1;
      break;
    }
    case 'h':
      usage (stdout);
      return 0;
    default:
      usage (stderr);
      return 1;
    }
  }
  if (optind < argc) {
    fprintf (stderr, "zsbench: unexpected argument '%s'\n", argv[optind]);
    usage (stderr);
    return 1;
  }

  if (sizes_file)
    load_distribution (sizes_file);
  else
    synthetic_distribution ();
  fill_data ();

  print_config ();
  if (run_table[1])
    table_scaling ();
  if (run_table[2])
    table_free ();
  if (run_table[3])
    table_overhead ();
  return 0;
}
