/* The backing store of writeback: see backing.h.  The requests'
 * dispatch over the two transports (backing-file.c, backing-nbd.c),
 * their errors and log, the space map's use (space-map.c: runs, their
 * release once no read is on them, checksums), and the statistics.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backing-internal.h"
#include "monotonic.h"

bool
backing_is_uri (const char *target)
{
  return strncmp (target, "nbd://", 6) == 0 || strncmp (target, "nbds://", 7) == 0
    || strncmp (target, "nbd+unix://", 11) == 0
    || strncmp (target, "nbds+unix://", 12) == 0
    || strncmp (target, "nbd+vsock://", 12) == 0;
}


struct backing *
backing_open (const char *target, uint64_t capacity, bool odirect,
              unsigned timeout_s, char **error)
{
  *error = NULL;
  struct backing *backing = calloc (1, sizeof *backing);
  if (!backing) {
    *error = backing_message ("backing: %s", strerror (errno));
    return NULL;
  }
  backing->fd = -1;
  backing->odirect = odirect;
  backing->timeout_ms = timeout_s * 1000;
  pthread_mutex_init (&backing->release_lock, NULL);
  for (unsigned i = 0; i < BACKING_CONNECTIONS; i++) {
    pthread_mutex_init (&backing->connections[i].lock, NULL);
    backing->connections[i].backoff_ms = BACKOFF_FIRST_MS;
  }
  int r;
  if (backing_is_uri (target)) {
    if (odirect) {
      *error = backing_message ("backing: O_DIRECT is for a file, not %s", target);
      backing_close (backing);
      return NULL;
    }
    backing->uri = strdup (target);
    r = backing->uri ? backing_nbd_open (backing, &capacity, error) : -1;
  }
  else
    r = backing_file_open (backing, target, capacity, error);
  if (r == 0 && (r = space_map_init (&backing->own_map,
                                     capacity / BACKING_SECTOR, NULL)) == 0) {
    backing->own_map_ready = true;
    backing->map = &backing->own_map;
  }
  /* malloc, not strdup: test-backing counts the map's bytes through
   * malloc and free.
   */
  size_t target_bytes = strlen (target) + 1;
  if (r == 0 && !(backing->target = malloc (target_bytes)))
    r = -1;
  if (r == 0)
    memcpy (backing->target, target, target_bytes);
  if (r == -1) {
    if (!*error)
      *error = backing_message ("backing: %s", strerror (errno));
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
  backing_nbd_close (backing);
  if (backing->fd >= 0)
    close (backing->fd);
  pthread_mutex_destroy (&backing->release_lock);
  free (backing->releases[0]);
  free (backing->releases[1]);
  if (backing->own_map_ready)
    space_map_destroy (&backing->own_map);
  free (backing->target);
  free (backing->uri);
  free (backing);
}

const char *
backing_target (const struct backing *backing)
{
  return backing->target;
}

uint64_t
backing_sectors (const struct backing *backing)
{
  return backing->map->sectors;
}

bool
backing_can_hold (const struct backing *backing, uint64_t sectors)
{
  return !backing->export_bytes
    || sectors <= backing->export_bytes / BACKING_SECTOR;
}

int
backing_map_adopt (struct backing *backing, struct space_map *map)
{
  if (!backing_can_hold (backing, map->sectors)) {
    errno = EINVAL;
    return -1;
  }
  if (map->sectors > backing_sectors (backing)
      && backing_file_extend (backing, map->sectors * BACKING_SECTOR) == -1)
    return -1;
  if (backing->own_map_ready)
    space_map_destroy (&backing->own_map);
  backing->own_map_ready = false;
  backing->map = map;
  return 0;
}

int64_t
backing_allocate (struct backing *backing, size_t bytes)
{
  bool stopped;
  int64_t offset = space_map_take (backing->map, bytes, &stopped);
  if (stopped && !atomic_exchange (&backing->quarantine_full_logged, true)) {
    struct space_map_stats map;
    space_map_stats (backing->map, &map);
    backing_log (backing, "backing: writeback stopped: %" PRIu64 " bytes of "
                 "the store are quarantined behind writes and trims that "
                 "were given up on and may still land (a slow or wedged "
                 "store; see backing_timeout); blocks stay in RAM; "
                 "restarting the server gives the space back",
                 map.quarantined_bytes);
    errno = ENOSPC;
  }
  return offset;
}

void
backing_checksum_set (struct backing *backing, uint64_t offset,
                      const void *bytes, size_t length)
{
  space_map_checksum_set (backing->map, offset, bytes, length);
}

static int request (struct backing *backing, char op, void *buf, size_t bytes,
                    uint64_t offset, uint64_t deadline_ms);

