/* watchdog: the nbd swap guest's hang detector (tests/vm-nbd/init).
 * Built statically on the host:  cc -static -O2 -o watchdog watchdog.c
 *
 * Usage: watchdog STALL_S DEADLINE_S HEARTBEAT_S NBDKIT_PID STATS_FILE \
 *            PROGRESS_FILE...
 *
 * Every 2 s it reads the workload's progress files (touch.c -p), the
 * kernel's swap counters (pswpout, pswpin) and the swap in use; every
 * HEARTBEAT_S it prints them (ZRAM-VM: wd ...).  When the workload has not
 * moved for STALL_S seconds (the swap counters do not count: a full
 * device fails swap-outs, and the kernel retries them, endlessly) it
 * prints "ZRAM-VM: HANG ..." (or, when
 * DEADLINE_S have passed with the workload still moving, "ZRAM-VM:
 * DEADLINE ..."), has the kernel dump blocked tasks, the CPUs,
 * memory and every task (sysrq w, l, m, t), prints the server's stats
 * file as a thread of its own last read it (every 5 s: reading it may
 * block once memory is gone, and must not block the watchdog) and
 * "ZRAM-VM: DUMPS-DONE", and waits to be killed.  It records the peak
 * swap use (KiB) in /tmp/swap_max, the longest time the workload did not
 * move before it moved again (seconds, to the 2 s it samples at: how
 * long a full device or the OOM killer kept the machine stalled) in
 * /tmp/stall_max, and "hang" or "deadline" in
 * /tmp/hang.wd.
 *
 * Not a shell loop: a first version in busybox sh was itself swapped out
 * and sat in do_swap_page behind the very hang it was to report.  This
 * one locks its memory (mlockall), runs at SCHED_FIFO 99 (above a
 * real-time server; and the page allocator lets a real-time task dip
 * below the min watermark), keeps every file it reads open (a /proc
 * file's buffer is allocated once) and writes files in place.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_PROGRESS 16

static char buf[65536];

static long now_s (void);

/* The stats file as last read, and when (0: never). */
static const char *stats_file;
static char stats[2][16384];
static int stats_latest = -1;
static long stats_when;
static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;

/* With the heartbeat: the server's mm_stat line as last read (orig,
 * compr, mem_used, limit, mem_used_max, ...), to follow the pool against
 * the swap in use over a run.
 */
static void
mm_stat_print (long t)
{
  char line[256] = "";
  pthread_mutex_lock (&stats_lock);
  if (stats_latest >= 0) {
    const char *at = strstr (stats[stats_latest], "mm_stat ");
    if (at) {
      size_t n = strcspn (at, "\n");
      if (n >= sizeof line)
        n = sizeof line - 1;
      memcpy (line, at, n);
      line[n] = '\0';
    }
  }
  pthread_mutex_unlock (&stats_lock);
  if (line[0])
    printf ("ZRAM-VM: wd t=%lds %s\n", t, line);
}

static void *
stats_reader (void *arg)
{
  int slot = 0;
  (void) arg;
  for (;;) {
    int fd = open (stats_file, O_RDONLY);
    if (fd >= 0) {
      ssize_t n, total = 0;
      while (total < (ssize_t) sizeof stats[slot] - 1 &&
             (n = read (fd, stats[slot] + total,
                        sizeof stats[slot] - 1 - total)) > 0)
        total += n;
      close (fd);
      stats[slot][total] = '\0';
      if (total > 0) {
        pthread_mutex_lock (&stats_lock);
        stats_latest = slot;
        stats_when = now_s ();
        pthread_mutex_unlock (&stats_lock);
        slot = !slot;
      }
    }
    sleep (5);
  }
  return NULL;
}

/* The file at FD from its start, NUL-terminated in buf; its length. */
static ssize_t
slurp (int fd)
{
  ssize_t n, total = 0;
  if (lseek (fd, 0, SEEK_SET) == -1)
    return -1;
  while (total < (ssize_t) sizeof buf - 1 &&
         (n = read (fd, buf + total, sizeof buf - 1 - total)) > 0)
    total += n;
  buf[total] = '\0';
  return total;
}

static long long
vmstat_field (const char *text, const char *name)
{
  size_t len = strlen (name);
  const char *p = text;
  while ((p = strstr (p, name)) != NULL) {
    if ((p == text || p[-1] == '\n') && p[len] == ' ')
      return atoll (p + len + 1);
    p += len;
  }
  return 0;
}

