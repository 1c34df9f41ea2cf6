/* Cold packing: units of idle blocks compressed together, their decode
 * cache, and dissolving them.  See block-store.h for the design.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block-store-internal.h"

/* A unit whose dissolve failed for memory is tried again after this many
 * seconds.
 */
#define DISSOLVE_RETRY_SECONDS 10
/* Units pinned by one walk of the unit list. */
#define DISSOLVE_BATCH 64

/* What a unit's descriptor takes (rounded up to its alignment). */
static inline size_t
unit_bytes (unsigned parts, unsigned count)
{
  size_t bytes = sizeof (struct pack_unit) + (parts + count) * sizeof (uint64_t);
  return (bytes + STORE_PACK_MAX - 1) / STORE_PACK_MAX * STORE_PACK_MAX;
}
static inline zs_handle_t *unit_parts (struct pack_unit *unit)
{
  return (zs_handle_t *) unit->words;
}
static inline const zs_handle_t *unit_parts_const (const struct pack_unit *unit)
{
  return (const zs_handle_t *) unit->words;
}
static inline uint64_t *unit_blocks (struct pack_unit *unit)
{
  return unit->words + unit->parts;
}

/* Decode a unit's blocks, from its first, into data (room for count
 * blocks) until at least through of them are out, or more if *more (the
 * blocks other readers of its cache slot wait for; NULL: none) grows
 * meanwhile, streamed straight from its parts: units are compressed in
 * steps of STORE_PACK_STEP blocks (pack_group), so decoding stops at the
 * end of the step that holds the last block wanted.  Returns the blocks
 * decoded, or -1 with errno.
 */
static int
unit_decode_prefix (struct block_store *store, const struct pack_unit *unit,
                    unsigned through, _Atomic unsigned *more,
                    unsigned char *data)
{
  struct codec_stream stream;
  if (codec_stream_begin (store->pack_codec, &stream, data,
                          (size_t) unit->count * STORE_BLOCK_SIZE) == -1)
    return -1;
  const zs_handle_t *part = unit_parts_const (unit);
  int r = 0;
  for (unsigned i = 0; i < unit->parts && r == 0; i++) {
    unsigned waited = more ? atomic_load (more) : 0;
    size_t wanted = (size_t) (waited > through ? waited : through)
      * STORE_BLOCK_SIZE;
    if (stream.produced >= wanted)
      break;
    size_t at = (size_t) i * STORE_PACK_PART;
    size_t length = unit->length - at < STORE_PACK_PART
      ? unit->length - at : STORE_PACK_PART;
    const void *bytes = zs_read_begin (store->pool, part[i], NULL);
    r = codec_stream_feed (&stream, bytes, length, wanted);
    zs_read_end (store->pool, part[i], bytes);
  }
  size_t produced = stream.produced;
  codec_stream_end (&stream);
  if (r == 0 && produced < (size_t) through * STORE_BLOCK_SIZE) {
    errno = EIO;                /* the unit ended early */
    r = -1;
  }
  return r == -1 ? -1 : (int) (produced / STORE_BLOCK_SIZE);
}

/* A cache slot's data, made (and charged to the pool) on first use.
 * The slot (in the store's array) owns it until cache_slot_free (its
 * unit went, a decode into it failed, decode_cache_trim,
 * store_decode_cache_sweep) or store_destroy frees it: gcc's analyzer
 * cannot follow a pointer stored in an array element, so its leak check
 * is off here.
 */
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif
static bool
cache_slot_make (struct block_store *store, struct unit_cache *slot)
{
  size_t bytes = (size_t) store->pack_blocks * STORE_BLOCK_SIZE;
  if (slot->data)
    return true;
  if (zs_pool_charge (store->pool, bytes) == -1)
    return false;
  if (!(slot->data = malloc (bytes))) {
    zs_pool_discharge (store->pool, bytes);
    return false;
  }
  counter_add (&store->decode_cache_bytes, bytes);
  return true;
}
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic pop
#endif

