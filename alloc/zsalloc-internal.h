/* zsalloc internals: the whole design, then the data structures.
 *
 * SIZE CLASSES
 *   Object sizes 1..4096 map to 256 raw classes, one every 16 bytes
 *   (raw index = (size - 1) / 16, slot size = 16 * (index + 1)).  Each
 *   class picks the zspage length in 1..chain pages that wastes the least
 *   ((pages * 4096) % slot size, ties to fewer pages).  A raw class whose
 *   (pages per zspage, objects per zspage) equal the next larger class's
 *   is merged into it: both raw indexes point at one struct size_class.
 *   The "huge" class is the one with one object per one-page zspage; the
 *   smallest size that lands there is zs_huge_class_size().
 *   Because a slot size 16*k with k odd divides k pages exactly, the least
 *   waste never needs more than 256 objects per zspage: an object index
 *   fits in 8 bits.
 *
 * ZSPAGES
 *   A zspage is a run of 1..16 virtually contiguous pages from the page
 *   source (page-source.h), so every object - even one straddling a page
 *   boundary - is one contiguous range: read_begin returns a direct
 *   pointer and write is one memcpy; no bounce buffer ever.  Its
 *   descriptor (struct zspage) lives outside the pages.  Free slots form
 *   an intrusive list (a free slot's first two bytes hold the next free
 *   index); slots never used yet are handed out in order from
 *   `never_used`, so a zspage needs no free list built at creation.  A
 *   new zspage's pages are populated at once (one MADV_POPULATE_WRITE
 *   call in the page source): RSS follows the pool's pages, not only the
 *   bytes stored.
 *   zspages sit on one of ZS_FULLNESS_GROUPS lists per class by how full
 *   they are; allocation takes from the fullest non-full group (bitmap of
 *   non-empty groups, one count-leading-zeros).  An empty zspage is
 *   unlinked under the class lock and its pages given back to the page
 *   source after the lock is dropped.
 *
 * HANDLES
 *   A handle is the address of an 8-byte cell owned by the allocator
 *   (handle-cell.c).  The cell holds the object's current location:
 *
 *     bits 63..20  zspage descriptor address >> 4 (descriptors are 16-byte
 *                  aligned, as malloc's blocks are, and below 2^48)
 *     bits 19..12  object index in the zspage
 *     bits 11..0   object size - 1, whose top 8 bits are the raw class
 *                  index: free finds its class from the cell alone, with
 *                  no pool-wide lock (seed 000), and the exact size makes
 *                  bytes_stored exact.
 *
 *   Cells come from per-class cell blocks, allocated and freed under the
 *   class lock; a block whose cells are all free again is given back
 *   (handle-cell.c), so cells follow the live objects.
 *
 * MOVING OBJECTS (compact.c)
 *   Compaction moves a class's live objects out of its sparsest zspage
 *   into its fullest ones (fullness groups), until the class has no
 *   zspage to spare (class_freeable_zspages); an emptied zspage is
 *   released after the locks are dropped.  Each slot of a zspage has a
 *   back pointer to its cell (slot_cells, NULL for a free slot), set by
 *   malloc and cleared by free under the class lock, so the mover knows
 *   which slots are live and whose they are.
 *   Each zspage is guarded against moves by a move lock: one of the
 *   pool's ZS_MOVE_LOCKS writer-preferring rwlocks, each on its own cache
 *   line, picked by a hash of the zspage descriptor's address
 *   (zspage_move_lock).  Readers of different zspages thus take
 *   different locks, as zsmalloc's per-zspage lock, without descriptors
 *   that must outlive their zspage: a lock is never freed with one.
 *   The protocol:
 *   - one mover at a time (pool->compact_lock).  Under the class lock it
 *     picks the sparsest zspage as source and pins it (a pinned zspage
 *     that empties stays listed, in the "empty" group, instead of being
 *     released by the freer); it drops the class lock, takes the source's
 *     move lock for writing - waiting, never try-locking, so steady reads
 *     cannot starve it: the lock prefers writers - then the class lock
 *     again.  It copies each live object into the class's fullest other
 *     zspage, sets the back pointer, rewrites the cell with one atomic
 *     store (the caller's handle, the cell's address, never changes), and
 *     puts the old slot back.  It unpins the source, drops both locks,
 *     and releases the source if it emptied; so an access waits for one
 *     zspage's moves at most, and only if its object is in that zspage.
 *     A destination needs no move lock: the mover writes only into its
 *     free slots, which nobody reads.
 *   - readers (zs_read_begin..zs_read_end) and zs_write load the cell,
 *     take the move lock of the zspage it names for reading, and load the
 *     cell again: if it names another zspage the object moved in
 *     between, so they unlock and start over.  Once the cell is seen
 *     under the lock, the object cannot move and its zspage cannot be
 *     released (its owner is the one reading it), so the descriptor is
 *     only dereferenced then.  A write right after zs_malloc lands
 *     where the object is by then.
 *   - malloc, free (immediate or a batch's drain) and zs_resize take only
 *     the class lock and re-read the cell under it, so a deferred free
 *     frees wherever the object lives by then (never where it lived when
 *     the free was queued: compaction may have moved it since);
 *   - the class is found from the cell's size bits, which a move never
 *     changes, before any lock is taken.
 *   zs_malloc compacts the pool once before it refuses for the limit.
 *   A thread holds at most one zs_read_begin at a time, and none when it
 *   calls zs_malloc or zs_compact: with a mover waiting on a lock the
 *   thread already reads under, a second read or a compaction of its own
 *   would wait for itself.

 * FREES: IMMEDIATE OR BATCHED (free-batch.c, seed 002)
 *   In batched mode zs_free appends the handle to one of the pool's
 *   ZS_FREE_BATCHES batches (ZS_FREE_BATCH_SIZE handles each) under that
 *   batch's own lock: no pool or class lock.  Each thread prefers one
 *   batch (a thread-local hint) and moves to the next when its batch is
 *   busy, so threads rarely meet on a batch lock.  A full batch is
 *   counting-sorted by class and drained holding each class lock once per
 *   run of same-class handles; emptied zspages are released after the
 *   class lock is dropped.
 *   Memory still comes back promptly: zs_pool_flush drains every batch
 *   and purges the page source's resident free runs (page-source.h),
 *   statistics flush first, and an allocation about to be refused for the
 *   memory limit flushes and retries.
 *
 * WHO OWNS WHAT
 *   The pool owns everything it uses: classes, zspages, cells, batches,
 *   page chunks, from zs_pool_create to zs_pool_destroy.  Threads own
 *   nothing of it: no pthread key, no thread-exit hook, so a thread that
 *   exits after zs_pool_destroy - or after the program that holds the
 *   allocator has been unloaded (nbdkit's connection threads are
 *   detached and may outlive .unload) - runs no allocator code.  The only
 *   thread-local is the batch hint, a plain integer.
 *
 * MEMORY LIMIT
 *   The limit counts everything the pool holds that grows with what is
 *   stored: zspage pages and descriptors, handle-cell blocks, and what the
 *   pool's user charges with zs_pool_charge (the plugin's block table).
 *   One atomic word, the limit account, holds those bytes (low 48 bits)
 *   and the zspages in transit (high 16 bits): reserved but not yet listed
 *   in their class, or unlisted but their pages not yet returned.  A new
 *   zspage's bytes are reserved and the zspage put in transit with one
 *   compare-and-swap before it is created, so the limit is never
 *   exceeded, even for a moment, by racing allocators.  An allocation
 *   decides with its class lock held and its class seen without a free
 *   slot; if the limit refuses the pages it drains the batches once, and
 *   while the same snapshot of the account shows zspages in transit it
 *   yields and looks again.  So a refusal (ENOSPC) is true when it is
 *   made: every page is in a listed zspage and the class has no slot.
 *   zs_pool_set_mem_limit changes the limit under limit_lock held for
 *   writing, after checking the account; every charge checks the limit
 *   and swaps the account under it held for reading.  So a limit the
 *   account refuses is never in force, and a charge checked against the
 *   old limit never lands after a new, lower one took effect.  Only
 *   charges take it (limit_add), never the discharges, which only lower
 *   the account; it is a leaf (taken with a class lock held, nothing
 *   taken under it).
 *   With limit_pages_only the account holds the zspages' pages alone, as
 *   the kernel's zram counts its mem_limit: descriptors, cell blocks and
 *   the user's charges are counted in the stats only (metadata_bytes,
 *   the user's own), and the reserve not at all - its pages count once
 *   a zspage takes them, so giving them up makes no room and is not
 *   tried, and in resident_only the data's room is the whole limit.
 *
 * THE RESERVE (page-source.h)
 *   zs_pool_reserve_refill maps populated chunks onto the page source's
 *   reserve.  Each is counted against the limit (unless it counts pages
 *   only) and put in transit in one
 *   compare-and-swap before it is mapped, counted in reserve_charged
 *   (pages) once it is on the stack, then taken out of transit: a refusal
 *   meanwhile waits for it like for a zspage.  The page source counts the
 *   reserve's pages, spare runs of chunks taken from it included
 *   (page_source_reserve_pages), and never reads low; when it reads below
 *   reserve_charged - zspages took the pages, whose own reservations
 *   count them, or they were dropped - reserve_settle gives the difference
 *   back to the limit.  zspage_reserve settles before it refuses, and an
 *   allocation the limit refuses (a zspage or a cell block) first gives up
 *   reserve pages: the reserve never costs the data room under the
 *   limit - except in resident_only, where the reserve's pages are the
 *   only ones a write may take: there the data's room is the limit less
 *   the whole reserve (what zspages took of it and no refill has put
 *   back yet counts as reserved: reserve_missing_room), and a refusal is
 *   ENOSPC.  Opened (zs_pool_open_reserve),
 *   the data's charges may also count the reserve's pages they can take
 *   (those still held and charged) as room: the data may fill the whole
 *   limit, taking pages that are resident already, so nothing more is
 *   asked of the machine; the account may then read above the limit by
 *   at most the reserve until the zspages that took its pages settle it.
 *   The refill never counts that room, and closes the reserve once it is
 *   whole again.
 *
 * LOCKS, what each guards, and the ONE lock order
 *   pool->compact_lock         there is one mover at a time, and the
 *                              pinned flag of its source.
 *   pool->move_locks[i]        read: every access to the bytes of an object
 *                              in a zspage hashed to i; write: the mover
 *                              while it empties such a zspage (MOVING
 *                              OBJECTS).
 *   free_batch->lock           that batch's handles and count.
 *   size_class->lock           points to the class's own mutex (lock=class)
 *                              or to pool->pool_lock (lock=pool); guards the
 *                              class's fullness lists, every zspage's free
 *                              list, in-use count, group, pinned flag and
 *                              back pointers, the class's counters and its
 *                              cell blocks.
 *   page_source->purge_lock    one purge at a time (page_source_purge):
 *                              in resident_only its holder is the only
 *                              thread that unmaps chunks.
 *   page_source->lock          the chunk lists of one run length.
 *   pool->limit_lock           read: a charge's check of the limit and its
 *                              swap of the account; write: a change of
 *                              the limit (MEMORY LIMIT).  A leaf: taken
 *                              with a class lock held or none, nothing
 *                              taken under it.
 *
 *   Order: compact_lock -> move lock -> size_class->lock, and
 *   free_batch->lock -> size_class->lock.  No path holds two move locks,
 *   a move lock and a batch lock, or two batch locks; a mover holds no
 *   other lock while it waits for a move lock.
 *   page_source locks are never taken while a class lock is held
 *   (zspages are created and released outside the class lock); among
 *   them: purge_lock -> a run list's lock -> reserve_lock.
 *   No path holds two class locks.  Pool-wide counters are atomics.
 */

