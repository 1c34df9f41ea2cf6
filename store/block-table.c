/* The block table: see block-table.h (LIFETIME tells the protocol).  A
 * service at the bottom of the store: it calls only the allocator's
 * charges.
 */

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "block-table.h"

/* Inner nodes are arrays of child pointers. */
typedef _Atomic (void *) node_slot;

/* The mark reclaim leaves in every slot of an inner node it is freeing,
 * so that no child can be made under it meanwhile: a value no node's
 * address can be, and the same in every process (a table in a region
 * outlives the process that made it).
 */
#define SEALED ((void *) (uintptr_t) 1)

/* A leaf's used count, with LEAF_DEAD set once reclaim took it: it has
 * no entry and can get none.
 */
#define LEAF_DEAD 0x80000000u

struct block_leaf {
  _Atomic uint32_t used;      /* entries not empty, | LEAF_DEAD */
  struct block_entry entries[BLOCK_TABLE_FANOUT];
};

void
block_table_init (struct block_table *table, uint64_t blocks,
                  struct zs_pool *pool, struct region *region)
{
  unsigned bits = 0;
  while (bits < 64 && (blocks - 1) >> bits)
    bits++;
  table->inner_levels = bits > BLOCK_TABLE_BITS
    ? (bits - BLOCK_TABLE_BITS + BLOCK_TABLE_BITS - 1) / BLOCK_TABLE_BITS : 0;
  atomic_init (&table->root, NULL);
  atomic_init (&table->bytes, 0);
  atomic_init (&table->nodes_to_check, false);
  atomic_init (&table->keep_nodes, false);
  table->pool = pool;
  table->region = region;
  pthread_rwlock_init (&table->walk_lock, NULL);
}

void
block_table_take_over (struct block_table *table)
{
  pthread_rwlock_init (&table->walk_lock, NULL);
}

/* Level 0 is a leaf. */
static size_t
node_bytes (unsigned level)
{
  return level > 0 ? BLOCK_TABLE_FANOUT * sizeof (node_slot)
    : sizeof (struct block_leaf);
}

static void
node_release (struct block_table *table, void *node, unsigned level)
{
  region_memory_free (table->region, node);
  atomic_fetch_sub_explicit (&table->bytes, node_bytes (level),
                             memory_order_relaxed);
  if (table->pool)
    zs_pool_discharge (table->pool, node_bytes (level));
}

static void
node_free_all (struct block_table *table, void *node, unsigned level)
{
  if (!node || node == SEALED)
    return;
  if (level > 0) {
    node_slot *slots = node;
    for (unsigned i = 0; i < BLOCK_TABLE_FANOUT; i++)
      node_free_all (table, atomic_load_explicit (&slots[i], memory_order_relaxed),
                     level - 1);
  }
  node_release (table, node, level);
}

void
block_table_destroy (struct block_table *table)
{
  node_free_all (table, atomic_load (&table->root), table->inner_levels);
  atomic_store (&table->root, NULL);
  pthread_rwlock_destroy (&table->walk_lock);
}

/* The node in a slot (maybe SEALED), made (zero-filled) if the slot is
 * empty and create is set: NULL with errno ENOSPC when the pool's limit
 * refuses its memory, ENOMEM.
 */
static void *
slot_child (struct block_table *table, node_slot *slot, unsigned level,
            bool create)
{
  void *node = atomic_load_explicit (slot, memory_order_acquire);
  if (node || !create)
    return node;

  if (table->pool && zs_pool_charge (table->pool, node_bytes (level)) == -1)
    return NULL;
  void *fresh = region_memory_alloc (table->region, node_bytes (level),
                                     _Alignof (struct block_leaf));
  if (fresh)
    memset (fresh, 0, node_bytes (level));
  else {
    if (table->pool)
      zs_pool_discharge (table->pool, node_bytes (level));
    errno = ENOMEM;
    return NULL;
  }
  if (atomic_compare_exchange_strong_explicit (slot, &node, fresh,
                                               memory_order_acq_rel,
                                               memory_order_acquire)) {
    atomic_fetch_add_explicit (&table->bytes, node_bytes (level),
                               memory_order_relaxed);
    /* If what it was made for fails, it stays empty: let reclaim look. */
    atomic_store_explicit (&table->nodes_to_check, true, memory_order_relaxed);
    return fresh;
  }
  region_memory_free (table->region, fresh); /* another thread won (or
                                                sealed it) */
  if (table->pool)
    zs_pool_discharge (table->pool, node_bytes (level));
  return node;
}

static unsigned
slot_index (uint64_t block, unsigned level)
{
  return (block >> (level * BLOCK_TABLE_BITS)) & (BLOCK_TABLE_FANOUT - 1);
}

