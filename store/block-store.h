/* The block store: a virtual disk of 4 KiB blocks kept compressed in a
 * zsalloc pool.  It knows nothing of nbdkit, so tests can drive it
 * directly; plugin/zram.c forwards nbdkit's callbacks here.
 *
 * Each block is one entry of the block table (block-table.h): empty
 * (reads as zeros), same-filled (one 8-byte word, no object: zram's
 * ZRAM_SAME), compressed, raw (compressed size would reach the pool's
 * huge class, so the 4096 bytes are stored as they are), packed with
 * other idle blocks (cold packing, below), or written back to a backing
 * store (writeback, below).  The entry's state word (block-table.h) holds
 * its kind, flags, zeroed overlay, access time and the move claim.
 *
 * LOCKS, what each guards, and the ONE lock order
 *   table walk_lock  read: extents walks; write: the grace period of the
 *                table's reclaim (block-table.h, LIFETIME).
 *   stripe lock  stripes[block % STORE_STRIPES] guards the entries of the
 *                blocks that hash to it, the table nodes on their path
 *                (a lookup and every use of its entry happen under it),
 *                and the objects those entries hold: a reader decompresses
 *                under it so the object cannot be freed beneath it; a
 *                partial write reads, patches and re-stores the block
 *                under it, so two partial writes of one block never lose
 *                each other's bytes.  Written-back blocks are the
 *                exception: their backing reads run with the stripe
 *                unlocked, the run pinned by a read epoch (backing.h,
 *                READS AND RELEASES), and a partial write checks the
 *                entry again after it (block_patch).
 *   units_lock   the list of packed units, their links and dissolve_retry,
 *                and the pinning of a unit to dissolve (never one whose
 *                live count reached 0: its last block's thread frees it)
 *                (a leaf; held for one pass over the list at most).
 *   unit cache slot lock  a decoded unit kept for reads (taken under a
 *                stripe lock; the unit's parts are read and decoded under
 *                it).  A reader waits for it only while the slot holds or
 *                decodes the reader's own unit; else it tries it and
 *                decodes alone if it is busy.  unit_destroy waits for
 *                the slot of the unit it frees (only a decode of another
 *                unit or a trim can hold it then: no read can reach a
 *                unit whose last block went).
 *   dictionary_lock  packing's dictionaries: their places, which one is
 *                current, and when one was trained (pack-dictionary.c);
 *                held to install, take or free one.  Taken under a
 *                stripe lock (a unit's last block gone frees the unit and
 *                may free its dictionary) and before the allocator's
 *                locks (a region's heap); no other store lock under it.
 *                A dictionary's decoder is made without it (one
 *                compare-and-swap).
 *   writeback_lock  one writeback run at a time, and the writeback
 *                limit's changes; held for a whole run (a pass of a
 *                writeback for room).  A thread holds one store's at a
 *                time: a writeback over the stores that share a cold tier
 *                takes each in turn (COLD TIER ACROSS STORES); the owner's
 *                is only tried (trylock) for the map's charge under
 *                another's.
 *   budget members_lock  the stores on a budget that write back, and
 *                their pins (COLD TIER ACROSS STORES); a leaf, held for
 *                a list walk at most.
 *   backing locks  the backing store's space map (its lock,
 *                space-map.h), its queue of released runs (release_lock)
 *                and each NBD connection (backing.h): leaves, never held two at a time; a
 *                connection's lock is held for one request, its deadline
 *                (backing_timeout) at most, and never under a stripe lock.
 *   allocator locks (alloc/zsalloc-internal.h).
 *
 *   Order: writeback_lock -> stripe lock -> unit cache slot lock ->
 *   allocator locks; stripe lock -> dictionary_lock -> allocator locks;
 *   units_lock, the budget's members_lock and the backing locks are
 *   leaves;
 *   walk_lock is never held with another.
 *   Every thread holds one stripe lock at a time (the table's reclaim
 *   takes each in turn for its grace period).  Full-block writes
 *   compress and allocate before taking the stripe lock and hold it only
 *   to look up and swap the entry; every write frees the old object after
 *   dropping it (a free can take a class lock and drain a batch: never
 *   under a stripe lock, which readers of the block wait on).
 *
 * MOVING A BLOCK: claim, then commit only if the claim holds
 *   Packing, dissolving, recompression, writeback and readback move a
 *   block to a new encoding while the server keeps serving it.  Each
 *   does it the one way (entry_claim / entry_commit / entry_unclaim in
 *   block-store-internal.h), with two bits of the entry's state word:
 *     MOVE_HELD    a mover holds a claim on the entry.  Set by entry_claim
 *                  (only where it is clear: one mover per entry at a
 *                  time), cleared by that mover's entry_commit or
 *                  entry_unclaim and by nothing else.
 *     MOVE_INTACT  nothing was stored into the entry since it was
 *                  claimed.  Set by entry_claim with MOVE_HELD; cleared by
 *                  every store into the entry (entry_store: full and
 *                  partial writes, trims, zeroes, zeroed ranges, other
 *                  commits).  A read, an access-time update or the idle
 *                  marker leave it: they change no content.
 *   1. Under the block's stripe lock the mover claims the entry (both
 *      bits) and copies what it needs (decoded bytes, object bytes).
 *   2. With no stripe lock it does the slow part (compress, write to the
 *      backing store).
 *   3. Under the stripe lock again it commits: if MOVE_INTACT is still set
 *      the new content replaces the old (not an access: the time and the
 *      idle flag stay) and the old is freed after the lock; else its work
 *      is dropped (freed) and the entry is left as the store made it.
 *      Either way MOVE_HELD goes.
 *   Readback (a read that brings a written-back block into RAM) moves
 *   within the one hold of the stripe lock in which it read the block:
 *   with no window it needs no claim, and stores like a write.
 *   A claim also holds the entry's leaf (block_leaf_claim): were the
 *   entry emptied and its leaf reclaimed, a new leaf could carry another
 *   mover's claim on the same block.
 *   No decision rests on a handle, a state word or a time being equal:
 *   a handle is recycled, a partial write in place keeps it, and the
 *   idle marker makes old state words again.  Why two bits and not one:
 *   with one, a claim voided by a write could be taken again by a second
 *   mover, and the first would then see "its" claim standing and commit
 *   stale bytes (tests/move-protocol.pml shows both rules failing and
 *   this one holding).
 *
 * A write allocates and fills the new object before touching the entry,
 * so a write refused for memory (ENOSPC) leaves the old block readable.
 *
 * WHO OWNS WHAT
 *   The store owns its table, its pool (with the pool's batches of
 *   deferred frees) and its codec (with every compression context), from
 *   store_create to store_destroy.  Threads own nothing: a call borrows a
 *   context for its own length, frees go to the pool's batches, and no
 *   pthread key or thread-exit hook exists.  So nbdkit's threads may exit
 *   at any time, even after .unload destroyed the store and the plugin
 *   was unmapped, without running any of its code.  store_destroy
 *   requires that no call is running.
 *
 * BUDGET (stores on one pool: the devices of one server; quota.c)
 *   Stores that share a pool (config.shared_pool) share its mem_limit,
 *   and each may have a cap (config.cap: its objects may not take more,
 *   as cgroup v2's memory.zswap.max) and a floor (config.floor: the
 *   others may not take the room it has not used yet, as memory.min).
 *   Both count a store's objects by their size classes' bytes
 *   (quota_bytes), not pages: the pages of a zspage are shared by every
 *   store whose objects it holds.  An object is charged when it is
 *   allocated and discharged when it is freed, with one atomic add each
 *   (a claim: a charge that takes the store over its cap is taken back
 *   and the object freed, so that no moment's sum exceeds the cap but
 *   by claims about to be refused).  The budget (struct store_budget,
 *   shared by the stores) holds the floors' unmet room: the sum over
 *   stores with a floor of what they may still take below it, changed by
 *   each of their charges by exactly what that charge changed.  Every
 *   allocation of every store on the budget checks, after the pool gave
 *   it the object, that the pool's bytes plus the other stores' unmet
 *   floors are within mem_limit, or gives the object back (ENOSPC).
 *   What floors do not cover: the pool's slack (a zspage's unused slots),
 *   the table's nodes and the decode cache, which the pool charges to
 *   whichever store made them; the refusal of another store's write
 *   keeps the floor's room free, it does not evict what was there before
 *   the floor was set.  Only atomics: no lock.
 *
 * COLD TIER ACROSS STORES (writeback.c)
 *   The stores of one budget may share one backing store: the owner's
 *   (config.backing), which the others use (config.backing_owner) with
 *   its one space map, so that each block's run is named by its own
 *   store's entry alone (a store reads only what its table points to)
 *   and a store's trim or destroy releases its runs to the map that all
 *   use.  The map's charge to the pool is the owner's (under the owner's
 *   writeback_lock).  A writeback that makes room (a write refused for
 *   memory, store_writeback_until) goes over every store on the budget
 *   with a backing store, coldest first: its passes (idle blocks, huge
 *   ones, then by age) each visit every store before the next, so an
 *   idle device's blocks go before a busy one's recent ones.  It works on
 *   one store at a time, under that store's writeback_lock alone, and
 *   pins the store (budget->members_lock) for it: a store leaving the
 *   budget (store_destroy) is unlinked first and waits until no pin
 *   holds it.  In a region the owner is the region's root and the map
 *   is in the region (HANDOVER): a recovery walks every device's table
 *   into the map's recovery (store_recover), and a device taken over
 *   uses the adopted owner's backing store again (store_adopt).  The map
 *   keeps the capacity it was made with: the backing store opened by a
 *   later process (asked for the room of the devices declared then) is
 *   extended to it if shorter, refused if it cannot hold it.
 *
 * HANDOVER (a store that outlives its process; alloc/region.h)
 *   With a region (config.pool.region) the store is allocated there with
 *   everything a read needs: the struct, the table's nodes, the units'
 *   descriptors, the pool and its pages.  Nothing in it points outside
 *   the region except this process's parts - the codecs (their contexts),
 *   the decode cache's slots and their data, the write scratch, the
 *   backing store - and the state of its locks.  store_hand_over gives
 *   those parts up (the decode cache and scratch freed and discharged,
 *   the codecs closed) and drains the pool's deferred frees; the store is
 *   the region's root from its creation, under STORE_LAYOUT_VERSION (a
 *   server that dies before it serves leaves a region whose empty store
 *   the next one takes); store_take_over,
 *   in the next owner, finds it there, checks that config describes the
 *   same device (size, algorithms: a block is decoded by the algorithm
 *   its priority bits name), and makes the parts and every lock anew.
 *   The blocks are not touched: no copy, no recompression.  Block access
 *   times are seconds of CLOCK_MONOTONIC since created_ns, one clock for
 *   every process of a boot (and a memfd does not outlive a boot).
 *   After a crash the store is rebuilt instead (store_recover); for
 *   that, an entry's two words are written with the stripe's intent
 *   record (entry_write) and a live object is never written over (no
 *   rewrite in place in a region).
 *   A cold tier (config.backing) is kept too: its space map (which runs
 *   of the backing store hold which blocks, and their checksums) is made
 *   in the region (space-map.h, IN A REGION), and the next owner gives
 *   it to the backing store it opened - the same target (a checksum of
 *   its name is kept) of the same capacity, or the take-over is refused.
 *   A handover settles the runs released while reads were on and closes
 *   the backing store (this process's part); a recovery marks the runs
 *   the entries reach, and quarantines the ones nothing reaches when the
 *   target is an NBD export (the dead server's requests may still land).
 *
 * DEVICES IN A REGION (store-devices.c)
 *   The root store of a region may hold more stores on its pool: a
 *   server's devices.  Each is made in the region on the root's pool
 *   (config.shared_pool and config.pool.region) and published in a slot
 *   of a table the root points to (store_device_publish): its spec
 *   (name, size, algorithm, level, cap, floor; with a CRC-32C) written
 *   first, then the slot's store pointer in one atomic store.  Removing
 *   one unpublishes it (the pointer cleared) before its store is
 *   destroyed.  So a kill at any point of an add or a remove leaves the
 *   device whole or gone: recovery walks only published slots, and what
 *   no walk reaches (a store made but not published, or unpublished but
 *   not yet destroyed, and its objects) is free after it, as any
 *   allocation cut short.  A recovery walks every published store with
 *   the one pool's recovery (store_recover: the pool is rebuilt once,
 *   from every store's handles); a hand over gives up every store's
 *   process parts (store_hand_over on the root); a new owner adopts the
 *   root (store_take_over, store_recover) and then each device
 *   (store_devices_held, store_device_adopt).  Only the thread that adds
 *   and removes devices publishes; the table is read by the one thread
 *   that hands over, takes over or recovers, when no one publishes.
 */

