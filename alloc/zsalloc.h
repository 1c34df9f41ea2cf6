/* zsalloc: a user-space zsmalloc for compressed pages.
 *
 * A pool stores objects of 1..4096 bytes (typically the compressed form of
 * one 4 KiB page) packed into "zspages": runs of 1..chain contiguous pages,
 * each dedicated to one size class.  Callers get an opaque handle per
 * object, never a pointer: the allocator owns the indirection so it may
 * move objects later (compaction) without telling the caller.
 *
 * Object access follows the kernel's 2025 mapping API:
 *
 *   zs_handle_t h = zs_malloc (pool, len);     // 0 and errno on failure
 *   zs_write (pool, h, buf, len);              // fill it
 *   const void *p = zs_read_begin (pool, h, local_copy);
 *   ... use p[0..len) ...
 *   zs_read_end (pool, h, p);
 *   zs_free (pool, h);                         // may be deferred (batched)
 *
 * Thread safety: every function may be called from any number of threads
 * at once on one pool, except zs_pool_destroy, which must be the last call.
 * The caller serialises the uses of ONE handle: no zs_free (or zs_write)
 * of a handle while another thread reads or writes that same handle.
 *
 * Errors: functions that can fail return 0 / NULL / -1 and set errno:
 *   EINVAL  bad size or configuration value,
 *   ENOSPC  the pool's memory limit would be exceeded (after draining every
 *           deferred free, so pending frees never cause a refusal),
 *   ENOMEM  the operating system refused memory.
 * A failure never touches objects already stored.
 *
 * The design (size classes, handles, locks and their order) is described
 * in alloc/zsalloc-internal.h.  The manual is man/zsalloc.3.
 */

#ifndef ZSALLOC_H
#define ZSALLOC_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest object, and the page size the pool is built on. */
#define ZS_PAGE_SIZE 4096
#define ZS_MAX_OBJECT_SIZE ZS_PAGE_SIZE

/* Range of the zspage chain limit (pages per zspage at most). */
#define ZS_CHAIN_MIN 1
#define ZS_CHAIN_MAX 16
#define ZS_CHAIN_DEFAULT 8

/* Number of fullness groups: empty, 1-10 %, 11-20 %, ..., 81-90 %,
 * 91-99 %, full.  zs_fullness_group_name gives their column names.
 */
#define ZS_FULLNESS_GROUPS 12

/* An object handle.  0 is never a valid handle. */
typedef uintptr_t zs_handle_t;

enum zs_lock_mode {
  ZS_LOCK_CLASS = 0,          /* one lock per size class (default) */
  ZS_LOCK_POOL,               /* one pool-wide lock, for A/B benchmarks only */
};

enum zs_free_mode {
  ZS_FREE_BATCHED = 0,        /* batches of deferred frees (default) */
  ZS_FREE_IMMEDIATE,          /* every zs_free frees at once, for A/B benchmarks */
};

struct region;                  /* memory that outlives the process:
                                   alloc/region.h */

struct zs_pool_config {
  unsigned chain_pages;           /* zspage chain limit, 1..16, default 8 */
  uint64_t mem_limit;             /* bytes the pool may hold: pages, their
                                     descriptors, handle cells, charges
                                     (zs_pool_charge), the reserve; or,
                                     limit_pages_only, the zspages' pages
                                     alone; 0 = no limit */
  bool limit_pages_only;          /* mem_limit counts the zspages' pages
                                     only, as the kernel's zram counts
                                     its mem_limit (zs_get_total_pages):
                                     the rest is counted in the stats
                                     but refused nothing (MEMORY LIMIT
                                     in zsalloc-internal.h) */
  enum zs_lock_mode lock_mode;
  enum zs_free_mode free_mode;
  bool compact_before_refusal;    /* zs_malloc compacts once before it
                                     refuses for mem_limit (default true) */
  uint64_t reserve_bytes;         /* populated pages kept ready for new
                                     zspages (zs_pool_reserve_refill),
                                     counted in mem_limit; 0 = none */
  bool resident_only;             /* a new zspage takes only pages that are
                                     resident already (the reserve's, freed
                                     ones); none ready: zs_malloc fails at
                                     once with EAGAIN, and the refill
                                     (zs_pool_reserve_refill) makes more
                                     ready (swap: a write never waits on
                                     reclaim; RESIDENT ONLY in
                                     page-source.h) */
  struct region *region;          /* where the pool lives - its own
                                     structures, zspages, descriptors and
                                     cells - so that another process can
                                     take it over (zs_pool_take_over):
                                     the region itself (owner->region),
                                     the same address in every owner;
                                     NULL (default): the C heap and
                                     anonymous mappings */
};

