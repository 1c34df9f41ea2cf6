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
 *     and the others keep theirs;
 *   - caps and floors (BUDGET in block-store.h): a capped store is
 *     refused past its cap with its old block intact; a store with a
 *     floor gets its floor's room while the others are refused short of
 *     it, also while two threads write to the others as fast as they
 *     can; the floors' unmet room follows every write, trim and destroy.
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

/* A store on a budget: the owner (mem_limit, its own pool) or one on
 * the owner's pool with a cap and a floor.
 */
/* A store on budget (on owner's pool, if given), with backing, or
 * using owner's (shares_cold_tier: COLD TIER ACROSS STORES).
 */
static struct block_store *
make_cold_store (struct block_store *owner, struct store_budget *budget,
                 uint64_t mem_limit, uint64_t cap, uint64_t floor,
                 struct backing *backing, bool shares_cold_tier)
{
  struct store_config config = { .size = DEVICE_BLOCKS * BS,
                                 .algorithm = CODEC_LZ4, .level = 1,
                                 .budget = budget, .cap = cap,
                                 .floor = floor, .backing = backing,
                                 .backing_owner = shares_cold_tier ? owner
                                 : NULL };
  zs_pool_config_init (&config.pool);
  config.pool.mem_limit = mem_limit;
  if (owner)
    config.shared_pool = store_pool (owner);
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  return store;
}

static struct block_store *
make_budget_store (struct block_store *owner, struct store_budget *budget,
                   uint64_t mem_limit, uint64_t cap, uint64_t floor)
{
  return make_cold_store (owner, budget, mem_limit, cap, floor, NULL, false);
}

/* Random (incompressible) blocks to store from block first on, until
 * ENOSPC or count: how many were stored.
 */
static uint64_t
fill_random (struct block_store *store, uint64_t first, uint64_t count,
             uint64_t seed)
{
  unsigned char buf[BS];
  uint64_t i = 0;
  for (; i < count; i++) {
    random_fill (buf, seed + first + i);
    if (store_write (store, buf, BS, (first + i) * BS) == -1) {
      assert_int_equal (errno, ENOSPC);
      break;
    }
  }
  return i;
}

#define BUDGET_LIMIT (2 << 20)
#define CAP (256 << 10)
#define FLOOR (512 << 10)

static void
test_cap (void **state)
{
  struct store_budget budget = STORE_BUDGET_INIT;
  struct block_store *owner = make_budget_store (NULL, &budget, BUDGET_LIMIT,
                                                 0, 0);
  struct block_store *capped = make_budget_store (owner, &budget, 0, CAP, 0);
  uint64_t stored = fill_random (capped, 0, DEVICE_BLOCKS, 0);
  struct store_stats s;
  store_stats (capped, &s);
  uint64_t counted = s.quota_bytes;
  /* Raw blocks: one 4 KiB object each, so the cap holds CAP / BS. */
  assert_int_equal (stored, CAP / BS);
  assert_true (s.quota_bytes <= CAP);
  assert_true (s.refused_for_budget >= 1);
  /* A rewrite over the cap is refused and leaves the old block. */
  unsigned char buf[BS], got[BS];
  random_fill (buf, 424242);
  assert_int_equal (store_write (capped, buf, BS, 0), -1);
  assert_int_equal (errno, ENOSPC);
  random_fill (buf, 0);
  assert_int_equal (store_read (capped, got, BS, 0), 0);
  assert_memory_equal (got, buf, BS);
  /* The owner still has the rest of the budget. */
  uint64_t others = fill_random (owner, 0, 64, 1 << 20);
  assert_int_equal (others, 64);
  /* A trim gives the cap's room back. */
  assert_int_equal (store_trim (capped, 8 * BS, 0), 0);
  store_flush (capped);
  assert_int_equal (fill_random (capped, 0, 8, 2 << 20), 8);
  /* Rewrites in place (a partial zero re-encodes the block in its own
   * object) and trims leave the count exact: all of it back at the end.
   */
  unsigned char half[BS];
  memset (half, 0x5a, BS);
  assert_int_equal (store_trim (capped, DEVICE_BLOCKS * BS, 0), 0);
  store_flush (capped);
  for (uint64_t i = 0; i < 32; i++) {
    memcpy (buf, half, BS);
    buf[i] = (unsigned char) i;
    assert_int_equal (store_write (capped, buf, BS, i * BS), 0);
    assert_int_equal (store_zero (capped, 1000, i * BS + 2000, false), 0);
    random_fill (buf, i);
    assert_int_equal (store_write (capped, buf, BS / 2, i * BS), 0);
  }
  assert_int_equal (store_trim (capped, DEVICE_BLOCKS * BS, 0), 0);
  store_flush (capped);
  store_stats (capped, &s);
  assert_int_equal (s.quota_bytes, 0);
  print_message ("cap: %" PRIu64 " blocks under a %d KiB cap (%" PRIu64
                 " bytes counted), a rewrite past it refused with the old "
                 "block kept; rewrites in place and trims left 0 counted\n",
                 stored, CAP >> 10, counted);
  store_destroy (capped);
  store_destroy (owner);
}

