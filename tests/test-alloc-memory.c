/* Unit tests for the zsalloc allocator (alloc/zsalloc.h): memory given back, the reserve and swap mode's resident pages.
 *
 * Every test builds its own pool(s) and asserts on object contents, on
 * the public statistics and, where the design fixes it, on exact page
 * counts.  Run under ASan/LSan by CI, so every test also frees what it
 * allocates.  The shared helpers are in alloc-fixture.h.
 */

#include "alloc-fixture.h"

/* Memory a sanitizer's runtime keeps for itself while a test runs. */
#if defined (__SANITIZE_THREAD__) || defined (__SANITIZE_ADDRESS__)
#define SANITIZER_SLACK (4u << 20)
#elif defined (__has_feature)
#if __has_feature (thread_sanitizer) || __has_feature (address_sanitizer)
#define SANITIZER_SLACK (4u << 20)
#endif
#endif
#ifndef SANITIZER_SLACK
#define SANITIZER_SLACK 0u
#endif

/* ---------------------------------------------------------------------- */
/* 11. Freed memory goes back to the operating system.                    */

static uint64_t
rss_bytes (void)
{
  FILE *fp = fopen ("/proc/self/statm", "r");
  unsigned long size, resident;

  assert_non_null (fp);
  assert_int_equal (fscanf (fp, "%lu %lu", &size, &resident), 2);
  fclose (fp);
  return (uint64_t) resident * (uint64_t) sysconf (_SC_PAGESIZE);
}

static void
test_memory_returns (void **state)
{
  (void) state;
  enum { SIZE = 2000 };
  const size_t n = (64u << 20) / SIZE;
  zs_handle_t *h = calloc (n, sizeof *h);
  uint8_t buf[SIZE];
  struct zs_pool_stats st;

  assert_non_null (h);
  memset (h, 0xff, n * sizeof *h); /* make the array resident first */
  struct zs_pool *pool = default_pool ();

  uint64_t before = rss_bytes ();
  for (size_t i = 0; i < n; i++) {
    h[i] = zs_malloc (pool, SIZE);
    assert_true (h[i] != 0);
    memset (buf, (int) (i & 0xff), SIZE);
    buf[0] = 0x5a;
    assert_int_equal (zs_write (pool, h[i], buf, SIZE), 0);
  }
  uint64_t peak = rss_bytes ();
  for (size_t i = 0; i < n; i += 997) {
    uint8_t local[PAGE];
    const uint8_t *p = zs_read_begin (pool, h[i], local);
    assert_non_null (p);
    assert_int_equal (p[0], 0x5a);
    assert_int_equal (p[SIZE - 1], i & 0xff);
    zs_read_end (pool, h[i], p);
  }
  get_stats (pool, &st);
  assert_int_equal (st.objects, n);
  assert_true (st.pages_used * PAGE >= (uint64_t) n * SIZE);

  for (size_t i = 0; i < n; i++)
    zs_free (pool, h[i]);
  zs_pool_flush (pool);
  uint64_t after = rss_bytes ();
  get_stats (pool, &st);

  print_message ("RSS before %ju KiB, peak %ju KiB, after free %ju KiB\n",
                 (uintmax_t) before >> 10, (uintmax_t) peak >> 10,
                 (uintmax_t) after >> 10);
  assert_int_equal (st.pages_used, 0);
  assert_int_equal (st.objects, 0);
  assert_true (peak > before);
  /* At least 64 MiB were written. */
  assert_true (peak - before >= (uint64_t) 60 << 20);
  assert_true (after <= peak);
  assert_true ((peak - after) * 4 >= (peak - before) * 3);

  zs_pool_destroy (pool);
  free (h);
}


/* ---------------------------------------------------------------------- */
/* 12. Memory comes back when the process locks its memory (swap mode:    */
/*     mlockall with MCL_ONFAULT; nbdkit --swap: without), and the runs   */
/*     it gave back are locked again when reused.                          */

struct locked_result {
  /* 0 ok, 77 could not lock, else failed.  64 bits, so that the struct
   * has no padding: the child writes it whole, and valgrind reports
   * uninitialised padding bytes passed to write().
   */
  int64_t status;
  uint64_t rss_full, rss_freed, rss_reused;
  uint64_t locked_full, locked_freed, locked_reused;
  uint64_t mappings_full, mappings_freed;
};

/* Lines of /proc/self/maps: the process's mappings. */
static uint64_t
mapping_count (void)
{
  FILE *fp = fopen ("/proc/self/maps", "r");
  uint64_t lines = 0;
  int c;
  while (fp && (c = getc (fp)) != EOF)
    lines += c == '\n';
  if (fp)
    fclose (fp);
  return lines;
}

