/* nbdkit-zram-plugin: a compressed RAM block device.
 *
 * This file parses the parameters (man/nbdkit-zram-plugin.pod is the
 * specification; zram_config_help mirrors it) and forwards each request
 * to the block store (block-store.h), which does the work.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lz4.h>
#include <zstd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "block-store.h"
#include "control.h"
#include "error-text.h"
#include "housekeeper.h"
#include "server-check.h"
#include "stats-file.h"
#include "metrics.h"
#include "swap-full.h"
#include "swap-mode.h"

/* The largest request we accept, as nbdkit's memory plugin. */
#define ZRAM_MAX_REQUEST (32u << 20)

/* Compact when this percent of the pool's pages could be freed. */
#define ZRAM_COMPACT_THRESHOLD_DEFAULT 2

/* The allocator keeps its reserve in chunks of this size. */
#define ZRAM_RESERVE_UNIT ((uint64_t) 2 << 20)

static struct store_config config;
static bool size_given, level_given, reserve_given, swap_full_given;
static struct housekeeper_policy policy;
/* recomp_algorithm= by priority (1..STORE_RECOMP_MAX), as given. */
static bool recomp_given[STORE_RECOMP_MAX + 1];
static char *stats_path;
static char *metrics_path;
/* name=: the device label of the metrics. */
static char *device_name;
static char *ctl_path;
/* Writeback: backing= as given (a path made absolute, or an NBD URI). */
static char *backing_target;
static bool backing_direct;
/* backing_timeout=: seconds an NBD backing request may take. */
static unsigned backing_timeout = 30;
static unsigned compact_threshold = ZRAM_COMPACT_THRESHOLD_DEFAULT;
static struct block_store *store;

/* The backing store's own failures (backing.h, ERRORS: rate-limited
 * there).
 */
static void
backing_log (const char *line)
{
  nbdkit_error ("%s", line);
}

static void
zram_load (void)
{
  config.algorithm = CODEC_LZ4;
  zs_pool_config_init (&config.pool);
  server_check_load ();
}

static void
zram_unload (void)
{
  store_destroy (store);
  metrics_unconfigure ();
  free (stats_path);
  free (metrics_path);
  free (device_name);
  free (ctl_path);
  free (backing_target);
}

/* Parse a size, naming the parameter on error (nbdkit's own message
 * does not).
 */
static int
parse_size_parameter (const char *key, const char *value, int64_t *size)
{
  *size = nbdkit_parse_size (value);
  if (*size == -1) {
    nbdkit_error ("%s: '%s' is not a size (e.g. 512M, 8G)", key, value);
    return -1;
  }
  return 0;
}

/* Parse a path, made absolute, into *path (replacing what it held);
 * what names the kind of path in the error ("file", "socket").
 */
static int
parse_path_parameter (const char *key, const char *value, const char *what,
                      char **path)
{
  free (*path);
  *path = *value ? nbdkit_absolute_path (value) : NULL;
  if (!*path) {
    nbdkit_error ("%s: '%s' is not a usable %s name", key, value, what);
    return -1;
  }
  return 0;
}

/* Parse a value from a fixed list, naming the parameter on error. */
static int
parse_choice (const char *key, const char *value, const char *const *names,
              int count, int *result)
{
  for (int i = 0; i < count; i++)
    if (strcmp (value, names[i]) == 0) {
      *result = i;
      return 0;
    }
  char accepted[128] = "";
  for (int i = 0; i < count; i++)
    snprintf (accepted + strlen (accepted), sizeof accepted - strlen (accepted),
              "%s%s", i ? "|" : "", names[i]);
  nbdkit_error ("%s: '%s' is not one of %s", key, value, accepted);
  return -1;
}

/* recomp_algorithm=NAME[:level=N][:priority=P] (',' works as ':' too):
 * a recompression algorithm; without priority, the next free one.
 */
