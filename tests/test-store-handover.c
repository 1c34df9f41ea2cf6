/* A store in a region handed from one process to the next (HANDOVER in
 * store/block-store.h): a child fills it with every kind of block a
 * device holds - compressed, raw, same-filled, partly written, partly
 * zeroed, trimmed, packed in units and units half dissolved, written
 * back to a cold tier (a file) and some of those rewritten - against an
 * exact shadow in memory both processes share, hands it over and exits;
 * the parent takes it over and compares every byte of the device with
 * the shadow, the counters with the child's and with a walk, serves on
 * (writes, packing) and destroys it with no page of the region left
 * taken.  A server configured for another device is refused, and the
 * store is untouched by the refusal.  Kill points: a writing, packing,
 * writing-back store killed at random instants and recovered; and the
 * recovery itself killed at each of its steps in turn, at random steps
 * and instants, one to three deep, before the recovery that is checked.
 */

#include "store-fixture.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "region-fixture.h"
#include "space-map.h"

#define DEVICE (16ull << 20)
#define BLOCKS (DEVICE / BS)
#define REGION_BYTES (128ull << 20)
#define COLD_BYTES (2 * DEVICE)         /* the cold tier's file */

/* What both processes share, made before the fork. */
struct shared {
  unsigned char shadow[DEVICE];   /* the device's exact expected bytes */
  struct store_stats before;      /* the child's counters, at handover */
};

static struct store_config
config_for (struct region *region, enum codec_algorithm algorithm)
{
  struct store_config config = { .size = DEVICE, .algorithm = algorithm,
                                 .level = 1 };
  zs_pool_config_init (&config.pool);
  config.pool.region = region;
  return config;
}

/* config with a cold tier: the file at path (made, or the one a last
 * process used).
 */
static void
with_cold_tier (struct store_config *config, const char *path)
{
  char *error = NULL;
  config->backing = backing_open (path, COLD_BYTES, false, 30, &error);
  if (!config->backing)
    fail_msg ("backing_open %s: %s", path, error);
}

/* Write back up to max blocks of [first, last]: the blocks written. */
static uint64_t
write_back (struct block_store *store, uint64_t first, uint64_t last,
            uint64_t max)
{
  struct store_writeback_request request = {
    .type = WRITEBACK_ANY, .first = first, .last = last, .max_blocks = max,
  };
  struct store_writeback_result result;
  if (store_writeback (store, &request, NULL, NULL, &result) == -1
      && errno != ENOSPC)
    return 0;
  return result.blocks;
}

static void
shadow_write (struct block_store *store, struct shared *shared,
              const void *buf, uint64_t count, uint64_t offset)
{
  assert_int_equal (store_write (store, buf, count, offset), 0);
  memcpy (shared->shadow + offset, buf, count);
}

static void
shadow_zero (struct block_store *store, struct shared *shared,
             uint64_t count, uint64_t offset)
{
  assert_int_equal (store_zero (store, count, offset, true), 0);
  memset (shared->shadow + offset, 0, count);
}

static void
shadow_trim (struct block_store *store, struct shared *shared,
             uint64_t count, uint64_t offset)
{
  assert_int_equal (store_trim (store, count, offset), 0);
  memset (shared->shadow + offset, 0, count);
}

/* Every kind of block, by block number modulo 8. */
static void
fill_mix (struct block_store *store, struct shared *shared, unsigned version)
{
  unsigned char buf[BS];
  uint64_t seed = 1234 + version;
  for (uint64_t b = 0; b < BLOCKS; b++) {
    uint64_t offset = b * BS;
    switch (b % 8) {
    case 0: case 1: case 2:     /* text: packs well */
      text_fill (buf, b, version);
      shadow_write (store, shared, buf, BS, offset);
      break;
    case 3:                     /* random: stored raw */
      for (size_t i = 0; i < BS; i += 8) {
        uint64_t word = xorshift64 (&seed);
        memcpy (buf + i, &word, 8);
      }
      shadow_write (store, shared, buf, BS, offset);
      break;
    case 4:                     /* same-filled */
      for (size_t i = 0; i < BS; i += 8) {
        uint64_t word = b * 0x0101010101010101ull + version;
        memcpy (buf + i, &word, 8);
      }
      shadow_write (store, shared, buf, BS, offset);
      break;
    case 5:                     /* written, then partly overwritten */
      block_fill (buf, b, version);
      shadow_write (store, shared, buf, BS, offset);
      memset (buf, 0x5a + version, 1000);
      shadow_write (store, shared, buf, 1000, offset + 100);
      break;
    case 6:                     /* written, then trimmed */
      block_fill (buf, b, version);
      shadow_write (store, shared, buf, BS, offset);
      shadow_trim (store, shared, BS, offset);
      break;
    case 7:                     /* written, then partly zeroed */
      block_fill (buf, b, version + 1);
      shadow_write (store, shared, buf, BS, offset);
      shadow_zero (store, shared, 512, offset + 1024);
      break;
    }
  }
}

/* Pack the idle blocks, then break a unit in sixteen by rewriting,
 * dissolve the units left half dead, and store random blocks raw again
 * (packing took them along).
 */
static void
pack_and_break (struct block_store *store, struct shared *shared,
                unsigned version)
{
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result result;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &result), 0);
  assert_true (result.blocks > BLOCKS / 4);
  unsigned char buf[BS];
  for (uint64_t b = 0; b < BLOCKS; b += 16) {
    block_fill (buf, b, version + 10);
    shadow_write (store, shared, buf, BS, b * BS);
  }
  store_pack_dissolve (store, 50, NULL, NULL);
  uint64_t seed = 777 + version;
  for (uint64_t b = 3; b < BLOCKS; b += 8) {
    for (size_t i = 0; i < BS; i += 8) {
      uint64_t word = xorshift64 (&seed);
      memcpy (buf + i, &word, 8);
    }
    shadow_write (store, shared, buf, BS, b * BS);
  }
}