#ifndef ZRAM_BLOCK_STORE_H
#define ZRAM_BLOCK_STORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "zsalloc.h"
#include "block-table.h"
#include "codec.h"

#define STORE_BLOCK_SIZE 4096
#define STORE_STRIPES 1024
/* The store's layout in a region (HANDOVER): raise it with any change to
 * a structure the store keeps there (struct block_store, the table, the
 * units), as REGION_LAYOUT_VERSION for the allocator's.
 */
#define STORE_LAYOUT_VERSION 7

#define STORE_RECOMP_MAX 3
#define STORE_WRITEBACK_BATCH 32
#define STORE_WRITEBACK_BATCH_MAX 256

/* BUDGET, above: what the stores on one pool share besides the pool. */
struct store_budget {
  /* The floors' room not used yet.  Signed: each store's steps land in
   * any order, so the sum may be read a step early (below 0 for a
   * moment) or late; budget_unmet_floors reads it clamped at 0.
   */
  _Atomic int64_t unmet_floors;
  _Atomic uint64_t floors;        /* the floors' sum */
  /* COLD TIER ACROSS STORES: the stores on the budget that have a
   * backing store, linked through their budget_next, for a writeback
   * that makes room for any of them.  members_lock guards the list and
   * the members' pins; a leaf (no other lock is taken while it is held).
   */
  pthread_mutex_t members_lock;
  struct block_store *members;
};
#define STORE_BUDGET_INIT { .members_lock = PTHREAD_MUTEX_INITIALIZER }

