/* The page source: runs of 1..ZS_CHAIN_MAX contiguous pages for zspages.
 *
 * Memory is mapped in chunks (2 MiB; resident_only: 512 KiB), each cut into runs
 * of one length only (a chunk for 3-page runs holds 170 of them), so a run
 * is found and freed in O(1) with no coalescing.  Chunks are mapped
 * MADV_NOHUGEPAGE so one live 4 KiB run cannot pin a 2 MiB huge page.
 *
 * The kernel's per-call costs decide the rest (measured on the 2-core VM
 * this was built on: a first-touch fault 17 us per page, one
 * madvise(MADV_DONTNEED) of 4 pages 30 us - a TLB shootdown - but 0.5 us
 * per page when one call covers 64 MiB, MADV_POPULATE_WRITE 1.5 us per
 * page):
 *   - A new run is populated with one MADV_POPULATE_WRITE call instead of
 *     faulting its pages in one by one as objects fill it.
 *   - A freed run stays resident on its list's "dirty" stack (linked
 *     through the run's own first bytes) and is the first to be reused,
 *     with no fault.  When a list holds more than PAGE_DIRTY_MAX_PAGES
 *     dirty pages, the older half is purged: sorted by address, adjacent
 *     runs merged, one madvise(MADV_DONTNEED) per merged range, and only
 *     then published as free runs of their chunks.  page_source_purge
 *     purges everything (the pool's flush calls it), so RSS follows the
 *     pool's page count to within PAGE_DIRTY_MAX_PAGES per run length
 *     between flushes, and exactly after one.
 *   - A chunk whose runs are all free is unmapped, except one spare per
 *     run length kept to absorb churn (its pages are already given back).
 *
 * LOCKED MEMORY (swap, nbdkit --swap)
 *   Under mlockall the kernel refuses MADV_DONTNEED on locked pages.  The
 *   purge does not assume either way: when madvise fails with EINVAL it
 *   uses MADV_DONTNEED_LOCKED (Linux 5.18), which drops locked pages and
 *   leaves the mapping whole; on older kernels it munlocks the range
 *   first and marks the chunk, so that its runs are locked again
 *   (mlock2 MLOCK_ONFAULT) when they are handed out again - each such
 *   munlock splits the mapping, and the kernel's limit on mappings
 *   (vm.max_map_count) bounds how far that can go.  Unmapping a whole
 *   chunk needs neither.
 *
 * THE RESERVE (swap mode's forward progress)
 *   With a reserve target, the page source keeps up to that many chunks
 *   mapped and populated (locked too, under mlockall) on a reserve stack,
 *   filled by page_source_reserve_add from a background thread.  A new
 *   chunk is taken from the reserve when it holds one, so a write needs no
 *   mmap and no page fault; an empty reserve is a miss, counted, and the
 *   chunk is mapped as usual.  A chunk taken from the reserve keeps its
 *   never-used runs populated: they still count as reserve pages (spare)
 *   until a zspage takes them, the chunk is unmapped, or a drop gives them
 *   back.  The pool counts reserve pages against its memory limit
 *   (pool.c), so what is resident stays within it.
 *
 * RESIDENT ONLY (swap mode: a write never waits on reclaim)
 *   A swap write that faults a page in, or calls MADV_POPULATE_WRITE, may
 *   sit in the kernel's direct reclaim, which waits for the very swap
 *   writes the server should be finishing.  With resident_only set, a run
 *   is handed out only if its pages are resident already: a dirty run, a
 *   never-used run of the list's "fresh" chunk (one taken from the
 *   reserve), or the first run of a new chunk taken from the reserve.
 *   Free-stack runs (given back by a purge) and new mappings are never
 *   used; with nothing resident ready the call fails at once with EAGAIN
 *   (counted in reserve_misses), as the kernel's zram fails an allocation
 *   that would have to wait.  The refilling thread makes runs ready again
 *   (page_source_ready_runs): it takes free-stack runs, populates them
 *   (it may wait on reclaim: it is not on the write path) and puts them
 *   on the dirty stack, and it tops the reserve up.
 *
 *   Nor does a write make any memory-map call (mmap, munmap, madvise):
 *   each takes the process's mmap lock, and a thread of the server that
 *   holds it for reading while in reclaim, with another queued to take
 *   it for writing, would hold every such call behind them - the swap
 *   writes that reclaim waits for included.  So with resident_only a
 *   free never purges (its run joins the dirty stack, however long),
 *   a reserve chunk's tail is given back later, and only the refilling
 *   thread purges (page_source_purge, which then also gives the tails
 *   back): it is the only thread that unmaps a chunk.  Between two
 *   refills the dirty runs may exceed PAGE_DIRTY_MAX_PAGES; they are the
 *   first pages the next writes take.
 */

#ifndef ZSALLOC_PAGE_SOURCE_H
#define ZSALLOC_PAGE_SOURCE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "region.h"
#include "zsalloc.h"

/* A chunk's size: 2 MiB; in resident_only a quarter of that, as each run
 * length takes a chunk of its own from the reserve and its never-used
 * runs stay populated, counted against the limit: up to a chunk per
 * length (16 MiB of 96M on a 256 MiB machine, with 2 MiB chunks).
 */
#define PAGE_CHUNK_PAGES_DEFAULT 512
#define PAGE_CHUNK_PAGES_RESIDENT 128
#define PAGE_DIRTY_MAX_PAGES 256

