/* The page source: see page-source.h. */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dlist.h"
#include "page-source.h"
#include "zsalloc-internal.h"

#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24 /* Linux 5.18 */
#endif

/* Give a range of freed pages back to the system: false if they stay.
 * Locked pages (mlockall) refuse MADV_DONTNEED: MADV_DONTNEED_LOCKED
 * (Linux 5.18) drops them and keeps the mapping whole; before it, they
 * are unlocked first (*unlocked: lock them again when reused), which
 * splits the mapping.
 */
static bool
range_give_back (struct page_source *source, unsigned char *start,
                 size_t length, bool *unlocked)
{
  if (source->region) {
    region_punch (source->region, start, length);
    return true;
  }
  if (madvise (start, length, MADV_DONTNEED) == 0)
    return true;
  if (errno != EINVAL)
    return false;
  if (madvise (start, length, MADV_DONTNEED_LOCKED) == 0)
    return true;
  if (munlock (start, length) == -1)
    return false;
  *unlocked = true;
  return madvise (start, length, MADV_DONTNEED) == 0;
}

/* Give back a range that is never handed out (a chunk's tail): locked or
 * not, and without splitting the mapping (an older kernel keeps it).
 */
static void
range_give_back_unlocked (struct page_source *source, unsigned char *start,
                          size_t length)
{
  if (source->region)
    region_punch (source->region, start, length);
  else if (madvise (start, length, MADV_DONTNEED) == -1 && errno == EINVAL)
    madvise (start, length, MADV_DONTNEED_LOCKED);
}

void
page_source_locks_init (struct page_source *source)
{
  pthread_mutex_init (&source->purge_lock, NULL);
  pthread_mutex_init (&source->reserve_lock, NULL);
  for (unsigned len = 0; len <= ZS_CHAIN_MAX; len++)
    pthread_mutex_init (&source->lists[len].lock, NULL);
}

void
page_source_init (struct page_source *source, bool resident_only,
                  struct region *region)
{
  source->region = region;
  atomic_init (&source->pages_returned, 0);
  page_source_locks_init (source);
  source->reserve = NULL;
  atomic_init (&source->reserve_chunks, 0);
  atomic_init (&source->reserve_misses, 0);
  atomic_init (&source->reserve_spare_pages, 0);
  source->reserve_target = 0;
  source->resident_only = resident_only;
  source->chunk_pages = resident_only ? PAGE_CHUNK_PAGES_RESIDENT
    : PAGE_CHUNK_PAGES_DEFAULT;
  source->chunk_bytes = (size_t) source->chunk_pages * ZS_PAGE_SIZE;
  atomic_init (&source->runs_readied, 0);
  for (unsigned len = 0; len <= ZS_CHAIN_MAX; len++) {
    source->lists[len].partial = NULL;
    source->lists[len].all = NULL;
    source->lists[len].dirty = NULL;
    source->lists[len].dirty_count = 0;
    source->lists[len].empty_chunks = 0;
    source->lists[len].fresh = NULL;
  }
}

/* The never-used runs of a reserve chunk: populated, not counted as
 * pages of zspages.  The run list's lock is held.
 */
static uint64_t
chunk_spare_pages (const struct page_chunk *chunk)
{
  return chunk->from_reserve
    ? (uint64_t) (chunk->runs - chunk->never_used) * chunk->run_pages : 0;
}

/* Give a chunk's worth of address space back (chunk_mapping's). */
static void
mapping_free (struct page_source *source, void *base)
{
  if (source->region)
    region_free (source->region, base);
  else
    munmap (base, source->chunk_bytes);
}

/* Unmap a chunk, whose list lock is not held (it is off every list). */
static void
chunk_unmap (struct page_source *source, struct page_chunk *chunk)
{
  atomic_fetch_sub (&source->reserve_spare_pages, chunk_spare_pages (chunk));
  mapping_free (source, chunk->base);
  region_memory_free (source->region, chunk);
}

/* The newest reserve chunk, or NULL.  spare_pages of it stay populated
 * and unused (0 when it is dropped): they are counted as spare before the
 * chunk leaves the stack, so page_source_reserve_pages never reads low.
 */
