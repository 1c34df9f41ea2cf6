/* Fuzzer: the block store against a shadow disk.
 *
 * The first bytes choose the device (a few blocks with an odd tail, or
 * 2^40 bytes, of which the first and last 256 blocks are used), the
 * codec, a mem_limit or none, and a backing store (a memfd) or none.
 * Then each operation is a byte and its arguments: write, read and
 * verify, trim, zero (with and without may-trim) at any offset and
 * length, idle marking, recompression, packing, dissolving, writeback,
 * compaction.  A write refused for memory must leave every block either
 * as it was or as written.  At the end every block is verified, and the
 * store's counters against a walk of its blocks.
 *
 * Built with libFuzzer (configure --enable-fuzzing) or with
 * tests/fuzz/replay.c (make check).
 */

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz-input.h"
#include "backing.h"
#include "block-store.h"
#include "store-walk.h"

#define BS STORE_BLOCK_SIZE
#define WINDOW 256                 /* blocks used at each end of a huge device */


/* The shadow: what each used block should read as. */
static unsigned char shadow[2 * WINDOW][BS];
static uint64_t device_size, device_blocks;

/* The shadow block of block b, or NULL if b is not used. */
static unsigned char *
shadow_of (uint64_t b)
{
  if (device_blocks <= 2 * WINDOW)
    return shadow[b];
  if (b < WINDOW)
    return shadow[b];
  if (b >= device_blocks - WINDOW)
    return shadow[WINDOW + b - (device_blocks - WINDOW)];
  return NULL;
}

/* An offset and a length inside the used blocks. */
static void
pick_range (struct input *in, uint64_t *offset, uint64_t *count)
{
  uint64_t used = device_blocks <= 2 * WINDOW ? device_size : 2 * WINDOW * BS;
  uint64_t start = take (&in[0], 3) % used;
  uint64_t length = take (&in[0], 2) % (8 * BS) + 1;
  bool high = device_blocks > 2 * WINDOW && start >= WINDOW * BS;
  uint64_t base = high ? (device_blocks - WINDOW) * BS - WINDOW * BS : 0;
  uint64_t end = high || device_blocks <= 2 * WINDOW ? device_size
    : WINDOW * BS;
  *offset = base + start;
  if (*offset >= end)
    *offset = end - 1;
  *count = length < end - *offset ? length : end - *offset;
}

/* Each piece of [offset, offset + count) within one block. */
#define FOR_EACH_PIECE(offset, count, block, from, length)              \
  for (uint64_t _at = (offset), block, from, length;                    \
       _at < (offset) + (count)                                         \
         && (block = _at / BS, from = _at % BS,                         \
             length = BS - from < (offset) + (count) - _at              \
               ? BS - from : (offset) + (count) - _at, 1);              \
       _at += length)

static void
shadow_write (uint64_t offset, uint64_t count, const unsigned char *data)
{
  FOR_EACH_PIECE (offset, count, block, from, length) {
    if (data)
      memcpy (shadow_of (block) + from, data + (block * BS + from - offset),
              length);
    else
      memset (shadow_of (block) + from, 0, length);
  }
}

static void
verify_range (struct block_store *store, uint64_t offset, uint64_t count)
{
  static unsigned char got[8 * BS + BS];
  check (store_read (store, got, count, offset) == 0);
  FOR_EACH_PIECE (offset, count, block, from, length)
    check (memcmp (got + (block * BS + from - offset), shadow_of (block) + from,
                   length) == 0);
}