int
backing_read_block (struct backing *backing, void *buf, size_t length,
                    uint64_t offset, uint64_t deadline_ms)
{
  if (request (backing, 'r', buf, length, offset, deadline_ms) == -1)
    return -1;
  if (!space_map_checksum_matches (backing->map, offset, buf, length)) {
    atomic_fetch_add (&backing->corrupt, 1);
    errno = EIO;
    return -1;
  }
  return 0;
}

/* Log a line about the store, ten a second at most (the rest counted,
 * and said with the next line logged).
 */
#define LOG_LINES_PER_SECOND 10

void
backing_log (struct backing *backing, const char *format, ...)
{
  if (!backing->log)
    return;
  int64_t second = monotonic_ms () / 1000;
  int64_t counted = atomic_load (&backing->log_second);
  if (second != counted
      && atomic_compare_exchange_strong (&backing->log_second, &counted,
                                         second))
    atomic_store (&backing->log_lines, 0);
  if (atomic_fetch_add (&backing->log_lines, 1) >= LOG_LINES_PER_SECOND) {
    atomic_fetch_add (&backing->log_missed, 1);
    return;
  }
  va_list args;
  char *text = NULL;
  va_start (args, format);
  int r = vasprintf (&text, format, args);
  va_end (args);
  if (r == -1)
    return;
  uint64_t missed = atomic_exchange (&backing->log_missed, 0);
  char *line = NULL;
  if (missed == 0
      || asprintf (&line, "%s (and %" PRIu64 " more lines about the backing "
                   "store not logged)", text, missed) == -1)
    line = NULL;
  backing->log (line ? line : text);
  free (line);
  free (text);
}

static const char *
op_name (char op)
{
  switch (op) {
  case 'r': return "read";
  case 'w': return "write";
  case 'f': return "flush";
  default: return "trim";
  }
}

/* A request failed with err: count it, log it as what it is, and give
 * the caller ENOSPC (the store is full) or EIO (anything else).
 */
static void
request_failed (struct backing *backing, char op, size_t bytes,
                uint64_t offset, int err)
{
  atomic_fetch_add (&backing->failed, 1);
  const char *where = backing->uri ? backing->uri : "the backing file";
  bool full = err == ENOSPC || err == EDQUOT || err == EFBIG;
  if (full) {
    atomic_fetch_add (&backing->errors_nospace, 1);
    backing_log (backing, "backing: %s of %zu bytes at %" PRIu64 " on %s: the "
              "store is full (%s)", op_name (op), bytes, offset, where,
              strerror (err));
  }
  else {
    atomic_fetch_add (&backing->errors_io, 1);
    if (err == ETIMEDOUT)
      backing_log (backing, "backing: %s of %zu bytes at %" PRIu64 " on %s: no "
                "answer in time (backing_timeout=%u)", op_name (op), bytes,
                offset, where, backing->timeout_ms / 1000);
    else if (err != ECANCELED)   /* the server is stopping: not news */
      backing_log (backing, "backing: %s of %zu bytes at %" PRIu64 " on %s: %s",
                op_name (op), bytes, offset, where, strerror (err));
  }
  errno = full ? ENOSPC : EIO;
}

static int
request (struct backing *backing, char op, void *buf, size_t bytes,
         uint64_t offset, uint64_t deadline_ms)
{
  int r = backing->uri
    ? backing_nbd_request (backing, op, buf, bytes, offset, deadline_ms)
    : backing_file_request (backing, op, buf, bytes, offset);
  if (r == -1)
    request_failed (backing, op, bytes, offset, errno);
  return r;
}

int
backing_sync (struct backing *backing, uint64_t deadline_ms)
{
  /* One flush: more than one connection is used only where the export
   * offers multi-conn, whose flush covers the writes of them all.
   */
  return request (backing, 'f', NULL, 0, 0, deadline_ms);
}

int
backing_write (struct backing *backing, const void *buf, size_t bytes,
               uint64_t offset, uint64_t deadline_ms)
{
  return request (backing, 'w', (void *) buf, bytes, offset, deadline_ms);
}

void
backing_set_log (struct backing *backing, backing_log_function *log)
{
  backing->log = log;
}

void
backing_cancel (struct backing *backing)
{
  atomic_store (&backing->cancelled, true);
}

unsigned
backing_timeout_ms (const struct backing *backing)
{
  return backing->timeout_ms;
}

unsigned
backing_read_begin (struct backing *backing)
{
  for (;;) {
    unsigned epoch = atomic_load (&backing->epoch);
    atomic_fetch_add (&backing->readers[epoch & 1], 1);
    if (atomic_load (&backing->epoch) == epoch)
      return epoch;
    atomic_fetch_sub (&backing->readers[epoch & 1], 1);   /* it flipped */
  }
}

void
backing_read_end (struct backing *backing, unsigned epoch)
{
  atomic_fetch_sub (&backing->readers[epoch & 1], 1);
}

static void run_free (struct backing *backing, uint64_t offset, size_t bytes);