/* The budget's unmet floors now, clamped at 0 (see above). */
static inline uint64_t
budget_unmet_floors (struct store_budget *budget)
{
  int64_t unmet = atomic_load (&budget->unmet_floors);
  return unmet > 0 ? (uint64_t) unmet : 0;
}

struct store_config {
  uint64_t size;                  /* device size in bytes, >= 1 */
  enum codec_algorithm algorithm;
  int level;
  /* Recompression algorithms, priority 1..recomp_count in this order. */
  unsigned recomp_count;
  struct {
    enum codec_algorithm algorithm;
    int level;
  } recomp[STORE_RECOMP_MAX];
  int pack_level;                 /* zstd level of packed units
                                     (0: STORE_PACK_LEVEL_DEFAULT) */
  unsigned pack_blocks;           /* blocks per unit, 2..STORE_PACK_MAX
                                     (0: STORE_PACK_DEFAULT) */
  uint64_t decode_cache;          /* bytes of decoded units kept for reads
                                     (0: STORE_DECODE_CACHE_DEFAULT; one
                                     unit at least) */
  unsigned write_batch;           /* whole blocks of a write compressed as
                                     one batch, 1..STORE_WRITE_BATCH_MAX
                                     (0: the most; 1: block by block) */
  struct zs_pool_config pool;     /* chain, mem_limit, lock and free modes */
  /* A pool other stores use too (the devices of one server, one budget:
   * store_pool of the first), used and not owned, in place of one made
   * from pool: its mem_limit counts every store's objects.  Without a
   * region (pool.region NULL); the pool's store is destroyed last.
   */
  struct zs_pool *shared_pool;
  /* BUDGET, above: the budget shared by the stores on shared_pool (and
   * the pool's own store), or NULL; this store's cap and floor in bytes
   * of objects (0: none; with a budget only, a floor with a mem_limit).
   */
  struct store_budget *budget;
  uint64_t cap;
  uint64_t floor;
  /* Writeback: the backing store (backing.h), or NULL.  store_create
   * owns it from the call on, whether it succeeds or not.
   */
  struct backing *backing;
  /* Or the backing store of another store, shared (the devices of one
   * server: the default export's, COLD TIER ACROSS STORES below): used,
   * not owned, with backing NULL; its space map and the map's charge to
   * the pool stay the owner's.  The owner is destroyed last.
   */
  struct block_store *backing_owner;
  unsigned writeback_batch;       /* blocks per backing write, 1..
                                     STORE_WRITEBACK_BATCH_MAX (0: 32) */
  bool writeback_limited;         /* writeback_limit applies (zram's
                                     writeback_limit_enable) */
  uint64_t writeback_limit;       /* bytes that may be written back, if
                                     writeback_limited (0: none) */
  uint64_t readback_below;        /* a read of a written-back block brings
                                     it back into RAM while the pool holds
                                     less than this (0: never) */
  bool backing_nosync;            /* do not make a batch durable before
                                     its RAM copies go (backing_sync) */
};

