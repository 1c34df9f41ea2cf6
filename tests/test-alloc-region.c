/* A pool in a region, handed from one process to another: the region's
 * heap, a clean handover checked object by object, a crash reported as
 * one, and every bad region refused with nothing in it written
 * (alloc/region.h).
 */

#include "alloc-fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/shm.h>

#include "crc32c.h"
#include "region-fixture.h"

#define REGION_BYTES (256u << 20)
#define DEVICE_BYTES (1ull << 30)
#define OBJECTS 20000

/* What the filling process leaves for the next one: the user's root. */
struct handover_root {
  struct zs_pool *pool;
  unsigned count;
  zs_handle_t handles[OBJECTS];
  uint16_t sizes[OBJECTS];
};

/* ---- the heap ------------------------------------------------------------ */

/* The ready list's length, each page on it checked free and resident. */
static uint64_t
ready_list_length (struct region *region)
{
  uint64_t length = 0, previous = REGION_NO_PAGE;
  for (uint64_t p = region->ready_head; p != REGION_NO_PAGE;
       p = region_pages (region)[p].next) {
    assert_int_equal (region_pages (region)[p].kind, REGION_PAGE_FREE_RESIDENT);
    assert_int_equal (region_pages (region)[p].prev, previous);
    previous = p;
    length++;
  }
  return length;
}

/* Random sizes from slabs and runs, each filled with its own byte, freed
 * in random order: no two allocations overlap (every byte is still its
 * owner's at the end), the heap empties, a trim gives back what stayed
 * resident, and a full region refuses with ENOMEM.
 */
static void
test_region_heap (void **state)
{
  (void) state;
  struct region_owner *owner = region_create (region_path ("heap"), 64u << 20,
                                              DEVICE_BYTES, false);
  assert_non_null (owner);
  struct region *region = owner->region;
  uint64_t seed = 42;
  enum { N = 3000 };
  static void *p[N];
  static size_t bytes[N];
  for (unsigned i = 0; i < N; i++) {
    bytes[i] = xorshift64 (&seed) % 4 == 0
      ? rnd_range (&seed, 1025, 5 * PAGE) : rnd_range (&seed, 1, 1024);
    size_t align = (size_t) 1 << rnd_range (&seed, 0, 6);
    p[i] = region_alloc (region, bytes[i], align);
    assert_non_null (p[i]);
    assert_int_equal ((uintptr_t) p[i] % align, 0);
    memset (p[i], i & 0xff, bytes[i]);
  }
  for (unsigned i = N; i-- > 1;) {       /* shuffle, then free in order */
    unsigned j = xorshift64 (&seed) % (i + 1);
    void *tp = p[i]; p[i] = p[j]; p[j] = tp;
    size_t tb = bytes[i]; bytes[i] = bytes[j]; bytes[j] = tb;
  }
  for (unsigned i = 0; i < N; i++) {
    const unsigned char *b = p[i];
    unsigned char want = b[0];
    for (size_t k = 0; k < bytes[i]; k++)
      if (b[k] != want)
        fail_msg ("allocation of %zu bytes at %p: byte %zu is %#x, not %#x",
                  bytes[i], p[i], k, b[k], want);
    region_free (region, p[i]);
  }
  assert_int_equal (region->pages_taken, 0);
  uint64_t resident = region->pages_resident_free;
  assert_true (resident > 0);
  assert_int_equal (region_trim (region), resident);
  assert_int_equal (region->pages_resident_free, 0);

  /* Ready pages: made resident ahead, listed, and what a small
   * allocation takes first (resident: no fault on a swap write).
   */
  assert_true (region_make_ready (region, 64 * PAGE) >= 64 * PAGE);
  uint64_t ready = region->pages_resident_free;
  assert_true (ready >= 64);
  assert_int_equal (ready_list_length (region), ready);
  void *slab = region_alloc (region, 100, 8);
  void *page = region_alloc (region, PAGE, PAGE);
  assert_non_null (slab);
  assert_non_null (page);
  assert_int_equal (region->pages_resident_free, ready - 2);
  assert_int_equal (ready_list_length (region), ready - 2);
  unsigned char in_memory = 0;
  assert_int_equal (mincore (page, PAGE, &in_memory), 0);
  assert_true (in_memory & 1);
  region_free (region, slab);
  region_free (region, page);
  assert_int_equal (region->pages_taken, 0);
  assert_int_equal (ready_list_length (region), ready);
  assert_int_equal (region_trim (region), ready);
  assert_int_equal (ready_list_length (region), 0);

  /* Mapping what the region holds maps no hole (a punched run stays
   * out of memory), and maps at least the header.
   */
  char *run = region_alloc (region, 32 * PAGE, PAGE);
  assert_non_null (run);
  memset (run, 1, 32 * PAGE);
  region_free (region, run);
  assert_true (region_map_resident (region) >= 1);   /* the header */
  unsigned char run_in_memory[32];
  assert_int_equal (mincore (run, 32 * PAGE, run_in_memory), 0);
  for (unsigned i = 0; i < 32; i++)
    assert_false (run_in_memory[i] & 1);

  /* Full: runs until none fits, then the refusal. */
  unsigned runs = 0;
  while (region_alloc (region, 1 << 20, PAGE))
    runs++;
  assert_int_equal (errno, ENOMEM);
  assert_true (runs >= 60);
  region_destroy (owner);
}

