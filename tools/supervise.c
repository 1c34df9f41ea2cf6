/* `nbdkit-zramctl supervise`: keep a swap device's server running (the
 * swap tool starts it; tools/nbdkit-zram-swap.in).
 *
 *   nbdkit-zramctl supervise DIR DEVICE CONNECTIONS DEAD_CONN_TIMEOUT
 *                            -- NBDKIT ARGUMENT...
 *
 * It goes to the background (its pid in DIR/supervisor.pid), runs the
 * server in the foreground (nbdkit -f, its pid file DIR/pid and socket
 * DIR/sock among the arguments) and attaches DEVICE to it (netlink, with
 * the dead-connection timeout: nbd-attach.c); DIR/attached says that is
 * done, DIR/supervisor.err why it failed.  Then:
 *   - the server dies (a crash, SIGKILL, the OOM killer): it is started
 *     again at once - it recovers the device's region - and DEVICE is
 *     given its socket (reconnect): the requests the kernel kept are
 *     sent again;
 *   - SIGHUP (`swap restart`): the server is asked to hand its region
 *     over and exit (the control channel's handover, SIGTERM if that
 *     cannot be asked or it has not exited in 40 s) and started again -
 *     the binary as it is on disk now, so an upgraded one - and DEVICE
 *     reconnected;
 *   - SIGTERM (`swap off`): the server is stopped and the supervisor
 *     exits.
 * Each restart is a line in DIR/supervisor.log: why, and the downtime
 * (from the old server's end, or the signal that stopped it, to the
 * device reconnected).
 *
 * The requests the kernel had sent to the old server and that it never
 * answered (it died, or held them while it handed over) are not sent
 * again by the reconnect: the driver sends a request again only from its
 * timeout handler, and only when a request timeout is set - with none
 * (the default, so that a live server that is slow is never cut off) it
 * warns every 30 s and waits for good, and those swap pages stay under
 * writeback, held in RAM, for good (seen: a restarted server's machine
 * stalled on them until an OOM kill).  So after a reconnect the device
 * gets a request timeout (REQUEUE_TIMEOUT_S) for REQUEUE_WINDOW_S: each
 * such request's 30 s timer fires within it and is put back in the queue
 * for the new socket (sent on the old one, it does not make the new one
 * dead); then the timeout goes back to none.
 *
 * While no server runs, the swapping kernel may need this process to
 * make progress, and none of its pages may be on the device: its memory
 * is locked (mlockall), it allocates nothing after the start, and a
 * restart is fork and exec.  Nor may a page the next server reads: the
 * region file is kept locked here (the region itself is SHM_LOCKed; the
 * binaries are on a disk, or a ramfs in the guest test).
 */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57    /* Linux 5.6 */
#endif

#include "nbd-attach.h"
#include "supervise.h"

static volatile sig_atomic_t restart_asked, stop_asked;

/* After a reconnect (see above): the request timeout, long enough that
 * no request of the new server meets it, and how long it stays: the old
 * requests' 30 s timer round, and a whole timeout more, so that a
 * request sent meanwhile (its timer armed with the new timeout) that the
 * new server never answers - it died too - is sent again as well (seen:
 * one started just after a reconnect, warned about 120 s later, after a
 * window of 65 s had closed).
 */
#define REQUEUE_TIMEOUT_S 120
#define REQUEUE_WINDOW_S (35 + REQUEUE_TIMEOUT_S)

static void
on_signal (int signal)
{
  if (signal == SIGHUP)
    restart_asked = 1;
  else if (signal != SIGCHLD && signal != SIGALRM)
    stop_asked = 1;
}

