/* The plugin's parameters: see params.h.  The table is the one list;
 * nbdkit-zram-plugin(1), PARAMETERS, is the specification it follows.
 */

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "block-table.h"
#include "codec.h"
#include "devices.h"
#include "error-text.h"
#include "params.h"
#include "stats-file.h"
#include "text-parse.h"
#include "swap-full.h"
#include "swap-mode.h"
#include "zsalloc.h"

/* The allocator keeps swap mode's reserve in chunks of this size. */
#define RESERVE_UNIT ((uint64_t) 2 << 20)

enum param_kind {
  KIND_SIZE,            /* parse_size into a uint64_t, >= min */
  KIND_UNSIGNED,        /* into an unsigned, min..max */
  KIND_INT,             /* into an int (its range checked elsewhere) */
  KIND_BOOL,            /* parse_bool into a bool */
  KIND_CHOICE,          /* one of choices, its index into an int (an enum
                           whose values are the indexes) */
  KIND_PATH,            /* made absolute, into a char * */
  KIND_CUSTOM,          /* set does it all */
};

struct param {
  const char *key;
  enum param_kind kind;
  const char *syntax;           /* after "key=" in --help */
  const char *help;             /* --help's text; '\n' starts a new line */
  size_t offset;                /* of the target in struct zram_params */
  int64_t min, max;             /* KIND_SIZE: min; KIND_UNSIGNED: both */
  const char *const *choices;   /* KIND_CHOICE: NULL-terminated */
  const char *what;             /* KIND_UNSIGNED: the range's unit, for
                                   the error; KIND_PATH: "file", "socket" */
  int (*set) (struct zram_params *params, const char *value);
                                /* KIND_CUSTOM; else, after the value is
                                   stored, further checks (may be NULL) */
};

#define AT(field) offsetof (struct zram_params, field)
#define CHOICES(...) ((const char *const []) { __VA_ARGS__, NULL })

static int set_name (struct zram_params *, const char *);
static int set_device (struct zram_params *, const char *);
static int set_recomp_algorithm (struct zram_params *, const char *);
static int check_pack_level (struct zram_params *, const char *);
static int set_backing (struct zram_params *, const char *);
static int set_backing_sync (struct zram_params *, const char *);
static int set_compact (struct zram_params *, const char *);
static int set_swap (struct zram_params *, const char *);
static int set_swap_full (struct zram_params *, const char *);
static int set_swap_full_after (struct zram_params *, const char *);
static int set_swap_full_available (struct zram_params *, const char *);

