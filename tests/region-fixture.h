/* The region tests' shared fixture (tests/test-alloc-region.c,
 * tests/test-store-handover.c): region files in a folder of the run's
 * own, and the attach a test expects to succeed.
 */
#ifndef ZRAM_TESTS_REGION_FIXTURE_H
#define ZRAM_TESTS_REGION_FIXTURE_H

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "region.h"

static char region_folder[64];

/* A region file's path in the run's folder (made on first use). */
static inline const char *
region_path (const char *name)
{
  static char path[128];
  if (!region_folder[0]) {
    snprintf (region_folder, sizeof region_folder, "/tmp/%s-XXXXXX",
              program_invocation_short_name);
    assert_non_null (mkdtemp (region_folder));
  }
  snprintf (path, sizeof path, "%s/%s", region_folder, name);
  return path;
}

/* The run's folder, removed at the end (empty unless a test failed). */
static inline void
region_folder_remove (void)
{
  if (region_folder[0])
    rmdir (region_folder);
}

/* Attach the region at path, which must succeed and have been left as
 * want says.
 */
static inline struct region_owner *
region_attach_expecting (const char *path, uint64_t device_bytes,
                         enum region_attach_result want)
{
  enum region_attach_result how;
  char why[256] = "";
  struct region_owner *owner = region_attach (path, device_bytes, &how, why,
                                              sizeof why);
  if (!owner)
    fail_msg ("region_attach: %s", why);
  assert_int_equal (how, want);
  return owner;
}

#endif /* ZRAM_TESTS_REGION_FIXTURE_H */
