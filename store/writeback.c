/* Writeback to a backing store (zram's writeback, backing.h), and reads
 * that bring written-back blocks back.  A mover (block-store-internal.h):
 * it calls the walks, the entries' move protocol, the encoders and the
 * backing store.  See block-store.h for the design.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block-store-internal.h"
#include "monotonic.h"

/* ... and each writeback for a write refused for memory aims this far
 * below what the pool holds.
 */
#define WRITEBACK_ROOM ((uint64_t) 1 << 20)

bool
block_read_back_claim (struct block_store *store, struct block_leaf *leaf,
                       struct block_entry *entry,
                       const struct block_content *content)
{
  if (content->kind != BLOCK_BACKED || !store->readback_below
      || zs_pool_bytes (store->pool) >= store->readback_below)
    return false;
  return entry_claim_locked (leaf, entry);
}

void
block_read_back (struct block_store *store, uint64_t block,
                 const unsigned char *data, bool read_ok)
{
  struct block_content back, old;
  if (!read_ok || block_encode (store, data, &back) == -1) {
    entry_unclaim (store, block);   /* no memory: it stays where it is */
    return;
  }
  if (!entry_commit (store, block, &back, &old)) {
    content_discard (store, &back); /* a store came first */
    return;
  }
  content_discard (store, &old);   /* entry_commit accounted for it */
  counter_add (&store->bd_readbacks, 1);
}


/* A writeback pass. */
struct writeback_run {
  struct block_store *store;
  const struct store_writeback_request *request;
  uint32_t now;
  unsigned char *buffer;          /* writeback_batch blocks */
  struct store_writeback_result *result;
  bool (*keep_going) (void *opaque);
  void *opaque;
  uint64_t deadline_ms;           /* monotonic; 0: none.  No backing
                                     request waits past it */
};

/* Blocks rewritten in place at the memory limit (BLOCK_COMPRESSED_PADDED)
 * are left in RAM: their compressed length is not known without a decode
 * and they get a right-sized object with their next write.  Packed
 * blocks go compressed alone (the unit goes when its last block does).
 */
static bool
writeback_candidate (void *opaque, uint64_t block, uint64_t state)
{
  const struct writeback_run *run = opaque;
  const struct store_writeback_request *request = run->request;
  unsigned kind = block_state_kind (state);
  if (kind != BLOCK_COMPRESSED && kind != BLOCK_RAW && kind != BLOCK_PACKED)
    return false;
  if (block < request->first || block > request->last)
    return false;
  bool idle = state & BLOCK_FLAG_IDLE;
  switch (request->type) {
  case WRITEBACK_IDLE: if (!idle) return false; break;
  case WRITEBACK_HUGE: if (kind != BLOCK_RAW) return false; break;
  case WRITEBACK_HUGE_IDLE: if (kind != BLOCK_RAW || !idle) return false; break;
  case WRITEBACK_INCOMPRESSIBLE:
    if (!(state & BLOCK_FLAG_INCOMPRESSIBLE)) return false;
    break;
  case WRITEBACK_ANY: break;
  }
  return state_is_older (state, run->now, request->min_age);
}

/* A block claimed for writeback: its compressed bytes are at `at` in the
 * batch's buffer, and go to the same place in the batch's run.
 */
struct writeback_member {
  uint64_t block;
  size_t length;
  size_t at;
  unsigned flags;                 /* its codec and incompressibility */
  uint64_t where;                 /* its offset in the backing store */
};

static inline size_t
sectors_bytes (size_t bytes)
{
  return (bytes + BACKING_SECTOR - 1) / BACKING_SECTOR * BACKING_SECTOR;
}

/* Write the members' bytes (buffer, at bytes in all) to the backing
 * store: in one run, or, when the space map has no run that long, one
 * run per member.  Returns how many members were written (from the
 * first), each with its place set; 0 with result->failed or
 * backing_full set when none was.
 */
