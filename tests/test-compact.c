/* Compaction beside readers: white-box tests of the move protocol
 * (MOVING OBJECTS in alloc/zsalloc-internal.h).  They look at which
 * zspage each object is in and which move lock guards it, so that each
 * case is set up exactly rather than hoped for.
 *
 *   - a read held on an object in a zspage the mover does not empty
 *     does not stop compaction (with one lock per class it did);
 *   - threads reading the source zspages without pause do not starve
 *     the mover;
 *   - a source zspage emptied by frees while the mover waits for its
 *     lock is released by the mover, once, and no object is lost.
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

#include "zsalloc-internal.h"

enum { OBJECT_SIZE = 1000, ZSPAGES = 300, JOIN_SECONDS = 60 };

/* The pool under test and its objects, ZSPAGES zspages of one class. */
struct layout {
  struct zs_pool *pool;
  struct size_class *class;
  unsigned per_zspage;
  unsigned count;
  zs_handle_t *handles;           /* 0 once freed */
};

static uint8_t
content_byte (zs_handle_t handle, size_t i)
{
  return (uint8_t) ((handle >> 3) * 131 + i * 7);
}

static void
object_write (struct zs_pool *pool, zs_handle_t handle)
{
  uint8_t buffer[OBJECT_SIZE];
  for (size_t i = 0; i < OBJECT_SIZE; i++)
    buffer[i] = content_byte (handle, i);
  assert_int_equal (zs_write (pool, handle, buffer, OBJECT_SIZE), 0);
}

static bool
object_intact (struct zs_pool *pool, zs_handle_t handle)
{
  const uint8_t *bytes = zs_read_begin (pool, handle, NULL);
  bool intact = true;
  for (size_t i = 0; i < OBJECT_SIZE && intact; i++)
    intact = bytes[i] == content_byte (handle, i);
  zs_read_end (pool, handle, bytes);
  return intact;
}

static struct zspage *
zspage_of (zs_handle_t handle)
{
  return cell_zspage (handle_load (handle));
}

/* ZSPAGES full zspages; objects [k * per_zspage, (k + 1) * per_zspage)
 * are in the k-th (allocation fills the fullest zspage first).
 */
static void
layout_create (struct layout *layout)
{
  struct zs_pool_config config;
  zs_pool_config_init (&config);
  config.free_mode = ZS_FREE_IMMEDIATE;   /* frees take effect at once */
  layout->pool = zs_pool_create (&config);
  assert_non_null (layout->pool);
  layout->class = class_for_size (layout->pool, OBJECT_SIZE);
  layout->per_zspage = layout->class->objs_per_zspage;
  assert_true (layout->per_zspage >= 3);
  layout->count = ZSPAGES * layout->per_zspage;
  layout->handles = calloc (layout->count, sizeof *layout->handles);
  assert_non_null (layout->handles);
  for (unsigned i = 0; i < layout->count; i++) {
    layout->handles[i] = zs_malloc (layout->pool, OBJECT_SIZE);
    assert_true (layout->handles[i] != 0);
    object_write (layout->pool, layout->handles[i]);
  }
  for (unsigned k = 0; k < ZSPAGES; k++)
    for (unsigned j = 1; j < layout->per_zspage; j++)
      assert_ptr_equal (zspage_of (layout->handles[k * layout->per_zspage + j]),
                        zspage_of (layout->handles[k * layout->per_zspage]));
}

static zs_handle_t
first_object (struct layout *layout, unsigned zspage)
{
  return layout->handles[zspage * layout->per_zspage];
}

static pthread_rwlock_t *
lock_of_zspage (struct layout *layout, unsigned zspage)
{
  return zspage_move_lock (layout->pool, zspage_of (first_object (layout, zspage)));
}

/* Free the objects of a zspage from the j-th on. */
static void
free_from (struct layout *layout, unsigned zspage, unsigned j)
{
  for (; j < layout->per_zspage; j++) {
    zs_handle_t *handle = &layout->handles[zspage * layout->per_zspage + j];
    zs_free (layout->pool, *handle);
    *handle = 0;
  }
}

