/* Stores that share one allocator pool (store_config.shared_pool: the
 * devices of one server under one budget):
 *   - threads write, trim and read random blocks of three stores while a
 *     compactor moves the shared pool's objects, every read checked
 *     against its store's exact model: no block ever reads another
 *     store's bytes or a stale version;
 *   - one budget: a store that fills the pool's mem_limit leaves the
 *     others ENOSPC too (their old blocks intact), and its trims give the
 *     room to them;
 *   - a store destroyed gives its objects back to the pool, one by one,
 *     and the others keep theirs.
 */

#include "store-fixture.h"

#define DEVICE_BLOCKS 512
#define DEVICES 3
#define IO_THREADS 3
#define ROUNDS 20000

static struct block_store *
make_device (struct block_store *owner, enum codec_algorithm algorithm)
{
  struct store_config config = { .size = DEVICE_BLOCKS * BS,
                                 .algorithm = algorithm, .level = 1,
                                 .shared_pool = store_pool (owner) };
  zs_pool_config_init (&config.pool);
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  return store;
}

/* Each store's model: the version of each block (0: never written or
 * trimmed), changed under its block's lock so that a reader knows which
 * versions it may see.
 */
struct device_model {
  struct block_store *store;
  pthread_mutex_t locks[DEVICE_BLOCKS];
  uint64_t versions[DEVICE_BLOCKS];
};

static struct device_model models[DEVICES];
static atomic_bool stop_compactor;
static _Atomic uint64_t mismatches, compactions;

/* The bytes a block of a device holds at a version: the device's number
 * folded into the block number, so that another device's block of the
 * same number and version never matches.
 */
static void
device_fill (unsigned char *buf, unsigned device, uint64_t block,
             uint64_t version)
{
  block_fill (buf, block + (uint64_t) device * 1000003, version);
}

static void *
io_thread (void *arg)
{
  uint64_t state = (uintptr_t) arg * 7919 + 1;
  unsigned char buf[BS], want[BS];
  static const unsigned char zeros[BS];
  for (unsigned round = 0; round < ROUNDS; round++) {
    unsigned device = xorshift64 (&state) % DEVICES;
    uint64_t block = xorshift64 (&state) % DEVICE_BLOCKS;
    struct device_model *model = &models[device];
    unsigned what = xorshift64 (&state) % 10;
    pthread_mutex_lock (&model->locks[block]);
    if (what < 4) {
      uint64_t version = model->versions[block] + 1;
      device_fill (buf, device, block, version);
      if (store_write (model->store, buf, BS, block * BS) == 0)
        model->versions[block] = version;
    }
    else if (what < 5) {
      if (store_trim (model->store, BS, block * BS) == 0)
        model->versions[block] = 0;
    }
    else {
      if ((round & 7) == 0)
        sched_yield ();         /* widen the window beside the compactor */
      assert_int_equal (store_read (model->store, buf, BS, block * BS), 0);
      if (model->versions[block])
        device_fill (want, device, block, model->versions[block]);
      const unsigned char *expected = model->versions[block] ? want : zeros;
      if (memcmp (buf, expected, BS) != 0)
        atomic_fetch_add (&mismatches, 1);
    }
    pthread_mutex_unlock (&model->locks[block]);
  }
  return NULL;
}

/* Moves the shared pool's objects under every store's feet: compaction
 * is the pool's, asked through any one store.
 */
static void *
compactor_thread (void *arg)
{
  unsigned turn = 0;
  while (!atomic_load (&stop_compactor)) {
    struct block_store *store = models[turn++ % DEVICES].store;
    store_flush (store);
    store_compact (store);
    atomic_fetch_add (&compactions, 1);
    sched_yield ();
  }
  return NULL;
}

static void
test_isolation_beside_compaction (void **state)
{
  models[0].store = make_store (DEVICE_BLOCKS * BS, CODEC_LZ4, 0);
  for (unsigned d = 1; d < DEVICES; d++)
    models[d].store = make_device (models[0].store,
                                   d % 2 ? CODEC_ZSTD : CODEC_LZ4);
  for (unsigned d = 0; d < DEVICES; d++)
    for (unsigned b = 0; b < DEVICE_BLOCKS; b++) {
      pthread_mutex_init (&models[d].locks[b], NULL);
      models[d].versions[b] = 0;
    }
  pthread_t io[IO_THREADS], compactor;
  atomic_store (&stop_compactor, false);
  assert_int_equal (pthread_create (&compactor, NULL, compactor_thread, NULL), 0);
  for (uintptr_t t = 0; t < IO_THREADS; t++)
    assert_int_equal (pthread_create (&io[t], NULL, io_thread, (void *) t), 0);
  for (unsigned t = 0; t < IO_THREADS; t++)
    pthread_join (io[t], NULL);
  atomic_store (&stop_compactor, true);
  pthread_join (compactor, NULL);

  /* Every block of every store, against its model. */
  unsigned char buf[BS], want[BS];
  static const unsigned char zeros[BS];
  uint64_t stored = 0;
  for (unsigned d = 0; d < DEVICES; d++)
    for (uint64_t b = 0; b < DEVICE_BLOCKS; b++) {
      assert_int_equal (store_read (models[d].store, buf, BS, b * BS), 0);
      if (models[d].versions[b]) {
        device_fill (want, d, b, models[d].versions[b]);
        assert_memory_equal (buf, want, BS);
        stored++;
      }
      else
        assert_memory_equal (buf, zeros, BS);
    }
  assert_int_equal (atomic_load (&mismatches), 0);
  assert_true (atomic_load (&compactions) > 0);
  print_message ("isolation: %u stores on one pool, %u threads x %u requests "
                 "beside %" PRIu64 " compactions: %" PRIu64 " blocks stored, "
                 "0 reads of another store's or a stale block\n", DEVICES,
                 IO_THREADS, ROUNDS, atomic_load (&compactions), stored);
  for (unsigned d = DEVICES; d-- > 0; )
    store_destroy (models[d].store);
}

