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
 *   help
 *
 * THREADS.  One control thread (started in .after_fork, stopped in
 * .cleanup) serves up to 8 clients at once, beside nbdkit's threads:
 * commands use the store's thread-safe calls only.  No client can wedge
 * it: sockets are non-blocking; a client silent for 60 s is closed, and
 * when all 8 places are taken a new client takes the place of one silent
 * for a second or more, else it is told "too many" and closed; a reply
 * its client reads nothing of for 2 s drops the client (the command's
 * effect stays; the log says so); every wait also watches the wake pipe,
 * so control_stop returns within a poll.  A command that walks the
 * device stops early when its client hangs up.  Client bytes never reach
 * the server's log.
 */
#ifndef ZRAM_CONTROL_H
#define ZRAM_CONTROL_H

#include "block-store.h"

/* What `info` reports: fixed at startup. */
struct control_info {
  uint64_t disksize;
  const char *algorithm;
  int level;
};

/* In .get_ready: make the socket (errors reach the user before nbdkit
 * forks).  0, or -1 after nbdkit_error.
 */
extern int control_listen (const char *path);
/* In .after_fork: start the thread.  0, or -1 with errno. */
extern int control_start (struct block_store *store,
                          const struct control_info *info);
/* In .cleanup: stop the thread, close and remove the socket. */
extern void control_stop (void);

#endif /* ZRAM_CONTROL_H */
