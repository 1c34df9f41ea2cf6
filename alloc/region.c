/* The region: creation, attach, handover.  See region.h; the heap is in
 * region-heap.c.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#include "crc32c.h"
#include "region.h"

static uint32_t
identity_checksum (const struct region *header)
{
  return crc32c (header, offsetof (struct region, identity_checksum));
}

static uint32_t
state_checksum (const struct region_state_record *record)
{
  return crc32c (record, offsetof (struct region_state_record, checksum));
}

static bool
state_whole (const struct region_state_record *record)
{
  return record->checksum == state_checksum (record)
    && record->state >= REGION_SERVING && record->state <= REGION_RECOVERING;
}

const struct region_state_record *
region_state_read (const struct region *region)
{
  if (state_whole (&region->current) || !state_whole (&region->journal))
    return &region->current;
  return &region->journal;
}

/* Write the state as changed by the owner (STATE WRITES in region.h):
 * the journal whole first, then current.  The fences keep the compiler
 * from mixing the two copies' stores: a kill stops this process between
 * two of its stores, whatever order they were given.
 */
static void
state_publish (struct region *header, struct region_state_record record)
{
  record.owner_pid = getpid ();
  record.pad = 0;
  record.checksum = state_checksum (&record);
  header->journal = record;
  atomic_signal_fence (memory_order_seq_cst);
  recovery_step ("state: journal written");
  header->current = record;
  atomic_signal_fence (memory_order_seq_cst);
}

void (*region_recovery_step) (const char *step);

/* Pages of maps for a region of pages pages: the header's page, the
 * bitmap, the page records.
 */
static uint64_t
map_pages_for (uint64_t pages)
{
  uint64_t bytes = (pages + 63) / 64 * 8 + pages * sizeof (struct region_page);
  return 1 + (bytes + REGION_PAGE_SIZE - 1) / REGION_PAGE_SIZE;
}

/* Own the region file at path (made if missing): its descriptor, locked
 * (OWNERSHIP in region.h); -1 with errno EBUSY when another process owns
 * it.
 */
static int
ownership_take (const char *path, int flags)
{
  int fd = open (path, O_RDWR | O_CLOEXEC | flags, 0600);
  if (fd == -1)
    return -1;
  if (flock (fd, LOCK_EX | LOCK_NB) == -1) {
    int err = errno == EWOULDBLOCK ? EBUSY : errno;
    close (fd);
    errno = err;
    return -1;
  }
  return fd;
}

/* A copy of the header of segment shm_id, read through a mapping of its
 * own (read-only, anywhere): what an attach checks before it maps the
 * segment where the header says.  false with errno if it cannot be
 * mapped.
 */
static bool
header_peek (int shm_id, struct region *seen)
{
  void *peek = shmat (shm_id, NULL, SHM_RDONLY);
  if (peek == (void *) -1)
    return false;
  memcpy (seen, peek, sizeof *seen);
  shmdt (peek);
  return true;
}

/* The region file's line. */
#define REGION_FILE_FORMAT "nbdkit-zram region key=%x shm=%d device=%32s\n"

static void
device_id_text (const uint8_t id[16], char text[33])
{
  for (unsigned i = 0; i < 16; i++)
    snprintf (text + 2 * i, 3, "%02x", id[i]);
}

/* What the region file says of a region not made yet: a creator that
 * dies before it is done leaves it, and the next attach removes the
 * segment of its key, if there is one.
 */
#define REGION_FILE_CREATING "creating"

/* Write the region file's line, replacing the file atomically (the lock
 * is on the old inode: the new one is locked before the rename); the
 * device id, or REGION_FILE_CREATING while the header is being written.
 */
