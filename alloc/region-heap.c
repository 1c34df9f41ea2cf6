/* The region's heap: runs of whole pages and slabs of small slots, all
 * recorded in the region itself (LAYOUT in region.h), under heap_lock.
 *
 * Runs are found first-fit in the page bitmap from a rover, so a run of
 * n pages costs a scan of the bitmap's words from there (runs are a
 * chunk of a page source, a cell block, a large descriptor: rare next to
 * the objects stored).  A slab page is cut into equal slots of one
 * class; its free slots are threaded through their first two bytes (a
 * slot index) and slots never used are handed out in order, as a
 * zspage's are.  Slab pages with a free slot are listed by class, linked
 * by page number in their page records; a slab whose slots are all free
 * again goes back to the pages.
 */

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "region.h"

#define SLAB_NO_SLOT 0xffff

static inline bool
page_taken (struct region *region, uint64_t page)
{
  return region_page_bits (region)[page / 64] >> (page % 64) & 1;
}

static void
pages_mark (struct region *region, uint64_t first, uint64_t count, bool taken)
{
  for (uint64_t p = first; p < first + count; p++) {
    uint64_t bit = (uint64_t) 1 << (p % 64);
    if (taken)
      region_page_bits (region)[p / 64] |= bit;
    else
      region_page_bits (region)[p / 64] &= ~bit;
  }
}

/* The first page of count free pages at or after start, below end;
 * REGION_NO_PAGE if none.
 */
static uint64_t
run_find (struct region *region, uint64_t start, uint64_t end, uint64_t count)
{
  uint64_t p = start, found = 0;
  while (p < end) {
    if ((p % 64) == 0 && region_page_bits (region)[p / 64] == UINT64_MAX) {
      p += 64;                  /* a word of taken pages */
      found = 0;
      continue;
    }
    if (page_taken (region, p)) {
      p++;
      found = 0;
      continue;
    }
    if (found++ == 0)
      start = p;
    p++;
    if (found == count)
      return start;
  }
  return REGION_NO_PAGE;
}

/* The ready list: free pages still resident (REGION_PAGE_FREE_RESIDENT),
 * linked through their records' prev and next.
 */
static void
ready_push (struct region *region, uint64_t page)
{
  struct region_page *record = &region_pages (region)[page];
  record->kind = REGION_PAGE_FREE_RESIDENT;
  record->prev = REGION_NO_PAGE;
  record->next = region->ready_head;
  if (region->ready_head != REGION_NO_PAGE)
    region_pages (region)[region->ready_head].prev = page;
  region->ready_head = page;
  region->pages_resident_free++;
}

static void
ready_remove (struct region *region, uint64_t page)
{
  struct region_page *record = &region_pages (region)[page];
  if (record->prev != REGION_NO_PAGE)
    region_pages (region)[record->prev].next = record->next;
  else
    region->ready_head = record->next;
  if (record->next != REGION_NO_PAGE)
    region_pages (region)[record->next].prev = record->prev;
  record->prev = record->next = REGION_NO_PAGE;
  region->pages_resident_free--;
}

/* Take a run of count pages: its first page, or REGION_NO_PAGE.  A page
 * alone comes from the ready list when it has one.
 */
static uint64_t
run_take (struct region *region, uint64_t count)
{
  uint64_t pages = region->region_bytes / REGION_PAGE_SIZE;
  uint64_t first = count == 1 ? region->ready_head : REGION_NO_PAGE;
  bool from_ready = first != REGION_NO_PAGE;
  if (first == REGION_NO_PAGE)
    first = run_find (region, region->rover, pages, count);
  if (first == REGION_NO_PAGE)
    first = run_find (region, region->map_pages, pages, count);
  if (first == REGION_NO_PAGE)
    return REGION_NO_PAGE;
  pages_mark (region, first, count, true);
  for (uint64_t p = first; p < first + count; p++) {
    if (region_pages (region)[p].kind == REGION_PAGE_FREE_RESIDENT)
      ready_remove (region, p);
    region_pages (region)[p].kind = p == first ? REGION_PAGE_RUN : REGION_PAGE_RUN_TAIL;
  }
  region_pages (region)[first].run_pages = count;
  region->pages_taken += count;
  if (!from_ready)
    region->rover = first + count;
  if (region->high_water < first + count)
    region->high_water = first + count;
  return first;
}

static void *
page_address (struct region *region, uint64_t page)
{
  return (char *) region + page * REGION_PAGE_SIZE;
}

static uint64_t
page_of (struct region *region, const void *p)
{
  return ((const char *) p - (const char *) region) / REGION_PAGE_SIZE;
}

