/* Block store tests, the movers that re-encode: recompression (idle and
 * huge blocks to stronger codecs), cold packing into units and their
 * dissolving, each alone and beside I/O checked against exact models.
 * The program links with -Wl,--wrap= for pthread_mutex_lock (a thread's
 * locks slowed down to widen a race's window), clock_gettime (the
 * movers' ages, moved-clock.h) and zstd's compressions (an action run
 * inside a packer's compression, or a compression made to fail).
 */

#include "store-fixture.h"
#include "moved-clock.h"

/* pack_blocks and pack_level 0: the defaults. */
static struct block_store *
make_packing_store_at (uint64_t blocks, unsigned pack_blocks, int pack_level)
{
  struct store_config config = {
    .size = blocks * BS, .algorithm = CODEC_LZ4, .level = 1,
    .recomp_count = 2,
    .recomp = { { CODEC_ZSTD, 3 }, { CODEC_ZSTD, 19 } },
    .pack_blocks = pack_blocks, .pack_level = pack_level,
  };
  zs_pool_config_init (&config.pool);
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  return store;
}

static struct block_store *
make_packing_store (uint64_t blocks, unsigned pack_blocks)
{
  return make_packing_store_at (blocks, pack_blocks, 0);
}

static struct block_store *
make_recompressing_store (uint64_t blocks)
{
  return make_packing_store (blocks, 0);
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
  /* At level 1 a unit is compressed in about the time the workers take
   * to rewrite a block of it, so each round keeps some units and loses
   * blocks (or whole units) to writes.  At the default level, ten times
   * slower, the workers rewrite every block of a unit before it is
   * compressed, and no round would keep one.
   */
  struct block_store *store
    = make_packing_store_at (RECOMP_THREADS * RECOMP_RANGE, 0, 1);
  assert_true (run_beside_io_on (store, pack_round, "pack") > 0);
}

/* Packing's dictionaries beside I/O.  The first half of the store is
 * packed once (its units use the first dictionary) and then only read,
 * by two threads checking every block; a writer turns the second half
 * over and reads its own blocks back, so that packing rounds train new
 * dictionaries while the readers decode units of the old one, and every
 * third round sweeps three times (the encoder goes, then a current
 * dictionary no unit uses).  Two dictionaries must be seen live at once;
 * at the end the first half is trimmed (its dictionary goes with its
 * last unit) and the rest reads back.
 */
enum { DICT_BLOCKS = 1024, DICT_HALF = DICT_BLOCKS / 2 };

struct dictionary_io {
  struct block_store *store;
  atomic_bool stop;
  _Atomic uint64_t reads;
  unsigned versions[DICT_HALF];   /* the writer's: the second half's */
};

static void *
dictionary_reader_main (void *opaque)
{
  struct dictionary_io *io = opaque;
  uint64_t seed = (uintptr_t) &seed;
  unsigned char want[BS], got[BS];
  while (!atomic_load (&io->stop)) {
    uint64_t b = xorshift64 (&seed) % DICT_HALF;
    text_fill (want, b, 1);
    if (store_read (io->store, got, BS, b * BS) != 0
        || memcmp (got, want, BS) != 0)
      return (void *) "a block of the first half reads back wrong";
    atomic_fetch_add (&io->reads, 1);
  }
  return NULL;
}

static void *
dictionary_writer_main (void *opaque)
{
  struct dictionary_io *io = opaque;
  uint64_t seed = 99;
  unsigned char buf[BS], got[BS];
  while (!atomic_load (&io->stop)) {
    unsigned i = xorshift64 (&seed) % DICT_HALF;
    uint64_t b = DICT_HALF + i;
    text_fill (buf, b, ++io->versions[i] + 1);
    if (store_write (io->store, buf, BS, b * BS) != 0)
      return (void *) "a write failed";
    unsigned j = xorshift64 (&seed) % DICT_HALF;
    text_fill (buf, DICT_HALF + j, io->versions[j] + 1);
    if (store_read (io->store, got, BS, (DICT_HALF + j) * BS) != 0
        || memcmp (got, buf, BS) != 0)
      return (void *) "a block of the second half reads back wrong";
    if (i % 64 == 0) {
      struct timespec pause = { 0, 100000 };
      nanosleep (&pause, NULL);         /* let some go idle */
    }
  }
  return NULL;
}