/* A mapped chunk; all fields guarded by its run list's lock. */
struct page_chunk {
  struct page_chunk *prev, *next; /* on its run list's partial list */
  struct page_chunk *all_prev, *all_next; /* on its list of all chunks */
  unsigned char *base;
  unsigned run_pages;
  unsigned runs;                  /* runs that fit in the chunk */
  unsigned never_used;            /* runs >= this were never handed out */
  unsigned free_count;            /* runs not handed out */
  unsigned free_top;              /* entries in free_stack */
  bool locked;                    /* a purge found its pages locked: lock
                                     runs again when handing them out */
  bool tail_resident;             /* resident_only: the tail no run covers
                                     is still populated (the next purge
                                     gives it back) */
  bool from_reserve;              /* its never-used runs are populated
                                     (a reserve chunk): they count as
                                     reserve_spare_pages */
  uint16_t free_stack[];          /* recycled run indexes */
};

/* A freed run waiting to be purged: lives in the run's first bytes. */
struct dirty_run {
  struct dirty_run *next;
  struct page_chunk *chunk;
};

/* All chunks cutting runs of one length. */
struct page_run_list {
  pthread_mutex_t lock;           /* guards this list, its chunks and its
                                     dirty stack */
  struct page_chunk *partial;     /* chunks with at least one free run */
  struct page_chunk *all;         /* every chunk, for destroy */
  unsigned empty_chunks;          /* chunks on partial that are all free */
  struct page_chunk *fresh;       /* resident_only: the chunk taken from
                                     the reserve whose never-used runs are
                                     handed out next; NULL when none */
  struct dirty_run *dirty;        /* freed, still resident runs, newest first */
  unsigned dirty_count;
};

/* A reserve chunk's mapping waiting to be used: lives in its first bytes. */
struct reserve_chunk {
  struct reserve_chunk *next;
};

struct page_source {
  struct page_run_list lists[ZS_CHAIN_MAX + 1]; /* index = run length */
  _Atomic uint64_t pages_returned; /* given back to the OS, ever */
  pthread_mutex_t purge_lock;     /* one page_source_purge at a time: in
                                     resident_only, the only thread that
                                     unmaps chunks; taken before any run
                                     list's lock */
  pthread_mutex_t reserve_lock;   /* guards reserve; a leaf, taken under a
                                     run list's lock by chunk_map */
  struct reserve_chunk *reserve;  /* populated chunk mappings, newest first */
  _Atomic uint64_t reserve_chunks; /* on the reserve stack */
  _Atomic uint64_t reserve_misses; /* chunks mapped with the reserve empty */
  _Atomic uint64_t reserve_spare_pages; /* never-used runs of chunks taken
                                           from the reserve: populated */
  unsigned reserve_target;        /* chunks to keep; 0: no reserve */
  bool resident_only;             /* hand out resident runs only (RESIDENT
                                     ONLY); set by page_source_init */
  unsigned chunk_pages;           /* pages a chunk maps: PAGE_CHUNK_PAGES_
                                     DEFAULT or _RESIDENT; fixed */
  size_t chunk_bytes;             /* the same in bytes */
  _Atomic uint64_t runs_readied;  /* free runs made resident again by
                                     page_source_ready_runs, ever */
  struct region *region;          /* chunks come from this region (and
                                     go back to it, punched out); NULL:
                                     anonymous mappings */
};

extern void page_source_init (struct page_source *source, bool resident_only,
                              struct region *region);
/* Every lock of the source made anew (init, and a take-over). */
extern void page_source_locks_init (struct page_source *source);
/* Unmap every chunk, whether or not its runs were freed. */
extern void page_source_destroy (struct page_source *source);
/* A run of run_pages pages, or NULL with errno ENOMEM (resident_only:
 * EAGAIN when no resident run is ready).
 */
extern void *page_run_alloc (struct page_source *source, unsigned run_pages,
                             struct page_chunk **chunk);
/* Free a run; it may stay resident until the next purge. */
extern void page_run_free (struct page_source *source, struct page_chunk *chunk,
                           void *run);
/* Give every dirty run back to the operating system now (resident_only:
 * all but PAGE_READY_RUNS_PAGES pages of each run length, kept ready, and
 * only ever from the refilling thread).
 */
extern void page_source_purge (struct page_source *source);
/* Map and populate one chunk onto the reserve: 0, or -1 with errno. */
extern int page_source_reserve_add (struct page_source *source);
/* resident_only: make up to PAGE_READY_RUNS_PAGES pages of each run
 * length's free-stack runs resident again (on the dirty stack), so that
 * the space purged out of partly used chunks is reused.  May wait on the
 * kernel: never call it on the write path.  Returns the pages readied.
 */
#define PAGE_READY_RUNS_PAGES (PAGE_DIRTY_MAX_PAGES / 2)
extern uint64_t page_source_ready_runs (struct page_source *source);
/* Give back one reserve chunk, or else the populated never-used runs of
 * one chunk taken from the reserve: false when there is neither.
 */
extern bool page_source_reserve_drop (struct page_source *source);
/* Populated pages held for the reserve: its chunks, and the never-used
 * runs of chunks taken from it.  Never reads low while pages move from
 * one to the other.
 */
extern uint64_t page_source_reserve_pages (struct page_source *source);

#endif /* ZSALLOC_PAGE_SOURCE_H */
