/* A pool in a region rebuilt after its process died (zs_recover_* in
 * zsalloc.h, RECOVERY in region.h).
 *
 * A crash can stop any change half done: a class list relinked, a free
 * list threaded, a batch of frees drained, an object moved.  Nothing of
 * that is trusted.  What is trusted is what the allocator writes before
 * it lets a handle out, and never changes while the handle lives: a live
 * handle's cell names its zspage, its slot and its size, that zspage's
 * back pointer for the slot names the cell (a mover sets the new slot's
 * back pointer before it rewrites the cell, and clears the old one
 * after), and a zspage's base, chunk and class, a chunk's base and run
 * length, a class's sizes are fixed when made.  So the user hands over
 * every handle its structures reach (zs_recover_handle, which checks
 * each of those facts), and zs_recover_end builds everything else anew
 * from them: each zspage's slots and free list, each class's fullness
 * lists and counters, each cell block's free cells, each chunk's free
 * runs, the page source's lists, the pool's counters and limit account;
 * and it claims in the region every piece of memory it keeps.  What no
 * handle reaches - objects being allocated, freed, or moved from, frees
 * waiting in batches - is free afterwards.  The reserve's chunks are
 * kept (reserve_rebuild): they are whole runs on a stack whose every
 * link was written before the chunk was pushed.
 *
 * The recovery can be killed too, and the next one starts over on what
 * it left.  So it never clears a fact it rebuilds from: a live handle's
 * slot already names it and is left as it is (only slots no live handle
 * names are emptied), the reserve's stack is cut after its last good
 * chunk rather than rebuilt, and everything else it writes (lists, free
 * lists threaded through free slots and cells, counters) is made from
 * the handles alone.  The next recovery gets the same handles, passes
 * the same checks and writes the same.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dlist.h"
#include "zsalloc-internal.h"

/* One zspage, cell block or chunk met, with a bit per slot, cell or run. */
struct met {
  const void *key;
  struct size_class *class;     /* a cell block's class */
  uint64_t bits[8];             /* 512: a chunk's runs, a block's cells */
};

/* An open-addressed set of met things, keyed by address. */
struct met_set {
  struct met *slots;
  size_t capacity, count;
};

struct zs_recovery {
  struct zs_pool *pool;
  struct region *region;
  zs_handle_t *handles;
  size_t count, capacity;
  uint64_t refused;
};

/* The slot of key in slots (capacity of them, never full). */
static struct met *
met_slot (struct met *slots, size_t capacity, const void *key)
{
  size_t i = ((uintptr_t) key * 0x9e3779b97f4a7c15ull >> 20) % capacity;
  while (slots[i].key && slots[i].key != key)
    i = (i + 1) % capacity;
  return &slots[i];
}

/* The entry of key, made if new (*fresh); NULL without memory. */
static struct met *
met_find (struct met_set *set, const void *key, bool *fresh)
{
  if (set->count * 2 >= set->capacity) {
    size_t capacity = set->capacity ? set->capacity * 2 : 1024;
    struct met *slots = calloc (capacity, sizeof *slots);
    if (!slots)
      return NULL;
    for (size_t i = 0; i < set->capacity; i++)
      if (set->slots[i].key)
        *met_slot (slots, capacity, set->slots[i].key) = set->slots[i];
    free (set->slots);
    set->slots = slots;
    set->capacity = capacity;
  }
  struct met *met = met_slot (set->slots, set->capacity, key);
  *fresh = !met->key;
  if (*fresh) {
    *met = (struct met) { .key = key };
    set->count++;
  }
  return met;
}

static bool
bit_set (uint64_t *bits, unsigned i)
{
  bool was = bits[i / 64] >> (i % 64) & 1;
  bits[i / 64] |= (uint64_t) 1 << (i % 64);
  return was;
}

static bool
bit_get (const uint64_t *bits, unsigned i)
{
  return bits[i / 64] >> (i % 64) & 1;
}

