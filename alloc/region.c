/* The region: creation, attach, handover.  See region.h; the heap is in
 * region-heap.c.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <time.h>
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
  if (!state_whole (&header->current) && state_whole (&header->journal)) {
    /* Current torn by the last writer's kill: made whole from the
     * journal before the journal is written over, so that a kill now
     * still leaves one whole copy.
     */
    header->current = header->journal;
    atomic_signal_fence (memory_order_seq_cst);
  }
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

/* The region file's line; earlier versions wrote it padded (the same
 * for a device id, 32 characters).
 */
#define REGION_FILE_FORMAT "nbdkit-zram region key=%x shm=%d device=%s\n"
#define REGION_FILE_FORMAT_PADDED \
  "nbdkit-zram region key=%x shm=%d device=%32s\n"

static void
device_id_text (const uint8_t id[16], char text[33])
{
  for (unsigned i = 0; i < 16; i++)
    snprintf (text + 2 * i, 3, "%02x", id[i]);
}

/* What the region file says of a region not made yet: a creator that
 * dies before it is done leaves it, and the next attach removes the
 * segment of its key if it can prove the segment is that creator's
 * (TRUST in region.h).
 */
#define REGION_FILE_CREATING "creating"

/* A refusal's errno err and its message in why[] (none when why_bytes
 * is 0).
 */
static void
vexplain (int err, char *why, size_t why_bytes, const char *format,
          va_list args)
{
  if (why_bytes)
    vsnprintf (why, why_bytes, format, args);
  errno = err;
}

static void __attribute__ ((format (printf, 4, 5)))
explain (int err, char *why, size_t why_bytes, const char *format, ...)
{
  va_list args;
  va_start (args, format);
  vexplain (err, why, why_bytes, format, args);
  va_end (args);
}

/* A refusal of an attach: errno err, the message in why[], NULL. */
static struct region_owner * __attribute__ ((format (printf, 4, 5)))
refuse (int err, char *why, size_t why_bytes, const char *format, ...)
{
  va_list args;
  va_start (args, format);
  vexplain (err, why, why_bytes, format, args);
  va_end (args);
  return NULL;
}

/* ---- trust: only what is this user's (TRUST in region.h) ---------------- */

/* How long an attach or a removal waits for a segment's other
 * attachments to go (a standby's header peek, a process still unmapping
 * it as it exits), and a writer of the region file for another's
 * PATH.new to go (a creator that lost a race removes its own at once).
 */
#define ATTACHED_WAIT_NS 2000000000ull
#define NEW_FILE_WAIT_NS 1000000000ull
#define WAIT_STEP_NS 2000000

static uint64_t
clock_now_ns (void)
{
  struct timespec now;
  clock_gettime (CLOCK_MONOTONIC, &now);
  return (uint64_t) now.tv_sec * 1000000000 + now.tv_nsec;
}

static void
wait_step (void)
{
  struct timespec step = { 0, WAIT_STEP_NS };
  nanosleep (&step, NULL);
}

/* Where a region file is: its directory, opened once and checked, and
 * its name there.  Every use of the file goes through the directory's
 * descriptor (openat, renameat, unlinkat), so what was checked is what
 * is used.
 */
struct region_place {
  int dir_fd;
  const char *path;                     /* as given, for messages */
  char dir[PATH_MAX];                   /* for messages */
  char name[NAME_MAX + 1];
  char new_name[NAME_MAX + 1];          /* name.new: a line being written */
};

static void
place_close (struct region_place *place)
{
  if (place->dir_fd != -1)
    close (place->dir_fd);
  place->dir_fd = -1;
}

/* Every directory above the place's (held: its stat), up to /, under
 * the same rule as the place's own (as ssh's StrictModes): else whoever
 * may rename one of them could put a directory of their choosing where
 * the region file is looked for.  Links are resolved first (realpath)
 * and the resolved directory must be the one held.
 */
static bool
ancestors_trusted (const struct region_place *place, const struct stat *held,
                   char *why, size_t why_bytes)
{
  char resolved[PATH_MAX];
  struct stat st;
  if (!realpath (place->dir, resolved) || stat (resolved, &st) == -1) {
    explain (errno, why, why_bytes, "its directory %s: %m", place->dir);
    return false;
  }
  if (st.st_dev != held->st_dev || st.st_ino != held->st_ino) {
    explain (EAGAIN, why, why_bytes, "its directory %s changed while it "
             "was looked at: refused", place->dir);
    return false;
  }
  uid_t me = geteuid ();
  while (strcmp (resolved, "/") != 0) {
    char *slash = strrchr (resolved, '/');
    if (slash == resolved)
      slash[1] = '\0';
    else
      *slash = '\0';
    if (lstat (resolved, &st) == -1) {
      explain (errno, why, why_bytes, "the directory %s above it: %m",
               resolved);
      return false;
    }
    if ((st.st_uid != me && st.st_uid != 0)
        || ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))) {
      explain (EPERM, why, why_bytes, "the directory %s above it is owned "
               "by uid %u with mode %04o: refused (every directory above a "
               "region file is root's or this user's (uid %u), and "
               "writable by no one else unless sticky)", resolved,
               (unsigned) st.st_uid, (unsigned) (st.st_mode & 07777),
               (unsigned) me);
      return false;
    }
  }
  return true;
}

