/* Block store tests, concurrency: partial writes of one block must not
 * lose each other's bytes, and a read must never return another block's
 * data or freed data whatever runs beside it (writers, readers, trims,
 * zeroes and the pool's reclaim, with batched and immediate frees);
 * threads that outlive the store register nothing that runs at their
 * exit (-Wl,--wrap=pthread_key_create, thread-exit-hooks.h).
 */

#include "store-fixture.h"
#include "thread-exit-hooks.h"

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

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_concurrent_partial_writes),
    cmocka_unit_test (test_threads_exit_after_destroy),
    cmocka_unit_test (test_concurrent_mixed_batched),
    cmocka_unit_test (test_concurrent_mixed_immediate_pool_lock),
    cmocka_unit_test (test_concurrent_mixed_leaves),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
