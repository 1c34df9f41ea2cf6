/* Block store tests: the plugin's core without nbdkit, so that the
 * sanitizers see every thread.  Concurrency first: partial writes of one
 * block must not lose each other's bytes, and a read must never return
 * another block's data or freed data whatever runs beside it.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "xorshift.h"
#include "store-walk.h"
#include "moved-clock.h"
#include "thread-exit-hooks.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "block-store.h"
#include "block-store-internal.h"  /* store_decode_cache_sweep */
#include "backing.h"

#define BS STORE_BLOCK_SIZE

static struct block_store *
make_store (uint64_t size, enum codec_algorithm algorithm, uint64_t mem_limit)
{
  struct store_config config = { .size = size, .algorithm = algorithm,
                                 .level = 1 };
  zs_pool_config_init (&config.pool);
  config.pool.mem_limit = mem_limit;
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  return store;
}

/* A block whose bytes say which block and which version they are:
 * word 0 = block, word 1 = version, the rest a function of both, half of
 * it compressible.  block_check tells whether a buffer is such a block
 * (or all zeros) for the expected block number.
 */
static void
block_fill (unsigned char *buf, uint64_t block, uint64_t version)
{
  uint64_t *words = (uint64_t *) buf;
  uint64_t state = block * 0x9e3779b97f4a7c15ull + version + 1;
  words[0] = block;
  words[1] = version;
  for (size_t i = 2; i < BS / 8; i++)
    words[i] = i < BS / 16 ? xorshift64 (&state) : block ^ version;
}

static bool
block_check (const unsigned char *buf, uint64_t block)
{
  static const unsigned char zeros[BS];
  if (memcmp (buf, zeros, BS) == 0)
    return true;
  unsigned char expected[BS];
  uint64_t version;
  memcpy (&version, buf + 8, 8);
  block_fill (expected, block, version);
  return memcmp (buf, expected, BS) == 0;
}

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
static void recomp_fill (unsigned char *buf, uint64_t block, uint64_t version);

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

/* ---- concurrency ---------------------------------------------------- */

#define THREADS 4
#define SHARED_BLOCKS 4

struct partial_args {
  struct block_store *store;
  unsigned id;
  unsigned rounds;
};

/* Each thread owns a slice of every shared block and rewrites it over
 * and over with partial writes, reading its slice back each time: nobody
 * else writes it, so it must always hold the thread's last pattern.  A
 * lost update (another thread's read-modify-write putting back an older
 * copy) shows as a slice that went back in time.
 */
static void *
partial_writer (void *arg)
{
  struct partial_args *a = arg;
  const size_t slice = BS / THREADS;
  unsigned char pattern[BS / THREADS], back[BS / THREADS];

  for (unsigned round = 1; round <= a->rounds; round++) {
    memset (pattern, (a->id << 6) | (round & 63), slice);
    for (uint64_t block = 0; block < SHARED_BLOCKS; block++) {
      uint64_t offset = block * BS + a->id * slice;
      if (store_write (a->store, pattern, slice, offset) == -1)
        return (void *) 1;
      uint64_t previous = (block + SHARED_BLOCKS - 1) % SHARED_BLOCKS;
      uint64_t check = previous * BS + a->id * slice;
      if (store_read (a->store, back, slice, check) == -1)
        return (void *) 1;
      unsigned char expect = block == 0 ? ((a->id << 6) | ((round - 1) & 63))
                                        : pattern[0];
      if (round == 1 && block == 0)
        continue;
      for (size_t i = 0; i < slice; i++)
        if (back[i] != expect)
          return (void *) 2;
    }
  }
  return NULL;
}

static void
test_concurrent_partial_writes (void **state)
{
  (void) state;
  struct block_store *store = make_store (SHARED_BLOCKS * BS, CODEC_LZ4, 0);
  pthread_t threads[THREADS];
  struct partial_args args[THREADS];
  unsigned rounds = 2000;

  for (unsigned t = 0; t < THREADS; t++) {
    args[t] = (struct partial_args) { store, t, rounds };
    pthread_create (&threads[t], NULL, partial_writer, &args[t]);
  }
  for (unsigned t = 0; t < THREADS; t++) {
    void *result;
    pthread_join (threads[t], &result);
    assert_null (result);
  }

  unsigned char buf[BS];
  for (uint64_t block = 0; block < SHARED_BLOCKS; block++) {
    assert_int_equal (store_read (store, buf, BS, block * BS), 0);
    for (unsigned t = 0; t < THREADS; t++)
      for (size_t i = 0; i < BS / THREADS; i++)
        assert_int_equal (buf[t * (BS / THREADS) + i],
                          (t << 6) | (rounds & 63));
  }
  store_destroy (store);
}

#define MIXED_BLOCKS 256

struct mixed_args {
  struct block_store *store;
  uint64_t seed;
  unsigned operations;
  uint64_t stride;              /* blocks of the device per test block */
  atomic_uint *bad_reads;
};

/* Writers, readers, trimmers and zeroers on a small set of blocks: every
 * read must be all zeros or a whole, consistent version of that block.
 */
static void *
mixed_worker (void *arg)
{
  struct mixed_args *a = arg;
  unsigned char buf[BS];
  uint64_t rng = a->seed;

  for (unsigned i = 0; i < a->operations; i++) {
    uint64_t r = xorshift64 (&rng);
    uint64_t block = r % MIXED_BLOCKS;
    uint64_t offset = block * a->stride * BS;
    switch ((r >> 20) % 8) {
    case 0: case 1: case 2:
      block_fill (buf, block, r >> 32);
      if (store_write (a->store, buf, BS, offset) == -1)
        return (void *) 1;
      break;
    case 3:
      store_trim (a->store, BS, offset);
      break;
    case 4:
      store_zero (a->store, BS, offset, (r >> 40) & 1);
      break;
    default:
      if (store_read (a->store, buf, BS, offset) == -1)
        return (void *) 1;
      if (!block_check (buf, block))
        atomic_fetch_add (a->bad_reads, 1);
      break;
    }
  }
  return NULL;
}

/* Beside the workers: the housekeeper's flush, which reclaims the block
 * table's empty leaves, and extents walks, until the workers are done.
 */
