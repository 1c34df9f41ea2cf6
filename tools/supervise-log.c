/* The supervisor's log: lines put in a ring in locked memory, a thread
 * that copies the servers' output into the ring, and one that writes
 * the ring to a text file whose pages stay in memory (the design is in
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
/* Lines not written to the file yet: a writer stuck for a while (in the
 * kernel's reclaim, for the file's next page) loses none of a
 * restart's.
 */
#define RING_BYTES (256u << 10)

/* Pipes drained at once: the supervisor's own stderr, the server, the
 * standby, and servers stopped that have not closed theirs yet.
 */
#define LOG_SOURCES_MAX 8
/* The threads' stacks: their frames hold a few KiB (a sanitizer's
 * build more).
 */
#define LOG_THREAD_STACK (256u << 10)
/* A server's line longer than this is written in pieces. */
#define LOG_LINE_MAX 1024

/* A child's output: its pid, and the part of a line read so far (the
 * part: the drain thread's alone).
 */
struct log_source {
  int fd;                       /* -1: slot free */
  pid_t pid;
  size_t used;
  char line[LOG_LINE_MAX];
};

/* Guards sources[].fd and .pid: the main thread fills a free slot, the
 * drain thread frees one at its pipe's end (and alone reads the pipes).
 */
static pthread_mutex_t sources_lock = PTHREAD_MUTEX_INITIALIZER;
static struct log_source sources[LOG_SOURCES_MAX];
/* Written to wake the drain thread when a source is added. */
static int wake_pipe[2] = { -1, -1 };

/* Guards the ring, the count of lines lost, and writer_busy; the writer
 * waits on ring_filled.  Held only to copy bytes in or out.
 */
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ring_filled = PTHREAD_COND_INITIALIZER;
static char ring[RING_BYTES];
static size_t ring_start, ring_used;
static unsigned long lines_lost;
static bool writer_busy;

/* The file: the writer thread's alone once open. */
static int log_fd = -1;
static char *log_map;           /* LOG_BYTES_MAX of the file, shared */
static size_t log_length;       /* the file's length */
static size_t log_locked;       /* bytes of log_map locked: whole pages */

static size_t
page_round_up (size_t bytes)
{
  return (bytes + LOG_PAGE - 1) / LOG_PAGE * LOG_PAGE;
}

/* Drop the file's older half, at a line's end. */
static void
file_drop_older_half (void)
{
  size_t from = log_length - LOG_BYTES_MAX / 2;
  char *newline = memchr (log_map + from, '\n', log_length - from);
  from = newline ? (size_t) (newline + 1 - log_map) : log_length;
  memmove (log_map, log_map + from, log_length - from);
  log_length -= from;
  if (ftruncate (log_fd, log_length) == 0)
    log_locked = page_round_up (log_length);
}

/* Append bytes to the file through the mapping.  The file grows first,
 * its new pages are locked (a new tmpfs page is made zeroed, never read
 * back from swap), then the bytes are copied in.
 */
