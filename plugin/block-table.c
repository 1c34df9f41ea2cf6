/* The block table: see block-table.h. */

#include <stdlib.h>

#include "block-table.h"

/* Inner nodes are arrays of child pointers; leaves arrays of entries. */
typedef _Atomic (void *) node_slot;

void
block_table_init (struct block_table *table, uint64_t blocks)
{
  unsigned bits = 0;
  while (bits < 64 && (blocks - 1) >> bits)
    bits++;
  table->inner_levels = bits > BLOCK_TABLE_BITS
    ? (bits - BLOCK_TABLE_BITS + BLOCK_TABLE_BITS - 1) / BLOCK_TABLE_BITS : 0;
  atomic_init (&table->root, NULL);
  atomic_init (&table->bytes, 0);
}

static void
node_free (void *node, unsigned level)
{
  if (!node)
    return;
  if (level > 0) {
    node_slot *slots = node;
    for (unsigned i = 0; i < BLOCK_TABLE_FANOUT; i++)
      node_free (atomic_load_explicit (&slots[i], memory_order_relaxed),
                 level - 1);
  }
  free (node);
}

void
block_table_destroy (struct block_table *table)
{
  node_free (atomic_load (&table->root), table->inner_levels);
  atomic_store (&table->root, NULL);
  atomic_store (&table->bytes, 0);
}

/* Level 0 is a leaf. */
static size_t
node_bytes (unsigned level)
{
  return level > 0 ? BLOCK_TABLE_FANOUT * sizeof (node_slot)
    : BLOCK_TABLE_FANOUT * sizeof (struct block_entry);
}

/* The node in a slot, made (zero-filled) if absent and create is set. */
static void *
slot_child (struct block_table *table, node_slot *slot, unsigned level,
            bool create)
{
  void *node = atomic_load_explicit (slot, memory_order_acquire);
  if (node || !create)
    return node;

  void *fresh = calloc (1, node_bytes (level));
  if (!fresh)
    return NULL;
  if (atomic_compare_exchange_strong_explicit (slot, &node, fresh,
                                               memory_order_acq_rel,
                                               memory_order_acquire)) {
    atomic_fetch_add_explicit (&table->bytes, node_bytes (level),
                               memory_order_relaxed);
    return fresh;
  }
  free (fresh);                 /* another thread won; node is theirs */
  return node;
}

static unsigned
slot_index (uint64_t block, unsigned level)
{
  return (block >> (level * BLOCK_TABLE_BITS)) & (BLOCK_TABLE_FANOUT - 1);
}

struct block_entry *
block_table_lookup (struct block_table *table, uint64_t block, bool create)
{
  unsigned level = table->inner_levels;
  void *node = slot_child (table, &table->root, level, create);

  while (node && level > 0) {
    node_slot *slots = node;
    node = slot_child (table, &slots[slot_index (block, level)], level - 1,
                       create);
    level--;
  }
  if (!node)
    return NULL;
  return &((struct block_entry *) node)[slot_index (block, 0)];
}

/* Depth-first search for the first leaf at or after *block under node,
 * which covers the blocks starting at base.
 */
static struct block_entry *
next_leaf_under (void *node, unsigned level, uint64_t base, uint64_t *block)
{
  if (level == 0) {
    *block = base;
    return node;
  }

  node_slot *slots = node;
  unsigned shift = level * BLOCK_TABLE_BITS;
  unsigned first = *block > base ? (*block - base) >> shift : 0;
  for (unsigned i = first; i < BLOCK_TABLE_FANOUT; i++) {
    void *child = atomic_load_explicit (&slots[i], memory_order_acquire);
    if (!child)
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
  if (!root)
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
