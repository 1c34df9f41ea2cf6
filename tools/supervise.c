/* `nbdkit-zramctl supervise`: keep a swap device's server running (the
 * swap tool starts it; tools/nbdkit-zram-swap.in).
 *
 *   nbdkit-zramctl supervise DIR DEVICE CONNECTIONS DEAD_CONN_TIMEOUT
 *                            [--standby | --standbys N]
 *                            [--device /dev/nbdM=EXPORT]...
 *                            -- NBDKIT ARGUMENT...
 *
 * Each --device is another device of the same server (the plugin's
 * device=EXPORT:SIZE), attached to the server's export EXPORT and
 * handled as DEVICE is below: every restart reconnects all of them (the
 * server is one), a standby keeps connections ready for each, a request
 * of any that meets its timeout has the server killed (struct
 * supervised).
 *
 * It goes to the background (its pid in DIR/supervisor.pid), runs the
 * server in the foreground (NBDKIT ARGUMENT... with -f among them; it
 * adds --unix DIR/sock --pidfile DIR/pid) and attaches DEVICE to it
 * (netlink, with the dead-connection timeout: nbd-attach.c);
 * DIR/attached says that is done, DIR/supervisor.err why it failed.
 *
 * With --standby it keeps a second server ready beside the first: the
 * same command with the plugin's standby=DIR/standby.sock (and --unix
 * DIR/sock.standby --pidfile DIR/pid.standby), its CONNECTIONS sockets
 * connected and through the handshake, its threads' stacks made ready
 * ("ready"); DIR/standby.ready holds its pid while it is.  --standbys N
 * keeps N of them (the second's names end in standby2, and so on), so
 * that a crash while the next standby is still being made after a
 * restart (a few seconds, under pressure more) finds one ready too: with
 * one, two crashes that close start a server with the device down (seen
 * in the guest: with zstd at 2.25x RAM that server hung in reclaim in 2
 * of 4 runs).  Each costs what an idle server holds (RSS, in the log
 * when it is ready).  A restart
 * then asks it to take the device over ("takeover") and gives the
 * kernel those sockets: nothing is started, exec'd or faulted in while
 * the device is down - a server started then, on a machine whose
 * memory the swapping kernel used up meanwhile, can wait in reclaim
 * for pages only the device could take (seen in the guest: half the
 * restarts under 2.25x RAM).  A new standby follows each restart, once
 * the old server's requests are sent again (below), and at once after a
 * standby's death; one that cannot be made ready is tried again every
 * STANDBY_RETRY_S; meanwhile a restart starts a server as below.
 * Then:
 *   - the server dies (a crash, SIGKILL, the OOM killer): it is started
 *     again at once - it recovers the device's region - and DEVICE is
 *     given its socket (reconnect): the requests the kernel kept are
 *     sent again;
 *   - SIGHUP (`swap restart`): a new standby is made ready first - the
 *     binary as it is on disk now, so an upgraded one - while the old
 *     server serves (one whose making starves the server is given up,
 *     and the restart waits: server_starved); then the server is asked to hand its region over
 *     and exit (the control channel's handover, SIGTERM if that cannot
 *     be asked or it has not exited in 40 s), and the standby takes
 *     over (or, without one, the server is started again) and DEVICE is
 *     reconnected;
 *   - SIGTERM (`swap off`): the server is stopped and the supervisor
 *     exits.
 * Each step is a line in DIR/supervisor.log with its time (what it
 * waits for, what answered and after how long), and each restart ends
 * with one: why, and the downtime (from the old server's end, or the
 * signal that stopped it, to the device reconnected).  The servers'
 * output goes there too, through a pipe: the log is written by the
 * supervisor alone, from pages it keeps locked (supervise-log.h).
 *
 * The requests the kernel had sent to the old server and that it never
 * answered (it died, or held them while it handed over) are not sent
 * again by the reconnect: the driver sends a request again only from its
 * timeout handler, and only when a request timeout is set (with none it
 * warns every 30 s and waits for good, the swap pages under writeback
 * held in RAM for good).  So the device has a request timeout from its
 * attach on (--request-timeout, REQUEST_TIMEOUT_DEFAULT_S): a request
 * the old server never answered is sent again to the new one at most
 * that long after it was first sent - what a user waits, with the
 * restart's own time, after a crash.  (A timeout armed only after the
 * reconnect, as before, acts on the old requests only when their 30 s
 * timers fire: every kill stalled the device for 30-34 s.)
 *
 * A live server's request that meets the timeout is sent again too, on
 * a new connection - while the server may still be working on the first
 * copy, a write that would land after the resend and after a newer write
 * of the same block, stale data.  So that cannot happen, such a server
 * is killed and reaped before anything is sent again (a dead process
 * writes nothing), and the restart below takes over: the driver's
 * link-dead notice for a live server says a request timed out.  A slow
 * server costs a restart, never data.
 *
 * The downtime said for a restart is what a user of the device waits at
 * most: from the device's last answer before the server's end (its
 * counters are read each STALL_SAMPLE_S) to the reconnect, or, when
 * requests were waiting at the end, to the request timeout after which
 * they are sent again, if that is later.  The new server is told it
 * (the control channel's downtime), for its stats and metrics.
 *
 * While no server runs, the swapping kernel may need this process to
 * make progress, and none of its pages may be on the device: its memory
 * is locked (mlockall), it allocates nothing after the start, and a
 * restart is fork and exec.  Nor may a page the next server reads or
 * writes: the region file is kept locked here (the region itself is
 * SHM_LOCKed; the binaries are on a disk, or a ramfs in the guest
 * test), the log too, and the servers write no other file but new ones
 * (pid files, sockets, the stats files renamed over: a new page is
 * never read back from swap).
 */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
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
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57    /* Linux 5.6 */
#endif

#include "kernel-log.h"
#include "nbd-attach.h"
#include "supervise.h"
#include "supervise-log.h"

static volatile sig_atomic_t restart_asked, stop_asked;

/* The device's request timeout (see above) unless --request-timeout
 * says otherwise: short, as it is a crash's downtime.  A server of the
 * swap tool's answers in milliseconds; one that takes longer is stalled
 * (a backing store's wait: the swap tool gives such a device a timeout
 * above the backing store's own).  The driver's timer fires up to a
 * second late.
 */
#define REQUEST_TIMEOUT_DEFAULT_S 3
/* How often the device's counters are read, for the downtime. */
#define STALL_SAMPLE_S 0.25
/* The driver's link-dead notices for the server that went come a moment
 * after the restart: not taken for a live server's.
 */
#define QUIET_AFTER_RESTART_S 3

/* A standby that could not be made ready, or that exited: tried again
 * after this long.  Its first answer to "ready" (it makes everything
 * ready first), a later one, and its answer to "takeover" (a recovery
 * after a crash walks the whole device) may take this long at most.
 */
#define STANDBY_RETRY_S 30
/* After a restart that had to start a server (no standby was ready): the
 * next standby not before this long.
 */
#define STANDBY_AFTER_START_S 30
/* A planned restart that finds no standby can be made without starving
 * the server tries this many times, STANDBY_RETRY_S apart.
 */
#define RESTART_WAITS_MAX 3
#define STANDBY_START_TIMEOUT_S 60
#define STANDBY_READY_TIMEOUT_S 10
#define TAKEOVER_TIMEOUT_S 60

/* Free memory for the kernel at the reconnect.  Giving the device new
 * sockets (the driver's reconfigure) allocates in the kernel, and the
 * supervisor, an IO flusher, cannot have its reclaim write anything out:
 * on a machine whose memory the swapping kernel used up meanwhile (all
 * of it waiting for the device to come back), that allocation waited
 * until the dead-connection timeout failed the device's requests (seen:
 * the reconnect took 120.4 s in the guest, then I/O errors - the
 * "handed over, then no reconnect" hang).  So the supervisor holds a
 * ballast of locked memory and gives it back just before each
 * reconnect; a thread of its own takes it again when a standby is
 * made (the main thread never waits for that memory).
 */
