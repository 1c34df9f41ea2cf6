/* A store in a region whose server died: rebuilt from its block table
 * (store_recover in block-store.h, RECOVERY in alloc/region.h).
 *
 * The table is the truth: an acknowledged write's entry was written
 * before the write returned, and what it points to (an object, a packed
 * unit) was complete before the entry pointed to it.  So:
 *   1. torn entries are put back: a stripe whose intent is set was
 *      between an entry's two words (entry_write), for a write that was
 *      never acknowledged; the entry gets the pair it held;
 *   2. the table is walked (block_table_recover): each node claimed in
 *      the region, each entry checked - its object handed to the pool's
 *      recovery (a handle that names no live object empties the entry,
 *      counted as lost: it does not happen unless memory was damaged),
 *      its unit counted, movers' claims cleared;
 *   3. each unit that entries still name is claimed with its parts, its
 *      live count set to those entries, the list of units made anew;
 *      units no entry names are free (a pack or dissolve cut short);
 *      then each dictionary units name (or the current one) is checked
 *      (its CRC) and claimed, its count set to those units;
 *   4. the pool rebuilt around the handles (zs_recover_end), the
 *      region's heap closed (region_recover_end: what nothing reached is
 *      given back), the counters recomputed from the walk;
 *   5. the cold tier's space map (a written-back block's entry was
 *      written after its run was taken and its checksum kept): the runs
 *      entries reach marked in step 2, the rest quarantined or freed
 *      (space_map_recover_end);
 *   6. then as a clean take-over: this process's parts made anew.
 * Every step reads what a crash cannot leave half written, or checks it;
 * and no step destroys what it or a later one reads, so a recovery that
 * is itself killed leaves a region the next recovery, started over,
 * brings to the same result (RECOVERY in alloc/region.h): intents are
 * cleared only after their entries are put back, an entry is emptied
 * only when its content is refused (as the next attempt would refuse
 * it), and everything else is made anew from the table.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block-store-internal.h"
#include "space-map.h"

/* A unit met in the walk, and the entries that name it. */
struct unit_met {
  struct pack_unit *unit;
  uint64_t entries;
};

struct recovery_walk {
  struct block_store *store;
  struct zs_recovery *pool;
  struct space_map_recovery *backing_map;   /* NULL: no cold tier */
  uint64_t backed, backed_bytes;
  struct unit_met *units;         /* open addressing by address */
  size_t unit_capacity, unit_count;
  struct store_recover_result *result;
  uint64_t compr_bytes, same, raw, packed, stored;
  uint64_t quota_bytes;           /* the objects' rooms (BUDGET) */
  uint64_t charged;               /* what the stores' units, dictionaries
                                     and tables charge the pool */
};

static struct unit_met *
unit_find (struct recovery_walk *walk, struct pack_unit *unit)
{
  if (walk->unit_count * 2 >= walk->unit_capacity) {
    size_t capacity = walk->unit_capacity ? walk->unit_capacity * 2 : 1024;
    struct unit_met *bigger = calloc (capacity, sizeof *bigger);
    if (!bigger)
      return NULL;
    for (size_t i = 0; i < walk->unit_capacity; i++) {
      struct unit_met *met = &walk->units[i];
      if (!met->unit)
        continue;
      size_t j = ((uintptr_t) met->unit / STORE_PACK_MAX) % capacity;
      while (bigger[j].unit)
        j = (j + 1) % capacity;
      bigger[j] = *met;
    }
    free (walk->units);
    walk->units = bigger;
    walk->unit_capacity = capacity;
  }
  size_t i = ((uintptr_t) unit / STORE_PACK_MAX) % walk->unit_capacity;
  while (walk->units[i].unit && walk->units[i].unit != unit)
    i = (i + 1) % walk->unit_capacity;
  if (!walk->units[i].unit) {
    walk->units[i].unit = unit;
    walk->unit_count++;
  }
  return &walk->units[i];
}

