/* The supervisor's log: a text file whose pages stay in memory, and the
 * thread that copies the servers' output into it (the design is in
 * supervise-log.h).
 */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "supervise-log.h"

/* Past this the older half of the file goes: the log holds the last
 * restarts whatever happened before them, in memory that is locked.
 */
#define LOG_BYTES_MAX (1u << 20)
#define LOG_PAGE 4096u

/* Pipes drained at once: the server, the standby, and servers stopped
 * that have not closed theirs yet.
 */
#define LOG_SOURCES_MAX 8
/* A server's line longer than this is written in pieces. */
#define LOG_LINE_MAX 1024

/* A child's output: its pid, and the part of a line read so far. */
struct log_source {
  int fd;                       /* -1: slot free */
  pid_t pid;
  size_t used;
  char line[LOG_LINE_MAX];
};

/* Guards everything below (see supervise-log.h). */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;
static char *log_map;           /* LOG_BYTES_MAX of the file, shared */
static size_t log_length;       /* the file's length */
static size_t log_locked;       /* bytes of log_map locked: whole pages */
static struct log_source sources[LOG_SOURCES_MAX];
/* Written to wake the drain thread when a source is added. */
static int wake_pipe[2] = { -1, -1 };

static size_t
page_round_up (size_t bytes)
{
  return (bytes + LOG_PAGE - 1) / LOG_PAGE * LOG_PAGE;
}

/* Drop the older half, at a line's end.  Under log_lock. */
static void
log_drop_older_half (void)
{
  size_t from = log_length - LOG_BYTES_MAX / 2;
  char *newline = memchr (log_map + from, '\n', log_length - from);
  from = newline ? (size_t) (newline + 1 - log_map) : log_length;
  memmove (log_map, log_map + from, log_length - from);
  log_length -= from;
  if (ftruncate (log_fd, log_length) == 0)
    log_locked = page_round_up (log_length);
}

/* Append bytes to the file through the mapping.  Under log_lock.  The
 * file grows first, its new pages are locked (a new tmpfs page is made
 * zeroed, never read back from swap), then the bytes are copied in.
 */
static void
log_append (const char *bytes, size_t count)
{
  if (!log_map || count == 0)
    return;
  if (count > LOG_BYTES_MAX / 4)
    count = LOG_BYTES_MAX / 4;
  if (log_length + count > LOG_BYTES_MAX)
    log_drop_older_half ();
  size_t new_length = log_length + count;
  if (ftruncate (log_fd, new_length) == -1)
    return;
  if (new_length > log_locked) {
    size_t new_locked = page_round_up (new_length);
    /* Without the lock (memory short) the page is still made, only not
     * kept: the line is worth more than the guarantee.
     */
    mlock (log_map + log_locked, new_locked - log_locked);
    log_locked = new_locked;
  }
  memcpy (log_map + log_length, bytes, count);
  log_length = new_length;
}

/* "2026-12-05T22:10:01.123Z [  123.456] ": the start of every line. */
static size_t
log_prefix (char *buffer, size_t size)
{
  struct timespec wall, monotonic;
  struct tm utc;
  clock_gettime (CLOCK_REALTIME, &wall);
  clock_gettime (CLOCK_MONOTONIC, &monotonic);
  gmtime_r (&wall.tv_sec, &utc);
  size_t used = strftime (buffer, size, "%Y-%m-%dT%H:%M:%S", &utc);
  int more = snprintf (buffer + used, size - used, ".%03ldZ [%5ld.%03ld] ",
                       wall.tv_nsec / 1000000, (long) monotonic.tv_sec,
                       monotonic.tv_nsec / 1000000);
  return more > 0 && used + more < size ? used + more : used;
}

void
supervise_log (const char *format, ...)
{
  char line[LOG_LINE_MAX + 128];
  size_t used = log_prefix (line, sizeof line);
  used += snprintf (line + used, sizeof line - used, "supervisor: ");
  va_list args;
  va_start (args, format);
  int length = vsnprintf (line + used, sizeof line - used - 1, format, args);
  va_end (args);
  if (length < 0)
    return;
  used += (size_t) length < sizeof line - used - 1
    ? (size_t) length : sizeof line - used - 2;
  if (line[used - 1] != '\n')
    line[used++] = '\n';
  pthread_mutex_lock (&log_lock);
  log_append (line, used);
  pthread_mutex_unlock (&log_lock);
}

/* A child's line (or a piece of one too long) with its prefix.  Under
 * log_lock.
 */
static void
source_line_write (struct log_source *source)
{
  if (source->used == 0)
    return;
  char prefix[128];
  size_t used = log_prefix (prefix, sizeof prefix);
  used += snprintf (prefix + used, sizeof prefix - used, "pid %d: ",
                    (int) source->pid);
  log_append (prefix, used);
  log_append (source->line, source->used);
  if (source->line[source->used - 1] != '\n')
    log_append ("\n", 1);
  source->used = 0;
}

