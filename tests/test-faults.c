/* The fault sweep: each failure point a workload reaches, failed at each
 * of its calls in turn (tests/fault-inject.h).
 *
 * The workload is what a user does to a device, from one thread so that
 * every run makes the same calls: create the store (and its backing
 * file), write (compressible, incompressible, same-filled and zero
 * blocks, one block and several), partial writes, reads, trims, zeroes
 * with and without may-trim, compaction, idle marking, recompression,
 * packing, reads and writes of packed blocks, writeback, reads of
 * written-back blocks (and readback), the release of idle memory.  Three
 * stores run it: lz4 with a backing memfd, zstd under a mem_limit, and
 * lz4 with an O_DIRECT backing file in TMPDIR (skipped where the file
 * system refuses O_DIRECT).
 *
 * First a clean run counts the calls of every point.  Then, for each
 * point and each n up to its count, a run fails the nth call and checks:
 *   - the call was failed (the sweep really reached it);
 *   - the request that met the failure failed with ENOMEM, ENOSPC or EIO
 *     and changed nothing it should not have: a failed write leaves each
 *     block as it was or as written (one block: as it was), a failed read
 *     or background step changes nothing;
 *   - every other request did what it should: after the run every block
 *     reads back as a shadow disk says;
 *   - the counters are exact: failed_reads and failed_writes count the
 *     requests that failed, orig_data_size and bd_count match a walk of
 *     the blocks, and trimming everything leaves nothing stored;
 *   - the store keeps serving: every block is written and read again.
 * Creation itself may fail (ENOMEM): then nothing is left behind
 * (ASan's leak check and valgrind see to that).
 *
 * Last, damage: FAULT_CORRUPT flips bits of a stored object; reading its
 * block fails with EIO, counted in failed_reads, and no other block is
 * touched; rewriting the block heals it.
 *
 * FAULT_STRIDE=N (environment) tries every Nth call only, for slow
 * builds; the default is every call.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backing.h"
#include "block-store.h"
#include "store-walk.h"
#include "fault-inject.h"
#include "xorshift.h"

#define BS STORE_BLOCK_SIZE
#define BLOCKS 40                       /* whole blocks, then a tail */
#define TAIL 1000
#define DEVICE_SIZE ((uint64_t) BLOCKS * BS + TAIL)
#define ALL_BLOCKS (BLOCKS + 1)

static void
check_at (bool condition, const char *what, int line)
{
  if (!condition) {
    fprintf (stderr, "test-faults: line %d: check failed: %s\n", line, what);
    abort ();
  }
}
#define check(condition) check_at ((condition), #condition, __LINE__)

/* One configuration of the store the workload runs on. */
struct setup {
  const char *name;
  enum codec_algorithm algorithm;
  bool backing;                 /* a backing file (memfd) and readback */
  uint64_t mem_limit;           /* 0: none */
  bool direct;                  /* the backing file in TMPDIR, O_DIRECT */
};

/* What a run of the workload saw. */
struct run {
  const struct setup *setup;
  struct block_store *store;
  int memfd;
  unsigned char shadow[ALL_BLOCKS][BS];
  uint64_t failed_reads, failed_writes; /* requests that failed */
  uint64_t failures;                    /* of any kind */
};

/* A request failed: only for want of memory or with an I/O error. */
static void
failed (struct run *run)
{
  check (errno == ENOMEM || errno == ENOSPC || errno == EIO);
  run->failures++;
}

static uint64_t
block_bytes (uint64_t block)
{
  return block == BLOCKS ? TAIL : BS;
}

/* Block contents by kind: compressible text, incompressible noise, one
 * byte repeated (same-filled), zeros.
 */
static void
make_block (unsigned char *out, unsigned kind, unsigned seed)
{
  uint64_t rng = seed * 0x9E3779B97F4A7C15ull | 1;
  switch (kind % 4) {
  case 0:
    for (unsigned i = 0; i < BS; i++)
      out[i] = "the quick brown fox "[(i + seed) % 20] ^ (i / 700 == seed % 6);
    break;
  case 1:
    for (unsigned i = 0; i < BS; i += 8) {
      uint64_t word = xorshift64 (&rng);
      memcpy (out + i, &word, 8);
    }
    break;
  case 2:
    memset (out, 0x40 + seed % 64, BS);
    break;
  default:
    memset (out, 0, BS);
  }
}

