/* A device that outlives its server: see handover.h. */

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "error-text.h"
#include "devices.h"
#include "handover.h"
#include "monotonic.h"
#include "region.h"

/* How long the exit waits for running requests before it gives up the
 * handover (the region is then left as a crash leaves it).
 */
#define QUIET_WAIT_MS 30000

/* The one region of this server: set at start (one thread), cleared at
 * exit (one thread), read by nothing else.
 */
static struct region_owner *owner;
/* Requests touching the store now, and whether new ones are held (the
 * exit's gate): sequentially consistent atomics, so that a request that
 * counted itself before the gate closed is waited for, and one that
 * counts itself after sees the gate closed.
 */
static _Atomic uint64_t requests_running;
static atomic_bool holding;
static atomic_bool dropping;
/* Written at start (one thread) and when serving starts, read by the
 * stats (handover_status_get) after that.
 */
static struct handover_status status;
static uint64_t last_stopped_ns;
/* handover_downtime_report's figure (0: none): set by the control
 * thread, read by the stats.
 */
static _Atomic uint64_t reported_downtime_ms;

/* Address space for a region: twice what the pool may hold (its pages
 * fragment, and the region's heap with them), the block table at its
 * largest (16 bytes a block, its leaves rounded to pages), and room for
 * the descriptors.  Only what is written takes memory.
 */
static uint64_t
region_bytes_for (const struct store_config *config)
{
  /* The devices declared are on the same pool, in the same region. */
  uint64_t size = config->size + devices_declared_bytes ();
  uint64_t data = config->pool.mem_limit && config->pool.mem_limit < size
    ? config->pool.mem_limit : size;
  return 2 * data + size / STORE_BLOCK_SIZE * 24 + (64u << 20);
}

/* The store made in the region this server owns now: a new one, or one
 * whose maker died making it (made anew in place).  On failure the
 * region goes: nothing in it was ever served.
 */
static struct block_store *
store_make (struct store_config *config, const char *path, bool locked)
{
  config->pool.region = owner->region;
  struct block_store *store = store_create (config);
  if (!store) {
    nbdkit_error ("cannot create the compressed store: %s", error_text (errno));
    region_destroy (owner);
    owner = NULL;
    return NULL;
  }
  nbdkit_debug ("region: a new region at %s: shm id %d, %" PRIu64
                " MiB of address space at %p%s", path, owner->shm_id,
                owner->region->region_bytes >> 20, (void *) owner->region,
                locked ? ", locked in memory" : "");
  return store;
}

static struct block_store *
store_new (struct store_config *config, const char *path, bool locked)
{
  char why[512] = "";
  owner = region_create_explained (path, region_bytes_for (config),
                                   config->size, locked, why, sizeof why);
  if (!owner) {
    nbdkit_error ("region: %s: cannot make a region: %s%s", path, why,
                  locked && (errno == EPERM || errno == ENOMEM)
                  ? " (locking it needs CAP_IPC_LOCK or RLIMIT_MEMLOCK)" : "");
    return NULL;
  }
  return store_make (config, path, locked);
}

void
handover_reserve_address (const char *path)
{
  if (region_reserve_address (path) == -1)
    nbdkit_debug ("region: %s: its address is not kept ahead (%s): it is "
                  "mapped there if that is free when it is taken",
                  path, error_text (errno));
}

