/* The nbd driver's lines in the kernel's log (tools/kernel-log.c), as
 * the supervisor reads them: /dev/kmsg, opened at the supervisor's start
 * and read from its end then, one record per read, without allocating
 * (the supervisor allocates nothing once started).
 *
 * Three of the driver's lines about the device matter:
 *   - "Connection timed out, retrying": the moment it sent again a
 *     request the old server never answered (a restart's downtime ends
 *     with the last of them);
 *   - "Dead connection" or "(0/N alive)": no connection of the device is
 *     alive.  While the server runs and is not being stopped, that is a
 *     request of the live server's that met the request timeout, as the
 *     driver's link-dead notice says - but the notice is sent from a
 *     kernel worker that allocates, and with the machine's memory used
 *     up it never came (seen in a 256 MiB guest: the workers waited in
 *     reclaim, the device answered nothing until the dead-connection
 *     timeout failed its requests).  A line of the log costs the kernel
 *     no allocation;
 *   - "reconnected socket": the driver took a socket a restart gave it.
 *     A dead-connection line after it is about that new connection, not
 *     the old server's: seen, Linux 6.1 under memory pressure, the old
 *     connection's receive worker marked its slot dead late - after the
 *     reconnect had put the new socket in that slot - and so shut the
 *     new socket down 11 ms after the reconnect.  Nothing else would
 *     ever answer then: the device waited out its dead-connection
 *     timeout (120 s) and failed every request.
 *
 * The log's times are the kernel's clock, which is the monotonic clock
 * give or take its drift: they compare with the supervisor's now ().
 * The state is the one thread's that reads it: no lock.
 */
#ifndef ZRAM_KERNEL_LOG_H
#define ZRAM_KERNEL_LOG_H

#include <stdbool.h>

#define KERNEL_LOG_RESENDS_KEPT 256
#define KERNEL_LOG_DEVICES_MAX 8

/* One device's lines. */
struct kernel_log_device {
  char key[64];                           /* "nbd0:": not nbd01's lines */
  double resend_at[KERNEL_LOG_RESENDS_KEPT]; /* a ring: resends % KEPT */
  unsigned resends;                       /* every one seen */
  unsigned resends_reported;              /* up to here in a report */
  double link_dead_at;                    /* the last dead line, or 0 */
  double link_dead_judged;                /* up to here judged */
  double reconnected_at;                  /* the last reconnect, or 0 */
};

struct kernel_log {
  int fd;                                 /* -1: none */
  unsigned count;                         /* devices[] in use */
  struct kernel_log_device devices[KERNEL_LOG_DEVICES_MAX];
};

/* Its state emptied, reading fd (/dev/kmsg from its end; -1: none) for
 * the lines of the count devices named in names ("nbd0", "nbd1"; at most
 * KERNEL_LOG_DEVICES_MAX).  Each function below takes a device by its
 * index in names.
 */
extern void kernel_log_init (struct kernel_log *log, int fd,
                             const char *const *names, unsigned count);

/* What was logged since the last call, into the state. */
extern void kernel_log_read (struct kernel_log *log);

/* Of device's resends logged since the last call, how many came no
 * later than until, and when the last of them came (0: none).
 */
extern double kernel_log_resends (struct kernel_log *log, unsigned device,
                                  double until, unsigned *count);

/* Whether a dead-connection line of device logged since the last call
 * is news of a live server's connection (each line is judged once):
 *   - KERNEL_LOG_DEAD_OLD: none, or one the restart begun at
 *     restart_began expects (the old server's connection, logged before
 *     quiet_until and before the driver took the restart's sockets);
 *   - KERNEL_LOG_DEAD_LIVE: logged after quiet_until: a live server's
 *     request met the request timeout;
 *   - KERNEL_LOG_DEAD_NEW: logged after the driver took the sockets of
 *     the restart begun at restart_began, inside its quiet window: the
 *     new connection died (see above).
 */
enum kernel_log_dead {
  KERNEL_LOG_DEAD_OLD,
  KERNEL_LOG_DEAD_LIVE,
  KERNEL_LOG_DEAD_NEW,
};
extern enum kernel_log_dead kernel_log_link_dead (struct kernel_log *log,
                                                  unsigned device,
                                                  double quiet_until,
                                                  double restart_began);

#endif /* ZRAM_KERNEL_LOG_H */
