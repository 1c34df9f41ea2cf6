/* A device that outlives its server (region=): the store kept in a region
 * (alloc/region.h), taken over by the next server, handed over at exit.
 *
 * At start (handover_store_open), the region file names a region or not:
 *   - none (or its segment is gone): a new region and an empty store in
 *     it;
 *   - one handed over cleanly: the store in it, taken over as it is
 *     (store_take_over) - same device, same data, nothing copied - and
 *     the downtime since the last server stopped serving is reported;
 *   - one whose server died serving it: the store rebuilt from its block
 *     table (store_recover), every acknowledged write kept;
 *   - anything else (another owner, another layout version, another
 *     device, a damaged header): refused, the region untouched, with the
 *     reason.
 * At exit (handover_store_close), after nbdkit stopped the connections
 * and the plugin its threads: new requests are held (never answered: the
 * client sends them again to the next server), those running finish,
 * and the store is handed over - unless handover_drop was asked (the
 * control channel's "drop"), which gives the memory up instead.
 *
 * Every request that touches the store runs between handover_request_
 * enter and _exit: the count of them is how the exit knows the store is
 * quiet, whatever nbdkit's connection threads still do.
 */
#ifndef ZRAM_HANDOVER_H
#define ZRAM_HANDOVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "block-store.h"

/* Every server with region=, before it maps anything of its own (at
 * config_complete): the address of the region path names kept for its
 * attach (alloc/region.h, ADDRESS RESERVATION).  If it cannot be kept
 * (no region yet, or the range taken already) it is only logged: the
 * attach maps the region if the address is free then.
 */
extern void handover_reserve_address (const char *path);

/* The store for config, in the region that path names (made if none),
 * locked in memory when locked (swap).  NULL after nbdkit_error saying
 * why.
 */
extern struct block_store *handover_store_open (struct store_config *config,
                                                const char *path, bool locked);
/* The server starts serving (before any thread of the plugin starts):
 * the region is this server's from now, and the downtime since the last
 * one stopped is known.
 */
extern void handover_serving (void);
/* A planned restart (the control channel's handover, on its thread):
 * the watchers stopped (before_hold), new requests held for good, those
 * running finished, then every other thread that touches the store
 * stopped and joined, its backing I/O cut short (after_hold), and the
 * store handed over.  The backing I/O is cut short only once no request
 * runs: a request's read of a written-back block must not fail for it.
 * 0: the caller exits at once (_exit: nothing more may touch the store,
 * and no request is answered with an error - the client sends the held
 * ones again to the next server); -1 with errno (EINVAL: no region;
 * EBUSY: requests did not finish in 30 s: the caller exits all the
 * same, and the next server recovers the region as after a crash).
 */
extern int handover_now (struct block_store *store);
/* What handover_now calls to stop the plugin's own threads (set by the
 * plugin once they run): before_hold, those that must not see requests
 * held (the full-device watch would take them for a stalled server; a
 * standby's thread); after_hold, every thread that touches the store -
 * the housekeeper, the control channel's worker - the exit's way
 * (.cleanup): backing I/O cut short, then each joined.
 */
extern void handover_set_quiesce (void (*before_hold) (void),
                                  void (*after_hold) (void));
/* Exit: hand the store over (or destroy it and its region after a drop). */
extern void handover_store_close (struct block_store *store);
/* The server is alive (a housekeeping round, once a second): after a
 * crash the next server counts its downtime from the last one.
 */
extern void handover_alive (void);
/* Give the memory up at exit instead of handing it over. */
extern void handover_drop (void);
/* The downtime of this server's start as the supervisor measured it on
 * the device (the control channel's downtime): what the stats say from
 * now on, in place of the server's own figure, which cannot see the
 * requests the kernel waits to send again.
 */
extern void handover_downtime_report (uint64_t milliseconds);

/* A request that touches the store: in and out. */
extern void handover_request_enter (void);
extern void handover_request_exit (void);

struct handover_status {
  bool enabled;                 /* region= given */
  uint64_t generation;          /* servers of this region so far, 1 first */
  uint64_t restarts;            /* of them, after the first */
  uint64_t recoveries;          /* of them, after a crash */
  uint64_t recovery_restarts;   /* recoveries started over one that was
                                   itself cut short */
  uint64_t downtime_ms;         /* this server's start: from the last
                                   server's stop to serving (0: first) */
  uint64_t recovered_blocks;    /* blocks found at this server's start */
  uint64_t recovery_ms;         /* the take-over's own time */
  bool drop;                    /* the memory goes at exit */
};
extern void handover_status_get (struct handover_status *status);
extern void handover_print (const struct handover_status *status, FILE *fp);

#endif /* ZRAM_HANDOVER_H */
