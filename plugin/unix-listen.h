/* A listening Unix socket of the server's own (the control channel's,
 * the standby's): owner only, and a socket left by a server that is
 * gone replaced.
 */
#ifndef ZRAM_UNIX_LISTEN_H
#define ZRAM_UNIX_LISTEN_H

/* Listen on path (what: the parameter, for messages).  A socket already
 * there that nobody answers on is removed first; one that answers, or
 * anything that is not a socket, is refused.  The socket (mode 0600,
 * close-on-exec), or -1 after nbdkit_error.
 */
extern int unix_listen (const char *path, const char *what);

#endif /* ZRAM_UNIX_LISTEN_H */
