/* The block store's private parts, shared by its files, in layers that
 * only call down (a file calls the files of its own layer and below,
 * never above):
 *
 *   the store       block-store.c    create/destroy, limits, memory,
 *                                    statistics (calls any layer)
 *                   recover.c        a region's stores rebuilt after a
 *                                    crash
 *                   store-devices.c  the devices a region's root keeps
 *                                    (DEVICES IN A REGION)
 *   requests        block-request.c  read, write, patch, trim, zero,
 *                                    extents, making room
 *   movers          block-batch.c    batched writes (returns what it
 *                                    could not store: the request layer
 *                                    writes it again)
 *                   pack.c           cold packing and dissolving
 *                   recompress.c     recompression
 *                   writeback.c      writeback and read-back
 *   walks           block-walks.c    idle marking, block_state, candidates
 *   encoding        block-encode.c   a block encoded and decoded (the
 *                                    zeroed overlay too)
 *                   unit-decode.c    a packed unit's blocks decoded,
 *                                    through the decode cache
 *   entries         block-entry.c    entries loaded and stored, their
 *                                    accounting, the move protocol
 *   units           unit.c           a packed unit freed
 *                   decode-cache.c   the decode cache's slots
 *   services        block-table.c, codec.c, backing.c (its transports
 *                   and space map), the allocator (alloc/)
 *
 * The design, the locks and their one order are in block-store.h.
 */

#ifndef ZRAM_BLOCK_STORE_INTERNAL_H
#define ZRAM_BLOCK_STORE_INTERNAL_H

#include "block-store.h"
#include "backing.h"
#include "monotonic.h"

/* A packed unit (cold packing, block-store.h): the compressed bytes of
 * count blocks, in parts of at most STORE_PACK_PART bytes: zstd frames
 * of STORE_PACK_FRAME blocks each (the last may be shorter), one after
 * the other, each decoded alone with the unit's dictionary.  live counts
 * the entries that point to it; the one that drops it to 0 frees it.
 * Everything else is fixed once the unit is made.  Aligned so that an
 * entry holds its address and a block's index in one word.
 */
struct pack_unit {
  _Atomic uint32_t live;
  uint32_t dissolve_retry;        /* under units_lock: not before this
                                     store_clock second (a dissolve that
                                     failed for memory; 0: any time) */
  struct pack_unit *prev, *next;  /* store->units, under units_lock */
  uint32_t length;                /* compressed bytes */
  uint8_t count;                  /* blocks */
  uint8_t parts;                  /* allocator objects */
  uint8_t dictionary;             /* store->dictionaries[dictionary - 1]
                                     compressed it; 0: none */
  uint64_t id;                    /* never reused: the decode cache's key */
  /* parts handles, then the blocks packed: the first one's number, then
   * each next one's distance from the one before, 16 bits each (a
   * unit's blocks ascend, at most UNIT_BLOCK_GAP_MAX apart: pack_group),
   * then each frame's compressed length but the last's, 16 bits each.
   * 44 bytes for 16 blocks in 4 parts where a number each took 128:
   * with the descriptor's alignment, 128 bytes a unit instead of 256.
   * Read by unit_blocks_get and unit_frame_at.
   */
  uint64_t words[];
} __attribute__ ((aligned (STORE_PACK_MAX)));

#define UNIT_BLOCK_GAP_MAX UINT16_MAX
/* Blocks a frame of a unit holds: a random read of a packed block
 * decodes this many at most.  With a dictionary trained on the store's
 * blocks, frames of 4 blocks hold a memory image in as little as frames
 * of 16 without one, decoded 2.5 times faster than a 16-block unit read
 * to the block (bench/README.md, "Frames and dictionaries").
 */
#define STORE_PACK_FRAME 4
/* A frame's length fits 16 bits (zstd's worst case adds well under 1
 * KiB), and a unit's frames a slot's 32-bit mask (struct unit_cache).
 */
_Static_assert (STORE_PACK_FRAME * STORE_BLOCK_SIZE + 1024 <= UINT16_MAX,
                "a frame's length in 16 bits");
_Static_assert (STORE_PACK_MAX / STORE_PACK_FRAME <= 32, "frames in a mask");

static inline unsigned
unit_frames (unsigned count)
{
  return (count + STORE_PACK_FRAME - 1) / STORE_PACK_FRAME;
}

/* What a unit's descriptor takes (rounded up to its alignment). */
static inline size_t
unit_bytes (unsigned parts, unsigned count)
{
  size_t bytes = sizeof (struct pack_unit) + (parts + 1) * sizeof (uint64_t)
    + (count ? count - 1 : 0) * sizeof (uint16_t)
    + (count ? unit_frames (count) - 1 : 0) * sizeof (uint16_t);
  return (bytes + STORE_PACK_MAX - 1) / STORE_PACK_MAX * STORE_PACK_MAX;
}