static void *
reserve_take (struct page_source *source, uint64_t spare_pages)
{
  pthread_mutex_lock (&source->reserve_lock);
  struct reserve_chunk *chunk = source->reserve;
  if (chunk) {
    source->reserve = chunk->next;
    atomic_fetch_add (&source->reserve_spare_pages, spare_pages);
    atomic_fetch_sub (&source->reserve_chunks, 1);
  }
  pthread_mutex_unlock (&source->reserve_lock);
  return chunk;
}

void
page_source_destroy (struct page_source *source)
{
  for (unsigned len = 0; len <= ZS_CHAIN_MAX; len++) {
    struct page_run_list *list = &source->lists[len];
    while (list->all) {
      struct page_chunk *chunk = list->all;
      list->all = chunk->all_next;
      chunk_unmap (source, chunk);
    }
    list->partial = NULL;
    pthread_mutex_destroy (&list->lock);
  }
  /* The reserve's chunks (the spare runs went with their chunks). */
  void *base;
  while ((base = reserve_take (source, 0)))
    mapping_free (source, base);
  pthread_mutex_destroy (&source->reserve_lock);
  pthread_mutex_destroy (&source->purge_lock);
}

/* A chunk's worth of fresh address space. */
static void *
chunk_mapping (struct page_source *source)
{
  if (source->region)
    return region_alloc (source->region, source->chunk_bytes,
                         REGION_PAGE_SIZE);
  void *base = mmap (NULL, source->chunk_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    errno = ENOMEM;
    return NULL;
  }
#ifdef MADV_NOHUGEPAGE
  madvise (base, source->chunk_bytes, MADV_NOHUGEPAGE);
#endif
  return base;
}

int
page_source_reserve_add (struct page_source *source)
{
  void *base = chunk_mapping (source);
  if (!base)
    return -1;
#ifdef MADV_POPULATE_WRITE
  if (madvise (base, source->chunk_bytes, MADV_POPULATE_WRITE) == -1)
#endif
    memset (base, 0, source->chunk_bytes);   /* an older kernel: fault it in */
  struct reserve_chunk *chunk = base;
  pthread_mutex_lock (&source->reserve_lock);
  chunk->next = source->reserve;
  source->reserve = chunk;
  atomic_fetch_add (&source->reserve_chunks, 1);
  pthread_mutex_unlock (&source->reserve_lock);
  return 0;
}

uint64_t
page_source_reserve_pages (struct page_source *source)
{
  return atomic_load (&source->reserve_chunks) * source->chunk_pages
    + atomic_load (&source->reserve_spare_pages);
}

/* Give back the never-used runs of one reserve chunk: false if no chunk
 * has any.  The list lock is held across the madvise, so none of those
 * runs can be handed out meanwhile.
 */
static bool
reserve_spare_drop (struct page_source *source)
{
  for (unsigned len = 1; len <= ZS_CHAIN_MAX; len++) {
    struct page_run_list *list = &source->lists[len];
    pthread_mutex_lock (&list->lock);
    for (struct page_chunk *chunk = list->all; chunk; chunk = chunk->all_next) {
      uint64_t spare = chunk_spare_pages (chunk);
      if (spare == 0)
        continue;
      size_t run_bytes = (size_t) chunk->run_pages * ZS_PAGE_SIZE;
      bool unlocked = false;
      range_give_back (source, chunk->base + chunk->never_used * run_bytes,
                       spare * ZS_PAGE_SIZE, &unlocked);
      chunk->locked |= unlocked;
      chunk->from_reserve = false;
      if (list->fresh == chunk)
        list->fresh = NULL;     /* its never-used runs are not resident */
      atomic_fetch_sub (&source->reserve_spare_pages, spare);
      pthread_mutex_unlock (&list->lock);
      return true;
    }
    pthread_mutex_unlock (&list->lock);
  }
  return false;
}

bool
page_source_reserve_drop (struct page_source *source)
{
  void *base = reserve_take (source, 0);
  if (base) {
    mapping_free (source, base);
    return true;
  }
  return reserve_spare_drop (source);
}