/* A field of /proc/self/status in KiB. */
static uint64_t
status_kib (const char *name)
{
  FILE *fp = fopen ("/proc/self/status", "r");
  char line[256];
  uint64_t value = 0;
  size_t length = strlen (name);
  while (fp && fgets (line, sizeof line, fp))
    if (strncmp (line, name, length) == 0 && line[length] == ':')
      value = strtoull (line + length + 1, NULL, 10);
  if (fp)
    fclose (fp);
  return value;
}

/* In a child (the lock must not outlive the case): 8192 one-page objects,
 * every other one freed, so every chunk stays half used and its freed
 * runs must be given back one by one; then as many allocated again.
 */
static struct locked_result
locked_child (int lock_flags)
{
  struct locked_result result = { .status = 1 };
  enum { N = 8192 };
  if (mlockall (lock_flags) == -1) {
    result.status = 77;
    return result;
  }
  struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS,
                                    ZS_FREE_IMMEDIATE);
  static zs_handle_t h[N];
  uint8_t buf[PAGE];
  for (unsigned i = 0; i < N; i++) {
    h[i] = zs_malloc (pool, PAGE);
    memset (buf, (int) i, PAGE);
    if (!h[i] || zs_write (pool, h[i], buf, PAGE) != 0)
      return result;
  }
  result.rss_full = status_kib ("VmRSS");
  result.locked_full = status_kib ("VmLck");
  result.mappings_full = mapping_count ();
  if (result.locked_full == 0) {
    result.status = 77;         /* AddressSanitizer ignores mlockall */
    return result;
  }
  for (unsigned i = 0; i < N; i += 2)
    zs_free (pool, h[i]);
  zs_pool_flush (pool);
  result.rss_freed = status_kib ("VmRSS");
  result.locked_freed = status_kib ("VmLck");
  result.mappings_freed = mapping_count ();
  for (unsigned i = 0; i < N; i += 2) {
    h[i] = zs_malloc (pool, PAGE);
    memset (buf, (int) i, PAGE);
    if (!h[i] || zs_write (pool, h[i], buf, PAGE) != 0)
      return result;
  }
  result.locked_reused = status_kib ("VmLck");
  result.rss_reused = status_kib ("VmRSS");
  for (unsigned i = 0; i < N; i++) {
    const uint8_t *p = zs_read_begin (pool, h[i], NULL);
    bool intact = p[0] == (uint8_t) i && p[PAGE - 1] == (uint8_t) i;
    zs_read_end (pool, h[i], p);
    if (!intact)
      return result;
  }
  zs_pool_destroy (pool);
  result.status = 0;
  return result;
}

static void
test_memory_returns_when_locked (void **state)
{
  (void) state;
  /* Only future mappings (the pool's chunks): MCL_CURRENT without
   * MCL_ONFAULT would populate a sanitizer's terabytes of shadow.
   */
  static const struct { int flags; const char *name; } modes[] = {
    { MCL_FUTURE | MCL_ONFAULT, "swap=on (MCL_ONFAULT)" },
    { MCL_FUTURE, "nbdkit --swap (MCL_FUTURE)" },
  };
  for (unsigned m = 0; m < 2; m++) {
    int pipe_fds[2];
    assert_int_equal (pipe (pipe_fds), 0);
    pid_t pid = fork ();
    assert_true (pid != -1);
    if (pid == 0) {
      struct locked_result result = locked_child (modes[m].flags);
      ssize_t written = write (pipe_fds[1], &result, sizeof result);
      _exit (written == sizeof result ? 0 : 1);
    }
    close (pipe_fds[1]);
    struct locked_result result;
    assert_int_equal (read (pipe_fds[0], &result, sizeof result), sizeof result);
    close (pipe_fds[0]);
    int status;
    assert_int_equal (waitpid (pid, &status, 0), pid);
    /* Also fails on a valgrind error in the child (--error-exitcode). */
    assert_true (WIFEXITED (status) && WEXITSTATUS (status) == 0);
    if (result.status == 77) {
      print_message ("%s: not run: mlockall refused (no CAP_IPC_LOCK, small "
                     "RLIMIT_MEMLOCK) or ignored (AddressSanitizer)\n",
                     modes[m].name);
      continue;
    }
    print_message ("%s: RSS %" PRIu64 " KiB full, %" PRIu64 " KiB after "
                   "freeing half, %" PRIu64 " KiB reused; locked %" PRIu64
                   " -> %" PRIu64 " -> %" PRIu64 " KiB; mappings %" PRIu64
                   " -> %" PRIu64 "\n", modes[m].name, result.rss_full,
                   result.rss_freed, result.rss_reused, result.locked_full,
                   result.locked_freed, result.locked_reused,
                   result.mappings_full, result.mappings_freed);
    assert_int_equal (result.status, 0);
    /* 16 MiB were freed: at least 12 of them must leave the RSS, and
     * come back when reused.
     */
    assert_true (result.rss_freed + 12 * 1024 <= result.rss_full);
    assert_true (result.rss_reused >= result.rss_freed + 12 * 1024);
    /* Locked still (MADV_DONTNEED_LOCKED keeps the mapping), and not cut
     * into thousands of mappings (munlock of each freed run did that).
     */
    assert_true (result.locked_reused >= result.locked_full);
    assert_true (result.mappings_freed <= result.mappings_full + 16);
  }
}