struct zs_recovery *
zs_recover_begin (struct zs_pool *pool)
{
  struct zs_recovery *recovery = calloc (1, sizeof *recovery);
  if (!recovery)
    return NULL;
  recovery->pool = pool;
  recovery->region = pool->config.region;
  return recovery;
}

bool
zs_recover_handle (struct zs_recovery *recovery, zs_handle_t handle)
{
  struct zs_pool *pool = recovery->pool;
  struct region *region = recovery->region;
  const void *cell = (const void *) handle;
  if (!region_contains (region, cell, sizeof (uint64_t)) || handle % sizeof (uint64_t))
    goto refuse;
  uint64_t location = handle_load (handle);
  struct zspage *zspage = cell_zspage (location);
  if (!region_contains (region, zspage, sizeof *zspage))
    goto refuse;
  struct size_class *class = class_for_size (pool, cell_object_size (location));
  unsigned index = cell_object_index (location);
  size_t in_block = handle % CELL_BLOCK_BYTES;
  if (index >= class->objs_per_zspage
      || in_block < offsetof (struct cell_block, cells)
      || !region_contains (region, zspage, zspage_descriptor_bytes (class))
      || !region_contains (region, zspage->chunk, sizeof (struct page_chunk))
      || zspage->chunk->run_pages != class->pages_per_zspage
      || zspage->base < zspage->chunk->base
      || (size_t) (zspage->base - zspage->chunk->base)
         >= (size_t) zspage->chunk->runs * zspage->chunk->run_pages * ZS_PAGE_SIZE
      || (size_t) (zspage->base - zspage->chunk->base)
         % ((size_t) zspage->chunk->run_pages * ZS_PAGE_SIZE)
      || zspage->slot_cells[index] != (_Atomic uint64_t *) handle)
    goto refuse;
  if (recovery->count == recovery->capacity) {
    size_t capacity = recovery->capacity ? recovery->capacity * 2 : 4096;
    zs_handle_t *more = realloc (recovery->handles, capacity * sizeof *more);
    if (!more)
      goto refuse;
    recovery->handles = more;
    recovery->capacity = capacity;
  }
  recovery->handles[recovery->count++] = handle;
  return true;

 refuse:
  recovery->refused++;
  return false;
}

/* The class and page source's lists and counters, empty. */
static void
lists_reset (struct zs_pool *pool)
{
  for (unsigned c = 0; c < pool->distinct_classes; c++) {
    struct size_class *class = &pool->classes[c];
    memset (class->groups, 0, sizeof class->groups);
    memset (class->group_counts, 0, sizeof class->group_counts);
    class->nonempty_groups = 0;
    class->zspages = 0;
    class->objs_used = 0;
    class->bytes_stored = 0;
    class->cell_blocks_with_room = NULL;
    class->cell_blocks = NULL;
    class->cell_blocks_count = 0;
  }
  struct page_source *source = &pool->pages;
  for (unsigned len = 0; len <= ZS_CHAIN_MAX; len++) {
    struct page_run_list *list = &source->lists[len];
    list->partial = list->all = list->fresh = NULL;
    list->dirty = NULL;
    list->dirty_count = 0;
    list->empty_chunks = 0;
  }
  /* source->reserve stays: reserve_rebuild walks it. */
  atomic_store (&source->reserve_chunks, 0);
  atomic_store (&source->reserve_spare_pages, 0);
  for (unsigned n = 0; n < ZS_FREE_BATCHES; n++)
    pool->batches[n].count = 0;
}

/* Rebuild one zspage met by handles: its free list, its group. */
static void
zspage_rebuild (struct size_class *class, struct zspage *zspage)
{
  zspage->free_head = ZS_NO_OBJECT;
  zspage->never_used = class->objs_per_zspage;
  zspage->pinned = false;
  zspage->prev = zspage->next = NULL;
  for (unsigned i = class->objs_per_zspage; i-- > 0;)
    if (!zspage->slot_cells[i]) {
      *(uint16_t *) (zspage->base + (size_t) i * class->size) = zspage->free_head;
      zspage->free_head = i;
    }
  zspage_insert (class, zspage);
}

