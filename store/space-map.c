/* The backing store's space map: see space-map.h. */

#include <errno.h>
#include <stdlib.h>

#include "crc32c.h"
#include "space-map.h"

#define LEAF_SECTORS SPACE_MAP_LEAF_SECTORS
#define LEAF_WORDS (LEAF_SECTORS / 64)

/* The sectors leaf i covers (the last one may be short). */
static uint32_t
leaf_sectors (const struct space_map *map, uint64_t leaf)
{
  uint64_t left = map->sectors - leaf * LEAF_SECTORS;
  return left < LEAF_SECTORS ? left : LEAF_SECTORS;
}

int
space_map_init (struct space_map *map, uint64_t sectors)
{
  *map = (struct space_map) { .sectors = sectors };
  pthread_mutex_init (&map->lock, NULL);
  map->free_sectors = sectors;
  map->leaf_count = (sectors + LEAF_SECTORS - 1) / LEAF_SECTORS;
  map->tree_base = 1;
  while (map->tree_base < map->leaf_count)
    map->tree_base *= 2;
  map->leaves = calloc (map->leaf_count ? map->leaf_count : 1,
                        sizeof *map->leaves);
  map->longest = calloc (2 * map->tree_base, sizeof *map->longest);
  map->longest_runs = calloc (map->leaf_count ? map->leaf_count : 1,
                              sizeof *map->longest_runs);
  if (!map->leaves || !map->longest || !map->longest_runs) {
    /* Nothing half made: the caller destroys only a map that was made. */
    space_map_destroy (map);
    errno = ENOMEM;
    return -1;
  }
  map->map_bytes = map->leaf_count
    * (sizeof *map->leaves + sizeof *map->longest_runs)
    + 2 * map->tree_base * sizeof *map->longest;
  /* Every leaf free: its longest run is all of it. */
  for (uint64_t i = 0; i < map->leaf_count; i++) {
    map->longest[map->tree_base + i] = leaf_sectors (map, i);
    map->longest_runs[i] = 1;
  }
  for (uint64_t node = map->tree_base; node-- > 1;) {
    uint16_t a = map->longest[2 * node], b = map->longest[2 * node + 1];
    map->longest[node] = a > b ? a : b;
  }
  return 0;
}

/* Set leaf i's longest free run and bring its ancestors up to date. */
static void
tree_set (struct space_map *map, uint64_t leaf, uint16_t longest)
{
  uint64_t node = map->tree_base + leaf;
  map->longest[node] = longest;
  for (node /= 2; node >= 1; node /= 2) {
    uint16_t a = map->longest[2 * node], b = map->longest[2 * node + 1];
    uint16_t max = a > b ? a : b;
    if (map->longest[node] == max)
      break;                    /* and so are those above */
    map->longest[node] = max;
  }
}

/* The first leaf with a free run of count sectors, or leaf_count. */
static uint64_t
tree_find (const struct space_map *map, uint32_t count)
{
  if (map->longest[1] < count)
    return map->leaf_count;
  uint64_t node = 1;
  while (node < map->tree_base)
    node = map->longest[2 * node] >= count ? 2 * node : 2 * node + 1;
  return node - map->tree_base;
}

/* The first sector at or after from, below end, whose bit is set (one)
 * or clear (!one); end if none.
 */
static uint32_t
bit_find (const uint64_t *bits, uint32_t from, uint32_t end, bool one)
{
  while (from < end) {
    uint64_t word = bits[from / 64];
    if (!one)
      word = ~word;
    word &= ~0ull << (from % 64);
    if (word) {
      uint32_t at = from / 64 * 64 + __builtin_ctzll (word);
      return at < end ? at : end;
    }
    from = (from / 64 + 1) * 64;
  }
  return end;
}

/* The first sector after the last set bit below end; 0 if none. */
static uint32_t
bit_after_last_one (const uint64_t *bits, uint32_t end)
{
  while (end > 0) {
    uint32_t w = (end - 1) / 64;
    uint64_t word = bits[w];
    if (end - w * 64 < 64)
      word &= (1ull << (end - w * 64)) - 1;
    if (word)
      return w * 64 + 64 - __builtin_clzll (word);
    end = w * 64;
  }
  return 0;
}