static int
region_file_write (struct region_owner *owner, bool created)
{
  char id[33], tmp[4096];
  if (created)
    device_id_text (owner->region->device_id, id);
  else
    strcpy (id, REGION_FILE_CREATING);
  if (snprintf (tmp, sizeof tmp, "%s.new", owner->path) >= (int) sizeof tmp) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = ownership_take (tmp, O_CREAT | O_TRUNC);
  if (fd == -1)
    return -1;
  if (dprintf (fd, REGION_FILE_FORMAT, (unsigned) owner->key, owner->shm_id,
               id) < 0
      || fsync (fd) == -1 || rename (tmp, owner->path) == -1) {
    int err = errno;
    close (fd);
    unlink (tmp);
    errno = err;
    return -1;
  }
  close (owner->lock_fd);
  owner->lock_fd = fd;
  return 0;
}

/* This process owns the region from now: the heap's lock made anew (a
 * pthread lock's state is the last owner's).
 */
static void
heap_own (struct region *region)
{
  pthread_mutex_init (&region->heap_lock, NULL);
}

struct region_owner *
region_create (const char *path, uint64_t bytes, uint64_t device_bytes,
               bool locked)
{
  bytes = (bytes + REGION_PAGE_SIZE - 1) / REGION_PAGE_SIZE * REGION_PAGE_SIZE;
  uint64_t pages = bytes / REGION_PAGE_SIZE;
  uint64_t map_pages = map_pages_for (pages);
  if (pages < map_pages + 1 || pages > UINT32_MAX) {
    errno = EINVAL;
    return NULL;
  }
  struct region_owner *owner = calloc (1, sizeof *owner);
  if (!owner || !(owner->path = strdup (path)))
    goto fail;
  owner->shm_id = -1;
  owner->lock_fd = ownership_take (path, O_CREAT);
  if (owner->lock_fd == -1)
    goto fail;
  /* The segment's key is in the region file before the segment exists,
   * so that a creator killed at any point leaves nothing the next attach
   * cannot find and remove.
   */
  for (unsigned tries = 0; owner->shm_id == -1; tries++) {
    if (getrandom (&owner->key, sizeof owner->key, 0) != sizeof owner->key)
      goto fail;
    if (owner->key == IPC_PRIVATE)
      continue;
    if (region_file_write (owner, false) == -1)
      goto fail;
    owner->shm_id = shmget (owner->key, bytes,
                            IPC_CREAT | IPC_EXCL | 0600 | SHM_NORESERVE);
    if (owner->shm_id == -1 && (errno != EEXIST || tries == 16))
      goto fail;
  }
  if (locked && shmctl (owner->shm_id, SHM_LOCK, NULL) == -1)
    goto fail;
  struct region *region = shmat (owner->shm_id, NULL, 0);
  if (region == (void *) -1)
    goto fail;
  owner->region = region;

  memcpy (region->magic, REGION_MAGIC, sizeof region->magic);
  region->layout_version = REGION_LAYOUT_VERSION;
  region->header_bytes = sizeof *region;
  region->region_bytes = bytes;
  region->base_address = (uintptr_t) region;
  region->page_size = REGION_PAGE_SIZE;
  region->device_bytes = device_bytes;
  if (getrandom (region->device_id, sizeof region->device_id, 0)
      != sizeof region->device_id)
    goto fail;
  region->map_pages = map_pages;
  region->identity_checksum = identity_checksum (region);
  /* Made until its user names its root (CREATION). */
  state_publish (region, (struct region_state_record) {
                           .state = REGION_CREATING });

  heap_own (region);
  region->rover = map_pages;
  for (uint64_t p = 0; p < map_pages; p++) {
    region_page_bits (region)[p / 64] |= (uint64_t) 1 << (p % 64);
    region_pages (region)[p].kind = REGION_PAGE_MAPS;
  }
  if (region_file_write (owner, true) == -1)
    goto fail;
  return owner;

 fail:;
  int err = errno;
  if (owner) {
    if (owner->region)
      shmdt (owner->region);
    if (owner->shm_id != -1)
      shmctl (owner->shm_id, IPC_RMID, NULL);
    if (owner->lock_fd > 0)
      close (owner->lock_fd);
    free (owner->path);
    free (owner);
  }
  errno = err;
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

/* The region file's segment id (-1 while being made), its key and device
 * id; false (errno ENOENT) when it names none.
 */
static bool
region_file_read (int fd, int *shm_id, key_t *key, char device_text[33])
{
  char line[256];
  ssize_t n = pread (fd, line, sizeof line - 1, 0);
  unsigned key_read;
  if (n <= 0) {
    errno = ENOENT;
    return false;
  }
  line[n] = '\0';
  if (sscanf (line, "nbdkit-zram region key=%x shm=%d device=%32s", &key_read,
              shm_id, device_text) != 3) {
    errno = ENOENT;
    return false;
  }
  *key = key_read;
  return true;
}

/* A copy of the header of the segment the region file at path names,
 * read without owning it; false with errno if there is none to read.
 */
static bool
path_peek (const char *path, struct region *seen)
{
  char device_text[33];
  int shm_id;
  key_t key;
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd == -1)
    return false;
  bool named = region_file_read (fd, &shm_id, &key, device_text);
  close (fd);
  if (!named) {
    errno = ENOENT;
    return false;
  }
  return header_peek (shm_id, seen);
}