/* ---- handover ------------------------------------------------------------ */

/* In a child: a region at path with a pool of OBJECTS objects of seeded
 * sizes (every class, huge ones too), a third freed again (in batches,
 * still pending until the handover drains them), the pool compacted;
 * then handed over cleanly (clean: the child exits) or left as a crash
 * leaves it (the child waits to be killed with SIGKILL).  Returns once
 * the region is ready for the parent.
 */
static pid_t
fill_in_child (const char *path, bool clean)
{
  int ready[2];
  assert_int_equal (pipe (ready), 0);
  pid_t pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    close (ready[0]);
    struct region_owner *owner = region_create (path, REGION_BYTES,
                                                DEVICE_BYTES, false);
    if (!owner)
      _exit (3);
    region_start_serving (owner);
    struct region *region = owner->region;
    struct zs_pool_config config;
    zs_pool_config_init (&config);
    config.region = region;
    struct zs_pool *pool = zs_pool_create (&config);
    struct handover_root *root = region_alloc (region, sizeof *root, 64);
    if (!pool || !root)
      _exit (4);
    root->pool = pool;
    root->count = OBJECTS;
    uint64_t seed = 7;
    for (unsigned i = 0; i < OBJECTS; i++) {
      root->sizes[i] = rnd_range (&seed, 1, PAGE);
      root->handles[i] = alloc_written (pool, root->sizes[i], i);
    }
    for (unsigned i = 0; i < OBJECTS; i += 3) {
      zs_free (pool, root->handles[i]);
      root->handles[i] = 0;
    }
    zs_compact (pool);
    region_set_root (region, root, 1);
    if (clean) {
      zs_pool_hand_over (pool);
      region_hand_over (owner, 1);
    }
    if (write (ready[1], "r", 1) != 1)
      _exit (2);
    if (clean)
      _exit (0);
    pause ();                   /* until the parent kills it */
    _exit (5);
  }
  close (ready[1]);
  char byte;
  assert_int_equal (read (ready[0], &byte, 1), 1);
  close (ready[0]);
  return pid;
}

