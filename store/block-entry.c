/* The entry layer, the store's lowest: a block's entry (its content,
 * flags and access time) loaded and stored under its stripe lock, the
 * accounting of what entries hold, and the move protocol (block-store.h,
 * MOVING A BLOCK: entry_claim, entry_commit) that every mover stands on.
 * It calls only the block table, the allocator and the backing store's
 * release; every other file of the store calls it.
 */

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block-store-internal.h"

/* Seconds since the store was created, as block entries keep them. */
uint32_t
store_clock (const struct block_store *store)
{
  uint64_t seconds = (monotonic_ns () - store->created_ns) / 1000000000;
  return seconds < BLOCK_ATIME_MAX ? seconds : BLOCK_ATIME_MAX;
}

struct block_content
entry_load (const struct block_entry *entry)
{
  struct block_content content = { .kind = BLOCK_EMPTY };
  if (entry) {
    uint64_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
    content.kind = block_state_kind (state);
    content.flags = block_state_flags (state);
    content.zeroed = block_state_zeroed (state);
    content.atime = block_state_atime (state);
    content.value = atomic_load_explicit (&entry->value, memory_order_relaxed);
  }
  return content;
}

/* A read accessed the entry (stripe lock held): the idle flag goes and
 * the access time is now, stored only when either changes (at most once
 * a second per block).  A claim stays: the content did not change.
 */
void
entry_touch (struct block_store *store, struct block_entry *entry)
{
  uint64_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
  uint64_t touched = (state & ~(uint64_t) BLOCK_FLAG_IDLE
                      & ~((uint64_t) BLOCK_ATIME_MAX << BLOCK_ATIME_SHIFT))
    | (uint64_t) store_clock (store) << BLOCK_ATIME_SHIFT;
  if (touched != state)
    atomic_store_explicit (&entry->state, touched, memory_order_relaxed);
}

/* Write an entry's two words, its stripe lock held.  In a region a crash
 * may stop between them: the stripe's intent keeps the old pair until
 * both are written, and recovery puts it back (the write it belonged to
 * was never acknowledged: its old content is still allocated, released
 * only after this returns).  Release stores: the compiler keeps the
 * order, and x86 stores reach memory in it.
 */
void (*entry_write_window) (void);

static void
entry_write (struct block_store *store, uint64_t block,
             struct block_entry *entry, uint64_t value, uint64_t state)
{
  struct stripe_intent *intent = store->region
    ? &store->intents[block % STORE_STRIPES] : NULL;
  if (intent) {
    intent->value = atomic_load_explicit (&entry->value, memory_order_relaxed);
    intent->state = atomic_load_explicit (&entry->state, memory_order_relaxed);
    atomic_store_explicit (&intent->entry, (uintptr_t) entry,
                           memory_order_release);
  }
  atomic_store_explicit (&entry->value, value, memory_order_release);
  if (intent && entry_write_window)
    entry_write_window ();
  atomic_store_explicit (&entry->state, state, memory_order_release);
  if (intent)
    atomic_store_explicit (&intent->entry, 0, memory_order_release);
}

/* Store new content into an entry of leaf, whose old content was old,
 * under its stripe lock.  An empty entry that gets content was claimed
 * in its leaf before (entry_lock); one that is emptied is released.
 * Every store breaks a mover's claim (MOVE_INTACT goes); MOVE_HELD stays
 * for its mover to clear.
 */
void
entry_store (struct block_store *store, uint64_t block, struct block_leaf *leaf,
             struct block_entry *entry, const struct block_content *old,
             const struct block_content *content)
{
  uint64_t held = atomic_load_explicit (&entry->state, memory_order_relaxed)
    & BLOCK_MOVE_HELD;
  /* A write is an access: idle and incompressible go, the access time is
   * now; the priority says which codec the object was compressed with.
   */
  entry_write (store, block, entry, content->value,
               block_state_make (content->kind,
                                 content->flags & BLOCK_PRIORITY_MASK,
                                 content->zeroed, store_clock (store))
               | held);
  if (old->kind != BLOCK_EMPTY && content->kind == BLOCK_EMPTY)
    block_leaf_release (&store->table, leaf);
}

/* Lock a block's stripe and look up its entry (making its leaf when
 * create), with its content in *old.  An empty entry that is going to
 * get content (create) is claimed in its leaf, looking up again when the
 * leaf was being reclaimed (block-table.h, LIFETIME).  NULL, with the
 * stripe unlocked, when there is no entry: no leaf and !create, or no
 * memory for one (errno).
 */
