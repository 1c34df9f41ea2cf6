/* A pool in a region, handed from one process to another: the region's
 * heap, a clean handover checked object by object, a crash reported as
 * one, and every bad region refused with nothing in it written
 * (alloc/region.h).
 */

#include "alloc-fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/shm.h>
#include <sys/file.h>
#include <sys/stat.h>

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
  _Atomic bool pool_made;       /* its pool made and its reserve filled */
  _Atomic bool go;              /* the parent lets its threads start */
  uint64_t reserve_made;        /* the reserve's bytes when pool_made */
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
  zs_pool_reserve_refill (pool);
  struct zs_pool_stats st;
  get_stats (pool, &st);
  shared->reserve_made = st.reserve_bytes;
  atomic_store (&shared->pool_made, true);
  while (!atomic_load (&shared->go))
    usleep (100);
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
  unsigned points = 100, checked = 0, quiet_points = 0;
  uint64_t reserve_kept = 0, quiet_reserve = 0;
  for (unsigned point = 0; point < points; point++) {
    /* Every fourth child is killed with its pool made and its reserve
     * full, before its threads start: recovery must keep that reserve
     * to the byte, however slow the machine (a sanitizer's child may
     * not reach its pool within the others' delays).  The others run
     * at once and are killed anywhere.
     */
    bool quiet = point % 4 == 0;
    memset (shared, 0, sizeof *shared);
    atomic_store (&shared->go, !quiet);
    pid_t pid = fork ();
    assert_true (pid >= 0);
    if (pid == 0)
      crash_child (path, shared, seed + point);
    if (quiet)
      for (unsigned waited = 0; !atomic_load (&shared->pool_made); waited++) {
        if (waited == 60000)
          fail_msg ("kill point %u: no pool made in 60 s", point);
        usleep (1000);
      }
    else
      usleep (2000 + xorshift64 (&seed) % 40000);
    kill (pid, SIGKILL);
    int status;
    assert_int_equal (waitpid (pid, &status, 0), pid);
    if (!WIFSIGNALED (status))
      fail_msg ("kill point %u: the child exited (status %#x)", point, status);
    uint64_t kept_before = reserve_kept;
    crash_recover_and_check (path, shared, &checked, &reserve_kept);
    if (quiet) {
      assert_true (shared->reserve_made > 0);
      assert_int_equal (reserve_kept - kept_before, shared->reserve_made);
      quiet_points++;
      quiet_reserve += shared->reserve_made;
    }
  }
  print_message ("%u kill points: %u published objects read back exactly, "
                 "%" PRIu64 " MiB of reserve kept (%" PRIu64 " MiB of it "
                 "whole, by the %u killed before their threads ran), no "
                 "page left taken\n", points, checked, reserve_kept >> 20,
                 quiet_reserve >> 20, quiet_points);
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

/* A region file naming segment shm_id (and its key: 0 for one made with
 * IPC_PRIVATE) as device id (hex); this user's, mode 0600, as a region
 * file must be.
 */
static void
region_file_point (const char *path, int shm_id, const char *id)
{
  struct shmid_ds info;
  assert_int_equal (shmctl (shm_id, IPC_STAT, &info), 0);
  FILE *fp = fopen (path, "w");
  assert_non_null (fp);
  fprintf (fp, "nbdkit-zram region key=%x shm=%d device=%s\n",
           (unsigned) info.shm_perm.__key, shm_id, id);
  fclose (fp);
  assert_int_equal (chmod (path, 0600), 0);
}

static void
segment_remove (int shm_id)
{
  shmctl (shm_id, IPC_RMID, NULL);
}

/* The first page of segment shm_id (its size if smaller) into page:
 * its bytes, 0 if there is no such segment.  Detached after: an attach
 * refuses a segment another process has attached.
 */
static size_t
first_page_read (int shm_id, unsigned char page[PAGE])
{
  struct shmid_ds info;
  if (shm_id < 0 || shmctl (shm_id, IPC_STAT, &info) == -1)
    return 0;
  size_t bytes = info.shm_segsz < PAGE ? info.shm_segsz : PAGE;
  void *p = shmat (shm_id, NULL, SHM_RDONLY);
  assert_true (p != (void *) -1);
  memcpy (page, p, bytes);
  shmdt (p);
  return bytes;
}

/* Attach must refuse the region at path with err and a message
 * containing text, and leave the first page of its segment (if any) as
 * it was.
 */