static bool
leaf_dead (struct block_leaf *leaf)
{
  return atomic_load_explicit (&leaf->used, memory_order_acquire) & LEAF_DEAD;
}

struct block_entry *
block_table_lookup (struct block_table *table, uint64_t block, bool create,
                    struct block_leaf **leaf)
{
  for (;;) {
    unsigned level = table->inner_levels;
    void *node = slot_child (table, &table->root, level, create);

    while (node && node != SEALED && level > 0) {
      node_slot *slots = node;
      node = slot_child (table, &slots[slot_index (block, level)], level - 1,
                         create);
      level--;
    }
    /* A node being reclaimed (a sealed slot, a dead leaf) holds nothing;
     * to make a leaf in its place, wait until reclaim has unlinked it,
     * which it does at once.
     */
    if (create && (node == SEALED || (node && leaf_dead (node)))) {
      sched_yield ();
      continue;
    }
    if (node == SEALED)
      node = NULL;
    *leaf = node;
    if (!node)
      return NULL;
    return &((struct block_leaf *) node)->entries[slot_index (block, 0)];
  }
}

bool
block_leaf_claim (struct block_leaf *leaf)
{
  uint32_t used = atomic_load_explicit (&leaf->used, memory_order_relaxed);
  do {
    if (used & LEAF_DEAD)
      return false;
  } while (!atomic_compare_exchange_weak_explicit (&leaf->used, &used, used + 1,
                                                   memory_order_acq_rel,
                                                   memory_order_relaxed));
  return true;
}

void
block_leaf_release (struct block_table *table, struct block_leaf *leaf)
{
  if (atomic_fetch_sub_explicit (&leaf->used, 1, memory_order_acq_rel) == 1)
    atomic_store_explicit (&table->nodes_to_check, true, memory_order_relaxed);
}

/* Depth-first search for the first leaf at or after *block under node,
 * which covers the blocks starting at base.
 */
static struct block_entry *
next_leaf_under (void *node, unsigned level, uint64_t base, uint64_t *block)
{
  if (level == 0) {
    *block = base;
    return ((struct block_leaf *) node)->entries;
  }

  node_slot *slots = node;
  unsigned shift = level * BLOCK_TABLE_BITS;
  unsigned first = *block > base ? (*block - base) >> shift : 0;
  for (unsigned i = first; i < BLOCK_TABLE_FANOUT; i++) {
    void *child = atomic_load_explicit (&slots[i], memory_order_acquire);
    if (!child || child == SEALED)
      continue;
    uint64_t child_base = base + ((uint64_t) i << shift);
    struct block_entry *leaf = next_leaf_under (child, level - 1, child_base,
                                                block);
    if (leaf)
      return leaf;
  }
  return NULL;
}

struct block_entry *
block_table_next_leaf (struct block_table *table, uint64_t *block)
{
  void *root = atomic_load_explicit (&table->root, memory_order_acquire);
  if (!root || root == SEALED)
    return NULL;
  /* Round down to the leaf holding *block. */
  uint64_t from = *block & ~(uint64_t) (BLOCK_TABLE_FANOUT - 1);
  uint64_t found = from;
  struct block_entry *leaf = next_leaf_under (root, table->inner_levels, 0,
                                              &found);
  if (leaf)
    *block = found;
  return leaf;
}

void
block_table_walk_begin (struct block_table *table)
{
  pthread_rwlock_rdlock (&table->walk_lock);
}

void
block_table_walk_end (struct block_table *table)
{
  pthread_rwlock_unlock (&table->walk_lock);
}

/* Nodes unlinked by a reclaim pass, freed after its grace period. */
struct unlinked {
  void *node;
  unsigned level;
};

struct reclaim {
  struct unlinked *list;
  size_t count, capacity;
};

/* Room to note one more unlinked node. */
static bool
reclaim_room (struct reclaim *r)
{
  if (r->count == r->capacity) {
    size_t capacity = r->capacity ? 2 * r->capacity : 64;
    struct unlinked *list = realloc (r->list, capacity * sizeof *list);
    if (!list)
      return false;
    r->list = list;
    r->capacity = capacity;
  }
  return true;
}

/* Unlink what is empty under the node in slot: leaves with no used entry
 * (marked dead first, so that no entry can be claimed in them), inner
 * nodes with no child (every slot sealed first, so that no child can be
 * made in them).  Returns true if slot is empty now.
 */