static int
parse_recomp_algorithm (const char *value)
{
  static const char *const algorithms[] = { "lz4", "zstd" };
  char *copy = strdup (value);
  if (!copy) {
    nbdkit_error ("recomp_algorithm: %s", error_text (errno));
    return -1;
  }
  char *save, *name = strtok_r (copy, ":,", &save);
  int algorithm, level = INT32_MIN;
  unsigned priority = 0;
  int r = -1;
  if (!name || parse_choice ("recomp_algorithm", name, algorithms, 2,
                             &algorithm) == -1)
    goto out;
  for (char *option; (option = strtok_r (NULL, ":,", &save)); ) {
    if (strncmp (option, "level=", 6) == 0) {
      if (nbdkit_parse_int ("recomp_algorithm level", option + 6, &level) == -1)
        goto out;
    }
    else if (strncmp (option, "priority=", 9) == 0) {
      if (nbdkit_parse_unsigned ("recomp_algorithm priority", option + 9,
                                 &priority) == -1)
        goto out;
      if (priority < 1 || priority > STORE_RECOMP_MAX) {
        nbdkit_error ("recomp_algorithm: priority %u is not 1..%d", priority,
                      STORE_RECOMP_MAX);
        goto out;
      }
    }
    else {
      nbdkit_error ("recomp_algorithm: '%s' is not level=N or priority=N",
                    option);
      goto out;
    }
  }
  if (!priority)
    for (priority = 1; priority <= STORE_RECOMP_MAX && recomp_given[priority];
         priority++)
      ;
  if (priority > STORE_RECOMP_MAX || recomp_given[priority]) {
    nbdkit_error ("recomp_algorithm: at most %d, one per priority",
                  STORE_RECOMP_MAX);
    goto out;
  }
  int min, max;
  if (level == INT32_MIN)
    level = codec_default_level (algorithm);
  else if (!codec_level_is_valid (algorithm, level, &min, &max)) {
    nbdkit_error ("recomp_algorithm: level %d is not a valid %s level (%d..%d)",
                  level, codec_name (algorithm), min, max);
    goto out;
  }
  recomp_given[priority] = true;
  config.recomp[priority - 1].algorithm = algorithm;
  config.recomp[priority - 1].level = level;
  r = 0;
 out:
  free (copy);
  return r;
}