/* The directory of path, opened, if a region file may live there: owned
 * by this user or root, and writable by no one else unless sticky (where
 * no one removes or renames another's file).  false with errno and why.
 */
static bool
place_open (struct region_place *place, const char *path, char *why,
            size_t why_bytes)
{
  place->dir_fd = -1;
  place->path = path;
  const char *slash = strrchr (path, '/');
  const char *name = slash ? slash + 1 : path;
  size_t dir_length = slash ? (size_t) (slash - path) : 0;
  if (!*name || strcmp (name, ".") == 0 || strcmp (name, "..") == 0) {
    explain (EISDIR, why, why_bytes, "names a directory, not a region file: "
             "give region= a file's path");
    return false;
  }
  if (strlen (name) + 4 > NAME_MAX || dir_length >= sizeof place->dir) {
    explain (ENAMETOOLONG, why, why_bytes, "the name is too long (the name "
             "with .new must fit in %d bytes)", NAME_MAX);
    return false;
  }
  if (!slash)
    strcpy (place->dir, ".");
  else if (dir_length == 0)
    strcpy (place->dir, "/");
  else {
    memcpy (place->dir, path, dir_length);
    place->dir[dir_length] = '\0';
  }
  strcpy (place->name, name);
  snprintf (place->new_name, sizeof place->new_name, "%s.new", name);

  place->dir_fd = open (place->dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  struct stat st;
  if (place->dir_fd == -1 || fstat (place->dir_fd, &st) == -1) {
    explain (errno, why, why_bytes, "its directory %s: %m", place->dir);
    place_close (place);
    return false;
  }
  uid_t me = geteuid ();
  if (st.st_uid != me && st.st_uid != 0) {
    explain (EPERM, why, why_bytes, "its directory %s is owned by uid %u, "
             "neither this user's (uid %u) nor root's: refused (a region "
             "file lives where no one else can replace it)", place->dir,
             (unsigned) st.st_uid, (unsigned) me);
    place_close (place);
    return false;
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
    explain (EPERM, why, why_bytes, "its directory %s is writable by group "
             "or others and not sticky (mode %04o): refused (chmod go-w %s, "
             "or give region= a path in a directory only this user can "
             "write)", place->dir, (unsigned) (st.st_mode & 07777),
             place->dir);
    place_close (place);
    return false;
  }
  if (!ancestors_trusted (place, &st, why, why_bytes)) {
    place_close (place);
    return false;
  }
  return true;
}

/* Whether name in the place's directory is the file fd has open (not a
 * file put there since).
 */
static bool
same_file_at (const struct region_place *place, const char *name, int fd)
{
  struct stat there, held;
  return fstatat (place->dir_fd, name, &there, AT_SYMLINK_NOFOLLOW) == 0
    && fstat (fd, &held) == 0
    && there.st_dev == held.st_dev && there.st_ino == held.st_ino;
}

static const char *
file_kind (mode_t mode)
{
  return S_ISLNK (mode) ? "symbolic link" : S_ISDIR (mode) ? "directory"
    : S_ISFIFO (mode) ? "FIFO" : S_ISSOCK (mode) ? "socket"
    : S_ISCHR (mode) || S_ISBLK (mode) ? "device" : "regular file";
}

/* The region file, opened (flags: O_RDONLY or O_RDWR) if this user may
 * trust it: a regular file reached by no link, this user's, writable by
 * no one else, one name.  -1 with errno and why: ENOENT (there is none),
 * EPERM (refused: not opened, or closed unread).
 */
static int
file_open_trusted (const struct region_place *place, int flags, char *why,
                   size_t why_bytes)
{
  struct stat st;
  if (fstatat (place->dir_fd, place->name, &st, AT_SYMLINK_NOFOLLOW) == -1) {
    explain (errno, why, why_bytes, "no region file %s: %m", place->path);
    return -1;
  }
  if (S_ISLNK (st.st_mode) || !S_ISREG (st.st_mode)) {
    explain (EPERM, why, why_bytes, "the region file is a %s: refused, not "
             "opened (%s)", file_kind (st.st_mode), S_ISLNK (st.st_mode)
             ? "a region file is never reached through a link: give "
             "region= the file's own path, or remove the link"
             : "give region= the path of a region file");
    return -1;
  }
  /* O_NONBLOCK: a FIFO put there since the look does not hang the open. */
  int fd = openat (place->dir_fd, place->name,
                   flags | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  if (fd == -1) {
    int err = errno;
    if (err == ELOOP)
      explain (EPERM, why, why_bytes, "the region file is a symbolic link: "
               "refused (a region file is never reached through a link)");
    else
      explain (err, why, why_bytes, "%s %s: %m", err == ENOENT
               ? "no region file" : "cannot open the region file",
               place->path);
    return -1;
  }
  uid_t me = geteuid ();
  if (fstat (fd, &st) == -1)
    explain (errno, why, why_bytes, "cannot look at the region file: %m");
  else if (!S_ISREG (st.st_mode))
    explain (EPERM, why, why_bytes, "the region file is a %s: refused",
             file_kind (st.st_mode));
  else if (st.st_uid != me)
    explain (EPERM, why, why_bytes, "the region file is owned by uid %u, not "
             "this user's (uid %u): refused (a region file is its server's "
             "user's own; remove it if it is no region's)",
             (unsigned) st.st_uid, (unsigned) me);
  else if (st.st_mode & (S_IWGRP | S_IWOTH))
    explain (EPERM, why, why_bytes, "the region file is writable by group or "
             "others (mode %04o): refused (chmod 600 %s if it is yours)",
             (unsigned) (st.st_mode & 07777), place->path);
  else if (st.st_nlink != 1)
    explain (EPERM, why, why_bytes, "the region file has %ju names (hard "
             "links): refused (a region file has one; remove the others if "
             "it is yours)", (uintmax_t) st.st_nlink);
  else
    return fd;
  int err = errno;
  close (fd);
  errno = err;
  return -1;
}

/* The region file opened as file_open_trusted does, and locked
 * (OWNERSHIP): its descriptor, still the file at the path once locked (a
 * writer may have renamed a new line over it meanwhile: the lock would
 * be on a file no longer the region's - tried again).  -1 with errno and
 * why: as file_open_trusted, or EBUSY (another process holds it).
 */
static int
file_lock_trusted (const struct region_place *place, char *why,
                   size_t why_bytes)
{
  for (unsigned tries = 0; tries < 64; tries++) {
    int fd = file_open_trusted (place, O_RDONLY, why, why_bytes);
    if (fd == -1)
      return -1;
    if (flock (fd, LOCK_EX | LOCK_NB) == -1) {
      int err = errno == EWOULDBLOCK ? EBUSY : errno;
      if (err != EBUSY)
        explain (err, why, why_bytes, "cannot lock the region file: %m");
      close (fd);
      errno = err;
      return -1;
    }
    if (same_file_at (place, place->name, fd))
      return fd;
    close (fd);                 /* replaced meanwhile: the new one */
  }
  explain (EAGAIN, why, why_bytes, "the region file is replaced again and "
           "again while it is being locked: refused");
  return -1;
}

/* What a region file says: the segment's key, its id and the device id
 * its header carries - or, while the region is being made, the key only
 * (creating: shm=-1 device=creating).
 */
struct region_line {
  key_t key;
  int shm_id;
  bool creating;
  char device_text[33];
};

/* The region file's one line, exactly as this code writes it; anything
 * else (empty, garbled, more than the line) is refused with EINVAL: it
 * is no region file, and nothing is written over it.
 */
static bool
region_file_parse (int fd, struct region_line *line, char *why,
                   size_t why_bytes)
{
  char text[256], again[256];
  ssize_t n = pread (fd, text, sizeof text - 1, 0);
  if (n < 0) {
    explain (errno, why, why_bytes, "cannot read the region file: %m");
    return false;
  }
  text[n] = '\0';
  unsigned key;
  bool named = n > 0 && (size_t) n < sizeof text - 1
    && sscanf (text, "nbdkit-zram region key=%8x shm=%d device= %32[0-9a-z]",
               &key, &line->shm_id, line->device_text) == 3;
  if (named) {
    /* The text is what the line would be written as: nothing more, nothing
     * written another way (or as earlier versions wrote "creating":
     * right-aligned in 32 columns).
     */
    line->key = key;
    line->creating = strcmp (line->device_text, REGION_FILE_CREATING) == 0;
    snprintf (again, sizeof again, REGION_FILE_FORMAT, key, line->shm_id,
              line->device_text);
    named = strcmp (again, text) == 0;
    if (!named && line->creating) {
      snprintf (again, sizeof again, REGION_FILE_FORMAT_PADDED, key,
                line->shm_id, line->device_text);
      named = strcmp (again, text) == 0;
    }
    named = named
      && (line->creating
          ? line->shm_id == -1 && line->key != IPC_PRIVATE
          : line->shm_id >= 0 && strlen (line->device_text) == 32
            && strspn (line->device_text, "0123456789abcdef") == 32);
  }
  if (!named)
    explain (EINVAL, why, why_bytes, "not a region file (empty, or not one "
             "line 'nbdkit-zram region key=... shm=... device=...'): "
             "refused, nothing written; remove it if it is no region's, or "
             "give region= another path");
  return named;
}

enum segment_found {
  SEGMENT_GONE,                 /* no segment of the line's key and id */
  SEGMENT_MINE,                 /* this user's, made by it, mode 0600 */
  SEGMENT_REFUSED,              /* someone else's: not touched */
};

/* The segment a region file's line names, looked at: by its id, or by
 * its key for a region being made.  An id whose segment has another key
 * is another segment's now (the named one is gone: ids are reused).  A
 * segment is used only if this user made it and owns it and no one else
 * may attach it (mode 0600); *shm_id and *info then say which.
 */
static enum segment_found
segment_find (const struct region_line *line, int *shm_id,
              struct shmid_ds *info, char *why, size_t why_bytes)
{
  int id = line->shm_id;
  if (line->creating && (id = shmget (line->key, 0, 0)) == -1) {
    if (errno == ENOENT)
      return SEGMENT_GONE;
    explain (errno == EACCES ? EPERM : errno, why, why_bytes, "the segment "
             "of key %x it names (a region being made) cannot be looked "
             "at (%m): not this user's: refused, not touched",
             (unsigned) line->key);
    return SEGMENT_REFUSED;
  }
  if (shmctl (id, IPC_STAT, info) == -1) {
    if (errno == EINVAL || errno == EIDRM)
      return SEGMENT_GONE;
    explain (errno == EACCES ? EPERM : errno, why, why_bytes, "the segment "
             "it names (shm id %d) cannot be looked at (%m): not this "
             "user's: refused, not touched", id);
    return SEGMENT_REFUSED;
  }
  if (info->shm_perm.__key != line->key)
    return SEGMENT_GONE;
  uid_t me = geteuid ();
  if (info->shm_perm.uid != me || info->shm_perm.cuid != me) {
    explain (EPERM, why, why_bytes, "the segment it names (shm id %d) is "
             "owned by uid %u and was made by uid %u, not this user's (uid "
             "%u): refused, not touched (remove the region file if it is no "
             "region of yours)", id, (unsigned) info->shm_perm.uid,
             (unsigned) info->shm_perm.cuid, (unsigned) me);
    return SEGMENT_REFUSED;
  }
  if ((info->shm_perm.mode & 0777) != 0600) {
    explain (EPERM, why, why_bytes, "the segment it names (shm id %d) has "
             "mode %04o, not 0600 (another user may write it): refused, not "
             "touched", id, (unsigned) (info->shm_perm.mode & 0777));
    return SEGMENT_REFUSED;
  }
  *shm_id = id;
  return SEGMENT_MINE;
}

/* Wait until no process but allowed ones (this one, once it attached)
 * has the segment attached: a standby's header peek or an exiting
 * owner's unmapping goes in a moment; an attachment that stays
 * ATTACHED_WAIT_NS is a live server's (one reached through a copy of
 * its region file, whose lock is on another inode), and its segment is
 * never taken.  false with errno and why: EBUSY, or ENOENT if the
 * segment went meanwhile.
 */
static bool
segment_wait_unattached (int shm_id, shmatt_t allowed, struct shmid_ds *info,
                         char *why, size_t why_bytes)
{
  uint64_t deadline = clock_now_ns () + ATTACHED_WAIT_NS;
  for (;;) {
    if (shmctl (shm_id, IPC_STAT, info) == -1) {
      explain (errno == EINVAL || errno == EIDRM ? ENOENT : errno, why,
               why_bytes, "the segment it names (shm id %d) went: %m",
               shm_id);
      return false;
    }
    if (info->shm_nattch <= allowed)
      return true;
    if (clock_now_ns () >= deadline)
      break;
    wait_step ();
  }
  explain (EBUSY, why, why_bytes, "the segment it names (shm id %d) is "
           "attached by %lu process%s%s (last pid %d): another server "
           "serves it: refused (its server owns it through another region "
           "file, a copy: use that one)", shm_id,
           (unsigned long) (info->shm_nattch - allowed),
           info->shm_nattch - allowed == 1 ? "" : "es",
           allowed ? " besides this one" : "", (int) info->shm_lpid);
  return false;
}

/* Whether the segment (this user's: segment_find; unattached) is,
 * provably, the one the line names - what may be removed on the line's
 * word: for a region being made, a segment of that key whose header is
 * all zero (its creator died before writing it), or a region's header
 * not whole yet or still "creating" (it died while writing or making
 * it: CREATION in region.h); else a whole region header (magic,
 * identity checksum) of the segment's size and the line's device id.
 * false with EINVAL and why: not touched.
 */
static bool
segment_is_named (int shm_id, const struct shmid_ds *info,
                  const struct region_line *line, char *why,
                  size_t why_bytes)
{
  struct region seen;
  static const struct region nothing_written;
  if (info->shm_segsz < sizeof seen) {
    explain (EINVAL, why, why_bytes, "the segment it names (shm id %d) is "
             "%zu bytes, smaller than a region's header: not a region: "
             "refused, not touched", shm_id, (size_t) info->shm_segsz);
    return false;
  }
  if (!header_peek (shm_id, &seen)) {
    explain (errno, why, why_bytes, "cannot read the segment it names (shm "
             "id %d): %m", shm_id);
    return false;
  }
  char seen_text[33];
  device_id_text (seen.device_id, seen_text);
  bool magic = memcmp (seen.magic, REGION_MAGIC, sizeof seen.magic) == 0;
  /* Under a "creating" line: a header never written, or one its creator
   * was writing (identity or state not whole yet) or had written but
   * not made (state "creating"): a made region is never removed for it.
   */
  const struct region_state_record *state = region_state_read (&seen);
  bool being_made = memcmp (&seen, &nothing_written, sizeof seen) == 0
    || (magic && (seen.identity_checksum != identity_checksum (&seen)
                  || !state_whole (state)
                  || state->state == REGION_CREATING));
  if (line->creating
      ? being_made
      : magic && seen.identity_checksum == identity_checksum (&seen)
        && seen.region_bytes == info->shm_segsz
        && strcmp (seen_text, line->device_text) == 0)
    return true;
  explain (EINVAL, why, why_bytes, "the segment it names (shm id %d) is not "
           "the region the file names (%s): refused, not touched (ipcrm -m "
           "%d removes it if you know it is yours)", shm_id,
           line->creating ? "it holds something else than a region being "
           "made" : !magic ? "no region's magic"
           : seen.identity_checksum != identity_checksum (&seen)
           ? "its header is damaged"
           : seen.region_bytes != info->shm_segsz
           ? "its size is not its header's" : "another device's", shm_id);
  return false;
}

/* PATH.new, where it is in the way of a new line: left by a writer that
 * died (a regular file of this user's, mode 0600, one name, no one's lock
 * on it), it is removed: 1.  Being written (locked): 0, wait.  Anything
 * else is refused, not touched: -1 with errno and why.
 */
static int
new_file_leftover_remove (const struct region_place *place, char *why,
                          size_t why_bytes)
{
  struct stat st;
  if (fstatat (place->dir_fd, place->new_name, &st, AT_SYMLINK_NOFOLLOW)
      == -1) {
    if (errno == ENOENT)
      return 1;                 /* gone meanwhile */
    explain (errno, why, why_bytes, "cannot look at %s.new: %m", place->path);
    return -1;
  }
  if (S_ISLNK (st.st_mode)) {
    explain (EPERM, why, why_bytes, "%s.new is a symbolic link: refused, not "
             "touched (a region file is never written through a link; "
             "remove it)", place->path);
    return -1;
  }
  if (!S_ISREG (st.st_mode) || st.st_uid != geteuid ()
      || (st.st_mode & 07777) != 0600 || st.st_nlink != 1) {
    explain (EPERM, why, why_bytes, "%s.new is in the way and is not what a "
             "region file's writer leaves (a %s of uid %u, mode %04o, %ju "
             "names): refused, not touched (remove it if no server is "
             "making the region)", place->path, file_kind (st.st_mode),
             (unsigned) st.st_uid, (unsigned) (st.st_mode & 07777),
             (uintmax_t) st.st_nlink);
    return -1;
  }
  int fd = openat (place->dir_fd, place->new_name,
                   O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd == -1)
    return errno == ENOENT ? 1 : 0;
  int removed = 0;
  if (flock (fd, LOCK_EX | LOCK_NB) == 0) {
    if (same_file_at (place, place->new_name, fd))
      unlinkat (place->dir_fd, place->new_name, 0);
    removed = 1;
  }
  close (fd);
  return removed;
}

/* PATH.new made for a new line of the region file: created (O_EXCL, never
 * through a link), mode 0600, and locked, so no one else writes, renames
 * or removes it.  One being written by another is waited for,
 * NEW_FILE_WAIT_NS at most.  -1 with errno and why.
 */
static int
new_file_take (const struct region_place *place, char *why, size_t why_bytes)
{
  uint64_t deadline = clock_now_ns () + NEW_FILE_WAIT_NS;
  for (;;) {
    int fd = openat (place->dir_fd, place->new_name,
                     O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd == -1 && errno != EEXIST) {
      explain (errno, why, why_bytes, "cannot make %s.new: %m", place->path);
      return -1;
    }
    if (fd != -1) {
      /* Another writer may have taken it for a leftover between the
       * create and the lock, and removed it: it is ours only if it is
       * still there, locked by us.
       */
      if (flock (fd, LOCK_EX | LOCK_NB) == 0
          && same_file_at (place, place->new_name, fd)) {
        if (fchmod (fd, 0600) == -1) {   /* whatever the umask */
          explain (errno, why, why_bytes, "cannot set %s.new's mode: %m",
                   place->path);
          unlinkat (place->dir_fd, place->new_name, 0);
          close (fd);
          return -1;
        }
        return fd;
      }
      close (fd);
    }
    else {
      int removed = new_file_leftover_remove (place, why, why_bytes);
      if (removed == -1)
        return -1;
      if (removed)
        continue;
    }
    if (clock_now_ns () >= deadline) {
      explain (EBUSY, why, why_bytes, "%s.new is being written by another "
               "process (a server making or updating this region): refused; "
               "try again once it is done", place->path);
      return -1;
    }
    wait_step ();
  }
}

/* Whether a new region's first line may replace what is at the region
 * file's name (region_create, while it holds PATH.new): nothing, or a
 * region file of this user's that no one owns and that names no segment
 * that exists.  *old_fd: that file, locked until the rename (-1 for
 * none).  Else false with errno and why: EBUSY (owned), EEXIST (its
 * region exists), EPERM, EINVAL (not a region file: nothing written).
 */
static bool
region_file_replaceable (const struct region_place *place, int *old_fd,
                         char *why, size_t why_bytes)
{
  *old_fd = -1;
  int fd = file_lock_trusted (place, why, why_bytes);
  if (fd == -1 && errno == ENOENT) {
    if (why_bytes)
      why[0] = '\0';
    return true;
  }
  if (fd == -1) {
    if (errno == EBUSY)
      explain (EBUSY, why, why_bytes, "the region is owned by another "
               "process (made or taken by it first): refused");
    return false;
  }
  struct region_line line;
  struct shmid_ds info;
  int shm_id;
  if (!region_file_parse (fd, &line, why, why_bytes)) {
    close (fd);
    return false;
  }
  switch (segment_find (&line, &shm_id, &info, why, why_bytes)) {
  case SEGMENT_GONE:
    *old_fd = fd;
    return true;
  case SEGMENT_MINE:
    explain (EEXIST, why, why_bytes, "the region file names a region that "
             "exists (shm id %d): refused, not replaced (nbdkit-zramctl "
             "region remove %s gives it up)", shm_id, place->path);
    break;
  case SEGMENT_REFUSED:
    break;
  }
  int err = errno;
  close (fd);
  errno = err;
  return false;
}

/* Remove the region file's name if it is still the file fd has open:
 * 0, or -1 with errno.
 */
static int
region_file_unlink (const struct region_place *place, int fd)
{
  if (!same_file_at (place, place->name, fd))
    return 0;                   /* not this file's name any more */
  return unlinkat (place->dir_fd, place->name, 0);
}

/* Write the region file's line, replacing the file atomically (the lock
 * is on the old inode: the new one is locked before the rename); the
 * device id, or REGION_FILE_CREATING while the header is being written.
 * The first line (no lock_fd yet) replaces only what
 * region_file_replaceable allows; a later one only this owner's file.
 */
static int
region_file_write (struct region_owner *owner,
                   const struct region_place *place, bool created,
                   char *why, size_t why_bytes)
{
  char id[33];
  if (created)
    device_id_text (owner->region->device_id, id);
  else
    strcpy (id, REGION_FILE_CREATING);
  int fd = new_file_take (place, why, why_bytes);
  if (fd == -1)
    return -1;
  int old_fd = -1;
  if (dprintf (fd, REGION_FILE_FORMAT, (unsigned) owner->key, owner->shm_id,
               id) < 0 || fsync (fd) == -1) {
    explain (errno, why, why_bytes, "cannot write %s.new: %m", place->path);
    goto fail;
  }
  if (owner->lock_fd == -1) {
    if (!region_file_replaceable (place, &old_fd, why, why_bytes))
      goto fail;
  }
  else if (!same_file_at (place, place->name, owner->lock_fd)) {
    explain (EBUSY, why, why_bytes, "the region file was replaced by "
             "another process while this one made the region: refused");
    goto fail;
  }
  if (renameat (place->dir_fd, place->new_name, place->dir_fd, place->name)
      == -1) {
    explain (errno, why, why_bytes, "cannot rename %s.new over the region "
             "file: %m", place->path);
    goto fail;
  }
  if (old_fd != -1)
    close (old_fd);
  if (owner->lock_fd != -1)
    close (owner->lock_fd);
  owner->lock_fd = fd;
  return 0;

 fail:;
  int err = errno;
  if (same_file_at (place, place->new_name, fd))
    unlinkat (place->dir_fd, place->new_name, 0);
  close (fd);
  if (old_fd != -1)
    close (old_fd);
  errno = err;
  return -1;
}

/* This process owns the region from now: the heap's lock made anew (a
 * pthread lock's state is the last owner's).
 */
static void
heap_own (struct region *region)
{
  pthread_mutex_init (&region->heap_lock, NULL);
}

/* The address range region_reserve_address keeps (ADDRESS RESERVATION
 * in region.h): set by it, consumed or given back by region_attach.
 * Not locked: a process reserves before it starts the thread that
 * attaches (a standby: nbdkit's get_ready, then its takeover thread).
 */
static void *reserved_address;
static uint64_t reserved_bytes;

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
region_create (const char *path, uint64_t bytes, uint64_t device_bytes,
               bool locked)
{
  return region_create_explained (path, bytes, device_bytes, locked, NULL, 0);
}

struct region_owner *
region_create_explained (const char *path, uint64_t bytes,
                         uint64_t device_bytes, bool locked, char *why,
                         size_t why_bytes)
{
  if (why_bytes)
    why[0] = '\0';
  bytes = (bytes + REGION_PAGE_SIZE - 1) / REGION_PAGE_SIZE * REGION_PAGE_SIZE;
  uint64_t pages = bytes / REGION_PAGE_SIZE;
  uint64_t map_pages = map_pages_for (pages);
  if (pages < map_pages + 1 || pages > UINT32_MAX) {
    explain (EINVAL, why, why_bytes, "a region of %" PRIu64 " pages cannot "
             "be made (%" PRIu64 " to %" PRIu32 ")", pages, map_pages + 1,
             UINT32_MAX);
    return NULL;
  }
  struct region_place place = { .dir_fd = -1 };
  struct region_owner *owner = calloc (1, sizeof *owner);
  if (!owner || !(owner->path = strdup (path)))
    goto fail;
  owner->shm_id = -1;
  owner->lock_fd = -1;
  if (!place_open (&place, path, why, why_bytes))
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
    if (region_file_write (owner, &place, false, why, why_bytes) == -1)
      goto fail;
    owner->shm_id = shmget (owner->key, bytes,
                            IPC_CREAT | IPC_EXCL | 0600 | SHM_NORESERVE);
    if (owner->shm_id == -1 && (errno != EEXIST || tries == 16)) {
      explain (errno, why, why_bytes, "cannot make its segment of %" PRIu64
               " bytes: %m", bytes);
      goto fail;
    }
  }
  reservation_release ();       /* a region that is gone: its range back */
  if (locked && shmctl (owner->shm_id, SHM_LOCK, NULL) == -1) {
    explain (errno, why, why_bytes, "cannot lock it in memory, as swap "
             "needs: %m%s", errno == EPERM || errno == ENOMEM
             ? " (locking it needs CAP_IPC_LOCK or RLIMIT_MEMLOCK)" : "");
    goto fail;
  }
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
  if (region_file_write (owner, &place, true, why, why_bytes) == -1)
    goto fail;
  place_close (&place);
  return owner;

 fail:;
  int err = errno;
  if (why_bytes && !why[0])
    snprintf (why, why_bytes, "%s", strerror (err));
  if (owner) {
    if (owner->region)
      shmdt (owner->region);
    if (owner->shm_id != -1)
      shmctl (owner->shm_id, IPC_RMID, NULL);
    if (owner->lock_fd != -1)
      close (owner->lock_fd);
    free (owner->path);
    free (owner);
  }
  place_close (&place);
  errno = err;
  return NULL;
}

/* A copy of the header of the segment the region file at path names,
 * read without owning it, if the file and the segment are this user's
 * (TRUST); false with errno if there is none to read (ENOENT: no region,
 * or one being made; EINVAL: not a region file; EPERM: not trusted).
 */
static bool
path_peek (const char *path, struct region *seen)
{
  struct region_place place;
  if (!place_open (&place, path, NULL, 0))
    return false;
  int fd = file_open_trusted (&place, O_RDONLY, NULL, 0);
  place_close (&place);
  if (fd == -1)
    return false;
  struct region_line line;
  bool named = region_file_parse (fd, &line, NULL, 0);
  close (fd);
  if (!named)
    return false;
  struct shmid_ds info;
  int shm_id;
  if (line.creating) {
    errno = ENOENT;
    return false;
  }
  switch (segment_find (&line, &shm_id, &info, NULL, 0)) {
  case SEGMENT_GONE:
    errno = ENOENT;
    return false;
  case SEGMENT_REFUSED:
    return false;
  case SEGMENT_MINE:
    break;
  }
  return header_peek (shm_id, seen);
}

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

struct region_owner *
region_attach (const char *path, uint64_t device_bytes,
               enum region_attach_result *how, char *why, size_t why_bytes)
{
  if (why_bytes)
    why[0] = '\0';
  struct region_place place;
  if (!place_open (&place, path, why, why_bytes))
    return NULL;
  int lock_fd = file_lock_trusted (&place, why, why_bytes);
  place_close (&place);
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
    return NULL;
  struct region_line line;
  if (!region_file_parse (lock_fd, &line, why, why_bytes)) {
    close (lock_fd);
    return NULL;
  }
  const char *device_text = line.device_text;
  int shm_id = -1;
  struct shmid_ds info;
  enum segment_found found = segment_find (&line, &shm_id, &info, why,
                                           why_bytes);
  if (found == SEGMENT_REFUSED)
    goto refused;
  if (line.creating) {
    /* A creator (the lock is free: it is gone) died before its region was
     * whole: nothing was stored in it.  Its segment, if it made one, is
     * removed if it is provably that creator's; a new region is made.
     */
    if (found == SEGMENT_MINE
        && (!segment_wait_unattached (shm_id, 0, &info, why, why_bytes)
            || !segment_is_named (shm_id, &info, &line, why, why_bytes)))
      goto refused;
    if (found == SEGMENT_MINE)
      shmctl (shm_id, IPC_RMID, NULL);
    close (lock_fd);
    return refuse (ENOENT, why, why_bytes, "the region named by %s was "
                   "being made when its server died: %s", path,
                   found == SEGMENT_MINE ? "its segment removed"
                   : "it had no segment yet");
  }
  if (found == SEGMENT_GONE) {
    close (lock_fd);
    return refuse (ENOENT, why, why_bytes, "the region file %s names no "
                   "segment that exists (removed, or the machine "
                   "restarted)", path);
  }
  /* One process serves a region: one that has it attached (a server that
   * owns it through another inode's lock, a copy of this file) keeps it.
   */
  if (!segment_wait_unattached (shm_id, 0, &info, why, why_bytes)) {
    if (errno == ENOENT) {
      close (lock_fd);
      return refuse (ENOENT, why, why_bytes, "the region file %s names no "
                     "segment that exists (removed meanwhile)", path);
    }
    goto refused;
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
  /* Another taker that passed the check above at the same moment: then
   * neither keeps it.
   */
  if (!segment_wait_unattached (shm_id, 1, &info, why, why_bytes)) {
    shmdt (region);
    close (lock_fd);
    return NULL;
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
  owner->key = line.key;
  owner->lock_fd = lock_fd;
  switch (state->state) {
  case REGION_HANDED_OVER: *how = REGION_ATTACH_CLEAN; break;
  case REGION_CREATING: *how = REGION_ATTACH_UNMADE; break;
  default: *how = REGION_ATTACH_CRASHED; break;
  }
  heap_own (region);
  return owner;

 refused:;
  int err = errno;
  close (lock_fd);
  errno = err;
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
region_remake (struct region_owner *owner)
{
  struct region *region = owner->region;
  region_recover_begin (region);
  region_recover_end (region);  /* nothing claimed: every page back */
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
  /* The name goes only if it is still this owner's file. */
  struct region_place place;
  if (place_open (&place, owner->path, NULL, 0)) {
    region_file_unlink (&place, owner->lock_fd);
    place_close (&place);
  }
  owner_end (owner);
}

int
region_remove (const char *path, char *why, size_t why_bytes)
{
  if (why_bytes)
    why[0] = '\0';
  struct region_place place;
  if (!place_open (&place, path, why, why_bytes))
    return -1;
  int fd = file_lock_trusted (&place, why, why_bytes);
  if (fd == -1) {
    int err = errno;
    place_close (&place);
    if (err == ENOENT)
      return 0;                 /* nothing to remove */
    if (err == EBUSY)
      explain (EBUSY, why, why_bytes, "the region is owned by another "
               "process (its server): refused (stop the server, or give it "
               "up with nbdkit-zramctl drop)");
    errno = err;
    return -1;
  }
  struct region_line line;
  struct shmid_ds info;
  int shm_id;
  if (!region_file_parse (fd, &line, why, why_bytes))
    goto refused;
  switch (segment_find (&line, &shm_id, &info, why, why_bytes)) {
  case SEGMENT_REFUSED:
    goto refused;
  case SEGMENT_GONE:
    break;                      /* the file alone */
  case SEGMENT_MINE:
    if (!segment_wait_unattached (shm_id, 0, &info, why, why_bytes)) {
      if (errno == ENOENT)
        break;                  /* went meanwhile */
      goto refused;
    }
    if (!segment_is_named (shm_id, &info, &line, why, why_bytes))
      goto refused;
    if (shmctl (shm_id, IPC_RMID, NULL) == -1) {
      explain (errno, why, why_bytes, "cannot remove its segment (shm id "
               "%d): %m", shm_id);
      goto refused;
    }
    break;
  }
  if (region_file_unlink (&place, fd) == -1) {
    explain (errno, why, why_bytes, "cannot remove the region file: %m");
    goto refused;
  }
  close (fd);
  place_close (&place);
  return 0;

 refused:;
  int err = errno;
  close (fd);
  place_close (&place);
  errno = err;
  return -1;
}
