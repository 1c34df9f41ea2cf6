/* libnbd, loaded when a backing store first needs it (dlopen), not
 * linked: the plugin then maps libnbd - and through it gnutls, libxml2,
 * ICU and libstdc++, several MiB of resident pages - only when
 * backing=nbd://... is used.  The functions the NBD transport calls
 * (backing-nbd.c), through this table.
 */
#ifndef ZRAM_LIBNBD_LOAD_H
#define ZRAM_LIBNBD_LOAD_H

#include <libnbd.h>

struct libnbd {
  __typeof__ (nbd_create) *create;
  __typeof__ (nbd_close) *close;
  __typeof__ (nbd_shutdown) *shutdown;
  __typeof__ (nbd_get_error) *get_error;
  __typeof__ (nbd_get_errno) *get_errno;
  __typeof__ (nbd_aio_connect_uri) *aio_connect_uri;
  __typeof__ (nbd_aio_is_connecting) *aio_is_connecting;
  __typeof__ (nbd_aio_is_ready) *aio_is_ready;
  __typeof__ (nbd_aio_is_dead) *aio_is_dead;
  __typeof__ (nbd_aio_is_closed) *aio_is_closed;
  __typeof__ (nbd_aio_command_completed) *aio_command_completed;
  __typeof__ (nbd_aio_pread) *aio_pread;
  __typeof__ (nbd_aio_pwrite) *aio_pwrite;
  __typeof__ (nbd_aio_trim) *aio_trim;
  __typeof__ (nbd_aio_flush) *aio_flush;
  __typeof__ (nbd_poll) *poll;
  __typeof__ (nbd_get_size) *get_size;
  __typeof__ (nbd_is_read_only) *is_read_only;
  __typeof__ (nbd_can_trim) *can_trim;
  __typeof__ (nbd_can_multi_conn) *can_multi_conn;
};

/* The table, libnbd loaded by the first call (once, whichever thread
 * calls first); NULL with *error (malloc'd) if it cannot be loaded.
 */
extern const struct libnbd *libnbd_load (char **error);
/* The table once libnbd_load has returned it (written only inside its
 * pthread_once), NULL before: for code that runs after a successful
 * libnbd_load.
 */
extern const struct libnbd *libnbd;

#endif /* ZRAM_LIBNBD_LOAD_H */
