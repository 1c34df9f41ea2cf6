/* Unit tests for the zsalloc allocator (alloc/zsalloc.h).
 *
 * Every test builds its own pool(s) and asserts on object contents, on
 * the public statistics and, where the design fixes it, on exact page
 * counts.  Run under ASan/LSan by CI, so every test also frees what it
 * allocates.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "xorshift.h"
#include "thread-exit-hooks.h"

#include "zsalloc.h"
#include "page-source.h"    /* PAGE_READY_RUNS_PAGES */

#define PAGE ZS_PAGE_SIZE
#define MAX_CLASSES (ZS_MAX_OBJECT_SIZE / 16)

/* ---------------------------------------------------------------------- */
/* Helpers                                                                */

/* Uniform-ish integer in lo..hi inclusive. */
static size_t
rnd_range (uint64_t *s, size_t lo, size_t hi)
{
  return lo + (size_t) (xorshift64 (s) % (hi - lo + 1));
}

/* A per-object key derived from the handle. */
static uint64_t
handle_key (zs_handle_t h)
{
  return ((uint64_t) h * 0x9E3779B97F4A7C15ULL) >> 40;
}

/* Byte i of an object of this size and key. */
static uint8_t
pattern_byte (size_t i, size_t size, uint64_t key)
{
  return (uint8_t) ((i * 31 + size + key) & 0xff);
}

static void
fill_pattern (uint8_t *buf, size_t size, uint64_t key)
{
  for (size_t i = 0; i < size; i++)
    buf[i] = pattern_byte (i, size, key);
}

static void
write_pattern (struct zs_pool *pool, zs_handle_t h, size_t size, uint64_t key)
{
  uint8_t buf[PAGE];

  fill_pattern (buf, size, key);
  assert_int_equal (zs_write (pool, h, buf, size), 0);
}

/* Allocate an object and write its pattern (keyed by key). */
static zs_handle_t
alloc_written (struct zs_pool *pool, size_t size, uint64_t key)
{
  zs_handle_t h = zs_malloc (pool, size);

  if (h == 0)
    print_error ("zs_malloc (%zu) failed: %s\n", size, strerror (errno));
  assert_true (h != 0);
  write_pattern (pool, h, size, key);
  return h;
}

/* True when the object has this size and its content is the pattern.
 * Prints the first difference otherwise.
 */
static bool
object_ok (struct zs_pool *pool, zs_handle_t h, size_t size, uint64_t key)
{
  uint8_t local[PAGE];
  size_t got_size = zs_object_size (pool, h);
  bool ok = true;

  if (got_size != size) {
    print_error ("handle %#jx: zs_object_size %zu, expected %zu\n",
                 (uintmax_t) h, got_size, size);
    return false;
  }
  const uint8_t *p = zs_read_begin (pool, h, local);
  if (p == NULL) {
    print_error ("handle %#jx: zs_read_begin returned NULL\n", (uintmax_t) h);
    return false;
  }
  for (size_t i = 0; i < size; i++) {
    if (p[i] != pattern_byte (i, size, key)) {
      print_error ("handle %#jx size %zu: byte %zu is %#x, expected %#x\n",
                   (uintmax_t) h, size, i, p[i], pattern_byte (i, size, key));
      ok = false;
      break;
    }
  }
  zs_read_end (pool, h, p);
  return ok;
}

static struct zs_pool *
make_pool (unsigned chain, uint64_t limit, enum zs_lock_mode lock_mode,
           enum zs_free_mode free_mode)
{
  struct zs_pool_config config;

  zs_pool_config_init (&config);
  config.chain_pages = chain;
  config.mem_limit = limit;
  config.lock_mode = lock_mode;
  config.free_mode = free_mode;
  struct zs_pool *pool = zs_pool_create (&config);
  if (pool == NULL)
    print_error ("zs_pool_create: %s\n", strerror (errno));
  assert_non_null (pool);
  return pool;
}

static struct zs_pool *
default_pool (void)
{
  return make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS, ZS_FREE_BATCHED);
}

struct class_table {
  unsigned n;
  struct zs_class_stats cs[MAX_CLASSES];
};

static void
get_classes (struct zs_pool *pool, struct class_table *t)
{
  t->n = zs_class_count (pool);
  assert_in_range (t->n, 1, MAX_CLASSES);
  for (unsigned k = 0; k < t->n; k++) {
    memset (&t->cs[k], 0xa5, sizeof t->cs[k]);
    assert_int_equal (zs_class_stats (pool, k, &t->cs[k]), 0);
  }
}

/* The class serving objects of this size (class 0 serves 1..its size). */
static unsigned
class_of (const struct class_table *t, size_t size)
{
  for (unsigned k = 0; k < t->n; k++)
    if (size <= t->cs[k].size && (k == 0 || size >= t->cs[k].min_size))
      return k;
  fail_msg ("no class serves size %zu", size);
  return 0;
}

static void
get_stats (struct zs_pool *pool, struct zs_pool_stats *st)
{
  memset (st, 0xa5, sizeof *st);
  zs_pool_stats (pool, st);
}

/* The pool and per-class statistics agree with each other. */
static void
check_stats_consistent (struct zs_pool *pool)
{
  struct zs_pool_stats st;
  struct class_table *t = malloc (sizeof *t);

  assert_non_null (t);
  get_stats (pool, &st);
  get_classes (pool, t);
  uint64_t pages = 0, objs = 0;
  for (unsigned k = 0; k < t->n; k++) {
    const struct zs_class_stats *c = &t->cs[k];
    uint64_t zspages = 0;
    for (unsigned g = 0; g < ZS_FULLNESS_GROUPS; g++)
      zspages += c->zspages[g];
    assert_int_equal (c->pages_used, zspages * c->pages_per_zspage);
    assert_int_equal (c->objs_allocated, zspages * c->objs_per_zspage);
    assert_true (c->objs_used <= c->objs_allocated);
    /* A full zspage holds objs_per_zspage objects, a non-empty one >= 1. */
    assert_true (c->objs_used >= c->zspages[ZS_FULLNESS_GROUPS - 1]
                 * c->objs_per_zspage);
    pages += c->pages_used;
    objs += c->objs_used;
  }
  assert_int_equal (st.pages_used, pages);
  assert_int_equal (st.objects, objs);
  assert_true (st.pages_used_max >= st.pages_used);
  assert_int_equal (st.frees_pending, 0);
  free (t);
}

/* Pointer range of a live object, for overlap checks. */
struct range {
  uintptr_t start;
  size_t len;
};

