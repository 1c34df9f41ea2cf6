/* nbdkit-zram-plugin: a compressed RAM block device.
 *
 * This file is the nbdkit glue: it hands the parameters to params.c
 * (whose table follows man/nbdkit-zram-plugin.pod, the specification),
 * starts the threads, and forwards each request to the block store
 * (block-store.h), which does the work.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <lz4.h>
#include <zstd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "block-store.h"
#include "control.h"
#include "devices.h"
#include "error-text.h"
#include "handover.h"
#include "housekeeper.h"
#include "server-check.h"
#include "standby.h"
#include "stats-file.h"
#include "metrics.h"
#include "monotonic.h"
#include "params.h"
#include "registry.h"
#include "region.h"
#include "swap-full.h"
#include "swap-mode.h"

/* The largest request we accept, as nbdkit's memory plugin. */
#define ZRAM_MAX_REQUEST (32u << 20)

static struct zram_params params;
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
  params_init (&params);
  params_make_help ();
  server_check_load ();
}

static void
zram_unload (void)
{
  devices_destroy ();              /* first: they use the store's pool */
  if (store)
    handover_store_close (store);   /* store_destroy without region= */
  metrics_unconfigure ();
  params_free (&params);
}

static int
zram_config (const char *key, const char *value)
{
  return params_set (&params, key, value);
}

static int
zram_config_complete (void)
{
  if (params_complete (&params) == -1)
    return -1;
  /* The region's address kept before this process maps anything more
   * (threads, heaps, codec contexts): its pointers need it there
   * (ADDRESS RESERVATION in alloc/region.h).
   */
  if (params.region_path)
    handover_reserve_address (params.region_path);
  return 0;
}

/* The cold tier (backing=) opened: 0, or -1 after nbdkit_error. */
static int
backing_start (void)
{
  if (params.backing_target) {
    char *error = NULL;
    /* Reads bring written-back blocks home below the watermark; above
     * it the policy writes the coldest out: the blocks in use end up in
     * RAM.
     */
    if (params.policy.writeback_watermark)
      params.store.readback_below = params.store.pool.mem_limit / 100
        * params.policy.writeback_watermark;
    /* Room for every device declared (devices.h): one cold tier. */
    params.store.backing = backing_open (params.backing_target,
                                         params.store.size
                                         + devices_declared_bytes (),
                                         params.backing_direct,
                                         params.backing_timeout, &error);
    if (!params.store.backing) {
      nbdkit_error ("%s", error ? error : "backing: out of memory");
      free (error);
      return -1;
    }
    backing_set_log (params.store.backing, backing_log);
  }
  return 0;
}

/* Create the store before nbdkit forks, so errors reach the user. */
static int
zram_get_ready (void)
{
  /* First: no thread may exist yet (they inherit the IO flusher flag). */
  if (swap_mode_prepare () == -1)
    return -1;
  const char *device_name = params.device_name ? params.device_name : "zram";
  if (metrics_configure (device_name, codec_name (params.store.algorithm),
                         params.store.level) == -1) {
    nbdkit_error ("metrics: %s", error_text (errno));
    return -1;
  }
  /* A standby takes the region at its takeover (standby.h), and starts
   * the control channel then: its socket is the serving server's now.
   * So it opens the cold tier then too: the serving server holds a
   * backing file's lock.
   */
  if (params.standby_path)
    return standby_listen (params.standby_path);
  if (backing_start () == -1)
    return -1;
  if (params.region_path) {
    store = handover_store_open (&params.store, params.region_path,
                                 swap_mode != SWAP_OFF);
    if (!store)
      return -1;                /* it said why */
  }
  else if (!(store = store_create (&params.store))) {
    nbdkit_error ("cannot create the compressed store: %s", error_text (errno));
    return -1;
  }
  if (devices_create (&params.store, store) == -1)
    return -1;
  /* No ctl=: a control socket all the same, in the registry, so that
   * nbdkit-zramctl finds the server (not for a standby: its control
   * channel is its server's, given by ctl=).
   */
  if (!params.ctl_path && !params.standby_path)
    params.ctl_path = registry_default_ctl (params.device_name);
  if (params.ctl_path
      && control_listen (params.ctl_path, params.device_name) == -1)
    return -1;
  if (params.ctl_ro_path && control_listen_read_only (params.ctl_ro_path) == -1)
    return -1;
  nbdkit_debug ("zram: %" PRIu64 " bytes, %s level %d, chain %u, "
                "raw from %zu bytes",
                params.store.size, codec_name (params.store.algorithm),
                params.store.level, params.store.pool.chain_pages,
                store_raw_threshold (store));
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
  uint64_t headroom = params.store.pool.reserve_bytes / 32;
  return headroom < (1 << 20) ? 1 << 20 : headroom;
}