static int
zram_config (const char *key, const char *value)
{
  static const char *const algorithms[] = { "lz4", "zstd" };
  static const char *const lock_modes[] = { "class", "pool" };
  static const char *const free_modes[] = { "batched", "immediate" };
  static const char *const compact_modes[] = { "auto", "off" };
  int choice;

  if (strcmp (key, "size") == 0) {
    int64_t size;
    if (parse_size_parameter (key, value, &size) == -1)
      return -1;
    if (size == 0) {
      nbdkit_error ("size: the device must be at least 1 byte");
      return -1;
    }
    config.size = size;
    size_given = true;
  }
  else if (strcmp (key, "comp") == 0) {
    if (parse_choice (key, value, algorithms, 2, &choice) == -1)
      return -1;
    config.algorithm = choice;
  }
  else if (strcmp (key, "level") == 0) {
    if (nbdkit_parse_int ("level", value, &config.level) == -1)
      return -1;
    level_given = true;
  }
  else if (strcmp (key, "mem_limit") == 0) {
    int64_t limit;
    if (parse_size_parameter (key, value, &limit) == -1)
      return -1;
    config.pool.mem_limit = limit;
  }
  else if (strcmp (key, "stats") == 0) {
    if (parse_path_parameter (key, value, "file", &stats_path) == -1)
      return -1;
  }
  else if (strcmp (key, "metrics") == 0) {
    if (parse_path_parameter (key, value, "file", &metrics_path) == -1)
      return -1;
  }
  else if (strcmp (key, "name") == 0) {
    /* A label value may hold anything but must say something. */
    if (!*value) {
      nbdkit_error ("name: the device's name must not be empty");
      return -1;
    }
    free (device_name);
    if (!(device_name = strdup (value))) {
      nbdkit_error ("name: %s", error_text (errno));
      return -1;
    }
  }
  else if (strcmp (key, "chain") == 0) {
    if (nbdkit_parse_unsigned ("chain", value, &config.pool.chain_pages) == -1)
      return -1;
    if (config.pool.chain_pages < ZS_CHAIN_MIN
        || config.pool.chain_pages > ZS_CHAIN_MAX) {
      nbdkit_error ("chain: %u is out of range %d..%d",
                    config.pool.chain_pages, ZS_CHAIN_MIN, ZS_CHAIN_MAX);
      return -1;
    }
  }
  else if (strcmp (key, "lock") == 0) {
    if (parse_choice (key, value, lock_modes, 2, &choice) == -1)
      return -1;
    config.pool.lock_mode = choice == 0 ? ZS_LOCK_CLASS : ZS_LOCK_POOL;
  }
  else if (strcmp (key, "compact") == 0) {
    if (parse_choice (key, value, compact_modes, 2, &choice) == -1)
      return -1;
    config.pool.compact_before_refusal = choice == 0;   /* auto */
  }
  else if (strcmp (key, "compact_threshold") == 0) {
    if (nbdkit_parse_unsigned ("compact_threshold", value,
                               &compact_threshold) == -1)
      return -1;
    if (compact_threshold > 100) {
      nbdkit_error ("compact_threshold: %u is not a percentage (0..100)",
                    compact_threshold);
      return -1;
    }
  }
  else if (strcmp (key, "recomp_algorithm") == 0) {
    if (parse_recomp_algorithm (value) == -1)
      return -1;
  }
  else if (strcmp (key, "idle_after") == 0
           || strcmp (key, "recompress_after") == 0
           || strcmp (key, "pack_after") == 0) {
    unsigned seconds;
    if (nbdkit_parse_unsigned (key, value, &seconds) == -1)
      return -1;
    if (seconds > BLOCK_ATIME_MAX) {
      nbdkit_error ("%s: %u seconds is more than %u", key, seconds,
                    BLOCK_ATIME_MAX);
      return -1;
    }
    if (key[0] == 'i')
      policy.idle_after = seconds;
    else if (key[0] == 'r')
      policy.recompress_after = seconds;
    else
      policy.pack_after = seconds;
  }
  else if (strcmp (key, "pack_level") == 0) {
    int min, max;
    if (nbdkit_parse_int ("pack_level", value, &config.pack_level) == -1)
      return -1;
    if (!codec_level_is_valid (CODEC_ZSTD, config.pack_level, &min, &max)) {
      nbdkit_error ("pack_level: %d is not a zstd level (%d..%d, not 0)",
                    config.pack_level, min, max);
      return -1;
    }
  }
  else if (strcmp (key, "write_batch") == 0) {
    if (nbdkit_parse_unsigned (key, value, &config.write_batch) == -1)
      return -1;
    if (config.write_batch < 1 || config.write_batch > STORE_WRITE_BATCH_MAX) {
      nbdkit_error ("write_batch: %u is not a number of blocks 1..%d",
                    config.write_batch, STORE_WRITE_BATCH_MAX);
      return -1;
    }
  }
  else if (strcmp (key, "decode_cache") == 0) {
    int64_t bytes;
    if (parse_size_parameter (key, value, &bytes) == -1)
      return -1;
    if (bytes < 1) {
      nbdkit_error ("decode_cache: '%s' must be more than 0 bytes", value);
      return -1;
    }
    config.decode_cache = bytes;
  }
  else if (strcmp (key, "pack_blocks") == 0) {
    if (nbdkit_parse_unsigned ("pack_blocks", value, &config.pack_blocks) == -1)
      return -1;
    if (config.pack_blocks < 2 || config.pack_blocks > STORE_PACK_MAX) {
      nbdkit_error ("pack_blocks: %u is not a number of blocks 2..%d",
                    config.pack_blocks, STORE_PACK_MAX);
      return -1;
    }
  }
  else if (strcmp (key, "backing") == 0) {
    free (backing_target);
    backing_target = !*value ? NULL
      : backing_is_uri (value) ? strdup (value) : nbdkit_absolute_path (value);
    if (!backing_target) {   /* an empty value too: say what is wrong */
      nbdkit_error ("backing: '%s' is not a file name or an NBD URI", value);
      return -1;
    }
  }
  else if (strcmp (key, "backing_direct") == 0) {
    int direct = nbdkit_parse_bool (value);
    if (direct == -1)
      return -1;
    backing_direct = direct;
  }
  else if (strcmp (key, "backing_sync") == 0) {
    int sync = nbdkit_parse_bool (value);
    if (sync == -1)
      return -1;
    config.backing_nosync = !sync;
  }
  else if (strcmp (key, "backing_timeout") == 0) {
    if (nbdkit_parse_unsigned (key, value, &backing_timeout) == -1)
      return -1;
    if (backing_timeout < 1 || backing_timeout > 3600) {
      nbdkit_error ("backing_timeout: %u is not from 1 to 3600 seconds",
                    backing_timeout);
      return -1;
    }
  }
  else if (strcmp (key, "writeback_limit") == 0) {
    int64_t bytes;
    if (parse_size_parameter (key, value, &bytes) == -1)
      return -1;
    config.writeback_limit = bytes;
    config.writeback_limited = true;    /* 0: nothing, as in zram */
  }
  else if (strcmp (key, "writeback_batch_size") == 0) {
    if (nbdkit_parse_unsigned (key, value, &config.writeback_batch) == -1)
      return -1;
    if (config.writeback_batch < 1
        || config.writeback_batch > STORE_WRITEBACK_BATCH_MAX) {
      nbdkit_error ("writeback_batch_size: %u is not a number of blocks "
                    "1..%d", config.writeback_batch, STORE_WRITEBACK_BATCH_MAX);
      return -1;
    }
  }
  else if (strcmp (key, "writeback_watermark") == 0) {
    if (nbdkit_parse_unsigned (key, value, &policy.writeback_watermark) == -1)
      return -1;
    if (policy.writeback_watermark < 10 || policy.writeback_watermark > 100) {
      nbdkit_error ("writeback_watermark: %u is not a percentage of mem_limit "
                    "10..100", policy.writeback_watermark);
      return -1;
    }
  }
  else if (strcmp (key, "ctl") == 0) {
    if (parse_path_parameter (key, value, "socket", &ctl_path) == -1)
      return -1;
  }
  else if (strcmp (key, "swap") == 0) {
    if (swap_mode_parse (value) == -1)
      return -1;
  }
  else if (strcmp (key, "swap_full") == 0) {
    if (swap_full_parse (value) == -1)
      return -1;
    swap_full_given = true;
  }
  else if (strcmp (key, "swap_reserve") == 0) {
    int64_t reserve;
    if (parse_size_parameter (key, value, &reserve) == -1)
      return -1;
    config.pool.reserve_bytes = reserve;
    reserve_given = true;
  }
  else if (strcmp (key, "free") == 0) {
    if (parse_choice (key, value, free_modes, 2, &choice) == -1)
      return -1;
    config.pool.free_mode = choice == 0 ? ZS_FREE_BATCHED : ZS_FREE_IMMEDIATE;
  }
  else {
    nbdkit_error ("unknown parameter '%s' (see nbdkit-zram-plugin(1))", key);
    return -1;
  }
  return 0;
}