static void
refused (const char *path, int shm_id, uint64_t device_bytes, int err,
         const char *text)
{
  static unsigned char before[PAGE], after[PAGE];
  size_t bytes = first_page_read (shm_id, before);
  enum region_attach_result how;
  char why[512] = "";
  struct region_owner *owner = region_attach (path, device_bytes, &how, why,
                                              sizeof why);
  if (owner)
    fail_msg ("attach accepted what it should refuse (%s)", text);
  if (errno != err)
    fail_msg ("refusal \"%s\": errno %d, not %d (%s)", why, errno, err, text);
  if (!strstr (why, text))
    fail_msg ("refusal \"%s\" does not say \"%s\"", why, text);
  if (bytes) {
    assert_int_equal (first_page_read (shm_id, after), bytes);
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

  /* A damaged state. */
  /* Both its copies (one alone is a torn write, test_state_torn). */
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

/* ---- trust (TRUST in region.h) ------------------------------------------ */

static uint64_t
clock_ns (void)
{
  struct timespec now;
  clock_gettime (CLOCK_MONOTONIC, &now);
  return (uint64_t) now.tv_sec * 1000000000 + now.tv_nsec;
}

/* A path of the run's folder, kept (region_path's buffer is reused). */
static char *
path_keep (const char *name)
{
  char *path = strdup (region_path (name));
  assert_non_null (path);
  return path;
}

static char *
path_join (const char *dir, const char *name)
{
  char *path;
  assert_true (asprintf (&path, "%s/%s", dir, name) > 0);
  return path;
}

static void
file_write (const char *path, const char *text, mode_t mode)
{
  int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
  assert_true (fd >= 0);
  assert_int_equal (write (fd, text, strlen (text)), (ssize_t) strlen (text));
  close (fd);
  assert_int_equal (chmod (path, mode), 0);
}

/* What is at a path (not followed): to show a refusal changed nothing. */
struct file_seen {
  bool exists;
  struct stat st;
  char text[256];
};

static struct file_seen
file_look (const char *path)
{
  struct file_seen seen = { 0 };
  seen.exists = lstat (path, &seen.st) == 0;
  if (seen.exists && S_ISLNK (seen.st.st_mode))
    assert_true (readlink (path, seen.text, sizeof seen.text - 1) >= 0);
  else if (seen.exists && S_ISREG (seen.st.st_mode)) {
    int fd = open (path, O_RDONLY | O_NOFOLLOW);
    assert_true (fd >= 0);
    assert_true (read (fd, seen.text, sizeof seen.text - 1) >= 0);
    close (fd);
  }
  return seen;
}

static void
file_unchanged (const char *path, const struct file_seen *before)
{
  struct file_seen now = file_look (path);
  if (now.exists != before->exists)
    fail_msg ("%s %s", path, now.exists ? "was made" : "was removed");
  if (!now.exists)
    return;
  if (now.st.st_ino != before->st.st_ino
      || now.st.st_mode != before->st.st_mode
      || now.st.st_size != before->st.st_size
      || now.st.st_mtim.tv_sec != before->st.st_mtim.tv_sec
      || now.st.st_mtim.tv_nsec != before->st.st_mtim.tv_nsec
      || strcmp (now.text, before->text) != 0)
    fail_msg ("%s was changed", path);
}

static void
says (const char *why, const char *text)
{
  if (!strstr (why, text))
    fail_msg ("refusal \"%s\" does not say \"%s\"", why, text);
}

/* region_create must refuse path with err and a message saying text, and
 * leave what is at path and path.new as it was.
 */
static void
create_refused (const char *path, int err, const char *text)
{
  char *new_path;
  assert_true (asprintf (&new_path, "%s.new", path) > 0);
  struct file_seen before = file_look (path);
  struct file_seen new_before = file_look (new_path);
  char why[512] = "";
  struct region_owner *owner = region_create_explained (path, 16u << 20,
                                                        DEVICE_BYTES, false,
                                                        why, sizeof why);
  if (owner)
    fail_msg ("region_create accepted what it should refuse (%s)", text);
  if (errno != err)
    fail_msg ("refusal \"%s\": errno %d, not %d", why, errno, err);
  says (why, text);
  file_unchanged (path, &before);
  file_unchanged (new_path, &new_before);
  free (new_path);
}

/* region_remove must refuse path likewise, the file unchanged. */
static void
remove_refused (const char *path, int err, const char *text)
{
  struct file_seen before = file_look (path);
  char why[512] = "";
  errno = 0;
  if (region_remove (path, why, sizeof why) != -1)
    fail_msg ("region_remove accepted what it should refuse (%s)", text);
  if (errno != err)
    fail_msg ("refusal \"%s\": errno %d, not %d", why, errno, err);
  says (why, text);
  file_unchanged (path, &before);
}

static bool
segment_exists (int shm_id)
{
  struct shmid_ds info;
  return shmctl (shm_id, IPC_STAT, &info) == 0;
}

/* Files an attacker plants: links, files not the user's own, files that
 * are no region file, and directories others may write.  Each is refused
 * by the attach, the creation and the removal it would reach, with its
 * message, and nothing at the path is written, made or removed.
 */
static void
test_trust_files (void **state)
{
  (void) state;
  char *path = path_keep ("files");
  char *new_path, *victim = path_keep ("victim");
  assert_true (asprintf (&new_path, "%s.new", path) > 0);
  file_write (victim, "precious\n", 0644);
  struct file_seen victim_before = file_look (victim);

  /* A link at PATH.new: the creation would have truncated its target. */
  assert_int_equal (symlink (victim, new_path), 0);
  create_refused (path, EPERM, ".new is a symbolic link: refused, not "
                  "touched");
  file_unchanged (victim, &victim_before);
  assert_false (file_look (path).exists);
  unlink (new_path);

  /* Something else at PATH.new: not a leftover of ours. */
  file_write (new_path, "", 0644);
  create_refused (path, EPERM, "is not what a region file's writer leaves "
                  "(a regular file of uid");
  unlink (new_path);

  /* A leftover (a writer that died): removed, the region made. */
  file_write (new_path, "nbdkit-zram region key=1 shm=-1 d", 0600);
  struct region_owner *owner = region_create (path, 16u << 20, DEVICE_BYTES,
                                              false);
  assert_non_null (owner);
  assert_false (file_look (new_path).exists);
  /* One being written (locked): waited for, then refused. */
  region_destroy (owner);
  file_write (new_path, "", 0600);
  int held = open (new_path, O_RDONLY);
  assert_int_equal (flock (held, LOCK_EX), 0);
  create_refused (path, EBUSY, ".new is being written by another process");
  close (held);
  unlink (new_path);

  /* A link at PATH, to a file or to nothing. */
  assert_int_equal (symlink (victim, path), 0);
  refused (path, -1, 0, EPERM, "the region file is a symbolic link");
  create_refused (path, EPERM, "the region file is a symbolic link");
  remove_refused (path, EPERM, "the region file is a symbolic link");
  file_unchanged (victim, &victim_before);
  unlink (path);
  char *nowhere = path_keep ("nowhere");
  assert_int_equal (symlink (nowhere, path), 0);
  refused (path, -1, 0, EPERM, "the region file is a symbolic link");
  create_refused (path, EPERM, "never reached through a link");
  assert_false (file_look (nowhere).exists);
  unlink (path);

  /* Not a region file: empty, garbled, a line and more, an ordinary
   * file (a configuration, say).
   */
  static const char *const not_region[] = {
    "",
    "nbdkit-zram region key=zz shm=1 device=creating\n",
    "nbdkit-zram region key=1f shm=-1 device=creating\nmore\n",
    "nbdkit-zram region key=1f shm=3 device=creating\n",
    "nbdkit-zram region key=1f shm=3 device=0123\n",
    "nbdkit-zram region key=1f shm=3 device=0123456789abcdef0123456789abcdef",
    "setting = 1\n",
  };
  for (size_t i = 0; i < sizeof not_region / sizeof not_region[0]; i++) {
    file_write (path, not_region[i], 0644);
    refused (path, -1, 0, EINVAL, "not a region file (empty, or not one "
             "line 'nbdkit-zram region key=... shm=... device=...'): "
             "refused, nothing written");
    create_refused (path, EINVAL, "not a region file");
    remove_refused (path, EINVAL, "not a region file");
  }

  /* Writable by others; more than one name. */
  file_write (path, "nbdkit-zram region key=1f shm=-1 device=creating\n",
              0660);
  refused (path, -1, 0, EPERM, "writable by group or others (mode 0660): "
           "refused (chmod 600");
  create_refused (path, EPERM, "writable by group or others (mode 0660)");
  remove_refused (path, EPERM, "writable by group or others (mode 0660)");
  assert_int_equal (chmod (path, 0600), 0);
  char *second = path_keep ("second-name");
  assert_int_equal (link (path, second), 0);
  refused (path, -1, 0, EPERM, "has 2 names (hard links)");
  remove_refused (path, EPERM, "has 2 names (hard links)");
  unlink (second);
  /* Alone, it is a region file naming no segment: region_remove takes
   * the file alone.
   */
  char why[512] = "";
  assert_int_equal (region_remove (path, why, sizeof why), 0);
  assert_false (file_look (path).exists);
  assert_int_equal (region_remove (path, why, sizeof why), 0);

  /* A directory others may write: refused unless sticky. */
  char *open_dir = path_keep ("open"), *in_open = path_join (open_dir, "r");
  assert_int_equal (mkdir (open_dir, 0700), 0);
  assert_int_equal (chmod (open_dir, 0777), 0);
  create_refused (in_open, EPERM, "is writable by group or others and not "
                  "sticky (mode 0777): refused");
  refused (in_open, -1, 0, EPERM, "not sticky (mode 0777)");
  assert_false (file_look (in_open).exists);
  assert_int_equal (chmod (open_dir, 01777), 0);
  owner = region_create (in_open, 16u << 20, DEVICE_BYTES, false);
  assert_non_null (owner);
  int shm_id = owner->shm_id;
  region_close (owner);
  assert_int_equal (chmod (open_dir, 0770), 0);
  remove_refused (in_open, EPERM, "is writable by group or others and not "
                  "sticky (mode 0770)");
  assert_true (segment_exists (shm_id));
  assert_int_equal (chmod (open_dir, 0700), 0);
  assert_int_equal (region_remove (in_open, why, sizeof why), 0);
  assert_false (segment_exists (shm_id));
  assert_false (file_look (in_open).exists);
  rmdir (open_dir);

  unlink (victim);
  free (open_dir);
  free (in_open);
  free (second);
  free (nowhere);
  free (new_path);
  free (victim);
  free (path);
}

/* A segment of bytes with key (IPC_PRIVATE: none) and mode, its first
 * bytes set to fill (NULL: all zero).
 */
static int
segment_make (key_t key, size_t bytes, int mode, const void *fill,
              size_t fill_bytes)
{
  int shm_id = shmget (key, bytes, IPC_CREAT | IPC_EXCL | mode);
  assert_true (shm_id >= 0);
  if (fill) {
    void *p = shmat (shm_id, NULL, 0);
    assert_true (p != (void *) -1);
    memcpy (p, fill, fill_bytes);
    shmdt (p);
  }
  return shm_id;
}

static key_t
key_random (void)
{
  static uint64_t seed;
  if (!seed)
    seed = getpid () * 0x9e3779b97f4a7c15ull;
  key_t key;
  do
    key = (key_t) xorshift64 (&seed);
  while (key == IPC_PRIVATE || shmget (key, 0, 0) != -1);
  return key;
}

static void
creating_point (const char *path, key_t key)
{
  char line[128];
  snprintf (line, sizeof line,
            "nbdkit-zram region key=%x shm=-1 device=creating\n",
            (unsigned) key);
  file_write (path, line, 0600);
}

/* The region's address kept in this process (ADDRESS RESERVATION in
 * region.h) once it has let the region go, before a child forked from it
 * attaches: else this process's next mappings may land where the region
 * goes (the address space's free hole is reused first; seen under TSan
 * with randomisation off), and the child inherits them.
 */
static void
address_keep (const char *path)
{
  if (region_reserve_address (path) == -1 && errno != EALREADY)
    fail_msg ("region_reserve_address %s: %s", path, strerror (errno));
}

/* Segments a region file names that are not provably its own: another
 * mode, memory of something else under a "creating" line (the planted
 * line that once removed any segment of its key), one attached by a live
 * process - refused by the attach and by region_remove, each surviving
 * whole; what is provably a dead creator's (all zero, or begun with the
 * magic) removed; and a copy of a live region's file gives it no second
 * owner.
 */
static void
test_trust_segments (void **state)
{
  (void) state;
  char *path = path_keep ("segments"), *copy = path_keep ("segments-copy");
  char why[512];
  static const char data[] = "a database's memory";

  /* Mode 0644: another user could read it; 0660 write it. */
  struct region_owner *owner = region_create (path, 16u << 20, DEVICE_BYTES,
                                              false);
  assert_non_null (owner);
  int shm_id = owner->shm_id;
  region_close (owner);
  struct shmid_ds info;
  assert_int_equal (shmctl (shm_id, IPC_STAT, &info), 0);
  info.shm_perm.mode = 0660;
  assert_int_equal (shmctl (shm_id, IPC_SET, &info), 0);
  refused (path, shm_id, 0, EPERM, "has mode 0660, not 0600");
  remove_refused (path, EPERM, "has mode 0660, not 0600");
  create_refused (path, EPERM, "has mode 0660, not 0600");
  assert_true (segment_exists (shm_id));
  info.shm_perm.mode = 0600;
  assert_int_equal (shmctl (shm_id, IPC_SET, &info), 0);

  /* A copy of a live region's file: the owner (a child) holds the lock
   * on the original's inode; through the copy the attach is refused for
   * the attachment, and so is a removal.
   */
  int ready[2], stop[2];
  assert_int_equal (pipe (ready), 0);
  assert_int_equal (pipe (stop), 0);
  address_keep (path);
  pid_t pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    enum region_attach_result how;
    struct region_owner *live = region_attach (path, 0, &how, why,
                                               sizeof why);
    char byte = live ? 'y' : 'n';
    if (!live)
      fprintf (stderr, "the child's attach: %s\n", why);
    if (write (ready[1], &byte, 1) != 1 || read (stop[0], &byte, 1) < 0)
      _exit (2);
    if (live)
      region_hand_over (live, 1);
    _exit (0);
  }
  char byte;
  assert_int_equal (read (ready[0], &byte, 1), 1);
  assert_int_equal (byte, 'y');
  struct file_seen original = file_look (path);
  file_write (copy, original.text, 0600);
  uint64_t start = clock_ns ();
  refused (copy, shm_id, 0, EBUSY, "is attached by 1 process (last pid");
  uint64_t waited_ms = (clock_ns () - start) / 1000000;
  remove_refused (copy, EBUSY, "another server serves it");
  refused (path, shm_id, 0, EBUSY, "owned by another process");
  assert_true (segment_exists (shm_id));
  assert_int_equal (write (stop[1], "x", 1), 1);
  int status;
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFEXITED (status) && WEXITSTATUS (status) == 0);
  print_message ("a copy of a live region's file: refused after %" PRIu64
                 " ms of waiting for the attachment to go\n", waited_ms);
  /* Its owner gone, the copy is a region file like the original. */
  owner = region_attach_expecting (copy, 0, REGION_ATTACH_CLEAN);
  region_close (owner);
  unlink (copy);
  for (int i = 0; i < 4; i++)
    close (i < 2 ? ready[i] : stop[i - 2]);

  /* Attached by another process (here: this one, elsewhere): refused,
   * even though the region file is free.
   */
  void *elsewhere = shmat (shm_id, NULL, SHM_RDONLY);
  assert_true (elsewhere != (void *) -1);
  enum region_attach_result how;
  assert_null (region_attach (path, 0, &how, why, sizeof why));
  assert_int_equal (errno, EBUSY);
  says (why, "another server serves it");
  shmdt (elsewhere);
  assert_int_equal (region_remove (path, why, sizeof why), 0);
  assert_false (segment_exists (shm_id));
  assert_false (file_look (path).exists);

  /* "creating" lines.  Planted, naming memory of something else: the
   * segment is not touched, by the attach, the creation or a removal.
   */
  key_t key = key_random ();
  int other = segment_make (key, 1 << 20, 0600, data, sizeof data);
  creating_point (path, key);
  refused (path, other, 0, EINVAL, "it holds something else than a region "
           "being made): refused, not touched");
  remove_refused (path, EINVAL, "holds something else than a region");
  assert_true (segment_exists (other));
  shmctl (other, IPC_RMID, NULL);

  /* Naming a segment too small to be a region. */
  key = key_random ();
  other = segment_make (key, 100, 0600, NULL, 0);
  creating_point (path, key);
  refused (path, other, 0, EINVAL, "smaller than a region's header");
  assert_true (segment_exists (other));
  shmctl (other, IPC_RMID, NULL);

  /* Naming one that is attached. */
  key = key_random ();
  other = segment_make (key, 1 << 20, 0600, NULL, 0);
  elsewhere = shmat (other, NULL, SHM_RDONLY);
  creating_point (path, key);
  refused (path, other, 0, EBUSY, "attached by 1 process");
  assert_true (segment_exists (other));
  shmdt (elsewhere);

  /* All zero (a creator died before its header), unattached, this
   * user's: removed, and a new region made in its place.
   */
  refused (path, -1, 0, ENOENT, "being made when its server died: its "
           "segment removed");
  assert_false (segment_exists (other));
  owner = region_create (path, 16u << 20, DEVICE_BYTES, false);
  assert_non_null (owner);
  region_destroy (owner);

  /* Begun with the magic (died writing it): removed too, by a removal. */
  key = key_random ();
  other = segment_make (key, 1 << 20, 0600, REGION_MAGIC,
                        sizeof REGION_MAGIC);
  creating_point (path, key);
  assert_int_equal (region_remove (path, why, sizeof why), 0);
  assert_false (segment_exists (other));
  assert_false (file_look (path).exists);

  /* A region file naming another region's segment, whole: the device id
   * differs, so a removal refuses it.
   */
  owner = region_create (path, 16u << 20, DEVICE_BYTES, false);
  assert_non_null (owner);
  shm_id = owner->shm_id;
  region_close (owner);
  struct file_seen whole = file_look (path);
  char *device = strstr (whole.text, "device=") + 7, first = device[0];
  device[0] = first == '0' ? '1' : '0';
  file_write (path, whole.text, 0600);
  remove_refused (path, EINVAL, "another device's");
  assert_true (segment_exists (shm_id));
  device[0] = first;
  file_write (path, whole.text, 0600);
  if (region_remove (path, why, sizeof why) == -1)
    fail_msg ("region_remove: %s", why);
  assert_false (segment_exists (shm_id));

  free (copy);
  free (path);
}