static void
file_append (const char *bytes, size_t count)
{
  if (count > LOG_BYTES_MAX / 4)
    count = LOG_BYTES_MAX / 4;
  if (log_length + count > LOG_BYTES_MAX)
    file_drop_older_half ();
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

/* Put a whole line in the ring, or count it lost if it has no room. */
static void
ring_put (const char *line, size_t count)
{
  pthread_mutex_lock (&ring_lock);
  if (RING_BYTES - ring_used < count)
    lines_lost++;
  else {
    size_t end = (ring_start + ring_used) % RING_BYTES;
    size_t first = count < RING_BYTES - end ? count : RING_BYTES - end;
    memcpy (ring + end, line, first);
    memcpy (ring, line + first, count - first);
    ring_used += count;
    pthread_cond_signal (&ring_filled);
  }
  pthread_mutex_unlock (&ring_lock);
}

/* The writer thread: what the ring holds, to the file, in the order it
 * came; a line for those lost when the ring was full.
 */
static void *
writer_main (void *arg)
{
  (void) arg;
  static char chunk[64 << 10];
  for (;;) {
    pthread_mutex_lock (&ring_lock);
    writer_busy = false;
    while (ring_used == 0 && lines_lost == 0)
      pthread_cond_wait (&ring_filled, &ring_lock);
    writer_busy = true;
    size_t count = ring_used < sizeof chunk ? ring_used : sizeof chunk;
    size_t first = count < RING_BYTES - ring_start
      ? count : RING_BYTES - ring_start;
    memcpy (chunk, ring + ring_start, first);
    memcpy (chunk + first, ring, count - first);
    ring_start = (ring_start + count) % RING_BYTES;
    ring_used -= count;
    unsigned long lost = lines_lost;
    lines_lost = 0;
    pthread_mutex_unlock (&ring_lock);
    file_append (chunk, count);
    if (lost) {
      char line[128];
      int length = snprintf (line, sizeof line, "(%lu lines lost: the log's "
                             "writer was behind)\n", lost);
      file_append (line, length);
    }
  }
  return NULL;
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
  ring_put (line, used);
}

/* A child's line (or a piece of one too long), with its prefix. */
static void
source_line_write (struct log_source *source)
{
  if (source->used == 0)
    return;
  char line[LOG_LINE_MAX + 160];
  size_t used = log_prefix (line, sizeof line);
  used += snprintf (line + used, sizeof line - used, "pid %d: ",
                    (int) source->pid);
  memcpy (line + used, source->line, source->used);
  used += source->used;
  if (line[used - 1] != '\n')
    line[used++] = '\n';
  ring_put (line, used);
  source->used = 0;
}

/* Read what source has, put its whole lines in the ring; at its end,
 * the slot is freed.
 */
static void
source_drain (struct log_source *source)
{
  char chunk[4096];
  ssize_t got = read (source->fd, chunk, sizeof chunk);
  if (got == -1 && (errno == EINTR || errno == EAGAIN))
    return;
  for (ssize_t i = 0; i < got; i++) {
    source->line[source->used++] = chunk[i];
    if (chunk[i] == '\n' || source->used == LOG_LINE_MAX)
      source_line_write (source);
  }
  if (got <= 0) {
    source_line_write (source);
    pthread_mutex_lock (&sources_lock);
    close (source->fd);
    source->fd = -1;
    pthread_mutex_unlock (&sources_lock);
  }
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
    pthread_mutex_lock (&sources_lock);
    for (int i = 0; i < LOG_SOURCES_MAX; i++)
      if (sources[i].fd >= 0) {
        fds[count] = (struct pollfd) { .fd = sources[i].fd, .events = POLLIN };
        which[count++] = &sources[i];
      }
    pthread_mutex_unlock (&sources_lock);
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
supervise_thread_start (void *(*main) (void *))
{
  sigset_t all, before;
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &before);
  /* A small stack: the supervisor's memory is locked whole (mlockall),
   * a default stack of 8 MiB with it.
   */
  pthread_attr_t attributes;
  pthread_attr_init (&attributes);
  pthread_attr_setstacksize (&attributes, LOG_THREAD_STACK);
  pthread_t thread;
  int err = pthread_create (&thread, &attributes, main, NULL);
  pthread_attr_destroy (&attributes);
  pthread_sigmask (SIG_SETMASK, &before, NULL);
  if (err != 0) {
    errno = err;
    return false;
  }
  pthread_detach (thread);
  return true;
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
  log_fd = fd;
  log_map = map;
  log_length = (size_t) st.st_size;
  if (log_length > LOG_BYTES_MAX) {
    /* Longer than this build keeps (an older supervisor's): its end. */
    log_length = LOG_BYTES_MAX;
    file_drop_older_half ();
  }
  log_locked = page_round_up (log_length);
  if (log_locked)
    mlock (log_map, log_locked);
  return supervise_thread_start (writer_main)
    && supervise_thread_start (drain_main);
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
  pthread_mutex_lock (&sources_lock);
  for (int i = 0; i < LOG_SOURCES_MAX && pid > 0 && !added; i++)
    if (sources[i].fd == -1) {
      sources[i].pid = pid;
      sources[i].used = 0;
      sources[i].fd = our_end;
      added = true;
    }
  pthread_mutex_unlock (&sources_lock);
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
    pthread_mutex_lock (&sources_lock);
    for (int i = 0; i < LOG_SOURCES_MAX && !pending; i++) {
      struct pollfd readable = { .fd = sources[i].fd, .events = POLLIN };
      pending = sources[i].fd >= 0 && poll (&readable, 1, 0) == 1;
    }
    pthread_mutex_unlock (&sources_lock);
    pthread_mutex_lock (&ring_lock);
    pending = pending || ring_used > 0 || lines_lost > 0 || writer_busy;
    pthread_mutex_unlock (&ring_lock);
    if (!pending)
      return;
    usleep (10000);
  }
}
