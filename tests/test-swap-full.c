/* The full-device watch alone (plugin/swap-full.h), driven with made-up
 * times: refused writes for two seconds on a machine short of memory ask
 * the OOM killer (a "f" written to the sysrq file); a grace - a
 * restart's, or one asked for, each kept apart - holds it off; and a gap
 * in the watch's own looks (the process was stopped) starts its clocks
 * again, so that refusals on both sides of a pause are not one episode.
 *
 * open() is wrapped: the sysrq file and the /proc files the watch reads
 * are files of the test's (a real "f" would kill a process here).
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "swap-full.h"

#define MS 1000000ull

static char folder[] = "/tmp/test-swap-full.XXXXXX";
static char sysrq_path[64], meminfo_path[64], vmstat_path[64];

/* ---- stand-ins for what the watch calls outside its file ------------- */

void
nbdkit_error (const char *format, ...)
{
  (void) format;
}

int __real_open (const char *path, int flags, ...);

int
__wrap_open (const char *path, int flags, ...)
{
  mode_t mode = 0;
  if (flags & O_CREAT) {
    va_list args;
    va_start (args, flags);
    mode = va_arg (args, mode_t);
    va_end (args);
  }
  if (strcmp (path, "/proc/sysrq-trigger") == 0)
    path = sysrq_path;
  else if (strcmp (path, "/proc/meminfo") == 0)
    path = meminfo_path;
  else if (strcmp (path, "/proc/vmstat") == 0)
    path = vmstat_path;
  else if (strcmp (path, "/proc/sys/vm/min_free_kbytes") == 0) {
    errno = ENOENT;             /* the thirty-second of RAM decides */
    return -1;
  }
  return __real_open (path, flags, mode);
}

static void
write_file (const char *path, const char *text)
{
  FILE *fp = fopen (path, "w");
  assert_non_null (fp);
  fputs (text, fp);
  fclose (fp);
}

/* Times the OOM killer was asked (the sysrq file's length). */
static long
kills_asked (void)
{
  struct stat st;
  assert_int_equal (stat (sysrq_path, &st), 0);
  return st.st_size;
}

/* The watch's looks from *now for ms, every tick, a refusal before each
 * when refusing.
 */
static void
watch_for (uint64_t *now, unsigned ms, bool refusing)
{
  for (unsigned t = 0; t < ms; t += SWAP_FULL_TICK_MS) {
    if (refusing)
      swap_full_note_refusal ();
    *now += SWAP_FULL_TICK_MS * MS;
    swap_full_watch (*now);
  }
}

/* The episode over (no refusal for a pause) and the settle after a kill
 * passed: the next refusals start afresh.
 */
static void
quiet (uint64_t *now)
{
  watch_for (now, SWAP_FULL_SETTLE_MS + SWAP_FULL_PAUSE_MS, false);
}

