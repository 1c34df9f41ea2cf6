/* The control channel: see control.h.  The socket, its clients and
 * their lines, and the worker; what each command does is
 * control-commands.c's.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "control.h"
#include "control-internal.h"
#include "error-text.h"
#include "monotonic.h"
#include "registry.h"
#include "unix-listen.h"

#define CONTROL_WORDS_MAX 8
/* Clients served at once; one more is told so and closed. */
#define CONTROL_CLIENTS_MAX 8
/* A client that sends nothing for this long is closed. */
#define CONTROL_IDLE_MS (60 * 1000)
/* A line must be whole this long after its first byte came, else its
 * client is closed: a client that trickles bytes holds its place only
 * that long.
 */
#define CONTROL_LINE_DEADLINE_MS 2000

/* Set up in control_listen / control_start, torn down in control_stop,
 * one thread at a time: nbdkit's main thread, or a standby's thread at
 * its takeover (standby.h), which the main thread joins before its
 * control_stop; the control thread only reads them.
 */
static int listen_fd = -1;
static char *socket_path;
static struct stat socket_name;     /* what unix_listen bound */
/* The read-only socket (ctl_ro=), the same way; -1: none. */
static int read_only_fd = -1;
static char *read_only_path;
static struct stat read_only_name;
static pthread_t thread;
static bool running;
/* Set on the control thread alone (control_main): its own commands'
 * control_stop (handover) stops the worker only.
 */
static _Thread_local bool on_control_thread;
static struct block_store *store;
static struct control_info info;

/* THE WORKER.  A command that may wait for the backing store runs on a
 * thread of its own, started for it by the control thread and joined by
 * it, so that a wedged store never stops the channel: one such command
 * at a time (job.client set), a second is answered "busy".
 *
 * job is written by the control thread before it starts the worker and
 * read by it after the join; meanwhile the worker reads it and writes
 * result (pthread_create and pthread_join order the two).
 */
static struct worker_job {
  struct client *client;        /* NULL: no command on the worker */
  const struct control_command *command;
  int argc;
  char *argv[CONTROL_WORDS_MAX + 1];  /* words of client->line */
  size_t line_bytes;            /* the line with its newline: removed
                                   from client->line once it is done */
  int result;                   /* what command->run returned */
} job;
static pthread_t worker_thread;
/* The worker writes a byte here when its command is done; the control
 * thread polls the other end.
 */
static int worker_done_pipe[2] = { -1, -1 };
/* worker_lock guards worker_running, and the setting of the stop
 * (client_io_stop): so that control_stop either sees a worker that
 * started and cuts its backing I/O short, or no worker starts after it.
 */
static pthread_mutex_t worker_lock = PTHREAD_MUTEX_INITIALIZER;
static bool worker_running;

/* ---- the socket ------------------------------------------------------ */

int
control_listen_read_only (const char *path)
{
  int fd = unix_listen (path, "ctl_ro", &read_only_name, 0666);
  if (fd == -1)
    return -1;
  if (!(read_only_path = strdup (path))) {
    nbdkit_error ("ctl_ro: %s", error_text (errno));
    close (fd);
    unlink (path);
    return -1;
  }
  read_only_fd = fd;
  return 0;
}

int
control_listen (const char *path, const char *name)
{
  int fd = unix_listen (path, "ctl", &socket_name, 0600);
  if (fd == -1)
    return -1;
  registry_add (name, path);
  /* control_stop removes the socket by this name. */
  socket_path = strdup (path);
  if (!socket_path) {
    nbdkit_error ("ctl: %s", error_text (errno));
    close (fd);
    unlink (path);
    return -1;
  }
  listen_fd = fd;
  return 0;
}


static void *
worker_main (void *arg)
{
  job.result = job.command->run (job.client, job.argc, job.argv);
  /* A device's command held it in flight (worker_start): let a remove
   * waiting on the control thread go on.
   */
  if (job.client->device)
    device_leave (job.client->device);
  char byte = 0;
  ssize_t written = write (worker_done_pipe[1], &byte, 1);
  (void) written;               /* a pipe with room: one byte per job */
  return NULL;
}

/* Start command on the worker for client's line (line_bytes long, with
 * its newline): 0, or -1 after an error reply (busy, stopping, no
 * thread).
 */