/* As this process, then as uid nobody: a segment nobody made (its owner
 * set back to this user: only its creator differs) and one it owns, and
 * a region file of nobody's naming a segment of ours.  Refused, each
 * left as it was.  Needs root.
 */
static void
test_trust_other_users (void **state)
{
  (void) state;
  if (geteuid () != 0)
    skip ();
  const uid_t nobody = 65534;
  char *path = path_keep ("users");
  char why[512];
  key_t key = key_random ();
  pid_t pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    if (setgid (nobody) == -1 || setuid (nobody) == -1)
      _exit (2);
    _exit (shmget (key, 1 << 20, IPC_CREAT | IPC_EXCL | 0600) == -1 ? 3 : 0);
  }
  int status;
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFEXITED (status) && WEXITSTATUS (status) == 0);
  int theirs = shmget (key, 0, 0);
  assert_true (theirs >= 0);

  /* Theirs, all zero, under a "creating" line: once removed at once. */
  creating_point (path, key);
  refused (path, theirs, 0, EPERM, "is owned by uid 65534 and was made by "
           "uid 65534, not this user's (uid 0): refused, not touched");
  remove_refused (path, EPERM, "owned by uid 65534");
  assert_true (segment_exists (theirs));
  /* Owned by us now, made by them. */
  struct shmid_ds info;
  assert_int_equal (shmctl (theirs, IPC_STAT, &info), 0);
  info.shm_perm.uid = 0;
  assert_int_equal (shmctl (theirs, IPC_SET, &info), 0);
  refused (path, theirs, 0, EPERM, "is owned by uid 0 and was made by uid "
           "65534");
  assert_true (segment_exists (theirs));
  shmctl (theirs, IPC_RMID, NULL);

  /* A region of ours, its file given to nobody. */
  struct region_owner *owner = region_create (path, 16u << 20, DEVICE_BYTES,
                                              false);
  assert_non_null (owner);
  int shm_id = owner->shm_id;
  region_close (owner);
  assert_int_equal (chown (path, nobody, nobody), 0);
  refused (path, shm_id, 0, EPERM, "the region file is owned by uid 65534, "
           "not this user's (uid 0): refused");
  create_refused (path, EPERM, "owned by uid 65534");
  remove_refused (path, EPERM, "owned by uid 65534");
  assert_true (segment_exists (shm_id));
  assert_int_equal (chown (path, 0, 0), 0);
  assert_int_equal (region_remove (path, why, sizeof why), 0);
  assert_false (segment_exists (shm_id));

  /* A directory of nobody's. */
  char *dir = path_keep ("nobodys"), *in_dir = path_join (dir, "r");
  assert_int_equal (mkdir (dir, 0700), 0);
  assert_int_equal (chown (dir, nobody, nobody), 0);
  create_refused (in_dir, EPERM, "is owned by uid 65534, neither this user's "
                  "(uid 0) nor root's");
  rmdir (dir);
  free (dir);
  free (in_dir);
  free (path);
}

