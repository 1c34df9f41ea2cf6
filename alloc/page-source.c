/* The page source: see page-source.h. */

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "dlist.h"
#include "page-source.h"

void
page_source_init (struct page_source *source)
{
  for (unsigned len = 0; len <= ZS_CHAIN_MAX; len++) {
    pthread_mutex_init (&source->lists[len].lock, NULL);
    source->lists[len].partial = NULL;
    source->lists[len].all = NULL;
    source->lists[len].empty_chunks = 0;
  }
}

static void
chunk_unmap (struct page_chunk *chunk)
{
  munmap (chunk->base, PAGE_CHUNK_BYTES);
  free (chunk);
}

void
page_source_destroy (struct page_source *source)
{
  for (unsigned len = 0; len <= ZS_CHAIN_MAX; len++) {
    struct page_run_list *list = &source->lists[len];
    while (list->all) {
      struct page_chunk *chunk = list->all;
      list->all = chunk->all_next;
      chunk_unmap (chunk);
    }
    list->partial = NULL;
    pthread_mutex_destroy (&list->lock);
  }
}

static struct page_chunk *
chunk_map (unsigned run_pages)
{
  unsigned runs = PAGE_CHUNK_PAGES / run_pages;
  struct page_chunk *chunk = malloc (sizeof *chunk + runs * sizeof (uint16_t));
  if (!chunk)
    return NULL;
  void *base = mmap (NULL, PAGE_CHUNK_BYTES, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    free (chunk);
    errno = ENOMEM;
    return NULL;
  }
#ifdef MADV_NOHUGEPAGE
  madvise (base, PAGE_CHUNK_BYTES, MADV_NOHUGEPAGE);
#endif
  chunk->base = base;
  chunk->run_pages = run_pages;
  chunk->runs = runs;
  chunk->never_used = 0;
  chunk->free_count = runs;
  chunk->free_top = 0;
  return chunk;
}

void *
page_run_alloc (struct page_source *source, unsigned run_pages,
                struct page_chunk **chunk_out)
{
  struct page_run_list *list = &source->lists[run_pages];
  unsigned index;

  pthread_mutex_lock (&list->lock);
  struct page_chunk *chunk = list->partial;
  if (!chunk) {
    /* Mapped under the lock: it is rare (once per 2 MiB of zspages) and
     * it keeps two threads from mapping a chunk each at once.
     */
    chunk = chunk_map (run_pages);
    if (!chunk) {
      pthread_mutex_unlock (&list->lock);
      return NULL;
    }
    DLIST_PUSH (list->all, chunk, all_prev, all_next);
    DLIST_PUSH (list->partial, chunk, prev, next);
    list->empty_chunks++;
  }
  if (chunk->free_count == chunk->runs)
    list->empty_chunks--;
  if (chunk->free_top > 0)
    index = chunk->free_stack[--chunk->free_top];
  else
    index = chunk->never_used++;
  if (--chunk->free_count == 0)
    DLIST_REMOVE (list->partial, chunk, prev, next);
  pthread_mutex_unlock (&list->lock);

  *chunk_out = chunk;
  return chunk->base + (size_t) index * run_pages * ZS_PAGE_SIZE;
}

void
page_run_free (struct page_source *source, struct page_chunk *chunk, void *run)
{
  struct page_run_list *list = &source->lists[chunk->run_pages];
  size_t run_bytes = (size_t) chunk->run_pages * ZS_PAGE_SIZE;
  unsigned index = ((unsigned char *) run - chunk->base) / run_bytes;
  struct page_chunk *unmap = NULL;

  /* The run is still ours: give its memory back before publishing it. */
  madvise (run, run_bytes, MADV_DONTNEED);

  pthread_mutex_lock (&list->lock);
  chunk->free_stack[chunk->free_top++] = index;
  if (chunk->free_count++ == 0)
    DLIST_PUSH (list->partial, chunk, prev, next);
  if (chunk->free_count == chunk->runs) {
    if (list->empty_chunks == 0)
      list->empty_chunks++;     /* keep it as the spare */
    else {
      DLIST_REMOVE (list->partial, chunk, prev, next);
      DLIST_REMOVE (list->all, chunk, all_prev, all_next);
      unmap = chunk;
    }
  }
  pthread_mutex_unlock (&list->lock);

  if (unmap)
    chunk_unmap (unmap);
}
