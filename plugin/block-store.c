/* The block store: see block-store.h for the design and the locks. */

#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block-store.h"
#include "backing.h"

/* A packed unit (cold packing, block-store.h): the compressed bytes of
 * count blocks, in parts of at most STORE_PACK_PART bytes.  live counts
 * the entries that point to it; the one that drops it to 0 frees it.
 * Everything else is fixed once the unit is made.  Aligned so that an
 * entry holds its address and a block's index in one word.
 */
struct pack_unit {
  _Atomic uint32_t live;
  struct pack_unit *prev, *next;  /* store->units, under units_lock */
  bool dissolve_failed;           /* under units_lock: skip it */
  uint8_t count;                  /* blocks */
  uint8_t parts;                  /* allocator objects */
  uint32_t length;                /* compressed bytes */
  uint64_t id;                    /* never reused: the decode cache's key */
  /* parts handles, then the count blocks packed (unit_blocks). */
  uint64_t words[];
} __attribute__ ((aligned (STORE_PACK_MAX)));

#define UNIT_INDEX_MASK ((uint64_t) STORE_PACK_MAX - 1)
#define UNIT_CACHE_SLOTS 16

/* A write refused for memory tries again after each writeback that made
 * room, this many times at most (other writers may take the room first;
 * a writeback that writes nothing ends it at once).
 */
#define WRITEBACK_ATTEMPTS 64
/* ... and each such writeback aims this far below what the pool holds. */
#define WRITEBACK_ROOM ((uint64_t) 1 << 20)

/* A decoded unit, kept for the next read of one of its blocks.  Owned by
 * the store (no thread-local buffers: design-hazards.md #11); a reader
 * that finds its slot busy decodes into a buffer of its own.
 */
struct unit_cache {
  pthread_mutex_t lock;           /* guards id and data */
  uint64_t id;                    /* 0: empty */
  unsigned char *data;            /* pack_blocks blocks */
};

/* What a unit's descriptor takes (rounded up to its alignment). */
static inline size_t
unit_bytes (unsigned parts, unsigned count)
{
  size_t bytes = sizeof (struct pack_unit) + (parts + count) * sizeof (uint64_t);
  return (bytes + STORE_PACK_MAX - 1) / STORE_PACK_MAX * STORE_PACK_MAX;
}
static inline zs_handle_t *unit_parts (struct pack_unit *unit)
{
  return (zs_handle_t *) unit->words;
}
static inline const zs_handle_t *unit_parts_const (const struct pack_unit *unit)
{
  return (const zs_handle_t *) unit->words;
}
static inline uint64_t *unit_blocks (struct pack_unit *unit)
{
  return unit->words + unit->parts;
}

struct block_store {
  uint64_t size;
  uint64_t blocks;
  struct zs_pool *pool;
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
                                     and dissolve_failed; a leaf */
  struct pack_unit *units;
  unsigned pack_blocks;           /* blocks per unit at most */
  struct unit_cache *unit_cache;
  unsigned char *unit_cache_data; /* the slots' data, one allocation */
  _Atomic uint64_t unit_ids;
  _Atomic uint64_t packed_blocks;
  _Atomic uint64_t pack_units;
  _Atomic uint64_t recomp_blocks;
  _Atomic uint64_t recomp_bytes_saved;
  uint64_t created_ns;            /* monotonic: block access times count
                                     from here */
  /* Writeback: the backing store (NULL: none), one run at a time. */
  struct backing *backing;
  pthread_mutex_t writeback_lock; /* held for a whole writeback run; taken
                                     before any stripe lock */
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
};

/* What an entry holds, detached from the table. */
struct block_content {
  enum block_kind kind;
  uint64_t value;
  uint32_t zeroed;                /* see struct block_entry */
  unsigned flags;                 /* BLOCK_FLAG_* */
  uint32_t atime;                 /* last access, store_clock */
};

static inline uint32_t
zeroed_range (size_t first, size_t end)
{
  return (uint32_t) first << 16 | (uint32_t) end;
}
static inline size_t zeroed_first (uint32_t zeroed) { return zeroed >> 16; }
static inline size_t zeroed_end (uint32_t zeroed) { return zeroed & 0xffff; }

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

static inline void
counter_add (_Atomic uint64_t *counter, int64_t delta)
{
  atomic_fetch_add_explicit (counter, (uint64_t) delta, memory_order_relaxed);
}

static uint64_t
monotonic_ns (void)
{
  struct timespec now;
  clock_gettime (CLOCK_MONOTONIC, &now);
  return (uint64_t) now.tv_sec * 1000000000 + now.tv_nsec;
}

/* Seconds since the store was created, as block entries keep them. */
static uint32_t
store_clock (const struct block_store *store)
{
  uint64_t seconds = (monotonic_ns () - store->created_ns) / 1000000000;
  return seconds < BLOCK_ATIME_MAX ? seconds : BLOCK_ATIME_MAX;
}

static inline pthread_mutex_t *
stripe_for (struct block_store *store, uint64_t block)
{
  return &store->stripes[block % STORE_STRIPES];
}

struct block_store *
store_create (const struct store_config *config)
{
  struct block_store *store = config->size ? calloc (1, sizeof *store) : NULL;
  if (!store) {
    if (config->size == 0)
      errno = EINVAL;
    int saved = errno;
    backing_close (config->backing);
    errno = saved;
    return NULL;
  }
  store->size = config->size;
  store->blocks = (config->size - 1) / STORE_BLOCK_SIZE + 1;
  store->created_ns = monotonic_ns ();
  store->pool = zs_pool_create (&config->pool);
  if (!store->pool)
    goto fail;
  if (config->recomp_count > STORE_RECOMP_MAX) {
    errno = EINVAL;
    goto fail;
  }
  store->recomp_count = config->recomp_count;
  store->algorithms[0] = config->algorithm;
  store->codecs[0] = codec_create (config->algorithm, config->level);
  if (!store->codecs[0])
    goto fail;
  for (unsigned p = 1; p <= store->recomp_count; p++) {
    store->algorithms[p] = config->recomp[p - 1].algorithm;
    store->codecs[p] = codec_create (config->recomp[p - 1].algorithm,
                                     config->recomp[p - 1].level);
    if (!store->codecs[p])
      goto fail;
  }
  store->pack_codec = codec_create (CODEC_ZSTD,
                                    config->pack_level ? config->pack_level : 3);
  store->pack_blocks = config->pack_blocks ? config->pack_blocks
    : STORE_PACK_DEFAULT;
  if (store->pack_blocks < 2 || store->pack_blocks > STORE_PACK_MAX) {
    errno = EINVAL;
    goto fail;
  }
  store->unit_cache = calloc (UNIT_CACHE_SLOTS, sizeof *store->unit_cache);
  /* Pages the kernel maps only when a slot is first used. */
  store->unit_cache_data = calloc (UNIT_CACHE_SLOTS,
                                   (size_t) store->pack_blocks * STORE_BLOCK_SIZE);
  if (!store->pack_codec || !store->unit_cache || !store->unit_cache_data)
    goto fail;
  for (unsigned i = 0; i < UNIT_CACHE_SLOTS; i++) {
    pthread_mutex_init (&store->unit_cache[i].lock, NULL);
    store->unit_cache[i].data = store->unit_cache_data
      + (size_t) i * store->pack_blocks * STORE_BLOCK_SIZE;
  }
  pthread_mutex_init (&store->units_lock, NULL);
  pthread_mutex_init (&store->writeback_lock, NULL);
  store->writeback_batch = config->writeback_batch ? config->writeback_batch
    : STORE_WRITEBACK_BATCH;
  if (store->writeback_batch > STORE_WRITEBACK_BATCH_MAX) {
    errno = EINVAL;
    goto fail;
  }
  store->writeback_limit = config->writeback_limited ? config->writeback_limit
    : UINT64_MAX;
  store->backing = config->backing;   /* the store's from here */
  store->readback_below = config->readback_below;
  store->raw_threshold = zs_huge_class_size (store->pool);
  block_table_init (&store->table, store->blocks, store->pool);
  for (unsigned i = 0; i < STORE_STRIPES; i++)
    pthread_mutex_init (&store->stripes[i], NULL);
  return store;

 fail:;
  int saved = errno;
  if (store->pool)
    zs_pool_destroy (store->pool);
  for (unsigned p = 0; p <= STORE_RECOMP_MAX; p++)
    codec_destroy (store->codecs[p]);
  codec_destroy (store->pack_codec);
  free (store->unit_cache);
  free (store->unit_cache_data);
  free (store);
  backing_close (config->backing);
  errno = saved;
  return NULL;
}

void
store_destroy (struct block_store *store)
{
  if (!store)
    return;
  /* The table first: its nodes are charged to the pool.  The pool frees
   * every object at once; the entries need no walk.
   */
  block_table_destroy (&store->table);
  zs_pool_destroy (store->pool);
  for (unsigned p = 0; p <= STORE_RECOMP_MAX; p++)
    codec_destroy (store->codecs[p]);
  codec_destroy (store->pack_codec);
  for (unsigned i = 0; i < UNIT_CACHE_SLOTS; i++)
    pthread_mutex_destroy (&store->unit_cache[i].lock);
  free (store->unit_cache);
  free (store->unit_cache_data);
  /* The units' parts went with the pool; their descriptors go here. */
  while (store->units) {
    struct pack_unit *unit = store->units;
    store->units = unit->next;
    free (unit);
  }
  pthread_mutex_destroy (&store->units_lock);
  for (unsigned i = 0; i < STORE_STRIPES; i++)
    pthread_mutex_destroy (&store->stripes[i]);
  backing_close (store->backing);
  pthread_mutex_destroy (&store->writeback_lock);
  free (store);
}

size_t
store_raw_threshold (const struct block_store *store)
{
  return store->raw_threshold;
}

