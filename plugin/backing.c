/* The backing store of writeback: see backing.h. */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libnbd.h>

#include "backing.h"

struct connection {
  pthread_mutex_t lock;         /* guards handle and last_connect */
  struct nbd_handle *handle;    /* NULL: to be made again */
  time_t last_connect;          /* monotonic seconds of the last attempt */
};

struct backing {
  char *uri;                    /* NULL for a file */
  int fd;                       /* a file, or -1 */
  bool odirect;
  unsigned connection_count;
  struct connection connections[BACKING_CONNECTIONS];
  _Atomic unsigned next_connection;
  atomic_bool can_trim;         /* cleared when the store cannot */

  pthread_mutex_t map_lock;     /* guards bits, free_sectors, cursor */
  uint64_t *bits;               /* one per sector, 1: allocated */
  uint64_t sectors;
  uint64_t free_sectors;
  uint64_t cursor;              /* where the next search starts */

  _Atomic uint64_t failed;
  _Atomic uint64_t reconnects;
};

bool
backing_is_uri (const char *target)
{
  return strncmp (target, "nbd://", 6) == 0 || strncmp (target, "nbds://", 7) == 0
    || strncmp (target, "nbd+unix://", 11) == 0
    || strncmp (target, "nbds+unix://", 12) == 0
    || strncmp (target, "nbd+vsock://", 12) == 0;
}

static char *
message (const char *format, ...)
{
  va_list args;
  char *text = NULL;
  va_start (args, format);
  if (vasprintf (&text, format, args) == -1)
    text = NULL;
  va_end (args);
  return text;
}

static time_t
monotonic_seconds (void)
{
  struct timespec now;
  clock_gettime (CLOCK_MONOTONIC, &now);
  return now.tv_sec;
}

/* A connected handle, or NULL with a message in *error. */
static struct nbd_handle *
nbd_connect (const char *uri, char **error)
{
  struct nbd_handle *handle = nbd_create ();
  if (!handle) {
    *error = message ("backing: %s", nbd_get_error ());
    return NULL;
  }
  if (nbd_connect_uri (handle, uri) == -1) {
    *error = message ("backing: %s: %s", uri, nbd_get_error ());
    nbd_close (handle);
    return NULL;
  }
  return handle;
}

static int
open_nbd (struct backing *backing, uint64_t *capacity, char **error)
{
  struct nbd_handle *first = nbd_connect (backing->uri, error);
  if (!first)
    return -1;
  int64_t size = nbd_get_size (first);
  if (size < BACKING_SECTOR || nbd_is_read_only (first) == 1) {
    *error = message ("backing: %s: %s", backing->uri,
                      size < 0 ? nbd_get_error ()
                      : size < BACKING_SECTOR ? "the export is too small"
                      : "the export is read-only");
    nbd_close (first);
    return -1;
  }
  if ((uint64_t) size < *capacity)
    *capacity = size;
  backing->can_trim = nbd_can_trim (first) == 1;
  backing->connections[0].handle = first;
  backing->connection_count = 1;
  if (nbd_can_multi_conn (first) == 1) {
    for (unsigned i = 1; i < BACKING_CONNECTIONS; i++) {
      char *ignored = NULL;
      struct nbd_handle *more = nbd_connect (backing->uri, &ignored);
      free (ignored);
      if (!more)
        break;
      backing->connections[i].handle = more;
      backing->connection_count++;
    }
  }
  return 0;
}

static int
open_file (struct backing *backing, const char *path, uint64_t capacity,
           char **error)
{
  int flags = O_RDWR | O_CREAT | O_CLOEXEC | (backing->odirect ? O_DIRECT : 0);
  backing->fd = open (path, flags, 0600);
  if (backing->fd == -1) {
    *error = message ("backing: %s: %s", path, strerror (errno));
    return -1;
  }
  struct stat st;
  if (fstat (backing->fd, &st) == 0 && S_ISREG (st.st_mode)
      && (uint64_t) st.st_size < capacity
      && ftruncate (backing->fd, capacity) == -1) {
    *error = message ("backing: %s: cannot extend it to %" PRIu64 " bytes: %s",
                      path, capacity, strerror (errno));
    return -1;
  }
  backing->can_trim = true;     /* punching holes, where the fs can */
  return 0;
}

