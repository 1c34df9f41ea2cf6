/* The backing store's space map: see space-map.h. */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "region.h"
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

/* The map's memory: zeroed, from its region or the C heap. */
static void *
map_alloc (struct space_map *map, size_t bytes)
{
  if (!map->region)
    return calloc (1, bytes);
  void *p = region_alloc (map->region, bytes, 16);
  if (p)
    memset (p, 0, bytes);
  return p;
}

static void
map_free (struct space_map *map, void *p)
{
  if (map->region)
    region_free (map->region, p);
  else
    free (p);
}

#define QUARANTINE_FIRST 16

/* Entries of the per-leaf arrays (leaves, longest_runs): at least one. */
static uint64_t
leaf_slots (const struct space_map *map)
{
  return map->leaf_count ? map->leaf_count : 1;
}

/* What the map takes without its leaves. */
static uint64_t
base_map_bytes (const struct space_map *map)
{
  return map->leaf_count * (sizeof *map->leaves + sizeof *map->longest_runs)
    + 2 * map->tree_base * sizeof *map->longest;
}

int
space_map_init (struct space_map *map, uint64_t sectors, struct region *region)
{
  *map = (struct space_map) { .sectors = sectors, .region = region };
  pthread_mutex_init (&map->lock, NULL);
  map->free_sectors = sectors;
  map->leaf_count = (sectors + LEAF_SECTORS - 1) / LEAF_SECTORS;
  map->tree_base = 1;
  while (map->tree_base < map->leaf_count)
    map->tree_base *= 2;
  map->leaves = map_alloc (map, leaf_slots (map)
                           * sizeof *map->leaves);
  map->longest = map_alloc (map, 2 * map->tree_base * sizeof *map->longest);
  map->longest_runs = map_alloc (map, leaf_slots (map)
                                 * sizeof *map->longest_runs);
  if (!map->leaves || !map->longest || !map->longest_runs) {
    /* Nothing half made: the caller destroys only a map that was made. */
    space_map_destroy (map);
    errno = ENOMEM;
    return -1;
  }
  map->map_bytes = base_map_bytes (map);
  /* Room for a few quarantined extents from the start: a record that
   * cannot grow falls back on the one it has (space_map_quarantine).
   */
  map->quarantine = map_alloc (map, QUARANTINE_FIRST * sizeof *map->quarantine);
  if (map->quarantine)
    map->quarantine_capacity = QUARANTINE_FIRST;
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
static uint32_t
leaf_longest (struct space_map *map, uint64_t leaf, uint16_t *runs_out)
{
  const uint64_t *bits = map->leaves[leaf];
  uint32_t n = leaf_sectors (map, leaf), longest = 0, runs = 0;
  if (!bits) {
    *runs_out = 1;              /* a leaf that is not there is free */
    return n;
  }
  for (uint32_t start = bit_find (bits, 0, n, false); start < n;) {
    uint32_t end = bit_find (bits, start, n, true);
    if (end - start > longest) {
      longest = end - start;
      runs = 0;
    }
    runs += end - start == longest;
    start = bit_find (bits, end, n, false);
  }
  *runs_out = runs;
  return longest;
}

static void
leaf_measure (struct space_map *map, uint64_t leaf)
{
  tree_set (map, leaf, leaf_longest (map, leaf, &map->longest_runs[leaf]));
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
      bits = map_alloc (map, SPACE_MAP_LEAF_BYTES);
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
  map_free (map, map->quarantine);
  for (uint64_t i = 0; map->leaves && i < map->leaf_count; i++)
    map_free (map, map->leaves[i]);
  map_free (map, map->leaves);
  map_free (map, map->longest);
  map_free (map, map->longest_runs);
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
    struct space_run *extents = map_alloc (map, capacity * sizeof *extents);
    if (extents && map->quarantine_count)
      memcpy (extents, map->quarantine,
              map->quarantine_count * sizeof *extents);
    if (!extents && !map->quarantine) {
      /* Nowhere to record it: no run is handed out again (space lost,
       * never data).
       */
      map->quarantined_bytes = map->sectors * SPACE_MAP_SECTOR;
      pthread_mutex_unlock (&map->lock);
      return;
    }
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
      /* The new array in place before the old goes: a crash between the
       * two leaves the old one unreached (freed by a recovery), never
       * the map pointing at a freed one.
       */
      struct space_run *old = map->quarantine;
      map->quarantine = extents;
      map->quarantine_capacity = capacity;
      map_free (map, old);
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
        /* Its last run went: the leaf goes too (unlinked first: a crash
         * between the two leaves it unreached, never reached and freed).
         */
        map->leaves[leaf] = NULL;
        map_free (map, bits);
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

/* ---- a map in a region: take-over and recovery ----------------------- */

void
space_map_take_over (struct space_map *map)
{
  pthread_mutex_init (&map->lock, NULL);
}

/* A recovery's own record (process memory): the sectors the entries
 * reach, a bitmap per leaf that is there.
 */
struct space_map_recovery {
  struct space_map *map;
  uint64_t **reached;
};

struct space_map_recovery *
space_map_recover_begin (struct space_map *map)
{
  struct region *region = map->region;
  size_t leaves_bytes = leaf_slots (map) * sizeof *map->leaves;
  if (!region
      || !region_recover_claim (region, map->leaves, leaves_bytes, 16)
      || !region_recover_claim (region, map->longest,
                                2 * map->tree_base * sizeof *map->longest, 16)
      || !region_recover_claim (region, map->longest_runs,
                                leaf_slots (map)
                                * sizeof *map->longest_runs, 16)) {
    errno = EINVAL;
    return NULL;
  }
  if (map->quarantine
      && !region_recover_claim (region, map->quarantine,
                                map->quarantine_capacity
                                * sizeof *map->quarantine, 16)) {
    /* Its extents are unknown now: nothing is handed out again. */
    map->quarantine = NULL;
    map->quarantine_count = map->quarantine_capacity = 0;
    map->quarantined_bytes = map->sectors * SPACE_MAP_SECTOR;
  }
  struct space_map_recovery *recovery = calloc (1, sizeof *recovery);
  if (!recovery
      || !(recovery->reached = calloc (leaf_slots (map),
                                       sizeof *recovery->reached))) {
    free (recovery);
    errno = ENOMEM;
    return NULL;
  }
  recovery->map = map;
  for (uint64_t i = 0; i < map->leaf_count; i++) {
    if (!map->leaves[i])
      continue;
    if (!region_recover_claim (region, map->leaves[i], SPACE_MAP_LEAF_BYTES,
                               16)) {
      map->leaves[i] = NULL;    /* its blocks are lost: their sums with it */
      continue;
    }
    if (!(recovery->reached[i] = calloc (LEAF_WORDS, sizeof (uint64_t)))) {
      space_map_recover_abandon (recovery);
      errno = ENOMEM;
      return NULL;
    }
  }
  return recovery;
}

bool
space_map_recover_run (struct space_map_recovery *recovery, uint64_t offset,
                       size_t bytes)
{
  struct space_map *map = recovery->map;
  uint64_t first = offset / SPACE_MAP_SECTOR;
  uint64_t count = (bytes + SPACE_MAP_SECTOR - 1) / SPACE_MAP_SECTOR;
  if (offset % SPACE_MAP_SECTOR || count == 0 || first >= map->sectors
      || count > map->sectors - first
      || first / LEAF_SECTORS != (first + count - 1) / LEAF_SECTORS)
    return false;               /* runs lie within a leaf */
  uint64_t leaf = first / LEAF_SECTORS;
  uint64_t *reached = recovery->reached[leaf];
  const uint64_t *taken = map->leaves[leaf];
  uint32_t at = first % LEAF_SECTORS;
  /* Taken in the map (it was, before its entry pointed at it), and not
   * reached by another entry.
   */
  if (!reached || bit_find (taken, at, at + count, false) < at + count
      || bit_find (reached, at, at + count, true) < at + count)
    return false;
  bits_assign (reached, at, count, true);
  return true;
}

void
space_map_recover_abandon (struct space_map_recovery *recovery)
{
  if (!recovery)
    return;
  for (uint64_t i = 0; i < recovery->map->leaf_count; i++)
    free (recovery->reached[i]);
  free (recovery->reached);
  free (recovery);
}

void
space_map_recover_end (struct space_map_recovery *recovery,
                       bool keep_unreached)
{
  struct space_map *map = recovery->map;
  pthread_mutex_init (&map->lock, NULL);
  map->free_sectors = map->sectors;
  map->map_bytes = base_map_bytes (map);
  /* The quarantine's bytes from its list (a crash inside a merge can
   * leave the count out of step), unless it could not be kept at all.
   */
  if (map->quarantine) {
    map->quarantined_bytes = 0;
    for (size_t q = 0; q < map->quarantine_count; q++)
      map->quarantined_bytes += map->quarantine[q].bytes;
  }
  /* Quarantined extents stay taken, reached or not. */
  for (size_t q = 0; q < map->quarantine_count; q++) {
    uint64_t first = map->quarantine[q].offset / SPACE_MAP_SECTOR;
    uint64_t end = first + map->quarantine[q].bytes / SPACE_MAP_SECTOR;
    for (uint64_t sector = first; sector < end && sector < map->sectors;) {
      uint64_t leaf = sector / LEAF_SECTORS;
      uint64_t leaf_end = (leaf + 1) * LEAF_SECTORS < end
        ? (leaf + 1) * LEAF_SECTORS : end;
      if (recovery->reached[leaf])
        bits_assign (recovery->reached[leaf], sector % LEAF_SECTORS,
                     leaf_end - sector, true);
      sector = leaf_end;
    }
  }
  for (uint64_t leaf = 0; leaf < map->leaf_count; leaf++) {
    uint64_t *bits = map->leaves[leaf], *reached = recovery->reached[leaf];
    if (!bits)
      continue;
    /* Taken but reached by no entry: a writeback or a release the dead
     * process was in the middle of.  Its requests may still land (an
     * NBD server goes on with what it was sent): quarantined when
     * keep_unreached, else free.
     */
    uint32_t n = leaf_sectors (map, leaf);
    /* Worked out beside the map, which keeps every run taken until the
     * one copy below: a recovery killed before it finds the map as this
     * one did (RECOVERY in alloc/region.h); one killed inside it finds
     * every reached run still taken.
     */
    uint64_t unreached[LEAF_WORDS];
    for (uint32_t w = 0; w < LEAF_WORDS; w++)
      unreached[w] = bits[w] & ~reached[w];
    for (uint32_t s = bit_find (unreached, 0, n, true);
         keep_unreached && s < n;) {
      uint32_t e = bit_find (unreached, s, n, false);
      bits_assign (reached, s, e - s, true);
      space_map_quarantine (map, ((uint64_t) leaf * LEAF_SECTORS + s)
                            * SPACE_MAP_SECTOR,
                            (size_t) (e - s) * SPACE_MAP_SECTOR);
      s = bit_find (unreached, e, n, true);
    }
    recovery_step ("store: cold tier's leaf worked out");
    memcpy (bits, reached, LEAF_WORDS * sizeof *bits);
    uint32_t taken = 0;
    for (uint32_t w = 0; w < LEAF_WORDS; w++)
      taken += __builtin_popcountll (bits[w]);
    if (taken == 0) {
      map->leaves[leaf] = NULL;
      map_free (map, bits);
      continue;
    }
    map->free_sectors -= taken;
    map->map_bytes += SPACE_MAP_LEAF_BYTES;
  }
  /* The tree from its leaves up. */
  for (uint64_t node = map->tree_base; node < 2 * map->tree_base; node++)
    map->longest[node] = 0;
  for (uint64_t leaf = 0; leaf < map->leaf_count; leaf++)
    map->longest[map->tree_base + leaf]
      = leaf_longest (map, leaf, &map->longest_runs[leaf]);
  for (uint64_t node = map->tree_base; node-- > 1;) {
    uint16_t a = map->longest[2 * node], b = map->longest[2 * node + 1];
    map->longest[node] = a > b ? a : b;
  }
  space_map_recover_abandon (recovery);
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
