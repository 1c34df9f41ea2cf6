/* A standby server (standby=PATH): a second server, started while the
 * first one serves, that takes the device over the moment it is told.
 *
 * WHY.  A server started after the last one died has its whole process
 * to fault in - heap, compression contexts, thread stacks, some 15 MiB -
 * and in swap, on a machine whose memory the swapping kernel used up
 * while its device was down, those faults wait in reclaim for pages
 * that only this server could take in (seen in a 384 MiB guest at 2.25x
 * RAM: restarted servers stuck in their first faults, half the runs).
 * A standby does all of it ahead, while memory can still be had:
 * everything but the region, which one server owns at a time.
 *
 * MEANWHILE.  nbdkit serves the standby as any server: its socket takes
 * connections and the handshake is answered (size and flags come from
 * the parameters), so the supervisor connects the kernel's sockets
 * ahead too, and nbdkit's worker threads for them exist; their stacks
 * are made ready each second and on "ready".  A request that comes
 * before the takeover is refused with EIO (there is nothing to serve
 * yet); the stats, the metrics and the control channel start with the
 * takeover.
 *
 * THE PROTOCOL on PATH (a Unix socket, owner only): a line, a reply line.
 *   ready     make ready the stacks of the threads that exist now:
 *             "ok N" (N stacks made ready)
 *   takeover  take the region over - it must be free: its last server
 *             handed it over or died; a live owner is refused - and
 *             serve: "ok GENERATION", or "error: MESSAGE" (the log says
 *             more), and the standby goes on waiting.
 * After a takeover the socket is closed and removed.
 *
 * THREADS.  One thread (standby_start to standby_stop) accepts, answers
 * and runs the takeover.  standby_waiting is the requests' question: an
 * acquire load of a flag the takeover clears (release) once the store
 * and everything a request reaches are set, so a request that sees
 * false sees them.
 */
#ifndef ZRAM_STANDBY_H
#define ZRAM_STANDBY_H

#include <stdbool.h>

/* In .get_ready: listen on path.  0, or -1 after nbdkit_error. */
extern int standby_listen (const char *path);
/* In .after_fork: start the thread.  take_over: 0 once the server
 * serves, or -1 after nbdkit_error (nothing taken: it may be asked
 * again); make_ready: the stacks (and heap) made ready, their count.
 * 0, or -1 with errno.
 */
extern int standby_start (int (*take_over) (void),
                          unsigned (*make_ready) (void));
/* Not serving yet: a request must be refused. */
extern bool standby_waiting (void);
/* In .cleanup: stop the thread, remove the socket. */
extern void standby_stop (void);

#endif /* ZRAM_STANDBY_H */