struct reclaimer_args {
  struct block_store *store;
  atomic_bool *done;
  uint64_t size;
};

static int
count_extent (void *opaque, uint64_t offset, uint64_t length,
              enum store_extent type)
{
  (*(unsigned *) opaque)++;
  return 0;
}

static void *
reclaimer (void *arg)
{
  struct reclaimer_args *a = arg;
  unsigned extents = 0;

  while (!atomic_load (a->done)) {
    store_flush (a->store);
    if (store_extents (a->store, a->size, 0, count_extent, &extents) == -1)
      return (void *) 1;
  }
  return NULL;
}

static void
run_mixed (enum zs_free_mode free_mode, enum zs_lock_mode lock_mode,
           uint64_t stride)
{
  struct store_config config = { .size = MIXED_BLOCKS * stride * BS,
                                 .algorithm = CODEC_LZ4, .level = 1 };
  zs_pool_config_init (&config.pool);
  config.pool.free_mode = free_mode;
  config.pool.lock_mode = lock_mode;
  struct block_store *store = store_create (&config);
  assert_non_null (store);

  atomic_uint bad_reads = 0;
  atomic_bool done = false;
  pthread_t threads[THREADS], reclaim_thread;
  struct mixed_args args[THREADS];
  struct reclaimer_args reclaim_args = { store, &done, config.size };
  pthread_create (&reclaim_thread, NULL, reclaimer, &reclaim_args);
  for (unsigned t = 0; t < THREADS; t++) {
    args[t] = (struct mixed_args) { store, t * 7919 + 1, 20000, stride,
                                    &bad_reads };
    pthread_create (&threads[t], NULL, mixed_worker, &args[t]);
  }
  for (unsigned t = 0; t < THREADS; t++) {
    void *result;
    pthread_join (threads[t], &result);
    assert_null (result);
  }
  atomic_store (&done, true);
  void *reclaim_result;
  pthread_join (reclaim_thread, &reclaim_result);
  assert_null (reclaim_result);
  assert_int_equal (atomic_load (&bad_reads), 0);

  /* Afterwards every block is consistent and the accounting balances. */
  unsigned char buf[BS];
  uint64_t stored = 0;
  for (uint64_t block = 0; block < MIXED_BLOCKS; block++) {
    assert_int_equal (store_read (store, buf, BS, block * stride * BS), 0);
    assert_true (block_check (buf, block));
  }
  struct store_stats s;
  store_stats (store, &s);
  assert_true (s.orig_data_size <= MIXED_BLOCKS * BS);
  stored = s.orig_data_size;
  assert_int_equal (store_trim (store, config.size, 0), 0);
  store_flush (store);
  store_stats (store, &s);
  assert_int_equal (s.orig_data_size, 0);
  assert_int_equal (s.compr_data_size, 0);
  assert_int_equal (s.mem_used_total, 0);
  assert_int_equal (s.table_bytes, 0);
  (void) stored;
  store_destroy (store);
}

/* Threads that served requests exit after the store is destroyed, and no
 * thread's exit runs store or allocator code: nothing registers a pthread
 * key with a destructor.  Both codecs; each
 * thread writes, reads and trims, so it has borrowed contexts and left
 * frees pending.
 */
struct late_server {
  struct block_store *store;
  unsigned index;
  pthread_barrier_t *used, *may_exit;
};

static void *
late_server_thread (void *arg)
{
  struct late_server *l = arg;
  unsigned char buf[BS], back[BS];

  for (uint64_t block = l->index; block < 256; block += 4) {
    block_fill (buf, block, 1);
    assert_int_equal (store_write (l->store, buf, BS, block * BS), 0);
    assert_int_equal (store_read (l->store, back, BS, block * BS), 0);
    assert_memory_equal (buf, back, BS);
    assert_int_equal (store_trim (l->store, BS, block * BS), 0);
  }
  pthread_barrier_wait (l->used);
  pthread_barrier_wait (l->may_exit);
  return NULL;
}

static void
test_threads_exit_after_destroy (void **state)
{
  (void) state;
  enum { SERVERS = 4 };

  for (int algorithm = CODEC_LZ4; algorithm <= CODEC_ZSTD; algorithm++) {
    struct block_store *store = make_store (256 * BS, algorithm, 0);
    pthread_barrier_t used, may_exit;
    pthread_t threads[SERVERS];
    struct late_server l[SERVERS];

    pthread_barrier_init (&used, NULL, SERVERS + 1);
    pthread_barrier_init (&may_exit, NULL, SERVERS + 1);
    for (unsigned i = 0; i < SERVERS; i++) {
      l[i] = (struct late_server) { store, i, &used, &may_exit };
      assert_int_equal (pthread_create (&threads[i], NULL, late_server_thread,
                                        &l[i]), 0);
    }
    pthread_barrier_wait (&used);
    store_destroy (store);
    pthread_barrier_wait (&may_exit);
    for (unsigned i = 0; i < SERVERS; i++)
      assert_int_equal (pthread_join (threads[i], NULL), 0);
    pthread_barrier_destroy (&used);
    pthread_barrier_destroy (&may_exit);
  }
  assert_int_equal (atomic_load (&keys_with_destructor), 0);
}

static void
test_concurrent_mixed_batched (void **state)
{
  (void) state;
  run_mixed (ZS_FREE_BATCHED, ZS_LOCK_CLASS, 1);
}

/* The same with every test block in a leaf of its own (512 blocks
 * apart), so that trims empty leaves that the flush beside reclaims while
 * writers make them again.
 */
static void
test_concurrent_mixed_leaves (void **state)
{
  (void) state;
  run_mixed (ZS_FREE_BATCHED, ZS_LOCK_CLASS, 512);
}

static void
test_concurrent_mixed_immediate_pool_lock (void **state)
{
  (void) state;
  run_mixed (ZS_FREE_IMMEDIATE, ZS_LOCK_POOL, 1);
}

/* ---- recompression -------------------------------------------------- */

/* Text-like content (words of a small vocabulary in a random order):
 * lz4 leaves room that zstd takes, so recompression has work.  Kinds:
 * text, random (stored raw, shrinks with nothing), same-filled.
 */
