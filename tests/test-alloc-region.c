/* A pool in a region, handed from one process to another: the region's
 * heap, a clean handover checked object by object, a crash reported as
 * one, and every bad region refused with nothing in it written
 * (alloc/region.h).
 */

#include "alloc-fixture.h"

#include <fcntl.h>
#include <signal.h>

#include "crc32c.h"
#include "fd-pass.h"
#include "region.h"

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

/* Random sizes from slabs and runs, each filled with its own byte, freed
 * in random order: no two allocations overlap (every byte is still its
 * owner's at the end), the heap empties, a trim gives back what stayed
 * resident, and a full region refuses with ENOMEM.
 */
static void
test_region_heap (void **state)
{
  (void) state;
  struct region_owner *owner = region_create (64u << 20, DEVICE_BYTES);
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

  /* Full: runs until none fits, then the refusal. */
  unsigned runs = 0;
  while (region_alloc (region, 1 << 20, PAGE))
    runs++;
  assert_int_equal (errno, ENOMEM);
  assert_true (runs >= 60);
  region_close (owner);
}

/* ---- handover ------------------------------------------------------------ */

/* In a child: a region with a pool of OBJECTS objects of seeded sizes
 * (every class, huge ones too), a third freed again (in batches, still
 * pending until the handover drains them), the pool compacted; the region
 * sent to the parent; then handed over cleanly (clean) or left as a
 * crash leaves it (the child is killed with SIGKILL by the parent).
 */
static pid_t
fill_in_child (int *fd, bool clean)
{
  int sockets[2];
  assert_int_equal (socketpair (AF_UNIX, SOCK_STREAM, 0, sockets), 0);
  pid_t pid = fork ();
  assert_true (pid >= 0);
  if (pid == 0) {
    close (sockets[0]);
    struct region_owner *owner = region_create (REGION_BYTES, DEVICE_BYTES);
    if (!owner)
      _exit (3);
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
    if (clean)
      zs_pool_hand_over (pool);
    fd_send (sockets[1], owner->fd);
    if (clean) {
      region_hand_over (owner);
      _exit (0);
    }
    pause ();                   /* until the parent kills it */
    _exit (5);
  }
  close (sockets[1]);
  *fd = fd_receive (sockets[0]);
  assert_true (*fd >= 0);
  close (sockets[0]);
  return pid;
}

static void
test_handover_clean (void **state)
{
  (void) state;
  int fd, status;
  pid_t pid = fill_in_child (&fd, true);
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFEXITED (status) && WEXITSTATUS (status) == 0);

  enum region_attach_result how;
  char why[256] = "";
  struct region_owner *owner = region_attach (fd, DEVICE_BYTES, &how, why,
                                              sizeof why);
  if (!owner)
    fail_msg ("region_attach: %s", why);
  struct region *region = owner->region;
  assert_int_equal (how, REGION_ATTACH_CLEAN);
  assert_int_equal (region->generation, 2);
  assert_int_equal (region->state, REGION_SERVING);
  assert_int_equal (region->user_version, 1);

  /* A second taker, while this process owns it: refused. */
  enum region_attach_result how2;
  assert_null (region_attach (fd, DEVICE_BYTES, &how2, why, sizeof why));
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
  region_close (owner);
  close (fd);
}

/* A killed owner: the next attach reports the crash (the recovery that
 * rebuilds the pool is the caller's), and the region is not "handed
 * over" in anyone's eyes.
 */
static void
test_crash_reported (void **state)
{
  (void) state;
  int fd, status;
  pid_t pid = fill_in_child (&fd, false);
  kill (pid, SIGKILL);
  assert_int_equal (waitpid (pid, &status, 0), pid);
  assert_true (WIFSIGNALED (status));

  enum region_attach_result how;
  char why[256] = "";
  struct region_owner *owner = region_attach (fd, DEVICE_BYTES, &how, why,
                                              sizeof why);
  if (!owner)
    fail_msg ("region_attach: %s", why);
  struct region *region = owner->region;
  assert_int_equal (how, REGION_ATTACH_CRASHED);
  assert_int_equal (region->generation, 2);
  region_close (owner);
  close (fd);
}

/* ---- refusals ------------------------------------------------------------ */

/* A region made here and closed (its owner gone, its state "serving"):
 * a descriptor of it.
 */