/* zram's mm_stat and io_stat, plus what a user of this store wants. */
struct store_stats {
  uint64_t disk_size;             /* the device's size in bytes */
  uint64_t orig_data_size;        /* bytes of blocks stored (same incl.) */
  uint64_t compr_data_size;       /* bytes of stored objects */
  uint64_t mem_used_total;        /* pool pages x 4096 */
  uint64_t mem_limit;
  uint64_t limit_used;            /* what mem_limit counts, in use now */
  uint64_t mem_used_max;
  uint64_t same_pages;
  uint64_t pages_compacted;        /* freed by compaction, ever */
  uint64_t pages_freeable;         /* compaction could free now */
  uint64_t compact_ms;             /* time spent compacting, ever */
  uint64_t huge_pages;            /* blocks stored raw now */
  uint64_t huge_pages_since;      /* blocks stored raw, ever */
  uint64_t failed_reads;
  uint64_t failed_writes;
  uint64_t invalid_io;
  uint64_t notify_free;           /* blocks freed by trim or zero */
  uint64_t reads, writes;         /* block reads and writes done */
  uint64_t table_bytes;           /* block table */
  uint64_t metadata_bytes;        /* allocator metadata */
  unsigned streams;               /* compression contexts of comp= (the
                                     most writes compressed at once) */
  uint64_t codec_bytes;           /* compression contexts, and batched
                                     writes' scratch */
  uint64_t reserve_bytes;         /* swap reserve: populated pages ready */
  uint64_t reserve_refills;       /* bytes it was topped up with, ever */
  uint64_t reserve_misses;        /* chunks mapped with it empty, ever */
  uint64_t reserve_metadata_misses; /* writes refused as the heap had no
                                     metadata room ready, ever */
  uint64_t recomp_blocks;         /* blocks recompressed, ever */
  uint64_t recomp_bytes_saved;    /* bytes that saved, ever */
  uint64_t packed_blocks;         /* blocks in packed units now */
  uint64_t pack_units;            /* packed units now */
  uint64_t pack_dictionaries;     /* packing's dictionaries now */
  uint64_t pack_dictionary_bytes; /* theirs, their decoders' and the
                                     encoder's (while packing) */
  uint64_t decode_cache_bytes;    /* decoded units kept for reads now
                                     (charged to mem_limit) */
  uint64_t decode_cache_hits;     /* packed reads it served, ever */
  uint64_t decode_cache_misses;   /* packed reads that decoded, ever */
  /* Writeback: zram's bd_stat (4 KiB units), and the backing store. */
  uint64_t bd_count;              /* blocks written back, there now */
  uint64_t bd_reads;              /* blocks read from it, ever */
  uint64_t bd_writes;             /* blocks written to it, ever */
  uint64_t bd_bytes;              /* compressed bytes of bd_count blocks */
  uint64_t bd_failed_reads;       /* reads of it that failed */
  uint64_t bd_readbacks;          /* blocks read back into RAM, ever */
  uint64_t backing_capacity;      /* bytes its space map covers (0: none) */
  uint64_t backing_used;          /* bytes of it in use (sector runs) */
  uint64_t backing_map_bytes;     /* RAM its space map takes (counted in
                                     limit_used once settled) */
  uint64_t backing_failed;        /* requests to it that failed */
  uint64_t backing_reconnects;    /* NBD connections made again */
  uint64_t backing_timeouts;      /* NBD requests not answered in time */
  uint64_t backing_corrupt;       /* blocks read back that failed their
                                     checksum */
  uint64_t backing_abandoned;     /* writes and trims given up on once
                                     sent: they may still land */
  uint64_t backing_quarantined_bytes; /* the store they may reach, never
                                     used again (backing.h) */
  uint64_t backing_errors_nospace; /* requests the store refused: full */
  uint64_t backing_errors_io;     /* its other failures, timeouts too */
  uint64_t writeback_limit_left;  /* bytes writeback may still write
                                     (UINT64_MAX: no limit) */
  /* BUDGET: this store's cap and floor (0: none), and with either, the
   * bytes of its objects they count; the budget's floors and their
   * room not used yet (0 without a budget).
   */
  uint64_t cap, floor, quota_bytes, refused_for_budget;
  uint64_t budget_floors, budget_unmet_floors;
};

