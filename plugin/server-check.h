/* What the plugin knows of the nbdkit server it runs in.
 *
 * nbdkit before 1.34 (Debian 12 ships 1.32.5) aborts when a client hangs
 * up while replies to it are still pending and its connection has worker
 * threads: one worker's failed send closes the socket, the next worker's
 * send asserts (connections.c, "Assertion `sock >= 0' failed"), and
 * every client's data dies with the process.  Upstream fixed it in
 * 1.33.10 / 1.34.0 (Red Hat bug 2173054).
 *
 * The plugin API does not tell a plugin the server's version, nor how
 * many threads serve a connection, so both are observed:
 *
 * - version: a server that exports nbdkit_disconnect, new in 1.34, has
 *   the fix (only 1.33 development snapshots could be misjudged);
 * - threads: nbdkit runs .open on the connection's own thread, and
 *   serves requests on that same thread unless it started worker threads
 *   for the connection (-t above 1, the default being 16).  A request on
 *   a thread that did not open a connection is on a worker.
 *
 * On an old server, the first request served by a worker thread prints
 * one warning for the life of the process.
 */
#ifndef ZRAM_SERVER_CHECK_H
#define ZRAM_SERVER_CHECK_H

#include <stdbool.h>

/* In .load: look at the server.  Sets server_has_disconnect_fix. */
void server_check_load (void);

/* True when the server survives clients that hang up early. */
extern bool server_has_disconnect_fix;

/* In .open: this thread opened a connection. */
void server_check_open (void);

/* In each data request: on an old server, warn once if the request runs
 * on a worker thread.  Costs one predictable branch on a fixed server.
 */
void server_check_worker_thread (void);
static inline void
server_check_request (void)
{
  if (__builtin_expect (!server_has_disconnect_fix, 0))
    server_check_worker_thread ();
}

#endif /* ZRAM_SERVER_CHECK_H */