static void
test_handover_clean (void **state)
{
  (void) state;
  int status;
  const char *path = region_path ("clean");
  pid_t pid = fill_in_child (path, true);
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFEXITED (status) && WEXITSTATUS (status) == 0);

  struct region_owner *owner = region_attach_expecting (path, DEVICE_BYTES,
                                                        REGION_ATTACH_CLEAN);
  struct region *region = owner->region;
  assert_int_equal (region->current.state, REGION_HANDED_OVER);
  region_start_serving (owner);
  assert_int_equal (region->current.generation, 2);
  assert_int_equal (region->current.state, REGION_SERVING);
  assert_int_equal (region->current.recoveries, 0);
  assert_int_equal (region->current.user_version, 1);

  /* A second taker, while this process owns it: refused. */
  enum region_attach_result how2;
  char why[256] = "";
  assert_null (region_attach (path, DEVICE_BYTES, &how2, why, sizeof why));
  assert_int_equal (errno, EBUSY);
  assert_non_null (strstr (why, "owned by another process"));

  struct handover_root *root = region_root (region);
  struct zs_pool *pool = zs_pool_take_over (root->pool);
  unsigned live = 0;
  for (unsigned i = 0; i < root->count; i++)
    if (root->handles[i]) {
      assert_true (object_ok (pool, root->handles[i], root->sizes[i], i));
      live++;
    }
  assert_int_equal (live, OBJECTS - (OBJECTS + 2) / 3);
  check_stats_consistent (pool);
  struct zs_pool_stats st;
  get_stats (pool, &st);
  assert_int_equal (st.objects, live);

  /* The pool serves on: new objects, frees, a compaction. */
  uint64_t seed = 99;
  for (unsigned i = 0; i < root->count; i += 3) {
    root->sizes[i] = rnd_range (&seed, 1, PAGE);
    root->handles[i] = alloc_written (pool, root->sizes[i], i);
  }
  for (unsigned i = 1; i < root->count; i += 2) {
    zs_free (pool, root->handles[i]);
    root->handles[i] = 0;
  }
  zs_compact (pool);
  for (unsigned i = 0; i < root->count; i++)
    if (root->handles[i])
      assert_true (object_ok (pool, root->handles[i], root->sizes[i], i));
  check_stats_consistent (pool);

  /* Everything the pool held goes back to the region: nothing leaked. */
  zs_pool_destroy (pool);
  region_free (region, root);
  assert_int_equal (region->pages_taken, 0);
  region_destroy (owner);
}

/* ADDRESS RESERVATION: an attach finds the region's address taken by a
 * mapping of its own and is refused, the memory untouched; a process
 * that kept the range first (a standby) finds it kept - nothing else
 * can map there - and attaches over it; a second reservation, or one
 * for no region, is refused.
 */
static void
test_address_reserved (void **state)
{
  (void) state;
  int status;
  const char *path = region_path ("reserved");
  enum region_attach_result how;
  char why[256] = "";
  errno = 0;
  assert_int_equal (region_reserve_address (path), -1);
  assert_int_equal (errno, ENOENT);
  pid_t pid = fill_in_child (path, true);
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFEXITED (status) && WEXITSTATUS (status) == 0);

  /* Where it goes: attached once, and left as it was. */
  struct region_owner *owner = region_attach_expecting (path, DEVICE_BYTES,
                                                        REGION_ATTACH_CLEAN);
  void *address = owner->region;
  region_close (owner);

  void *blocker = mmap ((char *) address + REGION_BYTES / 2, 4096, PROT_READ,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                        -1, 0);
  assert_ptr_equal (blocker, (char *) address + REGION_BYTES / 2);
  assert_null (region_attach (path, DEVICE_BYTES, &how, why, sizeof why));
  assert_int_equal (errno, EEXIST);
  assert_non_null (strstr (why, "this process has something there already"));
  errno = 0;
  assert_int_equal (region_reserve_address (path), -1);
  assert_int_equal (errno, EEXIST);
  munmap (blocker, 4096);

  assert_int_equal (region_reserve_address (path), 0);
  errno = 0;
  assert_int_equal (region_reserve_address (path), -1);
  assert_int_equal (errno, EALREADY);
  blocker = mmap ((char *) address + REGION_BYTES / 2, 4096, PROT_READ,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  assert_ptr_equal (blocker, MAP_FAILED);
  assert_int_equal (errno, EEXIST);

  owner = region_attach_expecting (path, DEVICE_BYTES, REGION_ATTACH_CLEAN);
  assert_ptr_equal (owner->region, address);
  region_start_serving (owner);
  struct handover_root *root = region_root (owner->region);
  struct zs_pool *pool = zs_pool_take_over (root->pool);
  for (unsigned i = 0; i < root->count; i++)
    if (root->handles[i])
      assert_true (object_ok (pool, root->handles[i], root->sizes[i], i));
  check_stats_consistent (pool);
  /* Consumed: a new reservation may be made (none is kept now). */
  zs_pool_destroy (pool);
  region_free (owner->region, root);
  region_destroy (owner);
  assert_int_equal (region_reserve_address (path), -1);
  assert_int_equal (errno, ENOENT);
}