/* Used KiB of the swap device (/dev/nbd0, or the kernel's /dev/zram0:
 * the guest has one) in /proc/swaps: its first line after the header.
 */
static long long
swap_used (const char *text)
{
  const char *p = strchr (text, '\n');
  long long size, used;
  char type[32];
  if (!p || sscanf (p + 1, "%*s %31s %lld %lld", type, &size, &used) != 3)
    return 0;
  return used;
}

static long
now_s (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec;
}

static void
sysrq (int fd, char key, const char *what)
{
  printf ("ZRAM-VM: sysrq %c (%s)\n", key, what);
  if (pwrite (fd, &key, 1, 0) != 1)
    printf ("ZRAM-VM: sysrq %c: %m\n", key);
  sleep (2);
}

/* The swap tool's supervisor's log, beside the stats file: its restarts
 * (a restart under test may be what stalls the workload; the shells that
 * would report it may be swapped out).  Lines not printed yet.
 */
static void
supervisor_log_print (void)
{
  static long printed;
  char path[4096], *slash;
  snprintf (path, sizeof path, "%s", stats_file);
  if (!(slash = strrchr (path, '/')))
    return;
  snprintf (slash, path + sizeof path - slash, "/supervisor.log");
  FILE *fp = fopen (path, "r");
  if (!fp)
    return;
  char line[512];
  long n = 0;
  while (fgets (line, sizeof line, fp))
    if (++n > printed)
      printf ("ZRAM-VM: wd supervisor: %s", line);
  printed = n;
  fclose (fp);
}

