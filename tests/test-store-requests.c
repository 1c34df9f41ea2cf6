/* Block store tests, the requests: reads and writes with both codecs,
 * kinds of blocks and the statistics, extents, what a write at the
 * memory limit does (ENOSPC keeps the old block; a partial zero needs no
 * memory; a batch stores what it can), the block table's bound and
 * reclaim, and resident memory.  Without nbdkit, so that the sanitizers
 * see every thread.
 */

#include "store-fixture.h"

static void
test_round_trip_both_codecs (void **state)
{
  (void) state;
  for (int algorithm = CODEC_LZ4; algorithm <= CODEC_ZSTD; algorithm++) {
    struct block_store *store = make_store (1 << 20, algorithm, 0);
    unsigned char in[3 * BS + 100], out[sizeof in];
    for (size_t i = 0; i < sizeof in; i++)
      in[i] = i % 251 < 100 ? 'a' : (unsigned char) (i * 7);
    assert_int_equal (store_write (store, in, sizeof in, 4000), 0);
    assert_int_equal (store_read (store, out, sizeof out, 4000), 0);
    assert_memory_equal (in, out, sizeof in);
    /* This thread's context is counted, and sized for 4 KiB blocks
     * (a default-sized zstd context is 0.6 MiB and more).
     */
    struct store_stats s;
    store_stats (store, &s);
    assert_true (s.codec_bytes > 0);
    assert_true (s.codec_bytes < 400 * 1024);
    /* Idle zstd workspaces go back, and are made again for the next call;
     * lz4's small fixed state stays.  The batched write's scratch (its
     * two whole blocks were one batch) goes with either.
     */
    size_t freed = store_release_idle_memory (store);
    struct store_stats trimmed;
    store_stats (store, &trimmed);
    if (algorithm == CODEC_ZSTD) {
      assert_true (freed > 0);
      assert_int_equal (trimmed.codec_bytes, s.codec_bytes - freed);
      assert_true (trimmed.codec_bytes < 4096);
    }
    else {
      assert_int_equal (freed, 16 * BS);
      assert_int_equal (trimmed.codec_bytes, s.codec_bytes - freed);
      assert_true (trimmed.codec_bytes < 64 * 1024);
    }
    memset (out, 0, sizeof out);
    assert_int_equal (store_write (store, in, sizeof in, 4000 + 3 * BS), 0);
    assert_int_equal (store_read (store, out, sizeof out, 4000 + 3 * BS), 0);
    assert_memory_equal (in, out, sizeof in);
    /* Before the write: zeros. */
    assert_int_equal (store_read (store, out, 4000, 0), 0);
    for (size_t i = 0; i < 4000; i++)
      assert_int_equal (out[i], 0);
    store_destroy (store);
  }
}

static void
test_kinds_and_stats (void **state)
{
  (void) state;
  struct block_store *store = make_store (64 * BS, CODEC_LZ4, 0);
  unsigned char buf[BS];
  uint64_t state_rng = 42;

  memset (buf, 0, BS);                  /* block 0: zeros -> same */
  assert_int_equal (store_write (store, buf, BS, 0), 0);
  for (size_t i = 0; i < BS; i += 8)    /* block 1: one word -> same */
    memcpy (buf + i, "ABCDEFGH", 8);
  assert_int_equal (store_write (store, buf, BS, BS), 0);
  for (size_t i = 0; i < BS; i += 8) {  /* block 2: random -> raw */
    uint64_t r = xorshift64 (&state_rng);
    memcpy (buf + i, &r, 8);
  }
  assert_int_equal (store_write (store, buf, BS, 2 * BS), 0);
  memset (buf, 'x', BS);                /* block 3: text -> compressed */
  memcpy (buf, "header", 6);
  assert_int_equal (store_write (store, buf, BS, 3 * BS), 0);

  struct store_stats s;
  store_stats (store, &s);
  assert_int_equal (s.orig_data_size, 4 * BS);
  assert_int_equal (s.same_pages, 2);
  assert_int_equal (s.huge_pages, 1);
  assert_true (s.compr_data_size > BS && s.compr_data_size < 2 * BS);
  assert_true (s.mem_used_total >= s.compr_data_size);

  /* Overwrite the raw block with a same-filled one: counters follow. */
  memset (buf, 7, BS);
  assert_int_equal (store_write (store, buf, BS, 2 * BS), 0);
  store_stats (store, &s);
  assert_int_equal (s.same_pages, 3);
  assert_int_equal (s.huge_pages, 0);
  assert_int_equal (s.huge_pages_since, 1);

  /* Trim everything: nothing stored, reads are zeros. */
  assert_int_equal (store_trim (store, 64 * BS, 0), 0);
  store_stats (store, &s);
  assert_int_equal (s.orig_data_size, 0);
  assert_int_equal (s.compr_data_size, 0);
  assert_int_equal (s.mem_used_total, 0);
  assert_int_equal (store_read (store, buf, BS, 3 * BS), 0);
  for (size_t i = 0; i < BS; i++)
    assert_int_equal (buf[i], 0);
  store_destroy (store);
}