/* A killed owner: the next attach reports the crash (the recovery that
 * rebuilds the pool is the caller's), and the region is not "handed
 * over" in anyone's eyes.
 */
static void
test_crash_reported (void **state)
{
  (void) state;
  int status;
  const char *path = region_path ("crash");
  pid_t pid = fill_in_child (path, false);
  kill (pid, SIGKILL);
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFSIGNALED (status));

  struct region_owner *owner = region_attach_expecting (path, DEVICE_BYTES,
                                                        REGION_ATTACH_CRASHED);
  struct region *region = owner->region;
  region_start_serving (owner);
  assert_int_equal (region->current.generation, 2);
  assert_int_equal (region->current.recoveries, 1);
  region_destroy (owner);
}

/* ---- recovery after a crash --------------------------------------------- */

#define CRASH_SLOTS 4096
#define CRASH_THREADS 2
#define CRASH_RESERVE (4u << 20)     /* taken by new zspages, refilled */

/* What the killed child publishes, in memory both processes share: a
 * handle is published once its object is written, unpublished before it
 * is freed - the "acknowledged" objects.
 */
struct crash_shared {
  _Atomic zs_handle_t handles[CRASH_SLOTS];
  uint16_t sizes[CRASH_SLOTS];
  _Atomic uint32_t keys[CRASH_SLOTS];
  _Atomic unsigned rounds;
};

struct crash_worker {
  struct zs_pool *pool;
  struct crash_shared *shared;
  unsigned first, count;
  uint64_t seed;
};

static void *
crash_worker_main (void *arg)
{
  struct crash_worker *w = arg;
  for (uint32_t round = 1;; round++) {
    unsigned i = w->first + xorshift64 (&w->seed) % w->count;
    zs_handle_t old = atomic_exchange (&w->shared->handles[i], 0);
    if (old)
      zs_free (w->pool, old);
    size_t size = rnd_range (&w->seed, 1, PAGE);
    uint32_t key = (uint32_t) (i * 7919 + round);
    zs_handle_t h = zs_malloc (w->pool, size);
    if (!h)
      continue;
    write_pattern (w->pool, h, size, key);
    w->shared->sizes[i] = size;
    atomic_store (&w->shared->keys[i], key);
    atomic_store (&w->shared->handles[i], h);
  }
  return NULL;
}

/* The child: a pool filled, then threads replacing objects and a mover
 * compacting until the parent kills it.
 */
static void
crash_child (const char *path, struct crash_shared *shared, uint64_t seed)
{
  struct region_owner *owner = region_create (path, 64u << 20, DEVICE_BYTES,
                                              false);
  if (!owner)
    _exit (3);
  region_start_serving (owner);
  struct zs_pool_config config;
  zs_pool_config_init (&config);
  config.region = owner->region;
  config.chain_pages = 1 + seed % ZS_CHAIN_MAX;
  config.reserve_bytes = CRASH_RESERVE;
  struct zs_pool *pool = zs_pool_create (&config);
  if (!pool)
    _exit (4);
  region_set_root (owner->region, pool, 1);
  struct crash_worker workers[CRASH_THREADS];
  for (unsigned t = 0; t < CRASH_THREADS; t++) {
    workers[t] = (struct crash_worker) {
      .pool = pool, .shared = shared, .first = t * (CRASH_SLOTS / CRASH_THREADS),
      .count = CRASH_SLOTS / CRASH_THREADS, .seed = seed * 31 + t + 1,
    };
    pthread_t thread;
    if (pthread_create (&thread, NULL, crash_worker_main, &workers[t]) != 0)
      _exit (5);
  }
  for (;;) {
    zs_compact (pool);
    zs_pool_reserve_refill (pool);
    if (atomic_fetch_add (&shared->rounds, 1) % 8 == 0)
      zs_pool_flush (pool);
  }
}

/* Recover the pool the killed child left: every published object read
 * back exactly, the pool consistent, and once every object is freed,
 * nothing of the region taken but the pool itself.
 */
