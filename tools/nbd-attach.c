/* `nbdkit-zramctl nbd connect|reconnect|disconnect`: the kernel's nbd
 * device attached to a server's Unix socket through the nbd driver's
 * netlink interface, with a dead-connection timeout, so that the device
 * (and a swap area on it) outlives a server that restarts: while no
 * server answers, the driver keeps every request (those sent and not
 * answered included) queued for up to the timeout; `reconnect` gives it
 * the new server's socket (NBD_CMD_RECONFIGURE) and the driver sends
 * them again there.  nbd-client cannot do this (it has no reconfigure,
 * and its -persist is not reliable), so this does the NBD handshake
 * (fixed newstyle, NBD_OPT_GO) and the netlink calls itself, as rbd-nbd
 * does.
 */

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>
#include <endian.h>

#include <linux/nbd-netlink.h>
#include <netlink/genl/ctrl.h>
#include <netlink/genl/genl.h>
#include <netlink/netlink.h>

#include "nbd-attach.h"

#define NBD_MAGIC 0x4e42444d41474943ull         /* "NBDMAGIC" */
#define NBD_OPTS_MAGIC 0x49484156454f5054ull    /* "IHAVEOPT" */
#define NBD_REP_MAGIC 0x3e889045565a9ull
#define NBD_FLAG_FIXED_NEWSTYLE 1
#define NBD_FLAG_NO_ZEROES 2
#define NBD_OPT_GO 7
#define NBD_REP_ACK 1
#define NBD_REP_INFO 3
#define NBD_INFO_EXPORT 0

static const char *program = "nbdkit-zramctl";

/* How long the handshake may take: a server that accepts and then says
 * nothing (stuck, or not an NBD server) must not hold up the caller - the
 * supervisor, whose device waits for its next try.
 */
#define HANDSHAKE_TIMEOUT_S 10

/* The socket's send and receive timeouts (0: none, as the kernel's
 * driver must find them).
 */