struct block_store;

/* NULL with errno on failure. */
extern struct block_store *store_create (const struct store_config *config);
extern void store_destroy (struct block_store *store);
/* The store's allocator pool: for store_config.shared_pool. */
extern struct zs_pool *store_pool (struct block_store *store);

/* A device: a named store on another's pool (DEVICES IN A REGION, and
 * the plugin's devices).  algorithm is an enum codec_algorithm (-1 and
 * level INT32_MIN while not yet given); cap and floor are bytes of
 * objects (BUDGET), 0 for none.  Kept in a region as it is: fixed
 * sizes only.
 */
#define DEVICES_MAX 64
#define DEVICE_NAME_MAX 64
struct device_spec {
  char name[DEVICE_NAME_MAX + 1];
  uint64_t size;
  int32_t algorithm;
  int32_t level;
  uint64_t cap, floor;
};

/* DEVICES IN A REGION, above.  store_device_publish: store (made on
 * root's pool in root's region, not yet used) kept as the device spec
 * describes: 0, or -1 with errno (ENOSPC: every slot taken; ENOMEM: no
 * room for the table).  store_device_unpublish: store no longer kept;
 * the caller then destroys it.  store_devices_held: the devices root
 * keeps, at most max, into specs and stores; their count.
 * store_device_adopt: a held store made this process's for a server
 * configured by config (a new owner's, after store_take_over or
 * store_recover of the root): 0, or -1 with why[].
 */
extern int store_device_publish (struct block_store *root,
                                 const struct device_spec *spec,
                                 struct block_store *store);
extern void store_device_unpublish (struct block_store *root,
                                    struct block_store *store);
extern unsigned store_devices_held (struct block_store *root,
                                    struct device_spec *specs,
                                    struct block_store **stores,
                                    unsigned max);
extern int store_device_adopt (struct block_store *store,
                               const struct store_config *config,
                               char *why, size_t why_bytes);

/* HANDOVER, above.  store_hand_over: no call on the store may be
 * running or follow in this process; then hand its region over
 * (region_hand_over).  0, or -1 with errno EINVAL for a store in no
 * region.  store_take_over: the store at the root of a region attached
 * clean, for a server configured by config; NULL with errno EINVAL and
 * the reason in why[] when config describes another device.
 */
extern int store_hand_over (struct block_store *store);

/* A store at the root of a region whose server died (store/recover.c
 * tells how): rebuilt from its block table, for a server configured by
 * config.  Every block whose write returned before the crash reads as
 * it was written; a block whose write was running reads as before or
 * after it (the client sends it again).  NULL with errno and why[] (the
 * region is then left as it is: EINVAL for another device, or damage
 * beyond repair).  One thread, before anything else uses the store.
 */
struct store_recover_result {
  uint64_t blocks;                /* blocks kept, in every store */
  uint64_t devices;               /* devices kept (DEVICES IN A REGION) */
  uint64_t lost_devices;          /* devices whose slot was damaged */
  uint64_t torn_entries;          /* entries put back to what they held */
  uint64_t lost_blocks;           /* entries whose content was not found */
  uint64_t lost_units;            /* packed units not whole */
  uint64_t objects_refused;       /* the allocator's count of those */
  uint64_t pages_given_back;      /* the region's pages no one reached */
  uint64_t nanoseconds;
};
extern struct block_store *store_recover (struct region *region,
                                          const struct store_config *config,
                                          struct store_recover_result *result,
                                          char *why, size_t why_bytes);
extern struct block_store *store_take_over (struct region *region,
                                            const struct store_config *config,
                                            char *why, size_t why_bytes);

/* Byte-range operations; any offset and length within the device.
 * 0, or -1 with errno (ENOSPC when memory is full, ENOMEM, EIO; EAGAIN
 * when no memory was made ready, zs_pool_config.resident_only).  A
 * failed write or zero counts in failed_writes, except one that failed
 * with EAGAIN: its caller may wait for memory and try it again, and
 * counts it with store_failed_write if it gives up, so that the counter
 * counts writes that failed, as zram's, not attempts.
 */
