/* The housekeeper keeps its once-a-second rhythm whatever the wall clock
 * does: its waits are on the monotonic clock.  The test steps the wall
 * clock the housekeeper sees an hour ahead (a link-time wrap of
 * clock_gettime) and counts its rounds through stand-ins for the store
 * and the stats file.  With a deadline taken from CLOCK_REALTIME the
 * housekeeper stalled after its first round.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "housekeeper.h"
#include "block-store-internal.h"   /* store_decode_cache_sweep */
#include "metrics.h"
#include "stats-file.h"

/* The wall clock, as the code under test sees it: an hour ahead. */
int __real_clock_gettime (clockid_t clock, struct timespec *ts);
int __wrap_clock_gettime (clockid_t clock, struct timespec *ts);
int
__wrap_clock_gettime (clockid_t clock, struct timespec *ts)
{
  int r = __real_clock_gettime (clock, ts);
  if (r == 0 && clock == CLOCK_REALTIME)
    ts->tv_sec += 3600;
  return r;
}

/* Stand-ins for the store and the stats file: count the rounds. */
static atomic_int rounds;

void
store_flush (struct block_store *store)
{
  atomic_fetch_add (&rounds, 1);
}

/* No region here. */
void
handover_alive (void)
{
}

static atomic_int stats_writes;

/* The decode cache's sweep: counted, and which round it came in. */
static atomic_int sweeps, sweeps_out_of_round;

size_t
store_decode_cache_sweep (struct block_store *store)
{
  atomic_fetch_add (&sweeps, 1);
  if (atomic_load (&rounds) == 0)
    atomic_fetch_add (&sweeps_out_of_round, 1);  /* before store_flush */
  return 0;
}

/* Compaction is not under test here: a pool with nothing to free. */
uint64_t
store_freeable (struct block_store *store, uint64_t *pages_used)
{
  *pages_used = 0;
  return 0;
}

uint64_t
store_compact (struct block_store *store)
{
  return 0;
}

size_t
store_release_idle_memory (struct block_store *store)
{
  return 0;
}

/* Writeback is not under test here: no mem_limit, never above it. */
void
store_stats (struct block_store *store, struct store_stats *stats)
{
  memset (stats, 0, sizeof *stats);
}

int
store_writeback_until (struct block_store *store, uint64_t target,
                       uint64_t max_blocks,
                       bool (*keep_going) (void *opaque), void *opaque,
                       struct store_writeback_result *result)
{
  return 0;
}

/* The swap reserve: refills counted; reported low only when asked.
 * Once the reserve keeper runs (keeper_started), refills from any other
 * thread are counted apart: in resident_only the refill purges, and the
 * allocator's purge must have one thread (page-source.h).  The keeper's
 * refills take a while, as populating memory does, so that wakes pile up
 * meanwhile.
 */
static atomic_int refills, refills_elsewhere;
static atomic_bool keeper_started;

uint64_t
store_reserve_refill (struct block_store *store)
{
  atomic_fetch_add (&refills, 1);
  char name[16] = "";
  pthread_getname_np (pthread_self (), name, sizeof name);
  if (strcmp (name, "zram-reserve") == 0)
    usleep (20000);
  else if (atomic_load (&keeper_started))
    atomic_fetch_add (&refills_elsewhere, 1);
  return 0;
}

uint64_t
store_mark_idle (struct block_store *store, uint32_t min_age,
                 bool (*keep_going) (void *opaque), void *opaque)
{
  return 0;
}

int
store_recompress (struct block_store *store,
                  const struct store_recompress_request *request,
                  bool (*keep_going) (void *opaque), void *opaque,
                  struct store_recompress_result *result)
{
  return 0;
}

int
store_pack (struct block_store *store, uint64_t max_blocks, uint32_t min_age,
            bool (*keep_going) (void *opaque), void *opaque,
            struct store_pack_result *result)
{
  return 0;
}

uint64_t
store_pack_dissolve (struct block_store *store, unsigned live_percent,
                     bool (*keep_going) (void *opaque), void *opaque)
{
  return 0;
}

/* The store is empty whenever asked: the reserve would go back. */
static atomic_int releases_asked;

