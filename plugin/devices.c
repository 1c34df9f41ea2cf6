/* A server's devices: see devices.h. */

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "block-store-internal.h"   /* store_decode_cache_sweep */
#include "codec.h"
#include "devices.h"
#include "error-text.h"
#include "text-parse.h"

static struct device devices[DEVICES_MAX];
static unsigned device_count;

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

int
devices_declare (const char *value)
{
  if (device_count == DEVICES_MAX) {
    nbdkit_error ("device: at most %d devices", DEVICES_MAX);
    return -1;
  }
  char *copy = strdup (value);
  if (!copy) {
    nbdkit_error ("device: %s", error_text (errno));
    return -1;
  }
  struct device_spec spec = { .algorithm = -1, .level = INT32_MIN };
  int r = -1;
  char *save, *name = strtok_r (copy, ":", &save);
  char *size = name ? strtok_r (NULL, ":", &save) : NULL;
  if (!name || !name_is_plain (name)) {
    nbdkit_error ("device: '%s': the name first, 1 to %d of A-Z a-z 0-9 . _ -, "
                  "then :SIZE (device=NAME:SIZE[:comp=lz4|zstd][:level=N])",
                  value, DEVICE_NAME_MAX);
    goto out;
  }
  strcpy (spec.name, name);
  int64_t bytes = size ? parse_size (size) : -1;
  if (bytes < STORE_BLOCK_SIZE) {
    nbdkit_error ("device: %s: '%s' is not a size of %d bytes or more "
                  "(device=NAME:SIZE, e.g. disk1:4G)", name, size ? size : "",
                  STORE_BLOCK_SIZE);
    goto out;
  }
  spec.size = (uint64_t) bytes;
  for (char *option; (option = strtok_r (NULL, ":", &save)); ) {
    char *end;
    if (strcmp (option, "comp=lz4") == 0)
      spec.algorithm = CODEC_LZ4;
    else if (strcmp (option, "comp=zstd") == 0)
      spec.algorithm = CODEC_ZSTD;
    else if (strncmp (option, "level=", 6) == 0) {
      errno = 0;
      long level = strtol (option + 6, &end, 10);
      if (errno || end == option + 6 || *end || level < INT32_MIN + 1
          || level > INT32_MAX) {
        nbdkit_error ("device: %s: '%s' is not level=N", name, option);
        goto out;
      }
      spec.level = (int) level;
    }
    else {
      nbdkit_error ("device: %s: '%s' is not comp=lz4|zstd or level=N", name,
                    option);
      goto out;
    }
  }
  for (unsigned i = 0; i < device_count; i++)
    if (strcmp (devices[i].spec.name, spec.name) == 0) {
      nbdkit_error ("device: %s is declared twice", spec.name);
      goto out;
    }
  devices[device_count++].spec = spec;
  r = 0;
 out:
  free (copy);
  return r;
}

int
devices_complete (enum codec_algorithm algorithm, int level,
                  const char *refused_parameter)
{
  if (device_count && refused_parameter) {
    nbdkit_error ("device: not with %s= yet: each device would need its "
                  "share of it (serve those devices from a server of their "
                  "own)", refused_parameter);
    return -1;
  }
  for (unsigned i = 0; i < device_count; i++) {
    struct device_spec *spec = &devices[i].spec;
    if (spec->algorithm == -1)
      spec->algorithm = algorithm;
    if (spec->level == INT32_MIN)
      spec->level = (enum codec_algorithm) spec->algorithm == algorithm ? level
        : codec_default_level (spec->algorithm);
    int min, max;
    if (!codec_level_is_valid (spec->algorithm, spec->level, &min, &max)) {
      nbdkit_error ("device: %s: level %d is not a valid %s level (%d..%d)",
                    spec->name, spec->level, codec_name (spec->algorithm),
                    min, max);
      return -1;
    }
  }
  return 0;
}

int
devices_create (const struct store_config *base, struct block_store *owner)
{
  for (unsigned i = 0; i < device_count; i++) {
    struct device *device = &devices[i];
    struct store_config config = *base;
    config.size = device->spec.size;
    config.algorithm = device->spec.algorithm;
    config.level = device->spec.level;
    config.backing = NULL;
    config.pool.region = NULL;
    config.shared_pool = store_pool (owner);
    if (!(device->store = store_create (&config))) {
      nbdkit_error ("device: %s: cannot create its store: %s",
                    device->spec.name, error_text (errno));
      devices_destroy ();
      return -1;
    }
  }
  return 0;
}

void
devices_destroy (void)
{
  for (unsigned i = device_count; i-- > 0; ) {
    store_destroy (devices[i].store);
    devices[i].store = NULL;
  }
}

unsigned
devices_count (void)
{
  return device_count;
}

struct device *
device_at (unsigned index)
{
  return index < device_count ? &devices[index] : NULL;
}

struct device *
device_find (const char *name)
{
  for (unsigned i = 0; i < device_count; i++)
    if (strcmp (devices[i].spec.name, name) == 0)
      return &devices[i];
  return NULL;
}

void
devices_housekeeping (void)
{
  for (unsigned i = 0; i < device_count; i++)
    if (devices[i].store) {
      store_flush (devices[i].store);
      store_decode_cache_sweep (devices[i].store);
    }
}
