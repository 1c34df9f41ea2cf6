/* Packing's dictionaries (struct pack_dictionary, block-store-internal.h):
 * made current by a packing run that trained one, taken by each unit it
 * compresses with it, freed when the last unit and the store's current
 * reference let go; their decoders made on first use.  Below the units
 * (unit.c drops a unit's reference) and the packing runs; it calls only
 * the codecs, the region's memory and the pool's charges.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block-store-internal.h"
#include "crc32c.h"

static size_t
dictionary_struct_bytes (size_t size)
{
  return sizeof (struct pack_dictionary) + size;
}

/* Free the dictionary at place (its last reference went): under
 * dictionary_lock.
 */
static void
dictionary_free_locked (struct block_store *store, unsigned place)
{
  struct pack_dictionary *dictionary = atomic_load (&store->dictionaries[place]);
  struct codec_decoder *decoder = atomic_exchange (&store->decoders[place], NULL);
  size_t bytes = dictionary_struct_bytes (dictionary->size);
  if (decoder) {
    counter_add (&store->dictionary_bytes, -(int64_t) codec_decoder_bytes (decoder));
    codec_decoder_free (decoder);
  }
  atomic_store (&store->dictionaries[place], NULL);
  counter_add (&store->dictionary_bytes, -(int64_t) bytes);
  zs_pool_discharge (store->pool, bytes);
  region_memory_free (store->region, dictionary);
}

void
dictionary_put (struct block_store *store, unsigned number)
{
  if (number == 0)
    return;
  struct pack_dictionary *dictionary =
    atomic_load (&store->dictionaries[number - 1]);
  /* The last reference: no unit or run can take another. */
  if (atomic_fetch_sub (&dictionary->units, 1) == 1) {
    pthread_mutex_lock (&store->dictionary_lock);
    dictionary_free_locked (store, number - 1);
    pthread_mutex_unlock (&store->dictionary_lock);
  }
}

/* Drop a reference to dictionary number: under dictionary_lock. */
static void
dictionary_put_locked (struct block_store *store, unsigned number)
{
  if (atomic_fetch_sub (&atomic_load (&store->dictionaries[number - 1])->units,
                        1) == 1)
    dictionary_free_locked (store, number - 1);
}

/* Free the encoder (no run uses it): under dictionary_lock. */
static void
encoder_free_locked (struct block_store *store)
{
  counter_add (&store->dictionary_bytes,
               -(int64_t) codec_encoder_bytes (store->encoder));
  codec_encoder_free (store->encoder);
  store->encoder = NULL;
  store->encoder_used = false;
  if (store->encoder_dictionary)
    dictionary_put_locked (store, store->encoder_dictionary);
  store->encoder_dictionary = 0;
}

struct codec_encoder *
dictionary_encoder_borrow (struct block_store *store, unsigned *number)
{
  pthread_mutex_lock (&store->dictionary_lock);
  unsigned current = store->dictionary_current;
  if (store->encoder && store->encoder_dictionary != current
      && store->encoder_users == 0)
    encoder_free_locked (store);        /* for an older dictionary */
  if (!store->encoder && current) {
    const struct pack_dictionary *dictionary =
      atomic_load (&store->dictionaries[current - 1]);
    store->encoder = codec_encoder_make (store->pack_codec, dictionary->bytes,
                                         dictionary->size);
    if (store->encoder) {
      counter_add (&store->dictionary_bytes,
                   codec_encoder_bytes (store->encoder));
      store->encoder_dictionary = current;
      atomic_fetch_add (&atomic_load (&store->dictionaries[current - 1])->units,
                        1);
    }
  }
  struct codec_encoder *encoder = store->encoder;
  if (encoder) {
    store->encoder_users++;
    *number = store->encoder_dictionary;
  }
  pthread_mutex_unlock (&store->dictionary_lock);
  return encoder;
}

void
dictionary_encoder_return (struct block_store *store, bool used)
{
  pthread_mutex_lock (&store->dictionary_lock);
  store->encoder_users--;
  store->encoder_used |= used;
  if (store->encoder_users == 0
      && store->encoder_dictionary != store->dictionary_current)
    encoder_free_locked (store);
  pthread_mutex_unlock (&store->dictionary_lock);
}

