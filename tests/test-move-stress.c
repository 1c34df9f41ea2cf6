/* Background movers never lose a write.
 *
 * Packing, dissolving, recompression, writeback and readback move blocks
 * to new encodings while writers keep writing them (block-store.h,
 * MOVING A BLOCK): a write, trim or zero that lands while a block is
 * being moved must survive the move.  Everything here goes through the
 * public API of block-store.h and backing.h only.
 *
 * A. The windows, one at a time, deterministically.  A mover's slow part
 *    (the compression of a packed unit, the backing write of writeback,
 *    the recompression of one block) is hooked (-Wl,--wrap=
 *    ZSTD_compressCCtx, pwrite): the first call of the armed window runs
 *    an action, then the real call.  The actions are the two ways a block
 *    can change and still look as it did to a mover that compares the
 *    handle and the state word: a block rewritten twice with the free
 *    batches drained between (the second write gets the first handle
 *    back) and a part of it zeroed (rewritten in its own object: same
 *    handle), each followed by store_mark_idle (the idle flag back, the
 *    access time the same second: the clock stands still in these tests).
 *    Afterwards the block must read as the action left it.
 *
 *    The action runs in a thread of its own, and the mover waits for it
 *    at most MOVE_WINDOW_WAIT_MS (5000): a mover that holds the block's
 *    stripe lock through its slow part (recompression did before the
 *    move protocol: it compressed under the lock) would deadlock an
 *    action run in the mover's thread; here the action waits for the
 *    lock, the mover goes on after the wait, and the action lands after
 *    the move, which must not lose it either (the test says which way it
 *    went).  Packing and writeback hold no stripe lock in their slow
 *    part, so there the action must finish inside the window (else the
 *    test would test nothing, and says so).  On the code before the
 *    protocol (a packer that compared handles and state words, c7b2761)
 *    both packing cases fail: the block reads as the packer saw it.
 *    The read window (-Wl,--wrap=pread): a read of a written-back block,
 *    done without its stripe lock, is held in its backing read while the
 *    block is rewritten and a new block written back; the read must
 *    return its block's data (old or new), never the new block's (its
 *    run must not be reused under it), with readback on and off.
 *
 * B. A stress against exact shadows: writer threads own disjoint blocks
 *    (block % WRITERS), so each keeps an exact copy of its blocks without
 *    a lock, and write (compressible, incompressible, same-filled, zero
 *    blocks), patch, trim, zero and zero in part, checking every read
 *    against the copy; batch writers own runs of blocks after theirs and
 *    write runs of 2 to 40 blocks (batched writes, some with partial
 *    ends), trim and zero runs and read them back against their copies; meanwhile mover threads pack, dissolve, recompress,
 *    write back (reads bring blocks back: readback_below), compact, mark
 *    idle, drain the free batches, and move mem_limit close to what is
 *    held and back (writes then meet ENOSPC, and a refused write must
 *    leave the old block).  Windows are widened on purpose: a mover
 *    sleeps inside some of its compressions and backing writes, and its
 *    lock acquisitions (-Wl,--wrap=pthread_mutex_lock) sometimes yield or
 *    sleep.  MOVE_STRESS_SECONDS (default 6) sets its length,
 *    MOVE_STRESS_SKIP (e.g. "pack,writeback") leaves movers out.  At the end
 *    every block is checked, and the counters against a walk.  It prints
 *    what it saw (mismatches, rounds, operations) before it fails.
 *
 * C. Ages at any uptime (-Wl,--wrap=clock_gettime moves the monotonic
 *    clock ahead): blocks written a year or three after the store was
 *    made still age, so idle marking by age tells them apart.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <zstd.h>

#include "block-store.h"
#include "backing.h"
#include "store-walk.h"
#include "xorshift.h"
#include "moved-clock.h"

#define BS STORE_BLOCK_SIZE

static unsigned
env_unsigned (const char *name, unsigned otherwise)
{
  const char *value = getenv (name);
  return value && atoi (value) > 0 ? (unsigned) atoi (value) : otherwise;
}

/* ---- the clock: tests/moved-clock.h ---------------------------------- */

static void
clock_freeze (void)
{
  atomic_store (&clock_frozen_ns, real_now_ns ());
}

static void
clock_thaw (void)
{
  atomic_store (&clock_frozen_ns, 0);
}

/* ---- widening windows ------------------------------------------------- */

/* Per thread: how often (per mille) a lock acquisition pauses before
 * and after it, and whether a pause may sleep (movers) or only yields
 * (writers).  Movers also sleep inside some of their compressions and
 * backing writes (window_sleep below).  0 outside the stress.
 */
static __thread unsigned lock_jitter;
static __thread bool jitter_sleeps;
static __thread bool in_mover;
static __thread uint64_t jitter_rng = 1;

static void
pause_briefly (uint64_t r, bool may_sleep)
{
  if (!may_sleep || r % 4 != 0)
    sched_yield ();
  else {
    struct timespec pause = { 0, 1000 + (long) (r >> 8) % 40000 };
    nanosleep (&pause, NULL);
  }
}

int __real_pthread_mutex_lock (pthread_mutex_t *mutex);
int __wrap_pthread_mutex_lock (pthread_mutex_t *mutex);
int
__wrap_pthread_mutex_lock (pthread_mutex_t *mutex)
{
  if (!lock_jitter)
    return __real_pthread_mutex_lock (mutex);
  uint64_t r = xorshift64 (&jitter_rng);
  if (r % 1000 < lock_jitter)
    pause_briefly (r >> 10, jitter_sleeps);
  int result = __real_pthread_mutex_lock (mutex);
  if ((r >> 32) % 1000 < lock_jitter / 2)
    pause_briefly (r >> 42, false);
  return result;
}

/* In the stress, a mover sleeps inside one in four of its slow parts, up
 * to this long: the writers get many operations in.
 */
static _Atomic unsigned window_sleep_us;

static void
window_sleep (void)
{
  unsigned most = atomic_load (&window_sleep_us);
  if (!in_mover || !most)
    return;
  uint64_t r = xorshift64 (&jitter_rng);
  if (r % 4 == 0) {
    struct timespec pause = { 0, 1000L * (long) (1 + (r >> 8) % most) };
    nanosleep (&pause, NULL);
  }
}

/* ---- the windows of part A --------------------------------------------- */

enum window {
  WINDOW_NONE,
  WINDOW_PACK,                  /* zstd of a unit (more than one block) */
  WINDOW_RECOMPRESS,            /* zstd of the one block window_block */
  WINDOW_WRITEBACK,             /* a write to the backing file */
  WINDOW_READ,                  /* a read of the backing file */
};

static _Atomic int window_armed;
static uint64_t window_block;
static void (*window_action) (void);
static atomic_bool action_finished;
static bool action_started, action_inside;
static pthread_t action_thread;
static unsigned window_wait_ms;

static void *
action_main (void *arg)
{
  (void) arg;
  window_action ();
  atomic_store (&action_finished, true);
  return NULL;
}

/* The mover is in its slow part: if the window is armed, run the action
 * (in a thread of its own) and wait for it, at most window_wait_ms.
 */
static void
window_open (enum window window, const void *src, size_t size)
{
  int armed = atomic_load (&window_armed);
  if (armed != (int) window)
    return;
  if (window == WINDOW_PACK && size <= BS)
    return;
  if (window == WINDOW_RECOMPRESS) {
    uint64_t block;
    if (size != BS)
      return;
    memcpy (&block, src, sizeof block);
    if (block != window_block)
      return;
  }
  if (!atomic_compare_exchange_strong (&window_armed, &armed, WINDOW_NONE))
    return;
  atomic_store (&action_finished, false);
  if (pthread_create (&action_thread, NULL, action_main, NULL) != 0)
    return;
  action_started = true;
  int64_t deadline = real_now_ns () + (int64_t) window_wait_ms * 1000000;
  while (!atomic_load (&action_finished) && real_now_ns () < deadline) {
    struct timespec pause = { 0, 200000 };
    nanosleep (&pause, NULL);
  }
  action_inside = atomic_load (&action_finished);
}

