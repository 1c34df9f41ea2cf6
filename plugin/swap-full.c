/* A full swap device: see swap-full.h. */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "error-text.h"
#include "monotonic.h"
#include "proc-files.h"
#include "stack-touch.h"
#include "swap-full.h"
#include "text-parse.h"

#define SYSRQ_TRIGGER "/proc/sysrq-trigger"

enum swap_full_action swap_full_action = SWAP_FULL_OOM;
unsigned swap_full_after_ms = SWAP_FULL_AFTER_MS;
uint64_t swap_full_available_kib;

static const char *const action_names[] = { "oom", "fail" };

/* Written by request threads. */
static _Atomic uint64_t refusals;
/* Written by the watching thread, read by the stats writer. */
static _Atomic uint64_t kills;
/* Called after each kill (swap_full_start); the watcher's alone. */
static void (*after_kill_hook) (void);
static _Atomic uint64_t kill_delay_max_ms;
static atomic_int full_now;
/* The watching thread's own state. */
static int sysrq_fd = -1;
static uint64_t refusals_seen;
static uint64_t episode_start_ns;       /* 0: no refusals going on */
static uint64_t last_refusal_ns;
static uint64_t last_kill_ns;

int
swap_full_parse (const char *value)
{
  for (int action = SWAP_FULL_OOM; action <= SWAP_FULL_FAIL; action++)
    if (strcmp (value, action_names[action]) == 0) {
      swap_full_action = action;
      return 0;
    }
  nbdkit_error ("swap_full: '%s' is not one of oom|fail", value);
  return -1;
}

int
swap_full_after_parse (const char *value)
{
  char *end;
  errno = 0;
  unsigned long ms = strtoul (value, &end, 10);
  if (errno || end == value || *end || *value == '-' || ms < 250
      || ms > 600000) {
    nbdkit_error ("swap_full_after: '%s' is not a number of milliseconds "
                  "from 250 to 600000", value);
    return -1;
  }
  swap_full_after_ms = ms;
  return 0;
}

int
swap_full_available_parse (const char *value)
{
  int64_t bytes = parse_size (value);
  if (bytes == -1) {
    nbdkit_error ("swap_full_available: '%s' is not a size (e.g. 64M; 0: "
                  "twice vm.min_free_kbytes or a thirty-second of RAM)",
                  value);
    return -1;
  }
  swap_full_available_kib = (uint64_t) bytes / 1024;
  return 0;
}

int
swap_full_prepare (char *problem, size_t size)
{
  if (swap_full_action != SWAP_FULL_OOM || sysrq_fd != -1)
    return 0;
  sysrq_fd = open (SYSRQ_TRIGGER, O_WRONLY | O_CLOEXEC);
  if (sysrq_fd != -1)
    return 0;
  snprintf (problem, size,
            "swap_full=oom cannot open " SYSRQ_TRIGGER " (%s; it needs "
            "root, and a /proc that is not read-only): when the device is "
            "full the machine could not recover; use swap_full=fail to go "
            "without", error_text (errno));
  return -1;
}

/* Swap mode's stores in flight and done, for the stall check. */
static _Atomic uint64_t stores_started, stores_done;

void
swap_full_store_start (void)
{
  atomic_fetch_add_explicit (&stores_started, 1, memory_order_relaxed);
}

void
swap_full_store_done (void)
{
  atomic_fetch_add_explicit (&stores_done, 1, memory_order_relaxed);
}

void
swap_full_note_refusal (void)
{
  atomic_fetch_add_explicit (&refusals, 1, memory_order_relaxed);
}

/* The /proc files the watch reads, each opened once and read again from
 * its start: an open allocates in the kernel, and under pressure that
 * sent the watcher itself into reclaim.  Only the watcher's thread uses
 * them (no lock).
 */
#define PROC_FILES 4
static struct { const char *path; int fd; } proc_files[PROC_FILES];

/* A whole small /proc file into buf: 0, or -1. */
static int
read_proc (const char *path, char *buf, size_t size)
{
  int fd = -1;
  for (unsigned i = 0; i < PROC_FILES && fd == -1; i++)
    if ((proc_files[i].path && strcmp (proc_files[i].path, path) == 0)
        || (!proc_files[i].path
            && (proc_files[i].fd = open (path, O_RDONLY | O_CLOEXEC)) != -1
            && (proc_files[i].path = path)))
      fd = proc_files[i].fd;
  if (fd == -1)
    return -1;
  ssize_t n = pread (fd, buf, size - 1, 0);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  return 0;
}

/* nr_writeback of /proc/vmstat: pages the kernel is writing out now. */
static int64_t
pages_under_writeback (void)
{
  char text[16384];
  if (read_proc ("/proc/vmstat", text, sizeof text) == -1)
    return 0;
  const char *at = strstr (text, "\nnr_writeback ");
  return at ? strtoll (at + strlen ("\nnr_writeback "), NULL, 10) : 0;
}