/* Two processes started at once for one region file, as two servers
 * would (attach; if there is none, create), 40 times: exactly one owns
 * the region each time, the other is refused with why; and a creator
 * killed at any point of its creation leaves nothing the next one cannot
 * take or make, and no segment behind.
 */
static void
test_creation_races (void **state)
{
  (void) state;
  char *path = path_keep ("race");
  unsigned refused_attach = 0, refused_create = 0;
  for (unsigned round = 0; round < 40; round++) {
    int go[2], result[2], stop[2];
    assert_int_equal (pipe (go), 0);
    assert_int_equal (pipe (result), 0);
    assert_int_equal (pipe (stop), 0);
    pid_t pids[2];
    for (int c = 0; c < 2; c++) {
      pids[c] = fork ();
      assert_true (pids[c] >= 0);
      if (pids[c] == 0) {
        char byte, why[512] = "";
        /* Only the parent's ends make the EOFs that say go and stop. */
        close (go[1]);
        close (stop[1]);
        if (read (go[0], &byte, 1) < 0)
          _exit (2);
        enum region_attach_result how;
        struct region_owner *owner = region_attach (path, DEVICE_BYTES, &how,
                                                    why, sizeof why);
        char outcome = owner ? 'a' : 'A';
        if (!owner && errno == ENOENT) {
          owner = region_create_explained (path, 16u << 20, DEVICE_BYTES,
                                           false, why, sizeof why);
          outcome = owner ? 'c' : 'C';
        }
        if (write (result[1], &outcome, 1) != 1
            || read (stop[0], &byte, 1) < 0)
          _exit (2);
        if (owner)
          region_destroy (owner);
        _exit (0);
      }
    }
    close (go[0]);
    close (go[1]);              /* both go */
    unsigned owners = 0;
    for (int c = 0; c < 2; c++) {
      char outcome;
      assert_int_equal (read (result[0], &outcome, 1), 1);
      owners += outcome == 'a' || outcome == 'c';
      refused_attach += outcome == 'A';
      refused_create += outcome == 'C';
    }
    if (owners != 1)
      fail_msg ("round %u: %u processes own the region", round, owners);
    close (stop[1]);
    for (int c = 0; c < 2; c++) {
      int status;
      assert_int_equal (waitpid (pids[c], &status, 0), pids[c]);
      assert_true (WIFEXITED (status) && WEXITSTATUS (status) == 0);
    }
    close (result[0]);
    close (result[1]);
    close (stop[0]);
    assert_false (file_look (path).exists);
  }
  print_message ("40 creation races: one owner each; the other refused at "
                 "its attach %u times, at its creation %u times\n",
                 refused_attach, refused_create);
  free (path);
}

