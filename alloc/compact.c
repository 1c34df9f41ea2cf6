/* Compaction: move live objects out of a class's sparsest zspages into
 * its fullest ones, so that emptied zspages give their pages back.  See
 * MOVING OBJECTS in zsalloc-internal.h for the protocol.
 */

#include <stdlib.h>
#include <string.h>

#include "zsalloc-internal.h"

/* zspages the class could do without: all minus those its live objects
 * need at the least.
 */
uint64_t
class_freeable_zspages (const struct size_class *class)
{
  uint64_t needed = (class->objs_used + class->objs_per_zspage - 1)
    / class->objs_per_zspage;
  return class->zspages > needed ? class->zspages - needed : 0;
}

/* Move every live object of src into the class's other zspages, fullest
 * first.  Class lock and src's move lock (write) held; the class has
 * room for them (class_freeable_zspages > 0).
 */
static void
zspage_evacuate (struct size_class *class, struct zspage *src)
{
  for (unsigned i = 0; i < src->never_used && src->inuse > 0; i++) {
    _Atomic uint64_t *cell = src->slot_cells[i];
    if (!cell)
      continue;
    struct zspage *dst = class_fullest_zspage_except (class, src);
    if (!dst)
      return;
    uint64_t location = atomic_load_explicit (cell, memory_order_relaxed);
    size_t size = cell_object_size (location);
    unsigned index = zspage_take_object (class, dst);
    memcpy (dst->base + (size_t) index * class->size,
            src->base + (size_t) i * class->size, size);
    dst->slot_cells[index] = cell;
    atomic_store_explicit (cell, cell_encode (dst, index, size),
                           memory_order_release);
    src->slot_cells[i] = NULL;
    zspage_put_object (class, src, i);   /* pinned: stays listed */
  }
}

/* Compact one class, one source zspage at a time, so that an access
 * waits for one zspage's moves at most.  compact_lock held.  Returns
 * pages freed.
 */
static uint64_t
class_compact (struct zs_pool *pool, struct size_class *class)
{
  uint64_t freed = 0;

  for (;;) {
    pthread_mutex_lock (class->lock);
    struct zspage *src = class_freeable_zspages (class)
      ? class_sparsest_zspage (class) : NULL;
    if (!src) {
      pthread_mutex_unlock (class->lock);
      return freed;
    }
    /* Pinned, src stays a live descriptor while no lock is held. */
    src->pinned = true;
    pthread_mutex_unlock (class->lock);

    pthread_rwlock_t *move_lock = zspage_move_lock (pool, src);
    pthread_rwlock_wrlock (move_lock);
    pthread_mutex_lock (class->lock);
    if (class_freeable_zspages (class))
      zspage_evacuate (class, src);
    bool emptied = zspage_unpin (class, src);
    /* In transit until zspage_release has returned its pages. */
    if (emptied)
      atomic_fetch_add (&pool->limit_account, LIMIT_TRANSIT);
    pthread_mutex_unlock (class->lock);
    pthread_rwlock_unlock (move_lock);
    if (!emptied)
      return freed;
    zspage_release (pool, class, src);
    freed += class->pages_per_zspage;
  }
}

uint64_t
zs_compact (struct zs_pool *pool)
{
  uint64_t freed = 0;

  pthread_mutex_lock (&pool->compact_lock);
  for (unsigned c = 0; c < pool->distinct_classes; c++)
    freed += class_compact (pool, &pool->classes[c]);
  pthread_mutex_unlock (&pool->compact_lock);
  atomic_fetch_add (&pool->pages_compacted, freed);
  return freed;
}

int
move_locks_init (struct zs_pool *pool)
{
  pool->move_locks = region_memory_alloc (pool->config.region,
                                        ZS_MOVE_LOCKS * sizeof *pool->move_locks,
                                        _Alignof (struct move_lock));
  if (!pool->move_locks)
    return -1;
  atomic_fetch_add (&pool->metadata_bytes,
                    ZS_MOVE_LOCKS * sizeof *pool->move_locks);
  return 0;
}

void
move_locks_destroy (struct zs_pool *pool)
{
  for (unsigned i = 0; i < ZS_MOVE_LOCKS; i++)
    pthread_rwlock_destroy (&pool->move_locks[i].lock);
  pthread_mutex_destroy (&pool->compact_lock);
  region_memory_free (pool->config.region, pool->move_locks);
}