#ifndef ZSALLOC_INTERNAL_H
#define ZSALLOC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "zsalloc.h"
#include "page-source.h"
#include "region.h"

#define ZS_SIZE_CLASS_DELTA 16
#define ZS_RAW_CLASSES (ZS_MAX_OBJECT_SIZE / ZS_SIZE_CLASS_DELTA) /* 256 */
#define ZS_MAX_OBJS_PER_ZSPAGE 256
#define ZS_FREE_BATCH_SIZE 512   /* one page of handles, as the kernel's */
#define ZS_FREE_BATCHES 16       /* batches per pool, shared by threads */
#define ZS_NO_OBJECT 0xffff      /* end of a zspage's free list */
#define ZS_GROUP_FULL (ZS_FULLNESS_GROUPS - 1)
#define ZS_MOVE_LOCK_BITS 8      /* 256 move locks per pool */
#define ZS_MOVE_LOCKS (1u << ZS_MOVE_LOCK_BITS)

/* Cell encoding, see HANDLES above. */
#define CELL_SIZE_BITS 12
#define CELL_INDEX_BITS 8
#define CELL_ZSPAGE_SHIFT (CELL_SIZE_BITS + CELL_INDEX_BITS)
/* 16, malloc's own alignment: a stricter one made glibc's memalign leave a
 * free remnant of about 100 bytes beside each descriptor, one a zspage,
 * that nothing else reused (0.4 MiB of a 57 MiB server holding a 256 MiB
 * memory image).  44 bits of address >> 4 reach 2^48, the most a user
 * address has.
 */