/* Empty a slot (its lock held) and give its data back: the bytes freed.
 * errno is kept (a failed decode's).
 */
static size_t
cache_slot_free (struct block_store *store, struct unit_cache *slot)
{
  atomic_store (&slot->id, 0);
  slot->blocks = 0;
  if (!slot->data)
    return 0;
  int err = errno;
  size_t bytes = (size_t) store->pack_blocks * STORE_BLOCK_SIZE;
  free (slot->data);
  slot->data = NULL;
  zs_pool_discharge (store->pool, bytes);
  counter_add (&store->decode_cache_bytes, -(int64_t) bytes);
  errno = err;
  return bytes;
}

static void
atomic_raise (_Atomic unsigned *value, unsigned to)
{
  unsigned now = atomic_load (value);
  while (now < to && !atomic_compare_exchange_weak (value, &now, to))
    ;
}

/* The two places of the cache where unit id may be kept. */
static void
cache_places (struct block_store *store, uint64_t id,
              struct unit_cache *place[2])
{
  unsigned n = store->unit_cache_count;
  place[0] = &store->unit_cache[(id * 0x9E3779B97F4A7C15u >> 32) % n];
  place[1] = &store->unit_cache[(place[0] - store->unit_cache + 1) % n];
}

/* The cache slot for unit id, locked: the one of its two places that
 * holds the unit or is decoding it (waiting for that decode, after
 * asking it to go on through block through), else the least recently
 * used of them that is free (made to hold nothing of the unit yet: the
 * caller decodes into it); with make false, only one whose data is made
 * already (no memory is taken).  NULL if there is none: a reader never
 * waits for another unit's decode.
 */
static struct unit_cache *
cache_slot_lock (struct block_store *store, uint64_t id, unsigned through,
                 bool make)
{
  struct unit_cache *place[2];
  cache_places (store, id, place);
  for (unsigned i = 0; i < 2; i++)
    if (atomic_load (&place[i]->id) == id) {
      atomic_raise (&place[i]->wanted, through);
      pthread_mutex_lock (&place[i]->lock);
      if (atomic_load (&place[i]->id) == id)
        return place[i];
      pthread_mutex_unlock (&place[i]->lock);   /* replaced meanwhile */
    }
  if (atomic_load (&place[1]->used) < atomic_load (&place[0]->used)) {
    struct unit_cache *older = place[1];
    place[1] = place[0];
    place[0] = older;
  }
  for (unsigned i = 0; i < 2; i++)
    if (pthread_mutex_trylock (&place[i]->lock) == 0) {
      if (atomic_load (&place[i]->id) != id) {
        if (!make && !place[i]->data) {
          pthread_mutex_unlock (&place[i]->lock);
          continue;
        }
        place[i]->blocks = 0;
        atomic_store (&place[i]->wanted, through);
        atomic_store (&place[i]->id, id);
      }
      return place[i];
    }
  return NULL;
}

/* Block index of unit out of a slot locked for it (cache_slot_lock,
 * its data made), decoding the unit through block through first if the
 * slot does not hold the block yet; the slot unlocked on return.  A
 * decode that fails empties the slot.  counted: a read (the hit and
 * miss counters count reads).
 */
static int
cache_slot_read (struct block_store *store, struct unit_cache *slot,
                 const struct pack_unit *unit, unsigned index,
                 unsigned through, unsigned char *block, bool counted)
{
  int r = 0;
  if (index < slot->blocks) {
    if (counted)
      counter_add (&store->decode_cache_hits, 1);
  }
  else {
    if (counted)
      counter_add (&store->decode_cache_misses, 1);
    /* Past a prefix decoded already: reads go through the unit. */
    if (slot->blocks > 0)
      through = unit->count;
    slot->blocks = 0;
    if ((r = unit_decode_prefix (store, unit, through, &slot->wanted,
                                 slot->data)) >= 0) {
      slot->blocks = r;
      r = 0;
    }
    else
      cache_slot_free (store, slot);
  }
  if (r == 0)
    memcpy (block, slot->data + (size_t) index * STORE_BLOCK_SIZE,
            STORE_BLOCK_SIZE);
  atomic_store (&slot->used, atomic_fetch_add (&store->unit_cache_clock, 1));
  pthread_mutex_unlock (&slot->lock);
  return r;
}

