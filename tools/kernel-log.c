/* The nbd driver's lines in the kernel's log: see kernel-log.h. */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernel-log.h"

void
kernel_log_init (struct kernel_log *log, int fd, const char *const *names,
                 unsigned count)
{
  memset (log, 0, sizeof *log);
  log->fd = fd;
  log->count = count < KERNEL_LOG_DEVICES_MAX ? count : KERNEL_LOG_DEVICES_MAX;
  for (unsigned i = 0; i < log->count; i++)
    snprintf (log->devices[i].key, sizeof log->devices[i].key, "%s:",
              names[i]);
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
        || text == 0)
      continue;
    double at = microseconds / 1e6;
    const char *line = record + text;
    for (unsigned i = 0; i < log->count; i++) {
      struct kernel_log_device *device = &log->devices[i];
      if (!strstr (line, device->key))
        continue;
      if (strstr (line, "timed out, retrying"))
        device->resend_at[device->resends++ % KERNEL_LOG_RESENDS_KEPT] = at;
      if (strstr (line, "Dead connection") || strstr (line, "(0/"))
        device->link_dead_at = at;
      if (strstr (line, "reconnected socket"))
        device->reconnected_at = at;
    }
  }
}

double
kernel_log_resends (struct kernel_log *log, unsigned index, double until,
                    unsigned *count)
{
  kernel_log_read (log);
  struct kernel_log_device *device = &log->devices[index];
  double last = 0;
  *count = 0;
  unsigned first = device->resends_reported;
  if (device->resends - first > KERNEL_LOG_RESENDS_KEPT)
    first = device->resends - KERNEL_LOG_RESENDS_KEPT;
  for (unsigned i = first; i < device->resends; i++) {
    double at = device->resend_at[i % KERNEL_LOG_RESENDS_KEPT];
    if (at <= until) {
      last = at;
      ++*count;
    }
  }
  device->resends_reported = device->resends;
  return last;
}

enum kernel_log_dead
kernel_log_link_dead (struct kernel_log *log, unsigned index,
                      double quiet_until, double restart_began)
{
  kernel_log_read (log);
  struct kernel_log_device *device = &log->devices[index];
  if (device->link_dead_at <= device->link_dead_judged)
    return KERNEL_LOG_DEAD_OLD;
  device->link_dead_judged = device->link_dead_at;
  if (device->link_dead_at > quiet_until)
    return KERNEL_LOG_DEAD_LIVE;
  /* Inside a restart's window the old connection's death is expected;
   * one after the driver took the restart's sockets is the new one's.
   */
  if (device->reconnected_at > restart_began
      && device->link_dead_at > device->reconnected_at)
    return KERNEL_LOG_DEAD_NEW;
  return KERNEL_LOG_DEAD_OLD;
}