#define ZSPAGE_ALIGN 16

struct size_class;

/* One zspage's descriptor.  Every field is guarded by its class's lock,
 * except base, chunk and class_index which never change after creation.
 */
struct zspage {
  struct zspage *prev, *next;     /* fullness group list links */
  unsigned char *base;            /* first byte of the page run */
  struct page_chunk *chunk;       /* where the run came from */
  uint16_t inuse;                 /* live objects */
  uint16_t free_head;             /* first recycled free slot or ZS_NO_OBJECT */
  uint16_t never_used;            /* slots >= this were never handed out */
  uint8_t group;                  /* fullness group it is linked on */
  bool pinned;                    /* the mover's source: stays listed when
                                     it empties (MOVING OBJECTS) */
  /* Each slot's cell (the back pointer compaction moves objects by), NULL
   * for a free slot: objs_per_zspage of them.
   */
  _Atomic uint64_t *slot_cells[];
} __attribute__ ((aligned (ZSPAGE_ALIGN)));

/* A block of handle cells; see handle-cell.c.  Guarded by its class's
 * lock.  CELL_BLOCK_BYTES, aligned to its size: each class in use holds
 * one block at least (116 classes after packing a memory image: 464 KiB
 * in blocks of a page), and a smaller block is given back sooner as its
 * class shrinks (the image's metadata: 1.56 MB with blocks of a page,
 * 1.33 with 1 KiB).
 */