static const struct param params_table[PARAM_COUNT] = {
  [P_SIZE] = { "size", KIND_SIZE, "SIZE",
    "(required) Device size, e.g. 8G.", AT (store.size), .min = 1 },
  [P_COMP] = { "comp", KIND_CHOICE, "lz4|zstd",
    "Compression algorithm (default lz4).", AT (store.algorithm),
    .choices = CHOICES ("lz4", "zstd") },
  [P_LEVEL] = { "level", KIND_INT, "N",
    "lz4 acceleration 1..65537, zstd level (default 1).", AT (store.level) },
  [P_DEVICE] = { "device", KIND_CUSTOM,
    "NAME:SIZE[:comp=A][:level=N][:cap=SIZE][:floor=SIZE]",
    "One more device, the export NAME, on the same\n"
    "memory budget (repeatable; default comp=, level=).",
    .set = set_device },
  [P_MEM_LIMIT] = { "mem_limit", KIND_SIZE, "SIZE",
    "Most memory the compressed pages may use, as\n"
    "zram's mem_limit (0 = none).",
    AT (store.pool.mem_limit) },
  [P_MEM_BUDGET] = { "mem_budget", KIND_SIZE, "SIZE",
    "Instead of mem_limit: most memory the store may\n"
    "use, its table and metadata included (0 = none).",
    AT (store.pool.mem_limit) },
  [P_STATS] = { "stats", KIND_PATH, "PATH",
    "Write zram-style statistics to PATH every second.", AT (stats_path),
    .what = "file" },
  [P_METRICS] = { "metrics", KIND_PATH, "PATH",
    "Write Prometheus metrics to PATH every second.", AT (metrics_path),
    .what = "file" },
  [P_NAME] = { "name", KIND_CUSTOM, "NAME",
    "The metrics' device label (default zram).", .set = set_name },
  [P_CTL] = { "ctl", KIND_PATH, "PATH",
    "Control channel: a Unix socket (nbdkit-zramctl).", AT (ctl_path),
    .what = "socket" },
  [P_CTL_RO] = { "ctl_ro", KIND_PATH, "PATH",
    "Read-only control channel: a socket any local user\n"
    "may read the figures on.", AT (ctl_ro_path), .what = "socket" },
  [P_RECOMP_ALGORITHM] = { "recomp_algorithm", KIND_CUSTOM,
    "ALGO[:level=N][:priority=P]",
    "A recompression algorithm (up to 3).", .set = set_recomp_algorithm },
  [P_IDLE_AFTER] = { "idle_after", KIND_UNSIGNED, "SECONDS",
    "Policy: mark blocks idle after this (default off).",
    AT (policy.idle_after), 0, BLOCK_ATIME_MAX, .what = "seconds" },
  [P_RECOMPRESS_AFTER] = { "recompress_after", KIND_UNSIGNED, "SECONDS",
    "Policy: recompress idle blocks after this (off).",
    AT (policy.recompress_after), 0, BLOCK_ATIME_MAX, .what = "seconds" },
  [P_PACK_AFTER] = { "pack_after", KIND_UNSIGNED, "SECONDS",
    "Policy: pack idle blocks after this (off).",
    AT (policy.pack_after), 0, BLOCK_ATIME_MAX, .what = "seconds" },
  [P_PACK_LEVEL] = { "pack_level", KIND_INT, "N",
    "zstd level of packed units (default 14).", AT (store.pack_level),
    .set = check_pack_level },
  [P_PACK_BLOCKS] = { "pack_blocks", KIND_UNSIGNED, "N",
    "Blocks per packed unit, 2..64 (default 16).", AT (store.pack_blocks),
    2, STORE_PACK_MAX, .what = "blocks" },
  [P_DECODE_CACHE] = { "decode_cache", KIND_SIZE, "SIZE",
    "Decoded packed units kept for reads (default 2M).",
    AT (store.decode_cache), .min = 1 },
  [P_WRITE_BATCH] = { "write_batch", KIND_UNSIGNED, "N",
    "Whole blocks of a write compressed as one batch,\n"
    "1..16 (default 16; 1: block by block).", AT (store.write_batch),
    1, STORE_WRITE_BATCH_MAX, .what = "blocks" },
  [P_BACKING] = { "backing", KIND_CUSTOM, "PATH|URI",
    "Writeback: a file or an NBD URI to write blocks to.",
    .set = set_backing },
  [P_BACKING_DIRECT] = { "backing_direct", KIND_BOOL, "true",
    "Writeback: open the backing file with O_DIRECT.", AT (backing_direct) },
  [P_BACKING_TIMEOUT] = { "backing_timeout", KIND_UNSIGNED, "SECONDS",
    "Writeback: an NBD backing request's deadline (30).",
    AT (backing_timeout), 1, 3600, .what = "seconds" },
  [P_BACKING_SYNC] = { "backing_sync", KIND_CUSTOM, "false",
    "Writeback: drop RAM copies without a flush.", .set = set_backing_sync },
  [P_WRITEBACK_LIMIT] = { "writeback_limit", KIND_SIZE, "SIZE",
    "Writeback: write at most this much (0 = nothing;\n"
    "default no limit).", AT (store.writeback_limit) },
  [P_WRITEBACK_BATCH_SIZE] = { "writeback_batch_size", KIND_UNSIGNED, "N",
    "Writeback: blocks per backing write (default 32).",
    AT (store.writeback_batch), 1, STORE_WRITEBACK_BATCH_MAX,
    .what = "blocks" },
  [P_WRITEBACK_WATERMARK] = { "writeback_watermark", KIND_UNSIGNED,
    "PERCENT",
    "Writeback: above this much of mem_limit, write the\n"
    "coldest blocks back (default off).", AT (policy.writeback_watermark),
    10, 100, .what = "percent of mem_limit" },
  [P_COMPACT] = { "compact", KIND_CUSTOM, "auto|off",
    "Compact memory in the background (default auto).", .set = set_compact,
    .choices = CHOICES ("auto", "off") },
  [P_COMPACT_THRESHOLD] = { "compact_threshold", KIND_UNSIGNED, "PERCENT",
    "Compact when this much could be freed (default 2).",
    AT (compact_threshold), 0, 100, .what = "percent" },
  [P_SWAP] = { "swap", KIND_CUSTOM, "on|try|off",
    "Be a safe swap target: lock memory, IO flusher,\n"
    "OOM-proof; needs mem_limit (default off).", .set = set_swap,
    .choices = CHOICES ("on", "try", "off") },
  [P_SWAP_RESERVE] = { "swap_reserve", KIND_SIZE, "SIZE",
    "Swap mode: populated pages kept ready (default\n"
    "RAM/32 within 4M..64M, at most mem_limit/8).",
    AT (store.pool.reserve_bytes) },
  [P_SWAP_RESERVE_WAIT] = { "swap_reserve_wait", KIND_UNSIGNED, "MILLISECONDS",
    "Swap mode: how long a write that finds the\n"
    "reserve empty waits for its refill (default 250).",
    AT (swap_reserve_wait), 0, 10000, .what = "milliseconds" },
  [P_SWAP_FULL] = { "swap_full", KIND_CUSTOM, "oom|fail",
    "Swap mode, device full and memory short: ask the\n"
    "kernel's OOM killer to act (default oom).", .set = set_swap_full,
    .choices = CHOICES ("oom", "fail") },
  [P_SWAP_FULL_AFTER] = { "swap_full_after", KIND_CUSTOM, "MILLISECONDS",
    "A full device: writes refused this long (2000).",
    .set = set_swap_full_after },
  [P_SWAP_FULL_AVAILABLE] = { "swap_full_available", KIND_CUSTOM, "SIZE",
    "A full device: memory short below this MemAvailable\n"
    "(0: 2 x min_free_kbytes or RAM/32).", .set = set_swap_full_available },
  [P_REGION] = { "region", KIND_PATH, "PATH",
    "Keep the device in memory that outlives the server: the region file\n"
    "naming it (a server started again with it serves the same data).",
    AT (region_path), .what = "file" },
  [P_STANDBY] = { "standby", KIND_PATH, "PATH",
    "Start as a standby for region=: ready, not serving, until a line\n"
    "'takeover' on the socket PATH (its server handed over or died).",
    AT (standby_path), .what = "socket" },
  [P_CHAIN] = { "chain", KIND_UNSIGNED, "N",
    "Tuning: pages per zspage at most, 1..16 (default 8).",
    AT (store.pool.chain_pages), ZS_CHAIN_MIN, ZS_CHAIN_MAX,
    .what = "pages" },
  [P_LOCK] = { "lock", KIND_CHOICE, "class|pool",
    "Tuning: allocator locking (default class).", AT (store.pool.lock_mode),
    .choices = CHOICES ("class", "pool") },
  [P_FREE] = { "free", KIND_CHOICE, "batched|immediate",
    "Tuning: allocator free mode (default batched).",
    AT (store.pool.free_mode), .choices = CHOICES ("batched", "immediate") },
};