/* The address range region_reserve_address keeps (ADDRESS RESERVATION
 * in region.h): set by it, consumed or given back by region_attach.
 * Not locked: a process reserves before it starts the thread that
 * attaches (a standby: nbdkit's get_ready, then its takeover thread).
 */
static void *reserved_address;
static uint64_t reserved_bytes;

int
region_reserve_address (const char *path)
{
  struct region seen;
  if (reserved_address) {
    errno = EALREADY;
    return -1;
  }
  if (!path_peek (path, &seen))
    return -1;
  if (memcmp (seen.magic, REGION_MAGIC, sizeof seen.magic) != 0
      || seen.identity_checksum != identity_checksum (&seen)) {
    errno = EINVAL;
    return -1;
  }
  void *want = (void *) (uintptr_t) seen.base_address;
  void *got = mmap (want, seen.region_bytes, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE
                    | MAP_FIXED_NOREPLACE, -1, 0);
  if (got == MAP_FAILED)
    return -1;                  /* EEXIST: something is there already */
  if (got != want) {
    /* A kernel before 4.17 takes the flag for a hint. */
    munmap (got, seen.region_bytes);
    errno = EEXIST;
    return -1;
  }
  reserved_address = want;
  reserved_bytes = seen.region_bytes;
  return 0;
}

/* The reservation given back (its range unmapped), if there is one. */
static void
reservation_release (void)
{
  if (reserved_address) {
    munmap (reserved_address, reserved_bytes);
    reserved_address = NULL;
  }
}

struct region_owner *
region_attach (const char *path, uint64_t device_bytes,
               enum region_attach_result *how, char *why, size_t why_bytes)
{
  int lock_fd = ownership_take (path, 0);
  if (lock_fd == -1 && errno == EBUSY) {
    struct region seen = { 0 };
    path_peek (path, &seen);
    const struct region_state_record *state = region_state_read (&seen);
    return refuse (EBUSY, why, why_bytes,
                   "the region is owned by another process (last owner "
                   "pid %" PRIu32 ", generation %" PRIu64 ")",
                   state->owner_pid, state->generation);
  }
  if (lock_fd == -1)
    return refuse (errno, why, why_bytes, "no region file %s: %m", path);
  char device_text[33];
  int shm_id = -1;
  key_t key;
  bool named = region_file_read (lock_fd, &shm_id, &key, device_text);
  struct shmid_ds info;
  if (named && strcmp (device_text, REGION_FILE_CREATING) == 0) {
    int orphan = shmget (key, 0, 0);
    if (orphan != -1)
      shmctl (orphan, IPC_RMID, NULL);
    close (lock_fd);
    return refuse (ENOENT, why, why_bytes, "the region named by %s was "
                   "being made when its server died: removed", path);
  }
  if (!named || shmctl (shm_id, IPC_STAT, &info) == -1) {
    close (lock_fd);
    return refuse (ENOENT, why, why_bytes, "the region file %s names no "
                   "segment that exists (removed, or the machine "
                   "restarted)", path);
  }

