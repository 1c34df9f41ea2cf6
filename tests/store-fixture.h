/* The block store tests' shared fixture (tests/test-store-*.c): stores
 * made the usual ways, blocks whose bytes say which block and version
 * they are (block_fill, recomp_fill, text_fill) and their checks, a
 * scratch backing file, and the run of I/O threads against exact models
 * that the movers' tests run their rounds beside (run_beside_io_on).
 */
#ifndef ZRAM_TESTS_STORE_FIXTURE_H
#define ZRAM_TESTS_STORE_FIXTURE_H

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
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xorshift.h"
#include "store-walk.h"

#include "block-store.h"
#include "block-store-internal.h"  /* store_decode_cache_sweep */
#include "backing.h"

#define BS STORE_BLOCK_SIZE

/* The scratch file a test's backing store lives in: made empty by
 * backing_file_create, unlinked by the test that made it.
 */
static char backing_path[] = "/tmp/test-store-backing-XXXXXX";

static inline const char *
backing_file_create (void)
{
  strcpy (backing_path, "/tmp/test-store-backing-XXXXXX");
  int fd = mkstemp (backing_path);
  assert_true (fd >= 0);
  close (fd);
  return backing_path;
}

static inline struct block_store *
make_store (uint64_t size, enum codec_algorithm algorithm, uint64_t mem_limit)
{
  struct store_config config = { .size = size, .algorithm = algorithm,
                                 .level = 1 };
  zs_pool_config_init (&config.pool);
  config.pool.mem_limit = mem_limit;
  struct block_store *store = store_create (&config);
  assert_non_null (store);
  return store;
}

/* A block whose bytes say which block and which version they are:
 * word 0 = block, word 1 = version, the rest a function of both, half of
 * it compressible.  block_check tells whether a buffer is such a block
 * (or all zeros) for the expected block number.
 */
static inline void
block_fill (unsigned char *buf, uint64_t block, uint64_t version)
{
  uint64_t *words = (uint64_t *) buf;
  uint64_t state = block * 0x9e3779b97f4a7c15ull + version + 1;
  words[0] = block;
  words[1] = version;
  for (size_t i = 2; i < BS / 8; i++)
    words[i] = i < BS / 16 ? xorshift64 (&state) : block ^ version;
}

static inline bool
block_check (const unsigned char *buf, uint64_t block)
{
  static const unsigned char zeros[BS];
  if (memcmp (buf, zeros, BS) == 0)
    return true;
  unsigned char expected[BS];
  uint64_t version;
  memcpy (&version, buf + 8, 8);
  block_fill (expected, block, version);
  return memcmp (buf, expected, BS) == 0;
}

/* Text-like content (words of a small vocabulary in a random order):
 * lz4 leaves room that zstd takes, so recompression has work.  Kinds:
 * text, random (stored raw, shrinks with nothing), same-filled.
 */
static inline void
recomp_fill (unsigned char *buf, uint64_t block, uint64_t version)
{
  static const char *const words[] = {
    "alpha ", "beta ", "gamma ", "delta ", "epsilon ", "zeta ", "eta ",
    "theta ", "iota ", "kappa ", "lambda ", "mu ", "nu ", "xi ", "omicron ",
    "pi ", "rho ", "sigma ", "tau ", "upsilon ", "phi ", "chi ", "psi ",
    "omega ", "block ", "store ", "zspage ", "class ", "handle ", "cell ",
  };
  uint64_t state = block * 0x9e3779b97f4a7c15ull + version * 7919 + 1;
  switch (block % 8) {
  case 0:                       /* random: raw */
    for (size_t i = 0; i < BS; i += 8) {
      uint64_t word = xorshift64 (&state);
      memcpy (buf + i, &word, 8);
    }
    break;
  case 1:                       /* same-filled: no header */
    memset (buf, (int) (block + version), BS);
    return;
  default: {
    size_t used = 0;
    while (used < BS) {
      const char *word = words[xorshift64 (&state) % 30];
      size_t length = strlen (word);
      if (length > BS - used)
        length = BS - used;
      memcpy (buf + used, word, length);
      used += length;
    }
  }
  }
  memcpy (buf, &block, 8);
  memcpy (buf + 8, &version, 8);
}

/* Every block reads back as the model says (version 0: never written). */
static inline void
recomp_verify (struct block_store *store, const uint64_t *versions,
               const bool *present, uint64_t first, uint64_t count)
{
  unsigned char got[BS], want[BS];
  for (uint64_t b = first; b < first + count; b++) {
    assert_int_equal (store_read (store, got, BS, b * BS), 0);
    if (present[b])
      recomp_fill (want, b, versions[b]);
    else
      memset (want, 0, BS);
    if (memcmp (got, want, BS) != 0)
      fail_msg ("block %" PRIu64 " (version %" PRIu64 ") differs", b,
                versions[b]);
  }
}

