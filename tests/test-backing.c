/* The backing store's space map (store/space-map.c, through store/backing.c): what it costs in
 * RAM, and that its run search hands out runs that never overlap, finds
 * a run wherever one lies within a leaf, and stays fast on a large,
 * fragmented map, and that runs released while reads are on are freed
 * once those reads are done.
 *
 * The test counts the memory backing.c allocates itself: it is linked
 * with -Wl,--wrap for malloc, calloc, realloc, aligned_alloc,
 * posix_memalign and free, and adds up the usable size of every block.
 * (tests/test-store-writeback.c has the space map's older tests.)
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "xorshift.h"
#include "backing.h"

#define GiB ((uint64_t) 1 << 30)
#define MiB ((uint64_t) 1 << 20)
#define KiB ((uint64_t) 1 << 10)
#define SECTOR BACKING_SECTOR
#define LEAF BACKING_MAP_LEAF_SECTORS

/* ---- what backing.c allocates ------------------------------------------ */

static _Atomic int64_t live_bytes;  /* usable bytes of the blocks held */

void *__real_malloc (size_t size);
void *__real_calloc (size_t count, size_t size);
void *__real_realloc (void *p, size_t size);
void *__real_aligned_alloc (size_t alignment, size_t size);
int __real_posix_memalign (void **p, size_t alignment, size_t size);
void __real_free (void *p);
void *__wrap_malloc (size_t size);
void *__wrap_calloc (size_t count, size_t size);
void *__wrap_realloc (void *p, size_t size);
void *__wrap_aligned_alloc (size_t alignment, size_t size);
int __wrap_posix_memalign (void **p, size_t alignment, size_t size);
void __wrap_free (void *p);

static void *
counted (void *p)
{
  if (p)
    atomic_fetch_add (&live_bytes, (int64_t) malloc_usable_size (p));
  return p;
}

void *
__wrap_malloc (size_t size)
{
  return counted (__real_malloc (size));
}

void *
__wrap_calloc (size_t count, size_t size)
{
  return counted (__real_calloc (count, size));
}

void *
__wrap_realloc (void *p, size_t size)
{
  if (p)
    atomic_fetch_sub (&live_bytes, (int64_t) malloc_usable_size (p));
  void *q = __real_realloc (p, size);
  if (!q && p && size)
    return counted (p);         /* the old block stays */
  return counted (q);
}

void *
__wrap_aligned_alloc (size_t alignment, size_t size)
{
  return counted (__real_aligned_alloc (alignment, size));
}

int
__wrap_posix_memalign (void **p, size_t alignment, size_t size)
{
  int r = __real_posix_memalign (p, alignment, size);
  if (r == 0)
    counted (*p);
  return r;
}

void
__wrap_free (void *p)
{
  if (p)
    atomic_fetch_sub (&live_bytes, (int64_t) malloc_usable_size (p));
  __real_free (p);
}

/* ---- helpers --------------------------------------------------------- */

static char path[4096];

/* A backing file of capacity bytes (sparse), or NULL where the file
 * system cannot have one that large.
 */
static struct backing *
open_map (uint64_t capacity)
{
  const char *dir = getenv ("TMPDIR") ? getenv ("TMPDIR") : "/tmp";
  snprintf (path, sizeof path, "%s/test-backing-XXXXXX", dir);
  int fd = mkstemp (path);
  assert_true (fd >= 0);
  close (fd);
  char *error = NULL;
  struct backing *backing = backing_open (path, capacity, false, 30, &error);
  if (!backing) {
    print_message ("backing_open (%" PRIu64 " bytes): %s\n", capacity, error);
    __real_free (error);        /* vasprintf's, not counted */
    unlink (path);
  }
  return backing;
}

static void
close_map (struct backing *backing)
{
  backing_close (backing);
  unlink (path);
}

static double
seconds_since (const struct timespec *start)
{
  struct timespec now;
  clock_gettime (CLOCK_MONOTONIC, &now);
  return (now.tv_sec - start->tv_sec) + (now.tv_nsec - start->tv_nsec) / 1e9;
}

/* ---- what the map costs ------------------------------------------------ */

