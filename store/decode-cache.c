/* The decode cache's slots (block-store-internal.h, struct unit_cache):
 * made, freed, found for a unit, given up to writes and to the
 * housekeeper, forgotten with their unit.  Storage only, below the
 * entries (a unit that goes forgets its slots): it calls only the
 * allocator's charges; unit-decode.c decodes into them.
 */

#include <errno.h>
#include <stdlib.h>

#include "block-store-internal.h"

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
bool
decode_cache_slot_make (struct block_store *store, struct unit_cache *slot)
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
size_t
decode_cache_slot_free (struct block_store *store, struct unit_cache *slot)
{
  atomic_store (&slot->id, 0);
  slot->frames = 0;
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

/* The two places of the cache where unit id may be kept. */
void
decode_cache_places (struct block_store *store, uint64_t id,
              struct unit_cache *place[2])
{
  unsigned n = store->unit_cache_count;
  place[0] = &store->unit_cache[(id * 0x9E3779B97F4A7C15u >> 32) % n];
  place[1] = &store->unit_cache[(place[0] - store->unit_cache + 1) % n];
}

size_t
decode_cache_trim (struct block_store *store)
{
  size_t freed = 0;
  for (unsigned i = 0; i < store->unit_cache_count; i++) {
    struct unit_cache *slot = &store->unit_cache[i];
    if (pthread_mutex_trylock (&slot->lock) != 0)
      continue;                 /* in use: next time */
    freed += decode_cache_slot_free (store, slot);
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
      freed += decode_cache_slot_free (store, slot);
    pthread_mutex_unlock (&slot->lock);
  }
  dictionary_sweep (store);
  return freed;
}

/* A unit going: its slots are freed, so that the cache keeps (and
 * mem_limit counts) live units only.  Its lock is waited for: once the
 * unit's last reference went no read or move can use the unit, so a
 * holder is decoding another unit (or trimming) and waits for nothing
 * of ours.
 */
void
decode_cache_forget (struct block_store *store, uint64_t id)
{
  struct unit_cache *place[2];
  decode_cache_places (store, id, place);
  for (unsigned i = 0; i < 2; i++)
    if (atomic_load (&place[i]->id) == id) {
      pthread_mutex_lock (&place[i]->lock);
      if (atomic_load (&place[i]->id) == id)
        decode_cache_slot_free (store, place[i]);
      pthread_mutex_unlock (&place[i]->lock);
    }
}