static int
zram_config_complete (void)
{
  int min, max;

  if (!size_given) {
    nbdkit_error ("size: you must give the device size, e.g. 'nbdkit zram 8G'");
    return -1;
  }
  /* A stats file that cannot be written is a bad parameter: say so now,
   * not never.
   */
  if (stats_path && stats_file_check (stats_path) == -1) {
    nbdkit_error ("stats: cannot write '%s': %s", stats_path,
                  errno == EEXIST ? "it is not a regular file"
                  : error_text (errno));
    return -1;
  }
  if (metrics_path && stats_file_check (metrics_path) == -1) {
    nbdkit_error ("metrics: cannot write '%s': %s", metrics_path,
                  errno == EEXIST ? "it is not a regular file"
                  : error_text (errno));
    return -1;
  }
  if (swap_mode_check_config (config.pool.mem_limit) == -1)
    return -1;
  if (policy.recompress_after && !recomp_given[1]) {
    nbdkit_error ("recompress_after: needs recomp_algorithm= (what to "
                  "recompress with)");
    return -1;
  }
  if (policy.recompress_after && !policy.idle_after)
    policy.idle_after = policy.recompress_after;
  if (policy.pack_after
      && (!policy.idle_after || policy.pack_after < policy.idle_after))
    policy.idle_after = policy.pack_after;
  /* Priorities 1..N without a gap. */
  config.recomp_count = 0;
  for (unsigned p = 1; p <= STORE_RECOMP_MAX; p++) {
    if (!recomp_given[p])
      continue;
    if (p != config.recomp_count + 1) {
      nbdkit_error ("recomp_algorithm: priority %u is given but %u is not",
                    p, config.recomp_count + 1);
      return -1;
    }
    config.recomp_count = p;
  }
  if (!backing_target
      && (config.writeback_limited || config.writeback_batch
          || policy.writeback_watermark || backing_direct
          || config.backing_nosync)) {
    nbdkit_error ("%s: needs backing= (where to write blocks back)",
                  config.writeback_limited ? "writeback_limit"
                  : config.writeback_batch ? "writeback_batch_size"
                  : policy.writeback_watermark ? "writeback_watermark"
                  : backing_direct ? "backing_direct" : "backing_sync");
    return -1;
  }
  if (policy.writeback_watermark && !config.pool.mem_limit) {
    nbdkit_error ("writeback_watermark: needs mem_limit= (it is a percentage "
                  "of it)");
    return -1;
  }
  if ((reserve_given || swap_full_given) && swap_mode == SWAP_OFF) {
    nbdkit_error ("%s: only with swap=on or swap=try",
                  reserve_given ? "swap_reserve" : "swap_full");
    return -1;
  }
  /* Swap: a write takes only memory that is resident already, pages
   * and metadata (zs_pool_config.resident_only, swap_reserve_tick).
   */
  config.pool.resident_only = swap_mode != SWAP_OFF;
  /* The reserve is kept in whole chunks of ZRAM_RESERVE_UNIT. */
  if (reserve_given) {
    config.pool.reserve_bytes = (config.pool.reserve_bytes + ZRAM_RESERVE_UNIT - 1)
      / ZRAM_RESERVE_UNIT * ZRAM_RESERVE_UNIT;
    if (config.pool.reserve_bytes > config.pool.mem_limit / 2) {
      nbdkit_error ("swap_reserve: %" PRIu64 " bytes (in whole 2 MiB units) "
                    "is more than half of mem_limit (%" PRIu64 " bytes)",
                    config.pool.reserve_bytes, config.pool.mem_limit);
      return -1;
    }
  }
  else if (swap_mode != SWAP_OFF)
    config.pool.reserve_bytes = swap_mode_default_reserve (config.pool.mem_limit,
                                                           ZRAM_RESERVE_UNIT);
  if (!level_given)
    config.level = codec_default_level (config.algorithm);
  else if (!codec_level_is_valid (config.algorithm, config.level, &min, &max)) {
    nbdkit_error ("level: %d is not a valid %s level (%d..%d%s)",
                  config.level, codec_name (config.algorithm), min, max,
                  config.algorithm == CODEC_ZSTD ? ", not 0" : "");
    return -1;
  }
  return 0;
}