/* An empty map costs little whatever the device's size; it grows with
 * the sectors in use (a 4 KiB leaf per 16 MiB of the store that holds a
 * run), and shrinks back when they are freed.  It used to be a bitmap of
 * the whole capacity, allocated at open: 256 KiB per GiB of device.
 */
static void
test_map_cost_follows_use (void **state)
{
  (void) state;
  enum { RUNS = 4096, RUN_SECTORS = 32 };         /* 64 MiB in use */
  uint64_t capacity = 64 * GiB;
  int64_t before = atomic_load (&live_bytes);
  struct backing *backing = open_map (capacity);
  assert_non_null (backing);
  int64_t empty = atomic_load (&live_bytes) - before;
  print_message ("a %" PRIu64 " GiB map: %" PRId64 " bytes empty\n",
                 capacity / GiB, empty);
  /* 896 bytes per GiB of capacity, plus the struct. */
  assert_true (empty < (int64_t) (capacity / GiB * KiB + 64 * KiB));
  /* map_bytes says what the map takes: all but the struct. */
  struct backing_stats stats;
  backing_stats (backing, &stats);
  uint64_t map_empty = stats.map_bytes;
  assert_true (map_empty >= capacity / SECTOR / LEAF * sizeof (void *));
  assert_true (map_empty <= (uint64_t) empty);

  int64_t *runs = __real_malloc (RUNS * sizeof *runs);
  assert_non_null (runs);
  for (int i = 0; i < RUNS; i++) {
    runs[i] = backing_allocate (backing, RUN_SECTORS * SECTOR);
    assert_true (runs[i] >= 0);
  }
  int64_t used = atomic_load (&live_bytes) - before - empty;
  uint64_t in_use = (uint64_t) RUNS * RUN_SECTORS * SECTOR;
  print_message ("%" PRIu64 " MiB in use: the map grew by %" PRId64
                 " bytes\n", in_use / MiB, used);
  /* One bit and one checksum per sector in use, in whole leaves (+
   * malloc's rounding).
   */
  uint64_t leaves = (in_use / SECTOR + LEAF - 1) / LEAF;
  assert_true (used > 0);
  assert_true (used <= (int64_t) (leaves * (BACKING_MAP_LEAF_BYTES + 4096)));
  backing_stats (backing, &stats);
  assert_int_equal (stats.map_bytes, map_empty + leaves * BACKING_MAP_LEAF_BYTES);

  for (int i = 0; i < RUNS; i++)
    backing_release (backing, runs[i], RUN_SECTORS * SECTOR);
  assert_int_equal (atomic_load (&live_bytes) - before, empty);
  backing_stats (backing, &stats);
  assert_int_equal (stats.used, 0);
  assert_int_equal (stats.map_bytes, map_empty);
  assert_int_equal (stats.capacity, capacity);
  __real_free (runs);
  close_map (backing);
  assert_int_equal (atomic_load (&live_bytes), before);
}

/* A terabyte device: the figure the manual gives. */
static void
test_map_cost_terabyte (void **state)
{
  (void) state;
  int64_t before = atomic_load (&live_bytes);
  struct backing *backing = open_map (1024 * GiB);
  if (!backing) {
    print_message ("no 1 TiB sparse file here: skipped\n");
    return;
  }
  int64_t empty = atomic_load (&live_bytes) - before;
  struct backing_stats stats;
  backing_stats (backing, &stats);
  print_message ("a 1 TiB map: %" PRId64 " bytes empty, map_bytes %" PRIu64
                 "\n", empty, stats.map_bytes);
  assert_true (empty <= (int64_t) MiB);
  assert_true (stats.map_bytes <= (uint64_t) empty);
  close_map (backing);
}

/* ---- the run search --------------------------------------------------- */

/* Is there a free run of count sectors within one leaf? */
static bool
shadow_has_run (const uint8_t *owned, uint64_t sectors, uint64_t count)
{
  uint64_t length = 0;
  for (uint64_t i = 0; i < sectors; i++) {
    if (i % LEAF == 0)
      length = 0;
    length = owned[i] ? 0 : length + 1;
    if (length >= count)
      return true;
  }
  return false;
}