struct extent_log {
  unsigned n;
  uint64_t offset[16], length[16];
  enum store_extent type[16];
};

static int
log_extent (void *opaque, uint64_t offset, uint64_t length,
            enum store_extent type)
{
  struct extent_log *log = opaque;
  assert_true (log->n < 16);
  log->offset[log->n] = offset;
  log->length[log->n] = length;
  log->type[log->n++] = type;
  return 0;
}

static void
test_extents (void **state)
{
  (void) state;
  /* Far apart blocks in a huge device: leaves between are skipped. */
  uint64_t size = INT64_MAX;
  struct block_store *store = make_store (size, CODEC_LZ4, 0);
  unsigned char buf[BS];
  memset (buf, 'q', BS);
  buf[0] = 1;
  uint64_t far = (uint64_t) 1 << 50;
  assert_int_equal (store_write (store, buf, BS, BS), 0);
  memset (buf, 0, BS);
  assert_int_equal (store_write (store, buf, BS, 2 * BS), 0);
  assert_int_equal (store_zero (store, BS, far, false), 0);

  struct extent_log log = { 0 };
  assert_int_equal (store_extents (store, far + BS, 0, log_extent, &log), 0);
  assert_int_equal (log.n, 5);
  assert_int_equal (log.type[0], STORE_EXTENT_HOLE);
  assert_int_equal (log.length[0], BS);
  assert_int_equal (log.type[1], STORE_EXTENT_DATA);
  assert_int_equal (log.offset[1], BS);
  assert_int_equal (log.type[2], STORE_EXTENT_ZERO);
  assert_int_equal (log.offset[2], 2 * BS);
  assert_int_equal (log.type[3], STORE_EXTENT_HOLE);
  assert_int_equal (log.offset[3], 3 * BS);
  assert_int_equal (log.length[3], far - 3 * BS);
  assert_int_equal (log.type[4], STORE_EXTENT_ZERO);
  assert_int_equal (log.offset[4], far);
  assert_int_equal (log.length[4], BS);

  /* Zeroing part of a hole keeps it a hole. */
  assert_int_equal (store_zero (store, 100, far + BS + 10, false), 0);
  log.n = 0;
  assert_int_equal (store_extents (store, BS, far + BS, log_extent, &log), 0);
  assert_int_equal (log.n, 1);
  assert_int_equal (log.type[0], STORE_EXTENT_HOLE);

  /* ... and where no table leaf exists, makes none. */
  struct store_stats before, after;
  store_stats (store, &before);
  assert_int_equal (store_zero (store, 100, ((uint64_t) 1 << 40) + 10, false), 0);
  store_stats (store, &after);
  assert_int_equal (after.table_bytes, before.table_bytes);

  /* Zero with may_trim makes a hole. */
  assert_int_equal (store_zero (store, BS, far, true), 0);
  log.n = 0;
  assert_int_equal (store_extents (store, BS, far, log_extent, &log), 0);
  assert_int_equal (log.n, 1);
  assert_int_equal (log.type[0], STORE_EXTENT_HOLE);

  /* The last bytes of a 2^63-1 device. */
  unsigned char tail[511], back[511];
  memset (tail, 0x5c, sizeof tail);
  assert_int_equal (store_write (store, tail, sizeof tail, size - sizeof tail), 0);
  assert_int_equal (store_read (store, back, sizeof back, size - sizeof back), 0);
  assert_memory_equal (tail, back, sizeof tail);
  store_destroy (store);
}

