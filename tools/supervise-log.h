/* The supervisor's log (tools/supervise-log.c): DIR/supervisor.log, its
 * own lines and its servers' output, written without ever waiting for
 * the swap device it supervises.
 *
 * The log is a plain text file on /run (a tmpfs, whose pages the kernel
 * may swap out - to the very device that is down during a restart).  A
 * process that appends to such a file must first read its last page
 * back: seen, a standby taking the device over sat in swap_readpage
 * under vfs_write, and the supervisor behind it on the file's lock, so
 * the device was never reconnected.  So:
 *   - only the supervisor writes the file, and every page of it stays
 *     mapped and locked in the supervisor's memory: a write never reads
 *     a page back, and a reader (swap status, a watchdog) never waits
 *     for the device either;
 *   - a server's stdout and stderr are a pipe (kernel memory) that a
 *     thread of the supervisor drains into the log, each line with the
 *     time and the server's pid;
 *   - the file is kept to LOG_BYTES_MAX: past that its older half goes.
 * Each line starts with the wall-clock time (UTC) and, in brackets, the
 * monotonic clock in seconds (the clock of the kernel's log, so a line
 * can be set beside the driver's messages).
 *
 * Locks: log_lock (supervise-log.c) guards the file's length, its
 * mapping and the table of pipes; it is the only lock of the supervisor
 * and nothing is waited for while it is held but the file's own calls.
 */
#ifndef ZRAM_SUPERVISE_LOG_H
#define ZRAM_SUPERVISE_LOG_H

#include <stdbool.h>
#include <sys/types.h>

/* Open DIR/supervisor.log (created 0644 if missing, never through a
 * link), lock its pages and start the thread that drains the servers'
 * pipes.  false with errno if the file cannot be used: the lines are
 * then lost, the supervisor works on.
 */
extern bool supervise_log_open (const char *dir);

/* A line of the supervisor's own (no newline needed). */
extern void supervise_log (const char *format, ...)
  __attribute__ ((format (printf, 1, 2)));

/* Before a fork: a pipe whose write end becomes the child's stdout and
 * stderr (*child_end; close-on-exec is off for it in the child only).
 * -1 if none can be made: the child then gets /dev/null.
 */
extern int supervise_log_pipe (int *child_end);

/* After the fork: the read end of that pipe (our_end) is the output of
 * pid from now on (pid -1: the fork failed, the pipe is closed).  The
 * parent's copy of the child's end must be closed by the caller.
 */
extern void supervise_log_child (int our_end, pid_t pid);

/* Before the supervisor exits: its own stderr closed, and up to a
 * second for the thread to copy what the pipes still hold.
 */
extern void supervise_log_flush (void);

#endif /* ZRAM_SUPERVISE_LOG_H */
