/* A server's devices: see devices.h. */

#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "block-store.h"
#include "zsalloc.h"
#include "codec.h"
#include "devices.h"
#include "error-text.h"
#include "text-parse.h"

/* lock guards table and count (the devices now, in no order), each
 * device's connections, and named.  A leaf: nothing else is taken under
 * it but what a store_flush takes (the housekeeping round) and nbdkit's
 * export list.  Devices are added and removed by the control thread
 * alone (and made before serving), so the device a control command
 * looked up stays until that thread removes it.
 */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct device *table[DEVICES_MAX];
static unsigned count;
/* Set once a device was declared or added: from then on an export name
 * must be the default's or a device's (before, any name is the default,
 * as servers without devices always took it).
 */
static bool named;
/* For devices added while serving: the server's algorithm and level,
 * the default store's configuration and pool, and what devices do not
 * go with (devices_complete, devices_create).
 */
static enum codec_algorithm server_algorithm;
static int server_level;
/* Shared by the default store and every device (BUDGET in block-store.h);
 * its floors change only with a device's store made or destroyed.
 */
static struct store_budget budget = STORE_BUDGET_INIT;
static struct store_config base_config;
static struct block_store *owner_store;
/* Swap mode: the threads each device's contexts are made for (0: not in
 * swap mode, devices_keep_resident not called).  The control thread's.
 */
