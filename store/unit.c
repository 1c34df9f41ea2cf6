/* A packed unit's life: made by pack.c (unit_create), freed with its
 * parts and its decode cache slots when the last entry naming it lets
 * go (the entry layer's content_release, pack.c's unit_put), and all of
 * them at store_destroy.  Below the entries: it calls only the allocator,
 * the decode cache's slots (decode-cache.c) and the dictionaries
 * (pack-dictionary.c).
 */

#include <stdlib.h>

#include "block-store-internal.h"

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
    object_free (store, unit_parts (unit)[i]);
  counter_add (&store->compr_bytes, -(int64_t) unit->length);
  counter_add (&store->pack_units, -1);
  zs_pool_discharge (store->pool, unit_bytes (unit->parts, unit->count));
  decode_cache_forget (store, unit->id);
  dictionary_put (store, unit->dictionary);
  region_memory_free (store->region, unit);
}


void
units_free_all (struct block_store *store)
{
  while (store->units) {
    struct pack_unit *unit = store->units;
    store->units = unit->next;
    region_memory_free (store->region, unit);
  }
}