void
dictionary_get (struct block_store *store, unsigned number)
{
  if (number)
    atomic_fetch_add (&atomic_load (&store->dictionaries[number - 1])->units,
                      1);
}

bool
dictionary_wanted (struct block_store *store, uint32_t now)
{
  pthread_mutex_lock (&store->dictionary_lock);
  uint64_t written = atomic_load (&store->writes) - store->dictionary_writes;
  uint32_t trained_at = store->dictionary_trained_at;
  bool wanted = written >= store->dictionary_stored
    && (trained_at == 0
        || now + 1 - trained_at >= STORE_DICTIONARY_SECONDS);
  pthread_mutex_unlock (&store->dictionary_lock);
  return wanted;
}

/* Under dictionary_lock: a dictionary was trained (or tried) now. */
static void
dictionary_tried_locked (struct block_store *store)
{
  uint64_t stored = atomic_load (&store->stored_blocks);
  store->dictionary_writes = atomic_load (&store->writes);
  store->dictionary_stored = stored > STORE_DICTIONARY_SAMPLES_MIN ? stored
    : STORE_DICTIONARY_SAMPLES_MIN;
}

void
dictionary_tried (struct block_store *store)
{
  pthread_mutex_lock (&store->dictionary_lock);
  dictionary_tried_locked (store);
  pthread_mutex_unlock (&store->dictionary_lock);
}

int
dictionary_install (struct block_store *store, const void *bytes, size_t size,
                    uint32_t now)
{
  size_t total = dictionary_struct_bytes (size);
  pthread_mutex_lock (&store->dictionary_lock);
  unsigned place = 0;
  while (place < STORE_DICTIONARIES && atomic_load (&store->dictionaries[place]))
    place++;
  struct pack_dictionary *dictionary = NULL;
  if (place < STORE_DICTIONARIES && zs_pool_charge (store->pool, total) == 0) {
    dictionary = region_memory_alloc (store->region, total, 16);
    if (!dictionary)
      zs_pool_discharge (store->pool, total);
  }
  if (!dictionary) {
    pthread_mutex_unlock (&store->dictionary_lock);
    errno = ENOSPC;             /* every place taken, or no memory */
    return -1;
  }
  memcpy (dictionary->bytes, bytes, size);
  dictionary->size = size;
  dictionary->crc = crc32c (bytes, size);
  atomic_init (&dictionary->units, 1);  /* the store's: it is current */
  counter_add (&store->dictionary_bytes, total);
  atomic_store (&store->dictionaries[place], dictionary);
  unsigned old = store->dictionary_current;
  store->dictionary_current = place + 1;
  dictionary_tried_locked (store);
  store->dictionary_trained_at = now + 1;
  if (store->encoder && store->encoder_users == 0)
    encoder_free_locked (store);        /* for the old one */
  if (old)
    dictionary_put_locked (store, old);
  pthread_mutex_unlock (&store->dictionary_lock);
  return 0;
}

void
dictionary_sweep (struct block_store *store)
{
  pthread_mutex_lock (&store->dictionary_lock);
  if (store->encoder && store->encoder_users == 0 && !store->encoder_used)
    encoder_free_locked (store);
  store->encoder_used = false;
  unsigned current = store->dictionary_current;
  bool unused = current && !store->encoder
    && atomic_load (&atomic_load (&store->dictionaries[current - 1])->units)
    == 1;                       /* the store's own reference alone */
  if (unused && store->dictionary_unused) {
    /* Unused since the last sweep too: not one just trained whose run
     * ran out of time before its first unit.
     */
    store->dictionary_current = 0;
    store->dictionary_stored = 0;       /* the next run trains one */
    store->dictionary_trained_at = 0;
    dictionary_free_locked (store, current - 1);
    unused = false;
  }
  store->dictionary_unused = unused;
  pthread_mutex_unlock (&store->dictionary_lock);
}

const struct pack_dictionary *
dictionary_at (struct block_store *store, unsigned number)
{
  return number ? atomic_load (&store->dictionaries[number - 1]) : NULL;
}