#define zram_config_help \
  "[size=]SIZE               (required) Device size, e.g. 8G.\n" \
  "comp=lz4|zstd             Compression algorithm (default lz4).\n" \
  "level=N                   lz4 acceleration 1..65537, zstd level (default 1).\n" \
  "mem_limit=SIZE            Most memory the compressed data may use (0 = none).\n" \
  "stats=PATH                Write zram-style statistics to PATH every second.\n" \
  "metrics=PATH              Write Prometheus metrics to PATH every second.\n" \
  "name=NAME                 The metrics' device label (default zram).\n" \
  "ctl=PATH                  Control channel: a Unix socket (nbdkit-zramctl).\n" \
  "recomp_algorithm=ALGO[:level=N][:priority=P]\n" \
  "                          A recompression algorithm (up to 3).\n" \
  "idle_after=SECONDS        Policy: mark blocks idle after this (default off).\n" \
  "recompress_after=SECONDS  Policy: recompress idle blocks after this (off).\n" \
  "pack_after=SECONDS        Policy: pack idle blocks after this (off).\n" \
  "pack_level=N              zstd level of packed units (default 6).\n" \
  "pack_blocks=N             Blocks per packed unit, 2..64 (default 16).\n" \
  "decode_cache=SIZE         Decoded packed units kept for reads (default 2M).\n" \
  "write_batch=N             Whole blocks of a write compressed as one batch,\n" \
  "                          1..16 (default 16; 1: block by block).\n" \
  "backing=PATH|URI          Writeback: a file or an NBD URI to write blocks to.\n" \
  "backing_direct=true       Writeback: open the backing file with O_DIRECT.\n" \
  "backing_timeout=SECONDS   Writeback: an NBD backing request's deadline (30).\n" \
  "backing_sync=false        Writeback: drop RAM copies without a flush.\n" \
  "writeback_limit=SIZE      Writeback: write at most this much (0 = nothing;\n" \
  "                          default no limit).\n" \
  "writeback_batch_size=N    Writeback: blocks per backing write (default 32).\n" \
  "writeback_watermark=PERCENT\n" \
  "                          Writeback: above this much of mem_limit, write the\n" \
  "                          coldest blocks back (default off).\n" \
  "compact=auto|off          Compact memory in the background (default auto).\n" \
  "compact_threshold=PERCENT Compact when this much could be freed (default 2).\n" \
  "swap=on|try|off           Be a safe swap target: lock memory, IO flusher,\n" \
  "                          OOM-proof; needs mem_limit (default off).\n" \
  "swap_reserve=SIZE         Swap mode: populated pages kept ready (default\n" \
  "                          RAM/32 within 4M..64M, at most mem_limit/8).\n" \
  "swap_full=oom|fail        Swap mode, device full and memory short: ask the\n" \
  "                          kernel's OOM killer to act (default oom).\n" \
  "chain=N                   Tuning: pages per zspage at most, 1..16 (default 8).\n" \
  "lock=class|pool           Tuning: allocator locking (default class).\n" \
  "free=batched|immediate    Tuning: allocator free mode (default batched)."

/* Create the store before nbdkit forks, so errors reach the user. */
static int
zram_get_ready (void)
{
  /* First: no thread may exist yet (they inherit the IO flusher flag). */
  if (swap_mode_prepare () == -1)
    return -1;
  if (backing_target) {
    char *error = NULL;
    /* Reads bring written-back blocks home below the watermark; above
     * it the policy writes the coldest out: the blocks in use end up in
     * RAM.
     */
    if (policy.writeback_watermark)
      config.readback_below = config.pool.mem_limit / 100
        * policy.writeback_watermark;
    config.backing = backing_open (backing_target, config.size, backing_direct,
                                   backing_timeout, &error);
    if (!config.backing) {
      nbdkit_error ("%s", error ? error : "backing: out of memory");
      free (error);
      return -1;
    }
    backing_set_log (config.backing, backing_log);
  }
  store = store_create (&config);
  if (!store) {
    nbdkit_error ("cannot create the compressed store: %s", error_text (errno));
    return -1;
  }
  if (metrics_configure (store, device_name ? device_name : "zram") == -1) {
    nbdkit_error ("metrics: %s", error_text (errno));
    return -1;
  }
  if (ctl_path && control_listen (ctl_path) == -1)
    return -1;
  nbdkit_debug ("zram: %" PRIu64 " bytes, %s level %d, chain %u, "
                "raw from %zu bytes",
                config.size, codec_name (config.algorithm), config.level,
                config.pool.chain_pages, store_raw_threshold (store));
  return 0;
}