/* Read what source has, write its whole lines.  false at its end. */
static bool
source_drain (struct log_source *source)
{
  char chunk[4096];
  ssize_t got = read (source->fd, chunk, sizeof chunk);
  if (got == -1 && (errno == EINTR || errno == EAGAIN))
    return true;
  pthread_mutex_lock (&log_lock);
  for (ssize_t i = 0; i < got; i++) {
    source->line[source->used++] = chunk[i];
    if (chunk[i] == '\n' || source->used == LOG_LINE_MAX)
      source_line_write (source);
  }
  if (got <= 0) {
    source_line_write (source);
    close (source->fd);
    source->fd = -1;
  }
  pthread_mutex_unlock (&log_lock);
  return got > 0;
}

/* The drain thread: waits for output of any source, or a new one. */
static void *
drain_main (void *arg)
{
  (void) arg;
  for (;;) {
    struct pollfd fds[LOG_SOURCES_MAX + 1];
    struct log_source *which[LOG_SOURCES_MAX + 1];
    nfds_t count = 0;
    fds[count] = (struct pollfd) { .fd = wake_pipe[0], .events = POLLIN };
    which[count++] = NULL;
    pthread_mutex_lock (&log_lock);
    for (int i = 0; i < LOG_SOURCES_MAX; i++)
      if (sources[i].fd >= 0) {
        fds[count] = (struct pollfd) { .fd = sources[i].fd, .events = POLLIN };
        which[count++] = &sources[i];
      }
    pthread_mutex_unlock (&log_lock);
    if (poll (fds, count, -1) == -1)
      continue;
    if (fds[0].revents) {
      char discard[64];
      if (read (wake_pipe[0], discard, sizeof discard) == -1) {
        /* Nothing to do: it only wakes the poll. */
      }
    }
    for (nfds_t i = 1; i < count; i++)
      if (fds[i].revents)
        source_drain (which[i]);
  }
  return NULL;
}

bool
supervise_log_open (const char *dir)
{
  char path[4096];
  snprintf (path, sizeof path, "%s/supervisor.log", dir);
  for (int i = 0; i < LOG_SOURCES_MAX; i++)
    sources[i].fd = -1;
  int fd = open (path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  struct stat st;
  if (fd == -1)
    return false;
  if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode)
      || st.st_uid != geteuid ()) {
    close (fd);
    errno = EPERM;
    return false;
  }
  void *map = mmap (NULL, LOG_BYTES_MAX, PROT_READ | PROT_WRITE, MAP_SHARED,
                    fd, 0);
  if (map == MAP_FAILED || pipe2 (wake_pipe, O_CLOEXEC | O_NONBLOCK) == -1) {
    int saved = errno;
    if (map != MAP_FAILED)
      munmap (map, LOG_BYTES_MAX);
    close (fd);
    errno = saved;
    return false;
  }
  pthread_mutex_lock (&log_lock);
  log_fd = fd;
  log_map = map;
  log_length = (size_t) st.st_size;
  if (log_length > LOG_BYTES_MAX) {
    /* Longer than this build keeps (an older supervisor's): its end. */
    log_length = LOG_BYTES_MAX;
    log_drop_older_half ();
  }
  log_locked = page_round_up (log_length);
  if (log_locked)
    mlock (log_map, log_locked);
  pthread_mutex_unlock (&log_lock);
  /* The thread takes no signal: the supervisor's are for its main
   * thread's waits.
   */
  sigset_t all, before;
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &before);
  pthread_t thread;
  int err = pthread_create (&thread, NULL, drain_main, NULL);
  pthread_sigmask (SIG_SETMASK, &before, NULL);
  if (err != 0) {
    errno = err;
    return false;
  }
  pthread_detach (thread);
  return true;
}

int
supervise_log_pipe (int *child_end)
{
  int ends[2];
  if (wake_pipe[1] == -1 || pipe2 (ends, O_CLOEXEC) == -1) {
    *child_end = -1;
    return -1;
  }
  *child_end = ends[1];
  return ends[0];
}

void
supervise_log_child (int our_end, pid_t pid)
{
  if (our_end == -1)
    return;
  bool added = false;
  pthread_mutex_lock (&log_lock);
  for (int i = 0; i < LOG_SOURCES_MAX && pid > 0 && !added; i++)
    if (sources[i].fd == -1) {
      sources[i] = (struct log_source) { .fd = our_end, .pid = pid };
      added = true;
    }
  pthread_mutex_unlock (&log_lock);
  if (!added) {
    if (pid > 0)
      supervise_log ("pid %d: its output is lost (%d pipes drained already)",
                     (int) pid, LOG_SOURCES_MAX);
    close (our_end);
    return;
  }
  if (write (wake_pipe[1], "", 1) == -1) {
    /* Full: the thread is awake already. */
  }
}

void
supervise_log_flush (void)
{
  int null = open ("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0) {
    dup2 (null, 2);
    close (null);
  }
  for (int round = 0; round < 100; round++) {
    bool pending = false;
    pthread_mutex_lock (&log_lock);
    for (int i = 0; i < LOG_SOURCES_MAX && !pending; i++) {
      struct pollfd readable = { .fd = sources[i].fd, .events = POLLIN };
      pending = sources[i].fd >= 0 && poll (&readable, 1, 0) == 1;
    }
    pthread_mutex_unlock (&log_lock);
    if (!pending)
      return;
    usleep (10000);
  }
}