static int
range_cmp (const void *a, const void *b)
{
  const struct range *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

/* No two objects share a byte. */
static void
check_no_overlap (struct range *r, size_t n)
{
  qsort (r, n, sizeof *r, range_cmp);
  for (size_t i = 1; i < n; i++) {
    if (r[i - 1].start + r[i - 1].len > r[i].start)
      fail_msg ("objects overlap: [%#jx, +%zu) and [%#jx, +%zu)",
                (uintmax_t) r[i - 1].start, r[i - 1].len,
                (uintmax_t) r[i].start, r[i].len);
  }
}

static struct range
object_range (struct zs_pool *pool, zs_handle_t h, size_t size)
{
  uint8_t local[PAGE];
  const void *p = zs_read_begin (pool, h, local);

  assert_non_null (p);
  /* This implementation never copies: the pointer is into the zspage. */
  assert_true (p != (const void *) local);
  zs_read_end (pool, h, p);
  return (struct range) { .start = (uintptr_t) p, .len = size };
}

static int
handle_cmp (const void *a, const void *b)
{
  zs_handle_t x = *(const zs_handle_t *) a, y = *(const zs_handle_t *) b;
  return x < y ? -1 : x > y;
}

static void
check_handles_unique (const zs_handle_t *h, size_t n)
{
  zs_handle_t *copy = malloc (n * sizeof *copy);

  assert_non_null (copy);
  memcpy (copy, h, n * sizeof *copy);
  qsort (copy, n, sizeof *copy, handle_cmp);
  for (size_t i = 0; i < n; i++)
    assert_true (copy[i] != 0);
  for (size_t i = 1; i < n; i++)
    if (copy[i] == copy[i - 1])
      fail_msg ("handle %#jx returned twice", (uintmax_t) copy[i]);
  free (copy);
}

/* ---------------------------------------------------------------------- */
/* 1. Every size 1..4096 round-trips, all objects alive at once.          */

static void
test_roundtrip_all_sizes (void **state)
{
  (void) state;
  struct zs_pool *pool = default_pool ();
  zs_handle_t *h = calloc (PAGE + 1, sizeof *h);
  struct range *r = calloc (PAGE, sizeof *r);
  struct zs_pool_stats st;
  uint64_t total = 0;

  assert_non_null (h);
  assert_non_null (r);
  assert_int_equal (zs_read_needs_copy (pool), 0);

  for (size_t size = 1; size <= PAGE; size++) {
    h[size] = zs_malloc (pool, size);
    assert_true (h[size] != 0);
    assert_int_equal (zs_object_size (pool, h[size]), size);
    write_pattern (pool, h[size], size, handle_key (h[size]));
    assert_true (object_ok (pool, h[size], size, handle_key (h[size])));
    total += size;
  }
  check_handles_unique (h + 1, PAGE);

  get_stats (pool, &st);
  assert_int_equal (st.objects, PAGE);
  assert_int_equal (st.bytes_stored, total);
  check_stats_consistent (pool);

  /* Verify all again after every other object was written, and check
   * that no two objects share memory.
   */
  for (size_t size = 1; size <= PAGE; size++) {
    assert_true (object_ok (pool, h[size], size, handle_key (h[size])));
    r[size - 1] = object_range (pool, h[size], size);
  }
  check_no_overlap (r, PAGE);

  /* Reading with a NULL local_copy is allowed when no copy is needed. */
  for (size_t size = 1; size <= PAGE; size += 255) {
    const uint8_t *p = zs_read_begin (pool, h[size], NULL);
    assert_non_null (p);
    assert_int_equal (p[size - 1], pattern_byte (size - 1, size,
                                                 handle_key (h[size])));
    zs_read_end (pool, h[size], p);
  }

  /* Free the odd sizes, check the even ones survived, free the rest. */
  for (size_t size = 1; size <= PAGE; size += 2) {
    zs_free (pool, h[size]);
    total -= size;
  }
  get_stats (pool, &st);
  assert_int_equal (st.objects, PAGE / 2);
  assert_int_equal (st.bytes_stored, total);
  for (size_t size = 2; size <= PAGE; size += 2)
    assert_true (object_ok (pool, h[size], size, handle_key (h[size])));
  for (size_t size = 2; size <= PAGE; size += 2)
    zs_free (pool, h[size]);

  get_stats (pool, &st);
  assert_int_equal (st.objects, 0);
  assert_int_equal (st.bytes_stored, 0);
  assert_int_equal (st.pages_used, 0);
  zs_pool_destroy (pool);
  free (h);
  free (r);
}

/* ---------------------------------------------------------------------- */
/* 2. Objects straddling the 4 KiB pages of a multi-page zspage.          */

static void
test_page_crossing (void **state)
{
  (void) state;
  static const size_t sizes[] = { 1568, 3000, 2730, 4000, 1000, 2500, 3500,
                                  1200, 2064, 3264 };
  const size_t per_size = 64;
  const size_t n = per_size * (sizeof sizes / sizeof sizes[0]);
  struct zs_pool *pool = default_pool ();
  zs_handle_t *h = calloc (n, sizeof *h);
  size_t *sz = calloc (n, sizeof *sz);
  struct range *r = calloc (n, sizeof *r);
  size_t crossing = 0;

  assert_non_null (h);
  assert_non_null (sz);
  assert_non_null (r);

  /* Interleave sizes so every class's zspages fill up in turn. */
  for (size_t i = 0; i < n; i++) {
    sz[i] = sizes[i % (sizeof sizes / sizeof sizes[0])];
    h[i] = zs_malloc (pool, sz[i]);
    assert_true (h[i] != 0);
    write_pattern (pool, h[i], sz[i], handle_key (h[i]));
  }
  for (size_t i = 0; i < n; i++) {
    assert_true (object_ok (pool, h[i], sz[i], handle_key (h[i])));
    r[i] = object_range (pool, h[i], sz[i]);
    if (r[i].start % PAGE + sz[i] > PAGE) {
      crossing++;
      /* Write and read back a crossing object once more, with a
       * different key, to exercise memcpy across the boundary.
       */
      write_pattern (pool, h[i], sz[i], handle_key (h[i]) + 1);
      assert_true (object_ok (pool, h[i], sz[i], handle_key (h[i]) + 1));
      write_pattern (pool, h[i], sz[i], handle_key (h[i]));
    }
  }
  print_message ("%zu of %zu objects cross a page boundary\n", crossing, n);
  assert_true (crossing >= 1);
  check_no_overlap (r, n);
  for (size_t i = 0; i < n; i++)
    assert_true (object_ok (pool, h[i], sz[i], handle_key (h[i])));
  check_stats_consistent (pool);

  for (size_t i = 0; i < n; i++)
    zs_free (pool, h[i]);
  struct zs_pool_stats st;
  get_stats (pool, &st);
  assert_int_equal (st.objects, 0);
  assert_int_equal (st.pages_used, 0);
  zs_pool_destroy (pool);
  free (h);
  free (sz);
  free (r);
}

/* ---------------------------------------------------------------------- */
/* 3. Size classes and their merging.                                     */

static void
check_classes_for_chain (unsigned chain)
{
  struct zs_pool *pool = make_pool (chain, 0, ZS_LOCK_CLASS,
                                    ZS_FREE_IMMEDIATE);
  struct class_table *t = malloc (sizeof *t);
  struct zs_pool_config config;
  bool merged = false;

  assert_non_null (t);
  zs_pool_get_config (pool, &config);
  assert_int_equal (config.chain_pages, chain);

  get_classes (pool, t);
  print_message ("chain %u: %u classes, huge class from %zu\n",
                 chain, t->n, zs_huge_class_size (pool));
  assert_true (t->cs[0].min_size >= 1 && t->cs[0].min_size <= 16);
  assert_int_equal (t->cs[t->n - 1].size, ZS_MAX_OBJECT_SIZE);

  for (unsigned k = 0; k < t->n; k++) {
    const struct zs_class_stats *c = &t->cs[k];

    assert_int_equal (c->size % 16, 0);
    assert_true (c->min_size <= c->size);
    if (k > 0) {
      assert_true (c->size > t->cs[k - 1].size);
      /* Contiguous ranges: every size is served by exactly one class. */
      assert_int_equal (c->min_size, t->cs[k - 1].size + 1);
    }
    if (c->min_size + 15 < c->size)
      merged = true;
    assert_in_range (c->pages_per_zspage, 1, chain);
    assert_int_equal (c->objs_per_zspage,
                      c->pages_per_zspage * PAGE / c->size);
    assert_true (c->objs_per_zspage >= 1);
    /* Fresh pool: nothing allocated. */
    assert_int_equal (c->objs_used, 0);
    assert_int_equal (c->objs_allocated, 0);
    assert_int_equal (c->pages_used, 0);
    for (unsigned g = 0; g < ZS_FULLNESS_GROUPS; g++)
      assert_int_equal (c->zspages[g], 0);
    /* A merged class shares its layout with... itself only: distinct
     * neighbours have a distinct (pages, objs) layout.
     */
    if (k > 0)
      assert_true (c->pages_per_zspage != t->cs[k - 1].pages_per_zspage
                   || c->objs_per_zspage != t->cs[k - 1].objs_per_zspage);
  }
  /* The huge class is the last one, one object per one-page zspage. */
  const struct zs_class_stats *huge = &t->cs[t->n - 1];
  assert_int_equal (huge->pages_per_zspage, 1);
  assert_int_equal (huge->objs_per_zspage, 1);
  assert_int_equal (huge->min_size, zs_huge_class_size (pool));

  /* Out-of-range class numbers are refused. */
  struct zs_class_stats dummy;
  assert_int_not_equal (zs_class_stats (pool, t->n, &dummy), 0);

  if (chain == ZS_CHAIN_DEFAULT) {
    assert_true (merged);
    assert_true (t->n < 256);
  }

  /* Objects of the smallest and the largest size of each class land in
   * that class, both in one zspage when it holds two.
   */
  for (unsigned k = 0; k < t->n; k++) {
    const struct zs_class_stats *c = &t->cs[k];
    size_t lo = k == 0 ? 1 : c->min_size;
    zs_handle_t h1 = alloc_written (pool, lo, 1);
    zs_handle_t h2 = alloc_written (pool, c->size, 2);
    struct zs_class_stats now;
    struct zs_pool_stats st;

    assert_int_equal (zs_class_stats (pool, k, &now), 0);
    assert_int_equal (now.objs_used, 2);
    assert_int_equal (now.pages_used,
                      c->objs_per_zspage >= 2
                      ? c->pages_per_zspage : 2 * c->pages_per_zspage);
    get_stats (pool, &st);
    assert_int_equal (st.pages_used, now.pages_used);
    assert_int_equal (st.bytes_stored, lo + c->size);
    assert_true (object_ok (pool, h1, lo, 1));
    assert_true (object_ok (pool, h2, c->size, 2));
    zs_free (pool, h1);
    zs_free (pool, h2);
    get_stats (pool, &st);
    assert_int_equal (st.pages_used, 0);
    assert_int_equal (st.objects, 0);
  }

  zs_pool_destroy (pool);
  free (t);
}

static void
test_classes (void **state)
{
  (void) state;
  check_classes_for_chain (ZS_CHAIN_DEFAULT);
  check_classes_for_chain (4);
  check_classes_for_chain (16);
  check_classes_for_chain (ZS_CHAIN_MIN);
}

/* ---------------------------------------------------------------------- */
/* 4. The huge class.                                                     */

static void
test_huge_class (void **state)
{
  (void) state;
  struct zs_pool *pool = default_pool ();
  struct zs_pool_stats st;
  struct class_table *t = malloc (sizeof *t);
  size_t huge = zs_huge_class_size (pool);

  assert_non_null (t);
  print_message ("huge class size %zu\n", huge);
  assert_true (huge > PAGE / 2 && huge <= PAGE);

  zs_handle_t a = alloc_written (pool, huge, 11);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, 1);
  zs_handle_t b = alloc_written (pool, huge, 12);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, 2);
  zs_handle_t c = alloc_written (pool, PAGE, 13);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, 3);
  assert_int_equal (st.bytes_stored, 2 * huge + PAGE);

  get_classes (pool, t);
  unsigned hk = class_of (t, huge);
  assert_int_equal (hk, t->n - 1);
  assert_int_equal (class_of (t, PAGE), hk);
  assert_int_equal (t->cs[hk].objs_used, 3);
  assert_int_equal (t->cs[hk].zspages[ZS_FULLNESS_GROUPS - 1], 3);

  assert_true (object_ok (pool, a, huge, 11));
  assert_true (object_ok (pool, b, huge, 12));
  assert_true (object_ok (pool, c, PAGE, 13));
  zs_free (pool, a);
  zs_free (pool, b);
  zs_free (pool, c);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, 0);
  zs_pool_destroy (pool);

  /* huge - 1 is not huge: two such objects share one zspage. */
  pool = default_pool ();
  get_classes (pool, t);
  unsigned k = class_of (t, huge - 1);
  assert_true (k < t->n - 1);
  assert_true (t->cs[k].objs_per_zspage >= 2);
  a = alloc_written (pool, huge - 1, 21);
  b = alloc_written (pool, huge - 1, 22);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, t->cs[k].pages_per_zspage);
  assert_true (object_ok (pool, a, huge - 1, 21));
  assert_true (object_ok (pool, b, huge - 1, 22));
  zs_free (pool, a);
  zs_free (pool, b);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, 0);
  zs_pool_destroy (pool);
  free (t);
}

