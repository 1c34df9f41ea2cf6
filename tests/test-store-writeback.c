/* Block store tests, the cold tier: writeback to a backing file and
 * read-back, the space map of the backing file, the writeback limit and
 * failed writes, writeback instead of ENOSPC, writeback beside I/O, and
 * packed blocks written back.
 */

#include "store-fixture.h"

/* A store (lz4, mem_limit) writing back to a fresh file, or to path. */
static uint64_t readback_below;    /* for the next make_backed_store */

static struct block_store *
make_backed_store (uint64_t blocks, uint64_t mem_limit, const char *path,
                   uint64_t writeback_limit)
{
  char *error = NULL;
  if (!path)
    path = backing_file_create ();
  struct backing *backing = backing_open (path, blocks * BS, false, 30, &error);
  if (!backing)
    fail_msg ("backing_open: %s", error);
  struct store_config config = {
    .size = blocks * BS, .algorithm = CODEC_LZ4, .level = 1,
    .recomp_count = 1, .recomp = { { CODEC_ZSTD, 3 } },
    .backing = backing, .writeback_limit = writeback_limit,
    .writeback_limited = writeback_limit != 0,
    .readback_below = readback_below,
  };
  zs_pool_config_init (&config.pool);
  config.pool.mem_limit = mem_limit;
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  return store;
}

static const struct store_writeback_request writeback_all_idle = {
  .type = WRITEBACK_IDLE, .first = 0, .last = UINT64_MAX,
};