/* One entry of the table: true if it holds content (after the checks). */
static bool
entry_recover (void *opaque, uint64_t block, struct block_entry *entry)
{
  struct recovery_walk *walk = opaque;
  struct block_store *store = walk->store;
  if (block % 256 == 0)
    recovery_step ("store: table walk");
  uint64_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
  uint64_t value = atomic_load_explicit (&entry->value, memory_order_relaxed);
  unsigned kind = block_state_kind (state);
  bool keep;
  /* A dead mover's claim goes. */
  state &= ~(uint64_t) (BLOCK_MOVE_HELD | BLOCK_MOVE_INTACT);
  switch (kind) {
  case BLOCK_EMPTY:
    keep = false;
    break;
  case BLOCK_SAME:
    walk->same++;
    keep = true;
    break;
  case BLOCK_COMPRESSED:
  case BLOCK_RAW:
  case BLOCK_COMPRESSED_PADDED:
    keep = zs_recover_handle (walk->pool, value);
    if (keep) {
      walk->compr_bytes += zs_object_size (store->pool, value);
      walk->quota_bytes += zs_object_room (store->pool, value);
      walk->raw += kind == BLOCK_RAW;
    }
    break;
  case BLOCK_PACKED: {
    struct pack_unit *unit = (struct pack_unit *) (uintptr_t)
      (value & ~UNIT_INDEX_MASK);
    struct unit_met *met = NULL;
    keep = region_contains (store->region, unit, sizeof *unit)
      && (value & UNIT_INDEX_MASK) < unit->count
      && (met = unit_find (walk, unit)) != NULL;
    if (keep) {
      met->entries++;
      walk->packed++;
    }
    break;
  }
  case BLOCK_BACKED:
    keep = walk->backing_map
      && space_map_recover_run (walk->backing_map, backed_offset (value),
                                backed_length (value));
    if (keep) {
      walk->backed++;
      walk->backed_bytes += backed_length (value);
    }
    break;
  default:
    keep = false;
    break;
  }
  if (!keep && kind != BLOCK_EMPTY)
    walk->result->lost_blocks++;
  if (!keep)
    state = 0;
  atomic_store_explicit (&entry->state, state, memory_order_relaxed);
  if (!keep)
    atomic_store_explicit (&entry->value, 0, memory_order_relaxed);
  walk->stored += keep;
  return keep;
}

/* Torn entries back to what they held (step 1). */
static void
intents_undo (struct block_store *store, struct store_recover_result *result)
{
  for (unsigned s = 0; s < STORE_STRIPES; s++) {
    struct stripe_intent *intent = &store->intents[s];
    struct block_entry *entry = (struct block_entry *) (uintptr_t)
      atomic_load (&intent->entry);
    if (!entry)
      continue;
    if (region_contains (store->region, entry, sizeof *entry)
        && (uintptr_t) entry % _Alignof (struct block_entry) == 0) {
      atomic_store (&entry->value, intent->value);
      atomic_store (&entry->state, intent->state);
      result->torn_entries++;
    }
    atomic_store (&intent->entry, 0);
  }
}

/* Units named by entries: claimed with their parts, their counts and
 * list made anew (step 3).  Returns the bytes they charge the pool.
 */
static uint64_t
units_recover (struct recovery_walk *walk)
{
  struct block_store *store = walk->store;
  uint64_t charged = 0, units = 0;
  uint32_t dictionary_units[STORE_DICTIONARIES] = { 0 };
  store->units = NULL;
  for (size_t i = 0; i < walk->unit_capacity; i++) {
    struct pack_unit *unit = walk->units[i].unit;
    if (!unit)
      continue;
    size_t bytes = unit_bytes (unit->parts, unit->count);
    if (!region_recover_claim (store->region, unit, bytes, STORE_PACK_MAX)) {
      walk->result->lost_units++;
      continue;
    }
    bool whole = true;
    for (unsigned p = 0; p < unit->parts; p++) {
      bool kept = zs_recover_handle (walk->pool, unit_parts (unit)[p]);
      if (kept)
        walk->quota_bytes += zs_object_room (store->pool, unit_parts (unit)[p]);
      whole &= kept;
    }
    if (unit->dictionary > STORE_DICTIONARIES)
      unit->dictionary = 0;     /* damaged: its reads fail (EIO) */
    if (!whole || !dictionary_recover_check (store, unit->dictionary))
      walk->result->lost_units++;
    if (unit->dictionary)
      dictionary_units[unit->dictionary - 1]++;
    atomic_store (&unit->live, walk->units[i].entries);
    unit->dissolve_retry = 0;
    unit->prev = NULL;
    unit->next = store->units;
    if (store->units)
      store->units->prev = unit;
    store->units = unit;
    walk->compr_bytes += unit->length;
    charged += bytes;
    units++;
  }
  atomic_store (&store->pack_units, units);
  return charged + dictionaries_recover (store, dictionary_units);
}

