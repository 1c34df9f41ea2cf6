/* Unit tests for the zsalloc allocator (alloc/zsalloc.h): objects, classes and statistics.
 *
 * Every test builds its own pool(s) and asserts on object contents, on
 * the public statistics and, where the design fixes it, on exact page
 * counts.  Run under ASan/LSan by CI, so every test also frees what it
 * allocates.  The shared helpers are in alloc-fixture.h.
 */

#include "alloc-fixture.h"

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
    cmocka_unit_test (test_bad_input),
    cmocka_unit_test (test_names_and_print),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
