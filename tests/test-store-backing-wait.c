/* A write waits for the backing store one backing_timeout in all
 * (block-store.h, BACKING WAITS): whatever it waits for - the read of a
 * written-back block it patches, the writeback that makes it room, the
 * trims of the runs that writeback frees - every backing request it
 * makes carries a deadline, and none past one backing_timeout from its
 * first wait.
 *
 * The NBD transport (store/backing-nbd.c) is replaced, through
 * -Wl,--wrap, by an export in memory that answers at once (healthy),
 * after a delay (slow) or never (wedged), on the monotonic clock of
 * moved-clock.h, frozen: a request "waits" by moving the clock to when
 * it is answered or given up on, as the real transport gives up at
 * min(its deadline, now + backing_timeout), and a write or trim given up
 * on is quarantined as there.  Every request is recorded with the
 * deadline it was handed, so the test asserts the mechanism (the
 * deadlines handed down) as well as the time the write took on that
 * clock, exactly, in no real time.  Each request meets a connection of
 * its own (an export with multi-conn, before any backoff): the wait a
 * request is handed is the wait it gets.
 *
 * Regressions: a write at the limit of a wedged store settled the
 * released runs after its writeback timed out and trimmed them with no
 * deadline (one more backing_timeout: seen as writes failing with
 * ENOSPC after twice the timeout); a partial write of a written-back
 * block read it with a timeout of its own, then started the timeout of
 * its writeback for room.
 */

#include "store-fixture.h"
#include "moved-clock.h"

#include "backing-internal.h"
#include "monotonic.h"

#define TIMEOUT_S 5
#define TIMEOUT_MS (TIMEOUT_S * 1000)

/* ---- the export --------------------------------------------------------- */

/* One thread at a time (the tests drive the store from theirs). */
static struct {
  unsigned char *image;
  uint64_t capacity;
  bool wedged;                  /* no request is ever answered */
  uint64_t delay_ms;            /* else each is answered this late */
} export;

/* The requests made since record_start, with the deadline each was
 * handed (0: none).
 */
#define RECORD_MAX 4096
static struct request_seen {
  char op;
  uint64_t deadline_ms;
} seen[RECORD_MAX];
static unsigned seen_count;

static void
record_start (void)
{
  seen_count = 0;
}

/* The frozen clock moved to at_ms (never back). */
static void
clock_move_to (uint64_t at_ms)
{
  uint64_t now = monotonic_ms ();
  if (at_ms > now)
    atomic_fetch_add (&clock_ahead_ns, (int64_t) (at_ms - now) * 1000000);
}

int __wrap_backing_nbd_open (struct backing *backing, uint64_t *capacity,
                             char **error);
int __wrap_backing_nbd_request (struct backing *backing, char op, void *buf,
                                size_t bytes, uint64_t offset,
                                uint64_t deadline_ms);
void __real_backing_nbd_close (struct backing *backing);
void __wrap_backing_nbd_close (struct backing *backing);

int
__wrap_backing_nbd_open (struct backing *backing, uint64_t *capacity,
                         char **error)
{
  export.capacity = *capacity;
  export.image = calloc (1, *capacity);
  assert_non_null (export.image);
  backing->can_trim = true;
  backing->connection_count = 1;
  return 0;
}

int
__wrap_backing_nbd_request (struct backing *backing, char op, void *buf,
                            size_t bytes, uint64_t offset,
                            uint64_t deadline_ms)
{
  assert_true (seen_count < RECORD_MAX);
  seen[seen_count++] = (struct request_seen) { op, deadline_ms };
  uint64_t now = monotonic_ms ();
  uint64_t give_up = now + backing->timeout_ms;
  if (deadline_ms && deadline_ms < give_up)
    give_up = deadline_ms < now ? now : deadline_ms;
  if (export.wedged || now + export.delay_ms > give_up) {
    /* As backing_nbd_request: no answer in time, and a write or trim
     * that was sent may still land.
     */
    clock_move_to (give_up);
    atomic_fetch_add (&backing->timeouts, 1);
    if (op == 'w' || op == 't') {
      atomic_fetch_add (&backing->abandoned_requests, 1);
      space_map_quarantine (backing->map, offset, bytes);
    }
    errno = ETIMEDOUT;
    return -1;
  }
  clock_move_to (now + export.delay_ms);
  assert_true (offset + bytes <= export.capacity);
  switch (op) {
  case 'r': memcpy (buf, export.image + offset, bytes); break;
  case 'w': memcpy (export.image + offset, buf, bytes); break;
  case 't': memset (export.image + offset, 0, bytes); break;
  default: break;
  }
  return 0;
}

