/* Block store tests, the decode cache of packed units: what it keeps and
 * drops, that it yields to writes at the memory limit, that units freed
 * take their cached copies with them, its sweep, and packed blocks
 * written back while cached.
 */

#include "store-fixture.h"
#include "zsalloc-internal.h"     /* CELL_BLOCK_BYTES */

/* A batched write that memory cannot hold in full (seed 004's path at
 * mem_limit): the request fails with ENOSPC, each block holds its old
 * content or its new one, never a mix, the counters match the blocks,
 * and nothing the batch allocated is left behind.
 */
/* The decode cache: a packed read decodes only the frames holding the
 * blocks its request reads, a read of another frame decodes that one,
 * the slots are charged to mem_limit and given back, and every read
 * returns its block.
 */
static void
check_cache (struct block_store *store, uint64_t first, unsigned count,
             uint64_t hits, uint64_t misses, const char *what)
{
  unsigned char *got = malloc ((size_t) count * BS), want[BS];
  assert_non_null (got);
  struct store_stats before, after;
  store_stats (store, &before);
  assert_int_equal (store_read (store, got, (uint64_t) count * BS,
                                first * BS), 0);
  store_stats (store, &after);
  for (unsigned i = 0; i < count; i++) {
    text_fill (want, first + i, 1);
    if (memcmp (got + (size_t) i * BS, want, BS) != 0)
      fail_msg ("%s: block %" PRIu64 " differs", what, first + i);
  }
  free (got);
  if (after.decode_cache_hits - before.decode_cache_hits != hits
      || after.decode_cache_misses - before.decode_cache_misses != misses)
    fail_msg ("%s: %" PRIu64 " hits, %" PRIu64 " misses; expected %" PRIu64
              ", %" PRIu64, what,
              after.decode_cache_hits - before.decode_cache_hits,
              after.decode_cache_misses - before.decode_cache_misses,
              hits, misses);
}

/* A store of size blocks whose first packed blocks hold text_fill
 * version 1, all packed in units of 16 in block order (0-15, 16-31...).
 */