/* Block index of unit decoded into a buffer of the caller's alone. */
static int
unit_decode_alone (struct block_store *store, const struct pack_unit *unit,
                   unsigned index, unsigned char *block)
{
  unsigned char *data = malloc ((size_t) unit->count * STORE_BLOCK_SIZE);
  if (!data)
    return -1;
  int r = unit_decode_prefix (store, unit, index + 1, NULL, data);
  if (r >= 0) {
    memcpy (block, data + (size_t) index * STORE_BLOCK_SIZE, STORE_BLOCK_SIZE);
    r = 0;
  }
  free (data);
  return r;
}

/* One block of a unit (and, ahead, how many of the blocks after it the
 * same request reads), through the decode cache.  A miss decodes the
 * unit up to the step holding the last block wanted, by this read and by
 * the readers that came for the same unit meanwhile and wait for the
 * decode (a sequential reader's requests in flight, a run of neighbours:
 * one decode serves them all); a read past a cached prefix decodes the
 * rest.  Under the block's stripe lock, which keeps the unit alive (the
 * entry points to it).
 */
int
unit_decode (struct block_store *store, const struct block_content *content,
             unsigned char *block, unsigned ahead)
{
  const struct pack_unit *unit = content_unit (content);
  unsigned index = content->value & UNIT_INDEX_MASK;
  unsigned through = ahead < unit->count - index ? index + 1 + ahead
    : unit->count;

  struct unit_cache *slot = cache_slot_lock (store, unit->id, through, true);
  if (slot && !cache_slot_make (store, slot)) {
    atomic_store (&slot->id, 0);
    pthread_mutex_unlock (&slot->lock);
    slot = NULL;
  }
  if (slot)
    return cache_slot_read (store, slot, unit, index, through, block, true);
  /* Both places busy with other units, or no memory for a slot: decode
   * for this read alone.
   */
  counter_add (&store->decode_cache_misses, 1);
  return unit_decode_alone (store, unit, index, block);
}

/* Writeback's decode: see block-store-internal.h.  Through a slot that
 * holds the unit, or one of its places whose memory is made and free
 * (writeback goes through a unit's blocks in order: the whole unit is
 * decoded there once), else alone.
 */
int
unit_decode_uncached (struct block_store *store,
                      const struct block_content *content,
                      unsigned char *block)
{
  const struct pack_unit *unit = content_unit (content);
  unsigned index = content->value & UNIT_INDEX_MASK;
  struct unit_cache *slot = cache_slot_lock (store, unit->id, unit->count,
                                             false);
  if (slot && !slot->data) {    /* held the unit with no data: not kept */
    atomic_store (&slot->id, 0);
    pthread_mutex_unlock (&slot->lock);
    slot = NULL;
  }
  if (slot)
    return cache_slot_read (store, slot, unit, index, unit->count, block,
                            false);
  return unit_decode_alone (store, unit, index, block);
}

size_t
decode_cache_trim (struct block_store *store)
{
  size_t freed = 0;
  for (unsigned i = 0; i < store->unit_cache_count; i++) {
    struct unit_cache *slot = &store->unit_cache[i];
    if (pthread_mutex_trylock (&slot->lock) != 0)
      continue;                 /* in use: next time */
    freed += cache_slot_free (store, slot);
    pthread_mutex_unlock (&slot->lock);
  }
  return freed;
}