static int
closed_region (void)
{
  struct region_owner *owner = region_create (16u << 20, DEVICE_BYTES);
  assert_non_null (owner);
  int fd = dup (owner->fd);
  region_close (owner);
  return fd;
}

static void
header_read (int fd, struct region *header)
{
  assert_int_equal (pread (fd, header, sizeof *header, 0), sizeof *header);
}

static void
header_write (int fd, const struct region *header)
{
  assert_int_equal (pwrite (fd, header, sizeof *header, 0), sizeof *header);
}

/* Attach must refuse fd with err and a message containing text, and leave
 * every byte of the file's first page as it was.
 */
static void
refused (int fd, uint64_t device_bytes, int err, const char *text)
{
  unsigned char before[PAGE], after[PAGE];
  memset (before, 0, sizeof before);
  memset (after, 0, sizeof after);
  ssize_t got = pread (fd, before, sizeof before, 0);
  enum region_attach_result how;
  char why[256] = "";
  struct region_owner *owner = region_attach (fd, device_bytes, &how, why,
                                              sizeof why);
  if (owner)
    fail_msg ("attach accepted what it should refuse (%s)", text);
  assert_int_equal (errno, err);
  if (!strstr (why, text))
    fail_msg ("refusal \"%s\" does not say \"%s\"", why, text);
  assert_int_equal (pread (fd, after, sizeof after, 0), got);
  assert_memory_equal (before, after, sizeof before);
}

static void
test_refusals (void **state)
{
  (void) state;
  struct region header;

  /* Memory of something else. */
  int fd = memfd_create ("other", 0);
  assert_int_equal (ftruncate (fd, 1 << 20), 0);
  assert_int_equal (pwrite (fd, "something else", 14, 0), 14);
  refused (fd, 0, EINVAL, "not an nbdkit-zram region");
  close (fd);

  /* Smaller than a header. */
  fd = memfd_create ("tiny", 0);
  assert_int_equal (ftruncate (fd, 100), 0);
  refused (fd, 0, EINVAL, "smaller than a region's header");
  close (fd);

  /* Truncated. */
  fd = closed_region ();
  assert_int_equal (ftruncate (fd, 8u << 20), 0);
  refused (fd, 0, EINVAL, "truncated");
  close (fd);

  /* A damaged identity. */
  fd = closed_region ();
  header_read (fd, &header);
  header.region_bytes ^= 1 << 12;
  header_write (fd, &header);
  refused (fd, 0, EINVAL, "header is damaged");
  close (fd);

  /* A damaged state. */
  fd = closed_region ();
  header_read (fd, &header);
  header.root ^= 64;
  header_write (fd, &header);
  refused (fd, 0, EINVAL, "state is damaged");
  close (fd);

  /* A newer layout, with a checksum that holds. */
  fd = closed_region ();
  header_read (fd, &header);
  header.layout_version = REGION_LAYOUT_VERSION + 1;
  header.identity_checksum
    = crc32c (&header, offsetof (struct region, identity_checksum));
  header_write (fd, &header);
  refused (fd, 0, EPROTO, "layout version");
  close (fd);

  /* Another device's memory. */
  fd = closed_region ();
  refused (fd, DEVICE_BYTES / 2, EINVAL, "another device");

  /* Its address taken in this process. */
  header_read (fd, &header);
  void *want = (void *) (uintptr_t) header.base_address;
  void *squatter = mmap (want, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS
                         | MAP_FIXED_NOREPLACE, -1, 0);
  assert_ptr_equal (squatter, want);
  refused (fd, DEVICE_BYTES, EEXIST, "where its pointers need it");
  munmap (squatter, PAGE);

  /* And once the address is free, the same region is taken (a crash
   * left it: closed while serving).
   */
  enum region_attach_result how;
  char why[256] = "";
  struct region_owner *owner = region_attach (fd, DEVICE_BYTES, &how, why,
                                              sizeof why);
  if (!owner)
    fail_msg ("region_attach: %s", why);
  assert_int_equal (how, REGION_ATTACH_CRASHED);
  assert_int_equal (owner->region->generation, 2);
  region_close (owner);
  close (fd);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_region_heap),
    cmocka_unit_test (test_handover_clean),
    cmocka_unit_test (test_crash_reported),
    cmocka_unit_test (test_refusals),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
