/* What a walk of the block store's blocks (store_block_state) counts,
 * for tests that hold the store's counters against it.
 */
#ifndef ZRAM_TESTS_STORE_WALK_H
#define ZRAM_TESTS_STORE_WALK_H

#include <stdint.h>

#include "block-store.h"

struct store_walk {
  uint64_t stored;               /* blocks stored: orig_data_size / 4096 */
  uint64_t written_back;         /* of them, written back: bd_count */
};

static int
store_walk_add (void *opaque, const struct store_block_state *state)
{
  struct store_walk *walk = opaque;
  walk->stored++;
  walk->written_back += state->written_back;
  return 0;
}

/* 0 (and *walk filled), or -1 if the walk failed. */
static inline int
store_walk (struct block_store *store, struct store_walk *walk)
{
  *walk = (struct store_walk) { 0, 0 };
  return store_block_state (store, 0, UINT64_MAX, store_walk_add, walk);
}

#endif /* ZRAM_TESTS_STORE_WALK_H */