/* The segments that exist (/proc/sysvipc/shm), by id and creator pid. */
struct segment_seen {
  long shm_id, creator_pid;
};
struct segments_seen {
  struct segment_seen *segments;
  size_t count;
};

static struct segments_seen
segments_look (void)
{
  struct segments_seen seen = { NULL, 0 };
  FILE *fp = fopen ("/proc/sysvipc/shm", "r");
  assert_non_null (fp);
  char line[512];
  assert_non_null (fgets (line, sizeof line, fp));      /* the titles */
  while (fgets (line, sizeof line, fp)) {
    struct segment_seen segment;
    if (sscanf (line, "%*d %ld %*o %*u %ld", &segment.shm_id,
                &segment.creator_pid) != 2)
      continue;
    seen.segments = realloc (seen.segments,
                             (seen.count + 1) * sizeof *seen.segments);
    assert_non_null (seen.segments);
    seen.segments[seen.count++] = segment;
  }
  fclose (fp);
  return seen;
}

/* Whether a segment made by process pid exists now that did not before.
 * Not the creator's pid alone: segments that outlive their makers (this
 * machine's other tests and servers leave regions on purpose) keep pids
 * that the kernel hands out again, to this test's children too.
 */
static bool
segment_of_process_new (pid_t pid, const struct segments_seen *before)
{
  struct segments_seen now = segments_look ();
  bool found = false;
  for (size_t i = 0; i < now.count && !found; i++) {
    if (now.segments[i].creator_pid != pid)
      continue;
    found = true;
    for (size_t j = 0; j < before->count; j++)
      if (before->segments[j].shm_id == now.segments[i].shm_id
          && before->segments[j].creator_pid == pid)
        found = false;
  }
  free (now.segments);
  return found;
}