/* Every live object intact, then all freed: the pool must be empty. */
static void
layout_destroy (struct layout *layout)
{
  for (unsigned i = 0; i < layout->count; i++) {
    if (layout->handles[i]) {
      assert_true (object_intact (layout->pool, layout->handles[i]));
      zs_free (layout->pool, layout->handles[i]);
    }
  }
  struct zs_pool_stats stats;
  zs_pool_stats (layout->pool, &stats);
  assert_int_equal (stats.objects, 0);
  assert_int_equal (stats.pages_used, 0);
  zs_pool_destroy (layout->pool);
  free (layout->handles);
}

struct compactor {
  struct zs_pool *pool;
  pthread_t thread;
  uint64_t freed;
};

static void *
compactor_main (void *arg)
{
  struct compactor *compactor = arg;
  compactor->freed = zs_compact (compactor->pool);
  return NULL;
}

/* 0 when the compactor finished within JOIN_SECONDS. */
static int
compactor_join (struct compactor *compactor)
{
  struct timespec deadline;
  clock_gettime (CLOCK_REALTIME, &deadline);
  deadline.tv_sec += JOIN_SECONDS;
  return pthread_timedjoin_np (compactor->thread, NULL, &deadline);
}

struct reader {
  struct layout *layout;
  const zs_handle_t *handles;
  unsigned count;
  atomic_bool *stop;
  atomic_uint_least64_t reads;
  atomic_bool corrupt;
  pthread_t thread;
};

static void *
reader_main (void *arg)
{
  struct reader *reader = arg;
  while (!atomic_load (reader->stop)) {
    for (unsigned i = 0; i < reader->count; i++) {
      if (!object_intact (reader->layout->pool, reader->handles[i]))
        atomic_store (&reader->corrupt, true);
      atomic_fetch_add (&reader->reads, 1);
    }
  }
  return NULL;
}

/* Sources: zspages 1.. keep one object each; zspage 0 stays full.  A read
 * held on an object of zspage 0 (under a lock no source shares) must not
 * stop the mover, and two threads reading the sources' objects without
 * pause must not starve it.
 */
static void
test_compact_beside_readers (void **state)
{
  (void) state;
  enum { SOURCES = 40 };
  struct layout layout;
  layout_create (&layout);

  /* The full zspage to read from: one whose lock no source shares. */
  unsigned held = ZSPAGES;
  for (unsigned candidate = SOURCES + 1; candidate < ZSPAGES && held == ZSPAGES;
       candidate++) {
    bool shared = false;
    for (unsigned k = 1; k <= SOURCES; k++)
      shared |= lock_of_zspage (&layout, k) == lock_of_zspage (&layout, candidate);
    if (!shared)
      held = candidate;
  }
  assert_true (held < ZSPAGES);

  zs_handle_t kept[SOURCES];
  for (unsigned k = 1; k <= SOURCES; k++) {
    free_from (&layout, k, 1);
    kept[k - 1] = first_object (&layout, k);
  }
  struct zs_pool_stats before;
  zs_pool_stats (layout.pool, &before);
  /* SOURCES objects fit in this many zspages; the rest can go. */
  uint64_t expected = (SOURCES - (SOURCES + layout.per_zspage - 1)
                       / layout.per_zspage) * layout.class->pages_per_zspage;
  assert_int_equal (before.pages_freeable, expected);

  const uint8_t *read = zs_read_begin (layout.pool, first_object (&layout, held),
                                       NULL);
  atomic_bool stop = false;
  struct reader readers[2];
  for (unsigned r = 0; r < 2; r++) {
    readers[r] = (struct reader) {
      .layout = &layout, .handles = kept + r * SOURCES / 2,
      .count = SOURCES / 2, .stop = &stop,
    };
    assert_int_equal (pthread_create (&readers[r].thread, NULL, reader_main,
                                      &readers[r]), 0);
  }
  struct compactor compactor = { .pool = layout.pool };
  assert_int_equal (pthread_create (&compactor.thread, NULL, compactor_main,
                                    &compactor), 0);
  int joined = compactor_join (&compactor);
  /* Let a blocked mover finish before failing, so the test ends. */
  zs_read_end (layout.pool, first_object (&layout, held), read);
  if (joined != 0)
    pthread_join (compactor.thread, NULL);
  atomic_store (&stop, true);
  for (unsigned r = 0; r < 2; r++) {
    pthread_join (readers[r].thread, NULL);
    assert_false (atomic_load (&readers[r].corrupt));
    print_message ("reader %u: %" PRIu64 " reads\n", r,
                   (uint64_t) atomic_load (&readers[r].reads));
  }
  print_message ("compaction beside a held read: %s, %" PRIu64 " pages freed"
                 " (%" PRIu64 " freeable)\n",
                 joined == 0 ? "finished" : "blocked", compactor.freed, expected);
  assert_int_equal (joined, 0);
  assert_int_equal (compactor.freed, expected);

  struct zs_pool_stats after;
  zs_pool_stats (layout.pool, &after);
  assert_int_equal (after.pages_freeable, 0);
  assert_int_equal (after.pages_compacted, expected);
  assert_int_equal (after.pages_used, before.pages_used - expected);
  layout_destroy (&layout);
}