struct block_store *
handover_store_open (struct store_config *config, const char *path,
                     bool locked)
{
  uint64_t start = monotonic_ns ();
  char why[512] = "";
  enum region_attach_result how;
  status.enabled = true;
  owner = region_attach (path, config->size, &how, why, sizeof why);
  if (!owner && errno == ENOENT) {
    nbdkit_debug ("region: %s: %s: a new region", path, why);
    return store_new (config, path, locked);
  }
  if (!owner) {
    nbdkit_error ("region: %s: %s", path, why);
    return NULL;
  }
  struct region *region = owner->region;
  if (locked && region_lock (owner) == -1) {
    nbdkit_error ("region: %s: cannot lock the region in memory, as swap "
                  "needs: %s: the memory is left as it is", path,
                  error_text (errno));
    region_close (owner);
    owner = NULL;
    return NULL;
  }
  if (how == REGION_ATTACH_UNMADE) {
    /* Nothing in it was ever served: made anew, in place when its sizes
     * are this server's.
     */
    bool fits = region->device_bytes == config->size
      && region->region_bytes == region_bytes_for (config);
    nbdkit_error ("region: %s: its server died while it made the region: "
                  "%s", path, fits ? "made anew" : "removed, a new one made");
    if (fits) {
      region_remake (owner);
      return store_make (config, path, locked);
    }
    region_destroy (owner);
    owner = NULL;
    return store_new (config, path, locked);
  }
  config->pool.region = region;
  struct block_store *store;
  if (how == REGION_ATTACH_CRASHED) {
    /* A refusal for another device leaves the region as it is; a
     * recovery that fails or is killed part way leaves it "recovering":
     * the next attempt starts over and reaches the same result
     * (RECOVERY in region.h).
     */
    uint32_t dead_pid = region_state_read (region)->owner_pid;
    struct store_recover_result result;
    store = store_recover (region, config, &result, why, sizeof why);
    if (store) {
      nbdkit_debug ("region: %s: its last server (pid %" PRIu32 ") died "
                    "serving it: %" PRIu64 " blocks recovered (%" PRIu64
                    " devices beside the default), %" PRIu64
                    " torn entries put back, %" PRIu64 " pages no block "
                    "reached given back", path, dead_pid,
                    result.blocks, result.devices, result.torn_entries,
                    result.pages_given_back);
      if (result.lost_devices)
        nbdkit_error ("region: %s: recovery found %" PRIu64 " devices whose "
                      "record was damaged: they are gone", path,
                      result.lost_devices);
      if (result.lost_blocks || result.lost_units || result.objects_refused)
        nbdkit_error ("region: %s: recovery found %" PRIu64 " blocks and %"
                      PRIu64 " packed units whose content was damaged: they "
                      "read as zeros", path, result.lost_blocks,
                      result.lost_units);
    }
  }
  else
    store = store_take_over (region, config, why, sizeof why);
  if (!store) {
    nbdkit_error ("region: %s: %s: the memory is left as it is", path, why);
    region_close (owner);
    owner = NULL;
    return NULL;
  }
  uint64_t mapped = region_map_resident (region);
  struct store_stats stats;
  store_stats (store, &stats);
  status.recovered_blocks = stats.orig_data_size / STORE_BLOCK_SIZE;
  status.recovery_ms = (monotonic_ns () - start) / 1000000;
  /* A crash: the downtime counts from the last sign of life. */
  last_stopped_ns = how == REGION_ATTACH_CLEAN
    ? region_state_read (region)->stopped_ns
    : atomic_load (&region->alive_ns);
  nbdkit_debug ("region: took over %s (%s): %" PRIu64 " blocks in %" PRIu64
                " ms, %" PRIu64 " MiB of it mapped", path,
                how == REGION_ATTACH_CLEAN
                ? "handed over cleanly" : "recovered after a crash",
                status.recovered_blocks, status.recovery_ms, mapped >> 8);
  return store;
}

void
handover_serving (void)
{
  if (!owner)
    return;
  region_start_serving (owner);
  const struct region_state_record *state = region_state_read (owner->region);
  status.generation = state->generation;
  status.restarts = state->generation - 1;
  status.recoveries = state->recoveries;
  status.recovery_restarts = state->recovery_restarts;
  if (last_stopped_ns)
    status.downtime_ms = (monotonic_ns () - last_stopped_ns) / 1000000;
  nbdkit_debug ("region: generation %" PRIu64 " serving, %" PRIu64 " ms "
                "after the last server stopped", status.generation,
                status.downtime_ms);
}

void
handover_alive (void)
{
  if (owner)
    atomic_store_explicit (&owner->region->alive_ns, monotonic_ns (),
                           memory_order_relaxed);
}

void
handover_drop (void)
{
  atomic_store (&dropping, true);
}

