/* What the plugin knows of the nbdkit server: see server-check.h. */

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "server-check.h"

bool server_has_disconnect_fix;

/* Set on the threads that ran .open: nbdkit's connection threads.  No
 * destructor, so nothing of the plugin runs at thread exit.
 */
static __thread bool thread_opened_connection;

/* The warning is printed once per process. */
static atomic_bool warning_given;

void
server_check_load (void)
{
  /* By name: 1.32's headers do not declare it. */
  server_has_disconnect_fix = dlsym (RTLD_DEFAULT, "nbdkit_disconnect") != NULL;
  nbdkit_debug ("zram: server %s the client-disconnect fix of nbdkit 1.34",
                server_has_disconnect_fix ? "has" : "lacks");
}

void
server_check_open (void)
{
  thread_opened_connection = true;
}

void
server_check_worker_thread (void)
{
  if (thread_opened_connection || atomic_load_explicit (&warning_given,
                                                        memory_order_relaxed))
    return;
  if (atomic_exchange (&warning_given, true))
    return;
  nbdkit_error ("zram: warning: this nbdkit is older than 1.34 and serves "
                "each connection with several threads: a client that "
                "disconnects with requests in flight makes it abort, and "
                "every client's data is lost.  Use nbdkit 1.34 or later "
                "(setup.sh builds one), or serve with -t 1");
}