/* A unit's parts (allocator handles) and the blocks packed in it. */
static inline zs_handle_t *unit_parts (struct pack_unit *unit)
{
  return (zs_handle_t *) unit->words;
}
static inline const zs_handle_t *unit_parts_const (const struct pack_unit *unit)
{
  return (const zs_handle_t *) unit->words;
}
/* The unit's blocks in order, into blocks (room for unit->count). */
static inline void
unit_blocks_get (const struct pack_unit *unit, uint64_t *blocks)
{
  const uint16_t *gap = (const uint16_t *) (unit->words + unit->parts + 1);
  blocks[0] = unit->words[unit->parts];
  for (unsigned i = 1; i < unit->count; i++)
    blocks[i] = blocks[i - 1] + gap[i - 1];
}
/* Set them (ascending, gaps of at most UNIT_BLOCK_GAP_MAX), and the
 * frames' lengths (unit_frames of them, adding up to unit->length).
 */
static inline void
unit_layout_set (struct pack_unit *unit, const uint64_t *blocks,
                 const uint32_t *frame_lengths)
{
  uint16_t *gap = (uint16_t *) (unit->words + unit->parts + 1);
  unit->words[unit->parts] = blocks[0];
  for (unsigned i = 1; i < unit->count; i++)
    gap[i - 1] = blocks[i] - blocks[i - 1];
  uint16_t *frame = gap + unit->count - 1;
  for (unsigned i = 0; i + 1 < unit_frames (unit->count); i++)
    frame[i] = frame_lengths[i];
}
/* Where frame number (0..unit_frames - 1) starts in the unit's bytes,
 * and its length.
 */
static inline void
unit_frame_at (const struct pack_unit *unit, unsigned number, size_t *start,
               size_t *length)
{
  const uint16_t *frame = (const uint16_t *) (unit->words + unit->parts + 1)
    + unit->count - 1;
  size_t at = 0;
  for (unsigned i = 0; i < number; i++)
    at += frame[i];
  *start = at;
  *length = number + 1 < unit_frames (unit->count) ? frame[number]
    : unit->length - at;
}

/* A trained zstd dictionary the store's units are compressed with
 * (cold packing, block-store.h), where the store lives (its region, or
 * the C heap).  units counts the units made with it, plus one while it
 * is the store's current one; the drop to 0 frees it.  Its decoder is
 * this process's (made on first use; a new owner makes its own), freed
 * with it.
 */
struct pack_dictionary {
  _Atomic uint32_t units;
  uint32_t size;                  /* bytes */
  uint32_t crc;                   /* CRC-32C of bytes: recovery checks it */
  unsigned char bytes[];
};

#define UNIT_INDEX_MASK ((uint64_t) STORE_PACK_MAX - 1)
/* Dictionaries a store holds at most (the current one and those older
 * units still use); packing goes on without one when all are in use.
 */
#define STORE_DICTIONARIES 4
/* A dictionary's bytes at most, and the blocks sampled to train it
 * (spread over the run's candidates).  On the memory image: 112 KiB
 * trained from 1,024 blocks in 0.2 s makes 4-block frames 0.4 %
 * bigger than 16-block frames alone; 8,192 samples gain 0.5 % more in
 * six times the time (bench/README.md, "Frames and dictionaries").
 */
#define STORE_DICTIONARY_BYTES (112 << 10)
#define STORE_DICTIONARY_SAMPLES 1024
/* Fewer candidates than this: no dictionary is trained (a few blocks
 * teach it nothing a frame could not learn alone).
 */
#define STORE_DICTIONARY_SAMPLES_MIN 64
/* A store makes a dictionary at most once in this many seconds: a
 * small device written fast turns over in a fraction of a second, and
 * training takes 0.1 s of a core.
 */
#define STORE_DICTIONARY_SECONDS 60

/* A decoded unit, or some of its frames, kept for the next read of
 * one of its blocks (the decode cache: decode_cache= bytes of them).
 * Owned by the store (no thread-local buffers: a thread that exits after
 * the plugin is unloaded must run none of its code);
 * a reader that finds a unit's two slots busy decodes into a buffer of
 * its own.  A slot's data is charged to the pool (mem_limit) and kept
 * only for a live unit: freed when the unit goes (unit_destroy), when a
 * decode into it fails, when not read for a housekeeping round
 * (store_decode_cache_sweep; kept while the store is to stay resident),
 * and given up to writes and to a lower mem_limit (decode_cache_trim).
 * Whenever its lock is free, data != NULL means id names a live unit.
 */
struct unit_cache {
  pthread_mutex_t lock;           /* guards frames and data, and changes of
                                     id; held for a decode into the slot */
  _Atomic uint64_t id;            /* the unit held or being decoded (0:
                                     none); read without the lock by
                                     readers looking for their unit */
  uint32_t frames;                /* of the unit decoded: frame i's bit */
  unsigned char *data;            /* pack_blocks blocks, made (and charged
                                     to the pool) on first use, freed as
                                     said above */
  _Atomic uint64_t used;          /* unit_cache_clock at its last read:
                                     which of two slots to replace */
};

/* Batched writes (block-batch.c) run STORE_WRITE_SLOTS at once at most. */
#define STORE_WRITE_SLOTS 16

