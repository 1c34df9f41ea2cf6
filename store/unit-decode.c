/* Packed units read back: a unit's blocks decoded from its parts,
 * through the decode cache (block-store-internal.h, struct unit_cache).
 * The encoding layer: above the entries (it reads what an entry names,
 * under the block's stripe lock, which keeps the unit alive), below the
 * movers and the requests, which call it; it calls only the allocator,
 * the codecs and the cache's slots (decode-cache.c).
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block-store-internal.h"

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

static void
atomic_raise (_Atomic unsigned *value, unsigned to)
{
  unsigned now = atomic_load (value);
  while (now < to && !atomic_compare_exchange_weak (value, &now, to))
    ;
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
  decode_cache_places (store, id, place);
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
      decode_cache_slot_free (store, slot);
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
  if (slot && !decode_cache_slot_make (store, slot)) {
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

