/* The kernel's nbd device attached to a server through the driver's
 * netlink interface, with a dead-connection timeout (tools/nbd-attach.c).
 */
#ifndef ZRAM_NBD_ATTACH_H
#define ZRAM_NBD_ATTACH_H

#include <stdbool.h>
#include <stdint.h>

/* Seconds the driver keeps requests queued for a server that is gone. */
#define NBD_DEAD_CONN_TIMEOUT_DEFAULT 120

#define NBD_CONNECTIONS_MAX 16
/* The longest export name asked for (the protocol's bound is 4096). */
#define NBD_EXPORT_NAME_MAX 4096

/* Attach device (/dev/nbdN) to export (NULL or "": the default) of the
 * server at socket_path with connections sockets (reconnect: give an
 * attached device whose server died the new server's sockets).  0, or
 * -1 after a message.
 */
extern int nbd_attach (const char *device, const char *socket_path,
                       const char *export, bool reconnect,
                       unsigned connections, unsigned dead_conn_timeout,
                       unsigned block_size);
/* nbd_attach in two steps, so that the sockets can be made ahead (a
 * standby server's: tools/supervise.c).  nbd_connect: connections
 * sockets to the server at socket_path, each through the handshake
 * (at most 10 s each), in socks[], with the export's size and flags;
 * 0, or -1 after a message with none left open.  nbd_attach_sockets:
 * give them to device (the caller closes its own copies after: the
 * kernel holds references of its own); 0, or -1 after a message.
 */
extern int nbd_connect (const char *socket_path, const char *export,
                        unsigned connections, int *socks, uint64_t *size,
                        uint16_t *flags);
extern int nbd_attach_sockets (const char *device, const int *socks,
                               unsigned count, bool reconnect, uint64_t size,
                               uint16_t flags, unsigned dead_conn_timeout,
                               unsigned block_size);
extern void nbd_close (const int *socks, unsigned count);
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
/* The driver's link-dead notices for device: it marks a connection dead
 * when its server goes, and also when a request on it meets the request
 * timeout - a live server then loses the connection, and nothing but a
 * reconnect gives it back (tools/supervise.c watches for that).
 * nbd_watch_open: NULL after a message; nbd_watch_fd: to poll;
 * nbd_watch_link_dead: reads what is pending, true if a notice for the
 * device was among it.
 */
struct nbd_watch;
extern struct nbd_watch *nbd_watch_open (const char *device);
extern int nbd_watch_fd (const struct nbd_watch *watch);
extern bool nbd_watch_link_dead (struct nbd_watch *watch);
/* `nbdkit-zramctl nbd ...`: the exit status. */
extern int run_nbd (int argc, char **argv);

#endif /* ZRAM_NBD_ATTACH_H */