/* A block that is one 8-byte word repeated. */
static bool
block_is_same_filled (const unsigned char *block, uint64_t *word)
{
  uint64_t first, next;
  memcpy (&first, block, sizeof first);
  for (size_t i = sizeof first; i < STORE_BLOCK_SIZE; i += sizeof next) {
    memcpy (&next, block + i, sizeof next);
    if (next != first)
      return false;
  }
  *word = first;
  return true;
}

/* Encode a whole block into new content: a fill word, or an object
 * allocated and written (not yet in the table).  -1 with errno.
 */
static int
block_encode (struct block_store *store, const unsigned char *block,
              struct block_content *content)
{
  unsigned char compressed[STORE_BLOCK_SIZE];
  const void *payload = compressed;

  content->zeroed = 0;
  content->flags = 0;           /* compressed by codecs[0] */
  if (block_is_same_filled (block, &content->value)) {
    content->kind = BLOCK_SAME;
    return 0;
  }

  int length = codec_compress (store->codecs[0], block, compressed,
                               store->raw_threshold - 1);
  if (length == -1)
    return -1;
  content->kind = BLOCK_COMPRESSED;
  if (length == 0) {
    content->kind = BLOCK_RAW;
    payload = block;
    length = STORE_BLOCK_SIZE;
  }

  zs_handle_t handle = zs_malloc (store->pool, length);
  if (!handle)
    return -1;
  zs_write (store->pool, handle, payload, length);
  content->value = handle;
  return 0;
}

/* The union of a recorded zeroed range (0: none) and [first, end), if it
 * is one range: true, with *merged set.
 */
static bool
zeroed_merge (uint32_t zeroed, size_t first, size_t end, uint32_t *merged)
{
  if (zeroed) {
    if (end < zeroed_first (zeroed) || first > zeroed_end (zeroed))
      return false;
    if (zeroed_first (zeroed) < first)
      first = zeroed_first (zeroed);
    if (zeroed_end (zeroed) > end)
      end = zeroed_end (zeroed);
  }
  *merged = zeroed_range (first, end);
  return true;
}

/* Encode a whole block into the object old holds, when it fits there:
 * needs no memory, so zeroing part of a block that holds data works at
 * the memory limit.  Under the stripe lock, which keeps readers of the
 * block out while its object is rewritten.  Returns 0 with content set (a
 * fill word, or old's object rewritten: compressed bytes that leave part
 * of it unused are BLOCK_COMPRESSED_PADDED), 1 if the block does not fit
 * (nothing changed), or -1 with errno.
 */
static int
block_encode_in_place (struct block_store *store, const unsigned char *block,
                       const struct block_content *old,
                       struct block_content *content)
{
  content->zeroed = 0;
  content->flags = 0;           /* compressed by codecs[0] */
  if (block_is_same_filled (block, &content->value)) {
    content->kind = BLOCK_SAME;
    return 0;
  }
  if (!content_has_object (old))
    return 1;

  unsigned char compressed[STORE_BLOCK_SIZE];
  zs_handle_t handle = old->value;
  size_t size = zs_object_size (store->pool, handle);
  size_t room = zs_object_room (store->pool, handle);
  int length = codec_compress (store->codecs[0], block, compressed,
                               room < store->raw_threshold - 1
                               ? room : store->raw_threshold - 1);
  if (length == -1)
    return -1;
  content->value = handle;
  if (length > 0) {
    /* Exact when the slot's class fits the new size, padded (the object
     * keeps its size) when the new size belongs to a smaller class.
     */
    content->kind = BLOCK_COMPRESSED;
    if ((size_t) length != size
        && zs_resize (store->pool, handle, length) == -1)
      content->kind = BLOCK_COMPRESSED_PADDED;
    zs_write (store->pool, handle, compressed, length);
    return 0;
  }
  if (size == STORE_BLOCK_SIZE) {
    zs_write (store->pool, handle, block, STORE_BLOCK_SIZE);
    content->kind = BLOCK_RAW;
    return 0;
  }
  return 1;
}

static inline struct pack_unit *
content_unit (const struct block_content *content)
{
  return (struct pack_unit *) (uintptr_t) (content->value & ~UNIT_INDEX_MASK);
}

/* Decode a whole unit into data (count blocks). */
static int
unit_decode_all (struct block_store *store, const struct pack_unit *unit,
                 unsigned char *data)
{
  unsigned char *compressed = malloc (unit->length);
  if (!compressed)
    return -1;
  size_t at = 0;
  const zs_handle_t *part = unit_parts_const (unit);
  for (unsigned i = 0; i < unit->parts; i++) {
    size_t length = zs_object_size (store->pool, part[i]);
    const void *bytes = zs_read_begin (store->pool, part[i], NULL);
    memcpy (compressed + at, bytes, length);
    zs_read_end (store->pool, part[i], bytes);
    at += length;
  }
  int r = codec_decompress_bytes (store->pack_codec, compressed, unit->length,
                                  false, data,
                                  (size_t) unit->count * STORE_BLOCK_SIZE);
  free (compressed);
  return r;
}

/* One block of a unit, through the decode cache.  Under the block's
 * stripe lock, which keeps the unit alive (the entry points to it).
 */
static int
unit_decode (struct block_store *store, const struct block_content *content,
             unsigned char *block)
{
  const struct pack_unit *unit = content_unit (content);
  unsigned index = content->value & UNIT_INDEX_MASK;
  struct unit_cache *slot = &store->unit_cache[unit->id % UNIT_CACHE_SLOTS];
  int r = 0;

  if (pthread_mutex_trylock (&slot->lock) == 0) {
    if (slot->id != unit->id) {
      slot->id = 0;
      if ((r = unit_decode_all (store, unit, slot->data)) == 0)
        slot->id = unit->id;
    }
    if (r == 0)
      memcpy (block, slot->data + (size_t) index * STORE_BLOCK_SIZE,
              STORE_BLOCK_SIZE);
    pthread_mutex_unlock (&slot->lock);
    return r;
  }
  unsigned char *data = malloc ((size_t) unit->count * STORE_BLOCK_SIZE);
  if (!data)
    return -1;
  if ((r = unit_decode_all (store, unit, data)) == 0)
    memcpy (block, data + (size_t) index * STORE_BLOCK_SIZE, STORE_BLOCK_SIZE);
  free (data);
  return r;
}

/* Free a unit: its last block moved out. */
static void
unit_destroy (struct block_store *store, struct pack_unit *unit)
{
  pthread_mutex_lock (&store->units_lock);
  if (unit->prev)
    unit->prev->next = unit->next;
  else if (store->units == unit)
    store->units = unit->next;
  if (unit->next)
    unit->next->prev = unit->prev;
  pthread_mutex_unlock (&store->units_lock);
  for (unsigned i = 0; i < unit->parts; i++)
    zs_free (store->pool, unit_parts (unit)[i]);
  counter_add (&store->compr_bytes, -(int64_t) unit->length);
  counter_add (&store->pack_units, -1);
  zs_pool_discharge (store->pool, unit_bytes (unit->parts, unit->count));
  free (unit);
}

/* Decode stored content into a whole block.  Under the stripe lock. */
static int
block_decode (struct block_store *store, const struct block_content *content,
              unsigned char *block)
{
  int r = 0;

  switch (content->kind) {
  case BLOCK_EMPTY:
    memset (block, 0, STORE_BLOCK_SIZE);
    return 0;
  case BLOCK_SAME:
    for (size_t i = 0; i < STORE_BLOCK_SIZE; i += sizeof content->value)
      memcpy (block + i, &content->value, sizeof content->value);
    break;
  case BLOCK_PACKED:
    r = unit_decode (store, content, block);
    break;
  case BLOCK_BACKED: {
    /* Under the stripe lock: the run cannot be freed and reused meanwhile
     * (a read waits for the backing store; so do blocks of its stripe).
     */
    unsigned char compressed[STORE_BLOCK_SIZE];
    size_t length = backed_length (content->value);
    bool raw = length == STORE_BLOCK_SIZE;
    r = backing_read (store->backing, raw ? block : compressed, length,
                      backed_offset (content->value));
    if (r == 0 && !raw)
      r = codec_decompress (content_codec (store, content), compressed, length,
                            false, block);
    if (r == -1) {
      counter_add (&store->bd_failed_reads, 1);
      errno = EIO;
    }
    else
      counter_add (&store->bd_reads, 1);
    break;
  }
  case BLOCK_RAW:
  case BLOCK_COMPRESSED:
  case BLOCK_COMPRESSED_PADDED: {
    unsigned char local_copy[STORE_BLOCK_SIZE];
    zs_handle_t handle = content->value;
    size_t length = zs_object_size (store->pool, handle);
    const void *object = zs_read_begin (store->pool, handle, local_copy);
    if (content->kind == BLOCK_RAW)
      memcpy (block, object, STORE_BLOCK_SIZE);
    else
      r = codec_decompress (content_codec (store, content), object, length,
                            content->kind == BLOCK_COMPRESSED_PADDED, block);
    zs_read_end (store->pool, handle, object);
    break;
  }
  }
  if (content->zeroed)
    memset (block + zeroed_first (content->zeroed), 0,
            zeroed_end (content->zeroed) - zeroed_first (content->zeroed));
  return r;
}

static struct block_content
entry_load (const struct block_entry *entry)
{
  struct block_content content = { .kind = BLOCK_EMPTY };
  if (entry) {
    uint32_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
    content.kind = block_state_kind (state);
    content.flags = block_state_flags (state);
    content.atime = block_state_atime (state);
    content.value = atomic_load_explicit (&entry->value, memory_order_relaxed);
    content.zeroed = atomic_load_explicit (&entry->zeroed, memory_order_relaxed);
  }
  return content;
}

/* A read accessed the entry (stripe lock held): the idle flag goes and
 * the access time is now, stored only when either changes (at most once
 * a second per block).
 */