/* Room for the allocator's metadata made ready: in the C heap, or with
 * region= in the region's heap, where it comes from then (its free
 * pages touched ahead: region_make_ready).  The bytes ready.
 */
static uint64_t
metadata_make_ready (void)
{
  struct region *region = params.store.pool.region;
  if (region)
    return region_make_ready (region, metadata_headroom ());
  return swap_mode_heap_ready (metadata_headroom ());
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
  store_metadata_ready (store, metadata_make_ready ());
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

/* The threads that touch the store, stopped: at exit (.cleanup) and at
 * a planned restart (handover_now, after the requests are held, on the
 * control thread: control_stop then stops its worker only).  The
 * backing I/O first: a writeback in progress (the control channel's,
 * the housekeeper's) must not hold the stop up on a slow or wedged
 * backing store; then each thread joined, so that nothing touches the
 * store once it is handed over.
 */
static void
store_users_stop (void)
{
  if (store)
    store_cancel_backing_io (store);
  control_stop ();
  swap_full_stop ();
  housekeeper_stop ();
}

/* A planned restart's first step (handover_now, before the requests are
 * held): the full-device watch stopped, a standby's thread joined (it
 * ended at its takeover: the handover's exit would leave it unjoined),
 * and the control channel's worker told to end its command after the
 * batch it is on (a request waiting behind its writeback must finish
 * within the hold).
 */
static void
watchers_stop (void)
{
  standby_stop ();
  swap_full_stop ();
  control_wind_down ();
}

/* The heap made ready for requests (swap_mode_prepare_heap): once, by
 * .after_fork or, in a standby, ahead of its takeover.
 */
static size_t heap_ready_bytes;
static bool heap_prepared;

/* Serve the store this server now owns: everything a request reaches,
 * made and started - in .after_fork, or at a standby's takeover.  0, or
 * -1 after nbdkit_error (the caller stops what started).
 */
static int
serve_start (void)
{
  handover_serving ();
  /* Swap mode: what the serving path needs, made (and so locked) before
   * any request; the reserve below.  The table is charged to mem_limit.
   * With region= the allocator's metadata is in the region (made ready
   * there: metadata_make_ready), not in the C heap.  A standby's heap
   * has the room for the contexts already (standby_heap_ready).
   */
  if (swap_mode != SWAP_OFF
      && store_keep_resident (store, SWAP_SERVING_THREADS) == -1) {
    nbdkit_error ("swap=%s: cannot make the block table and compression "
                  "contexts ready: %s%s", swap_mode == SWAP_ON ? "on" : "try",
                  error_text (errno),
                  errno == ENOSPC ? " (mem_limit is too small for the "
                  "device's table: 16 bytes a block)" : "");
    if (swap_mode == SWAP_ON)
      return -1;
  }
  char why[256];
  if (swap_mode != SWAP_OFF
      && devices_keep_resident (SWAP_SERVING_THREADS, why, sizeof why) == -1) {
    nbdkit_error ("swap=%s: device %s: cannot make its block table and "
                  "compression contexts ready", swap_mode == SWAP_ON ? "on"
                  : "try", why);
    if (swap_mode == SWAP_ON)
      return -1;
  }
  /* Then the heap for the requests (nbdkit's buffers): room of its own,
   * not what the contexts took (zstd's take 4 MiB).  The allocator's
   * metadata gets its room from the reserve keeper as the data grows
   * (metadata_make_ready).
   */
  if (!heap_prepared)
    heap_ready_bytes = swap_mode_prepare_heap ();
  /* Swap mode: the reserve populated (and locked) before any request,
   * and a full device watched.
   */
  struct handover_status handover;
  handover_status_get (&handover);
  params.policy.reserve_always = swap_mode != SWAP_OFF;
  params.policy.reserve_tick = swap_mode != SWAP_OFF ? swap_reserve_tick : NULL;
  params.policy.devices_round = devices_housekeeping;
  /* A server that took its device over (a restart) serves first, with the
   * reserve the last one left: populating more before it serves waited
   * 130 s in reclaim in the guest, the device down, for memory only
   * swapping through this server could give back.  The keeper tops it up
   * once it serves.  The metadata's room (a MiB or so) is made ready
   * first all the same: without it every write is refused (seen: a
   * recovered region, its free pages given back, answered the kernel's
   * first writes with errors).
   */
  params.policy.reserve_later = handover.generation > 1;
  if (swap_mode != SWAP_OFF)
    store_metadata_ready (store, metadata_make_ready ());
  housekeeper_set_policy (&params.policy);
  if (housekeeper_start (store, params.stats_path, params.metrics_path,
                         params.store.pool.compact_before_refusal
                         ? (int) params.compact_threshold : -1) == -1) {
    nbdkit_error ("cannot start the housekeeping thread: %s", error_text (errno));
    return -1;
  }
  if (handover.generation > 1)
    swap_full_grace (SWAP_FULL_GRACE_RESTART, monotonic_ns ()
                     + SWAP_FULL_RESTART_GRACE_MS * UINT64_C (1000000));
  if (swap_mode != SWAP_OFF && swap_full_start (open_reserve) == -1) {
    nbdkit_error ("cannot start the full-device watcher: %s", error_text (errno));
    return -1;
  }
  struct store_stats stats;
  store_stats (store, &stats);
  swap_mode_report (stats.reserve_bytes,
                    heap_ready_bytes + stats.table_bytes + stats.codec_bytes);
  struct control_info info = {
    .disksize = params.store.size,
    .algorithm = codec_name (params.store.algorithm),
    .level = params.store.level,
    .limit_pages_only = params.store.pool.limit_pages_only,
  };
  const char *own[] = {
    params.ctl_path, params.ctl_ro_path, params.standby_path,
  };
  unsigned owned = 0;
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
    if (own[i])
      info.own_sockets[owned++] = own[i];
  if (control_start (store, &info) == -1) {
    nbdkit_error ("ctl: cannot start the control thread: %s", error_text (errno));
    return -1;
  }
  return 0;
}

/* A standby's heap made ready for what its takeover makes (standby.h):
 * the compression contexts, scratch and caches of a store of the same
 * parameters, made for a small scratch store and freed - in swap mode
 * the heap keeps its free memory, resident and locked
 * (swap_mode_heap_settings), for the real ones to take without a fault -
 * and then the requests' heap.  The bytes made ready.
 */
static size_t
standby_heap_ready (void)
{
  if (swap_mode == SWAP_OFF)
    return 0;                   /* a heap that is not locked: nothing to do */
  struct store_config config = params.store;
  config.size = 64 * STORE_BLOCK_SIZE;
  config.backing = NULL;
  config.pool.region = NULL;
  config.pool.reserve_bytes = 0;
  config.pool.mem_limit = 0;
  config.pool.resident_only = false;
  uint64_t parts = 0;
  struct block_store *scratch = store_create (&config);
  if (scratch && store_keep_resident (scratch, SWAP_SERVING_THREADS) == 0) {
    struct store_stats stats;
    store_stats (scratch, &stats);
    parts = stats.codec_bytes + stats.table_bytes;
  }
  store_destroy (scratch);
  size_t bytes = swap_mode_prepare_heap ();
  swap_mode_heap_ready (parts);
  return bytes + parts;
}

/* A standby's takeover (standby.h, on its thread): the control channel
 * (refused while the last server lives: its socket answers), the region
 * (refused while it is owned), then serving.  0, or -1 after
 * nbdkit_error with nothing taken.
 */
static int
zram_take_over (void)
{
  if ((params.ctl_path
       && control_listen (params.ctl_path, params.device_name) == -1)
      || (params.ctl_ro_path
          && control_listen_read_only (params.ctl_ro_path) == -1)) {
    control_stop ();
    return -1;
  }
  if (!params.store.backing && backing_start () == -1) {
    control_stop ();
    return -1;
  }
  struct block_store *taken = handover_store_open (&params.store,
                                                   params.region_path,
                                                   swap_mode != SWAP_OFF);
  if (!taken) {
    control_stop ();
    return -1;
  }
  store = taken;
  if (devices_create (&params.store, store) == -1) {
    /* The region says "serving": the next server recovers it. */
    nbdkit_error ("standby: the device was taken over but its devices "
                  "cannot be served: exiting");
    _exit (EXIT_FAILURE);
  }
  if (serve_start () == -1) {
    /* The region says "serving": the next server recovers it. */
    nbdkit_error ("standby: the device was taken over but cannot be "
                  "served: exiting");
    _exit (EXIT_FAILURE);
  }
  return 0;
}

/* Threads do not survive nbdkit's fork: start the housekeeper after it. */
static int
zram_after_fork (void)
{
  handover_set_quiesce (watchers_stop, store_users_stop);
  if (swap_mode_lock () == -1)
    goto failed;
  swap_mode_heap_settings ();
  if (params.standby_path) {
    heap_ready_bytes = standby_heap_ready ();
    heap_prepared = true;
    if (standby_start (zram_take_over, swap_mode_ready_stacks) == -1) {
      nbdkit_error ("cannot start the standby thread: %s", error_text (errno));
      goto failed;
    }
    return 0;
  }
  if (serve_start () == -1)
    goto failed;
  return 0;

 failed:
  /* nbdkit exits without .cleanup: stop what started, and leave no
   * control socket behind.
   */
  standby_stop ();
  control_stop ();
  swap_full_stop ();
  housekeeper_stop ();
  return -1;
}

static void
zram_cleanup (void)
{
  /* First: a takeover in progress finishes (or never starts). */
  standby_stop ();
  store_users_stop ();
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
  params_dump (stdout);
  /* yes: the server survives clients that hang up with requests in
   * flight (nbdkit 1.34 or later).
   */
  printf ("zram_server_disconnect_fix=%s\n",
          server_has_disconnect_fix ? "yes" : "no");
}

/* A connection's handle: its device (devices.h), or default_export for
 * the default export, whose store is whatever store is now (a standby's
 * takeover replaces it).  Not NBDKIT_HANDLE_NOT_NEEDED: that is the
 * address of the calling thread's errno, a different one on each of
 * nbdkit's threads.
 */
static struct device default_export;

static void *
zram_open (int readonly)
{
  server_check_open ();
  const char *name = nbdkit_export_name ();
  if (!name || !*name)
    return &default_export;
  struct device *device = device_open (name);
  /* A server that never had devices takes any name for its one device,
   * as servers before devices did.
   */
  if (!device && !devices_named ())
    return &default_export;
  if (!device) {
    nbdkit_error ("unknown export '%s': this server serves the default "
                  "export and %u device%s (nbdinfo --list)", name,
                  devices_count (), devices_count () == 1 ? "" : "s");
    nbdkit_set_error (ENOENT);
    return NULL;
  }
  return device;
}

static void
zram_close (void *handle)
{
  if (handle != &default_export)
    device_close (handle);
}

/* The store a request on handle works on, read after request_begin (a
 * standby's takeover replaces the default one), or NULL with errno
 * ESHUTDOWN: its device was removed by force (devices.h, A FORCED
 * REMOVE).  request_store_done after a request that got one.
 */
static struct block_store *
request_store (void *handle)
{
  return handle == &default_export ? store : device_enter (handle);
}

static void
request_store_done (void *handle, struct block_store *the_store)
{
  if (handle != &default_export && the_store)
    device_leave (handle);
}

static int64_t
zram_get_size (void *handle)
{
  return handle == &default_export ? params.store.size
    : ((struct device *) handle)->spec.size;
}

struct export_listing {
  struct nbdkit_exports *exports;
  int failed;
};

static void
export_add (struct device *device, void *opaque)
{
  struct export_listing *listing = opaque;
  char description[128];
  snprintf (description, sizeof description, "%" PRIu64 " bytes, %s",
            device->spec.size, codec_name (device->spec.algorithm));
  if (nbdkit_add_export (listing->exports, device->spec.name, description)
      == -1)
    listing->failed = 1;
}

static int
zram_list_exports (int readonly, int is_tls, struct nbdkit_exports *exports)
{
  char description[128];
  snprintf (description, sizeof description, "%" PRIu64 " bytes, %s",
            params.store.size, codec_name (params.store.algorithm));
  if (nbdkit_add_export (exports, "", description) == -1)
    return -1;
  struct export_listing listing = { exports, 0 };
  devices_each (export_add, &listing);
  return listing.failed ? -1 : 0;
}

static const char *
zram_default_export (int readonly, int is_tls)
{
  return "";
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
    else if (unready)
      nbdkit_error ("%s of %" PRIu64 " bytes at %" PRIu64 ": no memory ready "
                    "(the swap reserve stayed empty for %u ms)", what, count,
                    offset, params.swap_reserve_wait);
    else
      nbdkit_error ("%s of %" PRIu64 " bytes at %" PRIu64 ": %s",
                    what, count, offset, error_text (err));
  }
  nbdkit_set_error (err);
  return -1;
}