size_t
store_decode_cache_sweep (struct block_store *store)
{
  uint64_t since = atomic_exchange (&store->unit_cache_swept,
                                    atomic_load (&store->unit_cache_clock));
  bool idle_too = !atomic_load (&store->keep_resident);
  size_t freed = 0;
  for (unsigned i = 0; i < store->unit_cache_count; i++) {
    struct unit_cache *slot = &store->unit_cache[i];
    if (pthread_mutex_trylock (&slot->lock) != 0)
      continue;                 /* being read: not idle */
    if (slot->data
        && (atomic_load (&slot->id) == 0
            || (idle_too && atomic_load (&slot->used) < since)))
      freed += cache_slot_free (store, slot);
    pthread_mutex_unlock (&slot->lock);
  }
  return freed;
}

/* A unit going: its slots are freed, so that the cache keeps (and
 * mem_limit counts) live units only.  Its lock is waited for: once the
 * unit's last reference went no read or move can use the unit, so a
 * holder is decoding another unit (or trimming) and waits for nothing
 * of ours.
 */
static void
cache_forget (struct block_store *store, uint64_t id)
{
  struct unit_cache *place[2];
  cache_places (store, id, place);
  for (unsigned i = 0; i < 2; i++)
    if (atomic_load (&place[i]->id) == id) {
      pthread_mutex_lock (&place[i]->lock);
      if (atomic_load (&place[i]->id) == id)
        cache_slot_free (store, place[i]);
      pthread_mutex_unlock (&place[i]->lock);
    }
}

/* Free a unit: its last block moved out. */
void
unit_destroy (struct block_store *store, struct pack_unit *unit)
{
  pthread_mutex_lock (&store->units_lock);
  if (unit->prev)
    unit->prev->next = unit->next;
  else if (store->units == unit)
    store->units = unit->next;
  if (unit->next)
    unit->next->prev = unit->prev;
  pthread_mutex_unlock (&store->units_lock);
  for (unsigned i = 0; i < unit->parts; i++)
    zs_free (store->pool, unit_parts (unit)[i]);
  counter_add (&store->compr_bytes, -(int64_t) unit->length);
  counter_add (&store->pack_units, -1);
  zs_pool_discharge (store->pool, unit_bytes (unit->parts, unit->count));
  cache_forget (store, unit->id);
  free (unit);
}


void
units_free_all (struct block_store *store)
{
  while (store->units) {
    struct pack_unit *unit = store->units;
    store->units = unit->next;
    free (unit);
  }
}

/* Drop a reference to a unit (a block's, or a pin): the last frees it. */
static void
unit_put (struct block_store *store, struct pack_unit *unit)
{
  if (atomic_fetch_sub (&unit->live, 1) == 1)
    unit_destroy (store, unit);
}

static bool
dissolve_wanted (void *opaque, uint64_t block, uint64_t state)
{
  return block_state_kind (state) == BLOCK_PACKED;
}

/* Move the blocks still in a unit out, each stored alone again by the
 * move protocol (not an access: its time and idle flag stay).  plain,
 * if not NULL, holds the unit's blocks decoded.  The caller holds a
 * reference.  Returns how many blocks moved out; *complete says whether
 * none is left (false: no memory for one, or another mover held it).
 */