static void
entry_touch (struct block_store *store, struct block_entry *entry,
             const struct block_content *content)
{
  uint32_t now = store_clock (store);
  if (content->atime != now || (content->flags & BLOCK_FLAG_IDLE))
    atomic_store_explicit (&entry->state,
                           block_state_make (content->kind,
                                             content->flags & ~BLOCK_FLAG_IDLE,
                                             now),
                           memory_order_relaxed);
}

/* Store new content into an entry of leaf, whose old content was old,
 * under its stripe lock.  An empty entry that gets content was claimed
 * in its leaf before (entry_lock); one that is emptied is released.
 */
static void
entry_store (struct block_store *store, struct block_leaf *leaf,
             struct block_entry *entry, const struct block_content *old,
             const struct block_content *content)
{
  atomic_store_explicit (&entry->value, content->value, memory_order_relaxed);
  /* A write is an access: idle and incompressible go, the access time is
   * now; the priority says which codec the object was compressed with.
   */
  atomic_store_explicit (&entry->state,
                         block_state_make (content->kind,
                                           content->flags & BLOCK_PRIORITY_MASK,
                                           store_clock (store)),
                         memory_order_relaxed);
  atomic_store_explicit (&entry->zeroed, content->zeroed, memory_order_relaxed);
  if (old->kind != BLOCK_EMPTY && content->kind == BLOCK_EMPTY)
    block_leaf_release (&store->table, leaf);
}

/* Lock a block's stripe and look up its entry (making its leaf when
 * create), with its content in *old.  An empty entry that is going to
 * get content (create) is claimed in its leaf, looking up again when the
 * leaf was being reclaimed (block-table.h, LIFETIME).  NULL, with the
 * stripe unlocked, when there is no entry: no leaf and !create, or no
 * memory for one (errno).
 */
static struct block_entry *
entry_lock (struct block_store *store, uint64_t block, bool create,
            struct block_leaf **leaf, struct block_content *old)
{
  for (;;) {
    pthread_mutex_lock (stripe_for (store, block));
    struct block_entry *entry = block_table_lookup (&store->table, block,
                                                    create, leaf);
    if (!entry) {
      pthread_mutex_unlock (stripe_for (store, block));
      return NULL;
    }
    *old = entry_load (entry);
    if (!create || old->kind != BLOCK_EMPTY || block_leaf_claim (*leaf))
      return entry;
    pthread_mutex_unlock (stripe_for (store, block));
  }
}

/* The bytes of content's object, 0 if it has none. */
static size_t
content_bytes (struct block_store *store, const struct block_content *content)
{
  return content_has_object (content)
    ? zs_object_size (store->pool, content->value) : 0;
}

/* Account for content of bytes object bytes (content_bytes) entering
 * (sign 1) or leaving (sign -1) the table.
 */
static void
content_account (struct block_store *store, const struct block_content *content,
                 int sign, size_t bytes)
{
  switch (content->kind) {
  case BLOCK_EMPTY:
    return;
  case BLOCK_SAME:
    counter_add (&store->same_blocks, sign);
    break;
  case BLOCK_RAW:
    counter_add (&store->raw_blocks, sign);
    if (sign > 0)
      counter_add (&store->raw_blocks_since, 1);
    /* fallthrough */
  case BLOCK_COMPRESSED:
  case BLOCK_COMPRESSED_PADDED:
    counter_add (&store->compr_bytes, sign * (int64_t) bytes);
    break;
  case BLOCK_PACKED:            /* the unit's bytes count with the unit */
    counter_add (&store->packed_blocks, sign);
    break;
  case BLOCK_BACKED:
    counter_add (&store->bd_count, sign);
    counter_add (&store->bd_bytes, sign * (int64_t) backed_length (content->value));
    break;
  }
  counter_add (&store->stored_blocks, sign);
}

/* Free the object of content that left the table, or never entered it. */
static void
content_discard (struct block_store *store, const struct block_content *content)
{
  if (content_has_object (content))
    zs_free (store->pool, content->value);
  else if (content->kind == BLOCK_PACKED) {
    struct pack_unit *unit = content_unit (content);
    if (atomic_fetch_sub (&unit->live, 1) == 1)
      unit_destroy (store, unit);
  }
  else if (content->kind == BLOCK_BACKED)
    backing_release (store->backing, backed_offset (content->value),
                     backed_length (content->value));
}

/* Content left the table: account for it and free its object. */
static void
content_release (struct block_store *store, const struct block_content *content)
{
  content_account (store, content, -1, content_bytes (store, content));
  content_discard (store, content);
}

/* Install content for a block: the entry's lookup (and leaf, if need
 * be) and the swap under the stripe lock; the old object is freed after.
 */
static int
block_install (struct block_store *store, uint64_t block,
               struct block_content *content)
{
  struct block_leaf *leaf;
  struct block_content old;

  /* Emptying a block needs no leaf where there is none. */
  struct block_entry *entry = entry_lock (store, block,
                                          content->kind != BLOCK_EMPTY,
                                          &leaf, &old);
  if (!entry) {
    /* No leaf: the block is a hole.  A zero block that the limit refuses
     * a leaf may stay one: it reads as zeros all the same.
     */
    if (content->kind == BLOCK_EMPTY
        || (content->kind == BLOCK_SAME && content->value == 0
            && errno == ENOSPC))
      return 0;
    int err = errno;
    content_discard (store, content);
    errno = err;
    return -1;
  }
  content_account (store, content, 1, content_bytes (store, content));
  entry_store (store, leaf, entry, &old, content);
  pthread_mutex_unlock (stripe_for (store, block));
  content_release (store, &old);
  return 0;
}

/* A written-back block just read (into block, under its stripe lock):
 * back into RAM while the pool is under readback_below, so that the
 * blocks being read live in RAM and the watermark writes back colder
 * ones.  True if it was; *old is then to be released after the lock.
 */
static bool
block_read_back (struct block_store *store, struct block_leaf *leaf,
                 struct block_entry *entry, const unsigned char *block,
                 const struct block_content *old)
{
  if (old->kind != BLOCK_BACKED || !store->readback_below
      || zs_pool_bytes (store->pool) >= store->readback_below)
    return false;
  struct block_content back;
  if (block_encode (store, block, &back) == -1)
    return false;               /* no memory: it stays where it is */
  content_account (store, &back, 1, content_bytes (store, &back));
  entry_store (store, leaf, entry, old, &back);   /* an access */
  counter_add (&store->bd_readbacks, 1);
  return true;
}

/* Read a whole block into out. */
static int
block_read (struct block_store *store, uint64_t block, unsigned char *out)
{
  struct block_leaf *leaf;
  int r;

  pthread_mutex_lock (stripe_for (store, block));
  struct block_entry *entry = block_table_lookup (&store->table, block, false,
                                                  &leaf);
  struct block_content content = entry_load (entry);
  r = block_decode (store, &content, out);
  bool moved = r == 0 && block_read_back (store, leaf, entry, out, &content);
  if (content.kind != BLOCK_EMPTY && !moved)
    entry_touch (store, entry, &content);
  pthread_mutex_unlock (stripe_for (store, block));
  if (moved)
    content_release (store, &content);
  return r;
}

/* Rewrite part of a block, [from, from+length), with data (or zeros when
 * data is NULL), all under the stripe lock.
 *
 * A write gets a right-sized object, and only if memory is full is the
 * block rewritten in its old object, when it fits there.  A zero is
 * rewritten in the old object whenever it fits, and needs memory only
 * when the new encoding is bigger than the old object's slot (or the
 * block was same-filled); if the limit refuses that memory, the zeroed
 * range is recorded in the entry beside the old data (struct
 * block_entry), which needs none.  So zeroing part of a block that holds
 * data never fails for lack of memory, but in one case: the block already
 * has a zeroed range that does not touch the new one.
 */
static int
block_patch (struct block_store *store, uint64_t block, const void *data,
             size_t from, size_t length)
{
  unsigned char buffer[STORE_BLOCK_SIZE];
  struct block_content content = { .kind = BLOCK_EMPTY };
  struct block_leaf *leaf;
  struct block_content old;

  /* Zeroing needs no leaf where there is none: that range is a hole. */
  struct block_entry *entry = entry_lock (store, block, data != NULL,
                                          &leaf, &old);
  if (!entry)
    return data ? -1 : 0;
  if (!data && old.kind == BLOCK_EMPTY) {
    /* Zeroing part of a hole: it reads as zeros already, keep the hole. */
    pthread_mutex_unlock (stripe_for (store, block));
    return 0;
  }
  size_t old_bytes = content_bytes (store, &old); /* before any rewrite */
  int r = block_decode (store, &old, buffer);
  if (r == 0) {
    if (data) {
      memcpy (buffer + from, data, length);
      r = block_encode (store, buffer, &content);
      if (r == -1 && errno == ENOSPC
          && block_encode_in_place (store, buffer, &old, &content) == 0)
        r = 0;
    }
    else {
      memset (buffer + from, 0, length);
      r = block_encode_in_place (store, buffer, &old, &content);
      if (r == 1)
        r = block_encode (store, buffer, &content);
      if (r == -1 && errno == ENOSPC
          && zeroed_merge (old.zeroed, from, from + length, &content.zeroed)) {
        content.kind = old.kind;
        content.value = old.value;
        content.flags = old.flags;      /* its codec, for one */
        r = 0;
      }
    }
  }
  if (r == -1) {
    /* The entry stays as it was: give back its claim. */
    if (old.kind == BLOCK_EMPTY)
      block_leaf_release (&store->table, leaf);
    pthread_mutex_unlock (stripe_for (store, block));
    return -1;
  }
  /* The old object (or unit) kept beside a zeroed range is not freed. */
  bool same_object = content.value == old.value
    && ((content_has_object (&content) && content_has_object (&old))
        || (content.kind == BLOCK_PACKED && old.kind == BLOCK_PACKED)
        || (content.kind == BLOCK_BACKED && old.kind == BLOCK_BACKED));
  content_account (store, &content, 1, content_bytes (store, &content));
  entry_store (store, leaf, entry, &old, &content);
  pthread_mutex_unlock (stripe_for (store, block));
  content_account (store, &old, -1, old_bytes);
  if (!same_object)
    content_discard (store, &old);
  return 0;
}

