/* The backing store's NBD transport: connections, deadlines, reconnects
 * (backing.h; the struct in backing-internal.h).  Below the requests'
 * dispatch (backing.c); calls down only into libnbd and the space map
 * (a request given up on quarantines its extent).
 */

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backing-internal.h"
#include "libnbd-load.h"
#include "monotonic.h"

/* Drive handle until done (handle) says so, or until deadline_ms: 1 done,
 * 0 the deadline passed, -1 the connection failed.  A server that accepts
 * and never answers costs the deadline, never more.
 */
static int
nbd_wait (struct backing *backing, struct nbd_handle *handle,
          uint64_t deadline_ms,
          int (*done) (struct nbd_handle *handle, int64_t cookie),
          int64_t cookie)
{
  for (;;) {
    int r = done (handle, cookie);
    if (r != 0)
      return r;
    uint64_t now = monotonic_ms ();
    if (now >= deadline_ms || atomic_load (&backing->cancelled))
      return 0;
    /* Slices of 100 ms: backing_cancel is seen that soon. */
    uint64_t left = deadline_ms - now;
    if (libnbd->poll (handle, left > 100 ? 100 : (int) left) == -1)
      return -1;
  }
}

static int
connected (struct nbd_handle *handle, int64_t cookie)
{
  (void) cookie;
  if (libnbd->aio_is_connecting (handle) == 1)
    return 0;
  return libnbd->aio_is_ready (handle) == 1 ? 1 : -1;
}

static int
completed (struct nbd_handle *handle, int64_t cookie)
{
  return libnbd->aio_command_completed (handle, cookie);
}

/* A connected handle, or NULL with a message in *error: connecting takes
 * the timeout at most, and never goes past deadline_ms (0: none).
 */
static struct nbd_handle *
nbd_connect (struct backing *backing, uint64_t deadline_ms, char **error)
{
  const char *uri = backing->uri;
  struct nbd_handle *handle = libnbd->create ();
  if (!handle) {
    *error = backing_message ("backing: %s", libnbd->get_error ());
    return NULL;
  }
  int r = libnbd->aio_connect_uri (handle, uri);
  uint64_t until = monotonic_ms () + backing->timeout_ms;
  if (deadline_ms && deadline_ms < until)
    until = deadline_ms;
  if (r == 0)
    r = nbd_wait (backing, handle, until, connected, 0);
  if (r != 1) {
    *error = r == 0
      ? backing_message ("backing: %s: no answer within %u s", uri,
                 backing->timeout_ms / 1000)
      : backing_message ("backing: %s: %s", uri, libnbd->get_error ());
    libnbd->close (handle);
    return NULL;
  }
  return handle;
}

int
backing_nbd_open (struct backing *backing, uint64_t *capacity, char **error)
{
  /* libnbd's functions (libnbd-load.h): every other call here comes
   * after this.
   */
  char *why = NULL;
  if (!libnbd_load (&why)) {
    *error = backing_message ("backing: %s: %s", backing->uri,
                              why ? why : "cannot load libnbd");
    free (why);
    return -1;
  }
  struct nbd_handle *first = nbd_connect (backing, 0, error);
  if (!first)
    return -1;
  int64_t size = libnbd->get_size (first);
  if (size < BACKING_SECTOR || libnbd->is_read_only (first) == 1) {
    *error = backing_message ("backing: %s: %s", backing->uri,
                      size < 0 ? libnbd->get_error ()
                      : size < BACKING_SECTOR ? "the export is too small"
                      : "the export is read-only");
    libnbd->close (first);
    return -1;
  }
  if ((uint64_t) size < *capacity)
    *capacity = size;
  backing->export_bytes = size;
  backing->can_trim = libnbd->can_trim (first) == 1;
  backing->connections[0].handle = first;
  backing->connection_count = 1;
  if (libnbd->can_multi_conn (first) == 1) {
    for (unsigned i = 1; i < BACKING_CONNECTIONS; i++) {
      char *ignored = NULL;
      struct nbd_handle *more = nbd_connect (backing, 0, &ignored);
      free (ignored);
      if (!more)
        break;
      backing->connections[i].handle = more;
      backing->connection_count++;
    }
  }
  return 0;
}

/* A connection failed or timed out: drop it, and wait longer each time
 * before making it again.  With connection->lock held.
 */
static void
connection_drop (struct connection *connection)
{
  if (connection->handle) {
    libnbd->close (connection->handle);
    connection->handle = NULL;
  }
  connection->retry_at_ms = monotonic_ms () + connection->backoff_ms;
  connection->backoff_ms = connection->backoff_ms * 2 > BACKOFF_LAST_MS
    ? BACKOFF_LAST_MS : connection->backoff_ms * 2;
}