/* ---------------------------------------------------------------------- */
/* 5. Statistics match exactly what was allocated.                        */

static void
test_stats_exact (void **state)
{
  (void) state;
  enum { N = 1000 };
  struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS,
                                    ZS_FREE_BATCHED);
  struct class_table *t = malloc (sizeof *t);
  zs_handle_t h[N];
  size_t sz[N];
  uint64_t per_class[MAX_CLASSES] = { 0 };
  uint64_t seed = 0x1234567887654321ULL;
  uint64_t total = 0;
  struct zs_pool_stats st;

  assert_non_null (t);
  get_classes (pool, t);
  for (size_t i = 0; i < N; i++) {
    sz[i] = rnd_range (&seed, 1, PAGE);
    h[i] = alloc_written (pool, sz[i], i);
    total += sz[i];
    per_class[class_of (t, sz[i])]++;
  }

  get_stats (pool, &st);
  assert_int_equal (st.objects, N);
  assert_int_equal (st.bytes_stored, total);
  assert_int_equal (st.frees_pending, 0);
  assert_int_equal (st.mem_limit, 0);
  assert_int_equal (st.limit_hits, 0);
  assert_int_equal (st.pages_freed, 0);
  assert_true (st.pages_used > 0);
  assert_true (st.pages_used_max >= st.pages_used);
  assert_true (st.metadata_bytes > 0);
  /* The objects need at least their bytes in pages. */
  assert_true (st.pages_used * PAGE >= total);

  get_classes (pool, t);
  uint64_t pages = 0, objs = 0;
  for (unsigned k = 0; k < t->n; k++) {
    const struct zs_class_stats *c = &t->cs[k];
    uint64_t zspages = 0;
    for (unsigned g = 0; g < ZS_FULLNESS_GROUPS; g++)
      zspages += c->zspages[g];
    assert_int_equal (c->objs_used, per_class[k]);
    assert_int_equal (c->objs_allocated, zspages * c->objs_per_zspage);
    assert_int_equal (c->pages_used, zspages * c->pages_per_zspage);
    /* Allocation fills zspages in turn and nothing was freed: exactly
     * the zspages needed, and empty zspages never linger.
     */
    assert_int_equal (zspages, (per_class[k] + c->objs_per_zspage - 1)
                      / c->objs_per_zspage);
    if (c->zspages[0] != 0)
      fail_msg ("class %u (size %u, %u objects per zspage, %ju in use): "
                "%ju zspage(s) in the \"empty\" group while nothing was freed",
                k, c->size, c->objs_per_zspage, (uintmax_t) c->objs_used,
                (uintmax_t) c->zspages[0]);
    pages += c->pages_used;
    objs += c->objs_used;
  }
  assert_int_equal (objs, N);
  assert_int_equal (pages, st.pages_used);
  check_stats_consistent (pool);

  /* Free half without flushing: the statistics drain the batch. */
  uint64_t freed_bytes = 0;
  for (size_t i = 0; i < N; i += 2) {
    zs_free (pool, h[i]);
    freed_bytes += sz[i];
    per_class[class_of (t, sz[i])]--;
  }
  get_stats (pool, &st);
  assert_int_equal (st.objects, N / 2);
  assert_int_equal (st.bytes_stored, total - freed_bytes);
  assert_int_equal (st.frees_pending, 0);
  get_classes (pool, t);
  for (unsigned k = 0; k < t->n; k++)
    assert_int_equal (t->cs[k].objs_used, per_class[k]);
  check_stats_consistent (pool);
  for (size_t i = 1; i < N; i += 2)
    assert_true (object_ok (pool, h[i], sz[i], i));

  for (size_t i = 1; i < N; i += 2)
    zs_free (pool, h[i]);
  get_stats (pool, &st);
  assert_int_equal (st.objects, 0);
  assert_int_equal (st.bytes_stored, 0);
  assert_int_equal (st.pages_used, 0);
  assert_int_equal (st.frees_pending, 0);
  assert_true (st.pages_used_max > 0);
  assert_true (st.pages_freed >= st.pages_used_max);
  get_classes (pool, t);
  for (unsigned k = 0; k < t->n; k++) {
    assert_int_equal (t->cs[k].objs_used, 0);
    assert_int_equal (t->cs[k].objs_allocated, 0);
    assert_int_equal (t->cs[k].pages_used, 0);
  }
  zs_pool_destroy (pool);
  free (t);
}

/* Fullness groups: "empty" (0) is for zspages with no object at all,
 * group 1 is "1-10 %", ..., group 10 "91-99 %", 11 "full".  Uses the
 * 16-byte class: 256 objects in one page.
 */
static void
test_fullness_groups (void **state)
{
  (void) state;
  /* inuse -> expected group, for 256 objects per zspage. */
  static const struct { unsigned inuse, group; } steps[] = {
    { 1, 1 },                   /* 0.4 %: not empty, "10" */
    { 2, 1 },                   /* 0.8 % */
    { 3, 1 },                   /* 1.2 % */
    { 25, 1 },                  /* 9.8 % */
    { 54, 3 },                  /* 21.1 % */
    { 128, 5 },                 /* 50 % */
    { 200, 8 },                 /* 78.1 % */
    { 233, 10 },                /* 91.0 % */
    { 255, 10 },                /* 99.6 %: "99", not full */
    { 256, 11 },                /* full */
  };
  struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS,
                                    ZS_FREE_IMMEDIATE);
  zs_handle_t h[256];
  unsigned n = 0;
  struct zs_class_stats c;

  assert_int_equal (zs_class_stats (pool, 0, &c), 0);
  assert_int_equal (c.size, 16);
  assert_int_equal (c.pages_per_zspage, 1);
  assert_int_equal (c.objs_per_zspage, 256);

  for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
    while (n < steps[s].inuse) {
      h[n] = alloc_written (pool, 16, n);
      n++;
    }
    assert_int_equal (zs_class_stats (pool, 0, &c), 0);
    assert_int_equal (c.objs_used, n);
    for (unsigned g = 0; g < ZS_FULLNESS_GROUPS; g++) {
      uint64_t expect = g == steps[s].group;
      if (c.zspages[g] != expect)
        fail_msg ("%u of 256 objects in use: zspages[%u] (\"%s\") is %ju, "
                  "expected %ju (the zspage belongs in group %u \"%s\")",
                  n, g, zs_fullness_group_name (g), (uintmax_t) c.zspages[g],
                  (uintmax_t) expect, steps[s].group,
                  zs_fullness_group_name (steps[s].group));
    }
  }
  for (unsigned i = 0; i < n; i++)
    assert_true (object_ok (pool, h[i], 16, i));

  /* And back down: free until one object is left. */
  while (n > 1)
    zs_free (pool, h[--n]);
  assert_int_equal (zs_class_stats (pool, 0, &c), 0);
  assert_int_equal (c.zspages[0], 0);
  assert_int_equal (c.zspages[1], 1);
  zs_free (pool, h[0]);
  assert_int_equal (zs_class_stats (pool, 0, &c), 0);
  assert_int_equal (c.zspages[0], 0);   /* an empty zspage is released */
  assert_int_equal (c.pages_used, 0);
  zs_pool_destroy (pool);
}

/* ---------------------------------------------------------------------- */
/* 6. Memory limit.                                                       */

/* The most a zspage descriptor of objs slots can take: a header of at
 * most two cache lines and a back pointer per slot.
 */
#define DESCRIPTOR_MAX(objs) (128 + (uint64_t) (objs) * 8)

/* A pool refused an allocation for its limit: what it counts is within
 * the limit, and the next zspage (zspage_bytes of pages, plus at most
 * descriptor_bytes) would not have fitted.
 */