extern int store_read (struct block_store *store, void *buf, uint64_t count,
                       uint64_t offset);
extern int store_write (struct block_store *store, const void *buf,
                        uint64_t count, uint64_t offset);
/* Free whole blocks in the range; partial head and tail are left. */
extern int store_trim (struct block_store *store, uint64_t count,
                       uint64_t offset);
/* Make the range read as zeros: whole blocks become holes (may_trim) or
 * same-filled zero blocks; partial head and tail are rewritten.
 */
extern int store_zero (struct block_store *store, uint64_t count,
                       uint64_t offset, bool may_trim);
extern void store_failed_write (struct block_store *store);

/* Extents: calls add for runs of blocks in [offset, offset+count), in
 * order, each typed STORE_EXTENT_HOLE (never written or trimmed: also
 * zero), STORE_EXTENT_ZERO (stored zeros) or STORE_EXTENT_DATA.
 * Stops early if add returns -1 (and returns -1).
 */
enum store_extent { STORE_EXTENT_DATA, STORE_EXTENT_ZERO, STORE_EXTENT_HOLE };
typedef int (*store_extent_fn) (void *opaque, uint64_t offset,
                                uint64_t length, enum store_extent type);
extern int store_extents (struct block_store *store, uint64_t count,
                          uint64_t offset, store_extent_fn add, void *opaque);

/* Give freed memory back now: free the block table's empty leaves and
 * nodes, drain the allocator's deferred frees and its resident free pages.
 */
extern void store_flush (struct block_store *store);

/* The pages compaction could free now, and (*pages_used) the pool's
 * pages: cheap (no flush), for deciding when to compact.
 */
extern uint64_t store_freeable (struct block_store *store, uint64_t *pages_used);

/* Idle tracking (zram's idle marking).  Each stored block keeps the time
 * of its last read or write, in seconds since the store was created
 * (store_now), and an idle flag that an access clears.  store_mark_idle
 * sets the flag on every stored block not accessed for min_age seconds
 * (0: all of them) and returns how many it marked; keep_going, if not
 * NULL, is asked between pieces of the walk and stops it by returning
 * false.
 */
extern uint32_t store_now (const struct block_store *store);
extern uint64_t store_mark_idle (struct block_store *store, uint32_t min_age,
                                 bool (*keep_going) (void *opaque),
                                 void *opaque);

/* zram's debugfs block_state: every stored block in [first, first+count),
 * in order, until emit returns -1.
 */
struct store_block_state {
  uint64_t block;
  uint32_t atime;                 /* seconds, as store_now */
  bool same, huge, idle;          /* zram's s, h and i flags */
  bool recompressed, incompressible; /* zram's r and n flags */
  bool written_back;              /* zram's w flag */
};
typedef int (*store_block_state_fn) (void *opaque,
                                     const struct store_block_state *state);
extern int store_block_state (struct block_store *store, uint64_t first,
                              uint64_t count, store_block_state_fn emit,
                              void *opaque);

/* How far a long walk over the device has come (recompression, packing,
 * writeback: each result holds one).  walked of to_walk block numbers
 * (the request's range, cut at the device's end) were passed; the walk
 * writes it on its own thread before each keep_going question, which
 * may read it (a progress report: nbdkit-zramctl's progress line).
 */
struct store_progress {
  uint64_t walked, to_walk;
};

/* Recompression (zram's recompress): blocks matching the request are
 * compressed again with the recompression algorithms, in priority order
 * (or only the one of request->priority), and the result kept only if it
 * lands in a smaller size class of the allocator; a block that none
 * shrinks is marked incompressible and skipped from then on, and one
 * already recompressed at a priority is skipped by that priority and
 * lower ones.  A block whose compression fails is skipped.  Each block
 * moves by the move protocol (MOVING A BLOCK): decoded under its stripe
 * lock, compressed with none held, committed if nothing was stored
 * meanwhile.
 */
enum store_recompress_type {
  RECOMPRESS_IDLE = 1,            /* idle blocks */
  RECOMPRESS_HUGE = 2,            /* blocks stored raw */
  RECOMPRESS_HUGE_IDLE = 3,       /* both */
};
struct store_recompress_request {
  enum store_recompress_type type;
  size_t threshold;               /* only objects of at least this size */
  uint64_t max_blocks;            /* at most this many tried; 0: all */
  unsigned priority;              /* 1..recomp_count, or 0: every one */
  uint32_t min_age;               /* only blocks not accessed for this
                                     many seconds (0: any) */
};
struct store_recompress_result {
  uint64_t tried, recompressed, incompressible, bytes_saved;
  struct store_progress progress;
};
/* keep_going (if not NULL) is asked before each block and stops the work
 * by returning false.  0, or -1 with errno (EINVAL: no such priority, no
 * algorithm).
 */
extern int store_recompress (struct block_store *store,
                             const struct store_recompress_request *request,
                             bool (*keep_going) (void *opaque), void *opaque,
                             struct store_recompress_result *result);
/* The name of a recompression priority's algorithm, or NULL. */
extern const char *store_recompress_algorithm (const struct block_store *store,
                                               unsigned priority);

