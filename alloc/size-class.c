/* Size classes: slot sizes, zspage lengths, and the merging of classes
 * that would lay out their zspages identically.  See zsalloc-internal.h.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "zsalloc-internal.h"

/* The zspage length in 1..chain pages that wastes the least tail space
 * for this slot size; ties go to the shorter zspage.
 */
static unsigned
pages_for_least_waste (unsigned size, unsigned chain)
{
  unsigned best_pages = 1;
  unsigned best_waste = ZS_PAGE_SIZE % size;

  for (unsigned pages = 2; pages <= chain && best_waste > 0; pages++) {
    unsigned waste = (pages * ZS_PAGE_SIZE) % size;
    if (waste < best_waste) {
      best_waste = waste;
      best_pages = pages;
    }
  }
  return best_pages;
}

int
size_classes_init (struct zs_pool *pool)
{
  unsigned pages[ZS_RAW_CLASSES], objs[ZS_RAW_CLASSES];
  bool starts_class[ZS_RAW_CLASSES]; /* largest raw index of its class */
  unsigned distinct = 0;

  for (unsigned i = 0; i < ZS_RAW_CLASSES; i++) {
    unsigned size = (i + 1) * ZS_SIZE_CLASS_DELTA;
    pages[i] = pages_for_least_waste (size, pool->config.chain_pages);
    objs[i] = pages[i] * ZS_PAGE_SIZE / size;
  }
  for (unsigned i = ZS_RAW_CLASSES; i-- > 0;) {
    starts_class[i] = i == ZS_RAW_CLASSES - 1
      || pages[i] != pages[i + 1] || objs[i] != objs[i + 1];
    distinct += starts_class[i];
  }

  pool->classes = region_memory_alloc (pool->config.region,
                                     distinct * sizeof *pool->classes, 64);
  if (!pool->classes) {
    errno = ENOMEM;
    return -1;
  }
  memset (pool->classes, 0, distinct * sizeof *pool->classes);
  pool->distinct_classes = distinct;
  atomic_fetch_add (&pool->metadata_bytes, distinct * sizeof *pool->classes);

  /* Walk from the largest size down, filling distinct classes from the
   * end of the array so that it ends up in increasing size.
   */
  struct size_class *class = NULL;
  unsigned next = distinct;
  for (unsigned i = ZS_RAW_CLASSES; i-- > 0;) {
    /* The largest raw class always starts one (starts_class[] above), so
     * class is set from the first round on; "class == NULL" says so to
     * gcc -fanalyzer, which does not follow starts_class[] that far.
     */
    if (class == NULL || starts_class[i]) {
      class = &pool->classes[--next];
      class->size = (i + 1) * ZS_SIZE_CLASS_DELTA;
      class->index = i;
      class->pages_per_zspage = pages[i];
      class->objs_per_zspage = objs[i];
      class->lock = pool->config.lock_mode == ZS_LOCK_POOL
        ? &pool->pool_lock : &class->own_lock;
    }
    class->min_size = i * ZS_SIZE_CLASS_DELTA + 1;
    pool->class_by_index[i] = class;
  }

  pool->huge_class_size = pool->class_by_index[ZS_RAW_CLASSES - 1]->min_size;
  return 0;
}

void
size_classes_destroy (struct zs_pool *pool)
{
  for (unsigned c = 0; c < pool->distinct_classes; c++)
    pthread_mutex_destroy (&pool->classes[c].own_lock);
  region_memory_free (pool->config.region, pool->classes);
}