struct block_entry *
entry_lock (struct block_store *store, uint64_t block, bool create,
            struct block_leaf **leaf, struct block_content *old)
{
  for (;;) {
    pthread_mutex_lock (stripe_for (store, block));
    struct block_entry *entry = block_table_lookup (&store->table, block,
                                                    create, leaf);
    if (!entry) {
      pthread_mutex_unlock (stripe_for (store, block));
      return NULL;
    }
    *old = entry_load (entry);
    if (!create || old->kind != BLOCK_EMPTY || block_leaf_claim (*leaf))
      return entry;
    pthread_mutex_unlock (stripe_for (store, block));
  }
}

/* The bytes of content's object, 0 if it has none. */
size_t
content_bytes (struct block_store *store, const struct block_content *content)
{
  return content_has_object (content)
    ? zs_object_size (store->pool, content->value) : 0;
}

/* Account for content of bytes object bytes (content_bytes) entering
 * (sign 1) or leaving (sign -1) the table.
 */
void
content_account (struct block_store *store, const struct block_content *content,
                 int sign, size_t bytes)
{
  switch (content->kind) {
  case BLOCK_EMPTY:
    return;
  case BLOCK_SAME:
    counter_add (&store->same_blocks, sign);
    break;
  case BLOCK_RAW:
    counter_add (&store->raw_blocks, sign);
    if (sign > 0)
      counter_add (&store->raw_blocks_since, 1);
    /* fallthrough */
  case BLOCK_COMPRESSED:
  case BLOCK_COMPRESSED_PADDED:
    counter_add (&store->compr_bytes, sign * (int64_t) bytes);
    break;
  case BLOCK_PACKED:            /* the unit's bytes count with the unit */
    counter_add (&store->packed_blocks, sign);
    break;
  case BLOCK_BACKED:
    counter_add (&store->bd_count, sign);
    counter_add (&store->bd_bytes, sign * (int64_t) backed_length (content->value));
    break;
  }
  counter_add (&store->stored_blocks, sign);
}

/* Free the object of content that left the table, or never entered it. */
void
content_discard (struct block_store *store, const struct block_content *content)
{
  if (content_has_object (content))
    object_free (store, content->value);
  else if (content->kind == BLOCK_PACKED) {
    struct pack_unit *unit = content_unit (content);
    if (atomic_fetch_sub (&unit->live, 1) == 1)
      unit_destroy (store, unit);
  }
  else if (content->kind == BLOCK_BACKED)
    backing_release (store->backing, backed_offset (content->value),
                     backed_length (content->value));
}

/* Content left the table: account for it and free its object. */
void
content_release (struct block_store *store, const struct block_content *content)
{
  content_account (store, content, -1, content_bytes (store, content));
  content_discard (store, content);
}

/* Install content for a block: the entry's lookup (and leaf, if need
 * be) and the swap under the stripe lock.  *old is what the entry held
 * (BLOCK_EMPTY: nothing), already out of the counters, for the caller to
 * discard (content_discard) once the stripe lock is gone: 0.  -1 with
 * errno when no leaf could be had (content discarded).
 */
int
block_install_swap (struct block_store *store, uint64_t block,
                    struct block_content *content, struct block_content *old)
{
  struct block_leaf *leaf;

  /* Emptying a block needs no leaf where there is none. */
  struct block_entry *entry = entry_lock (store, block,
                                          content->kind != BLOCK_EMPTY,
                                          &leaf, old);
  if (!entry) {
    old->kind = BLOCK_EMPTY;
    /* No leaf: the block is a hole.  A zero block that the limit refuses
     * a leaf may stay one: it reads as zeros all the same.
     */
    if (content->kind == BLOCK_EMPTY
        || (content->kind == BLOCK_SAME && content->value == 0
            && errno == ENOSPC))
      return 0;
    int err = errno;
    content_discard (store, content);
    errno = err;
    return -1;
  }
  content_account (store, content, 1, content_bytes (store, content));
  entry_store (store, block, leaf, entry, old, content);
  pthread_mutex_unlock (stripe_for (store, block));
  content_account (store, old, -1, content_bytes (store, old));
  return 0;
}