/* The store.  With a region (store_config.pool.region) it lives there,
 * with everything it points to, except what a new owner makes anew
 * (HANDOVER in block-store.h): the codecs, the decode cache's slots, the
 * write scratch, the backing store, and every lock's state.
 */
struct block_store {
  uint64_t size;
  uint64_t blocks;
  struct region *region;          /* where it lives; NULL: the C heap */
  struct zs_pool *pool;
  bool shares_pool;               /* another store's pool (a server's
                                     devices, store_config.shared_pool):
                                     its objects are freed one by one */
  /* A region's root: the table of the devices it holds (DEVICES IN A
   * REGION in block-store.h), made at the first publish; NULL: none.
   * Written by the thread that publishes, atomically, after the table.
   */
  struct store_devices *_Atomic devices;
  bool limit_pages_only;          /* how the pool counts mem_limit
                                     (zs_pool_config): a new owner must
                                     count it the same way */
  /* codecs[0] compresses every write; codecs[1..recomp_count], the
   * recompression algorithms by priority, only recompress.  A block's
   * priority bits say which one decodes it.
   */
  struct codec *codecs[1 + STORE_RECOMP_MAX];
  enum codec_algorithm algorithms[1 + STORE_RECOMP_MAX];
  unsigned recomp_count;
  size_t raw_threshold;           /* compressed size stored raw from here */
  struct block_table table;
  pthread_mutex_t stripes[STORE_STRIPES]; /* see LOCKS in block-store.h */
  atomic_bool keep_resident;      /* store_keep_resident ran */
  unsigned write_batch;           /* 1..STORE_WRITE_BATCH_MAX (1: no batches) */
  /* Where a batched write (block-batch.c) compresses its blocks: slots
   * borrowed like codec contexts, never waited for (a write that finds
   * every slot busy goes block by block), each made on first use and
   * freed by store_release_idle_memory (store_keep_resident makes and
   * touches them all, and keeps them).  No lock: a slot's busy flag is
   * its owner's.
   */
  struct write_scratch {
    atomic_bool busy;
    _Atomic (unsigned char *) bytes; /* STORE_WRITE_BATCH_MAX blocks */
  } write_scratch[STORE_WRITE_SLOTS];
  _Atomic uint64_t write_scratch_bytes;