const struct codec_decoder *
dictionary_decoder (struct block_store *store, unsigned number)
{
  struct codec_decoder *decoder = atomic_load (&store->decoders[number - 1]);
  if (decoder)
    return decoder;
  const struct pack_dictionary *dictionary = dictionary_at (store, number);
  if (!dictionary) {
    errno = EIO;                /* lost in a recovery: memory was damaged */
    return NULL;
  }
  struct codec_decoder *made = codec_decoder_make (dictionary->bytes,
                                                   dictionary->size);
  if (!made)
    return NULL;
  if (!atomic_compare_exchange_strong (&store->decoders[number - 1], &decoder,
                                       made)) {
    codec_decoder_free (made);  /* another reader's came first */
    return decoder;
  }
  counter_add (&store->dictionary_bytes, codec_decoder_bytes (made));
  return made;
}

bool
dictionary_recover_check (struct block_store *store, unsigned number)
{
  if (number == 0)
    return true;
  if (number > STORE_DICTIONARIES)
    return false;
  const struct pack_dictionary *dictionary =
    atomic_load (&store->dictionaries[number - 1]);
  return dictionary
    && region_contains (store->region, dictionary, sizeof *dictionary)
    && dictionary->size <= STORE_DICTIONARY_BYTES
    && region_contains (store->region, dictionary,
                        dictionary_struct_bytes (dictionary->size))
    && crc32c (dictionary->bytes, dictionary->size) == dictionary->crc;
}

uint64_t
dictionaries_recover (struct block_store *store, const uint32_t *units)
{
  uint64_t charged = 0;
  store->encoder_dictionary = 0;      /* the dead owner's: not counted */
  if (store->dictionary_current > STORE_DICTIONARIES
      || !dictionary_recover_check (store, store->dictionary_current))
    store->dictionary_current = 0;
  for (unsigned place = 0; place < STORE_DICTIONARIES; place++) {
    struct pack_dictionary *dictionary = atomic_load (&store->dictionaries[place]);
    uint32_t references = units[place]
      + (store->dictionary_current == place + 1);
    bool sound = references > 0 && dictionary_recover_check (store, place + 1);
    size_t bytes = sound ? dictionary_struct_bytes (dictionary->size) : 0;
    if (!sound || !region_recover_claim (store->region, dictionary, bytes, 16)) {
      /* Unreached (the region's recovery gives it back), or damaged. */
      atomic_store (&store->dictionaries[place], NULL);
      if (store->dictionary_current == place + 1)
        store->dictionary_current = 0;
      continue;
    }
    atomic_store (&dictionary->units, references);
    charged += bytes;
  }
  return charged;
}

void
dictionaries_adopt (struct block_store *store)
{
  /* The old owner's decoders and encoder went with it; the encoder's
   * reference on its dictionary goes now (no other thread runs yet).
   */
  for (unsigned place = 0; place < STORE_DICTIONARIES; place++)
    atomic_store (&store->decoders[place], NULL);
  store->encoder = NULL;
  store->encoder_users = 0;
  store->encoder_used = false;
  if (store->encoder_dictionary)
    dictionary_put_locked (store, store->encoder_dictionary);
  store->encoder_dictionary = 0;
  uint64_t bytes = 0;
  for (unsigned place = 0; place < STORE_DICTIONARIES; place++) {
    const struct pack_dictionary *dictionary =
      atomic_load (&store->dictionaries[place]);
    if (dictionary)
      bytes += dictionary_struct_bytes (dictionary->size);
  }
  atomic_store (&store->dictionary_bytes, bytes);
}

void
dictionaries_free_all (struct block_store *store)
{
  codec_encoder_free (store->encoder);
  store->encoder = NULL;
  store->encoder_dictionary = 0;
  for (unsigned place = 0; place < STORE_DICTIONARIES; place++) {
    struct pack_dictionary *dictionary = atomic_load (&store->dictionaries[place]);
    codec_decoder_free (atomic_exchange (&store->decoders[place], NULL));
    if (dictionary) {
      zs_pool_discharge (store->pool, dictionary_struct_bytes (dictionary->size));
      region_memory_free (store->region, dictionary);
    }
    atomic_store (&store->dictionaries[place], NULL);
  }
  store->dictionary_current = 0;
}