/* The shadow of [offset, offset + count) becomes data (NULL: zeros). */
static void
shadow_write (struct run *run, uint64_t offset, uint64_t count,
              const unsigned char *data)
{
  unsigned char *disk = &run->shadow[0][0];
  if (data)
    memcpy (disk + offset, data, count);
  else
    memset (disk + offset, 0, count);
}

/* After a failed write of data (NULL: zeros) to [offset, offset+count):
 * each block must be whole, as it was or as written; a write within one
 * block must have left it as it was.  The shadow takes what is there.
 */
static void
settle_failed_write (struct run *run, uint64_t offset, uint64_t count,
                     const unsigned char *data)
{
  static const unsigned char zeros[8 * BS];
  unsigned char got[BS];
  uint64_t first = offset / BS, last = (offset + count - 1) / BS;
  if (!data)
    data = zeros;
  for (uint64_t b = first; b <= last; b++) {
    uint64_t bytes = block_bytes (b);
    check (store_read (run->store, got, bytes, b * BS) == 0);
    unsigned char written[BS];
    memcpy (written, run->shadow[b], bytes);
    uint64_t from = b * BS > offset ? b * BS : offset;
    uint64_t to = b * BS + bytes < offset + count ? b * BS + bytes
      : offset + count;
    memcpy (written + (from - b * BS), data + (from - offset), to - from);
    bool old = memcmp (got, run->shadow[b], bytes) == 0;
    bool new = memcmp (got, written, bytes) == 0;
    check (old || (new && first != last));
    memcpy (run->shadow[b], got, bytes);
  }
}

static void
do_write (struct run *run, uint64_t offset, uint64_t count,
          const unsigned char *data)
{
  if (store_write (run->store, data, count, offset) == 0)
    shadow_write (run, offset, count, data);
  else {
    failed (run);
    run->failed_writes++;
    settle_failed_write (run, offset, count, data);
  }
}

static void
do_zero (struct run *run, uint64_t offset, uint64_t count, bool may_trim)
{
  if (store_zero (run->store, count, offset, may_trim) == 0)
    shadow_write (run, offset, count, NULL);
  else {
    failed (run);
    run->failed_writes++;
    settle_failed_write (run, offset, count, NULL);
  }
}

static void
do_trim (struct run *run, uint64_t offset, uint64_t count)
{
  check (store_trim (run->store, count, offset) == 0);
  for (uint64_t b = (offset + BS - 1) / BS; (b + 1) * BS <= offset + count; b++)
    memset (run->shadow[b], 0, BS);
}

/* Read [offset, offset+count) and compare it with the shadow, unless the
 * read failed (by injection: then it is counted).
 */
static void
do_read (struct run *run, uint64_t offset, uint64_t count)
{
  static unsigned char got[ALL_BLOCKS * BS];
  if (store_read (run->store, got, count, offset) == -1) {
    failed (run);
    run->failed_reads++;
    return;
  }
  check (memcmp (got, &run->shadow[0][0] + offset, count) == 0);
}

static void
read_all (struct run *run)
{
  for (uint64_t b = 0; b < ALL_BLOCKS; b++)
    do_read (run, b * BS, block_bytes (b));
}

/* Background steps: their failures are the store's to absorb. */
static void
background (struct run *run, int r)
{
  if (r == -1)
    failed (run);
}