struct backing *
backing_open (const char *target, uint64_t capacity, bool odirect,
              char **error)
{
  *error = NULL;
  struct backing *backing = calloc (1, sizeof *backing);
  if (!backing) {
    *error = message ("backing: %s", strerror (errno));
    return NULL;
  }
  backing->fd = -1;
  backing->odirect = odirect;
  pthread_mutex_init (&backing->map_lock, NULL);
  for (unsigned i = 0; i < BACKING_CONNECTIONS; i++)
    pthread_mutex_init (&backing->connections[i].lock, NULL);
  int r;
  if (backing_is_uri (target)) {
    if (odirect) {
      *error = message ("backing: O_DIRECT is for a file, not %s", target);
      backing_close (backing);
      return NULL;
    }
    backing->uri = strdup (target);
    r = backing->uri ? open_nbd (backing, &capacity, error) : -1;
  }
  else
    r = open_file (backing, target, capacity, error);
  if (r == 0) {
    backing->sectors = capacity / BACKING_SECTOR;
    backing->free_sectors = backing->sectors;
    backing->bits = calloc ((backing->sectors + 63) / 64, sizeof (uint64_t));
    if (!backing->bits)
      r = -1;
  }
  if (r == -1) {
    if (!*error)
      *error = message ("backing: %s", strerror (errno));
    backing_close (backing);
    return NULL;
  }
  return backing;
}

void
backing_close (struct backing *backing)
{
  if (!backing)
    return;
  for (unsigned i = 0; i < BACKING_CONNECTIONS; i++) {
    if (backing->connections[i].handle) {
      nbd_shutdown (backing->connections[i].handle, 0);
      nbd_close (backing->connections[i].handle);
    }
    pthread_mutex_destroy (&backing->connections[i].lock);
  }
  if (backing->fd >= 0)
    close (backing->fd);
  pthread_mutex_destroy (&backing->map_lock);
  free (backing->bits);
  free (backing->uri);
  free (backing);
}

/* ---- the space map --------------------------------------------------- */

static inline bool
bit_is_set (const uint64_t *bits, uint64_t i)
{
  return bits[i / 64] >> (i % 64) & 1;
}

static void
bits_assign (uint64_t *bits, uint64_t first, uint64_t count, bool set)
{
  for (uint64_t i = first; i < first + count; i++) {
    if (set)
      bits[i / 64] |= 1ull << (i % 64);
    else
      bits[i / 64] &= ~(1ull << (i % 64));
  }
}

/* The first run of count free sectors in [from, end), or end if none. */
static uint64_t
run_search (const uint64_t *bits, uint64_t from, uint64_t end, uint64_t count)
{
  uint64_t start = from, length = 0;
  for (uint64_t i = from; i < end; i++) {
    if (i % 64 == 0 && bits[i / 64] == UINT64_MAX && i + 64 <= end) {
      i += 63;                  /* a whole word taken */
      length = 0;
      start = i + 1;
      continue;
    }
    if (bit_is_set (bits, i)) {
      length = 0;
      start = i + 1;
    }
    else if (++length == count)
      return start;
  }
  return end;
}

int64_t
backing_allocate (struct backing *backing, size_t bytes)
{
  uint64_t count = (bytes + BACKING_SECTOR - 1) / BACKING_SECTOR;
  pthread_mutex_lock (&backing->map_lock);
  uint64_t start = backing->sectors;
  if (count <= backing->free_sectors) {
    /* Next fit: from the cursor, then from the start. */
    start = run_search (backing->bits, backing->cursor, backing->sectors, count);
    if (start == backing->sectors) {
      uint64_t end = backing->cursor + count < backing->sectors
        ? backing->cursor + count : backing->sectors;
      start = run_search (backing->bits, 0, end, count);
      if (start == end)
        start = backing->sectors;     /* no run anywhere */
    }
  }
  if (start >= backing->sectors) {
    pthread_mutex_unlock (&backing->map_lock);
    errno = ENOSPC;
    return -1;
  }
  bits_assign (backing->bits, start, count, true);
  backing->free_sectors -= count;
  backing->cursor = start + count;
  pthread_mutex_unlock (&backing->map_lock);
  return (int64_t) (start * BACKING_SECTOR);
}

/* ---- requests -------------------------------------------------------- */

/* Run one request on a connection, reconnecting a dead one (at most once
 * a second) and retrying once.  op: 'r', 'w', 't'.
 */