void
handover_request_enter (void)
{
  atomic_fetch_add (&requests_running, 1);
  if (atomic_load (&holding)) {
    /* Held for good: never answered, the client sends it again to the
     * next server.  The process exits under it.
     */
    atomic_fetch_sub (&requests_running, 1);
    for (;;)
      pause ();
  }
}

void
handover_request_exit (void)
{
  atomic_fetch_sub (&requests_running, 1);
}

/* Hold new requests for good and wait for those running to finish: true
 * once none runs, false if some still run after QUIET_WAIT_MS.
 */
static bool
requests_hold (void)
{
  atomic_store (&holding, true);
  for (unsigned waited = 0; atomic_load (&requests_running); waited++) {
    if (waited == QUIET_WAIT_MS)
      return false;
    usleep (1000);
  }
  return true;
}

/* The plugin's own threads stopped, in two steps (handover.h; set by
 * the plugin once they run, on one thread, before the control thread
 * that reads them starts).
 */
static void (*quiesce_before_hold) (void);
static void (*quiesce_after_hold) (void);

void
handover_set_quiesce (void (*before_hold) (void), void (*after_hold) (void))
{
  quiesce_before_hold = before_hold;
  quiesce_after_hold = after_hold;
}

int
handover_now (struct block_store *store)
{
  if (!owner) {
    errno = EINVAL;
    return -1;
  }
  /* The watchers first: the full-device watch would take the held
   * requests for a stalled server and ask the OOM killer to act (seen
   * in the guest: a kill 5 s into a handover).
   */
  if (quiesce_before_hold)
    quiesce_before_hold ();
  if (!requests_hold ()) {
    /* Its watchers are stopped: it cannot serve on safely.  Left as a
     * crash leaves it; the next server recovers it.
     */
    errno = EBUSY;
    return -1;
  }
  /* Then every thread that still touches the store, joined: the control
   * channel's worker in a writeback, the housekeeper (before: the
   * worker's writeback went on while the store below was handed over -
   * its backing store closed, its codecs freed - and corrupted the
   * heap).
   */
  if (quiesce_after_hold)
    quiesce_after_hold ();
  uint64_t stopped = monotonic_ns ();
  if (store_hand_over (store) == -1)
    return -1;
  region_hand_over (owner, stopped);
  owner = NULL;
  return 0;
}

void
handover_store_close (struct block_store *store)
{
  if (!owner) {
    store_destroy (store);
    return;
  }
  if (!requests_hold ()) {
    nbdkit_error ("region: requests still running after %d s: the region "
                  "is left as a crash would leave it", QUIET_WAIT_MS / 1000);
    region_close (owner);
    owner = NULL;
    return;
  }
  uint64_t stopped = monotonic_ns ();
  if (atomic_load (&dropping)) {
    store_destroy (store);
    region_destroy (owner);
    owner = NULL;
    return;
  }
  if (store_hand_over (store) == -1) {
    region_close (owner);
    owner = NULL;
    return;
  }
  region_hand_over (owner, stopped);
  owner = NULL;
}

void
handover_status_get (struct handover_status *out)
{
  *out = status;
  out->drop = atomic_load (&dropping);
  uint64_t reported = atomic_load (&reported_downtime_ms);
  if (reported)
    out->downtime_ms = reported;
}

void
handover_downtime_report (uint64_t milliseconds)
{
  atomic_store (&reported_downtime_ms, milliseconds);
}

void
handover_print (const struct handover_status *s, FILE *fp)
{
  if (!s->enabled)
    return;
  fprintf (fp, "generation: %" PRIu64 "\n", s->generation);
  fprintf (fp, "restarts: %" PRIu64 "\n", s->restarts);
  fprintf (fp, "recoveries: %" PRIu64 "\n", s->recoveries);
  fprintf (fp, "recovery_restarts: %" PRIu64 "\n", s->recovery_restarts);
  fprintf (fp, "recovered_blocks: %" PRIu64 "\n", s->recovered_blocks);
  fprintf (fp, "recovery_seconds: %.3f\n", s->recovery_ms / 1000.0);
  fprintf (fp, "downtime_seconds: %.3f\n", s->downtime_ms / 1000.0);
}