/* A write or trim of [offset, offset + bytes) was sent and given up on:
 * quarantine its extent (backing.h, ABANDONED REQUESTS).
 */
static void
abandon (struct backing *backing, uint64_t offset, size_t bytes)
{
  atomic_fetch_add (&backing->abandoned_requests, 1);
  space_map_quarantine (backing->map, offset, bytes);
}

/* Run one request on a connection, reconnecting a dead one (with
 * backoff) and retrying once.  Each attempt, connecting included, takes
 * the timeout at most, and none waits past deadline_ms (0: none): a
 * request not answered by then fails and its connection is dropped
 * (nbd_close: libnbd lets go of buf); a write or trim that was sent and
 * not answered is abandoned (its extent quarantined).  op: 'r', 'w',
 * 't' (trim), 'f' (flush).  -1 with errno ETIMEDOUT (no answer in time),
 * ECANCELED (backing_cancel), the server's error, or EIO (no connection).
 */
int
backing_nbd_request (struct backing *backing, char op, void *buf, size_t bytes,
             uint64_t offset, uint64_t deadline_ms)
{
  unsigned n = atomic_fetch_add (&backing->next_connection, 1)
    % backing->connection_count;
  struct connection *connection = &backing->connections[n];
  int r = -1, err = EIO;
  bool abandoned = false;
  if (mutex_lock_until (&connection->lock, deadline_ms) != 0) {
    errno = ETIMEDOUT;
    return -1;
  }
  for (int attempt = 0; attempt < 2 && r == -1; attempt++) {
    if (atomic_load (&backing->cancelled)) {
      err = ECANCELED;
      break;
    }
    if (connection->handle
        && (libnbd->aio_is_dead (connection->handle) == 1
            || libnbd->aio_is_closed (connection->handle) == 1))
      connection_drop (connection);
    if (!connection->handle) {
      if (monotonic_ms () < connection->retry_at_ms)
        break;                  /* backing off: EIO */
      char *error = NULL;
      connection->handle = nbd_connect (backing, deadline_ms, &error);
      free (error);
      if (!connection->handle) {
        connection_drop (connection);
        break;
      }
      atomic_fetch_add (&backing->reconnects, 1);
    }
    int64_t cookie;
    switch (op) {
    case 'r':
      cookie = libnbd->aio_pread (connection->handle, buf, bytes, offset,
                              NBD_NULL_COMPLETION, 0);
      break;
    case 'w':
      cookie = libnbd->aio_pwrite (connection->handle, buf, bytes, offset,
                               NBD_NULL_COMPLETION, 0);
      break;
    case 'f':
      cookie = libnbd->aio_flush (connection->handle, NBD_NULL_COMPLETION, 0);
      break;
    default:
      cookie = libnbd->aio_trim (connection->handle, bytes, offset,
                             NBD_NULL_COMPLETION, 0);
      break;
    }
    uint64_t until = monotonic_ms () + backing->timeout_ms;
    if (deadline_ms && deadline_ms < until)
      until = deadline_ms;
    int done = cookie == -1 ? -1
      : nbd_wait (backing, connection->handle, until, completed, cookie);
    if (done == 1) {
      r = 0;
      connection->backoff_ms = BACKOFF_FIRST_MS;
      break;
    }
    bool lost = done == 0 || libnbd->aio_is_dead (connection->handle) == 1
      || libnbd->aio_is_closed (connection->handle) == 1;
    if (cookie != -1 && lost && (op == 'w' || op == 't'))
      abandoned = true;
    if (done == 0) {
      /* No answer in time: this connection is wedged; no second try. */
      err = ETIMEDOUT;
      if (atomic_load (&backing->cancelled))
        err = ECANCELED;
      else
        atomic_fetch_add (&backing->timeouts, 1);
      connection_drop (connection);
      break;
    }
    if (!lost) {
      /* The server's answer: an error that is what it says. */
      err = libnbd->get_errno ();
      if (err == 0)
        err = EIO;
      break;
    }
    /* Only a dead connection is worth a second try. */
  }
  pthread_mutex_unlock (&connection->lock);
  /* Recorded before this returns: only the caller releases the run. */
  if (abandoned)
    abandon (backing, offset, bytes);
  if (r == -1)
    errno = err;
  return r;
}

void
backing_nbd_close (struct backing *backing)
{
  for (unsigned i = 0; i < BACKING_CONNECTIONS; i++) {
    if (backing->connections[i].handle) {
      libnbd->shutdown (backing->connections[i].handle, 0);
      libnbd->close (backing->connections[i].handle);
    }
    pthread_mutex_destroy (&backing->connections[i].lock);
  }
}