/* A cell block met: its free cells threaded, its class's lists. */
static void
cell_block_rebuild (struct met *met)
{
  struct cell_block *block = (struct cell_block *) met->key;
  struct size_class *class = met->class;
  block->free_cells = NULL;
  block->free_count = 0;
  for (size_t i = CELLS_PER_BLOCK; i-- > 0;)
    if (!bit_get (met->bits, i)) {
      atomic_store_explicit (&block->cells[i],
                             (uint64_t) (uintptr_t) block->free_cells,
                             memory_order_relaxed);
      block->free_cells = &block->cells[i];
      block->free_count++;
    }
  block->prev = block->next = block->all_prev = block->all_next = NULL;
  if (block->free_count)
    DLIST_PUSH (class->cell_blocks_with_room, block, prev, next);
  DLIST_PUSH (class->cell_blocks, block, all_prev, all_next);
  class->cell_blocks_count++;
}

/* A chunk met: its runs not in use are free (given back), its lists. */
static void
chunk_rebuild (struct zs_pool *pool, struct met *met)
{
  struct page_source *source = &pool->pages;
  struct page_chunk *chunk = (struct page_chunk *) met->key;
  struct page_run_list *list = &source->lists[chunk->run_pages];
  size_t run_bytes = (size_t) chunk->run_pages * ZS_PAGE_SIZE;
  chunk->free_top = 0;
  chunk->free_count = 0;
  chunk->never_used = chunk->runs;
  chunk->locked = false;
  chunk->tail_resident = false;
  chunk->from_reserve = false;
  chunk->prev = chunk->next = chunk->all_prev = chunk->all_next = NULL;
  for (unsigned i = chunk->runs; i-- > 0;)
    if (!bit_get (met->bits, i)) {
      region_punch (pool->config.region, chunk->base + i * run_bytes, run_bytes);
      chunk->free_stack[chunk->free_top++] = i;
      chunk->free_count++;
    }
  size_t used = (size_t) chunk->runs * run_bytes;
  if (used < source->chunk_bytes)
    region_punch (pool->config.region, chunk->base + used,
                  source->chunk_bytes - used);
  if (chunk->free_count)
    DLIST_PUSH (list->partial, chunk, prev, next);
  DLIST_PUSH (list->all, chunk, all_prev, all_next);
}

/* Claim a piece of the pool's memory in the region (false: it cannot be
 * one: the pool is beyond repair there).
 */
static bool
claim (struct zs_recovery *recovery, const void *p, size_t bytes, size_t align)
{
  return region_recover_claim (recovery->region, p, bytes, align);
}

/* The reserve's chunks that were on its stack, kept on it: a server
 * restarted under memory pressure must find its reserve populated, as
 * after a clean handover (seen: a recovery that gave them back left the
 * new server populating them in the kernel's reclaim, which waited for
 * the swap device that server is).  The stack is walked in place from
 * its head; a chunk that is not a whole run of the region, or was
 * claimed already (a crash between its taking and the stack's update),
 * ends it there: the rest is given back.  Only that one link is written,
 * so a recovery killed here leaves a stack the next one walks the same
 * way.  Returns the chunks kept.
 */
static uint64_t
reserve_rebuild (struct zs_recovery *recovery)
{
  struct page_source *source = &recovery->pool->pages;
  uint64_t kept = 0;
  uint64_t most = recovery->region->region_bytes / source->chunk_bytes;
  struct reserve_chunk **link = &source->reserve;
  while (*link && kept < most
         && region_contains (recovery->region, *link, source->chunk_bytes)
         && claim (recovery, *link, source->chunk_bytes, REGION_PAGE_SIZE)) {
    kept++;
    link = &(*link)->next;
  }
  *link = NULL;
  atomic_store (&source->reserve_chunks, kept);
  return kept;
}