static int
worker_start (struct client *client, const struct control_command *command,
              int argc, char **argv, size_t line_bytes)
{
  if (job.client)
    return reply_error (client, "busy: '%s' is running (one command that "
                        "waits for the backing store at a time); try again "
                        "when it is done", job.command->name);
  pthread_mutex_lock (&worker_lock);
  bool refused = client_io_stopping ();
  worker_running = !refused;
  pthread_mutex_unlock (&worker_lock);
  if (refused)
    return reply_error (client, "%s: the server is stopping", command->name);

  /* A command on a device holds it in flight until it ends, so that a
   * remove (on this thread) waits for it, and tells it to stop
   * (client_still_there): devices.h, A FORCED REMOVE.
   */
  if (client->device && !device_enter (client->device)) {
    pthread_mutex_lock (&worker_lock);
    worker_running = false;
    pthread_mutex_unlock (&worker_lock);
    return reply_error (client, "%s: device %s was removed", command->name,
                        client->device->spec.name);
  }
  job.client = client;
  job.command = command;
  job.argc = argc;
  memcpy (job.argv, argv, argc * sizeof *argv);
  job.argv[argc] = NULL;
  job.line_bytes = line_bytes;
  client->on_worker = true;
  int err = pthread_create (&worker_thread, NULL, worker_main, NULL);
  if (err) {
    if (client->device)
      device_leave (client->device);
    client->on_worker = false;
    job.client = NULL;
    pthread_mutex_lock (&worker_lock);
    worker_running = false;
    pthread_mutex_unlock (&worker_lock);
    return reply_error (client, "%s: cannot start its thread: %s",
                        command->name, error_text (err));
  }
  pthread_setname_np (worker_thread, "zram-ctl-work");
  return 0;
}

/* Wait for the worker to end (it has, or was told to stop), and forget
 * its job: the client it served, for the caller to finish with.
 */
static struct client *
worker_join (void)
{
  pthread_join (worker_thread, NULL);
  pthread_mutex_lock (&worker_lock);
  worker_running = false;
  pthread_mutex_unlock (&worker_lock);
  struct client *client = job.client;
  client->on_worker = false;
  job.client = NULL;
  return client;
}

enum line_outcome { LINE_ANSWERED, LINE_ON_WORKER };

/* Run one line (line_bytes long with its newline): its reply, ending
 * with ok or error, is sent now, or once the worker has run it.
 */
static enum line_outcome
run_line (struct client *client, char *line, size_t line_bytes)
{
  char *argv[CONTROL_WORDS_MAX + 1];
  int argc = 0;
  for (char *save, *word = strtok_r (line, " \t\r", &save); word;
       word = strtok_r (NULL, " \t\r", &save)) {
    if (argc == CONTROL_WORDS_MAX)
      break;
    argv[argc++] = word;
  }
  if (argc == 0) {
    fprintf (client->out, "ok\n"); /* an empty line: nothing to do */
    reply_flush (client);
    return LINE_ANSWERED;
  }
  /* device=NAME, anywhere on the line: the command acts on that device
   * (devices.h); without it, on the default export.
   */
  client->store = store;
  client->device = NULL;
  client->all_devices = false;
  for (int k = 0; k < argc && argc < CONTROL_WORDS_MAX; k++)
    if (strncmp (argv[k], "device=", 7) == 0) {
      const char *name = argv[k] + 7;
      memmove (&argv[k], &argv[k + 1], (argc - k - 1) * sizeof *argv);
      argc--;
      client->all_devices = strcmp (name, "*") == 0;
      if (*name && !client->all_devices
          && !(client->device = device_find (name))) {
        reply_error (client, "unknown device '%s' (devices lists them)", name);
        reply_flush (client);
        return LINE_ANSWERED;
      }
      if (client->device)
        client->store = client->device->store;
      break;
    }
  if (argc == 0) {
    reply_error (client, "device=: which command?");
    reply_flush (client);
    return LINE_ANSWERED;
  }

  int r = -1;
  size_t i;
  for (i = 0; i < control_command_count; i++)
    if (strcmp (argv[0], control_commands[i].name) == 0)
      break;
  if (client->all_devices && strcmp (argv[0], "mm_stat") != 0
      && strcmp (argv[0], "io_stat") != 0 && strcmp (argv[0], "bd_stat") != 0)
    reply_error (client, "device=*: only mm_stat, io_stat and bd_stat give "
                 "the server's totals (the other commands take one device)");
  else if (argc == CONTROL_WORDS_MAX)
    reply_error (client, "too many words");
  else if (i == control_command_count)
    reply_error (client, "unknown command '%s' (try help)", argv[0]);
  else if (client->read_only && !control_commands[i].reads_only)
    reply_error (client, "%s: not on the read-only socket (ctl_ro=): it "
                 "answers only what reads the server's figures", argv[0]);
  else if (argc < control_commands[i].min_words || argc > control_commands[i].max_words)
    reply_error (client, "usage: %s", control_commands[i].usage);
  else if (control_commands[i].worker_words && argc >= control_commands[i].worker_words) {
    if (worker_start (client, &control_commands[i], argc, argv, line_bytes) == 0)
      return LINE_ON_WORKER;
  }
  else
    r = control_commands[i].run (client, argc, argv);
  if (r == 0)
    fprintf (client->out, "ok\n");
  reply_flush (client);
  return LINE_ANSWERED;
}

