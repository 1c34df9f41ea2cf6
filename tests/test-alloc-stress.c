/* Multi-threaded stress of one shared zsalloc pool.
 *
 * N threads (ZS_STRESS_THREADS, default 4) each run ZS_STRESS_OPS
 * operations (default depends on the build: fewer under sanitizers):
 *
 *   phase 1  a random mix of zs_malloc (sizes 1..4096, biased to
 *            200..3000), zs_write of a per-object pattern, read-verify of
 *            the thread's own live objects (at most MAX_LIVE), rewrite,
 *            and zs_free, with the odd zs_pool_stats / zs_pool_flush;
 *   phase 2  hand-off: objects allocated and written by thread i are
 *            queued to thread i+1, which verifies and frees them, so
 *            frees land in a different thread's batch than the malloc;
 *   end      every thread verifies and frees everything it holds.
 *
 * Then the pool must be empty: objects, bytes_stored and pages_used 0.
 * The whole stress runs three times: lock=class + batched frees,
 * lock=pool + immediate frees, and lock=class + batched with a memory
 * limit, where ENOSPC is allowed (counted) but the limit must hold.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "xorshift.h"

#include "zsalloc.h"

#define PAGE ZS_PAGE_SIZE
#define MAX_LIVE 2000
#define QUEUE_CAP 512

/* Sanitizer builds get a smaller default workload. */
#if defined (__SANITIZE_THREAD__)
#define STRESS_TSAN 1
#elif defined (__has_feature)
#if __has_feature (thread_sanitizer)
#define STRESS_TSAN 1
#endif
#endif
#if defined (__SANITIZE_ADDRESS__)
#define STRESS_ASAN 1
#elif defined (__has_feature)
#if __has_feature (address_sanitizer)
#define STRESS_ASAN 1
#endif
#endif

#if defined (STRESS_TSAN)
#define DEFAULT_OPS 50000
#elif defined (STRESS_ASAN)
#define DEFAULT_OPS 50000
#else
#define DEFAULT_OPS 120000
#endif
#define DEFAULT_THREADS 4

static unsigned nr_threads;
static unsigned long ops_per_thread;

/* Random bytes that object contents are cut from. */
static uint8_t source[2 * PAGE];

struct obj {
  zs_handle_t h;
  uint32_t size;
  uint32_t off;                 /* where in source[] its bytes come from */
  uint64_t tag;                 /* thread << 40 | sequence: first 8 bytes */
};

/* A lock-protected queue of objects handed to one thread. */
struct queue {
  pthread_mutex_t lock;
  unsigned head, count;
  struct obj items[QUEUE_CAP];
};

struct run;

struct worker {
  struct run *run;
  unsigned id;
  pthread_t thread;
  uint64_t rng;
  uint64_t seq;
  unsigned live;
  struct obj table[MAX_LIVE];
  /* Results. */
  uint64_t failures;
  uint64_t enospc;
  uint64_t mallocs, frees, verifies, cross_frees;
};

struct run {
  struct zs_pool *pool;
  bool allow_enospc;
  pthread_barrier_t barrier;
  struct queue *queues;         /* one per worker */
  struct worker *workers;
};

/* 1..4096 with 70 % in 200..3000. */
static uint32_t
random_size (uint64_t *rng)
{
  uint64_t r = xorshift64 (rng);
  if (r % 10 < 7)
    return 200 + (uint32_t) ((r >> 8) % 2801);
  return 1 + (uint32_t) ((r >> 8) % PAGE);
}

static void
fail_report (struct worker *w, const struct obj *o, const char *what)
{
  w->failures++;
  if (w->failures <= 10)
    fprintf (stderr, "thread %u: handle %#" PRIxPTR " size %" PRIu32
             " tag %#" PRIx64 ": %s\n", w->id, o->h, o->size, o->tag, what);
}

/* Allocate and write a new object; false if the pool refused. */
static bool
obj_create (struct worker *w, struct obj *o)
{
  struct zs_pool *pool = w->run->pool;
  uint8_t buf[PAGE];

  o->size = random_size (&w->rng);
  o->tag = (uint64_t) w->id << 40 | w->seq++;
  o->off = (uint32_t) ((o->tag * 2654435761u) % PAGE);
  errno = 0;
  o->h = zs_malloc (pool, o->size);
  if (o->h == 0) {
    if (errno == ENOSPC && w->run->allow_enospc)
      w->enospc++;
    else
      fail_report (w, o, errno == ENOSPC ? "unexpected ENOSPC"
                   : "zs_malloc failed");
    return false;
  }
  w->mallocs++;
  memcpy (buf, source + o->off, o->size);
  if (o->size >= 8)
    memcpy (buf, &o->tag, 8);
  if (zs_write (pool, o->h, buf, o->size) != 0)
    fail_report (w, o, "zs_write failed");
  return true;
}

