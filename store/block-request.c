/* The request layer, the store's highest: reads, writes (block by
 * block, or in batches through block-batch.c, whose leftovers it writes
 * again), trims, zeroes and extents, and making room for a write that
 * memory refused (the decode cache given up, then writeback).  It calls
 * down into the entry layer, the encoders and the movers; nothing in the
 * store calls it.
 */

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block-store-internal.h"

/* A write refused for memory tries again after each writeback that made
 * room, this many times at most (other writers may take the room first;
 * a writeback that writes nothing ends it at once).
 */
#define WRITEBACK_ATTEMPTS 64

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
 * the backing I/O (see block_read), by deadline_ms at most (the write's:
 * backing_wait_deadline).  Entered with the stripe locked and *old the
 * entry's content; returns with it locked again (or, if the block became
 * a hole, unlocked and NULL) and *old reloaded.  The run stays pinned
 * from before the unlock to after the relock, so it cannot be freed and
 * given to other data meanwhile: if the entry still names it with the
 * same zeroed range, nothing was stored since and *r says how the read
 * went.  *changed otherwise: the caller starts again.
 */
static struct block_entry *
backed_decode_unlocked (struct block_store *store, uint64_t block, bool create,
                        struct block_leaf **leaf, struct block_content *old,
                        unsigned char *buffer, uint64_t deadline_ms, int *r,
                        bool *changed)
{
  struct block_content snapshot = *old;
  unsigned epoch = backing_read_begin (store->backing);
  pthread_mutex_unlock (stripe_for (store, block));
  *r = block_decode_until (store, &snapshot, buffer, 0, deadline_ms);
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
 *
 * Reading a written-back block waits for the backing store: that wait
 * is the write's (*backing_deadline_ms, backing_wait_deadline), shared
 * with its waits for room.
 */
static int
block_patch (struct block_store *store, uint64_t block, const void *data,
             size_t from, size_t length, uint64_t *backing_deadline_ms)
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
                                    buffer, backing_wait_deadline
                                    (store, backing_deadline_ms), &r,
                                    &changed);
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
  entry_store (store, block, leaf, entry, &old, &content);
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
 * *backing_deadline_ms).  0: try the write again; -1 with errno as it
 * was when there is nothing to gain.
 */
static int
make_room (struct block_store *store, uint64_t *backing_deadline_ms)
{
  int err = errno;
  if (err == ENOSPC && decode_cache_trim (store) > 0) {
    errno = err;
    return 0;
  }
  return writeback_for_room (store, backing_deadline_ms);
}

/* Write one piece of a block (a whole block, or part of one), making
 * room by writeback and trying again when memory is short: 0, or -1
 * with errno.  *backing_deadline_ms: the request's one deadline for its
 * waits on the backing store (backing_wait_deadline): 0 before its
 * first such wait, then when they all end.
 */
static int
block_write_piece (struct block_store *store, uint64_t block,
                   const unsigned char *in, uint64_t from, uint64_t length,
                   uint64_t *backing_deadline_ms)
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
      r = block_patch (store, block, in, from, length, backing_deadline_ms);
    if (r == 0 || attempt == WRITEBACK_ATTEMPTS
        || make_room (store, backing_deadline_ms) == -1)
      return r;
  }
}

/* A write or zero that failed, counted (zram's failed_writes), unless it
 * failed for want of memory made ready (EAGAIN): its caller may wait and
 * try it again, and counts it with store_failed_write if it gives up.
 */
static void
failed_write_count (struct block_store *store)
{
  if (errno != EAGAIN)
    counter_add (&store->failed_writes, 1);
}

int
store_write (struct block_store *store, const void *buf, uint64_t count,
             uint64_t offset)
{
  const unsigned char *in = buf;
  uint64_t backing_deadline_ms = 0;     /* one for the whole request */
  room_failure_forget ();

  FOR_EACH_BLOCK_PIECE (offset, count, block, from, length) {
    /* Whole blocks, two or more: a batch (block-batch.c), and length
     * covers them all.
     */
    uint64_t whole = from == 0
      ? (offset + count - block * STORE_BLOCK_SIZE) / STORE_BLOCK_SIZE : 0;
    unsigned n = whole < store->write_batch ? whole : store->write_batch;
    int r;
    if (n >= 2) {
      bool stored[STORE_WRITE_BATCH_MAX];
      blocks_write_batch (store, block, in, n, stored);
      /* What the batch could not store, block by block (which can make
       * room by writeback, and says why it failed).
       */
      r = 0;
      for (unsigned i = 0; i < n && r == 0; i++)
        if (!stored[i])
          r = block_write_piece (store, block + i,
                                 in + (size_t) i * STORE_BLOCK_SIZE, 0,
                                 STORE_BLOCK_SIZE, &backing_deadline_ms);
      length = (uint64_t) n * STORE_BLOCK_SIZE;
    }
    else {
      n = 1;
      r = block_write_piece (store, block, in, from, length,
                             &backing_deadline_ms);
    }
    if (r == -1) {
      failed_write_count (store);
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

void
store_failed_write (struct block_store *store)
{
  counter_add (&store->failed_writes, 1);
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
  uint64_t backing_deadline_ms = 0;     /* one for the whole request */
  room_failure_forget ();
  FOR_EACH_BLOCK_PIECE (offset, count, block, from, length) {
    int r;
    if (piece_is_whole_block (store, block, from, length)) {
      struct block_content content = { .kind = may_trim ? BLOCK_EMPTY : BLOCK_SAME };
      r = block_install (store, block, &content);
      counter_add (&store->notify_free, 1);
    }
    else {
      for (unsigned attempt = 0; ; attempt++) {
        r = block_patch (store, block, NULL, from, length,
                         &backing_deadline_ms);
        if (r == 0 || attempt == WRITEBACK_ATTEMPTS
            || make_room (store, &backing_deadline_ms) == -1)
          break;
      }
    }
    if (r == -1) {
      failed_write_count (store);
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

