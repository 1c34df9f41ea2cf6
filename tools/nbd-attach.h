/* The kernel's nbd device attached to a server through the driver's
 * netlink interface, with a dead-connection timeout (tools/nbd-attach.c).
 */
#ifndef ZRAM_NBD_ATTACH_H
#define ZRAM_NBD_ATTACH_H

#include <stdbool.h>

/* Seconds the driver keeps requests queued for a server that is gone. */
#define NBD_DEAD_CONN_TIMEOUT_DEFAULT 120

#define NBD_CONNECTIONS_MAX 16

/* Attach device (/dev/nbdN) to the server at socket_path with
 * connections sockets (reconnect: give an attached device whose server
 * died the new server's sockets).  0, or -1 after a message.
 */
extern int nbd_attach (const char *device, const char *socket_path,
                       bool reconnect, unsigned connections,
                       unsigned dead_conn_timeout, unsigned block_size);
extern int nbd_detach (const char *device);
/* The driver's request timeout (0: none, the default).  With none, a
 * request sent to a server that died is never sent again: the driver
 * only warns of it every 30 s ("Possible stuck request") - and so swap
 * pages stay under writeback for good.  With one, the driver's timeout
 * handler puts it back in the queue, for the current socket; it marks
 * that socket dead only if the request was sent on it.  0, or -1 after
 * a message.
 */
extern int nbd_set_request_timeout (const char *device, unsigned seconds);
/* `nbdkit-zramctl nbd ...`: the exit status. */
extern int run_nbd (int argc, char **argv);

#endif /* ZRAM_NBD_ATTACH_H */
