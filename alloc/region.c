/* The region: creation, attach, handover.  See region.h; the heap is in
 * region-heap.c.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "region.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000    /* Linux 4.17 */
#endif

static uint32_t
identity_checksum (const struct region *header)
{
  return crc32c (header, offsetof (struct region, identity_checksum));
}

static uint32_t
state_checksum (const struct region *header)
{
  size_t start = offsetof (struct region, generation);
  return crc32c ((const char *) header + start,
                 offsetof (struct region, state_checksum) - start);
}

static void
state_write (struct region *header, enum region_state state)
{
  header->state = state;
  header->owner_pid = getpid ();
  header->state_checksum = state_checksum (header);
}

/* Pages of maps for a region of pages pages: the header's page, the
 * bitmap, the page records.
 */
static uint64_t
map_pages_for (uint64_t pages)
{
  uint64_t bytes = (pages + 63) / 64 * 8 + pages * sizeof (struct region_page);
  return 1 + (bytes + REGION_PAGE_SIZE - 1) / REGION_PAGE_SIZE;
}

/* Own the region in fd: flock on a description of our own (OWNERSHIP in
 * region.h).  -1 with errno EBUSY when another process owns it.
 */
static int
ownership_take (int fd)
{
  char path[64];
  snprintf (path, sizeof path, "/proc/self/fd/%d", fd);
  int lock_fd = open (path, O_RDWR | O_CLOEXEC);
  if (lock_fd == -1)
    return -1;
  if (flock (lock_fd, LOCK_EX | LOCK_NB) == -1) {
    int err = errno == EWOULDBLOCK ? EBUSY : errno;
    close (lock_fd);
    errno = err;
    return -1;
  }
  return lock_fd;
}

/* This process owns the region from now: the heap's lock made anew (a
 * pthread lock's state is the last owner's) and its descriptor noted.
 */
static void
heap_own (struct region *region, int fd)
{
  pthread_mutex_init (&region->heap_lock, NULL);
  region->owner_fd = fd;
}

