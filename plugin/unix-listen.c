/* A listening Unix socket: see unix-listen.h. */

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "error-text.h"
#include "unix-listen.h"

int
unix_listen (const char *path, const char *what, struct stat *bound,
             mode_t mode)
{
  struct sockaddr_un address = { .sun_family = AF_UNIX };
  if (strlen (path) >= sizeof address.sun_path) {
    nbdkit_error ("%s: '%s' is too long for a socket name (%zu bytes at most)",
                  what, path, sizeof address.sun_path - 1);
    return -1;
  }
  strcpy (address.sun_path, path);

  int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1) {
    nbdkit_error ("%s: socket: %s", what, error_text (errno));
    return -1;
  }
  /* A socket left by a server that is gone is replaced; anything else
   * that is there is not touched.
   */
  struct stat st;
  if (lstat (path, &st) == 0) {
    if (!S_ISSOCK (st.st_mode)) {
      nbdkit_error ("%s: '%s' exists and is not a socket", what, path);
      close (fd);
      return -1;
    }
    if (connect (fd, (struct sockaddr *) &address, sizeof address) == 0) {
      nbdkit_error ("%s: '%s' is in use by another server", what, path);
      close (fd);
      return -1;
    }
    unlink (path);
  }
  /* Its mode from the moment it exists. */
  mode_t old_mask = umask (0777 & ~mode);
  int r = bind (fd, (struct sockaddr *) &address, sizeof address);
  umask (old_mask);
  if (r == -1 || listen (fd, SOMAXCONN) == -1) {
    nbdkit_error ("%s: cannot listen on '%s': %s", what, path,
                  error_text (errno));
    close (fd);
    if (r == 0)
      unlink (path);            /* bound, not listening: not left behind */
    return -1;
  }
  if (lstat (path, bound) == -1) {
    nbdkit_error ("%s: '%s': %s", what, path, error_text (errno));
    close (fd);
    return -1;
  }
  return fd;
}

void
unix_unlink (const char *path, const struct stat *bound)
{
  struct stat now;
  if (lstat (path, &now) == 0 && now.st_dev == bound->st_dev
      && now.st_ino == bound->st_ino)
    unlink (path);
}
