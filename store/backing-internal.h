/* The backing store's insides, shared by its three files: backing.c
 * (the requests' dispatch, errors, log, the space map's use, releases,
 * statistics) on top of backing-file.c and backing-nbd.c (the two
 * transports), which call down only into the system, libnbd and
 * space-map.c.  Locks: see backing.h, LOCKS.
 */
#ifndef ZRAM_BACKING_INTERNAL_H
#define ZRAM_BACKING_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backing.h"
#include "space-map.h"

struct nbd_handle;

struct connection {
  pthread_mutex_t lock;         /* guards handle, retry_at_ms, backoff_ms */
  struct nbd_handle *handle;    /* NULL: to be made again */
  uint64_t retry_at_ms;         /* no new connection before (monotonic) */
  uint64_t backoff_ms;          /* the wait after the next failure */
};

/* Waits between attempts to connect again: doubled after each failure
 * (a connection that fails or times out), from the first to the last.
 */
#define BACKOFF_FIRST_MS 1000
#define BACKOFF_LAST_MS 30000

struct backing {
  char *uri;                    /* NULL for a file */
  int fd;                       /* a file, or -1 */
  bool odirect;
  unsigned connection_count;
  struct connection connections[BACKING_CONNECTIONS];
  _Atomic unsigned next_connection;
  atomic_bool can_trim;         /* cleared when the store cannot */
  uint64_t export_bytes;        /* an NBD export's size; 0: a file's room
                                   is made as needed (backing_map_adopt) */
  unsigned timeout_ms;          /* each NBD request or connection */

  struct space_map own_map;     /* its own lock (space-map.h) */
  bool own_map_ready;           /* own_map initialised (backing_close) */
  struct space_map *map;        /* &own_map, or a map in a region
                                   (backing_map_adopt): set before any
                                   request */
  char *target;                 /* as given to backing_open */

  /* Reads without the stripe lock (see backing.h, READS AND RELEASES):
   * the readers of each of two epochs, and the runs released while
   * readers were about, waiting for them.
   */
  _Atomic unsigned epoch;
  _Atomic uint64_t readers[2];  /* by epoch & 1 */
  pthread_mutex_t release_lock; /* guards releases, the epoch's flips and
                                   draining */
  struct space_run *releases[2];
  size_t release_count[2], release_capacity[2];
  bool draining;                /* epoch - 1's runs wait for its readers */

  atomic_bool quarantine_full_logged;
  atomic_bool cancelled;        /* backing_cancel: every request fails */
  _Atomic uint64_t abandoned_requests;

  /* The store's own failures, logged through log (rate-limited). */
  backing_log_function *log;
  _Atomic int64_t log_second;   /* the second whose lines are counted */
  _Atomic unsigned log_lines;   /* lines logged in it */
  _Atomic uint64_t log_missed;  /* lines not logged since the last one */
  _Atomic uint64_t errors_nospace;
  _Atomic uint64_t errors_io;
  _Atomic uint64_t failed;
  _Atomic uint64_t reconnects;
  _Atomic uint64_t timeouts;
  _Atomic uint64_t corrupt;
};

/* A message made with vasprintf, for an error's *error (NULL if that
 * failed).
 */
static inline char *backing_message (const char *format, ...)
  __attribute__ ((format (printf, 1, 2)));
static inline char *
backing_message (const char *format, ...)
{
  va_list args;
  char *text = NULL;
  va_start (args, format);
  if (vasprintf (&text, format, args) == -1)
    text = NULL;
  va_end (args);
  return text;
}

/* backing.c: a line about the store through backing->log, ten a second
 * at most.
 */
extern void backing_log (struct backing *backing, const char *format, ...)
  __attribute__ ((format (printf, 2, 3)));

/* backing-nbd.c: connect to backing->uri (more connections with
 * multi-conn; capacity cut to the export's size): 0, or -1 with a
 * message in *error.  A request: 0, or -1 with errno (the server's
 * error, ETIMEDOUT, ECANCELED, EIO); op 'r', 'w', 't' (trim), 'f'.
 */
extern int backing_nbd_open (struct backing *backing, uint64_t *capacity,
                             char **error);
extern int backing_nbd_request (struct backing *backing, char op, void *buf,
                                size_t bytes, uint64_t offset,
                                uint64_t deadline_ms);
extern void backing_nbd_close (struct backing *backing);

/* backing-file.c: open (or create) and lock the file, extended to
 * capacity: 0, or -1 with a message in *error.  A whole request (op 'r',
 * 'w', 'f'): 0, or -1 with errno.
 */
extern int backing_file_open (struct backing *backing, const char *path,
                              uint64_t capacity, char **error);
/* A regular file extended to bytes if shorter (a block device, an NBD
 * export: nothing done): 0, or -1 with errno.
 */
extern int backing_file_extend (struct backing *backing, uint64_t bytes);
extern int backing_file_request (struct backing *backing, char op, void *buf,
                                 size_t bytes, uint64_t offset);

#endif /* ZRAM_BACKING_INTERNAL_H */