  /* Counters, atomics: no lock. */
  _Atomic uint64_t stored_blocks; /* entries not empty */
  _Atomic uint64_t compr_bytes;   /* bytes of stored objects */
  _Atomic uint64_t same_blocks;
  _Atomic uint64_t raw_blocks;
  _Atomic uint64_t raw_blocks_since;
  _Atomic uint64_t failed_reads;
  _Atomic uint64_t failed_writes;
  _Atomic uint64_t invalid_io;
  _Atomic uint64_t notify_free;
  _Atomic uint64_t reads;
  _Atomic uint64_t writes;
  _Atomic uint64_t compact_ns;    /* time spent in store_compact */
  /* Cold packing: its codec (zstd, its own contexts, sized for units),
   * the decode cache, the counters.
   */
  struct codec *pack_codec;
  pthread_mutex_t units_lock;     /* guards units, and every unit's links
                                     and dissolve_retry; a leaf */
  struct pack_unit *units;        /* newest first */
  unsigned pack_blocks;           /* blocks per unit at most */
  struct unit_cache *unit_cache;
  unsigned unit_cache_count;      /* slots: decode_cache / a unit's bytes */
  _Atomic uint64_t unit_cache_clock;
  _Atomic uint64_t unit_cache_swept; /* unit_cache_clock at the last
                                     store_decode_cache_sweep */
  _Atomic uint64_t decode_cache_bytes;
  _Atomic uint64_t decode_cache_hits, decode_cache_misses;
  _Atomic uint64_t unit_ids;
  /* The dictionaries units were compressed with (struct pack_dictionary;
   * a unit names one by its place + 1).  The current one, if any, is
   * what packing compresses with; it is trained again when as many
   * blocks were written as the store held when it was trained (so that
   * it follows what the store holds).  Places
   * and current change under dictionary_lock (a leaf: the stripe locks
   * come before it); a place is read without it by the units it names,
   * which keep it alive.
   */
  pthread_mutex_t dictionary_lock;
  _Atomic (struct pack_dictionary *) dictionaries[STORE_DICTIONARIES];
  unsigned dictionary_current;    /* its place + 1; 0: none */
  uint64_t dictionary_writes;     /* writes when the last was trained */
  uint64_t dictionary_stored;     /* blocks stored then (at least
                                     STORE_DICTIONARY_SAMPLES_MIN) */
  bool dictionary_unused;         /* the last sweep found the current one
                                     unused (dictionary_sweep) */
  uint32_t dictionary_trained_at; /* store_clock when the current one
                                     was trained, + 1 (0: none yet, or it
                                     was dropped unused) */
  /* Their decoders: this process's (HANDOVER), made on first use by a
   * compare-and-swap, freed with the dictionary.
   */
  _Atomic (struct codec_decoder *) decoders[STORE_DICTIONARIES];
  /* Packing's encoder (about 1.5 MiB of zstd's tables at level 14, a
   * few milliseconds to make: more than a policy round's share), made
   * by the first run that compresses with the current dictionary and
   * kept for the next runs; it holds a reference on its dictionary.
   * Freed by a sweep that finds it unused since the last one
   * (dictionary_sweep), or once its dictionary is not the current one
   * and no run uses it.  Under dictionary_lock; the encoder is this
   * process's (a new owner drops the old one's reference).
   */
  struct codec_encoder *encoder;
  unsigned encoder_dictionary;    /* its dictionary's number; 0: none */
  unsigned encoder_users;         /* runs compressing with it now */
  bool encoder_used;              /* a unit was made with it since the
                                     last sweep */
  _Atomic uint64_t dictionary_bytes; /* theirs, their decoders' and the
                                     encoder's */
  _Atomic uint64_t packed_blocks;
  _Atomic uint64_t pack_units;
  _Atomic uint64_t recomp_blocks;
  _Atomic uint64_t recomp_bytes_saved;
  uint64_t created_ns;            /* monotonic: block access times count
                                     from here */
  /* Writeback: the backing store (NULL: none), one run at a time. */
  struct backing *backing;        /* this process's (HANDOVER), or the
                                     owner's (backing_owner) */
  struct block_store *backing_owner; /* COLD TIER ACROSS STORES: whose
                                     backing store this is (NULL: its
                                     own) */
  struct space_map *backing_map;  /* in a region: the backing store's
                                     space map, kept there (NULL: no
                                     region, or no backing store) */
  uint32_t backing_target_crc;    /* CRC-32C of its target's name */
  pthread_mutex_t writeback_lock; /* held for a whole writeback run, and
                                     guards map_charged; taken before any
                                     stripe lock */
  uint64_t map_charged;           /* the backing store's space map, bytes
                                     charged to the pool for it */
  unsigned writeback_batch;       /* blocks per backing write */
  _Atomic uint64_t writeback_limit; /* bytes that may still be written
                                     back (zram's writeback_limit),
                                     changed under writeback_lock.
                                     UINT64_MAX: no limit */
  _Atomic uint64_t bd_count;      /* blocks in the backing store now */
  _Atomic uint64_t bd_bytes;      /* their compressed bytes */
  _Atomic uint64_t bd_reads;      /* blocks read from it, ever */
  _Atomic uint64_t bd_writes;     /* blocks written to it, ever */
  _Atomic uint64_t bd_failed_reads;
  _Atomic uint64_t bd_readbacks;  /* blocks read back into RAM, ever */
  uint64_t readback_below;        /* pool bytes under which reads bring
                                     written-back blocks back (0: never) */
  bool backing_sync;              /* a batch made durable before its RAM
                                     copies go */
  /* BUDGET (block-store.h, quota.c): set at creation, then read-only
   * but for the counters.
   */
  struct store_budget *budget;    /* shared with the pool's other stores */
  struct block_store *budget_next; /* budget->members, under its
                                     members_lock */
  unsigned budget_pins;           /* writebacks of other stores at work
                                     on this one, under members_lock */
  bool budget_member;             /* on budget->members */
  uint64_t cap, floor;            /* 0: none */
  bool quota_counted;             /* a cap or a floor: quota_bytes kept */
  _Atomic uint64_t quota_bytes;   /* this store's objects, their classes'
                                     bytes, from allocation to free */
  _Atomic uint64_t refused_for_budget; /* allocations given back for the
                                     cap or another store's floor */
  /* In a region: each stripe's entry being written, with what it held,
   * until both its words are (entry_write; store_recover puts a torn
   * entry back).  Guarded by the stripe's lock.  Last, and allocated
   * only with a region (STORE_STRIPES of them, store_create): a store
   * on the C heap has none, so that an idle device costs 24 KiB less.
   */
  struct stripe_intent {
    _Atomic uint64_t entry;       /* the entry's address; 0: none */
    uint64_t value, state;        /* what it held */
  } intents[];
};

/* The bytes of a store's structure: its intents only in a region. */
static inline size_t
store_struct_bytes (bool in_region)
{
  return sizeof (struct block_store)
    + (in_region ? STORE_STRIPES * sizeof (struct stripe_intent) : 0);
}

/* block-store.c, for a store in a region (HANDOVER in block-store.h):
 * why config cannot serve the store at the region's root (NULL: it
 * can), and the store made this process's - its process parts made
 * anew, the old process's pointers forgotten (0, or -1 with why[]).
 */
extern const char *store_config_mismatch (struct region *region,
                                          const struct store_config *config);
extern int store_adopt (struct block_store *store,
                        const struct store_config *config,
                        char *why, size_t why_bytes);

/* quota.c, for a new owner (store_adopt): store's budget, cap and floor
 * config's (the old process's pointer forgotten), its quota_bytes (kept
 * by a handover, counted again by a recovery) joining the budget's
 * unmet floors.  0, or -1 with errno EINVAL.
 */
extern int quota_rejoin (struct block_store *store,
                         const struct store_config *config);

