/* The registry's directory rules and its claim-then-remove
 * (plugin/registry-dir.h): a directory others may write refused, a
 * stale entry removed only while it is still the file judged, and one
 * a server put at the name after the judgement left in place.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "registry-dir.h"

static char folder[] = "/tmp/test-registry-dir.XXXXXX";

static void
make_file (const char *path)
{
  FILE *fp = fopen (path, "w");
  assert_non_null (fp);
  fclose (fp);
}

static void
test_dir_rules (void **state)
{
  (void) state;
  char dir[1024], got[PATH_MAX];
  snprintf (dir, sizeof dir, "%s/registry", folder);
  setenv ("NBDKIT_ZRAM_RUNTIME_DIR", dir, 1);
  /* Missing: made only when asked to. */
  assert_int_equal (registry_dir (got, sizeof got, false), -1);
  assert_int_equal (errno, ENOENT);
  assert_int_equal (registry_dir (got, sizeof got, true), 0);
  assert_string_equal (got, dir);
  /* Writable by others: refused. */
  assert_int_equal (chmod (dir, 0777), 0);
  assert_int_equal (registry_dir (got, sizeof got, false), -1);
  assert_int_equal (errno, EPERM);
  assert_int_equal (chmod (dir, 0700), 0);
  /* A link to a directory: refused. */
  char link_path[1024];
  snprintf (link_path, sizeof link_path, "%s/link", folder);
  assert_int_equal (symlink (dir, link_path), 0);
  setenv ("NBDKIT_ZRAM_RUNTIME_DIR", link_path, 1);
  assert_int_equal (registry_dir (got, sizeof got, false), -1);
  assert_int_equal (errno, EPERM);
  unlink (link_path);
  setenv ("NBDKIT_ZRAM_RUNTIME_DIR", dir, 1);
}

static void
test_remove_if_same (void **state)
{
  (void) state;
  char dir[1024], entry[PATH_MAX], other[PATH_MAX];
  snprintf (dir, sizeof dir, "%s/registry", folder);
  snprintf (entry, sizeof entry, "%s/old.ctl", dir);
  snprintf (other, sizeof other, "%s/new", folder);
  struct stat judged, now;

  /* Still the file judged: removed. */
  make_file (entry);
  assert_int_equal (lstat (entry, &judged), 0);
  assert_int_equal (registry_remove_if_same (dir, entry, &judged), 0);
  assert_int_equal (lstat (entry, &now), -1);

  /* Replaced after the judgement (a server registered anew): left, at
   * its name, and nothing else left behind.
   */
  make_file (entry);
  assert_int_equal (lstat (entry, &judged), 0);
  make_file (other);
  assert_int_equal (rename (other, entry), 0);
  assert_int_equal (registry_remove_if_same (dir, entry, &judged), -1);
  assert_int_equal (lstat (entry, &now), 0);
  assert_true (now.st_ino != judged.st_ino);
  char claim[PATH_MAX];
  snprintf (claim, sizeof claim, "%s/.claim-%ld", dir, (long) getpid ());
  assert_int_equal (lstat (claim, &now), -1);
  unlink (entry);

  /* Nothing there any more: nothing done. */
  assert_int_equal (registry_remove_if_same (dir, entry, &judged), -1);
}

int
main (void)
{
  if (!mkdtemp (folder))
    return 1;
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_dir_rules),
    cmocka_unit_test (test_remove_if_same),
  };
  int failed = cmocka_run_group_tests (tests, NULL, NULL);
  char command[PATH_MAX + 16];
  snprintf (command, sizeof command, "rm -rf '%s'", folder);
  if (system (command) != 0)
    failed++;
  return failed;
}