/* Every byte of the device against the shadow. */
static void
device_matches (struct block_store *store, const struct shared *shared)
{
  static unsigned char got[64 * BS];
  for (uint64_t offset = 0; offset < DEVICE; offset += sizeof got) {
    assert_int_equal (store_read (store, got, sizeof got, offset), 0);
    for (size_t i = 0; i < sizeof got; i += BS)
      if (memcmp (got + i, shared->shadow + offset + i, BS) != 0)
        fail_msg ("block %" PRIu64 " differs from what was acknowledged",
                  (offset + i) / BS);
  }
}

/* In a child: the region at path, the store filled and packed, handed
 * over.
 */
static void
store_filled_in_child (struct shared *shared, const char *path,
                       const char *cold_path)
{
  pid_t pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    struct region_owner *owner = region_create (path, REGION_BYTES, DEVICE,
                                                false);
    if (!owner)
      _exit (3);
    region_start_serving (owner);
    struct store_config config = config_for (owner->region, CODEC_LZ4);
    with_cold_tier (&config, cold_path);
    struct block_store *store = store_create (&config);
    if (!store)
      _exit (4);
    fill_mix (store, shared, 1);
    pack_and_break (store, shared, 1);
    /* A quarter of the device written back, a few of those rewritten
     * (their runs released) and trimmed.
     */
    if (write_back (store, 0, BLOCKS - 1, BLOCKS / 4) == 0)
      _exit (6);
    unsigned char buf[BS];
    for (uint64_t b = 0; b < BLOCKS / 4; b += 7) {
      block_fill (buf, b, 30);
      shadow_write (store, shared, buf, BS, b * BS);
    }
    shadow_trim (store, shared, 4 * BS, 100 * BS);
    store_flush (store);
    store_stats (store, &shared->before);
    if (store_hand_over (store) == -1)
      _exit (5);
    region_hand_over (owner, 1);
    _exit (0);
  }
  int status;
  assert_int_equal (waitpid (pid, &status, 0), pid);
  if (!WIFEXITED (status) || WEXITSTATUS (status) != 0)
    fail_msg ("the filling child failed (status %#x)", status);
}