/* quota.c: a store's objects allocated and freed against its cap and
 * the other stores' floors (BUDGET in block-store.h).  object_alloc: 0
 * with errno ENOSPC when the pool, the cap or a floor refuses.
 * objects_alloc_batch: zs_malloc_batch's handles, each 0 if refused.
 */
extern zs_handle_t object_alloc (struct block_store *store, size_t length);
extern void objects_alloc_batch (struct block_store *store,
                                 const size_t *lengths, unsigned count,
                                 zs_handle_t *handles);
extern void object_free (struct block_store *store, zs_handle_t handle);
extern void objects_free_many (struct block_store *store,
                               zs_handle_t *handles, unsigned count);
/* Set up store's share of config's budget: 0, or -1 with errno EINVAL. */
extern int quota_init (struct block_store *store,
                       const struct store_config *config);
/* Its floor's unmet room given back to the budget (a store destroyed). */
extern void quota_leave (struct block_store *store);

/* quota.c, COLD TIER ACROSS STORES (block-store.h): a store with a
 * budget and a backing store joins the budget's members (at creation),
 * and leaves them (first thing at its destroy: unlinked, then it waits
 * until no writeback of another store holds a pin on it).
 * budget_members_pin: the members that share store's backing store
 * (store itself among them), up to max of them, each pinned until
 * budget_members_unpin; 0 when store is no member (its writeback is its
 * own alone).
 */
extern void budget_member_join (struct block_store *store);
extern void budget_member_leave (struct block_store *store);
extern unsigned budget_members_pin (struct block_store *store,
                                    struct block_store **members,
                                    unsigned max);
extern void budget_members_unpin (struct block_store *const *members,
                                  unsigned count);

/* What an entry holds, detached from the table. */
struct block_content {
  enum block_kind kind;
  uint64_t value;
  uint32_t zeroed;                /* first << 13 | end, 0: none */
  unsigned flags;                 /* BLOCK_FLAG_* */
  uint32_t atime;                 /* last access, store_clock */
};

static inline uint32_t
zeroed_range (size_t first, size_t end)
{
  return (uint32_t) first << 13 | (uint32_t) end;
}
static inline size_t zeroed_first (uint32_t zeroed) { return zeroed >> 13; }
static inline size_t zeroed_end (uint32_t zeroed) { return zeroed & 0x1fff; }

static inline unsigned
content_priority (const struct block_content *content)
{
  return (content->flags & BLOCK_PRIORITY_MASK) >> BLOCK_PRIORITY_SHIFT;
}

/* The codec that compressed content's object. */
static inline struct codec *
content_codec (struct block_store *store, const struct block_content *content)
{
  return store->codecs[content_priority (content)];
}

/* Where a written-back block is (BLOCK_BACKED's value). */
static inline uint64_t
backed_value (uint64_t offset, size_t length)
{
  return (offset / BACKING_SECTOR) << 13 | (length - 1);
}
static inline uint64_t backed_offset (uint64_t value)
{
  return (value >> 13) * BACKING_SECTOR;
}
static inline size_t backed_length (uint64_t value)
{
  return (value & 0x1fff) + 1;
}

static inline bool
content_has_object (const struct block_content *content)
{
  return content->kind == BLOCK_COMPRESSED || content->kind == BLOCK_RAW
    || content->kind == BLOCK_COMPRESSED_PADDED;
}

static inline struct pack_unit *
content_unit (const struct block_content *content)
{
  return (struct pack_unit *) (uintptr_t) (content->value & ~UNIT_INDEX_MASK);
}

static inline void
counter_add (_Atomic uint64_t *counter, int64_t delta)
{
  atomic_fetch_add_explicit (counter, (uint64_t) delta, memory_order_relaxed);
}

static inline pthread_mutex_t *
stripe_for (struct block_store *store, uint64_t block)
{
  return &store->stripes[block % STORE_STRIPES];
}

/* Is a block of this state word at least min_age seconds old at now? */
static inline bool
state_is_older (uint64_t state, uint32_t now, uint32_t min_age)
{
  uint32_t atime = block_state_atime (state);
  return now >= atime && now - atime >= min_age;
}

/* ---- block-entry.c: time, entries, accounting, the move protocol ----- */

/* A read accessed the entry (stripe lock held): the idle flag goes and
 * the access time is now (entry layer).
 */
extern void entry_touch (struct block_store *store, struct block_entry *entry);
/* Seconds since the store was created, as block entries keep them. */
extern uint32_t store_clock (const struct block_store *store);

extern struct block_content entry_load (const struct block_entry *entry);
extern struct block_entry *entry_lock (struct block_store *store,
                                       uint64_t block, bool create,
                                       struct block_leaf **leaf,
                                       struct block_content *old);
/* Tests only (NULL otherwise): called in a region between an entry's two
 * words, to hold a crash's window open (tests/test-store-handover.c).
 */
extern void (*entry_write_window) (void);
extern void entry_store (struct block_store *store, uint64_t block,
                         struct block_leaf *leaf, struct block_entry *entry,
                         const struct block_content *old,
                         const struct block_content *content);
extern size_t content_bytes (struct block_store *store,
                             const struct block_content *content);
