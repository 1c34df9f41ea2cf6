/* The block store's core: see block-store.h for the design and the locks,
 * block-store-internal.h for how its files divide the work.
 */

#include <assert.h>
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block-store-internal.h"

/* A write refused for memory tries again after each writeback that made
 * room, this many times at most (other writers may take the room first;
 * a writeback that writes nothing ends it at once).
 */
#define WRITEBACK_ATTEMPTS 64

/* Seconds since the store was created, as block entries keep them. */
uint32_t
store_clock (const struct block_store *store)
{
  uint64_t seconds = (monotonic_ns () - store->created_ns) / 1000000000;
  return seconds < BLOCK_ATIME_MAX ? seconds : BLOCK_ATIME_MAX;
}

struct block_store *
store_create (const struct store_config *config)
{
  struct block_store *store = config->size ? calloc (1, sizeof *store) : NULL;
  if (!store) {
    if (config->size == 0)
      errno = EINVAL;
    int saved = errno;
    backing_close (config->backing);
    errno = saved;
    return NULL;
  }
  store->size = config->size;
  store->blocks = (config->size - 1) / STORE_BLOCK_SIZE + 1;
  store->created_ns = monotonic_ns ();
  store->pool = zs_pool_create (&config->pool);
  if (!store->pool)
    goto fail;
  if (config->recomp_count > STORE_RECOMP_MAX) {
    errno = EINVAL;
    goto fail;
  }
  store->recomp_count = config->recomp_count;
  store->algorithms[0] = config->algorithm;
  store->codecs[0] = codec_create (config->algorithm, config->level);
  if (!store->codecs[0])
    goto fail;
  for (unsigned p = 1; p <= store->recomp_count; p++) {
    store->algorithms[p] = config->recomp[p - 1].algorithm;
    store->codecs[p] = codec_create (config->recomp[p - 1].algorithm,
                                     config->recomp[p - 1].level);
    if (!store->codecs[p])
      goto fail;
  }
  store->pack_codec = codec_create (CODEC_ZSTD,
                                    config->pack_level ? config->pack_level
                                    : STORE_PACK_LEVEL_DEFAULT);
  store->pack_blocks = config->pack_blocks ? config->pack_blocks
    : STORE_PACK_DEFAULT;
  if (store->pack_blocks < 2 || store->pack_blocks > STORE_PACK_MAX) {
    errno = EINVAL;
    goto fail;
  }
  store->write_batch = config->write_batch ? config->write_batch
    : STORE_WRITE_BATCH_MAX;
  if (store->write_batch > STORE_WRITE_BATCH_MAX) {
    errno = EINVAL;
    goto fail;
  }
  {
    size_t unit_plain = (size_t) store->pack_blocks * STORE_BLOCK_SIZE;
    uint64_t cache = config->decode_cache ? config->decode_cache
      : STORE_DECODE_CACHE_DEFAULT;
    store->unit_cache_count = cache / unit_plain > 1 ? cache / unit_plain : 1;
    if (store->unit_cache_count > STORE_DECODE_CACHE_SLOTS_MAX)
      store->unit_cache_count = STORE_DECODE_CACHE_SLOTS_MAX;
  }
  store->unit_cache = calloc (store->unit_cache_count,
                              sizeof *store->unit_cache);
  if (!store->pack_codec || !store->unit_cache)
    goto fail;
  for (unsigned i = 0; i < store->unit_cache_count; i++)
    pthread_mutex_init (&store->unit_cache[i].lock, NULL);
  pthread_mutex_init (&store->units_lock, NULL);
  pthread_mutex_init (&store->writeback_lock, NULL);
  store->writeback_batch = config->writeback_batch ? config->writeback_batch
    : STORE_WRITEBACK_BATCH;
  if (store->writeback_batch > STORE_WRITEBACK_BATCH_MAX) {
    errno = EINVAL;
    goto fail;
  }
  store->writeback_limit = config->writeback_limited ? config->writeback_limit
    : UINT64_MAX;
  store->backing = config->backing;   /* the store's from here */
  store->readback_below = config->readback_below;
  store->backing_sync = !config->backing_nosync;
  store->raw_threshold = zs_huge_class_size (store->pool);
  block_table_init (&store->table, store->blocks, store->pool);
  for (unsigned i = 0; i < STORE_STRIPES; i++)
    pthread_mutex_init (&store->stripes[i], NULL);
  backing_map_settle (store, false);    /* the empty map's */
  return store;

 fail:;
  int saved = errno;
  if (store->pool)
    zs_pool_destroy (store->pool);
  for (unsigned p = 0; p <= STORE_RECOMP_MAX; p++)
    codec_destroy (store->codecs[p]);
  codec_destroy (store->pack_codec);
  free (store->unit_cache);
  free (store);
  backing_close (config->backing);
  errno = saved;
  return NULL;
}