static unsigned
writeback_write (struct block_store *store, struct writeback_member *members,
                 unsigned count, const unsigned char *buffer, size_t at,
                 uint64_t deadline_ms, struct store_writeback_result *result)
{
  int64_t offset = backing_allocate (store->backing, at);
  if (offset != -1) {
    if (backing_write (store->backing, buffer, at, offset, deadline_ms) == -1) {
      backing_release (store->backing, offset, at);
      result->failed = true;
      result->backing_full = errno == ENOSPC;
      return 0;
    }
    for (unsigned i = 0; i < count; i++) {
      members[i].where = offset + members[i].at;
      backing_checksum_set (store->backing, members[i].where,
                            buffer + members[i].at, members[i].length);
    }
    return count;
  }
  for (unsigned i = 0; i < count; i++) {
    size_t bytes = sectors_bytes (members[i].length);
    if ((offset = backing_allocate (store->backing, bytes)) == -1) {
      result->backing_full = i == 0;
      return i;
    }
    if (backing_write (store->backing, buffer + members[i].at, bytes,
                       offset, deadline_ms) == -1) {
      backing_release (store->backing, offset, bytes);
      result->failed = i == 0;
      result->backing_full = errno == ENOSPC;
      return i;
    }
    members[i].where = offset;
    backing_checksum_set (store->backing, offset, buffer + members[i].at,
                          members[i].length);
  }
  return count;
}

/* Copy a claimed block's compressed bytes to out (under its stripe
 * lock): its object's bytes, or a packed block compressed alone with
 * codecs[0].  Their length, or -1.  A packed block is decoded without
 * filling the decode cache (unit_decode_uncached): slots made here would
 * be charged to the pool that this writeback is to make room in, and
 * left holding units that go with their last block.  Its zeroed overlay
 * stays in the entry.
 */
static int
writeback_copy (struct block_store *store, const struct block_content *claimed,
                unsigned char *out, unsigned *flags)
{
  if (claimed->kind == BLOCK_PACKED) {
    unsigned char plain[STORE_BLOCK_SIZE];
    *flags = 0;
    if (unit_decode_uncached (store, claimed, plain) == -1)
      return -1;
    return block_compress (store, plain, out);
  }
  zs_handle_t handle = claimed->value;
  size_t length = zs_object_size (store->pool, handle);
  const void *object = zs_read_begin (store->pool, handle, out);
  if (object != out)
    memcpy (out, object, length);
  zs_read_end (store->pool, handle, object);
  *flags = claimed->flags & (BLOCK_PRIORITY_MASK | BLOCK_FLAG_INCOMPRESSIBLE);
  return length;
}

static void
writeback_unclaim (struct block_store *store,
                   const struct writeback_member *members, unsigned count)
{
  for (unsigned i = 0; i < count; i++)
    entry_unclaim (store, members[i].block);
}

/* Write back up to writeback_batch blocks in one backing write, by the
 * move protocol: each is claimed and copied under its stripe lock; the
 * batch is written with no lock but writeback_lock held; then each moves
 * to the backing store if its claim holds, else its run is freed and it
 * stays as the store made it.  So a block leaves RAM only once its
 * backing write is confirmed.  Returns 0 (adds to result), or -1 with
 * errno (EIO: the write failed, nothing moved; ENOSPC: the backing store
 * or the writeback limit is full).
 */