extern void content_account (struct block_store *store,
                             const struct block_content *content, int sign,
                             size_t bytes);
extern void content_discard (struct block_store *store,
                             const struct block_content *content);
extern void content_release (struct block_store *store,
                             const struct block_content *content);

/* The move protocol (block-store.h, MOVING A BLOCK).
 *
 * entry_claim: lock the block's stripe and claim its entry, with its
 * content in *claimed.  NULL (stripe unlocked) if the block has no entry,
 * another mover holds a claim on it, or wanted (if not NULL) does not
 * accept its state word.  The caller copies what it needs and unlocks
 * the stripe; a claim held keeps the entry's leaf.
 *
 * entry_commit: lock the stripe, and if the claim holds, put content in
 * the entry (not an access: its time and idle flag stay; content's flags
 * say its codec and incompressibility; the zeroed overlay stays) and set
 * *old to what it held, to release (content_release) by the caller; the
 * claim goes either way and the stripe is unlocked on return.  False if
 * the claim was broken by a store: then content is the caller's to free.
 *
 * entry_unclaim: give a claim up (the mover dropped its work).
 */
extern struct block_entry *entry_claim (struct block_store *store,
                                        uint64_t block,
                                        bool (*wanted) (void *opaque,
                                                        uint64_t block,
                                                        uint64_t state),
                                        void *opaque,
                                        struct block_content *claimed);
extern bool entry_commit (struct block_store *store, uint64_t block,
                          const struct block_content *content,
                          struct block_content *old);
/* entry_commit_flags: the claim's outcome is a flag (flags added to the
 * entry, e.g. BLOCK_FLAG_INCOMPRESSIBLE) rather than new content.
 */
extern bool entry_commit_flags (struct block_store *store, uint64_t block,
                                unsigned flags);
extern void entry_unclaim (struct block_store *store, uint64_t block);
/* entry_claim's claim on an entry found under its stripe lock (held):
 * false if another mover holds one.
 */
extern bool entry_claim_locked (struct block_leaf *leaf,
                                struct block_entry *entry);

/* Install content for a block under its stripe lock: *old is what the
 * entry held (BLOCK_EMPTY: nothing), already out of the counters, for
 * the caller to discard (content_discard) with the lock gone.  0, or -1
 * with errno when no leaf could be had (content discarded).
 */
extern int block_install_swap (struct block_store *store, uint64_t block,
                               struct block_content *content,
                               struct block_content *old);
/* The same, the old content discarded: 0, or -1 with errno. */
extern int block_install (struct block_store *store, uint64_t block,
                          struct block_content *content);
/* ---- block-batch.c ----------------------------------------------------- */

/* BATCHED WRITES (block-batch.c).  n (2..write_batch) whole blocks
 * from first: compressed with one borrowed context into a scratch slot,
 * their objects allocated in class runs (zs_malloc_batch), installed
 * block by block (each under its own stripe lock only: a reader waits
 * for one block's install, never for the batch), the old objects freed
 * as one batch (zs_free_many).  stored[i] says whether block first + i
 * now holds its new content; one that does not holds its old one (memory
 * short, no scratch slot free): the caller, the request layer, writes it
 * again block by block (which can make room, and says why it failed).
 */
extern void blocks_write_batch (struct block_store *store, uint64_t first,
                                const unsigned char *in, unsigned n,
                                bool stored[]);
extern int write_scratch_prepare (struct block_store *store);
extern void write_scratch_free (struct block_store *store);
/* Free the scratch of every slot no batch is using (made again on next
 * use): the bytes freed.  Not while the store is to stay resident.
 */
extern size_t write_scratch_trim (struct block_store *store);

/* ---- block-encode.c ---------------------------------------------------- */

/* Whether a block is one 8-byte word repeated (*word: that word). */
extern bool block_is_same_filled (const unsigned char *block, uint64_t *word);

/* Encode a whole block into new content: a fill word, or an object
 * allocated and written (not yet in the table).  -1 with errno.
 */
extern int block_encode (struct block_store *store,
                         const unsigned char *block,
                         struct block_content *content);
/* Compress a whole block with codecs[0] into out (STORE_BLOCK_SIZE
 * bytes): its length, STORE_BLOCK_SIZE when it is stored raw (out holds
 * the block), or -1 with errno.
 */
extern int block_compress (struct block_store *store,
                           const unsigned char *block, unsigned char *out);
/* Encode a whole block in the object old holds, if it fits there: 0, 1
 * if it does not (nothing changed), -1 with errno.
 */
extern int block_encode_in_place (struct block_store *store,
                                  const unsigned char *block,
                                  const struct block_content *old,
                                  struct block_content *content);
extern bool zeroed_merge (uint32_t zeroed, size_t first, size_t end,
                          uint32_t *merged);
/* Decode stored content into a whole block, with its zeroed overlay.
 * Under the stripe lock.  block_decode_ahead: a read that goes on for
 * ahead more blocks (a packed unit's decode stops past them).
 * block_decode_until: a written-back block's read from the backing
 * store waits until deadline_ms (monotonic) at most, 0: its own
 * backing_timeout (a write's read of the block it patches: the write's
 * one deadline, block-request.c).
 */
