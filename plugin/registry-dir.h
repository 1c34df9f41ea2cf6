/* The registry: the one directory where every server puts its control
 * socket, or a link to it, so that nbdkit-zramctl finds every server
 * without being told (zramctl lists every zram device).
 *
 *   root         /run/nbdkit-zram
 *   a user       $XDG_RUNTIME_DIR/nbdkit-zram (none without XDG_RUNTIME_DIR)
 *   either       $NBDKIT_ZRAM_RUNTIME_DIR when set (the tests)
 *
 * An entry is NAME.ctl: the control socket itself (a server given no
 * ctl= listens there), or a symbolic link to it (a server given ctl=
 * elsewhere).  NAME is the server's name= made a file name (letters,
 * digits, '.', '_' and '-'; anything else '_'), with "-PID" after it
 * when a live server has that entry already; zram-PID without a name.
 *
 * The directory is used only if it is a directory (not a link to one),
 * owned by this user, and writable by nobody else; it is made (mode 0755
 * for root, 0700 for a user) when missing.  Both the plugin and
 * nbdkit-zramctl read it here, so that they agree on it.
 */
#ifndef ZRAM_REGISTRY_DIR_H
#define ZRAM_REGISTRY_DIR_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define REGISTRY_SUFFIX ".ctl"

/* The registry's path into dir: 0, or -1 with errno (ENOENT: there is
 * none for this user; EPERM: it is not safe to use, see above).  make:
 * create it when missing.
 */
static inline int
registry_dir (char *dir, size_t size, bool make)
{
  const char *forced = getenv ("NBDKIT_ZRAM_RUNTIME_DIR");
  const char *runtime = getenv ("XDG_RUNTIME_DIR");
  int n;
  if (forced && *forced)
    n = snprintf (dir, size, "%s", forced);
  else if (geteuid () == 0)
    n = snprintf (dir, size, "/run/nbdkit-zram");
  else if (runtime && *runtime == '/')
    n = snprintf (dir, size, "%s/nbdkit-zram", runtime);
  else {
    errno = ENOENT;
    return -1;
  }
  if (n < 0 || (size_t) n >= size) {
    errno = ENAMETOOLONG;
    return -1;
  }
  struct stat st;
  if (lstat (dir, &st) == -1) {
    if (errno != ENOENT || !make
        || (mkdir (dir, geteuid () == 0 ? 0755 : 0700) == -1 && errno != EEXIST)
        || lstat (dir, &st) == -1)
      return -1;
  }
  if (!S_ISDIR (st.st_mode) || st.st_uid != geteuid ()
      || (st.st_mode & (S_IWGRP | S_IWOTH))) {
    errno = EPERM;
    return -1;
  }
  return 0;
}

#endif /* ZRAM_REGISTRY_DIR_H */