/* The mover pins its source and waits for the source's move lock, held
 * here through a read of another zspage that shares it.  Meanwhile the
 * source's last object is freed: the zspage must stay (pinned) until the
 * mover gets the lock, and then be released by the mover, once.
 */
static void
test_source_emptied_while_pinned (void **state)
{
  (void) state;
  struct layout layout;
  layout_create (&layout);

  /* Two zspages under one lock: there are more zspages than locks. */
  unsigned source = ZSPAGES, partner = ZSPAGES;
  for (unsigned a = 0; a < ZSPAGES && source == ZSPAGES; a++)
    for (unsigned b = a + 1; b < ZSPAGES && source == ZSPAGES; b++)
      if (lock_of_zspage (&layout, a) == lock_of_zspage (&layout, b)) {
        source = a;
        partner = b;
      }
  assert_true (source < ZSPAGES);
  unsigned spare = source > 0 ? 0 : partner == 1 ? 2 : 1;

  /* The source keeps 1 object and the spare per_zspage - 1: exactly one
   * zspage is freeable and the source, the sparsest, is the mover's.
   */
  free_from (&layout, source, 1);
  free_from (&layout, spare, layout.per_zspage - 1);
  struct zs_pool_stats before;
  zs_pool_stats (layout.pool, &before);
  assert_int_equal (before.pages_freeable, layout.class->pages_per_zspage);

  struct zspage *source_zspage = zspage_of (first_object (&layout, source));
  const uint8_t *read = zs_read_begin (layout.pool,
                                       first_object (&layout, partner), NULL);
  struct compactor compactor = { .pool = layout.pool };
  assert_int_equal (pthread_create (&compactor.thread, NULL, compactor_main,
                                    &compactor), 0);
  bool pinned = false;
  for (unsigned tries = 0; tries < 10000 && !pinned; tries++) {
    pthread_mutex_lock (layout.class->lock);
    pinned = source_zspage->pinned;
    pthread_mutex_unlock (layout.class->lock);
    if (!pinned) {
      struct timespec pause = { .tv_nsec = 1000000 };
      nanosleep (&pause, NULL);
    }
  }
  assert_true (pinned);

  /* Empty the pinned source: it stays, for the mover to release. */
  free_from (&layout, source, 0);
  struct zs_pool_stats emptied;
  zs_pool_stats (layout.pool, &emptied);
  assert_int_equal (emptied.pages_used, before.pages_used);
  assert_int_equal (emptied.objects, before.objects - 1);

  zs_read_end (layout.pool, first_object (&layout, partner), read);
  assert_int_equal (compactor_join (&compactor), 0);
  assert_int_equal (compactor.freed, layout.class->pages_per_zspage);

  struct zs_pool_stats after;
  zs_pool_stats (layout.pool, &after);
  assert_int_equal (after.pages_used,
                    before.pages_used - layout.class->pages_per_zspage);
  assert_int_equal (after.pages_freeable, 0);
  layout_destroy (&layout);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_compact_beside_readers),
    cmocka_unit_test (test_source_emptied_while_pinned),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
