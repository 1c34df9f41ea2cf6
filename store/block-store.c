/* The block store itself: its making and unmaking, its limits, its
 * memory and its statistics.  See block-store.h for the design and the
 * locks, block-store-internal.h for how its files divide the work
 * (block-entry.c below every other, block-request.c above them all).
 */

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block-store-internal.h"
#include "crc32c.h"
#include "space-map.h"

/* This process's parts of a store: the codecs (the algorithms are the
 * store's, the levels config's), the decode cache's slots, the write
 * batch, and every lock - a store taken over from another process gets
 * them anew (HANDOVER in block-store.h).  0, or -1 with errno (what was
 * made, process_parts_free frees).
 *
 * gcc 12's -fanalyzer takes the slots' array for a leak: it does not
 * follow it into a store that came from region_memory_alloc (the region
 * or the C heap).  Its leak check is off for this function only;
 * check-valgrind (tests/test-store-*) checks it.
 */
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif
static int
process_parts_make (struct block_store *store, const struct store_config *config)
{
  store->codecs[0] = codec_create (store->algorithms[0], config->level);
  if (!store->codecs[0])
    return -1;
  for (unsigned p = 1; p <= store->recomp_count; p++) {
    store->codecs[p] = codec_create (store->algorithms[p],
                                     config->recomp[p - 1].level);
    if (!store->codecs[p])
      return -1;
  }
  store->pack_codec = codec_create (CODEC_ZSTD,
                                    config->pack_level ? config->pack_level
                                    : STORE_PACK_LEVEL_DEFAULT);
  store->write_batch = config->write_batch ? config->write_batch
    : STORE_WRITE_BATCH_MAX;
  if (store->write_batch > STORE_WRITE_BATCH_MAX) {
    errno = EINVAL;
    return -1;
  }
  size_t unit_plain = (size_t) store->pack_blocks * STORE_BLOCK_SIZE;
  uint64_t cache = config->decode_cache ? config->decode_cache
    : STORE_DECODE_CACHE_DEFAULT;
  unsigned slots = cache / unit_plain > 1 ? cache / unit_plain : 1;
  if (slots > STORE_DECODE_CACHE_SLOTS_MAX)
    slots = STORE_DECODE_CACHE_SLOTS_MAX;
  if (!store->pack_codec
      || !(store->unit_cache = calloc (slots, sizeof *store->unit_cache)))
    return -1;
  store->unit_cache_count = slots;
  for (unsigned i = 0; i < slots; i++)
    pthread_mutex_init (&store->unit_cache[i].lock, NULL);
  pthread_mutex_init (&store->units_lock, NULL);
  pthread_mutex_init (&store->dictionary_lock, NULL);
  pthread_mutex_init (&store->writeback_lock, NULL);
  for (unsigned i = 0; i < STORE_STRIPES; i++)
    pthread_mutex_init (&store->stripes[i], NULL);
  return 0;
}
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic pop
#endif

/* Undo process_parts_make (what of it was made). */
static void
process_parts_free (struct block_store *store)
{
  for (unsigned p = 0; p <= STORE_RECOMP_MAX; p++) {
    codec_destroy (store->codecs[p]);
    store->codecs[p] = NULL;
  }
  codec_destroy (store->pack_codec);
  store->pack_codec = NULL;
  unsigned slots = store->unit_cache_count;
  for (unsigned i = 0; i < slots; i++) {
    pthread_mutex_destroy (&store->unit_cache[i].lock);
    free (store->unit_cache[i].data);
  }
  free (store->unit_cache);
  store->unit_cache = NULL;
  store->unit_cache_count = 0;
  if (!slots)
    return;                     /* the locks below were not made */
  pthread_mutex_destroy (&store->units_lock);
  pthread_mutex_destroy (&store->dictionary_lock);
  pthread_mutex_destroy (&store->writeback_lock);
  for (unsigned i = 0; i < STORE_STRIPES; i++)
    pthread_mutex_destroy (&store->stripes[i]);
}

/* What the store keeps of its cold tier's name (store_config_mismatch). */
static uint32_t
target_checksum (const struct backing *backing)
{
  const char *target = backing_target (backing);
  return crc32c (target, strlen (target));
}

/* The cold tier's space map made in the store's region, and given to
 * config's backing store (HANDOVER in block-store.h).  0, or -1 with
 * errno.
 */