struct zs_pool;

/* Fill *config with the defaults. */
extern void zs_pool_config_init (struct zs_pool_config *config);

/* Create a pool.  config may be NULL for the defaults.  Returns NULL and
 * sets errno (EINVAL for a bad config value, ENOMEM) on failure.
 */
extern struct zs_pool *zs_pool_create (const struct zs_pool_config *config);

/* Destroy a pool, freeing every object still stored and every page.
 * No other call on the pool may be running or follow.
 */
extern void zs_pool_destroy (struct zs_pool *pool);

/* A pool in a region, handed from one process to the next (HANDOVER in
 * alloc/region.h).  zs_pool_hand_over drains the deferred frees and
 * leaves every structure whole; no other call on the pool may be running
 * or follow in this process (hand the region over next).  In the process
 * that attached the region, zs_pool_take_over makes the pool's locks
 * anew; then the pool serves every object as it was, its handles
 * unchanged.  Returns pool.
 */
extern void zs_pool_hand_over (struct zs_pool *pool);

/* A pool in a region whose process died (RECOVERY in alloc/region.h,
 * the design in alloc/recover.c): between the region's
 * region_recover_begin and region_recover_end, zs_recover_begin starts,
 * zs_recover_handle gives one live handle (false: it names no live
 * object - the caller's reference is lost), zs_recover_end rebuilds
 * every list and counter around them, claims the pool's memory in the
 * region and frees what no handle reaches; charged_bytes: what the
 * pool's user has charged (zs_pool_charge) and still holds.  0, or -1
 * with errno (EINVAL: the pool's own structures are not where they
 * should be; ENOMEM): the pool is then unusable.  Then zs_pool_take_over
 * is not needed.  One thread, no other call on the pool meanwhile.
 */
struct zs_recovery;
struct zs_recover_result {
  uint64_t objects;               /* live objects kept */
  uint64_t refused;               /* handles that named no live object */
  uint64_t zspages, pages;        /* kept */
};
extern struct zs_recovery *zs_recover_begin (struct zs_pool *pool);
extern bool zs_recover_handle (struct zs_recovery *recovery,
                               zs_handle_t handle);
extern int zs_recover_end (struct zs_recovery *recovery,
                           uint64_t charged_bytes,
                           struct zs_recover_result *result);
extern struct zs_pool *zs_pool_take_over (struct zs_pool *pool);

/* Allocate an object of size bytes (1..ZS_MAX_OBJECT_SIZE).  Its content
 * is undefined until written.  Returns 0 and sets errno on failure.
 */
extern zs_handle_t zs_malloc (struct zs_pool *pool, size_t size);

/* Allocate n objects (n <= ZS_MALLOC_BATCH_MAX) of sizes[i] bytes into
 * handles[i], in class order: each run of one class takes the class lock
 * once (a write of many blocks).  Returns how many it allocated; fewer
 * than n (errno set) when one failed, and then the handles of the ones
 * not allocated are 0 (which ones: any).
 */
#define ZS_MALLOC_BATCH_MAX 64
extern unsigned zs_malloc_batch (struct zs_pool *pool, const size_t *sizes,
                                 unsigned n, zs_handle_t *handles);

/* Free an object.  In batched mode the object joins one of the pool's
 * batches of deferred frees and its memory is reclaimed when the batch
 * drains (batch full, zs_pool_flush, statistics, or memory limit).
 * The handle must not be used again either way.  zs_free of 0 is a no-op.
 */
extern void zs_free (struct zs_pool *pool, zs_handle_t handle);
/* Free n objects at once (0 handles skipped): one batch lock hold for
 * them all.  handles[] is reordered.
 */
extern void zs_free_many (struct zs_pool *pool, zs_handle_t *handles,
                          unsigned n);

/* Drain every batch of deferred frees, returning empty zspages'
 * pages to the operating system.
 */
extern void zs_pool_flush (struct zs_pool *pool);

/* Begin reading an object: returns a pointer to its bytes, valid until
 * zs_read_end.  local_copy is a caller buffer of the object's size that
 * the allocator may copy the object into; this implementation keeps each
 * zspage virtually contiguous so it never needs to, but callers must
 * still pass one (or NULL when they know the pool never copies: see
 * zs_read_needs_copy).  Until zs_read_end the object cannot be moved by
 * compaction; a thread holds at most one read at a time and calls
 * neither zs_malloc nor zs_compact while it does (either could wait for
 * a mover that waits for this read).
 */
