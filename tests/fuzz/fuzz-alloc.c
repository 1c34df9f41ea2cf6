/* Fuzzer: sequences of allocator operations against a shadow copy.
 *
 * The input is a program: each operation is a byte (what) and a few
 * bytes of argument.  Operations: malloc of any size 1..4096 (and the
 * invalid 0 and 4097), write, read-and-verify, free, flush, compact,
 * a limit change, a resize.  After each operation the live objects'
 * count and bytes must match the shadow; at the end every live object is
 * verified, then freed, and the pool must be empty.
 *
 * Built with libFuzzer (configure --enable-fuzzing, clang) or with
 * tests/fuzz/replay.c, which runs a corpus once (make check).
 */

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-input.h"
#include "zsalloc.h"

#define SLOTS 64

struct object {
  zs_handle_t handle;
  size_t size;
  unsigned char bytes[ZS_MAX_OBJECT_SIZE];
};

static struct object objects[SLOTS];


static void
fill (unsigned char *bytes, size_t size, unsigned seed)
{
  for (size_t i = 0; i < size; i++)
    bytes[i] = (unsigned char) (seed * 131 + i * 7 + (i >> 5));
}

static void
verify (struct zs_pool *pool, const struct object *object)
{
  unsigned char copy[ZS_MAX_OBJECT_SIZE];
  check (zs_object_size (pool, object->handle) == object->size);
  const void *bytes = zs_read_begin (pool, object->handle, copy);
  check (memcmp (bytes, object->bytes, object->size) == 0);
  zs_read_end (pool, object->handle, bytes);
}

static void
check_totals (struct zs_pool *pool)
{
  uint64_t count = 0, bytes = 0;
  for (unsigned i = 0; i < SLOTS; i++)
    if (objects[i].handle) {
      count++;
      bytes += objects[i].size;
    }
  struct zs_pool_stats stats;
  zs_pool_stats (pool, &stats);
  check (stats.objects == count);
  check (stats.bytes_stored == bytes);
  check (!stats.mem_limit || stats.limit_used <= stats.mem_limit
         || count == 0);
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct input in = { data, size, 0 };
  struct zs_pool_config config;
  zs_pool_config_init (&config);
  unsigned mode = take (&in, 1);
  config.chain_pages = 1 + mode % ZS_CHAIN_MAX;
  config.free_mode = mode & 0x10 ? ZS_FREE_IMMEDIATE : ZS_FREE_BATCHED;
  config.lock_mode = mode & 0x20 ? ZS_LOCK_POOL : ZS_LOCK_CLASS;
  config.compact_before_refusal = !(mode & 0x40);
  if (mode & 0x80)
    config.mem_limit = (uint64_t) (1 + take (&in, 1)) << 14;
  struct zs_pool *pool = zs_pool_create (&config);
  check (pool != NULL);
  memset (objects, 0, sizeof objects);

  while (in.at < in.size) {
    unsigned op = take (&in, 1);
    struct object *object = &objects[take (&in, 1) % SLOTS];
    switch (op % 8) {
    case 0: case 1: {           /* malloc (replacing the slot's object) */
      size_t want = take (&in, 2) % (ZS_MAX_OBJECT_SIZE + 2);
      zs_handle_t handle = zs_malloc (pool, want);
      if (want == 0 || want > ZS_MAX_OBJECT_SIZE)
        check (handle == 0 && errno == EINVAL);
      else if (handle == 0)
        check (errno == ENOSPC && config.mem_limit);
      else {
        if (object->handle)
          zs_free (pool, object->handle);
        object->handle = handle;
        object->size = want;
        fill (object->bytes, want, op);
        check (zs_write (pool, handle, object->bytes, want) == 0);
      }
      break;
    }
    case 2:                     /* rewrite part */
      if (object->handle) {
        size_t length = take (&in, 2) % (object->size + 1);
        fill (object->bytes, length, op + 1);
        check (zs_write (pool, object->handle, object->bytes, length) == 0);
        check (zs_write (pool, object->handle, object->bytes,
                         object->size + 1) == -1 && errno == EINVAL);
      }
      break;
    case 3:                     /* read and verify */
      if (object->handle)
        verify (pool, object);
      break;
    case 4:                     /* free */
      zs_free (pool, object->handle);
      object->handle = 0;
      break;
    case 5:
      if (op & 0x80)
        zs_compact (pool);
      else
        zs_pool_flush (pool);
      break;
    case 6: {                   /* a new limit, never below what is held */
      uint64_t limit = (uint64_t) take (&in, 1) << 14;
      int r = zs_pool_set_mem_limit (pool, limit);
      if (r == 0)
        config.mem_limit = limit;
      else
        check (errno == ENOSPC);
      break;
    }
    case 7:                     /* resize in place, where it fits */
      if (object->handle) {
        size_t want = 1 + take (&in, 2) % ZS_MAX_OBJECT_SIZE;
        size_t old = object->size;
        if (zs_resize (pool, object->handle, want) == 0) {
          unsigned char copy[ZS_MAX_OBJECT_SIZE];
          const void *bytes = zs_read_begin (pool, object->handle, copy);
          check (memcmp (bytes, object->bytes, want < old ? want : old) == 0);
          zs_read_end (pool, object->handle, bytes);
          if (want > old)
            fill (object->bytes + old, want - old, op);
          object->size = want;
          check (zs_write (pool, object->handle, object->bytes, want) == 0);
        }
        else
          check (errno == ERANGE);
      }
      break;
    }
    if (op % 8 != 3)
      check_totals (pool);
  }
  for (unsigned i = 0; i < SLOTS; i++)
    if (objects[i].handle) {
      verify (pool, &objects[i]);
      zs_free (pool, objects[i].handle);
      objects[i].handle = 0;
    }
  zs_pool_flush (pool);
  struct zs_pool_stats stats;
  zs_pool_stats (pool, &stats);
  check (stats.objects == 0 && stats.bytes_stored == 0 && stats.pages_used == 0);
  zs_pool_destroy (pool);
  return 0;
}