enum { CACHE_UNIT = 16 };
static struct block_store *
make_packed_text_store (uint64_t size, uint64_t packed, uint64_t decode_cache,
                        uint64_t mem_limit)
{
  struct store_config config = {
    .size = size * BS, .algorithm = CODEC_LZ4, .level = 1,
    .pack_blocks = CACHE_UNIT, .decode_cache = decode_cache,
  };
  zs_pool_config_init (&config.pool);
  config.pool.mem_limit = mem_limit;
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  unsigned char buf[BS];
  for (uint64_t b = 0; b < packed; b++) {
    text_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  assert_int_equal (result.blocks, packed);
  assert_int_equal (result.units, packed / CACHE_UNIT);
  return store;
}

static void
test_decode_cache (void **state)
{
  (void) state;
  enum { BLOCKS = 64 };
  const uint64_t unit_bytes = CACHE_UNIT * BS;
  struct block_store *store = make_packed_text_store (BLOCKS, BLOCKS,
                                                      2 * unit_bytes, 64 << 20);
  unsigned char buf[BS];

  struct store_stats before, after;
  store_stats (store, &before);
  assert_int_equal (before.decode_cache_bytes, 0);
  /* One block: its frame (blocks 0-3) decoded into a slot, charged. */
  check_cache (store, 0, 1, 0, 1, "block 0");
  store_stats (store, &after);
  assert_int_equal (after.decode_cache_bytes, unit_bytes);
  assert_int_equal (after.limit_used - before.limit_used, unit_bytes);
  check_cache (store, 1, 3, 3, 0, "blocks 1-3 (the frame decoded)");
  /* Another frame: decoded alone, then hits. */
  check_cache (store, 4, 1, 0, 1, "block 4 (the next frame)");
  check_cache (store, 5, 3, 3, 0, "blocks 5-7 (its frame decoded)");
  /* A request of 8 blocks decodes its two frames at its first block. */
  check_cache (store, 8, 8, 7, 1, "blocks 8-15 in one request");
  check_cache (store, 16, 8, 7, 1, "blocks 16-23 in one request");
  check_cache (store, 24, 1, 0, 1, "block 24 (past the request's frames)");
  check_cache (store, 25, 3, 3, 0, "blocks 25-27");
  check_cache (store, 28, 4, 3, 1, "blocks 28-31 (the last frame)");
  /* A request across two units; the cache holds two units at most. */
  check_cache (store, 44, 8, 6, 2, "blocks 44-51 (two units)");
  store_stats (store, &after);
  assert_true (after.decode_cache_bytes <= 2 * unit_bytes);
  /* Given back when idle memory is; reads still right afterwards. */
  store_release_idle_memory (store);
  store_stats (store, &after);
  assert_int_equal (after.decode_cache_bytes, 0);
  assert_int_equal (after.limit_used, before.limit_used);
  check_cache (store, 0, BLOCKS, BLOCKS - 4 * 1, 4, "all, in one request");
  /* A rewritten packed block reads its new content, its neighbours theirs. */
  memset (buf, 0x5a, BS);
  buf[0] = 1;
  assert_int_equal (store_write (store, buf, BS, 2 * BS), 0);
  unsigned char got[BS];
  assert_int_equal (store_read (store, got, BS, 2 * BS), 0);
  assert_memory_equal (got, buf, BS);
  check_cache (store, 3, 1, 0, 1, "block 3 beside a rewritten block");
  store_destroy (store);
}

/* The decode cache gives its memory up to writes at mem_limit: data
 * comes first, and reads of packed blocks still work without it.
 */
static void
test_decode_cache_yields_to_writes (void **state)
{
  (void) state;
  enum { PACKED = 64, FRESH = 32 };
  const uint64_t unit_bytes = CACHE_UNIT * BS;
  struct block_store *store = make_packed_text_store (PACKED + FRESH, PACKED,
                                                      4 * unit_bytes, 0);
  unsigned char buf[BS];
  check_cache (store, 0, PACKED, PACKED - 4, 4, "all (fills the cache)");
  struct store_stats stats;
  store_stats (store, &stats);
  uint64_t cached = stats.decode_cache_bytes;
  assert_true (cached >= 2 * unit_bytes);       /* two places a unit */
  /* Room for a quarter of the fresh blocks beside the cache. */
  assert_int_equal (store_set_mem_limit (store, stats.limit_used
                                         + FRESH / 4 * BS, NULL), 0);
  uint64_t rng = 7;
  for (uint64_t b = PACKED; b < PACKED + FRESH; b++) {
    for (size_t i = 0; i < BS; i += 8) {
      uint64_t x = xorshift64 (&rng);
      memcpy (buf + i, &x, 8);
    }
    if (store_write (store, buf, BS, b * BS) != 0)
      fail_msg ("fresh block %" PRIu64 ": %s (the cache kept its memory?)",
                b, strerror (errno));
  }
  store_stats (store, &stats);
  assert_true (stats.decode_cache_bytes < cached);
  assert_true (stats.limit_used <= stats.mem_limit);
  /* Packed blocks still read right, slots or not. */
  unsigned char got[BS];
  for (uint64_t b = 0; b < PACKED; b++) {
    text_fill (buf, b, 1);
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    assert_memory_equal (got, buf, BS);
  }
  store_destroy (store);
}

/* ---- exact accounting of the decode cache (issue 26, item 4) ---------- */

/* A store writing back to a fresh file (backing_path), packing in units
 * of CACHE_UNIT, with decode_cache bytes of cache (0: the default), no
 * mem_limit yet; its first packed blocks hold text_fill version 1, all
 * packed (units in block order).
 */
static struct block_store *
make_backed_packed_store (uint64_t size, uint64_t packed,
                          uint64_t decode_cache, struct store_stats *empty)
{
  char *error = NULL;
  backing_file_create ();
  struct backing *backing = backing_open (backing_path, size * BS, false, 30,
                                          &error);
  if (!backing)
    fail_msg ("backing_open: %s", error);
  struct store_config config = {
    .size = size * BS, .algorithm = CODEC_LZ4, .level = 1,
    .pack_blocks = CACHE_UNIT, .decode_cache = decode_cache,
    .backing = backing,
  };
  zs_pool_config_init (&config.pool);
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  store_flush (store);
  store_stats (store, empty);
  unsigned char buf[BS];
  for (uint64_t b = 0; b < packed; b++) {
    text_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  assert_int_equal (result.blocks, packed);
  assert_int_equal (result.units, packed / CACHE_UNIT);
  return store;
}

/* The counters hold what a walk of the blocks finds. */
static void
assert_counters_walk (struct block_store *store)
{
  struct store_walk walk;
  struct store_stats stats;
  assert_int_equal (store_walk (store, &walk), 0);
  store_stats (store, &stats);
  assert_int_equal (stats.orig_data_size, walk.stored * BS);
  assert_int_equal (stats.bd_count, walk.written_back);
}

/* A slot goes with its unit: when the unit's last block leaves it (here
 * by trims), at once, with no housekeeping round; an empty store holds
 * no slot, its limit_used is the table's and the space map's, and a low
 * mem_limit is taken.  (The slots used to outlive their units: 2 MiB of
 * them on an empty store, and mem_limit=1M refused.)
 */
static void
test_decode_cache_freed_with_units (void **state)
{
  (void) state;
  enum { PACKED = 512, UNITS = PACKED / CACHE_UNIT };
  const uint64_t unit_bytes = CACHE_UNIT * BS;
  struct store_stats empty, stats, before;
  struct block_store *store = make_backed_packed_store (PACKED, PACKED, 0,
                                                        &empty);
  assert_int_equal (empty.decode_cache_bytes, 0);
  /* Every block read: each unit decoded into a slot, 32 of them. */
  check_cache (store, 0, PACKED, PACKED - UNITS, UNITS, "all, to fill");
  store_stats (store, &stats);
  print_message ("%u units read: decode cache %" PRIu64 " bytes\n", UNITS,
                 stats.decode_cache_bytes);
  assert_true (stats.decode_cache_bytes >= 8 * unit_bytes);
  /* Unit 0 read again (its slot the newest), then half its blocks
   * trimmed: it lives on, its slot too; the rest trimmed: the slot goes.
   */
  check_cache (store, 0, 1, 0, 1, "unit 0 again");
  store_stats (store, &before);
  assert_int_equal (store_trim (store, CACHE_UNIT / 2 * BS, 0), 0);
  store_stats (store, &stats);
  assert_int_equal (stats.decode_cache_bytes, before.decode_cache_bytes);
  assert_int_equal (stats.pack_units, UNITS);
  assert_int_equal (store_trim (store, CACHE_UNIT / 2 * BS,
                                CACHE_UNIT / 2 * BS), 0);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_units, UNITS - 1);
  assert_int_equal (stats.decode_cache_bytes,
                    before.decode_cache_bytes - unit_bytes);
  /* A dissolved unit's slot goes too: unit 1 read, then dissolved
   * (every unit under 101% live is): each dissolve frees its slot.
   */
  check_cache (store, CACHE_UNIT, 1, 0, 1, "unit 1 again");
  assert_int_equal (store_pack_dissolve (store, 101, NULL, NULL), UNITS - 1);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_units, 0);
  assert_int_equal (stats.decode_cache_bytes, 0);

  /* Packed again, read again, then everything trimmed. */
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result packed;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &packed), 0);
  assert_int_equal (packed.units, UNITS - 1);
  check_cache (store, CACHE_UNIT, PACKED - CACHE_UNIT,
               PACKED - CACHE_UNIT - (UNITS - 1), UNITS - 1, "all again");
  store_stats (store, &stats);
  assert_true (stats.decode_cache_bytes >= 8 * unit_bytes);
  assert_int_equal (store_trim (store, (uint64_t) PACKED * BS, 0), 0);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_units, 0);
  assert_int_equal (stats.decode_cache_bytes, 0);
  /* A housekeeping round's sweep finds no slot left to free; three
   * rounds free packing's encoder and its dictionary (dictionary_sweep).
   */
  for (int round = 0; round < 3; round++)
    assert_int_equal (store_decode_cache_sweep (store), 0);
  store_flush (store);
  store_stats (store, &stats);
  /* What is left: the table, the space map, the reserve, and the
   * allocator's handle cells (one block kept per size class used).
   */
  uint64_t rest = stats.table_bytes + stats.backing_map_bytes
    + stats.reserve_bytes;
  print_message ("empty store: limit_used %" PRIu64 " (table %" PRIu64
                 ", space map %" PRIu64 ", reserve %" PRIu64 ", decode "
                 "cache %" PRIu64 ", handle cells %" PRIu64 "), new: %"
                 PRIu64 "\n", stats.limit_used, stats.table_bytes,
                 stats.backing_map_bytes, stats.reserve_bytes,
                 stats.decode_cache_bytes, stats.limit_used - rest,
                 empty.limit_used);
  assert_int_equal (stats.orig_data_size, 0);
  assert_int_equal (stats.compr_data_size, 0);
  assert_int_equal (stats.mem_used_total, 0);
  assert_true (stats.limit_used >= rest);
  assert_int_equal ((stats.limit_used - rest) % CELL_BLOCK_BYTES, 0);
  assert_true (stats.limit_used - rest
               <= (uint64_t) store_class_count (store) * CELL_BLOCK_BYTES);
  /* The reporter's mem_limit=1M, and the least limit there is. */
  assert_int_equal (store_set_mem_limit (store, 1 << 20, NULL), 0);
  assert_int_equal (store_set_mem_limit (store, stats.limit_used, NULL), 0);
  assert_counters_walk (store);
  store_destroy (store);
  unlink (backing_path);
}