extern const void *zs_read_begin (struct zs_pool *pool, zs_handle_t handle,
                                  void *local_copy);
extern void zs_read_end (struct zs_pool *pool, zs_handle_t handle,
                         const void *mem);

/* Non-zero when zs_read_begin may use local_copy.  Always 0 here. */
extern int zs_read_needs_copy (const struct zs_pool *pool);

/* Copy len bytes (at most the object's size) into the object.
 * Returns 0, or -1 with errno EINVAL when len is too big.
 */
extern int zs_write (struct zs_pool *pool, zs_handle_t handle,
                     const void *buf, size_t len);

/* The size that was passed to zs_malloc for this handle (or zs_resize). */
extern size_t zs_object_size (struct zs_pool *pool, zs_handle_t handle);

/* The most the object's slot holds: its size class's slot size. */
extern size_t zs_object_room (struct zs_pool *pool, zs_handle_t handle);
/* The slot size an object of size bytes would get (its class's room);
 * 0 for a size out of range.
 */
extern size_t zs_size_room (struct zs_pool *pool, size_t size);

/* Change an object's size in place, keeping its slot and its bytes:
 * 0, or -1 with errno ERANGE when the new size belongs to another size
 * class (it would need another slot), EINVAL for a bad size.  Uses of the
 * handle are serialised by the caller, as for zs_write.
 */
extern int zs_resize (struct zs_pool *pool, zs_handle_t handle, size_t size);

/* Objects of this size or larger land in the huge class: one object per
 * one-page zspage.  zram stores pages that compress to this size or more
 * uncompressed.
 */
extern size_t zs_huge_class_size (const struct zs_pool *pool);

/* The configuration the pool was created with. */
extern void zs_pool_get_config (const struct zs_pool *pool,
                                struct zs_pool_config *config);

/* Compact the pool: in each size class, move live objects out of the
 * sparsest zspages into the fullest ones and give the emptied zspages'
 * pages back.  Runs beside every other call (one mover at a time, one
 * source zspage at a time; only readers and writers of objects in that
 * zspage wait for its moves), except that the caller must not hold a
 * zs_read_begin.  Returns the pages freed.
 */
extern uint64_t zs_compact (struct zs_pool *pool);

/* Change the memory limit while the pool is in use (0: none).  -1 with
 * errno ENOSPC if the pool holds more than limit once its deferred frees
 * are drained; nothing changes then.  The check and the change are one
 * step for every charge against the limit: a refused limit is never in
 * force, not even for a moment, and an accepted one is never exceeded by
 * an allocation checked against the old one.  zs_pool_set_mem_limit_held
 * also says, on a refusal, the bytes the pool held that refused it
 * (*held, the limit_used of zs_pool_stats at that moment).
 */
extern int zs_pool_set_mem_limit (struct zs_pool *pool, uint64_t limit);
extern int zs_pool_set_mem_limit_held (struct zs_pool *pool, uint64_t limit,
                                       uint64_t *held);
/* Restart pages_used_max from pages_used (zram's mem_used_max reset). */
extern void zs_pool_reset_max (struct zs_pool *pool);
/* The bytes mem_limit counts now (zs_pool_stats' limit_used), without
 * the flush and the walk of the classes zs_pool_stats does: one atomic
 * load, for fast paths.
 */
extern uint64_t zs_pool_bytes (struct zs_pool *pool);
/* mem_limit now (0: none), one atomic load as zs_pool_bytes. */
extern uint64_t zs_pool_mem_limit (struct zs_pool *pool);

/* Top up the reserve of populated pages (config.reserve_bytes) from the
 * operating system, as far as the memory limit allows; for a background
 * thread, so that allocations take pages that are already there.
 * Returns the bytes added.  zs_pool_reserve_low says when to call it.
 */
extern uint64_t zs_pool_reserve_refill (struct zs_pool *pool);
/* True when the reserve holds less than half its target (resident_only:
 * or its stack is empty, or less than half the metadata allowance is
 * left).
 */