static void
crash_recover_and_check (const char *path, struct crash_shared *shared,
                         unsigned *checked, uint64_t *reserve_kept)
{
  enum region_attach_result how;
  char why[256] = "";
  struct region_owner *owner = region_attach (path, DEVICE_BYTES, &how, why,
                                              sizeof why);
  if (!owner && errno == ENOENT) {
    /* Killed while it made the region: nothing can have been written. */
    for (unsigned i = 0; i < CRASH_SLOTS; i++)
      assert_int_equal (shared->handles[i], 0);
    unlink (path);
    return;
  }
  if (!owner)
    fail_msg ("region_attach: %s", why);
  struct region *region = owner->region;
  struct zs_pool *pool = region_root (region);
  if (how == REGION_ATTACH_CLEAN || !pool) {
    /* Killed before it served (a new region is clean until then), or
     * before its pool was made: nothing written either.
     */
    assert_null (how == REGION_ATTACH_CLEAN ? pool : NULL);
    for (unsigned i = 0; i < CRASH_SLOTS; i++)
      assert_int_equal (shared->handles[i], 0);
    region_destroy (owner);
    return;
  }
  region_recover_begin (region);
  struct zs_recovery *recovery = zs_recover_begin (pool);
  assert_non_null (recovery);
  for (unsigned i = 0; i < CRASH_SLOTS; i++)
    if (shared->handles[i] && !zs_recover_handle (recovery, shared->handles[i]))
      fail_msg ("slot %u: handle %#jx refused", i,
                (uintmax_t) shared->handles[i]);
  struct zs_recover_result result;
  assert_int_equal (zs_recover_end (recovery, 0, &result), 0);
  assert_int_equal (result.refused, 0);
  region_recover_end (region);
  region_start_serving (owner);

  unsigned live = 0;
  for (unsigned i = 0; i < CRASH_SLOTS; i++)
    if (shared->handles[i]) {
      if (!object_ok (pool, shared->handles[i], shared->sizes[i],
                      shared->keys[i]))
        fail_msg ("slot %u: the object differs from what was written", i);
      live++;
    }
  assert_int_equal (result.objects, live);
  check_stats_consistent (pool);
  struct zs_pool_stats st;
  get_stats (pool, &st);
  assert_int_equal (st.objects, live);
  /* The reserve's chunks were kept (but one being taken, perhaps), each
   * charged: what the limit account holds is the pages, the reserve and
   * the metadata.
   */
  assert_true (st.reserve_bytes <= CRASH_RESERVE);
  *reserve_kept += st.reserve_bytes;
  /* It serves on: new objects take the free slots and cells, and none
   * lands on a recovered one (a slot or cell both free and in use would
   * show here); then everything is given back.
   */
  enum { MORE = 3000 };
  static zs_handle_t more[MORE];
  static uint16_t more_sizes[MORE];
  uint64_t seed = live;
  for (unsigned i = 0; i < MORE; i++) {
    more_sizes[i] = rnd_range (&seed, 1, PAGE);
    more[i] = alloc_written (pool, more_sizes[i], 1000000 + i);
  }
  zs_compact (pool);
  for (unsigned i = 0; i < CRASH_SLOTS; i++)
    if (shared->handles[i]
        && !object_ok (pool, shared->handles[i], shared->sizes[i],
                       shared->keys[i]))
      fail_msg ("slot %u: overwritten by an object allocated after recovery", i);
  for (unsigned i = 0; i < MORE; i++) {
    assert_true (object_ok (pool, more[i], more_sizes[i], 1000000 + i));
    zs_free (pool, more[i]);
  }
  for (unsigned i = 0; i < CRASH_SLOTS; i++)
    if (shared->handles[i])
      zs_free (pool, shared->handles[i]);
  zs_pool_flush (pool);
  get_stats (pool, &st);
  assert_int_equal (st.objects, 0);
  assert_int_equal (st.pages_used, 0);
  zs_pool_destroy (pool);
  assert_int_equal (region->pages_taken, 0);
  region_destroy (owner);
  *checked += live;
}

/* Kill points: a child killed with SIGKILL at a random instant of a
 * write-heavy, mover-heavy run, a hundred times.
 */