/* ---------------------------------------------------------------------- */
/* 13. The reserve: populated chunks counted in the limit, taken by new    */
/*     zspages before the OS is asked, and never costing the data room.   */

static unsigned
fill_until_refused (struct zs_pool *pool, zs_handle_t *h, unsigned max)
{
  unsigned n = 0;
  while (n < max && (h[n] = zs_malloc (pool, PAGE)) != 0)
    n++;
  assert_true (n < max);
  assert_int_equal (errno, ENOSPC);
  return n;
}

static void
test_reserve (void **state)
{
  (void) state;
  enum { LIMIT = 16 << 20, RESERVE = 4 << 20, MAX = 8192 };
  zs_handle_t *h = calloc (MAX, sizeof *h);
  assert_non_null (h);

  struct zs_pool_config config;
  zs_pool_config_init (&config);
  config.mem_limit = LIMIT;
  config.free_mode = ZS_FREE_IMMEDIATE;
  struct zs_pool *plain = zs_pool_create (&config);
  unsigned plain_count = fill_until_refused (plain, h, MAX);
  zs_pool_destroy (plain);

  config.reserve_bytes = RESERVE;
  struct zs_pool *pool = zs_pool_create (&config);
  assert_non_null (pool);
  assert_true (zs_pool_reserve_low (pool));
  assert_int_equal (zs_pool_reserve_refill (pool), RESERVE);
  assert_false (zs_pool_reserve_low (pool));
  struct zs_pool_stats st;
  get_stats (pool, &st);
  assert_int_equal (st.reserve_bytes, RESERVE);
  assert_int_equal (st.reserve_refills, RESERVE);
  assert_true (st.limit_used >= RESERVE);

  /* The first chunks come from the reserve: no miss. */
  for (unsigned i = 0; i < 256; i++)
    assert_true ((h[i] = zs_malloc (pool, PAGE)) != 0);
  get_stats (pool, &st);
  assert_int_equal (st.reserve_misses, 0);
  assert_true (st.reserve_bytes < RESERVE);
  for (unsigned i = 0; i < 256; i++)
    zs_free (pool, h[i]);

  /* Full: as many objects as without a reserve, which was given up. */
  assert_int_equal (zs_pool_reserve_refill (pool) % (2 << 20), 0);
  unsigned count = fill_until_refused (pool, h, MAX);
  get_stats (pool, &st);
  print_message ("reserve: %u objects fit with it, %u without; %" PRIu64
                 " misses, %" PRIu64 " bytes left in it\n", count, plain_count,
                 st.reserve_misses, st.reserve_bytes);
  assert_int_equal (count, plain_count);
  assert_int_equal (st.reserve_bytes, 0);
  assert_true (st.reserve_misses > 0);
  assert_true (st.limit_used <= LIMIT);
  /* At the limit nothing can be added to it. */
  assert_int_equal (zs_pool_reserve_refill (pool), 0);

  for (unsigned i = 0; i < count; i++)
    zs_free (pool, h[i]);
  assert_int_equal (zs_pool_reserve_refill (pool), RESERVE);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, 0);
  assert_true (st.limit_used >= RESERVE && st.limit_used < RESERVE + PAGE * 8);
  zs_pool_destroy (pool);
  free (h);
}


/* The reserve's regressions: a cell block refused while the reserve
 * holds room must take that room; a refusal while a refill is in flight
 * must not be made; what is resident must stay within the limit when
 * chunks taken from the reserve keep populated runs unused.
 */
/* The refill thread of part 3 waits here until the test has read its
 * RSS: the new thread's stack and a sanitizer's per-thread state are
 * then outside the growth measured.
 */
static pthread_barrier_t refill_start;

static void *
refill_loop (void *arg)
{
  struct zs_pool *pool = arg;
  pthread_barrier_wait (&refill_start);
  for (int i = 0; i < 200000; i++) {
    zs_pool_reserve_refill (pool);
    if (i % 64 == 0)
      sched_yield ();
  }
  return NULL;
}

struct refiller {
  struct zs_pool *pool;
  atomic_bool stop;
};

static void *
refiller_main (void *arg)
{
  struct refiller *refiller = arg;
  while (!atomic_load (&refiller->stop))
    zs_pool_reserve_refill (refiller->pool);
  return NULL;
}