/* ---- the thread ------------------------------------------------------ */

/* Drop the line just run (bytes long, with its newline) from the
 * client's buffer.  The clock of the line after it, if some of it came,
 * starts now: the client could not know when the line before would end.
 */
static void
line_consume (struct client *client, size_t bytes)
{
  client->used -= bytes;
  memmove (client->line, client->line + bytes, client->used);
  client->line_started_ms = client->used ? monotonic_ms () : 0;
}

/* Run the whole lines in the client's buffer, until none is left or one
 * went to the worker (the rest wait for it): true while the client
 * stays.
 */
static bool
client_run_lines (struct client *client)
{
  char *end;
  while (!client->gone && !client->on_worker
         && (end = memchr (client->line, '\n', client->used))) {
    size_t length = end - client->line;
    *end = '\0';
    client->last_line_ms = monotonic_ms ();
    /* A NUL would cut the line short unseen: refuse it, and answer. */
    if (memchr (client->line, '\0', length)) {
      reply_error (client, "the line holds a NUL byte");
      reply_flush (client);
    }
    else if (run_line (client, client->line, length + 1) == LINE_ON_WORKER)
      return true;              /* the line stays till the worker is done */
    line_consume (client, length + 1);
  }
  if (!client->on_worker && client->used == sizeof client->line) {
    reply_error (client, "line too long (%d bytes at most)", CONTROL_LINE_MAX);
    reply_flush (client);
    return false;
  }
  return !client->gone;
}

/* Take what the client sent and run the whole lines: true while it
 * stays.
 */
static bool
client_read (struct client *client)
{
  ssize_t n = recv (client->fd, client->line + client->used,
                    sizeof client->line - client->used, MSG_DONTWAIT);
  if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return true;
  if (n <= 0)
    return false;
  uint64_t now = monotonic_ms ();
  if (client->used == 0)
    client->line_started_ms = now;
  client->used += n;
  client->last_heard_ms = now;
  return client_run_lines (client);
}

static struct client clients[CONTROL_CLIENTS_MAX];

static void
client_close (struct client *client)
{
  fclose (client->out);
  free (client->reply);
  close (client->fd);
  client->fd = -1;
}

/* The worker is done: join it, send its client the reply, then run the
 * lines that client sent meanwhile.
 */
static void
worker_finish (void)
{
  char byte;
  ssize_t got = read (worker_done_pipe[0], &byte, 1);
  (void) got;                   /* readable: the worker wrote its byte */
  int result = job.result;
  size_t line_bytes = job.line_bytes;
  struct client *client = worker_join ();
  /* It waited for its reply: neither silent nor slow. */
  client->last_heard_ms = client->last_line_ms = monotonic_ms ();
  if (result == 0)
    fprintf (client->out, "ok\n");
  reply_flush (client);
  line_consume (client, line_bytes);
  if (!client_run_lines (client))
    client_close (client);
}

/* A new connection: a free slot; else the slot of the client that has
 * gone longest without finishing a line (it may have just connected,
 * or be trickling bytes: however many such clients there are, they
 * never lock out the next client that talks), never the one whose
 * command is on the worker; else a short refusal.
 */
