/* The block table: one 16-byte entry per written 4 KiB block, in a radix
 * tree whose nodes exist only where blocks are stored, so a 2^63-1 byte
 * device costs nothing until used (a flat array would cost 16 bytes per
 * 4 KiB of the device's size up front).
 *
 * Leaves hold BLOCK_TABLE_FANOUT entries (8 KiB, covering 2 MiB of the
 * device) and count the entries that are not empty; inner nodes hold
 * BLOCK_TABLE_FANOUT child pointers.  The depth is fixed at creation from
 * the device size.  Nodes are published with a compare-and-swap; every
 * node's memory is charged to the pool's limit (zs_pool_charge), so
 * mem_limit bounds the table too.
 *
 * LIFETIME.  Entries are guarded by the block store's stripe locks
 * (block-store.h), and so is the use of a node: a lookup, and every use
 * of the entry it returns, happens with the block's stripe lock held.
 * block_table_reclaim (the housekeeper) frees leaves that hold no entry
 * and inner nodes that hold no child, without taking stripe locks:
 *   1. it marks an empty leaf dead (its used count 0 -> LEAF_DEAD, one
 *      compare-and-swap), after which no entry can be claimed in it
 *      (block_leaf_claim fails; the caller looks up again and gets a new
 *      leaf), and seals every slot of a childless inner node (NULL ->
 *      SEALED), after which no child can be made in it;
 *   2. it unlinks them (their parent slot -> NULL); lookups that come
 *      later make new ones where needed;
 *   3. grace period: it takes and drops every stripe lock, one at a time,
 *      so every lookup that may still hold an unlinked node has ended,
 *      and takes walk_lock for writing, so every walker (extents, which
 *      hold no stripe lock but walk_lock for reading) has ended;
 *   4. it frees them.
 * A dead leaf or a sealed slot found by a lookup reads as a hole.  The
 * locks and their order are in block-store.h.
 */

#ifndef ZRAM_BLOCK_TABLE_H
#define ZRAM_BLOCK_TABLE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "region.h"
#include "zsalloc.h"

#define BLOCK_TABLE_BITS 9
#define BLOCK_TABLE_FANOUT (1u << BLOCK_TABLE_BITS)

enum block_kind {
  BLOCK_EMPTY = 0,      /* never written or trimmed: reads as zeros */
  BLOCK_SAME,           /* value: the 8-byte word repeated 512 times */
  BLOCK_COMPRESSED,     /* value: zsalloc handle of the compressed bytes */
  BLOCK_RAW,            /* value: zsalloc handle of the 4096 raw bytes */
  BLOCK_COMPRESSED_PADDED, /* value: zsalloc handle of an object larger
                              than the compressed bytes at its start: a
                              block rewritten in place (block-request.c) */
  BLOCK_PACKED,         /* value: a packed unit's address | the block's
                           index in it (cold packing, pack.c) */
  BLOCK_BACKED,         /* value: where the block is in the backing store,
                           (offset / 512) << 13 | (length - 1); length
                           4096: stored raw (writeback.c) */
};

/* The state word of a block, one 64-bit atomic:
 *   bits  0..2   kind (enum block_kind)
 *   bit   3      BLOCK_MOVE_HELD: a mover holds a claim (block-store.h,
 *                MOVING A BLOCK)
 *   bits  4..7   flags, BLOCK_FLAG_* (zram's block_state letters below)
 *   bit   8      BLOCK_MOVE_INTACT: nothing stored since the claim
 *   bits  9..33  zeroed: a range of the block that reads as zeros
 *                whatever its data says, first << 13 | end (0: none).
 *                How a partial zero is stored when the block's new
 *                encoding needs memory that the limit refuses.
 *   bits 34..63  last access, seconds since the store was created: 2^30 s
 *                is 34 years, so ages are right for any uptime (it
 *                saturates after).
 */
#define BLOCK_KIND_MASK 0x7u
#define BLOCK_MOVE_HELD 0x8u
#define BLOCK_FLAG_IDLE 0x10u   /* [i] not accessed since marked idle */
#define BLOCK_FLAG_INCOMPRESSIBLE 0x20u /* [n] no recompression shrank it */
#define BLOCK_PRIORITY_SHIFT 6  /* [r] bits 6..7: the algorithm that
                                   compressed it, 0 primary, 1..3 the
                                   recompression algorithms */
#define BLOCK_PRIORITY_MASK 0xc0u
#define BLOCK_FLAG_MASK 0xf0u
#define BLOCK_MOVE_INTACT 0x100u
#define BLOCK_ZEROED_SHIFT 9
#define BLOCK_ZEROED_MASK 0x1ffffffu
#define BLOCK_ATIME_SHIFT 34
#define BLOCK_ATIME_MAX 0x3fffffffu

struct block_entry {
  /* What the kind says: a handle, a fill word, a unit, a place. */
  _Atomic uint64_t value;
  /* See above.  Written under the stripe lock, except that the idle
   * marker sets BLOCK_FLAG_IDLE with a compare-and-swap during a walk (a
   * write that races with it wins: it is an access).  Read without a
   * lock by walks (a hint, checked again under the lock) and by extents.
   */
  _Atomic uint64_t state;
};