/* A new chunk: from the reserve when it has one; else a new mapping,
 * unless the source hands out resident runs only (NULL, EAGAIN).
 */
static struct page_chunk *
chunk_map (struct page_source *source, unsigned run_pages)
{
  unsigned runs = source->chunk_pages / run_pages;
  struct page_chunk *chunk = region_memory_alloc (source->region, sizeof *chunk
                                               + runs * sizeof (uint16_t),
                                               _Alignof (struct page_chunk));
  if (!chunk)
    return NULL;
  void *base = reserve_take (source, (uint64_t) runs * run_pages);
  chunk->from_reserve = base != NULL;
  chunk->tail_resident = false;
  if (base) {
    /* The tail no run covers is never used: give it back now, or in
     * resident_only at the next purge (no memory-map call on the write
     * path: RESIDENT ONLY).
     */
    size_t used = (size_t) runs * run_pages * ZS_PAGE_SIZE;
    if (used < source->chunk_bytes && source->resident_only)
      chunk->tail_resident = true;
    else if (used < source->chunk_bytes)
      range_give_back_unlocked (source, (unsigned char *) base + used,
                                source->chunk_bytes - used);
  }
  else {
    if (source->reserve_target)
      atomic_fetch_add (&source->reserve_misses, 1);
    if (source->resident_only) {
      region_memory_free (source->region, chunk);
      errno = EAGAIN;
      return NULL;
    }
    base = chunk_mapping (source);
  }
  if (!base) {
    region_memory_free (source->region, chunk);
    return NULL;
  }
  chunk->base = base;
  chunk->locked = false;
  chunk->run_pages = run_pages;
  chunk->runs = runs;
  chunk->never_used = 0;
  chunk->free_count = runs;
  chunk->free_top = 0;
  return chunk;
}

/* Publish a run as free in its chunk; the list lock is held.  Returns
 * the chunk if it became all free and must be unmapped.
 */
static struct page_chunk *
run_publish (struct page_run_list *list, struct page_chunk *chunk, void *run)
{
  size_t run_bytes = (size_t) chunk->run_pages * ZS_PAGE_SIZE;

  chunk->free_stack[chunk->free_top++] = ((unsigned char *) run - chunk->base)
    / run_bytes;
  if (chunk->free_count++ == 0)
    DLIST_PUSH (list->partial, chunk, prev, next);
  if (chunk->free_count < chunk->runs)
    return NULL;
  if (list->empty_chunks == 0) {
    list->empty_chunks++;       /* keep it as the spare */
    return NULL;
  }
  DLIST_REMOVE (list->partial, chunk, prev, next);
  DLIST_REMOVE (list->all, chunk, all_prev, all_next);
  if (list->fresh == chunk)
    list->fresh = NULL;
  return chunk;
}

/* Make a run's pages resident (and locked again if a purge had to unlock
 * them, a kernel before 5.18: on fault, as mlockall(MCL_ONFAULT) would,
 * so the mapping can merge back).  One MADV_POPULATE_WRITE call instead
 * of a fault per page; a kernel without it (EINVAL) faults them in.
 * May wait on reclaim: never on the write path of a resident_only source.
 */
static void
run_make_resident (unsigned char *run, unsigned run_pages, bool locked,
                   bool touch_if_no_populate)
{
  size_t bytes = (size_t) run_pages * ZS_PAGE_SIZE;
  if (locked)
    mlock2 (run, bytes, MLOCK_ONFAULT);
#ifdef MADV_POPULATE_WRITE
  if (madvise (run, bytes, MADV_POPULATE_WRITE) == 0)
    return;
#endif
  if (touch_if_no_populate)
    for (size_t offset = 0; offset < bytes; offset += ZS_PAGE_SIZE)
      ((volatile unsigned char *) run)[offset] = 0;
}

/* Hand out a run of chunk from its free stack, or else its next never-used
 * run; the list lock is held and the chunk has a free run.
 */