/* Remove pages from the segment: their memory goes back at once.  Under
 * mlockall the mapping is locked and MADV_REMOVE refuses it (EINVAL):
 * the region's mapping is unlocked then, once - a locked region
 * (SHM_LOCK) keeps its pages resident without it.
 */
static void
punch (struct region *region, uint64_t offset, uint64_t bytes)
{
  char *start = (char *) region + offset;
  if (madvise (start, bytes, MADV_REMOVE) == -1 && errno == EINVAL
      && munlock (region, region->region_bytes) == 0)
    madvise (start, bytes, MADV_REMOVE);
}

/* Give a run back; it is punched out if long, else kept resident. */
static void
run_release (struct region *region, uint64_t first, uint64_t count)
{
  bool punched = count >= REGION_PUNCH_PAGES;
  if (punched)
    punch (region, first * REGION_PAGE_SIZE, count * REGION_PAGE_SIZE);
  for (uint64_t p = first; p < first + count; p++) {
    if (punched)
      region_pages (region)[p].kind = REGION_PAGE_FREE;
    else
      ready_push (region, p);
  }
  pages_mark (region, first, count, false);
  region->pages_taken -= count;
  if (first < region->rover)
    region->rover = first;
}

/* ---- slabs ------------------------------------------------------------ */

static unsigned
slab_class_for (size_t bytes)
{
  unsigned k = 0;
  while ((size_t) REGION_SLAB_MIN << k < bytes)
    k++;
  return k;
}

static size_t
slab_slot_bytes (unsigned class)
{
  return (size_t) REGION_SLAB_MIN << class;
}

static void
slab_list_push (struct region *region, unsigned class, uint64_t page)
{
  uint32_t *head = &region->slab_partial[class];
  region_pages (region)[page].prev = REGION_NO_PAGE;
  region_pages (region)[page].next = *head;
  if (*head != REGION_NO_PAGE)
    region_pages (region)[*head].prev = page;
  *head = page;
}

static void
slab_list_remove (struct region *region, unsigned class, uint64_t page)
{
  struct region_page *record = &region_pages (region)[page];
  if (record->prev != REGION_NO_PAGE)
    region_pages (region)[record->prev].next = record->next;
  else
    region->slab_partial[class] = record->next;
  if (record->next != REGION_NO_PAGE)
    region_pages (region)[record->next].prev = record->prev;
  record->prev = record->next = REGION_NO_PAGE;
}

static void *
slab_alloc (struct region *region, unsigned class)
{
  uint64_t page = region->slab_partial[class];
  if (page == REGION_NO_PAGE) {
    page = run_take (region, 1);
    if (page == REGION_NO_PAGE)
      return NULL;
    struct region_page *record = &region_pages (region)[page];
    record->kind = REGION_PAGE_SLAB;
    record->slab_class = class;
    record->slab_used = 0;
    record->slab_free_head = SLAB_NO_SLOT;
    record->slab_never_used = 0;
    slab_list_push (region, class, page);
  }
  struct region_page *record = &region_pages (region)[page];
  size_t slot_bytes = slab_slot_bytes (class);
  char *base = page_address (region, page);
  unsigned slot;
  if (record->slab_free_head != SLAB_NO_SLOT) {
    slot = record->slab_free_head;
    memcpy (&record->slab_free_head, base + slot * slot_bytes,
            sizeof record->slab_free_head);
  }
  else
    slot = record->slab_never_used++;
  if (++record->slab_used == REGION_PAGE_SIZE / slot_bytes)
    slab_list_remove (region, class, page);
  return base + slot * slot_bytes;
}

static void
slab_free (struct region *region, uint64_t page, void *p)
{
  struct region_page *record = &region_pages (region)[page];
  unsigned class = record->slab_class;
  size_t slot_bytes = slab_slot_bytes (class);
  char *base = page_address (region, page);
  uint16_t slot = ((char *) p - base) / slot_bytes;
  if (record->slab_used == REGION_PAGE_SIZE / slot_bytes)
    slab_list_push (region, class, page);
  memcpy (p, &record->slab_free_head, sizeof record->slab_free_head);
  record->slab_free_head = slot;
  if (--record->slab_used == 0) {
    slab_list_remove (region, class, page);
    run_release (region, page, 1);
  }
}

/* ---- the heap's calls ------------------------------------------------- */

void *
region_alloc (struct region *region, size_t bytes, size_t align)
{
  void *p = NULL;
  pthread_mutex_lock (&region->heap_lock);
  if (bytes <= slab_slot_bytes (REGION_SLAB_CLASSES - 1)
      && align <= slab_slot_bytes (slab_class_for (bytes)))
    p = slab_alloc (region, slab_class_for (bytes));
  else {
    uint64_t first = run_take (region, (bytes + REGION_PAGE_SIZE - 1)
                               / REGION_PAGE_SIZE);
    if (first != REGION_NO_PAGE)
      p = page_address (region, first);
  }
  pthread_mutex_unlock (&region->heap_lock);
  if (!p)
    errno = ENOMEM;
  return p;
}