#define CELL_BLOCK_BYTES 1024
struct cell_block {
  struct cell_block *prev, *next;         /* the class's blocks with room */
  struct cell_block *all_prev, *all_next; /* all the class's blocks */
  _Atomic uint64_t *free_cells;           /* threaded through free cells */
  unsigned free_count;
  _Atomic uint64_t cells[];
};

#define CELLS_PER_BLOCK \
  ((CELL_BLOCK_BYTES - offsetof (struct cell_block, cells)) / sizeof (uint64_t))

static inline struct cell_block *
block_of (_Atomic uint64_t *cell)
{
  return (struct cell_block *) ((uintptr_t) cell & ~(uintptr_t) (CELL_BLOCK_BYTES - 1));
}

struct size_class {
  pthread_mutex_t *lock;          /* own_lock or the pool lock, see above */
  /* Immutable after pool creation: */
  unsigned size;                  /* slot size */
  unsigned min_size;              /* smallest object size served */
  unsigned pages_per_zspage;
  unsigned objs_per_zspage;
  unsigned index;                 /* raw index of the largest size served */
  /* Guarded by *lock: */
  struct zspage *groups[ZS_FULLNESS_GROUPS]; /* list heads */
  uint64_t group_counts[ZS_FULLNESS_GROUPS];
  uint32_t nonempty_groups;       /* bit g set: groups[g] != NULL */
  uint64_t zspages;
  uint64_t objs_used;
  uint64_t bytes_stored;
  struct cell_block *cell_blocks_with_room; /* see handle-cell.c */
  struct cell_block *cell_blocks; /* all of them */
  uint64_t cell_blocks_count;
  pthread_mutex_t own_lock;
} __attribute__ ((aligned (64)));

/* One of the pool's move locks, alone on its cache line so that readers
 * of zspages hashed to different locks share no line.
 */
struct move_lock {
  pthread_rwlock_t lock;
} __attribute__ ((aligned (64)));

/* A batch of deferred frees, one of the pool's ZS_FREE_BATCHES. */
struct free_batch {
  pthread_mutex_t lock;           /* guards count and handles */
  unsigned count;
  zs_handle_t handles[ZS_FREE_BATCH_SIZE];
} __attribute__ ((aligned (64)));

struct zs_pool {
  struct zs_pool_config config;
  unsigned huge_class_size;
  unsigned distinct_classes;
  struct size_class *class_by_index[ZS_RAW_CLASSES]; /* raw index -> class */
  struct size_class *classes;     /* distinct classes, increasing size */
  struct page_source pages;
  pthread_mutex_t pool_lock;      /* the class lock of every class in
                                     lock=pool mode; unused otherwise */