static void
test_enospc_keeps_old_block (void **state)
{
  (void) state;
  struct block_store *store = make_store (1024 * BS, CODEC_LZ4, 64 * BS);
  unsigned char known[BS], buf[BS], back[BS];
  uint64_t rng = 7;

  block_fill (known, 0, 1);
  assert_int_equal (store_write (store, known, BS, 0), 0);

  /* Fill with incompressible blocks until the limit refuses. */
  uint64_t block;
  int r = 0;
  for (block = 1; block < 1024 && r == 0; block++) {
    for (size_t i = 0; i < BS; i += 8) {
      uint64_t x = xorshift64 (&rng);
      memcpy (buf + i, &x, 8);
    }
    r = store_write (store, buf, BS, block * BS);
  }
  assert_int_equal (r, -1);
  assert_int_equal (errno, ENOSPC);
  assert_true (block < 80);

  /* Overwriting the known block with incompressible data fails too, and
   * the old content stays.
   */
  assert_int_equal (store_write (store, buf, BS, 0), -1);
  assert_int_equal (errno, ENOSPC);
  assert_int_equal (store_read (store, back, BS, 0), 0);
  assert_memory_equal (known, back, BS);

  /* Trims free memory; writes work again. */
  assert_int_equal (store_trim (store, 16 * BS, BS), 0);
  assert_int_equal (store_write (store, buf, BS, 0), 0);
  assert_int_equal (store_read (store, back, BS, 0), 0);
  assert_memory_equal (buf, back, BS);

  struct store_stats s;
  store_stats (store, &s);
  assert_true (s.failed_writes >= 2);
  assert_true (s.mem_used_max <= 64 * BS);
  store_destroy (store);
}

/* Zeroing part of a block that holds an object needs no memory: with the
 * pool full, random partial zeroes of every stored block (two per block,
 * the second touching the first, and some making the block compress worse
 * than before, some of same-filled blocks) all succeed, and every block
 * reads back as a model of it says.  Both codecs.
 */