static void
obj_verify (struct worker *w, const struct obj *o)
{
  struct zs_pool *pool = w->run->pool;
  uint8_t local[PAGE];
  bool ok;

  w->verifies++;
  if (zs_object_size (pool, o->h) != o->size) {
    fail_report (w, o, "wrong zs_object_size");
    return;
  }
  const uint8_t *p = zs_read_begin (pool, o->h, local);
  if (p == NULL) {
    fail_report (w, o, "zs_read_begin returned NULL");
    return;
  }
  if (o->size >= 8)
    ok = memcmp (p, &o->tag, 8) == 0
      && memcmp (p + 8, source + o->off + 8, o->size - 8) == 0;
  else
    ok = memcmp (p, source + o->off, o->size) == 0;
  zs_read_end (pool, o->h, p);
  if (!ok)
    fail_report (w, o, "content mismatch");
}

static void
obj_destroy (struct worker *w, const struct obj *o)
{
  obj_verify (w, o);
  zs_free (w->run->pool, o->h);
  w->frees++;
}

static bool
queue_push (struct queue *q, const struct obj *o)
{
  bool ok = false;

  pthread_mutex_lock (&q->lock);
  if (q->count < QUEUE_CAP) {
    q->items[(q->head + q->count) % QUEUE_CAP] = *o;
    q->count++;
    ok = true;
  }
  pthread_mutex_unlock (&q->lock);
  return ok;
}

static bool
queue_pop (struct queue *q, struct obj *o)
{
  bool ok = false;

  pthread_mutex_lock (&q->lock);
  if (q->count > 0) {
    *o = q->items[q->head];
    q->head = (q->head + 1) % QUEUE_CAP;
    q->count--;
    ok = true;
  }
  pthread_mutex_unlock (&q->lock);
  return ok;
}

/* One operation on the thread's own table. */
static void
table_op (struct worker *w)
{
  uint64_t r = xorshift64 (&w->rng) % 100;

  if (w->live == 0 || (r < 45 && w->live < MAX_LIVE)) {
    if (obj_create (w, &w->table[w->live]))
      w->live++;
    return;
  }
  unsigned i = (unsigned) (xorshift64 (&w->rng) % w->live);
  if (r < 70)
    obj_verify (w, &w->table[i]);
  else if (r < 75) {
    /* Replace: free and allocate anew at once (slot reuse). */
    obj_destroy (w, &w->table[i]);
    if (!obj_create (w, &w->table[i]))
      w->table[i] = w->table[--w->live];
  }
  else {
    obj_destroy (w, &w->table[i]);
    w->table[i] = w->table[--w->live];
  }
}

static void *
worker_main (void *arg)
{
  struct worker *w = arg;
  struct run *run = w->run;
  struct queue *mine = &run->queues[w->id];
  struct queue *next = &run->queues[(w->id + 1) % nr_threads];
  unsigned long phase1 = ops_per_thread * 7 / 10;
  static const struct obj none;
  struct obj o;

  pthread_barrier_wait (&run->barrier);

  /* Phase 1: own objects only. */
  for (unsigned long op = 0; op < phase1; op++) {
    uint64_t r = xorshift64 (&w->rng);
    if (r % 20000 == 0) {
      struct zs_pool_stats st;
      zs_pool_stats (run->pool, &st);
      if (st.frees_pending != 0) {
        /* Other threads may free right after the drain; only a gross
         * inconsistency is a failure.
         */
        if (st.frees_pending > (uint64_t) nr_threads * 512 * 2)
          fail_report (w, &none, "absurd frees_pending");
      }
      if (st.mem_limit != 0 && st.pages_used * PAGE > st.mem_limit)
        fail_report (w, &none, "pages_used above mem_limit");
    }
    else if (r % 20000 == 1)
      zs_pool_flush (run->pool);
    else
      table_op (w);
  }

  /* Phase 2: hand objects to the next thread, free the previous one's. */
  for (unsigned long op = phase1; op < ops_per_thread; op++) {
    uint64_t r = xorshift64 (&w->rng) % 100;
    if (r < 40) {
      if (obj_create (w, &o) && !queue_push (next, &o))
        obj_destroy (w, &o);    /* queue full */
    }
    else if (r < 80) {
      if (queue_pop (mine, &o)) {
        obj_destroy (w, &o);
        w->cross_frees++;
      }
      else
        table_op (w);
    }
    else
      table_op (w);
  }

  /* Nobody pushes after this barrier: drain the own queue, then free
   * everything still in the table.
   */
  pthread_barrier_wait (&run->barrier);
  while (queue_pop (mine, &o)) {
    obj_destroy (w, &o);
    w->cross_frees++;
  }
  for (unsigned i = 0; i < w->live; i++)
    obj_verify (w, &w->table[i]);
  for (unsigned i = 0; i < w->live; i++)
    obj_destroy (w, &w->table[i]);
  w->live = 0;
  return NULL;                  /* pending frees stay in the pool's batches */
}