/* After a failed write: each block is whole as before or as written. */
static void
settle_failed_write (struct block_store *store, uint64_t offset,
                     uint64_t count, const unsigned char *data)
{
  static unsigned char got[BS];
  for (uint64_t b = offset / BS; b * BS < offset + count; b++) {
    check (store_read (store, got, BS, b * BS) == 0);
    unsigned char *want = shadow_of (b);
    uint64_t from = b * BS > offset ? b * BS : offset;
    uint64_t to = (b + 1) * BS < offset + count ? (b + 1) * BS : offset + count;
    bool old = memcmp (got, want, BS) == 0;
    bool new = memcmp (got, want, from - b * BS) == 0
      && memcmp (got + (from - b * BS), data + (from - offset), to - from) == 0
      && memcmp (got + (to - b * BS), want + (to - b * BS), (b + 1) * BS - to) == 0;
    check (old || new);
    memcpy (want, got, BS);
  }
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct input in = { data, size, 0 };
  unsigned mode = take (&in, 1);
  device_size = mode & 1 ? (uint64_t) 1 << 40
    : (uint64_t) (1 + take (&in, 1) % 64) * BS + take (&in, 2) % BS;
  device_blocks = (device_size + BS - 1) / BS;
  memset (shadow, 0, sizeof shadow);

  struct store_config config = {
    .size = device_size,
    .algorithm = mode & 2 ? CODEC_ZSTD : CODEC_LZ4, .level = 1,
    .recomp_count = 1, .recomp = { { CODEC_ZSTD, 5 } },
    .pack_blocks = 2 + (mode >> 4) % 15,
  };
  zs_pool_config_init (&config.pool);
  if (mode & 4)
    config.pool.mem_limit = (uint64_t) (8 + take (&in, 1)) << 12;
  int memfd = -1;
  if (mode & 8) {
    memfd = memfd_create ("fuzz-backing", MFD_CLOEXEC);
    check (memfd >= 0);
    char path[64], *error = NULL;
    snprintf (path, sizeof path, "/proc/self/fd/%d", memfd);
    config.backing = backing_open (path, 2 * WINDOW * BS * 2, false, 30, &error);
    check (config.backing != NULL);
    config.readback_below = mode & 0x80 ? UINT64_MAX : 0;
  }
  struct block_store *store = store_create (&config);
  check (store != NULL);

  static unsigned char buffer[8 * BS];
  while (in.at < in.size) {
    unsigned op = take (&in, 1);
    uint64_t offset, count;
    pick_range (&in, &offset, &count);
    switch (op % 12) {
    case 0: case 1: case 2: {
      for (uint64_t i = 0; i < count; i++)
        buffer[i] = op & 0x80 ? (unsigned char) (i / 512 + op) /* runs */
          : (unsigned char) ((i * 2654435761u) >> 13 ^ op);
      if (op & 0x40)
        memset (buffer, 0, count);        /* zero blocks written */
      if (store_write (store, buffer, count, offset) == 0)
        shadow_write (offset, count, buffer);
      else {
        check (errno == ENOSPC);
        settle_failed_write (store, offset, count, buffer);
      }
      break;
    }
    case 3: case 4:
      verify_range (store, offset, count);
      break;
    case 5:
      check (store_trim (store, count, offset) == 0);
      /* Whole blocks only are trimmed (the device's last block is whole
       * from its start to the device's end); they read as zeros.
       */
      for (uint64_t b = (offset + BS - 1) / BS;
           b < device_blocks && ((b + 1) * BS <= offset + count
                                 || offset + count == device_size);
           b++)
        memset (shadow_of (b), 0, BS);
      break;
    case 6:
      if (store_zero (store, count, offset, op & 0x80) == 0)
        shadow_write (offset, count, NULL);
      else {
        check (errno == ENOSPC);
        static const unsigned char zeros[8 * BS];
        settle_failed_write (store, offset, count, zeros);
      }
      break;
    case 7:
      store_mark_idle (store, 0, NULL, NULL);
      break;
    case 8: {
      struct store_recompress_request request = {
        .type = op & 0x80 ? RECOMPRESS_HUGE_IDLE : RECOMPRESS_IDLE,
      };
      struct store_recompress_result result;
      check (store_recompress (store, &request, NULL, NULL, &result) == 0);
      break;
    }
    case 9: {
      struct store_pack_result result;
      check (store_pack (store, op >> 4, 0, NULL, NULL, &result) == 0);
      if (op & 0x08)
        store_pack_dissolve (store, 50 + op % 50, NULL, NULL);
      break;
    }
    case 10:
      if (config.backing) {
        struct store_writeback_request request = {
          .type = (op >> 4) % 5, .first = offset / BS,
          .last = (offset + count - 1) / BS, .max_blocks = op >> 6,
        };
        struct store_writeback_result result;
        int r = store_writeback (store, &request, NULL, NULL, &result);
        check (r == 0 || errno == ENOSPC);
      }
      break;
    case 11:
      store_compact (store);
      if (op & 0x80)
        store_release_idle_memory (store);
      store_flush (store);
      break;
    }
  }

  /* Every block as the shadow says; the counters as a walk says. */
  for (uint64_t b = 0; b < device_blocks; b++) {
    if (b == WINDOW && device_blocks > 2 * WINDOW)
      b = device_blocks - WINDOW;     /* the unused middle */
    verify_range (store, b * BS, b == device_blocks - 1
                  ? device_size - b * BS : BS);
  }
  struct store_walk walk;
  check (store_walk (store, &walk) == 0);
  struct store_stats stats;
  store_stats (store, &stats);
  check (stats.orig_data_size == walk.stored * BS);
  check (stats.bd_count == walk.written_back);
  check (stats.failed_reads == 0);
  /* The used blocks, whole (the device may end inside the last). */
  if (device_blocks <= 2 * WINDOW)
    check (store_trim (store, device_blocks * BS, 0) == 0);
  else {
    check (store_trim (store, WINDOW * BS, 0) == 0);
    check (store_trim (store, WINDOW * BS, (device_blocks - WINDOW) * BS) == 0);
  }
  store_flush (store);
  store_stats (store, &stats);
  check (stats.orig_data_size == 0 && stats.compr_data_size == 0
         && stats.bd_count == 0 && stats.backing_used == 0
         && stats.packed_blocks == 0 && stats.pack_units == 0);
  store_destroy (store);
  if (memfd >= 0)
    close (memfd);
  return 0;
}