/* Slots of live units: a lower mem_limit takes the idle ones before it
 * refuses, and a housekeeping round's sweep frees those no read used
 * since the round before.
 */
static void
test_decode_cache_sweep_and_mem_limit (void **state)
{
  (void) state;
  enum { PACKED = 256, UNITS = PACKED / CACHE_UNIT };
  const uint64_t unit_bytes = CACHE_UNIT * BS;
  struct block_store *store = make_packed_text_store (PACKED, PACKED, 0, 0);
  struct store_stats stats;
  check_cache (store, 0, PACKED, PACKED - UNITS, UNITS, "all, to fill");
  store_stats (store, &stats);
  uint64_t cached = stats.decode_cache_bytes;
  assert_true (cached >= 8 * unit_bytes);
  /* Below what the pool holds with the slots, not without them. */
  uint64_t held = 0;
  assert_int_equal (store_set_mem_limit (store, stats.limit_used - cached,
                                         &held), 0);
  store_stats (store, &stats);
  assert_int_equal (stats.decode_cache_bytes, 0);
  assert_int_equal (stats.mem_limit, stats.limit_used);
  /* Below what the data holds: refused, and the cache was no help. */
  errno = 0;
  assert_int_equal (store_set_mem_limit (store, stats.limit_used - 4096,
                                         &held), -1);
  assert_int_equal (errno, ENOSPC);
  assert_int_equal (held, stats.limit_used);
  assert_int_equal (store_set_mem_limit (store, 0, NULL), 0);

  /* The sweep: the first call only starts counting; a slot read since
   * the one before stays, the others go; then it goes too.
   */
  check_cache (store, 0, PACKED, PACKED - UNITS, UNITS, "all, again");
  store_stats (store, &stats);
  cached = stats.decode_cache_bytes;
  assert_int_equal (store_decode_cache_sweep (store), 0);
  check_cache (store, 0, 1, 1, 0, "block 0 (a hit)");
  assert_int_equal (store_decode_cache_sweep (store), cached - unit_bytes);
  store_stats (store, &stats);
  assert_int_equal (stats.decode_cache_bytes, unit_bytes);
  check_cache (store, 1, 1, 1, 0, "block 1 (still a hit)");
  assert_int_equal (store_decode_cache_sweep (store), 0);
  assert_int_equal (store_decode_cache_sweep (store), unit_bytes);
  store_stats (store, &stats);
  assert_int_equal (stats.decode_cache_bytes, 0);
  check_cache (store, 0, PACKED, PACKED - UNITS, UNITS, "all, after");
  assert_counters_walk (store);
  store_destroy (store);
}

