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
 *     devices"); on the shared pool an idle device costs 44 KiB of RSS,
 *     mostly its stripe locks, and nothing against mem_limit
 *     (bench/run-devices-bench.sh);
 *   - compaction is the pool's, one for all.
 * A device's blocks are its store's: reads, extents, trims, zeroes and
 * the decode cache never cross devices (the handle of each connection
 * is its device).  Devices are declared at start, and added and removed
 * while serving (the control channel's add and remove); all are
 * destroyed before the default store, whose pool they use.
 *
 * REMOVING A DEVICE.  A connection's open finds its device and counts
 * itself on it under one lock (device_open), and its close uncounts it;
 * remove claims the device by taking it out of the table under that
 * lock only if it counts no connection, then destroys its store with
 * no lock held (its objects go back to the pool one by one).  So no
 * request can reach a store being destroyed: a connection that opened
 * before the claim made the claim fail, one after it finds no device.
 * A device removed and added again is a new store, empty.
 *
 * A FORCED REMOVE (remove NAME force) takes a device its clients are
 * still connected to.  nbdkit (1.32) lets a plugin close no connection
 * but the one it serves, so the connections stay, and each of their
 * requests from then on fails with ESHUTDOWN (NBD's "server shutting
 * down"): a request counts itself in_flight and then reads gone
 * (device_enter); the remove sets gone, then waits until in_flight is
 * 0, then destroys the store.  Both are sequentially consistent, so a
 * request either sees gone, or is counted before the remove reads the
 * count and is waited for: no request reaches a destroyed store.  The
 * device (its name and spec, the connections' handles) is freed by
 * whichever comes last of the remove and the last close.
 *
 * CAPS AND FLOORS.  A device may have a cap (its objects take at most
 * that much, as cgroup v2's memory.zswap.max) and a floor (the room
 * below it is the device's: another device's write that would take it
 * is refused, as memory.min), both counted in bytes of the device's
 * objects on the shared pool (BUDGET in block-store.h).  A floor needs
 * mem_limit, and the floors together fit in it (checked at start and by
 * add); cap >= floor.  The default export has neither, but its writes
 * respect the devices' floors as theirs do.
 *
 * SWAP.  In swap mode the devices are swap devices as the default one
 * is: they share its pool, so its reserve, its resident-only pages and
 * its full-device watch, and each device's table and contexts are made
 * resident as the default store's (devices_keep_resident).
 *
 * A REGION (region=, standby=) holds every device with the default
 * store, on its pool (DEVICES IN A REGION in block-store.h): an add
 * publishes the device's store there once made, a remove unpublishes
 * it before destroying it, so a kill leaves each device whole or gone.
 * A new owner (a restart, a standby's takeover, a recovery) serves the
 * devices the region keeps, those added while serving too; a device=
 * of a name the region keeps must declare it as kept (size, algorithm,
 * cap, floor), and one it does not keep is made.  So with a region the
 * region, not the command line, says which devices exist: a device
 * removed stays removed unless a device= names it again.  The stores
 * are not destroyed at exit: they are handed over with the default
 * store, or go with the region.
 *
 * A COLD TIER (backing=) is the default store's, shared by every device
 * (COLD TIER ACROSS STORES in block-store.h): one backing store with
 * room for the default export and every device declared at start, which
 * devices added later share; a writeback for room picks the coldest
 * blocks of every device.  In a region the tier's space map is the
 * root's, and a recovery walks every device's entries into it; its
 * capacity is the one it was made with, whatever the devices declared
 * at a later start.
 *
 * Threads: declared and made alone (.config, .get_ready); then nbdkit's
 * threads open and close connections, the housekeeper walks the table
 * (devices_each), and the control thread alone adds, removes and looks
 * up for its commands (so a device it looked up stays until it removes
 * it).  devices.c's lock guards the table, the connection counts and
 * named.  Lock order: that lock first, then what a store_flush takes
 * (the housekeeping walk: block-store.h's order below it) and nbdkit's
 * export list; it is never taken under a store's lock.
 */
#ifndef ZRAM_DEVICES_H
#define ZRAM_DEVICES_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "block-store.h"

/* struct device_spec, DEVICES_MAX and DEVICE_NAME_MAX: block-store.h
 * (a region keeps its devices' specs).  The algorithm is -1 and the
 * level INT32_MIN until the server's comp= and level= fill them in
 * (devices_complete).
 */
struct device {
  struct device_spec spec;
  struct block_store *store;      /* NULL once a forced remove destroyed
                                     it (then gone is set) */
  unsigned connections;           /* open on it (device_open); lock */
  bool removed;                   /* out of the table, its store gone:
                                     the last close frees it; lock */
  atomic_bool gone;               /* a forced remove began: requests
                                     fail (device_enter) */
  _Atomic unsigned in_flight;     /* requests between device_enter and
                                     device_leave */
};

/* device=VALUE: parse and remember it.  0, or -1 after nbdkit_error
 * naming device=.
 */
extern int devices_declare (const char *value);
/* After every parameter: the server's algorithm (and its level, for
 * the same algorithm) for the devices that gave none, levels, caps and
 * floors checked.  0, or -1 after nbdkit_error.
 */
extern int devices_complete (enum codec_algorithm algorithm, int level,
                             uint64_t mem_limit);
/* The budget the default store and every device share (BUDGET in
 * block-store.h): the floors' room.
 */
extern struct store_budget *devices_budget (void);
/* Make each declared device's store on owner's pool, from base (the
 * default store's configuration: everything but size, algorithm, level,
 * backing and region).  0, or -1 after nbdkit_error (none is left made).
 */
extern int devices_create (const struct store_config *base,
                           struct block_store *owner);
extern void devices_destroy (void);

/* While serving (the control channel): add the device NAME:SIZE[:...]
 * on the default store's pool, or remove the device named name if no
 * connection is open on it (REMOVING A DEVICE).  0, or -1 with why (for
 * the client: naming the device, never echoing its whole text).
 */
extern int devices_add (const char *value, char *why, size_t why_size);
extern int devices_remove (const char *name, bool force, char *why,
                           size_t why_size);

/* The sizes of the devices declared (device=), summed: for the room a
 * region is made with.  A device added while serving takes its room
 * from what the region has left (mem_limit bounds every device's data).
 */
extern uint64_t devices_declared_bytes (void);
extern unsigned devices_count (void);
/* Whether a device was ever declared or added: then an export name must
 * be one of them (or the default's, ""); before, any name is the
 * default export, as servers without devices always served it.
 */
extern bool devices_named (void);
/* visit for each device, under the table's lock. */
extern void devices_each (void (*visit) (struct device *device, void *opaque),
                          void *opaque);
/* The device named name (not the default export, ""), or NULL: for the
 * control thread (see Threads).
 */
extern struct device *device_find (const char *name);
/* A connection to the device named name: found and counted on it, or
 * NULL; device_close uncounts it.
 */
extern struct device *device_open (const char *name);
extern void device_close (struct device *device);
/* A request on a connection's device: its store, or NULL (with errno
 * ESHUTDOWN) once a forced remove took it; device_leave after each
 * request that got a store.
 */
extern struct block_store *device_enter (struct device *device);
extern void device_leave (struct device *device);

/* Swap mode (swap-mode.h): each device's table, scratch and contexts for
 * threads made ready as the default store's are (store_keep_resident),
 * and every device added from now on too (an add that cannot is
 * refused).  0, or -1 with why naming the device.
 */
extern int devices_keep_resident (unsigned threads, char *why,
                                  size_t why_size);

/* A housekeeping round's share for the devices (housekeeper.h,
 * devices_round): visit each device's store, with the number of
 * devices, under the table's lock (so that no remove destroys a store
 * being visited).
 */
extern void devices_housekeeping (void (*visit) (struct block_store *store,
                                                 unsigned devices,
                                                 void *opaque),
                                  void *opaque);

#endif /* ZRAM_DEVICES_H */
