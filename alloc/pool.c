/* The pool: creation, and the object API (malloc, free, read, write). */

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "zsalloc-internal.h"

void
zs_pool_config_init (struct zs_pool_config *config)
{
  config->chain_pages = ZS_CHAIN_DEFAULT;
  config->mem_limit = 0;
  config->lock_mode = ZS_LOCK_CLASS;
  config->free_mode = ZS_FREE_BATCHED;
  config->compact_before_refusal = true;
  config->reserve_bytes = 0;
  config->resident_only = false;
  config->limit_pages_only = false;
  config->region = NULL;
}

static bool
config_is_valid (const struct zs_pool_config *config)
{
  return config->chain_pages >= ZS_CHAIN_MIN
    && config->chain_pages <= ZS_CHAIN_MAX
    && (config->lock_mode == ZS_LOCK_CLASS || config->lock_mode == ZS_LOCK_POOL)
    && (config->free_mode == ZS_FREE_BATCHED
        || config->free_mode == ZS_FREE_IMMEDIATE);
}

/* Writers first: a change of the limit is not starved by charges, and a
 * mover waiting for a zspage's move lock stops new readers of it, so
 * steady reads cannot starve it.
 */
static void
rwlock_init_writers_first (pthread_rwlock_t *lock)
{
  pthread_rwlockattr_t attributes;
  pthread_rwlockattr_init (&attributes);
#ifdef __GLIBC__
  pthread_rwlockattr_setkind_np (&attributes,
                                 PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
  pthread_rwlock_init (lock, &attributes);
  pthread_rwlockattr_destroy (&attributes);
}

void
pool_locks_init (struct zs_pool *pool)
{
  rwlock_init_writers_first (&pool->limit_lock);
  pthread_mutex_init (&pool->pool_lock, NULL);
  pthread_mutex_init (&pool->compact_lock, NULL);
  page_source_locks_init (&pool->pages);
  for (unsigned c = 0; c < pool->distinct_classes; c++)
    pthread_mutex_init (&pool->classes[c].own_lock, NULL);
  for (unsigned n = 0; n < ZS_FREE_BATCHES; n++)
    pthread_mutex_init (&pool->batches[n].lock, NULL);
  for (unsigned i = 0; i < ZS_MOVE_LOCKS; i++)
    rwlock_init_writers_first (&pool->move_locks[i].lock);
}

struct zs_pool *
zs_pool_create (const struct zs_pool_config *config)
{
  struct zs_pool_config chosen;
  if (config)
    chosen = *config;
  else
    zs_pool_config_init (&chosen);
  if (!config_is_valid (&chosen)) {
    errno = EINVAL;
    return NULL;
  }
  struct zs_pool *pool = region_memory_alloc (chosen.region, sizeof *pool,
                                            _Alignof (struct zs_pool));
  if (!pool) {
    errno = ENOMEM;
    return NULL;
  }
  memset (pool, 0, sizeof *pool);
  pool->config = chosen;

  atomic_init (&pool->mem_limit, pool->config.mem_limit);
  page_source_init (&pool->pages, pool->config.resident_only,
                    pool->config.region);
  size_t chunk_bytes = pool->pages.chunk_bytes;
  pool->pages.reserve_target = (pool->config.reserve_bytes + chunk_bytes - 1)
    / chunk_bytes;
  if (size_classes_init (pool) == -1)
    goto fail_classes;
  if (free_batches_init (pool) == -1)
    goto fail_batches;
  if (move_locks_init (pool) == -1)
    goto fail_move_locks;
  pool_locks_init (pool);
  return pool;

 fail_move_locks:
  free_batches_destroy (pool);
 fail_batches:
  size_classes_destroy (pool);
 fail_classes:
  page_source_destroy (&pool->pages);
  region_memory_free (pool->config.region, pool);
  errno = ENOMEM;
  return NULL;
}

/* The deferred frees drained and the free pages given back: what is
 * handed over is the objects, nothing pending.
 */
void
zs_pool_hand_over (struct zs_pool *pool)
{
  zs_pool_flush (pool);
}

struct zs_pool *
zs_pool_take_over (struct zs_pool *pool)
{
  pool_locks_init (pool);
  return pool;
}

void
zs_pool_destroy (struct zs_pool *pool)
{
  if (!pool)
    return;
  free_batches_destroy (pool);
  for (unsigned c = 0; c < pool->distinct_classes; c++) {
    class_destroy_zspages (pool, &pool->classes[c]);
    cells_destroy (pool, &pool->classes[c]);
  }
  move_locks_destroy (pool);
  size_classes_destroy (pool);
  page_source_destroy (&pool->pages);
  pthread_mutex_destroy (&pool->pool_lock);
  pthread_rwlock_destroy (&pool->limit_lock);
  region_memory_free (pool->config.region, pool);
}

/* Add to the limit account (bytes, and zspages in transit in the high
 * bits) with one compare-and-swap, unless the bytes would exceed the
 * limit adjusted by room (less: what the caller leaves free; more: the
 * open reserve's pages, reserve_open_room): false then, with *seen the
 * account that refused them.  The check and the swap are made under
 * limit_lock (read), so that the limit does not change between them
 * (MEMORY LIMIT).
 */
static bool
limit_add_within (struct zs_pool *pool, uint64_t add, int64_t room,
                  uint64_t *seen)
{
  bool added = true;
  pthread_rwlock_rdlock (&pool->limit_lock);
  uint64_t account = atomic_load_explicit (&pool->limit_account,
                                           memory_order_relaxed);
  uint64_t limit = atomic_load_explicit (&pool->mem_limit, memory_order_relaxed);
  do {
    if (limit && (int64_t) account_bytes (account + add) > (int64_t) limit + room) {
      *seen = account;
      added = false;
      break;
    }
  } while (!atomic_compare_exchange_weak (&pool->limit_account, &account,
                                          account + add));
  pthread_rwlock_unlock (&pool->limit_lock);
  return added;
}

/* The room an open reserve gives the data's charges: its pages still
 * held and still charged (the data may take those; a page taken but not
 * yet settled is counted by its zspage already).  limit_add asks it only
 * while the reserve is open.
 */
static int64_t
reserve_open_room (struct zs_pool *pool)
{
  uint64_t held = page_source_reserve_pages (&pool->pages);
  uint64_t charged = atomic_load (&pool->reserve_charged);
  return (int64_t) ((held < charged ? held : charged) * ZS_PAGE_SIZE);
}

/* resident_only, the reserve closed: what zspages took of the reserve
 * and no refill has put back yet, which the data may not count as room
 * (its room is the limit less the whole reserve).  Without it, each
 * zspage's settle of the pages it took from the reserve gave the next
 * zspage their room under the limit, and the data ate the closed reserve
 * zspage by zspage once it was within a zspage of the limit.  0 where
 * the reserve is not the data's only pages, or the limit does not count
 * it.
 */
static int64_t
reserve_missing_room (struct zs_pool *pool)
{
  if (!pool->pages.resident_only || pool->config.limit_pages_only)
    return 0;
  uint64_t target = (uint64_t) pool->pages.reserve_target * pool->pages.chunk_pages;
  uint64_t charged = atomic_load (&pool->reserve_charged);
  return charged < target ? -(int64_t) ((target - charged) * ZS_PAGE_SIZE) : 0;
}

/* A charge of the data's (a zspage, a block of cells, the caller's own):
 * within the limit less the reserve, or the whole limit while the
 * reserve is open.
 */
static bool
limit_add (struct zs_pool *pool, uint64_t add, uint64_t *seen)
{
  int64_t room = atomic_load_explicit (&pool->reserve_open, memory_order_relaxed)
    ? reserve_open_room (pool) : reserve_missing_room (pool);
  return limit_add_within (pool, add, room, seen);
}

/* resident_only: the limit has no room for another reserve chunk, so a
 * write that finds no resident page will not find one after a refill
 * either: the device is full.
 */
static bool
refill_blocked_by_limit (struct zs_pool *pool)
{
  uint64_t limit = atomic_load_explicit (&pool->mem_limit, memory_order_relaxed);
  return limit && !pool->config.limit_pages_only
    && account_bytes (atomic_load (&pool->limit_account)) + pool->pages.chunk_bytes > limit;
}

/* Give the limit back what reserve pages taken (or dropped) since the
 * last settle were charged (see THE RESERVE).  Returns the bytes given.
 */
static uint64_t
reserve_settle (struct zs_pool *pool)
{
  uint64_t charged = atomic_load (&pool->reserve_charged);
  for (;;) {
    uint64_t held = page_source_reserve_pages (&pool->pages);
    if (held >= charged)
      return 0;
    if (atomic_compare_exchange_weak (&pool->reserve_charged, &charged, held)) {
      limit_discharge (pool, (charged - held) * ZS_PAGE_SIZE);
      return (charged - held) * ZS_PAGE_SIZE;
    }
  }
}

/* The outcome of asking for a new zspage's pages. */
enum reservation {
  RESERVED,             /* the pages are counted, the zspage in transit */
  REFUSED,              /* the limit is reached and no zspage in transit */
  IN_TRANSIT,           /* the limit is reached but zspages are in transit */
};

/* Reserve a new zspage's bytes against the limit and put it in transit,
 * in one compare-and-swap of the limit account: the limit is never
 * exceeded, not even for a moment, and a refusal sees in the same instant
 * that no zspage is on its way in or out (see MEMORY LIMIT).
 */
static enum reservation
zspage_reserve (struct zs_pool *pool, struct size_class *class)
{
  uint64_t seen;
  if (!limit_add (pool, zspage_charge (pool, class) + LIMIT_TRANSIT, &seen)
      && (!reserve_settle (pool)
          || !limit_add (pool, zspage_charge (pool, class) + LIMIT_TRANSIT, &seen)))
    return account_transit (seen) ? IN_TRANSIT : REFUSED;

  uint64_t pages = atomic_fetch_add (&pool->pages_used, class->pages_per_zspage)
    + class->pages_per_zspage;
  uint64_t max = atomic_load_explicit (&pool->pages_used_max, memory_order_relaxed);
  while (pages > max
         && !atomic_compare_exchange_weak (&pool->pages_used_max, &max, pages))
    ;
  return RESERVED;
}

/* A zspage in transit was not made after all, or was released. */
void
zspage_unreserve (struct zs_pool *pool, struct size_class *class)
{
  atomic_fetch_sub (&pool->pages_used, class->pages_per_zspage);
  atomic_fetch_sub (&pool->limit_account, zspage_charge (pool, class) + LIMIT_TRANSIT);
}

bool
limit_charge (struct zs_pool *pool, uint64_t bytes)
{
  uint64_t seen;
  return limit_add (pool, bytes, &seen);
}

void
limit_discharge (struct zs_pool *pool, uint64_t bytes)
{
  atomic_fetch_sub (&pool->limit_account, bytes);
}

bool
limit_charge_metadata (struct zs_pool *pool, uint64_t bytes)
{
  return pool->config.limit_pages_only || limit_charge (pool, bytes);
}

void
limit_discharge_metadata (struct zs_pool *pool, uint64_t bytes)
{
  if (!pool->config.limit_pages_only)
    limit_discharge (pool, bytes);
}

/* Giving up reserve pages makes room under the limit: the limit counts
 * them, and they are not the only pages a write may take (resident_only,
 * where the data's room is the limit less the reserve).
 */
static bool
reserve_gives_room (const struct zs_pool *pool)
{
  return !pool->pages.resident_only && !pool->config.limit_pages_only;
}

/* The limit refuses: give up reserve pages to make room (true if any). */
static bool
reserve_give_up_one (struct zs_pool *pool)
{
  bool dropped = page_source_reserve_drop (&pool->pages);
  reserve_settle (pool);
  return dropped;
}

/* Chunks a resident_only pool keeps on the reserve's stack whatever the
 * spare pages: each run length takes a chunk of its own when its fresh
 * one is used up, so the pages counted as reserve may all be spare runs
 * of other lengths (seen: a full reserve of spares, 800,000 refused
 * writes, no refill).
 */
#define RESERVE_STACK_MIN 2

/* The reserve is below its target, or (resident_only) its stack is. */
static bool
reserve_wanted (struct zs_pool *pool)
{
  uint64_t target = pool->pages.reserve_target;
  if (!target)
    return false;
  if (pool->pages.resident_only
      && atomic_load (&pool->pages.reserve_chunks)
         < (target < RESERVE_STACK_MIN ? target : RESERVE_STACK_MIN))
    return true;
  return page_source_reserve_pages (&pool->pages) < target * pool->pages.chunk_pages;
}

uint64_t
zs_pool_reserve_refill (struct zs_pool *pool)
{
  uint64_t added = 0, seen;
  reserve_settle (pool);
  /* Each chunk is counted and in transit while it is mapped and
   * populated, so a refusal meanwhile waits for it (MEMORY LIMIT).  It
   * leaves a chunk of the limit's room to the data: a write near the
   * limit gives reserve chunks up to make room, and a refill that took
   * that room straight back would leave it refused again, round after
   * round (seen: a writer and a refiller in a loop for minutes).  Not in
   * resident_only, where the reserve is what the data takes.
   */
  uint64_t leave = pool->pages.resident_only ? 0 : pool->pages.chunk_bytes;
  /* A limit of pages only does not count the reserve (its pages count
   * once a zspage takes them): nothing to charge, nothing in transit.
   */
  bool charged = !pool->config.limit_pages_only;
  uint64_t charge = pool->pages.chunk_bytes + LIMIT_TRANSIT;
  while (reserve_wanted (pool)
         && (!charged
             || limit_add_within (pool, charge, -(int64_t) leave, &seen))) {
    if (page_source_reserve_add (&pool->pages) == -1) {
      if (charged)
        atomic_fetch_sub (&pool->limit_account, charge);
      break;
    }
    if (charged) {
      atomic_fetch_add (&pool->reserve_charged, pool->pages.chunk_pages);
      atomic_fetch_sub (&pool->limit_account, LIMIT_TRANSIT);
    }
    atomic_fetch_add (&pool->reserve_refills, 1);
    added += pool->pages.chunk_bytes;
  }
  bool refilled = added > 0;
  /* Freed space made resident again: not counted in the limit, as the
   * dirty runs it joins (at most PAGE_READY_RUNS_PAGES a run length).
   */
  if (pool->pages.resident_only) {
    page_source_purge (&pool->pages);
    added += page_source_ready_runs (&pool->pages) * ZS_PAGE_SIZE;
  }
  /* Made whole again after the data took from it: the data's room is the
   * limit less the reserve again.  (Not before it was taken from: the
   * keeper's next round would close what was just opened.)
   */
  if (refilled && atomic_load (&pool->reserve_open)
      && !reserve_wanted (pool))
    atomic_store (&pool->reserve_open, false);
  return added;
}

void
zs_pool_open_reserve (struct zs_pool *pool)
{
  if (pool->pages.resident_only && pool->pages.reserve_target)
    atomic_store (&pool->reserve_open, true);
}

void
zs_pool_reserve_release (struct zs_pool *pool)
{
  while (reserve_give_up_one (pool))
    ;
}

bool
metadata_take (struct zs_pool *pool, size_t bytes)
{
  if (!pool->pages.resident_only)
    return true;
  int64_t before = atomic_fetch_sub (&pool->metadata_allowance, (int64_t) bytes);
  if (before >= (int64_t) bytes)
    return true;
  atomic_fetch_add (&pool->metadata_allowance, (int64_t) bytes);
  atomic_fetch_add (&pool->metadata_misses, 1);
  errno = EAGAIN;
  return false;
}

void
zs_pool_metadata_ready (struct zs_pool *pool, uint64_t bytes)
{
  atomic_store (&pool->metadata_ready_given, bytes);
  atomic_store (&pool->metadata_allowance, (int64_t) bytes);
}

/* Less than half of what the heap last had ready is left. */
static bool
metadata_low (struct zs_pool *pool)
{
  return pool->pages.resident_only
    && atomic_load (&pool->metadata_allowance) * 2
       < (int64_t) atomic_load (&pool->metadata_ready_given);
}

bool
zs_pool_reserve_low (struct zs_pool *pool)
{
  if (metadata_low (pool))
    return true;
  if (pool->pages.resident_only && atomic_load (&pool->pages.reserve_chunks) == 0)
    return pool->pages.reserve_target > 0;
  return page_source_reserve_pages (&pool->pages) * 2
    < (uint64_t) pool->pages.reserve_target * pool->pages.chunk_pages;
}

int
zs_pool_charge (struct zs_pool *pool, size_t bytes)
{
  if (limit_charge_metadata (pool, bytes))
    return 0;
  /* Not in resident_only: the reserve is the only memory its writes may
   * take, and dropping it is a memory-map call on the write path.
   */
  while (reserve_gives_room (pool) && reserve_give_up_one (pool))
    if (limit_charge (pool, bytes))
      return 0;
  /* Pending frees may hold what is missing. */
  if (pool->config.free_mode == ZS_FREE_BATCHED) {
    zs_pool_flush (pool);
    if (limit_charge (pool, bytes))
      return 0;
  }
  atomic_fetch_add (&pool->limit_hits, 1);
  errno = ENOSPC;
  return -1;
}

void
zs_pool_discharge (struct zs_pool *pool, size_t bytes)
{
  limit_discharge_metadata (pool, bytes);
}

/* Allocate an object of size bytes in class, whose lock the caller holds
 * (and holds again on return, though it may be dropped meanwhile, to
 * drain frees, compact or make a zspage).  0 with errno on failure.
 */
static zs_handle_t
object_alloc_locked (struct zs_pool *pool, struct size_class *class,
                     size_t size)
{
  struct zspage *zspage;
  bool flushed = false, compacted = !pool->config.compact_before_refusal;
  int err;

  /* The cell first: once a zspage is found or made, nothing can fail,
   * so a failure never leaves a new, empty zspage behind.
   */
  _Atomic uint64_t *cell;
  while (!(cell = cell_alloc (pool, class))) {
    /* A new block of cells refused by the limit: drain the pending frees
     * once (they may free cells of this class, or bytes), then look again.
     */
    err = errno;
    pthread_mutex_unlock (class->lock);
    if (err == ENOSPC && reserve_gives_room (pool)
        && reserve_give_up_one (pool)) {
      pthread_mutex_lock (class->lock);
      continue;
    }
    if (err != ENOSPC || flushed || pool->config.free_mode != ZS_FREE_BATCHED) {
      if (err == ENOSPC)
        atomic_fetch_add (&pool->limit_hits, 1);
      pthread_mutex_lock (class->lock);
      errno = err;
      return 0;
    }
    flushed = true;
    zs_pool_flush (pool);
    pthread_mutex_lock (class->lock);
  }
  /* Every decision below is made with the class lock held and the class
   * seen without a free slot, so a refusal is true when it is made.
   */
  while (!(zspage = class_fullest_zspage (class))) {
    enum reservation reservation = zspage_reserve (pool, class);
    if (reservation == RESERVED) {
      pthread_mutex_unlock (class->lock);
      zspage = zspage_create (pool, class);
      err = errno;
      reserve_settle (pool);
      pthread_mutex_lock (class->lock);
      if (!zspage) {
        zspage_unreserve (pool, class);
        if (err == EAGAIN && refill_blocked_by_limit (pool)) {
          atomic_fetch_add (&pool->limit_hits, 1);
          err = ENOSPC;
        }
        goto fail;
      }
      /* Take from the new zspage itself, even if a racing thread made a
       * fuller one meanwhile: never leave an empty zspage behind.
       */
      zspage_insert (class, zspage);
      atomic_fetch_sub (&pool->limit_account, LIMIT_TRANSIT);
      break;
    }
    if (reservation == REFUSED && reserve_gives_room (pool)
        && page_source_reserve_pages (&pool->pages)) {
      /* The reserve's pages are the data's before they are anything.
       * Not in resident_only: there they are the only pages a write may
       * take, and a zspage given room by dropping them would find none
       * (seen: writes refused "not ready" forever, under the limit, with
       * the refill unable to add a chunk) - the data's room is mem_limit
       * less the reserve, and past it the refusal is ENOSPC.
       */
      pthread_mutex_unlock (class->lock);
      bool dropped = reserve_give_up_one (pool);
      pthread_mutex_lock (class->lock);
      if (dropped)
        continue;
    }
    if (reservation == REFUSED && flushed && compacted) {
      atomic_fetch_add (&pool->limit_hits, 1);
      err = ENOSPC;
      goto fail;
    }
    if (reservation == IN_TRANSIT && pool->pages.resident_only) {
      /* What is in transit is most likely the refill's chunk, being
       * populated - which, with memory short, waits on reclaim.  A write
       * never waits on that: and spinning here, at a swap server's
       * real-time priority, would starve the reclaim it waits for (seen:
       * the kernel's RT throttling, a swap-out stuck for minutes).
       */
      err = EAGAIN;
      goto fail;
    }
    /* Drain the pending frees once, then compact once, or let the
     * zspages in transit land; then look in the class again.
     */
    pthread_mutex_unlock (class->lock);
    if (reservation == REFUSED && !flushed) {
      flushed = true;
      if (pool->config.free_mode == ZS_FREE_BATCHED)
        zs_pool_flush (pool);
    }
    else if (reservation == REFUSED) {
      compacted = true;
      zs_compact (pool);
    }
    else
      sched_yield ();
    pthread_mutex_lock (class->lock);
  }

  unsigned index = zspage_take_object (class, zspage);
  zspage->slot_cells[index] = cell;
  class->objs_used++;
  class->bytes_stored += size;
  atomic_store_explicit (cell, cell_encode (zspage, index, size),
                         memory_order_release);
  return (zs_handle_t) cell;

 fail:
  cell_release (pool, class, cell);
  errno = err;
  return 0;
}

zs_handle_t
zs_malloc (struct zs_pool *pool, size_t size)
{
  if (size == 0 || size > ZS_MAX_OBJECT_SIZE) {
    errno = EINVAL;
    return 0;
  }
  struct size_class *class = class_for_size (pool, size);
  pthread_mutex_lock (class->lock);
  zs_handle_t handle = object_alloc_locked (pool, class, size);
  int err = errno;
  pthread_mutex_unlock (class->lock);
  errno = err;
  return handle;
}

unsigned
zs_malloc_batch (struct zs_pool *pool, const size_t *sizes, unsigned n,
                 zs_handle_t *handles)
{
  /* The objects in class order (an insertion sort: n is a request's
   * blocks), so that each run of one class takes its lock once.
   */
  if (n > ZS_MALLOC_BATCH_MAX) {
    errno = EINVAL;
    return 0;
  }
  unsigned order[ZS_MALLOC_BATCH_MAX];
  memset (handles, 0, n * sizeof *handles);
  for (unsigned i = 0; i < n; i++) {
    if (sizes[i] == 0 || sizes[i] > ZS_MAX_OBJECT_SIZE) {
      errno = EINVAL;
      return 0;
    }
    unsigned j = i;
    for (; j > 0 && sizes[order[j - 1]] > sizes[i]; j--)
      order[j] = order[j - 1];
    order[j] = i;
  }
  unsigned done = 0;
  while (done < n) {
    struct size_class *class = class_for_size (pool, sizes[order[done]]);
    pthread_mutex_lock (class->lock);
    do {
      unsigned i = order[done];
      if (!(handles[i] = object_alloc_locked (pool, class, sizes[i]))) {
        int err = errno;
        pthread_mutex_unlock (class->lock);
        errno = err;
        return done;
      }
      done++;
    } while (done < n && class_for_size (pool, sizes[order[done]]) == class);
    pthread_mutex_unlock (class->lock);
  }
  return done;
}

struct zspage *
object_free_locked (struct zs_pool *pool, struct size_class *class,
                    zs_handle_t handle)
{
  _Atomic uint64_t *cell = (_Atomic uint64_t *) handle;
  uint64_t location = atomic_load_explicit (cell, memory_order_relaxed);
  struct zspage *zspage = cell_zspage (location);

  class->objs_used--;
  class->bytes_stored -= cell_object_size (location);
  cell_release (pool, class, cell);
  zspage->slot_cells[cell_object_index (location)] = NULL;
  if (zspage_put_object (class, zspage, cell_object_index (location)))
    return zspage;
  return NULL;
}

void
zs_free (struct zs_pool *pool, zs_handle_t handle)
{
  zs_free_many (pool, &handle, 1);
}

void
zs_free_many (struct zs_pool *pool, zs_handle_t *handles, unsigned n)
{
  unsigned kept = 0;
  for (unsigned i = 0; i < n; i++)
    if (handles[i])
      handles[kept++] = handles[i];
  if (kept == 0)
    return;
  if (pool->config.free_mode == ZS_FREE_BATCHED)
    free_batch_add (pool, handles, kept);
  else
    for (unsigned at = 0; at < kept; at += ZS_FREE_BATCH_SIZE)
      free_handles (pool, handles + at, kept - at < ZS_FREE_BATCH_SIZE
                    ? kept - at : ZS_FREE_BATCH_SIZE);
}

static inline unsigned char *
object_address (struct zs_pool *pool, uint64_t location)
{
  struct size_class *class = class_for_size (pool, cell_object_size (location));
  return cell_zspage (location)->base
    + (size_t) cell_object_index (location) * class->size;
}

/* Take, for reading, the move lock of the zspage the object is in, and
 * return the object's location seen under it (see MOVING OBJECTS).
 */
static uint64_t
object_lock_against_moves (struct zs_pool *pool, zs_handle_t handle)
{
  uint64_t seen = handle_load (handle);
  for (;;) {
    pthread_rwlock_t *move_lock = zspage_move_lock (pool, cell_zspage (seen));
    pthread_rwlock_rdlock (move_lock);
    uint64_t location = handle_load (handle);
    if (cell_zspage (location) == cell_zspage (seen))
      return location;
    /* Moved before the lock was taken: lock where it is now. */
    pthread_rwlock_unlock (move_lock);
    seen = location;
  }
}

static void
object_unlock_against_moves (struct zs_pool *pool, zs_handle_t handle)
{
  pthread_rwlock_unlock (zspage_move_lock (pool,
                                           cell_zspage (handle_load (handle))));
}

const void *
zs_read_begin (struct zs_pool *pool, zs_handle_t handle, void *local_copy)
{
  return object_address (pool, object_lock_against_moves (pool, handle));
}

void
zs_read_end (struct zs_pool *pool, zs_handle_t handle, const void *mem)
{
  object_unlock_against_moves (pool, handle);
}

int
zs_read_needs_copy (const struct zs_pool *pool)
{
  return 0;
}

int
zs_write (struct zs_pool *pool, zs_handle_t handle, const void *buf, size_t len)
{
  /* Under the lock: the object may have moved since zs_malloc. */
  uint64_t location = object_lock_against_moves (pool, handle);
  int r = 0;
  if (len > cell_object_size (location)) {
    errno = EINVAL;
    r = -1;
  }
  else
    memcpy (object_address (pool, location), buf, len);
  object_unlock_against_moves (pool, handle);
  return r;
}

size_t
zs_object_size (struct zs_pool *pool, zs_handle_t handle)
{
  return cell_object_size (handle_load (handle));
}

size_t
zs_object_room (struct zs_pool *pool, zs_handle_t handle)
{
  return class_of_handle (pool, handle)->size;
}

size_t
zs_size_room (struct zs_pool *pool, size_t size)
{
  if (size == 0 || size > ZS_MAX_OBJECT_SIZE)
    return 0;
  return class_for_size (pool, size)->size;
}

int
zs_resize (struct zs_pool *pool, zs_handle_t handle, size_t size)
{
  if (size == 0 || size > ZS_MAX_OBJECT_SIZE) {
    errno = EINVAL;
    return -1;
  }
  struct size_class *class = class_of_handle (pool, handle);
  if (class_for_size (pool, size) != class) {
    errno = ERANGE;
    return -1;
  }
  /* The class lock: the size is counted in bytes_stored, and a drain
   * freeing other objects of the class reads cells under it.
   */
  pthread_mutex_lock (class->lock);
  uint64_t location = handle_load (handle);
  class->bytes_stored += size - cell_object_size (location);
  atomic_store_explicit ((_Atomic uint64_t *) handle,
                         cell_encode (cell_zspage (location),
                                      cell_object_index (location), size),
                         memory_order_release);
  pthread_mutex_unlock (class->lock);
  return 0;
}

size_t
zs_huge_class_size (const struct zs_pool *pool)
{
  return pool->huge_class_size;
}

void
zs_pool_get_config (const struct zs_pool *pool, struct zs_pool_config *config)
{
  *config = pool->config;
  config->mem_limit = atomic_load (&pool->mem_limit);
}

int
zs_pool_set_mem_limit_held (struct zs_pool *pool, uint64_t limit,
                            uint64_t *held)
{
  for (bool drained = false; ; drained = true) {
    /* Checked and set with no charge in between (MEMORY LIMIT): a limit
     * the account refuses is never in force, and one it accepts binds
     * every charge that lands after it.
     */
    pthread_rwlock_wrlock (&pool->limit_lock);
    uint64_t bytes = account_bytes (atomic_load (&pool->limit_account));
    if (!limit || bytes <= limit) {
      atomic_store (&pool->mem_limit, limit);
      pthread_rwlock_unlock (&pool->limit_lock);
      return 0;
    }
    pthread_rwlock_unlock (&pool->limit_lock);
    /* Refused for what the pool holds once its deferred frees are
     * drained and the reserve's pages that zspages took are given back,
     * as an allocation is.
     */
    if (drained) {
      if (held)
        *held = bytes;
      errno = ENOSPC;
      return -1;
    }
    if (pool->config.free_mode == ZS_FREE_BATCHED)
      zs_pool_flush (pool);
    reserve_settle (pool);
  }
}

int
zs_pool_set_mem_limit (struct zs_pool *pool, uint64_t limit)
{
  return zs_pool_set_mem_limit_held (pool, limit, NULL);
}

void
zs_pool_reset_max (struct zs_pool *pool)
{
  atomic_store (&pool->pages_used_max, atomic_load (&pool->pages_used));
}

uint64_t
zs_pool_bytes (struct zs_pool *pool)
{
  return account_bytes (atomic_load_explicit (&pool->limit_account,
                                              memory_order_relaxed));
}

uint64_t
zs_pool_mem_limit (struct zs_pool *pool)
{
  return atomic_load_explicit (&pool->mem_limit, memory_order_relaxed);
}