/* Random runs, mostly small, some up to 2048 sectors (a batch of 256 raw
 * blocks), over 2.5 leaves (the last one partial): runs never overlap,
 * stay inside the map, and a refusal (ENOSPC) means that no free run of
 * that length lies within a leaf.  Every sector is freed at the end.
 */
static void
test_run_search_random (void **state)
{
  (void) state;
  enum { STEPS = 20000, LIVE_MAX = 4000 };
  uint64_t sectors = LEAF * 5 / 2;
  struct backing *backing = open_map (sectors * SECTOR);
  assert_non_null (backing);
  uint8_t *owned = __real_calloc (sectors, 1);
  int64_t (*runs)[2] = __real_malloc (LIVE_MAX * sizeof *runs);
  assert_non_null (owned);
  assert_non_null (runs);
  uint64_t rng = 11, refused = 0, allocated = 0;
  unsigned live = 0;
  for (unsigned step = 0; step < STEPS; step++) {
    if (live > 0 && (live == LIVE_MAX || xorshift64 (&rng) % 5 < 2)) {
      unsigned k = xorshift64 (&rng) % live;
      backing_release (backing, runs[k][0] * SECTOR, runs[k][1] * SECTOR - 7);
      memset (owned + runs[k][0], 0, runs[k][1]);
      runs[k][0] = runs[live - 1][0];
      runs[k][1] = runs[live - 1][1];
      live--;
      continue;
    }
    uint64_t count = xorshift64 (&rng) % 16 == 0
      ? 1 + xorshift64 (&rng) % 2048 : 1 + xorshift64 (&rng) % 12;
    int64_t offset = backing_allocate (backing, count * SECTOR - 100);
    if (offset == -1) {
      assert_int_equal (errno, ENOSPC);
      if (shadow_has_run (owned, sectors, count))
        fail_msg ("step %u: %" PRIu64 " sectors refused, but a run is free",
                  step, count);
      refused++;
      continue;
    }
    assert_true (offset % SECTOR == 0);
    uint64_t first = offset / SECTOR;
    assert_true (first + count <= sectors);
    for (uint64_t i = first; i < first + count; i++) {
      if (owned[i])
        fail_msg ("step %u: sector %" PRIu64 " handed out twice", step, i);
      owned[i] = 1;
    }
    runs[live][0] = first;
    runs[live][1] = count;
    live++;
    allocated++;
  }
  struct backing_stats stats;
  backing_stats (backing, &stats);
  uint64_t used = 0;
  for (unsigned k = 0; k < live; k++)
    used += runs[k][1] * SECTOR;
  assert_int_equal (stats.used, used);
  print_message ("%" PRIu64 " runs allocated, %" PRIu64 " refused, %u live "
                 "(%" PRIu64 " KiB)\n", allocated, refused, live, used / KiB);
  assert_true (refused > 0);
  for (unsigned k = 0; k < live; k++)
    backing_release (backing, runs[k][0] * SECTOR, runs[k][1] * SECTOR);
  backing_stats (backing, &stats);
  assert_int_equal (stats.used, 0);
  /* Empty again: the whole map is one free run per leaf. */
  int64_t offset = backing_allocate (backing, LEAF * SECTOR);
  assert_int_equal (offset, 0);
  backing_release (backing, offset, LEAF * SECTOR);
  __real_free (owned);
  __real_free (runs);
  close_map (backing);
}

/* A full map and a fragmented one answer at once: the search does not
 * walk the whole map for each request.  A 2 GiB map (4 Mi sectors) is
 * filled with 8-sector runs, every other one freed (so every hole is 8
 * sectors), then asked 20000 times for 16 sectors (refused) and 8
 * sectors (found).
 */