int
zs_recover_end (struct zs_recovery *recovery, uint64_t charged_bytes,
                struct zs_recover_result *result)
{
  struct zs_pool *pool = recovery->pool;
  struct met_set zspages = { 0 }, blocks = { 0 }, chunks = { 0 };
  int r = -1;
  pool_locks_init (pool);
  lists_reset (pool);
  *result = (struct zs_recover_result) { .refused = recovery->refused };
  uint64_t fixed = sizeof *pool + pool->distinct_classes * sizeof *pool->classes
    + ZS_FREE_BATCHES * sizeof *pool->batches
    + ZS_MOVE_LOCKS * sizeof *pool->move_locks;
  if (!claim (recovery, pool, sizeof *pool, _Alignof (struct zs_pool))
      || !claim (recovery, pool->classes,
                 pool->distinct_classes * sizeof *pool->classes, 64)
      || !claim (recovery, pool->batches,
                 ZS_FREE_BATCHES * sizeof *pool->batches,
                 _Alignof (struct free_batch))
      || !claim (recovery, pool->move_locks,
                 ZS_MOVE_LOCKS * sizeof *pool->move_locks,
                 _Alignof (struct move_lock))) {
    errno = EINVAL;
    goto out;
  }

  /* Pass 1: the live objects marked, nothing written.  A live handle's
   * slot names it already (zs_recover_handle checked it), so a slot is
   * never cleared and set again: a recovery killed part way leaves every
   * live slot as it found it, and the next one finds the same handles
   * live (RECOVERY in region.h).  A second handle for a slot or a cell
   * is refused (the later one lost).
   */
  uint64_t descriptors = 0, pages = 0;
  for (size_t h = 0; h < recovery->count; h++) {
    zs_handle_t handle = recovery->handles[h];
    uint64_t location = handle_load (handle);
    struct zspage *zspage = cell_zspage (location);
    struct size_class *class = class_for_size (pool, cell_object_size (location));
    unsigned index = cell_object_index (location);
    bool fresh;
    struct met *zspage_met = met_find (&zspages, zspage, &fresh);
    if (!zspage_met)
      goto out;
    if (fresh)
      zspage_met->class = class;
    uintptr_t block = handle & ~(uintptr_t) (CELL_BLOCK_BYTES - 1);
    struct met *block_met = met_find (&blocks, (const void *) block, &fresh);
    if (!block_met)
      goto out;
    if (fresh)
      block_met->class = class;
    size_t cell_index = (handle - block
                         - offsetof (struct cell_block, cells)) / 8;
    if (zspage_met->class != class || block_met->class != class
        || bit_get (zspage_met->bits, index)
        || bit_get (block_met->bits, cell_index)) {
      result->refused++;
      continue;
    }
    bit_set (zspage_met->bits, index);
    bit_set (block_met->bits, cell_index);
    class->objs_used++;
    class->bytes_stored += cell_object_size (location);
    result->objects++;
  }
  recovery_step ("allocator: live objects marked");
  /* Pass 2: the slots no live object holds emptied (what a dead
   * allocation, free or move left there), each zspage's count.
   */
  size_t emptied = 0, rebuilt = 0;
  for (size_t i = 0; i < zspages.capacity; i++) {
    struct met *met = &zspages.slots[i];
    if (!met->key)
      continue;
    struct zspage *zspage = (struct zspage *) met->key;
    unsigned inuse = 0;
    for (unsigned slot = 0; slot < met->class->objs_per_zspage; slot++)
      if (bit_get (met->bits, slot))
        inuse++;
      else
        zspage->slot_cells[slot] = NULL;
    zspage->inuse = inuse;
    if (++emptied % 64 == 1)
      recovery_step ("allocator: slots emptied");
  }
  recovery_step ("allocator: zspages counted");
  /* Each zspage listed and claimed, its chunk's run in use. */
  for (size_t i = 0; i < zspages.capacity; i++) {
    struct met *met = &zspages.slots[i];
    if (!met->key)
      continue;
    struct zspage *zspage = (struct zspage *) met->key;
    struct size_class *class = met->class;
    if (zspage->inuse == 0)
      continue;                 /* its only handles were refused */
    bool fresh;
    struct met *chunk_met = met_find (&chunks, zspage->chunk, &fresh);
    if (!chunk_met)
      goto out;
    struct page_chunk *chunk = zspage->chunk;
    size_t run_bytes = (size_t) chunk->run_pages * ZS_PAGE_SIZE;
    if (!claim (recovery, zspage, zspage_descriptor_bytes (class), ZSPAGE_ALIGN)
        || bit_set (chunk_met->bits, (zspage->base - chunk->base) / run_bytes)) {
      errno = EINVAL;
      goto out;
    }
    zspage_rebuild (class, zspage);
    descriptors += zspage_descriptor_bytes (class);
    pages += class->pages_per_zspage;
    if (++rebuilt % 64 == 1)
      recovery_step ("allocator: zspages rebuilt");
  }
  recovery_step ("allocator: zspages listed");
  for (size_t i = 0; i < blocks.capacity; i++)
    if (blocks.slots[i].key) {
      if (!claim (recovery, blocks.slots[i].key, CELL_BLOCK_BYTES,
                  CELL_BLOCK_BYTES)) {
        errno = EINVAL;
        goto out;
      }
      cell_block_rebuild (&blocks.slots[i]);
    }
  recovery_step ("allocator: cell blocks rebuilt");
  for (size_t i = 0; i < chunks.capacity; i++)
    if (chunks.slots[i].key) {
      struct page_chunk *chunk = (struct page_chunk *) chunks.slots[i].key;
      if (!claim (recovery, chunk, sizeof *chunk + chunk->runs * sizeof (uint16_t),
                  _Alignof (struct page_chunk))
          || !claim (recovery, chunk->base, pool->pages.chunk_bytes,
                     REGION_PAGE_SIZE)) {
        errno = EINVAL;
        goto out;
      }
      chunk_rebuild (pool, &chunks.slots[i]);
    }
  recovery_step ("allocator: chunks rebuilt");