bool
store_reserve_release_if_empty (struct block_store *store)
{
  atomic_fetch_add (&releases_asked, 1);
  return true;
}

bool
store_reserve_low (struct block_store *store)
{
  return false;
}

/* A stats write that hangs (in reclaim, say) while stats_stuck is set. */
static atomic_bool stats_stuck;

void
stats_sample_take (struct block_store *store, bool with_classes,
                   struct stats_sample *sample)
{
  memset (sample, 0, sizeof *sample);
}

void
stats_sample_release (struct stats_sample *sample)
{
}

void
stats_print_sample (const struct stats_sample *sample, FILE *fp)
{
}

void
metrics_print_sample (const struct stats_sample *sample, FILE *fp)
{
}

int
stats_output_write (const char *what, const char *path, bool *failed,
                    void (*print) (const struct stats_sample *sample, FILE *fp),
                    const struct stats_sample *sample,
                    struct output_file *written)
{
  atomic_fetch_add (&stats_writes, 1);
  while (atomic_load (&stats_stuck))
    usleep (10000);
  return 0;
}

void
stats_output_remove (const char *path, const struct output_file *written)
{
}

static void
test_rounds_survive_a_clock_step (void **state)
{
  (void) state;
  for (int with_stats = 0; with_stats < 2; with_stats++) {
    atomic_store (&rounds, 0);
    atomic_store (&stats_writes, 0);
    assert_int_equal (housekeeper_start (NULL, with_stats ? "stats" : NULL,
                                         NULL, 10), 0);
    /* Rounds at 0, 1, 2 s...: three within 6 s even on a loaded machine. */
    for (int i = 0; i < 60 && atomic_load (&rounds) < 3; i++)
      usleep (100000);
    int seen = atomic_load (&rounds);
    housekeeper_stop ();
    if (seen < 3)
      fail_msg ("%d housekeeping round(s) in 6 s with the wall clock stepped "
                "an hour ahead, want 3", seen);
    /* housekeeper_stop runs one last round; each writes the stats. */
    assert_true (atomic_load (&rounds) > seen);
    assert_int_equal (atomic_load (&stats_writes),
                      with_stats ? atomic_load (&rounds) : 0);
  }
}

/* housekeeper_wake tops the reserve up at once, between rounds (which
 * come a second apart), however many wakes come at once.  A refill
 * that happens to share its moment with a round proves nothing, so up to
 * five tries.
 */
static void
test_wake_refills_between_rounds (void **state)
{
  (void) state;
  atomic_store (&rounds, 0);
  assert_int_equal (housekeeper_start (NULL, NULL, NULL, -1), 0);
  for (int i = 0; i < 50 && atomic_load (&rounds) < 1; i++)
    usleep (100000);
  assert_true (atomic_load (&rounds) >= 1);

  bool between_rounds = false;
  for (int try = 0; try < 5 && !between_rounds; try++) {
    int rounds_before = atomic_load (&rounds);
    int refills_before = atomic_load (&refills);
    for (int burst = 0; burst < 100; burst++)
      housekeeper_wake ();
    for (int i = 0; i < 200 && atomic_load (&refills) == refills_before; i++)
      usleep (10000);
    int refilled = atomic_load (&refills) - refills_before;
    int new_rounds = atomic_load (&rounds) - rounds_before;
    assert_true (refilled >= 1);
    between_rounds = new_rounds == 0;
  }
  housekeeper_stop ();
  assert_true (between_rounds);
}

/* Swap mode (reserve_always): the reserve is filled before
 * housekeeper_start returns, before any request can need it (the first
 * swap-out used to find it empty), refilled every round and never given
 * back, even while the store is empty.
 */