static void
recomp_fill (unsigned char *buf, uint64_t block, uint64_t version)
{
  static const char *const words[] = {
    "alpha ", "beta ", "gamma ", "delta ", "epsilon ", "zeta ", "eta ",
    "theta ", "iota ", "kappa ", "lambda ", "mu ", "nu ", "xi ", "omicron ",
    "pi ", "rho ", "sigma ", "tau ", "upsilon ", "phi ", "chi ", "psi ",
    "omega ", "block ", "store ", "zspage ", "class ", "handle ", "cell ",
  };
  uint64_t state = block * 0x9e3779b97f4a7c15ull + version * 7919 + 1;
  switch (block % 8) {
  case 0:                       /* random: raw */
    for (size_t i = 0; i < BS; i += 8) {
      uint64_t word = xorshift64 (&state);
      memcpy (buf + i, &word, 8);
    }
    break;
  case 1:                       /* same-filled: no header */
    memset (buf, (int) (block + version), BS);
    return;
  default: {
    size_t used = 0;
    while (used < BS) {
      const char *word = words[xorshift64 (&state) % 30];
      size_t length = strlen (word);
      if (length > BS - used)
        length = BS - used;
      memcpy (buf + used, word, length);
      used += length;
    }
  }
  }
  memcpy (buf, &block, 8);
  memcpy (buf + 8, &version, 8);
}

/* pack_blocks 0: the default. */
static struct block_store *
make_packing_store (uint64_t blocks, unsigned pack_blocks)
{
  struct store_config config = {
    .size = blocks * BS, .algorithm = CODEC_LZ4, .level = 1,
    .recomp_count = 2,
    .recomp = { { CODEC_ZSTD, 3 }, { CODEC_ZSTD, 19 } },
    .pack_blocks = pack_blocks,
  };
  zs_pool_config_init (&config.pool);
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  return store;
}

static struct block_store *
make_recompressing_store (uint64_t blocks)
{
  return make_packing_store (blocks, 0);
}

/* Every block reads back as the model says (version 0: never written). */
static void
recomp_verify (struct block_store *store, const uint64_t *versions,
               const bool *present, uint64_t first, uint64_t count)
{
  unsigned char got[BS], want[BS];
  for (uint64_t b = first; b < first + count; b++) {
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    if (present[b])
      recomp_fill (want, b, versions[b]);
    else
      memset (want, 0, BS);
    if (memcmp (got, want, BS) != 0)
      fail_msg ("block %" PRIu64 " (version %" PRIu64 ") differs", b,
                versions[b]);
  }
}

struct recomp_flags {
  uint64_t recompressed, incompressible, idle;
};

static int
count_flags (void *opaque, const struct store_block_state *state)
{
  struct recomp_flags *flags = opaque;
  flags->recompressed += state->recompressed;
  flags->incompressible += state->incompressible;
  flags->idle += state->idle;
  return 0;
}

