/* Unit tests for the supervisor's reading of the nbd driver's lines in
 * the kernel's log (tools/kernel-log.h): records fed through a
 * sequenced-packet socket, which keeps each write one record as
 * /dev/kmsg does, in the format /dev/kmsg gives.
 *
 * The first case replays the kernel lines of the failed restart that
 * made the "reconnected socket" rule: the new connection shut down
 * 11 ms after the reconnect, inside the restart's quiet window.
 */

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernel-log.h"

static int feed[2];
static unsigned long long sequence;
static const char *const nbd0[] = { "nbd0" };

/* One record at the kernel's time at (seconds), as /dev/kmsg gives it. */
static void
logged (double at, const char *text)
{
  char record[512];
  int length = snprintf (record, sizeof record, "6,%llu,%llu,-;%s\n",
                         sequence++, (unsigned long long) (at * 1e6 + 0.5),
                         text);
  assert_int_equal (write (feed[1], record, length), length);
}

static int
setup (void **state)
{
  (void) state;
  return socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, feed);
}

static int
teardown (void **state)
{
  (void) state;
  close (feed[0]);
  close (feed[1]);
  return 0;
}

/* The failed run's lines: the old connection's death is expected, the
 * new one's (after "reconnected socket") is news, and only once.
 */
static void
test_new_connection_died (void **state)
{
  (void) state;
  struct kernel_log log;
  kernel_log_init (&log, feed[0], nbd0, 1);
  double restart_began = 13.23, quiet_until = 13.33 + 3;
  logged (13.240766, "block nbd0: Receive control failed (result -32)");
  logged (13.318648, "block nbd0: Send data failed (result -32)");
  logged (13.319030, "block nbd0: Request send failed, requeueing");
  logged (13.319761, "block nbd0: Dead connection, failed to find a "
          "fallback");
  assert_int_equal (kernel_log_link_dead (&log, 0, quiet_until, restart_began),
                    KERNEL_LOG_DEAD_OLD);
  logged (13.329117, "block nbd0: reconnected socket");
  assert_int_equal (kernel_log_link_dead (&log, 0, quiet_until, restart_began),
                    KERNEL_LOG_DEAD_OLD);
  logged (13.340190, "block nbd0: Receive control failed (result -32)");
  logged (13.343938, "block nbd0: Dead connection, failed to find a "
          "fallback");
  assert_int_equal (kernel_log_link_dead (&log, 0, quiet_until, restart_began),
                    KERNEL_LOG_DEAD_NEW);
  assert_int_equal (kernel_log_link_dead (&log, 0, quiet_until, restart_began),
                    KERNEL_LOG_DEAD_OLD);
}

/* A restart as it should go, its lines read in one batch: nothing is
 * news.  A later restart's old deaths are not taken for new ones by the
 * first restart's reconnect line.  Past the quiet window, a dead line
 * is a live server's timed-out request.
 */
static void
test_restarts_and_live_deaths (void **state)
{
  (void) state;
  struct kernel_log log;
  kernel_log_init (&log, feed[0], nbd0, 1);
  logged (13.240, "block nbd0: Receive control failed (result -32)");
  logged (13.319, "block nbd0: Dead connection, failed to find a fallback");
  logged (13.329, "block nbd0: reconnected socket");
  assert_int_equal (kernel_log_link_dead (&log, 0, 16.33, 13.23),
                    KERNEL_LOG_DEAD_OLD);
  logged (40.100, "block nbd0: Connection timed out, retrying (0/1 alive)");
  assert_int_equal (kernel_log_link_dead (&log, 0, 43.0, 40.0),
                    KERNEL_LOG_DEAD_OLD);
  logged (50.000, "block nbd0: Connection timed out, retrying (0/1 alive)");
  assert_int_equal (kernel_log_link_dead (&log, 0, 43.0, 40.0),
                    KERNEL_LOG_DEAD_LIVE);
  /* The supervisor's own reconnect without the driver's line (an older
   * kernel's wording): a dead line in the window stays the old one's.
   */
  logged (60.100, "block nbd0: Dead connection, failed to find a fallback");
  assert_int_equal (kernel_log_link_dead (&log, 0, 63.0, 60.0),
                    KERNEL_LOG_DEAD_OLD);
}

/* Another device's lines (nbd01 beside nbd0, nbd1) are not this one's;
 * records that do not parse are skipped; no log reads nothing.
 */