/* Loop over [offset, offset+count) one block at a time: block is the
 * block number, from the first byte of it in the range, length how many
 * bytes of it (STORE_BLOCK_SIZE for a whole block).
 */
#define FOR_EACH_BLOCK_PIECE(offset, count, block, from, length)        \
  for (uint64_t _pos = (offset), _end = (offset) + (count),             \
         block, from, length;                                           \
       _pos < _end                                                      \
         && (block = _pos / STORE_BLOCK_SIZE,                           \
             from = _pos % STORE_BLOCK_SIZE,                            \
             length = STORE_BLOCK_SIZE - from < _end - _pos             \
               ? STORE_BLOCK_SIZE - from : _end - _pos, 1);             \
       _pos += length)

static int writeback_for_room (struct block_store *store);

int
store_read (struct block_store *store, void *buf, uint64_t count,
            uint64_t offset)
{
  unsigned char *out = buf;
  unsigned char buffer[STORE_BLOCK_SIZE];

  FOR_EACH_BLOCK_PIECE (offset, count, block, from, length) {
    int r;
    if (length == STORE_BLOCK_SIZE)
      r = block_read (store, block, out);
    else if ((r = block_read (store, block, buffer)) == 0)
      memcpy (out, buffer + from, length);
    if (r == -1) {
      counter_add (&store->failed_reads, 1);
      return -1;
    }
    counter_add (&store->reads, 1);
    out += length;
  }
  return 0;
}

int
store_write (struct block_store *store, const void *buf, uint64_t count,
             uint64_t offset)
{
  const unsigned char *in = buf;

  FOR_EACH_BLOCK_PIECE (offset, count, block, from, length) {
    int r;
    for (unsigned attempt = 0; ; attempt++) {
      if (length == STORE_BLOCK_SIZE) {
        struct block_content content;
        r = block_encode (store, in, &content);
        if (r == 0)
          r = block_install (store, block, &content);
      }
      else
        r = block_patch (store, block, in, from, length);
      if (r == 0 || attempt == WRITEBACK_ATTEMPTS
          || writeback_for_room (store) == -1)
        break;
    }
    if (r == -1) {
      counter_add (&store->failed_writes, 1);
      return -1;
    }
    counter_add (&store->writes, 1);
    in += length;
  }
  return 0;
}

/* Does a piece cover its whole block?  The last block of a device whose
 * size is not a multiple of the block size is whole when the piece runs
 * from its start to the device's end: trimming or zeroing it frees it.
 */
static bool
piece_is_whole_block (const struct block_store *store, uint64_t block,
                      uint64_t from, uint64_t length)
{
  return length == STORE_BLOCK_SIZE
    || (from == 0 && block * STORE_BLOCK_SIZE + length >= store->size);
}

int
store_trim (struct block_store *store, uint64_t count, uint64_t offset)
{
  FOR_EACH_BLOCK_PIECE (offset, count, block, from, length) {
    if (piece_is_whole_block (store, block, from, length)) {
      struct block_content content = { .kind = BLOCK_EMPTY };
      block_install (store, block, &content);
      counter_add (&store->notify_free, 1);
    }
  }
  return 0;
}

int
store_zero (struct block_store *store, uint64_t count, uint64_t offset,
            bool may_trim)
{
  FOR_EACH_BLOCK_PIECE (offset, count, block, from, length) {
    int r;
    if (piece_is_whole_block (store, block, from, length)) {
      struct block_content content = { .kind = may_trim ? BLOCK_EMPTY : BLOCK_SAME };
      r = block_install (store, block, &content);
      counter_add (&store->notify_free, 1);
    }
    else {
      for (unsigned attempt = 0; ; attempt++) {
        r = block_patch (store, block, NULL, from, length);
        if (r == 0 || attempt == WRITEBACK_ATTEMPTS
            || writeback_for_room (store) == -1)
          break;
      }
    }
    if (r == -1) {
      counter_add (&store->failed_writes, 1);
      return -1;
    }
  }
  return 0;
}

static enum store_extent
extent_type (const struct block_entry *entry)
{
  struct block_content content = entry_load (entry);
  switch (content.kind) {
  case BLOCK_EMPTY: return STORE_EXTENT_HOLE;
  case BLOCK_SAME: return content.value == 0 ? STORE_EXTENT_ZERO
                                              : STORE_EXTENT_DATA;
  default: return STORE_EXTENT_DATA;
  }
}

/* Extents read entries without stripe locks: a block changing meanwhile
 * may be reported either way, as with any concurrent write.  The table's
 * walk lock keeps the leaves alive (block-table.h, LIFETIME).
 */
static int
extents_walk (struct block_store *store, uint64_t count, uint64_t offset,
              store_extent_fn add, void *opaque)
{
  uint64_t end = offset + count;
  uint64_t run_start = offset;
  enum store_extent run_type = STORE_EXTENT_HOLE;
  uint64_t pos = offset;

  /* Emit the run so far if the next piece differs in type. */
#define EXTENT_PIECE(type, piece_end)                                   \
  do {                                                                  \
    if ((type) != run_type && pos > run_start) {                        \
      if (add (opaque, run_start, pos - run_start, run_type) == -1)     \
        return -1;                                                      \
      run_start = pos;                                                  \
    }                                                                   \
    run_type = (type);                                                  \
    pos = (piece_end) < end ? (piece_end) : end;                        \
  } while (0)

  while (pos < end) {
    uint64_t block = pos / STORE_BLOCK_SIZE;
    uint64_t leaf_block = block;
    struct block_entry *leaf = block_table_next_leaf (&store->table, &leaf_block);

    if (!leaf) {
      EXTENT_PIECE (STORE_EXTENT_HOLE, end);
      break;
    }
    if (leaf_block > block) {   /* a gap with no leaf: one hole */
      EXTENT_PIECE (STORE_EXTENT_HOLE, leaf_block * STORE_BLOCK_SIZE);
      continue;
    }
    for (unsigned i = block - leaf_block;
         i < BLOCK_TABLE_FANOUT && pos < end; i++)
      EXTENT_PIECE (extent_type (&leaf[i]),
                    (leaf_block + i + 1) * STORE_BLOCK_SIZE);
  }
  if (pos > run_start)
    return add (opaque, run_start, pos - run_start, run_type);
  return 0;
#undef EXTENT_PIECE
}

int
store_extents (struct block_store *store, uint64_t count, uint64_t offset,
               store_extent_fn add, void *opaque)
{
  block_table_walk_begin (&store->table);
  int r = extents_walk (store, count, offset, add, opaque);
  block_table_walk_end (&store->table);
  return r;
}

/* Call visit for every stored block in [first, first + count), in order,
 * inside a table walk (no stripe lock: the leaves stay alive), until it
 * returns false.  keep_going is asked once per leaf.
 */
static void
stored_blocks_walk (struct block_store *store, uint64_t first, uint64_t count,
                    bool (*visit) (void *opaque, uint64_t block,
                                   struct block_entry *entry),
                    bool (*keep_going) (void *opaque), void *opaque)
{
  uint64_t end = count < store->blocks - first ? first + count : store->blocks;
  uint64_t block = first;

  block_table_walk_begin (&store->table);
  while (block < end) {
    uint64_t leaf_block = block;
    struct block_entry *leaf = block_table_next_leaf (&store->table, &leaf_block);
    if (!leaf || leaf_block >= end || (keep_going && !keep_going (opaque)))
      break;
    if (leaf_block > block)
      block = leaf_block;
    for (; block < leaf_block + BLOCK_TABLE_FANOUT && block < end; block++) {
      struct block_entry *entry = &leaf[block - leaf_block];
      uint32_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
      if (block_state_kind (state) != BLOCK_EMPTY
          && !visit (opaque, block, entry))
        goto done;
    }
  }
 done:
  block_table_walk_end (&store->table);
}

struct idle_marking {
  uint32_t now, min_age;
  uint64_t marked;
  bool (*keep_going) (void *opaque);
  void *opaque;
};

static bool
idle_mark_one (void *opaque, uint64_t block, struct block_entry *entry)
{
  struct idle_marking *marking = opaque;
  uint32_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
  /* A write that replaces the state meanwhile wins: it is an access. */
  while (block_state_kind (state) != BLOCK_EMPTY
         && !(state & BLOCK_FLAG_IDLE)
         && marking->now - block_state_atime (state) >= marking->min_age) {
    if (atomic_compare_exchange_weak (&entry->state, &state,
                                      state | BLOCK_FLAG_IDLE)) {
      marking->marked++;
      break;
    }
  }
  return true;
}

static bool
idle_keep_going (void *opaque)
{
  struct idle_marking *marking = opaque;
  return !marking->keep_going || marking->keep_going (marking->opaque);
}

uint64_t
store_mark_idle (struct block_store *store, uint32_t min_age,
                 bool (*keep_going) (void *opaque), void *opaque)
{
  struct idle_marking marking = {
    .now = store_clock (store), .min_age = min_age,
    .keep_going = keep_going, .opaque = opaque,
  };
  stored_blocks_walk (store, 0, store->blocks, idle_mark_one, idle_keep_going,
                      &marking);
  return marking.marked;
}

/* block_state gathers a batch of entries inside a walk and emits them
 * after it: emit may block (a slow client), and the walk lock must not
 * be held meanwhile (the table's reclaim waits for it).
 */
#define STATE_BATCH 256

struct state_batch {
  struct store_block_state states[STATE_BATCH];
  unsigned count;
};