extern int block_decode_until (struct block_store *store,
                               const struct block_content *content,
                               unsigned char *block, unsigned ahead,
                               uint64_t deadline_ms);
static inline int
block_decode_ahead (struct block_store *store,
                    const struct block_content *content,
                    unsigned char *block, unsigned ahead)
{
  return block_decode_until (store, content, block, ahead, 0);
}
static inline int
block_decode (struct block_store *store, const struct block_content *content,
              unsigned char *block)
{
  return block_decode_until (store, content, block, 0, 0);
}

/* ---- block-walks.c ------------------------------------------------------ */

/* Call visit for every stored block in [first, first + count), in order,
 * inside a table walk (no stripe lock: the leaves stay alive), until it
 * returns false.  keep_going is asked once per leaf.
 */
extern void stored_blocks_walk (struct block_store *store, uint64_t first,
                                uint64_t count,
                                bool (*visit) (void *opaque, uint64_t block,
                                               struct block_entry *entry),
                                bool (*keep_going) (void *opaque),
                                void *opaque);

/* The stored blocks of [first, last] whose state word wanted accepts,
 * handed to work in groups of at most group blocks, in block order, until
 * work returns non-zero (returned) or more (asked before each group)
 * says to stop.  State words are read without locks: work checks each
 * block again under its stripe lock.
 */
struct candidates {
  uint64_t first, last;
  unsigned group;
  bool (*wanted) (void *opaque, uint64_t block, uint64_t state);
  bool (*more) (void *opaque, unsigned *group);  /* may shrink *group */
  int (*work) (void *opaque, const uint64_t *blocks, unsigned n);
  void *opaque;
  /* Where the walk is, set before each more (NULL: not kept). */
  struct store_progress *progress;
};
extern int candidates_walk (struct block_store *store,
                            const struct candidates *walk);

/* ---- unit-decode.c ----------------------------------------------------- */

/* One block of a unit, through the decode cache; ahead: how many blocks
 * after it the same request reads.  Under the block's stripe lock, which
 * keeps the unit alive (the entry points to it).
 */
extern int unit_decode (struct block_store *store,
                        const struct block_content *content,
                        unsigned char *block, unsigned ahead);
/* One block of a unit for writeback (under its stripe lock, the entry
 * claimed), without taking memory for the decode cache: through a slot
 * that holds the unit already, or one of the unit's places whose memory
 * is made and free, else decoded into a buffer of its own.  So writeback
 * to make room never grows what mem_limit counts.  Not a read: the hit
 * and miss counters stay.
 */
extern int unit_decode_uncached (struct block_store *store,
                                 const struct block_content *content,
                                 unsigned char *block);
/* Free the decode cache's slots no read is using; returns the bytes.
 * (Not the dictionaries: writes at the limit call it often, and a
 * dictionary freed there would be trained again by the next run.)
 */
extern size_t decode_cache_trim (struct block_store *store);
/* A housekeeping round's (housekeeper.c): free the slots that hold no
 * unit, and, unless the store is to stay resident, those not read since
 * the last call (the first call only starts the count); and the current
 * dictionary if no unit uses it (dictionary_sweep).  The slots' bytes
 * freed.
 */
extern size_t store_decode_cache_sweep (struct block_store *store);
/* ---- decode-cache.c ---------------------------------------------------- */

/* A unit going (unit_destroy): its slots are freed, so that the cache
 * keeps (and mem_limit counts) live units only.
 */
extern void decode_cache_forget (struct block_store *store, uint64_t id);
/* A slot's data made (charged to the pool): false if memory refused it;
 * a slot emptied (its lock held) and its data given back: the bytes
 * freed (errno kept); the two places unit id may be kept.
 */
extern bool decode_cache_slot_make (struct block_store *store,
                                    struct unit_cache *slot);
extern size_t decode_cache_slot_free (struct block_store *store,
                                      struct unit_cache *slot);
extern void decode_cache_places (struct block_store *store, uint64_t id,
                                 struct unit_cache *place[2]);

/* ---- pack.c ------------------------------------------------------------ */

/* ---- unit.c ------------------------------------------------------------ */

/* Free a unit: its last block moved out. */
extern void unit_destroy (struct block_store *store, struct pack_unit *unit);

/* ---- pack-dictionary.c ------------------------------------------------- */

/* Drop a unit's reference to dictionary number (place + 1; 0: none):
 * the last frees it.  Takes dictionary_lock then.
 */
extern void dictionary_put (struct block_store *store, unsigned number);
/* A packing run's encoder for the current dictionary (made if need
 * be), and in *number the dictionary's; NULL if there is none (or no
 * memory for it): pack without one.  Given back by the run's end, used
 * if it made a unit.
 */
extern struct codec_encoder *dictionary_encoder_borrow (struct block_store *store,
                                                        unsigned *number);