/* What a server does with a region file: take the region it names, or
 * make a new one if there is none.
 */
static struct region_owner *
region_take_or_make (const char *path, char *why, size_t why_bytes)
{
  enum region_attach_result how;
  struct region_owner *owner = region_attach (path, DEVICE_BYTES, &how, why,
                                              why_bytes);
  if (!owner && errno == ENOENT)
    owner = region_create_explained (path, 16u << 20, DEVICE_BYTES, false,
                                     why, why_bytes);
  return owner;
}

static void
test_creation_killed (void **state)
{
  (void) state;
  char *path = path_keep ("killed"), *new_path;
  assert_true (asprintf (&new_path, "%s.new", path) > 0);
  /* How long a creation takes here: the kills fall all over it. */
  uint64_t start = clock_ns ();
  for (int i = 0; i < 5; i++)
    region_destroy (region_create (path, 16u << 20, DEVICE_BYTES, false));
  uint64_t create_us = (clock_ns () - start) / 5000 + 1;
  enum { NOTHING, CREATING, CREATING_SEGMENT, WHOLE, KINDS };
  unsigned left[KINDS] = { 0 }, new_left = 0, next_killed = 0;
  uint64_t seed = 12345;
  const unsigned rounds = 300;
  for (unsigned round = 0; round < rounds; round++) {
    struct segments_seen before = segments_look ();
    pid_t pid = fork ();
    assert_true (pid >= 0);
    if (pid == 0) {
      if (!region_create (path, 16u << 20, DEVICE_BYTES, false))
        _exit (3);
      pause ();
      _exit (0);
    }
    struct timespec wait = { 0, xorshift64 (&seed) % (create_us * 3 / 2)
                             * 1000 };
    nanosleep (&wait, NULL);
    kill (pid, SIGKILL);
    int status;
    assert_int_equal (waitpid (pid, &status, 0), pid);
    if (!WIFSIGNALED (status))
      fail_msg ("round %u: the creator exited (status %#x)", round, status);

    struct file_seen seen = file_look (path);
    int kind = !seen.exists ? NOTHING : !strstr (seen.text, "creating")
      ? WHOLE : NOTHING;
    if (seen.exists && kind != WHOLE) {
      unsigned key;
      assert_int_equal (sscanf (seen.text, "nbdkit-zram region key=%x",
                                &key), 1);
      kind = shmget ((key_t) key, 0, 0) == -1 ? CREATING : CREATING_SEGMENT;
    }
    left[kind]++;
    new_left += file_look (new_path).exists;

    /* Every other round the next server is killed too, while it takes
     * or cleans up what the first left (or makes its own).
     */
    pid_t next = -1;
    if (round % 2) {
      next = fork ();
      assert_true (next >= 0);
      if (next == 0) {
        if (!region_take_or_make (path, NULL, 0))
          _exit (3);
        pause ();
        _exit (0);
      }
      wait.tv_nsec = xorshift64 (&seed) % (create_us * 3 / 2) * 1000;
      nanosleep (&wait, NULL);
      kill (next, SIGKILL);
      assert_int_equal (waitpid (next, &status, 0), next);
      if (!WIFSIGNALED (status))
        fail_msg ("round %u: the next server exited (status %#x)", round,
                  status);
      next_killed++;
    }
    char why[512] = "";
    struct region_owner *owner = region_take_or_make (path, why, sizeof why);
    if (!owner)
      fail_msg ("round %u: after a creator killed %ld us in: %s", round,
                wait.tv_nsec / 1000, why);
    region_destroy (owner);
    if (segment_of_process_new (pid, &before)
        || segment_of_process_new (next, &before))
      fail_msg ("round %u: a killed process's segment is left", round);
    free (before.segments);
    assert_false (file_look (path).exists);
  }
  print_message ("%u creators killed (a creation takes %" PRIu64 " us here): "
                 "they left no region file %u times, a 'creating' line and "
                 "no segment %u, a 'creating' line and its segment %u, a "
                 "whole region %u, and a PATH.new %u times; the next server "
                 "killed too %u times; each taken or made anew, no segment "
                 "left\n", rounds, create_us, left[NOTHING], left[CREATING],
                 left[CREATING_SEGMENT], left[WHOLE], new_left, next_killed);
  free (new_path);
  free (path);
}