static bool
block_state_gather (void *opaque, uint64_t block, struct block_entry *entry)
{
  struct state_batch *batch = opaque;
  uint32_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
  if (block_state_kind (state) == BLOCK_EMPTY)
    return true;
  batch->states[batch->count++] = (struct store_block_state) {
    .block = block,
    .atime = block_state_atime (state),
    .same = block_state_kind (state) == BLOCK_SAME,
    .huge = block_state_kind (state) == BLOCK_RAW
      || (block_state_kind (state) == BLOCK_BACKED
          && backed_length (atomic_load_explicit (&entry->value,
                                                  memory_order_relaxed))
             == STORE_BLOCK_SIZE),
    .written_back = block_state_kind (state) == BLOCK_BACKED,
    .idle = (state & BLOCK_FLAG_IDLE) != 0,
    .recompressed = (state & BLOCK_PRIORITY_MASK) != 0,
    .incompressible = (state & BLOCK_FLAG_INCOMPRESSIBLE) != 0,
  };
  return batch->count < STATE_BATCH;
}

int
store_block_state (struct block_store *store, uint64_t first, uint64_t count,
                   store_block_state_fn emit, void *opaque)
{
  if (first >= store->blocks)
    return 0;
  uint64_t end = count < store->blocks - first ? first + count : store->blocks;
  struct state_batch *batch = malloc (sizeof *batch);
  if (!batch)
    return -1;
  int r = 0;
  while (first < end && r == 0) {
    batch->count = 0;
    stored_blocks_walk (store, first, end - first, block_state_gather, NULL,
                        batch);
    for (unsigned i = 0; i < batch->count && r == 0; i++)
      r = emit (opaque, &batch->states[i]);
    if (batch->count < STATE_BATCH)
      break;                    /* the walk reached the end */
    first = batch->states[batch->count - 1].block + 1;
  }
  free (batch);
  return r;
}

int
store_set_mem_limit (struct block_store *store, uint64_t limit)
{
  return zs_pool_set_mem_limit (store->pool, limit);
}

void
store_reset_mem_used_max (struct block_store *store)
{
  zs_pool_reset_max (store->pool);
}

void
store_print_classes (struct block_store *store, FILE *fp)
{
  zs_pool_print_stats (store->pool, fp);
}

uint32_t
store_now (const struct block_store *store)
{
  return store_clock (store);
}

/* ---- walks for candidates (recompression, packing, writeback) -------- */

/* The stored blocks of [first, last] whose state word wanted accepts,
 * handed to work in groups of at most group blocks, in block order, until
 * work returns non-zero (returned) or more (asked before each group)
 * says to stop.  State words are read without locks: work checks each
 * block again under its stripe lock.
 */
struct candidates {
  uint64_t first, last;
  unsigned group;
  bool (*wanted) (void *opaque, uint64_t block, uint32_t state);
  bool (*more) (void *opaque, unsigned *group);  /* may shrink *group */
  int (*work) (void *opaque, const uint64_t *blocks, unsigned n);
  void *opaque;
};

struct candidates_batch {
  const struct candidates *walk;
  uint64_t blocks[STATE_BATCH];
  unsigned count;
};

static bool
candidates_gather (void *opaque, uint64_t block, struct block_entry *entry)
{
  struct candidates_batch *batch = opaque;
  uint32_t state = atomic_load_explicit (&entry->state, memory_order_relaxed);
  if (batch->walk->wanted (batch->walk->opaque, block, state))
    batch->blocks[batch->count++] = block;
  return batch->count < STATE_BATCH;
}

static int
candidates_walk (struct block_store *store, const struct candidates *walk)
{
  struct candidates_batch *batch = malloc (sizeof *batch);
  if (!batch)
    return -1;
  batch->walk = walk;
  uint64_t next = walk->first;
  uint64_t last = walk->last < store->blocks - 1 ? walk->last
    : store->blocks - 1;
  int r = 0;
  while (next <= last && r == 0) {
    batch->count = 0;
    stored_blocks_walk (store, next, last - next + 1, candidates_gather, NULL,
                        batch);
    for (unsigned i = 0; i < batch->count && r == 0; ) {
      unsigned n = batch->count - i < walk->group ? batch->count - i
        : walk->group;
      if (!walk->more (walk->opaque, &n))
        goto out;
      r = walk->work (walk->opaque, batch->blocks + i, n);
      i += n;
    }
    if (batch->count < STATE_BATCH)
      break;
    next = batch->blocks[batch->count - 1] + 1;
  }
 out:
  free (batch);
  return r;
}

/* ---- recompression ------------------------------------------------- */

const char *
store_recompress_algorithm (const struct block_store *store, unsigned priority)
{
  if (priority < 1 || priority > store->recomp_count)
    return NULL;
  return codec_name (store->algorithms[priority]);
}

/* A recompression run. */
struct recompress_run {
  struct block_store *store;
  const struct store_recompress_request *request;
  unsigned top_priority;          /* the highest priority tried */
  uint32_t now;                   /* store_clock when it started */
  struct store_recompress_result *result;
  bool (*keep_going) (void *opaque);
  void *opaque;
};

static bool
recompress_wanted (const struct recompress_run *batch, uint32_t state)
{
  unsigned kind = block_state_kind (state);
  if (kind != BLOCK_COMPRESSED && kind != BLOCK_RAW
      && kind != BLOCK_COMPRESSED_PADDED)
    return false;
  if ((state & BLOCK_FLAG_INCOMPRESSIBLE)
      || ((state & BLOCK_PRIORITY_MASK) >> BLOCK_PRIORITY_SHIFT)
         >= batch->top_priority)
    return false;
  if ((batch->request->type & RECOMPRESS_IDLE) && !(state & BLOCK_FLAG_IDLE))
    return false;
  if ((batch->request->type & RECOMPRESS_HUGE) && kind != BLOCK_RAW)
    return false;
  return batch->now - block_state_atime (state) >= batch->request->min_age;
}

static bool
recompress_candidate (void *opaque, uint64_t block, uint32_t state)
{
  return recompress_wanted (opaque, state);
}

/* Recompress one block, all under its stripe lock (one block's decode
 * and compressions: what a read or write of a block on that stripe may
 * wait for).  Adds to result.
 */
static int
recompress_block (struct block_store *store, uint64_t block,
                  const struct recompress_run *batch,
                  struct store_recompress_result *result)
{
  unsigned char plain[STORE_BLOCK_SIZE], compressed[STORE_BLOCK_SIZE];
  struct block_leaf *leaf;
  pthread_mutex_t *stripe = stripe_for (store, block);
  int r = 0;

  pthread_mutex_lock (stripe);
  struct block_entry *entry = block_table_lookup (&store->table, block, false,
                                                  &leaf);
  uint32_t state = entry ? atomic_load (&entry->state) : 0;
  if (!entry || !recompress_wanted (batch, state))
    goto out;                   /* changed since the walk */
  struct block_content old = entry_load (entry);
  size_t old_size = zs_object_size (store->pool, old.value);
  size_t old_room = zs_object_room (store->pool, old.value);
  if (old_size < batch->request->threshold)
    goto out;
  /* The zeroed overlay stays as it is: decode the object alone. */
  struct block_content stored = old;
  stored.zeroed = 0;
  if ((r = block_decode (store, &stored, plain)) == -1)
    goto out;
  result->tried++;

  /* The first algorithm, by priority, that lands in a smaller class. */
  unsigned first = batch->request->priority ? batch->request->priority
    : content_priority (&old) + 1;
  unsigned priority = 0;
  int length = 0;
  for (unsigned p = first; p <= batch->top_priority && !priority; p++) {
    length = codec_compress (store->codecs[p], plain, compressed,
                             store->raw_threshold - 1);
    if (length == -1) {
      r = -1;
      goto out;
    }
    if (length > 0 && zs_size_room (store->pool, length) < old_room)
      priority = p;
  }
  if (!priority) {
    /* Nothing shrinks it: skip it from now on. */
    atomic_store (&entry->state, state | BLOCK_FLAG_INCOMPRESSIBLE);
    result->incompressible++;
    goto out;
  }
  zs_handle_t handle = zs_malloc (store->pool, length);
  if (!handle) {
    /* At the limit: this one stays as it is, the next may fit. */
    if (errno != ENOSPC)
      r = -1;
    goto out;
  }
  zs_write (store->pool, handle, compressed, length);
  struct block_content content = {
    .kind = BLOCK_COMPRESSED, .value = handle, .zeroed = old.zeroed,
  };
  content_account (store, &old, -1, old_size);
  content_account (store, &content, 1, length);
  atomic_store_explicit (&entry->value, handle, memory_order_relaxed);
  /* Not an access: the access time and the idle flag stay. */
  atomic_store_explicit (&entry->state,
                         block_state_make (BLOCK_COMPRESSED,
                                           (block_state_flags (state)
                                            & BLOCK_FLAG_IDLE)
                                           | priority << BLOCK_PRIORITY_SHIFT,
                                           block_state_atime (state)),
                         memory_order_relaxed);
  pthread_mutex_unlock (stripe);
  zs_free (store->pool, old.value);
  result->recompressed++;
  result->bytes_saved += old_size - length;
  counter_add (&store->recomp_blocks, 1);
  counter_add (&store->recomp_bytes_saved, old_size - length);
  return 0;

 out:
  pthread_mutex_unlock (stripe);
  return r;
}

static bool
recompress_more (void *opaque, unsigned *group)
{
  struct recompress_run *run = opaque;
  return !(run->request->max_blocks
           && run->result->tried >= run->request->max_blocks)
    && !(run->keep_going && !run->keep_going (run->opaque));
}

static int
recompress_one (void *opaque, const uint64_t *blocks, unsigned n)
{
  struct recompress_run *run = opaque;
  return recompress_block (run->store, blocks[0], run, run->result);
}

