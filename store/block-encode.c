/* Encoding and decoding a block: a fill word, a compressed or raw object,
 * a packed unit's block, a written-back block; the zeroed overlay.  The
 * encoding layer (block-store-internal.h): it calls the codecs, the
 * allocator, unit-decode.c and the backing store's reads.  See
 * block-store.h for the design.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block-store-internal.h"

/* A block that is one 8-byte word repeated. */
bool
block_is_same_filled (const unsigned char *block, uint64_t *word)
{
  uint64_t first, next;
  memcpy (&first, block, sizeof first);
  for (size_t i = sizeof first; i < STORE_BLOCK_SIZE; i += sizeof next) {
    memcpy (&next, block + i, sizeof next);
    if (next != first)
      return false;
  }
  *word = first;
  return true;
}


int
block_compress (struct block_store *store, const unsigned char *block,
                unsigned char *out)
{
  int length = codec_compress (store->codecs[0], block, out,
                               store->raw_threshold - 1);
  if (length == 0) {
    memcpy (out, block, STORE_BLOCK_SIZE);
    length = STORE_BLOCK_SIZE;
  }
  return length;
}

int
block_encode (struct block_store *store, const unsigned char *block,
              struct block_content *content)
{
  unsigned char compressed[STORE_BLOCK_SIZE];

  content->zeroed = 0;
  content->flags = 0;           /* compressed by codecs[0] */
  if (block_is_same_filled (block, &content->value)) {
    content->kind = BLOCK_SAME;
    return 0;
  }
  int length = block_compress (store, block, compressed);
  if (length == -1)
    return -1;
  content->kind = length == STORE_BLOCK_SIZE ? BLOCK_RAW : BLOCK_COMPRESSED;
  zs_handle_t handle = object_alloc (store, length);
  if (!handle)
    return -1;
  zs_write (store->pool, handle, compressed, length);
  content->value = handle;
  return 0;
}

/* The union of a recorded zeroed range (0: none) and [first, end), if it
 * is one range: true, with *merged set.
 */
bool
zeroed_merge (uint32_t zeroed, size_t first, size_t end, uint32_t *merged)
{
  if (zeroed) {
    if (end < zeroed_first (zeroed) || first > zeroed_end (zeroed))
      return false;
    if (zeroed_first (zeroed) < first)
      first = zeroed_first (zeroed);
    if (zeroed_end (zeroed) > end)
      end = zeroed_end (zeroed);
  }
  *merged = zeroed_range (first, end);
  return true;
}

/* Encode a whole block into the object old holds, when it fits there:
 * needs no memory, so zeroing part of a block that holds data works at
 * the memory limit.  Under the stripe lock, which keeps readers of the
 * block out while its object is rewritten.  Returns 0 with content set (a
 * fill word, or old's object rewritten: compressed bytes that leave part
 * of it unused are BLOCK_COMPRESSED_PADDED), 1 if the block does not fit
 * (nothing changed), or -1 with errno.
 */
int
block_encode_in_place (struct block_store *store, const unsigned char *block,
                       const struct block_content *old,
                       struct block_content *content)
{
  content->zeroed = 0;
  content->flags = 0;           /* compressed by codecs[0] */
  if (block_is_same_filled (block, &content->value)) {
    content->kind = BLOCK_SAME;
    return 0;
  }
  /* In a region, a live object is never written over: a crash in the
   * middle would leave its block neither old nor new (HANDOVER in
   * block-store.h).
   */
  if (!content_has_object (old) || store->region)
    return 1;

  unsigned char compressed[STORE_BLOCK_SIZE];
  zs_handle_t handle = old->value;
  size_t size = zs_object_size (store->pool, handle);
  size_t room = zs_object_room (store->pool, handle);
  int length = codec_compress (store->codecs[0], block, compressed,
                               room < store->raw_threshold - 1
                               ? room : store->raw_threshold - 1);
  if (length == -1)
    return -1;
  content->value = handle;
  if (length > 0) {
    /* Exact when the slot's class fits the new size, padded (the object
     * keeps its size) when the new size belongs to a smaller class.
     */
    content->kind = BLOCK_COMPRESSED;
    if ((size_t) length != size
        && zs_resize (store->pool, handle, length) == -1)
      content->kind = BLOCK_COMPRESSED_PADDED;
    zs_write (store->pool, handle, compressed, length);
    return 0;
  }
  if (size == STORE_BLOCK_SIZE) {
    zs_write (store->pool, handle, block, STORE_BLOCK_SIZE);
    content->kind = BLOCK_RAW;
    return 0;
  }
  return 1;
}

/* Decode stored content into a whole block.  Under the stripe lock, but
 * for written-back content (see there).
 */
int
block_decode_until (struct block_store *store,
                    const struct block_content *content, unsigned char *block,
                    unsigned ahead, uint64_t deadline_ms)
{
  int r = 0;

  switch (content->kind) {
  case BLOCK_EMPTY:
    memset (block, 0, STORE_BLOCK_SIZE);
    return 0;
  case BLOCK_SAME:
    for (size_t i = 0; i < STORE_BLOCK_SIZE; i += sizeof content->value)
      memcpy (block + i, &content->value, sizeof content->value);
    break;
  case BLOCK_PACKED:
    r = unit_decode (store, content, block, ahead);
    break;
  case BLOCK_BACKED: {
    /* Without the stripe lock (block_read, block_patch): the caller's
     * backing_read_begin keeps the run from being freed and reused.
     */
    unsigned char compressed[STORE_BLOCK_SIZE];
    size_t length = backed_length (content->value);
    bool raw = length == STORE_BLOCK_SIZE;
    r = backing_read_block (store->backing, raw ? block : compressed, length,
                            backed_offset (content->value), deadline_ms);
    if (r == 0 && !raw)
      r = codec_decompress (content_codec (store, content), compressed, length,
                            false, block);
    if (r == -1) {
      counter_add (&store->bd_failed_reads, 1);
      errno = EIO;
    }
    else
      counter_add (&store->bd_reads, 1);
    break;
  }
  case BLOCK_RAW:
  case BLOCK_COMPRESSED:
  case BLOCK_COMPRESSED_PADDED: {
    unsigned char local_copy[STORE_BLOCK_SIZE];
    zs_handle_t handle = content->value;
    size_t length = zs_object_size (store->pool, handle);
    const void *object = zs_read_begin (store->pool, handle, local_copy);
    if (content->kind == BLOCK_RAW)
      memcpy (block, object, STORE_BLOCK_SIZE);
    else
      r = codec_decompress (content_codec (store, content), object, length,
                            content->kind == BLOCK_COMPRESSED_PADDED, block);
    zs_read_end (store->pool, handle, object);
    break;
  }
  }
  if (content->zeroed)
    memset (block + zeroed_first (content->zeroed), 0,
            zeroed_end (content->zeroed) - zeroed_first (content->zeroed));
  return r;
}