static void
assert_limit_full (const struct zs_pool_stats *st, uint64_t zspage_bytes,
                   uint64_t descriptor_bytes)
{
  assert_true (st->limit_used <= st->mem_limit);
  assert_true (st->limit_used + zspage_bytes + descriptor_bytes > st->mem_limit);
  assert_true (st->pages_used_max * PAGE <= st->mem_limit);
  /* Pages, and the metadata beside them, are counted. */
  assert_true (st->limit_used > st->pages_used * PAGE);
}

static void
test_mem_limit_huge (void **state)
{
  (void) state;
  enum { LIMIT_PAGES = 64 };
  struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT,
                                    (uint64_t) LIMIT_PAGES * PAGE,
                                    ZS_LOCK_CLASS, ZS_FREE_BATCHED);
  zs_handle_t h[LIMIT_PAGES + 1];
  struct zs_pool_stats st;
  size_t n = 0;

  for (;;) {
    errno = 0;
    zs_handle_t x = zs_malloc (pool, PAGE);
    if (x == 0) {
      assert_int_equal (errno, ENOSPC);
      break;
    }
    assert_true (n < LIMIT_PAGES);
    h[n] = x;
    write_pattern (pool, x, PAGE, n);
    n++;
  }
  get_stats (pool, &st);
  assert_int_equal (st.mem_limit, (uint64_t) LIMIT_PAGES * PAGE);
  assert_int_equal (st.limit_hits, 1);   /* one allocation was refused */
  assert_int_equal (st.pages_used, n);
  assert_int_equal (st.objects, n);
  assert_limit_full (&st, PAGE, DESCRIPTOR_MAX (1));
  /* The limit also counts descriptors and cells: a few pages of 64. */
  assert_true (n >= LIMIT_PAGES - 3);
  for (size_t i = 0; i < n; i++)
    assert_true (object_ok (pool, h[i], PAGE, i));

  /* A pending (unflushed) free must not cause a refusal. */
  zs_free (pool, h[5]);
  errno = 0;
  h[5] = zs_malloc (pool, PAGE);
  if (h[5] == 0)
    print_error ("zs_malloc after a batched free: %s\n", strerror (errno));
  assert_true (h[5] != 0);
  write_pattern (pool, h[5], PAGE, 5);

  /* Full again. */
  errno = 0;
  assert_true (zs_malloc (pool, PAGE) == 0);
  assert_int_equal (errno, ENOSPC);
  errno = 0;
  assert_true (zs_malloc (pool, 1) == 0);
  assert_int_equal (errno, ENOSPC);
  get_stats (pool, &st);
  assert_int_equal (st.limit_hits, 3);
  assert_limit_full (&st, PAGE, DESCRIPTOR_MAX (1));
  for (size_t i = 0; i < n; i++)
    assert_true (object_ok (pool, h[i], PAGE, i));

  for (size_t i = 0; i < n; i++)
    zs_free (pool, h[i]);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, 0);
  zs_pool_destroy (pool);
}

static void
test_mem_limit_small (void **state)
{
  (void) state;
  enum { LIMIT_PAGES = 64, SIZE = 100 };
  struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT,
                                    (uint64_t) LIMIT_PAGES * PAGE,
                                    ZS_LOCK_CLASS, ZS_FREE_BATCHED);
  struct class_table *t = malloc (sizeof *t);
  size_t cap = LIMIT_PAGES * PAGE / 16;
  zs_handle_t *h = calloc (cap, sizeof *h);
  struct zs_pool_stats st;
  size_t n = 0;

  assert_non_null (t);
  assert_non_null (h);
  get_classes (pool, t);
  const struct zs_class_stats *c = &t->cs[class_of (t, SIZE)];
  size_t most = (LIMIT_PAGES / c->pages_per_zspage) * c->objs_per_zspage;

  for (;;) {
    errno = 0;
    zs_handle_t x = zs_malloc (pool, SIZE);
    if (x == 0) {
      assert_int_equal (errno, ENOSPC);
      break;
    }
    assert_true (n < cap);
    h[n] = x;
    write_pattern (pool, x, SIZE, n);
    n++;
  }
  print_message ("%zu objects of %d bytes fit in %d pages\n",
                 n, SIZE, LIMIT_PAGES);
  get_stats (pool, &st);
  assert_int_equal (st.limit_hits, 1);
  /* Every zspage full, and no room for another one. */
  assert_int_equal (n, st.pages_used / c->pages_per_zspage * c->objs_per_zspage);
  assert_limit_full (&st, c->pages_per_zspage * PAGE,
                     DESCRIPTOR_MAX (c->objs_per_zspage));
  /* Descriptors (with a back pointer per slot) and cells take 16 bytes
   * per object of the limit: 14 % of 112-byte slots.
   */
  assert_true (n <= most && n >= most * 75 / 100);

  /* Free 10 spread over several zspages, without flushing: 10 new
   * objects fit in their slots, the 11th does not.
   */
  for (size_t j = 0; j < 10; j++) {
    size_t i = j * (n / 10);
    zs_free (pool, h[i]);
    h[i] = 0;
  }
  for (size_t j = 0; j < 10; j++) {
    size_t i = j * (n / 10);
    errno = 0;
    h[i] = zs_malloc (pool, SIZE);
    if (h[i] == 0)
      print_error ("allocation %zu after 10 batched frees: %s\n",
                   j, strerror (errno));
    assert_true (h[i] != 0);
    write_pattern (pool, h[i], SIZE, i);
  }
  errno = 0;
  assert_true (zs_malloc (pool, SIZE) == 0);
  assert_int_equal (errno, ENOSPC);
  get_stats (pool, &st);
  assert_int_equal (st.objects, n);
  assert_limit_full (&st, c->pages_per_zspage * PAGE,
                     DESCRIPTOR_MAX (c->objs_per_zspage));
  for (size_t i = 0; i < n; i++)
    assert_true (object_ok (pool, h[i], SIZE, i));

  for (size_t i = 0; i < n; i++)
    zs_free (pool, h[i]);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, 0);
  zs_pool_destroy (pool);
  free (h);
  free (t);
}

/* A pending free in ANOTHER (still running) thread's batch must be
 * drained before an allocation is refused.
 */
struct other_free {
  struct zs_pool *pool;
  zs_handle_t h;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int step;                     /* 1: freed, 2: may exit */
};

static void *
other_free_thread (void *arg)
{
  struct other_free *o = arg;

  zs_free (o->pool, o->h);
  pthread_mutex_lock (&o->lock);
  o->step = 1;
  pthread_cond_broadcast (&o->cond);
  while (o->step != 2)
    pthread_cond_wait (&o->cond, &o->lock);
  pthread_mutex_unlock (&o->lock);
  return NULL;
}

static void
test_mem_limit_other_thread_batch (void **state)
{
  (void) state;
  enum { LIMIT_PAGES = 16 };
  struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT,
                                    (uint64_t) LIMIT_PAGES * PAGE,
                                    ZS_LOCK_CLASS, ZS_FREE_BATCHED);
  zs_handle_t h[LIMIT_PAGES];
  struct other_free o = { .pool = pool, .step = 0 };
  pthread_t thread;
  struct zs_pool_stats st;
  size_t n;

  /* Fill to the limit (descriptors and cells take a page of it). */
  for (n = 0; n < LIMIT_PAGES; n++) {
    errno = 0;
    if (!(h[n] = zs_malloc (pool, PAGE)))
      break;
    write_pattern (pool, h[n], PAGE, n);
  }
  assert_int_equal (errno, ENOSPC);
  assert_true (n >= LIMIT_PAGES - 2);

  pthread_mutex_init (&o.lock, NULL);
  pthread_cond_init (&o.cond, NULL);
  o.h = h[3];
  assert_int_equal (pthread_create (&thread, NULL, other_free_thread, &o), 0);
  pthread_mutex_lock (&o.lock);
  while (o.step != 1)
    pthread_cond_wait (&o.cond, &o.lock);
  pthread_mutex_unlock (&o.lock);

  /* The other thread is alive, its free is (probably) still pending. */
  errno = 0;
  h[3] = zs_malloc (pool, PAGE);
  if (h[3] == 0)
    print_error ("zs_malloc with another thread's pending free: %s\n",
                 strerror (errno));
  assert_true (h[3] != 0);
  write_pattern (pool, h[3], PAGE, 3);

  pthread_mutex_lock (&o.lock);
  o.step = 2;
  pthread_cond_broadcast (&o.cond);
  pthread_mutex_unlock (&o.lock);
  assert_int_equal (pthread_join (thread, NULL), 0);

  for (size_t i = 0; i < n; i++)
    assert_true (object_ok (pool, h[i], PAGE, i));
  for (size_t i = 0; i < n; i++)
    zs_free (pool, h[i]);
  get_stats (pool, &st);
  assert_int_equal (st.objects, 0);
  assert_int_equal (st.pages_used, 0);
  assert_true (st.pages_used_max <= LIMIT_PAGES);
  zs_pool_destroy (pool);
  pthread_mutex_destroy (&o.lock);
  pthread_cond_destroy (&o.cond);
}

/* ---------------------------------------------------------------------- */
/* 7. Batched and immediate frees give the same results.                  */

struct twin {
  zs_handle_t hb, hi;           /* batched pool, immediate pool */
  size_t size;
  uint64_t key;
};