static unsigned char *
chunk_take_run (struct page_source *source, struct page_run_list *list,
                struct page_chunk *chunk, bool never_used_first)
{
  unsigned index;
  if (chunk->free_count == chunk->runs)
    list->empty_chunks--;
  if (chunk->free_top > 0 && !(never_used_first
                               && chunk->never_used < chunk->runs))
    index = chunk->free_stack[--chunk->free_top];
  else {
    index = chunk->never_used++;
    /* A reserve chunk's run: a zspage's page from now on. */
    if (chunk->from_reserve)
      atomic_fetch_sub (&source->reserve_spare_pages, chunk->run_pages);
  }
  if (--chunk->free_count == 0)
    DLIST_REMOVE (list->partial, chunk, prev, next);
  return chunk->base + (size_t) index * chunk->run_pages * ZS_PAGE_SIZE;
}

/* A new chunk on the list's lists; NULL with errno. */
static struct page_chunk *
list_add_chunk (struct page_source *source, struct page_run_list *list,
                unsigned run_pages)
{
  /* Mapped under the lock: it is rare (once per 2 MiB of zspages) and it
   * keeps two threads from mapping a chunk each at once.
   */
  struct page_chunk *chunk = chunk_map (source, run_pages);
  if (chunk) {
    DLIST_PUSH (list->all, chunk, all_prev, all_next);
    DLIST_PUSH (list->partial, chunk, prev, next);
    list->empty_chunks++;
  }
  return chunk;
}

/* RESIDENT ONLY: a never-used run of the fresh chunk, taking a new fresh
 * chunk from the reserve when it has none left; NULL (EAGAIN) when the
 * reserve is empty.  The list lock is held.
 */
static unsigned char *
fresh_run_take (struct page_source *source, struct page_run_list *list,
                unsigned run_pages, struct page_chunk **chunk_out)
{
  struct page_chunk *chunk = list->fresh;
  if (!chunk || chunk->never_used == chunk->runs) {
    list->fresh = NULL;
    if (!(chunk = list_add_chunk (source, list, run_pages)))
      return NULL;
    list->fresh = chunk;
  }
  unsigned char *run = chunk_take_run (source, list, chunk, true);
  if (chunk->never_used == chunk->runs)
    list->fresh = NULL;
  *chunk_out = chunk;
  return run;
}

void *
page_run_alloc (struct page_source *source, unsigned run_pages,
                struct page_chunk **chunk_out)
{
  struct page_run_list *list = &source->lists[run_pages];

  pthread_mutex_lock (&list->lock);
  struct dirty_run *dirty = list->dirty;
  if (dirty) {                  /* resident already: no fault, no call */
    list->dirty = dirty->next;
    list->dirty_count--;
    *chunk_out = dirty->chunk;
    pthread_mutex_unlock (&list->lock);
    return dirty;
  }
  if (source->resident_only) {
    unsigned char *run = fresh_run_take (source, list, run_pages, chunk_out);
    pthread_mutex_unlock (&list->lock);
    return run;
  }

  struct page_chunk *chunk = list->partial;
  if (!chunk && !(chunk = list_add_chunk (source, list, run_pages))) {
    pthread_mutex_unlock (&list->lock);
    return NULL;
  }
  unsigned char *run = chunk_take_run (source, list, chunk, false);
  bool locked = chunk->locked;
  pthread_mutex_unlock (&list->lock);

  run_make_resident (run, run_pages, locked, false);
  *chunk_out = chunk;
  return run;
}

/* A chunk of the list with a free run that is not resident (on its free
 * stack, or never used and not the fresh chunk's), or NULL.  The list
 * lock is held.
 */
static struct page_chunk *
list_chunk_to_ready (struct page_run_list *list)
{
  for (struct page_chunk *chunk = list->partial; chunk; chunk = chunk->next)
    if (chunk->free_top > 0
        || (chunk != list->fresh && chunk->never_used < chunk->runs))
      return chunk;
  return NULL;
}