void
__wrap_backing_nbd_close (struct backing *backing)
{
  __real_backing_nbd_close (backing);
  free (export.image);
  export.image = NULL;
}

/* ---- the store ---------------------------------------------------------- */

static struct block_store *
make_nbd_store (uint64_t blocks)
{
  char *error = NULL;
  export.wedged = false;
  export.delay_ms = 0;
  struct backing *backing = backing_open ("nbd+unix:///?socket=/the-mock",
                                          blocks * BS, false, TIMEOUT_S,
                                          &error);
  if (!backing)
    fail_msg ("backing_open: %s", error);
  struct store_config config = {
    .size = blocks * BS, .algorithm = CODEC_LZ4, .level = 1,
    .backing = backing,
  };
  zs_pool_config_init (&config.pool);
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  return store;
}

/* Random bytes: stored raw, one page each. */
static void
random_fill (unsigned char *buf, uint64_t block, uint64_t version)
{
  uint64_t state = block * 0x9e3779b97f4a7c15ull + version * 7919 + 1;
  for (size_t i = 0; i < BS; i += 8) {
    uint64_t word = xorshift64 (&state);
    memcpy (buf + i, &word, 8);
  }
}

static void
write_random (struct block_store *store, uint64_t first, uint64_t count,
              uint64_t version)
{
  unsigned char buf[BS];
  for (uint64_t b = first; b < first + count; b++) {
    random_fill (buf, b, version);
    assert_int_equal (store_write (store, buf, BS, b * BS), 0);
  }
}

static void
check_random (struct block_store *store, uint64_t first, uint64_t count,
              uint64_t version)
{
  unsigned char got[BS], want[BS];
  for (uint64_t b = first; b < first + count; b++) {
    random_fill (want, b, version);
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    assert_memory_equal (got, want, BS);
  }
}

/* Blocks [first, first + count) written back (the export healthy). */
static void
write_back (struct block_store *store, uint64_t first, uint64_t count)
{
  static const struct store_writeback_request everything = {
    .type = WRITEBACK_ANY, .first = 0, .last = UINT64_MAX,
  };
  struct store_writeback_request request = everything;
  request.first = first;
  request.last = first + count - 1;
  struct store_writeback_result result;
  assert_int_equal (store_writeback (store, &request, NULL, NULL, &result), 0);
  assert_int_equal (result.blocks, count);
}

/* mem_limit at what the pool holds now: the next block stored needs
 * room.
 */
static void
limit_at_held (struct block_store *store)
{
  struct store_stats stats;
  store_stats (store, &stats);
  uint64_t held = stats.limit_used;
  if (store_set_mem_limit (store, held, &held) == -1)
    assert_int_equal (store_set_mem_limit (store, held, NULL), 0);
}

/* The requests recorded since started_ms, the write's start: each had a
 * deadline, none past one backing_timeout from then; and at least one
 * of kind op was made (the path under test was taken).
 */
static void
check_deadlines (uint64_t started_ms, char op)
{
  bool op_seen = false;
  for (unsigned i = 0; i < seen_count; i++) {
    print_message ("  request %u: %c, deadline %+" PRId64 " ms from the "
                   "write's start\n", i, seen[i].op, seen[i].deadline_ms
                   ? (int64_t) (seen[i].deadline_ms - started_ms) : 0);
    if (seen[i].deadline_ms == 0)
      fail_msg ("request %u (%c) of the write was handed no deadline: it "
                "may wait a backing_timeout of its own", i, seen[i].op);
    if (seen[i].deadline_ms > started_ms + TIMEOUT_MS)
      fail_msg ("request %u (%c) of the write may wait until %" PRIu64
                " ms after the write's start, past its %d ms", i, seen[i].op,
                seen[i].deadline_ms - started_ms, TIMEOUT_MS);
    op_seen |= seen[i].op == op;
  }
  assert_true (op_seen);
}