/* Swap mode makes this many compression contexts ready: nbdkit's worker
 * threads by default (--threads 16), the housekeeper and the control
 * thread.
 */
#define SWAP_SERVING_THREADS 18

/* Swap mode: the heap room the reserve keeper keeps ready for the
 * allocator's metadata: a thirty-second of the reserve (a zspage of
 * compressed 4 KiB pages takes about 100 bytes of descriptor and cells a
 * page, 2.5%), at least 1 MiB.  Kept resident for good: what idle
 * memory swap mode keeps beyond the reserve.
 */
static size_t
metadata_headroom (void)
{
  uint64_t headroom = config.pool.reserve_bytes / 32;
  return headroom < (1 << 20) ? 1 << 20 : headroom;
}

/* The reserve keeper's work beyond the pages (housekeeper.h,
 * reserve_tick), all of it what a swap write must find ready: the heap's
 * room for the allocator's metadata, the stacks of threads new since the
 * last tick.  (The full-device watch has a thread of its own,
 * swap_full_start: the keeper may be the thread that is stuck.)
 */
static void
swap_reserve_tick (void)
{
  store_metadata_ready (store, swap_mode_heap_ready (metadata_headroom ()));
  swap_mode_ready_stacks ();
}

/* After the full-device watcher asked the OOM killer to act (swap-full.h):
 * the writes may take the reserve, so that the kernel's reclaim, where
 * the victim may be stuck, stores pages again.
 */
static void
open_reserve (void)
{
  store_open_reserve (store);
}

/* Threads do not survive nbdkit's fork: start the housekeeper after it. */
static int
zram_after_fork (void)
{
  if (swap_mode_lock () == -1)
    goto failed;
  /* Swap mode: what the serving path needs, made (and so locked) before
   * any request; the reserve below.  The table is charged to mem_limit.
   */
  size_t heap_bytes = swap_mode_prepare_heap (config.size / STORE_BLOCK_SIZE,
                                              config.pool.mem_limit);
  if (swap_mode != SWAP_OFF
      && store_keep_resident (store, SWAP_SERVING_THREADS) == -1) {
    nbdkit_error ("swap=%s: cannot make the block table and compression "
                  "contexts ready: %s%s", swap_mode == SWAP_ON ? "on" : "try",
                  error_text (errno),
                  errno == ENOSPC ? " (mem_limit is too small for the "
                  "device's table: 16 bytes a block)" : "");
    if (swap_mode == SWAP_ON)
      goto failed;
  }
  /* Swap mode: the reserve populated (and locked) before any request,
   * and a full device watched.
   */
  policy.reserve_always = swap_mode != SWAP_OFF;
  policy.reserve_tick = swap_mode != SWAP_OFF ? swap_reserve_tick : NULL;
  if (swap_mode != SWAP_OFF)
    store_metadata_ready (store, swap_mode_heap_ready (metadata_headroom ()));
  housekeeper_set_policy (&policy);
  if (housekeeper_start (store, stats_path, metrics_path,
                         config.pool.compact_before_refusal
                         ? (int) compact_threshold : -1) == -1) {
    nbdkit_error ("cannot start the housekeeping thread: %s", error_text (errno));
    goto failed;
  }
  if (swap_mode != SWAP_OFF && swap_full_start (open_reserve) == -1) {
    nbdkit_error ("cannot start the full-device watcher: %s", error_text (errno));
    goto failed;
  }
  struct store_stats stats;
  store_stats (store, &stats);
  swap_mode_report (stats.reserve_bytes,
                    heap_bytes + stats.table_bytes + stats.codec_bytes);
  struct control_info info = {
    .disksize = config.size,
    .algorithm = codec_name (config.algorithm),
    .level = config.level,
  };
  if (control_start (store, &info) == -1) {
    nbdkit_error ("ctl: cannot start the control thread: %s", error_text (errno));
    goto failed;
  }
  return 0;

 failed:
  /* nbdkit exits without .cleanup: stop what started, and leave no
   * control socket behind.
   */
  control_stop ();
  swap_full_stop ();
  housekeeper_stop ();
  return -1;
}