static int
nbd_request (struct backing *backing, char op, void *buf, size_t bytes,
             uint64_t offset)
{
  unsigned n = atomic_fetch_add (&backing->next_connection, 1)
    % backing->connection_count;
  struct connection *connection = &backing->connections[n];
  int r = -1;
  pthread_mutex_lock (&connection->lock);
  for (int attempt = 0; attempt < 2 && r == -1; attempt++) {
    if (connection->handle
        && (nbd_aio_is_dead (connection->handle) == 1
            || nbd_aio_is_closed (connection->handle) == 1)) {
      nbd_close (connection->handle);
      connection->handle = NULL;
    }
    if (!connection->handle) {
      time_t now = monotonic_seconds ();
      if (now == connection->last_connect)
        break;                  /* tried this second already */
      connection->last_connect = now;
      char *error = NULL;
      connection->handle = nbd_connect (backing->uri, &error);
      free (error);
      if (!connection->handle)
        break;
      atomic_fetch_add (&backing->reconnects, 1);
    }
    switch (op) {
    case 'r': r = nbd_pread (connection->handle, buf, bytes, offset, 0); break;
    case 'w': r = nbd_pwrite (connection->handle, buf, bytes, offset, 0); break;
    default: r = nbd_trim (connection->handle, bytes, offset, 0); break;
    }
    /* Only a dead connection is worth a second try. */
    if (r == -1 && nbd_aio_is_dead (connection->handle) != 1
        && nbd_aio_is_closed (connection->handle) != 1)
      break;
  }
  pthread_mutex_unlock (&connection->lock);
  return r;
}

/* pread or pwrite in full on the file (through an aligned bounce buffer
 * with O_DIRECT, in whole sectors).
 */
static int
file_request (struct backing *backing, char op, void *buf, size_t bytes,
              uint64_t offset)
{
  void *io = buf;
  size_t length = bytes;
  if (backing->odirect) {
    length = (bytes + BACKING_SECTOR - 1) / BACKING_SECTOR * BACKING_SECTOR;
    if (posix_memalign (&io, 4096, length) != 0)
      return -1;
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
      r = -1;
      break;
    }
    done += n;
  }
  if (io != buf) {
    if (r == 0 && op == 'r')
      memcpy (buf, io, bytes);
    free (io);
  }
  return r;
}

static int
request (struct backing *backing, char op, void *buf, size_t bytes,
         uint64_t offset)
{
  int r = backing->uri ? nbd_request (backing, op, buf, bytes, offset)
    : file_request (backing, op, buf, bytes, offset);
  if (r == -1) {
    atomic_fetch_add (&backing->failed, 1);
    errno = EIO;
  }
  return r;
}

int
backing_write (struct backing *backing, const void *buf, size_t bytes,
               uint64_t offset)
{
  return request (backing, 'w', (void *) buf, bytes, offset);
}

int
backing_read (struct backing *backing, void *buf, size_t bytes, uint64_t offset)
{
  return request (backing, 'r', buf, bytes, offset);
}

void
backing_release (struct backing *backing, uint64_t offset, size_t bytes)
{
  uint64_t first = offset / BACKING_SECTOR;
  uint64_t count = (bytes + BACKING_SECTOR - 1) / BACKING_SECTOR;
  /* Trim first, while the run is still allocated: trimmed after it was
   * freed, it could be a new block's run by then, and lose that block.
   * Best effort: the run is free in the map whatever the store says.
   */
  if (atomic_load (&backing->can_trim)) {
    int saved = errno;
    if (backing->uri)
      nbd_request (backing, 't', NULL, count * BACKING_SECTOR, offset);
    else if (fallocate (backing->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        offset, count * BACKING_SECTOR) == -1
             && (errno == EOPNOTSUPP || errno == ENODEV))
      atomic_store (&backing->can_trim, false);  /* this file system cannot */
    errno = saved;
  }
  pthread_mutex_lock (&backing->map_lock);
  bits_assign (backing->bits, first, count, false);
  backing->free_sectors += count;
  pthread_mutex_unlock (&backing->map_lock);
}

void
backing_stats (struct backing *backing, struct backing_stats *stats)
{
  pthread_mutex_lock (&backing->map_lock);
  stats->capacity = backing->sectors * BACKING_SECTOR;
  stats->used = (backing->sectors - backing->free_sectors) * BACKING_SECTOR;
  pthread_mutex_unlock (&backing->map_lock);
  stats->failed = atomic_load (&backing->failed);
  stats->reconnects = atomic_load (&backing->reconnects);
}
