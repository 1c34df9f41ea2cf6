/* libnbd, loaded when a backing store first needs it: libnbd-load.h. */

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libnbd-load.h"

#define LIBNBD_SONAME "libnbd.so.0"

static struct libnbd table;
/* Set once, by load_once under pthread_once: NULL and the message, or
 * &table.
 */
const struct libnbd *libnbd;
static char load_error[256];
static pthread_once_t load_done = PTHREAD_ONCE_INIT;

static void
load_once (void)
{
  void *library = dlopen (LIBNBD_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    snprintf (load_error, sizeof load_error, "cannot load %s: %s",
              LIBNBD_SONAME, dlerror ());
    return;
  }
  struct { const char *name; void **slot; } symbols[] = {
#define SYMBOL(field) { "nbd_" #field, (void **) &table.field }
    SYMBOL (create), SYMBOL (close), SYMBOL (shutdown), SYMBOL (get_error),
    SYMBOL (get_errno), SYMBOL (aio_connect_uri), SYMBOL (aio_is_connecting),
    SYMBOL (aio_is_ready), SYMBOL (aio_is_dead), SYMBOL (aio_is_closed),
    SYMBOL (aio_command_completed), SYMBOL (aio_pread), SYMBOL (aio_pwrite),
    SYMBOL (aio_trim), SYMBOL (aio_flush), SYMBOL (poll), SYMBOL (get_size),
    SYMBOL (is_read_only), SYMBOL (can_trim), SYMBOL (can_multi_conn),
#undef SYMBOL
  };
  for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++)
    if (!(*symbols[i].slot = dlsym (library, symbols[i].name))) {
      snprintf (load_error, sizeof load_error, "%s has no %s: too old",
                LIBNBD_SONAME, symbols[i].name);
      dlclose (library);
      return;
    }
  libnbd = &table;              /* the library stays loaded for good */
}

const struct libnbd *
libnbd_load (char **error)
{
  pthread_once (&load_done, load_once);
  if (!libnbd && error)
    *error = strdup (load_error);
  return libnbd;
}