void
backing_release (struct backing *backing, uint64_t offset, size_t bytes)
{
  /* A reader that could be on the run began before the entry stopped
   * naming it (it looked the entry up under the stripe lock that the
   * change took after it): with no reader about now, none is on it.  An
   * NBD store's runs always wait for the housekeeper: their trim is a
   * request, which the writer that released the run must not wait for.
   */
  if (!backing->uri
      && atomic_load (&backing->readers[0])
         + atomic_load (&backing->readers[1]) == 0) {
    run_free (backing, offset, bytes);
    return;
  }
  pthread_mutex_lock (&backing->release_lock);
  unsigned slot = atomic_load (&backing->epoch) & 1;
  if (backing->release_count[slot] == backing->release_capacity[slot]) {
    size_t capacity = backing->release_capacity[slot] * 2 + 16;
    struct space_run *runs = realloc (backing->releases[slot],
                                capacity * sizeof *runs);
    if (!runs) {
      /* The run stays allocated: space lost, never data. */
      pthread_mutex_unlock (&backing->release_lock);
      return;
    }
    backing->releases[slot] = runs;
    backing->release_capacity[slot] = capacity;
  }
  backing->releases[slot][backing->release_count[slot]++]
    = (struct space_run) { offset, bytes };
  pthread_mutex_unlock (&backing->release_lock);
}

/* One step: move the epoch on if runs wait in the current one, and free
 * the previous epoch's runs if its readers are gone; whether it freed.
 */
static bool
settle_step (struct backing *backing)
{
  pthread_mutex_lock (&backing->release_lock);
  unsigned epoch = atomic_load (&backing->epoch);
  if (!backing->draining) {
    if (backing->release_count[epoch & 1] == 0) {
      pthread_mutex_unlock (&backing->release_lock);
      return false;
    }
    /* New readers and releases go to the other slot from now on. */
    atomic_store (&backing->epoch, ++epoch);
    backing->draining = true;
  }
  unsigned old = (epoch - 1) & 1;
  if (atomic_load (&backing->readers[old]) != 0) {
    pthread_mutex_unlock (&backing->release_lock);
    return false;               /* a read of that epoch is still on */
  }
  struct space_run *runs = backing->releases[old];
  size_t count = backing->release_count[old];
  backing->releases[old] = NULL;
  backing->release_count[old] = backing->release_capacity[old] = 0;
  backing->draining = false;
  pthread_mutex_unlock (&backing->release_lock);
  for (size_t i = 0; i < count; i++)
    run_free (backing, runs[i].offset, runs[i].bytes);
  free (runs);
  return true;
}

void
backing_settle_releases (struct backing *backing)
{
  /* Runs can wait in both slots: the previous epoch's, and the current
   * one's, released while the previous epoch's readers held its slot.
   * With no reader about, two steps free them all (what store_flush
   * promises); no more than two, so that writers releasing without end
   * cannot keep the caller here.
   */
  if (settle_step (backing))
    settle_step (backing);
}

/* Trim a run, then free it in the space map. */
static void
run_free (struct backing *backing, uint64_t offset, size_t bytes)
{
  uint64_t count = (bytes + BACKING_SECTOR - 1) / BACKING_SECTOR;
  /* A quarantined run stays allocated, untrimmed (ABANDONED REQUESTS). */
  if (space_map_quarantined (backing->map, offset, count * BACKING_SECTOR))
    return;
  /* Trim first, while the run is still allocated: trimmed after it was
   * freed, it could be a new block's run by then, and lose that block.
   * A trim that fails is only space not given back: the run is free in
   * the map whatever the store says, unless the trim was abandoned and
   * may still land (then the map keeps it: quarantined).
   */
  if (atomic_load (&backing->can_trim)) {
    int saved = errno;
    if (backing->uri)
      request (backing, 't', NULL, count * BACKING_SECTOR, offset, 0);
    else if (fallocate (backing->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        offset, count * BACKING_SECTOR) == -1
             && (errno == EOPNOTSUPP || errno == ENODEV))
      atomic_store (&backing->can_trim, false);  /* this file system cannot */
    errno = saved;
  }
  space_map_free (backing->map, offset, bytes);
}

void
backing_stats (struct backing *backing, struct backing_stats *stats)
{
  struct space_map_stats map;
  space_map_stats (backing->map, &map);
  stats->capacity = map.capacity;
  stats->used = map.used;
  stats->map_bytes = map.map_bytes;
  stats->quarantined_bytes = map.quarantined_bytes;
  stats->failed = atomic_load (&backing->failed);
  stats->reconnects = atomic_load (&backing->reconnects);
  stats->timeouts = atomic_load (&backing->timeouts);
  stats->abandoned = atomic_load (&backing->abandoned_requests);
  stats->errors_nospace = atomic_load (&backing->errors_nospace);
  stats->errors_io = atomic_load (&backing->errors_io);
  stats->corrupt = atomic_load (&backing->corrupt);
}