static void
test_partial_zero_at_limit (void **state)
{
  (void) state;
  enum { BLOCKS = 256 };
  static unsigned char model[BLOCKS][BS];
  unsigned char back[BS];

  /* lz4, zstd, and lz4 whose blocks were then recompressed with zstd at
   * the limit (a zero decodes them with the codec that made them, and
   * one kept beside its zeroed range keeps that codec).
   */
  for (int variant = 0; variant < 3; variant++) {
    int algorithm = variant == 1 ? CODEC_ZSTD : CODEC_LZ4;
    struct store_config config = {
      .size = BLOCKS * BS, .algorithm = algorithm, .level = 1,
      .recomp_count = variant == 2, .recomp = { { CODEC_ZSTD, 19 } },
    };
    zs_pool_config_init (&config.pool);
    config.pool.mem_limit = 32 * BS;
    struct block_store *store = store_create (&config);
    assert_non_null (store);
    uint64_t rng = 11 + algorithm;
    uint64_t stored;
    int r = 0;

    /* Fill until the limit refuses: half-random blocks, periodic text
     * (which a zero in its middle makes compress worse), raw blocks and
     * same-filled ones (which a zero turns into data that needs memory).
     */
    for (stored = 0; stored < BLOCKS; stored++) {
      unsigned char *block = model[stored];
      switch (stored % 4) {
      case 0:
        block_fill (block, stored, 1);
        break;
      case 3:
        memset (block, 0xa0 + stored % 16, BS);   /* same-filled */
        break;
      case 1:
        if (variant == 2) {       /* text that zstd packs tighter */
          recomp_fill (block, stored * 8 + 2, 1);
          break;
        }
        for (size_t i = 0; i < BS; i++)
          block[i] = "a known compressible block 42 "[i % 30];
        block[0] = stored;
        break;
      default:
        for (size_t i = 0; i < BS; i += 8) {
          uint64_t x = xorshift64 (&rng);
          memcpy (block + i, &x, 8);
        }
      }
      if ((r = store_write (store, block, BS, stored * BS)) == -1)
        break;
    }
    assert_int_equal (r, -1);
    assert_int_equal (errno, ENOSPC);
    assert_true (stored > 6);
    if (variant == 2) {
      /* Recompression needs room for the new object before the old one
       * goes: give it some, then put the limit back at what is held.
       */
      assert_int_equal (store_set_mem_limit (store, 64 * BS, NULL), 0);
      store_mark_idle (store, 0, NULL, NULL);
      struct store_recompress_request request = { .type = RECOMPRESS_IDLE };
      struct store_recompress_result result;
      assert_int_equal (store_recompress (store, &request, NULL, NULL,
                                          &result), 0);
      store_compact (store);
      store_flush (store);
      struct store_stats st;
      store_stats (store, &st);
      assert_int_equal (store_set_mem_limit (store, st.limit_used, NULL), 0);
      print_message ("tried %" PRIu64 ", incompressible %" PRIu64 "; %" PRIu64 " of %" PRIu64 " blocks recompressed, the "
                     "limit put back at %" PRIu64 " bytes held\n",
                     result.tried, result.incompressible, result.recompressed, stored, st.limit_used);
      assert_true (result.recompressed > 0);
    }

    for (uint64_t b = 0; b < stored; b++) {
      size_t first = 1 + xorshift64 (&rng) % (BS - 2);
      size_t length = 1 + xorshift64 (&rng) % (BS - 1 - first);
      if (store_zero (store, length, b * BS + first, false) == -1)
        fail_msg ("block %" PRIu64 ": zero [%zu, %zu) at the limit: %s",
                  b, first, first + length, strerror (errno));
      memset (model[b] + first, 0, length);
      /* A second zero that touches the first. */
      size_t second = first + length - (length > 8 ? 8 : length);
      size_t second_length = BS - second > 100 ? 100 : BS - second;
      if (store_zero (store, second_length, b * BS + second, false) == -1)
        fail_msg ("block %" PRIu64 ": second zero at the limit: %s",
                  b, strerror (errno));
      memset (model[b] + second, 0, second_length);
    }
    for (uint64_t b = 0; b < stored; b++) {
      assert_int_equal (store_read (store, back, BS, b * BS), 0);
      assert_memory_equal (model[b], back, BS);
    }

    /* The blocks rewritten or marked stay writable and trimmable. */
    assert_int_equal (store_trim (store, stored * BS, 0), 0);
    struct store_stats st;
    store_stats (store, &st);
    assert_int_equal (st.compr_data_size, 0);
    assert_int_equal (st.orig_data_size, 0);
    assert_int_equal (st.mem_used_total, 0);
    store_destroy (store);
  }
}

/* The block table follows what is stored and stays within mem_limit:
 * 16,384 NO_HOLE zeroes of single blocks 2 MiB apart (each wanting a leaf
 * of its own) on a 1 TiB device with mem_limit=1M all succeed, reading as
 * zeros, with the table inside the limit; data written there, then
 * trimmed, leaves no table behind once the store is flushed.
 */