int
block_install (struct block_store *store, uint64_t block,
               struct block_content *content)
{
  struct block_content old;
  if (block_install_swap (store, block, content, &old) == -1)
    return -1;
  content_discard (store, &old);
  return 0;
}

/* ---- the move protocol (block-store.h, MOVING A BLOCK) --------------- */

struct block_entry *
entry_claim (struct block_store *store, uint64_t block,
             bool (*wanted) (void *opaque, uint64_t block, uint64_t state),
             void *opaque, struct block_content *claimed)
{
  struct block_leaf *leaf;
  pthread_mutex_lock (stripe_for (store, block));
  struct block_entry *entry = block_table_lookup (&store->table, block, false,
                                                  &leaf);
  uint64_t state = entry ? atomic_load (&entry->state) : 0;
  if (block_state_kind (state) == BLOCK_EMPTY || (state & BLOCK_MOVE_HELD)
      || (wanted && !wanted (opaque, block, state))) {
    pthread_mutex_unlock (stripe_for (store, block));
    return NULL;
  }
  entry_claim_locked (leaf, entry);
  *claimed = entry_load (entry);
  return entry;
}

bool
entry_claim_locked (struct block_leaf *leaf, struct block_entry *entry)
{
  uint64_t state = atomic_load (&entry->state);
  if (state & BLOCK_MOVE_HELD)
    return false;
  /* The claim holds the leaf too: were the entry emptied and its leaf
   * reclaimed meanwhile, a new leaf could hold another mover's claim on
   * the block, and claim_end would take it for this one.  The leaf holds
   * this stored block, so it is not being reclaimed.
   */
  bool leaf_held = block_leaf_claim (leaf);
  assert (leaf_held);
  (void) leaf_held;
  /* A compare-and-swap: the idle marker may be setting its flag. */
  while (!atomic_compare_exchange_weak (&entry->state, &state,
                                        state | BLOCK_MOVE_HELD
                                        | BLOCK_MOVE_INTACT))
    ;
  return true;
}

/* Under the stripe lock: the claimed entry, and whether the claim holds;
 * the claim goes either way (the mover is done with it), and with it the
 * claim's hold on the leaf.
 */
static struct block_entry *
claim_end (struct block_store *store, uint64_t block, bool *holds)
{
  struct block_leaf *leaf;
  struct block_entry *entry = block_table_lookup (&store->table, block, false,
                                                  &leaf);
  assert (entry);               /* the claim kept its leaf */
  uint64_t state = atomic_load (&entry->state);
  assert (state & BLOCK_MOVE_HELD);
  *holds = (state & BLOCK_MOVE_INTACT) != 0;
  while (!atomic_compare_exchange_weak (&entry->state, &state,
                                        state & ~(uint64_t) (BLOCK_MOVE_HELD
                                                             | BLOCK_MOVE_INTACT)))
    ;
  block_leaf_release (&store->table, leaf);
  return entry;
}

bool
entry_commit (struct block_store *store, uint64_t block,
              const struct block_content *content, struct block_content *old)
{
  bool holds;
  pthread_mutex_lock (stripe_for (store, block));
  struct block_entry *entry = claim_end (store, block, &holds);
  if (holds) {
    *old = entry_load (entry);
    content_account (store, old, -1, content_bytes (store, old));
    content_account (store, content, 1, content_bytes (store, content));
    /* Not an access: the time and the idle flag stay, and so does the
     * zeroed overlay (movers encode the data under it).
     */
    entry_write (store, block, entry, content->value,
                 block_state_make (content->kind,
                                   (old->flags & BLOCK_FLAG_IDLE)
                                   | content->flags,
                                   old->zeroed, old->atime));
  }
  pthread_mutex_unlock (stripe_for (store, block));
  return holds;
}

bool
entry_commit_flags (struct block_store *store, uint64_t block, unsigned flags)
{
  bool holds;
  pthread_mutex_lock (stripe_for (store, block));
  struct block_entry *entry = claim_end (store, block, &holds);
  if (holds)
    atomic_fetch_or (&entry->state, flags);
  pthread_mutex_unlock (stripe_for (store, block));
  return holds;
}

void
entry_unclaim (struct block_store *store, uint64_t block)
{
  bool holds;
  pthread_mutex_lock (stripe_for (store, block));
  claim_end (store, block, &holds);
  pthread_mutex_unlock (stripe_for (store, block));
}