/* The first free run of at least count sectors in a leaf of n sectors
 * (n if none), its length in *length: a word at a time over taken and
 * free stretches, stopping there.
 */
static uint32_t
leaf_first_fit (const uint64_t *bits, uint32_t n, uint32_t count,
                uint32_t *length)
{
  for (uint32_t start = bit_find (bits, 0, n, false); start < n;) {
    uint32_t end = bit_find (bits, start, n, true);
    if (end - start >= count) {
      *length = end - start;
      return start;
    }
    start = bit_find (bits, end, n, false);
  }
  return n;
}

/* Look at a whole leaf again: its longest free run, and how many are
 * that long, into the tree.
 */
static void
leaf_measure (struct space_map *map, uint64_t leaf)
{
  const uint64_t *bits = map->leaves[leaf];
  uint32_t n = leaf_sectors (map, leaf), longest = 0, runs = 0;
  for (uint32_t start = bit_find (bits, 0, n, false); start < n;) {
    uint32_t end = bit_find (bits, start, n, true);
    if (end - start > longest) {
      longest = end - start;
      runs = 0;
    }
    runs += end - start == longest;
    start = bit_find (bits, end, n, false);
  }
  map->longest_runs[leaf] = runs;
  tree_set (map, leaf, longest);
}

/* Set (or clear) the bits of [first, first + count) in a leaf; returns
 * how many changed.
 */
static uint32_t
bits_assign (uint64_t *bits, uint32_t first, uint32_t count, bool set)
{
  uint32_t changed = 0;
  while (count > 0) {
    uint32_t shift = first % 64;
    uint32_t n = 64 - shift < count ? 64 - shift : count;
    uint64_t mask = (n == 64 ? ~0ull : ((1ull << n) - 1)) << shift;
    uint64_t *word = &bits[first / 64];
    changed += __builtin_popcountll (set ? mask & ~*word : mask & *word);
    *word = set ? *word | mask : *word & ~mask;
    first += n;
    count -= n;
  }
  return changed;
}

/* Find a run of count sectors and take it; leaf_count if none.  First
 * fit: the lowest leaf with room, then its first run that fits, so that
 * runs pack at the start of the store and few leaves exist.  The tree
 * and the counts of longest runs are exact (see space_map_free); were
 * a leaf to have no run that long after all, it is measured again and
 * the search goes on.
 */
/* gcc 12's -fanalyzer (--enable-analyzer) loses a leaf once it is stored
 * in map->leaves[] (an array on the heap) and reports it leaked:
 * its leak check is off for map_take and space_map_take only.
 * space_map_destroy frees every leaf, space_map_free each one that
 * empties (test-backing counts them).
 */
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif
static uint64_t
map_take (struct space_map *map, uint32_t count, uint32_t *start)
{
  for (;;) {
    uint64_t leaf = tree_find (map, count);
    if (leaf == map->leaf_count)
      return leaf;
    uint32_t n = leaf_sectors (map, leaf), length = n;
    uint32_t longest = map->longest[map->tree_base + leaf];
    uint64_t *bits = map->leaves[leaf];
    *start = 0;
    if (!bits) {
      /* The bitmap, then the checksums (leaf_sums). */
      bits = calloc (1, SPACE_MAP_LEAF_BYTES);
      if (!bits) {
        errno = ENOMEM;
        return map->leaf_count;
      }
      map->leaves[leaf] = bits;
      map->map_bytes += SPACE_MAP_LEAF_BYTES;
    }
    else if ((*start = leaf_first_fit (bits, n, count, &length)) == n) {
      leaf_measure (map, leaf);
      continue;
    }
    bits_assign (bits, *start, count, true);
    map->free_sectors -= count;
    /* Taken from a run shorter than the longest, the longest is still
     * there; from the last of the longest, measure the leaf again.
     */
    if (length == longest && --map->longest_runs[leaf] == 0)
      leaf_measure (map, leaf);
    return leaf;
  }
}