static void
compare_pools (struct zs_pool *pb, struct zs_pool *pi, bool exact_layout)
{
  struct zs_pool_stats sb, si;
  struct class_table *tb = malloc (sizeof *tb);
  struct class_table *ti = malloc (sizeof *ti);

  assert_non_null (tb);
  assert_non_null (ti);
  zs_pool_flush (pb);
  zs_pool_flush (pi);
  get_stats (pb, &sb);
  get_stats (pi, &si);
  print_message ("batched: %ju objects %ju bytes %ju pages; "
                 "immediate: %ju objects %ju bytes %ju pages\n",
                 (uintmax_t) sb.objects, (uintmax_t) sb.bytes_stored,
                 (uintmax_t) sb.pages_used, (uintmax_t) si.objects,
                 (uintmax_t) si.bytes_stored, (uintmax_t) si.pages_used);
  assert_int_equal (sb.objects, si.objects);
  assert_int_equal (sb.bytes_stored, si.bytes_stored);
  assert_int_equal (sb.frees_pending, 0);
  assert_int_equal (si.frees_pending, 0);
  if (exact_layout)
    assert_int_equal (sb.pages_used, si.pages_used);

  get_classes (pb, tb);
  get_classes (pi, ti);
  assert_int_equal (tb->n, ti->n);
  for (unsigned k = 0; k < tb->n; k++) {
    assert_int_equal (tb->cs[k].size, ti->cs[k].size);
    assert_int_equal (tb->cs[k].objs_used, ti->cs[k].objs_used);
    if (exact_layout) {
      assert_int_equal (tb->cs[k].objs_allocated, ti->cs[k].objs_allocated);
      assert_int_equal (tb->cs[k].pages_used, ti->cs[k].pages_used);
      for (unsigned g = 0; g < ZS_FULLNESS_GROUPS; g++)
        assert_int_equal (tb->cs[k].zspages[g], ti->cs[k].zspages[g]);
    }
  }
  check_stats_consistent (pb);
  check_stats_consistent (pi);
  free (tb);
  free (ti);
}

static void
test_batched_vs_immediate (void **state)
{
  (void) state;
  enum { OPS = 20000, MAX_LIVE = 3000 };
  struct zs_pool *pb = make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS,
                                  ZS_FREE_BATCHED);
  struct zs_pool *pi = make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS,
                                  ZS_FREE_IMMEDIATE);
  struct twin *live = calloc (MAX_LIVE, sizeof *live);
  size_t n = 0;
  uint64_t seed = 0xC0FFEE123456789ULL;

  assert_non_null (live);

  /* Phase A: allocations, then frees of a random subset, then a flush.
   * Both pools see the same allocations from the same (empty) state, so
   * they lay objects out identically, and the same set of objects then
   * remains in each zspage whatever order the frees are applied in: the
   * layouts must be identical.
   */
  for (n = 0; n < MAX_LIVE / 2; n++) {
    live[n].size = rnd_range (&seed, 1, PAGE);
    live[n].key = n;
    live[n].hb = alloc_written (pb, live[n].size, n);
    live[n].hi = alloc_written (pi, live[n].size, n);
  }
  for (size_t i = 0; i < n;) {
    if (xorshift64 (&seed) % 3 == 0) {
      zs_free (pb, live[i].hb);
      zs_free (pi, live[i].hi);
      live[i] = live[--n];
    }
    else
      i++;
  }
  compare_pools (pb, pi, true);

  /* Phase B: a random interleaving of allocations, writes and frees.
   * Deferred frees change which slots later allocations get, so the page
   * counts may legitimately differ; the objects may not.
   */
  for (size_t op = 0; op < OPS; op++) {
    uint64_t r = xorshift64 (&seed) % 100;
    if (n == 0 || (r < 50 && n < MAX_LIVE)) {
      live[n].size = rnd_range (&seed, 1, PAGE);
      live[n].key = op + 7;
      live[n].hb = alloc_written (pb, live[n].size, live[n].key);
      live[n].hi = alloc_written (pi, live[n].size, live[n].key);
      n++;
    }
    else if (r < 60) {
      size_t i = xorshift64 (&seed) % n;
      live[i].key ^= 0x5a;
      write_pattern (pb, live[i].hb, live[i].size, live[i].key);
      write_pattern (pi, live[i].hi, live[i].size, live[i].key);
    }
    else if (r < 65) {
      size_t i = xorshift64 (&seed) % n;
      assert_true (object_ok (pb, live[i].hb, live[i].size, live[i].key));
      assert_true (object_ok (pi, live[i].hi, live[i].size, live[i].key));
    }
    else {
      size_t i = xorshift64 (&seed) % n;
      zs_free (pb, live[i].hb);
      zs_free (pi, live[i].hi);
      live[i] = live[--n];
    }
  }
  compare_pools (pb, pi, false);
  for (size_t i = 0; i < n; i++) {
    assert_true (object_ok (pb, live[i].hb, live[i].size, live[i].key));
    assert_true (object_ok (pi, live[i].hi, live[i].size, live[i].key));
  }

  for (size_t i = 0; i < n; i++) {
    zs_free (pb, live[i].hb);
    zs_free (pi, live[i].hi);
  }
  compare_pools (pb, pi, true);
  struct zs_pool_stats st;
  get_stats (pb, &st);
  assert_int_equal (st.pages_used, 0);
  zs_pool_destroy (pb);
  zs_pool_destroy (pi);
  free (live);
}

/* ---------------------------------------------------------------------- */
/* 8. Destroying a pool that still holds objects and pending frees.       */

struct free_some_arg {
  struct zs_pool *pool;
  zs_handle_t *h;
  size_t n;
};

static void *
free_some_thread (void *arg)
{
  struct free_some_arg *a = arg;

  /* Freed here; they wait in the pool's batches after the thread exits. */
  for (size_t i = 0; i < a->n; i++)
    zs_free (a->pool, a->h[i]);
  return NULL;
}

static void
test_destroy_with_live_objects (void **state)
{
  (void) state;
  enum { N = 5000 };
  zs_handle_t *h = calloc (N, sizeof *h);
  uint64_t seed = 42;

  assert_non_null (h);
  for (int mode = 0; mode < 2; mode++) {
    struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT, 0,
                                      mode ? ZS_LOCK_POOL : ZS_LOCK_CLASS,
                                      mode ? ZS_FREE_IMMEDIATE
                                      : ZS_FREE_BATCHED);
    for (size_t i = 0; i < N; i++)
      h[i] = alloc_written (pool, rnd_range (&seed, 1, PAGE), i);

    /* Another thread frees 700 objects and exits. */
    struct free_some_arg arg = { .pool = pool, .h = h, .n = 700 };
    pthread_t thread;
    assert_int_equal (pthread_create (&thread, NULL, free_some_thread, &arg),
                      0);
    assert_int_equal (pthread_join (thread, NULL), 0);

    /* This thread frees 1300 more (2 batches and a partial one): the
     * last few hundred stay pending in this thread's batch.
     */
    for (size_t i = 700; i < 2000; i++)
      zs_free (pool, h[i]);

    zs_pool_destroy (pool);
  }

  /* The allocator is still usable after destroying pools with pending
   * frees (e.g. no stale per-thread state).
   */
  struct zs_pool *pool = default_pool ();
  for (size_t i = 0; i < 1000; i++)
    h[i] = alloc_written (pool, rnd_range (&seed, 1, PAGE), i);
  for (size_t i = 0; i < 1000; i++)
    assert_true (object_ok (pool, h[i], zs_object_size (pool, h[i]), i));
  for (size_t i = 0; i < 1000; i++)
    zs_free (pool, h[i]);
  struct zs_pool_stats st;
  get_stats (pool, &st);
  assert_int_equal (st.objects, 0);
  assert_int_equal (st.pages_used, 0);
  zs_pool_destroy (pool);
  free (h);
}

/* A thread that used a pool exits after the pool is destroyed, and no
 * thread's exit runs allocator code: the pool registers no pthread key
 * with a destructor (nbdkit's connection threads
 * exit after the plugin is unloaded).
 */
struct late_exit {
  struct zs_pool *pool;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int step;                     /* 1: used the pool, 2: may exit */
};

static void *
late_exit_thread (void *arg)
{
  struct late_exit *l = arg;
  zs_handle_t h[300];

  for (size_t i = 0; i < 300; i++)
    h[i] = alloc_written (l->pool, 100 + i * 13, i);
  for (size_t i = 0; i < 300; i++)
    zs_free (l->pool, h[i]);    /* batched: pending when the pool dies */
  pthread_mutex_lock (&l->lock);
  l->step = 1;
  pthread_cond_broadcast (&l->cond);
  while (l->step != 2)
    pthread_cond_wait (&l->cond, &l->lock);
  pthread_mutex_unlock (&l->lock);
  return NULL;
}

static void
test_thread_exits_after_destroy (void **state)
{
  (void) state;
  struct late_exit l = { .step = 0 };
  pthread_t thread;

  l.pool = make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS, ZS_FREE_BATCHED);
  pthread_mutex_init (&l.lock, NULL);
  pthread_cond_init (&l.cond, NULL);
  assert_int_equal (pthread_create (&thread, NULL, late_exit_thread, &l), 0);
  pthread_mutex_lock (&l.lock);
  while (l.step != 1)
    pthread_cond_wait (&l.cond, &l.lock);
  pthread_mutex_unlock (&l.lock);

  zs_pool_destroy (l.pool);
  /* Whatever the thread's exit would touch is gone now. */
  pthread_mutex_lock (&l.lock);
  l.step = 2;
  pthread_cond_broadcast (&l.cond);
  pthread_mutex_unlock (&l.lock);
  assert_int_equal (pthread_join (thread, NULL), 0);
  pthread_mutex_destroy (&l.lock);
  pthread_cond_destroy (&l.cond);

  assert_int_equal (atomic_load (&keys_with_destructor), 0);
}