/* Writeback of packed blocks takes no memory for the decode cache: half
 * of each unit written back (the units live on), the cache holds what
 * it held (one slot, of the unit read first), and mem_limit's count did
 * not grow by slots.
 */
static void
test_packed_writeback_leaves_cache (void **state)
{
  (void) state;
  enum { PACKED = 512, UNITS = PACKED / CACHE_UNIT };
  const uint64_t unit_bytes = CACHE_UNIT * BS;
  struct store_stats empty, before, stats;
  struct block_store *store = make_backed_packed_store (PACKED, PACKED, 0,
                                                        &empty);
  check_cache (store, 0, 1, 0, 1, "block 0: unit 0 in a slot");
  store_stats (store, &before);
  assert_int_equal (before.decode_cache_bytes, unit_bytes);
  for (uint64_t unit = 0; unit < UNITS; unit++) {
    struct store_writeback_request request = {
      .type = WRITEBACK_ANY, .first = unit * CACHE_UNIT,
      .last = unit * CACHE_UNIT + CACHE_UNIT / 2 - 1,
    };
    struct store_writeback_result result;
    assert_int_equal (store_writeback (store, &request, NULL, NULL, &result),
                      0);
    assert_int_equal (result.blocks, CACHE_UNIT / 2);
  }
  store_stats (store, &stats);
  print_message ("half of each of %u units written back: decode cache %"
                 PRIu64 " -> %" PRIu64 " bytes\n", UNITS,
                 before.decode_cache_bytes, stats.decode_cache_bytes);
  assert_int_equal (stats.pack_units, UNITS);
  assert_int_equal (stats.packed_blocks, PACKED / 2);
  assert_int_equal (stats.bd_count, PACKED / 2);
  assert_int_equal (stats.decode_cache_bytes, unit_bytes);
  assert_true (stats.limit_used <= before.limit_used + stats.backing_map_bytes
               - before.backing_map_bytes);
  unsigned char buf[BS], got[BS];
  for (uint64_t b = 0; b < PACKED; b++) {
    text_fill (buf, b, 1);
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    assert_memory_equal (got, buf, BS);
  }
  assert_counters_walk (store);
  store_destroy (store);
  unlink (backing_path);
}