static unsigned
unit_dissolve (struct block_store *store, struct pack_unit *unit,
               const unsigned char *plain, bool *complete)
{
  unsigned moved = 0;
  *complete = true;
  for (unsigned i = 0; i < unit->count; i++) {
    uint64_t block = unit_blocks (unit)[i];
    unsigned char decoded[STORE_BLOCK_SIZE];
    struct block_content old, content;
    struct block_entry *entry = entry_claim (store, block, dissolve_wanted,
                                             NULL, &old);
    if (!entry) {
      /* Moved out already, or another mover holds it. */
      struct block_leaf *leaf;
      pthread_mutex_lock (stripe_for (store, block));
      struct block_content now = entry_load (block_table_lookup (&store->table,
                                                                 block, false,
                                                                 &leaf));
      if (now.kind == BLOCK_PACKED && now.value == ((uintptr_t) unit | i))
        *complete = false;
      pthread_mutex_unlock (stripe_for (store, block));
      continue;
    }
    if (old.value != ((uintptr_t) unit | i)) {
      pthread_mutex_unlock (stripe_for (store, block));
      entry_unclaim (store, block);     /* in another unit */
      continue;
    }
    /* Decode the data alone: the zeroed overlay stays in the entry. */
    old.zeroed = 0;
    int r = plain ? 0 : block_decode (store, &old, decoded);
    pthread_mutex_unlock (stripe_for (store, block));
    if (r == 0)
      r = block_encode (store, plain ? plain + (size_t) i * STORE_BLOCK_SIZE
                        : decoded, &content);
    if (r == -1) {
      entry_unclaim (store, block);
      *complete = false;
      continue;
    }
    if (entry_commit (store, block, &content, &old)) {
      content_discard (store, &old);    /* the unit's reference */
      moved++;
    }
    else
      content_discard (store, &content); /* written meanwhile */
  }
  return moved;
}

/* ---- packing ---------------------------------------------------------- */

/* A packing run. */
struct pack_run {
  struct block_store *store;
  uint64_t max_blocks;
  uint32_t now, min_age;
  unsigned char *plain, *compressed;   /* pack_blocks blocks each */
  struct store_pack_result *result;
  bool (*keep_going) (void *opaque);
  void *opaque;
};

/* Idle, old enough, an object of its own, no zeroed overlay. */
static bool
pack_candidate (void *opaque, uint64_t block, uint64_t state)
{
  const struct pack_run *run = opaque;
  unsigned kind = block_state_kind (state);
  return (state & BLOCK_FLAG_IDLE)
    && (kind == BLOCK_COMPRESSED || kind == BLOCK_RAW
        || kind == BLOCK_COMPRESSED_PADDED)
    && block_state_zeroed (state) == 0
    && state_is_older (state, run->now, run->min_age);
}

/* A block claimed for packing. */
struct pack_member {
  uint64_t block;
  size_t bytes;                   /* its object's */
};

static void
members_unclaim (struct block_store *store, const struct pack_member *members,
                 unsigned count)
{
  for (unsigned i = 0; i < count; i++)
    entry_unclaim (store, members[i].block);
}

/* A unit of count blocks, its parts holding compressed (length bytes),
 * charged to the pool; its own reference in live.  NULL with errno.
 */
static struct pack_unit *
unit_create (struct block_store *store, const struct pack_member *members,
             unsigned count, const unsigned char *compressed, size_t length)
{
  unsigned parts = (length + STORE_PACK_PART - 1) / STORE_PACK_PART;
  size_t descriptor = unit_bytes (parts, count);
  if (zs_pool_charge (store->pool, descriptor) == -1)
    return NULL;
  struct pack_unit *unit = aligned_alloc (STORE_PACK_MAX, descriptor);
  if (!unit) {
    zs_pool_discharge (store->pool, descriptor);
    return NULL;
  }
  unit->count = count;
  unit->length = length;
  unit->prev = unit->next = NULL;
  unit->dissolve_retry = 0;
  unit->id = atomic_fetch_add (&store->unit_ids, 1) + 1;
  unit->parts = parts;
  atomic_init (&unit->live, 1);
  for (unsigned i = 0; i < count; i++)
    unit_blocks (unit)[i] = members[i].block;
  for (unsigned i = 0; i < parts; i++) {
    size_t at = (size_t) i * STORE_PACK_PART;
    size_t part = length - at < STORE_PACK_PART ? length - at : STORE_PACK_PART;
    zs_handle_t handle = zs_malloc (store->pool, part);
    if (!handle) {
      int err = errno;
      for (unsigned j = 0; j < i; j++)
        zs_free (store->pool, unit_parts (unit)[j]);
      zs_pool_discharge (store->pool, descriptor);
      free (unit);
      errno = err;
      return NULL;
    }
    zs_write (store->pool, handle, compressed + at, part);
    unit_parts (unit)[i] = handle;
  }
  counter_add (&store->compr_bytes, length);
  counter_add (&store->pack_units, 1);
  return unit;
}