struct region_owner *
region_create (uint64_t bytes, uint64_t device_bytes)
{
  bytes = (bytes + REGION_PAGE_SIZE - 1) / REGION_PAGE_SIZE * REGION_PAGE_SIZE;
  uint64_t pages = bytes / REGION_PAGE_SIZE;
  uint64_t map_pages = map_pages_for (pages);
  if (pages < map_pages + 1 || pages > UINT32_MAX) {
    errno = EINVAL;
    return NULL;
  }
  struct region_owner *owner = calloc (1, sizeof *owner);
  if (!owner)
    return NULL;
  int err;
  int fd = memfd_create ("nbdkit-zram", MFD_CLOEXEC);
  if (fd == -1)
    goto fail;
  if (ftruncate (fd, bytes) == -1)
    goto fail_fd;
  owner->lock_fd = ownership_take (fd);
  if (owner->lock_fd == -1)
    goto fail_fd;
  struct region *region = mmap (NULL, bytes, PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (region == MAP_FAILED)
    goto fail_lock;
  owner->region = region;
  owner->fd = fd;

  memcpy (region->magic, REGION_MAGIC, sizeof region->magic);
  region->layout_version = REGION_LAYOUT_VERSION;
  region->header_bytes = sizeof *region;
  region->region_bytes = bytes;
  region->base_address = (uintptr_t) region;
  region->page_size = REGION_PAGE_SIZE;
  region->device_bytes = device_bytes;
  if (getrandom (region->device_id, sizeof region->device_id, 0)
      != sizeof region->device_id)
    goto fail_map;
  region->map_pages = map_pages;
  region->identity_checksum = identity_checksum (region);
  region->generation = 1;
  region->root = 0;
  region->user_version = 0;
  state_write (region, REGION_SERVING);

  heap_own (region, fd);
  region->rover = map_pages;
  for (uint64_t p = 0; p < map_pages; p++) {
    region_page_bits (region)[p / 64] |= (uint64_t) 1 << (p % 64);
    region_pages (region)[p].kind = REGION_PAGE_MAPS;
  }
  return owner;

 fail_map:
  munmap (region, bytes);
 fail_lock:
  err = errno;
  close (owner->lock_fd);
  errno = err;
 fail_fd:
  err = errno;
  close (fd);
  errno = err;
 fail:
  free (owner);
  return NULL;
}

/* A refusal: errno err and the message in why[]. */
static struct region_owner *
refuse (int err, char *why, size_t why_bytes, const char *format, ...)
{
  va_list args;
  va_start (args, format);
  if (why_bytes)
    vsnprintf (why, why_bytes, format, args);
  va_end (args);
  errno = err;
  return NULL;
}

struct region_owner *
region_attach (int fd, uint64_t device_bytes, enum region_attach_result *how,
               char *why, size_t why_bytes)
{
  struct stat st;
  struct region seen;
  if (fstat (fd, &st) == -1)
    return refuse (errno, why, why_bytes, "cannot read the memory's size: %m");
  if ((uint64_t) st.st_size < sizeof seen)
    return refuse (EINVAL, why, why_bytes,
                   "the memory is %jd bytes, smaller than a region's header: "
                   "not a region, or truncated", (intmax_t) st.st_size);
  if (pread (fd, &seen, sizeof seen, 0) != (ssize_t) sizeof seen)
    return refuse (EINVAL, why, why_bytes, "cannot read the region's header");
  if (memcmp (seen.magic, REGION_MAGIC, sizeof seen.magic) != 0)
    return refuse (EINVAL, why, why_bytes,
                   "not an nbdkit-zram region (no magic): memory of "
                   "something else");
  if (seen.identity_checksum != identity_checksum (&seen))
    return refuse (EINVAL, why, why_bytes,
                   "the region's header is damaged (identity checksum "
                   "%08" PRIx32 ", computed %08" PRIx32 ")",
                   seen.identity_checksum, identity_checksum (&seen));
  if (seen.layout_version != REGION_LAYOUT_VERSION
      || seen.header_bytes != sizeof seen)
    return refuse (EPROTO, why, why_bytes,
                   "the region has layout version %" PRIu32 ", this build "
                   "knows version %d only: left as it is, for a server "
                   "that knows its layout", seen.layout_version,
                   REGION_LAYOUT_VERSION);
  if ((uint64_t) st.st_size != seen.region_bytes)
    return refuse (EINVAL, why, why_bytes,
                   "the region is truncated or grown: its memory is %jd "
                   "bytes, its header says %" PRIu64, (intmax_t) st.st_size,
                   seen.region_bytes);
  if (seen.page_size != REGION_PAGE_SIZE
      || seen.region_bytes % REGION_PAGE_SIZE != 0
      || seen.map_pages != map_pages_for (seen.region_bytes / REGION_PAGE_SIZE))
    return refuse (EINVAL, why, why_bytes,
                   "the region's header describes another page size or map "
                   "(page size %" PRIu64 ")", seen.page_size);
  if (device_bytes && seen.device_bytes != device_bytes)
    return refuse (EINVAL, why, why_bytes,
                   "the region holds a device of %" PRIu64 " bytes, not %"
                   PRIu64 ": memory of another device", seen.device_bytes,
                   device_bytes);
  if (seen.state_checksum != state_checksum (&seen)
      || (seen.state != REGION_SERVING && seen.state != REGION_HANDED_OVER))
    return refuse (EINVAL, why, why_bytes,
                   "the region's state is damaged (state checksum %08"
                   PRIx32 ", computed %08" PRIx32 ")", seen.state_checksum,
                   state_checksum (&seen));

  int lock_fd = ownership_take (fd);
  if (lock_fd == -1 && errno == EBUSY)
    return refuse (EBUSY, why, why_bytes,
                   "the region is owned by another process (last owner "
                   "pid %" PRIu32 ", generation %" PRIu64 ")",
                   seen.owner_pid, seen.generation);
  if (lock_fd == -1)
    return refuse (errno, why, why_bytes, "cannot lock the region: %m");

  void *want = (void *) (uintptr_t) seen.base_address;
  void *base = mmap (want, seen.region_bytes, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_NORESERVE | MAP_FIXED_NOREPLACE, fd, 0);
  if (base != want) {
    int err = base == MAP_FAILED ? errno : EEXIST;
    if (base != MAP_FAILED)
      munmap (base, seen.region_bytes);
    close (lock_fd);
    errno = err;
    return refuse (err == EEXIST ? EEXIST : ENOMEM, why, why_bytes,
                   "cannot map the region at %p, where its pointers "
                   "need it (%s): try again in a new process",
                   want, err == EEXIST
                   ? "this process has something there already"
                   : strerror (err));
  }
  struct region_owner *owner = calloc (1, sizeof *owner);
  int own_fd = owner ? fcntl (fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (own_fd == -1) {
    free (owner);
    munmap (base, seen.region_bytes);
    close (lock_fd);
    return refuse (ENOMEM, why, why_bytes, "out of memory or descriptors");
  }
  struct region *region = base;
  owner->region = region;
  owner->fd = own_fd;
  owner->lock_fd = lock_fd;
  *how = seen.state == REGION_HANDED_OVER
    ? REGION_ATTACH_CLEAN : REGION_ATTACH_CRASHED;
  heap_own (region, own_fd);
  region->generation++;
  state_write (region, REGION_SERVING);
  return owner;
}

void
region_set_root (struct region *region, void *root, uint64_t user_version)
{
  region->root = (uintptr_t) root;
  region->user_version = user_version;
  region->state_checksum = state_checksum (region);
}

void *
region_root (const struct region *region)
{
  return (void *) (uintptr_t) region->root;
}

static void
owner_end (struct region_owner *owner)
{
  munmap (owner->region, owner->region->region_bytes);
  close (owner->lock_fd);       /* ownership goes with the description */
  close (owner->fd);
  free (owner);
}

void
region_hand_over (struct region_owner *owner)
{
  pthread_mutex_destroy (&owner->region->heap_lock);
  state_write (owner->region, REGION_HANDED_OVER);
  owner_end (owner);
}

void
region_close (struct region_owner *owner)
{
  if (owner)
    owner_end (owner);
}