/* One 4 KiB write refused at mem_limit with cold packed blocks (never
 * read): the blocks written back to make room for it.  *cache: the
 * decode cache's bytes afterwards.
 */
static uint64_t
packed_written_back_for_one_write (uint64_t packed, uint64_t decode_cache,
                                   uint64_t *cache)
{
  struct store_stats empty, before, after;
  struct block_store *store = make_backed_packed_store (packed + 1, packed,
                                                        decode_cache, &empty);
  store_flush (store);
  store_stats (store, &before);
  assert_int_equal (before.decode_cache_bytes, 0);
  assert_int_equal (store_set_mem_limit (store, before.limit_used, NULL), 0);
  unsigned char buf[BS], got[BS];
  uint64_t rng = 99;
  for (size_t i = 0; i < BS; i += 8) {
    uint64_t x = xorshift64 (&rng);
    memcpy (buf + i, &x, 8);
  }
  if (store_write (store, buf, BS, packed * BS) != 0)
    fail_msg ("the write at the limit: %s", strerror (errno));
  store_stats (store, &after);
  *cache = after.decode_cache_bytes;
  assert_int_equal (store_read (store, got, BS, packed * BS), 0);
  assert_memory_equal (got, buf, BS);
  for (uint64_t b = 0; b < packed; b++) {
    text_fill (buf, b, 1);
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    assert_memory_equal (got, buf, BS);
  }
  assert_counters_walk (store);
  store_destroy (store);
  unlink (backing_path);
  return after.bd_writes - before.bd_writes;
}

/* Writeback of packed blocks decodes without filling the decode cache
 * (whose slots are charged to the pool it makes room in, and whose units
 * go with their last block): a write at the limit writes back what it
 * needs, the same with the default cache (2 MiB: 32 slots) as with one
 * slot, and leaves no slot behind.  (It used to write back every one of
 * 2048 packed blocks with the default cache, 1024 with one slot.)
 * state: packed blocks.
 */
static void
test_packed_writeback_at_limit (void **state)
{
  uint64_t packed = (uintptr_t) *state;
  uint64_t cache_default, cache_one;
  uint64_t by_default = packed_written_back_for_one_write (packed, 0,
                                                           &cache_default);
  uint64_t by_one = packed_written_back_for_one_write (packed, 1, &cache_one);
  print_message ("one write at the limit, %" PRIu64 " cold packed blocks: "
                 "%" PRIu64 " written back with the default decode cache, %"
                 PRIu64 " with one slot; cache left %" PRIu64 ", %" PRIu64
                 " bytes\n", packed, by_default, by_one, cache_default,
                 cache_one);
  assert_true (by_default > 0);
  assert_int_equal (cache_default, 0);
  assert_int_equal (cache_one, 0);
  assert_true (by_default <= by_one + STORE_WRITEBACK_BATCH);
  assert_true (by_one <= by_default + STORE_WRITEBACK_BATCH);
  assert_true (by_default < packed);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_decode_cache),
    cmocka_unit_test (test_decode_cache_yields_to_writes),
    cmocka_unit_test (test_decode_cache_freed_with_units),
    cmocka_unit_test (test_decode_cache_sweep_and_mem_limit),
    cmocka_unit_test (test_packed_writeback_leaves_cache),
    cmocka_unit_test_prestate (test_packed_writeback_at_limit,
                               (void *) (uintptr_t) 2048),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
