/* Unit tests for the supervisor's log (tools/supervise-log.h): lines
 * with their times, a child's output by its pid, every page of the file
 * locked in memory, the file kept to its bound at a line's start, and a
 * file a user planted refused.
 *
 * The log is one per process (the supervisor's), so the cases run in
 * order in one process: the refusals first, then one log.
 */

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "supervise-log.h"

/* ASan's and TSan's runtimes make mlock and mlockall do nothing. */
#if defined (__SANITIZE_ADDRESS__) || defined (__SANITIZE_THREAD__)
#define SANITIZER_IGNORES_MLOCK 1
#elif defined (__has_feature)
#if __has_feature (address_sanitizer) || __has_feature (thread_sanitizer)
#define SANITIZER_IGNORES_MLOCK 1
#endif
#endif
#ifndef SANITIZER_IGNORES_MLOCK
#define SANITIZER_IGNORES_MLOCK 0
#endif

static char dir[] = "/tmp/test-supervise-log.XXXXXX";
static char path[sizeof dir + 32];

/* The whole file, NUL-terminated (free it). */
static char *
log_read (size_t *length)
{
  int fd = open (path, O_RDONLY);
  assert_true (fd >= 0);
  struct stat st;
  assert_int_equal (fstat (fd, &st), 0);
  char *text = malloc (st.st_size + 1);
  assert_non_null (text);
  assert_int_equal (read (fd, text, st.st_size), st.st_size);
  text[st.st_size] = '\0';
  close (fd);
  *length = st.st_size;
  return text;
}

/* kB of the log's mapping locked in memory (smaps' Locked). */
static long
log_locked_kib (void)
{
  FILE *fp = fopen ("/proc/self/smaps", "r");
  assert_non_null (fp);
  char line[4096];
  bool in_log = false;
  long locked = -1;
  while (fgets (line, sizeof line, fp)) {
    /* A mapping's first line starts with its range; its fields' lines
     * with a name and a colon.
     */
    size_t first_word = strcspn (line, " ");
    if (first_word > 0 && line[first_word - 1] != ':')
      in_log = strstr (line, path) != NULL;
    if (in_log && sscanf (line, "Locked: %ld kB", &locked) == 1)
      break;
  }
  fclose (fp);
  return locked;
}

/* A line as the log writes it: time, monotonic seconds, the writer. */
static void
assert_line_shape (const char *line, const char *writer_and_text)
{
  regex_t shape;
  char pattern[512];
  snprintf (pattern, sizeof pattern, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}"
            "\\.[0-9]{3}Z \\[ *[0-9]+\\.[0-9]{3}\\] %s$", writer_and_text);
  assert_int_equal (regcomp (&shape, pattern, REG_EXTENDED | REG_NOSUB
                             | REG_NEWLINE), 0);
  if (regexec (&shape, line, 0, NULL, 0) != 0)
    fail_msg ("no line matches /%s/ in:\n%s", pattern, line);
  regfree (&shape);
}

static void
test_planted_files_refused (void **state)
{
  (void) state;
  /* A link: never followed. */
  assert_int_equal (symlink ("/etc/passwd", path), 0);
  errno = 0;
  assert_false (supervise_log_open (dir));
  assert_int_equal (errno, ELOOP);
  unlink (path);
  /* Another user's file (root only can make one to test with). */
  if (geteuid () == 0) {
    int fd = open (path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    assert_true (fd >= 0);
    assert_int_equal (fchown (fd, 65534, 65534), 0);
    close (fd);
    errno = 0;
    assert_false (supervise_log_open (dir));
    assert_int_equal (errno, EPERM);
    unlink (path);
  }
  else
    print_message ("another user's file: not tried (not root)\n");
}

static void
test_lines_and_children (void **state)
{
  (void) state;
  assert_true (supervise_log_open (dir));
  supervise_log ("restart %d (%s): down %.3f s", 1, "Killed", 0.25);
  /* A child's output: whole lines, and a last one without its newline,
   * each under the child's pid.
   */
  int child_end, our_end = supervise_log_pipe (&child_end);
  assert_true (our_end >= 0 && child_end >= 0);
  pid_t pid = fork ();
  assert_true (pid != -1);
  if (pid == 0) {
    dup2 (child_end, 2);
    dprintf (2, "nbdkit: first\nnbdkit: second\nno newline");
    _exit (0);
  }
  close (child_end);
  supervise_log_child (our_end, pid);
  assert_int_equal (waitpid (pid, NULL, 0), pid);
  /* The flush waits for what is readable; the last piece comes with the
   * pipe's end, read right after.
   */
  usleep (100000);
  supervise_log_flush ();
  size_t length;
  char *text = log_read (&length);
  char expected[128];
  assert_line_shape (text, "supervisor: restart 1 \\(Killed\\): down 0\\.250 s");
  snprintf (expected, sizeof expected, "pid %d: nbdkit: first", (int) pid);
  assert_line_shape (text, expected);
  snprintf (expected, sizeof expected, "pid %d: nbdkit: second", (int) pid);
  assert_line_shape (text, expected);
  snprintf (expected, sizeof expected, "pid %d: no newline", (int) pid);
  assert_line_shape (text, expected);
  assert_int_equal (text[length - 1], '\n');
  free (text);
}

static void
test_pages_locked (void **state)
{
  (void) state;
  /* The file grows by pages: each new one is locked as it comes. */
  for (int i = 0; i < 200; i++)
    supervise_log ("line %d of a file that grows past one page", i);
  supervise_log_flush ();
  size_t length;
  free (log_read (&length));
  long locked = log_locked_kib ();
  struct rlimit limit;
  getrlimit (RLIMIT_MEMLOCK, &limit);
  if (locked == 0 && limit.rlim_cur < (1u << 20)) {
    print_message ("pages locked: not checked (RLIMIT_MEMLOCK %lu bytes "
                   "refuses mlock here)\n", (unsigned long) limit.rlim_cur);
    return;
  }
  if (locked == 0 && SANITIZER_IGNORES_MLOCK) {
    print_message ("pages locked: not checked (the sanitizer's runtime "
                   "makes mlock do nothing)\n");
    return;
  }
  print_message ("log: %zu bytes, %ld KiB locked\n", length, locked);
  assert_true (locked >= (long) ((length + 4095) / 4096 * 4));
}

static void
test_bounded (void **state)
{
  (void) state;
  /* 2.5 MiB of lines: the file stays within 1 MiB, starts at a line's
   * start and ends with the last line.
   */
  for (int i = 0; i < 25000; i++) {
    supervise_log ("filler %06d: %s", i, "................................"
                   "......................................................");
    if (i % 1000 == 999)
      supervise_log_flush ();
  }
  supervise_log_flush ();
  size_t length;
  char *text = log_read (&length);
  print_message ("log after 25000 lines: %zu bytes\n", length);
  assert_true (length <= (1u << 20));
  assert_true (length >= (1u << 19) - 4096);
  assert_line_shape (text, "supervisor: filler [0-9]{6}: \\.+");
  assert_memory_equal (text + 4, "-", 1);
  assert_non_null (strstr (text, "filler 024999: "));
  assert_int_equal (text[length - 1], '\n');
  free (text);
  unlink (path);
  rmdir (dir);
}

int
main (void)
{
  if (!mkdtemp (dir)) {
    perror ("mkdtemp");
    return 1;
  }
  snprintf (path, sizeof path, "%s/supervisor.log", dir);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_planted_files_refused),
    cmocka_unit_test (test_lines_and_children),
    cmocka_unit_test (test_pages_locked),
    cmocka_unit_test (test_bounded),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