/* Pack up to pack_blocks blocks into one unit by the move protocol: each
 * is claimed and decoded under its stripe lock, all are compressed with
 * no lock held, then each moves in if its claim holds.  A unit that not
 * every block moved into is kept only if it takes less than the blocks
 * that did took; else they are put back (stored alone) and it goes.
 * Adds to result what was really packed.
 */
static int
pack_group (struct pack_run *run, const uint64_t *blocks, unsigned n)
{
  struct block_store *store = run->store;
  struct pack_member members[STORE_PACK_MAX];
  unsigned count = 0;
  size_t before = 0;

  for (unsigned i = 0; i < n; i++) {
    struct block_content old;
    if (!entry_claim (store, blocks[i], pack_candidate, run, &old))
      continue;
    size_t bytes = zs_object_size (store->pool, old.value);
    int r = block_decode (store, &old,
                          run->plain + (size_t) count * STORE_BLOCK_SIZE);
    pthread_mutex_unlock (stripe_for (store, blocks[i]));
    if (r == -1) {
      entry_unclaim (store, blocks[i]);
      continue;
    }
    members[count++] = (struct pack_member) { .block = blocks[i], .bytes = bytes };
    before += bytes;
  }
  if (count < 2) {
    members_unclaim (store, members, count);
    return 0;
  }

  /* A unit is worth it only if it takes less than its blocks did.  A
   * compression that fails skips this group: the run goes on.
   */
  int length = codec_compress_steps (store->pack_codec, run->plain,
                                     (size_t) count * STORE_BLOCK_SIZE,
                                     (size_t) STORE_PACK_STEP * STORE_BLOCK_SIZE,
                                     run->compressed, before);
  unsigned parts = length > 0 ? (length + STORE_PACK_PART - 1) / STORE_PACK_PART
    : 0;
  if (length <= 0 || (size_t) length + unit_bytes (parts, count) >= before) {
    members_unclaim (store, members, count);
    return 0;
  }
  struct pack_unit *unit = unit_create (store, members, count, run->compressed,
                                        length);
  if (!unit) {
    int err = errno;
    members_unclaim (store, members, count);
    errno = err;
    return err == ENOSPC ? 0 : -1;
  }

  unsigned moved = 0;
  size_t moved_bytes = 0;
  for (unsigned i = 0; i < count; i++) {
    struct block_content packed = {
      .kind = BLOCK_PACKED, .value = (uintptr_t) unit | i,
    }, old;
    /* The block's reference first: once in, a write may drop it. */
    atomic_fetch_add (&unit->live, 1);
    if (entry_commit (store, members[i].block, &packed, &old)) {
      content_discard (store, &old);
      moved++;
      moved_bytes += members[i].bytes;
    }
    else
      atomic_fetch_sub (&unit->live, 1);        /* written meanwhile */
  }
  size_t after = length + unit_bytes (parts, count);
  if (moved > 0 && moved < count && after >= moved_bytes) {
    /* Not worth it for the blocks that moved in: put them back. */
    bool complete;
    moved -= unit_dissolve (store, unit, run->plain, &complete);
    if (moved == 0)
      moved_bytes = 0;
  }
  if (moved > 0) {
    pthread_mutex_lock (&store->units_lock);
    unit->next = store->units;
    if (store->units)
      store->units->prev = unit;
    store->units = unit;
    pthread_mutex_unlock (&store->units_lock);
    run->result->units++;
    run->result->blocks += moved;
    run->result->bytes_before += moved_bytes;
    run->result->bytes_after += after;
  }
  unit_put (store, unit);       /* this call's reference */
  return 0;
}