/* The machine is short of memory: MemAvailable below
 * swap_full_available, by default twice vm.min_free_kbytes or a
 * thirty-second of RAM.  Unknown: short.
 */
static bool
memory_short (void)
{
  char text[4096], number[32];
  if (read_proc ("/proc/meminfo", text, sizeof text) == -1)
    return true;
  int64_t total = meminfo_kib (text, "MemTotal:");
  int64_t available = meminfo_kib (text, "MemAvailable:");
  int64_t min_free = read_proc ("/proc/sys/vm/min_free_kbytes", number,
                                sizeof number) == 0
    ? strtoll (number, NULL, 10) : 0;
  if (total <= 0 || available < 0)
    return true;
  int64_t threshold = 2 * min_free > total / 32 ? 2 * min_free : total / 32;
  if (swap_full_available_kib)
    threshold = swap_full_available_kib;
  return available < threshold;
}

/* A small file into buf (NUL-terminated, the last newline dropped):
 * system calls only, nothing allocated.
 */
static void
read_small (const char *path, char *buf, size_t size)
{
  buf[0] = '\0';
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd == -1)
    return;
  ssize_t n = read (fd, buf, size - 1);
  close (fd);
  if (n <= 0)
    return;
  buf[n] = '\0';
  if (buf[n - 1] == '\n')
    buf[n - 1] = '\0';
}

/* After a kill for a stall: each of this server's threads, its state and
 * the kernel function it waits in - what held the server up, for the
 * log.  Read into the watcher's stack after the kill (it cannot delay
 * it).
 */