static int
writeback_group (struct writeback_run *run, const uint64_t *blocks, unsigned n)
{
  struct block_store *store = run->store;
  struct store_writeback_result *result = run->result;
  unsigned char *buffer = run->buffer;
  /* Zeroed: gcc 12's -fanalyzer cannot follow count through the claims
   * and takes the members written for ones read uninitialised (10 KiB a
   * batch of backing writes).
   */
  struct writeback_member members[STORE_WRITEBACK_BATCH_MAX] = { 0 };
  unsigned count = 0;
  size_t at = 0;

  for (unsigned i = 0; i < n; i++) {
    struct block_content claimed;
    if (!entry_claim (store, blocks[i], writeback_candidate, run, &claimed))
      continue;
    unsigned flags;
    int length = writeback_copy (store, &claimed, buffer + at, &flags);
    pthread_mutex_unlock (stripe_for (store, blocks[i]));
    if (length == -1) {
      entry_unclaim (store, blocks[i]);
      continue;
    }
    members[count++] = (struct writeback_member) {
      .block = blocks[i], .length = length, .at = at, .flags = flags,
    };
    size_t padded = sectors_bytes (length);
    memset (buffer + at + length, 0, padded - length);
    at += padded;
  }
  if (count == 0)
    return 0;
  uint64_t limit = atomic_load (&store->writeback_limit);
  unsigned wanted = count;
  while (count > 0 && at > limit)
    at = members[--count].at;    /* what the limit lets through */
  writeback_unclaim (store, members + count, wanted - count);
  if (count == 0) {
    result->limited = true;
    errno = ENOSPC;
    return -1;
  }

  unsigned written = writeback_write (store, members, count, buffer, at,
                                     run->deadline_ms, result);
  writeback_unclaim (store, members + written, count - written);
  /* Durable before any RAM copy goes (unless backing_sync=false). */
  if (written > 0 && store->backing_sync
      && backing_sync (store->backing, run->deadline_ms) == -1) {
    for (unsigned i = 0; i < written; i++)
      backing_release (store->backing, members[i].where,
                       members[i].length);
    writeback_unclaim (store, members, written);
    result->failed = true;
    written = 0;
  }
  if (written == 0) {
    errno = result->failed ? EIO : ENOSPC;
    return -1;
  }
  if (limit != UINT64_MAX)
    atomic_fetch_sub (&store->writeback_limit,
                      members[written - 1].at
                      + sectors_bytes (members[written - 1].length));
  counter_add (&store->bd_writes, written);

  for (unsigned i = 0; i < written; i++) {
    struct writeback_member *member = &members[i];
    struct block_content backed = {
      .kind = BLOCK_BACKED, .value = backed_value (member->where,
                                                   member->length),
      .flags = member->flags,
    }, old;
    if (!entry_commit (store, member->block, &backed, &old)) {
      backing_release (store->backing, member->where, member->length);
      continue;                 /* written meanwhile: it stays */
    }
    content_discard (store, &old);
    result->blocks++;
    result->bytes += member->length;
  }
  return 0;
}

static bool
writeback_more (void *opaque, unsigned *group)
{
  struct writeback_run *run = opaque;
  uint64_t max = run->request->max_blocks, done = run->result->blocks;
  if ((max && done >= max) || (run->keep_going && !run->keep_going (run->opaque))
      || (run->deadline_ms && monotonic_ms () >= run->deadline_ms))
    return false;
  if (max && *group > max - done)
    *group = max - done;
  return true;
}

static int
writeback_some (void *opaque, const uint64_t *blocks, unsigned n)
{
  return writeback_group (opaque, blocks, n);
}

void
backing_map_settle (struct block_store *store, bool locked,
                    bool free_released)
{
  if (!store->backing)
    return;
  /* Runs released while reads were on, freed once those reads are done. */
  if (free_released)
    backing_settle_releases (store->backing);
  /* A shared map is charged by its owner (COLD TIER ACROSS STORES),
   * under the owner's writeback_lock: tried, as this store's may be held.
   */
  if (store->backing_owner) {
    store = store->backing_owner;
    locked = false;
  }
  if (!locked && pthread_mutex_trylock (&store->writeback_lock) != 0)
    return;
  struct backing_stats backing;
  backing_stats (store->backing, &backing);
  if (backing.map_bytes > store->map_charged) {
    if (zs_pool_charge (store->pool, backing.map_bytes - store->map_charged)
        == 0)
      store->map_charged = backing.map_bytes;
  }
  else if (backing.map_bytes < store->map_charged) {
    zs_pool_discharge (store->pool, store->map_charged - backing.map_bytes);
    store->map_charged = backing.map_bytes;
  }
  if (!locked)
    pthread_mutex_unlock (&store->writeback_lock);
}

/* One pass over the device for request; writeback_lock held. */
static int
writeback_pass (struct block_store *store,
                const struct store_writeback_request *request,
                bool (*keep_going) (void *opaque), void *opaque,
                uint64_t deadline_ms,
                unsigned char *buffer, struct store_writeback_result *result)
{
  struct writeback_run run = {
    .store = store, .request = request, .now = store_clock (store),
    .buffer = buffer, .result = result, .keep_going = keep_going,
    .opaque = opaque, .deadline_ms = deadline_ms,
  };
  struct candidates walk = {
    .first = request->first, .last = request->last,
    .group = store->writeback_batch, .wanted = writeback_candidate,
    .more = writeback_more, .work = writeback_some, .opaque = &run,
    .progress = &result->progress,
  };
  int r = candidates_walk (store, &walk);
  /* A write making room (deadline_ms) frees no released run: freeing an
   * NBD store's runs trims them, requests that would spend the write's
   * one backing_timeout on work it does not need, and that went out
   * with no deadline (seen: writes at the limit of a wedged store
   * failing with ENOSPC after twice the timeout).  The housekeeper's
   * next round frees them.
   */
  backing_map_settle (store, true, deadline_ms == 0);
  return r;
}