extern bool zs_pool_reserve_low (struct zs_pool *pool);
/* resident_only: the caller's heap has bytes ready (touched and locked)
 * for the pool's metadata - zspage descriptors and blocks of handle
 * cells, which come from malloc - so that a new zspage never faults the
 * heap in.  From now until the next call the pool takes at most that
 * many bytes of metadata (counting each allocation's alignment too);
 * past it, zs_malloc fails with EAGAIN as when no page is ready.  Until
 * the first call the allowance is 0.  Without resident_only: no effect.
 */
extern void zs_pool_metadata_ready (struct zs_pool *pool, uint64_t bytes);
/* resident_only: let the data take the reserve's pages too, until a
 * refill (zs_pool_reserve_refill) makes the reserve whole again - the
 * data's room becomes the whole limit instead of the limit less the
 * reserve.  For a full device on a machine out of memory: the reserve's
 * pages are resident already, so the writes they take ask nothing of the
 * machine, and each one stored frees a page of the machine's.  Without
 * resident_only or a reserve: no effect.
 */
extern void zs_pool_open_reserve (struct zs_pool *pool);
/* Give the whole reserve back to the operating system (a pool that holds
 * nothing needs none until it is written to again).
 */
extern void zs_pool_reserve_release (struct zs_pool *pool);

/* Count bytes the caller holds for what it stores (its own metadata)
 * against the pool's memory limit: 0, or -1 with errno ENOSPC (after
 * draining deferred frees).  zs_pool_discharge gives them back.  With
 * limit_pages_only the limit does not count them: always 0.
 */
extern int zs_pool_charge (struct zs_pool *pool, size_t bytes);
extern void zs_pool_discharge (struct zs_pool *pool, size_t bytes);

/* Pool statistics.  zs_pool_stats drains deferred frees first, so the
 * numbers are exact at the moment of the call.
 */
struct zs_pool_stats {
  uint64_t pages_used;        /* pages in zspages now */
  uint64_t pages_used_max;    /* high-water mark of pages_used */
  uint64_t bytes_stored;      /* sum of the sizes of live objects */
  uint64_t objects;           /* live objects */
  uint64_t pages_freed;       /* pages returned to the OS since creation */
  uint64_t limit_hits;        /* allocations refused for mem_limit */
  uint64_t mem_limit;         /* configured limit in bytes, 0 = none */
  uint64_t limit_used;        /* bytes counted against it: pages, zspage
                                 descriptors, cell blocks, charges */
  uint64_t pages_compacted;   /* pages freed by compaction, ever */
  uint64_t pages_freeable;    /* pages compaction could free now */
  uint64_t metadata_bytes;    /* zspage descriptors, handle cells, batches */
  uint64_t frees_pending;     /* deferred frees not yet drained (0 after
                                 the flush zs_pool_stats does) */
  uint64_t reserve_bytes;     /* populated pages ready in the reserve */
  uint64_t reserve_refills;   /* bytes the reserve was topped up with, ever */
  uint64_t reserve_misses;    /* new chunks mapped with the reserve empty */
  uint64_t metadata_misses;   /* resident_only: allocations refused as the
                                 metadata allowance was spent, ever */
};
extern void zs_pool_stats (struct zs_pool *pool, struct zs_pool_stats *stats);

/* Per size-class statistics, zsmalloc's debugfs columns.  Classes are
 * numbered 0..zs_class_count()-1 in increasing size; merged classes are
 * reported once, under their largest size.
 */
struct zs_class_stats {
  unsigned size;              /* object slot size in bytes */
  unsigned min_size;          /* smallest object size this class serves */
  unsigned pages_per_zspage;
  unsigned objs_per_zspage;
  uint64_t objs_allocated;    /* object slots in this class's zspages */
  uint64_t objs_used;         /* live objects */
  uint64_t zspages[ZS_FULLNESS_GROUPS]; /* zspages per fullness group */
  uint64_t pages_used;        /* zspages x pages_per_zspage */
  uint64_t pages_freeable;    /* pages compaction could free (zsmalloc's
                                 "freeable") */
};
extern unsigned zs_class_count (const struct zs_pool *pool);
extern int zs_class_stats (struct zs_pool *pool, unsigned class_number,
                           struct zs_class_stats *stats);

/* Column name of a fullness group: "empty", "10", "20", ..., "90", "99",
 * "full".
 */
extern const char *zs_fullness_group_name (unsigned group);

/* Print the pool and class statistics as a table (like zsmalloc's
 * debugfs "classes" file), skipping classes with no zspages.
 */
extern void zs_pool_print_stats (struct zs_pool *pool, FILE *fp);

#ifdef __cplusplus
}
#endif

#endif /* ZSALLOC_H */