int
store_recompress (struct block_store *store,
                  const struct store_recompress_request *request,
                  bool (*keep_going) (void *opaque), void *opaque,
                  struct store_recompress_result *result)
{
  memset (result, 0, sizeof *result);
  if (store->recomp_count == 0 || request->priority > store->recomp_count
      || request->type < RECOMPRESS_IDLE || request->type > RECOMPRESS_HUGE_IDLE) {
    errno = EINVAL;
    return -1;
  }
  struct recompress_run run = {
    .store = store, .request = request, .now = store_clock (store),
    .top_priority = request->priority ? request->priority : store->recomp_count,
    .result = result, .keep_going = keep_going, .opaque = opaque,
  };
  struct candidates walk = {
    .first = 0, .last = UINT64_MAX, .group = 1,
    .wanted = recompress_candidate, .more = recompress_more,
    .work = recompress_one, .opaque = &run,
  };
  return candidates_walk (store, &walk);
}

/* ---- cold packing ---------------------------------------------------- */

static bool
pack_wanted (uint32_t state)
{
  unsigned kind = block_state_kind (state);
  return (state & BLOCK_FLAG_IDLE)
    && (kind == BLOCK_COMPRESSED || kind == BLOCK_RAW
        || kind == BLOCK_COMPRESSED_PADDED);
}

static bool
pack_candidate (void *opaque, uint64_t block, uint32_t state)
{
  return pack_wanted (state);
}

/* A block read for packing, and what its entry said then. */
struct pack_member {
  uint64_t block;
  struct block_content old;
  uint32_t state;
  size_t bytes;
};

/* Pack up to pack_blocks blocks into one unit.  Each is read under its
 * stripe lock, then all are compressed with no lock held, then each is
 * moved in under its stripe lock if it is unchanged (same value, same
 * state word: any access since clears its idle flag).  Adds to result.
 */
static int
pack_group (struct block_store *store, const uint64_t *blocks, unsigned n,
            unsigned char *plain, unsigned char *compressed,
            struct store_pack_result *result)
{
  struct pack_member members[STORE_PACK_MAX];
  unsigned count = 0;
  size_t before = 0;
  struct block_leaf *leaf;

  for (unsigned i = 0; i < n; i++) {
    struct block_content old;
    struct block_entry *entry = entry_lock (store, blocks[i], false, &leaf, &old);
    if (!entry)
      continue;
    uint32_t state = atomic_load (&entry->state);
    if (pack_wanted (state) && old.zeroed == 0
        && block_decode (store, &old, plain + (size_t) count * STORE_BLOCK_SIZE)
           == 0) {
      members[count] = (struct pack_member) {
        .block = blocks[i], .old = old, .state = state,
        .bytes = zs_object_size (store->pool, old.value),
      };
      before += members[count].bytes;
      count++;
    }
    pthread_mutex_unlock (stripe_for (store, blocks[i]));
  }
  if (count < 2)
    return 0;

  int length = codec_compress_bytes (store->pack_codec, plain,
                                     (size_t) count * STORE_BLOCK_SIZE,
                                     compressed, before);
  if (length == -1)
    return -1;
  unsigned parts = (length + STORE_PACK_PART - 1) / STORE_PACK_PART;
  size_t descriptor = unit_bytes (parts, count);
  if (length == 0 || (size_t) length + descriptor >= before)
    return 0;                   /* it would not save memory */

  if (zs_pool_charge (store->pool, descriptor) == -1)
    return errno == ENOSPC ? 0 : -1;
  struct pack_unit *unit = aligned_alloc (STORE_PACK_MAX, descriptor);
  if (!unit) {
    zs_pool_discharge (store->pool, descriptor);
    return -1;
  }
  unit->count = count;
  unit->length = length;
  unit->prev = unit->next = NULL;
  unit->dissolve_failed = false;
  unit->id = atomic_fetch_add (&store->unit_ids, 1) + 1;
  unit->parts = parts;
  atomic_init (&unit->live, 1);  /* this call's own reference */
  for (unsigned i = 0; i < count; i++)
    unit_blocks (unit)[i] = members[i].block;
  for (unsigned i = 0; i < parts; i++) {
    size_t at = (size_t) i * STORE_PACK_PART;
    size_t part = length - at < STORE_PACK_PART ? length - at : STORE_PACK_PART;
    zs_handle_t handle = zs_malloc (store->pool, part);
    if (!handle) {
      int err = errno;
      for (unsigned j = 0; j < i; j++)
        zs_free (store->pool, unit_parts (unit)[j]);
      zs_pool_discharge (store->pool, descriptor);
      free (unit);
      return err == ENOSPC ? 0 : -1;
    }
    zs_write (store->pool, handle, compressed + at, part);
    unit_parts (unit)[i] = handle;
  }
  counter_add (&store->compr_bytes, length);
  counter_add (&store->pack_units, 1);

  unsigned moved = 0;
  for (unsigned i = 0; i < count; i++) {
    struct pack_member *member = &members[i];
    pthread_mutex_t *stripe = stripe_for (store, member->block);
    pthread_mutex_lock (stripe);
    struct block_entry *entry = block_table_lookup (&store->table,
                                                    member->block, false, &leaf);
    if (!entry || atomic_load (&entry->value) != member->old.value
        || atomic_load (&entry->state) != member->state
        || atomic_load (&entry->zeroed) != 0) {
      pthread_mutex_unlock (stripe);
      continue;                 /* accessed meanwhile: it stays out */
    }
    struct block_content packed = {
      .kind = BLOCK_PACKED, .value = (uintptr_t) unit | i,
    };
    atomic_fetch_add (&unit->live, 1);
    content_account (store, &member->old, -1, member->bytes);
    content_account (store, &packed, 1, 0);
    atomic_store_explicit (&entry->value, packed.value, memory_order_relaxed);
    /* Not an access: the access time and the idle flag stay. */
    atomic_store_explicit (&entry->state,
                           block_state_make (BLOCK_PACKED,
                                             member->state & BLOCK_FLAG_IDLE,
                                             block_state_atime (member->state)),
                           memory_order_relaxed);
    pthread_mutex_unlock (stripe);
    zs_free (store->pool, member->old.value);
    moved++;
  }
  if (moved) {
    pthread_mutex_lock (&store->units_lock);
    unit->next = store->units;
    if (store->units)
      store->units->prev = unit;
    store->units = unit;
    pthread_mutex_unlock (&store->units_lock);
  }
  /* Drop this call's reference: a unit nobody moved into goes now. */
  struct block_content own = { .kind = BLOCK_PACKED, .value = (uintptr_t) unit };
  content_discard (store, &own);
  if (moved) {
    result->units++;
    result->blocks += moved;
    result->bytes_before += before;
    result->bytes_after += length;
  }
  return 0;
}

/* A packing run. */
struct pack_run {
  struct block_store *store;
  uint64_t max_blocks;
  unsigned char *plain, *compressed;   /* pack_blocks blocks each */
  struct store_pack_result *result;
  bool (*keep_going) (void *opaque);
  void *opaque;
};

static bool
pack_more (void *opaque, unsigned *group)
{
  struct pack_run *run = opaque;
  return !(run->max_blocks && run->result->blocks >= run->max_blocks)
    && !(run->keep_going && !run->keep_going (run->opaque));
}

static int
pack_some (void *opaque, const uint64_t *blocks, unsigned n)
{
  struct pack_run *run = opaque;
  return pack_group (run->store, blocks, n, run->plain, run->compressed,
                     run->result);
}

int
store_pack (struct block_store *store, uint64_t max_blocks,
            bool (*keep_going) (void *opaque), void *opaque,
            struct store_pack_result *result)
{
  memset (result, 0, sizeof *result);
  size_t unit_plain = (size_t) store->pack_blocks * STORE_BLOCK_SIZE;
  struct pack_run run = {
    .store = store, .max_blocks = max_blocks,
    .plain = malloc (unit_plain), .compressed = malloc (unit_plain),
    .result = result, .keep_going = keep_going, .opaque = opaque,
  };
  struct candidates walk = {
    .first = 0, .last = UINT64_MAX, .group = store->pack_blocks,
    .wanted = pack_candidate, .more = pack_more, .work = pack_some,
    .opaque = &run,
  };
  int r = run.plain && run.compressed ? candidates_walk (store, &walk) : -1;
  free (run.plain);
  free (run.compressed);
  return r;
}

/* Move the blocks still in a unit out, each stored alone again (not an
 * access: its time and idle flag stay).  The caller holds a reference.
 * False if one could not be (no memory).
 */
static bool
unit_dissolve (struct block_store *store, struct pack_unit *unit)
{
  bool all = true;
  for (unsigned i = 0; i < unit->count; i++) {
    uint64_t block = unit_blocks (unit)[i];
    struct block_leaf *leaf;
    unsigned char plain[STORE_BLOCK_SIZE];
    pthread_mutex_t *stripe = stripe_for (store, block);
    pthread_mutex_lock (stripe);
    struct block_entry *entry = block_table_lookup (&store->table, block, false,
                                                    &leaf);
    struct block_content old = entry_load (entry);
    if (!entry || old.kind != BLOCK_PACKED
        || old.value != ((uintptr_t) unit | i)) {
      pthread_mutex_unlock (stripe);
      continue;                 /* moved out already */
    }
    uint32_t state = atomic_load (&entry->state);
    struct block_content content;
    if (block_decode (store, &old, plain) == -1
        || block_encode (store, plain, &content) == -1) {
      pthread_mutex_unlock (stripe);
      all = false;
      continue;
    }
    content.zeroed = old.zeroed;
    content_account (store, &content, 1, content_bytes (store, &content));
    content_account (store, &old, -1, 0);
    atomic_store_explicit (&entry->value, content.value, memory_order_relaxed);
    atomic_store_explicit (&entry->state,
                           block_state_make (content.kind,
                                             state & BLOCK_FLAG_IDLE,
                                             block_state_atime (state)),
                           memory_order_relaxed);
    pthread_mutex_unlock (stripe);
    content_discard (store, &old);
  }
  return all;
}

/* Pin a unit to dissolve it (a reference of our own on live), if fewer
 * than live_percent of its blocks are still in it; under units_lock.
 * Never one whose last block already left (live 0): the thread that took
 * live to 0 owns it and is about to unlink and free it (it waits for
 * units_lock), so pinning it then would free it twice.
 */