static void
test_reserve_edges (void **state)
{
  (void) state;
  struct zs_pool_config config;

  /* 1. A cell block (and a zspage) when only the reserve has room.  The
   * refill leaves a chunk of the limit to the data; a charge takes it.
   */
  zs_pool_config_init (&config);
  config.mem_limit = (4 << 20) + 2000;
  config.reserve_bytes = 2 << 20;
  struct zs_pool *pool = zs_pool_create (&config);
  assert_non_null (pool);
  assert_int_equal (zs_pool_reserve_refill (pool), 2 << 20);
  assert_int_equal (zs_pool_reserve_refill (pool), 0);
  assert_int_equal (zs_pool_charge (pool, 2 << 20), 0);
  zs_handle_t h = zs_malloc (pool, 100);
  if (!h)
    fail_msg ("zs_malloc (100) refused with 2 MiB of limit in the reserve: %s",
              strerror (errno));
  zs_free (pool, h);
  zs_pool_discharge (pool, 2 << 20);
  zs_pool_destroy (pool);

  /* 2. Fill to the limit while another thread refills the reserve:
   * every round stores exactly as much as a pool without a reserve.
   */
  enum { LIMIT = 4 << 20, MAX = 2048, ROUNDS = 40 };
  zs_handle_t *handles = calloc (MAX, sizeof *handles);
  assert_non_null (handles);
  zs_pool_config_init (&config);
  config.mem_limit = LIMIT;
  config.free_mode = ZS_FREE_IMMEDIATE;
  pool = zs_pool_create (&config);
  unsigned expected = fill_until_refused (pool, handles, MAX);
  zs_pool_destroy (pool);
  config.reserve_bytes = 2 << 20;
  unsigned short_rounds = 0;
  for (unsigned round = 0; round < ROUNDS; round++) {
    pool = zs_pool_create (&config);
    struct refiller refiller = { .pool = pool, .stop = false };
    pthread_t thread;
    assert_int_equal (pthread_create (&thread, NULL, refiller_main, &refiller), 0);
    unsigned count = fill_until_refused (pool, handles, MAX);
    atomic_store (&refiller.stop, true);
    pthread_join (thread, NULL);
    short_rounds += count != expected;
    zs_pool_destroy (pool);
  }
  print_message ("reserve: %u of %u rounds filled short of %u objects while "
                 "refilling\n", short_rounds, ROUNDS, expected);
  assert_int_equal (short_rounds, 0);
  free (handles);

  /* 3. Chunks taken from the reserve by zspages of every length: the
   * resident memory stays within the limit.
   */
  zs_pool_config_init (&config);
  config.mem_limit = 24 << 20;
  config.reserve_bytes = 16 << 20;
  pool = zs_pool_create (&config);
  pthread_t thread;
  assert_int_equal (pthread_barrier_init (&refill_start, NULL, 2), 0);
  assert_int_equal (pthread_create (&thread, NULL, refill_loop, pool), 0);
  uint64_t before = rss_bytes ();
  zs_pool_reserve_refill (pool);
  bool length_seen[ZS_CHAIN_MAX + 1] = { false };
  zs_handle_t kept[ZS_CHAIN_MAX + 1];
  unsigned lengths = 0;
  for (unsigned c = 0; c < zs_class_count (pool); c++) {
    struct zs_class_stats class;
    zs_class_stats (pool, c, &class);
    if (length_seen[class.pages_per_zspage])
      continue;
    length_seen[class.pages_per_zspage] = true;
    kept[lengths] = zs_malloc (pool, class.size);
    assert_true (kept[lengths] != 0);
    lengths++;
  }
  zs_pool_reserve_refill (pool);
  pthread_barrier_wait (&refill_start);
  pthread_join (thread, NULL);
  pthread_barrier_destroy (&refill_start);
  uint64_t growth = rss_bytes () - before;
  struct zs_pool_stats st;
  get_stats (pool, &st);
  print_message ("reserve: %u zspage lengths; RSS grew %" PRIu64 " KiB, limit "
                 "%" PRIu64 " KiB, counted %" PRIu64 " KiB (reserve %" PRIu64
                 " KiB)\n", lengths, growth >> 10, st.mem_limit >> 10,
                 st.limit_used >> 10, st.reserve_bytes >> 10);
  assert_true (st.limit_used <= st.mem_limit);
  /* What is resident is what is counted, give or take the handful of
   * pages malloc and the test itself touch, and under a sanitizer the
   * runtime's own bookkeeping of 200,000 rounds of locks (TSan's sync
   * objects and traces: 0.2 to 1.2 MiB seen).  A reserve counted once
   * and held twice would still be 16 MiB over.
   */
  assert_true (growth <= st.limit_used + (1 << 20) + SANITIZER_SLACK);
  for (unsigned i = 0; i < lengths; i++)
    zs_free (pool, kept[i]);
  zs_pool_destroy (pool);
}

/* 14. resident_only (swap mode): a new zspage takes only pages that are   */
/*     resident already; with none ready zs_malloc fails at once (EAGAIN)  */
/*     and the refill makes more ready.                                    */

