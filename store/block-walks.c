/* Walks over the stored blocks: idle marking, block_state, and the
 * candidates of recompression, packing and writeback.  Above the entries
 * and the table, which it calls; below the movers, which call it.  See
 * block-store.h for the design and the locks.
 */

#include <stdlib.h>

#include "block-store-internal.h"

/* Call visit for every stored block in [first, first + count), in order,
 * inside a table walk (no stripe lock: the leaves stay alive), until it
 * returns false.  keep_going is asked once per leaf.
 */
void
stored_blocks_walk (struct block_store *store, uint64_t first, uint64_t count,
                    bool (*visit) (void *opaque, uint64_t block,
                                   struct block_entry *entry),
                    bool (*keep_going) (void *opaque), void *opaque)
{
  uint64_t end = count < store->blocks - first ? first + count : store->blocks;
  uint64_t block = first;

  block_table_walk_begin (&store->table);
  while (block < end) {
    uint64_t leaf_block = block;
    struct block_entry *leaf = block_table_next_leaf (&store->table, &leaf_block);
    if (!leaf || leaf_block >= end || (keep_going && !keep_going (opaque)))
      break;
    if (leaf_block > block)
      block = leaf_block;
    for (; block < leaf_block + BLOCK_TABLE_FANOUT && block < end; block++) {
      struct block_entry *entry = &leaf[block - leaf_block];
      uint64_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
      if (block_state_kind (state) != BLOCK_EMPTY
          && !visit (opaque, block, entry))
        goto done;
    }
  }
 done:
  block_table_walk_end (&store->table);
}

struct idle_marking {
  uint32_t now, min_age;
  uint64_t marked;
  bool (*keep_going) (void *opaque);
  void *opaque;
};

static bool
idle_mark_one (void *opaque, uint64_t block, struct block_entry *entry)
{
  struct idle_marking *marking = opaque;
  uint64_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
  /* A write that replaces the state meanwhile wins: it is an access. */
  while (block_state_kind (state) != BLOCK_EMPTY
         && !(state & BLOCK_FLAG_IDLE)
         && state_is_older (state, marking->now, marking->min_age)) {
    if (atomic_compare_exchange_weak (&entry->state, &state,
                                      state | BLOCK_FLAG_IDLE)) {
      marking->marked++;
      break;
    }
  }
  return true;
}

static bool
idle_keep_going (void *opaque)
{
  struct idle_marking *marking = opaque;
  return !marking->keep_going || marking->keep_going (marking->opaque);
}

uint64_t
store_mark_idle (struct block_store *store, uint32_t min_age,
                 bool (*keep_going) (void *opaque), void *opaque)
{
  struct idle_marking marking = {
    .now = store_clock (store), .min_age = min_age,
    .keep_going = keep_going, .opaque = opaque,
  };
  stored_blocks_walk (store, 0, store->blocks, idle_mark_one, idle_keep_going,
                      &marking);
  return marking.marked;
}

/* block_state gathers a batch of entries inside a walk and emits them
 * after it: emit may block (a slow client), and the walk lock must not
 * be held meanwhile (the table's reclaim waits for it).
 */
#define STATE_BATCH 256

struct state_batch {
  struct store_block_state states[STATE_BATCH];
  unsigned count;
};

static bool
block_state_gather (void *opaque, uint64_t block, struct block_entry *entry)
{
  struct state_batch *batch = opaque;
  uint64_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
  if (block_state_kind (state) == BLOCK_EMPTY)
    return true;
  batch->states[batch->count++] = (struct store_block_state) {
    .block = block,
    .atime = block_state_atime (state),
    .same = block_state_kind (state) == BLOCK_SAME,
    .huge = block_state_kind (state) == BLOCK_RAW
      || (block_state_kind (state) == BLOCK_BACKED
          && backed_length (atomic_load_explicit (&entry->value,
                                                  memory_order_relaxed))
             == STORE_BLOCK_SIZE),
    .written_back = block_state_kind (state) == BLOCK_BACKED,
    .idle = (state & BLOCK_FLAG_IDLE) != 0,
    .recompressed = (state & BLOCK_PRIORITY_MASK) != 0,
    .incompressible = (state & BLOCK_FLAG_INCOMPRESSIBLE) != 0,
  };
  return batch->count < STATE_BATCH;
}

int
store_block_state (struct block_store *store, uint64_t first, uint64_t count,
                   store_block_state_fn emit, void *opaque)
{
  if (first >= store->blocks)
    return 0;
  uint64_t end = count < store->blocks - first ? first + count : store->blocks;
  struct state_batch *batch = malloc (sizeof *batch);
  if (!batch)
    return -1;
  int r = 0;
  while (first < end && r == 0) {
    batch->count = 0;
    stored_blocks_walk (store, first, end - first, block_state_gather, NULL,
                        batch);
    for (unsigned i = 0; i < batch->count && r == 0; i++)
      r = emit (opaque, &batch->states[i]);
    if (batch->count < STATE_BATCH)
      break;                    /* the walk reached the end */
    first = batch->states[batch->count - 1].block + 1;
  }
  free (batch);
  return r;
}

/* ---- walks for candidates (recompression, packing, writeback) -------- */

struct candidates_batch {
  const struct candidates *walk;
  uint64_t blocks[STATE_BATCH];
  unsigned count;
};

static bool
candidates_gather (void *opaque, uint64_t block, struct block_entry *entry)
{
  struct candidates_batch *batch = opaque;
  uint64_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
  if (batch->walk->wanted (batch->walk->opaque, block, state))
    batch->blocks[batch->count++] = block;
  return batch->count < STATE_BATCH;
}

int
candidates_walk (struct block_store *store, const struct candidates *walk)
{
  struct candidates_batch *batch = malloc (sizeof *batch);
  if (!batch)
    return -1;
  batch->walk = walk;
  uint64_t next = walk->first;
  uint64_t last = walk->last < store->blocks - 1 ? walk->last
    : store->blocks - 1;
  struct store_progress *progress = walk->progress;
  if (progress && next <= last)
    *progress = (struct store_progress) { .to_walk = last - next + 1 };
  int r = 0;
  while (next <= last && r == 0) {
    batch->count = 0;
    stored_blocks_walk (store, next, last - next + 1, candidates_gather, NULL,
                        batch);
    for (unsigned i = 0; i < batch->count && r == 0; ) {
      unsigned n = batch->count - i < walk->group ? batch->count - i
        : walk->group;
      if (progress)
        progress->walked = batch->blocks[i] - walk->first;
      if (!walk->more (walk->opaque, &n))
        goto out;
      r = walk->work (walk->opaque, batch->blocks + i, n);
      i += n;
    }
    if (batch->count < STATE_BATCH)
      break;
    next = batch->blocks[batch->count - 1] + 1;
  }
  if (progress && r == 0)
    progress->walked = progress->to_walk;
 out:
  free (batch);
  return r;
}