static bool
reclaim_under (struct reclaim *r, node_slot *slot, unsigned level)
{
  void *node = atomic_load_explicit (slot, memory_order_acquire);
  if (!node)
    return true;
  if (node == SEALED)
    return false;               /* not ours to touch */
  if (level > 0) {
    node_slot *slots = node;
    bool empty = true;
    for (unsigned i = 0; i < BLOCK_TABLE_FANOUT; i++)
      if (!reclaim_under (r, &slots[i], level - 1))
        empty = false;
    if (!empty)
      return false;
  }
  if (!reclaim_room (r))
    return false;               /* no memory to note it: keep it */

  if (level == 0) {
    uint32_t unused = 0;
    if (!atomic_compare_exchange_strong (&((struct block_leaf *) node)->used,
                                         &unused, LEAF_DEAD))
      return false;
  }
  else {
    node_slot *slots = node;
    unsigned sealed;
    for (sealed = 0; sealed < BLOCK_TABLE_FANOUT; sealed++) {
      void *expected = NULL;
      if (!atomic_compare_exchange_strong (&slots[sealed], &expected, SEALED))
        break;                  /* a child was just made */
    }
    if (sealed < BLOCK_TABLE_FANOUT) {
      while (sealed-- > 0)
        atomic_store (&slots[sealed], NULL);
      return false;
    }
  }
  r->list[r->count++] = (struct unlinked) { node, level };
  atomic_store_explicit (slot, NULL, memory_order_release);
  return true;
}

int
block_table_populate (struct block_table *table, uint64_t blocks,
                      block_table_lock_fn lock, block_table_lock_fn unlock,
                      void *opaque)
{
  atomic_store (&table->keep_nodes, true);
  for (uint64_t block = 0; block < blocks; block += BLOCK_TABLE_FANOUT) {
    struct block_leaf *leaf;
    lock (opaque, block);
    bool made = block_table_lookup (table, block, true, &leaf) != NULL;
    unlock (opaque, block);
    if (!made)
      return -1;
  }
  return 0;
}

void
block_table_reclaim (struct block_table *table, block_table_sweep_fn sweep,
                     void *opaque)
{
  if (atomic_load (&table->keep_nodes)
      || !atomic_exchange (&table->nodes_to_check, false))
    return;
  struct reclaim r = { NULL, 0, 0 };
  reclaim_under (&r, &table->root, table->inner_levels);
  if (r.count) {
    /* Grace period: a lookup that found a node before it was unlinked is
     * still using it only while it holds its block's stripe lock; once
     * every stripe has been taken once, none is.  Walkers hold walk_lock.
     */
    sweep (opaque);
    pthread_rwlock_wrlock (&table->walk_lock);
    pthread_rwlock_unlock (&table->walk_lock);
    for (size_t i = 0; i < r.count; i++)
      node_release (table, r.list[i].node, r.list[i].level);
  }
  free (r.list);
}

/* ---- after a crash ------------------------------------------------------ */

/* Recover the subtree in slot (see block_table_recover): its node claimed
 * in the region, its leaves' entries visited, empty leaves dropped
 * unless the table keeps its nodes.  Returns whether the slot still
 * holds a node.
 */
static bool
node_recover (struct block_table *table, node_slot *slot, unsigned level,
              uint64_t base, block_table_entry_fn visit, void *opaque)
{
  void *node = atomic_load_explicit (slot, memory_order_relaxed);
  if (node == SEALED
      || (node && !region_recover_claim (table->region, node,
                                         node_bytes (level),
                                         _Alignof (struct block_leaf))))
    node = NULL;                /* reclaim's mark, or nothing a node can be */
  bool keep = node != NULL;
  if (node && level > 0) {
    node_slot *slots = node;
    unsigned children = 0;
    for (unsigned i = 0; i < BLOCK_TABLE_FANOUT; i++)
      children += node_recover (table, &slots[i], level - 1,
                                base + ((uint64_t) i << (level * BLOCK_TABLE_BITS)),
                                visit, opaque);
    keep = children > 0 || atomic_load (&table->keep_nodes);
  }
  else if (node) {
    struct block_leaf *leaf = node;
    uint32_t used = 0;
    for (unsigned i = 0; i < BLOCK_TABLE_FANOUT; i++)
      used += visit (opaque, base + i, &leaf->entries[i]);
    atomic_store_explicit (&leaf->used, used, memory_order_relaxed);
    keep = used > 0 || atomic_load (&table->keep_nodes);
  }
  if (!keep) {
    /* Not claimed again: the region's recovery frees it. */
    if (node)
      region_free (table->region, node);
    node = NULL;
  }
  atomic_store_explicit (slot, node, memory_order_relaxed);
  if (node)
    atomic_fetch_add_explicit (&table->bytes, node_bytes (level),
                               memory_order_relaxed);
  return node != NULL;
}

void
block_table_recover (struct block_table *table, block_table_entry_fn visit,
                     void *opaque)
{
  pthread_rwlock_init (&table->walk_lock, NULL);
  atomic_store (&table->bytes, 0);
  atomic_store (&table->nodes_to_check, false);
  node_recover (table, (node_slot *) &table->root, table->inner_levels, 0,
                visit, opaque);
}