/* Allocate one object of size; on EAGAIN refill once and try again: it
 * must then succeed.  Returns the handle.
 */
static zs_handle_t
malloc_refilling (struct zs_pool *pool, size_t size, unsigned *refusals)
{
  zs_handle_t handle = zs_malloc (pool, size);
  if (handle)
    return handle;
  assert_int_equal (errno, EAGAIN);
  (*refusals)++;
  zs_pool_reserve_refill (pool);
  handle = zs_malloc (pool, size);
  if (!handle)
    fail_msg ("zs_malloc (%zu) refused again after a refill: %s", size,
              strerror (errno));
  return handle;
}

/* A resident_only pool with a reserve, frees immediate, its limit
 * counting everything or (pages_only) the zspages' pages alone.
 */
static struct zs_pool *
make_resident_pool (uint64_t limit, uint64_t reserve, bool pages_only)
{
  struct zs_pool_config config;
  zs_pool_config_init (&config);
  config.mem_limit = limit;
  config.limit_pages_only = pages_only;
  config.free_mode = ZS_FREE_IMMEDIATE;
  config.reserve_bytes = reserve;
  config.resident_only = true;
  struct zs_pool *pool = zs_pool_create (&config);
  assert_non_null (pool);
  return pool;
}

/* Pages of PAGE-sized objects (one page each) a resident_only pool
 * with a reserve stores before ENOSPC, its limit counting pages only or
 * everything; the handles freed again.
 */
static size_t
fill_to_limit (bool pages_only, uint64_t limit, uint64_t reserve)
{
  struct zs_pool *pool = make_resident_pool (limit, reserve, pages_only);
  zs_pool_metadata_ready (pool, 16 << 20);
  struct zs_pool_stats st;

  assert_int_equal (zs_pool_reserve_refill (pool), reserve);
  get_stats (pool, &st);
  /* The reserve counts under the limit only when it counts everything. */
  assert_int_equal (st.limit_used, pages_only ? 0 : reserve);
  /* So do the user's charges: never refused when it counts pages. */
  assert_int_equal (zs_pool_charge (pool, 2 * limit), pages_only ? 0 : -1);
  get_stats (pool, &st);
  assert_int_equal (st.limit_used, pages_only ? 0 : reserve);
  if (pages_only)
    zs_pool_discharge (pool, 2 * limit);

  size_t room = limit / PAGE * 2;
  zs_handle_t *h = calloc (room, sizeof *h);
  assert_non_null (h);
  size_t n = 0;
  unsigned misses = 0;
  for (;;) {
    errno = 0;
    zs_handle_t x = zs_malloc (pool, PAGE);
    if (x) {
      assert_true (n < room);
      write_pattern (pool, x, PAGE, n);
      h[n++] = x;
      continue;
    }
    if (errno == EAGAIN && misses++ < room) {
      zs_pool_reserve_refill (pool);
      continue;
    }
    assert_int_equal (errno, ENOSPC);
    break;
  }
  get_stats (pool, &st);
  assert_true (st.limit_used <= limit);
  if (pages_only)
    assert_int_equal (st.limit_used, st.pages_used * PAGE);
  for (size_t i = 0; i < n; i++) {
    assert_true (object_ok (pool, h[i], PAGE, i));
    zs_free (pool, h[i]);
  }
  free (h);
  zs_pool_destroy (pool);
  return n;
}

/* limit_pages_only: the limit counts the zspages' pages as the kernel's
 * zram counts its mem_limit - the data fills all of it, where a limit
 * counting everything leaves it less the metadata and what is left of
 * the reserve once the limit stops its refills.
 */
static void
test_limit_pages_only (void **state)
{
  (void) state;
  enum { LIMIT = 4 << 20, RESERVE = 2 << 20 };
  size_t pages = fill_to_limit (true, LIMIT, RESERVE);
  size_t everything = fill_to_limit (false, LIMIT, RESERVE);
  print_message ("limit of %d pages: %zu stored counting pages only, %zu "
                 "counting everything (a reserve of %d pages)\n",
                 LIMIT / PAGE, pages, everything, RESERVE / PAGE);
  assert_int_equal (pages, LIMIT / PAGE);
  assert_true (everything < pages);
}