static struct shared *
shared_make (void)
{
  struct shared *shared = mmap (NULL, sizeof *shared, PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true (shared != MAP_FAILED);
  return shared;
}

static struct region_owner *
attach_clean (const char *path)
{
  struct region_owner *owner = region_attach_expecting (path, DEVICE,
                                                        REGION_ATTACH_CLEAN);
  region_start_serving (owner);
  return owner;
}

static void
test_handover_mix (void **state)
{
  (void) state;
  struct shared *shared = shared_make ();
  char cold_path[256];            /* (region_path's buffer is reused) */
  snprintf (cold_path, sizeof cold_path, "%s", region_path ("mix-cold"));
  const char *path = region_path ("mix");
  store_filled_in_child (shared, path, cold_path);
  struct region_owner *owner = attach_clean (path);

  struct store_config config = config_for (owner->region, CODEC_LZ4);
  with_cold_tier (&config, cold_path);
  char why[256] = "";
  struct block_store *store = store_take_over (owner->region, &config, why,
                                               sizeof why);
  if (!store)
    fail_msg ("store_take_over: %s", why);
  device_matches (store, shared);

  /* The counters came over as they were, and a walk agrees. */
  struct store_stats after;
  store_stats (store, &after);
  const struct store_stats *before = &shared->before;
  assert_int_equal (after.orig_data_size, before->orig_data_size);
  assert_int_equal (after.compr_data_size, before->compr_data_size);
  assert_int_equal (after.same_pages, before->same_pages);
  assert_int_equal (after.huge_pages, before->huge_pages);
  assert_int_equal (after.packed_blocks, before->packed_blocks);
  assert_int_equal (after.pack_units, before->pack_units);
  assert_int_equal (after.mem_used_total, before->mem_used_total);
  assert_int_equal (after.table_bytes, before->table_bytes);
  assert_int_equal (after.bd_count, before->bd_count);
  assert_int_equal (after.bd_bytes, before->bd_bytes);
  assert_int_equal (after.backing_used, before->backing_used);
  assert_int_equal (after.backing_map_bytes, before->backing_map_bytes);
  print_message ("handed over: %" PRIu64 " blocks, %" PRIu64 " packed in %"
                 PRIu64 " units, %" PRIu64 " raw, %" PRIu64 " same-filled, %"
                 PRIu64 " in the cold tier\n",
                 before->orig_data_size / BS, before->packed_blocks,
                 before->pack_units, before->huge_pages, before->same_pages,
                 before->bd_count);
  assert_true (before->packed_blocks > 0 && before->huge_pages > 0
               && before->same_pages > 0 && before->bd_count > 0);
  struct store_walk walk;
  assert_int_equal (store_walk (store, &walk), 0);
  assert_int_equal (walk.stored * BS, after.orig_data_size);
  assert_int_equal (walk.written_back, after.bd_count);

  /* It serves on: every kind again over the old, packed again, written
   * back again.
   */
  fill_mix (store, shared, 2);
  pack_and_break (store, shared, 2);
  assert_true (write_back (store, 0, BLOCKS - 1, BLOCKS / 8) > 0);
  device_matches (store, shared);

  /* Destroyed, it leaves no page of the region taken. */
  store_destroy (store);
  assert_int_equal (owner->region->pages_taken, 0);
  region_destroy (owner);
  unlink (cold_path);
  munmap (shared, sizeof *shared);
}

/* A server for another device: refused, and the store is as it was for
 * the right one.
 */
static void
test_take_over_refused (void **state)
{
  (void) state;
  struct shared *shared = shared_make ();
  char cold_path[256], other_path[256];
  snprintf (cold_path, sizeof cold_path, "%s", region_path ("refused-cold"));
  snprintf (other_path, sizeof other_path, "%s", region_path ("other-cold"));
  const char *path = region_path ("refused");
  store_filled_in_child (shared, path, cold_path);
  struct region_owner *owner = attach_clean (path);

  struct store_config config = config_for (owner->region, CODEC_ZSTD);
  char why[256] = "";
  assert_null (store_take_over (owner->region, &config, why, sizeof why));
  assert_int_equal (errno, EINVAL);
  assert_non_null (strstr (why, "another algorithm"));
  config = config_for (owner->region, CODEC_LZ4);
  config.size = DEVICE / 2;
  assert_null (store_take_over (owner->region, &config, why, sizeof why));
  assert_non_null (strstr (why, "another size"));
  /* Its cold tier left out, or another file in its place. */
  config = config_for (owner->region, CODEC_LZ4);
  assert_null (store_take_over (owner->region, &config, why, sizeof why));
  assert_non_null (strstr (why, "give its backing= again"));
  with_cold_tier (&config, other_path);
  assert_null (store_take_over (owner->region, &config, why, sizeof why));
  assert_non_null (strstr (why, "not the stored device's"));
  backing_close (config.backing);

  config = config_for (owner->region, CODEC_LZ4);
  with_cold_tier (&config, cold_path);
  struct block_store *store = store_take_over (owner->region, &config, why,
                                               sizeof why);
  if (!store)
    fail_msg ("store_take_over: %s", why);
  device_matches (store, shared);
  store_destroy (store);
  region_destroy (owner);
  unlink (cold_path);
  unlink (other_path);
  munmap (shared, sizeof *shared);
}

/* ---- kill points: recovered after SIGKILL -------------------------------- */

/* Recoveries that found packed units and their dictionaries. */
static uint64_t recovered_with_dictionaries;

#define KILL_BLOCKS 2048
#define KILL_WRITERS 2

/* The exact shadow, shared: per block the version acknowledged (0:
 * never written or trimmed: zeros) and the version being written, if
 * any (its write may or may not have landed).
 */
struct kill_shadow {
  _Atomic uint32_t acked[KILL_BLOCKS];
  _Atomic uint32_t inflight[KILL_BLOCKS];
  _Atomic uint64_t writes, movers;
};

/* Block b at version v: text (packs), compressible, same-filled, random
 * (raw), by (b + v) % 4; version 0 is zeros.
 */
static void
kill_content (unsigned char *buf, uint64_t b, uint32_t v)
{
  if (v == 0) {
    memset (buf, 0, BS);
    return;
  }
  switch ((b + v) % 4) {
  case 0: text_fill (buf, b, v); break;
  case 1: block_fill (buf, b, v); break;
  case 2: memset (buf, (int) (b * 7 + v) | 1, BS); break;
  default: {
    uint64_t seed = b * 1000003 + v;
    for (size_t i = 0; i < BS; i += 8) {
      uint64_t word = xorshift64 (&seed);
      memcpy (buf + i, &word, 8);
    }
  }
  }
}

struct kill_writer {
  struct block_store *store;
  struct kill_shadow *shadow;
  unsigned first, count;
  uint64_t seed;
};

static void *
kill_writer_main (void *arg)
{
  struct kill_writer *w = arg;
  unsigned char buf[4 * BS];
  for (;;) {
    unsigned b = w->first + xorshift64 (&w->seed) % w->count;
    unsigned n = 1 + xorshift64 (&w->seed) % 4;
    if (b + n > w->first + w->count)
      n = w->first + w->count - b;
    uint32_t v = atomic_load (&w->shadow->acked[b]) + 1;
    bool trim = xorshift64 (&w->seed) % 16 == 0;
    for (unsigned i = 0; i < n; i++) {
      atomic_store (&w->shadow->inflight[b + i], trim ? UINT32_MAX : v);
      kill_content (buf + i * BS, b + i, v);
    }
    int r = trim ? store_trim (w->store, (uint64_t) n * BS, (uint64_t) b * BS)
      : store_write (w->store, buf, (uint64_t) n * BS, (uint64_t) b * BS);
    if (r == -1)
      _exit (6);
    for (unsigned i = 0; i < n; i++) {
      atomic_store (&w->shadow->acked[b + i], trim ? 0 : v);
      atomic_store (&w->shadow->inflight[b + i], 0);
    }
    atomic_fetch_add (&w->shadow->writes, 1);
  }
  return NULL;
}

/* Held open in the child: an entry half written (its value new, its
 * state old) for a few microseconds one time in four, so that kills land
 * there and recovery must put torn entries back.
 */
static void
torn_window (void)
{
  static __thread uint64_t seed = 1;
  if (xorshift64 (&seed) % 4 == 0) {
    struct timespec wait = { 0, 20000 };
    nanosleep (&wait, NULL);
  }
}

/* The child: writers over disjoint ranges (so each block's versions are
 * in order), and a mover that marks idle, packs, dissolves, compacts and
 * flushes the free batches without pause.
 */
static void
kill_child (const char *path, const char *cold_path,
            struct kill_shadow *shadow, uint64_t seed)
{
  struct region_owner *owner = region_create (path, REGION_BYTES, DEVICE,
                                              false);
  if (!owner)
    _exit (3);
  struct store_config config = config_for (owner->region, CODEC_LZ4);
  config.pack_blocks = 4 + seed % 13;
  with_cold_tier (&config, cold_path);
  struct block_store *store = store_create (&config);
  if (!store)
    _exit (4);
  region_start_serving (owner);     /* the plugin's order */
  entry_write_window = torn_window;
  struct kill_writer writers[KILL_WRITERS];
  for (unsigned t = 0; t < KILL_WRITERS; t++) {
    writers[t] = (struct kill_writer) {
      .store = store, .shadow = shadow,
      .first = t * (KILL_BLOCKS / KILL_WRITERS),
      .count = KILL_BLOCKS / KILL_WRITERS, .seed = seed * 7 + t + 1,
    };
    pthread_t thread;
    if (pthread_create (&thread, NULL, kill_writer_main, &writers[t]) != 0)
      _exit (5);
  }
  uint64_t mover_seed = seed;
  for (;;) {
    /* Writeback first: a packing run that trains a dictionary takes a
     * while (much longer under TSan), and a child killed within it must
     * still have written blocks back for the cold tier's recovery.
     */
    uint64_t first = xorshift64 (&mover_seed) % KILL_BLOCKS;
    write_back (store, first, KILL_BLOCKS - 1, 16);
    struct store_pack_result packed;
    store_mark_idle (store, 0, NULL, NULL);
    store_pack (store, 64, 0, NULL, NULL, &packed);
    store_pack_dissolve (store, 60, NULL, NULL);
    store_compact (store);
    store_flush (store);
    atomic_fetch_add (&shadow->movers, 1);
  }
}

/* A kill_child with its own seed, killed after delay_us: what it left
 * is in the region at path and in shadow.
 */
static void
kill_child_at (const char *path, const char *cold_path,
               struct kill_shadow *shadow, uint64_t seed, unsigned delay_us,
               unsigned movers)
{
  memset (shadow, 0, sizeof *shadow);
  pid_t pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0)
    kill_child (path, cold_path, shadow, seed);
  /* At least that many mover rounds first (each writes back), however
   * slow the machine (a sanitizer's child may do none in the delay).
   */
  for (unsigned waited = 0; atomic_load (&shadow->movers) < movers; waited++) {
    if (waited == 60000)
      fail_msg ("the writing child did %u mover rounds in 60 s", movers);
    usleep (1000);
  }
  usleep (delay_us);
  kill (pid, SIGKILL);
  int status;
  assert_int_equal (waitpid (pid, &status, 0), pid);
  if (!WIFSIGNALED (status))
    fail_msg ("the writing child exited (status %#x) before its kill",
              status);
}