static void
test_run_search_fragmented (void **state)
{
  (void) state;
  uint64_t capacity = 2 * GiB;
  uint64_t count = capacity / SECTOR / 8;
  struct backing *backing = open_map (capacity);
  assert_non_null (backing);
  struct timespec start;
  clock_gettime (CLOCK_MONOTONIC, &start);
  for (uint64_t i = 0; i < count; i++)
    assert_int_equal (backing_allocate (backing, 8 * SECTOR),
                      (int64_t) (i * 8 * SECTOR));
  double fill = seconds_since (&start);
  errno = 0;
  assert_int_equal (backing_allocate (backing, SECTOR), -1);
  assert_int_equal (errno, ENOSPC);
  for (uint64_t i = 0; i < count; i += 2)
    backing_release (backing, i * 8 * SECTOR, 8 * SECTOR);

  clock_gettime (CLOCK_MONOTONIC, &start);
  for (int i = 0; i < 20000; i++) {
    errno = 0;
    assert_int_equal (backing_allocate (backing, 16 * SECTOR), -1);
    assert_int_equal (errno, ENOSPC);
  }
  double refusals = seconds_since (&start);
  clock_gettime (CLOCK_MONOTONIC, &start);
  for (int i = 0; i < 20000; i++) {
    int64_t offset = backing_allocate (backing, 8 * SECTOR);
    assert_true (offset >= 0 && offset / SECTOR % 16 == 0);
  }
  double finds = seconds_since (&start);
  print_message ("2 GiB map: filled in %.2f s; 20000 refusals %.3f s, "
                 "20000 finds %.3f s\n", fill, refusals, finds);
  /* Walking the map each time would take minutes. */
  assert_true (refusals < 10 && finds < 10);
  close_map (backing);
}

/* Bytes in allocated runs now. */
static uint64_t
used_bytes (struct backing *backing)
{
  struct backing_stats stats;
  backing_stats (backing, &stats);
  return stats.used;
}

/* Runs released while a read is on wait for it (an epoch); once no
 * reader is about, one settle frees every run queued, those of both
 * epochs.  Runs left in the newer epoch were what CI's move stress once
 * found still allocated after everything had been trimmed and flushed.
 */
static void
test_release_epochs (void **state)
{
  (void) state;
  struct backing *backing = open_map (1 * GiB);
  assert_non_null (backing);
  int64_t first = backing_allocate (backing, 8 * SECTOR);
  int64_t second = backing_allocate (backing, 8 * SECTOR);
  assert_true (first >= 0 && second >= 0);

  /* No reader: freed at once. */
  int64_t third = backing_allocate (backing, 8 * SECTOR);
  assert_true (third >= 0);
  backing_release (backing, third, 8 * SECTOR);
  assert_int_equal (used_bytes (backing), 16 * SECTOR);

  /* A reader holds the first run past a settle (which moves the epoch
   * on); the second, released while that reader is still on, waits in
   * the next epoch.
   */
  unsigned reader = backing_read_begin (backing);
  backing_release (backing, first, 8 * SECTOR);
  backing_settle_releases (backing);
  backing_release (backing, second, 8 * SECTOR);
  assert_int_equal (used_bytes (backing), 16 * SECTOR);
  /* The reader done, one settle frees both epochs' runs. */
  backing_read_end (backing, reader);
  backing_settle_releases (backing);
  assert_int_equal (used_bytes (backing), 0);

  /* A reader of a later epoch holds only the runs released while it is
   * on.
   */
  first = backing_allocate (backing, 8 * SECTOR);
  second = backing_allocate (backing, 8 * SECTOR);
  assert_true (first >= 0 && second >= 0);
  reader = backing_read_begin (backing);
  backing_release (backing, first, 8 * SECTOR);
  backing_settle_releases (backing);
  unsigned later = backing_read_begin (backing);
  assert_int_not_equal (later, reader);
  backing_release (backing, second, 8 * SECTOR);
  backing_read_end (backing, reader);
  backing_settle_releases (backing);
  assert_int_equal (used_bytes (backing), 8 * SECTOR);
  backing_read_end (backing, later);
  backing_settle_releases (backing);
  assert_int_equal (used_bytes (backing), 0);
  close_map (backing);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_map_cost_follows_use),
    cmocka_unit_test (test_map_cost_terabyte),
    cmocka_unit_test (test_run_search_random),
    cmocka_unit_test (test_run_search_fragmented),
    cmocka_unit_test (test_release_epochs),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