static void
test_watch (void **state)
{
  (void) state;
  uint64_t now = 1000 * MS * 1000;     /* 1000 s: any start will do */
  char problem[256];
  assert_int_equal (swap_full_prepare (problem, sizeof problem), 0);

  /* Memory to spare: a full device, but nothing killed. */
  write_file (meminfo_path, "MemTotal: 1048576 kB\nMemAvailable: 524288 kB\n");
  watch_for (&now, 3 * SWAP_FULL_AFTER_MS, true);
  assert_int_equal (kills_asked (), 0);
  quiet (&now);

  /* Memory short: refusals for SWAP_FULL_AFTER_MS ask for one kill. */
  write_file (meminfo_path, "MemTotal: 1048576 kB\nMemAvailable: 1024 kB\n");
  watch_for (&now, SWAP_FULL_AFTER_MS, true);   /* the first look starts it */
  assert_int_equal (kills_asked (), 0);
  watch_for (&now, SWAP_FULL_TICK_MS, true);
  assert_int_equal (kills_asked (), 1);
  quiet (&now);

  /* A gap in the looks between two halves of the refusals: the server
   * was stopped, not refusing for all that time; no kill until the
   * refusals after it have gone on for SWAP_FULL_AFTER_MS themselves.
   */
  watch_for (&now, SWAP_FULL_AFTER_MS / 2, true);
  now += SWAP_FULL_GAP_MS * MS;
  watch_for (&now, SWAP_FULL_AFTER_MS, true);
  assert_int_equal (kills_asked (), 1);
  watch_for (&now, SWAP_FULL_TICK_MS, true);
  assert_int_equal (kills_asked (), 2);
  quiet (&now);

  /* A grace asked for holds the kill off; its end (0) lets it come. */
  swap_full_grace (SWAP_FULL_GRACE_ASKED, now + 60000 * MS);
  watch_for (&now, 3 * SWAP_FULL_AFTER_MS, true);
  assert_int_equal (kills_asked (), 2);
  swap_full_grace (SWAP_FULL_GRACE_ASKED, now);
  watch_for (&now, SWAP_FULL_TICK_MS, true);
  assert_int_equal (kills_asked (), 3);
  quiet (&now);

  /* The two graces are kept apart: ending the asked one leaves a
   * restart's in force.
   */
  swap_full_grace (SWAP_FULL_GRACE_RESTART, now + 45000 * MS);
  swap_full_grace (SWAP_FULL_GRACE_ASKED, now + 60000 * MS);
  swap_full_grace (SWAP_FULL_GRACE_ASKED, now);
  watch_for (&now, 3 * SWAP_FULL_AFTER_MS, true);
  assert_int_equal (kills_asked (), 3);

  struct swap_full_status status;
  swap_full_status (&status);
  assert_int_equal (status.kills, 3);
}

/* The thresholds as parameters: swap_full_after, how long refusals go
 * on first; swap_full_available, what MemAvailable counts as short.
 */
static void
test_thresholds (void **state)
{
  (void) state;
  uint64_t now = 2000 * MS * 1000;     /* past the other test's graces */
  assert_int_equal (swap_full_after_parse ("100"), -1);
  assert_int_equal (swap_full_after_parse ("600001"), -1);
  assert_int_equal (swap_full_after_parse ("soon"), -1);
  assert_int_equal (swap_full_available_parse ("lots"), -1);
  assert_int_equal (swap_full_after_parse ("5000"), 0);
  long kills = kills_asked ();

  /* 50000 kB available of 1 GiB: above a thirty-second of RAM (32768
   * kB), so not short by default: nothing killed.
   */
  write_file (meminfo_path, "MemTotal: 1048576 kB\nMemAvailable: 50000 kB\n");
  quiet (&now);
  watch_for (&now, 3 * 5000, true);
  assert_int_equal (kills_asked (), kills);

  /* Short below 64M: refusals for 5000 ms (not SWAP_FULL_AFTER_MS) ask
   * for a kill.
   */
  quiet (&now);
  assert_int_equal (swap_full_available_parse ("64M"), 0);
  watch_for (&now, 5000, true);
  assert_int_equal (kills_asked (), kills);
  watch_for (&now, SWAP_FULL_TICK_MS, true);
  assert_int_equal (kills_asked (), kills + 1);

  swap_full_after_ms = SWAP_FULL_AFTER_MS;
  swap_full_available_kib = 0;
}

int
main (void)
{
  if (!mkdtemp (folder))
    return 1;
  snprintf (sysrq_path, sizeof sysrq_path, "%s/sysrq", folder);
  snprintf (meminfo_path, sizeof meminfo_path, "%s/meminfo", folder);
  snprintf (vmstat_path, sizeof vmstat_path, "%s/vmstat", folder);
  write_file (sysrq_path, "");
  write_file (vmstat_path, "nr_free_pages 1\nnr_writeback 0\n");
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_watch),
    cmocka_unit_test (test_thresholds),
  };
  int failed = cmocka_run_group_tests (tests, NULL, NULL);
  unlink (sysrq_path);
  unlink (meminfo_path);
  unlink (vmstat_path);
  rmdir (folder);
  return failed;
}
