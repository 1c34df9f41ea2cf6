/* What the plugin reads from /proc: see proc-files.h. */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc-files.h"

int64_t
meminfo_kib (const char *text, const char *key)
{
  const char *at = strstr (text, key);
  return at ? strtoll (at + strlen (key), NULL, 10) : -1;
}

int64_t
self_status_number (const char *name, int base)
{
  FILE *fp = fopen ("/proc/self/status", "r");
  if (!fp)
    return -1;
  char line[256];
  size_t length = strlen (name);
  int64_t value = -1;
  while (fgets (line, sizeof line, fp))
    if (strncmp (line, name, length) == 0 && line[length] == ':') {
      value = strtoll (line + length + 1, NULL, base);
      break;
    }
  fclose (fp);
  return value;
}

int64_t
sysctl_number (const char *path)
{
  FILE *fp = fopen (path, "r");
  int64_t value = -1;
  if (fp) {
    if (fscanf (fp, "%" SCNd64, &value) != 1)
      value = -1;
    fclose (fp);
  }
  return value;
}