static void
test_pack_dictionaries_beside_io (void **state)
{
  (void) state;
  struct dictionary_io io = {
    .store = make_packing_store (DICT_BLOCKS, 16),
  };
  unsigned char buf[BS];
  for (uint64_t b = 0; b < DICT_BLOCKS; b++) {
    text_fill (buf, b, 1);
    assert_int_equal (store_write (io.store, buf, BS, b * BS), 0);
  }
  store_mark_idle (io.store, 0, NULL, NULL);
  struct store_pack_result result;
  assert_int_equal (store_pack (io.store, DICT_HALF, 0, NULL, NULL, &result),
                    0);
  pthread_t threads[3];
  assert_int_equal (pthread_create (&threads[0], NULL, dictionary_writer_main,
                                    &io), 0);
  for (int t = 1; t < 3; t++)
    assert_int_equal (pthread_create (&threads[t], NULL,
                                      dictionary_reader_main, &io), 0);
  unsigned most = 0;
  uint64_t packed = 0;
  for (int round = 0; round < 60 || (most < 2 && round < 600); round++) {
    store_mark_idle (io.store, 0, NULL, NULL);
    /* A minute a round, as far as training's pace goes. */
    atomic_fetch_add (&clock_ahead_ns,
                      (STORE_DICTIONARY_SECONDS + 1) * 1000000000ull);
    assert_int_equal (store_pack (io.store, 0, 0, NULL, NULL, &result), 0);
    packed += result.blocks;
    store_pack_dissolve (io.store, 50, NULL, NULL);
    struct store_stats stats;
    store_stats (io.store, &stats);
    if (stats.pack_dictionaries > most)
      most = stats.pack_dictionaries;
    if (round % 3 == 2)
      for (int sweep = 0; sweep < 3; sweep++)
        store_decode_cache_sweep (io.store);
  }
  atomic_store (&io.stop, true);
  atomic_store (&clock_ahead_ns, 0);
  for (int t = 0; t < 3; t++) {
    void *failure;
    pthread_join (threads[t], &failure);
    if (failure)
      fail_msg ("%s", (const char *) failure);
  }
  print_message ("dictionaries beside I/O: %" PRIu64 " blocks packed, %" PRIu64
                 " reads of the first half, at most %u dictionaries live\n",
                 packed, atomic_load (&io.reads), most);
  assert_true (most >= 2);
  assert_int_equal (store_trim (io.store, (uint64_t) DICT_HALF * BS, 0), 0);
  unsigned char got[BS];
  for (unsigned i = 0; i < DICT_HALF; i++) {
    text_fill (buf, DICT_HALF + i, io.versions[i] + 1);
    assert_int_equal (store_read (io.store, got, BS, (DICT_HALF + i) * BS), 0);
    assert_memory_equal (got, buf, BS);
  }
  store_destroy (io.store);
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
 * little before each lock it takes (this program links with
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
 * mover's window (this program links with -Wl,--wrap=ZSTD_compressCCtx):
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

/* Packing compresses a unit a frame at a time (codec_compress_frames):
 * the same hook, once per frame (a failure ends that unit's
 * compression).
 */
size_t __real_ZSTD_compress2 (void *cctx, void *dst, size_t capacity,
                              const void *src, size_t size);
size_t __wrap_ZSTD_compress2 (void *cctx, void *dst, size_t capacity,
                              const void *src, size_t size);
size_t
__wrap_ZSTD_compress2 (void *cctx, void *dst, size_t capacity,
                       const void *src, size_t size)
{
  compression_action_fn action = atomic_exchange (&compression_action, NULL);
  if (action)
    action (compression_opaque);
  unsigned failures = atomic_load (&compression_failures);
  while (failures > 0)
    if (atomic_compare_exchange_weak (&compression_failures, &failures,
                                      failures - 1))
      return (size_t) -1;       /* ZSTD_isError: ZSTD_error_GENERIC */
  return __real_ZSTD_compress2 (cctx, dst, capacity, src, size);
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

/* A unit keeps its blocks as 16-bit gaps: blocks further apart than
 * UNIT_BLOCK_GAP_MAX go into different units, and every block of each is
 * found again when it dissolves.
 */
static void
test_pack_far_apart (void **state)
{
  (void) state;
  enum { FAR = UNIT_BLOCK_GAP_MAX };
  const uint64_t at[] = { 0, 1, 1 + FAR, 2 + FAR, 3 + 2 * FAR, 4 + 2 * FAR,
                          5 + 2 * FAR };
  enum { COUNT = sizeof at / sizeof at[0] };
  const uint64_t blocks = at[COUNT - 1] + 2;
  struct block_store *store = make_packing_store (blocks, 0);
  unsigned char buf[BS], back[BS];
  for (unsigned i = 0; i < COUNT; i++) {
    text_fill (buf, at[i], 1);
    assert_int_equal (store_write (store, buf, BS, at[i] * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  /* 0, 1 and 1 + FAR, 2 + FAR (a gap of FAR, the most a unit keeps);
   * 3 + 2 * FAR is FAR + 1 further: a unit of its own with the rest.
   */
  print_message ("far apart: %" PRIu64 " units, %" PRIu64 " blocks\n",
                 result.units, result.blocks);
  assert_int_equal (result.units, 2);
  assert_int_equal (result.blocks, COUNT);
  for (unsigned i = 0; i < COUNT; i++) {
    text_fill (buf, at[i], 1);
    assert_int_equal (store_read (store, back, BS, at[i] * BS), 0);
    assert_memory_equal (back, buf, BS);
  }
  /* A block from each unit trimmed, the rest dissolved: each found. */
  assert_int_equal (store_trim (store, BS, at[1] * BS), 0);
  assert_int_equal (store_trim (store, BS, at[5] * BS), 0);
  assert_int_equal (store_pack_dissolve (store, 100, NULL, NULL), 2);
  struct store_stats stats;
  store_stats (store, &stats);
  assert_int_equal (stats.pack_units, 0);
  assert_int_equal (stats.packed_blocks, 0);
  for (unsigned i = 0; i < COUNT; i++) {
    if (i == 1 || i == 5)
      memset (buf, 0, BS);
    else
      text_fill (buf, at[i], 1);
    assert_int_equal (store_read (store, back, BS, at[i] * BS), 0);
    assert_memory_equal (back, buf, BS);
  }
  store_destroy (store);
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

/* Packing's dictionaries: the first run trains one (from samples of its
 * candidates) and its units use it; once as many blocks were written as
 * the store held, the next run trains another, and the older units keep
 * theirs (two live, every block read back through its own); the old one
 * goes with its last unit, and the current one when no unit is left.
 */
static void
check_texts (struct block_store *store, uint64_t first, uint64_t count,
             unsigned version, const char *what)
{
  unsigned char want[BS], got[BS];
  for (uint64_t b = first; b < first + count; b++) {
    text_fill (want, b, version);
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    if (memcmp (got, want, BS) != 0)
      fail_msg ("%s: block %" PRIu64 " reads back wrong", what, b);
  }
}

static void
test_pack_dictionaries (void **state)
{
  (void) state;
  enum { BLOCKS = 512, HALF = BLOCKS / 2 };
  struct block_store *store = make_packing_store (BLOCKS, 16);
  unsigned char buf[BS];
  for (uint64_t b = 0; b < BLOCKS; b++) {
    text_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  struct store_stats stats;
  store_stats (store, &stats);
  assert_int_equal (stats.pack_dictionaries, 0);
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  assert_int_equal (result.blocks, BLOCKS);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_dictionaries, 1);
  /* The dictionary (112 KiB at most) and the encoder kept for the next
   * runs (zstd's tables at level 14: about 1.5 MiB).
   */
  assert_true (stats.pack_dictionary_bytes > (112 << 10) / 2);
  assert_true (stats.pack_dictionary_bytes < (112 << 10) + (2 << 20));
  check_texts (store, 0, BLOCKS, 1, "with the first dictionary");
  store_stats (store, &stats);

  /* Packed again, unwritten: no new dictionary. */
  store_pack_dissolve (store, 101, NULL, NULL);
  store_mark_idle (store, 0, NULL, NULL);
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_dictionaries, 1);

  /* The second half written twice (as many writes as blocks stored):
   * a run within STORE_DICTIONARY_SECONDS of the last training trains
   * none; the next run after them trains another; the first half keeps
   * its units.
   */
  for (unsigned version = 2; version <= 3; version++)
    for (uint64_t b = HALF; b < BLOCKS; b++) {
      text_fill (buf, b, version);
      assert_int_equal (store_write (store, buf, BS, b * BS), 0);
    }
  store_mark_idle (store, 0, NULL, NULL);
  assert_true (!dictionary_wanted (store, store_clock (store))); /* too soon */
  atomic_store (&clock_ahead_ns,
                (STORE_DICTIONARY_SECONDS + 1) * 1000000000ull);
  assert_true (dictionary_wanted (store, store_clock (store)));
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  assert_int_equal (result.blocks, HALF);
  store_stats (store, &stats);
  assert_int_equal (stats.packed_blocks, BLOCKS);
  assert_int_equal (stats.pack_dictionaries, 2);
  check_texts (store, 0, HALF, 1, "the older units");
  check_texts (store, HALF, HALF, 3, "the newer units");
  /* The first half trimmed: its units, and their dictionary, go. */
  assert_int_equal (store_trim (store, (uint64_t) HALF * BS, 0), 0);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_dictionaries, 1);
  check_texts (store, HALF, HALF, 3, "the newer units alone");
  /* Everything trimmed: the current one stays until a sweep finds it
   * unused, then the store holds none and charges nothing for it.
   */
  store_stats (store, &stats);
  uint64_t limit_before = stats.limit_used;
  assert_int_equal (store_trim (store, (uint64_t) BLOCKS * BS, 0), 0);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_units, 0);
  assert_int_equal (stats.pack_dictionaries, 1);
  /* The first sweep finds the encoder used since the last one, the
   * second frees it and finds the dictionary unused, the third frees
   * the dictionary.
   */
  store_decode_cache_sweep (store);
  store_decode_cache_sweep (store);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_dictionaries, 1);
  store_decode_cache_sweep (store);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_dictionaries, 0);
  assert_int_equal (stats.pack_dictionary_bytes, 0);
  assert_true (stats.limit_used < limit_before);
  /* And the next run trains one again. */
  for (uint64_t b = 0; b < BLOCKS; b++) {
    text_fill (buf, b, 4);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  store_stats (store, &stats);
  assert_int_equal (stats.pack_dictionaries, 1);
  check_texts (store, 0, BLOCKS, 4, "after a new start");
  atomic_store (&clock_ahead_ns, 0);
  store_destroy (store);
}

/* Too few candidates teach a dictionary nothing: units go without one,
 * and read back.
 */
static void
test_pack_without_dictionary (void **state)
{
  (void) state;
  enum { BLOCKS = 32 };
  struct block_store *store = make_packing_store (BLOCKS, 16);
  unsigned char buf[BS];
  for (uint64_t b = 0; b < BLOCKS; b++) {
    text_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  assert_int_equal (result.blocks, BLOCKS);
  struct store_stats stats;
  store_stats (store, &stats);
  assert_int_equal (stats.pack_dictionaries, 0);
  check_texts (store, 0, BLOCKS, 1, "packed without a dictionary");
  store_destroy (store);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_recompress),
    cmocka_unit_test (test_recompress_beside_io),
    cmocka_unit_test_prestate (test_pack, (void *) (uintptr_t) 0),
    cmocka_unit_test_prestate (test_pack, (void *) (uintptr_t) 3),
    cmocka_unit_test_prestate (test_pack, (void *) (uintptr_t) STORE_PACK_MAX),
    cmocka_unit_test (test_pack_beside_io),
    cmocka_unit_test (test_pack_dictionaries_beside_io),
    cmocka_unit_test (test_dissolve_beside_trims),
    cmocka_unit_test (test_pack_blocks_bounds),
    cmocka_unit_test (test_pack_respects_age),
    cmocka_unit_test (test_pack_unit_kept_only_if_worth_it),
    cmocka_unit_test (test_compression_failure_skipped),
    cmocka_unit_test (test_dissolve_budget_and_retry),
    cmocka_unit_test (test_pack_far_apart),
    cmocka_unit_test (test_pack_dictionaries),
    cmocka_unit_test (test_pack_without_dictionary),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