static unsigned resident_threads;
/* An export name a shell, a URI and nbd-client take as it is. */
static bool
name_is_plain (const char *name)
{
  size_t length = strlen (name);
  if (length == 0 || length > DEVICE_NAME_MAX)
    return false;
  for (const char *c = name; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')
          || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_' || *c == '.'))
      return false;
  return true;
}

/* NAME:SIZE[:comp=A][:level=N] into *spec: 0, or -1 with why (which
 * names the device, never the whole text: a control client's text is
 * answered to it alone).
 */
static int
spec_parse (const char *value, struct device_spec *spec, char *why,
            size_t why_size)
{
  *spec = (struct device_spec) { .algorithm = -1, .level = INT32_MIN };
  char *copy = strdup (value);
  if (!copy) {
    snprintf (why, why_size, "%s", error_text (errno));
    return -1;
  }
  int r = -1;
  char *save, *name = strtok_r (copy, ":", &save);
  char *size = name ? strtok_r (NULL, ":", &save) : NULL;
  if (!name || !name_is_plain (name)) {
    snprintf (why, why_size, "the name first, 1 to %d of A-Z a-z 0-9 . _ -, "
              "then :SIZE (NAME:SIZE[:comp=lz4|zstd][:level=N][:cap=SIZE]"
              "[:floor=SIZE])",
              DEVICE_NAME_MAX);
    goto out;
  }
  strcpy (spec->name, name);
  int64_t bytes = size ? parse_size (size) : -1;
  if (bytes < STORE_BLOCK_SIZE) {
    snprintf (why, why_size, "%s: '%.32s' is not a size of %d bytes or more "
              "(NAME:SIZE, e.g. disk1:4G)", name, size ? size : "",
              STORE_BLOCK_SIZE);
    goto out;
  }
  spec->size = (uint64_t) bytes;
  for (char *option; (option = strtok_r (NULL, ":", &save)); ) {
    char *end;
    if (strcmp (option, "comp=lz4") == 0)
      spec->algorithm = CODEC_LZ4;
    else if (strcmp (option, "comp=zstd") == 0)
      spec->algorithm = CODEC_ZSTD;
    else if (strncmp (option, "cap=", 4) == 0
             || strncmp (option, "floor=", 6) == 0) {
      bool cap = option[0] == 'c';
      const char *text = option + (cap ? 4 : 6);
      int64_t amount = parse_size (text);
      if (amount <= 0) {
        snprintf (why, why_size, "%s: '%.32s' is not %s=SIZE (e.g. 256M)",
                  name, option, cap ? "cap" : "floor");
        goto out;
      }
      *(cap ? &spec->cap : &spec->floor) = (uint64_t) amount;
    }
    else if (strncmp (option, "level=", 6) == 0) {
      errno = 0;
      long level = strtol (option + 6, &end, 10);
      if (errno || end == option + 6 || *end || level < INT32_MIN + 1
          || level > INT32_MAX) {
        snprintf (why, why_size, "%s: '%.32s' is not level=N", name, option);
        goto out;
      }
      spec->level = (int) level;
    }
    else {
      snprintf (why, why_size, "%s: '%.32s' is not comp=lz4|zstd, level=N, "
                "cap=SIZE or floor=SIZE", name, option);
      goto out;
    }
  }
  r = 0;
 out:
  free (copy);
  return r;
}

/* The server's algorithm (and level, for the same algorithm) where the
 * spec gave none; then its level checked, and its cap and floor against
 * mem_limit with floors bytes of other floors.  0, or -1 with why.
 */
static int
spec_complete (struct device_spec *spec, uint64_t mem_limit, uint64_t floors,
               char *why, size_t why_size)
{
  if (spec->cap && spec->floor > spec->cap) {
    snprintf (why, why_size, "%s: floor=%" PRIu64 " is above cap=%" PRIu64,
              spec->name, spec->floor, spec->cap);
    return -1;
  }
  if (spec->floor && !mem_limit) {
    snprintf (why, why_size, "%s: floor= needs mem_limit (a floor is room "
              "kept in the budget)", spec->name);
    return -1;
  }
  if (spec->floor && floors + spec->floor > mem_limit) {
    snprintf (why, why_size, "%s: floor=%" PRIu64 " and the other floors (%"
              PRIu64 ") do not fit in mem_limit (%" PRIu64 ")", spec->name,
              spec->floor, floors, mem_limit);
    return -1;
  }
  if (spec->algorithm == -1)
    spec->algorithm = server_algorithm;
  if (spec->level == INT32_MIN)
    spec->level = (enum codec_algorithm) spec->algorithm == server_algorithm
      ? server_level : codec_default_level (spec->algorithm);
  int min, max;
  if (!codec_level_is_valid (spec->algorithm, spec->level, &min, &max)) {
    snprintf (why, why_size, "%s: level %d is not a valid %s level (%d..%d)",
              spec->name, spec->level, codec_name (spec->algorithm), min, max);
    return -1;
  }
  return 0;
}

/* The device of that name in the table, or NULL.  lock is held. */
static struct device *
table_find (const char *name)
{
  for (unsigned i = 0; i < count; i++)
    if (strcmp (table[i]->spec.name, name) == 0)
      return table[i];
  return NULL;
}

int
devices_declare (const char *value)
{
  char why[256];
  struct device_spec spec;
  if (spec_parse (value, &spec, why, sizeof why) == -1) {
    nbdkit_error ("device: %s", why);
    return -1;
  }
  if (count == DEVICES_MAX) {
    nbdkit_error ("device: at most %d devices", DEVICES_MAX);
    return -1;
  }
  if (table_find (spec.name)) {
    nbdkit_error ("device: %s is declared twice", spec.name);
    return -1;
  }
  struct device *device = calloc (1, sizeof *device);
  if (!device) {
    nbdkit_error ("device: %s", error_text (errno));
    return -1;
  }
  device->spec = spec;
  table[count++] = device;
  named = true;
  return 0;
}

struct store_budget *
devices_budget (void)
{
  return &budget;
}

int
devices_complete (enum codec_algorithm algorithm, int level,
                  uint64_t mem_limit)
{
  server_algorithm = algorithm;
  server_level = level;
  char why[256];
  uint64_t floors = 0;
  for (unsigned i = 0; i < count; i++) {
    if (spec_complete (&table[i]->spec, mem_limit, floors, why,
                       sizeof why) == -1) {
      nbdkit_error ("device: %s", why);
      return -1;
    }
    floors += table[i]->spec.floor;
  }
  return 0;
}

/* The configuration of spec's store: the default store's, on its pool
 * (and in its region, if it has one).
 */
static struct store_config
device_config (const struct device_spec *spec)
{
  struct store_config config = base_config;
  config.size = spec->size;
  config.algorithm = spec->algorithm;
  config.level = spec->level;
  config.backing = NULL;
  /* The default store's cold tier, shared (COLD TIER ACROSS STORES). */
  config.backing_owner = store_has_backing (owner_store) ? owner_store : NULL;
  config.shared_pool = store_pool (owner_store);
  config.budget = &budget;
  config.cap = spec->cap;
  config.floor = spec->floor;
  return config;
}

/* A store for spec on the default store's pool; in a region, published
 * there (DEVICES IN A REGION in block-store.h: a kill from here on
 * leaves it whole or gone).  NULL with errno.
 */
static struct block_store *
device_store_create (const struct device_spec *spec)
{
  struct store_config config = device_config (spec);
  struct block_store *store = store_create (&config);
  if (store && base_config.pool.region
      && store_device_publish (owner_store, spec, store) == -1) {
    int saved = errno;
    store_destroy (store);
    errno = saved;
    return NULL;
  }
  return store;
}

/* A device's store destroyed; in a region, unpublished first. */
static void
device_store_destroy (struct block_store *store)
{
  if (base_config.pool.region)
    store_device_unpublish (owner_store, store);
  store_destroy (store);
}

/* The devices a region kept (a new owner's: handed over or recovered),
 * each made this process's and put in the table; a declared device of
 * the same name must be the same device.  0, or -1 after nbdkit_error.
 */
static int
devices_adopt_held (void)
{
  struct device_spec specs[DEVICES_MAX];
  struct block_store *stores[DEVICES_MAX];
  unsigned held = store_devices_held (owner_store, specs, stores,
                                      DEVICES_MAX);
  char why[256];
  for (unsigned h = 0; h < held; h++) {
    const struct device_spec *spec = &specs[h];
    struct store_config config = device_config (spec);
    if (store_device_adopt (stores[h], &config, why, sizeof why) == -1) {
      nbdkit_error ("device: %s: kept in the region, cannot be served: %s",
                    spec->name, why);
      return -1;
    }
    struct device *declared = table_find (spec->name);
    if (declared && declared->store) {
      /* A second of one name: an add killed between making its store
       * and finding the name taken.  Never served: it goes.
       */
      nbdkit_debug ("device: %s: a second one in the region, empty: "
                    "removed", spec->name);
      device_store_destroy (stores[h]);
      continue;
    }
    if (declared) {
      const struct device_spec *d = &declared->spec;
      if (d->size != spec->size || d->algorithm != spec->algorithm
          || d->cap != spec->cap || d->floor != spec->floor) {
        nbdkit_error ("device: %s: the region keeps it as %" PRIu64 " bytes, "
                      "%s, cap %" PRIu64 ", floor %" PRIu64 ": declare it so "
                      "(or remove it first)", spec->name, spec->size,
                      codec_name (spec->algorithm), spec->cap, spec->floor);
        return -1;
      }
      declared->spec.level = spec->level;
      declared->store = stores[h];
      continue;
    }
    struct device *device = calloc (1, sizeof *device);
    if (!device || count == DEVICES_MAX) {
      free (device);
      nbdkit_error ("device: %s: %s", spec->name, error_text (ENOMEM));
      return -1;
    }
    device->spec = *spec;
    device->store = stores[h];
    pthread_mutex_lock (&lock);
    table[count++] = device;
    named = true;
    pthread_mutex_unlock (&lock);
  }
  return 0;
}

int
devices_create (const struct store_config *base, struct block_store *owner)
{
  base_config = *base;
  base_config.backing = NULL;   /* the default store's own */
  owner_store = owner;
  if (base_config.pool.region && devices_adopt_held () == -1) {
    devices_destroy ();
    return -1;
  }
  for (unsigned i = 0; i < count; i++)
    if (!table[i]->store
        && !(table[i]->store = device_store_create (&table[i]->spec))) {
      nbdkit_error ("device: %s: cannot create its store: %s",
                    table[i]->spec.name, error_text (errno));
      devices_destroy ();
      return -1;
    }
  return 0;
}

void
devices_destroy (void)
{
  pthread_mutex_lock (&lock);
  while (count > 0) {
    struct device *device = table[--count];
    table[count] = NULL;
    /* In a region the stores stay: the default store's close hands
     * them over with it, or the region goes with them.
     */
    if (!base_config.pool.region)
      store_destroy (device->store);
    free (device);
  }
  pthread_mutex_unlock (&lock);
}

int
devices_add (const char *value, char *why, size_t why_size)
{
  struct device_spec spec;
  if (!owner_store) {
    snprintf (why, why_size, "the server is not serving yet");
    return -1;
  }
  /* The floors checked against the pool's mem_limit now; two adds at
   * once cannot both pass: the control thread alone adds (devices.h).
   */
  if (spec_parse (value, &spec, why, why_size) == -1
      || spec_complete (&spec, zs_pool_mem_limit (store_pool (owner_store)),
                        atomic_load (&budget.floors), why, why_size) == -1)
    return -1;
  /* Refused before its store is made, so that a region never keeps two
   * of one name (only this thread adds: the name stays free).
   */
  pthread_mutex_lock (&lock);
  bool known = table_find (spec.name) != NULL;
  pthread_mutex_unlock (&lock);
  if (known) {
    snprintf (why, why_size, "%s is a device already", spec.name);
    return -1;
  }
  struct device *device = calloc (1, sizeof *device);
  if (!device || !(device->store = device_store_create (&spec))) {
    snprintf (why, why_size, "%s: cannot create its store: %s", spec.name,
              error_text (errno));
    free (device);
    return -1;
  }
  if (resident_threads
      && store_keep_resident (device->store, resident_threads) == -1) {
    snprintf (why, why_size, "%s: cannot make its table and contexts "
              "ready for swap: %s", spec.name, error_text (errno));
    device_store_destroy (device->store);
    free (device);
    return -1;
  }
  device->spec = spec;
  /* Made outside the lock; kept only if the name is still free. */
  pthread_mutex_lock (&lock);
  bool taken = table_find (spec.name) != NULL, full = count == DEVICES_MAX;
  if (!taken && !full) {
    table[count++] = device;
    named = true;
  }
  pthread_mutex_unlock (&lock);
  if (taken || full) {
    if (taken)
      snprintf (why, why_size, "%s is a device already", spec.name);
    else
      snprintf (why, why_size, "%s: at most %d devices", spec.name,
                DEVICES_MAX);
    device_store_destroy (device->store);
    free (device);
    return -1;
  }
  return 0;
}

int
devices_remove (const char *name, bool force, char *why, size_t why_size)
{
  pthread_mutex_lock (&lock);
  struct device *device = table_find (name);
  unsigned connections = device ? device->connections : 0;
  if (device && (!connections || force)) {
    /* Claimed: out of the table under the lock that each connection's
     * open counts itself under, so no connection can start on it now.
     */
    unsigned i = 0;
    while (table[i] != device)
      i++;
    table[i] = table[--count];
    atomic_store (&device->gone, true);
  }
  pthread_mutex_unlock (&lock);
  if (!device) {
    snprintf (why, why_size, "unknown device '%.64s' (devices lists them)",
              name);
    return -1;
  }
  if (connections && !force) {
    snprintf (why, why_size, "%s: %u client%s connected: disconnect %s "
              "first (or remove %s force)", name, connections,
              connections == 1 ? "" : "s", connections == 1 ? "it" : "them",
              name);
    return -1;
  }
  /* A FORCED REMOVE in devices.h: the requests that saw the device
   * before gone was set finish first.
   */
  while (atomic_load (&device->in_flight) > 0)
    nanosleep (&(struct timespec) { .tv_nsec = 1000000 }, NULL);
  device_store_destroy (device->store); /* its objects back to the pool */
  pthread_mutex_lock (&lock);
  device->store = NULL;
  device->removed = true;
  bool last = device->connections == 0;
  pthread_mutex_unlock (&lock);
  if (last)
    free (device);
  return 0;
}

uint64_t
devices_declared_bytes (void)
{
  uint64_t bytes = 0;
  pthread_mutex_lock (&lock);
  for (unsigned i = 0; i < count; i++)
    bytes += table[i]->spec.size;
  pthread_mutex_unlock (&lock);
  return bytes;
}

unsigned
devices_count (void)
{
  pthread_mutex_lock (&lock);
  unsigned n = count;
  pthread_mutex_unlock (&lock);
  return n;
}

bool
devices_named (void)
{
  pthread_mutex_lock (&lock);
  bool n = named;
  pthread_mutex_unlock (&lock);
  return n;
}

void
devices_each (void (*visit) (struct device *device, void *opaque),
              void *opaque)
{
  pthread_mutex_lock (&lock);
  for (unsigned i = 0; i < count; i++)
    visit (table[i], opaque);
  pthread_mutex_unlock (&lock);
}

struct device *
device_find (const char *name)
{
  pthread_mutex_lock (&lock);
  struct device *device = table_find (name);
  pthread_mutex_unlock (&lock);
  return device;
}

struct device *
device_open (const char *name)
{
  pthread_mutex_lock (&lock);
  struct device *device = table_find (name);
  if (device)
    device->connections++;
  pthread_mutex_unlock (&lock);
  return device;
}

void
device_close (struct device *device)
{
  pthread_mutex_lock (&lock);
  bool last = --device->connections == 0 && device->removed;
  pthread_mutex_unlock (&lock);
  if (last)
    free (device);
}

struct block_store *
device_enter (struct device *device)
{
  atomic_fetch_add (&device->in_flight, 1);
  if (atomic_load (&device->gone)) {
    device_leave (device);
    errno = ESHUTDOWN;
    return NULL;
  }
  return device->store;
}

void
device_leave (struct device *device)
{
  atomic_fetch_sub (&device->in_flight, 1);
}

int
devices_keep_resident (unsigned threads, char *why, size_t why_size)
{
  resident_threads = threads;
  pthread_mutex_lock (&lock);
  int r = 0;
  for (unsigned i = 0; i < count; i++)     /* each, even after a failure */
    if (store_keep_resident (table[i]->store, threads) == -1 && r == 0) {
      snprintf (why, why_size, "%s: %s", table[i]->spec.name,
                error_text (errno));
      r = -1;
    }
  pthread_mutex_unlock (&lock);
  return r;
}

void
devices_housekeeping (void (*visit) (struct block_store *store,
                                     unsigned devices, void *opaque),
                      void *opaque)
{
  pthread_mutex_lock (&lock);
  for (unsigned i = 0; i < count; i++)
    visit (table[i]->store, count, opaque);
  pthread_mutex_unlock (&lock);
}