/* A wedged export, a write at the limit: its writeback times out at the
 * write's deadline, and the runs released before (blocks written back,
 * then written again) are not trimmed past it.  ENOSPC after one
 * backing_timeout; nothing lost.
 */
static void
test_wedged_write_at_limit (void **state)
{
  (void) state;
  atomic_store (&clock_frozen_ns, real_now_ns ());
  struct block_store *store = make_nbd_store (1024);
  write_random (store, 0, 64, 1);
  write_back (store, 0, 64);
  /* Blocks 0..31 again: their runs are released (queued for the next
   * settle: an NBD store's trim is a request).
   */
  write_random (store, 0, 32, 2);
  write_random (store, 100, 32, 1);
  limit_at_held (store);

  export.wedged = true;
  record_start ();
  uint64_t started = monotonic_ms ();
  unsigned char buf[BS];
  random_fill (buf, 500, 1);
  int r = store_write (store, buf, BS, 500 * BS);
  int err = errno;
  uint64_t took = monotonic_ms () - started;
  print_message ("wedged export, a write at the limit: %s after %" PRIu64
                 " ms (backing_timeout %d ms), %u backing requests\n",
                 r == 0 ? "stored" : strerror (err), took, TIMEOUT_MS,
                 seen_count);
  assert_int_equal (r, -1);
  assert_int_equal (err, ENOSPC);
  check_deadlines (started, 'w');
  assert_true (took <= TIMEOUT_MS);

  /* Nothing lost: every block as it was written. */
  export.wedged = false;
  assert_int_equal (store_set_mem_limit (store, 0, NULL), 0);
  check_random (store, 0, 32, 2);
  check_random (store, 32, 32, 1);
  check_random (store, 100, 32, 1);
  store_destroy (store);
  atomic_store (&clock_frozen_ns, 0);
  atomic_store (&clock_ahead_ns, 0);
}

/* A slow export (each request answered after 0.6 backing_timeout), a
 * partial write of a written-back block at the limit: the read of the
 * block and the writeback for room share one deadline.  ENOSPC after
 * one backing_timeout, the block as it was.
 */
static void
test_slow_partial_write_at_limit (void **state)
{
  (void) state;
  atomic_store (&clock_frozen_ns, real_now_ns ());
  struct block_store *store = make_nbd_store (1024);
  write_random (store, 0, 64, 1);
  write_back (store, 0, 64);
  write_random (store, 100, 64, 1);
  limit_at_held (store);

  export.delay_ms = TIMEOUT_MS * 6 / 10;
  record_start ();
  uint64_t started = monotonic_ms ();
  unsigned char patch[100];
  memset (patch, 'P', sizeof patch);
  int r = store_write (store, patch, sizeof patch, 5 * BS + 10);
  int err = errno;
  uint64_t took = monotonic_ms () - started;
  print_message ("slow export (%" PRIu64 " ms a request), a partial write "
                 "of a written-back block at the limit: %s after %" PRIu64
                 " ms (backing_timeout %d ms), %u backing requests\n",
                 export.delay_ms, r == 0 ? "stored" : strerror (err), took,
                 TIMEOUT_MS, seen_count);
  assert_int_equal (r, -1);
  assert_int_equal (err, ENOSPC);
  check_deadlines (started, 'r');
  assert_true (took <= TIMEOUT_MS);

  export.delay_ms = 0;
  assert_int_equal (store_set_mem_limit (store, 0, NULL), 0);
  check_random (store, 0, 64, 1);
  check_random (store, 100, 64, 1);
  store_destroy (store);
  atomic_store (&clock_frozen_ns, 0);
  atomic_store (&clock_ahead_ns, 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_wedged_write_at_limit),
    cmocka_unit_test (test_slow_partial_write_at_limit),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