#define BALLAST_BYTES (4u << 20)
static pthread_mutex_t ballast_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ballast_wanted = PTHREAD_COND_INITIALIZER;
/* Guarded by ballast_lock: the memory held (NULL: none), and whether the
 * thread is to take it again.
 */
static void *ballast;
static bool ballast_asked;

static void *
ballast_main (void *arg)
{
  (void) arg;
  for (;;) {
    pthread_mutex_lock (&ballast_lock);
    while (!ballast_asked || ballast)
      pthread_cond_wait (&ballast_wanted, &ballast_lock);
    pthread_mutex_unlock (&ballast_lock);
    void *memory = mmap (NULL, BALLAST_BYTES, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    pthread_mutex_lock (&ballast_lock);
    if (memory != MAP_FAILED)
      ballast = memory;
    ballast_asked = false;
    pthread_mutex_unlock (&ballast_lock);
    if (memory == MAP_FAILED)
      sleep (STANDBY_RETRY_S);
  }
  return NULL;
}

/* Take the ballast again (asynchronously). */
static void
ballast_take (void)
{
  pthread_mutex_lock (&ballast_lock);
  ballast_asked = true;
  pthread_cond_signal (&ballast_wanted);
  pthread_mutex_unlock (&ballast_lock);
}

/* Give it back, just before a reconnect. */
static void
ballast_give_back (void)
{
  pthread_mutex_lock (&ballast_lock);
  void *memory = ballast;
  ballast = NULL;
  pthread_mutex_unlock (&ballast_lock);
  if (memory) {
    munmap (memory, BALLAST_BYTES);
    supervise_log ("ballast: %u MiB given back for the reconnect",
                   BALLAST_BYTES >> 20);
  }
  else
    supervise_log ("ballast: none held (not taken again yet)");
}

static bool
ballast_start (void)
{
  if (!supervise_thread_start (ballast_main))
    return false;
  ballast_take ();
  return true;
}

/* A standby (--standbys; see above).  Each has names of its own in DIR:
 * the first ".standby" (--unix DIR/sock.standby, --pidfile
 * DIR/pid.standby), "standby.sock" (the plugin's standby= channel) and
 * "standby.ready"; the second ".standby2", "standby2.sock",
 * "standby2.ready"; and so on.
 */
#define STANDBYS_MAX 3
/* The devices one supervisor attaches (struct supervised, below). */
#define SUPERVISED_MAX KERNEL_LOG_DEVICES_MAX
struct standby {
  pid_t pid;                            /* 0: none */
  /* Connected to it, through the handshake of each supervised device's
   * export: count each (0: none).
   */
  int socks[SUPERVISED_MAX][NBD_CONNECTIONS_MAX];
  unsigned count;
  double next_try;                      /* after a failure: not before */
  char suffix[16];                      /* ".standby", ".standby2", ... */
  char channel[32];                     /* "standby.sock", ... */
  char ready_note[32];                  /* "standby.ready", ... */
  char **argv;                          /* its command line */
};

static void
on_signal (int signal)
{
  if (signal == SIGHUP)
    restart_asked = 1;
  else if (signal != SIGCHLD)
    stop_asked = 1;
}

static double
now (void)
{
  struct timespec t;
  clock_gettime (CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

/* What the device answers, from its counters (/sys/block/NAME/stat), for
 * the downtime (see above).
 */
struct device_activity {
  char stat_path[64];
  uint64_t answered;            /* requests completed, of every kind */
  uint64_t waiting;             /* requests in flight */
  double last_answer;           /* when answered last grew, or none waited */
};

/* The devices supervised: the first is DEVICE, on the server's default
 * export; the others (--device PATH=EXPORT) are other exports of the
 * same server (its devices, device= of the plugin).  Each is attached,
 * watched and reconnected the same way, and a restart gives every one
 * of them its sockets: the server is one, so is its end.
 */
struct supervised {
  const char *path;                     /* "/dev/nbdN" */
  const char *export;                   /* "": the default export */
  /* Sampled in every wait (set at the attach): the main loop's and
   * those of the steps that take long (ask, server_start), so that the
   * last answer before a server's end is known within a sample
   * wherever the supervisor was then.
   */
  struct device_activity activity;
  struct nbd_watch *watch;              /* its notices; NULL: none */
};
static struct supervised supervised[SUPERVISED_MAX];
static unsigned supervised_count;

/* The device's name in the kernel's files and log: "nbd0" of
 * "/dev/nbd0".
 */
static const char *
device_kernel_name (const char *device)
{
  const char *slash = strrchr (device, '/');
  return slash ? slash + 1 : device;
}

/* A small file (/proc's, /sys's, the server's stats) read into the
 * caller's buffer, NUL-terminated - the supervisor allocates nothing
 * after its start: its length, or -1.  flags: added to O_RDONLY (as
 * O_NOFOLLOW for a file in the run directory).
 */
static ssize_t
small_file_read (const char *path, int flags, char *text, size_t size)
{
  int fd = open (path, O_RDONLY | O_CLOEXEC | flags);
  if (fd == -1)
    return -1;
  ssize_t got = read (fd, text, size - 1);
  close (fd);
  if (got < 0)
    return -1;
  text[got] = '\0';
  return got;
}

static void
device_activity_init (struct device_activity *activity, const char *device)
{
  snprintf (activity->stat_path, sizeof activity->stat_path,
            "/sys/block/%s/stat", device_kernel_name (device));
  activity->answered = activity->waiting = 0;
  activity->last_answer = now ();
}

/* Read the counters: reads, writes, discards and flushes completed
 * (fields 1, 5, 12 and 16 of the stat file; the last two only in newer
 * kernels), and in flight (field 9).
 */
static void
device_activity_sample (struct device_activity *activity)
{
  char text[512];
  if (!activity->stat_path[0]
      || small_file_read (activity->stat_path, 0, text, sizeof text) <= 0)
    return;                     /* before the attach, or unreadable */
  uint64_t field[18] = { 0 }, answered;
  char *at = text;
  for (int i = 1; i < 18; i++) {
    char *end;
    field[i] = strtoull (at, &end, 10);
    if (end == at)
      break;
    at = end;
  }
  answered = field[1] + field[5] + field[12] + field[16];
  if (answered != activity->answered || field[9] == 0)
    activity->last_answer = now ();
  activity->answered = answered;
  activity->waiting = field[9];
}

/* Every supervised device's counters read. */
static void
devices_activity_sample (void)
{
  for (unsigned i = 0; i < supervised_count; i++)
    device_activity_sample (&supervised[i].activity);
}

/* Of every supervised device (as last sampled): the earliest last answer
 * - a device with nothing waiting answered just now - and the requests
 * in flight, together.
 */
static double
devices_last_answer (uint64_t *waiting)
{
  double earliest = now ();
  *waiting = 0;
  for (unsigned i = 0; i < supervised_count; i++) {
    const struct device_activity *activity = &supervised[i].activity;
    if (activity->last_answer < earliest)
      earliest = activity->last_answer;
    *waiting += activity->waiting;
  }
  return earliest;
}

/* Wait up to seconds, or until a signal or a notice of the driver (for
 * a supervised device watched) comes: signals are blocked but here
 * (none: the mask with them unblocked), so one that comes while the
 * supervisor acts is acted on at the next wait, never lost.
 */
static void
wait_for (double seconds, const sigset_t *none)
{
  struct pollfd notices[SUPERVISED_MAX];
  for (unsigned i = 0; i < supervised_count; i++)
    notices[i] = (struct pollfd) {
      .fd = supervised[i].watch ? nbd_watch_fd (supervised[i].watch) : -1,
      .events = POLLIN,
    };
  struct timespec span = { .tv_sec = (time_t) seconds,
                           .tv_nsec = (long) ((seconds - (time_t) seconds)
                                              * 1e9) };
  ppoll (notices, supervised_count, &span, none);
}

/* The server runs (it has not exited; its status is left to waitpid). */
static bool
server_alive (pid_t pid)
{
  siginfo_t info = { .si_pid = 0 };
  return waitid (P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0
    && info.si_pid == 0;
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

/* While a standby is made ready (standby_making), its memory is
 * faulted in from the free memory the server's writes need too: on a
 * small machine that starved the server (seen: a 256 MiB guest, the
 * device answered nothing for 112 s).  So the device is watched
 * meanwhile, and a standby whose making leaves the server's requests
 * unanswered for standby_starve_s (half the request timeout: before
 * they time out) is given up (standby_starved says so).
 *
 * A starved server may answer, too: with its memory short it refuses
 * writes ("not ready": its reserve keeper finds nothing to make ready),
 * and every refusal is an answer to the device's counters (seen: a 384
 * MiB guest under 2.25x its RAM, zstd: a standby's `ready` unanswered
 * for 64 s while the server refused writes for 38 s and the workload
 * made no progress, until the full-device watch had a process killed).
 * So a write the server refused while the standby was made (io_stat's
 * failed_writes in the stats file the swap tool has it write, each
 * second) gives the standby up too.  A full device's refusals count as
 * well: a standby's memory would come out of the same starved machine.
 */
static bool standby_making, standby_starved;
static double standby_starve_s;
static char server_stats_path[4096];    /* DIR/stats */
static int64_t making_failed_writes;    /* at the making's start; -1: the
                                           file could not be read */

/* The serving server's failed writes so far, from its stats file's
 * io_stat line (failed_reads failed_writes invalid_io notify_free), or
 * -1 when it cannot be read.  Reads into the stack: the supervisor
 * allocates nothing once started.
 */
static int64_t
server_failed_writes (void)
{
  char text[1024];
  if (small_file_read (server_stats_path, O_NOFOLLOW, text, sizeof text) <= 0)
    return -1;
  const char *line = strstr (text, "\nio_stat ");
  if (!line)
    return -1;
  char *end;
  strtoull (line + strlen ("\nio_stat "), &end, 10);
  const char *field = end;
  long long failed = strtoll (field, &end, 10);
  return end == field || failed < 0 ? -1 : failed;
}

/* Writes the server refused since the making began (0: none, or not
 * known).
 */
static int64_t
making_refusals (void)
{
  if (making_failed_writes < 0)
    return 0;
  int64_t failed = server_failed_writes ();
  return failed > making_failed_writes ? failed - making_failed_writes : 0;
}

/* A device has requests waiting and has answered none of them for
 * standby_starve_s (sampled now).
 */
static bool
device_starved (void)
{
  devices_activity_sample ();
  uint64_t waiting;
  return now () - devices_last_answer (&waiting) > standby_starve_s
    && waiting;
}

static bool
server_starved (void)
{
  if (standby_making && (device_starved () || making_refusals () > 0))
    standby_starved = true;
  return standby_making && standby_starved;
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

/* Children stopped but not reaped yet (stuck exiting, in the kernel's
 * reclaim say): reaped later, so that no wait holds the supervisor up.
 */
#define LEFTOVERS_MAX 8
static pid_t leftovers[LEFTOVERS_MAX];

static void
leftovers_reap (void)
{
  for (int i = 0; i < LEFTOVERS_MAX; i++)
    if (leftovers[i] > 0 && waitpid (leftovers[i], NULL, WNOHANG) != 0)
      leftovers[i] = 0;
}

/* Stop child pid: SIGTERM first if gently (5 s to exit), then SIGKILL
 * and 5 s more; still there, it is reaped later (leftovers_reap).
 */
static void
child_stop (pid_t pid, bool gently)
{
  kill (pid, gently ? SIGTERM : SIGKILL);
  for (int waited = 0; waited < 1000; waited++) {
    if (waitpid (pid, NULL, WNOHANG) != 0)
      return;
    if (waited == 500 && gently)
      kill (pid, SIGKILL);
    usleep (10000);
  }
  for (int i = 0; i < LEFTOVERS_MAX; i++)
    if (leftovers[i] <= 0) {
      leftovers[i] = pid;
      return;
    }
}

/* Start a server (argv: server_argv's, for suffix ""; the standby's,
 * for ".standby"); wait for its pid file DIR/pid<suffix> and socket
 * DIR/sock<suffix>.  Its pid, or -1 (the server exited, or wrote
 * neither in 60 s).
 */
static pid_t
server_start (const char *dir, char **argv, const char *suffix,
              pid_t watched)
{
  char pid_path[4096], sock_path[4096];
  snprintf (pid_path, sizeof pid_path, "%s/pid%s", dir, suffix);
  snprintf (sock_path, sizeof sock_path, "%s/sock%s", dir, suffix);
  const char *role = *suffix ? "standby" : "server";
  unlink (pid_path);
  unlink (sock_path);
  int child_end, our_end = supervise_log_pipe (&child_end);
  double started = now ();
  pid_t pid = fork ();
  if (pid == 0) {
    sigset_t none;
    sigemptyset (&none);
    sigprocmask (SIG_SETMASK, &none, NULL);
    /* Its output is a pipe that dies with the supervisor: a server that
     * outlives it must not die of its next message.
     */
    signal (SIGPIPE, SIG_IGN);
    if (child_end >= 0) {
      dup2 (child_end, 1);
      dup2 (child_end, 2);
    }
    execv (argv[0], argv);
    _exit (127);
  }
  if (child_end >= 0)
    close (child_end);
  supervise_log_child (our_end, pid);
  if (pid == -1) {
    supervise_log ("%s: fork: %s", role, strerror (errno));
    return -1;
  }
  supervise_log ("%s: pid %d started, waiting for its socket", role,
                 (int) pid);
  for (int i = 0; i < 6000 && (watched <= 0 || server_alive (watched))
         && !server_starved (); i++) {
    struct stat st;
    if (stat (pid_path, &st) == 0 && st.st_size > 0
        && stat (sock_path, &st) == 0) {
      supervise_log ("%s: pid %d listens after %.3f s", role, (int) pid,
                     now () - started);
      return pid;
    }
    int status;
    if (waitpid (pid, &status, WNOHANG) == pid) {
      supervise_log ("%s: pid %d %s %d before it listened (%.3f s)", role,
                     (int) pid, WIFSIGNALED (status) ? "killed by signal"
                     : "exited with status", WIFSIGNALED (status)
                     ? WTERMSIG (status) : WEXITSTATUS (status),
                     now () - started);
      return -1;
    }
    if (i % 25 == 0)
      devices_activity_sample ();
    if (i > 0 && i % 500 == 0)
      supervise_log ("%s: pid %d has no socket yet after %.3f s", role,
                     (int) pid, now () - started);
    usleep (10000);
  }
  supervise_log ("%s: pid %d stopped: no socket in %.3f s%s", role,
                 (int) pid, now () - started,
                 watched > 0 && !server_alive (watched)
                 ? " (the server it stood by for is gone)" : "");
  child_stop (pid, false);
  return -1;
}

/* The command line of a server: NBDKIT, --unix DIR/sock<suffix>
 * --pidfile DIR/pid<suffix>, the rest of nbdkit_argv, and for a standby
 * standby=DIR/<channel>.  Made once, at the start (NULL: no memory).
 */
static char **
server_argv_make (const char *dir, char **nbdkit_argv, const char *suffix,
                  const char *channel)
{
  int count = 0;
  while (nbdkit_argv[count])
    count++;
  char **argv = calloc (count + 6, sizeof *argv);
  if (!argv
      || asprintf (&argv[2], "%s/sock%s", dir, suffix) == -1
      || asprintf (&argv[4], "%s/pid%s", dir, suffix) == -1
      || (channel
          && asprintf (&argv[count + 4], "standby=%s/%s", dir, channel) == -1))
    return NULL;
  argv[0] = nbdkit_argv[0];
  argv[1] = "--unix";
  argv[3] = "--pidfile";
  for (int i = 1; i < count; i++)
    argv[i + 4] = nbdkit_argv[i];
  return argv;
}

/* Send line to the server's socket DIR/name and read its one-line reply
 * into reply[] (without the newline), waiting timeout_s at most, and no
 * longer than the process watched lives (if > 0: the server, which the
 * supervisor must not stop watching for long).  true if a reply came.
 */
static bool
ask (const char *dir, const char *name, const char *line, char *reply,
     size_t size, unsigned timeout_s, pid_t watched)
{
  struct sockaddr_un address = { .sun_family = AF_UNIX };
  snprintf (address.sun_path, sizeof address.sun_path, "%s/%s", dir, name);
  int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return false;
  struct timeval timeout = { .tv_sec = timeout_s };
  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  size_t used = 0;
  bool answered = false, sent = false;
  double asked = now (), deadline = asked + timeout_s, next_note = asked + 5;
  /* The question without its newline, for the log. */
  int question = (int) strcspn (line, "\n");
  if (connect (fd, (struct sockaddr *) &address, sizeof address) == 0
      && write (fd, line, strlen (line)) == (ssize_t) strlen (line)) {
    sent = true;
    while (used < size - 1 && now () < deadline
           && (watched <= 0 || server_alive (watched)) && !server_starved ()) {
      if (now () >= next_note) {
        supervise_log ("%s: still no answer to '%.*s' after %.1f s (%u s "
                       "at most)", name, question, line, now () - asked,
                       timeout_s);
        next_note += 5;
      }
      struct pollfd readable = { .fd = fd, .events = POLLIN };
      devices_activity_sample ();
      if (poll (&readable, 1, 100) == 0)
        continue;
      ssize_t r = read (fd, reply + used, 1);
      if (r == -1 && errno == EINTR)
        continue;
      if (r <= 0)
        break;
      if (reply[used] == '\n') {
        answered = true;
        break;
      }
      used++;
    }
  }
  reply[used] = '\0';
  int why_not_sent = errno;
  close (fd);
  if (!sent)
    supervise_log ("%s: '%.*s' could not be asked: %s", name, question,
                   line, strerror (why_not_sent));
  else if (answered)
    supervise_log ("%s: '%.*s' answered after %.3f s: %s", name, question,
                   line, now () - asked, reply);
  else
    supervise_log ("%s: no answer to '%.*s' after %.3f s%s", name, question,
                   line, now () - asked, watched > 0 && !server_alive (watched)
                   ? " (the server is gone)" : standby_starved
                   ? " (given up: the server starved meanwhile)" : "");
  return answered;
}

/* Ask the server on DIR/ctl to hand its device over and exit (the
 * control channel's handover): its held requests are never answered, so
 * the kernel sends them again to the next server - a SIGTERM would have
 * nbdkit answer them with ESHUTDOWN, an I/O error.  true once it said
 * "ok", or exited while asked (a handover whose requests did not finish
 * exits without answering: the next server recovers the device); false
 * if it refused (no region=), could not be asked, or did not answer
 * within HANDOVER_WAIT_S: the caller stops it.
 */
#define HANDOVER_WAIT_S 40
static bool
ask_handover (const char *dir, pid_t server)
{
  char reply[256];
  if (ask (dir, "ctl", "handover\n", reply, sizeof reply, HANDOVER_WAIT_S,
           server))
    return strcmp (reply, "ok") == 0;
  return !server_alive (server);
}

/* The standby's sockets closed (the kernel keeps its own references to
 * those it was given).
 */
static void
standby_sockets_close (struct standby *standby)
{
  if (standby->count)
    for (unsigned i = 0; i < supervised_count; i++)
      nbd_close (standby->socks[i], standby->count);
  standby->count = 0;
}

/* The standby gone: its sockets closed, the process stopped (SIGTERM,
 * SIGKILL after 5 s) unless it has been waited for already (pid 0).
 */
static void
standby_discard (const char *dir, struct standby *standby)
{
  char path[4096];
  snprintf (path, sizeof path, "%s/%s", dir, standby->ready_note);
  unlink (path);
  standby_sockets_close (standby);
  if (standby->pid > 0)
    child_stop (standby->pid, true);
  standby->pid = 0;
}

/* Every standby gone (standby_discard). */
static void
standbys_discard (const char *dir, struct standby *standby_list,
                  unsigned standbys)
{
  for (unsigned k = 0; k < standbys; k++)
    standby_discard (dir, &standby_list[k]);
}

/* standby_prepare's steps: the process started, made ready, connected
 * and its connections' stacks made ready.  false on the first that
 * fails, its answer (if any) in reply.
 */
static bool
standby_make_ready (const char *dir, unsigned connections,
                    struct standby *standby, pid_t server, char *reply,
                    size_t reply_size)
{
  char sock_path[4096];
  snprintf (sock_path, sizeof sock_path, "%s/sock%s", dir, standby->suffix);
  uint64_t size;
  uint16_t flags;
  pid_t pid = server_start (dir, standby->argv, standby->suffix, server);
  if (pid == -1)
    return false;
  standby->pid = pid;
  /* Its first answer comes once it has made everything ready - under
   * memory pressure that took more than the handshake's 10 s (seen in
   * the guest with zstd); the server serves meanwhile.
   */
  if (!ask (dir, standby->channel, "ready\n", reply, reply_size,
            STANDBY_START_TIMEOUT_S, server) || strncmp (reply, "ok", 2) != 0)
    return false;
  double connecting = now ();
  for (unsigned i = 0; i < supervised_count; i++)
    if (nbd_connect (sock_path, supervised[i].export, connections,
                     standby->socks[i], &size, &flags) == -1) {
      supervise_log ("standby: pid %d: its %u connections for %s could not "
                     "be made", (int) pid, connections, supervised[i].path);
      for (unsigned made = 0; made < i; made++)
        nbd_close (standby->socks[made], connections);
      return false;
    }
  supervise_log ("standby: pid %d: %u connections through the handshake "
                 "for each of %u devices in %.3f s", (int) pid, connections,
                 supervised_count, now () - connecting);
  standby->count = connections;
  /* nbdkit starts a connection's workers after its handshake: a moment
   * for them to start, then their stacks made ready.
   */
  usleep (200000);
  return ask (dir, standby->channel, "ready\n", reply, reply_size,
              STANDBY_READY_TIMEOUT_S, server) && strncmp (reply, "ok", 2) == 0;
}

/* A field of /proc/PID/status in KiB (VmRSS:, RssAnon:), -1 if none:
 * read into the stack (the supervisor allocates nothing after its start).
 */
static long
status_field_kib (pid_t pid, const char *field)
{
  char path[64], text[4096];
  snprintf (path, sizeof path, "/proc/%d/status", (int) pid);
  if (small_file_read (path, 0, text, sizeof text) <= 0)
    return -1;
  const char *at = strstr (text, field);
  return at ? strtol (at + strlen (field), NULL, 10) : -1;
}

/* Start a standby and make it ready (see above): true, or false after a
 * line in the log, with none left and the next try due in
 * STANDBY_RETRY_S.
 */
static bool
standby_prepare (const char *dir, unsigned connections,
                 struct standby *standby, pid_t server)
{
  char reply[128] = "";
  /* Its memory is faulted in from the free memory the server's writes
   * need: the server's full-device watch is asked not to take the
   * refusals meanwhile for a full device (an old server without the
   * command refuses it: no matter).
   */
  /* Not while the device is not answering already: a fork then competes
   * with the server for the memory it waits for.
   */
  if (device_starved ()) {
    uint64_t waiting;
    supervise_log ("standby: not made now: the device has answered nothing "
                   "for %.1f s (tried again in %d s)",
                   now () - devices_last_answer (&waiting), STANDBY_RETRY_S);
    standby->next_try = now () + STANDBY_RETRY_S;
    standby_starved = true;
    return false;
  }
  ballast_take ();
  char grace_reply[128];
  ask (dir, "ctl", "grace 60\n", grace_reply, sizeof grace_reply, 5, server);
  snprintf (server_stats_path, sizeof server_stats_path, "%s/stats", dir);
  making_failed_writes = server_failed_writes ();
  standby_making = true;
  standby_starved = false;
  bool ready = standby_make_ready (dir, connections, standby, server,
                                   reply, sizeof reply);
  standby_making = false;
  if (standby_starved) {
    /* Its memory back to the server at once. */
    int64_t refused = making_refusals ();
    if (refused > 0)
      supervise_log ("standby: pid %d given up: the server refused %lld "
                     "writes while it was made ready (memory too short "
                     "for both): SIGKILL", (int) standby->pid,
                     (long long) refused);
    else
      supervise_log ("standby: pid %d given up: the device answered "
                     "nothing for %.1f s while it was made ready (memory "
                     "too short for both): SIGKILL", (int) standby->pid,
                     standby_starve_s);
    if (standby->pid > 0)
      kill (standby->pid, SIGKILL);
  }
  ask (dir, "ctl", "grace 10\n", grace_reply, sizeof grace_reply, 5, server);
  if (ready) {
    note (dir, standby->ready_note, false, "%d\n", (int) standby->pid);
    long resident_kib = status_field_kib (standby->pid, "VmRSS:"),
      anonymous_kib = status_field_kib (standby->pid, "RssAnon:");
    supervise_log ("standby: pid %d ready (resident %.1f MiB, %.1f MiB of "
                   "it its own: what it costs)", (int) standby->pid,
                   resident_kib / 1024.0, anonymous_kib / 1024.0);
    return true;
  }
  supervise_log ("standby: could not be made ready%s%s (tried again in "
                 "%d s)", *reply ? ": " : "", reply, STANDBY_RETRY_S);
  standby_discard (dir, standby);
  standby->next_try = now () + STANDBY_RETRY_S;
  return false;
}

/* The standby takes the device over and the kernel gets its sockets:
 * the standby's pid, now the server's (its socket and pid file renamed
 * to DIR/sock and DIR/pid), or -1 after a line in the log with the
 * standby gone (stopped by SIGTERM, a server that took the region over
 * hands it over cleanly).
 */
static pid_t
standby_take_over (const char *dir, struct standby *standby,
                   unsigned timeout)
{
  char reply[256] = "", from[4096], to[4096];
  snprintf (from, sizeof from, "%s/%s", dir, standby->ready_note);
  unlink (from);
  if (!ask (dir, standby->channel, "takeover\n", reply, sizeof reply,
            TAKEOVER_TIMEOUT_S, 0) || strncmp (reply, "ok", 2) != 0) {
    supervise_log ("standby: pid %d did not take the device over: %s",
                   (int) standby->pid, *reply ? reply : "no answer");
    standby_discard (dir, standby);
    return -1;
  }
  ballast_give_back ();
  double giving = now ();
  for (unsigned i = 0; i < supervised_count; i++)
    if (nbd_attach_sockets (supervised[i].path, standby->socks[i],
                            standby->count, true, 0, 0, timeout,
                            4096) == -1) {
      /* The devices given the standby's sockets before lose them with
       * it: a server is started and every device reconnected.
       */
      supervise_log ("standby: pid %d took the device over, but %s could "
                     "not be given its sockets", (int) standby->pid,
                     supervised[i].path);
      standby_discard (dir, standby);
      return -1;
    }
  supervise_log ("standby: pid %d: %u device%s given %u sockets each in "
                 "%.3f s", (int) standby->pid, supervised_count,
                 supervised_count == 1 ? "" : "s", standby->count,
                 now () - giving);
  standby_sockets_close (standby);
  pid_t pid = standby->pid;
  standby->pid = 0;
  const char *const names[] = { "sock", "pid" };
  for (int i = 0; i < 2; i++) {
    snprintf (from, sizeof from, "%s/%s%s", dir, names[i], standby->suffix);
    snprintf (to, sizeof to, "%s/%s", dir, names[i]);
    rename (from, to);
  }
  return pid;
}

/* The driver's lines in the kernel's log (kernel-log.h): opened at the
 * start, for the device it attaches.
 */
static struct kernel_log kernel_log = { .fd = -1 };

/* A restart whose downtime is not known yet (see above): it is when the
 * driver has sent the old requests again, which it does within the
 * request timeout and a second of the old server's end.
 */
struct restart_report {
  bool pending;
  unsigned number;
  const char *why;
  bool by_standby;
  double stall_from;            /* the device's last answer before */
  double exited;                /* the old server's end, as seen */
  double reconnected;
  uint64_t waiting;             /* requests in flight at the end */
  double due;                   /* when the resends are all done */
};

/* The restart's line, with the downtime, and the new server told it
 * (for its stats and metrics): once report->due has passed, or before
 * the next restart.  The downtime ends at the reconnect, or at the last
 * request sent again, if later; without the kernel's log, at the bound
 * of the request timeout and a second after the end when requests were
 * waiting.
 */
static void
restart_report_finish (struct restart_report *report, const char *dir,
                       unsigned request_timeout, pid_t server)
{
  if (!report->pending)
    return;
  report->pending = false;
  unsigned resends = 0;
  double last_resend = 0;
  for (unsigned i = 0; i < supervised_count; i++) {
    unsigned count;
    double last = kernel_log_resends (&kernel_log, i, report->due, &count);
    resends += count;
    if (last > last_resend)
      last_resend = last;
  }
  double answered = report->reconnected;
  char how[160];
  if (!report->waiting)
    snprintf (how, sizeof how, "no request waiting");
  else if (kernel_log.fd >= 0) {
    if (last_resend > answered)
      answered = last_resend;
    snprintf (how, sizeof how, "%llu requests waiting, %u sent again by the "
              "driver%s", (unsigned long long) report->waiting, resends,
              resends ? ", the last" : "");
    if (resends)
      snprintf (how + strlen (how), sizeof how - strlen (how),
                " %.3f s after the end", last_resend - report->exited);
  }
  else {
    if (report->exited + request_timeout + 1 > answered)
      answered = report->exited + request_timeout + 1;
    snprintf (how, sizeof how, "%llu requests waiting, sent again within "
              "the request timeout and a second: the kernel's log cannot "
              "say when", (unsigned long long) report->waiting);
  }
  double downtime = answered - report->stall_from;
  supervise_log ("restart %u (%s): %s%s reconnected, down %.3f s%s (the "
                 "device's last answer %.3f s before the server's end; "
                 "reconnected %.3f s after it; %s)", report->number,
                 report->why, supervised[0].path,
                 supervised_count > 1 ? " and the server's other devices"
                 : "", downtime,
                 report->by_standby ? ", taken over by the standby" : "",
                 report->exited - report->stall_from,
                 report->reconnected - report->exited, how);
  char line[64], reply[128];
  snprintf (line, sizeof line, "downtime %llu\n",
            (unsigned long long) (downtime * 1000 + 0.5));
  ask (dir, "ctl", line, reply, sizeof reply, 5, server);
}

/* The device's request timeout outlives a supervisor that is killed:
 * a request the server then leaves unanswered that long drops its
 * connection for good (nothing reconnects it), and after the
 * dead-connection timeout the kernel fails the device's requests.  So a
 * guardian process, forked at the attach, takes the request timeout
 * away (a stalled server is then waited for, as without a supervisor)
 * as soon as the supervisor is gone, says so in the kernel's log, and
 * exits.  It has the supervisor's code and nothing else (no thread, no
 * descriptor but stderr): it calls only the netlink code and no lock
 * the supervisor's threads could have held at the fork.  Its pages are
 * the supervisor's, shared and locked there, until it acts.
 */
static pid_t guardian;

/* On the supervisor's own ends: the guardian goes first, so that it
 * never acts on a device a later supervisor attached.
 */
static void
guardian_stop (void)
{
  if (guardian > 0) {
    kill (guardian, SIGKILL);
    waitpid (guardian, NULL, 0);
    guardian = 0;
  }
}

static void
guardian_start (void)
{
  pid_t supervisor = getpid ();
  sigset_t term;
  sigemptyset (&term);
  sigaddset (&term, SIGTERM);
  pid_t pid = fork ();
  if (pid != 0) {
    if (pid == -1)
      supervise_log ("guardian: fork: %s: a killed supervisor leaves the "
                     "devices their request timeout", strerror (errno));
    else
      supervise_log ("guardian: pid %d takes the devices' request timeout "
                     "away if the supervisor is killed", (int) pid);
    guardian = pid;
    return;
  }
  close_range (3, ~0u, 0);
  sigprocmask (SIG_BLOCK, &term, NULL);
  prctl (PR_SET_PDEATHSIG, SIGTERM);
  int signal_number;
  while (getppid () == supervisor)
    sigwait (&term, &signal_number);
  /* Its messages (netlink's) to the kernel's log: its stderr was the
   * supervisor's log pipe.
   */
  int kernel = open ("/dev/kmsg", O_WRONLY);
  if (kernel >= 0)
    dup2 (kernel, 2);
  for (unsigned i = 0; i < supervised_count; i++) {
    const char *device = supervised[i].path;
    bool removed = nbd_set_request_timeout (device, 0) == 0;
    if (kernel >= 0)
      dprintf (kernel, "nbdkit-zramctl: the supervisor of %s (pid %d) is "
               "gone: %s\n", device, (int) supervisor, removed
               ? "its request timeout removed, the server is waited for"
               : "its request timeout could not be removed: a request the "
               "server leaves unanswered that long drops its connection");
  }
  _exit (0);
}

int
run_supervise (int argc, char **argv)
{
  unsigned standbys = 0;
  bool usage = argc < 4;
  if (!usage)
    supervised[supervised_count++] = (struct supervised) {
      .path = argv[1], .export = "",
    };
  unsigned request_timeout = REQUEST_TIMEOUT_DEFAULT_S;
  int dashes = 4;
  for (; !usage && dashes < argc && strcmp (argv[dashes], "--") != 0;
       dashes++) {
    char *end;
    if (strcmp (argv[dashes], "--standby") == 0)
      standbys = standbys ? standbys : 1;
    else if (strcmp (argv[dashes], "--standbys") == 0 && dashes + 1 < argc) {
      errno = 0;
      unsigned long count = strtoul (argv[++dashes], &end, 10);
      if (errno || *end || end == argv[dashes] || count > STANDBYS_MAX) {
        fprintf (stderr, "nbdkit-zramctl: supervise: --standbys: '%s' is "
                 "not a number from 0 to %d\n", argv[dashes], STANDBYS_MAX);
        return EXIT_FAILURE;
      }
      standbys = count;
    }
    else if (strcmp (argv[dashes], "--request-timeout") == 0
             && dashes + 1 < argc) {
      errno = 0;
      unsigned long seconds = strtoul (argv[++dashes], &end, 10);
      if (errno || *end || end == argv[dashes] || seconds == 0
          || seconds > 3600) {
        fprintf (stderr, "nbdkit-zramctl: supervise: --request-timeout: "
                 "'%s' is not a number of seconds from 1 to 3600\n",
                 argv[dashes]);
        return EXIT_FAILURE;
      }
      request_timeout = seconds;
    }
    else if (strcmp (argv[dashes], "--device") == 0 && dashes + 1 < argc) {
      char *path = argv[++dashes], *equals = strchr (path, '=');
      if (!equals || equals == path || !equals[1]
          || supervised_count == SUPERVISED_MAX) {
        fprintf (stderr, "nbdkit-zramctl: supervise: --device: '%s' is not "
                 "/dev/nbdN=EXPORT (at most %d devices)\n", path,
                 SUPERVISED_MAX - 1);
        return EXIT_FAILURE;
      }
      *equals = '\0';
      supervised[supervised_count++] = (struct supervised) {
        .path = path, .export = equals + 1,
      };
    }
    else
      usage = true;
  }
  if (usage || dashes + 1 >= argc) {
    fprintf (stderr, "usage: nbdkit-zramctl supervise DIR DEVICE CONNECTIONS "
             "DEAD_CONN_TIMEOUT [--standby | --standbys N] [--request-timeout "
             "SECONDS] [--device /dev/nbdN=EXPORT]... -- "
             "NBDKIT ARGUMENT...\n");
    return EXIT_FAILURE;
  }
  const char *dir = argv[0], *device = argv[1];
  unsigned connections = atoi (argv[2]), timeout = atoi (argv[3]);
  char **server_argv = server_argv_make (dir, argv + dashes + 1, "", NULL);
  struct standby standby_list[STANDBYS_MAX] = { { .pid = 0 } };
  for (unsigned k = 0; k < standbys; k++) {
    struct standby *standby = &standby_list[k];
    char number[8] = "";
    if (k > 0)
      snprintf (number, sizeof number, "%u", k + 1);
    snprintf (standby->suffix, sizeof standby->suffix, ".standby%s", number);
    snprintf (standby->channel, sizeof standby->channel, "standby%s.sock",
              number);
    snprintf (standby->ready_note, sizeof standby->ready_note,
              "standby%s.ready", number);
    standby->argv = server_argv_make (dir, argv + dashes + 1,
                                      standby->suffix, standby->channel);
    if (!standby->argv)
      server_argv = NULL;
  }
  if (!server_argv) {
    perror ("nbdkit-zramctl: supervise");
    return EXIT_FAILURE;
  }

  /* Into the background: the swap tool goes on once DIR/attached is
   * there.
   */
  pid_t child = fork ();
  if (child == -1)
    return EXIT_FAILURE;
  if (child > 0)
    return EXIT_SUCCESS;
  setsid ();
  /* Its messages and the servers' go to DIR/supervisor.log, through
   * memory that is locked (supervise-log.h); its own stderr (what
   * nbd-attach.c says) through a pipe like a server's.
   */
  int null = open ("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2 (null, 0);
    dup2 (null, 1);
    dup2 (null, 2);
    close (null);
  }
  /* An IO flusher (its reclaim never writes pages out: no swap-out to
   * the device that is down) out of the OOM killer's reach, and so is
   * every server it starts from its first instruction - both are
   * inherited across fork and exec, and by the log's thread, started
   * after.  Seen without: a server started while the device was down
   * and memory full waited in the kernel's reclaim (__swap_writepage)
   * before it could set them itself.
   */
  int flusher_error = prctl (PR_SET_IO_FLUSHER, 1, 0, 0, 0) == -1 ? errno : 0;
  if (!supervise_log_open (dir))
    note (dir, "supervisor.err", false, "supervisor.log: %s: the "
          "supervisor's and the servers' messages are lost\n",
          strerror (errno));
  else {
    int child_end, our_end = supervise_log_pipe (&child_end);
    if (our_end >= 0) {
      dup2 (child_end, 2);
      close (child_end);
      supervise_log_child (our_end, getpid ());
    }
  }
  if (flusher_error)
    supervise_log ("PR_SET_IO_FLUSHER: %s", strerror (flusher_error));
  if (mlockall (MCL_CURRENT | MCL_FUTURE) == -1)
    supervise_log ("mlockall: %s: its pages may be swapped out",
                   strerror (errno));
  if (!ballast_start ())
    supervise_log ("ballast: no thread: the reconnect's kernel memory is not "
                   "kept free");
  int kmsg = open ("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (kmsg >= 0)
    lseek (kmsg, 0, SEEK_END);
  const char *names[SUPERVISED_MAX];
  for (unsigned i = 0; i < supervised_count; i++)
    names[i] = device_kernel_name (supervised[i].path);
  kernel_log_init (&kernel_log, kmsg, names, supervised_count);
  if (kmsg == -1)
    supervise_log ("/dev/kmsg: %s: a restart's downtime is the bound of the "
                   "request timeout", strerror (errno));
  int oom = open ("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    if (write (oom, "-1000", 5) != 5)
      supervise_log ("oom_score_adj: %s", strerror (errno));
    close (oom);
  }
  supervise_log ("pid %d supervises %s (%u connections, dead-connection "
                 "timeout %u s, %u standby%s kept ready)", (int) getpid (),
                 device, connections, timeout, standbys,
                 standbys == 1 ? "" : "s");
  for (unsigned i = 1; i < supervised_count; i++)
    supervise_log ("and %s, the server's export '%s'", supervised[i].path,
                   supervised[i].export);
  note (dir, "supervisor.pid", false, "%d\n", (int) getpid ());
  sigset_t blocked, none;
  sigemptyset (&blocked);
  sigaddset (&blocked, SIGHUP);
  sigaddset (&blocked, SIGTERM);
  sigaddset (&blocked, SIGINT);
  sigaddset (&blocked, SIGCHLD);
  sigprocmask (SIG_BLOCK, &blocked, &none);
  /* Blocked but while it waits (sigsuspend): a signal that comes while
   * it acts is acted on at the next wait, never lost.
   */
  struct sigaction action = { .sa_handler = on_signal };
  sigaction (SIGHUP, &action, NULL);
  sigaction (SIGTERM, &action, NULL);
  sigaction (SIGINT, &action, NULL);
  sigaction (SIGCHLD, &action, NULL);
  /* A server or standby that goes while it is written to must not take
   * the supervisor with it (its children get the default back).
   */
  signal (SIGPIPE, SIG_IGN);

  char sock_path[4096];
  snprintf (sock_path, sizeof sock_path, "%s/sock", dir);
  pid_t server = server_start (dir, server_argv, "", 0);
  for (unsigned i = 0; i < supervised_count; i++)
    if (server == -1
        || nbd_attach (supervised[i].path, sock_path, supervised[i].export,
                       false, connections, timeout, 4096) == -1) {
      note (dir, "supervisor.err", false, "the server did not start, or %s "
            "could not be attached to it\n", supervised[i].path);
      for (unsigned attached = 0; attached < i; attached++)
        nbd_detach_quietly (supervised[attached].path);
      if (server > 0) {
        kill (server, SIGTERM);
        waitpid (server, NULL, 0);
      }
      supervise_log_flush ();
      return EXIT_FAILURE;
    }
  /* The region file (on /run, a tmpfs: swappable) is what the next
   * server reads first: kept in memory, mapped and locked here, or a
   * server starting while the device is down would wait for its page to
   * come back from the device.
   */
  char region_path[4096];
  snprintf (region_path, sizeof region_path, "%s/region", dir);
  int region_fd = open (region_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (region_fd >= 0) {
    void *page = mmap (NULL, 4096, PROT_READ, MAP_SHARED, region_fd, 0);
    if (page == MAP_FAILED || mlock (page, 4096) == -1)
      supervise_log ("cannot lock %s in memory: %s\n",
            region_path, strerror (errno));
    close (region_fd);
  }
  for (unsigned i = 0; i < supervised_count; i++)
    note (dir, "attached", i > 0, "%s\n", supervised[i].path);
  /* The request timeout, from now on (see above). */
  for (unsigned i = 0; i < supervised_count; i++)
    if (nbd_set_request_timeout (supervised[i].path, request_timeout) == 0)
      supervise_log ("%s attached to server pid %d, request timeout %u s",
                     supervised[i].path, (int) server, request_timeout);
    else
      supervise_log ("%s attached to server pid %d, but its request timeout "
                     "could not be set: a request the server never answers "
                     "(it crashed) waits for good", supervised[i].path,
                     (int) server);
  /* A live server's request that met the request timeout (see above):
   * the driver's link-dead notice says so.  Its notices for a server
   * that went are the restart's business: ignored until
   * QUIET_AFTER_RESTART_S after.
   */
  guardian_start ();
  /* NBDKIT_ZRAM_SUPERVISE_NO_NOTICE: the notices not watched, as when
   * they never come - for the tests of the kernel log's way.
   */
  if (getenv ("NBDKIT_ZRAM_SUPERVISE_NO_NOTICE"))
    supervise_log ("the driver's notices not watched "
                   "(NBDKIT_ZRAM_SUPERVISE_NO_NOTICE): a live server's "
                   "timed-out request is known from the kernel's log alone");
  else
    for (unsigned i = 0; i < supervised_count; i++)
      if (!(supervised[i].watch = nbd_watch_open (supervised[i].path)))
        supervise_log ("cannot watch the driver's notices for %s: a live "
                       "server whose request timed out is known from the "
                       "kernel's log alone%s", supervised[i].path,
                       kernel_log.fd >= 0 ? "" : ", and there is none: it "
                       "is not restarted, and the request waits for the "
                       "dead-connection timeout");
  double quiet_until = 0, restart_began = 0;
  unsigned restarts = 0;
  for (unsigned i = 0; i < supervised_count; i++)
    device_activity_init (&supervised[i].activity, supervised[i].path);
  standby_starve_s = request_timeout / 2.0;
  struct restart_report report = { .pending = false };
  unsigned restart_waits = 0;
  double restart_not_before = 0;
  for (;;) {
    /* Wait for the server's end or a signal. */
    int status;
    double stopped = 0, next_exit_note = 5, timed_out_at = 0;
    bool terminated = false, timed_out = false, link_died = false;
    while (waitpid (server, &status, WNOHANG) != server) {
      devices_activity_sample ();
      if (report.pending && now () >= report.due)
        restart_report_finish (&report, dir, request_timeout, server);
      /* For each device, the driver's notice or its line in the
       * kernel's log (see kernel-log.h: the notice may never come).
       * Inside a restart's quiet window the notices are the old
       * connection's, but a line logged after the driver took the new
       * sockets is the new one's.  Every device's notices are read each
       * round, acted on or not: one left unread keeps the wait below
       * from waiting.
       */
      for (unsigned i = 0; i < supervised_count; i++) {
        const char *path = supervised[i].path;
        bool notice = supervised[i].watch
          && nbd_watch_link_dead (supervised[i].watch)
          && now () > quiet_until;
        enum kernel_log_dead logged
          = kernel_log_link_dead (&kernel_log, i, quiet_until, restart_began);
        if (stopped || (!notice && logged == KERNEL_LOG_DEAD_OLD))
          continue;
        /* A server that is going ends this wait at the next round: only
         * a live one's is news.  One that is being stopped or restarted
         * is reaped before anything is sent again anyway.
         */
        usleep (100000);
        if (server_alive (server) && logged == KERNEL_LOG_DEAD_NEW) {
          /* The requests it was given may be at work in it, as below. */
          supervise_log ("the connection restart %u gave %s died at once "
                         "(the kernel's log: dead after it reconnected): "
                         "server pid %d is killed and the devices "
                         "reconnected again", restarts, path,
                         (int) server);
          kill (server, SIGKILL);
          stopped = now ();
          link_died = terminated = true;
        }
        else if (server_alive (server)) {
          supervise_log ("the driver marked a connection of %s to the live "
                         "server pid %d dead (%s): a request met the %u s "
                         "request timeout, and its first copy may still be "
                         "at work in the server: the server is killed "
                         "before the request is sent again", path,
                         (int) server, notice ? "its notice"
                         : "the kernel's log; its notice did not come",
                         request_timeout);
          kill (server, SIGKILL);
          stopped = timed_out_at = now ();
          timed_out = terminated = true;
        }
      }
      leftovers_reap ();
      for (unsigned k = 0; k < standbys; k++) {
        struct standby *standby = &standby_list[k];
        if (standby->pid > 0
            && waitpid (standby->pid, NULL, WNOHANG) == standby->pid) {
          /* A standby's end is a crash of its own: the next one at once
           * (and STANDBY_RETRY_S after one that cannot be made ready).
           */
          supervise_log ("standby: pid %d exited: a new one is made ready",
                         (int) standby->pid);
          standby->pid = 0;
          standby_discard (dir, standby);
          standby->next_try = now ();
        }
      }
      /* Not while the old server's requests wait to be sent again after
       * a restart (next_try, set then): a standby starting meanwhile
       * faults its memory in while those requests hold pages under
       * writeback, and the new server's reserve, refilled from the same
       * free memory, ran dry (seen with zstd in the guest: writes
       * refused, a process killed).
       */
      /* One at a time, the server watched between them. */
      for (unsigned k = 0; k < standbys && !stop_asked && !restart_asked
             && !stopped; k++)
        if (!standby_list[k].pid && now () >= standby_list[k].next_try) {
          standby_prepare (dir, connections, &standby_list[k], server);
          break;
        }
      if (stop_asked && !terminated) {
        supervise_log ("stop asked: server pid %d sent SIGTERM",
                       (int) server);
        stopped = stopped ? stopped : now ();
        standbys_discard (dir, standby_list, standbys);
        kill (server, SIGTERM);
        terminated = true;
      }
      else if (restart_asked && !stopped && now () >= restart_not_before) {
        supervise_log ("restart asked: server pid %d serves on while a "
                       "standby is made ready", (int) server);
        /* The binary on disk now takes over: a new standby, made ready
         * while this server still serves (the others, of the old binary,
         * go: the rest are made after the restart).  One that cannot be
         * made without starving the server: the restart waits (a server
         * started after the old one's end would need the same memory,
         * with the device down), RESTART_WAITS_MAX times, then is not
         * done - a planned restart must cost the server nothing.
         */
        bool go = true;
        if (standbys) {
          standbys_discard (dir, standby_list, standbys);
          if (!standby_prepare (dir, connections, &standby_list[0], server)
              && standby_starved) {
            go = false;
            if (++restart_waits < RESTART_WAITS_MAX) {
              restart_not_before = now () + STANDBY_RETRY_S;
              supervise_log ("restart asked: waits %d s: no standby could "
                             "be made ready without starving the server "
                             "(try %u of %u)", STANDBY_RETRY_S,
                             restart_waits, RESTART_WAITS_MAX);
            }
            else {
              supervise_log ("restart %u: not done: no standby could be "
                             "made ready without starving the server in "
                             "%u tries; server pid %d serves on",
                             restarts + 1, RESTART_WAITS_MAX, (int) server);
              restart_asked = 0;
              restart_waits = 0;
              restart_not_before = 0;
            }
          }
        }
        if (go) {
          restart_waits = 0;
          restart_not_before = 0;
          stopped = now ();
          if (!ask_handover (dir, server)) {
            supervise_log ("server pid %d did not hand over: SIGTERM",
                           (int) server);
            kill (server, SIGTERM);
            terminated = true;
          }
        }
      }
      else if (restart_asked && stopped && !terminated
               && now () - stopped > HANDOVER_WAIT_S) {
        supervise_log ("server pid %d has not exited %d s after it handed "
                       "over: SIGTERM", (int) server, HANDOVER_WAIT_S);
        kill (server, SIGTERM);
        terminated = true;
      }
      else if (stopped && now () - stopped >= next_exit_note) {
        supervise_log ("server pid %d has not exited %.1f s after it was "
                       "asked to", (int) server, now () - stopped);
        next_exit_note += 5;
      }
      /* Woken by a signal, or each second (the 40 s above). */
      wait_for (STALL_SAMPLE_S, &none);
    }
    if (!stopped)
      stopped = now ();
    /* The last restart's line first (its server is the one that ended). */
    restart_report_finish (&report, dir, request_timeout, server);
    /* Requests waiting now wait for the request timeout: sent before the
     * end, they are sent again at most that long (and the driver's
     * second) after it.
     */
    devices_activity_sample ();
    uint64_t waiting;
    double exited = now (), stall_from = devices_last_answer (&waiting);
    /* A timed-out request is back in the driver's queue, which the
     * device's in-flight counter does not count: it waited the whole
     * request timeout before the notice, whatever the counter says.
     */
    if (timed_out && timed_out_at - request_timeout < stall_from)
      stall_from = timed_out_at - request_timeout;
    supervise_log ("server pid %d %s %d, %.3f s after %s", (int) server,
                   WIFSIGNALED (status) ? "killed by signal"
                   : "exited with status", WIFSIGNALED (status)
                   ? WTERMSIG (status) : WEXITSTATUS (status),
                   now () - stopped, restart_asked || stop_asked
                   ? "it was asked to" : "the supervisor saw it");
    if (stop_asked) {
      /* Stopped for good: the device it attached goes too (swap off has
       * detached it already; an interrupted swap on may not have), and
       * the standby (a stop that came with the server's exit skipped
       * the loop that discards it).
       */
      standbys_discard (dir, standby_list, standbys);
      for (unsigned i = 0; i < supervised_count; i++)
        nbd_detach_quietly (supervised[i].path);
      guardian_stop ();
      supervise_log_flush ();
      return EXIT_SUCCESS;
    }
    const char *why = timed_out ? "a request timed out"
      : link_died ? "its new connection died"
      : restart_asked ? "restart asked"
      : WIFSIGNALED (status) ? strsignal (WTERMSIG (status)) : "exited";
    bool asked = restart_asked;
    restart_asked = 0;
    /* A server that exits by itself with status 0 was stopped by
     * someone else on purpose: not restarted.
     */
    if (!asked && WIFEXITED (status) && WEXITSTATUS (status) == 0) {
      supervise_log ("the server exited (status 0): "
            "not restarted\n");
      standbys_discard (dir, standby_list, standbys);
      guardian_stop ();
      supervise_log_flush ();
      return EXIT_SUCCESS;
    }
    /* Tried again each second until it serves and the device is
     * reconnected: a start can fail for a reason that passes (memory
     * short, its address space layout: the server's message says), and
     * the device waits up to its dead-connection timeout.
     */
    struct standby *ready = NULL;
    for (unsigned k = 0; k < standbys && !ready; k++)
      if (standby_list[k].pid > 0)
        ready = &standby_list[k];
    supervise_log ("restart %u (%s) begins: %s", restarts + 1, why, ready
                   ? "a standby takes the device over"
                   : "no standby ready: a server is started");
    server = ready ? standby_take_over (dir, ready, timeout) : -1;
    bool by_standby = server != -1;
    for (unsigned attempt = 1; server == -1; attempt++) {
      if (attempt == 1)
        ballast_give_back ();
      server = server_start (dir, server_argv, "", 0);
      /* Every device reconnected, or the attempt fails (those that were
       * lose this server with it, and are reconnected at the next).
       */
      const char *failed = server == -1 ? "" : NULL;
      for (unsigned i = 0; i < supervised_count && !failed; i++)
        if (nbd_attach (supervised[i].path, sock_path, supervised[i].export,
                        true, connections, timeout, 4096) == -1)
          failed = supervised[i].path;
      if (!failed)
        break;
      supervise_log ("restart %u (%s), attempt %u: %s%s%s", restarts + 1,
                     why, attempt, *failed ? "" : "the server did not start "
                     "again", failed, *failed ? " could not be reconnected"
                     : "");
      if (server > 0)
        child_stop (server, false);
      server = -1;
      wait_for (1, &none);   /* swap off meanwhile stops the tries */
      if (stop_asked || now () - stopped > timeout) {
        supervise_log ("restart %u: given up after %u "
              "attempts (%s)\n", restarts + 1, attempt, stop_asked
              ? "stopped" : "the device's dead-connection timeout passed");
        for (unsigned i = 0; i < supervised_count; i++)
          nbd_detach_quietly (supervised[i].path);
        guardian_stop ();
        supervise_log_flush ();
        return EXIT_FAILURE;
      }
    }
    restarts++;
    report = (struct restart_report) {
      .pending = true, .number = restarts, .why = why,
      .by_standby = by_standby, .stall_from = stall_from, .exited = exited,
      .reconnected = now (), .waiting = waiting,
      .due = exited + request_timeout + 1.5,
    };
    supervise_log ("restart %u (%s): %s given its sockets %.3f s after the "
                   "server's end; its downtime once the requests that "
                   "waited are sent again", restarts, why, device,
                   report.reconnected - exited);
    quiet_until = now () + QUIET_AFTER_RESTART_S;
    restart_began = stopped;
    /* The next standby once the old requests are answered (see the
     * standby's start above) - and after a server started with the
     * device down, once that server has faulted its own memory in: a
     * standby forked 5 s after such a start, on a machine swapping 2.25x
     * its RAM with zstd, left the supervisor in the kernel's reclaim
     * (copy_process) and the new server's threads waiting on its
     * mmap_lock, the device answering nothing (seen in the guest).
     */
    for (unsigned k = 0; k < standbys; k++)
      if (!standby_list[k].pid)
        standby_list[k].next_try = report.due
          + (by_standby ? 1 : STANDBY_AFTER_START_S);
  }
}