int64_t
space_map_take (struct space_map *map, size_t bytes, bool *stopped)
{
  uint64_t count = (bytes + SPACE_MAP_SECTOR - 1) / SPACE_MAP_SECTOR;
  *stopped = false;
  if (count == 0 || count > LEAF_SECTORS) {
    errno = count ? ENOSPC : EINVAL;     /* runs lie within a leaf */
    return -1;
  }
  uint32_t start = 0;
  errno = ENOSPC;
  pthread_mutex_lock (&map->lock);
  /* A quarter of the store lost to abandoned requests: stop. */
  *stopped = map->quarantined_bytes > map->sectors * SPACE_MAP_SECTOR / 4;
  uint64_t leaf = *stopped ? map->leaf_count : map_take (map, count, &start);
  pthread_mutex_unlock (&map->lock);
  if (leaf == map->leaf_count)
    return -1;                  /* errno ENOSPC, or ENOMEM */
  return (int64_t) ((leaf * LEAF_SECTORS + start) * SPACE_MAP_SECTOR);
}
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic pop
#endif

void
space_map_destroy (struct space_map *map)
{
  pthread_mutex_destroy (&map->lock);
  free (map->quarantine);
  for (uint64_t i = 0; map->leaves && i < map->leaf_count; i++)
    free (map->leaves[i]);
  free (map->leaves);
  free (map->longest);
  free (map->longest_runs);
}

/* Does [offset, offset + bytes) meet a quarantined extent?  lock held. */
static bool
meets_quarantine (const struct space_map *map, uint64_t offset, size_t bytes)
{
  for (size_t i = 0; i < map->quarantine_count; i++) {
    const struct space_run *extent = &map->quarantine[i];
    if (extent->offset < offset + bytes
        && offset < extent->offset + extent->bytes)
      return true;
  }
  return false;
}

bool
space_map_quarantined (struct space_map *map, uint64_t offset, size_t bytes)
{
  pthread_mutex_lock (&map->lock);
  bool met = meets_quarantine (map, offset, bytes);
  pthread_mutex_unlock (&map->lock);
  return met;
}

void
space_map_quarantine (struct space_map *map, uint64_t offset, size_t bytes)
{
  uint64_t first = offset / SPACE_MAP_SECTOR * SPACE_MAP_SECTOR;
  uint64_t end = (offset + bytes + SPACE_MAP_SECTOR - 1)
    / SPACE_MAP_SECTOR * SPACE_MAP_SECTOR;
  pthread_mutex_lock (&map->lock);
  for (size_t i = 0; i < map->quarantine_count;) {
    struct space_run *extent = &map->quarantine[i];
    if (extent->offset <= end && first <= extent->offset + extent->bytes) {
      first = first < extent->offset ? first : extent->offset;
      end = end > extent->offset + extent->bytes
        ? end : extent->offset + extent->bytes;
      map->quarantined_bytes -= extent->bytes;
      *extent = map->quarantine[--map->quarantine_count];
      continue;
    }
    i++;
  }
  if (map->quarantine_count == map->quarantine_capacity) {
    size_t capacity = map->quarantine_capacity * 2 + 16;
    struct space_run *extents = realloc (map->quarantine,
                                         capacity * sizeof *extents);
    if (!extents) {
      /* Unrecorded, the extent could be handed out again: keep every
       * run from now on instead (space lost, never data).
       */
      first = 0;
      end = map->sectors * SPACE_MAP_SECTOR;
      map->quarantined_bytes = 0;
      map->quarantine_count = 0;
    }
    else {
      map->quarantine = extents;
      map->quarantine_capacity = capacity;
    }
  }
  map->quarantine[map->quarantine_count++]
    = (struct space_run) { first, end - first };
  map->quarantined_bytes += end - first;
  pthread_mutex_unlock (&map->lock);
}