size_t __real_ZSTD_compressCCtx (ZSTD_CCtx *cctx, void *dst, size_t capacity,
                                 const void *src, size_t size, int level);
size_t __wrap_ZSTD_compressCCtx (ZSTD_CCtx *cctx, void *dst, size_t capacity,
                                 const void *src, size_t size, int level);
size_t
__wrap_ZSTD_compressCCtx (ZSTD_CCtx *cctx, void *dst, size_t capacity,
                          const void *src, size_t size, int level)
{
  window_open (size > BS ? WINDOW_PACK : WINDOW_RECOMPRESS, src, size);
  window_sleep ();
  return __real_ZSTD_compressCCtx (cctx, dst, capacity, src, size, level);
}

/* Packing compresses a unit a frame at a time (codec_compress_frames):
 * the window opens at a unit's first frame (it is armed once).
 */
size_t __real_ZSTD_compress2 (ZSTD_CCtx *cctx, void *dst, size_t capacity,
                              const void *src, size_t size);
size_t __wrap_ZSTD_compress2 (ZSTD_CCtx *cctx, void *dst, size_t capacity,
                              const void *src, size_t size);
size_t
__wrap_ZSTD_compress2 (ZSTD_CCtx *cctx, void *dst, size_t capacity,
                       const void *src, size_t size)
{
  /* Frames of a unit of 2 blocks or more: more than a block. */
  window_open (WINDOW_PACK, src, size + BS);
  window_sleep ();
  return __real_ZSTD_compress2 (cctx, dst, capacity, src, size);
}

ssize_t __real_pwrite (int fd, const void *buf, size_t count, off_t offset);
ssize_t __wrap_pwrite (int fd, const void *buf, size_t count, off_t offset);
ssize_t
__wrap_pwrite (int fd, const void *buf, size_t count, off_t offset)
{
  window_open (WINDOW_WRITEBACK, buf, count);
  window_sleep ();
  return __real_pwrite (fd, buf, count, offset);
}

ssize_t __real_pread (int fd, void *buf, size_t count, off_t offset);
ssize_t __wrap_pread (int fd, void *buf, size_t count, off_t offset);
ssize_t
__wrap_pread (int fd, void *buf, size_t count, off_t offset)
{
  window_open (WINDOW_READ, buf, count);
  return __real_pread (fd, buf, count, offset);
}

/* ---- contents ------------------------------------------------------------ */

/* Text-like bytes: words of a small vocabulary in an order fixed by seed
 * (lz4 leaves room that zstd takes: recompression has work).
 */
static void
text_fill (unsigned char *out, size_t length, uint64_t seed)
{
  static const char *const words[] = {
    "alpha ", "beta ", "gamma ", "delta ", "epsilon ", "zeta ", "eta ",
    "theta ", "iota ", "kappa ", "lambda ", "mu ", "nu ", "xi ", "omicron ",
    "pi ", "rho ", "sigma ", "tau ", "upsilon ", "phi ", "chi ", "psi ",
    "omega ", "block ", "store ", "zspage ", "class ", "handle ", "cell ",
  };
  uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
  size_t used = 0;
  while (used < length) {
    const char *word = words[xorshift64 (&rng) % 30];
    size_t n = strlen (word);
    if (n > length - used)
      n = length - used;
    memcpy (out + used, word, n);
    used += n;
  }
}

/* A "shared" block: block and version in its first two words, the same
 * text in every block and version (SHARED_TEXT bytes), then one byte
 * repeated, which depends on block and version.  Every version of a block
 * compresses to the same size (so a rewrite lands in the same size class
 * of the allocator and can get a freed handle back), blocks alike pack
 * well together, and a short zeroed range in the repeated part leaves the
 * block in its size class (so it is rewritten in its own object).
 */
#define SHARED_TEXT 2048
#define SHARED_FILL_FROM (16 + SHARED_TEXT)

static unsigned char shared_text[SHARED_TEXT];
static pthread_once_t shared_text_once = PTHREAD_ONCE_INIT;

static void
shared_text_init (void)
{
  text_fill (shared_text, SHARED_TEXT, 424242);
}

static void
shared_fill (unsigned char *buf, uint64_t block, uint64_t version)
{
  pthread_once (&shared_text_once, shared_text_init);
  memcpy (buf, &block, 8);
  memcpy (buf + 8, &version, 8);
  memcpy (buf + 16, shared_text, SHARED_TEXT);
  memset (buf + SHARED_FILL_FROM, 0x80 | ((block * 7 + version) & 63),
          BS - SHARED_FILL_FROM);
}

static uint64_t
block_word (const unsigned char *buf, unsigned word)
{
  uint64_t value;
  memcpy (&value, buf + 8 * word, 8);
  return value;
}

/* A description of how got differs from want, into text. */
static void
describe_difference (char *text, size_t size, const unsigned char *want,
                     const unsigned char *got)
{
  size_t first = BS, count = 0;
  for (size_t i = 0; i < BS; i++)
    if (want[i] != got[i]) {
      if (first == BS)
        first = i;
      count++;
    }
  snprintf (text, size, "%zu bytes differ, the first at %zu; it reads "
            "words %#" PRIx64 " %#" PRIx64 ", expected %#" PRIx64 " %#"
            PRIx64, count, first, block_word (got, 0), block_word (got, 1),
            block_word (want, 0), block_word (want, 1));
}

/* ---- stores ------------------------------------------------------------ */

/* Packing and dissolving, with keep_going (NULL: to the end). */
static int
pack_idle (struct block_store *store, uint64_t max_blocks,
           bool (*keep_going) (void *opaque), struct store_pack_result *result)
{
  return store_pack (store, max_blocks, 0, keep_going, NULL, result);
}

static uint64_t
pack_dissolve (struct block_store *store, unsigned live_percent,
               bool (*keep_going) (void *opaque))
{
  return store_pack_dissolve (store, live_percent, keep_going, NULL);
}

/* A backing store in RAM: a memfd, opened through /proc/self/fd (or a
 * temporary file, unlinked, if backing_open will not take that).
 */
static struct backing *
open_ram_backing (uint64_t capacity)
{
  char path[64], *error = NULL;
  struct backing *backing = NULL;
  int fd = memfd_create ("test-move-stress", 0);
  if (fd >= 0) {
    snprintf (path, sizeof path, "/proc/self/fd/%d", fd);
    backing = backing_open (path, capacity, false, 30, &error);
    close (fd);
    free (error);
    error = NULL;
  }
  if (!backing) {
    char file[] = "/tmp/test-move-stress-XXXXXX";
    fd = mkstemp (file);
    assert_true (fd >= 0);
    close (fd);
    backing = backing_open (file, capacity, false, 30, &error);
    unlink (file);
    if (!backing)
      fail_msg ("backing_open: %s", error);
  }
  return backing;
}

/* lz4 for writes (so every zstd compression is a mover's), zstd for
 * recompression and packing, a backing store in RAM.
 */
static struct block_store *
make_moving_store (uint64_t blocks, uint64_t readback_below,
                   unsigned pack_blocks)
{
  struct store_config config = {
    .size = blocks * BS, .algorithm = CODEC_LZ4, .level = 1,
    .pack_blocks = pack_blocks,
    /* Two decoded units: readers of packed blocks contend for the slots,
     * replace each other's units and decode without a slot.
     */
    .decode_cache = 2 * (uint64_t) (pack_blocks ? pack_blocks
                                    : STORE_PACK_DEFAULT) * BS,
    .recomp_count = 1, .recomp = { { CODEC_ZSTD, 3 } },
    .backing = open_ram_backing (blocks * BS),
    .readback_below = readback_below,
  };
  zs_pool_config_init (&config.pool);
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  return store;
}

/* What a walk sees, beyond store-walk.h's. */
struct full_walk {
  uint64_t stored, written_back, same, huge_in_ram;
  uint8_t *stored_map;            /* blocks: 1 where stored (or NULL) */
  uint64_t blocks;
};

