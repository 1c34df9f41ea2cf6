/* The page source: runs of 1..ZS_CHAIN_MAX contiguous pages for zspages.
 *
 * Memory is mapped in chunks of PAGE_CHUNK_BYTES, each chunk cut into runs
 * of one length only (a chunk for 3-page runs holds 170 of them), so a run
 * is found and freed in O(1) with no coalescing.  A freed run is given back
 * to the operating system at once with madvise(MADV_DONTNEED), outside any
 * lock; a chunk whose runs are all free is unmapped, except one spare per
 * run length kept to absorb alloc/free churn (its pages are already given
 * back, so it costs address space only).  RSS therefore follows the pool's
 * page count.  Chunks are mapped MADV_NOHUGEPAGE so one live 4 KiB run
 * cannot pin a 2 MiB transparent huge page.
 */

#ifndef ZSALLOC_PAGE_SOURCE_H
#define ZSALLOC_PAGE_SOURCE_H

#include <pthread.h>
#include <stdint.h>

#include "zsalloc.h"

#define PAGE_CHUNK_BYTES (2u << 20)
#define PAGE_CHUNK_PAGES (PAGE_CHUNK_BYTES / ZS_PAGE_SIZE)

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
  uint16_t free_stack[];          /* recycled run indexes */
};

/* All chunks cutting runs of one length. */
struct page_run_list {
  pthread_mutex_t lock;           /* guards this list and its chunks */
  struct page_chunk *partial;     /* chunks with at least one free run */
  struct page_chunk *all;         /* every chunk, for destroy */
  unsigned empty_chunks;          /* chunks on partial that are all free */
};

struct page_source {
  struct page_run_list lists[ZS_CHAIN_MAX + 1]; /* index = run length */
};

extern void page_source_init (struct page_source *source);
/* Unmap every chunk, whether or not its runs were freed. */
extern void page_source_destroy (struct page_source *source);
/* A run of run_pages pages, or NULL with errno ENOMEM. */
extern void *page_run_alloc (struct page_source *source, unsigned run_pages,
                             struct page_chunk **chunk);
extern void page_run_free (struct page_source *source, struct page_chunk *chunk,
                           void *run);

#endif /* ZSALLOC_PAGE_SOURCE_H */