static void
client_accept (int fd, bool read_only)
{
  /* The read-only socket's clients (any local user) take at most half
   * the places, and give up only their own: they never push out the
   * owner's.
   */
  unsigned read_only_count = 0;
  for (unsigned i = 0; i < CONTROL_CLIENTS_MAX; i++)
    read_only_count += clients[i].fd != -1 && clients[i].read_only;
  bool own_only = read_only && read_only_count >= CONTROL_CLIENTS_MAX / 2;
  struct client *slot = NULL;
  for (unsigned i = 0; i < CONTROL_CLIENTS_MAX && !slot && !own_only; i++)
    if (clients[i].fd == -1)
      slot = &clients[i];
  if (!slot) {
    for (unsigned i = 0; i < CONTROL_CLIENTS_MAX; i++)
      if (clients[i].fd != -1 && !clients[i].on_worker
          && (!read_only || clients[i].read_only)
          && (!slot || clients[i].last_line_ms < slot->last_line_ms))
        slot = &clients[i];
    if (slot)
      client_close (slot);
  }
  if (!slot) {
    static const char refusal[] = "error: too many control clients ("
      "at most 8 at once); try again later\n";
    _Static_assert (CONTROL_CLIENTS_MAX == 8, "the refusal names the limit");
    ssize_t sent = send (fd, refusal, sizeof refusal - 1,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
    (void) sent;
    close (fd);
    return;
  }
  uint64_t now = monotonic_ms ();
  *slot = (struct client) {
    .fd = fd, .store = store, .info = &info, .read_only = read_only,
    .last_heard_ms = now, .last_line_ms = now,
  };
  /* gcc 12's -fanalyzer takes the stream for a leak: it is kept in the
   * static clients array, and client_close (also at the stop) closes it.
   */
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif
  slot->out = open_memstream (&slot->reply, &slot->reply_length);
  if (!slot->out) {
    nbdkit_error ("ctl: client refused: %s", error_text (errno));
    close (fd);
    slot->fd = -1;
  }
}
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic pop
#endif

/* Close the clients past a deadline: silent for CONTROL_IDLE_MS, or a
 * line not finished CONTROL_LINE_DEADLINE_MS after its first byte (told
 * so, if its socket has room).  Returns the milliseconds till the next
 * deadline, 1000 at most: the poll's timeout.
 */
static int
clients_expire (void)
{
  static const char too_slow[] = "error: the line was not finished within "
    "2 s of its first byte\n";
  _Static_assert (CONTROL_LINE_DEADLINE_MS == 2000, "the error names it");
  uint64_t next = monotonic_ms () + 1000;
  for (unsigned i = 0; i < CONTROL_CLIENTS_MAX; i++) {
    struct client *client = &clients[i];
    if (client->fd == -1 || client->on_worker)
      continue;
    uint64_t now = monotonic_ms ();
    if (client->line_started_ms
        && now >= client->line_started_ms + CONTROL_LINE_DEADLINE_MS) {
      /* The rest of the line may have come while this thread was busy
       * with another client's command: take it before judging.
       */
      if (!client_read (client)) {
        client_close (client);
        continue;
      }
      if (!client->on_worker && client->line_started_ms
          && now >= client->line_started_ms + CONTROL_LINE_DEADLINE_MS) {
        ssize_t sent = send (client->fd, too_slow, sizeof too_slow - 1,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
        (void) sent;
        client_close (client);
        continue;
      }
    }
    if (client->fd == -1 || client->on_worker)
      continue;
    if (now >= client->last_heard_ms + CONTROL_IDLE_MS) {
      client_close (client);
      continue;
    }
    if (client->last_heard_ms + CONTROL_IDLE_MS < next)
      next = client->last_heard_ms + CONTROL_IDLE_MS;
    if (client->line_started_ms
        && client->line_started_ms + CONTROL_LINE_DEADLINE_MS < next)
      next = client->line_started_ms + CONTROL_LINE_DEADLINE_MS;
  }
  uint64_t now = monotonic_ms ();
  return next > now ? (int) (next - now) : 0;
}

/* The poll's places: the wake pipe, the socket, the worker's pipe, the
 * read-only socket (-1 when there is none: poll skips it), the clients.
 */
#define FIRST_CLIENT 4

/* One thread serves every client: it waits for any of them to send, runs
 * the lines that came, and closes clients that hang up, stay silent for
 * CONTROL_IDLE_MS, trickle a line for CONTROL_LINE_DEADLINE_MS, or do
 * not read their replies (client_send).  A command that may wait for the
 * backing store goes to the worker, whose end the thread hears on
 * worker_done_pipe.  A silent or stuck client never holds up the others
 * for long, and the wake pipe stops the thread in any wait.
 */
static void *
control_main (void *arg)
{
  on_control_thread = true;
  for (unsigned i = 0; i < CONTROL_CLIENTS_MAX; i++)
    clients[i].fd = -1;
  for (;;) {
    int timeout_ms = clients_expire ();
    struct pollfd fds[FIRST_CLIENT + CONTROL_CLIENTS_MAX];
    struct client *polled[CONTROL_CLIENTS_MAX];
    nfds_t count = FIRST_CLIENT;
    fds[0] = (struct pollfd) { .fd = client_io_wake_fd (), .events = POLLIN };
    fds[1] = (struct pollfd) { .fd = listen_fd, .events = POLLIN };
    fds[2] = (struct pollfd) { .fd = worker_done_pipe[0], .events = POLLIN };
    fds[3] = (struct pollfd) { .fd = read_only_fd, .events = POLLIN };
    /* The worker's client is the worker's to watch (keep_going). */
    for (unsigned i = 0; i < CONTROL_CLIENTS_MAX; i++)
      if (clients[i].fd != -1 && !clients[i].on_worker) {
        polled[count - FIRST_CLIENT] = &clients[i];
        fds[count++] = (struct pollfd) { .fd = clients[i].fd, .events = POLLIN };
      }
    int ready = poll (fds, count, timeout_ms);
    if (ready == -1 && errno != EINTR)
      break;
    if (ready > 0 && fds[0].revents)
      break;                    /* stopping */
    if (ready > 0 && fds[2].revents)
      worker_finish ();
    for (nfds_t k = FIRST_CLIENT; ready > 0 && k < count; k++)
      if (fds[k].revents && !client_read (polled[k - FIRST_CLIENT]))
        client_close (polled[k - FIRST_CLIENT]);
    if (ready > 0 && fds[3].revents) {
      int fd = accept4 (read_only_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd != -1)
        client_accept (fd, true);
    }
    if (ready > 0 && fds[1].revents) {
      int fd = accept4 (listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd != -1)
        client_accept (fd, false);
      else if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN) {
        /* Out of descriptors or memory, the pending connection stays and
         * the socket stays readable: wait a little (or for the stop)
         * rather than spin.
         */
        nbdkit_debug ("ctl: accept: %s", error_text (errno));
        poll (&fds[0], 1, 100);
      }
    }
  }
  /* control_stop told the worker to stop and cut its backing I/O short:
   * it ends within a backing request's cancellation.
   */
  if (job.client)
    worker_join ();
  for (unsigned i = 0; i < CONTROL_CLIENTS_MAX; i++)
    if (clients[i].fd != -1)
      client_close (&clients[i]);
  return NULL;
}

int
control_start (struct block_store *the_store, const struct control_info *the_info)
{
  if (listen_fd == -1 && read_only_fd == -1)
    return 0;
  store = the_store;
  info = *the_info;
  if (client_io_open () == -1 || pipe2 (worker_done_pipe, O_CLOEXEC) == -1)
    return -1;
  int err = pthread_create (&thread, NULL, control_main, NULL);
  if (err) {
    errno = err;
    return -1;
  }
  pthread_setname_np (thread, "zram-control");
  running = true;
  return 0;
}

/* The stop's first step, for cause: a command on the worker stops at
 * its next keep_going question; no worker starts after it.  Whether one
 * was running.
 */
static bool
worker_wind_down (const char *cause)
{
  pthread_mutex_lock (&worker_lock);
  client_io_stop (cause);
  bool running_now = worker_running;
  pthread_mutex_unlock (&worker_lock);
  return running_now;
}

/* As worker_wind_down, and one inside a backing request (a wedged
 * store: up to backing_timeout, and a writeback makes many) cut short.
 */
static void
worker_cut_short (const char *cause)
{
  if (worker_wind_down (cause))
    store_cancel_backing_io (store);
}

void
control_wind_down (void)
{
  worker_wind_down ("the handover");
}

void
control_stop (void)
{
  if (on_control_thread) {
    /* A command of this thread's own stops the server (handover): the
     * worker is stopped and joined here, and its client gets its reply
     * (the command says it was cut short); the thread, its clients and
     * the socket go with the process, which exits next.
     */
    worker_cut_short ("the handover");
    if (job.client) {
      struct client *client = worker_join ();
      if (job.result == 0)      /* the worker's, read after the join */
        fprintf (client->out, "ok\n");
      reply_flush (client);
    }
    return;
  }
  if (running) {
    worker_cut_short ("the server's exit");
    client_io_wake ();
    pthread_join (thread, NULL);
    running = false;
  }
  client_io_close ();
  for (int i = 0; i < 2; i++) {
    if (worker_done_pipe[i] != -1) {
      close (worker_done_pipe[i]);
      worker_done_pipe[i] = -1;
    }
  }
  if (listen_fd != -1) {
    close (listen_fd);
    listen_fd = -1;
    unix_unlink (socket_path, &socket_name);
    registry_remove ();
  }
  free (socket_path);
  socket_path = NULL;
  if (read_only_fd != -1) {
    close (read_only_fd);
    read_only_fd = -1;
    unix_unlink (read_only_path, &read_only_name);
  }
  free (read_only_path);
  read_only_path = NULL;
}
