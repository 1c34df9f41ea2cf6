/* Unit tests for the zsalloc allocator (alloc/zsalloc.h): the memory limit, frees and a pool's end.
 *
 * Every test builds its own pool(s) and asserts on object contents, on
 * the public statistics and, where the design fixes it, on exact page
 * counts.  Run under ASan/LSan by CI, so every test also frees what it
 * allocates.  The shared helpers are in alloc-fixture.h.
 */

#include "alloc-fixture.h"
#include "zsalloc-internal.h"   /* CELLS_PER_BLOCK, CELL_BLOCK_BYTES */

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
  /* Refused at a boundary: every zspage full and no room for another
   * one, or every block of handle cells full and no room for another.
   */
  size_t slots = st.pages_used / c->pages_per_zspage * c->objs_per_zspage;
  print_message ("%zu slots in the zspages, %zu cells a block\n", slots,
                 (size_t) CELLS_PER_BLOCK);
  assert_true (n == slots || (n < slots && n % CELLS_PER_BLOCK == 0));
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

  /* The class's first object needs a block of cells. */
  atomic_store (&fail_malloc_of_size, (size_t) CELL_BLOCK_BYTES);
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

int
main (void)
{
  const struct CMUnitTest tests[] = {
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
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