static struct block_store *
open_store (struct run *run)
{
  const struct setup *setup = run->setup;
  struct store_config config = {
    .size = DEVICE_SIZE,
    .algorithm = setup->algorithm, .level = 1,
    .recomp_count = 1, .recomp = { { CODEC_ZSTD, 9 } },
    .pack_blocks = 4,
    .writeback_batch = 4,
  };
  zs_pool_config_init (&config.pool);
  config.pool.mem_limit = setup->mem_limit;
  run->memfd = -1;
  if (setup->backing) {
    /* A memfd, or for O_DIRECT (which memfds refuse) a file in TMPDIR
     * that is gone from the directory once open.
     */
    char path[4096], *error = NULL;
    if (setup->direct) {
      const char *dir = getenv ("TMPDIR") ? getenv ("TMPDIR") : "/tmp";
      snprintf (path, sizeof path, "%s/test-faults.XXXXXX", dir);
      run->memfd = mkstemp (path);
    }
    else {
      run->memfd = memfd_create ("test-faults", MFD_CLOEXEC);
      snprintf (path, sizeof path, "/proc/self/fd/%d", run->memfd);
    }
    check (run->memfd >= 0);
    config.backing = backing_open (path, 2 * DEVICE_SIZE, setup->direct, 30,
                                   &error);
    if (setup->direct)
      unlink (path);
    if (!config.backing) {
      check (error != NULL);
      free (error);
      failed (run);
      return NULL;
    }
    config.readback_below = UINT64_MAX;
  }
  struct block_store *store = store_create (&config);
  if (!store)
    failed (run);
  return store;
}

/* The workload.  Returns false if the store could not be created. */
static bool
workload (struct run *run)
{
  unsigned char data[8 * BS];
  struct block_store *store;

  memset (run->shadow, 0, sizeof run->shadow);
  run->failed_reads = run->failed_writes = run->failures = 0;
  if (!(run->store = store = open_store (run)))
    return false;

  /* Fill: one block at a time, every kind. */
  for (unsigned b = 0; b < BLOCKS; b++) {
    make_block (data, b, b);
    do_write (run, (uint64_t) b * BS, BS, data);
  }
  make_block (data, 0, 99);
  do_write (run, (uint64_t) BLOCKS * BS, TAIL, data);
  /* Several blocks in one request. */
  for (unsigned i = 0; i < 8; i++)
    make_block (data + i * BS, i % 3 == 2 ? 1 : 0, 50 + i);
  do_write (run, 30 * BS, 8 * BS, data);
  read_all (run);

  /* Partial writes: into compressed, raw, same-filled, empty blocks and
   * across two blocks.
   */
  make_block (data, 1, 7);
  do_write (run, 4 * BS + 100, 200, data);
  do_write (run, 5 * BS + 4000, 96, data);
  do_write (run, 6 * BS + 1, 10, data);
  do_write (run, 10 * BS + 3000, 2000, data);
  do_trim (run, 13 * BS, BS);
  do_write (run, 13 * BS + 512, 512, data);

  /* Trims, zeroes. */
  do_trim (run, 14 * BS + 10, 3 * BS);
  do_zero (run, 18 * BS, 2 * BS, true);
  do_zero (run, 20 * BS, 2 * BS, false);
  do_zero (run, 22 * BS + 10, 50, false);
  do_zero (run, 23 * BS + 4000, 200, true);
  read_all (run);
  store_compact (store);
  store_flush (store);

  /* Recompression and packing of idle blocks; reads and writes of packed
   * blocks; units dissolved when most of their blocks have gone.
   */
  store_mark_idle (store, 0, NULL, NULL);
  struct store_recompress_request recompress = { .type = RECOMPRESS_HUGE_IDLE };
  struct store_recompress_result recompressed;
  background (run, store_recompress (store, &recompress, NULL, NULL,
                                     &recompressed));
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result packed;
  background (run, store_pack (store, 0, 0, NULL, NULL, &packed));
  do_read (run, 0, 2 * BS);
  do_read (run, 8 * BS, BS);
  do_write (run, 8 * BS + 300, 300, data);
  do_trim (run, 24 * BS, 2 * BS);
  store_pack_dissolve (store, 75, NULL, NULL);
  read_all (run);

  /* Writeback, reads of written-back blocks (readback), and writes and
   * trims of them.
   */
  if (run->setup->backing) {
    store_mark_idle (store, 0, NULL, NULL);
    struct store_writeback_request writeback = {
      .type = WRITEBACK_IDLE, .first = 0, .last = UINT64_MAX,
    };
    struct store_writeback_result written;
    background (run, store_writeback (store, &writeback, NULL, NULL, &written));
    do_read (run, 28 * BS, 4 * BS);
    make_block (data, 0, 3);
    do_write (run, 33 * BS, BS, data);
    do_write (run, 34 * BS + 7, 7, data);
    do_trim (run, 35 * BS, BS);
  }

  store_release_idle_memory (store);
  store_compact (store);
  store_flush (store);
  return true;
}