static void
zram_cleanup (void)
{
  /* A writeback in progress (the control channel's, the housekeeper's)
   * must not hold up the exit on a slow backing store.
   */
  if (store)
    store_cancel_backing_io (store);
  control_stop ();
  swap_full_stop ();
  housekeeper_stop ();
  if (store) {
    char *text = NULL;
    size_t length = 0;
    FILE *fp = open_memstream (&text, &length);
    if (fp) {
      stats_print (store, fp);
      fclose (fp);
      for (char *line = strtok (text, "\n"); line; line = strtok (NULL, "\n"))
        nbdkit_debug ("zram: %s", line);
      free (text);
    }
  }
}

static void
zram_dump_plugin (void)
{
  printf ("zram_lz4=yes\n");
  printf ("zram_lz4_version=%s\n", LZ4_versionString ());
  printf ("zram_zstd=yes\n");
  printf ("zram_zstd_version=%s\n", ZSTD_versionString ());
  printf ("zram_chain_default=%d\n", ZS_CHAIN_DEFAULT);
  /* yes: the server survives clients that hang up with requests in
   * flight (nbdkit 1.34 or later).
   */
  printf ("zram_server_disconnect_fix=%s\n",
          server_has_disconnect_fix ? "yes" : "no");
}

static void *
zram_open (int readonly)
{
  server_check_open ();
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static int64_t
zram_get_size (void *handle)
{
  return config.size;
}

static int
zram_block_size (void *handle, uint32_t *minimum, uint32_t *preferred,
                 uint32_t *maximum)
{
  *minimum = 1;
  *preferred = STORE_BLOCK_SIZE;
  *maximum = ZRAM_MAX_REQUEST;
  return 0;
}

static int
zram_can_true (void *handle)
{
  return 1;
}

static int
zram_can_fua (void *handle)
{
  return NBDKIT_FUA_NATIVE;     /* RAM: every write is as durable as it gets */
}

static int
zram_can_cache (void *handle)
{
  return NBDKIT_CACHE_NATIVE;   /* all data is already in memory */
}

/* Failed requests logged in a second, at most: a device at its limit
 * (swap, a filling disk) may refuse thousands of writes a second, every
 * one counted in the stats; a line each would flood the log (the soak
 * wrote 325 MB of them in 30 minutes).
 */
#define FAILURES_LOGGED_PER_SECOND 10
static _Atomic int64_t failure_second;         /* the second counted */
static _Atomic uint64_t failures_this_second;
static _Atomic uint64_t failures_not_logged;   /* since the last line */

/* May this failure be logged?  Says how many were not, once a second. */
static bool
failure_log_allowed (void)
{
  struct timespec now;
  clock_gettime (CLOCK_MONOTONIC, &now);
  int64_t second = now.tv_sec;
  int64_t counted = atomic_load (&failure_second);
  if (second != counted
      && atomic_compare_exchange_strong (&failure_second, &counted, second)) {
    atomic_store (&failures_this_second, 0);
    uint64_t missed = atomic_exchange (&failures_not_logged, 0);
    if (missed)
      nbdkit_error ("%" PRIu64 " more failed requests were not logged "
                    "(the stats count every one)", missed);
  }
  if (atomic_fetch_add (&failures_this_second, 1) < FAILURES_LOGGED_PER_SECOND)
    return true;
  atomic_fetch_add (&failures_not_logged, 1);
  return false;
}

/* Report a store failure to nbdkit: ENOSPC (memory limit) maps to
 * ENOSPC on the wire, ENOMEM and EIO pass through.  In swap mode a store
 * refused for room is counted for the full-device watch (swap-full.h),
 * and EAGAIN (no resident memory ready: zs_pool_config.resident_only)
 * wakes the refill and goes out as ENOMEM: the kernel keeps the page and
 * tries again.  Both count for the watch: when the keeper cannot make
 * memory ready because the machine has none, writes fail "not ready"
 * for as long as a full device's fail "no room".
 */
static int
request_failed (const char *what, bool stores, uint64_t count, uint64_t offset)
{
  int err = errno;
  bool unready = err == EAGAIN;
  if (unready)
    housekeeper_wake ();
  /* Either refusal, kept up while memory is short, is the same
   * livelock: the kernel tries the page again and again.
   */
  if ((unready || err == ENOSPC) && stores && swap_mode != SWAP_OFF)
    swap_full_note_refusal ();
  if (unready)
    err = ENOMEM;
  if (failure_log_allowed ()) {
    /* At the limit with a backing store: why writeback made no room
     * (a full or failing store is the store's news, not memory's).
     */
    const char *room_failure = err == ENOSPC ? store_room_failure () : NULL;
    if (err == ENOSPC)
      nbdkit_error ("%s of %" PRIu64 " bytes at %" PRIu64 ": out of memory "
                    "(mem_limit reached%s%s)", what, count, offset,
                    room_failure ? "; writeback: " : "",
                    room_failure ? room_failure : "");
    else
      nbdkit_error ("%s of %" PRIu64 " bytes at %" PRIu64 ": %s",
                    what, count, offset,
                    unready ? "no memory ready (swap reserve empty: "
                    "refilling)" : error_text (err));
  }
  nbdkit_set_error (err);
  return -1;
}

/* Every data request starts here: the server check and, in swap mode,
 * the count of the thread's page faults (swap-mode.h).
 */
static uint64_t
request_begin (bool stores)
{
  server_check_request ();
  if (swap_mode == SWAP_OFF)
    return 0;
  if (stores)
    swap_full_store_start ();
  return swap_mode_request_start ();
}

/* ... and ends here, with the store's answer r. */
static int
request_end (int r, const char *what, bool stores, uint64_t faults,
             uint64_t count, uint64_t offset)
{
  int err = errno;
  if (swap_mode != SWAP_OFF) {
    swap_mode_request_done (stores, faults);
    if (stores)
      swap_full_store_done ();
  }
  errno = err;
  return r == -1 ? request_failed (what, stores, count, offset) : 0;
}

static int
zram_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
            uint32_t flags)
{
  uint64_t faults = request_begin (false);
  return request_end (store_read (store, buf, count, offset), "read", false,
                      faults, count, offset);
}