  struct region seen;
  if (info.shm_segsz < sizeof seen) {
    refuse (EINVAL, why, why_bytes, "the segment is %zu bytes, smaller than "
            "a region's header: not a region", (size_t) info.shm_segsz);
    goto refused;
  }
  if (!header_peek (shm_id, &seen)) {
    refuse (errno, why, why_bytes, "cannot attach the segment: %m");
    goto refused;
  }
  char seen_text[33];
  device_id_text (seen.device_id, seen_text);
  const struct region_state_record *state = region_state_read (&seen);
  bool bad = true;
  if (memcmp (seen.magic, REGION_MAGIC, sizeof seen.magic) != 0)
    refuse (EINVAL, why, why_bytes,
            "not an nbdkit-zram region (no magic): memory of "
            "something else");
  else if (seen.identity_checksum != identity_checksum (&seen))
    refuse (EINVAL, why, why_bytes,
            "the region's header is damaged (identity checksum "
            "%08" PRIx32 ", computed %08" PRIx32 ")",
            seen.identity_checksum, identity_checksum (&seen));
  else if (seen.layout_version != REGION_LAYOUT_VERSION
           || seen.header_bytes != sizeof seen)
    refuse (EPROTO, why, why_bytes,
            "the region has layout version %" PRIu32 ", this "
            "build knows version %d only: left as it is, for a "
            "server that knows its layout", seen.layout_version,
            REGION_LAYOUT_VERSION);
  else if (info.shm_segsz != seen.region_bytes)
    refuse (EINVAL, why, why_bytes,
            "the region is truncated or grown: its segment is "
            "%zu bytes, its header says %" PRIu64,
            (size_t) info.shm_segsz, seen.region_bytes);
  else if (seen.page_size != REGION_PAGE_SIZE
           || seen.region_bytes % REGION_PAGE_SIZE != 0
           || seen.map_pages != map_pages_for (seen.region_bytes
                                     / REGION_PAGE_SIZE))
    refuse (EINVAL, why, why_bytes,
            "the region's header describes another page size or "
            "map (page size %" PRIu64 ")", seen.page_size);
  else if (strcmp (seen_text, device_text) != 0)
    refuse (EINVAL, why, why_bytes,
            "the segment holds device %s, the region file names "
            "device %s: memory of another device", seen_text,
            device_text);
  else if (!state_whole (state))
    refuse (EINVAL, why, why_bytes,
            "the region's state is damaged (state checksum %08"
            PRIx32 ", computed %08" PRIx32 "; its journal's %08" PRIx32
            ", computed %08" PRIx32 ")", seen.current.checksum,
            state_checksum (&seen.current), seen.journal.checksum,
            state_checksum (&seen.journal));
  else if (device_bytes && seen.device_bytes != device_bytes
           && state->state != REGION_CREATING)
    refuse (EINVAL, why, why_bytes,
            "the region holds a device of %" PRIu64 " bytes, not "
            "%" PRIu64 ": memory of another device",
            seen.device_bytes, device_bytes);
  else
    bad = false;
  if (bad)
    goto refused;

  void *want = (void *) (uintptr_t) seen.base_address;
  /* Over this process's reservation of the range, if it is this one's
   * (SHM_REMAP replaces it in one step: no moment where another mapping
   * could take the range); one of another region is given back.
   */
  int remap = 0;
  if (reserved_address == want && reserved_bytes == seen.region_bytes)
    remap = SHM_REMAP;
  else
    reservation_release ();
  struct region *region = shmat (shm_id, want, remap);
  if (region == want && remap)
    reserved_address = NULL;    /* the segment sits there now */
  if (region != want) {
    int err = region == (void *) -1 ? errno : EEXIST;
    if (region != (void *) -1)
      shmdt (region);
    close (lock_fd);
    return refuse (err == EINVAL ? EEXIST : err, why, why_bytes,
                   "cannot attach the region at %p, where its pointers "
                   "need it (%s): try again in a new process", want,
                   err == EINVAL ? "this process has something there already"
                   : strerror (err));
  }
  struct region_owner *owner = calloc (1, sizeof *owner);
  if (!owner || !(owner->path = strdup (path))) {
    free (owner);
    shmdt (region);
    close (lock_fd);
    return refuse (ENOMEM, why, why_bytes, "out of memory");
  }
  owner->region = region;
  owner->shm_id = shm_id;
  owner->lock_fd = lock_fd;
  switch (state->state) {
  case REGION_HANDED_OVER: *how = REGION_ATTACH_CLEAN; break;
  case REGION_CREATING: *how = REGION_ATTACH_UNMADE; break;
  default: *how = REGION_ATTACH_CRASHED; break;
  }
  heap_own (region);
  return owner;