/* Handle cells follow the live objects: cycling 20,000 objects through 28
 * classes leaves, with no object left, at most one block of cells per
 * class (each class may keep one), not every class's high-water mark.
 */
static void
test_cells_follow_objects (void **state)
{
  (void) state;
  enum { N = 20000, SIZES = 28 };
  zs_handle_t *h = calloc (N, sizeof *h);
  assert_non_null (h);

  for (int mode = 0; mode < 2; mode++) {
    struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS,
                                      mode ? ZS_FREE_IMMEDIATE : ZS_FREE_BATCHED);
    struct zs_pool_stats st, fresh;
    uint64_t peak = 0;

    get_stats (pool, &fresh);
    for (unsigned s = 0; s < SIZES; s++) {
      size_t size = 64 + s * 128;
      for (size_t i = 0; i < N; i++)
        h[i] = alloc_written (pool, size, i);
      get_stats (pool, &st);
      if (st.metadata_bytes > peak)
        peak = st.metadata_bytes;
      for (size_t i = 0; i < N; i++)
        zs_free (pool, h[i]);
    }
    get_stats (pool, &st);
    print_message ("cells: metadata %" PRIu64 " bytes fresh, %" PRIu64
                   " at the peak, %" PRIu64 " after, limit_used %" PRIu64 "\n",
                   fresh.metadata_bytes, peak, st.metadata_bytes, st.limit_used);
    assert_int_equal (st.objects, 0);
    assert_int_equal (st.pages_used, 0);
    assert_true (peak >= fresh.metadata_bytes + N / 512 * PAGE);
    assert_true (st.metadata_bytes <= fresh.metadata_bytes + SIZES * PAGE);
    assert_true (st.limit_used <= SIZES * PAGE);
    zs_pool_destroy (pool);
  }
  free (h);
}

/* A refusal for the limit is true when it is made.  With the limit at
 * one zspage of 13 slots, 4 threads racing to store 3 objects each must
 * all succeed: one of them makes the zspage, the others wait for it
 * rather than failing while it is being made.
 */
enum { RACE_THREADS = 4, RACE_OBJECTS = 3, RACE_ROUNDS = 2000 };

struct limit_race {
  struct zs_pool *_Atomic pool;    /* this round's pool */
  pthread_barrier_t start, done;
  atomic_int refused;
  zs_handle_t h[RACE_THREADS][RACE_OBJECTS];
};

struct limit_racer {
  struct limit_race *race;
  unsigned index;
};

static void *
limit_racer_thread (void *arg)
{
  struct limit_racer *racer = arg;
  struct limit_race *race = racer->race;

  for (int round = 0; round < RACE_ROUNDS; round++) {
    pthread_barrier_wait (&race->start);
    struct zs_pool *pool = atomic_load (&race->pool);
    for (int i = 0; i < RACE_OBJECTS; i++) {
      zs_handle_t h = zs_malloc (pool, 300);
      if (!h) {
        atomic_fetch_add (&race->refused, 1);
        print_error ("round %d: errno %d\n", round, errno);
      }
      race->h[racer->index][i] = h;
    }
    pthread_barrier_wait (&race->done);
  }
  return NULL;
}

static void
test_limit_refusal_is_true (void **state)
{
  (void) state;
  struct limit_race race = { .refused = 0 };
  struct limit_racer racers[RACE_THREADS];
  pthread_t threads[RACE_THREADS];

  pthread_barrier_init (&race.start, NULL, RACE_THREADS + 1);
  pthread_barrier_init (&race.done, NULL, RACE_THREADS + 1);
  for (unsigned t = 0; t < RACE_THREADS; t++) {
    racers[t] = (struct limit_racer) { &race, t };
    assert_int_equal (pthread_create (&threads[t], NULL, limit_racer_thread,
                                      &racers[t]), 0);
  }
  int refusals = 0;
  for (int round = 0; round < RACE_ROUNDS; round++) {
    /* chain 1: the class of 300-byte objects has 13 slots in one page;
     * the limit holds that page, its descriptor and a block of cells.
     */
    struct zs_pool *pool = make_pool (1, 2 * PAGE + 256, ZS_LOCK_CLASS,
                                      round % 2 ? ZS_FREE_IMMEDIATE
                                      : ZS_FREE_BATCHED);
    atomic_store (&race.pool, pool);
    atomic_store (&race.refused, 0);
    pthread_barrier_wait (&race.start);
    pthread_barrier_wait (&race.done);
    refusals += atomic_load (&race.refused) != 0;
    for (unsigned t = 0; t < RACE_THREADS; t++)
      for (int i = 0; i < RACE_OBJECTS; i++)
        zs_free (pool, race.h[t][i]);
    zs_pool_destroy (pool);
  }
  for (unsigned t = 0; t < RACE_THREADS; t++)
    assert_int_equal (pthread_join (threads[t], NULL), 0);
  pthread_barrier_destroy (&race.start);
  pthread_barrier_destroy (&race.done);
  if (refusals)
    fail_msg ("%d of %d rounds refused an object that fitted the limit",
              refusals, RACE_ROUNDS);
}

/* An aligned_alloc that fails once, for the next request of a given size
 * (the test is linked with -Wl,--wrap=aligned_alloc; only the allocator's
 * and this file's calls go through here).
 */
static atomic_size_t fail_malloc_of_size;
void *__real_aligned_alloc (size_t alignment, size_t size);
void *__wrap_aligned_alloc (size_t alignment, size_t size);
void *
__wrap_aligned_alloc (size_t alignment, size_t size)
{
  size_t armed = size;
  if (atomic_compare_exchange_strong (&fail_malloc_of_size, &armed, 0)) {
    errno = ENOMEM;
    return NULL;
  }
  return __real_aligned_alloc (alignment, size);
}

/* zs_malloc that cannot get a handle cell fails with ENOMEM and leaves
 * nothing behind: no zspage listed, no page counted against the limit.
 */
static void
test_cell_failure_leaves_no_zspage (void **state)
{
  (void) state;
  struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT, 64 * PAGE,
                                    ZS_LOCK_CLASS, ZS_FREE_BATCHED);
  struct zs_pool_stats st;

  /* The class's first object needs a block of cells: one page. */
  atomic_store (&fail_malloc_of_size, (size_t) PAGE);
  errno = 0;
  assert_true (zs_malloc (pool, 1000) == 0);
  assert_int_equal (errno, ENOMEM);
  assert_int_equal (atomic_load (&fail_malloc_of_size), 0);
  get_stats (pool, &st);
  assert_int_equal (st.objects, 0);
  assert_int_equal (st.pages_used, 0);

  /* And the pool still works. */
  zs_handle_t h = alloc_written (pool, 1000, 7);
  assert_true (object_ok (pool, h, 1000, 7));
  zs_free (pool, h);
  get_stats (pool, &st);
  assert_int_equal (st.pages_used, 0);
  zs_pool_destroy (pool);
}

/* ---------------------------------------------------------------------- */
/* 8b. Changing the limit while the pool is in use.                        */

/* A limit is checked against what the pool holds and set in one step
 * with respect to charges: a refused limit is never in force, not even
 * for a moment, and an accepted one is never exceeded by a charge that
 * was checked against the old one.  A thread charges and gives back a
 * page over and over, another watches the limit, while the test sets
 * limits.
 */
struct set_limit_race {
  struct zs_pool *pool;
  uint64_t low;                 /* the limit being set */
  size_t charge;                /* what the charger charges each time */
  atomic_bool stop;
  atomic_ulong refusals;        /* charges refused */
  atomic_ulong charges;         /* charges that got through */
  atomic_ulong low_seen;        /* the watcher saw low in force */
  atomic_ulong over_seen;       /* the charger held its charge under low */
};

static void *
set_limit_charger (void *arg)
{
  struct set_limit_race *race = arg;
  struct zs_pool_config config;

  while (!atomic_load (&race->stop)) {
    if (zs_pool_charge (race->pool, race->charge) == -1) {
      atomic_fetch_add (&race->refusals, 1);
      continue;
    }
    atomic_fetch_add (&race->charges, 1);
    /* Charged: a limit in force now must have room for it. */
    zs_pool_get_config (race->pool, &config);
    if (config.mem_limit == race->low)
      atomic_fetch_add (&race->over_seen, 1);
    zs_pool_discharge (race->pool, race->charge);
  }
  return NULL;
}

static void *
set_limit_watcher (void *arg)
{
  struct set_limit_race *race = arg;
  struct zs_pool_config config;

  while (!atomic_load (&race->stop)) {
    zs_pool_get_config (race->pool, &config);
    if (config.mem_limit == race->low)
      atomic_fetch_add (&race->low_seen, 1);
  }
  return NULL;
}