/* A directory above the region file's that others may write (not
 * sticky): whoever may rename its entries could put a directory of their
 * own where the region file is looked for.  Refused at creation, attach
 * and removal, nothing made; sticky, it is accepted.
 */
static void
test_trust_ancestors (void **state)
{
  (void) state;
  char *open_dir = path_keep ("open"), *inner = path_join (open_dir, "inner");
  char *path = path_join (inner, "region");
  assert_int_equal (mkdir (open_dir, 0700), 0);
  assert_int_equal (chmod (open_dir, 0777), 0);
  assert_int_equal (mkdir (inner, 0700), 0);
  create_refused (path, EPERM, "above it is owned by uid");
  remove_refused (path, EPERM, "above it is owned by uid");
  enum region_attach_result how;
  char why[512] = "";
  assert_null (region_attach (path, DEVICE_BYTES, &how, why, sizeof why));
  assert_int_equal (errno, EPERM);
  says (why, "writable by no one else unless sticky");
  assert_int_equal (access (path, F_OK), -1);

  assert_int_equal (chmod (open_dir, 01777), 0);
  struct region_owner *owner = region_create (path, 16u << 20, DEVICE_BYTES,
                                              false);
  assert_non_null (owner);
  region_destroy (owner);
  assert_int_equal (rmdir (inner), 0);
  assert_int_equal (rmdir (open_dir), 0);
  free (path);
  free (inner);
  free (open_dir);
}