static void
test_floor (void **state)
{
  struct store_budget budget = STORE_BUDGET_INIT;
  struct block_store *owner = make_budget_store (NULL, &budget, BUDGET_LIMIT,
                                                 0, 0);
  struct block_store *floored = make_budget_store (owner, &budget, 0, 0,
                                                   FLOOR);
  assert_int_equal (budget_unmet_floors (&budget), FLOOR);
  /* The owner fills what the floor leaves, and no more. */
  uint64_t taken = fill_random (owner, 0, DEVICE_BLOCKS, 0);
  struct store_stats s;
  store_stats (owner, &s);
  assert_true (s.limit_used + FLOOR <= BUDGET_LIMIT + BS);
  assert_true (s.refused_for_budget >= 1);
  /* The floor's room is there: all of it but what the pool charges
   * beside the objects (zspage descriptors, handle cells, the table's
   * nodes: 6 of 128 blocks' worth here), which floors do not count.
   */
  uint64_t kept = fill_random (floored, 0, FLOOR / BS, 1 << 20);
  assert_true (kept >= FLOOR / BS - 8);
  store_stats (floored, &s);
  assert_int_equal (s.budget_unmet_floors, FLOOR - kept * BS);
  /* Its trims give the floor's room back to it, not to the others. */
  assert_int_equal (store_trim (floored, kept * BS, 0), 0);
  store_flush (floored);
  store_stats (floored, &s);
  assert_int_equal (s.quota_bytes, 0);
  assert_int_equal (s.budget_unmet_floors, FLOOR);
  assert_int_equal (fill_random (owner, taken, 16, 3 << 20), 0);
  store_destroy (floored);
  assert_int_equal (atomic_load (&budget.unmet_floors), 0);  /* exact */
  assert_int_equal (atomic_load (&budget.floors), 0);
  /* Without the floor, the owner takes the room. */
  assert_true (fill_random (owner, taken, 16, 3 << 20) == 16);
  print_message ("floor: the other store filled %" PRIu64 " blocks and was "
                 "refused short of a %d KiB floor, whose store then stored "
                 "%" PRIu64 " blocks\n", taken, FLOOR >> 10, kept);
  store_destroy (owner);
}

/* Two threads write random blocks to the owner as fast as they can
 * while one fills the floor's store: each of the floor's blocks is
 * stored, and reads back exactly.
 */
struct hog {
  struct block_store *store;
  uint64_t first;
  atomic_bool *stop;
  _Atomic uint64_t refused;
};

static void *
hog_thread (void *arg)
{
  struct hog *hog = arg;
  unsigned char buf[BS];
  for (uint64_t i = 0; !atomic_load (hog->stop); i++) {
    uint64_t block = hog->first + i % (DEVICE_BLOCKS / 2);
    random_fill (buf, i * 7 + hog->first);
    if (store_write (hog->store, buf, BS, block * BS) == -1)
      hog->refused++;
    if (i % 64 == 0)
      store_trim (hog->store, BS,
                  (hog->first + (i / 64) % (DEVICE_BLOCKS / 2)) * BS);
  }
  return NULL;
}

static void
test_floor_beside_writers (void **state)
{
  struct store_budget budget = STORE_BUDGET_INIT;
  struct block_store *owner = make_budget_store (NULL, &budget, BUDGET_LIMIT,
                                                 0, 0);
  struct block_store *floored = make_budget_store (owner, &budget, 0, 0,
                                                   FLOOR);
  atomic_bool stop = false;
  struct hog hogs[2] = {
    { .store = owner, .first = 0, .stop = &stop },
    { .store = owner, .first = DEVICE_BLOCKS / 2, .stop = &stop },
  };
  pthread_t threads[2];
  for (int i = 0; i < 2; i++)
    pthread_create (&threads[i], NULL, hog_thread, &hogs[i]);
  /* Let them fill the budget first. */
  while (hogs[0].refused + hogs[1].refused < 100)
    sched_yield ();
  unsigned char buf[BS], got[BS];
  uint64_t blocks = FLOOR / BS - 8;
  for (uint64_t i = 0; i < blocks; i++) {
    random_fill (buf, 5000000 + i);
    assert_int_equal (store_write (floored, buf, BS, i * BS), 0);
  }
  atomic_store (&stop, true);
  for (int i = 0; i < 2; i++)
    pthread_join (threads[i], NULL);
  for (uint64_t i = 0; i < blocks; i++) {
    random_fill (buf, 5000000 + i);
    assert_int_equal (store_read (floored, got, BS, i * BS), 0);
    assert_memory_equal (got, buf, BS);
  }
  struct store_stats s;
  store_stats (floored, &s);
  assert_true (s.limit_used <= BUDGET_LIMIT);
  assert_int_equal (s.budget_unmet_floors, FLOOR - blocks * BS);
  print_message ("floor beside 2 writers: %" PRIu64 " blocks of a %d KiB "
                 "floor stored while the writers were refused %" PRIu64
                 " times\n", blocks, FLOOR >> 10,
                 hogs[0].refused + hogs[1].refused);
  store_destroy (floored);
  store_destroy (owner);
}