static void
test_other_devices_and_garbage (void **state)
{
  (void) state;
  struct kernel_log log;
  kernel_log_init (&log, feed[0], nbd0, 1);
  logged (13.329, "block nbd0: reconnected socket");
  logged (13.340, "block nbd01: Dead connection, failed to find a fallback");
  logged (13.341, "block nbd1: Dead connection, failed to find a fallback");
  assert_int_equal (write (feed[1], "garbage without fields\n", 23), 23);
  assert_int_equal (write (feed[1], "6,1,notanumber,-;block nbd0: Dead "
                           "connection\n", 45), 45);
  assert_int_equal (kernel_log_link_dead (&log, 0, 16.33, 13.23),
                    KERNEL_LOG_DEAD_OLD);
  assert_true (log.devices[0].link_dead_at == 0);
  assert_true (log.devices[0].reconnected_at > 13.3
               && log.devices[0].reconnected_at < 13.33);

  struct kernel_log none;
  kernel_log_init (&none, -1, nbd0, 1);
  assert_int_equal (kernel_log_link_dead (&none, 0, 0, 0), KERNEL_LOG_DEAD_OLD);
  unsigned count = 99;
  assert_true (kernel_log_resends (&none, 0, 100, &count) == 0);
  assert_int_equal (count, 0);
}

/* A restart's resends: those up to its bound counted once, the last's
 * time given; the ring keeps the newest KERNEL_LOG_RESENDS_KEPT.
 */
static void
test_resends (void **state)
{
  (void) state;
  struct kernel_log log;
  kernel_log_init (&log, feed[0], nbd0, 1);
  logged (13.5, "block nbd0: Connection timed out, retrying (1/1 alive)");
  logged (14.2, "block nbd0: Connection timed out, retrying (1/1 alive)");
  logged (30.0, "block nbd0: Connection timed out, retrying (1/1 alive)");
  unsigned count;
  double last = kernel_log_resends (&log, 0, 15.0, &count);
  assert_int_equal (count, 2);
  assert_true (last > 14.19 && last < 14.21);
  last = kernel_log_resends (&log, 0, 15.0, &count);
  assert_int_equal (count, 0);
  assert_true (last == 0);
  assert_int_equal (kernel_log_link_dead (&log, 0, 10, 0), KERNEL_LOG_DEAD_OLD);
  for (unsigned i = 0; i < KERNEL_LOG_RESENDS_KEPT + 10; i++) {
    logged (100.0 + i / 1000.0, "block nbd0: Connection timed out, "
            "retrying (1/1 alive)");
    if (i % 64 == 63)
      kernel_log_read (&log);   /* the socket's buffer is bounded */
  }
  last = kernel_log_resends (&log, 0, 1000.0, &count);
  assert_int_equal (count, KERNEL_LOG_RESENDS_KEPT);
  assert_true (last > 100.264 && last < 100.266);
}

/* Two devices of one server (nbd0 and nbd1): each line is its own
 * device's, and one's new connection dying is not the other's.
 */
static void
test_two_devices (void **state)
{
  (void) state;
  static const char *const names[] = { "nbd0", "nbd1" };
  struct kernel_log log;
  kernel_log_init (&log, feed[0], names, 2);
  logged (13.240, "block nbd0: Receive control failed (result -32)");
  logged (13.241, "block nbd1: Receive control failed (result -32)");
  logged (13.300, "block nbd0: reconnected socket");
  logged (13.310, "block nbd1: reconnected socket");
  logged (13.340, "block nbd1: Dead connection, failed to find a fallback");
  logged (13.500, "block nbd0: Connection timed out, retrying (1/1 alive)");
  assert_int_equal (kernel_log_link_dead (&log, 0, 16.3, 13.23),
                    KERNEL_LOG_DEAD_OLD);
  assert_int_equal (kernel_log_link_dead (&log, 1, 16.3, 13.23),
                    KERNEL_LOG_DEAD_NEW);
  unsigned count;
  kernel_log_resends (&log, 0, 20, &count);
  assert_int_equal (count, 1);
  kernel_log_resends (&log, 1, 20, &count);
  assert_int_equal (count, 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown (test_new_connection_died, setup,
                                     teardown),
    cmocka_unit_test_setup_teardown (test_restarts_and_live_deaths, setup,
                                     teardown),
    cmocka_unit_test_setup_teardown (test_other_devices_and_garbage, setup,
                                     teardown),
    cmocka_unit_test_setup_teardown (test_resends, setup, teardown),
    cmocka_unit_test_setup_teardown (test_two_devices, setup, teardown),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
