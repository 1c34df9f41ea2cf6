/* Packed units read back: a unit's frames decoded from its parts,
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

/* The blocks frame number of a unit holds. */
static unsigned
frame_blocks (const struct pack_unit *unit, unsigned number)
{
  unsigned first = number * STORE_PACK_FRAME;
  return unit->count - first < STORE_PACK_FRAME ? unit->count - first
    : STORE_PACK_FRAME;
}

/* Decode frame number of a unit alone (with the unit's dictionary) into
 * data (room for its blocks), streamed straight from the parts that hold
 * it.  0, or -1 with errno.
 */
static int
unit_decode_frame (struct block_store *store, const struct pack_unit *unit,
                   unsigned number, unsigned char *data)
{
  const struct codec_decoder *decoder = NULL;
  if (unit->dictionary
      && !(decoder = dictionary_decoder (store, unit->dictionary)))
    return -1;
  size_t plain = (size_t) frame_blocks (unit, number) * STORE_BLOCK_SIZE;
  size_t at, length;
  unit_frame_at (unit, number, &at, &length);
  if (at + length > unit->length) {
    errno = EIO;                /* damaged: the frames outrun the unit */
    return -1;
  }
  struct codec_stream stream;
  if (codec_stream_begin (store->pack_codec, &stream, decoder, data,
                          plain) == -1)
    return -1;
  const zs_handle_t *part = unit_parts_const (unit);
  size_t end = at + length;
  int r = 0;
  while (r == 0 && at < end && stream.produced < plain) {
    unsigned i = at / STORE_PACK_PART;
    size_t offset = at % STORE_PACK_PART;
    size_t part_length = unit->length - (size_t) i * STORE_PACK_PART
      < STORE_PACK_PART ? unit->length - (size_t) i * STORE_PACK_PART
      : STORE_PACK_PART;
    size_t n = part_length - offset < end - at ? part_length - offset
      : end - at;
    const unsigned char *bytes = zs_read_begin (store->pool, part[i], NULL);
    r = codec_stream_feed (&stream, bytes + offset, n, plain);
    zs_read_end (store->pool, part[i], bytes);
    at += n;
  }
  size_t produced = stream.produced;
  codec_stream_end (&stream);
  if (r == 0 && produced != plain) {
    errno = EIO;                /* the frame ended early */
    r = -1;
  }
  return r;
}

/* The cache slot for unit id, locked: the one of its two places that
 * holds the unit or is decoding some of it (waiting for that decode),
 * else the least recently used of them that is free (made to hold
 * nothing of the unit yet: the caller decodes into it); with make false,
 * only one whose data is made already (no memory is taken).  NULL if
 * there is none: a reader never waits for another unit's decode.
 */
static struct unit_cache *
cache_slot_lock (struct block_store *store, uint64_t id, bool make)
{
  struct unit_cache *place[2];
  decode_cache_places (store, id, place);
  for (unsigned i = 0; i < 2; i++)
    if (atomic_load (&place[i]->id) == id) {
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
        place[i]->frames = 0;
        atomic_store (&place[i]->id, id);
      }
      return place[i];
    }
  return NULL;
}

/* Block index of unit out of a slot locked for it (cache_slot_lock,
 * its data made), decoding first the frames from the block's through
 * frame last that the slot does not hold yet; the slot unlocked on
 * return.  A decode that fails empties the slot.  counted: a read (the
 * hit and miss counters count reads).
 */
static int
cache_slot_read (struct block_store *store, struct unit_cache *slot,
                 const struct pack_unit *unit, unsigned index,
                 unsigned last, unsigned char *block, bool counted)
{
  int r = 0;
  unsigned first = index / STORE_PACK_FRAME;
  if (slot->frames & (UINT32_C (1) << first)) {
    if (counted)
      counter_add (&store->decode_cache_hits, 1);
  }
  else {
    if (counted)
      counter_add (&store->decode_cache_misses, 1);
    for (unsigned f = first; f <= last && r == 0; f++)
      if (!(slot->frames & (UINT32_C (1) << f))
          && (r = unit_decode_frame (store, unit, f, slot->data
                                     + (size_t) f * STORE_PACK_FRAME
                                     * STORE_BLOCK_SIZE)) == 0)
        slot->frames |= UINT32_C (1) << f;
    if (r == -1)
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
  unsigned number = index / STORE_PACK_FRAME;
  unsigned char *data = malloc ((size_t) frame_blocks (unit, number)
                                * STORE_BLOCK_SIZE);
  if (!data)
    return -1;
  int r = unit_decode_frame (store, unit, number, data);
  if (r == 0)
    memcpy (block, data + (size_t) (index % STORE_PACK_FRAME)
            * STORE_BLOCK_SIZE, STORE_BLOCK_SIZE);
  free (data);
  return r;
}

/* One block of a unit (and, ahead, how many of the blocks after it the
 * same request reads), through the decode cache.  A miss decodes the
 * frames that hold the block and the ones after it that the request
 * reads; readers of the same unit meanwhile wait for that decode, then
 * decode what they want of the rest.  Under the block's stripe lock,
 * which keeps the unit alive (the entry points to it).
 */
int
unit_decode (struct block_store *store, const struct block_content *content,
             unsigned char *block, unsigned ahead)
{
  const struct pack_unit *unit = content_unit (content);
  unsigned index = content->value & UNIT_INDEX_MASK;
  unsigned through = ahead < unit->count - index ? index + ahead
    : unit->count - 1u;

  struct unit_cache *slot = cache_slot_lock (store, unit->id, true);
  if (slot && !decode_cache_slot_make (store, slot)) {
    atomic_store (&slot->id, 0);
    pthread_mutex_unlock (&slot->lock);
    slot = NULL;
  }
  if (slot)
    return cache_slot_read (store, slot, unit, index,
                            through / STORE_PACK_FRAME, block, true);
  /* Both places busy with other units, or no memory for a slot: decode
   * for this read alone.
   */
  counter_add (&store->decode_cache_misses, 1);
  return unit_decode_alone (store, unit, index, block);
}

/* Writeback's decode: see block-store-internal.h.  Through a slot that
 * holds the unit, or one of its places whose memory is made and free
 * (writeback goes through a unit's blocks in order: each frame is
 * decoded there once), else alone.
 */
int
unit_decode_uncached (struct block_store *store,
                      const struct block_content *content,
                      unsigned char *block)
{
  const struct pack_unit *unit = content_unit (content);
  unsigned index = content->value & UNIT_INDEX_MASK;
  struct unit_cache *slot = cache_slot_lock (store, unit->id, false);
  if (slot && !slot->data) {    /* held the unit with no data: not kept */
    atomic_store (&slot->id, 0);
    pthread_mutex_unlock (&slot->lock);
    slot = NULL;
  }
  if (slot)
    return cache_slot_read (store, slot, unit, index,
                            index / STORE_PACK_FRAME, block, false);
  return unit_decode_alone (store, unit, index, block);
}