static void
test_writeback (void **state)
{
  (void) state;
  enum { BLOCKS = 512 };
  struct block_store *store = make_backed_store (BLOCKS, 0, NULL, 0);
  uint64_t versions[BLOCKS] = { 0 };
  bool present[BLOCKS] = { false };
  unsigned char buf[BS];
  uint64_t rng = 99;
  for (uint64_t b = 0; b < BLOCKS; b++) {
    versions[b] = 1;
    present[b] = true;
    recomp_fill (buf, b, 1);
    if (b % 7 == 0)             /* incompressible: stored raw */
      for (size_t i = 16; i < BS; i += 8) {
        uint64_t word = xorshift64 (&rng);
        memcpy (buf + i, &word, 8);
      }
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  /* The random blocks' contents, to check them later. */
  static unsigned char random_blocks[BLOCKS][BS];
  for (uint64_t b = 0; b < BLOCKS; b += 7)
    assert_int_equal (store_read (store, random_blocks[b], BS, b * BS), 0);

  struct store_stats before, after;
  struct store_writeback_result result;
  store_stats (store, &before);
  /* Nothing idle yet. */
  assert_int_equal (store_writeback (store, &writeback_all_idle, NULL, NULL,
                                     &result), 0);
  assert_int_equal (result.blocks, 0);
  /* Huge only: the random blocks. */
  store_mark_idle (store, 0, NULL, NULL);
  struct store_writeback_request huge = writeback_all_idle;
  huge.type = WRITEBACK_HUGE;
  assert_int_equal (store_writeback (store, &huge, NULL, NULL, &result), 0);
  /* Every seventh block at least (some of recomp_fill's are random). */
  assert_true (result.blocks >= (BLOCKS + 6) / 7);
  /* Then a range of any kind, then everything idle. */
  struct store_writeback_request range = {
    .type = WRITEBACK_ANY, .first = 100, .last = 149,
  };
  assert_int_equal (store_writeback (store, &range, NULL, NULL, &result), 0);
  assert_true (result.blocks > 0 && result.blocks <= 50 - (150 / 7 - 100 / 7));
  assert_int_equal (store_writeback (store, &writeback_all_idle, NULL, NULL,
                                     &result), 0);
  store_stats (store, &after);
  print_message ("writeback: %" PRIu64 " blocks, %" PRIu64 " bytes; pool %"
                 PRIu64 " -> %" PRIu64 ", backing used %" PRIu64 "\n",
                 after.bd_count, after.bd_bytes, before.mem_used_total,
                 after.mem_used_total, after.backing_used);
  uint64_t with_objects = before.orig_data_size / BS - before.same_pages;
  assert_int_equal (after.bd_count, with_objects);
  assert_int_equal (after.bd_writes, with_objects);
  assert_int_equal (after.compr_data_size, 0);
  assert_int_equal (after.orig_data_size, before.orig_data_size);
  assert_true (after.backing_used >= after.bd_bytes);
  assert_true (after.backing_used < after.bd_bytes + BLOCKS * 512);
  assert_true (after.mem_used_total < before.mem_used_total / 4);

  /* Every block reads back, from the backing store. */
  for (uint64_t b = 0; b < BLOCKS; b++) {
    unsigned char got[BS];
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    if (b % 7 == 0)
      assert_memory_equal (got, random_blocks[b], BS);
    else {
      recomp_fill (buf, b, 1);
      assert_memory_equal (got, buf, BS);
    }
  }
  store_stats (store, &after);
  assert_int_equal (after.bd_reads, with_objects);

  /* Overwritten, patched, trimmed, zeroed in part: each frees its place. */
  for (uint64_t b = 1; b < BLOCKS; b += 7) {
    versions[b]++;
    recomp_fill (buf, b, versions[b]);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  for (uint64_t b = 2; b < BLOCKS; b += 7) {
    unsigned char now[BS];
    recomp_fill (now, b, versions[b]);
    memset (now + 100, 'Q', 200);
    assert_int_equal (store_write (store, now + 100, 200, b * BS + 100), 0);
    assert_int_equal (store_read (store, buf, BS, b * BS), 0);
    assert_memory_equal (buf, now, BS);
    versions[b]++;
    recomp_fill (buf, b, versions[b]);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  for (uint64_t b = 3; b < BLOCKS; b += 7) {
    assert_int_equal (store_trim (store, BS, b * BS), 0);
    present[b] = false;
  }
  for (uint64_t b = 0; b < BLOCKS; b += 7)
    present[b] = false;         /* checked above, not modelled */
  for (uint64_t b = 0; b < BLOCKS; b += 7)
    assert_int_equal (store_trim (store, BS, b * BS), 0);
  recomp_verify (store, versions, present, 0, BLOCKS);
  struct store_stats later;
  store_stats (store, &later);
  uint64_t left = 0;
  for (uint64_t b = 0; b < BLOCKS; b++)
    left += b % 7 >= 4;         /* the untouched ones */
  /* Those untouched stay written back (but same-filled ones never were). */
  assert_true (later.bd_count <= left);
  assert_true (later.bd_count >= left - before.same_pages);
  assert_true (later.backing_used < after.backing_used);

  /* Back again, then all trimmed: the backing store is empty. */
  store_mark_idle (store, 0, NULL, NULL);
  assert_int_equal (store_writeback (store, &writeback_all_idle, NULL, NULL,
                                     &result), 0);
  recomp_verify (store, versions, present, 0, BLOCKS);
  assert_int_equal (store_trim (store, BLOCKS * BS, 0), 0);
  store_stats (store, &later);
  assert_int_equal (later.bd_count, 0);
  assert_int_equal (later.bd_bytes, 0);
  assert_int_equal (later.backing_used, 0);
  store_destroy (store);
  unlink (backing_path);
}

/* The space map hands out runs that never overlap, wraps around to the
 * start, and says ENOSPC when no run is long enough (a regression: the
 * wrapped search once returned a run in use).
 */
static void
test_backing_space_map (void **state)
{
  (void) state;
  enum { SECTORS = 64 };
  char *error = NULL;
  backing_file_create ();
  struct backing *backing = backing_open (backing_path, SECTORS * 512, false,
                                          30, &error);
  assert_non_null (backing);
  int64_t owner[SECTORS];
  for (unsigned i = 0; i < SECTORS; i++)
    owner[i] = -1;
  uint64_t rng = 5;
  int64_t runs[200][2];
  unsigned live = 0, refused = 0;
  for (unsigned step = 0; step < 5000; step++) {
    if (live > 0 && (live == 200 || xorshift64 (&rng) % 2)) {
      unsigned k = xorshift64 (&rng) % live;
      backing_release (backing, runs[k][0], runs[k][1] * 512 - 100);
      for (int64_t i = 0; i < runs[k][1]; i++)
        owner[runs[k][0] / 512 + i] = -1;
      runs[k][0] = runs[live - 1][0];
      runs[k][1] = runs[live - 1][1];
      live--;
      continue;
    }
    int64_t sectors = 1 + xorshift64 (&rng) % 9;
    int64_t offset = backing_allocate (backing, sectors * 512 - 100);
    if (offset == -1) {
      assert_int_equal (errno, ENOSPC);
      refused++;
      continue;
    }
    assert_true (offset % 512 == 0 && offset / 512 + sectors <= SECTORS);
    for (int64_t i = 0; i < sectors; i++) {
      assert_int_equal (owner[offset / 512 + i], -1);
      owner[offset / 512 + i] = step;
    }
    runs[live][0] = offset;
    runs[live][1] = sectors;
    live++;
  }
  assert_true (refused > 0);
  struct backing_stats stats;
  backing_stats (backing, &stats);
  uint64_t used = 0;
  for (unsigned k = 0; k < live; k++)
    used += runs[k][1] * 512;
  assert_int_equal (stats.used, used);
  assert_int_equal (stats.capacity, SECTORS * 512);
  backing_close (backing);
  unlink (backing_path);
}

/* Under readback_below, a read brings a written-back block back to RAM
 * (its run freed); over it, the block stays written back.
 */
static void
test_writeback_readback (void **state)
{
  (void) state;
  enum { BLOCKS = 256 };
  unsigned char buf[BS], got[BS];
  struct store_writeback_result result;
  struct store_stats stats;
  readback_below = 64 << 20;
  struct block_store *store = make_backed_store (BLOCKS, 0, NULL, 0);
  readback_below = 0;
  for (uint64_t b = 0; b < BLOCKS; b++) {
    recomp_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  assert_int_equal (store_writeback (store, &writeback_all_idle, NULL, NULL,
                                     &result), 0);
  store_stats (store, &stats);
  uint64_t backed = stats.bd_count;
  assert_true (backed > BLOCKS / 2);
  /* Zero part of one first: it is read, patched and stored in RAM. */
  assert_int_equal (store_zero (store, 100, 5 * BS + 10, false), 0);
  for (uint64_t b = 0; b < BLOCKS; b++) {
    recomp_fill (buf, b, 1);
    if (b == 5)
      memset (buf + 10, 0, 100);
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    assert_memory_equal (got, buf, BS);
  }
  store_stats (store, &stats);
  assert_int_equal (stats.bd_count, 0);
  assert_int_equal (stats.bd_readbacks, backed - 1);
  assert_int_equal (stats.backing_used, 0);
  for (uint64_t b = 0; b < BLOCKS; b++) {          /* from RAM now */
    recomp_fill (buf, b, 1);
    if (b == 5)
      memset (buf + 10, 0, 100);
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    assert_memory_equal (got, buf, BS);
  }
  store_stats (store, &stats);
  assert_int_equal (stats.bd_reads, backed);
  store_destroy (store);
  unlink (backing_path);
}

/* writeback_limit caps the bytes written; a failing backing store (reads
 * past its end, writes to /dev/full) fails only what needs it.
 */
static void
test_writeback_limit_and_failures (void **state)
{
  (void) state;
  enum { BLOCKS = 64 };
  unsigned char buf[BS], got[BS];
  struct store_writeback_result result;
  struct store_stats stats;

  struct block_store *store = make_backed_store (BLOCKS, 0, NULL, 8192);
  for (uint64_t b = 0; b < BLOCKS; b++) {
    recomp_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  assert_int_equal (store_writeback (store, &writeback_all_idle, NULL, NULL,
                                     &result), -1);
  assert_int_equal (errno, ENOSPC);
  assert_true (result.limited);
  store_stats (store, &stats);
  assert_true (result.blocks > 0 && result.blocks < BLOCKS);
  assert_true (stats.backing_used <= 8192);
  assert_true (stats.writeback_limit_left < 8192);
  /* The backing file loses its data: written-back blocks fail with EIO,
   * the others still read.
   */
  assert_int_equal (truncate (backing_path, 0), 0);
  uint64_t failed = 0;
  for (uint64_t b = 0; b < BLOCKS; b++) {
    recomp_fill (buf, b, 1);
    if (store_read (store, got, BS, b * BS) == -1) {
      assert_int_equal (errno, EIO);
      failed++;
    }
    else
      assert_memory_equal (got, buf, BS);
  }
  store_stats (store, &stats);
  assert_int_equal (failed, result.blocks);
  assert_int_equal (stats.bd_failed_reads, failed);
  assert_int_equal (stats.failed_reads, failed);
  /* Overwriting a lost block makes it good again. */
  assert_int_equal (store_write (store, buf, BS, (BLOCKS - 1) * BS), 0);
  store_destroy (store);
  unlink (backing_path);

  /* Writes to the backing store fail: every block stays in RAM. */
  store = make_backed_store (BLOCKS, 0, "/dev/full", 0);
  for (uint64_t b = 0; b < BLOCKS; b++) {
    recomp_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  int r = store_writeback (store, &writeback_all_idle, NULL, NULL, &result);
  assert_int_equal (r, -1);
  assert_int_equal (errno, EIO);
  assert_true (result.failed);
  assert_int_equal (result.blocks, 0);
  store_stats (store, &stats);
  assert_int_equal (stats.bd_count, 0);
  assert_int_equal (stats.backing_used, 0);
  assert_true (stats.backing_failed > 0);
  for (uint64_t b = 0; b < BLOCKS; b++) {
    recomp_fill (buf, b, 1);
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    assert_memory_equal (got, buf, BS);
  }
  store_destroy (store);
}

/* At mem_limit, writes make room by writing back instead of failing. */
static void
test_writeback_instead_of_enospc (void **state)
{
  (void) state;
  enum { BLOCKS = 2048 };
  struct block_store *store = make_backed_store (BLOCKS, 1 << 20, NULL, 0);
  static uint64_t versions[BLOCKS];
  static bool present[BLOCKS];
  unsigned char buf[BS];
  for (uint64_t b = 0; b < BLOCKS; b++) {
    versions[b] = 1;
    present[b] = true;
    recomp_fill (buf, b, 1);
    if (store_write (store, buf, BS, b * BS) == -1)
      fail_msg ("write of block %" PRIu64 ": %s", b, strerror (errno));
  }
  struct store_stats stats;
  store_stats (store, &stats);
  print_message ("2048 blocks at a 1 MiB limit: %" PRIu64 " written back, "
                 "pool %" PRIu64 " bytes\n", stats.bd_count,
                 stats.mem_used_total);
  assert_true (stats.bd_count > 0);
  assert_true (stats.mem_used_total <= 1 << 20);
  recomp_verify (store, versions, present, 0, BLOCKS);
  store_destroy (store);
  unlink (backing_path);
}

static uint64_t
writeback_round (struct block_store *store, int round)
{
  struct store_writeback_request request = writeback_all_idle;
  request.max_blocks = 300;
  request.type = round % 3 == 2 ? WRITEBACK_ANY : WRITEBACK_IDLE;
  struct store_writeback_result result;
  assert_int_equal (store_writeback (store, &request, NULL, NULL, &result), 0);
  usleep (5000);                /* the workers read and rewrite them */
  return result.blocks;
}

static void
test_writeback_beside_io (void **state)
{
  (void) state;
  /* Reads bring blocks back while writeback sends them out. */
  readback_below = 1 << 30;
  struct block_store *store = make_backed_store (RECOMP_THREADS * RECOMP_RANGE,
                                                 0, NULL, 0);
  readback_below = 0;
  assert_true (run_beside_io_on (store, writeback_round, "writeback") > 0);
  unlink (backing_path);
}

/* Packed blocks leave RAM too: writeback writes each alone, the unit
 * goes with its last block; with packing and a backing store, writes at
 * the memory limit make room by writeback instead of failing with ENOSPC
 * while the backing store is empty.
 */
static void
test_packed_blocks_written_back (void **state)
{
  (void) state;
  enum { BLOCKS = 1024, PACKED = 256 };
  struct block_store *store = make_backed_store (BLOCKS, 1 << 20, NULL, 0);
  unsigned char buf[BS], out[BS];
  for (uint64_t b = 0; b < PACKED; b++) {
    text_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result packed;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &packed), 0);
  assert_int_equal (packed.blocks, PACKED);

  /* The rest of the device, incompressible: four times the limit. */
  uint64_t seed = 42;
  for (uint64_t b = PACKED; b < BLOCKS; b++) {
    for (unsigned i = 0; i < BS / 8; i++) {
      uint64_t word = xorshift64 (&seed);
      memcpy (buf + 8 * i, &word, 8);
    }
    memcpy (buf, &b, sizeof b);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  struct store_stats stats;
  store_stats (store, &stats);
  print_message ("packed, then 3 MiB at a 1 MiB limit: %" PRIu64
                 " written back, %" PRIu64 " still packed in %" PRIu64
                 " units\n", stats.bd_count, stats.packed_blocks,
                 stats.pack_units);
  assert_true (stats.bd_count > 0);
  assert_true (stats.packed_blocks < PACKED);   /* packed ones went too */

  /* An explicit writeback of what is idle takes the packed ones. */
  struct store_writeback_result written;
  assert_int_equal (store_writeback (store, &writeback_all_idle, NULL, NULL,
                                     &written), 0);
  store_stats (store, &stats);
  assert_int_equal (stats.packed_blocks, 0);
  assert_int_equal (stats.pack_units, 0);
  for (uint64_t b = 0; b < PACKED; b++) {
    text_fill (buf, b, 1);
    assert_int_equal (store_read (store, out, BS, b * BS), 0);
    assert_memory_equal (buf, out, BS);
  }
  struct store_walk walk;
  assert_int_equal (store_walk (store, &walk), 0);
  assert_int_equal (stats.bd_count, walk.written_back);
  assert_int_equal (stats.orig_data_size, walk.stored * BS);
  store_destroy (store);
  unlink (backing_path);
}

/* The backing store's space map grows with what is written back and is
 * charged to the pool (what mem_limit counts), as the block table is: it
 * was outside mem_limit, 256 KiB per GiB of device.
 */
static void
test_backing_map_charged (void **state)
{
  (void) state;
  enum { BLOCKS = 8192 };       /* 32 MiB: two leaves of the map */
  struct block_store *store = make_backed_store (BLOCKS, 0, NULL, 0);
  unsigned char buf[BS];
  uint64_t seed = 7;
  for (uint64_t b = 0; b < BLOCKS; b++) {
    for (unsigned i = 0; i < BS / 8; i++) {
      uint64_t word = xorshift64 (&seed);
      memcpy (buf + 8 * i, &word, 8);
    }
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  struct store_stats empty, full, trimmed;
  store_flush (store);
  store_stats (store, &empty);
  struct store_writeback_request all = {
    .type = WRITEBACK_ANY, .first = 0, .last = UINT64_MAX,
  };
  struct store_writeback_result written;
  assert_int_equal (store_writeback (store, &all, NULL, NULL, &written), 0);
  assert_int_equal (written.blocks, BLOCKS);
  store_compact (store);
  store_flush (store);
  store_stats (store, &full);
  assert_int_equal (full.mem_used_total, 0);
  assert_true (full.backing_map_bytes >= empty.backing_map_bytes + 2 * 4096);

  assert_int_equal (store_trim (store, (uint64_t) BLOCKS * BS, 0), 0);
  store_flush (store);
  store_stats (store, &trimmed);
  assert_int_equal (trimmed.mem_used_total, 0);
  assert_int_equal (trimmed.backing_map_bytes, empty.backing_map_bytes);
  print_message ("space map: %" PRIu64 " bytes empty, %" PRIu64 " with 32 MiB "
                 "written back; limit_used %" PRIu64 " -> %" PRIu64 "\n",
                 empty.backing_map_bytes, full.backing_map_bytes,
                 full.limit_used, trimmed.limit_used);
  /* What left the pool's count is the map's leaves and the table's. */
  assert_int_equal (full.limit_used - trimmed.limit_used,
                    (full.backing_map_bytes - trimmed.backing_map_bytes)
                    + (full.table_bytes - trimmed.table_bytes));
  store_destroy (store);
  unlink (backing_path);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_packed_blocks_written_back),
    cmocka_unit_test (test_backing_map_charged),
    cmocka_unit_test (test_backing_space_map),
    cmocka_unit_test (test_writeback),
    cmocka_unit_test (test_writeback_readback),
    cmocka_unit_test (test_writeback_limit_and_failures),
    cmocka_unit_test (test_writeback_instead_of_enospc),
    cmocka_unit_test (test_writeback_beside_io),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