/* A request to a standby that has not taken the device over (standby.h):
 * refused, there is nothing to serve yet.
 */
static int
standby_refuse (const char *what)
{
  if (failure_log_allowed ())
    nbdkit_error ("%s: refused: this server is a standby (standby=) that "
                  "has not taken the device over", what);
  nbdkit_set_error (EIO);
  return -1;
}

/* Every data request starts here: the server check and, in swap mode,
 * the count of the thread's page faults (swap-mode.h).
 */
static uint64_t
request_begin (bool stores)
{
  handover_request_enter ();
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
  handover_request_exit ();
  errno = err;
  return r == -1 ? request_failed (what, stores, count, offset) : 0;
}

static int
zram_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
            uint32_t flags)
{
  if (standby_waiting ())
    return standby_refuse ("read");
  uint64_t faults = request_begin (false);
  struct block_store *the_store = request_store (handle);
  int r = the_store ? store_read (the_store, buf, count, offset) : -1;
  request_store_done (handle, the_store);
  return request_end (r, "read", false, faults, count, offset);
}

/* Whether a store_write or store_zero that returned r is tried again.
 * In swap mode a store refused for want of memory made ready (EAGAIN: a
 * burst of swap-outs took the reserve faster than the keeper refills
 * it) waits for refills, trying again after each, swap_reserve_wait ms
 * at most from its first refusal (*started_ms; default 250: one keeper
 * round, well inside the kernel's request timeout), then fails (ENOMEM:
 * the kernel keeps the page and writes it again later, but logs an I/O
 * error for it).  The wait is on the keeper (housekeeper_wait_refill),
 * never on reclaim: a keeper held in reclaim costs a request this long.
 * A refused store may have written some of its blocks, and writing the
 * same data again is the same request.  One given up on counts as a
 * failed write then (the store leaves EAGAIN's to its caller): a write
 * that waited and was stored is none.
 */