static bool
unit_pin_if_sparse (struct pack_unit *unit, unsigned live_percent)
{
  uint32_t live = atomic_load (&unit->live);
  while (live > 0 && live * 100 < unit->count * live_percent)
    if (atomic_compare_exchange_weak (&unit->live, &live, live + 1))
      return true;
  return false;
}

uint64_t
store_pack_dissolve (struct block_store *store, unsigned live_percent)
{
  uint64_t dissolved = 0;
  for (;;) {
    struct pack_unit *unit;
    pthread_mutex_lock (&store->units_lock);
    for (unit = store->units; unit; unit = unit->next)
      if (!unit->dissolve_failed && unit_pin_if_sparse (unit, live_percent))
        break;                  /* pinned while we work */
    pthread_mutex_unlock (&store->units_lock);
    if (!unit)
      return dissolved;
    if (unit_dissolve (store, unit))
      dissolved++;
    else {
      pthread_mutex_lock (&store->units_lock);
      unit->dissolve_failed = true;
      pthread_mutex_unlock (&store->units_lock);
    }
    struct block_content own = { .kind = BLOCK_PACKED, .value = (uintptr_t) unit };
    content_discard (store, &own);
  }
}

/* ---- writeback ----------------------------------------------------- */

/* Blocks rewritten in place at the memory limit (BLOCK_COMPRESSED_PADDED)
 * are left in RAM: their compressed length is not known without a decode
 * and they get a right-sized object with their next write.
 */
static bool
writeback_wanted (const struct store_writeback_request *request, uint32_t now,
                  uint64_t block, uint32_t state)
{
  unsigned kind = block_state_kind (state);
  if (kind != BLOCK_COMPRESSED && kind != BLOCK_RAW)
    return false;
  if (block < request->first || block > request->last)
    return false;
  bool idle = state & BLOCK_FLAG_IDLE;
  switch (request->type) {
  case WRITEBACK_IDLE: if (!idle) return false; break;
  case WRITEBACK_HUGE: if (kind != BLOCK_RAW) return false; break;
  case WRITEBACK_HUGE_IDLE: if (kind != BLOCK_RAW || !idle) return false; break;
  case WRITEBACK_INCOMPRESSIBLE:
    if (!(state & BLOCK_FLAG_INCOMPRESSIBLE)) return false;
    break;
  case WRITEBACK_ANY: break;
  }
  return now - block_state_atime (state) >= request->min_age;
}


/* A block copied for writeback: its object's bytes are at `at` in the
 * batch's buffer, and go to the same place in the batch's run.
 */
struct writeback_member {
  uint64_t block;
  zs_handle_t handle;
  size_t length;
  size_t at;
  uint64_t where;                 /* its offset in the backing store */
};

static inline size_t
sectors_bytes (size_t bytes)
{
  return (bytes + BACKING_SECTOR - 1) / BACKING_SECTOR * BACKING_SECTOR;
}

/* Write the members' bytes (buffer, at bytes in all) to the backing
 * store: in one run, or, when the space map has no run that long, one
 * run per member.  Returns how many members were written (from the
 * first), each with its place set; 0 with result->failed or
 * backing_full set when none was.
 */
static unsigned
writeback_write (struct block_store *store, struct writeback_member *members,
                 unsigned count, const unsigned char *buffer, size_t at,
                 struct store_writeback_result *result)
{
  int64_t offset = backing_allocate (store->backing, at);
  if (offset != -1) {
    if (backing_write (store->backing, buffer, at, offset) == -1) {
      backing_release (store->backing, offset, at);
      result->failed = true;
      return 0;
    }
    for (unsigned i = 0; i < count; i++)
      members[i].where = offset + members[i].at;
    return count;
  }
  for (unsigned i = 0; i < count; i++) {
    size_t bytes = sectors_bytes (members[i].length);
    if ((offset = backing_allocate (store->backing, bytes)) == -1) {
      result->backing_full = i == 0;
      return i;
    }
    if (backing_write (store->backing, buffer + members[i].at, bytes,
                       offset) == -1) {
      backing_release (store->backing, offset, bytes);
      result->failed = i == 0;
      return i;
    }
    members[i].where = offset;
  }
  return count;
}

/* Write back up to writeback_batch blocks in one backing write.  Each is
 * copied under its stripe lock; the batch is written with no lock but
 * writeback_lock held; then each is switched to the backing store under
 * its stripe lock, only if its object still holds the bytes written
 * (compared in full: a rewrite in place keeps the handle).  A block that
 * changed meanwhile stays in RAM and its run is freed.  So a block leaves
 * RAM only once its backing write is confirmed.  Returns 0 (adds to
 * result), or -1 with errno (EIO: the write failed, nothing moved;
 * ENOSPC: the backing store or the writeback limit is full).
 */
static int
writeback_group (struct block_store *store,
                 const struct store_writeback_request *request, uint32_t now,
                 const uint64_t *blocks, unsigned n, unsigned char *buffer,
                 struct store_writeback_result *result)
{
  struct writeback_member members[STORE_WRITEBACK_BATCH_MAX];
  unsigned count = 0;
  size_t at = 0;
  struct block_leaf *leaf;

  for (unsigned i = 0; i < n; i++) {
    struct block_content old;
    struct block_entry *entry = entry_lock (store, blocks[i], false, &leaf, &old);
    if (!entry)
      continue;
    if (writeback_wanted (request, now, blocks[i], atomic_load (&entry->state))) {
      zs_handle_t handle = old.value;
      size_t length = zs_object_size (store->pool, handle);
      const void *object = zs_read_begin (store->pool, handle, buffer + at);
      if (object != buffer + at)
        memcpy (buffer + at, object, length);
      zs_read_end (store->pool, handle, object);
      members[count++] = (struct writeback_member) {
        .block = blocks[i], .handle = handle, .length = length, .at = at,
      };
      size_t padded = sectors_bytes (length);
      memset (buffer + at + length, 0, padded - length);
      at += padded;
    }
    pthread_mutex_unlock (stripe_for (store, blocks[i]));
  }
  if (count == 0)
    return 0;
  uint64_t limit = atomic_load (&store->writeback_limit);
  while (count > 0 && at > limit)
    at = members[--count].at;    /* what the limit lets through */
  if (count == 0) {
    result->limited = true;
    errno = ENOSPC;
    return -1;
  }

  if ((count = writeback_write (store, members, count, buffer, at,
                               result)) == 0) {
    errno = result->failed ? EIO : ENOSPC;
    return -1;
  }
  if (limit != UINT64_MAX)
    atomic_fetch_sub (&store->writeback_limit,
                      members[count - 1].at
                      + sectors_bytes (members[count - 1].length));
  counter_add (&store->bd_writes, count);

  for (unsigned i = 0; i < count; i++) {
    struct writeback_member *member = &members[i];
    uint64_t where = member->where;
    pthread_mutex_t *stripe = stripe_for (store, member->block);
    struct block_content old;
    struct block_entry *entry = entry_lock (store, member->block, false, &leaf,
                                            &old);
    bool unchanged = entry && old.value == member->handle
      && (old.kind == BLOCK_COMPRESSED || old.kind == BLOCK_RAW)
      && zs_object_size (store->pool, old.value) == member->length;
    if (unchanged) {
      unsigned char copy[STORE_BLOCK_SIZE];
      const void *object = zs_read_begin (store->pool, old.value, copy);
      unchanged = memcmp (object, buffer + member->at, member->length) == 0;
      zs_read_end (store->pool, old.value, object);
    }
    if (!unchanged) {
      if (entry)
        pthread_mutex_unlock (stripe);  /* entry_lock left it unlocked */
      backing_release (store->backing, where, member->length);
      continue;
    }
    struct block_content backed = {
      .kind = BLOCK_BACKED, .value = backed_value (where, member->length),
    };
    content_account (store, &old, -1, member->length);
    content_account (store, &backed, 1, 0);
    atomic_store_explicit (&entry->value, backed.value, memory_order_relaxed);
    /* Not an access: the time, the idle flag and the codec stay. */
    uint32_t state = atomic_load (&entry->state);
    atomic_store_explicit (&entry->state,
                           block_state_make (BLOCK_BACKED,
                                             block_state_flags (state),
                                             block_state_atime (state)),
                           memory_order_relaxed);
    pthread_mutex_unlock (stripe);
    zs_free (store->pool, old.value);
    result->blocks++;
    result->bytes += member->length;
  }
  return 0;
}

/* A writeback pass. */
struct writeback_run {
  struct block_store *store;
  const struct store_writeback_request *request;
  uint32_t now;
  unsigned char *buffer;          /* writeback_batch blocks */
  struct store_writeback_result *result;
  bool (*keep_going) (void *opaque);
  void *opaque;
};

static bool
writeback_candidate (void *opaque, uint64_t block, uint32_t state)
{
  struct writeback_run *run = opaque;
  return writeback_wanted (run->request, run->now, block, state);
}

static bool
writeback_more (void *opaque, unsigned *group)
{
  struct writeback_run *run = opaque;
  uint64_t max = run->request->max_blocks, done = run->result->blocks;
  if ((max && done >= max) || (run->keep_going && !run->keep_going (run->opaque)))
    return false;
  if (max && *group > max - done)
    *group = max - done;
  return true;
}

static int
writeback_some (void *opaque, const uint64_t *blocks, unsigned n)
{
  struct writeback_run *run = opaque;
  return writeback_group (run->store, run->request, run->now, blocks, n,
                          run->buffer, run->result);
}

/* One pass over the device for request; writeback_lock held. */
static int
writeback_pass (struct block_store *store,
                const struct store_writeback_request *request,
                bool (*keep_going) (void *opaque), void *opaque,
                unsigned char *buffer, struct store_writeback_result *result)
{
  struct writeback_run run = {
    .store = store, .request = request, .now = store_clock (store),
    .buffer = buffer, .result = result, .keep_going = keep_going,
    .opaque = opaque,
  };
  struct candidates walk = {
    .first = request->first, .last = request->last,
    .group = store->writeback_batch, .wanted = writeback_candidate,
    .more = writeback_more, .work = writeback_some, .opaque = &run,
  };
  return candidates_walk (store, &walk);
}