void
space_map_free (struct space_map *map, uint64_t offset, size_t bytes)
{
  uint64_t first = offset / SPACE_MAP_SECTOR;
  uint64_t count = (bytes + SPACE_MAP_SECTOR - 1) / SPACE_MAP_SECTOR;
  pthread_mutex_lock (&map->lock);
  if (meets_quarantine (map, first * SPACE_MAP_SECTOR,
                        count * SPACE_MAP_SECTOR))
    count = 0;                  /* kept for the life of the map */
  while (count > 0 && first < map->sectors) {
    uint64_t leaf = first / LEAF_SECTORS;
    uint32_t at = first % LEAF_SECTORS, n = leaf_sectors (map, leaf);
    uint32_t length = count < n - at ? count : n - at;
    uint64_t *bits = map->leaves[leaf];
    uint32_t freed = bits ? bits_assign (bits, at, length, false) : 0;
    if (freed) {                /* (a leaf that is not there is free) */
      map->free_sectors += freed;
      /* The free run the freed sectors are part of now: the runs it
       * joined were shorter than it, so the leaf's longest runs are as
       * they were, or this one is one more, or the only one.
       */
      uint32_t run = bit_find (bits, at + length, n, true)
        - bit_after_last_one (bits, at);
      uint32_t longest = map->longest[map->tree_base + leaf];
      if (run > longest) {
        longest = run;
        map->longest_runs[leaf] = 1;
      }
      else if (run == longest)
        map->longest_runs[leaf]++;
      if (longest == n) {
        /* Its last run went: the leaf goes too. */
        free (bits);
        map->leaves[leaf] = NULL;
        map->map_bytes -= SPACE_MAP_LEAF_BYTES;
        map->longest_runs[leaf] = 1;
      }
      tree_set (map, leaf, longest);
    }
    first += length;
    count -= length;
  }
  pthread_mutex_unlock (&map->lock);
}

/* ---- checksums -------------------------------------------------------- */

/* A leaf's checksums, one per sector, after its bitmap. */
static uint32_t *
leaf_sums (uint64_t *bits)
{
  return (uint32_t *) (bits + LEAF_WORDS);
}

/* A block's checksum: CRC-32C, never 0, so that a sector whose checksum
 * was never set is told apart (it reads as a mismatch).
 */
static uint32_t
block_checksum (const void *data, size_t length)
{
  uint32_t c = crc32c (data, length);
  return c ? c : 1;
}

/* The checksum slot of the sector at offset; lock held.  NULL if its
 * leaf is not there (nothing was allocated in it).
 */
static uint32_t *
sum_slot (struct space_map *map, uint64_t offset)
{
  uint64_t sector = offset / SPACE_MAP_SECTOR;
  if (sector >= map->sectors)
    return NULL;
  uint64_t *bits = map->leaves[sector / LEAF_SECTORS];
  return bits ? &leaf_sums (bits)[sector % LEAF_SECTORS] : NULL;
}

void
space_map_checksum_set (struct space_map *map, uint64_t offset,
                        const void *bytes, size_t length)
{
  uint32_t sum = block_checksum (bytes, length);
  pthread_mutex_lock (&map->lock);
  uint32_t *slot = sum_slot (map, offset);
  if (slot)
    *slot = sum;
  pthread_mutex_unlock (&map->lock);
}

bool
space_map_checksum_matches (struct space_map *map, uint64_t offset,
                            const void *bytes, size_t length)
{
  pthread_mutex_lock (&map->lock);
  uint32_t *slot = sum_slot (map, offset);
  uint32_t sum = slot ? *slot : 0;
  pthread_mutex_unlock (&map->lock);
  return sum == block_checksum (bytes, length);
}

void
space_map_stats (struct space_map *map, struct space_map_stats *stats)
{
  pthread_mutex_lock (&map->lock);
  stats->capacity = map->sectors * SPACE_MAP_SECTOR;
  stats->used = (map->sectors - map->free_sectors) * SPACE_MAP_SECTOR;
  stats->map_bytes = map->map_bytes;
  stats->quarantined_bytes = map->quarantined_bytes;
  pthread_mutex_unlock (&map->lock);
}