int
store_writeback (struct block_store *store,
                 const struct store_writeback_request *request,
                 bool (*keep_going) (void *opaque), void *opaque,
                 struct store_writeback_result *result)
{
  memset (result, 0, sizeof *result);
  if (!store->backing) {
    errno = ENODEV;
    return -1;
  }
  unsigned char *buffer = malloc ((size_t) store->writeback_batch
                                  * STORE_BLOCK_SIZE);
  if (!buffer)
    return -1;
  pthread_mutex_lock (&store->writeback_lock);
  int r = writeback_pass (store, request, keep_going, opaque, 0, buffer,
                          result);
  pthread_mutex_unlock (&store->writeback_lock);
  free (buffer);
  zs_pool_flush (store->pool);
  return r;
}

/* The pool's bytes now (what mem_limit counts). */
static uint64_t
pool_bytes (struct block_store *store)
{
  struct zs_pool_stats pool;
  zs_pool_stats (store->pool, &pool);
  return pool.limit_used;
}

/* store_writeback_until, where deadline_ms (monotonic, 0: none) bounds
 * it all: the wait for writeback_lock (-1 with errno ETIMEDOUT past it)
 * and every backing request; and slice batches are written back between
 * looks at the pool (1 for a write that needs room: it gets what it
 * needs and one batch more at most; 8 for the policy's runs, whose
 * passes each walk the table).
 */
static int
writeback_until (struct block_store *store, uint64_t target,
                 uint64_t max_blocks,
                 bool (*keep_going) (void *opaque), void *opaque,
                 uint64_t deadline_ms, unsigned slice,
                 struct store_writeback_result *result)
{
  memset (result, 0, sizeof *result);
  if (!store->backing) {
    errno = ENODEV;
    return -1;
  }
  /* Coldest first: idle blocks, then huge ones, then by age; each pass
   * over every store that shares this one's backing store (COLD TIER
   * ACROSS STORES) before the next.
   */
  static const struct { enum store_writeback_type type; uint32_t min_age; }
  passes[] = {
    { WRITEBACK_IDLE, 0 }, { WRITEBACK_HUGE, 0 },
    { WRITEBACK_ANY, 3600 }, { WRITEBACK_ANY, 600 }, { WRITEBACK_ANY, 60 },
    { WRITEBACK_ANY, 10 }, { WRITEBACK_ANY, 1 }, { WRITEBACK_ANY, 0 },
  };
  struct block_store *members[DEVICES_MAX + 1];
  unsigned count = budget_members_pin (store, members, DEVICES_MAX + 1);
  bool pinned = count > 0;
  if (!pinned) {
    members[0] = store;
    count = 1;
  }
  unsigned batch = 0;
  for (unsigned m = 0; m < count; m++)
    if (members[m]->writeback_batch > batch)
      batch = members[m]->writeback_batch;
  unsigned char *buffer = malloc ((size_t) batch * STORE_BLOCK_SIZE);
  int r = buffer ? 0 : -1;
  for (unsigned p = 0; p < sizeof passes / sizeof passes[0] && r == 0; p++)
    for (unsigned m = 0; m < count && r == 0; m++) {
      struct block_store *member = members[m];
      if (pool_bytes (store) <= target
          || (deadline_ms && monotonic_ms () >= deadline_ms)
          || (max_blocks && result->blocks >= max_blocks))
        goto done;
      if (mutex_lock_until (&member->writeback_lock, deadline_ms) != 0) {
        errno = ETIMEDOUT;
        r = -1;
        break;
      }
      /* The pool gives pages back only as zspages empty: write back a
       * slice, compact, look again.
       */
      uint64_t before;
      do {
        before = result->blocks;
        struct store_writeback_request request = {
          .type = passes[p].type, .min_age = passes[p].min_age,
          .first = 0, .last = UINT64_MAX,
          .max_blocks = result->blocks + slice * member->writeback_batch,
        };
        if (max_blocks && request.max_blocks > max_blocks)
          request.max_blocks = max_blocks;
        r = writeback_pass (member, &request, keep_going, opaque,
                            deadline_ms, buffer, result);
        zs_compact (member->pool);
      } while (r == 0 && result->blocks > before
               && (!max_blocks || result->blocks < max_blocks)
               && pool_bytes (store) > target
               && !(keep_going && !keep_going (opaque))
               && !(deadline_ms && monotonic_ms () >= deadline_ms));
      pthread_mutex_unlock (&member->writeback_lock);
    }
 done:
  if (pinned)
    budget_members_unpin (members, count);
  free (buffer);
  return r;
}