static void
test_recompress (void **state)
{
  (void) state;
  enum { BLOCKS = 512 };
  struct block_store *store = make_recompressing_store (BLOCKS);
  uint64_t versions[BLOCKS] = { 0 };
  bool present[BLOCKS] = { false };
  unsigned char buf[BS];
  for (uint64_t b = 0; b < BLOCKS; b++) {
    versions[b] = 1;
    present[b] = true;
    recomp_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  struct store_stats before;
  store_stats (store, &before);

  /* Idle blocks only: nothing is idle yet. */
  struct store_recompress_request request = { .type = RECOMPRESS_IDLE };
  struct store_recompress_result result;
  assert_int_equal (store_recompress (store, &request, NULL, NULL, &result), 0);
  assert_int_equal (result.tried, 0);

  assert_int_equal (store_mark_idle (store, 0, NULL, NULL), BLOCKS);
  assert_int_equal (store_recompress (store, &request, NULL, NULL, &result), 0);
  struct store_stats after;
  store_stats (store, &after);
  print_message ("recompress: tried %" PRIu64 ", recompressed %" PRIu64
                 ", incompressible %" PRIu64 ", saved %" PRIu64 " bytes; "
                 "compressed %" PRIu64 " -> %" PRIu64 " bytes, pool %" PRIu64
                 " -> %" PRIu64 "\n", result.tried, result.recompressed,
                 result.incompressible, result.bytes_saved,
                 before.compr_data_size, after.compr_data_size,
                 before.mem_used_total, after.mem_used_total);
  /* 6 in 8 are text, 1 in 8 random, 1 in 8 same-filled (no object). */
  assert_int_equal (result.tried, BLOCKS * 7 / 8);
  assert_true (result.recompressed >= BLOCKS * 6 / 8 * 9 / 10);
  assert_true (result.incompressible >= BLOCKS / 8);
  assert_int_equal (before.compr_data_size - after.compr_data_size,
                    result.bytes_saved);
  assert_int_equal (after.recomp_bytes_saved, result.bytes_saved);
  assert_int_equal (after.recomp_blocks, result.recompressed);
  recomp_verify (store, versions, present, 0, BLOCKS);

  struct recomp_flags flags = { 0 };
  store_block_state (store, 0, BLOCKS, count_flags, &flags);
  assert_int_equal (flags.recompressed, result.recompressed);
  assert_int_equal (flags.incompressible, result.incompressible);

  /* Again: the incompressible and those at the top priority are skipped;
   * those of priority 1 get one more try, at priority 2 only.
   */
  store_mark_idle (store, 0, NULL, NULL);
  struct store_recompress_result again;
  assert_int_equal (store_recompress (store, &request, NULL, NULL, &again), 0);
  assert_true (again.tried <= result.recompressed);
  assert_int_equal (again.incompressible + again.recompressed <= again.tried, 1);
  recomp_verify (store, versions, present, 0, BLOCKS);

  /* Recompressed blocks overwritten, patched, zeroed in part, trimmed. */
  for (uint64_t b = 2; b < BLOCKS; b += 8) {
    versions[b]++;
    recomp_fill (buf, b, versions[b]);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  for (uint64_t b = 3; b < BLOCKS; b += 8) {
    /* A partial write decodes the old block with its own codec. */
    unsigned char old[BS];
    recomp_fill (old, b, versions[b]);
    recomp_fill (buf, b, versions[b] + 1);
    memcpy (old + 100, buf + 100, 1000);
    assert_int_equal (store_write (store, old + 100, 1000, b * BS + 100), 0);
    assert_int_equal (store_read (store, buf, BS, b * BS), 0);
    assert_memory_equal (buf, old, BS);
    /* Keep the model: write the whole block as it now is. */
    versions[b]++;
    recomp_fill (buf, b, versions[b]);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  for (uint64_t b = 4; b < BLOCKS; b += 8) {
    assert_int_equal (store_trim (store, BS, b * BS), 0);
    present[b] = false;
  }
  recomp_verify (store, versions, present, 0, BLOCKS);

  /* Bad requests change nothing. */
  struct store_recompress_request bad = { .type = RECOMPRESS_IDLE, .priority = 3 };
  assert_int_equal (store_recompress (store, &bad, NULL, NULL, &result), -1);
  assert_int_equal (errno, EINVAL);
  store_destroy (store);
}

/* Recompression beside I/O: threads own disjoint ranges and write, patch,
 * trim and verify them against their own model while the main thread
 * marks everything idle and recompresses, again and again.
 */
enum { RECOMP_THREADS = 3, RECOMP_RANGE = 128 };

struct recomp_worker {
  struct block_store *store;
  uint64_t first;
  uint64_t versions[RECOMP_RANGE];
  bool present[RECOMP_RANGE];
  atomic_bool *stop;
  uint64_t operations;
  pthread_t thread;
};

static void *
recomp_worker_main (void *arg)
{
  struct recomp_worker *w = arg;
  uint64_t rng = w->first * 31 + 7;
  unsigned char buf[BS], got[BS];
  while (!atomic_load (w->stop)) {
    unsigned i = xorshift64 (&rng) % RECOMP_RANGE;
    uint64_t b = w->first + i;
    switch (xorshift64 (&rng) % 4) {
    case 0: case 1:
      w->versions[i]++;
      recomp_fill (buf, b, w->versions[i]);
      if (store_write (w->store, buf, BS, b * BS) == -1)
        return (void *) "write failed";
      w->present[i] = true;
      break;
    case 2:
      if (store_trim (w->store, BS, b * BS) == -1)
        return (void *) "trim failed";
      w->present[i] = false;
      break;
    default:
      if (store_read (w->store, got, BS, b * BS) == -1)
        return (void *) "read failed";
      if (w->present[i])
        recomp_fill (buf, b, w->versions[i]);
      else
        memset (buf, 0, BS);
      if (memcmp (got, buf, BS) != 0)
        return (void *) "a block read back wrong";
    }
    w->operations++;
  }
  return NULL;
}

/* Threads own disjoint ranges and write, patch, trim and verify them
 * against their own model while the main thread marks everything idle
 * and runs one round of work (recompression or packing), 60 times.
 * Returns the blocks the rounds handled; every block is verified.
 */
static uint64_t
run_beside_io_on (struct block_store *store,
                  uint64_t (*round_work) (struct block_store *store, int round),
                  const char *what)
{
  atomic_bool stop = false;
  struct recomp_worker *workers = calloc (RECOMP_THREADS, sizeof *workers);
  assert_non_null (workers);
  unsigned char buf[BS];
  for (unsigned t = 0; t < RECOMP_THREADS; t++) {
    workers[t].store = store;
    workers[t].first = t * RECOMP_RANGE;
    workers[t].stop = &stop;
    for (unsigned i = 0; i < RECOMP_RANGE; i++) {
      workers[t].versions[i] = 1;
      workers[t].present[i] = true;
      recomp_fill (buf, workers[t].first + i, 1);
      assert_int_equal (store_write (store, buf, BS, (workers[t].first + i) * BS), 0);
    }
  }
  for (unsigned t = 0; t < RECOMP_THREADS; t++)
    assert_int_equal (pthread_create (&workers[t].thread, NULL,
                                      recomp_worker_main, &workers[t]), 0);
  uint64_t handled = 0;
  for (int round = 0; round < 60; round++) {
    store_mark_idle (store, 0, NULL, NULL);
    handled += round_work (store, round);
  }
  atomic_store (&stop, true);
  uint64_t operations = 0;
  for (unsigned t = 0; t < RECOMP_THREADS; t++) {
    void *failure;
    pthread_join (workers[t].thread, &failure);
    if (failure)
      fail_msg ("worker %u: %s", t, (const char *) failure);
    operations += workers[t].operations;
  }
  print_message ("%s beside I/O: %" PRIu64 " blocks in 60 rounds, %" PRIu64
                 " operations\n", what, handled, operations);
  for (unsigned t = 0; t < RECOMP_THREADS; t++) {
    uint64_t versions[RECOMP_THREADS * RECOMP_RANGE] = { 0 };
    bool present[RECOMP_THREADS * RECOMP_RANGE] = { false };
    memcpy (versions + workers[t].first, workers[t].versions,
            sizeof workers[t].versions);
    memcpy (present + workers[t].first, workers[t].present,
            sizeof workers[t].present);
    recomp_verify (store, versions, present, workers[t].first, RECOMP_RANGE);
  }
  free (workers);
  store_destroy (store);
  return handled;
}

static uint64_t
run_beside_io (uint64_t (*round_work) (struct block_store *store, int round),
               const char *what)
{
  return run_beside_io_on (make_recompressing_store (RECOMP_THREADS * RECOMP_RANGE),
                           round_work, what);
}

static uint64_t
recompress_round (struct block_store *store, int round)
{
  struct store_recompress_request request = {
    .type = round % 3 == 2 ? RECOMPRESS_HUGE : RECOMPRESS_IDLE,
  };
  struct store_recompress_result result;
  assert_int_equal (store_recompress (store, &request, NULL, NULL, &result), 0);
  /* The workers decode recompressed blocks with zstd meanwhile. */
  if (round % 2)
    store_release_idle_memory (store);
  return result.recompressed;
}

static void
test_recompress_beside_io (void **state)
{
  (void) state;
  assert_true (run_beside_io (recompress_round, "recompress") > 0);
}

/* ---- cold packing --------------------------------------------------- */

/* state: pack_blocks (0 for the default). */
static void
test_pack (void **state)
{
  unsigned pack_blocks = (uintptr_t) *state;
  enum { BLOCKS = 512 };
  struct block_store *store = make_packing_store (BLOCKS, pack_blocks);
  uint64_t versions[BLOCKS] = { 0 };
  bool present[BLOCKS] = { false };
  unsigned char buf[BS];
  for (uint64_t b = 0; b < BLOCKS; b++) {
    versions[b] = 1;
    present[b] = true;
    recomp_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  struct store_stats before, after;
  store_stats (store, &before);
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  assert_int_equal (result.blocks, 0);          /* nothing idle yet */

  store_mark_idle (store, 0, NULL, NULL);
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  store_stats (store, &after);
  print_message ("pack: %" PRIu64 " units, %" PRIu64 " blocks, %" PRIu64
                 " -> %" PRIu64 " bytes; compressed %" PRIu64 " -> %" PRIu64
                 ", pool %" PRIu64 " -> %" PRIu64 "\n", result.units,
                 result.blocks, result.bytes_before, result.bytes_after,
                 before.compr_data_size, after.compr_data_size,
                 before.mem_used_total, after.mem_used_total);
  /* Text packs; random blocks may ride along; same-filled never do. */
  assert_true (result.blocks >= BLOCKS * 6 / 8);
  assert_int_equal (after.packed_blocks, result.blocks);
  assert_int_equal (after.pack_units, result.units);
  /* No unit holds more than pack_blocks. */
  unsigned most = pack_blocks ? pack_blocks : STORE_PACK_DEFAULT;
  assert_true (result.units * most >= result.blocks);
  assert_true (result.units * most < result.blocks + 2 * most * (BLOCKS / 256));
  assert_true (after.compr_data_size < before.compr_data_size);
  assert_int_equal (after.orig_data_size, before.orig_data_size);
  recomp_verify (store, versions, present, 0, BLOCKS);
  recomp_verify (store, versions, present, 0, BLOCKS);   /* cached units */

  /* Packed blocks overwritten, patched, trimmed, zeroed in part. */
  for (uint64_t b = 2; b < BLOCKS; b += 5) {
    versions[b]++;
    recomp_fill (buf, b, versions[b]);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  for (uint64_t b = 3; b < BLOCKS; b += 5) {
    unsigned char now[BS];
    recomp_fill (now, b, versions[b]);
    memset (now + 50, 'P', 300);
    assert_int_equal (store_write (store, now + 50, 300, b * BS + 50), 0);
    assert_int_equal (store_read (store, buf, BS, b * BS), 0);
    assert_memory_equal (buf, now, BS);
    versions[b]++;
    recomp_fill (buf, b, versions[b]);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  for (uint64_t b = 4; b < BLOCKS; b += 5) {
    assert_int_equal (store_trim (store, BS, b * BS), 0);
    present[b] = false;
  }
  recomp_verify (store, versions, present, 0, BLOCKS);

  /* Units now 40 % live: dissolved, their blocks stored alone again. */
  store_stats (store, &before);
  uint64_t dissolved = store_pack_dissolve (store, 50, NULL, NULL);
  store_stats (store, &after);
  print_message ("dissolve: %" PRIu64 " units, packed blocks %" PRIu64
                 " -> %" PRIu64 ", units %" PRIu64 " -> %" PRIu64 "\n",
                 dissolved, before.packed_blocks, after.packed_blocks,
                 before.pack_units, after.pack_units);
  assert_true (dissolved > 0);
  assert_int_equal (after.pack_units, before.pack_units - dissolved);
  assert_true (after.packed_blocks < before.packed_blocks);
  recomp_verify (store, versions, present, 0, BLOCKS);
  /* Idle again, packed again. */
  store_mark_idle (store, 0, NULL, NULL);
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  assert_true (result.blocks > 0);
  recomp_verify (store, versions, present, 0, BLOCKS);

  /* Everything gone: every unit with it. */
  assert_int_equal (store_trim (store, BLOCKS * BS, 0), 0);
  store_flush (store);
  store_stats (store, &after);
  assert_int_equal (after.pack_units, 0);
  assert_int_equal (after.packed_blocks, 0);
  assert_int_equal (after.compr_data_size, 0);
  assert_int_equal (after.mem_used_total, 0);
  store_destroy (store);
}

/* Packing (and dissolving) beside I/O, as recompression above. */
static uint64_t
pack_round (struct block_store *store, int round)
{
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  store_pack_dissolve (store, 50, NULL, NULL);
  if (round % 2)
    store_release_idle_memory (store);   /* beside reads of packed blocks */
  return result.blocks;
}

static void
test_pack_beside_io (void **state)
{
  (void) state;
  assert_true (run_beside_io (pack_round, "pack") > 0);
}

/* ---- writeback ------------------------------------------------------- */

static char backing_path[] = "/tmp/test-store-backing-XXXXXX";

/* A store (lz4, mem_limit) writing back to a fresh file, or to path. */
static uint64_t readback_below;    /* for the next make_backed_store */

static struct block_store *
make_backed_store (uint64_t blocks, uint64_t mem_limit, const char *path,
                   uint64_t writeback_limit)
{
  char *error = NULL;
  if (!path) {
    strcpy (backing_path, "/tmp/test-store-backing-XXXXXX");
    int fd = mkstemp (backing_path);
    assert_true (fd >= 0);
    close (fd);
    path = backing_path;
  }
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
  strcpy (backing_path, "/tmp/test-store-backing-XXXXXX");
  int fd = mkstemp (backing_path);
  assert_true (fd >= 0);
  close (fd);
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

/* Dissolving beside trims that empty the same units.  A trim that moves
 * a unit's last block out frees the unit; dissolving must never pin a
 * unit in that state (it used to: the unit was freed twice, found by
 * ASan in test_pack_beside_io).  Each round packs 64 blocks in units of
 * 4, then one thread trims them while another dissolves every unit.
 */
struct dissolve_race {
  struct block_store *store;
  _Atomic bool trimming;
};

/* The window is a few instructions (between a trim's last reference
 * going and its unlinking of the unit), so the trimming thread waits a
 * little before each lock it takes (test-store links with
 * -Wl,--wrap=pthread_mutex_lock): the dissolver, spinning, gets in.
 */
static __thread bool slow_locks;
int __real_pthread_mutex_lock (pthread_mutex_t *mutex);
int __wrap_pthread_mutex_lock (pthread_mutex_t *mutex);
int
__wrap_pthread_mutex_lock (pthread_mutex_t *mutex)
{
  if (slow_locks)
    usleep (20);
  return __real_pthread_mutex_lock (mutex);
}

static void *
dissolve_race_dissolver (void *arg)
{
  struct dissolve_race *race = arg;
  while (atomic_load (&race->trimming)) {
    store_pack_dissolve (race->store, 100, NULL, NULL);
    sched_yield ();             /* valgrind runs one thread at a time */
  }
  return NULL;
}

static void
test_dissolve_beside_trims (void **state)
{
  enum { BLOCKS = 64 };
  /* STORE_RACE_ROUNDS: fewer under valgrind (make check-valgrind). */
  const char *env = getenv ("STORE_RACE_ROUNDS");
  unsigned rounds = env && atoi (env) > 0 ? atoi (env) : 200;
  struct block_store *store = make_packing_store (BLOCKS, 4);
  unsigned char buf[BS];
  for (unsigned round = 0; round < rounds; round++) {
    for (uint64_t b = 0; b < BLOCKS; b++) {
      /* Text alike across blocks: units save memory, so they are kept. */
      for (unsigned i = 0; i < BS; i++)
        buf[i] = "block and round "[i % 16] + (i / 512 == b % 8) + round % 3;
      assert_int_equal (store_write (store, buf, BS, b * BS), 0);
    }
    store_mark_idle (store, 0, NULL, NULL);
    struct store_pack_result packed;
    assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &packed), 0);
    assert_true (packed.units > 0);

    struct dissolve_race race = { .store = store, .trimming = true };
    pthread_t thread;
    assert_int_equal (pthread_create (&thread, NULL, dissolve_race_dissolver,
                                      &race), 0);
    /* Every other block first, so units empty while others dissolve. */
    slow_locks = true;
    for (uint64_t b = 0; b < BLOCKS; b += 2)
      assert_int_equal (store_trim (store, BS, b * BS), 0);
    for (uint64_t b = 1; b < BLOCKS; b += 2)
      assert_int_equal (store_trim (store, BS, b * BS), 0);
    slow_locks = false;
    atomic_store (&race.trimming, false);
    pthread_join (thread, NULL);

    store_flush (store);
    struct store_stats stats;
    store_stats (store, &stats);
    assert_int_equal (stats.pack_units, 0);
    assert_int_equal (stats.packed_blocks, 0);
    assert_int_equal (stats.orig_data_size, 0);
    assert_int_equal (stats.compr_data_size, 0);
  }
  store_destroy (store);
}

/* ---- the movers' policies (issue 17) -------------------------------- */

/* An action run once inside the next zstd compression, i.e. inside a
 * mover's window (test-store links with -Wl,--wrap=ZSTD_compressCCtx):
 * a packer compresses its unit there with no stripe lock held.
 */
typedef void (*compression_action_fn) (void *opaque);
static _Atomic (compression_action_fn) compression_action;
static void *compression_opaque;
/* ... and the next this many fail (zstd's generic error).  Atomics: every
 * thread's compressions come here.
 */
static _Atomic unsigned compression_failures;
size_t __real_ZSTD_compressCCtx (void *cctx, void *dst, size_t capacity,
                                 const void *src, size_t size, int level);
size_t __wrap_ZSTD_compressCCtx (void *cctx, void *dst, size_t capacity,
                                 const void *src, size_t size, int level);
size_t
__wrap_ZSTD_compressCCtx (void *cctx, void *dst, size_t capacity,
                          const void *src, size_t size, int level)
{
  compression_action_fn action = atomic_exchange (&compression_action, NULL);
  if (action)
    action (compression_opaque);
  unsigned failures = atomic_load (&compression_failures);
  while (failures > 0)
    if (atomic_compare_exchange_weak (&compression_failures, &failures,
                                      failures - 1))
      return (size_t) -1;       /* ZSTD_isError: ZSTD_error_GENERIC */
  return __real_ZSTD_compressCCtx (cctx, dst, capacity, src, size, level);
}

/* Packing compresses a unit in steps (codec_compress_steps): the same
 * hook, once per call (a failure ends that unit's compression).
 */
size_t __real_ZSTD_compressStream2 (void *cctx, void *output, void *input,
                                    int end);
size_t __wrap_ZSTD_compressStream2 (void *cctx, void *output, void *input,
                                    int end);
size_t
__wrap_ZSTD_compressStream2 (void *cctx, void *output, void *input, int end)
{
  compression_action_fn action = atomic_exchange (&compression_action, NULL);
  if (action)
    action (compression_opaque);
  unsigned failures = atomic_load (&compression_failures);
  while (failures > 0)
    if (atomic_compare_exchange_weak (&compression_failures, &failures,
                                      failures - 1))
      return (size_t) -1;       /* ZSTD_isError: ZSTD_error_GENERIC */
  return __real_ZSTD_compressStream2 (cctx, output, input, end);
}

/* Text of the same words in every block: units of them save memory. */
static void
text_fill (unsigned char *buf, uint64_t block, unsigned version)
{
  recomp_fill (buf, block * 8 + 2, version);
}

/* pack_after's age: store_pack packs only idle blocks that old. */
static void
test_pack_respects_age (void **state)
{
  (void) state;
  enum { BLOCKS = 32 };
  struct block_store *store = make_packing_store (BLOCKS, 4);
  unsigned char buf[BS];
  for (uint64_t b = 0; b < BLOCKS; b++) {
    text_fill (buf, b, 0);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  assert_int_equal (store_mark_idle (store, 0, NULL, NULL), BLOCKS);
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 3600, NULL, NULL, &result), 0);
  assert_int_equal (result.blocks, 0);          /* idle, but too young */
  atomic_store (&clock_ahead_ns, 3601ull * 1000000000);
  assert_int_equal (store_pack (store, 0, 3600, NULL, NULL, &result), 0);
  assert_int_equal (result.blocks, BLOCKS);
  atomic_store (&clock_ahead_ns, 0);
  store_destroy (store);
}

/* A group whose compression fails is skipped and the run goes on, in
 * packing and in recompression (both stopped at the first failure).
 */
static void
test_compression_failure_skipped (void **state)
{
  (void) state;
  enum { BLOCKS = 64 };
  struct block_store *store = make_packing_store (BLOCKS, 4);
  unsigned char buf[BS];
  for (uint64_t b = 0; b < BLOCKS; b++) {
    text_fill (buf, b, 0);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result packed;
  compression_failures = 1;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &packed), 0);
  assert_int_equal (compression_failures, 0);
  assert_int_equal (packed.blocks, BLOCKS - 4);  /* all but the first group */
  assert_int_equal (store_pack_dissolve (store, 101, NULL, NULL), BLOCKS / 4 - 1);

  /* Recompression with priority 1's codec, which fails once. */
  store_mark_idle (store, 0, NULL, NULL);
  struct store_recompress_request request = {
    .type = RECOMPRESS_IDLE, .priority = 1,
  };
  struct store_recompress_result result;
  compression_failures = 1;
  assert_int_equal (store_recompress (store, &request, NULL, NULL, &result), 0);
  assert_int_equal (compression_failures, 0);
  assert_int_equal (result.tried, BLOCKS);
  assert_int_equal (result.recompressed + result.incompressible, BLOCKS - 1);
  /* The failed one is not marked incompressible: tried again later. */
  assert_int_equal (store_recompress (store, &request, NULL, NULL, &result), 0);
  assert_int_equal (result.tried, 1);
  store_destroy (store);
}

/* Every member but one is rewritten while the packer compresses: the
 * unit would hold 4 blocks' bytes for 1, so that block is put back and
 * the unit goes (it was kept, and compr_data_size grew).  The rewrites
 * are there after.
 */
struct rewrite_others {
  struct block_store *store;
  uint64_t first, count;
};

static void
rewrite_all_but_first (void *opaque)
{
  struct rewrite_others *others = opaque;
  unsigned char buf[BS];
  for (uint64_t b = others->first + 1; b < others->first + others->count; b++) {
    text_fill (buf, b, 7);
    assert_int_equal (store_write (others->store, buf, BS, b * BS), 0);
  }
}

static void
test_pack_unit_kept_only_if_worth_it (void **state)
{
  (void) state;
  enum { BLOCKS = 4 };
  struct block_store *store = make_packing_store (BLOCKS, BLOCKS);
  unsigned char buf[BS], out[BS];
  for (uint64_t b = 0; b < BLOCKS; b++) {
    text_fill (buf, b, 0);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  struct store_stats before, after;
  store_stats (store, &before);
  struct rewrite_others others = { store, 0, BLOCKS };
  compression_opaque = &others;
  compression_action = rewrite_all_but_first;
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  assert_null (compression_action);             /* it ran */
  store_stats (store, &after);
  print_message ("pack with 3 of 4 rewritten: reply %" PRIu64 " blocks, %"
                 PRIu64 " -> %" PRIu64 " bytes; compr_data_size %" PRIu64
                 " -> %" PRIu64 ", units %" PRIu64 "\n", result.blocks,
                 result.bytes_before, result.bytes_after,
                 before.compr_data_size, after.compr_data_size,
                 after.pack_units);
  assert_int_equal (result.blocks, 0);
  assert_int_equal (result.bytes_before, 0);
  assert_int_equal (after.pack_units, 0);
  assert_int_equal (after.packed_blocks, 0);
  assert_true (after.compr_data_size <= before.compr_data_size);
  for (uint64_t b = 0; b < BLOCKS; b++) {
    text_fill (buf, b, b == 0 ? 0 : 7);
    assert_int_equal (store_read (store, out, BS, b * BS), 0);
    assert_memory_equal (buf, out, BS);
  }
  store_destroy (store);
}

/* Units that fewer blocks than live_percent still use, made cheaply:
 * count units of 2 blocks, one block of each trimmed.
 */
static struct block_store *
make_sparse_units (uint64_t count, uint64_t mem_limit)
{
  struct store_config config = {
    .size = 2 * count * BS, .algorithm = CODEC_LZ4, .level = 1,
    .pack_blocks = 2,
  };
  zs_pool_config_init (&config.pool);
  config.pool.mem_limit = mem_limit;
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  unsigned char buf[BS];
  for (uint64_t b = 0; b < 2 * count; b++) {
    text_fill (buf, b, 0);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  assert_int_equal (result.units, count);
  for (uint64_t b = 0; b < 2 * count; b += 2)
    assert_int_equal (store_trim (store, BS, b * BS), 0);
  return store;
}

static bool
countdown (void *opaque)
{
  unsigned *left = opaque;
  return (*left)-- > 0;
}

/* Dissolving is one pass over the unit list per batch and keeps to its
 * budget (it rescanned the list from its head after each unit: 32,000
 * units took 5.7 s); a unit it could not dissolve for lack of memory is
 * tried again later (it never was).
 */
static void
test_dissolve_budget_and_retry (void **state)
{
  (void) state;
  /* The budget: keep_going says how many units. */
  struct block_store *store = make_sparse_units (256, 0);
  unsigned left = 10;
  assert_int_equal (store_pack_dissolve (store, 100, countdown, &left), 10);
  struct store_stats stats;
  store_stats (store, &stats);
  assert_int_equal (stats.pack_units, 256 - 10);
  assert_int_equal (store_pack_dissolve (store, 100, NULL, NULL), 256 - 10);
  store_destroy (store);

  /* Linear: the time per unit does not grow with the units (printed, not
   * asserted: timing belongs in benchmarks).
   */
  for (uint64_t units = 1000; units <= 4000; units *= 4) {
    store = make_sparse_units (units, 0);
    int64_t start = real_now_ns ();
    assert_int_equal (store_pack_dissolve (store, 100, NULL, NULL), units);
    print_message ("dissolve %" PRIu64 " sparse units: %.3f s\n", units,
                   (real_now_ns () - start) / 1e9);
    store_destroy (store);
  }

  /* The retry: no memory for the blocks alone, then some. */
  store = make_sparse_units (64, 0);
  store_flush (store);
  store_stats (store, &stats);
  assert_int_equal (store_set_mem_limit (store, stats.limit_used, NULL), 0);
  /* The pool's slack taken by blocks of the same size, in the trimmed
   * places, until the limit refuses one.
   */
  unsigned char buf[BS];
  uint64_t b = 0;
  for (; b < 2 * 64; b += 2) {
    text_fill (buf, b, 3);
    if (store_write (store, buf, BS, b * BS) == -1)
      break;
  }
  assert_true (b < 2 * 64);
  assert_int_equal (errno, ENOSPC);
  assert_int_equal (store_pack_dissolve (store, 100, NULL, NULL), 0);
  assert_int_equal (store_set_mem_limit (store, 0, NULL), 0);
  /* Not at once (each failed unit would cost a decode every round)... */
  assert_int_equal (store_pack_dissolve (store, 100, NULL, NULL), 0);
  /* ... but later. */
  atomic_store (&clock_ahead_ns, 11ull * 1000000000);
  assert_int_equal (store_pack_dissolve (store, 100, NULL, NULL), 64);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_units, 0);
  atomic_store (&clock_ahead_ns, 0);
  store_destroy (store);
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

/* A unit of pack_blocks outside 2..STORE_PACK_MAX is refused. */
static void
test_pack_blocks_bounds (void **state)
{
  (void) state;
  struct store_config config = {
    .size = 64 * BS, .algorithm = CODEC_LZ4, .level = 1,
  };
  zs_pool_config_init (&config.pool);
  unsigned bad[] = { 1, STORE_PACK_MAX + 1 };
  for (unsigned i = 0; i < 2; i++) {
    config.pack_blocks = bad[i];
    errno = 0;
    assert_null (store_create (&config));
    assert_int_equal (errno, EINVAL);
  }
}

/* A batched write that memory cannot hold in full (seed 004's path at
 * mem_limit): the request fails with ENOSPC, each block holds its old
 * content or its new one, never a mix, the counters match the blocks,
 * and nothing the batch allocated is left behind.
 */
/* The decode cache: a packed read decodes its unit only up to the step
 * holding the blocks its request reads, a read past a cached prefix
 * decodes the rest, the slots are charged to mem_limit and given back,
 * and every read returns its block.
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
  /* One block: its step (blocks 0-3) decoded into a slot, charged. */
  check_cache (store, 0, 1, 0, 1, "block 0");
  store_stats (store, &after);
  assert_int_equal (after.decode_cache_bytes, unit_bytes);
  assert_int_equal (after.limit_used - before.limit_used, unit_bytes);
  check_cache (store, 1, 3, 3, 0, "blocks 1-3 (the step decoded)");
  /* Past the prefix: the rest of the unit, then all hits. */
  check_cache (store, 4, 1, 0, 1, "block 4 (past the prefix)");
  check_cache (store, 5, 11, 11, 0, "blocks 5-15 (the rest decoded)");
  /* A request of 8 blocks decodes through its last (two steps) once. */
  check_cache (store, 16, 8, 7, 1, "blocks 16-23 in one request");
  check_cache (store, 24, 1, 0, 1, "block 24 (past the request's steps)");
  check_cache (store, 25, 7, 7, 0, "blocks 25-31");
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
  strcpy (backing_path, "/tmp/test-store-backing-XXXXXX");
  int fd = mkstemp (backing_path);
  assert_true (fd >= 0);
  close (fd);
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
  /* A housekeeping round's sweep finds nothing left to free. */
  assert_int_equal (store_decode_cache_sweep (store), 0);
  store_flush (store);
  store_stats (store, &stats);
  /* What is left: the table, the space map, the reserve, and the
   * allocator's handle cells (one 4 KiB block kept per size class used).
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
  assert_int_equal ((stats.limit_used - rest) % 4096, 0);
  assert_true (stats.limit_used - rest
               <= (uint64_t) store_class_count (store) * 4096);
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
    cmocka_unit_test (test_round_trip_both_codecs),
    cmocka_unit_test (test_batched_write_at_limit),
    cmocka_unit_test (test_kinds_and_stats),
    cmocka_unit_test (test_extents),
    cmocka_unit_test (test_enospc_keeps_old_block),
    cmocka_unit_test (test_partial_zero_at_limit),
    cmocka_unit_test (test_table_bounded_and_reclaimed),
    cmocka_unit_test (test_keep_resident),
    cmocka_unit_test (test_concurrent_partial_writes),
    cmocka_unit_test (test_threads_exit_after_destroy),
    cmocka_unit_test (test_concurrent_mixed_batched),
    cmocka_unit_test (test_concurrent_mixed_immediate_pool_lock),
    cmocka_unit_test (test_concurrent_mixed_leaves),
    cmocka_unit_test (test_recompress),
    cmocka_unit_test (test_recompress_beside_io),
    cmocka_unit_test_prestate (test_pack, (void *) (uintptr_t) 0),
    cmocka_unit_test_prestate (test_pack, (void *) (uintptr_t) 3),
    cmocka_unit_test_prestate (test_pack, (void *) (uintptr_t) STORE_PACK_MAX),
    cmocka_unit_test (test_pack_beside_io),
    cmocka_unit_test (test_dissolve_beside_trims),
    cmocka_unit_test (test_pack_blocks_bounds),
    cmocka_unit_test (test_pack_respects_age),
    cmocka_unit_test (test_decode_cache),
    cmocka_unit_test (test_decode_cache_yields_to_writes),
    cmocka_unit_test (test_decode_cache_freed_with_units),
    cmocka_unit_test (test_decode_cache_sweep_and_mem_limit),
    cmocka_unit_test (test_packed_writeback_leaves_cache),
    cmocka_unit_test_prestate (test_packed_writeback_at_limit,
                               (void *) (uintptr_t) 2048),
    cmocka_unit_test (test_pack_unit_kept_only_if_worth_it),
    cmocka_unit_test (test_compression_failure_skipped),
    cmocka_unit_test (test_dissolve_budget_and_retry),
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