static int
full_walk_add (void *opaque, const struct store_block_state *s)
{
  struct full_walk *walk = opaque;
  walk->stored++;
  walk->written_back += s->written_back;
  walk->same += s->same;
  walk->huge_in_ram += s->huge && !s->written_back;
  if (walk->stored_map && s->block < walk->blocks)
    walk->stored_map[s->block] = 1;
  return 0;
}

/* The counters against a walk of the blocks; a message, or NULL. */
static const char *
check_counters (struct block_store *store, struct full_walk *walk,
                char *text, size_t size)
{
  struct store_walk simple;
  struct store_stats stats;
  if (store_block_state (store, 0, UINT64_MAX, full_walk_add, walk) == -1
      || store_walk (store, &simple) == -1)
    return "the walk failed";
  store_stats (store, &stats);
  if (simple.stored != walk->stored || simple.written_back != walk->written_back)
    snprintf (text, size, "two walks differ");
  else if (stats.orig_data_size != walk->stored * BS)
    snprintf (text, size, "orig_data_size %" PRIu64 " but the walk finds %"
              PRIu64 " blocks", stats.orig_data_size, walk->stored);
  else if (stats.bd_count != walk->written_back)
    snprintf (text, size, "bd_count %" PRIu64 " but the walk finds %" PRIu64
              " written back", stats.bd_count, walk->written_back);
  else if (stats.same_pages != walk->same)
    snprintf (text, size, "same_pages %" PRIu64 " but the walk finds %" PRIu64,
              stats.same_pages, walk->same);
  else if (stats.huge_pages != walk->huge_in_ram)
    snprintf (text, size, "huge_pages %" PRIu64 " but the walk finds %" PRIu64
              " huge blocks in RAM", stats.huge_pages, walk->huge_in_ram);
  else
    return NULL;
  return text;
}

/* Everything trimmed and flushed: nothing is left anywhere. */
static void
check_empty_after_trim (struct block_store *store, uint64_t blocks)
{
  struct store_stats stats;
  assert_int_equal (store_trim (store, blocks * BS, 0), 0);
  store_flush (store);
  store_stats (store, &stats);
  assert_int_equal (stats.orig_data_size, 0);
  assert_int_equal (stats.compr_data_size, 0);
  assert_int_equal (stats.same_pages, 0);
  assert_int_equal (stats.huge_pages, 0);
  assert_int_equal (stats.packed_blocks, 0);
  assert_int_equal (stats.pack_units, 0);
  assert_int_equal (stats.bd_count, 0);
  assert_int_equal (stats.bd_bytes, 0);
  assert_int_equal (stats.backing_used, 0);
  assert_int_equal (stats.mem_used_total, 0);
  assert_int_equal (stats.table_bytes, 0);
}

/* ---- A: one window at a time ----------------------------------------------- */

enum { WIN_BLOCKS = 16, WIN_X = 5 };
/* The range the zero action clears: 8 bytes of a shared block's text
 * whose zeroing leaves lz4's output exactly as long (1129 bytes), so the
 * block is rewritten in its own object, keeping its size and handle
 * (ranges in the repeated part make it longer: another size class).
 */
enum { ZERO_FROM = 1000, ZERO_LENGTH = 8 };

enum mover_kind { MOVER_PACK, MOVER_WRITEBACK, MOVER_RECOMPRESS };
enum action_kind { ACTION_RECYCLE, ACTION_ZERO };

struct window_case {
  enum mover_kind mover;
  enum action_kind action;
  const char *name;
};

static struct block_store *action_store;
static const char *action_failure;

/* Write X twice, draining the free batches between, so that the second
 * write gets back the handle the block had when the mover read it; then
 * mark everything idle again (the idle flag as the mover saw it).
 */
static void
action_recycle (void)
{
  unsigned char buf[BS];
  shared_fill (buf, WIN_X, 2);
  if (store_write (action_store, buf, BS, WIN_X * BS) == -1)
    action_failure = "the first rewrite failed";
  store_flush (action_store);
  shared_fill (buf, WIN_X, 3);
  if (store_write (action_store, buf, BS, WIN_X * BS) == -1)
    action_failure = "the second rewrite failed";
  store_mark_idle (action_store, 0, NULL, NULL);
}

/* Zero part of X: rewritten in its own object (the same handle). */
static void
action_zero (void)
{
  if (store_zero (action_store, ZERO_LENGTH, WIN_X * BS + ZERO_FROM, false)
      == -1)
    action_failure = "the partial zero failed";
  store_mark_idle (action_store, 0, NULL, NULL);
}