/* The state's step to kill at (region_recovery_step in a child). */
static const char *kill_at_step;

static void
kill_at (const char *step)
{
  if (kill_at_step && strcmp (step, kill_at_step) == 0)
    raise (SIGKILL);
}

static void
serving_started (struct region_owner *owner)
{
  region_start_serving (owner);
}

static void
recovery_started (struct region_owner *owner)
{
  region_recovery_start (owner->region);
}

/* A child takes the region at path (left as want says) and makes change,
 * killed once its state's journal copy is written.
 */
static void
state_change_killed (const char *path, enum region_attach_result want,
                     void (*change) (struct region_owner *owner))
{
  address_keep (path);
  pid_t pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    enum region_attach_result how;
    char why[256];
    struct region_owner *child = region_attach (path, DEVICE_BYTES, &how,
                                                why, sizeof why);
    if (!child || how != want) {
      fprintf (stderr, "the child's attach: %s (how %d, want %d)\n",
               child ? "taken" : why, (int) how, (int) want);
      _exit (3);
    }
    kill_at_step = "state: journal written";
    region_recovery_step = kill_at;
    change (child);
    _exit (4);                  /* not killed: the step was not reached */
  }
  int status;
  assert_int_equal (waitpid (pid, &status, 0), pid);
  if (!WIFSIGNALED (status) || WTERMSIG (status) != SIGKILL)
    fail_msg ("the child was not killed in its state write (status %#x)",
              status);
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
  state_change_killed (path, REGION_ATTACH_CLEAN, serving_started);
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
  region_close (owner);

  /* Killed again, in the next change's journal write (its recovery's
   * mark): current was made whole from the journal first, so the tear of
   * the journal leaves the state the torn write had reached.
   */
  state_change_killed (path, REGION_ATTACH_CRASHED, recovery_started);
  header_read (shm_id, &header);
  assert_int_equal (header.current.generation, 1);
  assert_int_equal (header.current.state, REGION_SERVING);
  assert_int_equal (header.journal.state, REGION_RECOVERING);
  torn = header;
  torn.journal.recovery_restarts ^= 1;  /* its checksum not yet */
  header_write (shm_id, &torn);
  owner = region_attach_expecting (path, DEVICE_BYTES, REGION_ATTACH_CRASHED);
  assert_int_equal (region_state_read (owner->region)->generation, 1);

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
 * size it serves (its caller then chooses: remade in place, or removed
 * for one of its own size) - and made anew in place keeps its identity;
 * once its root is named it is a made region, handed over.
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
  region_close (owner);
  owner = region_attach_expecting (path, DEVICE_BYTES, REGION_ATTACH_UNMADE);
  struct region *region = owner->region;
  assert_int_equal (region->pages_taken, 3);
  struct region identity = *region;
  region_remake (owner);
  assert_int_equal (region->pages_taken, 0);
  assert_memory_equal (region, &identity,
                       offsetof (struct region, current));
  assert_int_equal (region_state_read (region)->state, REGION_CREATING);
  void *root = region_alloc (region, 64, 64);
  assert_non_null (root);
  region_set_root (region, root, 1);
  region_hand_over (owner, 1);
  owner = region_attach_expecting (path, DEVICE_BYTES, REGION_ATTACH_CLEAN);
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
    cmocka_unit_test (test_trust_files),
    cmocka_unit_test (test_trust_ancestors),
    cmocka_unit_test (test_trust_segments),
    cmocka_unit_test (test_trust_other_users),
    cmocka_unit_test (test_creation_races),
    cmocka_unit_test (test_creation_killed),
    cmocka_unit_test (test_state_torn),
    cmocka_unit_test (test_unmade),
  };
  int failed = cmocka_run_group_tests (tests, NULL, NULL);
  region_folder_remove ();
  return failed;
}