static int
backing_map_in_region (struct block_store *store,
                       const struct store_config *config)
{
  struct space_map *map = region_alloc (store->region, sizeof *map, 16);
  if (!map)
    return -1;
  if (space_map_init (map, backing_sectors (config->backing),
                      store->region) == -1) {
    region_free (store->region, map);
    return -1;
  }
  store->backing_map = map;
  store->backing_target_crc = target_checksum (config->backing);
  return backing_map_adopt (config->backing, map);
}

/* The region's space map, destroyed (what backing_map_in_region made). */
static void
backing_map_free (struct block_store *store)
{
  if (!store->backing_map)
    return;
  space_map_destroy (store->backing_map);
  region_free (store->region, store->backing_map);
  store->backing_map = NULL;
}

struct block_store *
store_create (const struct store_config *config)
{
  struct region *region = config->pool.region;
  bool valid = config->size != 0;
  size_t bytes = store_struct_bytes (region != NULL);
  struct block_store *store = valid
    ? region_memory_alloc (region, bytes, _Alignof (struct block_store))
    : NULL;
  if (!store) {
    if (!valid)
      errno = EINVAL;
    int saved = errno;
    backing_close (config->backing);
    errno = saved;
    return NULL;
  }
  memset (store, 0, bytes);
  store->region = region;
  store->size = config->size;
  store->limit_pages_only = config->pool.limit_pages_only;
  store->blocks = (config->size - 1) / STORE_BLOCK_SIZE + 1;
  store->created_ns = monotonic_ns ();
  if (config->shared_pool && region
      && !region_contains (region, config->shared_pool, 1)) {
    errno = EINVAL;             /* a region's stores share its one pool */
    goto fail;
  }
  store->shares_pool = config->shared_pool != NULL;
  store->pool = config->shared_pool ? config->shared_pool
    : zs_pool_create (&config->pool);
  if (!store->pool)
    goto fail;
  if (quota_init (store, config) == -1)
    goto fail;
  if (config->recomp_count > STORE_RECOMP_MAX) {
    errno = EINVAL;
    goto fail;
  }
  store->recomp_count = config->recomp_count;
  store->algorithms[0] = config->algorithm;
  for (unsigned p = 1; p <= store->recomp_count; p++)
    store->algorithms[p] = config->recomp[p - 1].algorithm;
  store->pack_blocks = config->pack_blocks ? config->pack_blocks
    : STORE_PACK_DEFAULT;
  if (store->pack_blocks < 2 || store->pack_blocks > STORE_PACK_MAX) {
    errno = EINVAL;
    goto fail;
  }
  if (process_parts_make (store, config) == -1)
    goto fail;
  store->writeback_batch = config->writeback_batch ? config->writeback_batch
    : STORE_WRITEBACK_BATCH;
  if (store->writeback_batch > STORE_WRITEBACK_BATCH_MAX) {
    errno = EINVAL;
    goto fail;
  }
  store->writeback_limit = config->writeback_limited ? config->writeback_limit
    : UINT64_MAX;
  /* In a region, the owner is the region's root: its recovery walks
   * every device's entries into the one space map.
   */
  if (config->backing_owner
      && (config->backing || !config->backing_owner->backing
          || (region && config->backing_owner->region != region)
          || config->budget != config->backing_owner->budget
          || !config->budget)) {
    errno = EINVAL;             /* a shared cold tier is a budget's */
    goto fail;
  }
  if (region && config->backing && backing_map_in_region (store, config) == -1)
    goto fail;
  store->backing = config->backing;   /* the store's from here */
  if (config->backing_owner) {
    store->backing = config->backing_owner->backing;
    store->backing_owner = config->backing_owner;
  }
  store->readback_below = config->readback_below;
  store->backing_sync = !config->backing_nosync;
  store->raw_threshold = zs_huge_class_size (store->pool);
  block_table_init (&store->table, store->blocks, store->pool, region);
  backing_map_settle (store, false, true);    /* the empty map's */
  budget_member_join (store);
  if (region && !store->shares_pool)
    region_set_root (region, store, STORE_LAYOUT_VERSION);
  return store;

 fail:;
  int saved = errno;
  quota_leave (store);
  backing_map_free (store);
  if (store->pool && !store->shares_pool)
    zs_pool_destroy (store->pool);
  process_parts_free (store);
  region_memory_free (region, store);
  backing_close (config->backing);    /* NULL with backing_owner */
  errno = saved;
  return NULL;
}