/* Incompressible: each block takes a whole object. */
static void
random_fill (unsigned char *buf, uint64_t seed)
{
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < BS; i += 8) {
    uint64_t word = xorshift64 (&state);
    memcpy (buf + i, &word, 8);
  }
}

static void
test_one_budget (void **state)
{
  struct block_store *a = make_store (DEVICE_BLOCKS * BS, CODEC_LZ4, 1 << 20);
  struct block_store *b = make_device (a, CODEC_LZ4);
  unsigned char buf[BS], got[BS];
  /* b fills the shared limit alone. */
  uint64_t written = 0;
  for (; written < DEVICE_BLOCKS; written++) {
    random_fill (buf, written);
    if (store_write (b, buf, BS, written * BS) == -1) {
      assert_int_equal (errno, ENOSPC);
      break;
    }
  }
  assert_true (written > 0 && written < DEVICE_BLOCKS);
  /* a is refused too: the limit is the pool's, and b took it. */
  random_fill (buf, 999999);
  assert_int_equal (store_write (a, buf, BS, 0), -1);
  assert_int_equal (errno, ENOSPC);
  assert_int_equal (store_read (a, got, BS, 0), 0);
  static const unsigned char zeros[BS];
  assert_memory_equal (got, zeros, BS);
  /* b's trims give the room to a. */
  assert_int_equal (store_trim (b, written / 2 * BS, 0), 0);
  store_flush (b);
  uint64_t taken = 0;
  for (; taken < written / 4; taken++) {
    random_fill (buf, 1000000 + taken);
    assert_int_equal (store_write (a, buf, BS, taken * BS), 0);
  }
  /* b's blocks past the trim are intact. */
  for (uint64_t i = written / 2; i < written; i++) {
    random_fill (buf, i);
    assert_int_equal (store_read (b, got, BS, i * BS), 0);
    assert_memory_equal (got, buf, BS);
  }
  print_message ("one budget: one store filled the 1 MiB limit (%" PRIu64
                 " blocks), the other was refused, and took %" PRIu64
                 " blocks once the first trimmed\n", written, taken);
  store_destroy (b);
  store_destroy (a);
}

static void
test_destroy_gives_back (void **state)
{
  struct block_store *a = make_store (DEVICE_BLOCKS * BS, CODEC_LZ4, 0);
  struct block_store *b = make_device (a, CODEC_ZSTD);
  unsigned char buf[BS], got[BS];
  for (uint64_t i = 0; i < DEVICE_BLOCKS; i++) {
    block_fill (buf, i, 1);
    assert_int_equal (store_write (a, buf, BS, i * BS), 0);
  }
  store_flush (a);
  store_compact (a);
  struct store_stats alone, both, after;
  store_stats (a, &alone);
  for (uint64_t i = 0; i < DEVICE_BLOCKS; i++) {
    random_fill (buf, i);
    assert_int_equal (store_write (b, buf, BS, i * BS), 0);
  }
  store_stats (a, &both);
  assert_true (both.mem_used_total >= alone.mem_used_total
               + DEVICE_BLOCKS * BS / 2);
  store_destroy (b);
  store_flush (a);
  store_compact (a);
  store_stats (a, &after);
  assert_true (after.mem_used_total <= alone.mem_used_total + 16 * BS);
  assert_int_equal (after.compr_data_size, alone.compr_data_size);
  for (uint64_t i = 0; i < DEVICE_BLOCKS; i++) {
    block_fill (buf, i, 1);
    assert_int_equal (store_read (a, got, BS, i * BS), 0);
    assert_memory_equal (got, buf, BS);
  }
  print_message ("destroy: the pool's pages %" PRIu64 " KiB alone, %" PRIu64
                 " KiB with the second store, %" PRIu64 " KiB after it went\n",
                 alone.mem_used_total >> 10, both.mem_used_total >> 10,
                 after.mem_used_total >> 10);
  store_destroy (a);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_isolation_beside_compaction),
    cmocka_unit_test (test_one_budget),
    cmocka_unit_test (test_destroy_gives_back),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