/* Writeback (zram's writeback, to a file or an NBD export: backing.h).
 * Blocks matching the request are written, still compressed, to the
 * backing store, writeback_batch per backing write, and their memory is
 * freed once the write is confirmed; a block written to or trimmed
 * meanwhile stays in RAM (the move protocol).  Reading a written-back
 * block reads it from the backing store (under its stripe lock); writing,
 * trimming or zeroing it frees its place there.  Writeback is not an
 * access.  A packed block is written compressed alone; blocks rewritten
 * in place at the limit stay in RAM.  One writeback runs at a time
 * (writeback_lock, taken before any stripe lock).
 *
 * BACKING WAITS of a write (store_write, store_zero).  A write waits for
 * the backing store when it patches a written-back block (the block is
 * read first) and when mem_limit refuses it and it writes back for room:
 * for writeback_lock (another writer's or the policy's run), for the
 * backing writes and flushes, and for a connection another thread's
 * request holds.  All of them end by one deadline, set once per
 * request, one backing_timeout after its first such wait
 * (backing_wait_deadline, block-store-internal.h), and the runs its
 * writeback releases are freed (trimmed) by the housekeeper, not by the
 * write: a wedged or slow store costs a write one backing_timeout in
 * all, never one per attempt or per kind of wait.
 */
enum store_writeback_type {
  WRITEBACK_IDLE,                 /* idle blocks */
  WRITEBACK_HUGE,                 /* blocks stored raw */
  WRITEBACK_HUGE_IDLE,            /* both */
  WRITEBACK_INCOMPRESSIBLE,       /* no recompression shrank them */
  WRITEBACK_ANY,                  /* any (page_index=, page_indexes=) */
};
struct store_writeback_request {
  enum store_writeback_type type;
  uint64_t first, last;           /* blocks in [first, last] only */
  uint64_t max_blocks;            /* at most this many written; 0: all */
  uint32_t min_age;               /* not accessed for this many seconds */
};
struct store_writeback_result {
  uint64_t blocks, bytes;         /* written back (bytes: compressed) */
  bool limited;                   /* writeback_limit reached */
  bool backing_full;              /* no room in the backing store */
  bool failed;                    /* a backing write failed (EIO) */
  struct store_progress progress;
};
/* 0, or -1 with errno: ENODEV (no backing store), EIO (a backing write
 * failed: those blocks stay in RAM), ENOSPC (backing store or limit
 * full).  result says what was done either way.
 */
extern int store_writeback (struct block_store *store,
                            const struct store_writeback_request *request,
                            bool (*keep_going) (void *opaque), void *opaque,
                            struct store_writeback_result *result);
/* Write back, coldest first (idle blocks, huge ones, then by age), and
 * compact, until the pool's bytes (what mem_limit counts) are at most
 * target, or max_blocks (0: no cap) were written.  The automatic policy
 * (writeback_watermark) and writes refused for memory use it.
 */
extern int store_writeback_until (struct block_store *store, uint64_t target,
                                  uint64_t max_blocks,
                                  bool (*keep_going) (void *opaque),
                                  void *opaque,
                                  struct store_writeback_result *result);
extern bool store_has_backing (const struct block_store *store);
/* The server is stopping: every backing request, in progress or later,
 * fails within 100 ms (backing_cancel), so that no writeback holds up
 * the exit.  Blocks not written back stay where they are.
 */
extern void store_cancel_backing_io (struct block_store *store);
/* Why the calling thread's last write refused for memory could not make
 * room by writeback ("the backing store is full", ...), or NULL: for
 * its log line.
 */
extern const char *store_room_failure (void);
/* zram's writeback_limit at run time: from now on writeback may write
 * bytes more (limited), or any amount (!limited).  -1 with errno ENODEV
 * without a backing store.  Waits for a writeback run in progress.
 */
extern int store_set_writeback_limit (struct block_store *store, bool limited,
                                      uint64_t bytes);

/* Cold packing: idle blocks, up to pack_blocks at a time in block
 * order, compressed together (zstd, level pack_level) into one unit held
 * in allocator objects of at most STORE_PACK_PART bytes each; each
 * block's entry points to (unit, index).  A unit is made only if it
 * takes less than the blocks did, and kept only if it takes less than
 * the blocks that really moved in did (a block written meanwhile stays
 * out; if not all moved in and the unit is not worth it for the others,
 * they are put back and it goes).  A unit is a run of zstd frames of 4
 * blocks (STORE_PACK_FRAME), each decodable alone, compressed with a
 * dictionary the store trained on its own blocks (pack-dictionary.c: a
 * run trains one from a sample of its candidates when the store has
 * none or has been written over once since, a minute apart at least;
 * up to 4 live at once, each freed with its last unit): small frames with a dictionary hold a
 * memory image in as little as 4 times larger frames alone, and a read
 * of a packed block decodes its own frame only, into the decode cache
 * (decode_cache bytes of store-owned slots, made on first use and
 * charged to mem_limit, given up to a write the limit refuses before it
 * is tried again; each unit has two slots it may use, the least
 * recently read is replaced; readers of a unit being decoded wait for
 * that decode, then decode the frames they want that it did not);
 * writing, trimming or zeroing it moves it out; writeback writes it out
 * alone; a unit goes when its last block does.  Blocks move in and out
 * by the move protocol (MOVING A BLOCK).
 */