  struct free_batch *batches;     /* ZS_FREE_BATCHES of them, owned by
                                     the pool from create to destroy */
  struct move_lock *move_locks;   /* ZS_MOVE_LOCKS of them, see MOVING
                                     OBJECTS */
  pthread_mutex_t compact_lock;   /* one mover at a time */

  _Atomic uint64_t mem_limit;     /* config.mem_limit, changeable at run
                                     time (zs_pool_set_mem_limit) */
  pthread_rwlock_t limit_lock;    /* read: a charge's check of mem_limit
                                     and its compare-and-swap of the
                                     account; write: a change of mem_limit,
                                     its check and its store (MEMORY
                                     LIMIT) */
  /* Pool-wide counters: atomics, no lock. */
  _Atomic uint64_t limit_account; /* bytes counted against the limit and
                                     zspages in transit, see MEMORY LIMIT */
  _Atomic uint64_t pages_used;    /* pages in zspages (statistics) */
  _Atomic uint64_t pages_compacted; /* freed by compaction, ever */
  _Atomic uint64_t pages_used_max;
  _Atomic uint64_t limit_hits;
  _Atomic uint64_t metadata_bytes;
  _Atomic uint64_t reserve_charged; /* reserve pages counted against the
                                       limit (see THE RESERVE) */
  _Atomic uint64_t reserve_refills; /* chunks added to the reserve, ever */
  atomic_bool reserve_open;       /* resident_only: the data may take the
                                     reserve's pages past the limit's room
                                     for it (zs_pool_open_reserve), until
                                     a refill makes the reserve whole */
  /* resident_only: bytes of metadata (descriptors, cell blocks) the heap
   * has ready, touched, until the caller says again
   * (zs_pool_metadata_ready); an allocation that would go past it fails
   * with EAGAIN, as a page miss does.  metadata_ready_given: the last
   * amount said, for zs_pool_reserve_low.
   */
  _Atomic int64_t metadata_allowance;
  _Atomic uint64_t metadata_ready_given;
  _Atomic uint64_t metadata_misses; /* allocations refused for it, ever */
};

/* pool.c: take bytes of the metadata allowance before a metadata
 * allocation (always true unless resident_only); false with errno EAGAIN.
 * A descriptor or cell block taken from the heap may take its alignment
 * too: callers ask for the worst case.
 */
extern bool metadata_take (struct zs_pool *pool, size_t bytes);

/* pool.c: every lock of the pool made anew (creation, take-over). */
extern void pool_locks_init (struct zs_pool *pool);

/* The limit account (see MEMORY LIMIT). */
#define LIMIT_TRANSIT ((uint64_t) 1 << 48)   /* one zspage in transit */
static inline uint64_t
account_bytes (uint64_t account)
{
  return account & (LIMIT_TRANSIT - 1);
}
static inline uint64_t
account_transit (uint64_t account)
{
  return account / LIMIT_TRANSIT;
}
/* The bytes of a zspage descriptor of the class (with its back
 * pointers, rounded up to its alignment).
 */
static inline size_t
zspage_descriptor_bytes (const struct size_class *class)
{
  size_t bytes = sizeof (struct zspage)
    + class->objs_per_zspage * sizeof (_Atomic uint64_t *);
  return (bytes + ZSPAGE_ALIGN - 1) / ZSPAGE_ALIGN * ZSPAGE_ALIGN;
}

/* What a zspage of the class counts against the limit: its pages, and
 * its descriptor unless the limit counts pages only.
 */
static inline uint64_t
zspage_charge (const struct zs_pool *pool, const struct size_class *class)
{
  return (uint64_t) class->pages_per_zspage * ZS_PAGE_SIZE
    + (pool->config.limit_pages_only ? 0 : zspage_descriptor_bytes (class));
}

/* pool.c: count bytes against the limit (false: it would be exceeded),
 * and give them back; the _metadata pair, for what is not a zspage's
 * page (cells, the user's charges), does nothing when the limit counts
 * pages only.
 */
extern bool limit_charge (struct zs_pool *pool, uint64_t bytes);
extern void limit_discharge (struct zs_pool *pool, uint64_t bytes);
extern bool limit_charge_metadata (struct zs_pool *pool, uint64_t bytes);
extern void limit_discharge_metadata (struct zs_pool *pool, uint64_t bytes);

