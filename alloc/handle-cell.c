/* Handle cells: the 8-byte words a handle points to, each holding its
 * object's current location (see HANDLES in zsalloc-internal.h).
 *
 * Each class owns its cells, so they are allocated and freed under the
 * class lock that the caller already holds for the object: no extra lock.
 * Cells are carved from 4 KiB blocks; a free cell holds the address of the
 * next free cell.  Blocks are kept until the pool is destroyed, so each
 * class keeps 8 bytes per object of its own high-water mark: the sum of
 * every class's peak, which is more than the pool's peak when objects
 * move between classes (issue 7 makes cells shrink).
 */

#include <errno.h>
#include <stdlib.h>

#include "zsalloc-internal.h"

#define CELLS_PER_BLOCK (ZS_PAGE_SIZE / sizeof (uint64_t) - 1)

struct cell_block {
  struct cell_block *next;
  _Atomic uint64_t cells[CELLS_PER_BLOCK];
};

_Atomic uint64_t *
cell_alloc (struct zs_pool *pool, struct size_class *class)
{
  if (!class->free_cells) {
    struct cell_block *block = malloc (sizeof *block);
    if (!block) {
      errno = ENOMEM;
      return NULL;
    }
    block->next = class->cell_blocks;
    class->cell_blocks = block;
    class->cell_blocks_count++;
    atomic_fetch_add_explicit (&pool->metadata_bytes, sizeof *block,
                               memory_order_relaxed);
    for (size_t i = CELLS_PER_BLOCK; i-- > 0;)
      cell_release (class, &block->cells[i]);
  }

  _Atomic uint64_t *cell = class->free_cells;
  class->free_cells = (_Atomic uint64_t *) (uintptr_t)
    atomic_load_explicit (cell, memory_order_relaxed);
  return cell;
}

void
cell_release (struct size_class *class, _Atomic uint64_t *cell)
{
  atomic_store_explicit (cell, (uint64_t) (uintptr_t) class->free_cells,
                         memory_order_relaxed);
  class->free_cells = cell;
}

void
cells_destroy (struct size_class *class)
{
  while (class->cell_blocks) {
    struct cell_block *block = class->cell_blocks;
    class->cell_blocks = block->next;
    free (block);
  }
  class->free_cells = NULL;
}