static double
now_s (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A thread that compacts the pool in a loop while the workers run. */
struct compactor {
  struct zs_pool *pool;
  pthread_t thread;
  _Atomic bool done;
  uint64_t rounds, pages;
};

static void *
compactor_main (void *arg)
{
  struct compactor *c = arg;
  while (!atomic_load (&c->done)) {
    c->pages += zs_compact (c->pool);
    c->rounds++;
  }
  return NULL;
}

static void
run_stress (enum zs_lock_mode lock_mode, enum zs_free_mode free_mode,
            uint64_t mem_limit, bool compact, const char *name)
{
  struct zs_pool_config config;
  struct run run = { .allow_enospc = mem_limit != 0 };
  uint64_t failures = 0, enospc = 0, mallocs = 0, frees = 0;
  uint64_t verifies = 0, cross = 0;
  double t0 = now_s ();

  zs_pool_config_init (&config);
  config.lock_mode = lock_mode;
  config.free_mode = free_mode;
  config.mem_limit = mem_limit;
  run.pool = zs_pool_create (&config);
  assert_non_null (run.pool);

  run.queues = calloc (nr_threads, sizeof *run.queues);
  run.workers = calloc (nr_threads, sizeof *run.workers);
  assert_non_null (run.queues);
  assert_non_null (run.workers);
  assert_int_equal (pthread_barrier_init (&run.barrier, NULL, nr_threads), 0);
  for (unsigned i = 0; i < nr_threads; i++) {
    pthread_mutex_init (&run.queues[i].lock, NULL);
    run.workers[i].run = &run;
    run.workers[i].id = i;
    run.workers[i].rng = 0x9E3779B97F4A7C15ULL * (i + 1) + mem_limit
      + (uint64_t) lock_mode * 77 + (uint64_t) free_mode * 131;
  }
  struct compactor compactor = { .pool = run.pool, .done = false };
  if (compact)
    assert_int_equal (pthread_create (&compactor.thread, NULL, compactor_main,
                                      &compactor), 0);
  for (unsigned i = 0; i < nr_threads; i++)
    assert_int_equal (pthread_create (&run.workers[i].thread, NULL,
                                      worker_main, &run.workers[i]), 0);
  for (unsigned i = 0; i < nr_threads; i++) {
    struct worker *w = &run.workers[i];
    assert_int_equal (pthread_join (w->thread, NULL), 0);
    failures += w->failures;
    enospc += w->enospc;
    mallocs += w->mallocs;
    frees += w->frees;
    verifies += w->verifies;
    cross += w->cross_frees;
  }
  if (compact) {
    atomic_store (&compactor.done, true);
    assert_int_equal (pthread_join (compactor.thread, NULL), 0);
  }

  struct zs_pool_stats st;
  zs_pool_stats (run.pool, &st);
  double t1 = now_s ();
  printf ("# %s: %u threads x %lu ops in %.2f s: %" PRIu64 " mallocs, %"
          PRIu64 " frees (%" PRIu64 " cross-thread), %" PRIu64
          " verifies, %" PRIu64 " ENOSPC; pages_used_max %" PRIu64
          ", limit_hits %" PRIu64 "\n",
          name, nr_threads, ops_per_thread, t1 - t0, mallocs, frees, cross,
          verifies, enospc, st.pages_used_max, st.limit_hits);
  if (compact)
    printf ("# %s: the compactor ran %" PRIu64 " rounds, freed %" PRIu64
            " pages (pool: %" PRIu64 " compacted)\n", name, compactor.rounds,
            compactor.pages, st.pages_compacted);
  fflush (stdout);

  assert_int_equal (failures, 0);
  assert_int_equal (mallocs, frees);
  assert_int_equal (st.objects, 0);
  assert_int_equal (st.bytes_stored, 0);
  assert_int_equal (st.pages_used, 0);
  assert_int_equal (st.frees_pending, 0);
  assert_true (st.pages_freed >= st.pages_used_max);
  if (compact) {
    assert_true (compactor.rounds > 0);
    assert_true (st.pages_compacted >= compactor.pages);
  }
  if (nr_threads > 1 && ops_per_thread >= 1000)
    assert_true (cross > 0);
  if (mem_limit != 0) {
    assert_true (st.pages_used_max * PAGE <= mem_limit);
    /* Every refusal is counted. */
    assert_int_equal (st.limit_hits, enospc);
    /* With enough work the live set (~1.7 KB x 2000 per thread) goes
     * past the limit.
     */
    if (ops_per_thread >= 20000 && nr_threads >= 4)
      assert_true (enospc > 0);
  }
  else {
    assert_int_equal (enospc, 0);
    assert_int_equal (st.limit_hits, 0);
  }

  zs_pool_destroy (run.pool);
  pthread_barrier_destroy (&run.barrier);
  for (unsigned i = 0; i < nr_threads; i++)
    pthread_mutex_destroy (&run.queues[i].lock);
  free (run.queues);
  free (run.workers);
}

static void
test_stress_class_batched (void **state)
{
  (void) state;
  run_stress (ZS_LOCK_CLASS, ZS_FREE_BATCHED, 0, false, "lock=class free=batched");
}

static void
test_stress_pool_immediate (void **state)
{
  (void) state;
  run_stress (ZS_LOCK_POOL, ZS_FREE_IMMEDIATE, 0, false, "lock=pool free=immediate");
}

static void
test_stress_limit (void **state)
{
  (void) state;
  /* 8 MiB for 4 threads, scaled with the thread count. */
  uint64_t limit = (uint64_t) 2 << 20;
  limit *= nr_threads;
  run_stress (ZS_LOCK_CLASS, ZS_FREE_BATCHED, limit, false,
              "lock=class free=batched mem_limit");
}

/* The same mixes while another thread compacts the pool in a loop: every
 * read-verify, every write right after a malloc, every batched and
 * immediate free races the mover.
 */
static void
test_stress_compact_batched (void **state)
{
  (void) state;
  run_stress (ZS_LOCK_CLASS, ZS_FREE_BATCHED, 0, true,
              "lock=class free=batched compacting");
}

static void
test_stress_compact_immediate (void **state)
{
  (void) state;
  run_stress (ZS_LOCK_POOL, ZS_FREE_IMMEDIATE, 0, true,
              "lock=pool free=immediate compacting");
}

static void
test_stress_compact_limit (void **state)
{
  (void) state;
  uint64_t limit = (uint64_t) 2 << 20;
  limit *= nr_threads;
  run_stress (ZS_LOCK_CLASS, ZS_FREE_IMMEDIATE, limit, true,
              "lock=class free=immediate mem_limit compacting");
}

static unsigned long
env_number (const char *name, unsigned long dflt, unsigned long min,
            unsigned long max)
{
  const char *s = getenv (name);
  char *end;

  if (s == NULL || *s == '\0')
    return dflt;
  errno = 0;
  unsigned long v = strtoul (s, &end, 10);
  if (errno != 0 || *end != '\0' || v < min || v > max) {
    fprintf (stderr, "%s=%s: expected a number in %lu..%lu\n",
             name, s, min, max);
    exit (EXIT_FAILURE);
  }
  return v;
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_stress_class_batched),
    cmocka_unit_test (test_stress_pool_immediate),
    cmocka_unit_test (test_stress_limit),
    cmocka_unit_test (test_stress_compact_batched),
    cmocka_unit_test (test_stress_compact_immediate),
    cmocka_unit_test (test_stress_compact_limit),
  };
  uint64_t rng = 0xDEADBEEFCAFEF00DULL;

  nr_threads = env_number ("ZS_STRESS_THREADS", DEFAULT_THREADS, 1, 256);
  ops_per_thread = env_number ("ZS_STRESS_OPS", DEFAULT_OPS, 1, 1UL << 40);
  for (size_t i = 0; i < sizeof source; i++)
    source[i] = (uint8_t) (xorshift64 (&rng) >> 32);

  return cmocka_run_group_tests (tests, NULL, NULL);
}