static void
test_crash_recovered (void **state)
{
  (void) state;
  struct crash_shared *shared = mmap (NULL, sizeof *shared,
                                      PROT_READ | PROT_WRITE,
                                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true (shared != MAP_FAILED);
  const char *path = region_path ("kill-points");
  uint64_t seed = 2026;
  unsigned points = 100, checked = 0;
  uint64_t reserve_kept = 0;
  for (unsigned point = 0; point < points; point++) {
    memset (shared, 0, sizeof *shared);
    pid_t pid = fork ();
    assert_true (pid >= 0);
    if (pid == 0)
      crash_child (path, shared, seed + point);
    /* Let it fill a little, then kill it anywhere. */
    useconds_t delay = 2000 + xorshift64 (&seed) % 40000;
    usleep (delay);
    kill (pid, SIGKILL);
    int status;
    assert_int_equal (waitpid (pid, &status, 0), pid);
    if (!WIFSIGNALED (status))
      fail_msg ("kill point %u: the child exited (status %#x)", point, status);
    crash_recover_and_check (path, shared, &checked, &reserve_kept);
  }
  print_message ("%u kill points: %u published objects read back exactly, "
                 "%" PRIu64 " MiB of reserve kept, no page left taken\n",
                 points, checked, reserve_kept >> 20);
  /* The reserve outlives the crashes: most points kept some of it. */
  assert_true (reserve_kept >= (uint64_t) points * CRASH_RESERVE / 4);
  munmap (shared, sizeof *shared);
}

/* ---- refusals ------------------------------------------------------------ */

/* A region made here and closed (its owner gone, its state "serving"):
 * its segment's id.
 */
static int
closed_region (const char *path)
{
  struct region_owner *owner = region_create (path, 16u << 20, DEVICE_BYTES,
                                              false);
  assert_non_null (owner);
  region_start_serving (owner);
  int shm_id = owner->shm_id;
  region_close (owner);
  return shm_id;
}

/* The header of a segment, read or written in place. */
static void
header_read (int shm_id, struct region *header)
{
  void *p = shmat (shm_id, NULL, 0);
  assert_true (p != (void *) -1);
  memcpy (header, p, sizeof *header);
  shmdt (p);
}

static void
header_write (int shm_id, const struct region *header)
{
  void *p = shmat (shm_id, NULL, 0);
  assert_true (p != (void *) -1);
  memcpy (p, header, sizeof *header);
  shmdt (p);
}

/* A region file naming segment shm_id as device id (hex). */
static void
region_file_point (const char *path, int shm_id, const char *id)
{
  FILE *fp = fopen (path, "w");
  assert_non_null (fp);
  fprintf (fp, "nbdkit-zram region key=0 shm=%d device=%s\n", shm_id, id);
  fclose (fp);
}

static void
segment_remove (int shm_id)
{
  shmctl (shm_id, IPC_RMID, NULL);
}

/* Attach must refuse the region at path with err and a message
 * containing text, and leave the first page of its segment (if any) as
 * it was.
 */
static void
refused (const char *path, int shm_id, uint64_t device_bytes, int err,
         const char *text)
{
  unsigned char before[PAGE], after[PAGE];
  struct shmid_ds info;
  size_t bytes = shm_id >= 0 && shmctl (shm_id, IPC_STAT, &info) == 0
    ? (info.shm_segsz < PAGE ? info.shm_segsz : PAGE) : 0;
  void *p = bytes ? shmat (shm_id, NULL, SHM_RDONLY) : NULL;
  if (bytes)
    memcpy (before, p, bytes);
  enum region_attach_result how;
  char why[256] = "";
  struct region_owner *owner = region_attach (path, device_bytes, &how, why,
                                              sizeof why);
  if (owner)
    fail_msg ("attach accepted what it should refuse (%s)", text);
  assert_int_equal (errno, err);
  if (!strstr (why, text))
    fail_msg ("refusal \"%s\" does not say \"%s\"", why, text);
  if (bytes) {
    memcpy (after, p, bytes);
    shmdt (p);
    assert_memory_equal (before, after, bytes);
  }
}

static void
test_refusals (void **state)
{
  (void) state;
  struct region header;
  const char *path = region_path ("refusals");
  const char *zeros = "00000000000000000000000000000000";

  /* No region file; a file naming a segment that is gone. */
  refused (path, -1, 0, ENOENT, "no region file");
  int gone = closed_region (path);
  segment_remove (gone);
  refused (path, -1, 0, ENOENT, "names no segment");

  /* Memory of something else. */
  int other = shmget (IPC_PRIVATE, 1 << 20, IPC_CREAT | 0600);
  assert_true (other >= 0);
  void *p = shmat (other, NULL, 0);
  memcpy (p, "something else", 14);
  shmdt (p);
  region_file_point (path, other, zeros);
  refused (path, other, 0, EINVAL, "not an nbdkit-zram region");
  segment_remove (other);

  /* Smaller than a header. */
  int tiny = shmget (IPC_PRIVATE, 100, IPC_CREAT | 0600);
  assert_true (tiny >= 0);
  region_file_point (path, tiny, zeros);
  refused (path, tiny, 0, EINVAL, "smaller than a region's header");
  segment_remove (tiny);

  /* A region's header in a segment of another size: truncated. */
  int shm_id = closed_region (path);
  header_read (shm_id, &header);
  int truncated = shmget (IPC_PRIVATE, 8 << 20, IPC_CREAT | 0600);
  assert_true (truncated >= 0);
  header_write (truncated, &header);
  FILE *fp = fopen (path, "r");
  char line[128];
  assert_non_null (fgets (line, sizeof line, fp));
  fclose (fp);
  char id[33];
  assert_int_equal (sscanf (line, "nbdkit-zram region key=%*x shm=%*d device=%32s",
                            id), 1);
  region_file_point (path, truncated, id);
  refused (path, truncated, 0, EINVAL, "truncated");
  segment_remove (truncated);

  /* The file names another region's device id: another device. */
  region_file_point (path, shm_id, zeros);
  refused (path, shm_id, 0, EINVAL, "memory of another device");
  region_file_point (path, shm_id, id);

  /* Another device's size. */
  refused (path, shm_id, DEVICE_BYTES / 2, EINVAL, "memory of another device");

  /* Its address taken in this process. */
  void *want = (void *) (uintptr_t) header.base_address;
  void *squatter = mmap (want, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS
                         | MAP_FIXED_NOREPLACE, -1, 0);
  assert_ptr_equal (squatter, want);
  refused (path, shm_id, DEVICE_BYTES, EEXIST, "where its pointers need it");
  munmap (squatter, PAGE);

  /* A damaged state: both its copies (one alone is a torn write,
   * test_state_torn).
   */
  struct region damaged = header;
  damaged.current.root ^= 64;
  damaged.journal.root ^= 64;
  header_write (shm_id, &damaged);
  refused (path, shm_id, 0, EINVAL, "state is damaged");

  /* A damaged identity. */
  damaged = header;
  damaged.region_bytes ^= 1 << 12;
  header_write (shm_id, &damaged);
  refused (path, shm_id, 0, EINVAL, "header is damaged");

  /* A newer layout, with a checksum that holds. */
  damaged = header;
  damaged.layout_version = REGION_LAYOUT_VERSION + 1;
  damaged.identity_checksum
    = crc32c (&damaged, offsetof (struct region, identity_checksum));
  header_write (shm_id, &damaged);
  refused (path, shm_id, 0, EPROTO, "layout version");

  /* Whole again, the same region is taken (a crash left it: closed
   * while serving); a second taker meanwhile is refused.
   */
  header_write (shm_id, &header);
  struct region_owner *owner = region_attach_expecting (path, DEVICE_BYTES,
                                                        REGION_ATTACH_CRASHED);
  refused (path, shm_id, 0, EBUSY, "owned by another process");
  region_destroy (owner);
  refused (path, -1, 0, ENOENT, "no region file");
}

/* The state's step to kill at (region_recovery_step in a child). */
static const char *kill_at_step;

static void
kill_at (const char *step)
{
  if (kill_at_step && strcmp (step, kill_at_step) == 0)
    raise (SIGKILL);
}

/* A change of state killed half way (STATE WRITES in region.h): after
 * its journal copy, the old state holds; inside its current copy (its
 * generation written, its checksum not yet: what a kill there leaves),
 * the journal's new state holds.  Neither is "damaged".
 */
static void
test_state_torn (void **state)
{
  (void) state;
  const char *path = region_path ("torn");
  struct region_owner *owner = region_create (path, 16u << 20, DEVICE_BYTES,
                                              false);
  assert_non_null (owner);
  int shm_id = owner->shm_id;
  region_set_root (owner->region, owner->region, 1);
  region_hand_over (owner, 1);

  /* A server killed inside region_start_serving, its journal written. */
  pid_t pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    enum region_attach_result how;
    char why[256];
    struct region_owner *child = region_attach (path, DEVICE_BYTES, &how,
                                                why, sizeof why);
    if (!child || how != REGION_ATTACH_CLEAN)
      _exit (3);
    kill_at_step = "state: journal written";
    region_recovery_step = kill_at;
    region_start_serving (child);
    _exit (4);                  /* not killed: the step was not reached */
  }
  int status;
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFSIGNALED (status) && WTERMSIG (status) == SIGKILL);
  struct region header;
  header_read (shm_id, &header);
  assert_int_equal (header.current.generation, 0);
  assert_int_equal (header.journal.generation, 1);
  assert_int_equal (header.journal.state, REGION_SERVING);

  /* Killed there: the old state, as if the start never began. */
  owner = region_attach_expecting (path, DEVICE_BYTES, REGION_ATTACH_CLEAN);
  assert_int_equal (region_state_read (owner->region)->generation, 0);
  region_close (owner);

  /* Killed inside current's write: the new one, a crash to recover. */
  struct region torn = header;
  torn.current.generation = header.journal.generation;
  torn.current.state = header.journal.state;
  header_write (shm_id, &torn);
  owner = region_attach_expecting (path, DEVICE_BYTES, REGION_ATTACH_CRASHED);
  assert_int_equal (region_state_read (owner->region)->generation, 1);
  assert_ptr_equal (region_root (owner->region), owner->region);
  /* The next change writes both copies whole again. */
  region_start_serving (owner);
  header_read (shm_id, &header);
  assert_memory_equal (&header.current, &header.journal,
                       sizeof header.current);
  assert_int_equal (header.current.generation, 2);
  assert_int_equal (header.current.recoveries, 1);
  region_destroy (owner);
}