static void
set_limit_race_run (struct set_limit_race *race, bool watch,
                    int (*round) (struct set_limit_race *race))
{
  pthread_t charger, watcher;
  int failures = 0;

  atomic_store (&race->stop, false);
  assert_int_equal (pthread_create (&charger, NULL, set_limit_charger, race), 0);
  if (watch)
    assert_int_equal (pthread_create (&watcher, NULL, set_limit_watcher, race),
                      0);
  /* The charger at work, then as many rounds as fit in 300 ms. */
  while (atomic_load (&race->charges) + atomic_load (&race->refusals) == 0)
    sched_yield ();
  struct timespec start, now;
  clock_gettime (CLOCK_MONOTONIC, &start);
  for (int i = 0; failures == 0; i++) {
    failures += round (race);
    if (i % 1000 == 999) {
      clock_gettime (CLOCK_MONOTONIC, &now);
      if ((now.tv_sec - start.tv_sec) * 1000000000L
          + (now.tv_nsec - start.tv_nsec) > 300000000L)
        break;
    }
  }
  atomic_store (&race->stop, true);
  assert_int_equal (pthread_join (charger, NULL), 0);
  if (watch)
    assert_int_equal (pthread_join (watcher, NULL), 0);
  assert_int_equal (failures, 0);
}

/* Set the low limit, which the pool's holdings always refuse. */
static int
set_refused_limit (struct set_limit_race *race)
{
  struct zs_pool_config config;

  errno = 0;
  int r = zs_pool_set_mem_limit (race->pool, race->low);
  zs_pool_get_config (race->pool, &config);
  if (r != -1 || errno != ENOSPC || config.mem_limit != 0) {
    print_error ("zs_pool_set_mem_limit (%" PRIu64 "): %d (%s), limit now %"
                 PRIu64 "\n", race->low, r, strerror (errno), config.mem_limit);
    return 1;
  }
  return 0;
}

/* Set the low limit (accepted while the charger holds nothing), then
 * none again.
 */
static int
set_limit_and_back (struct set_limit_race *race)
{
  errno = 0;
  int r = zs_pool_set_mem_limit (race->pool, race->low);
  if (r == -1 && errno != ENOSPC) {
    print_error ("zs_pool_set_mem_limit: %s\n", strerror (errno));
    return 1;
  }
  return zs_pool_set_mem_limit (race->pool, 0) == 0 ? 0 : 1;
}

static void
test_set_mem_limit_refused_never_in_force (void **state)
{
  (void) state;
  /* Immediate frees: a charge the limit refuses is refused at once, not
   * retried after draining batches.
   */
  struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS,
                                    ZS_FREE_IMMEDIATE);
  assert_int_equal (zs_pool_charge (pool, 1 << 20), 0);
  struct set_limit_race race = {
    .pool = pool, .low = 512 << 10, .charge = PAGE,
  };
  set_limit_race_run (&race, true, set_refused_limit);
  print_message ("refused limit: %lu charges, %lu refused, the limit seen %lu "
                 "times\n", atomic_load (&race.charges),
                 atomic_load (&race.refusals), atomic_load (&race.low_seen));
  assert_true (atomic_load (&race.charges) > 0);
  assert_int_equal (atomic_load (&race.refusals), 0);
  assert_int_equal (atomic_load (&race.low_seen), 0);
  zs_pool_discharge (pool, 1 << 20);
  zs_pool_destroy (pool);
}

static void
test_set_mem_limit_accepted_never_exceeded (void **state)
{
  (void) state;
  struct zs_pool *pool = make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS,
                                    ZS_FREE_IMMEDIATE);
  assert_int_equal (zs_pool_charge (pool, 1 << 20), 0);
  /* Room for the 1 MiB held, not for the charger's 64 KiB as well. */
  struct set_limit_race race = {
    .pool = pool, .low = (1 << 20) + (32 << 10), .charge = 64 << 10,
  };
  set_limit_race_run (&race, false, set_limit_and_back);
  print_message ("accepted limit: %lu charges, %lu refused, %lu held over "
                 "the limit\n", atomic_load (&race.charges),
                 atomic_load (&race.refusals), atomic_load (&race.over_seen));
  assert_true (atomic_load (&race.charges) > 0);
  assert_int_equal (atomic_load (&race.over_seen), 0);
  zs_pool_discharge (pool, 1 << 20);
  zs_pool_destroy (pool);
}

/* A limit is refused only for what the pool holds once its deferred
 * frees are drained (as an allocation is), and a refusal leaves the limit
 * as it was.
 */
static void
test_set_mem_limit_drains_first (void **state)
{
  (void) state;
  enum { N = 64 };
  struct zs_pool *pool = default_pool ();
  zs_handle_t h[N];

  for (int i = 0; i < N; i++)
    h[i] = alloc_written (pool, 2000, i);
  uint64_t full = zs_pool_bytes (pool);
  for (int i = 0; i < N; i++)
    zs_free (pool, h[i]);       /* pending: N frees fit in a batch */
  assert_true (zs_pool_bytes (pool) == full);

  /* What the pool holds once the frees are drained fits. */
  struct zs_pool_config config;
  assert_int_equal (zs_pool_set_mem_limit (pool, full / 2), 0);
  zs_pool_get_config (pool, &config);
  assert_int_equal (config.mem_limit, full / 2);
  assert_true (zs_pool_bytes (pool) <= full / 2);

  /* Refused (a block of handle cells stays): the limit stays, and the
   * refusal says what the pool held.
   */
  errno = 0;
  assert_int_equal (zs_pool_set_mem_limit (pool, 1), -1);
  assert_int_equal (errno, ENOSPC);
  zs_pool_get_config (pool, &config);
  assert_int_equal (config.mem_limit, full / 2);
  zs_handle_t kept = alloc_written (pool, 3000, 1);
  uint64_t held = 0, now = zs_pool_bytes (pool);
  errno = 0;
  assert_int_equal (zs_pool_set_mem_limit_held (pool, now - 1, &held), -1);
  assert_int_equal (errno, ENOSPC);
  assert_int_equal (held, now);
  zs_pool_get_config (pool, &config);
  assert_int_equal (config.mem_limit, full / 2);
  assert_int_equal (zs_pool_set_mem_limit_held (pool, now, &held), 0);
  zs_free (pool, kept);
  zs_pool_destroy (pool);
}

/* ---------------------------------------------------------------------- */
/* 9. Bad input.                                                          */

static void
test_bad_input (void **state)
{
  (void) state;
  struct zs_pool_config config;
  struct zs_pool_stats st0, st1;

  /* Defaults. */
  memset (&config, 0xa5, sizeof config);
  zs_pool_config_init (&config);
  assert_int_equal (config.chain_pages, ZS_CHAIN_DEFAULT);
  assert_int_equal (config.mem_limit, 0);
  assert_int_equal (config.lock_mode, ZS_LOCK_CLASS);
  assert_int_equal (config.free_mode, ZS_FREE_BATCHED);

  /* Bad chain lengths. */
  zs_pool_config_init (&config);
  config.chain_pages = 0;
  errno = 0;
  assert_null (zs_pool_create (&config));
  assert_int_equal (errno, EINVAL);
  config.chain_pages = ZS_CHAIN_MAX + 1;
  errno = 0;
  assert_null (zs_pool_create (&config));
  assert_int_equal (errno, EINVAL);

  /* Bad modes. */
  zs_pool_config_init (&config);
  config.lock_mode = (enum zs_lock_mode) 7;
  errno = 0;
  assert_null (zs_pool_create (&config));
  assert_int_equal (errno, EINVAL);
  zs_pool_config_init (&config);
  config.free_mode = (enum zs_free_mode) 7;
  errno = 0;
  assert_null (zs_pool_create (&config));
  assert_int_equal (errno, EINVAL);

  /* NULL config gives the defaults. */
  struct zs_pool *pool = zs_pool_create (NULL);
  assert_non_null (pool);
  memset (&config, 0xa5, sizeof config);
  zs_pool_get_config (pool, &config);
  assert_int_equal (config.chain_pages, ZS_CHAIN_DEFAULT);
  assert_int_equal (config.mem_limit, 0);
  assert_int_equal (config.lock_mode, ZS_LOCK_CLASS);
  assert_int_equal (config.free_mode, ZS_FREE_BATCHED);

  /* Bad sizes. */
  errno = 0;
  assert_true (zs_malloc (pool, 0) == 0);
  assert_int_equal (errno, EINVAL);
  errno = 0;
  assert_true (zs_malloc (pool, ZS_MAX_OBJECT_SIZE + 1) == 0);
  assert_int_equal (errno, EINVAL);
  errno = 0;
  assert_true (zs_malloc (pool, SIZE_MAX) == 0);
  assert_int_equal (errno, EINVAL);
  get_stats (pool, &st0);
  assert_int_equal (st0.objects, 0);
  assert_int_equal (st0.pages_used, 0);

  /* Over-long write: refused, object untouched. */
  zs_handle_t h = alloc_written (pool, 100, 77);
  uint8_t big[PAGE];
  memset (big, 0xee, sizeof big);
  errno = 0;
  assert_int_equal (zs_write (pool, h, big, 101), -1);
  assert_int_equal (errno, EINVAL);
  errno = 0;
  assert_int_equal (zs_write (pool, h, big, PAGE), -1);
  assert_int_equal (errno, EINVAL);
  assert_true (object_ok (pool, h, 100, 77));

  /* A short write changes only the prefix. */
  assert_int_equal (zs_write (pool, h, big, 10), 0);
  {
    uint8_t local[PAGE];
    const uint8_t *p = zs_read_begin (pool, h, local);
    assert_non_null (p);
    for (size_t i = 0; i < 10; i++)
      assert_int_equal (p[i], 0xee);
    for (size_t i = 10; i < 100; i++)
      assert_int_equal (p[i], pattern_byte (i, 100, 77));
    zs_read_end (pool, h, p);
  }
  write_pattern (pool, h, 100, 77);

  /* zs_free (0) is a no-op. */
  get_stats (pool, &st0);
  zs_free (pool, 0);
  zs_pool_flush (pool);
  get_stats (pool, &st1);
  assert_int_equal (st1.objects, st0.objects);
  assert_int_equal (st1.bytes_stored, st0.bytes_stored);
  assert_int_equal (st1.pages_used, st0.pages_used);
  assert_int_equal (st1.objects, 1);
  assert_true (object_ok (pool, h, 100, 77));

  zs_free (pool, h);
  get_stats (pool, &st1);
  assert_int_equal (st1.objects, 0);
  zs_pool_destroy (pool);

  /* An immediate pool: zs_free (0) is a no-op there too. */
  pool = make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_POOL, ZS_FREE_IMMEDIATE);
  zs_free (pool, 0);
  get_stats (pool, &st1);
  assert_int_equal (st1.objects, 0);
  zs_pool_destroy (pool);
}