static void
test_resident_only (void **state)
{
  (void) state;
  enum { LIMIT = 64 << 20, RESERVE = 4 << 20, SIZES = (PAGE - 32) / 16 + 1 };
  struct zs_pool *pool = make_resident_pool (LIMIT, RESERVE, false);
  struct zs_pool_stats st;

  /* No heap said ready for metadata yet: refused at once, for that. */
  assert_int_equal (zs_malloc (pool, 100), 0);
  assert_int_equal (errno, EAGAIN);
  get_stats (pool, &st);
  assert_int_equal (st.metadata_misses, 1);
  assert_int_equal (st.pages_used, 0);

  /* Metadata room, but no page resident yet: refused at once, not
   * mapped.
   */
  zs_pool_metadata_ready (pool, 16 << 20);
  assert_int_equal (zs_malloc (pool, 100), 0);
  assert_int_equal (errno, EAGAIN);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, 0);
  assert_true (st.reserve_misses >= 1);

  /* Every class, so every run length: each takes a chunk of its own from
   * the reserve, more than the reserve holds; a refill after a refusal
   * always makes room (it once counted the other lengths' spare runs as
   * the reserve and added nothing).
   */
  assert_int_equal (zs_pool_reserve_refill (pool), RESERVE);
  zs_handle_t h[SIZES];
  unsigned refusals = 0;
  for (unsigned i = 0; i < SIZES; i++)
    h[i] = malloc_refilling (pool, 32 + 16 * i, &refusals);
  print_message ("resident_only: %u sizes, %u refusals, each cured by a "
                 "refill\n", (unsigned) SIZES, refusals);
  assert_true (refusals > 0);
  for (unsigned i = 0; i < SIZES; i++)
    zs_free (pool, h[i]);

  /* The metadata allowance runs out: a new zspage is refused with pages
   * ready (EAGAIN, counted), the pool says it is low, and a new
   * allowance cures it.  Objects of one class, each zspage taking a
   * descriptor: a small allowance is spent within a few zspages.
   */
  get_stats (pool, &st);
  uint64_t metadata_misses = st.metadata_misses;
  zs_pool_metadata_ready (pool, 4096);
  zs_handle_t spent[64];
  unsigned made = 0;
  while (made < 64 && (spent[made] = zs_malloc (pool, PAGE)))
    made++;
  assert_true (made < 64);
  assert_int_equal (errno, EAGAIN);
  assert_true (zs_pool_reserve_low (pool));
  get_stats (pool, &st);
  assert_int_equal (st.metadata_misses, metadata_misses + 1);
  zs_pool_metadata_ready (pool, 16 << 20);
  zs_pool_reserve_refill (pool);
  assert_true ((spent[made] = zs_malloc (pool, PAGE)) != 0);
  for (unsigned i = 0; i <= made; i++)
    zs_free (pool, spent[i]);

  /* A free, and a flush, give nothing back in resident_only, however
   * many pages are freed (past PAGE_DIRTY_MAX_PAGES here): a write never
   * makes a memory-map call.  The refill purges, in slices, all but
   * PAGE_READY_RUNS_PAGES of each run length's freed pages, which serve
   * the next writes without the reserve; what it gave back is not
   * resident, so no write takes it until a later refill makes it
   * resident again - and then it is taken before any reserve page.  One
   * object stays, so that its chunk stays mapped (an all-free chunk is
   * unmapped whole).
   */
  enum { OBJECTS = 300, READY = PAGE_READY_RUNS_PAGES };
  _Static_assert (OBJECTS - 1 > PAGE_DIRTY_MAX_PAGES,
                  "more freed pages than a purge_runs slice");
  zs_handle_t big[OBJECTS];
  for (unsigned i = 0; i < OBJECTS; i++)
    big[i] = malloc_refilling (pool, PAGE, &refusals);
  get_stats (pool, &st);
  uint64_t freed = st.pages_freed;
  for (unsigned i = 1; i < OBJECTS; i++)
    zs_free (pool, big[i]);
  zs_pool_flush (pool);
  get_stats (pool, &st);
  assert_int_equal (st.pages_freed, freed);
  zs_pool_reserve_release (pool);
  zs_pool_reserve_refill (pool);
  get_stats (pool, &st);
  if (st.pages_freed < freed + OBJECTS - 1 - READY)
    fail_msg ("the refill gave back %" PRIu64 " pages of %u freed, keeping "
              "%u", st.pages_freed - freed, OBJECTS - 1, READY);
  uint64_t reserve = st.reserve_bytes;
  assert_true (reserve > 0);
  for (unsigned i = 1; i <= READY; i++)  /* kept by the refill's purge */
    if (!(big[i] = zs_malloc (pool, PAGE)))
      fail_msg ("kept run %u of %u refused: %s", i, READY, strerror (errno));
  get_stats (pool, &st);
  assert_int_equal (st.reserve_bytes, reserve);
  zs_pool_reserve_refill (pool);  /* readies given-back runs */
  get_stats (pool, &st);
  reserve = st.reserve_bytes;
  for (unsigned i = READY + 1; i <= 2 * READY; i++)
    if (!(big[i] = zs_malloc (pool, PAGE)))
      fail_msg ("readied run %u refused: %s", i - READY, strerror (errno));
  get_stats (pool, &st);
  assert_int_equal (st.reserve_bytes, reserve);
  for (unsigned i = 2 * READY + 1; i < OBJECTS; i++)
    big[i] = malloc_refilling (pool, PAGE, &refusals);
  for (unsigned i = 0; i < OBJECTS; i++)
    zs_free (pool, big[i]);
  zs_pool_destroy (pool);

  /* Filled to the limit: a write that finds nothing resident, where the
   * limit leaves no room for another reserve chunk, is refused with
   * ENOSPC (a full device), never "not ready" for ever; the reserve's
   * chunk is not given up to make room (it is what writes take).
   */
  pool = make_resident_pool (6 << 20, 2 << 20, false);
  zs_pool_metadata_ready (pool, 16 << 20);
  enum { FILL_MAX = 4096 };
  zs_handle_t *fill = calloc (FILL_MAX, sizeof *fill);
  assert_non_null (fill);
  unsigned n = 0, not_ready_in_a_row = 0;
  while (n < FILL_MAX) {
    if ((fill[n] = zs_malloc (pool, PAGE))) {
      n++;
      not_ready_in_a_row = 0;
      continue;
    }
    if (errno != EAGAIN || ++not_ready_in_a_row > 2)
      break;
    zs_pool_reserve_refill (pool);
  }
  assert_true (n < FILL_MAX);
  if (errno != ENOSPC)
    fail_msg ("filled to the limit with %u objects: refused with %s, not "
              "ENOSPC", n, strerror (errno));
  get_stats (pool, &st);
  assert_true (st.limit_used <= st.mem_limit);
  assert_true (n * (uint64_t) PAGE >= (3 << 20));
  print_message ("resident_only: full at %u objects of 4 KiB, mem_limit "
                 "6 MiB, refused with ENOSPC\n", n);

  for (unsigned i = 0; i < n; i++)
    zs_free (pool, fill[i]);
  free (fill);
  zs_pool_destroy (pool);
}

