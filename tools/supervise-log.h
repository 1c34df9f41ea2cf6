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
 *   - no thread that acts (the main one, the drain thread) waits for the
 *     file: a line goes to a ring in locked memory, and a writer thread
 *     alone copies the ring to the file.  Growing the file takes a new
 *     page, which under memory exhaustion can wait in the kernel's
 *     reclaim for long (seen: 100 s, the supervisor stuck behind it and
 *     a timed-out server not restarted); the ring holds the lines
 *     meanwhile, and when it is full a line says how many were lost;
 *   - the file is kept to LOG_BYTES_MAX: past that its older half goes.
 * Each line starts with the wall-clock time (UTC) and, in brackets, the
 * monotonic clock in seconds (the clock of the kernel's log, so a line
 * can be set beside the driver's messages).
 *
 * Locks (supervise-log.c), never held together: sources_lock guards
 * the table of pipes' slots; ring_lock the ring (held only to copy
 * bytes in or out).  The file is the writer thread's alone.
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
 * second for the threads to copy what the pipes and the ring still
 * hold to the file.
 */
extern void supervise_log_flush (void);

/* Start a detached thread of the supervisor's (the log's, the
 * ballast's): it takes no signal - the supervisor's are for its main
 * thread's waits - and has a small stack (LOG_THREAD_STACK), as the
 * supervisor's memory is locked whole.  false with errno if it could
 * not be made.
 */
extern bool supervise_thread_start (void *(*main) (void *));

#endif /* ZRAM_SUPERVISE_LOG_H */