/* One store's process parts given up (HANDOVER in block-store.h). */
static void
process_parts_hand_over (struct block_store *store)
{
  decode_cache_trim (store);    /* this process's memory, discharged */
  write_scratch_trim (store);
  if (store->backing_owner)
    store->backing = NULL;      /* the owner's, closed by the owner */
  if (store->backing) {
    /* Runs released while reads were on: no read is on now. */
    backing_map_settle (store, false, true);
    backing_close (store->backing);
    store->backing = NULL;
  }
  process_parts_free (store);
}

int
store_hand_over (struct block_store *store)
{
  if (!store->region || store->shares_pool) {
    errno = EINVAL;
    return -1;
  }
  /* The devices first (DEVICES IN A REGION): their frees drain into
   * the pool handed over after them.
   */
  struct block_store *devices[DEVICES_MAX];
  unsigned count = store_devices_held (store, NULL, devices, DEVICES_MAX);
  for (unsigned i = 0; i < count; i++)
    process_parts_hand_over (devices[i]);
  process_parts_hand_over (store);
  zs_pool_hand_over (store->pool);
  return 0;
}

const char *
store_config_mismatch (struct region *region, const struct store_config *config)
{
  struct block_store *store = region_root (region);
  if (!store || region_state_read (region)->user_version != STORE_LAYOUT_VERSION)
    return "the region holds no store of this build's layout";
  if (store->size != config->size)
    return "the stored device has another size";
  if (store->limit_pages_only != config->pool.limit_pages_only)
    return store->limit_pages_only
      ? "the stored device counts its memory limit in compressed pages "
        "(mem_limit=): give mem_limit= again, not mem_budget="
      : "the stored device counts its memory limit in all the store holds "
        "(mem_budget=): give mem_budget= again, not mem_limit=";
  if (store->algorithms[0] != config->algorithm
      || store->recomp_count != config->recomp_count)
    return "the stored blocks were compressed with another algorithm";
  if (store->backing_map && !config->backing)
    return "the stored device has blocks in a cold tier: give its "
      "backing= again";
  if (!store->backing_map && config->backing)
    return "the stored device was served without a cold tier: backing= "
      "cannot be added to it";
  if (config->backing) {
    if (!region_contains (region, store->backing_map,
                          sizeof *store->backing_map))
      return "the cold tier's space map is not in the region: it is damaged";
    if (target_checksum (config->backing) != store->backing_target_crc)
      return "the cold tier (backing=) is not the stored device's";
    /* The map's capacity stays: the one asked now counts the devices
     * declared now, which may differ (a file is extended to it).
     */
    if (!backing_can_hold (config->backing, store->backing_map->sectors))
      return "the cold tier (backing=) is smaller than the stored "
        "device's";
  }
  for (unsigned p = 1; p <= store->recomp_count; p++)
    if (store->algorithms[p] != config->recomp[p - 1].algorithm)
      return "the stored blocks were recompressed with other algorithms";
  return NULL;
}

int
store_adopt (struct block_store *store, const struct store_config *config,
             char *why, size_t why_bytes)
{
  block_table_take_over (&store->table);
  atomic_store (&store->keep_resident, false);
  for (unsigned i = 0; i < STORE_WRITE_SLOTS; i++) {
    atomic_store (&store->write_scratch[i].busy, false);
    atomic_store (&store->write_scratch[i].bytes, NULL);
  }
  atomic_store (&store->write_scratch_bytes, 0);
  atomic_store (&store->decode_cache_bytes, 0);
  store->unit_cache = NULL;
  store->unit_cache_count = 0;
  for (unsigned p = 0; p <= STORE_RECOMP_MAX; p++)
    store->codecs[p] = NULL;
  store->pack_codec = NULL;
  store->backing = NULL;
  store->backing_owner = NULL;  /* set again below, from config */
  /* The old process's budget membership (COLD TIER ACROSS STORES). */
  store->budget_member = false;
  store->budget_next = NULL;
  store->budget_pins = 0;
  dictionaries_adopt (store);
  if (quota_rejoin (store, config) == -1) {
    snprintf (why, why_bytes, "its budget does not fit its cap and floor");
    return -1;
  }
  if (process_parts_make (store, config) == -1) {
    snprintf (why, why_bytes, "cannot make the codecs and caches: %m");
    process_parts_free (store);
    return -1;
  }
  if (config->backing) {
    /* The sizes were checked (store_config_mismatch); a file may still
     * fail to grow.
     */
    if (backing_map_adopt (config->backing, store->backing_map) == -1) {
      snprintf (why, why_bytes, "cannot give the cold tier (backing=) the "
                "stored device's capacity (%" PRIu64 " bytes): %m",
                store->backing_map->sectors * BACKING_SECTOR);
      process_parts_free (store);
      return -1;
    }
    store->backing = config->backing;
    backing_map_settle (store, false, true);
    budget_member_join (store);
  }
  else if (config->backing_owner) {
    /* A device of a region whose default store has a cold tier
     * (COLD TIER ACROSS STORES): its runs are in the owner's map.
     */
    store->backing_owner = config->backing_owner;
    store->backing = config->backing_owner->backing;
    budget_member_join (store);
  }
  store->raw_threshold = zs_huge_class_size (store->pool);
  return 0;
}