/* The enums the choices are stored into count as the table does; the
 * policy's 32-bit fields are unsigned.
 */
_Static_assert (sizeof (uint32_t) == sizeof (unsigned), "policy's fields");
_Static_assert (CODEC_LZ4 == 0 && CODEC_ZSTD == 1, "comp's choices");
_Static_assert (ZS_LOCK_CLASS == 0 && ZS_LOCK_POOL == 1, "lock's choices");
_Static_assert (ZS_FREE_BATCHED == 0 && ZS_FREE_IMMEDIATE == 1,
                "free's choices");

#define TARGET(params, param, type) \
  ((type *) ((char *) (params) + (param)->offset))

void
params_init (struct zram_params *params)
{
  *params = (struct zram_params) {
    .backing_timeout = 30,
    .compact_threshold = 2,
    .swap_reserve_wait = 250,
  };
  params->store.algorithm = CODEC_LZ4;
  zs_pool_config_init (&params->store.pool);
}

void
params_free (struct zram_params *params)
{
  free (params->stats_path);
  free (params->metrics_path);
  free (params->device_name);
  free (params->ctl_path);
  free (params->ctl_ro_path);
  free (params->region_path);
  free (params->standby_path);
  free (params->backing_target);
}

/* The choice value is, as its index in choices; -1 after an error naming
 * key and what it accepts.
 */