void
store_destroy (struct block_store *store)
{
  if (!store)
    return;
  /* The table first: its nodes are charged to the pool.  The pool frees
   * every object at once; the entries need no walk.
   */
  block_table_destroy (&store->table);
  zs_pool_destroy (store->pool);
  for (unsigned p = 0; p <= STORE_RECOMP_MAX; p++)
    codec_destroy (store->codecs[p]);
  codec_destroy (store->pack_codec);
  for (unsigned i = 0; i < store->unit_cache_count; i++) {
    pthread_mutex_destroy (&store->unit_cache[i].lock);
    free (store->unit_cache[i].data);
  }
  free (store->unit_cache);
  units_free_all (store);      /* their parts went with the pool */
  pthread_mutex_destroy (&store->units_lock);
  for (unsigned i = 0; i < STORE_STRIPES; i++)
    pthread_mutex_destroy (&store->stripes[i]);
  backing_close (store->backing);
  pthread_mutex_destroy (&store->writeback_lock);
  write_scratch_free (store);
  free (store);
}

size_t
store_raw_threshold (const struct block_store *store)
{
  return store->raw_threshold;
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
static void
entry_touch (struct block_store *store, struct block_entry *entry)
{
  uint64_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
  uint64_t touched = (state & ~(uint64_t) BLOCK_FLAG_IDLE
                      & ~((uint64_t) BLOCK_ATIME_MAX << BLOCK_ATIME_SHIFT))
    | (uint64_t) store_clock (store) << BLOCK_ATIME_SHIFT;
  if (touched != state)
    atomic_store_explicit (&entry->state, touched, memory_order_relaxed);
}

/* Store new content into an entry of leaf, whose old content was old,
 * under its stripe lock.  An empty entry that gets content was claimed
 * in its leaf before (entry_lock); one that is emptied is released.
 * Every store breaks a mover's claim (MOVE_INTACT goes); MOVE_HELD stays
 * for its mover to clear.
 */
void
entry_store (struct block_store *store, struct block_leaf *leaf,
             struct block_entry *entry, const struct block_content *old,
             const struct block_content *content)
{
  uint64_t held = atomic_load_explicit (&entry->state, memory_order_relaxed)
    & BLOCK_MOVE_HELD;
  atomic_store_explicit (&entry->value, content->value, memory_order_relaxed);
  /* A write is an access: idle and incompressible go, the access time is
   * now; the priority says which codec the object was compressed with.
   */
  atomic_store_explicit (&entry->state,
                         block_state_make (content->kind,
                                           content->flags & BLOCK_PRIORITY_MASK,
                                           content->zeroed, store_clock (store))
                         | held,
                         memory_order_relaxed);
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
    zs_free (store->pool, content->value);
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
  entry_store (store, leaf, entry, old, content);
  pthread_mutex_unlock (stripe_for (store, block));
  content_account (store, old, -1, content_bytes (store, old));
  return 0;
}

static int
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
    atomic_store_explicit (&entry->value, content->value, memory_order_relaxed);
    /* Not an access: the time and the idle flag stay, and so does the
     * zeroed overlay (movers encode the data under it).
     */
    atomic_store_explicit (&entry->state,
                           block_state_make (content->kind,
                                             (old->flags & BLOCK_FLAG_IDLE)
                                             | content->flags,
                                             old->zeroed, old->atime),
                           memory_order_relaxed);
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

/* Read a whole block into out.  A written-back block is read with the
 * stripe lock dropped (backing.h, READS AND RELEASES): the blocks of its
 * stripe do not wait for the backing store.
 */
static int
block_read (struct block_store *store, uint64_t block, unsigned char *out,
            unsigned ahead)
{
  struct block_leaf *leaf;
  int r;

  pthread_mutex_lock (stripe_for (store, block));
  struct block_entry *entry = block_table_lookup (&store->table, block, false,
                                                  &leaf);
  struct block_content content = entry_load (entry);
  if (content.kind != BLOCK_EMPTY)
    entry_touch (store, entry);
  if (content.kind != BLOCK_BACKED) {
    r = block_decode_ahead (store, &content, out, ahead);
    pthread_mutex_unlock (stripe_for (store, block));
    return r;
  }
  bool claimed = block_read_back_claim (store, leaf, entry, &content);
  unsigned epoch = backing_read_begin (store->backing);
  pthread_mutex_unlock (stripe_for (store, block));
  r = block_decode (store, &content, out);
  backing_read_end (store->backing, epoch);
  if (claimed)
    block_read_back (store, block, out, r == 0);
  return r;
}

/* The data of a written-back block, read with its stripe lock dropped for
 * the backing I/O (see block_read).  Entered with the stripe locked and
 * *old the entry's content; returns with it locked again (or, if the
 * block became a hole, unlocked and NULL) and *old reloaded.  The run
 * stays pinned from before the unlock to after the relock, so it cannot
 * be freed and given to other data meanwhile: if the entry still names it
 * with the same zeroed range, nothing was stored since and *r says how
 * the read went.  *changed otherwise: the caller starts again.
 */
static struct block_entry *
backed_decode_unlocked (struct block_store *store, uint64_t block, bool create,
                        struct block_leaf **leaf, struct block_content *old,
                        unsigned char *buffer, int *r, bool *changed)
{
  struct block_content snapshot = *old;
  unsigned epoch = backing_read_begin (store->backing);
  pthread_mutex_unlock (stripe_for (store, block));
  *r = block_decode (store, &snapshot, buffer);
  struct block_entry *entry = entry_lock (store, block, create, leaf, old);
  *changed = !entry || old->kind != BLOCK_BACKED
    || old->value != snapshot.value || old->zeroed != snapshot.zeroed;
  backing_read_end (store->backing, epoch);
  return entry;
}

/* Rewrite part of a block, [from, from+length), with data (or zeros when
 * data is NULL), all under the stripe lock.
 *
 * A write gets a right-sized object, and only if memory is full is the
 * block rewritten in its old object, when it fits there.  A zero is
 * rewritten in the old object whenever it fits, and needs memory only
 * when the new encoding is bigger than the old object's slot (or the
 * block was same-filled); if the limit refuses that memory, the zeroed
 * range is recorded in the entry beside the old data (struct
 * block_entry), which needs none.  So zeroing part of a block that holds
 * data never fails for lack of memory, but in one case: the block already
 * has a zeroed range that does not touch the new one.
 */
static int
block_patch (struct block_store *store, uint64_t block, const void *data,
             size_t from, size_t length)
{
  unsigned char buffer[STORE_BLOCK_SIZE];
  struct block_content content = { .kind = BLOCK_EMPTY };
  struct block_leaf *leaf;
  struct block_content old;

  int r;
  struct block_entry *entry;
 again:
  /* Zeroing needs no leaf where there is none: that range is a hole. */
  entry = entry_lock (store, block, data != NULL, &leaf, &old);
  if (!entry)
    return data ? -1 : 0;
  if (!data && old.kind == BLOCK_EMPTY) {
    /* Zeroing part of a hole: it reads as zeros already, keep the hole. */
    pthread_mutex_unlock (stripe_for (store, block));
    return 0;
  }
  if (old.kind == BLOCK_BACKED) {
    bool changed;
    entry = backed_decode_unlocked (store, block, data != NULL, &leaf, &old,
                                    buffer, &r, &changed);
    if (changed) {
      if (entry) {
        if (old.kind == BLOCK_EMPTY && data)
          block_leaf_release (&store->table, leaf);   /* entry_lock's */
        pthread_mutex_unlock (stripe_for (store, block));
      }
      goto again;
    }
  }
  else
    r = block_decode (store, &old, buffer);
  size_t old_bytes = content_bytes (store, &old); /* before any rewrite */
  if (r == 0) {
    if (data) {
      memcpy (buffer + from, data, length);
      r = block_encode (store, buffer, &content);
      if (r == -1 && errno == ENOSPC
          && block_encode_in_place (store, buffer, &old, &content) == 0)
        r = 0;
    }
    else {
      memset (buffer + from, 0, length);
      r = block_encode_in_place (store, buffer, &old, &content);
      if (r == 1)
        r = block_encode (store, buffer, &content);
      if (r == -1 && errno == ENOSPC
          && zeroed_merge (old.zeroed, from, from + length, &content.zeroed)) {
        content.kind = old.kind;
        content.value = old.value;
        content.flags = old.flags;      /* its codec, for one */
        r = 0;
      }
    }
  }
  if (r == -1) {
    /* The entry stays as it was: give back its claim. */
    if (old.kind == BLOCK_EMPTY)
      block_leaf_release (&store->table, leaf);
    pthread_mutex_unlock (stripe_for (store, block));
    return -1;
  }
  /* The old object (or unit) kept beside a zeroed range is not freed. */
  bool same_object = content.value == old.value
    && ((content_has_object (&content) && content_has_object (&old))
        || (content.kind == BLOCK_PACKED && old.kind == BLOCK_PACKED)
        || (content.kind == BLOCK_BACKED && old.kind == BLOCK_BACKED));
  content_account (store, &content, 1, content_bytes (store, &content));
  entry_store (store, leaf, entry, &old, &content);
  pthread_mutex_unlock (stripe_for (store, block));
  content_account (store, &old, -1, old_bytes);
  if (!same_object)
    content_discard (store, &old);
  return 0;
}

/* Loop over [offset, offset+count) one block at a time: block is the
 * block number, from the first byte of it in the range, length how many
 * bytes of it (STORE_BLOCK_SIZE for a whole block).  A body that handles
 * several whole blocks at once sets length to their bytes: the loop goes
 * on after them.
 */
#define FOR_EACH_BLOCK_PIECE(offset, count, block, from, length)        \
  for (uint64_t _pos = (offset), _end = (offset) + (count),             \
         block, from, length;                                           \
       _pos < _end                                                      \
         && (block = _pos / STORE_BLOCK_SIZE,                           \
             from = _pos % STORE_BLOCK_SIZE,                            \
             length = STORE_BLOCK_SIZE - from < _end - _pos             \
               ? STORE_BLOCK_SIZE - from : _end - _pos, 1);             \
       _pos += length)

int
store_read (struct block_store *store, void *buf, uint64_t count,
            uint64_t offset)
{
  unsigned char *out = buf;
  unsigned char buffer[STORE_BLOCK_SIZE];

  uint64_t last = (offset + count - 1) / STORE_BLOCK_SIZE;
  FOR_EACH_BLOCK_PIECE (offset, count, block, from, length) {
    /* The blocks this request reads after this one, capped. */
    unsigned ahead = last - block < STORE_PACK_MAX ? last - block : STORE_PACK_MAX;
    int r;
    if (length == STORE_BLOCK_SIZE)
      r = block_read (store, block, out, ahead);
    else if ((r = block_read (store, block, buffer, ahead)) == 0)
      memcpy (out, buffer + from, length);
    if (r == -1) {
      counter_add (&store->failed_reads, 1);
      return -1;
    }
    counter_add (&store->reads, 1);
    out += length;
  }
  return 0;
}

/* A write refused for memory (errno ENOSPC): give up the decode cache's
 * slots no read is using (reads make them again: data comes first),
 * else write back for room (writeback_for_room, within the request's
 * *room_deadline_ms).  0: try the write again; -1 with errno as it was
 * when there is nothing to gain.
 */
static int
make_room (struct block_store *store, uint64_t *room_deadline_ms)
{
  int err = errno;
  if (err == ENOSPC && decode_cache_trim (store) > 0) {
    errno = err;
    return 0;
  }
  return writeback_for_room (store, room_deadline_ms);
}

int
block_write_piece (struct block_store *store, uint64_t block,
                   const unsigned char *in, uint64_t from, uint64_t length,
                   uint64_t *room_deadline_ms)
{
  int r;
  for (unsigned attempt = 0; ; attempt++) {
    if (length == STORE_BLOCK_SIZE) {
      struct block_content content;
      r = block_encode (store, in, &content);
      if (r == 0)
        r = block_install (store, block, &content);
    }
    else
      r = block_patch (store, block, in, from, length);
    if (r == 0 || attempt == WRITEBACK_ATTEMPTS
        || make_room (store, room_deadline_ms) == -1)
      return r;
  }
}

int
store_write (struct block_store *store, const void *buf, uint64_t count,
             uint64_t offset)
{
  const unsigned char *in = buf;
  uint64_t room_deadline_ms = 0;

  FOR_EACH_BLOCK_PIECE (offset, count, block, from, length) {
    /* Whole blocks, two or more: a batch (block-batch.c), and length
     * covers them all.
     */
    uint64_t whole = from == 0
      ? (offset + count - block * STORE_BLOCK_SIZE) / STORE_BLOCK_SIZE : 0;
    unsigned n = whole < store->write_batch ? whole : store->write_batch;
    int r;
    if (n >= 2) {
      r = blocks_write_batch (store, block, in, n, &room_deadline_ms);
      length = (uint64_t) n * STORE_BLOCK_SIZE;
    }
    else {
      n = 1;
      r = block_write_piece (store, block, in, from, length,
                             &room_deadline_ms);
    }
    if (r == -1) {
      counter_add (&store->failed_writes, 1);
      return -1;
    }
    counter_add (&store->writes, n);
    in += length;
  }
  return 0;
}

/* Does a piece cover its whole block?  The last block of a device whose
 * size is not a multiple of the block size is whole when the piece runs
 * from its start to the device's end: trimming or zeroing it frees it.
 */
static bool
piece_is_whole_block (const struct block_store *store, uint64_t block,
                      uint64_t from, uint64_t length)
{
  return length == STORE_BLOCK_SIZE
    || (from == 0 && block * STORE_BLOCK_SIZE + length >= store->size);
}

int
store_trim (struct block_store *store, uint64_t count, uint64_t offset)
{
  FOR_EACH_BLOCK_PIECE (offset, count, block, from, length) {
    if (piece_is_whole_block (store, block, from, length)) {
      struct block_content content = { .kind = BLOCK_EMPTY };
      block_install (store, block, &content);
      counter_add (&store->notify_free, 1);
    }
  }
  return 0;
}

int
store_zero (struct block_store *store, uint64_t count, uint64_t offset,
            bool may_trim)
{
  uint64_t room_deadline_ms = 0;
  FOR_EACH_BLOCK_PIECE (offset, count, block, from, length) {
    int r;
    if (piece_is_whole_block (store, block, from, length)) {
      struct block_content content = { .kind = may_trim ? BLOCK_EMPTY : BLOCK_SAME };
      r = block_install (store, block, &content);
      counter_add (&store->notify_free, 1);
    }
    else {
      for (unsigned attempt = 0; ; attempt++) {
        r = block_patch (store, block, NULL, from, length);
        if (r == 0 || attempt == WRITEBACK_ATTEMPTS
            || make_room (store, &room_deadline_ms) == -1)
          break;
      }
    }
    if (r == -1) {
      counter_add (&store->failed_writes, 1);
      return -1;
    }
  }
  return 0;
}

static enum store_extent
extent_type (const struct block_entry *entry)
{
  struct block_content content = entry_load (entry);
  switch (content.kind) {
  case BLOCK_EMPTY: return STORE_EXTENT_HOLE;
  case BLOCK_SAME: return content.value == 0 ? STORE_EXTENT_ZERO
                                              : STORE_EXTENT_DATA;
  default: return STORE_EXTENT_DATA;
  }
}

/* Extents read entries without stripe locks: a block changing meanwhile
 * may be reported either way, as with any concurrent write.  The table's
 * walk lock keeps the leaves alive (block-table.h, LIFETIME).
 */
static int
extents_walk (struct block_store *store, uint64_t count, uint64_t offset,
              store_extent_fn add, void *opaque)
{
  uint64_t end = offset + count;
  uint64_t run_start = offset;
  enum store_extent run_type = STORE_EXTENT_HOLE;
  uint64_t pos = offset;

  /* Emit the run so far if the next piece differs in type. */
#define EXTENT_PIECE(type, piece_end)                                   \
  do {                                                                  \
    if ((type) != run_type && pos > run_start) {                        \
      if (add (opaque, run_start, pos - run_start, run_type) == -1)     \
        return -1;                                                      \
      run_start = pos;                                                  \
    }                                                                   \
    run_type = (type);                                                  \
    pos = (piece_end) < end ? (piece_end) : end;                        \
  } while (0)

  while (pos < end) {
    uint64_t block = pos / STORE_BLOCK_SIZE;
    uint64_t leaf_block = block;
    struct block_entry *leaf = block_table_next_leaf (&store->table, &leaf_block);

    if (!leaf) {
      EXTENT_PIECE (STORE_EXTENT_HOLE, end);
      break;
    }
    if (leaf_block > block) {   /* a gap with no leaf: one hole */
      EXTENT_PIECE (STORE_EXTENT_HOLE, leaf_block * STORE_BLOCK_SIZE);
      continue;
    }
    for (unsigned i = block - leaf_block;
         i < BLOCK_TABLE_FANOUT && pos < end; i++)
      EXTENT_PIECE (extent_type (&leaf[i]),
                    (leaf_block + i + 1) * STORE_BLOCK_SIZE);
  }
  if (pos > run_start)
    return add (opaque, run_start, pos - run_start, run_type);
  return 0;
#undef EXTENT_PIECE
}

int
store_extents (struct block_store *store, uint64_t count, uint64_t offset,
               store_extent_fn add, void *opaque)
{
  block_table_walk_begin (&store->table);
  int r = extents_walk (store, count, offset, add, opaque);
  block_table_walk_end (&store->table);
  return r;
}

int
store_set_mem_limit (struct block_store *store, uint64_t limit,
                     uint64_t *held)
{
  uint64_t ignored;
  if (zs_pool_set_mem_limit_held (store->pool, limit,
                                  held ? held : &ignored) == 0)
    return 0;
  /* Refused: the decode cache's slots no read is using give way first
   * (reads make them again), as they do to a write.
   */
  if (errno != ENOSPC || decode_cache_trim (store) == 0)
    return -1;                  /* decode_cache_trim keeps errno */
  return zs_pool_set_mem_limit_held (store->pool, limit,
                                     held ? held : &ignored);
}

void
store_reset_mem_used_max (struct block_store *store)
{
  zs_pool_reset_max (store->pool);
}

void
store_print_classes (struct block_store *store, FILE *fp)
{
  zs_pool_print_stats (store->pool, fp);
}

unsigned
store_class_count (struct block_store *store)
{
  return zs_class_count (store->pool);
}

int
store_class_stats (struct block_store *store, unsigned class_number,
                   struct zs_class_stats *stats)
{
  return zs_class_stats (store->pool, class_number, stats);
}

uint32_t
store_now (const struct block_store *store)
{
  return store_clock (store);
}
/* The table's reclaim grace period: take and drop every stripe lock. */
static void
stripes_sweep (void *opaque)
{
  struct block_store *store = opaque;

  for (unsigned i = 0; i < STORE_STRIPES; i++) {
    pthread_mutex_lock (&store->stripes[i]);
    pthread_mutex_unlock (&store->stripes[i]);
  }
}


uint64_t
store_freeable (struct block_store *store, uint64_t *pages_used)
{
  uint64_t freeable = 0;
  *pages_used = 0;
  for (unsigned c = 0; c < zs_class_count (store->pool); c++) {
    struct zs_class_stats class;
    zs_class_stats (store->pool, c, &class);
    freeable += class.pages_freeable;
    *pages_used += class.pages_used;
  }
  return freeable;
}

uint64_t
store_compact (struct block_store *store)
{
  uint64_t start = monotonic_ns ();
  uint64_t freed = zs_compact (store->pool);
  counter_add (&store->compact_ns, monotonic_ns () - start);
  return freed;
}

size_t
store_release_idle_memory (struct block_store *store)
{
  size_t freed = codec_trim (store->pack_codec);
  for (unsigned p = 0; p <= store->recomp_count; p++)
    freed += codec_trim (store->codecs[p]);
  if (!atomic_load (&store->keep_resident))
    freed += write_scratch_trim (store) + decode_cache_trim (store);
  /* What the data let go of, the process should too: the C library
   * keeps freed request buffers and metadata in its arenas otherwise.
   * Not when the serving path is to stay resident: the next request
   * would fault those pages in again, maybe with memory gone.
   */
  if (!atomic_load (&store->keep_resident))
    malloc_trim (0);
  return freed;
}

static void
stripe_lock_block (void *opaque, uint64_t block)
{
  pthread_mutex_lock (stripe_for (opaque, block));
}

static void
stripe_unlock_block (void *opaque, uint64_t block)
{
  pthread_mutex_unlock (stripe_for (opaque, block));
}

int
store_keep_resident (struct block_store *store, unsigned threads)
{
  atomic_store (&store->keep_resident, true);
  if (block_table_populate (&store->table, store->blocks, stripe_lock_block,
                            stripe_unlock_block, store) == -1)
    return -1;
  if (write_scratch_prepare (store) == -1)
    return -1;
  return codec_prepare (store->codecs[0], threads);
}

uint64_t
store_reserve_refill (struct block_store *store)
{
  return zs_pool_reserve_refill (store->pool);
}

bool
store_reserve_release_if_empty (struct block_store *store)
{
  struct zs_pool_stats pool;
  zs_pool_stats (store->pool, &pool);
  if (pool.pages_used > 0)
    return false;
  if (pool.reserve_bytes > 0)
    zs_pool_reserve_release (store->pool);
  return true;
}

bool
store_reserve_low (struct block_store *store)
{
  return zs_pool_reserve_low (store->pool);
}

void
store_open_reserve (struct block_store *store)
{
  zs_pool_open_reserve (store->pool);
}

void
store_metadata_ready (struct block_store *store, uint64_t bytes)
{
  zs_pool_metadata_ready (store->pool, bytes);
}

void
store_flush (struct block_store *store)
{
  block_table_reclaim (&store->table, stripes_sweep, store);
  backing_map_settle (store, false);
  zs_pool_flush (store->pool);
}

void
store_stats (struct block_store *store, struct store_stats *stats)
{
  struct zs_pool_stats pool;
  zs_pool_stats (store->pool, &pool);

  memset (stats, 0, sizeof *stats);
  stats->disk_size = store->size;
  stats->orig_data_size = atomic_load (&store->stored_blocks) * STORE_BLOCK_SIZE;
  stats->compr_data_size = atomic_load (&store->compr_bytes);
  stats->mem_used_total = pool.pages_used * ZS_PAGE_SIZE;
  stats->mem_limit = pool.mem_limit;
  stats->limit_used = pool.limit_used;
  stats->mem_used_max = pool.pages_used_max * ZS_PAGE_SIZE;
  stats->same_pages = atomic_load (&store->same_blocks);
  stats->pages_compacted = pool.pages_compacted;
  stats->pages_freeable = pool.pages_freeable;
  stats->compact_ms = atomic_load (&store->compact_ns) / 1000000;
  stats->huge_pages = atomic_load (&store->raw_blocks);
  stats->huge_pages_since = atomic_load (&store->raw_blocks_since);
  stats->failed_reads = atomic_load (&store->failed_reads);
  stats->failed_writes = atomic_load (&store->failed_writes);
  stats->invalid_io = atomic_load (&store->invalid_io);
  stats->notify_free = atomic_load (&store->notify_free);
  stats->reads = atomic_load (&store->reads);
  stats->writes = atomic_load (&store->writes);
  stats->table_bytes = atomic_load (&store->table.bytes);
  stats->metadata_bytes = pool.metadata_bytes;
  for (unsigned p = 0; p <= store->recomp_count; p++)
    stats->codec_bytes += codec_memory (store->codecs[p]);
  stats->recomp_blocks = atomic_load (&store->recomp_blocks);
  stats->packed_blocks = atomic_load (&store->packed_blocks);
  stats->pack_units = atomic_load (&store->pack_units);
  stats->recomp_bytes_saved = atomic_load (&store->recomp_bytes_saved);
  stats->reserve_bytes = pool.reserve_bytes;
  stats->reserve_refills = pool.reserve_refills;
  stats->reserve_misses = pool.reserve_misses;
  stats->reserve_metadata_misses = pool.metadata_misses;
  stats->codec_bytes += codec_memory (store->pack_codec);
  stats->codec_bytes += atomic_load (&store->write_scratch_bytes);
  stats->decode_cache_bytes = atomic_load (&store->decode_cache_bytes);
  stats->decode_cache_hits = atomic_load (&store->decode_cache_hits);
  stats->decode_cache_misses = atomic_load (&store->decode_cache_misses);
  stats->bd_count = atomic_load (&store->bd_count);
  stats->bd_reads = atomic_load (&store->bd_reads);
  stats->bd_writes = atomic_load (&store->bd_writes);
  stats->bd_bytes = atomic_load (&store->bd_bytes);
  stats->bd_failed_reads = atomic_load (&store->bd_failed_reads);
  stats->bd_readbacks = atomic_load (&store->bd_readbacks);
  if (store->backing) {
    struct backing_stats backing;
    backing_stats (store->backing, &backing);
    stats->backing_capacity = backing.capacity;
    stats->backing_used = backing.used;
    stats->backing_map_bytes = backing.map_bytes;
    stats->backing_failed = backing.failed;
    stats->backing_reconnects = backing.reconnects;
    stats->backing_timeouts = backing.timeouts;
    stats->backing_corrupt = backing.corrupt;
    stats->backing_abandoned = backing.abandoned;
    stats->backing_quarantined_bytes = backing.quarantined_bytes;
    stats->backing_errors_nospace = backing.errors_nospace;
    stats->backing_errors_io = backing.errors_io;
  }
  stats->writeback_limit_left = atomic_load (&store->writeback_limit);
}