static void
test_reserve_always (void **state)
{
  (void) state;
  struct housekeeper_policy policy = { .reserve_always = true };
  housekeeper_set_policy (&policy);
  atomic_store (&rounds, 0);
  atomic_store (&refills, 0);
  atomic_store (&releases_asked, 0);
  atomic_store (&refills_elsewhere, 0);
  assert_int_equal (housekeeper_start (NULL, NULL, NULL, -1), 0);
  assert_true (atomic_load (&refills) >= 1);
  atomic_store (&keeper_started, true);
  /* Wakes, as writes that find the reserve low send them: only the
   * keeper answers them, never the housekeeper between its rounds.
   */
  for (int i = 0; i < 1000 && atomic_load (&rounds) < 3; i++) {
    housekeeper_wake ();
    usleep (5000);
  }
  housekeeper_stop ();
  atomic_store (&keeper_started, false);
  print_message ("reserve_always: %d rounds, %d refills, %d of them not "
                 "by the keeper\n", atomic_load (&rounds),
                 atomic_load (&refills), atomic_load (&refills_elsewhere));
  assert_true (atomic_load (&rounds) >= 3);
  assert_true (atomic_load (&refills) >= 2);
  assert_int_equal (atomic_load (&refills_elsewhere), 0);
  assert_int_equal (atomic_load (&releases_asked), 0);

  /* Without it: nothing before the first wake; given back when empty. */
  policy.reserve_always = false;
  housekeeper_set_policy (&policy);
  atomic_store (&rounds, 0);
  atomic_store (&refills, 0);
  assert_int_equal (housekeeper_start (NULL, NULL, NULL, -1), 0);
  assert_int_equal (atomic_load (&refills), 0);
  housekeeper_wake ();
  for (int i = 0; i < 50 && atomic_load (&releases_asked) == 0; i++)
    usleep (100000);
  housekeeper_stop ();
  assert_true (atomic_load (&releases_asked) >= 1);
}

/* Swap mode: a stats write stuck (a tmpfs page in reclaim, in the
 * issue's guest) does not stop the rounds and their reserve refills: the
 * file has a thread of its own.
 */
static void
test_stuck_stats_write_keeps_refills (void **state)
{
  (void) state;
  struct housekeeper_policy policy = { .reserve_always = true };
  housekeeper_set_policy (&policy);
  atomic_store (&rounds, 0);
  atomic_store (&refills, 0);
  atomic_store (&stats_writes, 0);
  atomic_store (&stats_stuck, true);
  assert_int_equal (housekeeper_start (NULL, "stats", NULL, -1), 0);
  for (int i = 0; i < 80 && atomic_load (&rounds) < 3; i++)
    usleep (100000);
  int seen_rounds = atomic_load (&rounds), seen_refills = atomic_load (&refills);
  int writes = atomic_load (&stats_writes);
  atomic_store (&stats_stuck, false);
  housekeeper_stop ();
  print_message ("a stats write stuck: %d rounds, %d refills, %d writes "
                 "begun\n", seen_rounds, seen_refills, writes);
  assert_true (seen_rounds >= 3);
  assert_true (seen_refills >= 3);
  assert_int_equal (writes, 1);         /* the one that hung */
  policy.reserve_always = false;
  housekeeper_set_policy (&policy);
}

/* Every round but housekeeper_stop's last one sweeps the decode cache,
 * after its flush: a slot whose unit went, or that no read used for a
 * round, is freed within a round (pack.c).
 */
static void
test_rounds_sweep_decode_cache (void **state)
{
  (void) state;
  struct housekeeper_policy policy = { 0 };
  housekeeper_set_policy (&policy);
  atomic_store (&rounds, 0);
  atomic_store (&sweeps, 0);
  atomic_store (&sweeps_out_of_round, 0);
  assert_int_equal (housekeeper_start (NULL, NULL, NULL, -1), 0);
  for (int i = 0; i < 60 && atomic_load (&sweeps) < 3; i++)
    usleep (100000);
  housekeeper_stop ();
  print_message ("%d rounds, %d decode cache sweeps\n", atomic_load (&rounds),
                 atomic_load (&sweeps));
  assert_true (atomic_load (&sweeps) >= 3);
  assert_int_equal (atomic_load (&sweeps), atomic_load (&rounds) - 1);
  assert_int_equal (atomic_load (&sweeps_out_of_round), 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_rounds_survive_a_clock_step),
    cmocka_unit_test (test_wake_refills_between_rounds),
    cmocka_unit_test (test_reserve_always),
    cmocka_unit_test (test_stuck_stats_write_keeps_refills),
    cmocka_unit_test (test_rounds_sweep_decode_cache),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