static int
choice_index (const char *key, const char *value, const char *const *choices)
{
  for (int i = 0; choices[i]; i++)
    if (strcmp (value, choices[i]) == 0)
      return i;
  char accepted[128] = "";
  for (int i = 0; choices[i]; i++)
    snprintf (accepted + strlen (accepted), sizeof accepted - strlen (accepted),
              "%s%s", i ? "|" : "", choices[i]);
  nbdkit_error ("%s: '%s' is not one of %s", key, value, accepted);
  return -1;
}

/* Parse value by param's kind into its target. */
static int
param_parse (struct zram_params *params, const struct param *param,
             const char *value)
{
  const char *key = param->key;
  int64_t size;
  int choice, flag;
  switch (param->kind) {
  case KIND_SIZE:
    size = parse_size (value);
    if (size == -1) {
      nbdkit_error ("%s: '%s' is not a size (e.g. 512M, 8G)", key, value);
      return -1;
    }
    if (size < param->min) {
      nbdkit_error ("%s: '%s' must be at least %" PRId64 " byte%s", key,
                    value, param->min, param->min == 1 ? "" : "s");
      return -1;
    }
    *TARGET (params, param, uint64_t) = size;
    return 0;
  case KIND_UNSIGNED: {
    unsigned *number = TARGET (params, param, unsigned);
    if (nbdkit_parse_unsigned (key, value, number) == -1)
      return -1;
    if (*number < param->min || *number > param->max) {
      nbdkit_error ("%s: %u is out of range %" PRId64 "..%" PRId64 " (%s)",
                    key, *number, param->min, param->max, param->what);
      return -1;
    }
    return 0;
  }
  case KIND_INT:
    return nbdkit_parse_int (key, value, TARGET (params, param, int));
  case KIND_BOOL:
    if ((flag = parse_bool (value)) == -1) {
      nbdkit_error ("%s: '%s' is not a boolean (true|false, yes|no, on|off, "
                    "1|0)", key, value);
      return -1;
    }
    *TARGET (params, param, bool) = flag;
    return 0;
  case KIND_CHOICE:
    if ((choice = choice_index (key, value, param->choices)) == -1)
      return -1;
    *TARGET (params, param, int) = choice;
    return 0;
  case KIND_PATH: {
    char **path = TARGET (params, param, char *);
    free (*path);
    *path = *value ? nbdkit_absolute_path (value) : NULL;
    if (!*path) {
      nbdkit_error ("%s: '%s' is not a usable %s name", key, value,
                    param->what);
      return -1;
    }
    return 0;
  }
  case KIND_CUSTOM:
    return param->set (params, value);
  }
  return -1;
}

int
params_set (struct zram_params *params, const char *key, const char *value)
{
  for (int id = 0; id < PARAM_COUNT; id++) {
    const struct param *param = &params_table[id];
    if (strcmp (key, param->key) != 0)
      continue;
    if (param_parse (params, param, value) == -1
        || (param->kind != KIND_CUSTOM && param->set
            && param->set (params, value) == -1))
      return -1;
    params->given[id] = true;
    return 0;
  }
  nbdkit_error ("unknown parameter '%s' (see nbdkit-zram-plugin(1))", key);
  return -1;
}

/* ---- the parameters with more to them ---------------------------------- */

static int
set_device (struct zram_params *params, const char *value)
{
  return devices_declare (value);
}

static int
set_name (struct zram_params *params, const char *value)
{
  /* A label value may hold anything but must say something. */
  if (!*value) {
    nbdkit_error ("name: the device's name must not be empty");
    return -1;
  }
  free (params->device_name);
  if (!(params->device_name = strdup (value))) {
    nbdkit_error ("name: %s", error_text (errno));
    return -1;
  }
  return 0;
}

static int
check_pack_level (struct zram_params *params, const char *value)
{
  int min, max;
  (void) value;
  if (!codec_level_is_valid (CODEC_ZSTD, params->store.pack_level, &min,
                             &max)) {
    nbdkit_error ("pack_level: %d is not a zstd level (%d..%d, not 0)",
                  params->store.pack_level, min, max);
    return -1;
  }
  return 0;
}