static void
log_thread_waits (void)
{
  int dir = open ("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir == -1)
    return;
  char line[2048];
  _Alignas (8) char entries[2048];
  size_t used = 0;
  long n;
  while ((n = syscall (SYS_getdents64, dir, entries, sizeof entries)) > 0)
    for (long at = 0; at < n;) {
      struct entry {
        uint64_t inode;
        int64_t offset;
        unsigned short length;
        unsigned char type;
        char name[];
      } *entry = (struct entry *) (entries + at);
      at += entry->length;
      if (entry->name[0] == '.')
        continue;
      char path[96], name[32], wait[64], stat[512];
      snprintf (path, sizeof path, "/proc/self/task/%s/comm", entry->name);
      read_small (path, name, sizeof name);
      snprintf (path, sizeof path, "/proc/self/task/%s/wchan", entry->name);
      read_small (path, wait, sizeof wait);
      snprintf (path, sizeof path, "/proc/self/task/%s/stat", entry->name);
      read_small (path, stat, sizeof stat);
      const char *after_name = strrchr (stat, ')');
      char state = after_name && after_name[1] ? after_name[2] : '?';
      if (used < sizeof line)
        used += snprintf (line + used, sizeof line - used, " %s:%c:%s", name,
                          state, wait[0] && strcmp (wait, "0") ? wait : "-");
    }
  close (dir);
  nbdkit_error ("zram: the server's threads at that moment (name:state:"
                "waiting in):%s", used ? line : " unknown");
}

/* No kill before these (swap_full_grace), one per reason. */
static _Atomic uint64_t grace_until_ns[SWAP_FULL_GRACE_REASONS];

void
swap_full_grace (enum swap_full_grace_reason reason, uint64_t until_ns)
{
  atomic_store (&grace_until_ns[reason], until_ns);
}

static bool
in_grace (uint64_t now_ns)
{
  for (int reason = 0; reason < SWAP_FULL_GRACE_REASONS; reason++)
    if (now_ns < atomic_load (&grace_until_ns[reason]))
      return true;
  return false;
}

void
swap_full_watch (uint64_t now_ns)
{
  uint64_t seen = atomic_load_explicit (&refusals, memory_order_relaxed);
  /* Stalled: none done for SWAP_FULL_STALL_MS (a slow server is no
   * stuck one: with a second, a 384 MiB guest under TCG that swapped
   * every page had a process killed) while stores are in flight here, or while the kernel has
   * pages under writeback and this server was storing until lately - a
   * request stuck in nbdkit before it reaches the plugin (reading its
   * data into a buffer that faults) is in flight only there.
   */
  static uint64_t done_seen, stall_since_ns, last_done_ns, last_look_ns;
  if (last_look_ns && now_ns - last_look_ns >= SWAP_FULL_GAP_MS * 1000000ull) {
    /* The watcher did not run (the process stopped: SIGSTOP, a frozen
     * cgroup, a debugger): its clocks measured its own absence, not the
     * device.  They start again from now.
     */
    stall_since_ns = 0;
    episode_start_ns = 0;
    last_done_ns = now_ns;
  }
  last_look_ns = now_ns;
  uint64_t done = atomic_load_explicit (&stores_done, memory_order_relaxed);
  bool waited_on = atomic_load_explicit (&stores_started, memory_order_relaxed) != done
    || (now_ns - last_done_ns < SWAP_FULL_RECENT_MS * 1000000ull
        && pages_under_writeback () > 0);
  if (done != done_seen) {
    last_done_ns = now_ns;
    stall_since_ns = 0;
  }
  else if (!waited_on)
    stall_since_ns = 0;
  else if (!stall_since_ns)
    stall_since_ns = now_ns;
  done_seen = done;
  bool stalled = stall_since_ns
    && now_ns - stall_since_ns >= SWAP_FULL_STALL_MS * 1000000ull;
  if (seen != refusals_seen || stalled) {
    refusals_seen = seen;
    last_refusal_ns = now_ns;
    if (!episode_start_ns)
      episode_start_ns = now_ns;
  }
  else if (episode_start_ns
           && now_ns - last_refusal_ns >= SWAP_FULL_PAUSE_MS * 1000000ull)
    episode_start_ns = 0;       /* the writes got through again */
  atomic_store (&full_now, episode_start_ns != 0);

  if (!episode_start_ns || sysrq_fd == -1
      || in_grace (now_ns)
      || now_ns - episode_start_ns < swap_full_after_ms * 1000000ull
      || (last_kill_ns && now_ns - last_kill_ns < SWAP_FULL_SETTLE_MS * 1000000ull)
      || !memory_short ())
    return;
  uint64_t delay_ms = (now_ns - episode_start_ns) / 1000000;
  if (write (sysrq_fd, "f", 1) != 1) {
    nbdkit_error ("zram: swap_full=oom: the device is full and memory is "
                  "short, but writing to " SYSRQ_TRIGGER " failed: %s",
                  error_text (errno));
    last_kill_ns = now_ns;      /* do not flood the log */
    return;
  }
  atomic_fetch_add (&kills, 1);
  if (after_kill_hook)
    after_kill_hook ();
  uint64_t max = atomic_load (&kill_delay_max_ms);
  if (delay_ms > max)
    atomic_store (&kill_delay_max_ms, delay_ms);
  nbdkit_error ("zram: the device can take no more (writes refused for "
                "%" PRIu64 " ms: mem_limit reached, or no memory left to "
                "make ready) and memory is short: the kernel's OOM killer "
                "was asked to act (sysrq f), as it would without swap, "
                "and the writes may take the reserve until it is refilled",
                delay_ms);
  if (stalled)
    log_thread_waits ();
  last_kill_ns = now_ns;
  /* The victim's pages take a moment to leave: a new episode. */
  episode_start_ns = now_ns;
}

/* The watcher: a thread of its own, so that the way out does not wait
 * on the thread that populates memory (the reserve keeper sat in the
 * kernel's reclaim throttle through a whole hang).  It allocates
 * nothing: the /proc reads go to its stack, touched at its start.
 */
#define WATCHER_STACK_BYTES (64 << 10)
static pthread_t watcher;
static bool watcher_running;
static atomic_bool watcher_stopping;

static void *
watcher_main (void *arg)
{
  (void) arg;
  stack_touch (WATCHER_STACK_BYTES);
  while (!atomic_load (&watcher_stopping)) {
    struct timespec tick = { 0, SWAP_FULL_TICK_MS * 1000000l };
    swap_full_watch (monotonic_ns ());
    nanosleep (&tick, NULL);
  }
  return NULL;
}

int
swap_full_start (void (*after_kill) (void))
{
  after_kill_hook = after_kill;
  int err = pthread_create (&watcher, NULL, watcher_main, NULL);
  if (err) {
    errno = err;
    return -1;
  }
  pthread_setname_np (watcher, "zram-full-watch");
  watcher_running = true;
  return 0;
}

void
swap_full_stop (void)
{
  if (!watcher_running)
    return;
  atomic_store (&watcher_stopping, true);
  pthread_join (watcher, NULL);
  watcher_running = false;
}

void
swap_full_status (struct swap_full_status *status)
{
  status->refusals = atomic_load_explicit (&refusals, memory_order_relaxed);
  status->kills = atomic_load (&kills);
  status->kill_delay_max_ms = atomic_load (&kill_delay_max_ms);
  status->full = atomic_load (&full_now);
}

void
swap_full_print (const struct swap_full_status *status, FILE *fp)
{
  fprintf (fp, "swap_full_refusals: %" PRIu64 "\n", status->refusals);
  fprintf (fp, "swap_full_now: %d\n", status->full);
  fprintf (fp, "swap_full_oom_kills: %" PRIu64 "\n", status->kills);
  fprintf (fp, "swap_full_kill_delay_max_ms: %" PRIu64 "\n",
           status->kill_delay_max_ms);
}