/* One store of the region (its struct claimed), its blocks walked into
 * the pool's recovery (steps 1 to 3) and its counters set from them.
 */
static void
store_walk (struct block_store *store, struct recovery_walk *walk)
{
  struct recovery_walk one = {
    .store = store, .pool = walk->pool, .result = walk->result,
    /* The devices' runs are in the root's map (COLD TIER ACROSS STORES). */
    .backing_map = walk->backing_map,
  };
  intents_undo (store, walk->result);
  recovery_step ("store: torn entries put back");
  block_table_recover (&store->table, entry_recover, &one);
  recovery_step ("store: table walked");
  walk->charged += units_recover (&one)
    + (store->table.pool ? atomic_load (&store->table.bytes) : 0);
  free (one.units);
  recovery_step ("store: units recovered");
  atomic_store (&store->stored_blocks, one.stored);
  atomic_store (&store->compr_bytes, one.compr_bytes);
  atomic_store (&store->same_blocks, one.same);
  atomic_store (&store->raw_blocks, one.raw);
  atomic_store (&store->packed_blocks, one.packed);
  atomic_store (&store->bd_count, one.backed);
  atomic_store (&store->bd_bytes, one.backed_bytes);
  atomic_store (&store->quota_bytes, one.quota_bytes);
  walk->result->blocks += one.stored;
}

/* A device's store (store_devices_recover): false if it is not where a
 * store on the root's pool can be (then nothing of it was touched).
 */
static bool
device_walk (struct block_store *store, void *opaque)
{
  struct recovery_walk *walk = opaque;
  if (store == walk->store
      || !region_recover_claim (walk->store->region, store,
                                store_struct_bytes (true),
                                _Alignof (struct block_store))
      || !store->shares_pool || store->pool != walk->store->pool)
    return false;
  store_walk (store, walk);
  walk->result->devices++;
  return true;
}

struct block_store *
store_recover (struct region *region, const struct store_config *config,
               struct store_recover_result *result, char *why,
               size_t why_bytes)
{
  uint64_t start = monotonic_ns ();
  struct block_store *store = region_root (region);
  const char *wrong = store_config_mismatch (region, config);
  *result = (struct store_recover_result) { 0 };
  if (wrong) {
    snprintf (why, why_bytes, "%s", wrong);
    errno = EINVAL;
    return NULL;
  }
  region_recovery_start (region);
  recovery_step ("store: recovery marked");
  region_recover_begin (region);
  recovery_step ("region: allocations forgotten");
  struct recovery_walk walk = { .store = store, .result = result };
  if (!region_recover_claim (region, store, store_struct_bytes (true),
                             _Alignof (struct block_store))
      || !(walk.pool = zs_recover_begin (store->pool))) {
    snprintf (why, why_bytes, "the store's own memory is not where it "
              "should be: the region is damaged");
    errno = EINVAL;
    return NULL;
  }
  if (store->backing_map
      && (!region_recover_claim (region, store->backing_map,
                                 sizeof *store->backing_map, 16)
          || !(walk.backing_map = space_map_recover_begin (store->backing_map)))) {
    snprintf (why, why_bytes, "the cold tier's space map is not where it "
              "should be: the region is damaged");
    errno = EINVAL;
    return NULL;
  }
  store_walk (store, &walk);
  /* The devices on its pool: their handles into the same recovery, so
   * that the pool is rebuilt once from them all.
   */
  result->lost_devices = store_devices_recover (store, device_walk, &walk);
  recovery_step ("store: devices walked");
  struct zs_recover_result pool_result;
  if (zs_recover_end (walk.pool, walk.charged, &pool_result) == -1) {
    space_map_recover_abandon (walk.backing_map);
    snprintf (why, why_bytes, "the allocator's own structures are damaged: "
              "%m");
    return NULL;
  }
  result->objects_refused = pool_result.refused;
  result->pages_given_back = region_recover_end (region);
  recovery_step ("region: unreached pages given back");
  if (walk.backing_map)
    space_map_recover_end (walk.backing_map,
                           backing_is_uri (backing_target (config->backing)));
  recovery_step ("store: cold tier's map recovered");
  store->map_charged = 0;       /* charged again once adopted */
  if (store_adopt (store, config, why, why_bytes) == -1)
    return NULL;
  recovery_step ("store: adopted");
  result->nanoseconds = monotonic_ns () - start;
  return store;
}