uint64_t
page_source_ready_runs (struct page_source *source)
{
  uint64_t readied = 0;
  for (unsigned len = 1; len <= ZS_CHAIN_MAX; len++) {
    struct page_run_list *list = &source->lists[len];
    for (;;) {
      pthread_mutex_lock (&list->lock);
      struct page_chunk *chunk = list->dirty_count * len < PAGE_READY_RUNS_PAGES
        ? list_chunk_to_ready (list) : NULL;
      if (!chunk) {
        pthread_mutex_unlock (&list->lock);
        break;
      }
      /* Handed out meanwhile, so the chunk stays mapped. */
      struct dirty_run *run = (struct dirty_run *) chunk_take_run (source, list,
                                                                  chunk, false);
      bool locked = chunk->locked;
      pthread_mutex_unlock (&list->lock);

      run_make_resident ((unsigned char *) run, len, locked, true);

      pthread_mutex_lock (&list->lock);
      run->chunk = chunk;
      run->next = list->dirty;
      list->dirty = run;
      list->dirty_count++;
      pthread_mutex_unlock (&list->lock);
      readied += len;
    }
  }
  atomic_fetch_add (&source->runs_readied, readied);
  return readied;
}

struct purge_entry {
  unsigned char *run;
  struct page_chunk *chunk;
  bool was_locked;              /* its pages had to be unlocked */
};

static int
purge_entry_compare (const void *a, const void *b)
{
  const struct purge_entry *x = a, *y = b;
  return (x->run > y->run) - (x->run < y->run);
}

/* Purge a detached chain of dirty runs (no lock held): give their pages
 * back in as few calls as possible, then publish them as free.  A chunk
 * that these runs leave all free (and is not needed as the spare) is
 * unmapped whole instead: no madvise for its runs at all, which is what
 * a mass free mostly meets.
 */
static void
purge_runs (struct page_source *source, struct page_run_list *list,
            unsigned run_pages, struct dirty_run *chain)
{
  struct purge_entry entries[PAGE_DIRTY_MAX_PAGES + 1];
  struct page_chunk *unmap[PAGE_DIRTY_MAX_PAGES + 1];
  size_t run_bytes = (size_t) run_pages * ZS_PAGE_SIZE;
  unsigned n = 0, unmaps = 0;

  for (struct dirty_run *run = chain; run; run = run->next)
    entries[n++] = (struct purge_entry) { (unsigned char *) run, run->chunk,
                                          false };
  qsort (entries, n, sizeof entries[0], purge_entry_compare);
  atomic_fetch_add_explicit (&source->pages_returned, (uint64_t) n * run_pages,
                             memory_order_relaxed);

  /* Sorted by address, the runs of one chunk are adjacent. */
  pthread_mutex_lock (&list->lock);
  for (unsigned i = 0, j; i < n; i = j) {
    struct page_chunk *chunk = entries[i].chunk;
    for (j = i + 1; j < n && entries[j].chunk == chunk; j++)
      ;
    if (chunk->free_count + (j - i) == chunk->runs && list->empty_chunks > 0) {
      if (chunk->free_count > 0)
        DLIST_REMOVE (list->partial, chunk, prev, next);
      DLIST_REMOVE (list->all, chunk, all_prev, all_next);
      if (list->fresh == chunk)
        list->fresh = NULL;
      unmap[unmaps++] = chunk;
      for (unsigned k = i; k < j; k++)
        entries[k].run = NULL;
    }
  }
  pthread_mutex_unlock (&list->lock);
  for (unsigned i = 0; i < unmaps; i++)
    chunk_unmap (source, unmap[i]);

  for (unsigned i = 0, j; i < n; i = j) {
    for (j = i + 1; j < n && entries[i].run
           && entries[j].run == entries[j - 1].run + run_bytes; j++)
      ;
    if (!entries[i].run)
      continue;
    bool unlocked = false;
    if (!range_give_back (source, entries[i].run, (j - i) * run_bytes,
                          &unlocked))
      atomic_fetch_sub_explicit (&source->pages_returned,
                                 (uint64_t) (j - i) * run_pages,
                                 memory_order_relaxed);
    for (unsigned k = i; k < j; k++)
      entries[k].was_locked = unlocked;
  }

  unmaps = 0;
  pthread_mutex_lock (&list->lock);
  for (unsigned i = 0; i < n; i++) {
    if (entries[i].was_locked)
      entries[i].chunk->locked = true;
    struct page_chunk *empty = entries[i].run
      ? run_publish (list, entries[i].chunk, entries[i].run) : NULL;
    if (empty)
      unmap[unmaps++] = empty;
  }
  pthread_mutex_unlock (&list->lock);
  for (unsigned i = 0; i < unmaps; i++)
    chunk_unmap (source, unmap[i]);
}