int
main (int argc, char **argv)
{
  long stall, deadline, heartbeat, start, last_change, last_beat, now;
  int nbdkit_pid, vmstat_fd, swaps_fd, sysrq_fd, swapmax_fd, hang_fd;
  int progress_fd[MAX_PROGRESS], nprogress = 0, i;
  pthread_t reader;
  char sig[1024], last_sig[1024] = "", line[1024], proc[64];
  long long swap_max = 0;
  long stall_max = 0;
  int stallmax_fd;
  struct sched_param sp = { .sched_priority = 99 };

  if (argc < 6) {
    fprintf (stderr, "usage: watchdog STALL_S DEADLINE_S HEARTBEAT_S "
             "NBDKIT_PID STATS_FILE PROGRESS_FILE...\n");
    return 2;
  }
  stall = atol (argv[1]);
  deadline = atol (argv[2]);
  heartbeat = atol (argv[3]);
  nbdkit_pid = atoi (argv[4]);
  stats_file = argv[5];
  setvbuf (stdout, NULL, _IOLBF, 0);

  if (mlockall (MCL_CURRENT | MCL_FUTURE) == -1)
    printf ("ZRAM-VM: wd: mlockall: %m\n");
  if (sched_setscheduler (0, SCHED_FIFO, &sp) == -1)
    printf ("ZRAM-VM: wd: SCHED_FIFO: %m\n");
  {
    int fd = open ("/proc/self/oom_score_adj", O_WRONLY);
    if (fd >= 0) {
      if (write (fd, "-1000", 5) != 5) { /* not vital */ }
      close (fd);
    }
  }

  vmstat_fd = open ("/proc/vmstat", O_RDONLY);
  swaps_fd = open ("/proc/swaps", O_RDONLY);
  sysrq_fd = open ("/proc/sysrq-trigger", O_WRONLY);
  swapmax_fd = open ("/tmp/swap_max", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  stallmax_fd = open ("/tmp/stall_max", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  hang_fd = open ("/tmp/hang.wd", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (vmstat_fd < 0 || swaps_fd < 0 || sysrq_fd < 0 || swapmax_fd < 0 ||
      hang_fd < 0) {
    printf ("ZRAM-VM: wd: cannot open its files: %m\n");
    return 2;
  }
  /* The pages of the files it writes, now. */
  if (pwrite (swapmax_fd, "0                   \n", 21, 0) < 0 ||
      pwrite (hang_fd, "\n", 1, 0) < 0)
    return 2;
  for (i = 6; i < argc && nprogress < MAX_PROGRESS; i++) {
    /* The workload creates them as it starts: open what exists, or
     * create it (touch.c opens without O_TRUNC). */
    int fd = open (argv[i], O_RDONLY | O_CREAT, 0644);
    if (fd < 0) {
      printf ("ZRAM-VM: wd: %s: %m\n", argv[i]);
      return 2;
    }
    progress_fd[nprogress++] = fd;
  }
  snprintf (proc, sizeof proc, "/proc/%d", nbdkit_pid);
  if (pthread_create (&reader, NULL, stats_reader, NULL) != 0)
    printf ("ZRAM-VM: wd: no stats reader thread\n");

  start = last_change = last_beat = now_s ();
  for (;;) {
    long long so, si, used;
    const char *why = NULL, *verdict = "HANG";
    size_t len = 0;
    int alive;

    sleep (2);
    now = now_s ();
    sig[0] = '\0';
    for (i = 0; i < nprogress; i++) {
      char phase[16] = "-";
      unsigned long long pages = 0;
      const char *name = strrchr (argv[6 + i], '.');
      if (slurp (progress_fd[i]) > 0)
        sscanf (buf, "%15s %llu", phase, &pages);
      len += snprintf (sig + len, sizeof sig - len, " %s=%s:%lluM",
                       name ? name + 1 : argv[6 + i], phase, pages / 256);
    }
    if (slurp (vmstat_fd) < 0)
      buf[0] = '\0';
    so = vmstat_field (buf, "pswpout");
    si = vmstat_field (buf, "pswpin");
    if (slurp (swaps_fd) < 0)
      buf[0] = '\0';
    used = swap_used (buf);
    if (used > swap_max) {
      char n[32];
      swap_max = used;
      snprintf (n, sizeof n, "%-20lld\n", swap_max);
      if (pwrite (swapmax_fd, n, 21, 0) < 0) { /* best effort */ }
    }
    if (strcmp (sig, last_sig) != 0) {
      if (now - last_change > stall_max) {
        char n[32];
        stall_max = now - last_change;
        snprintf (n, sizeof n, "%-20ld\n", stall_max);
        if (pwrite (stallmax_fd, n, 21, 0) < 0) { /* best effort */ }
      }
      strcpy (last_sig, sig);
      last_change = now;
    }
    snprintf (sig + len, sizeof sig - len, " pswpout=%lld pswpin=%lld",
              so, si);
    alive = access (proc, F_OK) == 0;
    if (now - last_beat >= heartbeat) {
      last_beat = now;
      printf ("ZRAM-VM: wd t=%lds%s swap_used_kib=%lld nbdkit=%s\n",
              now - start, sig, used, alive ? "yes" : "no");
      supervisor_log_print ();
      mm_stat_print (now - start);
    }
    if (now - last_change >= stall) {
      snprintf (line, sizeof line, "no progress for %ld s",
                now - last_change);
      why = line;
    }
    else if (now - start >= deadline) {
      snprintf (line, sizeof line, "%ld s since the start, still moving",
                now - start);
      why = line;
      verdict = "DEADLINE";
    }
    if (why) {
      if (pwrite (hang_fd, verdict[0] == 'H' ? "hang\n" : "deadline\n",
                  verdict[0] == 'H' ? 5 : 9, 0) < 0) { /* best effort */ }
      printf ("ZRAM-VM: %s %s at t=%lds:%s swap_used_kib=%lld nbdkit=%s\n",
              verdict, why, now - start, sig, used, alive ? "yes" : "no");
      sysrq (sysrq_fd, 'w', "blocked tasks");
      sysrq (sysrq_fd, 'l', "backtrace of the active CPUs");
      sysrq (sysrq_fd, 'm', "memory");
      sysrq (sysrq_fd, 't', "all tasks");
      sleep (3);
      pthread_mutex_lock (&stats_lock);
      if (stats_latest < 0)
        printf ("ZRAM-VM: stats file: never read\n");
      else {
        char *p = stats[stats_latest], *nl;
        printf ("ZRAM-VM: stats file as last read, at t=%lds (the %s: "
                "t=%lds):\n", stats_when - start,
                verdict[0] == 'H' ? "hang" : "deadline", now - start);
        while ((nl = strchr (p, '\n')) != NULL) {
          *nl = '\0';
          printf ("ZRAM-VM: stat %s\n", p);
          p = nl + 1;
        }
      }
      pthread_mutex_unlock (&stats_lock);
      printf ("ZRAM-VM: DUMPS-DONE\n");
      for (;;)
        pause ();
    }
  }
}
