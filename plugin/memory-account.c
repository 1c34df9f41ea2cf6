/* Where the server's resident memory is: see memory-account.h. */

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memory-account.h"

enum mapping_kind { KIND_FILES, KIND_REGION, KIND_HEAP, KIND_STACKS,
                    KIND_ANONYMOUS, KIND_OTHER };

struct mapping {
  uint64_t start, end, resident;
  bool anonymous;               /* no file, no name */
  bool inaccessible;            /* ---p: a guard or reserved room */
  enum mapping_kind named;      /* by its name (anonymous: KIND_ANONYMOUS) */
};

/* A mapping's kind by its name ("[heap]", "/SYSV...", a path); an
 * anonymous one is sorted later, by its neighbours.
 */
static enum mapping_kind
kind_by_name (const char *name, uint64_t inode)
{
  if (strcmp (name, "[heap]") == 0)
    return KIND_HEAP;
  if (strcmp (name, "[stack]") == 0)
    return KIND_STACKS;
  if (strncmp (name, "/SYSV", 5) == 0)
    return KIND_REGION;
  if (name[0] == '[')
    return KIND_OTHER;
  if (name[0] || inode)
    return KIND_FILES;
  return KIND_ANONYMOUS;
}

/* The address room glibc reserves for each malloc arena beyond the main
 * one (HEAP_MAX_SIZE on 64-bit: twice the largest mmap threshold), and
 * aligns each arena to.
 */
#define ARENA_ROOM ((uint64_t) 64 << 20)

/* An anonymous read-write mapping's kind.  A malloc arena is the start
 * of an ARENA_ROOM-aligned room of ARENA_ROOM bytes whose rest follows,
 * reserved and inaccessible; a thread's stack sits right above its guard
 * page.  The arena's rule first: arenas are made one after another, so
 * an arena's start often lies right above the previous one's reserved
 * room, as a stack lies above its guard (seen: 16 worker arenas counted
 * as stacks).
 */
static enum mapping_kind
kind_by_neighbours (const struct mapping *mappings, size_t count, size_t i)
{
  const struct mapping *here = &mappings[i];
  const struct mapping *next = i + 1 < count ? &mappings[i + 1] : NULL;
  if (here->start % ARENA_ROOM == 0
      && (here->end - here->start == ARENA_ROOM        /* grown full */
          || (next && next->anonymous && next->inaccessible
              && next->start == here->end
              && next->end - here->start == ARENA_ROOM)))
    return KIND_HEAP;
  if (i > 0 && mappings[i - 1].anonymous && mappings[i - 1].inaccessible
      && mappings[i - 1].end == here->start)
    return KIND_STACKS;
  return KIND_ANONYMOUS;
}

int
memory_account_take (struct memory_account *account)
{
  memset (account, 0, sizeof *account);
  FILE *fp = fopen ("/proc/self/smaps", "re");
  if (!fp)
    return -1;
  struct mapping *mappings = NULL;
  size_t count = 0, room = 0;
  char *line = NULL;
  size_t line_size = 0;
  int result = 0;
  while (getline (&line, &line_size, fp) != -1) {
    unsigned long long start, end, inode, kib;
    char perms[8];
    int name_at = 0;
    if (sscanf (line, "%llx-%llx %7s %*s %*s %llu %n", &start, &end, perms,
                &inode, &name_at) == 4 && name_at > 0) {
      if (count == room) {
        room = room ? room * 2 : 256;
        struct mapping *grown = realloc (mappings, room * sizeof *mappings);
        if (!grown) {
          result = -1;
          break;
        }
        mappings = grown;
      }
      char *name = line + name_at;
      name[strcspn (name, "\n")] = '\0';
      mappings[count++] = (struct mapping) {
        .start = start, .end = end,
        .anonymous = !name[0] && !inode,
        .inaccessible = strncmp (perms, "---", 3) == 0,
        .named = kind_by_name (name, inode),
      };
    }
    else if (count && sscanf (line, "Rss: %llu kB", &kib) == 1)
      mappings[count - 1].resident = kib * 1024;
  }
  int saved = errno;
  free (line);
  fclose (fp);
  if (result == -1) {
    free (mappings);
    errno = saved;
    return -1;
  }
  for (size_t i = 0; i < count; i++) {
    const struct mapping *m = &mappings[i];
    enum mapping_kind kind = m->named;
    if (kind == KIND_ANONYMOUS && !m->inaccessible)
      kind = kind_by_neighbours (mappings, count, i);
    uint64_t *sum[] = {
      [KIND_FILES] = &account->files, [KIND_REGION] = &account->region,
      [KIND_HEAP] = &account->heap, [KIND_STACKS] = &account->stacks,
      [KIND_ANONYMOUS] = &account->anonymous, [KIND_OTHER] = &account->other,
    };
    *sum[kind] += m->resident;
    account->total += m->resident;
    account->stack_count += kind == KIND_STACKS;
  }
  free (mappings);
#if defined __GLIBC__ && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 heap = mallinfo2 ();
  account->heap_in_use = heap.uordblks + heap.hblkhd;
  account->heap_free_held = heap.fordblks;
#endif
  return 0;
}

void
memory_account_print (const struct memory_account *account,
                      const struct store_stats *store, FILE *fp)
{
#define LINE(name, value) \
  fprintf (fp, "%s %" PRIu64 "\n", name, (uint64_t) (value))
  LINE ("resident", account->total);
  LINE ("resident_files", account->files);
  LINE ("resident_region", account->region);
  LINE ("resident_heap", account->heap);
  LINE ("heap_in_use", account->heap_in_use);
  LINE ("heap_free_held", account->heap_free_held);
  LINE ("resident_stacks", account->stacks);
  LINE ("stacks", account->stack_count);
  LINE ("resident_anonymous", account->anonymous);
  LINE ("resident_other", account->other);
  /* What the store counts of its own, wherever it lives (the pool's
   * pages in the anonymous mappings or the region; metadata and
   * contexts in either, or the heap).
   */
  LINE ("store_pool_pages", store->mem_used_total);
  LINE ("store_reserve", store->reserve_bytes);
  LINE ("store_table", store->table_bytes);
  LINE ("store_metadata", store->metadata_bytes);
  LINE ("store_codec", store->codec_bytes);
  LINE ("store_decode_cache", store->decode_cache_bytes);
  LINE ("store_pack_dictionaries", store->pack_dictionary_bytes);
  uint64_t counted = store_stats_memory (store);
  /* The rest of the memory the process itself holds: neither the files
   * it maps nor what the store counts.
   */
  uint64_t own = account->total - account->files - account->other;
  fprintf (fp, "not_counted_by_store %" PRId64 "\n",
           (int64_t) own - (int64_t) counted);
#undef LINE
}