extern void dictionary_encoder_return (struct block_store *store, bool used);
/* Another reference to a dictionary the caller holds one to (a unit's). */
extern void dictionary_get (struct block_store *store, unsigned number);
/* Whether a packing run should train a dictionary: as many blocks
 * written since the last one was trained (or tried) as were stored then
 * (at least STORE_DICTIONARY_SAMPLES_MIN), and STORE_DICTIONARY_SECONDS
 * gone since the last was made; dictionary_tried: one was tried now and
 * not made (too few samples: tried again after as many writes).
 */
extern bool dictionary_wanted (struct block_store *store, uint32_t now);
extern void dictionary_tried (struct block_store *store);
/* Make bytes (size, at most STORE_DICTIONARY_BYTES) the current
 * dictionary, charged to the pool, trained at now (store_clock); the old
 * one goes when its units do.  0, or -1 with errno ENOSPC (no memory, or
 * every place in use).
 */
extern int dictionary_install (struct block_store *store, const void *bytes,
                               size_t size, uint32_t now);
/* The encoder freed if no run made a unit with it since the last
 * sweep, and the current dictionary if no unit (nor encoder) used it
 * at this sweep and the last: an empty store keeps none for long (the
 * next packing run trains one again).
 */
extern void dictionary_sweep (struct block_store *store);
/* Dictionary number (NULL for 0), and its decoder (made on first use;
 * NULL with errno).  The caller holds a unit that names it.
 */
extern const struct pack_dictionary *dictionary_at (struct block_store *store,
                                                    unsigned number);
extern const struct codec_decoder *dictionary_decoder (struct block_store *store,
                                                       unsigned number);
/* Recovery (recover.c): whether a unit's dictionary number names a sound
 * dictionary; then, with the units met naming each place, each sound
 * one named claimed and its count set, the others forgotten.  Returns
 * the bytes they charge the pool.
 */
extern bool dictionary_recover_check (struct block_store *store,
                                      unsigned number);
extern uint64_t dictionaries_recover (struct block_store *store,
                                      const uint32_t *units);
/* A new owner's: the old decoders forgotten, the bytes counted again. */
extern void dictionaries_adopt (struct block_store *store);

/* store-devices.c, for recover.c: the devices' table of root claimed,
 * and walk given each published store (a slot whose spec fails its
 * check, or whose store walk refuses - not where a store can be - is
 * emptied: that device is lost).  Returns the devices lost.
 */
/* The table given back (store_destroy of the root, its devices gone). */
extern void store_devices_free (struct block_store *root);
extern unsigned store_devices_recover (struct block_store *root,
                                       bool (*walk) (struct block_store *store,
                                                     void *opaque),
                                       void *opaque);
/* store_destroy: every dictionary freed and discharged, whatever units
 * still name them (before the pool goes).
 */
extern void dictionaries_free_all (struct block_store *store);
/* Free every unit's descriptor (store_destroy; the pool had the parts). */
extern void units_free_all (struct block_store *store);

/* ---- writeback.c --------------------------------------------------------- */

/* A write's one deadline for all its waits on the backing store
 * (block-store.h, BACKING WAITS): *deadline_ms is 0 until the write
 * first waits, and is then set to one backing_timeout from then; every
 * later wait of that write (a read of the block it patches, writeback
 * for room, the lock of a writeback another thread runs) ends by it.
 * Returns *deadline_ms.
 */
extern uint64_t backing_wait_deadline (struct block_store *store,
                                       uint64_t *deadline_ms);
/* A write refused for memory (errno ENOSPC) with a backing store: write
 * back the coldest blocks and let the write try again (0), or -1 with
 * errno as it was when there is nothing to gain or the write's deadline
 * (*deadline_ms, backing_wait_deadline) passed.  No lock held.
 */
/* A request starts: the calling thread's last room failure (for the
 * write's log line, store_room_failure) is no longer this request's.
 */
extern void room_failure_forget (void);
extern int writeback_for_room (struct block_store *store,
                               uint64_t *deadline_ms);
/* Charge the pool for the backing store's space map as it is now (it
 * grows and shrinks with what is written back): with writeback_lock
 * held (locked), or taking it if free (a run in progress settles at its
 * end).  A growth the limit refuses is charged at a later settle.  With
 * free_released, the runs released meanwhile are freed first
 * (backing_settle_releases: an NBD store's are trimmed, requests with
 * no deadline); a write making room never does it (BACKING WAITS).
 */
extern void backing_map_settle (struct block_store *store, bool locked,
                                bool free_released);
/* Readback of a written-back block that a read finds (under its stripe
 * lock): whether it should come back into RAM (the pool is under
 * readback_below), and if so a claim on it (entry_claim_locked), so that
 * the read, done without the lock, can bring it back with entry_commit
 * (block_read_back) unless a store came first.
 */
extern bool block_read_back_claim (struct block_store *store,
                                   struct block_leaf *leaf,
                                   struct block_entry *entry,
                                   const struct block_content *content);
/* After the read: the data back in RAM if the claim holds (else nothing:
 * the store that broke it is newer); the claim goes either way.
 */
extern void block_read_back (struct block_store *store, uint64_t block,
                             const unsigned char *data, bool read_ok);

#endif /* ZRAM_BLOCK_STORE_INTERNAL_H */
