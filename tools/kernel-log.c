/* The nbd driver's lines in the kernel's log: see kernel-log.h. */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernel-log.h"

void
kernel_log_init (struct kernel_log *log, int fd, const char *device_name)
{
  memset (log, 0, sizeof *log);
  log->fd = fd;
  snprintf (log->key, sizeof log->key, "%s:", device_name);
}

void
kernel_log_read (struct kernel_log *log)
{
  for (;;) {
    char record[1024];
    ssize_t got = log->fd >= 0
      ? read (log->fd, record, sizeof record - 1) : -1;
    if (got == -1 && errno == EPIPE)
      continue;                 /* overwritten meanwhile: the next */
    if (got <= 0)
      return;
    record[got] = '\0';
    /* "PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;TEXT" */
    unsigned long long microseconds;
    int text = 0;
    if (sscanf (record, "%*u,%*u,%llu,%*[^;];%n", &microseconds, &text) < 1
        || text == 0 || !strstr (record + text, log->key))
      continue;
    double at = microseconds / 1e6;
    const char *line = record + text;
    if (strstr (line, "timed out, retrying"))
      log->resend_at[log->resends++ % KERNEL_LOG_RESENDS_KEPT] = at;
    if (strstr (line, "Dead connection") || strstr (line, "(0/"))
      log->link_dead_at = at;
    if (strstr (line, "reconnected socket"))
      log->reconnected_at = at;
  }
}

double
kernel_log_resends (struct kernel_log *log, double until, unsigned *count)
{
  kernel_log_read (log);
  double last = 0;
  *count = 0;
  unsigned first = log->resends_reported;
  if (log->resends - first > KERNEL_LOG_RESENDS_KEPT)
    first = log->resends - KERNEL_LOG_RESENDS_KEPT;
  for (unsigned i = first; i < log->resends; i++) {
    double at = log->resend_at[i % KERNEL_LOG_RESENDS_KEPT];
    if (at <= until) {
      last = at;
      ++*count;
    }
  }
  log->resends_reported = log->resends;
  return last;
}

enum kernel_log_dead
kernel_log_link_dead (struct kernel_log *log, double quiet_until,
                      double restart_began)
{
  kernel_log_read (log);
  if (log->link_dead_at <= log->link_dead_judged)
    return KERNEL_LOG_DEAD_OLD;
  log->link_dead_judged = log->link_dead_at;
  if (log->link_dead_at > quiet_until)
    return KERNEL_LOG_DEAD_LIVE;
  /* Inside a restart's window the old connection's death is expected;
   * one after the driver took the restart's sockets is the new one's.
   */
  if (log->reconnected_at > restart_began
      && log->link_dead_at > log->reconnected_at)
    return KERNEL_LOG_DEAD_NEW;
  return KERNEL_LOG_DEAD_OLD;
}