/* Recover what the child left; every block as acknowledged (or as the
 * write in flight on it wrote it); the counters against a walk; then it
 * serves on, and gives every page back.
 */
static uint64_t
kill_recover_and_check (const char *path, const char *cold_path,
                        struct kill_shadow *shadow, uint64_t *torn,
                        uint64_t *backed, uint64_t *recovery_restarts)
{
  enum region_attach_result how;
  char why[256] = "";
  struct region_owner *owner = region_attach (path, DEVICE, &how, why,
                                              sizeof why);
  if (!owner && errno == ENOENT) {
    assert_int_equal (shadow->writes, 0);   /* killed while making it */
    unlink (path);
    return 0;
  }
  if (!owner)
    fail_msg ("region_attach: %s", why);
  if (how != REGION_ATTACH_CRASHED) {
    assert_int_equal (shadow->writes, 0);   /* killed before it served */
    region_destroy (owner);
    return 0;
  }
  struct store_config config = config_for (owner->region, CODEC_LZ4);
  with_cold_tier (&config, cold_path);
  struct store_recover_result result;
  struct block_store *store = store_recover (owner->region, &config, &result,
                                             why, sizeof why);
  if (!store)
    fail_msg ("store_recover: %s", why);
  assert_int_equal (result.lost_blocks, 0);
  assert_int_equal (result.lost_units, 0);
  assert_int_equal (result.objects_refused, 0);
  *torn += result.torn_entries;
  if (recovery_restarts)
    *recovery_restarts = region_state_read (owner->region)->recovery_restarts;
  region_start_serving (owner);

  static unsigned char got[BS], want[BS], other[BS];
  uint64_t checked = 0, stored = 0;
  for (uint64_t b = 0; b < KILL_BLOCKS; b++) {
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    uint32_t acked = shadow->acked[b], inflight = shadow->inflight[b];
    kill_content (want, b, acked);
    bool same = memcmp (got, want, BS) == 0;
    if (!same && inflight) {
      kill_content (other, b, inflight == UINT32_MAX ? 0 : inflight);
      same = memcmp (got, other, BS) == 0;
    }
    if (!same)
      fail_msg ("block %" PRIu64 ": neither its acknowledged version %u nor "
                "the one in flight (%u)", b, acked, inflight);
    checked += acked != 0;
    static const unsigned char zeros[BS];
    stored += memcmp (got, zeros, BS) != 0;
  }
  struct store_stats stats;
  store_stats (store, &stats);
  struct store_walk walk;
  assert_int_equal (store_walk (store, &walk), 0);
  assert_int_equal (walk.stored * BS, stats.orig_data_size);
  assert_true (walk.stored >= stored);
  assert_int_equal (walk.written_back, stats.bd_count);
  *backed += stats.bd_count;
  /* Units recovered with their dictionaries (packing trains one). */
  if (stats.pack_units > 0 && stats.pack_dictionaries > 0)
    recovered_with_dictionaries++;

  /* Serves on: every block written again, packed, read back. */
  unsigned char buf[BS];
  for (uint64_t b = 0; b < KILL_BLOCKS; b += 3) {
    kill_content (buf, b, 1000);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  write_back (store, 0, KILL_BLOCKS - 1, 64);
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result packed;
  assert_int_equal (store_pack (store, 0, 0, NULL, NULL, &packed), 0);
  store_compact (store);
  for (uint64_t b = 0; b < KILL_BLOCKS; b += 3) {
    kill_content (want, b, 1000);
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    if (memcmp (got, want, BS) != 0)
      fail_msg ("block %" PRIu64 " written after recovery reads back wrong", b);
  }
  store_destroy (store);
  assert_int_equal (owner->region->pages_taken, 0);
  region_destroy (owner);
  return checked;
}

static void
test_kill_points (void **state)
{
  (void) state;
  struct kill_shadow *shadow = mmap (NULL, sizeof *shadow,
                                     PROT_READ | PROT_WRITE,
                                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true (shadow != MAP_FAILED);
  char cold_path[256];            /* (region_path's buffer is reused) */
  snprintf (cold_path, sizeof cold_path, "%s", region_path ("kill-cold"));
  const char *path = region_path ("kill-points");
  unsigned points = atoi (getenv ("KILL_POINTS") ? getenv ("KILL_POINTS")
                          : "200");
  uint64_t seed = 42, checked = 0, writes = 0, movers = 0, torn = 0;
  uint64_t backed = 0;
  for (unsigned point = 0; point < points; point++) {
    /* Every tenth child lives long enough to train a dictionary for its
     * packing (0.1 s or so) and pack with it.
     */
    uint64_t delay_us = point % 10 == 9 ? 200000 + xorshift64 (&seed) % 400000
      : 5000 + xorshift64 (&seed) % 60000;
    kill_child_at (path, cold_path, shadow, seed + point, delay_us, 0);
    writes += shadow->writes;
    movers += shadow->movers;
    checked += kill_recover_and_check (path, cold_path, shadow, &torn,
                                       &backed, NULL);
  }
  print_message ("%u kill points: %" PRIu64 " acknowledged writes, %" PRIu64
                 " mover rounds; %" PRIu64 " acknowledged blocks checked, 0 "
                 "mismatches, %" PRIu64 " torn entries put back, %" PRIu64
                 " blocks found in the cold tier; %" PRIu64 " recoveries "
                 "found units and their dictionaries\n", points,
                 writes, movers, checked, torn, backed,
                 recovered_with_dictionaries);
  assert_true (backed > 0);
  assert_true (recovered_with_dictionaries > 0);
  unlink (cold_path);
  munmap (shadow, sizeof *shadow);
}

/* ---- devices in the region, added and removed under kills ---------------- */

#define DEVICE_SLOTS 4
#define DEVICE_SLOT_BLOCKS 64

/* What the child did to each device, in memory both processes share:
 * the state it reached (an add or remove in between: either outcome),
 * and each block's acknowledged version and the one in flight.
 */
enum device_phase { DEVICE_GONE, DEVICE_ADDING, DEVICE_PRESENT,
                    DEVICE_REMOVING };
struct devices_shadow {
  _Atomic int phase[DEVICE_SLOTS];
  _Atomic uint32_t acked[DEVICE_SLOTS][DEVICE_SLOT_BLOCKS];
  _Atomic uint32_t inflight[DEVICE_SLOTS][DEVICE_SLOT_BLOCKS];
  _Atomic uint64_t adds, removes, writes;
};

static struct device_spec
device_slot_spec (unsigned d)
{
  struct device_spec spec = { .size = DEVICE_SLOT_BLOCKS * BS,
                              .algorithm = CODEC_LZ4, .level = 1 };
  snprintf (spec.name, sizeof spec.name, "d%u", d);
  return spec;
}

static struct store_config
device_slot_config (struct region *region, struct block_store *root,
                    const struct device_spec *spec)
{
  struct store_config config = config_for (region, CODEC_LZ4);
  config.size = spec->size;
  config.shared_pool = store_pool (root);
  return config;
}

static void
devices_window (uint64_t *seed)
{
  struct timespec wait = { 0, (long) (xorshift64 (seed) % 500) * 1000 };
  nanosleep (&wait, NULL);
}

/* The child: the root store written, devices added, written and removed
 * one step at a time, until killed.
 */
static void
devices_child (const char *path, struct devices_shadow *shadow, uint64_t seed)
{
  struct region_owner *owner = region_create (path, REGION_BYTES, DEVICE,
                                              false);
  if (!owner)
    _exit (3);
  struct store_config config = config_for (owner->region, CODEC_LZ4);
  struct block_store *root = store_create (&config);
  if (!root)
    _exit (4);
  region_start_serving (owner);
  struct block_store *stores[DEVICE_SLOTS] = { NULL };
  unsigned char buf[BS];
  for (uint32_t version = 1;; version++) {
    unsigned d = xorshift64 (&seed) % DEVICE_SLOTS;
    struct device_spec spec = device_slot_spec (d);
    if (!stores[d]) {
      for (unsigned b = 0; b < DEVICE_SLOT_BLOCKS; b++)
        atomic_store (&shadow->acked[d][b], 0);
      atomic_store (&shadow->phase[d], DEVICE_ADDING);
      struct store_config device_config = device_slot_config (owner->region,
                                                             root, &spec);
      stores[d] = store_create (&device_config);
      /* The windows a kill must find whole or gone held open a while:
       * made but not published, unpublished but not destroyed.
       */
      if (stores[d])
        devices_window (&seed);
      if (!stores[d] || store_device_publish (root, &spec, stores[d]) == -1)
        _exit (5);
      atomic_store (&shadow->phase[d], DEVICE_PRESENT);
      atomic_fetch_add (&shadow->adds, 1);
    }
    else if (xorshift64 (&seed) % 8 == 0) {
      atomic_store (&shadow->phase[d], DEVICE_REMOVING);
      store_device_unpublish (root, stores[d]);
      devices_window (&seed);
      store_destroy (stores[d]);
      stores[d] = NULL;
      atomic_store (&shadow->phase[d], DEVICE_GONE);
      atomic_fetch_add (&shadow->removes, 1);
    }
    else {
      unsigned b = xorshift64 (&seed) % DEVICE_SLOT_BLOCKS;
      atomic_store (&shadow->inflight[d][b], version);
      kill_content (buf, b + d * 1000, version);
      if (store_write (stores[d], buf, BS, (uint64_t) b * BS) == -1)
        _exit (6);
      atomic_store (&shadow->acked[d][b], version);
      atomic_store (&shadow->inflight[d][b], 0);
      /* The root written too: its blocks must come through whatever
       * its devices did.
       */
      kill_content (buf, b, version);
      if (store_write (root, buf, BS, (uint64_t) b * BS) == -1)
        _exit (7);
      atomic_fetch_add (&shadow->writes, 1);
    }
  }
}

/* Recover the child's region: the devices it held as their phases
 * allow, each block as acknowledged or in flight; then everything
 * destroyed with no page of the region left taken (nothing a cut add
 * or remove made stays behind).  Returns the devices kept.
 */
static unsigned
devices_recover_and_check (const char *path, struct devices_shadow *shadow)
{
  enum region_attach_result how;
  char why[256] = "";
  struct region_owner *owner = region_attach (path, DEVICE, &how, why,
                                              sizeof why);
  if (!owner && errno == ENOENT) {
    unlink (path);
    return 0;
  }
  if (!owner)
    fail_msg ("region_attach: %s", why);
  if (how != REGION_ATTACH_CRASHED) {
    assert_int_equal (shadow->adds, 0);
    region_destroy (owner);
    return 0;
  }
  struct store_config config = config_for (owner->region, CODEC_LZ4);
  struct store_recover_result result;
  struct block_store *root = store_recover (owner->region, &config, &result,
                                            why, sizeof why);
  if (!root)
    fail_msg ("store_recover: %s", why);
  assert_int_equal (result.lost_blocks, 0);
  assert_int_equal (result.lost_devices, 0);
  region_start_serving (owner);
  struct device_spec specs[DEVICES_MAX];
  struct block_store *stores[DEVICES_MAX];
  unsigned held = store_devices_held (root, specs, stores, DEVICES_MAX);
  assert_int_equal (held, result.devices);
  bool seen[DEVICE_SLOTS] = { false };
  static unsigned char got[BS], want[BS], other[BS];
  for (unsigned i = 0; i < held; i++) {
    unsigned d = (unsigned) atoi (specs[i].name + 1);
    assert_true (d < DEVICE_SLOTS && !seen[d]);
    seen[d] = true;
    int phase = atomic_load (&shadow->phase[d]);
    if (phase == DEVICE_GONE)
      fail_msg ("device d%u: removed, yet recovered", d);
    struct store_config device_config
      = device_slot_config (owner->region, root, &specs[i]);
    if (store_device_adopt (stores[i], &device_config, why, sizeof why) == -1)
      fail_msg ("store_device_adopt d%u: %s", d, why);
    for (unsigned b = 0; b < DEVICE_SLOT_BLOCKS; b++) {
      assert_int_equal (store_read (stores[i], got, BS, (uint64_t) b * BS), 0);
      uint32_t acked = phase == DEVICE_ADDING ? 0 : shadow->acked[d][b];
      uint32_t inflight = phase == DEVICE_ADDING ? 0 : shadow->inflight[d][b];
      kill_content (want, b + d * 1000, acked);
      bool same = memcmp (got, want, BS) == 0;
      if (!same && inflight) {
        kill_content (other, b + d * 1000, inflight);
        same = memcmp (got, other, BS) == 0;
      }
      if (!same)
        fail_msg ("device d%u block %u: neither version %u nor %u", d, b,
                  acked, inflight);
    }
  }
  for (unsigned d = 0; d < DEVICE_SLOTS; d++)
    if (!seen[d] && atomic_load (&shadow->phase[d]) == DEVICE_PRESENT)
      fail_msg ("device d%u: added, yet not recovered", d);
  store_destroy (root);           /* its devices with it */
  assert_int_equal (owner->region->pages_taken, 0);
  region_destroy (owner);
  return held;
}

static void
test_devices_kill_points (void **state)
{
  (void) state;
  struct devices_shadow *shadow = mmap (NULL, sizeof *shadow,
                                        PROT_READ | PROT_WRITE,
                                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true (shadow != MAP_FAILED);
  const char *path = region_path ("devices-kill-points");
  unsigned points = 100, kept = 0, cut_adds = 0, cut_removes = 0;
  uint64_t seed = 44, adds = 0, removes = 0, writes = 0;
  for (unsigned point = 0; point < points; point++) {
    memset (shadow, 0, sizeof *shadow);
    pid_t pid = fork ();
    assert_true (pid >= 0);
    if (pid == 0)
      devices_child (path, shadow, seed + point);
    /* Killed after a random number of steps (and a random instant
     * more), not a random time: a sanitizer's child is too slow for
     * times to land among its adds and removes.
     */
    uint64_t steps = 1 + xorshift64 (&seed) % 40;
    for (unsigned waited = 0;
         atomic_load (&shadow->adds) + atomic_load (&shadow->removes)
           + atomic_load (&shadow->writes) < steps; waited++) {
      if (waited == 600000)
        fail_msg ("the devices' child did %" PRIu64 " steps in 60 s", steps);
      usleep (100);
    }
    usleep (xorshift64 (&seed) % 2000);
    kill (pid, SIGKILL);
    int status;
    assert_int_equal (waitpid (pid, &status, 0), pid);
    if (!WIFSIGNALED (status))
      fail_msg ("the devices' child exited (status %#x)", status);
    for (unsigned d = 0; d < DEVICE_SLOTS; d++) {
      cut_adds += atomic_load (&shadow->phase[d]) == DEVICE_ADDING;
      cut_removes += atomic_load (&shadow->phase[d]) == DEVICE_REMOVING;
    }
    adds += shadow->adds;
    removes += shadow->removes;
    writes += shadow->writes;
    kept += devices_recover_and_check (path, shadow);
  }
  print_message ("%u kill points among %" PRIu64 " adds, %" PRIu64 " removes "
                 "and %" PRIu64 " writes (%u inside an add, %u inside a "
                 "remove): %u devices recovered, each as its phase allows "
                 "and every block as acknowledged; no page of the region "
                 "left taken\n", points, adds, removes, writes, cut_adds,
                 cut_removes, kept);
  assert_true (adds > 0 && removes > 0);
  munmap (shadow, sizeof *shadow);
}

/* ---- kill points inside the recovery ------------------------------------- */

/* Every step a recovery names (recovery_step): the first kill of round r
 * is at the first call of step r % RECOVERY_STEPS, so that each step is
 * killed in turn; later kills, at a random call.
 */
static const char *const recovery_steps[] = {
  "state: journal written", "store: recovery marked",
  "region: allocations forgotten", "store: torn entries put back",
  "store: table walk", "store: table walked", "store: units recovered",
  "store: devices walked",
  "allocator: live objects marked", "allocator: slots emptied",
  "allocator: zspages counted", "allocator: zspages rebuilt",
  "allocator: zspages listed", "allocator: cell blocks rebuilt",
  "allocator: chunks rebuilt", "allocator: reserve kept",
  "region: unreached pages given back", "store: cold tier's leaf worked out",
  "store: cold tier's map recovered",
  "store: adopted",
};
#define RECOVERY_STEPS (sizeof recovery_steps / sizeof *recovery_steps)

/* Shared with the recovering child. */
struct recovery_kill {
  const char *step;             /* kill at its first call, or */
  uint64_t call;                /* at this call (1 the first; 0: none) */
  _Atomic uint64_t calls;       /* calls so far */
  _Atomic bool marked;          /* the attempt was marked (it counts in
                                   recovery_restarts when cut short) */
  _Atomic bool steps_seen[RECOVERY_STEPS];
};
static struct recovery_kill *recovery_kill;

static void
recovery_kill_step (const char *step)
{
  struct recovery_kill *k = recovery_kill;
  uint64_t call = atomic_fetch_add (&k->calls, 1) + 1;
  for (unsigned i = 0; i < RECOVERY_STEPS; i++)
    if (strcmp (step, recovery_steps[i]) == 0)
      atomic_store (&k->steps_seen[i], true);
  if (strcmp (step, "store: recovery marked") == 0)
    atomic_store (&k->marked, true);    /* published before the step */
  if ((k->step && strcmp (step, k->step) == 0) || call == k->call)
    raise (SIGKILL);
}

/* A child recovers the region at path, killed where recovery_kill
 * says (or by the parent after delay_us, when not 0); it exits without
 * serving if nothing killed it.  Returns whether it was killed.
 */
static bool
recovery_killed (const char *path, const char *cold_path, unsigned delay_us)
{
  atomic_store (&recovery_kill->calls, 0);
  atomic_store (&recovery_kill->marked, false);
  pid_t pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    enum region_attach_result how;
    char why[256];
    struct region_owner *owner = region_attach (path, DEVICE, &how, why,
                                                sizeof why);
    if (!owner || how != REGION_ATTACH_CRASHED)
      _exit (0);                /* nothing to recover: not served */
    struct store_config config = config_for (owner->region, CODEC_LZ4);
    with_cold_tier (&config, cold_path);
    if (!delay_us)
      region_recovery_step = recovery_kill_step;
    struct store_recover_result result;
    if (!store_recover (owner->region, &config, &result, why, sizeof why))
      _exit (3);
    _exit (0);                  /* recovered, never served */
  }
  if (delay_us) {
    usleep (delay_us);
    kill (pid, SIGKILL);
  }
  int status;
  assert_int_equal (waitpid (pid, &status, 0), pid);
  if (WIFEXITED (status) && WEXITSTATUS (status) != 0)
    fail_msg ("the recovering child failed (exit %d)", WEXITSTATUS (status));
  return WIFSIGNALED (status);
}

/* Seeded as test_kill_points does (writers, movers, a cold tier, torn
 * entries; killed at a random instant), then each round's recovery is
 * killed one, two or three deep - first at a named step, in turn, then
 * at a random step call or a random instant - and the last recovery
 * must find every acknowledged block and count the cut-short attempts.
 */
static void
test_recovery_kill_points (void **state)
{
  (void) state;
  struct kill_shadow *shadow = mmap (NULL, sizeof *shadow,
                                     PROT_READ | PROT_WRITE,
                                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  recovery_kill = mmap (NULL, sizeof *recovery_kill, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true (shadow != MAP_FAILED && recovery_kill != MAP_FAILED);
  char cold_path[256];
  snprintf (cold_path, sizeof cold_path, "%s",
            region_path ("recovery-kill-cold"));
  const char *path = region_path ("recovery-kill");
  unsigned rounds = atoi (getenv ("RECOVERY_KILL_ROUNDS")
                          ? getenv ("RECOVERY_KILL_ROUNDS") : "57");
  uint64_t seed = 4242, checked = 0, writes = 0, torn = 0, backed = 0;
  uint64_t kills = 0, most_calls = 32;
  for (unsigned round = 0; round < rounds; round++) {
    kill_child_at (path, cold_path, shadow, seed + round,
                   20000 + xorshift64 (&seed) % 50000, 2);
    writes += shadow->writes;

    uint64_t restarts = 0;
    bool exact = true;
    unsigned depth = 1 + round % 3;
    for (unsigned d = 0; d < depth; d++) {
      recovery_kill->step = NULL;
      recovery_kill->call = 0;
      unsigned delay_us = 0;
      if (d == 0)
        recovery_kill->step = recovery_steps[round % RECOVERY_STEPS];
      else if (xorshift64 (&seed) % 2)
        recovery_kill->call = 1 + xorshift64 (&seed) % most_calls;
      else
        delay_us = 1 + xorshift64 (&seed) % 3000;
      bool killed = recovery_killed (path, cold_path, delay_us);
      kills += killed;
      uint64_t calls = atomic_load (&recovery_kill->calls);
      if (!delay_us && !killed && calls > most_calls)
        most_calls = calls;
      /* Whether a timed kill came after the mark is not known here. */
      exact &= !delay_us;
      restarts += atomic_load (&recovery_kill->marked);
    }
    if (shadow->writes == 0) {
      /* Killed before it served: nothing was recovered. */
      enum region_attach_result how;
      char why[256];
      struct region_owner *owner = region_attach (path, DEVICE, &how, why,
                                                  sizeof why);
      if (owner)
        region_destroy (owner);
      else
        unlink (path);
      continue;
    }
    /* The last recovery, in this process: every block checked, and each
     * attempt cut short after it was marked counted once.
     */
    uint64_t counted = 0;
    checked += kill_recover_and_check (path, cold_path, shadow, &torn,
                                       &backed, &counted);
    if (exact)
      assert_int_equal (counted, restarts);
    else
      assert_true (counted >= restarts && counted <= depth);
  }
  print_message ("%u rounds: %" PRIu64 " acknowledged writes; %" PRIu64
                 " recoveries killed (one to three deep, at each of %zu "
                 "steps in turn and at random calls and instants); %" PRIu64
                 " acknowledged blocks checked after the last, 0 "
                 "mismatches, %" PRIu64 " torn entries put back, %" PRIu64
                 " blocks found in the cold tier\n", rounds, writes, kills,
                 RECOVERY_STEPS, checked, torn, backed);
  for (unsigned i = 0; i < RECOVERY_STEPS; i++)
    if (!recovery_kill->steps_seen[i])
      fail_msg ("the recovery never reached step \"%s\"", recovery_steps[i]);
  assert_true (kills >= rounds);
  unlink (cold_path);
  munmap (shadow, sizeof *shadow);
  munmap (recovery_kill, sizeof *recovery_kill);
}

/* ---- the cold tier's map after a crash ------------------------------------ */

/* A space map in a region, as a crash leaves it: run a reached by an
 * entry, run b taken by a writeback the crash cut short (no entry), c
 * quarantined, and a quarantine count a crash inside a merge left wrong.
 * The recovery keeps a, refuses a second reach of it and a reach of a
 * free run, keeps c quarantined, recounts the quarantine, and
 * quarantines b (keep_unreached: an NBD export) or frees it (a file).
 */
static void
cold_map_recovery (bool keep_unreached)
{
  const uint64_t run = 8 * SPACE_MAP_SECTOR;
  struct region_owner *owner = region_create (region_path ("cold-map"),
                                              64u << 20, DEVICE, false);
  assert_non_null (owner);
  struct region *region = owner->region;
  struct space_map *map = region_alloc (region, sizeof *map, 16);
  assert_non_null (map);
  assert_int_equal (space_map_init (map, 2 * SPACE_MAP_LEAF_SECTORS, region),
                    0);
  bool stopped;
  int64_t a = space_map_take (map, run, &stopped);
  int64_t b = space_map_take (map, run, &stopped);
  int64_t c = space_map_take (map, run, &stopped);
  int64_t never = space_map_take (map, run, &stopped);
  assert_true (a >= 0 && b >= 0 && c >= 0 && never >= 0);
  space_map_free (map, never, run);
  space_map_quarantine (map, c, run);
  map->quarantined_bytes = 12345;

  region_recover_begin (region);
  assert_true (region_recover_claim (region, map, sizeof *map, 16));
  struct space_map_recovery *recovery = space_map_recover_begin (map);
  assert_non_null (recovery);
  assert_true (space_map_recover_run (recovery, a, run));
  assert_false (space_map_recover_run (recovery, a, run));     /* twice */
  assert_false (space_map_recover_run (recovery, never, run));  /* free */
  region_recover_end (region);
  space_map_recover_end (recovery, keep_unreached);

  struct space_map_stats stats;
  space_map_stats (map, &stats);
  assert_int_equal (stats.used, (keep_unreached ? 3 : 2) * run);
  assert_int_equal (stats.quarantined_bytes, (keep_unreached ? 2 : 1) * run);
  assert_true (space_map_quarantined (map, c, run));
  assert_int_equal (space_map_quarantined (map, b, run), keep_unreached);
  /* It serves on: a new run is none of the kept ones. */
  int64_t d = space_map_take (map, run, &stopped);
  assert_true (d >= 0 && d != a && d != c && (!keep_unreached || d != b));
  space_map_destroy (map);
  region_free (region, map);
  assert_int_equal (region->pages_taken, 0);
  region_destroy (owner);
}

static void
test_cold_map_recovery (void **state)
{
  (void) state;
  cold_map_recovery (true);
  cold_map_recovery (false);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_handover_mix),
    cmocka_unit_test (test_take_over_refused),
    cmocka_unit_test (test_cold_map_recovery),
    cmocka_unit_test (test_kill_points),
    cmocka_unit_test (test_devices_kill_points),
    cmocka_unit_test (test_recovery_kill_points),
  };
  int failed = cmocka_run_group_tests (tests, NULL, NULL);
  region_folder_remove ();
  return failed;
}
