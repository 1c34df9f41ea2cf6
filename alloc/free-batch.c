/* Freeing objects: immediately, or through per-thread batches of deferred
 * frees drained one class-lock hold per run of same-class handles.
 * See FREES in zsalloc-internal.h.
 */

#include <stdlib.h>

#include "dlist.h"
#include "zsalloc-internal.h"

static inline unsigned
class_number (struct zs_pool *pool, zs_handle_t handle)
{
  /* The size bits of a cell never change while the object lives, so
   * they can be read without the class lock.
   */
  size_t size = cell_object_size (handle_load (handle));
  return class_for_size (pool, size) - pool->classes;
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
    struct zspage *zspage = object_free_locked (class, handles[i]);
    if (zspage)
      empty[empties++] = zspage;
  }
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
  unsigned fill[ZS_RAW_CLASSES];
  for (unsigned c = 0; c < pool->distinct_classes; c++)
    fill[c] = start[c];
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

static void
batch_free (struct zs_pool *pool, struct free_batch *batch)
{
  pthread_mutex_destroy (&batch->lock);
  atomic_fetch_sub (&pool->metadata_bytes, sizeof *batch);
  free (batch);
}

/* pthread key destructor: a thread exits, its pending frees drain. */
static void
batch_thread_exit (void *arg)
{
  struct free_batch *batch = arg;
  struct zs_pool *pool = batch->pool;

  pthread_mutex_lock (&pool->batch_registry_lock);
  pthread_mutex_lock (&batch->lock);
  batch_drain (pool, batch);
  pthread_mutex_unlock (&batch->lock);
  DLIST_REMOVE (pool->batches, batch, prev, next);
  pthread_mutex_unlock (&pool->batch_registry_lock);
  batch_free (pool, batch);
}

static struct free_batch *
batch_register (struct zs_pool *pool)
{
  struct free_batch *batch = malloc (sizeof *batch);
  if (!batch)
    return NULL;
  pthread_mutex_init (&batch->lock, NULL);
  batch->pool = pool;
  batch->count = 0;
  if (pthread_setspecific (pool->batch_key, batch) != 0) {
    pthread_mutex_destroy (&batch->lock);
    free (batch);
    return NULL;
  }
  atomic_fetch_add (&pool->metadata_bytes, sizeof *batch);

  pthread_mutex_lock (&pool->batch_registry_lock);
  DLIST_PUSH (pool->batches, batch, prev, next);
  pthread_mutex_unlock (&pool->batch_registry_lock);
  return batch;
}

void
free_batch_add (struct zs_pool *pool, zs_handle_t handle)
{
  struct free_batch *batch = pthread_getspecific (pool->batch_key);

  if (!batch && !(batch = batch_register (pool))) {
    /* No memory for a batch: free at once rather than fail. */
    free_handles (pool, &handle, 1);
    return;
  }
  pthread_mutex_lock (&batch->lock);
  batch->handles[batch->count++] = handle;
  if (batch->count == ZS_FREE_BATCH_SIZE)
    batch_drain (pool, batch);
  pthread_mutex_unlock (&batch->lock);
}

void
zs_pool_flush (struct zs_pool *pool)
{
  pthread_mutex_lock (&pool->batch_registry_lock);
  for (struct free_batch *batch = pool->batches; batch; batch = batch->next) {
    pthread_mutex_lock (&batch->lock);
    batch_drain (pool, batch);
    pthread_mutex_unlock (&batch->lock);
  }
  pthread_mutex_unlock (&pool->batch_registry_lock);
  page_source_purge (&pool->pages);
}

/* Deferred frees waiting in batches right now. */
uint64_t
free_batches_pending (struct zs_pool *pool)
{
  uint64_t pending = 0;

  pthread_mutex_lock (&pool->batch_registry_lock);
  for (struct free_batch *batch = pool->batches; batch; batch = batch->next) {
    pthread_mutex_lock (&batch->lock);
    pending += batch->count;
    pthread_mutex_unlock (&batch->lock);
  }
  pthread_mutex_unlock (&pool->batch_registry_lock);
  return pending;
}

int
free_batches_init (struct zs_pool *pool)
{
  if (pthread_key_create (&pool->batch_key, batch_thread_exit) != 0)
    return -1;
  pthread_mutex_init (&pool->batch_registry_lock, NULL);
  pool->batches = NULL;
  return 0;
}

/* Pool destroy: the objects in the batches go with their pages, so the
 * batches are discarded without draining.  Deleting the key first means
 * no thread's exit destructor can touch them afterwards.
 */
void
free_batches_destroy (struct zs_pool *pool)
{
  pthread_key_delete (pool->batch_key);
  while (pool->batches) {
    struct free_batch *batch = pool->batches;
    DLIST_REMOVE (pool->batches, batch, prev, next);
    batch_free (pool, batch);
  }
  pthread_mutex_destroy (&pool->batch_registry_lock);
}
