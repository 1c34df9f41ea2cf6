/* Passing a descriptor over a Unix socket, as a holder of a region's
 * memfd does (tests/test-alloc-region.c, tests/test-store-handover.c).
 */
#ifndef ZRAM_TESTS_FD_PASS_H
#define ZRAM_TESTS_FD_PASS_H

#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* In a child: send fd, or exit 2. */
static inline void
fd_send (int sock, int fd)
{
  char byte = 0;
  struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
  union { struct cmsghdr align; char buf[CMSG_SPACE (sizeof (int))]; } control;
  struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = control.buf,
                        .msg_controllen = sizeof control.buf };
  struct cmsghdr *cmsg = CMSG_FIRSTHDR (&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN (sizeof (int));
  memcpy (CMSG_DATA (cmsg), &fd, sizeof fd);
  if (sendmsg (sock, &msg, 0) != 1)
    _exit (2);
}

/* The descriptor sent, or -1. */
static inline int
fd_receive (int sock)
{
  char byte;
  struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
  union { struct cmsghdr align; char buf[CMSG_SPACE (sizeof (int))]; } control;
  struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = control.buf,
                        .msg_controllen = sizeof control.buf };
  if (recvmsg (sock, &msg, 0) != 1)
    return -1;
  struct cmsghdr *cmsg = CMSG_FIRSTHDR (&msg);
  if (!cmsg || cmsg->cmsg_type != SCM_RIGHTS)
    return -1;
  int fd;
  memcpy (&fd, CMSG_DATA (cmsg), sizeof fd);
  return fd;
}

#endif /* ZRAM_TESTS_FD_PASS_H */
