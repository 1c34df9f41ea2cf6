/* Freeing objects: immediately, or through the pool's batches of deferred
 * frees drained one class-lock hold per run of same-class handles.
 * See FREES in zsalloc-internal.h.
 */

#include <stdlib.h>
#include <string.h>

#include "zsalloc-internal.h"

static inline unsigned
class_number (struct zs_pool *pool, zs_handle_t handle)
{
  return class_of_handle (pool, handle) - pool->classes;
}

/* Free the n handles of one class under one hold of its lock; release
 * the zspages that became empty after dropping it.
 */
static void
free_class_run (struct zs_pool *pool, struct size_class *class,
                const zs_handle_t *handles, unsigned n)
{
  struct zspage *empty[ZS_FREE_BATCH_SIZE];
  unsigned empties = 0;

  pthread_mutex_lock (class->lock);
  for (unsigned i = 0; i < n; i++) {
    struct zspage *zspage = object_free_locked (pool, class, handles[i]);
    if (zspage)
      empty[empties++] = zspage;
  }
  /* In transit until zspage_release has returned their pages. */
  if (empties)
    atomic_fetch_add (&pool->limit_account, empties * LIMIT_TRANSIT);
  pthread_mutex_unlock (class->lock);

  for (unsigned i = 0; i < empties; i++)
    zspage_release (pool, class, empty[i]);
}

/* Free up to ZS_FREE_BATCH_SIZE handles: counting sort by class, then one
 * lock hold per class.
 */
void
free_handles (struct zs_pool *pool, zs_handle_t *handles, unsigned n)
{
  if (n == 1) {
    free_class_run (pool, &pool->classes[class_number (pool, handles[0])],
                    handles, 1);
    return;
  }

  unsigned start[ZS_RAW_CLASSES + 1] = { 0 };
  uint8_t key[ZS_FREE_BATCH_SIZE];
  zs_handle_t sorted[ZS_FREE_BATCH_SIZE];

  for (unsigned i = 0; i < n; i++) {
    key[i] = class_number (pool, handles[i]);
    start[key[i] + 1]++;
  }
  for (unsigned c = 0; c < pool->distinct_classes; c++)
    start[c + 1] += start[c];
  /* Every index a key can hold (0..ZS_RAW_CLASSES - 1), not only the
   * distinct classes: the keys are below distinct_classes, but gcc
   * -fanalyzer cannot know that and saw fill[] read uninitialised.
   */
  unsigned fill[ZS_RAW_CLASSES];
  memcpy (fill, start, sizeof fill);
  for (unsigned i = 0; i < n; i++)
    sorted[fill[key[i]]++] = handles[i];

  for (unsigned c = 0; c < pool->distinct_classes; c++) {
    unsigned count = start[c + 1] - start[c];
    if (count)
      free_class_run (pool, &pool->classes[c], &sorted[start[c]], count);
  }
}

/* Drain a batch; its lock is held. */
static void
batch_drain (struct zs_pool *pool, struct free_batch *batch)
{
  if (batch->count) {
    free_handles (pool, batch->handles, batch->count);
    batch->count = 0;
  }
}

/* The batch this thread tries first, plus one (0: none chosen yet).  A
 * plain thread-local with no destructor, shared by every pool: it is
 * only a hint, and a thread's exit runs no allocator code.
 */
static __thread unsigned preferred_batch;
static _Atomic unsigned next_preferred_batch;

/* Lock one of the pool's batches: the preferred one if it is free, else
 * the next free one (which becomes the preferred), else wait for the
 * preferred one.
 */
static struct free_batch *
batch_lock (struct zs_pool *pool)
{
  if (!preferred_batch)
    preferred_batch = atomic_fetch_add_explicit (&next_preferred_batch, 1,
                                                 memory_order_relaxed)
      % ZS_FREE_BATCHES + 1;
  unsigned first = preferred_batch - 1;
  for (unsigned i = 0; i < ZS_FREE_BATCHES; i++) {
    unsigned n = (first + i) % ZS_FREE_BATCHES;
    if (pthread_mutex_trylock (&pool->batches[n].lock) == 0) {
      preferred_batch = n + 1;
      return &pool->batches[n];
    }
  }
  pthread_mutex_lock (&pool->batches[first].lock);
  return &pool->batches[first];
}

void
free_batch_add (struct zs_pool *pool, const zs_handle_t *handles, unsigned n)
{
  struct free_batch *batch = batch_lock (pool);
  for (unsigned i = 0; i < n; i++) {
    batch->handles[batch->count++] = handles[i];
    if (batch->count == ZS_FREE_BATCH_SIZE)
      batch_drain (pool, batch);
  }
  pthread_mutex_unlock (&batch->lock);
}

void
zs_pool_flush (struct zs_pool *pool)
{
  for (unsigned n = 0; n < ZS_FREE_BATCHES; n++) {
    struct free_batch *batch = &pool->batches[n];
    pthread_mutex_lock (&batch->lock);
    batch_drain (pool, batch);
    pthread_mutex_unlock (&batch->lock);
  }
  /* resident_only: the reserve's refill purges, and nothing else does
   * (RESIDENT ONLY in page-source.h): this may be a write.
   */
  if (!pool->pages.resident_only)
    page_source_purge (&pool->pages);
}

/* Deferred frees waiting in batches right now. */
uint64_t
free_batches_pending (struct zs_pool *pool)
{
  uint64_t pending = 0;

  for (unsigned n = 0; n < ZS_FREE_BATCHES; n++) {
    struct free_batch *batch = &pool->batches[n];
    pthread_mutex_lock (&batch->lock);
    pending += batch->count;
    pthread_mutex_unlock (&batch->lock);
  }
  return pending;
}

int
free_batches_init (struct zs_pool *pool)
{
  pool->batches = region_memory_alloc (pool->config.region,
                                     ZS_FREE_BATCHES * sizeof *pool->batches,
                                     _Alignof (struct free_batch));
  if (!pool->batches)
    return -1;
  for (unsigned n = 0; n < ZS_FREE_BATCHES; n++)
    pool->batches[n].count = 0;
  atomic_fetch_add (&pool->metadata_bytes,
                    ZS_FREE_BATCHES * sizeof *pool->batches);
  return 0;
}

/* Pool destroy: the objects in the batches go with their pages, so the
 * batches are discarded without draining.
 */
void
free_batches_destroy (struct zs_pool *pool)
{
  for (unsigned n = 0; n < ZS_FREE_BATCHES; n++)
    pthread_mutex_destroy (&pool->batches[n].lock);
  region_memory_free (pool->config.region, pool->batches);
}