/* After a run, with nothing armed: every block, the counters, and a store
 * that still serves every request, then gives everything back.
 */
static void
check_after (struct run *run)
{
  struct block_store *store = run->store;
  struct store_stats stats;

  read_all (run);
  store_stats (store, &stats);
  check (stats.failed_reads == run->failed_reads);
  check (stats.failed_writes == run->failed_writes);
  struct store_walk walk;
  check (store_walk (store, &walk) == 0);
  check (stats.orig_data_size == walk.stored * BS);
  check (stats.bd_count == walk.written_back);

  unsigned char data[BS];
  for (unsigned b = 0; b < BLOCKS; b++) {
    make_block (data, b + 1, b + 1000);
    check (store_write (store, data, BS, (uint64_t) b * BS) == 0);
    shadow_write (run, (uint64_t) b * BS, BS, data);
  }
  uint64_t reads = run->failed_reads;
  read_all (run);
  check (run->failed_reads == reads);

  check (store_trim (store, DEVICE_SIZE, 0) == 0);
  check (store_zero (store, TAIL, (uint64_t) BLOCKS * BS, true) == 0);
  store_flush (store);
  store_stats (store, &stats);
  if (getenv ("FAULT_DEBUG"))
    fprintf (stderr, "orig %" PRIu64 " compr %" PRIu64 " bd %" PRIu64
             " backing %" PRIu64 " packed %" PRIu64 " units %" PRIu64 "\n",
             stats.orig_data_size, stats.compr_data_size, stats.bd_count,
             stats.backing_used, stats.packed_blocks, stats.pack_units);
  check (stats.orig_data_size == 0 && stats.compr_data_size == 0
         && stats.bd_count == 0 && stats.backing_used == 0
         && stats.packed_blocks == 0 && stats.pack_units == 0);
}

static void
close_run (struct run *run)
{
  if (run->store)
    store_destroy (run->store);
  run->store = NULL;
  if (run->memfd >= 0)
    close (run->memfd);
  run->memfd = -1;
}

static struct run run;           /* static: the shadow is 164 KiB */

/* Every point the workload reaches, failed at each call in turn. */
static void
sweep (const struct setup *setup, unsigned stride)
{
  uint64_t reached[FAULT_POINTS];

  run.setup = setup;
  fault_reset ();
  if (setup->direct && !workload (&run)) {
    /* The file system refuses O_DIRECT (tmpfs): nothing to sweep. */
    printf ("%s: skipped: no O_DIRECT backing file in TMPDIR\n", setup->name);
    close_run (&run);
    return;
  }
  if (!setup->direct)
    check (workload (&run));
  check (run.failures == 0);
  for (int point = 0; point < FAULT_POINTS; point++)
    reached[point] = fault_calls (point);
  check_after (&run);
  close_run (&run);

  uint64_t runs = 0, failures = 0, creation_failures = 0;
  for (int point = 0; point < FAULT_POINTS; point++) {
    if (point == FAULT_CORRUPT || reached[point] == 0)
      continue;
    for (uint64_t nth = 1; nth <= reached[point]; nth += stride) {
      fault_reset ();
      fault_arm (point, nth);
      if (workload (&run)) {
        fault_arm (point, 0);
        check_after (&run);
      }
      else
        creation_failures++;
      if (fault_injected () != 1) {
        fprintf (stderr, "test-faults: %s: %s call %" PRIu64 " of %" PRIu64
                 " was not reached\n", setup->name, fault_point_name (point),
                 nth, reached[point]);
        abort ();
      }
      failures += run.failures;
      close_run (&run);
      runs++;
    }
    printf ("%s: %-28s %5" PRIu64 " calls\n", setup->name,
            fault_point_name (point), reached[point]);
  }
  printf ("%s: %" PRIu64 " runs, %" PRIu64 " requests or steps failed, %"
          PRIu64 " creations failed, all checks passed\n",
          setup->name, runs, failures, creation_failures);
}

