/* The block table: one 16-byte entry per written 4 KiB block, in a radix
 * tree whose nodes exist only where blocks were written, so a 2^63-1 byte
 * device costs nothing until used (design-hazards.md #9).
 *
 * Leaves hold BLOCK_TABLE_FANOUT entries (8 KiB, covering 2 MiB of the
 * device); inner nodes hold BLOCK_TABLE_FANOUT child pointers.  The depth
 * is fixed at creation from the device size.  Nodes are published with a
 * compare-and-swap and never freed before the table is, so lookups take
 * no lock.  Entries themselves are guarded by the block store's stripe
 * locks (block-store.h); a leaf that empties again stays allocated
 * (0.4 % of the range it once covered).
 */

#ifndef ZRAM_BLOCK_TABLE_H
#define ZRAM_BLOCK_TABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define BLOCK_TABLE_BITS 9
#define BLOCK_TABLE_FANOUT (1u << BLOCK_TABLE_BITS)

enum block_kind {
  BLOCK_EMPTY = 0,      /* never written or trimmed: reads as zeros */
  BLOCK_SAME,           /* value: the 8-byte word repeated 512 times */
  BLOCK_COMPRESSED,     /* value: zsalloc handle of the compressed bytes */
  BLOCK_RAW,            /* value: zsalloc handle of the 4096 raw bytes */
  BLOCK_COMPRESSED_PADDED, /* value: zsalloc handle of an object larger
                              than the compressed bytes at its start: a
                              block rewritten in place (block-store.c) */
};

struct block_entry {
  _Atomic uint64_t value;
  _Atomic uint32_t kind;      /* enum block_kind */
  /* A range of a block that holds data (an object or a fill word) which
   * reads as zeros whatever the data says: first << 16 | end, 0 for none.
   * How a partial zero is stored when the block's new encoding needs
   * memory that the limit refuses (block-store.c).  Guarded by the stripe
   * lock (atomic, as kind and value, only for the lockless extents walk).
   */
  _Atomic uint32_t zeroed;
};

struct block_table {
  unsigned inner_levels;      /* levels above the leaves */
  _Atomic (void *) root;
  _Atomic uint64_t bytes;     /* memory held by nodes */
};

extern void block_table_init (struct block_table *table, uint64_t blocks);
/* Free every node; the caller frees what the entries point to first. */
extern void block_table_destroy (struct block_table *table);

/* The entry of a block, or NULL if its leaf does not exist.  With create,
 * the leaf is made if needed; NULL then means out of memory.
 */
extern struct block_entry *block_table_lookup (struct block_table *table,
                                               uint64_t block, bool create);

/* The first existing leaf covering a block >= *block: returns the leaf's
 * entries and sets *block to the leaf's first block; NULL when none.
 */
extern struct block_entry *block_table_next_leaf (struct block_table *table,
                                                  uint64_t *block);

#endif /* ZRAM_BLOCK_TABLE_H */