int
store_device_adopt (struct block_store *store,
                    const struct store_config *config, char *why,
                    size_t why_bytes)
{
  if (!store->shares_pool || config->shared_pool != store->pool
      || config->size != store->size
      || (int) config->algorithm != (int) store->algorithms[0]) {
    snprintf (why, why_bytes, "the device kept in the region has another "
              "size or algorithm");
    errno = EINVAL;
    return -1;
  }
  return store_adopt (store, config, why, why_bytes);
}

struct block_store *
store_take_over (struct region *region, const struct store_config *config,
                 char *why, size_t why_bytes)
{
  const char *wrong = store_config_mismatch (region, config);
  if (wrong) {
    snprintf (why, why_bytes, "%s", wrong);
    errno = EINVAL;
    return NULL;
  }
  struct block_store *store = region_root (region);
  zs_pool_take_over (store->pool);
  if (store->backing_map)
    space_map_take_over (store->backing_map);
  if (store_adopt (store, config, why, why_bytes) == -1)
    return NULL;
  return store;
}

void
store_destroy (struct block_store *store)
{
  if (!store)
    return;
  /* Out of the other stores' writebacks first (COLD TIER ACROSS STORES). */
  budget_member_leave (store);
  /* A region's root goes with the devices it holds (DEVICES IN A
   * REGION), before the pool they are on.
   */
  if (store->region && !store->shares_pool) {
    struct block_store *devices[DEVICES_MAX];
    unsigned count = store_devices_held (store, NULL, devices, DEVICES_MAX);
    for (unsigned i = 0; i < count; i++) {
      store_device_unpublish (store, devices[i]);
      store_destroy (devices[i]);
    }
    store_devices_free (store);
  }
  /* A pool shared with other stores takes this one's objects back one
   * by one (a trim of the whole device frees each block and unit) and
   * stays; a pool of its own frees every object at once, and the
   * entries need no walk.  The table first: its nodes are charged to
   * the pool.
   */
  if (store->shares_pool) {
    store_trim (store, store->size, 0);
    store_flush (store);
  }
  quota_leave (store);
  dictionaries_free_all (store);
  block_table_destroy (&store->table);
  if (!store->shares_pool)
    zs_pool_destroy (store->pool);
  process_parts_free (store);
  units_free_all (store);      /* their parts went with the pool */
  if (!store->backing_owner)
    backing_close (store->backing);
  backing_map_free (store);
  write_scratch_free (store);
  region_memory_free (store->region, store);
}

struct zs_pool *
store_pool (struct block_store *store)
{
  return store->pool;
}

size_t
store_raw_threshold (const struct block_store *store)
{
  return store->raw_threshold;
}

int
store_set_mem_limit (struct block_store *store, uint64_t limit,
                     uint64_t *held)
{
  uint64_t ignored;
  if (zs_pool_set_mem_limit_held (store->pool, limit,
                                  held ? held : &ignored) == 0)
    return 0;
  /* Refused: the decode cache's slots no read is using give way first
   * (reads make them again), as they do to a write.
   */
  if (errno != ENOSPC || decode_cache_trim (store) == 0)
    return -1;                  /* decode_cache_trim keeps errno */
  return zs_pool_set_mem_limit_held (store->pool, limit,
                                     held ? held : &ignored);
}

void
store_reset_mem_used_max (struct block_store *store)
{
  zs_pool_reset_max (store->pool);
}