/* Damage: the nth decompression reads a corrupted object. */
static void
corruption (enum codec_algorithm algorithm, bool pack)
{
  struct setup setup = { "corruption", algorithm, false, 0, false };
  struct block_store *store;
  unsigned char data[BS], got[BS];

  run.setup = &setup;
  fault_reset ();
  check ((store = run.store = open_store (&run)) != NULL);
  for (unsigned b = 0; b < 16; b++) {
    make_block (data, 0, b);
    check (store_write (store, data, BS, (uint64_t) b * BS) == 0);
  }
  if (pack) {
    store_mark_idle (store, 0, NULL, NULL);
    struct store_pack_result packed;
    check (store_pack (store, 0, 0, NULL, NULL, &packed) == 0);
    check (packed.blocks == 16);
  }

  /* The third decoding from now reads a damaged object; packed, the
   * second unit decoded: block 0 decodes the unit's first step (4
   * blocks), block 4 the rest, from the start.
   */
  fault_reset ();
  fault_arm (FAULT_CORRUPT, pack ? 2 : 3);
  uint64_t failed_blocks = 0;
  unsigned first_failed = 16;
  for (unsigned b = 0; b < 16; b++) {
    make_block (data, 0, b);
    if (store_read (store, got, BS, (uint64_t) b * BS) == -1) {
      check (errno == EIO);
      if (failed_blocks++ == 0)
        first_failed = b;
    }
    else
      check (memcmp (got, data, BS) == 0);
  }
  check (fault_injected () == 1);
  /* The block whose read met the damage fails first.  Packed, the unit
   * is decoded from its objects where they lie, so the damage may stay
   * (or go with the copy of an object that spans two pages): blocks of
   * the unit read after it may fail too (none was cached by the failed
   * decode), always with EIO, never with wrong bytes.
   */
  check (first_failed == (pack ? 4 : 2));
  check (pack ? failed_blocks >= 1 : failed_blocks == 1);
  struct store_stats stats;
  store_stats (store, &stats);
  check (stats.failed_reads == failed_blocks);

  /* Rewritten, it reads back; the others never changed. */
  for (unsigned b = 0; b < 16; b++) {
    make_block (data, 0, b);
    if (store_read (store, got, BS, (uint64_t) b * BS) == -1) {
      check (store_write (store, data, BS, (uint64_t) b * BS) == 0);
      check (store_read (store, got, BS, (uint64_t) b * BS) == 0);
    }
    check (memcmp (got, data, BS) == 0);
  }
  close_run (&run);
  printf ("corruption (%s%s): %" PRIu64 " block(s) failed with EIO, "
          "the others intact\n", algorithm == CODEC_LZ4 ? "lz4" : "zstd",
          pack ? ", packed" : "", failed_blocks);
}

int
main (void)
{
  setvbuf (stdout, NULL, _IOLBF, 0);
  const char *env = getenv ("FAULT_STRIDE");
  unsigned stride = env && atoi (env) > 0 ? atoi (env) : 1;
  static const struct setup setups[] = {
    { "lz4+backing", CODEC_LZ4, true, 0, false },
    { "zstd+limit", CODEC_ZSTD, false, 256 * 1024, false },
    { "lz4+direct", CODEC_LZ4, true, 0, true },
  };
  for (size_t i = 0; i < sizeof setups / sizeof setups[0]; i++)
    sweep (&setups[i], stride);
  corruption (CODEC_LZ4, false);
  corruption (CODEC_ZSTD, false);
  corruption (CODEC_LZ4, true);
  return 0;
}