static bool
reserve_wait_worth_it (struct block_store *the_store, int r,
                       uint64_t *started_ms)
{
  if (r != -1 || errno != EAGAIN)
    return false;
  uint64_t now = monotonic_ms ();
  if (!*started_ms)
    *started_ms = now;          /* the first refusal: the clock starts */
  uint64_t waited = now - *started_ms;
  bool refilled = swap_mode != SWAP_OFF && waited < params.swap_reserve_wait
    && housekeeper_wait_refill (params.swap_reserve_wait - waited);
  if (!refilled)
    store_failed_write (the_store);     /* given up: a failed write */
  errno = EAGAIN;
  return refilled;
}

static int
zram_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset,
             uint32_t flags)
{
  if (standby_waiting ())
    return standby_refuse ("write");
  uint64_t faults = request_begin (true);
  struct block_store *the_store = request_store (handle);
  if (swap_mode != SWAP_OFF && store_reserve_low (store))
    housekeeper_wake ();
  uint64_t started_ms = 0;
  int r = -1;
  if (the_store)
    do
      r = store_write (the_store, buf, count, offset);
    while (reserve_wait_worth_it (the_store, r, &started_ms));
  request_store_done (handle, the_store);
  return request_end (r, "write", true, faults, count, offset);
}

static int
zram_flush (void *handle, uint32_t flags)
{
  return 0;                     /* RAM: nothing to flush */
}

