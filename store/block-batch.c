/* Batched writes of whole blocks (a mover, block-store-internal.h: it
 * calls the entries and the encoders; what it could not store goes back
 * to the request layer, its caller).  A write of many blocks
 * (nbdcopy's 256 KiB, QEMU's up to 2 MiB, a swap-out cluster) pays for
 * a compression context, a class lock and a free batch once per batch,
 * not once per block.  See BATCHED WRITES in block-store-internal.h.
 *
 * What a batch never does is hold anything a reader needs for longer
 * than one block: the compression context it keeps for the batch is one
 * of the codec's slots, which a reader never waits for (borrowing passes
 * a busy slot over); the class locks are taken only while objects are
 * allocated, before any entry changes; and each block's entry changes
 * under that block's stripe lock alone, as in a write of one block.  The
 * seed's regression (a context held for a whole batch, decompressions
 * queued behind it) cannot happen here.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block-store-internal.h"

#define SCRATCH_BYTES ((size_t) STORE_WRITE_BATCH_MAX * STORE_BLOCK_SIZE)

/* Give a slot its buffer if it has none (counted in
 * write_scratch_bytes): the buffer, or NULL.  The slot is the caller's
 * (borrowed, or no write runs yet).
 */
static unsigned char *
scratch_make (struct block_store *store, struct write_scratch *slot)
{
  unsigned char *bytes = atomic_load_explicit (&slot->bytes,
                                               memory_order_relaxed);
  if (!bytes && (bytes = malloc (SCRATCH_BYTES))) {
    atomic_store_explicit (&slot->bytes, bytes, memory_order_relaxed);
    atomic_fetch_add (&store->write_scratch_bytes, SCRATCH_BYTES);
  }
  return bytes;
}

static void
scratch_return (struct write_scratch *slot)
{
  atomic_store_explicit (&slot->busy, false, memory_order_release);
}

/* A free scratch slot, made if it has no buffer yet; NULL if every slot
 * is busy or the buffer cannot be had (the caller goes block by block).
 */
static struct write_scratch *
scratch_borrow (struct block_store *store)
{
  for (unsigned i = 0; i < STORE_WRITE_SLOTS; i++) {
    struct write_scratch *slot = &store->write_scratch[i];
    if (atomic_load_explicit (&slot->busy, memory_order_relaxed)
        || atomic_exchange_explicit (&slot->busy, true, memory_order_acquire))
      continue;
    if (!scratch_make (store, slot)) {
      scratch_return (slot);
      return NULL;
    }
    return slot;
  }
  return NULL;
}

int
write_scratch_prepare (struct block_store *store)
{
  for (unsigned i = 0; i < STORE_WRITE_SLOTS; i++) {
    unsigned char *bytes = scratch_make (store, &store->write_scratch[i]);
    if (!bytes)
      return -1;
    memset (bytes, 0, SCRATCH_BYTES);   /* resident now, not mid-write */
  }
  return 0;
}

size_t
write_scratch_trim (struct block_store *store)
{
  size_t freed = 0;
  for (unsigned i = 0; i < STORE_WRITE_SLOTS; i++) {
    struct write_scratch *slot = &store->write_scratch[i];
    /* Borrowed, as a batch would: no batch uses it meanwhile. */
    if (atomic_exchange_explicit (&slot->busy, true, memory_order_acquire))
      continue;
    unsigned char *bytes = atomic_exchange (&slot->bytes, NULL);
    if (bytes) {
      free (bytes);
      atomic_fetch_sub (&store->write_scratch_bytes, SCRATCH_BYTES);
      freed += SCRATCH_BYTES;
    }
    scratch_return (slot);
  }
  return freed;
}

void
write_scratch_free (struct block_store *store)
{
  for (unsigned i = 0; i < STORE_WRITE_SLOTS; i++)
    free (atomic_load (&store->write_scratch[i].bytes));
}

/* Encode the blocks into contents[]: fill words, and objects compressed
 * in scratch, allocated in class runs and written.  stored[i] says
 * whether block i was encoded (false: memory was short, or the codec
 * failed; its content is then unset).
 */
static void
batch_encode (struct block_store *store, const unsigned char *in, unsigned n,
              unsigned char *scratch, struct block_content *contents,
              bool *stored)
{
  const unsigned char *sources[STORE_WRITE_BATCH_MAX];
  unsigned char *targets[STORE_WRITE_BATCH_MAX];
  unsigned which[STORE_WRITE_BATCH_MAX];
  int lengths[STORE_WRITE_BATCH_MAX];
  size_t sizes[STORE_WRITE_BATCH_MAX];
  zs_handle_t handles[STORE_WRITE_BATCH_MAX];
  unsigned count = 0;

  for (unsigned i = 0; i < n; i++) {
    const unsigned char *block = in + (size_t) i * STORE_BLOCK_SIZE;
    contents[i].zeroed = 0;
    contents[i].flags = 0;      /* compressed by codecs[0] */
    stored[i] = true;
    if (block_is_same_filled (block, &contents[i].value)) {
      contents[i].kind = BLOCK_SAME;
      continue;
    }
    sources[count] = block;
    targets[count] = scratch + (size_t) count * STORE_BLOCK_SIZE;
    which[count++] = i;
  }
  if (count == 0)
    return;

  if (codec_compress_blocks (store->codecs[0], sources, count, targets,
                             store->raw_threshold - 1, lengths) == -1) {
    for (unsigned j = 0; j < count; j++)
      stored[which[j]] = false;
    return;
  }
  for (unsigned j = 0; j < count; j++)
    sizes[j] = lengths[j] ? (size_t) lengths[j] : STORE_BLOCK_SIZE;
  objects_alloc_batch (store, sizes, count, handles);
  for (unsigned j = 0; j < count; j++) {
    struct block_content *content = &contents[which[j]];
    if (!handles[j]) {
      stored[which[j]] = false;
      continue;
    }
    /* Too big to gain from compression: the block itself, raw. */
    zs_write (store->pool, handles[j], lengths[j] ? targets[j] : sources[j],
              sizes[j]);
    content->kind = lengths[j] ? BLOCK_COMPRESSED : BLOCK_RAW;
    content->value = handles[j];
  }
}

void
blocks_write_batch (struct block_store *store, uint64_t first,
                    const unsigned char *in, unsigned n, bool stored[])
{
  struct block_content contents[STORE_WRITE_BATCH_MAX];
  zs_handle_t freed[STORE_WRITE_BATCH_MAX];
  unsigned freed_count = 0;

  struct write_scratch *slot = scratch_borrow (store);
  if (slot) {
    batch_encode (store, in, n, atomic_load_explicit (&slot->bytes,
                                                      memory_order_relaxed),
                  contents, stored);
    scratch_return (slot);
  }
  else
    memset (stored, 0, n * sizeof *stored);

  for (unsigned i = 0; i < n; i++) {
    struct block_content old;
    if (!stored[i])
      continue;
    if (block_install_swap (store, first + i, &contents[i], &old) == -1) {
      stored[i] = false;
      continue;
    }
    /* The old objects go as one batch; units and runs as they must. */
    if (content_has_object (&old))
      freed[freed_count++] = old.value;
    else
      content_discard (store, &old);
  }
  objects_free_many (store, freed, freed_count);
}
