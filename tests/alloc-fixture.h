/* The allocator tests' shared fixture: pools made the usual ways,
 * objects written and checked with a pattern, the classes and the
 * statistics read, ranges and handles checked (tests/test-alloc-*.c).
 */
#ifndef ZRAM_TEST_ALLOC_FIXTURE_H
#define ZRAM_TEST_ALLOC_FIXTURE_H

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
static inline size_t
rnd_range (uint64_t *s, size_t lo, size_t hi)
{
  return lo + (size_t) (xorshift64 (s) % (hi - lo + 1));
}

/* A per-object key derived from the handle. */
static inline uint64_t
handle_key (zs_handle_t h)
{
  return ((uint64_t) h * 0x9E3779B97F4A7C15ULL) >> 40;
}

/* Byte i of an object of this size and key. */
static inline uint8_t
pattern_byte (size_t i, size_t size, uint64_t key)
{
  return (uint8_t) ((i * 31 + size + key) & 0xff);
}

static inline void
fill_pattern (uint8_t *buf, size_t size, uint64_t key)
{
  for (size_t i = 0; i < size; i++)
    buf[i] = pattern_byte (i, size, key);
}

static inline void
write_pattern (struct zs_pool *pool, zs_handle_t h, size_t size, uint64_t key)
{
  uint8_t buf[PAGE];

  fill_pattern (buf, size, key);
  assert_int_equal (zs_write (pool, h, buf, size), 0);
}

/* Allocate an object and write its pattern (keyed by key). */
static inline zs_handle_t
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
static inline bool
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

static inline struct zs_pool *
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

static inline struct zs_pool *
default_pool (void)
{
  return make_pool (ZS_CHAIN_DEFAULT, 0, ZS_LOCK_CLASS, ZS_FREE_BATCHED);
}

struct class_table {
  unsigned n;
  struct zs_class_stats cs[MAX_CLASSES];
};

static inline void
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
static inline unsigned
class_of (const struct class_table *t, size_t size)
{
  for (unsigned k = 0; k < t->n; k++)
    if (size <= t->cs[k].size && (k == 0 || size >= t->cs[k].min_size))
      return k;
  fail_msg ("no class serves size %zu", size);
  return 0;
}

static inline void
get_stats (struct zs_pool *pool, struct zs_pool_stats *st)
{
  memset (st, 0xa5, sizeof *st);
  zs_pool_stats (pool, st);
}

/* The pool and per-class statistics agree with each other. */
static inline void
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

static inline int
range_cmp (const void *a, const void *b)
{
  const struct range *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

/* No two objects share a byte. */
static inline void
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

static inline struct range
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

static inline int
handle_cmp (const void *a, const void *b)
{
  zs_handle_t x = *(const zs_handle_t *) a, y = *(const zs_handle_t *) b;
  return x < y ? -1 : x > y;
}

static inline void
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


#endif /* ZRAM_TEST_ALLOC_FIXTURE_H */