static void
test_table_bounded_and_reclaimed (void **state)
{
  (void) state;
  enum { ZEROES = 16384, STRIDE = 512 };   /* blocks: one leaf apart */
  const uint64_t limit = 1 << 20;
  struct block_store *store = make_store ((uint64_t) 1 << 40, CODEC_LZ4, limit);
  unsigned char buf[BS], back[BS];
  struct store_stats st;

  for (uint64_t i = 0; i < ZEROES; i++)
    if (store_zero (store, BS, i * STRIDE * BS, false) == -1)
      fail_msg ("zero %" PRIu64 ": %s", i, strerror (errno));
  store_stats (store, &st);
  print_message ("after %d NO_HOLE zeroes: table %" PRIu64 " bytes, limit used %"
                 PRIu64 " of %" PRIu64 "\n", ZEROES, st.table_bytes,
                 st.limit_used, st.mem_limit);
  assert_true (st.limit_used <= limit);
  assert_true (st.table_bytes <= limit);
  assert_true (st.table_bytes > 0);
  for (uint64_t i = 0; i < ZEROES; i += 97) {
    assert_int_equal (store_read (store, back, BS, i * STRIDE * BS), 0);
    assert_true (back[0] == 0 && memcmp (back, back + 1, BS - 1) == 0);
  }

  /* Trimmed, the leaves and nodes go back. */
  for (uint64_t i = 0; i < ZEROES; i++)
    assert_int_equal (store_trim (store, BS, i * STRIDE * BS), 0);
  store_flush (store);
  store_stats (store, &st);
  assert_int_equal (st.table_bytes, 0);
  assert_int_equal (st.limit_used, 0);

  /* Data over many leaves, then trimmed: the same. */
  uint64_t written;
  for (written = 0; written < ZEROES; written++) {
    block_fill (buf, written, 1);
    if (store_write (store, buf, BS, written * STRIDE * BS) == -1)
      break;
  }
  assert_int_equal (errno, ENOSPC);
  assert_true (written > 8);
  for (uint64_t i = 0; i < written; i++) {
    block_fill (buf, i, 1);
    assert_int_equal (store_read (store, back, BS, i * STRIDE * BS), 0);
    assert_memory_equal (buf, back, BS);
  }
  assert_int_equal (store_trim (store, written * STRIDE * BS, 0), 0);
  store_flush (store);
  store_stats (store, &st);
  assert_int_equal (st.table_bytes, 0);
  assert_int_equal (st.orig_data_size, 0);
  store_destroy (store);
}

/* Swap mode's store_keep_resident: the whole table made at once and kept
 * through trims and reclaim, the write codec's contexts made and kept
 * through store_release_idle_memory, and a mem_limit too small for the
 * table refused with ENOSPC.
 */
static void
test_keep_resident (void **state)
{
  (void) state;
  enum { BLOCKS = 8 * 512 };      /* 8 leaves */
  unsigned char buf[BS], back[BS];
  struct store_stats st;

  for (int zstd = 0; zstd <= 1; zstd++) {
    enum codec_algorithm algorithm = zstd ? CODEC_ZSTD : CODEC_LZ4;
    struct block_store *store = make_store (BLOCKS * BS, algorithm, 0);
    store_stats (store, &st);
    assert_int_equal (st.table_bytes, 0);
    assert_int_equal (store_keep_resident (store, 6), 0);
    store_stats (store, &st);
    uint64_t table = st.table_bytes, contexts = st.codec_bytes;
    print_message ("%s: table %" PRIu64 " bytes, contexts %" PRIu64 " bytes\n",
                   zstd ? "zstd" : "lz4", table, contexts);
    /* 8 leaves of 16-byte entries and the root above them. */
    assert_true (table >= 8 * 512 * 16);
    assert_true (table < 8 * 512 * 16 + 2 * 8192);
    /* Six contexts, each with its workspace (zstd's: tens of KiB). */
    assert_true (contexts >= (zstd ? 6 * 16384 : 6 * 1024));

    for (uint64_t i = 0; i < BLOCKS; i += 37) {
      block_fill (buf, i, 1);
      assert_int_equal (store_write (store, buf, BS, i * BS), 0);
    }
    assert_int_equal (store_trim (store, BLOCKS * BS, 0), 0);
    store_flush (store);
    assert_int_equal (store_release_idle_memory (store), 0);
    store_stats (store, &st);
    assert_int_equal (st.table_bytes, table);
    assert_true (st.codec_bytes >= contexts);
    assert_int_equal (st.orig_data_size, 0);
    block_fill (buf, 5, 1);
    assert_int_equal (store_write (store, buf, BS, 5 * BS), 0);
    assert_int_equal (store_read (store, back, BS, 5 * BS), 0);
    assert_memory_equal (buf, back, BS);
    assert_int_equal (store_read (store, back, BS, 6 * BS), 0);
    assert_true (back[0] == 0 && memcmp (back, back + 1, BS - 1) == 0);
    store_destroy (store);
  }

  /* 1 TiB of device is 4 GiB of table: more than a 1 MiB limit. */
  struct block_store *store = make_store ((uint64_t) 1 << 40, CODEC_LZ4, 1 << 20);
  errno = 0;
  assert_int_equal (store_keep_resident (store, 2), -1);
  assert_int_equal (errno, ENOSPC);
  store_stats (store, &st);
  assert_true (st.limit_used <= 1 << 20);
  store_destroy (store);
}