static inline uint64_t
block_state_make (unsigned kind, unsigned flags, uint32_t zeroed,
                  uint32_t atime)
{
  return kind | flags | (uint64_t) zeroed << BLOCK_ZEROED_SHIFT
    | (uint64_t) atime << BLOCK_ATIME_SHIFT;
}
static inline unsigned
block_state_kind (uint64_t state)
{
  return state & BLOCK_KIND_MASK;
}
static inline unsigned
block_state_flags (uint64_t state)
{
  return state & BLOCK_FLAG_MASK;
}
static inline uint32_t
block_state_zeroed (uint64_t state)
{
  return (state >> BLOCK_ZEROED_SHIFT) & BLOCK_ZEROED_MASK;
}
static inline uint32_t
block_state_atime (uint64_t state)
{
  return state >> BLOCK_ATIME_SHIFT;
}

struct block_leaf;

struct block_table {
  unsigned inner_levels;      /* levels above the leaves */
  _Atomic (void *) root;
  _Atomic uint64_t bytes;     /* memory held by nodes */
  _Atomic bool nodes_to_check; /* a node may be empty: reclaim has work */
  _Atomic bool keep_nodes;    /* block_table_populate ran: reclaim is off */
  struct zs_pool *pool;       /* charged for the nodes; NULL: not charged */
  struct region *region;      /* where the nodes live; NULL: the C heap */
  pthread_rwlock_t walk_lock; /* read: walkers without stripe locks;
                                 write: reclaim.  See LIFETIME. */
};

extern void block_table_init (struct block_table *table, uint64_t blocks,
                              struct zs_pool *pool, struct region *region);
/* A table in a region, taken over by a new owner: its lock made anew. */
extern void block_table_take_over (struct block_table *table);

/* A table in a region whose owner died (between the region's
 * region_recover_begin and _end): every node reached is claimed in the
 * region again, reclaim's marks are cleared, visit is called for each
 * entry of each leaf and says whether the entry holds content (it may
 * empty it first); leaves left empty, and inner nodes left childless,
 * are dropped (unless block_table_populate ran), each leaf's count and
 * the table's bytes made anew.  One thread, nothing else running.
 */
typedef bool (*block_table_entry_fn) (void *opaque, uint64_t block,
                                      struct block_entry *entry);
extern void block_table_recover (struct block_table *table,
                                 block_table_entry_fn visit, void *opaque);
/* Free every node; the caller frees what the entries point to first. */
extern void block_table_destroy (struct block_table *table);

/* The entry of a block, with the block's stripe lock held; *leaf is set
 * to its leaf.  NULL if the leaf does not exist; with create, the leaf is
 * made if needed, and NULL means no memory (errno ENOSPC: the pool's
 * limit; ENOMEM).
 */
extern struct block_entry *block_table_lookup (struct block_table *table,
                                               uint64_t block, bool create,
                                               struct block_leaf **leaf);

/* An entry of the leaf is about to stop being empty: false if the leaf is
 * being reclaimed (then look the entry up again).  With the entry's
 * stripe lock held, before the entry changes.
 */
extern bool block_leaf_claim (struct block_leaf *leaf);
/* An entry of the leaf became empty.  With the entry's stripe lock held. */
extern void block_leaf_release (struct block_table *table,
                                struct block_leaf *leaf);

/* Make every node of the table now, as the kernel's zram allocates its
 * table at once, and keep them (reclaim does nothing from then on): a
 * write never allocates a node (swap mode).  lock and unlock (opaque,
 * block) take and drop the block's stripe lock around each lookup.  0,
 * or -1 with errno (ENOSPC: the pool's limit; ENOMEM); the nodes made are
 * kept either way.
 */
typedef void (*block_table_lock_fn) (void *opaque, uint64_t block);
extern int block_table_populate (struct block_table *table, uint64_t blocks,
                                 block_table_lock_fn lock,
                                 block_table_lock_fn unlock, void *opaque);

/* Walkers that hold no stripe lock bracket their walk with these. */
extern void block_table_walk_begin (struct block_table *table);
extern void block_table_walk_end (struct block_table *table);

/* The first existing leaf covering a block >= *block: returns the leaf's
 * entries and sets *block to the leaf's first block; NULL when none.
 * Inside a walk (above).
 */
extern struct block_entry *block_table_next_leaf (struct block_table *table,
                                                  uint64_t *block);

/* sweep (opaque) takes and drops every stripe lock, one at a time. */
typedef void (*block_table_sweep_fn) (void *opaque);

/* Free the leaves that hold no entry and the inner nodes left with no
 * child (see LIFETIME).  Free when no leaf emptied and no node was made
 * since the last call.  One caller at a time.
 */
extern void block_table_reclaim (struct block_table *table,
                                 block_table_sweep_fn sweep, void *opaque);

#endif /* ZRAM_BLOCK_TABLE_H */