static int
set_backing (struct zram_params *params, const char *value)
{
  free (params->backing_target);
  params->backing_target = !*value ? NULL
    : backing_is_uri (value) ? strdup (value) : nbdkit_absolute_path (value);
  if (!params->backing_target) {   /* an empty value too: say what is wrong */
    nbdkit_error ("backing: '%s' is not a file name or an NBD URI", value);
    return -1;
  }
  return 0;
}

static int
set_backing_sync (struct zram_params *params, const char *value)
{
  int sync = parse_bool (value);
  if (sync == -1) {
    nbdkit_error ("backing_sync: '%s' is not a boolean (true|false, yes|no, "
                  "on|off, 1|0)", value);
    return -1;
  }
  params->store.backing_nosync = !sync;
  return 0;
}

static int
set_compact (struct zram_params *params, const char *value)
{
  int choice = choice_index ("compact", value,
                             params_table[P_COMPACT].choices);
  if (choice == -1)
    return -1;
  params->store.pool.compact_before_refusal = choice == 0;   /* auto */
  return 0;
}

static int
set_swap (struct zram_params *params, const char *value)
{
  (void) params;
  return swap_mode_parse (value);
}

static int
set_swap_full_after (struct zram_params *params, const char *value)
{
  (void) params;
  return swap_full_after_parse (value);
}

static int
set_swap_full_available (struct zram_params *params, const char *value)
{
  (void) params;
  return swap_full_available_parse (value);
}

static int
set_swap_full (struct zram_params *params, const char *value)
{
  (void) params;
  return swap_full_parse (value);
}

/* recomp_algorithm=NAME[:level=N][:priority=P] (',' works as ':' too):
 * a recompression algorithm; without priority, the next free one.
 */