static bool
pack_more (void *opaque, unsigned *group)
{
  struct pack_run *run = opaque;
  return !(run->max_blocks && run->result->blocks >= run->max_blocks)
    && !(run->keep_going && !run->keep_going (run->opaque));
}

static int
pack_some (void *opaque, const uint64_t *blocks, unsigned n)
{
  return pack_group (opaque, blocks, n);
}

int
store_pack (struct block_store *store, uint64_t max_blocks, uint32_t min_age,
            bool (*keep_going) (void *opaque), void *opaque,
            struct store_pack_result *result)
{
  memset (result, 0, sizeof *result);
  size_t unit_plain = (size_t) store->pack_blocks * STORE_BLOCK_SIZE;
  struct pack_run run = {
    .store = store, .max_blocks = max_blocks,
    .now = store_clock (store), .min_age = min_age,
    .plain = malloc (unit_plain), .compressed = malloc (unit_plain),
    .result = result, .keep_going = keep_going, .opaque = opaque,
  };
  struct candidates walk = {
    .first = 0, .last = UINT64_MAX, .group = store->pack_blocks,
    .wanted = pack_candidate, .more = pack_more, .work = pack_some,
    .opaque = &run,
  };
  int r = run.plain && run.compressed ? candidates_walk (store, &walk) : -1;
  free (run.plain);
  free (run.compressed);
  return r;
}

/* ---- dissolving ---------------------------------------------------------- */

/* Pin a unit to dissolve it (a reference of our own on live), if fewer
 * than live_percent of its blocks are still in it; under units_lock.
 * Never one whose last block already left (live 0): the thread that took
 * live to 0 owns it and is about to unlink and free it (it waits for
 * units_lock), so pinning it then would free it twice.
 */
static bool
unit_pin_if_sparse (struct pack_unit *unit, unsigned live_percent)
{
  uint32_t live = atomic_load (&unit->live);
  while (live > 0 && live * 100 < unit->count * live_percent)
    if (atomic_compare_exchange_weak (&unit->live, &live, live + 1))
      return true;
  return false;
}

/* Each walk of the unit list pins up to DISSOLVE_BATCH sparse units under
 * units_lock, one pass, then dissolves them with no lock held: a walk is
 * linear in the units, and writers freeing units wait for one walk at
 * most.  keep_going is asked before each unit.
 */
uint64_t
store_pack_dissolve (struct block_store *store, unsigned live_percent,
                     bool (*keep_going) (void *opaque), void *opaque)
{
  uint32_t now = store_clock (store);
  uint64_t dissolved = 0;
  bool going = true;
  while (going) {
    struct pack_unit *batch[DISSOLVE_BATCH];
    unsigned n = 0;
    pthread_mutex_lock (&store->units_lock);
    for (struct pack_unit *unit = store->units; unit && n < DISSOLVE_BATCH;
         unit = unit->next)
      if (unit->dissolve_retry <= now
          && unit_pin_if_sparse (unit, live_percent))
        batch[n++] = unit;
    pthread_mutex_unlock (&store->units_lock);
    for (unsigned i = 0; i < n; i++) {
      going = going && !(keep_going && !keep_going (opaque));
      bool complete = false;
      if (going)
        unit_dissolve (store, batch[i], NULL, &complete);
      if (complete)
        dissolved++;
      else if (going) {
        /* No memory (or a mover held a block): not again for a while. */
        pthread_mutex_lock (&store->units_lock);
        batch[i]->dissolve_retry = now + DISSOLVE_RETRY_SECONDS;
        pthread_mutex_unlock (&store->units_lock);
      }
      unit_put (store, batch[i]);
    }
    if (n < DISSOLVE_BATCH)
      break;
  }
  return dissolved;
}