void
page_run_free (struct page_source *source, struct page_chunk *chunk, void *run)
{
  struct page_run_list *list = &source->lists[chunk->run_pages];
  unsigned limit = PAGE_DIRTY_MAX_PAGES / chunk->run_pages;
  struct dirty_run *dirty = run, *older = NULL;

  pthread_mutex_lock (&list->lock);
  dirty->chunk = chunk;
  dirty->next = list->dirty;
  list->dirty = dirty;
  /* resident_only: the purge is the refilling thread's (RESIDENT ONLY). */
  if (++list->dirty_count > limit && !source->resident_only) {
    /* Keep the newest half resident for reuse; purge the rest. */
    struct dirty_run *last_kept = list->dirty;
    for (unsigned i = 1; i < limit / 2; i++)
      last_kept = last_kept->next;
    older = last_kept->next;
    last_kept->next = NULL;
    list->dirty_count = limit / 2;  /* limit >= 16: never 0 */
  }
  pthread_mutex_unlock (&list->lock);

  if (older)
    purge_runs (source, list, chunk->run_pages, older);
}

/* Give back the never-used tails of the chunks of a list that resident_only
 * left resident (chunk_map).  purge_lock is held: in resident_only only
 * its holder unmaps chunks, so they stay mapped while their tails are
 * given back outside the list's lock.
 */
static void
tails_give_back (struct page_source *source, struct page_run_list *list,
                 unsigned run_pages)
{
  size_t used = (size_t) (source->chunk_pages / run_pages) * run_pages
    * ZS_PAGE_SIZE;
  if (used == source->chunk_bytes)
    return;
  for (;;) {
    unsigned char *tails[16];
    unsigned n = 0;
    pthread_mutex_lock (&list->lock);
    for (struct page_chunk *chunk = list->all; chunk && n < 16;
         chunk = chunk->all_next)
      if (chunk->tail_resident) {
        chunk->tail_resident = false;
        tails[n++] = chunk->base + used;
      }
    pthread_mutex_unlock (&list->lock);
    for (unsigned i = 0; i < n; i++)
      range_give_back_unlocked (source, tails[i], source->chunk_bytes - used);
    if (n < 16)
      return;
  }
}

void
page_source_purge (struct page_source *source)
{
  pthread_mutex_lock (&source->purge_lock);
  for (unsigned len = 1; len <= ZS_CHAIN_MAX; len++) {
    struct page_run_list *list = &source->lists[len];
    /* resident_only: the runs made ready for writes stay (RESIDENT ONLY),
     * at most PAGE_READY_RUNS_PAGES pages of them; the dirty stack may
     * have grown past PAGE_DIRTY_MAX_PAGES since the last purge, so it is
     * purged in slices that purge_runs can hold.
     */
    unsigned keep = source->resident_only ? PAGE_READY_RUNS_PAGES / len : 0;
    unsigned slice = PAGE_DIRTY_MAX_PAGES / len;
    for (;;) {
      pthread_mutex_lock (&list->lock);
      struct dirty_run *chain = NULL;
      if (list->dirty_count > keep) {
        struct dirty_run **link = &list->dirty;
        for (unsigned i = 0; i < keep; i++)
          link = &(*link)->next;
        chain = *link;
        unsigned taken = 1;
        struct dirty_run *last = chain;
        while (taken < slice && last->next) {
          last = last->next;
          taken++;
        }
        *link = last->next;
        last->next = NULL;
        list->dirty_count -= taken;
      }
      pthread_mutex_unlock (&list->lock);
      if (!chain)
        break;
      purge_runs (source, list, len, chain);
    }
    if (source->resident_only)
      tails_give_back (source, list, len);
  }
  pthread_mutex_unlock (&source->purge_lock);
}