/* ---------------------------------------------------------------------- */
/* 10. Names and printing.                                                */

static void
test_names_and_print (void **state)
{
  (void) state;
  static const char *const expect[ZS_FULLNESS_GROUPS] = {
    "empty", "10", "20", "30", "40", "50", "60", "70", "80", "90", "99",
    "full"
  };

  for (unsigned g = 0; g < ZS_FULLNESS_GROUPS; g++) {
    assert_non_null (zs_fullness_group_name (g));
    assert_string_equal (zs_fullness_group_name (g), expect[g]);
  }

  struct zs_pool *pool = default_pool ();
  zs_handle_t a = alloc_written (pool, 4000, 1);
  zs_handle_t b = alloc_written (pool, 100, 2);
  char *buf = NULL;
  size_t len = 0;
  FILE *fp = open_memstream (&buf, &len);
  assert_non_null (fp);
  zs_pool_print_stats (pool, fp);
  assert_int_equal (fclose (fp), 0);
  assert_non_null (buf);
  print_message ("%s", buf);
  assert_true (len > 0);
  /* The class table header names its columns. */
  assert_non_null (strstr (buf, "class"));
  assert_non_null (strstr (buf, "size"));
  assert_non_null (strstr (buf, "full"));
  /* The huge class (4096) is in use so it is printed. */
  assert_non_null (strstr (buf, "4096"));
  free (buf);

  zs_free (pool, a);
  zs_free (pool, b);
  zs_pool_destroy (pool);
}

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
static void *
refill_loop (void *arg)
{
  struct zs_pool *pool = arg;
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
  pthread_t thread;
  assert_int_equal (pthread_create (&thread, NULL, refill_loop, pool), 0);
  pthread_join (thread, NULL);
  uint64_t growth = rss_bytes () - before;
  struct zs_pool_stats st;
  get_stats (pool, &st);
  print_message ("reserve: %u zspage lengths; RSS grew %" PRIu64 " KiB, limit "
                 "%" PRIu64 " KiB, counted %" PRIu64 " KiB (reserve %" PRIu64
                 " KiB)\n", lengths, growth >> 10, st.mem_limit >> 10,
                 st.limit_used >> 10, st.reserve_bytes >> 10);
  assert_true (st.limit_used <= st.mem_limit);
  /* What is resident is what is counted, give or take the handful of
   * pages malloc and the test itself touch.
   */
  assert_true (growth <= st.limit_used + (1 << 20));
  for (unsigned i = 0; i < lengths; i++)
    zs_free (pool, kept[i]);
  zs_pool_destroy (pool);
}

/* ---------------------------------------------------------------------- */

/* zs_malloc_batch: objects of mixed classes, each readable and
 * writable as zs_malloc's, freed by zs_free_many in both free modes; a
 * bad size anywhere in the batch allocates nothing and leaves every
 * handle 0.
 */
static void
test_malloc_batch (void **state)
{
  (void) state;
  static const size_t pattern[] = { 700, 32, 4096, 700, 1500, 32, 3000, 90 };
  enum { N = 40 };
  for (int mode = 0; mode < 2; mode++) {
    struct zs_pool *pool = make_pool (8, 0, ZS_LOCK_CLASS,
                                      mode ? ZS_FREE_IMMEDIATE : ZS_FREE_BATCHED);
    size_t sizes[N];
    zs_handle_t h[N];
    for (unsigned i = 0; i < N; i++)
      sizes[i] = pattern[i % (sizeof pattern / sizeof pattern[0])];
    assert_int_equal (zs_malloc_batch (pool, sizes, N, h), N);
    for (unsigned i = 0; i < N; i++) {
      assert_true (h[i] != 0);
      assert_int_equal (zs_object_size (pool, h[i]), sizes[i]);
      write_pattern (pool, h[i], sizes[i], handle_key (h[i]));
    }
    for (unsigned i = 0; i < N; i++)
      assert_true (object_ok (pool, h[i], sizes[i], handle_key (h[i])));
    check_stats_consistent (pool);
    zs_free_many (pool, h, N);
    zs_pool_flush (pool);
    struct zs_pool_stats st;
    get_stats (pool, &st);
    assert_int_equal (st.objects, 0);
    assert_int_equal (st.pages_used, 0);

    sizes[N / 2] = ZS_MAX_OBJECT_SIZE + 1;
    memset (h, 0xa5, sizeof h);
    errno = 0;
    assert_int_equal (zs_malloc_batch (pool, sizes, N, h), 0);
    assert_int_equal (errno, EINVAL);
    for (unsigned i = 0; i < N; i++)
      assert_true (h[i] == 0);
    get_stats (pool, &st);
    assert_int_equal (st.objects, 0);
    zs_pool_destroy (pool);
  }
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

static void
test_resident_only (void **state)
{
  (void) state;
  enum { LIMIT = 64 << 20, RESERVE = 4 << 20, SIZES = (PAGE - 32) / 16 + 1 };
  struct zs_pool_config config;
  zs_pool_config_init (&config);
  config.mem_limit = LIMIT;
  config.free_mode = ZS_FREE_IMMEDIATE;
  config.reserve_bytes = RESERVE;
  config.resident_only = true;
  struct zs_pool *pool = zs_pool_create (&config);
  assert_non_null (pool);
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
  config.mem_limit = 6 << 20;
  config.reserve_bytes = 2 << 20;
  pool = zs_pool_create (&config);
  assert_non_null (pool);
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

/* 15. The open reserve (swap mode's full device on a machine out of      */
/*     memory): the data takes the reserve's resident pages, nothing more */
/*     asked of the system, until a refill makes it whole again.          */
static void
test_resident_only_open_reserve (void **state)
{
  (void) state;
  /* Pages that compress 1.5:1: their class's zspages are several pages
   * long, so at the limit a new one does not fit in what is left, and
   * the reserve stays whole (a page-sized object's one-page zspages
   * would take the reserve page by page, each settling the next's room).
   */
  enum { LIMIT = 6 << 20, RESERVE = 2 << 20, FILL_MAX = 4096,
         SIZE = PAGE * 2 / 3 };
  struct zs_pool_config config;
  zs_pool_config_init (&config);
  config.mem_limit = LIMIT;
  config.free_mode = ZS_FREE_IMMEDIATE;
  config.reserve_bytes = RESERVE;
  config.resident_only = true;
  struct zs_pool *pool = zs_pool_create (&config);
  assert_non_null (pool);
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
    cmocka_unit_test (test_roundtrip_all_sizes),
    cmocka_unit_test (test_malloc_batch),
    cmocka_unit_test (test_page_crossing),
    cmocka_unit_test (test_classes),
    cmocka_unit_test (test_huge_class),
    cmocka_unit_test (test_stats_exact),
    cmocka_unit_test (test_fullness_groups),
    cmocka_unit_test (test_mem_limit_huge),
    cmocka_unit_test (test_mem_limit_small),
    cmocka_unit_test (test_mem_limit_other_thread_batch),
    cmocka_unit_test (test_thread_exits_after_destroy),
    cmocka_unit_test (test_batched_vs_immediate),
    cmocka_unit_test (test_destroy_with_live_objects),
    cmocka_unit_test (test_cell_failure_leaves_no_zspage),
    cmocka_unit_test (test_cells_follow_objects),
    cmocka_unit_test (test_limit_refusal_is_true),
    cmocka_unit_test (test_set_mem_limit_refused_never_in_force),
    cmocka_unit_test (test_set_mem_limit_accepted_never_exceeded),
    cmocka_unit_test (test_set_mem_limit_drains_first),
    cmocka_unit_test (test_bad_input),
    cmocka_unit_test (test_names_and_print),
    cmocka_unit_test (test_memory_returns),
    cmocka_unit_test (test_memory_returns_when_locked),
    cmocka_unit_test (test_reserve),
    cmocka_unit_test (test_reserve_edges),
    cmocka_unit_test (test_resident_only),
    cmocka_unit_test (test_resident_only_open_reserve),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