static double
now (void)
{
  struct timespec t;
  clock_gettime (CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

/* Wait up to a second, or until a signal comes: they are blocked but
 * here (none: the mask with them unblocked), so one that comes while
 * the supervisor acts is acted on at the next wait, never lost.
 */
static void
wait_a_second (const sigset_t *none)
{
  alarm (1);
  sigsuspend (none);
  alarm (0);
}

/* A line in DIR/name (appended, or replacing the file). */
static void
note (const char *dir, const char *name, bool append, const char *format, ...)
  __attribute__ ((format (printf, 4, 5)));
static void
note (const char *dir, const char *name, bool append, const char *format, ...)
{
  char path[4096];
  snprintf (path, sizeof path, "%s/%s", dir, name);
  int fd = open (path, O_WRONLY | O_CREAT | O_CLOEXEC
                 | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd == -1)
    return;
  va_list args;
  va_start (args, format);
  vdprintf (fd, format, args);
  va_end (args);
  close (fd);
}

/* Ask the server on DIR/ctl to hand its device over and exit (the
 * control channel's handover): its held requests are never answered, so
 * the kernel sends them again to the next server - a SIGTERM would have
 * nbdkit answer them with ESHUTDOWN, an I/O error.  false if it could not
 * be asked.
 */
static bool
ask_handover (const char *dir)
{
  struct sockaddr_un address = { .sun_family = AF_UNIX };
  snprintf (address.sun_path, sizeof address.sun_path, "%s/ctl", dir);
  int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return false;
  static const char line[] = "handover\n";
  bool asked = connect (fd, (struct sockaddr *) &address, sizeof address) == 0
    && write (fd, line, sizeof line - 1) == sizeof line - 1;
  close (fd);
  return asked;
}

/* Detach device, saying nothing if it is not attached. */
static void
nbd_detach_quietly (const char *device)
{
  int err = dup (2), null = open ("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0)
    dup2 (null, 2);
  nbd_detach (device);
  if (err >= 0) {
    dup2 (err, 2);
    close (err);
  }
  if (null >= 0)
    close (null);
}

/* Start the server; wait for its pid file and socket.  Its pid, or -1
 * (the server exited, or wrote neither in 60 s).
 */
static pid_t
server_start (const char *dir, char **argv)
{
  char pid_path[4096], sock_path[4096];
  snprintf (pid_path, sizeof pid_path, "%s/pid", dir);
  snprintf (sock_path, sizeof sock_path, "%s/sock", dir);
  unlink (pid_path);
  unlink (sock_path);
  pid_t pid = fork ();
  if (pid == 0) {
    sigset_t none;
    sigemptyset (&none);
    sigprocmask (SIG_SETMASK, &none, NULL);
    execv (argv[0], argv);
    _exit (127);
  }
  if (pid == -1)
    return -1;
  for (int i = 0; i < 6000; i++) {
    struct stat st;
    if (stat (pid_path, &st) == 0 && st.st_size > 0
        && stat (sock_path, &st) == 0)
      return pid;
    if (waitpid (pid, NULL, WNOHANG) == pid)
      return -1;
    usleep (10000);
  }
  kill (pid, SIGKILL);
  waitpid (pid, NULL, 0);
  return -1;
}

int
run_supervise (int argc, char **argv)
{
  if (argc < 6 || strcmp (argv[4], "--") != 0) {
    fprintf (stderr, "usage: nbdkit-zramctl supervise DIR DEVICE CONNECTIONS "
             "DEAD_CONN_TIMEOUT -- NBDKIT ARGUMENT...\n");
    return EXIT_FAILURE;
  }
  const char *dir = argv[0], *device = argv[1];
  unsigned connections = atoi (argv[2]), timeout = atoi (argv[3]);
  char **server_argv = argv + 5;

  /* Into the background: the swap tool goes on once DIR/attached is
   * there.
   */
  pid_t child = fork ();
  if (child == -1)
    return EXIT_FAILURE;
  if (child > 0)
    return EXIT_SUCCESS;
  setsid ();
  /* Its messages (and the server's) go to DIR/supervisor.log. */
  char log_path[4096];
  snprintf (log_path, sizeof log_path, "%s/supervisor.log", dir);
  int null = open ("/dev/null", O_RDWR);
  int log = open (log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (null >= 0) {
    dup2 (null, 0);
    dup2 (log >= 0 ? log : null, 1);
    dup2 (log >= 0 ? log : null, 2);
    close (null);
  }
  if (log >= 0)
    close (log);
  if (mlockall (MCL_CURRENT | MCL_FUTURE) == -1)
    note (dir, "supervisor.log", true, "mlockall: %s: its pages may be "
          "swapped out\n", strerror (errno));
  /* An IO flusher (its reclaim never writes pages out: no swap-out to
   * the device that is down) out of the OOM killer's reach, and so is
   * every server it starts from its first instruction - both are
   * inherited across fork and exec.  Seen without: a server started
   * while the device was down and memory full waited in the kernel's
   * reclaim (__swap_writepage) before it could set them itself.
   */
  if (prctl (PR_SET_IO_FLUSHER, 1, 0, 0, 0) == -1)
    note (dir, "supervisor.log", true, "PR_SET_IO_FLUSHER: %s\n",
          strerror (errno));
  int oom = open ("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    if (write (oom, "-1000", 5) != 5)
      note (dir, "supervisor.log", true, "oom_score_adj: %s\n",
            strerror (errno));
    close (oom);
  }
  note (dir, "supervisor.pid", false, "%d\n", (int) getpid ());
  sigset_t blocked, none;
  sigemptyset (&blocked);
  sigaddset (&blocked, SIGHUP);
  sigaddset (&blocked, SIGTERM);
  sigaddset (&blocked, SIGINT);
  sigaddset (&blocked, SIGCHLD);
  sigaddset (&blocked, SIGALRM);
  sigprocmask (SIG_BLOCK, &blocked, &none);
  /* Blocked but while it waits (sigsuspend): a signal that comes while
   * it acts is acted on at the next wait, never lost.
   */
  struct sigaction action = { .sa_handler = on_signal };
  sigaction (SIGHUP, &action, NULL);
  sigaction (SIGTERM, &action, NULL);
  sigaction (SIGINT, &action, NULL);
  sigaction (SIGCHLD, &action, NULL);
  sigaction (SIGALRM, &action, NULL);

  char sock_path[4096];
  snprintf (sock_path, sizeof sock_path, "%s/sock", dir);
  pid_t server = server_start (dir, server_argv);
  if (server == -1
      || nbd_attach (device, sock_path, false, connections, timeout, 4096) == -1) {
    note (dir, "supervisor.err", false, "the server did not start, or %s "
          "could not be attached to it\n", device);
    if (server > 0) {
      kill (server, SIGTERM);
      waitpid (server, NULL, 0);
    }
    return EXIT_FAILURE;
  }
  /* The region file (on /run, a tmpfs: swappable) is what the next
   * server reads first: kept in memory, mapped and locked here, or a
   * server starting while the device is down would wait for its page to
   * come back from the device.
   */
  char region_path[4096];
  snprintf (region_path, sizeof region_path, "%s/region", dir);
  int region_fd = open (region_path, O_RDONLY | O_CLOEXEC);
  if (region_fd >= 0) {
    void *page = mmap (NULL, 4096, PROT_READ, MAP_SHARED, region_fd, 0);
    if (page == MAP_FAILED || mlock (page, 4096) == -1)
      note (dir, "supervisor.log", true, "cannot lock %s in memory: %s\n",
            region_path, strerror (errno));
    close (region_fd);
  }
  note (dir, "attached", false, "%s\n", device);
  unsigned restarts = 0;
  double requeue_until = 0;
  for (;;) {
    /* Wait for the server's end or a signal. */
    int status;
    double stopped = 0;
    bool terminated = false;
    while (waitpid (server, &status, WNOHANG) != server) {
      if (requeue_until && now () > requeue_until) {
        if (nbd_set_request_timeout (device, 0) == 0)
          requeue_until = 0;
      }
      if (stop_asked && !terminated) {
        stopped = stopped ? stopped : now ();
        kill (server, SIGTERM);
        terminated = true;
      }
      else if (restart_asked && !stopped) {
        stopped = now ();
        if (!ask_handover (dir)) {
          kill (server, SIGTERM);
          terminated = true;
        }
      }
      else if (restart_asked && !terminated && now () - stopped > 40) {
        kill (server, SIGTERM);
        terminated = true;
      }
      /* Woken by a signal, or each second (the 40 s above). */
      wait_a_second (&none);
    }
    if (!stopped)
      stopped = now ();
    if (stop_asked) {
      /* Stopped for good: the device it attached goes too (swap off has
       * detached it already; an interrupted swap on may not have).
       */
      nbd_detach_quietly (device);
      return EXIT_SUCCESS;
    }
    const char *why = restart_asked ? "restart asked"
      : WIFSIGNALED (status) ? strsignal (WTERMSIG (status)) : "exited";
    bool asked = restart_asked;
    restart_asked = 0;
    /* A server that exits by itself with status 0 was stopped by
     * someone else on purpose: not restarted.
     */
    if (!asked && WIFEXITED (status) && WEXITSTATUS (status) == 0) {
      note (dir, "supervisor.log", true, "the server exited (status 0): "
            "not restarted\n");
      return EXIT_SUCCESS;
    }
    /* Tried again each second until it serves and the device is
     * reconnected: a start can fail for a reason that passes (memory
     * short, its address space layout: the server's message says), and
     * the device waits up to its dead-connection timeout.
     */
    for (unsigned attempt = 1;; attempt++) {
      server = server_start (dir, server_argv);
      if (server != -1
          && nbd_attach (device, sock_path, true, connections, timeout,
                         4096) == 0)
        break;
      note (dir, "supervisor.log", true, "restart %u (%s), attempt %u: "
            "the server did not start again, or %s could not be "
            "reconnected\n", restarts + 1, why, attempt, device);
      if (server > 0) {
        kill (server, SIGKILL);
        waitpid (server, NULL, 0);
      }
      wait_a_second (&none);    /* swap off meanwhile stops the tries */
      if (stop_asked || now () - stopped > timeout) {
        note (dir, "supervisor.log", true, "restart %u: given up after %u "
              "attempts (%s)\n", restarts + 1, attempt, stop_asked
              ? "stopped" : "the device's dead-connection timeout passed");
        nbd_detach_quietly (device);
        return EXIT_FAILURE;
      }
    }
    restarts++;
    note (dir, "supervisor.log", true, "restart %u (%s): %s reconnected, "
          "down %.3f s\n", restarts, why, device, now () - stopped);
    /* The old server's unanswered requests: sent again (see above). */
    if (nbd_set_request_timeout (device, REQUEUE_TIMEOUT_S) == 0)
      requeue_until = now () + REQUEUE_WINDOW_S;
  }
}