  uint64_t reserve_kept = reserve_rebuild (recovery);
  recovery_step ("allocator: reserve kept");

  /* The counters, and the limit account: what is held now. */
  uint64_t block_bytes = (uint64_t) blocks.count * CELL_BLOCK_BYTES;
  atomic_store (&pool->pages_used, pages);
  if (atomic_load (&pool->pages_used_max) < pages)
    atomic_store (&pool->pages_used_max, pages);
  atomic_store (&pool->metadata_bytes, fixed - sizeof *pool + descriptors
                + block_bytes);
  if (pool->config.limit_pages_only) {
    atomic_store (&pool->limit_account, pages * ZS_PAGE_SIZE);
    atomic_store (&pool->reserve_charged, 0);
  }
  else {
    atomic_store (&pool->limit_account, pages * ZS_PAGE_SIZE + descriptors
                  + block_bytes + charged_bytes
                  + reserve_kept * pool->pages.chunk_bytes);
    atomic_store (&pool->reserve_charged,
                  reserve_kept * pool->pages.chunk_pages);
  }
  atomic_store (&pool->reserve_open, false);
  atomic_store (&pool->metadata_allowance, 0);
  result->zspages = zspages.count;
  result->pages = pages;
  r = 0;

 out:
  free (zspages.slots);
  free (blocks.slots);
  free (chunks.slots);
  free (recovery->handles);
  free (recovery);
  return r;
}