/* Fill a resident_only pool with objects of size, the keeper's refill
 * after each (so the reserve stays whole, as in swap mode), until
 * refused for a reason other than "not ready": that errno.
 */
static int
fill_keeping_reserve (struct zs_pool *pool, size_t size, zs_handle_t *fill,
                      unsigned *n, unsigned max)
{
  unsigned not_ready_in_a_row = 0;
  while (*n < max) {
    if ((fill[*n] = zs_malloc (pool, size))) {
      (*n)++;
      not_ready_in_a_row = 0;
      zs_pool_reserve_refill (pool);
      continue;
    }
    if (errno != EAGAIN || ++not_ready_in_a_row > 2)
      break;
    zs_pool_reserve_refill (pool);
  }
  return *n < max ? errno : 0;
}

/* 15. A closed reserve stays whole at the limit, whatever the limit and */
/*     the zspages' length: the data's room is the limit less all of it.  */
/*     (It was eaten zspage by zspage where the room left at the limit   */
/*     held one zspage: each took reserve pages, whose settle gave the    */
/*     next one their room; 6 MiB limits passed or failed by 4 KiB.)      */
static void
test_resident_only_reserve_kept_at_limit (void **state)
{
  (void) state;
  enum { RESERVE = 2 << 20, FILL_MAX = 4096 };
  static const size_t sizes[] = { PAGE, PAGE * 2 / 3, 1000 };
  zs_handle_t *fill = calloc (FILL_MAX, sizeof *fill);
  assert_non_null (fill);
  unsigned cases = 0;
  for (unsigned s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (uint64_t limit = (6 << 20) - 16 * PAGE; limit <= (6 << 20) + 16 * PAGE;
         limit += PAGE) {
      struct zs_pool *pool = make_resident_pool (limit, RESERVE, false);
      zs_pool_metadata_ready (pool, 16 << 20);
      unsigned n = 0;
      assert_int_equal (fill_keeping_reserve (pool, sizes[s], fill, &n, FILL_MAX),
                        ENOSPC);
      struct zs_pool_stats st;
      get_stats (pool, &st);
      /* The data's pages never reach into the reserve's room, and had
       * the rest of what the reserve holds: another zspage (the default
       * chain's pages at most, and its descriptor) would not have
       * fitted.  The reserve may hold more than its target (spare runs of
       * other lengths count in it), or less by under a chunk: refills add
       * whole chunks, and where the limit has room for less, that room
       * stays the reserve's, unused.
       */
      uint64_t data = (uint64_t) st.pages_used * PAGE;
      if (data > limit - RESERVE)
        fail_msg ("objects of %zu bytes, limit %" PRIu64 ": full at %u objects "
                  "holding %" PRIu64 " bytes of pages, past the limit less the "
                  "reserve (%" PRIu64 "); the reserve holds %" PRIu64,
                  sizes[s], limit, n, data, limit - RESERVE, st.reserve_bytes);
      if (data + st.metadata_bytes + ZS_CHAIN_DEFAULT * PAGE + 4096
          + (st.reserve_bytes < RESERVE ? PAGE_CHUNK_PAGES_RESIDENT * PAGE : 0)
          <= limit - st.reserve_bytes)
        fail_msg ("objects of %zu bytes, limit %" PRIu64 ": full at %u objects, "
                  "%" PRIu64 " bytes of pages and %" PRIu64 " of metadata, short "
                  "of the limit less what the reserve holds; limit_used %" PRIu64 ", reserve %" PRIu64,
                  sizes[s], limit, n, data, st.metadata_bytes, st.limit_used,
                  st.reserve_bytes);
      assert_true (st.limit_used <= limit);
      for (unsigned i = 0; i < n; i++)
        zs_free (pool, fill[i]);
      zs_pool_destroy (pool);
      cases++;
    }
  print_message ("closed reserve: out of the data's reach at the limit in %u cases (3 object "
                 "sizes, 33 limits around 6 MiB)\n", cases);
  free (fill);
}

/* 16. The open reserve (swap mode's full device on a machine out of      */
/*     memory): the data takes the reserve's resident pages, nothing more */
/*     asked of the system, until a refill makes it whole again.          */
static void
test_resident_only_open_reserve (void **state)
{
  (void) state;
  /* Pages that compress 1.5:1: their class's zspages are several pages
   * long, so the open reserve is taken a zspage at a time.
   */
  enum { LIMIT = 6 << 20, RESERVE = 2 << 20, FILL_MAX = 4096,
         SIZE = PAGE * 2 / 3 };
  struct zs_pool *pool = make_resident_pool (LIMIT, RESERVE, false);
  zs_pool_metadata_ready (pool, 16 << 20);
  zs_handle_t *fill = calloc (FILL_MAX, sizeof *fill);
  assert_non_null (fill);
  struct zs_pool_stats st;

  /* Full at the limit less the reserve, which is kept whole. */
  unsigned n = 0;
  assert_int_equal (fill_keeping_reserve (pool, SIZE, fill, &n, FILL_MAX), ENOSPC);
  get_stats (pool, &st);
  uint64_t reserve_full = st.reserve_bytes;
  if (reserve_full < RESERVE / 2)
    fail_msg ("full, the reserve holds %" PRIu64 " of %u bytes",
              reserve_full, (unsigned) RESERVE);
  uint64_t pages_before = st.pages_used, refills_before = st.reserve_refills;

  /* Opened: the data takes the reserve's pages with no refill, until
   * they are spent; then ENOSPC again, and the refill adds nothing while
   * the limit is full.
   */
  zs_pool_open_reserve (pool);
  unsigned opened = 0;
  while (n < FILL_MAX && (fill[n] = zs_malloc (pool, SIZE))) {
    n++;
    opened++;
  }
  if (errno != ENOSPC)
    fail_msg ("the open reserve spent: refused with %s, not ENOSPC",
              strerror (errno));
  assert_int_equal (zs_pool_reserve_refill (pool), 0);
  get_stats (pool, &st);
  print_message ("open reserve: full at %u objects with the reserve (%"
                 PRIu64 " KiB) whole; opened, %u more, reserve left %" PRIu64
                 " KiB, limit_used %" PRIu64 " of %" PRIu64 "\n",
                 n - opened, reserve_full >> 10, opened,
                 st.reserve_bytes >> 10, st.limit_used, st.mem_limit);
  assert_true (opened * (uint64_t) SIZE >= reserve_full / 2);
  assert_true (st.reserve_bytes < reserve_full);
  assert_int_equal (st.reserve_refills, refills_before);
  assert_true (st.pages_used > pages_before);
  assert_true (st.limit_used <= st.mem_limit);

  /* Room again (half the data freed): the refill makes the reserve whole
   * and closes it - full again at the limit less the reserve, which is
   * not taken.
   */
  unsigned kept = n / 2;
  for (unsigned i = kept; i < n; i++)
    zs_free (pool, fill[i]);
  n = kept;
  zs_pool_reserve_refill (pool);
  get_stats (pool, &st);
  assert_true (st.reserve_bytes >= RESERVE);
  assert_int_equal (fill_keeping_reserve (pool, SIZE, fill, &n, FILL_MAX), ENOSPC);
  get_stats (pool, &st);
  if (st.reserve_bytes < RESERVE / 2)
    fail_msg ("closed again, the reserve was still taken: %" PRIu64
              " of %u bytes left", st.reserve_bytes, (unsigned) RESERVE);
  for (unsigned i = 0; i < n; i++)
    zs_free (pool, fill[i]);
  free (fill);
  zs_pool_destroy (pool);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_memory_returns),
    cmocka_unit_test (test_memory_returns_when_locked),
    cmocka_unit_test (test_reserve),
    cmocka_unit_test (test_reserve_edges),
    cmocka_unit_test (test_resident_only),
    cmocka_unit_test (test_limit_pages_only),
    cmocka_unit_test (test_resident_only_reserve_kept_at_limit),
    cmocka_unit_test (test_resident_only_open_reserve),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