static int
set_recomp_algorithm (struct zram_params *params, const char *value)
{
  char *copy = strdup (value);
  if (!copy) {
    nbdkit_error ("recomp_algorithm: %s", error_text (errno));
    return -1;
  }
  char *save, *name = strtok_r (copy, ":,", &save);
  int algorithm, level = INT32_MIN;
  unsigned priority = 0;
  int r = -1;
  if (!name || (algorithm = choice_index ("recomp_algorithm", name,
                                          params_table[P_COMP].choices)) == -1)
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
    for (priority = 1;
         priority <= STORE_RECOMP_MAX && params->recomp_given[priority];
         priority++)
      ;
  if (priority > STORE_RECOMP_MAX || params->recomp_given[priority]) {
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
  params->recomp_given[priority] = true;
  params->store.recomp[priority - 1].algorithm = algorithm;
  params->store.recomp[priority - 1].level = level;
  r = 0;
 out:
  free (copy);
  return r;
}

/* ---- between parameters ------------------------------------------------ */

/* A stats or metrics file that cannot be written is a bad parameter: say
 * so now, not never.
 */
static int
check_output_file (const char *key, const char *path)
{
  if (!path || stats_file_check (path) == 0)
    return 0;
  nbdkit_error ("%s: cannot write '%s': %s", key, path,
                errno == EEXIST ? "it is not a regular file"
                : error_text (errno));
  return -1;
}

/* Recompression priorities 1..N without a gap. */
static int
recomp_complete (struct zram_params *params)
{
  struct housekeeper_policy *policy = &params->policy;
  if (policy->recompress_after && !params->recomp_given[1]) {
    nbdkit_error ("recompress_after: needs recomp_algorithm= (what to "
                  "recompress with)");
    return -1;
  }
  if (policy->recompress_after && !policy->idle_after)
    policy->idle_after = policy->recompress_after;
  if (policy->pack_after
      && (!policy->idle_after || policy->pack_after < policy->idle_after))
    policy->idle_after = policy->pack_after;
  params->store.recomp_count = 0;
  for (unsigned p = 1; p <= STORE_RECOMP_MAX; p++) {
    if (!params->recomp_given[p])
      continue;
    if (p != params->store.recomp_count + 1) {
      nbdkit_error ("recomp_algorithm: priority %u is given but %u is not",
                    p, params->store.recomp_count + 1);
      return -1;
    }
    params->store.recomp_count = p;
  }
  return 0;
}

/* The writeback parameters need backing= (and the watermark mem_limit). */
static int
writeback_complete (struct zram_params *params)
{
  static const enum param_id need_backing[] = {
    P_WRITEBACK_LIMIT, P_WRITEBACK_BATCH_SIZE, P_WRITEBACK_WATERMARK,
    P_BACKING_DIRECT, P_BACKING_SYNC,
  };
  params->store.writeback_limited = params->given[P_WRITEBACK_LIMIT];
  for (size_t i = 0; !params->backing_target && i < sizeof need_backing
         / sizeof need_backing[0]; i++)
    if (params->given[need_backing[i]]) {
      nbdkit_error ("%s: needs backing= (where to write blocks back)",
                    params_table[need_backing[i]].key);
      return -1;
    }
  if (params->policy.writeback_watermark && !params->store.pool.mem_limit) {
    nbdkit_error ("writeback_watermark: needs mem_limit= or mem_budget= (it "
                  "is a percentage of it)");
    return -1;
  }
  return 0;
}

/* The memory limit's key as given, for messages: "mem_budget", or
 * "mem_limit" (also when none was given).
 */
static const char *
limit_key (const struct zram_params *params)
{
  return params->given[P_MEM_BUDGET] ? "mem_budget" : "mem_limit";
}

/* Swap mode: its parameters, and the reserve in whole units. */
static int
swap_complete (struct zram_params *params)
{
  struct zs_pool_config *pool = &params->store.pool;
  bool reserve_given = params->given[P_SWAP_RESERVE];
  if (swap_mode_check_config (pool->mem_limit) == -1)
    return -1;
  if ((reserve_given || params->given[P_SWAP_FULL]
       || params->given[P_SWAP_RESERVE_WAIT]) && swap_mode == SWAP_OFF) {
    nbdkit_error ("%s: only with swap=on or swap=try",
                  reserve_given ? "swap_reserve"
                  : params->given[P_SWAP_FULL] ? "swap_full"
                  : "swap_reserve_wait");
    return -1;
  }
  /* Swap: a write takes only memory that is resident already, pages
   * and metadata (zs_pool_config.resident_only, swap_reserve_tick).
   */
  pool->resident_only = swap_mode != SWAP_OFF;
  if (reserve_given) {
    pool->reserve_bytes = (pool->reserve_bytes + RESERVE_UNIT - 1)
      / RESERVE_UNIT * RESERVE_UNIT;
    if (pool->reserve_bytes > pool->mem_limit / 2) {
      nbdkit_error ("swap_reserve: %" PRIu64 " bytes (in whole 2 MiB units) "
                    "is more than half of %s (%" PRIu64 " bytes)",
                    pool->reserve_bytes, limit_key (params),
                    pool->mem_limit);
      return -1;
    }
  }
  else if (swap_mode != SWAP_OFF)
    pool->reserve_bytes = swap_mode_default_reserve (pool->mem_limit,
                                                     RESERVE_UNIT);
  return 0;
}

/* A path as the file system resolves it, for telling whether two name
 * one file: the file itself resolved (links followed), or, for a file
 * not there yet, its directory resolved and its own name after it.
 * NULL if neither resolves (the parameter's own check says why later).
 */
static char *
path_resolved (const char *path)
{
  char *resolved = realpath (path, NULL);
  if (resolved || errno != ENOENT)
    return resolved;
  char *copy = strdup (path);
  if (!copy)
    return NULL;
  char *slash = strrchr (copy, '/');
  const char *name = slash ? slash + 1 : copy;
  if (slash)
    *slash = '\0';
  char *directory = realpath (slash ? (*copy ? copy : "/") : ".", NULL);
  if (directory && asprintf (&resolved, "%s/%s",
                             strcmp (directory, "/") == 0 ? "" : directory,
                             name) == -1)
    resolved = NULL;
  free (directory);
  free (copy);
  return resolved;
}

/* stats=, metrics=, ctl=, region=, standby= and a backing file name
 * different files: two naming one would lose one file's content to the
 * other (the stats file over the metrics, the control socket replaced).
 */
static int
check_distinct_paths (const struct zram_params *params)
{
  struct { const char *key, *path; char *resolved; } files[] = {
    { "stats", params->stats_path, NULL },
    { "metrics", params->metrics_path, NULL },
    { "ctl", params->ctl_path, NULL },
    { "ctl_ro", params->ctl_ro_path, NULL },
    { "region", params->region_path, NULL },
    { "standby", params->standby_path, NULL },
    { "backing", params->backing_target
      && !backing_is_uri (params->backing_target)
      ? params->backing_target : NULL, NULL },
  };
  enum { FILES = sizeof files / sizeof files[0] };
  int r = 0;
  for (size_t i = 0; i < FILES; i++)
    files[i].resolved = files[i].path ? path_resolved (files[i].path) : NULL;
  for (size_t i = 0; i < FILES && r == 0; i++)
    for (size_t j = i + 1; j < FILES && r == 0; j++)
      if (files[i].resolved && files[j].resolved
          && strcmp (files[i].resolved, files[j].resolved) == 0) {
        nbdkit_error ("%s: '%s' names the same file as %s= ('%s')",
                      files[j].key, files[j].path, files[i].key,
                      files[i].path);
        r = -1;
      }
  for (size_t i = 0; i < FILES; i++)
    free (files[i].resolved);
  return r;
}

int
params_complete (struct zram_params *params)
{
  int min, max;
  struct store_config *store = &params->store;
  if (!params->given[P_SIZE]) {
    nbdkit_error ("size: you must give the device size, e.g. 'nbdkit zram 8G'");
    return -1;
  }
  /* mem_limit counts the pool's pages, as zram's does; mem_budget all
   * the store holds (zsalloc.h: limit_pages_only).  One limit: two
   * would make a write's refusal depend on which was reached first.
   */
  if (params->given[P_MEM_LIMIT] && params->given[P_MEM_BUDGET]) {
    nbdkit_error ("mem_budget: give mem_limit (the compressed pages, as "
                  "zram's) or mem_budget (all the store holds), not both");
    return -1;
  }
  store->pool.limit_pages_only = !params->given[P_MEM_BUDGET];
  if (check_distinct_paths (params) == -1
      || check_output_file ("stats", params->stats_path) == -1
      || check_output_file ("metrics", params->metrics_path) == -1
      || recomp_complete (params) == -1
      || writeback_complete (params) == -1
      || swap_complete (params) == -1)
    return -1;
  if (params->standby_path && !params->region_path) {
    nbdkit_error ("standby: needs region= (a standby takes over the region "
                  "its server leaves)");
    return -1;
  }
  if (!params->given[P_LEVEL])
    store->level = codec_default_level (store->algorithm);
  else if (!codec_level_is_valid (store->algorithm, store->level, &min, &max)) {
    nbdkit_error ("level: %d is not a valid %s level (%d..%d%s)",
                  store->level, codec_name (store->algorithm), min, max,
                  store->algorithm == CODEC_ZSTD ? ", not 0" : "");
    return -1;
  }
  store->budget = devices_budget ();
  return devices_complete (store->algorithm, store->level,
                           store->pool.mem_limit);
}

/* ---- --help and --dump-plugin ------------------------------------------ */

#define HELP_COLUMN 26
char params_help[4096];

void
params_make_help (void)
{
  size_t used = 0;
  params_help[0] = '\0';
  for (int id = 0; id < PARAM_COUNT; id++) {
    const struct param *param = &params_table[id];
    char left[64];
    snprintf (left, sizeof left, id == P_SIZE ? "[%s=]%s" : "%s=%s",
              param->key, param->syntax);
    /* A key too long for the column has its text on the next line. */
    int pad = strlen (left) < HELP_COLUMN ? HELP_COLUMN - (int) strlen (left)
      : 0;
    used += snprintf (params_help + used, sizeof params_help - used,
                      "%s%s%s%*s", id ? "\n" : "", left,
                      pad ? "" : "\n", pad ? pad : HELP_COLUMN, "");
    for (const char *line = param->help; *line && used < sizeof params_help;) {
      size_t length = strcspn (line, "\n");
      used += snprintf (params_help + used, sizeof params_help - used,
                        "%.*s", (int) length, line);
      line += length;
      if (*line == '\n') {
        line++;
        used += snprintf (params_help + used, sizeof params_help - used,
                          "\n%*s", HELP_COLUMN, "");
      }
    }
    if (used >= sizeof params_help)
      break;
  }
}

void
params_dump (FILE *fp)
{
  fprintf (fp, "zram_params=");
  for (int id = 0; id < PARAM_COUNT; id++)
    fprintf (fp, "%s%s", id ? "," : "", params_table[id].key);
  fprintf (fp, "\n");
  for (int id = 0; id < PARAM_COUNT; id++)
    fprintf (fp, "zram_param_%s=%s\n", params_table[id].key,
             params_table[id].syntax);
}