/* Recompression beside I/O: threads own disjoint ranges and write, patch,
 * trim and verify them against their own model while the main thread
 * marks everything idle and recompresses, again and again.
 */
enum { RECOMP_THREADS = 3, RECOMP_RANGE = 128 };

struct recomp_worker {
  struct block_store *store;
  uint64_t first;
  uint64_t versions[RECOMP_RANGE];
  bool present[RECOMP_RANGE];
  atomic_bool *stop;
  uint64_t operations;
  pthread_t thread;
};

static inline void *
recomp_worker_main (void *arg)
{
  struct recomp_worker *w = arg;
  uint64_t rng = w->first * 31 + 7;
  unsigned char buf[BS], got[BS];
  while (!atomic_load (w->stop)) {
    unsigned i = xorshift64 (&rng) % RECOMP_RANGE;
    uint64_t b = w->first + i;
    switch (xorshift64 (&rng) % 4) {
    case 0: case 1:
      w->versions[i]++;
      recomp_fill (buf, b, w->versions[i]);
      if (store_write (w->store, buf, BS, b * BS) == -1)
        return (void *) "write failed";
      w->present[i] = true;
      break;
    case 2:
      if (store_trim (w->store, BS, b * BS) == -1)
        return (void *) "trim failed";
      w->present[i] = false;
      break;
    default:
      if (store_read (w->store, got, BS, b * BS) == -1)
        return (void *) "read failed";
      if (w->present[i])
        recomp_fill (buf, b, w->versions[i]);
      else
        memset (buf, 0, BS);
      if (memcmp (got, buf, BS) != 0)
        return (void *) "a block read back wrong";
    }
    w->operations++;
  }
  return NULL;
}

/* Threads own disjoint ranges and write, patch, trim and verify them
 * against their own model while the main thread marks everything idle
 * and runs one round of work (recompression or packing), 60 times.
 * Returns the blocks the rounds handled; every block is verified.
 */
static inline uint64_t
run_beside_io_on (struct block_store *store,
                  uint64_t (*round_work) (struct block_store *store, int round),
                  const char *what)
{
  atomic_bool stop = false;
  struct recomp_worker *workers = calloc (RECOMP_THREADS, sizeof *workers);
  assert_non_null (workers);
  unsigned char buf[BS];
  for (unsigned t = 0; t < RECOMP_THREADS; t++) {
    workers[t].store = store;
    workers[t].first = t * RECOMP_RANGE;
    workers[t].stop = &stop;
    for (unsigned i = 0; i < RECOMP_RANGE; i++) {
      workers[t].versions[i] = 1;
      workers[t].present[i] = true;
      recomp_fill (buf, workers[t].first + i, 1);
      assert_int_equal (store_write (store, buf, BS, (workers[t].first + i) * BS), 0);
    }
  }
  for (unsigned t = 0; t < RECOMP_THREADS; t++)
    assert_int_equal (pthread_create (&workers[t].thread, NULL,
                                      recomp_worker_main, &workers[t]), 0);
  uint64_t handled = 0;
  for (int round = 0; round < 60; round++) {
    store_mark_idle (store, 0, NULL, NULL);
    handled += round_work (store, round);
  }
  atomic_store (&stop, true);
  uint64_t operations = 0;
  for (unsigned t = 0; t < RECOMP_THREADS; t++) {
    void *failure;
    pthread_join (workers[t].thread, &failure);
    if (failure)
      fail_msg ("worker %u: %s", t, (const char *) failure);
    operations += workers[t].operations;
  }
  print_message ("%s beside I/O: %" PRIu64 " blocks in 60 rounds, %" PRIu64
                 " operations\n", what, handled, operations);
  for (unsigned t = 0; t < RECOMP_THREADS; t++) {
    uint64_t versions[RECOMP_THREADS * RECOMP_RANGE] = { 0 };
    bool present[RECOMP_THREADS * RECOMP_RANGE] = { false };
    memcpy (versions + workers[t].first, workers[t].versions,
            sizeof workers[t].versions);
    memcpy (present + workers[t].first, workers[t].present,
            sizeof workers[t].present);
    recomp_verify (store, versions, present, workers[t].first, RECOMP_RANGE);
  }
  free (workers);
  store_destroy (store);
  return handled;
}

/* Text of the same words in every block: units of them save memory. */
static inline void
text_fill (unsigned char *buf, uint64_t block, unsigned version)
{
  recomp_fill (buf, block * 8 + 2, version);
}

#endif /* ZRAM_TESTS_STORE_FIXTURE_H */