/* size-class.c */
extern int size_classes_init (struct zs_pool *pool);
extern void size_classes_destroy (struct zs_pool *pool);
static inline unsigned
raw_class_index (size_t size)
{
  return (size - 1) / ZS_SIZE_CLASS_DELTA;
}
static inline struct size_class *
class_for_size (struct zs_pool *pool, size_t size)
{
  return pool->class_by_index[raw_class_index (size)];
}

/* Cell encoding. */
static inline uint64_t
cell_encode (struct zspage *zspage, unsigned index, size_t size)
{
  return ((uint64_t) (uintptr_t) zspage / ZSPAGE_ALIGN) << CELL_ZSPAGE_SHIFT
    | (uint64_t) index << CELL_SIZE_BITS | (uint64_t) (size - 1);
}
static inline struct zspage *
cell_zspage (uint64_t cell)
{
  return (struct zspage *) (uintptr_t) ((cell >> CELL_ZSPAGE_SHIFT) * ZSPAGE_ALIGN);
}
static inline unsigned
cell_object_index (uint64_t cell)
{
  return (cell >> CELL_SIZE_BITS) & ((1u << CELL_INDEX_BITS) - 1);
}
static inline size_t
cell_object_size (uint64_t cell)
{
  return (cell & ((1u << CELL_SIZE_BITS) - 1)) + 1;
}
static inline uint64_t
handle_load (zs_handle_t handle)
{
  return atomic_load_explicit ((_Atomic uint64_t *) handle, memory_order_acquire);
}
/* The class of a handle's object.  No lock: the size bits of a cell keep
 * their class while the object lives, whatever moves or resizes it.
 */
static inline struct size_class *
class_of_handle (struct zs_pool *pool, zs_handle_t handle)
{
  return class_for_size (pool, cell_object_size (handle_load (handle)));
}

/* handle-cell.c: under the class lock. */
extern _Atomic uint64_t *cell_alloc (struct zs_pool *pool, struct size_class *class);
extern void cell_release (struct zs_pool *pool, struct size_class *class,
                          _Atomic uint64_t *cell);
extern void cells_destroy (struct zs_pool *pool, struct size_class *class);

/* zspage.c */
extern struct zspage *zspage_create (struct zs_pool *pool, struct size_class *class);
extern void zspage_release (struct zs_pool *pool, struct size_class *class,
                            struct zspage *zspage);
extern void zspage_unreserve (struct zs_pool *pool, struct size_class *class);
extern struct zspage *class_fullest_zspage (struct size_class *class);
extern struct zspage *class_fullest_zspage_except (struct size_class *class,
                                                   const struct zspage *except);
extern struct zspage *class_sparsest_zspage (struct size_class *class);

/* The move lock of a zspage (MOVING OBJECTS): a multiplicative hash of
 * its descriptor's address, whose low bits are always zero.
 */
static inline pthread_rwlock_t *
zspage_move_lock (struct zs_pool *pool, const struct zspage *zspage)
{
  uint64_t key = (uintptr_t) zspage / ZSPAGE_ALIGN;
  return &pool->move_locks[(key * 0x9e3779b97f4a7c15ull)
                           >> (64 - ZS_MOVE_LOCK_BITS)].lock;
}

/* compact.c */
extern int move_locks_init (struct zs_pool *pool);
extern void move_locks_destroy (struct zs_pool *pool);
/* compact.c: under the class lock. */
extern uint64_t class_freeable_zspages (const struct size_class *class);
extern void zspage_insert (struct size_class *class, struct zspage *zspage);
extern unsigned zspage_take_object (struct size_class *class, struct zspage *zspage);
extern bool zspage_put_object (struct size_class *class, struct zspage *zspage,
                               unsigned index);
extern bool zspage_unpin (struct size_class *class, struct zspage *zspage);
extern void class_destroy_zspages (struct zs_pool *pool, struct size_class *class);

/* pool.c: free one object; the class lock is held.  Returns the zspage
 * if it became empty (already unlinked: release it after unlocking).
 */
extern struct zspage *object_free_locked (struct zs_pool *pool,
                                          struct size_class *class,
                                          zs_handle_t handle);

/* free-batch.c */
extern int free_batches_init (struct zs_pool *pool);
extern void free_batches_destroy (struct zs_pool *pool);
extern void free_batch_add (struct zs_pool *pool, const zs_handle_t *handles,
                            unsigned n);
extern void free_handles (struct zs_pool *pool, zs_handle_t *handles, unsigned n);
extern uint64_t free_batches_pending (struct zs_pool *pool);

#endif /* ZSALLOC_INTERNAL_H */