static void
test_window (void **state)
{
  const struct window_case *c = *state;
  static const char *const movers[] = { "packing", "writeback", "recompression" };
  unsigned char buf[BS], want[BS];
  char text[256];

  window_wait_ms = env_unsigned ("MOVE_WINDOW_WAIT_MS", 5000);
  clock_freeze ();
  struct block_store *store = make_moving_store (64, 0, 0);
  for (uint64_t b = 0; b < WIN_BLOCKS; b++) {
    shared_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  assert_int_equal (store_mark_idle (store, 0, NULL, NULL), WIN_BLOCKS);

  action_store = store;
  action_failure = NULL;
  action_started = action_inside = false;
  window_action = c->action == ACTION_RECYCLE ? action_recycle : action_zero;
  window_block = WIN_X;
  enum window window = c->mover == MOVER_PACK ? WINDOW_PACK
    : c->mover == MOVER_WRITEBACK ? WINDOW_WRITEBACK : WINDOW_RECOMPRESS;
  atomic_store (&window_armed, window);

  uint64_t moved = 0;
  int r;
  switch (c->mover) {
  case MOVER_PACK: {
    struct store_pack_result result;
    r = pack_idle (store, 0, NULL, &result);
    moved = result.blocks;
    break;
  }
  case MOVER_WRITEBACK: {
    struct store_writeback_request request = {
      .type = WRITEBACK_IDLE, .first = 0, .last = UINT64_MAX,
    };
    struct store_writeback_result result;
    r = store_writeback (store, &request, NULL, NULL, &result);
    moved = result.blocks;
    break;
  }
  default: {
    struct store_recompress_request request = { .type = RECOMPRESS_IDLE };
    struct store_recompress_result result;
    r = store_recompress (store, &request, NULL, NULL, &result);
    moved = result.recompressed;
    break;
  }
  }
  atomic_store (&window_armed, WINDOW_NONE);
  if (action_started)
    pthread_join (action_thread, NULL);
  assert_int_equal (r, 0);
  print_message ("%s window, %s: the action %s; %" PRIu64 " blocks moved\n",
                 movers[c->mover], c->name,
                 !action_started ? "never ran"
                 : action_inside ? "ran inside the window"
                 : "waited for the mover (it holds the block's lock)", moved);
  if (!action_started)
    fail_msg ("the %s window never opened: the mover no longer compresses "
              "with ZSTD_compressCCtx or writes with pwrite (update the "
              "wraps)", movers[c->mover]);
  if (action_failure)
    fail_msg ("%s", action_failure);
  if (c->mover != MOVER_RECOMPRESS && !action_inside)
    fail_msg ("the action did not finish in %u ms inside the %s window: "
              "the mover holds something a write needs during its slow part",
              window_wait_ms, movers[c->mover]);
  assert_true (moved > 0);

  /* X reads as the action left it; the others as they were. */
  unsigned lost = 0;
  for (uint64_t b = 0; b < WIN_BLOCKS; b++) {
    shared_fill (want, b, 1);
    if (b == WIN_X && c->action == ACTION_RECYCLE)
      shared_fill (want, b, 3);
    else if (b == WIN_X)
      memset (want + ZERO_FROM, 0, ZERO_LENGTH);
    assert_int_equal (store_read (store, buf, BS, b * BS), 0);
    if (memcmp (buf, want, BS) != 0) {
      describe_difference (text, sizeof text, want, buf);
      print_message ("LOST WRITE (%s window, %s): block %" PRIu64 ": %s\n",
                     movers[c->mover], c->name, b, text);
      lost++;
    }
  }
  if (lost)
    fail_msg ("%u block(s) lost what was written while %s moved them",
              lost, movers[c->mover]);

  struct full_walk walk = { 0 };
  const char *wrong = check_counters (store, &walk, text, sizeof text);
  if (wrong)
    fail_msg ("%s", wrong);
  assert_int_equal (walk.stored, WIN_BLOCKS);
  check_empty_after_trim (store, 64);
  store_destroy (store);
  clock_thaw ();
}

static const struct window_case window_cases[] = {
  { MOVER_PACK, ACTION_RECYCLE, "recycled handle" },
  { MOVER_PACK, ACTION_ZERO, "partial zero in place" },
  { MOVER_WRITEBACK, ACTION_RECYCLE, "recycled handle" },
  { MOVER_WRITEBACK, ACTION_ZERO, "partial zero in place" },
  { MOVER_RECOMPRESS, ACTION_RECYCLE, "recycled handle" },
  { MOVER_RECOMPRESS, ACTION_ZERO, "partial zero in place" },
};

/* A read of a written-back block runs without the block's stripe lock
 * (backing.h, READS AND RELEASES).  Inside its backing read, the action
 * rewrites the block (its run is released) and writes back a new block
 * (which takes the first free run): the read must still return the
 * block's own data, old or new, never the new block's, and the action
 * must get through while the read waits.  With readback, the read's claim
 * is broken by the rewrite and its commit refused.
 */
enum { READ_NEW = 40 };

static void
action_rewrite_and_write_back (void)
{
  unsigned char buf[BS];
  shared_fill (buf, WIN_X, 2);
  if (store_write (action_store, buf, BS, WIN_X * BS) == -1)
    action_failure = "the rewrite failed";
  shared_fill (buf, READ_NEW, 1);
  if (store_write (action_store, buf, BS, READ_NEW * BS) == -1)
    action_failure = "the new block's write failed";
  struct store_writeback_request request = {
    .type = WRITEBACK_ANY, .first = READ_NEW, .last = READ_NEW,
  };
  struct store_writeback_result result;
  if (store_writeback (action_store, &request, NULL, NULL, &result) == -1
      || result.blocks != 1)
    action_failure = "the new block was not written back";
}

static void
test_read_window (void **state)
{
  uint64_t readback_below = (uintptr_t) *state;
  unsigned char buf[BS], old_data[BS], new_data[BS];

  window_wait_ms = env_unsigned ("MOVE_WINDOW_WAIT_MS", 5000);
  struct block_store *store = make_moving_store (64, readback_below, 0);
  for (uint64_t b = 0; b < WIN_BLOCKS; b++) {
    shared_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
  struct store_writeback_request all = {
    .type = WRITEBACK_ANY, .first = 0, .last = UINT64_MAX,
  };
  struct store_writeback_result result;
  assert_int_equal (store_writeback (store, &all, NULL, NULL, &result), 0);
  assert_int_equal (result.blocks, WIN_BLOCKS);

  action_store = store;
  action_failure = NULL;
  action_started = action_inside = false;
  window_action = action_rewrite_and_write_back;
  atomic_store (&window_armed, WINDOW_READ);
  int r = store_read (store, buf, BS, WIN_X * BS);
  atomic_store (&window_armed, WINDOW_NONE);
  if (action_started)
    pthread_join (action_thread, NULL);
  assert_int_equal (r, 0);
  print_message ("read window (readback %s): the action %s\n",
                 readback_below ? "on" : "off",
                 !action_started ? "never ran"
                 : action_inside ? "ran inside the read"
                 : "waited for the read (it holds the block's lock)");
  if (!action_started)
    fail_msg ("the read window never opened (backing reads no longer use "
              "pread: update the wrap)");
  if (action_failure)
    fail_msg ("%s", action_failure);
  if (!action_inside)
    fail_msg ("the rewrite waited for the backing read: the read holds the "
              "block's stripe lock through its backing I/O");
  shared_fill (old_data, WIN_X, 1);
  shared_fill (new_data, WIN_X, 2);
  if (memcmp (buf, old_data, BS) != 0 && memcmp (buf, new_data, BS) != 0) {
    char text[256];
    describe_difference (text, sizeof text, old_data, buf);
    fail_msg ("the read returned neither version of its block: %s", text);
  }
  /* Afterwards: the rewrite and the new block as written. */
  assert_int_equal (store_read (store, buf, BS, WIN_X * BS), 0);
  assert_memory_equal (buf, new_data, BS);
  shared_fill (new_data, READ_NEW, 1);
  assert_int_equal (store_read (store, buf, BS, READ_NEW * BS), 0);
  assert_memory_equal (buf, new_data, BS);
  for (uint64_t b = 0; b < WIN_BLOCKS; b++) {
    shared_fill (old_data, b, b == WIN_X ? 2 : 1);
    assert_int_equal (store_read (store, buf, BS, b * BS), 0);
    assert_memory_equal (buf, old_data, BS);
  }
  char text[256];
  struct full_walk walk = { 0 };
  const char *wrong = check_counters (store, &walk, text, sizeof text);
  if (wrong)
    fail_msg ("%s", wrong);
  check_empty_after_trim (store, 64);
  store_destroy (store);
}

/* ---- B: the stress ------------------------------------------------------ */

enum { WRITERS = 3, OWNED = 128, STRESS_BLOCKS = WRITERS * OWNED };
/* Batch writers own runs of blocks after the single-block writers'. */
enum { BATCH_WRITERS = 2, BATCH_OWNED = 96,
       ALL_BLOCKS = STRESS_BLOCKS + BATCH_WRITERS * BATCH_OWNED };
enum stored { STORED_NO, STORED_YES, STORED_MAYBE };

static atomic_bool stress_stop;
static _Atomic uint64_t mismatches, mismatches_printed;
static _Atomic uint64_t enospc_writes;
static _Atomic uint64_t unexpected_errors;
static char first_error[256];
static atomic_flag first_error_taken = ATOMIC_FLAG_INIT;

static void
record_error (const char *fmt, ...)
{
  atomic_fetch_add (&unexpected_errors, 1);
  if (atomic_flag_test_and_set (&first_error_taken))
    return;
  va_list args;
  va_start (args, fmt);
  vsnprintf (first_error, sizeof first_error, fmt, args);
  va_end (args);
}

/* The last operations on a block, for the report of a mismatch. */
struct op_record {
  const char *op;
  uint64_t version;
  uint32_t from, length;
  int result;
};
#define HISTORY 4

struct owned_block {
  unsigned char data[BS];       /* what it must read as */
  enum stored stored;
  uint64_t version;
  struct op_record history[HISTORY];
  unsigned next;
};

struct writer {
  struct block_store *store;
  unsigned id;
  uint64_t seed;
  struct owned_block *blocks;   /* OWNED; block = local * WRITERS + id */
  uint64_t operations, reads, checks;
  pthread_t thread;
};

static void
remember (struct owned_block *o, const char *op, uint64_t from,
          uint64_t length, int result)
{
  o->history[o->next++ % HISTORY] = (struct op_record) {
    op, o->version, (uint32_t) from, (uint32_t) length, result,
  };
}

/* Read a block and hold it against its copy; a mismatch is counted,
 * reported (the first few) and taken as the new copy, so that one lost
 * write counts once.
 */
static void
check_block (struct writer *w, unsigned local, const char *when)
{
  struct owned_block *o = &w->blocks[local];
  uint64_t block = (uint64_t) local * WRITERS + w->id;
  unsigned char got[BS];
  w->reads++;
  if (store_read (w->store, got, BS, block * BS) == -1) {
    record_error ("writer %u: read of block %" PRIu64 " failed: %s", w->id,
                  block, strerror (errno));
    return;
  }
  w->checks++;
  if (memcmp (got, o->data, BS) == 0)
    return;
  atomic_fetch_add (&mismatches, 1);
  if (atomic_fetch_add (&mismatches_printed, 1) < 8) {
    char text[256], ops[512];
    size_t used = 0;
    describe_difference (text, sizeof text, o->data, got);
    ops[0] = 0;
    for (unsigned i = 0; i < HISTORY; i++) {
      const struct op_record *h = &o->history[(o->next + i) % HISTORY];
      if (h->op && used < sizeof ops)
        used += snprintf (ops + used, sizeof ops - used,
                          "%s%s v%" PRIu64 " [%" PRIu32 ",+%" PRIu32 ")%s",
                          used ? ", " : "", h->op, h->version, h->from,
                          h->length, h->result ? " failed" : "");
    }
    fprintf (stderr, "MISMATCH (%s) block %" PRIu64 ": %s; last operations, "
             "oldest first: %s\n", when, block, text, ops);
  }
  memcpy (o->data, got, BS);
}

enum content { C_SHARED, C_TEXT, C_RANDOM, C_SAME, C_ZERO };

static enum content
content_fill (unsigned char *buf, uint64_t block, uint64_t version,
              uint64_t r, uint64_t *rng)
{
  unsigned pick = r % 100;
  if (pick < 40) {
    shared_fill (buf, block, version);
    return C_SHARED;
  }
  if (pick < 65) {
    text_fill (buf, BS, block * 1000003 + version);
    memcpy (buf, &block, 8);
    memcpy (buf + 8, &version, 8);
    return C_TEXT;
  }
  if (pick < 80) {
    for (size_t i = 0; i < BS; i += 8) {
      uint64_t x = xorshift64 (rng);
      memcpy (buf + i, &x, 8);
    }
    memcpy (buf, &block, 8);
    memcpy (buf + 8, &version, 8);
    return C_RANDOM;
  }
  if (pick < 92) {
    uint64_t word = (block << 32) | version | 1;
    for (size_t i = 0; i < BS; i += 8)
      memcpy (buf + i, &word, 8);
    return C_SAME;
  }
  memset (buf, 0, BS);
  return C_ZERO;
}

/* A write's result: the copy follows a write that worked; one refused
 * for memory (ENOSPC) must have left the block as it was.
 */
static bool
write_result (struct writer *w, int r, uint64_t block, const char *op)
{
  if (r == 0)
    return true;
  if (errno == ENOSPC)
    atomic_fetch_add (&enospc_writes, 1);
  else
    record_error ("writer %u: %s of block %" PRIu64 " failed: %s", w->id, op,
                  block, strerror (errno));
  return false;
}

static void *
writer_main (void *arg)
{
  struct writer *w = arg;
  uint64_t rng = w->seed;
  unsigned char buf[BS];
  lock_jitter = 10;             /* yields only */
  jitter_sleeps = false;
  jitter_rng = w->seed * 31 + 17;

  while (!atomic_load (&stress_stop)) {
    uint64_t r = xorshift64 (&rng);
    unsigned local = r % OWNED;
    struct owned_block *o = &w->blocks[local];
    uint64_t block = (uint64_t) local * WRITERS + w->id;
    uint64_t offset = block * BS;
    unsigned op = (r >> 16) % 100;
    uint64_t r2 = xorshift64 (&rng);
    size_t from = r2 % BS;
    size_t length = 1 + (r2 >> 16) % (BS - from);
    if (length == BS)
      length = BS - 1;
    int result;

    if (op < 30 || (op >= 90 && op < 95)) {
      /* A whole block; op 90..94: twice in a row, a yield between (the
       * housekeeper's flush may drain the first one's free between).
       */
      unsigned times = op < 30 ? 1 : 2;
      for (unsigned t = 0; t < times; t++) {
        o->version++;
        enum content kind = content_fill (buf, block, o->version, r2 >> 32,
                                          &rng);
        result = store_write (w->store, buf, BS, offset);
        remember (o, kind == C_ZERO ? "write zeros" : "write", 0, BS, result);
        if (write_result (w, result, block, "write")) {
          memcpy (o->data, buf, BS);
          o->stored = kind == C_ZERO || kind == C_SAME
            ? (o->stored == STORED_YES ? STORED_YES : STORED_MAYBE)
            : STORED_YES;
        }
        if (t + 1 < times)
          sched_yield ();
      }
    }
    else if (op < 42) {                 /* part of a block */
      o->version++;
      if (r2 & (1ull << 63))
        text_fill (buf, length, o->version);
      else
        for (size_t i = 0; i < length; i++)
          buf[i] = (unsigned char) xorshift64 (&rng);
      result = store_write (w->store, buf, length, offset + from);
      remember (o, "patch", from, length, result);
      if (write_result (w, result, block, "partial write")) {
        memcpy (o->data + from, buf, length);
        o->stored = STORED_YES;
      }
    }
    else if (op < 58) {                 /* zero part of a block */
      if (r2 & (1ull << 62) && length > 128)
        length = 1 + length % 128;      /* short: rewritten in place */
      result = store_zero (w->store, length, offset + from, false);
      remember (o, "zero part", from, length, result);
      if (write_result (w, result, block, "partial zero"))
        memset (o->data + from, 0, length);
    }
    else if (op < 62) {
      result = store_trim (w->store, BS, offset);
      remember (o, "trim", 0, BS, result);
      if (write_result (w, result, block, "trim")) {
        memset (o->data, 0, BS);
        o->stored = STORED_NO;
      }
    }
    else if (op < 67) {
      bool may_trim = r2 & 1;
      result = store_zero (w->store, BS, offset, may_trim);
      remember (o, may_trim ? "zero, may trim" : "zero", 0, BS, result);
      if (write_result (w, result, block, "zero")) {
        memset (o->data, 0, BS);
        o->stored = may_trim ? STORED_NO
          : o->stored == STORED_YES ? STORED_YES : STORED_MAYBE;
      }
    }
    else
      check_block (w, local, "during the run");

    /* Reads right after some changes too (they bring written-back blocks
     * back, and clear idle flags).
     */
    if (op < 67 && (r2 >> 40) % 4 == 0)
      check_block (w, local, "just after a change");
    if ((r >> 48) % 8 == 0)
      sched_yield ();
    w->operations++;
  }
  return NULL;
}

/* The movers. */
struct mover {
  struct block_store *store;
  unsigned id;
  uint64_t rounds;
  uint64_t moved;                /* blocks packed, recompressed, written back */
  uint64_t extra;                /* units dissolved; limit changes */
  pthread_t thread;
};

static bool
keep_going (void *opaque)
{
  (void) opaque;
  return !atomic_load (&stress_stop);
}

static void
mover_start (struct mover *m)
{
  in_mover = true;
  lock_jitter = 40;
  jitter_sleeps = true;
  jitter_rng = 0x5eed + m->id * 7919;
}

static void *
packer_main (void *arg)
{
  struct mover *m = arg;
  uint64_t rng = 101;
  mover_start (m);
  while (!atomic_load (&stress_stop)) {
    uint64_t r = xorshift64 (&rng);
    struct store_pack_result result;
    if (pack_idle (m->store, r % 2 ? 0 : 32, keep_going, &result) == -1)
      record_error ("store_pack: %s", strerror (errno));
    m->moved += result.blocks;
    if ((r >> 8) % 3 == 0)
      m->extra += pack_dissolve (m->store, (r >> 16) % 2 ? 100 : 50,
                                 keep_going);
    if ((r >> 24) % 16 == 0)
      store_release_idle_memory (m->store);
    m->rounds++;
    sched_yield ();
  }
  return NULL;
}

static void *
recompressor_main (void *arg)
{
  struct mover *m = arg;
  uint64_t rng = 202;
  mover_start (m);
  static const enum store_recompress_type types[] = {
    RECOMPRESS_IDLE, RECOMPRESS_HUGE, RECOMPRESS_HUGE_IDLE, RECOMPRESS_IDLE,
  };
  while (!atomic_load (&stress_stop)) {
    uint64_t r = xorshift64 (&rng);
    struct store_recompress_request request = {
      .type = types[r % 4], .max_blocks = (r >> 8) % 2 ? 0 : 64,
    };
    struct store_recompress_result result;
    if (store_recompress (m->store, &request, keep_going, NULL, &result) == -1)
      record_error ("store_recompress: %s", strerror (errno));
    m->moved += result.recompressed;
    m->rounds++;
    sched_yield ();
  }
  return NULL;
}

static void *
writebacker_main (void *arg)
{
  struct mover *m = arg;
  uint64_t rng = 303;
  mover_start (m);
  static const enum store_writeback_type types[] = {
    WRITEBACK_ANY, WRITEBACK_IDLE, WRITEBACK_HUGE, WRITEBACK_HUGE_IDLE,
    WRITEBACK_INCOMPRESSIBLE, WRITEBACK_IDLE,
  };
  while (!atomic_load (&stress_stop)) {
    uint64_t r = xorshift64 (&rng);
    uint64_t first = (r >> 8) % ALL_BLOCKS;
    struct store_writeback_request request = {
      .type = types[r % 6], .first = (r >> 24) % 2 ? 0 : first,
      .last = (r >> 25) % 2 ? UINT64_MAX : first + (r >> 32) % 64,
      .max_blocks = (r >> 40) % 2 ? 0 : 1 + (r >> 41) % 64,
    };
    struct store_writeback_result result;
    if (store_writeback (m->store, &request, keep_going, NULL, &result) == -1
        && errno != ENOSPC)
      record_error ("store_writeback: %s", strerror (errno));
    m->moved += result.blocks;
    m->rounds++;
    sched_yield ();
  }
  return NULL;
}

/* The housekeeper's work, faster: idle marking, the flush that drains
 * the free batches (handles come back), compaction, and mem_limit moved
 * close to what is held, then back to none.
 */
static void *
housekeeper_main (void *arg)
{
  struct mover *m = arg;
  uint64_t rng = 404;
  bool limited = false, writeback_stopped = false;
  mover_start (m);
  while (!atomic_load (&stress_stop)) {
    uint64_t r = xorshift64 (&rng);
    store_mark_idle (m->store, 0, keep_going, NULL);
    if (r % 2)
      store_flush (m->store);
    if ((r >> 4) % 8 == 0)
      store_compact (m->store);
    if ((r >> 8) % 64 == 0) {
      if (limited) {
        if (store_set_mem_limit (m->store, 0, NULL) == -1)
          record_error ("store_set_mem_limit (0): %s", strerror (errno));
        if (writeback_stopped
            && store_set_writeback_limit (m->store, false, 0) == -1)
          record_error ("store_set_writeback_limit: %s", strerror (errno));
        limited = writeback_stopped = false;
      }
      else {
        /* Half the time writeback may write nothing meanwhile: writes
         * that find no room then fail (ENOSPC) instead of writing back.
         */
        if ((r >> 14) % 2) {
          if (store_set_writeback_limit (m->store, true, 0) == -1)
            record_error ("store_set_writeback_limit: %s", strerror (errno));
          writeback_stopped = true;
        }
        struct store_stats stats;
        store_stats (m->store, &stats);
        uint64_t limit = stats.limit_used + (r >> 16) % (48 * 1024);
        if (store_set_mem_limit (m->store, limit, NULL) == 0)
          limited = true;
        else if (errno != ENOSPC)
          record_error ("store_set_mem_limit: %s", strerror (errno));
        else
          limited = true;       /* put writeback back next time */
      }
      m->extra++;
    }
    m->rounds++;
    struct timespec pause = { 0, 50000 + (long) ((r >> 32) % 400000) };
    nanosleep (&pause, NULL);
  }
  if (limited)
    store_set_mem_limit (m->store, 0, NULL);
  if (writeback_stopped)
    store_set_writeback_limit (m->store, false, 0);
  return NULL;
}

/* A batch writer owns BATCH_OWNED blocks in a row and writes, trims,
 * zeros and reads runs of them (2 to 40 blocks: batched writes, whole or
 * with partial ends), keeping an exact copy of the run.
 */
struct batch_writer {
  struct block_store *store;
  unsigned id;
  uint64_t first;               /* its first block */
  unsigned char *data;          /* BATCH_OWNED blocks: what they must read */
  uint64_t seed, operations, checks, failed;
  pthread_t thread;
};

/* After a request that failed (ENOSPC), each of its blocks holds its old
 * content or its new one, never a mix: the copy takes whichever it is.
 */
static void
batch_settle_failed (struct batch_writer *w, uint64_t offset, uint64_t count,
                     const unsigned char *wanted)
{
  unsigned char got[BS];
  uint64_t base = w->first * BS;
  for (uint64_t at = offset - offset % BS; at < offset + count; at += BS) {
    if (store_read (w->store, got, BS, at) == -1) {
      record_error ("batch writer %u: read failed: %s", w->id, strerror (errno));
      return;
    }
    unsigned char *copy = w->data + (at - base);
    unsigned char expect[BS];
    memcpy (expect, copy, BS);
    uint64_t from = at < offset ? offset : at;
    uint64_t end = at + BS < offset + count ? at + BS : offset + count;
    memcpy (expect + (from - at), wanted + (from - offset), end - from);
    if (memcmp (got, copy, BS) == 0 || memcmp (got, expect, BS) == 0)
      memcpy (copy, got, BS);
    else {
      atomic_fetch_add (&mismatches, 1);
      if (atomic_fetch_add (&mismatches_printed, 1) < 8)
        fprintf (stderr, "MISMATCH batch writer %u: block %" PRIu64 " is "
                 "neither its old nor its new content after a failed "
                 "request\n", w->id, at / BS);
      memcpy (copy, got, BS);
    }
  }
}

/* Read [offset, offset + count) and hold it against the copy. */
static void
batch_check (struct batch_writer *w, uint64_t offset, uint64_t count,
             const char *when)
{
  unsigned char *got = malloc (count);
  assert_non_null (got);
  if (store_read (w->store, got, count, offset) == -1)
    record_error ("batch writer %u: read failed: %s", w->id, strerror (errno));
  else {
    w->checks++;
    const unsigned char *copy = w->data + (offset - w->first * BS);
    if (memcmp (got, copy, count) != 0) {
      atomic_fetch_add (&mismatches, 1);
      uint64_t at = 0;
      while (got[at] == copy[at])
        at++;
      if (atomic_fetch_add (&mismatches_printed, 1) < 8)
        fprintf (stderr, "MISMATCH (%s) batch writer %u: block %" PRIu64
                 " byte %" PRIu64 " reads %u, written %u\n", when, w->id,
                 (offset + at) / BS, (offset + at) % BS, got[at], copy[at]);
      memcpy ((unsigned char *) copy, got, count);
    }
  }
  free (got);
}

static void *
batch_writer_main (void *arg)
{
  struct batch_writer *w = arg;
  uint64_t rng = w->seed, version = 1;
  enum { RUN_MAX = 40 };
  unsigned char *buf = malloc (RUN_MAX * BS);
  assert_non_null (buf);
  lock_jitter = 10;             /* yields only */
  jitter_sleeps = false;
  jitter_rng = w->seed * 31 + 17;

  while (!atomic_load (&stress_stop)) {
    uint64_t r = xorshift64 (&rng);
    unsigned blocks = 2 + r % (RUN_MAX - 1);
    unsigned start = (r >> 8) % (BATCH_OWNED - blocks + 1);
    uint64_t offset = (w->first + start) * BS, count = (uint64_t) blocks * BS;
    unsigned op = (r >> 16) % 100;
    if (op >= 45 && op < 60) {
      /* Partial ends: a piece of the first block, whole ones, a piece of
       * the last.
       */
      uint64_t head = 1 + (r >> 24) % (BS - 1), tail = 1 + (r >> 36) % (BS - 1);
      offset += head;
      count -= head + (BS - tail);
    }
    int result;
    w->operations++;
    if (op < 60) {
      for (uint64_t at = 0; at < count; at += BS) {
        uint64_t block = (offset + at) / BS;
        content_fill (buf + at, block, ++version, xorshift64 (&rng), &rng);
      }
      result = store_write (w->store, buf, count, offset);
      if (result == 0)
        memcpy (w->data + (offset - w->first * BS), buf, count);
    }
    else if (op < 75) {
      offset -= offset % BS;
      count = (uint64_t) blocks * BS;
      memset (buf, 0, count);
      result = store_trim (w->store, count, offset);
      if (result == 0)
        memset (w->data + (offset - w->first * BS), 0, count);
    }
    else if (op < 85) {
      memset (buf, 0, count);
      result = store_zero (w->store, count, offset, (r >> 48) & 1);
      if (result == 0)
        memset (w->data + (offset - w->first * BS), 0, count);
    }
    else {
      batch_check (w, offset, count, "during the run");
      continue;
    }
    if (result == -1) {
      if (errno != ENOSPC)
        record_error ("batch writer %u: request failed: %s", w->id,
                      strerror (errno));
      w->failed++;
      batch_settle_failed (w, offset, count, buf);
    }
    else if ((r >> 56) % 4 == 0)
      batch_check (w, offset, count, "just written");
  }
  free (buf);
  return NULL;
}

static void
test_stress (void **state)
{
  /* state: blocks per packed unit; the three runs share the time. */
  unsigned pack_blocks = (uintptr_t) *state;
  unsigned seconds = (env_unsigned ("MOVE_STRESS_SECONDS", 6) + 2) / 3;
  struct block_store *store = make_moving_store (ALL_BLOCKS, 1 << 30,
                                                 pack_blocks);
  print_message ("units of up to %u blocks\n", pack_blocks);
  struct writer writers[WRITERS];
  struct batch_writer batchers[BATCH_WRITERS];
  struct mover movers[4];
  void *(*mover_mains[4]) (void *) = {
    packer_main, recompressor_main, writebacker_main, housekeeper_main,
  };
  static const char *const mover_names[4] = {
    "pack", "recompress", "writeback", "housekeeping",
  };
  unsigned char buf[BS];

  atomic_store (&stress_stop, false);
  atomic_store (&mismatches, 0);
  atomic_store (&mismatches_printed, 0);
  atomic_store (&enospc_writes, 0);
  atomic_store (&unexpected_errors, 0);
  atomic_store (&window_sleep_us, 2000);

  /* Every block starts written (any content but zeros). */
  for (unsigned t = 0; t < WRITERS; t++) {
    writers[t] = (struct writer) {
      .store = store, .id = t, .seed = 0x1234 + t * 0x9e37,
      .blocks = calloc (OWNED, sizeof (struct owned_block)),
    };
    assert_non_null (writers[t].blocks);
    uint64_t rng = writers[t].seed;
    for (unsigned i = 0; i < OWNED; i++) {
      struct owned_block *o = &writers[t].blocks[i];
      uint64_t block = (uint64_t) i * WRITERS + t;
      o->version = 1;
      enum content kind = content_fill (o->data, block, 1, i * 37 % 92, &rng);
      assert_int_equal (store_write (store, o->data, BS, block * BS), 0);
      o->stored = kind == C_ZERO ? STORED_MAYBE : STORED_YES;
      remember (o, "first write", 0, BS, 0);
    }
  }
  /* The batch writers' runs start written too, in batches. */
  for (unsigned t = 0; t < BATCH_WRITERS; t++) {
    batchers[t] = (struct batch_writer) {
      .store = store, .id = t, .seed = 0xba7c + t * 0x9e37,
      .first = STRESS_BLOCKS + (uint64_t) t * BATCH_OWNED,
      .data = malloc (BATCH_OWNED * BS),
    };
    assert_non_null (batchers[t].data);
    uint64_t rng = batchers[t].seed;
    for (unsigned i = 0; i < BATCH_OWNED; i++)
      content_fill (batchers[t].data + (size_t) i * BS, batchers[t].first + i,
                    1, i * 37 % 92, &rng);
    assert_int_equal (store_write (store, batchers[t].data, BATCH_OWNED * BS,
                                   batchers[t].first * BS), 0);
  }
  for (unsigned t = 0; t < WRITERS; t++)
    assert_int_equal (pthread_create (&writers[t].thread, NULL, writer_main,
                                      &writers[t]), 0);
  for (unsigned t = 0; t < BATCH_WRITERS; t++)
    assert_int_equal (pthread_create (&batchers[t].thread, NULL,
                                      batch_writer_main, &batchers[t]), 0);
  /* MOVE_STRESS_SKIP: movers left out (names, e.g. "pack,writeback"). */
  const char *skip = getenv ("MOVE_STRESS_SKIP");
  bool running[4];
  for (unsigned i = 0; i < 4; i++) {
    movers[i] = (struct mover) { .store = store, .id = i };
    running[i] = !(skip && strstr (skip, mover_names[i]));
    if (running[i])
      assert_int_equal (pthread_create (&movers[i].thread, NULL,
                                        mover_mains[i], &movers[i]), 0);
  }
  int64_t end = real_now_ns () + (int64_t) seconds * 1000000000;
  while (real_now_ns () < end) {
    struct timespec pause = { 0, 50000000 };
    nanosleep (&pause, NULL);
  }
  atomic_store (&stress_stop, true);
  for (unsigned t = 0; t < WRITERS; t++)
    pthread_join (writers[t].thread, NULL);
  for (unsigned t = 0; t < BATCH_WRITERS; t++)
    pthread_join (batchers[t].thread, NULL);
  for (unsigned i = 0; i < 4; i++)
    if (running[i])
      pthread_join (movers[i].thread, NULL);
  atomic_store (&window_sleep_us, 0);

  /* Every block, once more, with everything still where the movers put
   * it, then the counters against a walk.
   */
  uint64_t during = atomic_load (&mismatches);
  for (unsigned t = 0; t < WRITERS; t++)
    for (unsigned i = 0; i < OWNED; i++)
      check_block (&writers[t], i, "at the end");
  for (unsigned t = 0; t < BATCH_WRITERS; t++)
    batch_check (&batchers[t], batchers[t].first * BS, BATCH_OWNED * BS,
                 "at the end");
  uint64_t at_end = atomic_load (&mismatches) - during;

  uint64_t operations = 0, checks = 0;
  for (unsigned t = 0; t < WRITERS; t++) {
    operations += writers[t].operations;
    checks += writers[t].checks;
  }
  struct store_stats stats;
  store_stats (store, &stats);
  print_message ("move stress, %u s: %" PRIu64 " writer operations, %" PRIu64
                 " reads checked, %" PRIu64 " writes refused for memory\n",
                 seconds, operations, checks, atomic_load (&enospc_writes));
  for (unsigned i = 0; i < 4; i++)
    print_message ("  %-12s %8" PRIu64 " rounds, %8" PRIu64 " blocks moved, %"
                   PRIu64 " %s\n", mover_names[i], movers[i].rounds,
                   movers[i].moved, movers[i].extra,
                   i == 0 ? "units dissolved" : i == 3 ? "limit changes" : "");
  for (unsigned t = 0; t < BATCH_WRITERS; t++)
    print_message ("  batch writer %u: %" PRIu64 " requests of 2 to 40 blocks, "
                   "%" PRIu64 " refused for memory, %" PRIu64 " reads checked\n",
                   t, batchers[t].operations, batchers[t].failed,
                   batchers[t].checks);
  print_message ("  readbacks %" PRIu64 ", blocks written back now %" PRIu64
                 ", packed now %" PRIu64 " in %" PRIu64 " units\n",
                 stats.bd_readbacks, stats.bd_count, stats.packed_blocks,
                 stats.pack_units);
  print_message ("move stress: %" PRIu64 " mismatches (%" PRIu64 " during the "
                 "run, %" PRIu64 " at the end) in %" PRIu64 " pack rounds, %"
                 PRIu64 " writer operations\n", during + at_end, during,
                 at_end, movers[0].rounds, operations);

  if (atomic_load (&unexpected_errors))
    fail_msg ("%" PRIu64 " unexpected errors; the first: %s",
              atomic_load (&unexpected_errors), first_error);
  if (during + at_end)
    fail_msg ("%" PRIu64 " reads differed from what was written (lost writes)",
              during + at_end);
  for (unsigned t = 0; t < BATCH_WRITERS; t++)
    if (batchers[t].operations == 0 || batchers[t].checks == 0)
      fail_msg ("batch writer %u did nothing", t);

  /* Which blocks are stored, and the counters, against a walk. */
  uint8_t stored_map[ALL_BLOCKS] = { 0 };
  struct full_walk walk = { .stored_map = stored_map, .blocks = ALL_BLOCKS };
  char text[256];
  const char *wrong = check_counters (store, &walk, text, sizeof text);
  if (wrong)
    fail_msg ("after the stress: %s", wrong);
  for (unsigned t = 0; t < WRITERS; t++)
    for (unsigned i = 0; i < OWNED; i++) {
      uint64_t block = (uint64_t) i * WRITERS + t;
      enum stored s = writers[t].blocks[i].stored;
      if ((s == STORED_YES && !stored_map[block])
          || (s == STORED_NO && stored_map[block]))
        fail_msg ("block %" PRIu64 " is %sstored, but it was %s", block,
                  stored_map[block] ? "" : "not ",
                  s == STORED_YES ? "written" : "trimmed");
    }
  /* The movers did their work. */
  for (unsigned i = 0; i < 3; i++)
    if (running[i] && movers[i].moved == 0)
      fail_msg ("the %s mover moved nothing in %u s", mover_names[i],
                seconds);

  /* Once more after a last pack, writeback and readback of everything. */
  store_mark_idle (store, 0, NULL, NULL);
  struct store_pack_result packed;
  assert_int_equal (pack_idle (store, 0, NULL, &packed), 0);
  for (unsigned t = 0; t < WRITERS; t++)
    for (unsigned i = 0; i < OWNED; i++) {
      uint64_t block = (uint64_t) i * WRITERS + t;
      assert_int_equal (store_read (store, buf, BS, block * BS), 0);
      assert_memory_equal (buf, writers[t].blocks[i].data, BS);
    }
  for (unsigned t = 0; t < BATCH_WRITERS; t++)
    for (unsigned i = 0; i < BATCH_OWNED; i++) {
      assert_int_equal (store_read (store, buf, BS,
                                    (batchers[t].first + i) * BS), 0);
      assert_memory_equal (buf, batchers[t].data + (size_t) i * BS, BS);
    }
  check_empty_after_trim (store, ALL_BLOCKS);
  for (unsigned t = 0; t < WRITERS; t++)
    free (writers[t].blocks);
  for (unsigned t = 0; t < BATCH_WRITERS; t++)
    free (batchers[t].data);
  store_destroy (store);
}

/* ---- C: ages at any uptime ---------------------------------------------- */

enum { AGE_BLOCKS = 16, AGE_A = 8 };   /* blocks 0..7: A; 8..15: B */

struct age_states {
  struct store_block_state s[AGE_BLOCKS];
  bool seen[AGE_BLOCKS];
};

static int
age_gather (void *opaque, const struct store_block_state *s)
{
  struct age_states *ages = opaque;
  if (s->block < AGE_BLOCKS) {
    ages->s[s->block] = *s;
    ages->seen[s->block] = true;
  }
  return 0;
}

static void
age_write (struct block_store *store, uint64_t first, uint64_t count)
{
  unsigned char buf[BS];
  for (uint64_t b = first; b < first + count; b++) {
    shared_fill (buf, b, 1);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
}

/* A written, then gap seconds later B; marking by an age of an hour
 * marks exactly A.
 */
static void
age_check (struct block_store *store, const char *what)
{
  uint64_t marked = store_mark_idle (store, 3600, NULL, NULL);
  struct age_states ages = { 0 };
  assert_int_equal (store_block_state (store, 0, AGE_BLOCKS, age_gather,
                                       &ages), 0);
  uint32_t now = store_now (store);
  print_message ("%s: now %" PRIu32 " s, A's atime %" PRIu32 ", B's %" PRIu32
                 ", %" PRIu64 " marked idle (of %d A blocks)\n", what, now,
                 ages.s[0].atime, ages.s[AGE_A].atime, marked, AGE_A);
  for (unsigned b = 0; b < AGE_BLOCKS; b++) {
    assert_true (ages.seen[b]);
    bool a = b < AGE_A;
    if (ages.s[b].idle != a)
      fail_msg ("%s: block %u (%s) is %sidle; A's atime %" PRIu32 ", B's %"
                PRIu32 ", now %" PRIu32, what, b, a ? "A" : "B",
                ages.s[b].idle ? "" : "not ", ages.s[0].atime,
                ages.s[AGE_A].atime, now);
    if (!a && ages.s[b].atime <= ages.s[0].atime)
      fail_msg ("%s: B's atime %" PRIu32 " is not after A's %" PRIu32, what,
                ages.s[b].atime, ages.s[0].atime);
    assert_true (ages.s[b].atime <= now);
  }
  assert_int_equal (marked, AGE_A);
  /* A read is an access: that block is young again. */
  unsigned char buf[BS];
  assert_int_equal (store_read (store, buf, BS, 0), 0);
  ages = (struct age_states) { 0 };
  assert_int_equal (store_block_state (store, 0, 1, age_gather, &ages), 0);
  assert_false (ages.s[0].idle);
  assert_true (ages.s[0].atime >= ages.s[AGE_A].atime);
  assert_int_equal (store_mark_idle (store, 3600, NULL, NULL), 0);
}

static void
test_ages (void **state)
{
  uint64_t uptime = (uintptr_t) *state;   /* seconds */
  const int64_t hours2 = (int64_t) 7200 * 1000000000;
  char what[96];

  /* A when the store is made, B after the uptime. */
  atomic_store (&clock_ahead_ns, 0);
  struct block_store *store = make_moving_store (64, 0, 0);
  age_write (store, 0, AGE_A);
  atomic_store (&clock_ahead_ns, (int64_t) uptime * 1000000000);
  age_write (store, AGE_A, AGE_BLOCKS - AGE_A);
  snprintf (what, sizeof what, "A at 0, B at %" PRIu64 " days", uptime / 86400);
  age_check (store, what);
  store_destroy (store);

  /* Both after the uptime, two hours apart. */
  atomic_store (&clock_ahead_ns, 0);
  store = make_moving_store (64, 0, 0);
  atomic_store (&clock_ahead_ns, (int64_t) uptime * 1000000000);
  age_write (store, 0, AGE_A);
  atomic_store (&clock_ahead_ns, (int64_t) uptime * 1000000000 + hours2);
  age_write (store, AGE_A, AGE_BLOCKS - AGE_A);
  snprintf (what, sizeof what, "A at %" PRIu64 " days, B two hours later",
            uptime / 86400);
  age_check (store, what);
  store_destroy (store);
  atomic_store (&clock_ahead_ns, 0);
}

int
main (void)
{
#define WINDOW_TEST(i) \
  cmocka_unit_test_prestate (test_window, (void *) &window_cases[i])
  const struct CMUnitTest tests[] = {
    WINDOW_TEST (0), WINDOW_TEST (1), WINDOW_TEST (2),
    WINDOW_TEST (3), WINDOW_TEST (4), WINDOW_TEST (5),
    cmocka_unit_test_prestate (test_read_window, (void *) (uintptr_t) 0),
    cmocka_unit_test_prestate (test_read_window,
                               (void *) (uintptr_t) (64 << 20)),
    cmocka_unit_test_prestate (test_ages, (void *) (uintptr_t) (365 * 86400)),
    cmocka_unit_test_prestate (test_ages,
                               (void *) (uintptr_t) (3 * 365 * 86400)),
    cmocka_unit_test_prestate (test_stress, (void *) (uintptr_t) 2),
    cmocka_unit_test_prestate (test_stress, (void *) (uintptr_t) 16),
    cmocka_unit_test_prestate (test_stress,
                               (void *) (uintptr_t) STORE_PACK_MAX),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