void
store_print_classes (struct block_store *store, FILE *fp)
{
  zs_pool_print_stats (store->pool, fp);
}

unsigned
store_class_count (struct block_store *store)
{
  return zs_class_count (store->pool);
}

int
store_class_stats (struct block_store *store, unsigned class_number,
                   struct zs_class_stats *stats)
{
  return zs_class_stats (store->pool, class_number, stats);
}

uint32_t
store_now (const struct block_store *store)
{
  return store_clock (store);
}
/* The table's reclaim grace period: take and drop every stripe lock. */
static void
stripes_sweep (void *opaque)
{
  struct block_store *store = opaque;

  for (unsigned i = 0; i < STORE_STRIPES; i++) {
    pthread_mutex_lock (&store->stripes[i]);
    pthread_mutex_unlock (&store->stripes[i]);
  }
}


uint64_t
store_freeable (struct block_store *store, uint64_t *pages_used)
{
  uint64_t freeable = 0;
  *pages_used = 0;
  for (unsigned c = 0; c < zs_class_count (store->pool); c++) {
    struct zs_class_stats class;
    zs_class_stats (store->pool, c, &class);
    freeable += class.pages_freeable;
    *pages_used += class.pages_used;
  }
  return freeable;
}

uint64_t
store_compact (struct block_store *store)
{
  uint64_t start = monotonic_ns ();
  uint64_t freed = zs_compact (store->pool);
  counter_add (&store->compact_ns, monotonic_ns () - start);
  return freed;
}

size_t
store_release_idle_memory (struct block_store *store)
{
  size_t freed = codec_trim (store->pack_codec);
  for (unsigned p = 0; p <= store->recomp_count; p++)
    freed += codec_trim (store->codecs[p]);
  if (!atomic_load (&store->keep_resident))
    freed += write_scratch_trim (store) + decode_cache_trim (store);
  /* What the data let go of, the process should too: the C library
   * keeps freed request buffers and metadata in its arenas otherwise.
   * Not when the serving path is to stay resident: the next request
   * would fault those pages in again, maybe with memory gone.
   */
  if (!atomic_load (&store->keep_resident))
    malloc_trim (0);
  return freed;
}

static void
stripe_lock_block (void *opaque, uint64_t block)
{
  pthread_mutex_lock (stripe_for (opaque, block));
}

static void
stripe_unlock_block (void *opaque, uint64_t block)
{
  pthread_mutex_unlock (stripe_for (opaque, block));
}

int
store_keep_resident (struct block_store *store, unsigned threads)
{
  atomic_store (&store->keep_resident, true);
  if (block_table_populate (&store->table, store->blocks, stripe_lock_block,
                            stripe_unlock_block, store) == -1)
    return -1;
  if (write_scratch_prepare (store) == -1)
    return -1;
  return codec_prepare (store->codecs[0], threads);
}

uint64_t
store_reserve_refill (struct block_store *store)
{
  return zs_pool_reserve_refill (store->pool);
}

bool
store_reserve_release_if_empty (struct block_store *store)
{
  struct zs_pool_stats pool;
  zs_pool_stats (store->pool, &pool);
  if (pool.pages_used > 0)
    return false;
  if (pool.reserve_bytes > 0)
    zs_pool_reserve_release (store->pool);
  return true;
}

bool
store_reserve_low (struct block_store *store)
{
  return zs_pool_reserve_low (store->pool);
}

void
store_open_reserve (struct block_store *store)
{
  zs_pool_open_reserve (store->pool);
}

void
store_metadata_ready (struct block_store *store, uint64_t bytes)
{
  zs_pool_metadata_ready (store->pool, bytes);
}

void
store_flush (struct block_store *store)
{
  block_table_reclaim (&store->table, stripes_sweep, store);
  backing_map_settle (store, false, true);
  zs_pool_flush (store->pool);
}

uint64_t
store_stats_memory (const struct store_stats *stats)
{
  return stats->mem_used_total + stats->reserve_bytes + stats->table_bytes
    + stats->metadata_bytes + stats->codec_bytes + stats->decode_cache_bytes
    + stats->pack_dictionary_bytes;
}