void
region_free (struct region *region, void *p)
{
  if (!p)
    return;
  uint64_t page = page_of (region, p);
  pthread_mutex_lock (&region->heap_lock);
  if (region_pages (region)[page].kind == REGION_PAGE_SLAB)
    slab_free (region, page, p);
  else
    run_release (region, page, region_pages (region)[page].run_pages);
  pthread_mutex_unlock (&region->heap_lock);
}

void
region_punch (struct region *region, void *start, size_t bytes)
{
  punch (region, (char *) start - (char *) region, bytes);
}

uint64_t
region_trim (struct region *region)
{
  uint64_t trimmed = 0;
  pthread_mutex_lock (&region->heap_lock);
  for (uint64_t p = region->map_pages; p < region->high_water;) {
    if (region_pages (region)[p].kind != REGION_PAGE_FREE_RESIDENT) {
      p++;
      continue;
    }
    uint64_t end = p;
    while (end < region->high_water
           && region_pages (region)[end].kind == REGION_PAGE_FREE_RESIDENT)
      region_pages (region)[end++].kind = REGION_PAGE_FREE;
    punch (region, p * REGION_PAGE_SIZE, (end - p) * REGION_PAGE_SIZE);
    trimmed += end - p;
    p = end;
  }
  region->pages_resident_free -= trimmed;
  region->ready_head = REGION_NO_PAGE;   /* every one of them punched */
  pthread_mutex_unlock (&region->heap_lock);
  return trimmed;
}

/* A free page never made resident (or punched since), taken (a run of
 * one) so that it can be touched outside the lock; REGION_NO_PAGE if
 * none is left.  *cursor: where the search goes on.
 */
static uint64_t
cold_page_take (struct region *region, uint64_t *cursor)
{
  uint64_t pages = region->region_bytes / REGION_PAGE_SIZE;
  for (uint64_t p = *cursor; p < pages; p++)
    if (!page_taken (region, p)
        && region_pages (region)[p].kind == REGION_PAGE_FREE) {
      *cursor = p + 1;
      pages_mark (region, p, 1, true);
      region_pages (region)[p].kind = REGION_PAGE_RUN;
      region_pages (region)[p].run_pages = 1;
      region->pages_taken++;
      if (region->high_water < p + 1)
        region->high_water = p + 1;
      return p;
    }
  *cursor = pages;
  return REGION_NO_PAGE;
}

/* Pages touched a batch at a time: the lock is not held while the
 * kernel finds their memory.
 */
#define READY_BATCH 64

uint64_t
region_make_ready (struct region *region, uint64_t bytes)
{
  uint64_t want = (bytes + REGION_PAGE_SIZE - 1) / REGION_PAGE_SIZE;
  uint64_t cursor = region->map_pages;
  for (;;) {
    uint64_t batch[READY_BATCH];
    unsigned taken = 0;
    pthread_mutex_lock (&region->heap_lock);
    uint64_t ready = region->pages_resident_free;
    while (ready + taken < want && taken < READY_BATCH
           && (batch[taken] = cold_page_take (region, &cursor))
              != REGION_NO_PAGE)
      taken++;
    pthread_mutex_unlock (&region->heap_lock);
    if (!taken)
      return ready * REGION_PAGE_SIZE;
    /* A write makes the shared page (reading would too, and both lock
     * it under SHM_LOCK); its content is the next allocation's to set.
     */
    for (unsigned i = 0; i < taken; i++)
      *(volatile char *) page_address (region, batch[i]) = 0;
    pthread_mutex_lock (&region->heap_lock);
    for (unsigned i = 0; i < taken; i++) {
      pages_mark (region, batch[i], 1, false);
      region->pages_taken--;
      ready_push (region, batch[i]);
    }
    pthread_mutex_unlock (&region->heap_lock);
  }
}

/* ---- rebuilt after a crash (RECOVERY in region.h) ----------------------- */

void
region_recover_begin (struct region *region)
{
  uint64_t pages = region->region_bytes / REGION_PAGE_SIZE;
  pthread_mutex_init (&region->heap_lock, NULL);
  memset (region_page_bits (region), 0, (pages + 63) / 64 * 8);
  for (uint64_t p = region->map_pages; p < region->high_water; p++)
    region_pages (region)[p] = (struct region_page) { .kind = REGION_PAGE_FREE };
  for (uint64_t p = 0; p < region->map_pages; p++)
    region_page_bits (region)[p / 64] |= (uint64_t) 1 << (p % 64);
  for (unsigned k = 0; k < REGION_SLAB_CLASSES; k++)
    region->slab_partial[k] = REGION_NO_PAGE;
  region->pages_taken = 0;
  region->pages_resident_free = 0;
  region->ready_head = REGION_NO_PAGE;
  region->rover = region->map_pages;
}

