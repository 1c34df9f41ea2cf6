/* A listening Unix socket of the server's own (the control channel's,
 * the standby's): owner only, and a socket left by a server that is
 * gone replaced.
 */
#ifndef ZRAM_UNIX_LISTEN_H
#define ZRAM_UNIX_LISTEN_H

#include <sys/stat.h>

/* Listen on path (what: the parameter, for messages).  A socket already
 * there that nobody answers on is removed first; one that answers, or
 * anything that is not a socket, is refused.  The socket (mode: 0600,
 * the owner only, or 0666 for a read-only socket; close-on-exec), with
 * the name's identity in *bound, or -1 after nbdkit_error.
 */
extern int unix_listen (const char *path, const char *what,
                        struct stat *bound, mode_t mode);
/* Remove path if it is still the name unix_listen bound: a server that
 * exits late must not remove the socket of the one that replaced it.
 */
extern void unix_unlink (const char *path, const struct stat *bound);

#endif /* ZRAM_UNIX_LISTEN_H */
