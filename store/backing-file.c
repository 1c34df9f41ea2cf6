/* The backing store's file transport: opening (no planted links, one
 * server per file) and whole requests on the file (backing.h; the struct
 * in backing-internal.h).  Below the requests' dispatch (backing.c).
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backing-internal.h"

/* The process holding an open file description lock on the file whose
 * device and inode are st's: a descriptor of it with an OFDLCK line in
 * its fdinfo.  (The lock itself does not say: F_OFD_GETLK and
 * /proc/locks give -1 for an OFD lock's process.)  0 if none is seen,
 * in a process this one may not look into, say.
 */
static pid_t
lock_holder (const struct stat *st)
{
  DIR *processes = opendir ("/proc");
  if (!processes)
    return 0;
  pid_t holder = 0;
  struct dirent *process;
  while (!holder && (process = readdir (processes))) {
    pid_t pid = atoi (process->d_name);
    if (pid <= 0 || pid == getpid ())
      continue;
    char path[64];
    snprintf (path, sizeof path, "/proc/%d/fd", pid);
    DIR *fds = opendir (path);
    if (!fds)
      continue;
    struct dirent *fd;
    while (!holder && (fd = readdir (fds))) {
      struct stat target;
      snprintf (path, sizeof path, "/proc/%d/fd/%.16s", pid, fd->d_name);
      if (fd->d_name[0] == '.' || stat (path, &target) == -1
          || target.st_dev != st->st_dev || target.st_ino != st->st_ino)
        continue;
      snprintf (path, sizeof path, "/proc/%d/fdinfo/%.16s", pid, fd->d_name);
      FILE *fp = fopen (path, "r");
      char line[256];
      while (fp && fgets (line, sizeof line, fp))
        if (strncmp (line, "lock:", 5) == 0 && strstr (line, "OFDLCK"))
          holder = pid;
      if (fp)
        fclose (fp);
    }
    closedir (fds);
  }
  closedir (processes);
  return holder;
}

/* Lock all of the open file (an OFD write lock, released when it is
 * closed): one server per backing file.  A message in *error if another
 * holds it.
 */
static int
lock_file (int fd, const char *path, char **error)
{
  struct flock whole = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
  if (fcntl (fd, F_OFD_SETLK, &whole) == 0)
    return 0;
  if (errno != EAGAIN && errno != EACCES) {
    *error = backing_message ("backing: %s: cannot lock it: %s", path, strerror (errno));
    return -1;
  }
  struct stat st;
  pid_t holder = fstat (fd, &st) == 0 ? lock_holder (&st) : 0;
  char comm[64] = "";
  if (holder) {
    char comm_path[64];
    snprintf (comm_path, sizeof comm_path, "/proc/%d/comm", holder);
    FILE *fp = fopen (comm_path, "r");
    if (fp && fgets (comm, sizeof comm, fp))
      comm[strcspn (comm, "\n")] = '\0';
    if (fp)
      fclose (fp);
  }
  if (holder)
    *error = backing_message ("backing: %s is in use by another server (process %d, "
                      "%s): two servers writing back to one file would "
                      "overwrite each other's blocks", path, (int) holder,
                      comm[0] ? comm : "?");
  else
    *error = backing_message ("backing: %s is in use by another server (it holds a "
                      "lock on it): two servers writing back to one file "
                      "would overwrite each other's blocks", path);
  return -1;
}

int
backing_file_open (struct backing *backing, const char *path, uint64_t capacity,
           char **error)
{
  /* A file the server makes or names itself, never one a planted
   * symbolic link points to (the server may run as root): an existing
   * file opened without following a link, a new one created exclusively;
   * a link is followed only to a block device (/dev/disk/by-id/...) or
   * through /proc/self/fd (the process's own descriptors).
   */
  int flags = O_RDWR | O_CLOEXEC | (backing->odirect ? O_DIRECT : 0);
  backing->fd = open (path, flags | O_NOFOLLOW);
  if (backing->fd == -1 && errno == ENOENT)
    backing->fd = open (path, flags | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  else if (backing->fd == -1 && errno == ELOOP) {
    struct stat target;
    if (strncmp (path, "/proc/self/fd/", 14) == 0
        || (stat (path, &target) == 0 && S_ISBLK (target.st_mode)))
      backing->fd = open (path, flags);
    else {
      *error = backing_message ("backing: %s is a symbolic link, and not to a block "
                        "device: name the file itself", path);
      return -1;
    }
  }
  if (backing->fd == -1) {
    *error = backing_message ("backing: %s: %s", path, strerror (errno));
    return -1;
  }
  if (lock_file (backing->fd, path, error) == -1)
    return -1;
  if (backing_file_extend (backing, capacity) == -1) {
    *error = backing_message ("backing: %s: cannot extend it to %" PRIu64 " bytes: %s",
                      path, capacity, strerror (errno));
    return -1;
  }
  backing->can_trim = true;     /* punching holes, where the fs can */
  return 0;
}

int
backing_file_extend (struct backing *backing, uint64_t bytes)
{
  struct stat st;
  if (backing->fd == -1)
    return 0;
  if (fstat (backing->fd, &st) == -1)
    return -1;
  if (!S_ISREG (st.st_mode) || (uint64_t) st.st_size >= bytes)
    return 0;
  return ftruncate (backing->fd, bytes);
}

/* pread, pwrite (in full) or fdatasync on the file (through an aligned
 * bounce buffer with O_DIRECT, in whole sectors).  -1 with errno.
 */
int
backing_file_request (struct backing *backing, char op, void *buf, size_t bytes,
              uint64_t offset)
{
  if (op == 'f')
    return fdatasync (backing->fd);
  void *io = buf;
  size_t length = bytes;
  if (backing->odirect) {
    length = (bytes + BACKING_SECTOR - 1) / BACKING_SECTOR * BACKING_SECTOR;
    int err = posix_memalign (&io, 4096, length);
    if (err != 0) {
      errno = err;
      return -1;
    }
    if (op == 'w') {
      memcpy (io, buf, bytes);
      memset ((char *) io + bytes, 0, length - bytes);
    }
  }
  size_t done = 0;
  int r = 0;
  while (done < length) {
    ssize_t n = op == 'r'
      ? pread (backing->fd, (char *) io + done, length - done, offset + done)
      : pwrite (backing->fd, (char *) io + done, length - done, offset + done);
    if (n <= 0) {
      if (n == -1 && errno == EINTR)
        continue;
      if (n == 0)
        errno = EIO;            /* the file ends early: truncated */
      r = -1;
      break;
    }
    done += n;
  }
  if (io != buf) {
    int saved = errno;
    if (r == 0 && op == 'r')
      memcpy (buf, io, bytes);
    free (io);
    errno = saved;
  }
  return r;
}