static void
socket_timeouts (int sock, unsigned seconds)
{
  struct timeval timeout = { .tv_sec = seconds };
  setsockopt (sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt (sock, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
}

static int
read_all (int fd, void *buf, size_t length)
{
  for (char *p = buf; length;) {
    ssize_t n = read (fd, p, length);
    if (n <= 0) {
      if (n == 0)
        errno = ECONNRESET;
      return -1;
    }
    p += n;
    length -= n;
  }
  return 0;
}

static int
write_all (int fd, const void *buf, size_t length)
{
  for (const char *p = buf; length;) {
    ssize_t n = write (fd, p, length);
    if (n <= 0)
      return -1;
    p += n;
    length -= n;
  }
  return 0;
}

/* Connect to the server at path and negotiate export (NULL or "": the
 * default export): the socket, in the transmission phase, with its size
 * and flags; -1 after a message.
 */
static int
server_handshake (const char *path, const char *export, uint64_t *size,
                  uint16_t *flags)
{
  if (!export)
    export = "";
  size_t name_length = strlen (export);
  if (name_length > NBD_EXPORT_NAME_MAX) {
    fprintf (stderr, "%s: nbd: export name '%s' too long\n", program, export);
    return -1;
  }
  struct sockaddr_un address = { .sun_family = AF_UNIX };
  if (strlen (path) >= sizeof address.sun_path) {
    fprintf (stderr, "%s: nbd: %s: socket path too long\n", program, path);
    return -1;
  }
  strcpy (address.sun_path, path);
  int sock = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock == -1 || connect (sock, (struct sockaddr *) &address,
                             sizeof address) == -1) {
    fprintf (stderr, "%s: nbd: %s: %m\n", program, path);
    if (sock != -1)
      close (sock);
    return -1;
  }
  socket_timeouts (sock, HANDSHAKE_TIMEOUT_S);
  struct {
    uint64_t magic, opts_magic;
    uint16_t flags;
  } __attribute__ ((packed)) greeting;
  uint32_t client_flags = htobe32 (NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
  /* NBD_OPT_GO: the name's length, the name, no information asked. */
  struct {
    uint64_t magic;
    uint32_t option, length, name_length;
  } __attribute__ ((packed)) go = {
    htobe64 (NBD_OPTS_MAGIC), htobe32 (NBD_OPT_GO),
    htobe32 (4 + name_length + 2), htobe32 (name_length),
  };
  uint16_t requests = 0;
  if (read_all (sock, &greeting, sizeof greeting) == -1
      || be64toh (greeting.magic) != NBD_MAGIC
      || be64toh (greeting.opts_magic) != NBD_OPTS_MAGIC
      || !(be16toh (greeting.flags) & NBD_FLAG_FIXED_NEWSTYLE)) {
    fprintf (stderr, "%s: nbd: %s: not an NBD server with the fixed "
             "newstyle handshake\n", program, path);
    goto fail;
  }
  if (write_all (sock, &client_flags, sizeof client_flags) == -1
      || write_all (sock, &go, sizeof go) == -1
      || write_all (sock, export, name_length) == -1
      || write_all (sock, &requests, sizeof requests) == -1)
    goto io_failed;
  bool have_export = false;
  for (;;) {
    struct {
      uint64_t magic;
      uint32_t option, type, length;
    } __attribute__ ((packed)) reply;
    if (read_all (sock, &reply, sizeof reply) == -1)
      goto io_failed;
    uint32_t type = be32toh (reply.type), length = be32toh (reply.length);
    if (be64toh (reply.magic) != NBD_REP_MAGIC || length > 65536) {
      fprintf (stderr, "%s: nbd: %s: a bad option reply\n", program, path);
      goto fail;
    }
    char data[length + 1];
    if (read_all (sock, data, length) == -1)
      goto io_failed;
    if (type == NBD_REP_ACK)
      break;
    if (type & 0x80000000) {
      data[length] = '\0';
      fprintf (stderr, "%s: nbd: %s: the server refused the export (%#x%s%s)\n",
               program, path, type, length ? ": " : "", length ? data : "");
      goto fail;
    }
    if (type == NBD_REP_INFO && length >= 12) {
      uint16_t info;
      memcpy (&info, data, 2);
      if (be16toh (info) == NBD_INFO_EXPORT) {
        uint64_t bytes;
        uint16_t transmission;
        memcpy (&bytes, data + 2, 8);
        memcpy (&transmission, data + 10, 2);
        *size = be64toh (bytes);
        *flags = be16toh (transmission);
        have_export = true;
      }
    }
  }
  if (!have_export) {
    fprintf (stderr, "%s: nbd: %s: the server did not say the export's "
             "size\n", program, path);
    goto fail;
  }
  socket_timeouts (sock, 0);
  return sock;

 io_failed:
  fprintf (stderr, "%s: nbd: %s: %m\n", program, path);
 fail:
  close (sock);
  return -1;
}

/* A generic netlink socket bound to the nbd family; NULL after a message. */
static struct nl_sock *
nbd_family (int *family)
{
  struct nl_sock *nl = nl_socket_alloc ();
  if (!nl || genl_connect (nl) < 0) {
    fprintf (stderr, "%s: nbd: cannot open a netlink socket\n", program);
    if (nl)
      nl_socket_free (nl);
    return NULL;
  }
  *family = genl_ctrl_resolve (nl, "nbd");
  if (*family < 0) {
    fprintf (stderr, "%s: nbd: the kernel's nbd driver has no netlink "
             "interface here (modprobe nbd; Linux 4.12 or later)\n", program);
    nl_socket_free (nl);
    return NULL;
  }
  return nl;
}

/* Send one nbd command and wait for the kernel's answer: 0, or -1 after
 * a message.
 */
static int
nbd_command (struct nl_sock *nl, struct nl_msg *msg, const char *what)
{
  int r = nl_send_sync (nl, msg);     /* frees msg */
  if (r < 0) {
    fprintf (stderr, "%s: nbd: %s: %s\n", program, what, nl_geterror (r));
    return -1;
  }
  return 0;
}

static int
device_index (const char *device)
{
  unsigned index;
  if (sscanf (device, "/dev/nbd%u", &index) != 1) {
    fprintf (stderr, "%s: nbd: %s is not /dev/nbdN\n", program, device);
    return -1;
  }
  return index;
}

/* The socket list attribute. */
static int
put_sockets (struct nl_msg *msg, const int *socks, unsigned n)
{
  struct nlattr *sockets = nla_nest_start (msg, NBD_ATTR_SOCKETS);
  if (!sockets)
    return -1;
  for (unsigned i = 0; i < n; i++) {
    struct nlattr *item = nla_nest_start (msg, NBD_SOCK_ITEM);
    if (!item || nla_put_u32 (msg, NBD_SOCK_FD, socks[i]) < 0)
      return -1;
    nla_nest_end (msg, item);
  }
  nla_nest_end (msg, sockets);
  return 0;
}

int
nbd_connect (const char *socket_path, const char *export,
             unsigned connections, int *socks, uint64_t *size,
             uint16_t *flags)
{
  if (connections < 1 || connections > NBD_CONNECTIONS_MAX) {
    fprintf (stderr, "%s: nbd: connections: 1 to %d\n", program,
             NBD_CONNECTIONS_MAX);
    return -1;
  }
  for (unsigned made = 0; made < connections; made++)
    if ((socks[made] = server_handshake (socket_path, export, size,
                                         flags)) == -1) {
      nbd_close (socks, made);
      return -1;
    }
  return 0;
}

void
nbd_close (const int *socks, unsigned count)
{
  for (unsigned i = 0; i < count; i++)
    close (socks[i]);
}

int
nbd_attach_sockets (const char *device, const int *socks, unsigned count,
                    bool reconnect, uint64_t size, uint16_t flags,
                    unsigned dead_conn_timeout, unsigned block_size)
{
  int index = device_index (device);
  if (index < 0)
    return -1;
  int family, r = -1;
  struct nl_sock *nl = nbd_family (&family);
  struct nl_msg *msg = nl ? nlmsg_alloc () : NULL;
  if (!msg)
    goto out;
  if (!genlmsg_put (msg, NL_AUTO_PORT, NL_AUTO_SEQ, family, 0, 0,
                    reconnect ? NBD_CMD_RECONFIGURE : NBD_CMD_CONNECT, 0)
      || nla_put_u32 (msg, NBD_ATTR_INDEX, index) < 0
      || (!reconnect
          && (nla_put_u64 (msg, NBD_ATTR_SIZE_BYTES, size) < 0
              || nla_put_u64 (msg, NBD_ATTR_BLOCK_SIZE_BYTES, block_size) < 0
              || nla_put_u64 (msg, NBD_ATTR_SERVER_FLAGS, flags) < 0))
      || nla_put_u64 (msg, NBD_ATTR_DEAD_CONN_TIMEOUT, dead_conn_timeout) < 0
      || put_sockets (msg, socks, count) == -1) {
    fprintf (stderr, "%s: nbd: cannot build the netlink message\n", program);
    nlmsg_free (msg);
    goto out;
  }
  r = nbd_command (nl, msg, reconnect ? "reconnect" : "connect");
 out:
  if (nl)
    nl_socket_free (nl);
  return r;
}

int
nbd_attach (const char *device, const char *socket_path, const char *export,
            bool reconnect, unsigned connections, unsigned dead_conn_timeout,
            unsigned block_size)
{
  uint64_t size = 0;
  uint16_t flags = 0;
  int socks[NBD_CONNECTIONS_MAX];
  if (device_index (device) < 0
      || nbd_connect (socket_path, export, connections, socks, &size,
                      &flags) == -1)
    return -1;
  int r = nbd_attach_sockets (device, socks, connections, reconnect, size,
                              flags, dead_conn_timeout, block_size);
  nbd_close (socks, connections);  /* the kernel holds its own references */
  return r;
}

/* The driver's link-dead notices (see nbd-attach.h): the socket in the
 * multicast group, the device it is for, and whether a notice came in
 * the last nbd_watch_link_dead.
 */
struct nbd_watch {
  struct nl_sock *nl;
  unsigned index;
  bool dead;
};

static int
on_notice (struct nl_msg *msg, void *opaque)
{
  struct nbd_watch *watch = opaque;
  struct nlmsghdr *header = nlmsg_hdr (msg);
  struct genlmsghdr *generic = nlmsg_data (header);
  struct nlattr *attrs[NBD_ATTR_MAX + 1];
  if (generic->cmd == NBD_CMD_LINK_DEAD
      && genlmsg_parse (header, 0, attrs, NBD_ATTR_MAX, NULL) == 0
      && attrs[NBD_ATTR_INDEX]
      && nla_get_u32 (attrs[NBD_ATTR_INDEX]) == watch->index)
    watch->dead = true;
  return NL_OK;
}

struct nbd_watch *
nbd_watch_open (const char *device)
{
  int index = device_index (device);
  int family;
  struct nl_sock *nl = index < 0 ? NULL : nbd_family (&family);
  if (!nl)
    return NULL;
  int group = genl_ctrl_resolve_grp (nl, NBD_GENL_FAMILY_NAME,
                                     NBD_GENL_MCAST_GROUP_NAME);
  struct nbd_watch *watch = calloc (1, sizeof *watch);
  if (group < 0 || !watch || nl_socket_add_membership (nl, group) < 0
      || nl_socket_set_nonblocking (nl) < 0
      || nl_socket_modify_cb (nl, NL_CB_VALID, NL_CB_CUSTOM, on_notice,
                              watch) < 0) {
    fprintf (stderr, "%s: nbd: cannot watch the driver's notices\n", program);
    free (watch);
    nl_socket_free (nl);
    return NULL;
  }
  nl_socket_disable_seq_check (nl);
  watch->nl = nl;
  watch->index = index;
  return watch;
}

int
nbd_watch_fd (const struct nbd_watch *watch)
{
  return nl_socket_get_fd (watch->nl);
}

bool
nbd_watch_link_dead (struct nbd_watch *watch)
{
  watch->dead = false;
  /* Only while something is there: an older libnl answers 0, not
   * -NLE_AGAIN, on a non-blocking socket with nothing to read.
   */
  struct pollfd pending = { .fd = nl_socket_get_fd (watch->nl),
                            .events = POLLIN };
  while (poll (&pending, 1, 0) > 0
         && nl_recvmsgs_default (watch->nl) >= 0)
    ;
  return watch->dead;
}

/* A command naming only the device (and, timeout_s >= 0, a request
 * timeout): 0, or -1 after a message.
 */
static int
device_command (const char *device, int command, const char *what,
                int64_t timeout_s)
{
  int index = device_index (device);
  if (index < 0)
    return -1;
  int family;
  struct nl_sock *nl = nbd_family (&family);
  if (!nl)
    return -1;
  struct nl_msg *msg = nlmsg_alloc ();
  int r = -1;
  if (msg && genlmsg_put (msg, NL_AUTO_PORT, NL_AUTO_SEQ, family, 0, 0,
                          command, 0)
      && nla_put_u32 (msg, NBD_ATTR_INDEX, index) >= 0
      && (timeout_s < 0
          || nla_put_u64 (msg, NBD_ATTR_TIMEOUT, timeout_s) >= 0))
    r = nbd_command (nl, msg, what);
  else if (msg)
    nlmsg_free (msg);
  nl_socket_free (nl);
  return r;
}

int
nbd_detach (const char *device)
{
  return device_command (device, NBD_CMD_DISCONNECT, "disconnect", -1);
}

int
nbd_set_request_timeout (const char *device, unsigned seconds)
{
  return device_command (device, NBD_CMD_RECONFIGURE, "request timeout",
                         seconds);
}

int
run_nbd (int argc, char **argv)
{
  static const char usage[] =
    "nbd connect|reconnect [-N EXPORT] /dev/nbdN SOCKET [CONNECTIONS "
    "[DEAD_CONN_TIMEOUT]]\n"
    "       nbd disconnect /dev/nbdN";
  if (argc == 2 && strcmp (argv[0], "disconnect") == 0)
    return nbd_detach (argv[1]) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
  bool connect = argc >= 3 && strcmp (argv[0], "connect") == 0;
  bool reconnect = argc >= 3 && strcmp (argv[0], "reconnect") == 0;
  const char *export = NULL;
  if ((connect || reconnect) && argc >= 5 && strcmp (argv[1], "-N") == 0) {
    export = argv[2];
    argv += 2;
    argc -= 2;
  }
  if ((!connect && !reconnect) || argc < 3 || argc > 5) {
    fprintf (stderr, "usage: %s %s\n", program, usage);
    return EXIT_FAILURE;
  }
  unsigned connections = 1, timeout = NBD_DEAD_CONN_TIMEOUT_DEFAULT;
  char *end;
  if (argc >= 4 && ((connections = strtoul (argv[3], &end, 10)) == 0 || *end)) {
    fprintf (stderr, "%s: nbd: CONNECTIONS: '%s' is not 1 to %d\n", program,
             argv[3], NBD_CONNECTIONS_MAX);
    return EXIT_FAILURE;
  }
  if (argc >= 5 && ((timeout = strtoul (argv[4], &end, 10)) == 0 || *end)) {
    fprintf (stderr, "%s: nbd: DEAD_CONN_TIMEOUT: '%s' is not a number of "
             "seconds above 0\n", program, argv[4]);
    return EXIT_FAILURE;
  }
  return nbd_attach (argv[1], argv[2], export, reconnect, connections,
                     timeout, 4096)
    == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
