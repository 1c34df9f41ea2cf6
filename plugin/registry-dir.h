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
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
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

/* Whether a server answers on the socket at path (following a link):
 * 1 it does, 0 nobody does (refused, or nothing there), -1 cannot tell.
 */
static inline int
registry_socket_answers (const char *path)
{
  struct sockaddr_un address = { .sun_family = AF_UNIX };
  if (strlen (path) >= sizeof address.sun_path)
    return -1;
  strcpy (address.sun_path, path);
  int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return -1;
  int r = connect (fd, (struct sockaddr *) &address, sizeof address);
  int err = errno;
  close (fd);
  if (r == 0)
    return 1;
  return err == ECONNREFUSED || err == ENOENT ? 0 : -1;
}

/* Remove the entry path of dir if it is still the file judged (its
 * device and inode, from an lstat made before it was judged stale): the
 * name is claimed first, by a rename to a name of this process's own in
 * the same directory, so that an entry a server put there since the
 * judgement is never removed; one that is not the file judged goes back
 * to its name (unless a newer one has that name by then: it stays
 * under the claimed name, a dead entry the next listing skips).
 * 0 removed, -1 not.
 */
static inline int
registry_remove_if_same (const char *dir, const char *path,
                         const struct stat *judged)
{
  char claim[PATH_MAX];
  int n = snprintf (claim, sizeof claim, "%s/.claim-%ld", dir, (long) getpid ());
  if (n < 0 || (size_t) n >= sizeof claim || rename (path, claim) == -1)
    return -1;
  struct stat now;
  if (lstat (claim, &now) == 0 && now.st_dev == judged->st_dev
      && now.st_ino == judged->st_ino) {
    unlink (claim);
    return 0;
  }
  renameat2 (AT_FDCWD, claim, AT_FDCWD, path, RENAME_NOREPLACE);
  return -1;
}

#endif /* ZRAM_REGISTRY_DIR_H */
