/* Handle cells: the 8-byte words a handle points to, each holding its
 * object's current location (see HANDLES in zsalloc-internal.h).
 *
 * Each class owns its cells, so they are allocated and freed under the
 * class lock that the caller already holds for the object: no extra lock.
 * Cells are carved from blocks of CELL_BLOCK_BYTES aligned to their size
 * (zsalloc-internal.h says why that size), so a cell finds its block by
 * masking its address.  Each block threads a list through
 * its free cells and counts them; the class lists the blocks that have a
 * free cell.  A block whose cells are all free again is given back (but
 * the class keeps one, if it has no other block with room, so that a
 * class that frees and allocates one object in turn does not allocate a
 * block each time).  So the cells' memory follows the objects, not the
 * high-water mark of each class, and every block counts against the
 * pool's memory limit (MEMORY LIMIT in zsalloc-internal.h).
 */

#include <errno.h>
#include <stdlib.h>

#include "dlist.h"
#include "zsalloc-internal.h"


static void
block_push_free (struct cell_block *block, _Atomic uint64_t *cell)
{
  atomic_store_explicit (cell, (uint64_t) (uintptr_t) block->free_cells,
                         memory_order_relaxed);
  block->free_cells = cell;
  block->free_count++;
}

/* A new block, every cell free, on the class's lists; NULL with errno. */
static struct cell_block *
block_new (struct zs_pool *pool, struct size_class *class)
{
  if (!limit_charge_metadata (pool, CELL_BLOCK_BYTES)) {
    errno = ENOSPC;
    return NULL;
  }
  if (!metadata_take (pool, 2 * CELL_BLOCK_BYTES)) {
    limit_discharge_metadata (pool, CELL_BLOCK_BYTES);
    return NULL;
  }
  struct cell_block *block = region_memory_alloc (pool->config.region,
                                                  CELL_BLOCK_BYTES,
                                                  CELL_BLOCK_BYTES);
  if (!block) {
    limit_discharge_metadata (pool, CELL_BLOCK_BYTES);
    errno = ENOMEM;
    return NULL;
  }
  block->free_cells = NULL;
  block->free_count = 0;
  for (size_t i = CELLS_PER_BLOCK; i-- > 0;)
    block_push_free (block, &block->cells[i]);
  DLIST_PUSH (class->cell_blocks_with_room, block, prev, next);
  DLIST_PUSH (class->cell_blocks, block, all_prev, all_next);
  class->cell_blocks_count++;
  atomic_fetch_add_explicit (&pool->metadata_bytes, CELL_BLOCK_BYTES,
                             memory_order_relaxed);
  return block;
}

_Atomic uint64_t *
cell_alloc (struct zs_pool *pool, struct size_class *class)
{
  struct cell_block *block = class->cell_blocks_with_room;
  if (!block && !(block = block_new (pool, class)))
    return NULL;

  _Atomic uint64_t *cell = block->free_cells;
  block->free_cells = (_Atomic uint64_t *) (uintptr_t)
    atomic_load_explicit (cell, memory_order_relaxed);
  if (--block->free_count == 0)
    DLIST_REMOVE (class->cell_blocks_with_room, block, prev, next);
  return cell;
}

void
cell_release (struct zs_pool *pool, struct size_class *class,
              _Atomic uint64_t *cell)
{
  struct cell_block *block = block_of (cell);

  block_push_free (block, cell);
  if (block->free_count == 1)
    DLIST_PUSH (class->cell_blocks_with_room, block, prev, next);
  else if (block->free_count == CELLS_PER_BLOCK
           && (block->prev || block->next)) {
    /* All free, and the class has another block with room: give it back. */
    DLIST_REMOVE (class->cell_blocks_with_room, block, prev, next);
    DLIST_REMOVE (class->cell_blocks, block, all_prev, all_next);
    class->cell_blocks_count--;
    region_memory_free (pool->config.region, block);
    atomic_fetch_sub_explicit (&pool->metadata_bytes, CELL_BLOCK_BYTES,
                               memory_order_relaxed);
    limit_discharge_metadata (pool, CELL_BLOCK_BYTES);
  }
}

/* Pool destroy: the limit account goes with the pool. */
void
cells_destroy (struct zs_pool *pool, struct size_class *class)
{
  while (class->cell_blocks) {
    struct cell_block *block = class->cell_blocks;
    DLIST_REMOVE (class->cell_blocks, block, all_prev, all_next);
    region_memory_free (pool->config.region, block);
  }
  class->cell_blocks_with_room = NULL;
  class->cell_blocks_count = 0;
}
