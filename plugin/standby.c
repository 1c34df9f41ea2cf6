/* A standby server: see standby.h. */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "error-text.h"
#include "handover.h"
#include "standby.h"
#include "unix-listen.h"

/* How often the waiting thread makes new threads' stacks ready, and how
 * long a client has to send its line.
 */
#define STANDBY_TICK_MS 1000
#define STANDBY_LINE_TIMEOUT_S 2

/* Set in standby_listen and standby_start (nbdkit's main thread, before
 * the thread runs), cleared by the thread after a takeover or by
 * standby_stop after it joined the thread.
 */
static int listen_fd = -1;
static char *socket_path;
static struct stat socket_name;     /* what unix_listen bound */
static int wake_pipe[2] = { -1, -1 };
static pthread_t thread;
static bool running;
static int (*take_over) (void);
static unsigned (*make_ready) (void);
/* True from standby_listen until a takeover serves (standby.h, THREADS). */
static atomic_bool waiting;

int
standby_listen (const char *path)
{
  int fd = unix_listen (path, "standby", &socket_name, 0600);
  if (fd == -1)
    return -1;
  if (!(socket_path = strdup (path))) {
    nbdkit_error ("standby: %s", error_text (errno));
    close (fd);
    unlink (path);
    return -1;
  }
  listen_fd = fd;
  atomic_store (&waiting, true);
  return 0;
}

bool
standby_waiting (void)
{
  return atomic_load_explicit (&waiting, memory_order_acquire);
}

/* The socket closed and removed (after a takeover, or at the stop). */
static void
socket_close (void)
{
  if (listen_fd != -1) {
    close (listen_fd);
    listen_fd = -1;
    unix_unlink (socket_path, &socket_name);
  }
}

/* Answer one client's line; true once the server serves. */
static bool
answer (int fd)
{
  struct timeval timeout = { .tv_sec = STANDBY_LINE_TIMEOUT_S };
  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  char line[64];
  size_t used = 0;
  while (used < sizeof line - 1) {
    ssize_t r = read (fd, line + used, 1);
    if (r <= 0 || line[used] == '\n')
      break;
    used++;
  }
  line[used] = '\0';
  char reply[128];
  bool serving = false;
  if (strcmp (line, "ready") == 0)
    snprintf (reply, sizeof reply, "ok %u\n", make_ready ());
  else if (strcmp (line, "takeover") == 0) {
    if (take_over () == 0) {
      struct handover_status status;
      handover_status_get (&status);
      atomic_store_explicit (&waiting, false, memory_order_release);
      serving = true;
      /* Gone before the answer: whoever reads "ok" finds no standby. */
      socket_close ();
      snprintf (reply, sizeof reply, "ok %" PRIu64 "\n", status.generation);
      nbdkit_debug ("standby: took the device over: generation %" PRIu64,
                    status.generation);
    }
    else
      snprintf (reply, sizeof reply, "error: the takeover failed (the "
                "server's log says why); still standing by\n");
  }
  else
    snprintf (reply, sizeof reply, "error: not a standby command "
              "(ready, takeover)\n");
  if (write (fd, reply, strlen (reply)) < 0) {
    /* The supervisor sees the server serve, or not, all the same. */
  }
  return serving;
}

static void *
standby_main (void *unused)
{
  for (;;) {
    struct pollfd fds[2] = {
      { .fd = listen_fd, .events = POLLIN },
      { .fd = wake_pipe[0], .events = POLLIN },
    };
    int r = poll (fds, 2, STANDBY_TICK_MS);
    if (r == -1 && errno != EINTR)
      break;
    if (fds[1].revents)
      break;                    /* standby_stop */
    if (r <= 0) {
      make_ready ();            /* nbdkit's new workers, as they come */
      continue;
    }
    int fd = accept4 (listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd == -1) {
      usleep (100000);          /* out of descriptors: not a busy loop */
      continue;
    }
    bool serving = answer (fd);
    close (fd);
    if (serving)
      break;
  }
  return NULL;
}

int
standby_start (int (*the_take_over) (void), unsigned (*the_make_ready) (void))
{
  if (listen_fd == -1)
    return 0;
  take_over = the_take_over;
  make_ready = the_make_ready;
  if (pipe2 (wake_pipe, O_CLOEXEC) == -1)
    return -1;
  int err = pthread_create (&thread, NULL, standby_main, NULL);
  if (err) {
    errno = err;
    return -1;
  }
  pthread_setname_np (thread, "zram-standby");
  running = true;
  return 0;
}

void
standby_stop (void)
{
  if (running) {
    char byte = 0;
    ssize_t written = write (wake_pipe[1], &byte, 1);
    (void) written;
    pthread_join (thread, NULL);
    running = false;
  }
  for (int i = 0; i < 2; i++)
    if (wake_pipe[i] != -1) {
      close (wake_pipe[i]);
      wake_pipe[i] = -1;
    }
  socket_close ();
  free (socket_path);
  socket_path = NULL;
}