int
store_writeback (struct block_store *store,
                 const struct store_writeback_request *request,
                 bool (*keep_going) (void *opaque), void *opaque,
                 struct store_writeback_result *result)
{
  memset (result, 0, sizeof *result);
  if (!store->backing) {
    errno = ENODEV;
    return -1;
  }
  unsigned char *buffer = malloc ((size_t) store->writeback_batch
                                  * STORE_BLOCK_SIZE);
  if (!buffer)
    return -1;
  pthread_mutex_lock (&store->writeback_lock);
  int r = writeback_pass (store, request, keep_going, opaque, buffer, result);
  pthread_mutex_unlock (&store->writeback_lock);
  free (buffer);
  zs_pool_flush (store->pool);
  return r;
}

/* The pool's bytes now (what mem_limit counts). */
static uint64_t
pool_bytes (struct block_store *store)
{
  struct zs_pool_stats pool;
  zs_pool_stats (store->pool, &pool);
  return pool.limit_used;
}

int
store_writeback_until (struct block_store *store, uint64_t target,
                       uint64_t max_blocks,
                       bool (*keep_going) (void *opaque), void *opaque,
                       struct store_writeback_result *result)
{
  memset (result, 0, sizeof *result);
  if (!store->backing) {
    errno = ENODEV;
    return -1;
  }
  /* Coldest first: idle blocks, then huge ones, then by age. */
  static const struct { enum store_writeback_type type; uint32_t min_age; }
  passes[] = {
    { WRITEBACK_IDLE, 0 }, { WRITEBACK_HUGE, 0 },
    { WRITEBACK_ANY, 3600 }, { WRITEBACK_ANY, 600 }, { WRITEBACK_ANY, 60 },
    { WRITEBACK_ANY, 10 }, { WRITEBACK_ANY, 1 }, { WRITEBACK_ANY, 0 },
  };
  unsigned char *buffer = malloc ((size_t) store->writeback_batch
                                  * STORE_BLOCK_SIZE);
  if (!buffer)
    return -1;
  int r = 0;
  pthread_mutex_lock (&store->writeback_lock);
  for (unsigned p = 0; p < sizeof passes / sizeof passes[0] && r == 0; p++) {
    if (pool_bytes (store) <= target)
      break;
    /* The pool gives pages back only as zspages empty: write back a
     * slice, compact, look again.
     */
    uint64_t before;
    do {
      before = result->blocks;
      struct store_writeback_request request = {
        .type = passes[p].type, .min_age = passes[p].min_age,
        .first = 0, .last = UINT64_MAX,
        .max_blocks = result->blocks + 8 * store->writeback_batch,
      };
      if (max_blocks && request.max_blocks > max_blocks)
        request.max_blocks = max_blocks;
      r = writeback_pass (store, &request, keep_going, opaque, buffer, result);
      zs_compact (store->pool);
    } while (r == 0 && result->blocks > before
             && (!max_blocks || result->blocks < max_blocks)
             && pool_bytes (store) > target
             && !(keep_going && !keep_going (opaque)));
    if (max_blocks && result->blocks >= max_blocks)
      break;
  }
  pthread_mutex_unlock (&store->writeback_lock);
  free (buffer);
  return r;
}

/* A write refused for memory (errno ENOSPC) with a backing store: write
 * back the coldest blocks, compact, and let the write try again (0) if
 * the pool holds less than before.
 * -1 with errno as it was when there is nothing to gain.  No lock held.
 */
static int
writeback_for_room (struct block_store *store)
{
  int err = errno;
  if (!store->backing || err != ENOSPC)
    return -1;
  struct store_writeback_result result;
  uint64_t used = pool_bytes (store);
  store_writeback_until (store, used > WRITEBACK_ROOM ? used - WRITEBACK_ROOM : 0,
                         0, NULL, NULL, &result);
  errno = err;
  /* Room made by this call, or by another writer's while this one
   * waited for writeback_lock: try again.
   */
  return result.blocks > 0 || pool_bytes (store) < used ? 0 : -1;
}

bool
store_has_backing (const struct block_store *store)
{
  return store->backing != NULL;
}

int
store_set_writeback_limit (struct block_store *store, bool limited,
                           uint64_t bytes)
{
  if (!store->backing) {
    errno = ENODEV;
    return -1;
  }
  /* UINT64_MAX is "no limit": a limit of that many bytes is one. */
  if (limited && bytes == UINT64_MAX)
    bytes--;
  pthread_mutex_lock (&store->writeback_lock);
  atomic_store (&store->writeback_limit, limited ? bytes : UINT64_MAX);
  pthread_mutex_unlock (&store->writeback_lock);
  return 0;
}

/* The table's reclaim grace period: take and drop every stripe lock. */
static void
stripes_sweep (void *opaque)
{
  struct block_store *store = opaque;

  for (unsigned i = 0; i < STORE_STRIPES; i++) {
    pthread_mutex_lock (&store->stripes[i]);
    pthread_mutex_unlock (&store->stripes[i]);
  }
}


uint64_t
store_freeable (struct block_store *store, uint64_t *pages_used)
{
  uint64_t freeable = 0;
  *pages_used = 0;
  for (unsigned c = 0; c < zs_class_count (store->pool); c++) {
    struct zs_class_stats class;
    zs_class_stats (store->pool, c, &class);
    freeable += class.pages_freeable;
    *pages_used += class.pages_used;
  }
  return freeable;
}

uint64_t
store_compact (struct block_store *store)
{
  uint64_t start = monotonic_ns ();
  uint64_t freed = zs_compact (store->pool);
  counter_add (&store->compact_ns, monotonic_ns () - start);
  return freed;
}

size_t
store_release_idle_memory (struct block_store *store)
{
  size_t freed = codec_trim (store->pack_codec);
  for (unsigned p = 0; p <= store->recomp_count; p++)
    freed += codec_trim (store->codecs[p]);
  /* What the data let go of, the process should too: the C library
   * keeps freed request buffers and metadata in its arenas otherwise.
   */
  malloc_trim (0);
  return freed;
}

uint64_t
store_reserve_refill (struct block_store *store)
{
  return zs_pool_reserve_refill (store->pool);
}

bool
store_reserve_release_if_empty (struct block_store *store)
{
  struct zs_pool_stats pool;
  zs_pool_stats (store->pool, &pool);
  if (pool.pages_used > 0)
    return false;
  if (pool.reserve_bytes > 0)
    zs_pool_reserve_release (store->pool);
  return true;
}

bool
store_reserve_low (struct block_store *store)
{
  return zs_pool_reserve_low (store->pool);
}

void
store_flush (struct block_store *store)
{
  block_table_reclaim (&store->table, stripes_sweep, store);
  zs_pool_flush (store->pool);
}

void
store_stats (struct block_store *store, struct store_stats *stats)
{
  struct zs_pool_stats pool;
  zs_pool_stats (store->pool, &pool);

  memset (stats, 0, sizeof *stats);
  stats->orig_data_size = atomic_load (&store->stored_blocks) * STORE_BLOCK_SIZE;
  stats->compr_data_size = atomic_load (&store->compr_bytes);
  stats->mem_used_total = pool.pages_used * ZS_PAGE_SIZE;
  stats->mem_limit = pool.mem_limit;
  stats->limit_used = pool.limit_used;
  stats->mem_used_max = pool.pages_used_max * ZS_PAGE_SIZE;
  stats->same_pages = atomic_load (&store->same_blocks);
  stats->pages_compacted = pool.pages_compacted;
  stats->pages_freeable = pool.pages_freeable;
  stats->compact_ms = atomic_load (&store->compact_ns) / 1000000;
  stats->huge_pages = atomic_load (&store->raw_blocks);
  stats->huge_pages_since = atomic_load (&store->raw_blocks_since);
  stats->failed_reads = atomic_load (&store->failed_reads);
  stats->failed_writes = atomic_load (&store->failed_writes);
  stats->invalid_io = atomic_load (&store->invalid_io);
  stats->notify_free = atomic_load (&store->notify_free);
  stats->reads = atomic_load (&store->reads);
  stats->writes = atomic_load (&store->writes);
  stats->table_bytes = atomic_load (&store->table.bytes);
  stats->metadata_bytes = pool.metadata_bytes;
  for (unsigned p = 0; p <= store->recomp_count; p++)
    stats->codec_bytes += codec_memory (store->codecs[p]);
  stats->recomp_blocks = atomic_load (&store->recomp_blocks);
  stats->packed_blocks = atomic_load (&store->packed_blocks);
  stats->pack_units = atomic_load (&store->pack_units);
  stats->recomp_bytes_saved = atomic_load (&store->recomp_bytes_saved);
  stats->reserve_bytes = pool.reserve_bytes;
  stats->reserve_refills = pool.reserve_refills;
  stats->reserve_misses = pool.reserve_misses;
  stats->codec_bytes += codec_memory (store->pack_codec);
  stats->bd_count = atomic_load (&store->bd_count);
  stats->bd_reads = atomic_load (&store->bd_reads);
  stats->bd_writes = atomic_load (&store->bd_writes);
  stats->bd_bytes = atomic_load (&store->bd_bytes);
  stats->bd_failed_reads = atomic_load (&store->bd_failed_reads);
  stats->bd_readbacks = atomic_load (&store->bd_readbacks);
  if (store->backing) {
    struct backing_stats backing;
    backing_stats (store->backing, &backing);
    stats->backing_capacity = backing.capacity;
    stats->backing_used = backing.used;
    stats->backing_failed = backing.failed;
    stats->backing_reconnects = backing.reconnects;
  }
  stats->writeback_limit_left = atomic_load (&store->writeback_limit);
}
