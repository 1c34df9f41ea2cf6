/* A store in a region handed from one process to the next (HANDOVER in
 * store/block-store.h): a child fills it with every kind of block a
 * device holds - compressed, raw, same-filled, partly written, partly
 * zeroed, trimmed, packed in units and units half dissolved - against an
 * exact shadow in memory both processes share, hands it over and exits;
 * the parent takes it over and compares every byte of the device with
 * the shadow, the counters with the child's and with a walk, serves on
 * (writes, packing) and destroys it with no page of the region left
 * taken.  A server configured for another device is refused, and the
 * store is untouched by the refusal.
 */

#include "store-fixture.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "region.h"

#define DEVICE (16ull << 20)
#define BLOCKS (DEVICE / BS)
#define REGION_BYTES (128ull << 20)

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

/* A region file's path in a folder of this run's own. */
static char folder[64];

static const char *
region_path (const char *name)
{
  static char path[128];
  if (!folder[0]) {
    strcpy (folder, "/tmp/test-store-handover-XXXXXX");
    assert_non_null (mkdtemp (folder));
  }
  snprintf (path, sizeof path, "%s/%s", folder, name);
  return path;
}

/* In a child: the region at path, the store filled and packed, handed
 * over.
 */
static void
store_filled_in_child (struct shared *shared, const char *path)
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
    struct block_store *store = store_create (&config);
    if (!store)
      _exit (4);
    fill_mix (store, shared, 1);
    pack_and_break (store, shared, 1);
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
  enum region_attach_result how;
  char why[256] = "";
  struct region_owner *owner = region_attach (path, DEVICE, &how, why,
                                              sizeof why);
  if (!owner)
    fail_msg ("region_attach: %s", why);
  assert_int_equal (how, REGION_ATTACH_CLEAN);
  region_start_serving (owner);
  return owner;
}

static void
test_handover_mix (void **state)
{
  (void) state;
  struct shared *shared = shared_make ();
  const char *path = region_path ("mix");
  store_filled_in_child (shared, path);
  struct region_owner *owner = attach_clean (path);

  struct store_config config = config_for (owner->region, CODEC_LZ4);
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
  print_message ("handed over: %" PRIu64 " blocks, %" PRIu64 " packed in %"
                 PRIu64 " units, %" PRIu64 " raw, %" PRIu64 " same-filled\n",
                 before->orig_data_size / BS, before->packed_blocks,
                 before->pack_units, before->huge_pages, before->same_pages);
  assert_true (before->packed_blocks > 0 && before->huge_pages > 0
               && before->same_pages > 0);
  struct store_walk walk;
  assert_int_equal (store_walk (store, &walk), 0);
  assert_int_equal (walk.stored * BS, after.orig_data_size);

  /* It serves on: every kind again over the old, packed again. */
  fill_mix (store, shared, 2);
  pack_and_break (store, shared, 2);
  device_matches (store, shared);

  /* Destroyed, it leaves no page of the region taken. */
  store_destroy (store);
  assert_int_equal (owner->region->pages_taken, 0);
  region_destroy (owner);
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
  const char *path = region_path ("refused");
  store_filled_in_child (shared, path);
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

  config = config_for (owner->region, CODEC_LZ4);
  struct block_store *store = store_take_over (owner->region, &config, why,
                                               sizeof why);
  if (!store)
    fail_msg ("store_take_over: %s", why);
  device_matches (store, shared);
  store_destroy (store);
  region_destroy (owner);
  munmap (shared, sizeof *shared);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_handover_mix),
    cmocka_unit_test (test_take_over_refused),
  };
  int failed = cmocka_run_group_tests (tests, NULL, NULL);
  if (folder[0])
    rmdir (folder);             /* empty unless a test failed */
  return failed;
}
