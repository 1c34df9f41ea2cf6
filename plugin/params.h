/* The plugin's parameters, described once: a table (params.c) of each
 * key, its kind, its range, its default and help line, and where its
 * value goes.  The table drives parsing (.config), the checks between
 * parameters (.config_complete), --help and --dump-plugin; a test holds
 * the man page's list of parameters (nbdkit-zram-plugin(1), PARAMETERS,
 * the specification) to it.
 *
 * One thread: nbdkit calls these before any other callback.
 */
#ifndef ZRAM_PARAMS_H
#define ZRAM_PARAMS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "block-store.h"
#include "housekeeper.h"

/* Every parameter, in the order --help lists them. */
enum param_id {
  P_SIZE, P_COMP, P_LEVEL, P_DEVICE, P_MEM_LIMIT, P_MEM_BUDGET, P_STATS, P_METRICS, P_NAME, P_CTL,
  P_CTL_RO, P_SWAP_FULL_AFTER, P_SWAP_FULL_AVAILABLE,
  P_RECOMP_ALGORITHM, P_IDLE_AFTER, P_RECOMPRESS_AFTER, P_PACK_AFTER,
  P_PACK_LEVEL, P_PACK_BLOCKS, P_DECODE_CACHE, P_WRITE_BATCH,
  P_BACKING, P_BACKING_DIRECT, P_BACKING_TIMEOUT, P_BACKING_SYNC,
  P_WRITEBACK_LIMIT, P_WRITEBACK_BATCH_SIZE, P_WRITEBACK_WATERMARK,
  P_COMPACT, P_COMPACT_THRESHOLD, P_SWAP, P_SWAP_RESERVE, P_SWAP_RESERVE_WAIT,
  P_SWAP_FULL,
  P_REGION, P_STANDBY, P_CHAIN, P_LOCK, P_FREE,
  PARAM_COUNT
};

/* What the parameters set. */
struct zram_params {
  struct store_config store;
  struct housekeeper_policy policy;
  bool given[PARAM_COUNT];
  bool recomp_given[STORE_RECOMP_MAX + 1];  /* by priority, 1.. */
  char *stats_path;
  char *metrics_path;
  char *device_name;            /* name=: the metrics' device label */
  char *ctl_path;
  char *ctl_ro_path;             /* ctl_ro=: the read-only socket */
  char *region_path;            /* region=: the region file */
  char *standby_path;           /* standby=: the takeover's socket */
  char *backing_target;         /* a path made absolute, or an NBD URI */
  bool backing_direct;
  unsigned backing_timeout;     /* seconds an NBD backing request may take */
  unsigned compact_threshold;   /* percent of the pool's pages */
  unsigned swap_reserve_wait;   /* ms a swap write waits for the reserve */
};

/* The defaults (.load). */
extern void params_init (struct zram_params *params);
/* key=value (.config): 0, or -1 after nbdkit_error naming the key. */
extern int params_set (struct zram_params *params, const char *key,
                       const char *value);
/* The checks between parameters, and the values they decide
 * (.config_complete): 0, or -1 after nbdkit_error naming a key.
 */
extern int params_complete (struct zram_params *params);
extern void params_free (struct zram_params *params);

/* The --help text, made from the table (.load fills it): the plugin's
 * config_help points at it.
 */
extern char params_help[];
extern void params_make_help (void);

/* --dump-plugin: zram_params=KEY,... and one zram_param_KEY=SYNTAX line a
 * parameter.
 */
extern void params_dump (FILE *fp);

#endif /* ZRAM_PARAMS_H */
