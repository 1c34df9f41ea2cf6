/* A server's devices: named NBD exports beside the default one, under
 * one memory budget.
 *
 * The default export ("", what `nbdkit zram 8G` serves) is the store
 * zram.c makes, with everything a store can have (region, standby, swap
 * mode, backing store).  Each device=NAME:SIZE[:comp=A][:level=N] is one
 * more store on the default store's allocator pool
 * (store_config.shared_pool), so that:
 *   - mem_limit is one budget: every device's objects count against it,
 *     and a device that writes while another idles uses the idle one's
 *     share (a device that fills it leaves the others ENOSPC until
 *     something is trimmed);
 *   - an idle device costs its table and counters, not a pool: a pool
 *     each kept the last zspage of every size class each device used,
 *     2.1x the pages for zstd's 256 MiB image over 64 devices, and 190
 *     KiB for an idle device (bench/device-cost, bench/README.md "Many
 *     devices");
 *   - compaction is the pool's, one for all.
 * A device's blocks are its store's: reads, extents, trims, zeroes and
 * the decode cache never cross devices (the handle of each connection
 * is its device).  Devices are declared at start and live until the
 * server exits; they are destroyed before the default store, whose
 * pool they use.
 *
 * Not yet (issue 44): devices with region=, standby=, swap= or
 * backing= (refused at start, naming the parameter), devices added and
 * removed at run time, per-device caps and floors, per-device metrics.
 *
 * Threads: devices_create and devices_destroy run alone (.get_ready,
 * .unload); the table does not change in between, so lookups take no
 * lock.
 */
#ifndef ZRAM_DEVICES_H
#define ZRAM_DEVICES_H

#include <stdbool.h>
#include <stdint.h>

#include "block-store.h"

#define DEVICES_MAX 64
#define DEVICE_NAME_MAX 64

/* A device as declared (device=): algorithm -1 and level INT32_MIN until
 * the server's comp= and level= fill them in (devices_complete).
 */
struct device_spec {
  char name[DEVICE_NAME_MAX + 1];
  uint64_t size;
  int algorithm;                  /* enum codec_algorithm, or -1 */
  int level;
};

struct device {
  struct device_spec spec;
  struct block_store *store;
};

/* device=VALUE: parse and remember it.  0, or -1 after nbdkit_error
 * naming device=.
 */
extern int devices_declare (const char *value);
/* After every parameter: the server's algorithm (and its level, for
 * the same algorithm) for the devices that gave none, levels checked;
 * refused_parameter, if not NULL, is one that devices do not go with
 * yet (named in the error).  0, or -1 after nbdkit_error.
 */
extern int devices_complete (enum codec_algorithm algorithm, int level,
                             const char *refused_parameter);
/* Make each declared device's store on owner's pool, from base (the
 * default store's configuration: everything but size, algorithm, level,
 * backing and region).  0, or -1 after nbdkit_error (none is left made).
 */
extern int devices_create (const struct store_config *base,
                           struct block_store *owner);
extern void devices_destroy (void);

extern unsigned devices_count (void);
extern struct device *device_at (unsigned index);
/* The device named name (not the default export, ""), or NULL. */
extern struct device *device_find (const char *name);

/* Each device's share of a housekeeping round: its deferred frees and
 * its decode cache's stale slots.
 */
extern void devices_housekeeping (void);

#endif /* ZRAM_DEVICES_H */
