/* conncut: shut down the NBD connections of a running server, the server
 * left running (the nbd swap guest's "cut" restart kind).  Built
 * statically on the host:  cc -static -O2 -o conncut tests/vm-nbd/conncut.c
 *
 * Usage: conncut PID
 *        conncut -w PIDFILE OLDPID
 *
 * -w: first wait (polling every 2 ms, up to 60 s) until PIDFILE names
 * another process than OLDPID - a restart's new server, whose pid file
 * the supervisor renames once the driver has taken its sockets - then
 * cut that one's: the cut lands within milliseconds of the reconnect,
 * where the driver's own late shutdown landed (a shell loop of greps
 * took seconds in the swapping guest).
 *
 * Every connected stream socket of PID that nbdkit accepted on its NBD
 * socket (its address's last part starts with "sock": DIR/sock,
 * DIR/sock.standby - not the control channel's) is taken with
 * pidfd_getfd and shut down both ways.  The kernel's nbd driver then
 * reads the end of its connection and marks it dead, as it did to a new
 * connection on its own when a late receive worker of the old one shut
 * the new socket down right after a restart's reconnect (Linux 6.1):
 * the supervisor must restart again rather than leave the device to its
 * dead-connection timeout.  Prints how many it cut; exit 1 if none.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

/* The pid PIDFILE names, or -1. */
static int
pid_file_read (const char *path)
{
  char text[32];
  int fd = open (path, O_RDONLY);
  if (fd == -1)
    return -1;
  ssize_t got = read (fd, text, sizeof text - 1);
  close (fd);
  if (got <= 0)
    return -1;
  text[got] = '\0';
  return atoi (text);
}

int
main (int argc, char **argv)
{
  int pid;
  if (argc == 4 && strcmp (argv[1], "-w") == 0) {
    int old = atoi (argv[3]);
    const struct timespec pause = { 0, 2000000 };
    for (unsigned i = 0; (pid = pid_file_read (argv[2])) <= 0 || pid == old;
         i++) {
      if (i == 30000) {
        fprintf (stderr, "conncut: %s still names %d after 60 s\n", argv[2],
                 old);
        return 2;
      }
      nanosleep (&pause, NULL);
    }
  }
  else if (argc == 2)
    pid = atoi (argv[1]);
  else {
    fprintf (stderr, "usage: conncut PID | conncut -w PIDFILE OLDPID\n");
    return 2;
  }
  int pidfd = syscall (SYS_pidfd_open, pid, 0);
  if (pidfd == -1) {
    perror ("conncut: pidfd_open");
    return 2;
  }
  char fd_dir[64];
  snprintf (fd_dir, sizeof fd_dir, "/proc/%d/fd", pid);
  DIR *dir = opendir (fd_dir);
  if (!dir) {
    perror (fd_dir);
    return 2;
  }
  unsigned cut = 0;
  struct dirent *entry;
  while ((entry = readdir (dir))) {
    if (entry->d_name[0] == '.')
      continue;
    int fd = syscall (SYS_pidfd_getfd, pidfd, atoi (entry->d_name), 0);
    if (fd == -1)
      continue;
    int type = 0, listening = 1;
    socklen_t length = sizeof type;
    struct sockaddr_un address = { 0 };
    socklen_t address_length = sizeof address;
    if (getsockopt (fd, SOL_SOCKET, SO_TYPE, &type, &length) == 0
        && type == SOCK_STREAM
        && (length = sizeof listening,
            getsockopt (fd, SOL_SOCKET, SO_ACCEPTCONN, &listening,
                        &length)) == 0
        && !listening
        && getsockname (fd, (struct sockaddr *) &address,
                        &address_length) == 0
        && address.sun_family == AF_UNIX && address.sun_path[0]) {
      const char *slash = strrchr (address.sun_path, '/');
      const char *name = slash ? slash + 1 : address.sun_path;
      if (strncmp (name, "sock", 4) == 0 && shutdown (fd, SHUT_RDWR) == 0)
        cut++;
    }
    close (fd);
  }
  closedir (dir);
  printf ("cut %u connections of pid %d\n", cut, pid);
  return cut ? 0 : 1;
}
