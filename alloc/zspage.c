/* zspages: runs of pages holding the objects of one class, their free
 * slots, and the fullness groups they are filed under.
 * Everything here runs under the class lock, except zspage_create and
 * zspage_release, which must be called without it.
 */

#include <errno.h>
#include <stdlib.h>

#include "dlist.h"
#include "zsalloc-internal.h"

/* 0 = empty, 1..10 = up to 10 %, 20 %, ..., 90 %, 99 %, 11 = full. */
static unsigned
fullness_group (const struct size_class *class, unsigned inuse)
{
  if (inuse == 0)
    return 0;
  if (inuse == class->objs_per_zspage)
    return ZS_GROUP_FULL;
  /* Percent rounded up, so that 1 of 256 objects is in "10", not "empty",
   * and 255 of 256 in "99", not "full".
   */
  unsigned percent = (100 * inuse + class->objs_per_zspage - 1)
    / class->objs_per_zspage;
  return (percent + 9) / 10;
}

static void
group_link (struct size_class *class, struct zspage *zspage, unsigned group)
{
  zspage->group = group;
  DLIST_PUSH (class->groups[group], zspage, prev, next);
  class->group_counts[group]++;
  class->nonempty_groups |= 1u << group;
}

static void
group_unlink (struct size_class *class, struct zspage *zspage)
{
  unsigned group = zspage->group;

  DLIST_REMOVE (class->groups[group], zspage, prev, next);
  class->group_counts[group]--;
  if (!class->groups[group])
    class->nonempty_groups &= ~(1u << group);
}

static void
zspage_regroup (struct size_class *class, struct zspage *zspage)
{
  unsigned group = fullness_group (class, zspage->inuse);
  if (group != zspage->group) {
    group_unlink (class, zspage);
    group_link (class, zspage, group);
  }
}

/* Allocation fills the fullest zspage that still has room, so that
 * partly used zspages empty out and can be released.
 */
struct zspage *
class_fullest_zspage (struct size_class *class)
{
  uint32_t not_full = class->nonempty_groups & ((1u << ZS_GROUP_FULL) - 1);
  if (!not_full)
    return NULL;
  return class->groups[31 - __builtin_clz (not_full)];
}

/* The fullest zspage with room but except (compaction's destination). */
struct zspage *
class_fullest_zspage_except (struct size_class *class,
                             const struct zspage *except)
{
  uint32_t not_full = class->nonempty_groups & ((1u << ZS_GROUP_FULL) - 1);
  while (not_full) {
    unsigned group = 31 - __builtin_clz (not_full);
    for (struct zspage *zspage = class->groups[group]; zspage;
         zspage = zspage->next)
      if (zspage != except)
        return zspage;
    not_full &= ~(1u << group);
  }
  return NULL;
}

/* The emptiest zspage that holds objects (compaction's source). */
struct zspage *
class_sparsest_zspage (struct size_class *class)
{
  uint32_t used = class->nonempty_groups & ~1u;   /* not "empty" */
  if (!used)
    return NULL;
  return class->groups[__builtin_ctz (used)];
}

struct zspage *
zspage_create (struct zs_pool *pool, struct size_class *class)
{
  if (!metadata_take (pool, zspage_descriptor_bytes (class) + ZSPAGE_ALIGN))
    return NULL;
  struct zspage *zspage = region_memory_alloc (pool->config.region,
                                             zspage_descriptor_bytes (class),
                                             ZSPAGE_ALIGN);
  if (!zspage) {
    errno = ENOMEM;
    return NULL;
  }
  /* The cell keeps the descriptor's address in 44 bits. */
  if ((uintptr_t) zspage >> 48) {
    region_memory_free (pool->config.region, zspage);
    errno = ENOMEM;
    return NULL;
  }
  zspage->base = page_run_alloc (&pool->pages, class->pages_per_zspage,
                                 &zspage->chunk);
  if (!zspage->base) {
    region_memory_free (pool->config.region, zspage);
    return NULL;
  }
  zspage->inuse = 0;
  zspage->free_head = ZS_NO_OBJECT;
  zspage->never_used = 0;
  zspage->group = 0;
  zspage->pinned = false;
  for (unsigned i = 0; i < class->objs_per_zspage; i++)
    zspage->slot_cells[i] = NULL;
  atomic_fetch_add_explicit (&pool->metadata_bytes,
                             zspage_descriptor_bytes (class),
                             memory_order_relaxed);
  return zspage;
}

void
zspage_release (struct zs_pool *pool, struct size_class *class,
                struct zspage *zspage)
{
  page_run_free (&pool->pages, zspage->chunk, zspage->base);
  /* Out of transit and its bytes returned, in one step. */
  zspage_unreserve (pool, class);
  atomic_fetch_sub_explicit (&pool->metadata_bytes,
                             zspage_descriptor_bytes (class),
                             memory_order_relaxed);
  region_memory_free (pool->config.region, zspage);
}

void
zspage_insert (struct size_class *class, struct zspage *zspage)
{
  group_link (class, zspage, fullness_group (class, zspage->inuse));
  class->zspages++;
}

static inline uint16_t *
slot_link (struct size_class *class, struct zspage *zspage, unsigned index)
{
  return (uint16_t *) (zspage->base + (size_t) index * class->size);
}

unsigned
zspage_take_object (struct size_class *class, struct zspage *zspage)
{
  unsigned index;

  if (zspage->free_head != ZS_NO_OBJECT) {
    index = zspage->free_head;
    zspage->free_head = *slot_link (class, zspage, index);
  }
  else
    index = zspage->never_used++;
  zspage->inuse++;
  zspage_regroup (class, zspage);
  return index;
}

bool
zspage_put_object (struct size_class *class, struct zspage *zspage,
                   unsigned index)
{
  *slot_link (class, zspage, index) = zspage->free_head;
  zspage->free_head = index;
  zspage->inuse--;
  if (zspage->inuse == 0 && !zspage->pinned) {
    group_unlink (class, zspage);
    class->zspages--;
    return true;
  }
  /* A pinned zspage that empties stays listed for its mover to release. */
  zspage_regroup (class, zspage);
  return false;
}

/* The mover is done with its source: true when it is empty (it is then
 * unlinked: release it after unlocking).
 */
bool
zspage_unpin (struct size_class *class, struct zspage *zspage)
{
  zspage->pinned = false;
  if (zspage->inuse > 0)
    return false;
  group_unlink (class, zspage);
  class->zspages--;
  return true;
}

/* Pool destroy: the page source unmaps the pages wholesale, so only the
 * descriptors are freed here.
 */
void
class_destroy_zspages (struct zs_pool *pool, struct size_class *class)
{
  for (unsigned group = 0; group < ZS_FULLNESS_GROUPS; group++) {
    while (class->groups[group]) {
      struct zspage *zspage = class->groups[group];
      group_unlink (class, zspage);
      region_memory_free (pool->config.region, zspage);
    }
  }
  class->zspages = 0;
}