#define STORE_PACK_DEFAULT 16     /* pack_blocks */
/* pack_level: 14 is the first level at which zstd parses 4-block frames
 * with its optimal parser, short matches and long target lengths (13
 * still gains nothing on 12): on the memory image it holds the packed
 * data in 4.7 % less than 6 for eight times the packing time, spent
 * once per block that goes cold; a frame decodes up to 40 % slower,
 * reads of packed blocks keep their pace (bench/README.md, "Cold
 * packing at level 14").
 */
#define STORE_PACK_LEVEL_DEFAULT 14
#define STORE_PACK_MAX 64         /* pack_blocks at most */
#define STORE_WRITE_BATCH_MAX 16  /* write_batch at most */
#define STORE_PACK_PART 3072
#define STORE_DECODE_CACHE_DEFAULT (2 << 20)  /* decode_cache */
#define STORE_DECODE_CACHE_SLOTS_MAX 65536
struct store_pack_result {
  uint64_t units, blocks, bytes_before, bytes_after;
  struct store_progress progress;
};
/* Packs idle blocks not accessed for min_age seconds, max_blocks at most
 * (0: all); keep_going (if not NULL) is asked before each unit.
 */
extern int store_pack (struct block_store *store, uint64_t max_blocks,
                       uint32_t min_age,
                       bool (*keep_going) (void *opaque), void *opaque,
                       struct store_pack_result *result);
/* Dissolve the units in which fewer than live_percent of the blocks are
 * still packed (the others were rewritten or trimmed: dead bytes): each
 * block left is stored alone again.  Returns the units dissolved.  A
 * unit that could not be (no memory) is tried again after 10 seconds.
 * keep_going (if not NULL) is asked before each unit.
 */
extern uint64_t store_pack_dissolve (struct block_store *store,
                                     unsigned live_percent,
                                     bool (*keep_going) (void *opaque),
                                     void *opaque);

/* The control channel's knobs: mem_limit at run time (-1 with errno
 * ENOSPC if more is held already; nothing changes then, and *held, if
 * not NULL, says the bytes held that refused it), mem_used_max
 * restarted from now, the allocator's per-class table.
 */
extern int store_set_mem_limit (struct block_store *store, uint64_t limit,
                                uint64_t *held);
extern void store_reset_mem_used_max (struct block_store *store);
extern void store_print_classes (struct block_store *store, FILE *fp);
/* The same figures, class by class (zs_class_stats). */
extern unsigned store_class_count (struct block_store *store);
extern int store_class_stats (struct block_store *store, unsigned class_number,
                              struct zs_class_stats *stats);

/* The allocator's reserve of populated pages (zs_pool_reserve_refill):
 * top it up; is it below half?
 */
extern uint64_t store_reserve_refill (struct block_store *store);
extern bool store_reserve_low (struct block_store *store);
/* Swap mode, a full device on a machine out of memory: let the data take
 * the reserve's pages too until it is refilled (zs_pool_open_reserve).
 */
extern void store_open_reserve (struct block_store *store);
/* Swap mode: the heap has bytes ready for the allocator's metadata
 * (zs_pool_metadata_ready).
 */
extern void store_metadata_ready (struct block_store *store, uint64_t bytes);
/* If the store holds no object, give the reserve back (if it has one)
 * and return true: none is needed until the next write.
 */
extern bool store_reserve_release_if_empty (struct block_store *store);

/* Compact the allocator's pool (zs_compact): returns pages freed. */
extern uint64_t store_compact (struct block_store *store);
/* Give back what idle helpers hold beyond the data: the compression
 * contexts no call is using (made again on next use); unless kept
 * resident, the batched writes' scratch, the decode cache's slots and
 * the C library's free arena memory.  After compaction and packing.
 * Returns the bytes the contexts, scratch and slots held.
 */
extern size_t store_release_idle_memory (struct block_store *store);

/* Swap mode: what a write needs beyond the allocator's reserve, made
 * now and kept.  The whole block table (16 bytes a block, charged to
 * mem_limit, as the kernel's zram allocates its table at once); threads
 * compression contexts of the write codec, each with its workspace
 * touched (codec_prepare); and store_release_idle_memory no longer hands
 * the C library's free memory back (it would be faulted in again by the
 * next request).  0, or -1 with errno (ENOSPC: mem_limit cannot hold the
 * table).  Before any request.
 */
extern int store_keep_resident (struct block_store *store, unsigned threads);

/* Exact statistics (drains deferred frees first). */
extern void store_stats (struct block_store *store, struct store_stats *stats);

/* The memory the store counts of its own in stats, wherever it lives:
 * the pool's pages, the reserve, the table, the allocator's metadata,
 * the compression contexts and write buffers, the decode cache.
 */
extern uint64_t store_stats_memory (const struct store_stats *stats);

extern size_t store_raw_threshold (const struct block_store *store);

#endif /* ZRAM_BLOCK_STORE_H */