static void
test_batched_write_at_limit (void **state)
{
  (void) state;
  enum { BLOCKS = 32 };
  struct block_store *store = make_store (64 * BS, CODEC_LZ4, 96 * 1024);
  /* calloc: every byte defined (valgrind checks what lz4 reads). */
  unsigned char *old = calloc (BLOCKS, BS), *new = calloc (BLOCKS, BS);
  unsigned char *got = calloc (BLOCKS, BS);
  assert_true (old && new && got);
  uint64_t rng = 77;
  for (unsigned b = 0; b < BLOCKS; b++) {
    unsigned char *o = old + (size_t) b * BS, *n = new + (size_t) b * BS;
    snprintf ((char *) o, BS, "old block %u", b);
    memset (o + 64, 'a' + b % 26, BS - 64);
    for (size_t i = 0; i < BS; i += 8) {     /* incompressible */
      uint64_t x = xorshift64 (&rng);
      memcpy (n + i, &x, 8);
    }
    /* Every fourth new block compresses: a batch of both kinds. */
    if (b % 4 == 0)
      memset (n + 16, 'z', BS - 16);
    assert_int_equal (store_write (store, o, BS, (uint64_t) b * BS), 0);
  }
  errno = 0;
  assert_int_equal (store_write (store, new, BLOCKS * BS, 0), -1);
  assert_int_equal (errno, ENOSPC);
  assert_int_equal (store_read (store, got, BLOCKS * BS, 0), 0);
  unsigned now_new = 0;
  for (unsigned b = 0; b < BLOCKS; b++) {
    size_t at = (size_t) b * BS;
    if (memcmp (got + at, new + at, BS) == 0)
      now_new++;
    else if (memcmp (got + at, old + at, BS) != 0)
      fail_msg ("block %u is neither its old content nor its new one", b);
  }
  print_message ("a 32-block batch at a 96 KiB limit: %u blocks new, %u old\n",
                 now_new, BLOCKS - now_new);
  assert_true (now_new > 0 && now_new < BLOCKS);
  struct store_walk walk;
  struct store_stats stats;
  assert_int_equal (store_walk (store, &walk), 0);
  store_stats (store, &stats);
  assert_int_equal (walk.stored, BLOCKS);
  assert_int_equal (stats.orig_data_size, BLOCKS * BS);
  assert_int_equal (stats.failed_writes, 1);
  assert_int_equal (store_trim (store, 64 * BS, 0), 0);
  store_flush (store);
  store_stats (store, &stats);
  assert_int_equal (stats.compr_data_size, 0);
  assert_int_equal (stats.mem_used_total, 0);
  free (old);
  free (new);
  free (got);
  store_destroy (store);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_round_trip_both_codecs),
    cmocka_unit_test (test_batched_write_at_limit),
    cmocka_unit_test (test_kinds_and_stats),
    cmocka_unit_test (test_extents),
    cmocka_unit_test (test_enospc_keeps_old_block),
    cmocka_unit_test (test_partial_zero_at_limit),
    cmocka_unit_test (test_table_bounded_and_reclaimed),
    cmocka_unit_test (test_keep_resident),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
