/* The server's entry in the registry: see registry.h, registry-dir.h. */

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "error-text.h"
#include "registry-dir.h"
#include "registry.h"

/* The link registry_add made (empty: none), and what it was. */
static char link_path[PATH_MAX];
static struct stat link_made;

/* The entry's path for name in dir: NAME.ctl, or NAME-PID.ctl when a live
 * server has NAME.ctl; without a name (NULL), zram-PID.ctl: servers
 * started at once without names never race for one entry.  0, or -1 if
 * it does not fit.
 */
static int
entry_path (const char *dir, const char *name, char *path, size_t size)
{
  if (!name) {
    int r = snprintf (path, size, "%s/zram-%ld" REGISTRY_SUFFIX, dir,
                      (long) getpid ());
    return r >= 0 && (size_t) r < size ? 0 : -1;
  }
  char file[128];
  size_t n = 0;
  for (const char *c = name; *c && n < sizeof file - 1; c++, n++) {
    bool kept = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')
      || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-'
      || (*c == '.' && n > 0);
    file[n] = kept ? *c : '_';
  }
  file[n] = '\0';
  int r = snprintf (path, size, "%s/%s" REGISTRY_SUFFIX, dir, file);
  if (r >= 0 && (size_t) r < size && registry_socket_answers (path) == 1)
    r = snprintf (path, size, "%s/%s-%ld" REGISTRY_SUFFIX, dir, file,
                  (long) getpid ());
  return r >= 0 && (size_t) r < size ? 0 : -1;
}

/* Links of this user's in dir to ctl_path: left by a server that served
 * there and died (a standby that took over listens there now, or a
 * server restarted with the same ctl=).  The socket is this server's
 * now, so they would list it twice: removed.
 */
static void
links_to_remove (const char *dir, const char *ctl_path)
{
  DIR *d = opendir (dir);
  if (!d)
    return;
  struct dirent *entry;
  while ((entry = readdir (d))) {
    char path[PATH_MAX], target[PATH_MAX];
    struct stat st;
    if (snprintf (path, sizeof path, "%s/%s", dir, entry->d_name)
        >= (int) sizeof path
        || lstat (path, &st) == -1 || !S_ISLNK (st.st_mode)
        || st.st_uid != geteuid ())
      continue;
    ssize_t n = readlink (path, target, sizeof target - 1);
    if (n <= 0)
      continue;
    target[n] = '\0';
    if (strcmp (target, ctl_path) == 0)
      registry_remove_if_same (dir, path, &st);
  }
  closedir (d);
}

char *
registry_default_ctl (const char *name)
{
  char dir[PATH_MAX], path[PATH_MAX];
  if (registry_dir (dir, sizeof dir, true) == -1) {
    nbdkit_debug ("registry: none (%s): no control channel without ctl=",
                  error_text (errno));
    return NULL;
  }
  if (entry_path (dir, name, path, sizeof path) == -1)
    return NULL;
  return strdup (path);
}

void
registry_add (const char *name, const char *ctl_path)
{
  char dir[PATH_MAX], path[PATH_MAX];
  if (registry_dir (dir, sizeof dir, true) == -1) {
    nbdkit_debug ("registry: none (%s): %s is not registered",
                  error_text (errno), ctl_path);
    return;
  }
  size_t length = strlen (dir);
  if (strncmp (ctl_path, dir, length) == 0 && ctl_path[length] == '/'
      && !strchr (ctl_path + length + 1, '/'))
    return;                     /* the socket is the entry */
  links_to_remove (dir, ctl_path);
  if (entry_path (dir, name, path, sizeof path) == -1)
    return;
  /* A stale entry (nobody answers there) of this user's goes; anything
   * else at the name is left alone, and this server is not registered.
   * Judged after the lstat, removed only if still that file.
   */
  struct stat st;
  if (lstat (path, &st) == 0 && st.st_uid == geteuid ()
      && (S_ISLNK (st.st_mode) || S_ISSOCK (st.st_mode))
      && registry_socket_answers (path) == 0)
    registry_remove_if_same (dir, path, &st);
  if (symlink (ctl_path, path) == -1 || lstat (path, &link_made) == -1) {
    nbdkit_debug ("registry: %s: %s", path, error_text (errno));
    return;
  }
  snprintf (link_path, sizeof link_path, "%s", path);
}

void
registry_remove (void)
{
  struct stat st;
  if (link_path[0] && lstat (link_path, &st) == 0 && S_ISLNK (st.st_mode)
      && st.st_dev == link_made.st_dev && st.st_ino == link_made.st_ino)
    unlink (link_path);
  link_path[0] = '\0';
}