static int
zram_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  if (standby_waiting ())
    return standby_refuse ("trim");
  uint64_t faults = request_begin (true);
  struct block_store *the_store = request_store (handle);
  int r = the_store ? store_trim (the_store, count, offset) : -1;
  request_store_done (handle, the_store);
  return request_end (r, "trim", true, faults, count, offset);
}

/* Zeroing is always cheap here (whole blocks just drop their object), so
 * NBDKIT_FLAG_FAST_ZERO needs no special case.
 */
static int
zram_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  if (standby_waiting ())
    return standby_refuse ("zero");
  uint64_t faults = request_begin (true);
  struct block_store *the_store = request_store (handle);
  uint64_t started_ms = 0;
  int r = -1;
  if (the_store)
    do
      r = store_zero (the_store, count, offset, flags & NBDKIT_FLAG_MAY_TRIM);
    while (reserve_wait_worth_it (the_store, r, &started_ms));
  request_store_done (handle, the_store);
  return request_end (r, "zero", true, faults, count, offset);
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
  if (standby_waiting ())
    return standby_refuse ("extents");
  handover_request_enter ();
  struct block_store *the_store = request_store (handle);
  int r = the_store
    ? store_extents (the_store, count, offset, add_extent, extents) : -1;
  request_store_done (handle, the_store);
  handover_request_exit ();
  if (!the_store) {
    nbdkit_error ("extents: %s", error_text (ESHUTDOWN));
    nbdkit_set_error (ESHUTDOWN);
  }
  return r;
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
  .config_help       = params_help,
  .magic_config_key  = "size",
  .get_ready         = zram_get_ready,
  .after_fork        = zram_after_fork,
  .cleanup           = zram_cleanup,
  .dump_plugin       = zram_dump_plugin,
  .open              = zram_open,
  .close             = zram_close,
  .list_exports      = zram_list_exports,
  .default_export    = zram_default_export,
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