/* Whether p, of bytes, lies in the heap. */
static bool
in_heap (struct region *region, const void *p, size_t bytes)
{
  uintptr_t start = (uintptr_t) region + region->map_pages * REGION_PAGE_SIZE;
  uintptr_t end = (uintptr_t) region + region->high_water * REGION_PAGE_SIZE;
  return (uintptr_t) p >= start && bytes <= end - (uintptr_t) p
    && (uintptr_t) p <= end;
}

bool
region_recover_claim (struct region *region, const void *p, size_t bytes,
                      size_t align)
{
  if (!p || !bytes || !in_heap (region, p, bytes))
    return false;
  uint64_t page = page_of (region, p);
  struct region_page *record = &region_pages (region)[page];
  if (bytes <= slab_slot_bytes (REGION_SLAB_CLASSES - 1)
      && align <= slab_slot_bytes (slab_class_for (bytes))) {
    unsigned class = slab_class_for (bytes);
    size_t slot_bytes = slab_slot_bytes (class);
    size_t offset = (const char *) p - (const char *) page_address (region, page);
    if (offset % slot_bytes)
      return false;
    if (record->kind == REGION_PAGE_FREE) {
      pages_mark (region, page, 1, true);
      region->pages_taken++;
      *record = (struct region_page) { .kind = REGION_PAGE_SLAB,
                                       .slab_class = class,
                                       .run_pages = 1 };
    }
    else if (record->kind != REGION_PAGE_SLAB || record->slab_class != class)
      return false;
    /* Slots claimed, a bit each (at most 64), kept in the page's list
     * links until region_recover_end threads the free ones.
     */
    unsigned slot = offset / slot_bytes;
    uint64_t claimed;
    memcpy (&claimed, &record->prev, sizeof claimed);
    if (claimed >> slot & 1)
      return false;             /* claimed twice */
    claimed |= (uint64_t) 1 << slot;
    memcpy (&record->prev, &claimed, sizeof claimed);
    record->slab_used++;
    return true;
  }
  uint64_t count = (bytes + REGION_PAGE_SIZE - 1) / REGION_PAGE_SIZE;
  if ((uintptr_t) p % REGION_PAGE_SIZE)
    return false;
  for (uint64_t q = page; q < page + count; q++)
    if (page_taken (region, q))
      return false;
  pages_mark (region, page, count, true);
  for (uint64_t q = page; q < page + count; q++)
    region_pages (region)[q].kind = q == page ? REGION_PAGE_RUN
      : REGION_PAGE_RUN_TAIL;
  region_pages (region)[page].run_pages = count;
  region->pages_taken += count;
  return true;
}

uint64_t
region_recover_end (struct region *region)
{
  /* Slabs: the slots not claimed threaded as free ones. */
  for (uint64_t p = region->map_pages; p < region->high_water; p++) {
    struct region_page *record = &region_pages (region)[p];
    if (record->kind != REGION_PAGE_SLAB)
      continue;
    uint64_t claimed;
    memcpy (&claimed, &record->prev, sizeof claimed);
    unsigned class = record->slab_class;
    size_t slot_bytes = slab_slot_bytes (class);
    unsigned slots = REGION_PAGE_SIZE / slot_bytes;
    char *base = page_address (region, p);
    record->slab_free_head = SLAB_NO_SLOT;
    record->slab_never_used = slots;
    for (unsigned slot = slots; slot-- > 0;)
      if (!(claimed >> slot & 1)) {
        memcpy (base + slot * slot_bytes, &record->slab_free_head,
                sizeof record->slab_free_head);
        record->slab_free_head = slot;
      }
    record->prev = record->next = REGION_NO_PAGE;
    if (record->slab_used < slots)
      slab_list_push (region, class, p);
  }
  /* Every page no one claimed goes back to the system. */
  uint64_t punched = 0;
  for (uint64_t p = region->map_pages; p < region->high_water;) {
    if (page_taken (region, p)) {
      p++;
      continue;
    }
    uint64_t end = p;
    while (end < region->high_water && !page_taken (region, end))
      end++;
    punch (region, p * REGION_PAGE_SIZE, (end - p) * REGION_PAGE_SIZE);
    punched += end - p;
    p = end;
  }
  return punched;
}
