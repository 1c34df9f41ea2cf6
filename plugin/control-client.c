/* The control channel's clients, from below: their replies sent, and
 * the stop every wait of the channel watches (control-internal.h).
 * control.c (the thread, its sockets, the worker) and control-commands.c
 * (what each command does) call down into it; it calls neither.
 */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "control-internal.h"

/* A reply its client does not read for this long: the client is dropped
 * (the command's effect stays; its log line says so).
 */
#define CONTROL_SEND_TIMEOUT_MS 2000

/* Made by client_io_open and closed by client_io_close, on the thread
 * that starts and stops the channel; written by client_io_wake, read
 * by every wait of the channel's threads.
 */
static int wake_pipe[2] = { -1, -1 };
/* Set once by client_io_stop: every long command stops at its next
 * keep_going question.
 */
static atomic_bool stopping;
/* Why (control_stop_cause): set with stopping, before it, and read once
 * stopping is seen set.
 */
static const char *_Atomic stop_cause;

int
client_io_open (void)
{
  atomic_store (&stopping, false);
  return pipe2 (wake_pipe, O_CLOEXEC);
}

void
client_io_close (void)
{
  for (int i = 0; i < 2; i++)
    if (wake_pipe[i] != -1) {
      close (wake_pipe[i]);
      wake_pipe[i] = -1;
    }
}

int
client_io_wake_fd (void)
{
  return wake_pipe[0];
}

void
client_io_wake (void)
{
  char byte = 0;
  ssize_t written = write (wake_pipe[1], &byte, 1);
  (void) written;               /* one byte, once: the pipe has room */
}

void
client_io_stop (const char *cause)
{
  atomic_store (&stop_cause, cause);
  atomic_store (&stopping, true);
}

bool
client_io_stopping (void)
{
  return atomic_load (&stopping);
}

/* Send on the non-blocking socket, waiting for room at most
 * CONTROL_SEND_TIMEOUT_MS without progress: a client that does not read
 * is dropped, and so is every client when the server stops.
 */
static void
client_send (struct client *client, const char *bytes, size_t length)
{
  while (length > 0 && !client->gone) {
    ssize_t sent = send (client->fd, bytes, length, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      bytes += sent;
      length -= sent;
      continue;
    }
    if (sent == -1 && errno == EINTR)
      continue;
    if (sent == -1 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd fds[] = {
        { .fd = client->fd, .events = POLLOUT },
        { .fd = wake_pipe[0], .events = POLLIN },
      };
      int ready = poll (fds, 2, CONTROL_SEND_TIMEOUT_MS);
      if (ready == -1 && errno == EINTR)
        continue;
      if (ready == 0)
        nbdkit_error ("ctl: client dropped: it read nothing of its reply "
                      "for %d s", CONTROL_SEND_TIMEOUT_MS / 1000);
      if (ready > 0 && !fds[1].revents)
        continue;
    }
    client->gone = true;
  }
}

/* Send what the reply holds so far and start it again. */
void
reply_flush (struct client *client)
{
  fflush (client->out);
  client_send (client, client->reply, client->reply_length);
  rewind (client->out);
  client->reply_length = 0;
  fflush (client->out);
}

int
reply_error (struct client *client, const char *format, ...)
{
  va_list args;
  va_start (args, format);
  fprintf (client->out, "error: ");
  vfprintf (client->out, format, args);
  fprintf (client->out, "\n");
  va_end (args);
  return -1;
}

/* True while the client is connected, the server is not stopping and
 * the command's device (if any) is not being removed: asked between
 * pieces of a long command, on the control thread or on the worker
 * (which then owns client->gone).  A stop leaves the client
 * connected: a handover's still sends the worker's reply.
 */
bool
client_still_there (void *opaque)
{
  struct client *client = opaque;
  struct pollfd fds[] = { { .fd = client->fd, .events = 0 } };
  if (poll (fds, 1, 0) > 0 && (fds[0].revents & (POLLHUP | POLLERR)))
    client->gone = true;
  return !client->gone && !atomic_load (&stopping)
    && !(client->device && atomic_load (&client->device->gone));
}

const char *
control_stop_cause (void)
{
  return atomic_load (&stopping) ? atomic_load (&stop_cause) : NULL;
}
