/* Compaction: move live objects out of a class's sparsest zspages into
 * its fullest ones, so that emptied zspages give their pages back.  See
 * MOVING OBJECTS in zsalloc-internal.h for the protocol.
 */

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
 * first.  Class lock and migrate lock (write) held; the class has room
 * for them (class_freeable_zspages > 0).  Returns true when src emptied
 * (it is then unlisted and in transit: release it after unlocking).
 */
static bool
zspage_evacuate (struct size_class *class, struct zspage *src)
{
  for (unsigned i = 0; i < src->never_used; i++) {
    _Atomic uint64_t *cell = src->slot_cells[i];
    if (!cell)
      continue;
    struct zspage *dst = class_fullest_zspage_except (class, src);
    if (!dst)
      return false;
    uint64_t location = atomic_load_explicit (cell, memory_order_relaxed);
    size_t size = cell_object_size (location);
    unsigned index = zspage_take_object (class, dst);
    memcpy (dst->base + (size_t) index * class->size,
            src->base + (size_t) i * class->size, size);
    dst->slot_cells[index] = cell;
    atomic_store_explicit (cell, cell_encode (dst, index, size),
                           memory_order_release);
    src->slot_cells[i] = NULL;
    if (zspage_put_object (class, src, i))
      return true;
  }
  return false;
}

/* Compact one class, one source zspage at a time, so that readers of
 * the class wait for one zspage's moves at most.  Returns pages freed.
 */
static uint64_t
class_compact (struct zs_pool *pool, struct size_class *class)
{
  uint64_t freed = 0;

  for (;;) {
    struct zspage *emptied = NULL;
    pthread_rwlock_wrlock (&class->migrate_lock);
    pthread_mutex_lock (class->lock);
    struct zspage *src = class_freeable_zspages (class)
      ? class_sparsest_zspage (class) : NULL;
    if (src && zspage_evacuate (class, src)) {
      emptied = src;
      /* In transit until zspage_release has returned its pages. */
      atomic_fetch_add (&pool->limit_account, LIMIT_TRANSIT);
    }
    pthread_mutex_unlock (class->lock);
    pthread_rwlock_unlock (&class->migrate_lock);
    if (!emptied)
      return freed;
    zspage_release (pool, class, emptied);
    freed += class->pages_per_zspage;
  }
}

uint64_t
zs_compact (struct zs_pool *pool)
{
  uint64_t freed = 0;

  for (unsigned c = 0; c < pool->distinct_classes; c++)
    freed += class_compact (pool, &pool->classes[c]);
  atomic_fetch_add (&pool->pages_compacted, freed);
  return freed;
}
