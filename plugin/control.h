/* The control channel (ctl=PATH): zram's sysfs attributes, over a Unix
 * socket that only the server's owner may connect to (mode 0600).
 *
 * One client at a time sends lines; each command's reply is zero or more
 * lines, then "ok" or "error: MESSAGE".  A bad command changes nothing.
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
 * .cleanup) accepts clients and runs their commands, beside nbdkit's
 * threads: commands use the store's thread-safe calls only.  A command
 * that walks the device stops early when its client hangs up.
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