 refused:
  close (lock_fd);
  return NULL;
}

void
region_set_root (struct region *region, void *root, uint64_t user_version)
{
  struct region_state_record record = *region_state_read (region);
  record.root = (uintptr_t) root;
  record.user_version = user_version;
  if (record.state == REGION_CREATING)
    record.state = REGION_HANDED_OVER;  /* made: nothing served yet */
  state_publish (region, record);
}

void *
region_root (const struct region *region)
{
  return (void *) (uintptr_t) region_state_read (region)->root;
}

void
region_remake (struct region_owner *owner, uint64_t device_bytes)
{
  struct region *region = owner->region;
  region_recover_begin (region);
  region_recover_end (region);  /* nothing claimed: every page back */
  if (device_bytes && device_bytes != region->device_bytes) {
    region->device_bytes = device_bytes;
    region->identity_checksum = identity_checksum (region);
  }
  state_publish (region, (struct region_state_record) {
                           .state = REGION_CREATING });
}

void
region_recovery_start (struct region *region)
{
  struct region_state_record record = *region_state_read (region);
  if (record.state == REGION_RECOVERING)
    record.recovery_restarts++;
  record.state = REGION_RECOVERING;
  state_publish (region, record);
}

static void
owner_end (struct region_owner *owner)
{
  shmdt (owner->region);
  close (owner->lock_fd);       /* ownership goes with it */
  free (owner->path);
  free (owner);
}

void
region_hand_over (struct region_owner *owner, uint64_t stopped_ns)
{
  pthread_mutex_destroy (&owner->region->heap_lock);
  struct region_state_record record = *region_state_read (owner->region);
  record.stopped_ns = stopped_ns;
  record.state = REGION_HANDED_OVER;
  state_publish (owner->region, record);
  owner_end (owner);
}

void
region_close (struct region_owner *owner)
{
  if (owner)
    owner_end (owner);
}

void
region_start_serving (struct region_owner *owner)
{
  struct region_state_record record = *region_state_read (owner->region);
  record.generation++;
  if (record.state == REGION_SERVING || record.state == REGION_RECOVERING) {
    record.recoveries++;
    record.stopped_ns = 0;
  }
  record.state = REGION_SERVING;
  state_publish (owner->region, record);
}

int
region_lock (struct region_owner *owner)
{
  return shmctl (owner->shm_id, SHM_LOCK, NULL);
}

uint64_t
region_map_resident (struct region *region)
{
  /* mincore tells which pages the segment holds (resident, whoever maps
   * them); a read maps one into this process - a hole read would be
   * given a new page, so holes are skipped.  The vector on the stack: no
   * allocation.
   */
  unsigned char in_memory[4096];
  uint64_t mapped = 0;
  for (uint64_t first = 0; first < region->high_water;
       first += sizeof in_memory) {
    uint64_t count = region->high_water - first < sizeof in_memory
      ? region->high_water - first : sizeof in_memory;
    char *start = (char *) region + first * REGION_PAGE_SIZE;
    if (mincore (start, count * REGION_PAGE_SIZE, in_memory) == -1)
      return mapped;
    for (uint64_t i = 0; i < count; i++)
      if (in_memory[i] & 1) {
        (void) *(volatile const char *) (start + i * REGION_PAGE_SIZE);
        mapped++;
      }
  }
  return mapped;
}

void
region_destroy (struct region_owner *owner)
{
  if (!owner)
    return;
  shmctl (owner->shm_id, IPC_RMID, NULL);
  unlink (owner->path);
  owner_end (owner);
}