/* A region whose maker died before its user's structures were made
 * (CREATION): the next taker is told so, not refused - whatever device
 * size it serves - and makes it anew in place; once its root is named
 * it is a made region, handed over.
 */
static void
test_unmade (void **state)
{
  (void) state;
  const char *path = region_path ("unmade");
  pid_t pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    struct region_owner *child = region_create (path, 16u << 20,
                                                DEVICE_BYTES, false);
    if (!child)
      _exit (3);
    void *half = region_alloc (child->region, 3 * PAGE, PAGE);
    if (!half)
      _exit (4);
    memset (half, 0x5a, 3 * PAGE);
    raise (SIGKILL);            /* before region_set_root */
    _exit (5);
  }
  int status;
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFSIGNALED (status));

  struct region_owner *owner = region_attach_expecting (path,
                                                        2 * DEVICE_BYTES,
                                                        REGION_ATTACH_UNMADE);
  struct region *region = owner->region;
  assert_int_equal (region->pages_taken, 3);
  region_remake (owner, 2 * DEVICE_BYTES);
  assert_int_equal (region->pages_taken, 0);
  assert_int_equal (region->device_bytes, 2 * DEVICE_BYTES);
  assert_int_equal (region_state_read (region)->state, REGION_CREATING);
  void *root = region_alloc (region, 64, 64);
  assert_non_null (root);
  region_set_root (region, root, 1);
  region_hand_over (owner, 1);
  owner = region_attach_expecting (path, 2 * DEVICE_BYTES,
                                   REGION_ATTACH_CLEAN);
  assert_ptr_equal (region_root (owner->region), root);
  region_destroy (owner);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_region_heap),
    cmocka_unit_test (test_handover_clean),
    cmocka_unit_test (test_address_reserved),
    cmocka_unit_test (test_crash_reported),
    cmocka_unit_test (test_crash_recovered),
    cmocka_unit_test (test_refusals),
    cmocka_unit_test (test_state_torn),
    cmocka_unit_test (test_unmade),
  };
  int failed = cmocka_run_group_tests (tests, NULL, NULL);
  region_folder_remove ();
  return failed;
}
