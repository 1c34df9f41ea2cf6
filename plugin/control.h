/* The control channel (ctl=PATH): zram's sysfs attributes, over a Unix
 * socket that only the server's owner may connect to (mode 0600).
 *
 * Clients send lines; each line's reply is zero or more lines, then "ok"
 * or "error: MESSAGE" (an empty line: "ok"; a line with a NUL byte: an
 * error).  A bad command changes nothing.
 * Commands (man page, "Control channel"):
 *
 *   info                   disksize, algorithm, level, mem_limit, ...
 *   mm_stat | io_stat | bd_stat    zram's lines
 *   stats                  the stats file's text
 *   classes                the allocator's per-class table
 *   compact                compact the pool now
 *   idle all | idle AGE    mark stored blocks idle (AGE: seconds unused)
 *   mem_limit SIZE         change the limit (never below what is held)
 *   mem_used_max 0         restart the high-water mark
 *   block_state START COUNT   zram's debugfs block_state lines
 *   recompress type=... [threshold=] [max_pages=] [algo=|priority=]
 *   pack [type=idle] [max_pages=N] | dissolve PERCENT   cold packing
 *   writeback TYPE [max_pages=N]   write blocks back (on the worker)
 *   writeback_limit [SIZE|off]     (setting it: on the worker)
 *   metrics                the metrics file's text
 *   help
 *
 * THREADS.  One control thread (started in .after_fork, stopped in
 * .cleanup) serves up to 8 clients at once, beside nbdkit's threads:
 * commands use the store's thread-safe calls only.  A command that may
 * wait for the backing store (writeback, and writeback_limit SIZE|off,
 * which waits for a writeback run) runs on a worker thread instead, one
 * at a time: the control thread goes on serving the other clients, a
 * second such command meanwhile is answered "error: busy: ...", and the
 * issuing client gets its reply when the worker is done (its next lines
 * wait till then).
 *
 * No client can wedge the channel: sockets are non-blocking; a client
 * silent for 60 s is closed, and so is one that does not finish a line
 * within 2 s of its first byte; when all 8 places are taken a new client
 * takes the place of the one that has gone longest without finishing a
 * line (never the one whose command is on the worker); a reply its
 * client reads nothing of for 2 s drops the client (the command's effect
 * stays; the log says so); every wait also watches the wake pipe.  A
 * command that walks the device stops early when its client hangs up.
 * control_stop returns within about a second even while the worker is
 * inside a backing request: it tells the worker to stop and cuts the
 * backing I/O short (store_cancel_backing_io), then joins it.  A
 * handover does the same from the control thread itself, before the
 * store is handed over (control_stop, below).  Client bytes never reach
 * the server's log.
 */
#ifndef ZRAM_CONTROL_H
#define ZRAM_CONTROL_H

#include <stdbool.h>

#include "block-store.h"

/* What `info` reports: fixed at startup. */
struct control_info {
  uint64_t disksize;
  const char *algorithm;
  int level;
  bool limit_pages_only;        /* mem_limit=: the limit counts the
                                   compressed pages (as zram's);
                                   mem_budget=: all the store holds */
  /* The plugin's own listening sockets (ctl=, ctl_ro=, standby=; NULL
   * ends the list): where it does not serve the device (info's serves).
   */
  const char *own_sockets[4];
};

/* In .get_ready: make the socket (errors reach the user before nbdkit
 * forks) and register it under name (name=, or NULL: registry.h).  0,
 * or -1 after nbdkit_error.
 */
extern int control_listen (const char *path, const char *name);
/* The same for the read-only socket (ctl_ro=, mode 0666: any local user
 * may read the figures; its clients get the reads_only commands alone,
 * and at most half the places).  After control_listen.
 */
extern int control_listen_read_only (const char *path);
/* In .after_fork: start the thread.  0, or -1 with errno. */
extern int control_start (struct block_store *store,
                          const struct control_info *info);
/* In .cleanup: stop the thread, close and remove the socket.  On the
 * control thread itself - its handover command (handover_now), the
 * server exiting next - stop the worker only: its backing I/O cut
 * short, the thread joined, its client answered that its command was
 * cut short by the handover; no command runs on after it, and the
 * thread, its clients and the socket go with the process.
 */
extern void control_stop (void);
/* A handover's first step, before it holds the requests: a command on
 * the worker stops at its next keep_going question (a writeback ends
 * after the batch it is on, its backing I/O not cut short: a client
 * request waiting behind it finishes), and no command starts after it.
 * control_stop follows.
 */
extern void control_wind_down (void);

#endif /* ZRAM_CONTROL_H */
