/* Where this server serves: the sockets the process listens on, as
 * zramctl's MOUNTPOINT says where a device is used.  nbdkit gives a
 * plugin no word of its listening sockets, so they are found the way
 * ss(8) finds them: the process's socket descriptors (/proc/self/fd)
 * matched by inode with the listening sockets of /proc/net/unix,
 * /proc/net/tcp and /proc/net/tcp6.
 */
#ifndef ZRAM_LISTEN_ADDRESS_H
#define ZRAM_LISTEN_ADDRESS_H

#include <stdio.h>

/* Write the listening addresses, space-separated, to out: unix:PATH,
 * tcp:A.B.C.D:PORT, tcp:[IPV6]:PORT; the Unix sockets whose paths are in
 * skip (NULL-terminated: the control sockets) left out.  Nothing when
 * none is found (an inherited socket, --run's, /proc not mounted).
 * Returns how many it wrote.
 */
extern unsigned listen_addresses_print (FILE *out, const char *const *skip);

#endif /* ZRAM_LISTEN_ADDRESS_H */