int
store_writeback_until (struct block_store *store, uint64_t target,
                       uint64_t max_blocks,
                       bool (*keep_going) (void *opaque), void *opaque,
                       struct store_writeback_result *result)
{
  return writeback_until (store, target, max_blocks, keep_going, opaque, 0,
                          8, result);
}

/* Why the calling thread's last writeback for room made none (NULL:
 * nothing to write back, or it made some): for the write's log line.
 */
static _Thread_local const char *room_failure;

const char *
store_room_failure (void)
{
  return room_failure;
}

void
room_failure_forget (void)
{
  room_failure = NULL;
}

uint64_t
backing_wait_deadline (struct block_store *store, uint64_t *deadline_ms)
{
  if (*deadline_ms == 0 && store->backing)
    *deadline_ms = monotonic_ms () + backing_timeout_ms (store->backing);
  return *deadline_ms;
}

/* A write refused for memory (errno ENOSPC) with a backing store: write
 * back the coldest blocks, compact, and let the write try again (0) if
 * the pool holds less than before.  -1 with errno as it was when there
 * is nothing to gain, or past the write's deadline (*deadline_ms,
 * backing_wait_deadline: started by the write's first wait on the
 * backing store, this one or a read before it): it bounds the write's
 * whole wait, for writeback_lock and backing requests alike, and the
 * passes trim nothing (writeback_pass), so that a wedged backing store
 * costs a write one timeout, not one per attempt or per kind of wait.
 * No lock held.
 */
int
writeback_for_room (struct block_store *store, uint64_t *deadline_ms)
{
  int err = errno;
  if (!store->backing || err != ENOSPC)
    return -1;
  if (monotonic_ms () >= backing_wait_deadline (store, deadline_ms)) {
    room_failure = "no room made within backing_timeout";
    return -1;
  }
  struct store_writeback_result result;
  uint64_t used = pool_bytes (store);
  int r = writeback_until (store, used > WRITEBACK_ROOM ? used - WRITEBACK_ROOM : 0,
                           0, NULL, NULL, *deadline_ms, 1, &result);
  room_failure = result.backing_full ? "the backing store is full"
    : result.failed ? "writes to the backing store fail"
    : result.limited ? "writeback_limit reached"
    : r == -1 && errno == ETIMEDOUT ? "no room made within backing_timeout"
    : NULL;
  errno = err;
  /* Room made by this call, or by another writer's while this one
   * waited for writeback_lock: try again.
   */
  return result.blocks > 0 || pool_bytes (store) < used ? 0 : -1;
}

bool
store_has_backing (const struct block_store *store)
{
  return store->backing != NULL;
}

void
store_cancel_backing_io (struct block_store *store)
{
  if (store->backing)
    backing_cancel (store->backing);
}

int
store_set_writeback_limit (struct block_store *store, bool limited,
                           uint64_t bytes)
{
  if (!store->backing) {
    errno = ENODEV;
    return -1;
  }
  /* UINT64_MAX is "no limit": a limit of that many bytes is one. */
  if (limited && bytes == UINT64_MAX)
    bytes--;
  pthread_mutex_lock (&store->writeback_lock);
  atomic_store (&store->writeback_limit, limited ? bytes : UINT64_MAX);
  pthread_mutex_unlock (&store->writeback_lock);
  return 0;
}