static int
zram_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset,
             uint32_t flags)
{
  uint64_t faults = request_begin (true);
  if (swap_mode != SWAP_OFF && store_reserve_low (store))
    housekeeper_wake ();
  return request_end (store_write (store, buf, count, offset), "write", true,
                      faults, count, offset);
}

static int
zram_flush (void *handle, uint32_t flags)
{
  return 0;                     /* RAM: nothing to flush */
}

static int
zram_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  uint64_t faults = request_begin (true);
  return request_end (store_trim (store, count, offset), "trim", true, faults,
                      count, offset);
}

/* Zeroing is always cheap here (whole blocks just drop their object), so
 * NBDKIT_FLAG_FAST_ZERO needs no special case.
 */
static int
zram_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  uint64_t faults = request_begin (true);
  return request_end (store_zero (store, count, offset,
                                  flags & NBDKIT_FLAG_MAY_TRIM),
                      "zero", true, faults, count, offset);
}

static int
add_extent (void *opaque, uint64_t offset, uint64_t length,
            enum store_extent type)
{
  static const uint32_t nbdkit_types[] = {
    [STORE_EXTENT_DATA] = 0,
    [STORE_EXTENT_ZERO] = NBDKIT_EXTENT_ZERO,
    [STORE_EXTENT_HOLE] = NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO,
  };
  return nbdkit_add_extent (opaque, offset, length, nbdkit_types[type]);
}

static int
zram_extents (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
              struct nbdkit_extents *extents)
{
  return store_extents (store, count, offset, add_extent, extents);
}

static int
zram_cache (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return 0;
}

static struct nbdkit_plugin plugin = {
  .name              = "zram",
  .version           = PACKAGE_VERSION,
  .longname          = "nbdkit compressed RAM plugin",
  .description       = "A compressed RAM disk (lz4 or zstd, zsmalloc-style)",
  .load              = zram_load,
  .unload            = zram_unload,
  .config            = zram_config,
  .config_complete   = zram_config_complete,
  .config_help       = zram_config_help,
  .magic_config_key  = "size",
  .get_ready         = zram_get_ready,
  .after_fork        = zram_after_fork,
  .cleanup           = zram_cleanup,
  .dump_plugin       = zram_dump_plugin,
  .open              = zram_open,
  .get_size          = zram_get_size,
  .block_size        = zram_block_size,
  .can_write         = zram_can_true,
  .can_flush         = zram_can_true,
  .can_trim          = zram_can_true,
  .can_zero          = zram_can_true,
  .can_fast_zero     = zram_can_true,
  .can_extents       = zram_can_true,
  .can_multi_conn    = zram_can_true,
  .can_fua           = zram_can_fua,
  .can_cache         = zram_can_cache,
  .pread             = zram_pread,
  .pwrite            = zram_pwrite,
  .flush             = zram_flush,
  .trim              = zram_trim,
  .zero              = zram_zero,
  .extents           = zram_extents,
  .cache             = zram_cache,
  .errno_is_preserved = 1,
};

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
NBDKIT_REGISTER_PLUGIN (plugin)