struct destroyer {
  struct block_store *store;
  atomic_bool done;
};

static void *
destroy_thread (void *arg)
{
  struct destroyer *destroyer = arg;
  store_destroy (destroyer->store);
  atomic_store (&destroyer->done, true);
  return NULL;
}

/* Random blocks from seed on read back from store's blocks 0..count-1. */
static void
check_random (struct block_store *store, uint64_t count, uint64_t seed)
{
  unsigned char want[BS], got[BS];
  for (uint64_t i = 0; i < count; i++) {
    random_fill (want, seed + i);
    assert_int_equal (store_read (store, got, BS, i * BS), 0);
    assert_memory_equal (got, want, BS);
  }
}

/* One cold tier for the stores of a budget: a write of the owner's that
 * finds the budget full writes back the device's idle blocks, none of
 * its own, and both read back; a device pinned by another store's
 * writeback (budget_members_pin) is taken off the members at once by its
 * destroy, which then waits for the pin to go; its runs come back to
 * the one space map.
 */
static void
test_shared_cold_tier (void **state)
{
  struct store_budget budget = STORE_BUDGET_INIT;
  char *error = NULL;
  struct backing *backing = backing_open (backing_file_create (),
                                          2 * DEVICE_BLOCKS * BS, false, 30,
                                          &error);
  if (!backing)
    fail_msg ("backing_open: %s", error);
  struct block_store *owner = make_cold_store (NULL, &budget, BUDGET_LIMIT,
                                               0, 0, backing, false);
  struct block_store *device = make_cold_store (owner, &budget, 0, 0, 0,
                                                NULL, true);
  /* A store sharing a cold tier: the owner's, on its budget. */
  struct store_config bad = { .size = BS, .algorithm = CODEC_LZ4,
                              .level = 1, .backing_owner = owner,
                              .shared_pool = store_pool (owner) };
  zs_pool_config_init (&bad.pool);
  assert_null (store_create (&bad));
  assert_int_equal (errno, EINVAL);

  /* The device takes 1.5 MiB of the 2 MiB budget, the owner 0.75. */
  const uint64_t blocks = 384, owner_blocks = 192;
  assert_int_equal (fill_random (device, 0, blocks, 0), blocks);
  store_mark_idle (device, 0, NULL, NULL);
  assert_int_equal (fill_random (owner, 0, owner_blocks, 1 << 20),
                    owner_blocks);
  struct store_stats d, o;
  store_stats (device, &d);
  store_stats (owner, &o);
  assert_true (d.bd_count > 0);
  assert_int_equal (o.bd_count, 0);
  assert_true (o.backing_used >= d.bd_count * BS);
  check_random (device, blocks, 0);
  check_random (owner, owner_blocks, 1 << 20);

  struct block_store *members[4], *again[4];
  assert_int_equal (budget_members_pin (owner, members, 4), 2);
  struct destroyer destroyer = { .store = device };
  pthread_t thread;
  assert_int_equal (pthread_create (&thread, NULL, destroy_thread,
                                    &destroyer), 0);
  /* Off the members at once, while the destroy waits for the pin. */
  unsigned count;
  do {
    count = budget_members_pin (owner, again, 4);
    budget_members_unpin (again, count);
  } while (count != 1);
  usleep (100000);
  assert_false (atomic_load (&destroyer.done));
  budget_members_unpin (members, 2);
  assert_int_equal (pthread_join (thread, NULL), 0);
  assert_true (atomic_load (&destroyer.done));
  store_flush (owner);
  store_stats (owner, &o);
  assert_int_equal (o.backing_used, 0);
  check_random (owner, owner_blocks, 1 << 20);
  print_message ("shared cold tier: the owner's writes wrote back %" PRIu64
                 " of the device's idle blocks and none of its own; the "
                 "device's destroy waited for the pin, its runs came "
                 "back\n", d.bd_count);
  store_destroy (owner);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_isolation_beside_compaction),
    cmocka_unit_test (test_one_budget),
    cmocka_unit_test (test_destroy_gives_back),
    cmocka_unit_test (test_cap),
    cmocka_unit_test (test_floor),
    cmocka_unit_test (test_floor_beside_writers),
    cmocka_unit_test (test_shared_cold_tier),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