void
store_stats (struct block_store *store, struct store_stats *stats)
{
  struct zs_pool_stats pool;
  zs_pool_stats (store->pool, &pool);

  memset (stats, 0, sizeof *stats);
  stats->disk_size = store->size;
  stats->orig_data_size = atomic_load (&store->stored_blocks) * STORE_BLOCK_SIZE;
  stats->compr_data_size = atomic_load (&store->compr_bytes);
  stats->mem_used_total = pool.pages_used * ZS_PAGE_SIZE;
  stats->mem_limit = pool.mem_limit;
  stats->limit_used = pool.limit_used;
  stats->mem_used_max = pool.pages_used_max * ZS_PAGE_SIZE;
  stats->same_pages = atomic_load (&store->same_blocks);
  stats->pages_compacted = pool.pages_compacted;
  stats->pages_freeable = pool.pages_freeable;
  stats->compact_ms = atomic_load (&store->compact_ns) / 1000000;
  stats->huge_pages = atomic_load (&store->raw_blocks);
  stats->huge_pages_since = atomic_load (&store->raw_blocks_since);
  stats->failed_reads = atomic_load (&store->failed_reads);
  stats->failed_writes = atomic_load (&store->failed_writes);
  stats->invalid_io = atomic_load (&store->invalid_io);
  stats->notify_free = atomic_load (&store->notify_free);
  stats->reads = atomic_load (&store->reads);
  stats->writes = atomic_load (&store->writes);
  stats->table_bytes = atomic_load (&store->table.bytes);
  stats->metadata_bytes = pool.metadata_bytes;
  for (unsigned p = 0; p <= store->recomp_count; p++)
    stats->codec_bytes += codec_memory (store->codecs[p]);
  stats->streams = codec_streams (store->codecs[0]);
  stats->recomp_blocks = atomic_load (&store->recomp_blocks);
  stats->packed_blocks = atomic_load (&store->packed_blocks);
  stats->pack_units = atomic_load (&store->pack_units);
  for (unsigned place = 0; place < STORE_DICTIONARIES; place++)
    stats->pack_dictionaries += atomic_load (&store->dictionaries[place]) != NULL;
  stats->pack_dictionary_bytes = atomic_load (&store->dictionary_bytes);
  stats->recomp_bytes_saved = atomic_load (&store->recomp_bytes_saved);
  stats->reserve_bytes = pool.reserve_bytes;
  stats->reserve_refills = pool.reserve_refills;
  stats->reserve_misses = pool.reserve_misses;
  stats->reserve_metadata_misses = pool.metadata_misses;
  stats->codec_bytes += codec_memory (store->pack_codec);
  stats->codec_bytes += atomic_load (&store->write_scratch_bytes);
  stats->decode_cache_bytes = atomic_load (&store->decode_cache_bytes);
  stats->cap = store->cap;
  stats->floor = store->floor;
  stats->quota_bytes = atomic_load (&store->quota_bytes);
  stats->refused_for_budget = atomic_load (&store->refused_for_budget);
  if (store->budget) {
    stats->budget_floors = atomic_load (&store->budget->floors);
    stats->budget_unmet_floors = budget_unmet_floors (store->budget);
  }
  stats->decode_cache_hits = atomic_load (&store->decode_cache_hits);
  stats->decode_cache_misses = atomic_load (&store->decode_cache_misses);
  stats->bd_count = atomic_load (&store->bd_count);
  stats->bd_reads = atomic_load (&store->bd_reads);
  stats->bd_writes = atomic_load (&store->bd_writes);
  stats->bd_bytes = atomic_load (&store->bd_bytes);
  stats->bd_failed_reads = atomic_load (&store->bd_failed_reads);
  stats->bd_readbacks = atomic_load (&store->bd_readbacks);
  if (store->backing) {
    struct backing_stats backing;
    backing_stats (store->backing, &backing);
    stats->backing_capacity = backing.capacity;
    stats->backing_used = backing.used;
    stats->backing_map_bytes = backing.map_bytes;
    stats->backing_failed = backing.failed;
    stats->backing_reconnects = backing.reconnects;
    stats->backing_timeouts = backing.timeouts;
    stats->backing_corrupt = backing.corrupt;
    stats->backing_abandoned = backing.abandoned;
    stats->backing_quarantined_bytes = backing.quarantined_bytes;
    stats->backing_errors_nospace = backing.errors_nospace;
    stats->backing_errors_io = backing.errors_io;
  }
  stats->writeback_limit_left = atomic_load (&store->writeback_limit);
}

