/* The backing store's space map: which 512-byte sectors of the store are
 * taken, a checksum for each block written there, and the extents that
 * requests given up on may still reach.  Pure bookkeeping in RAM: no
 * I/O, no nbdkit, no libnbd (backing.c does the requests, as zram's bio
 * code stands apart from its bitmap helpers).
 *
 * The map costs RAM in proportion to what is written back: a bit and a
 * 4-byte checksum per sector, in leaves of SPACE_MAP_LEAF_SECTORS
 * sectors (16 MiB of the store; SPACE_MAP_LEAF_BYTES: 4 KiB of bitmap
 * and 128 KiB of checksums, 132 KiB), each allocated when a run first
 * lands in it and freed when its last run goes, plus, for the whole
 * capacity, 14 to 18 bytes per leaf (a pointer, a count and search tree
 * nodes): 896 bytes per GiB of capacity.  Runs are handed out first fit
 * (the lowest leaf with room, found through a max tree of each leaf's
 * longest free run in log time, then its first run that fits), so they
 * pack at the start of the store and leaves stay few and full: 64
 * leaves, 8.25 MiB, per GiB of compressed data written back.
 *
 * CHECKSUMS.  CRC-32C of a block's bytes, kept at its first sector,
 * never 0: a sector whose checksum was never set reads as a mismatch.
 *
 * QUARANTINE.  An extent a write or trim given up on may still reach
 * (backing.h, ABANDONED REQUESTS) is recorded, merged with those it
 * overlaps or touches; a run that meets one is never freed (not
 * trimmed, never handed out again) for the life of the map.  Past a
 * quarter of the store, space_map_take refuses every run.
 *
 * LOCK.  lock (a leaf: nothing is taken under it) guards everything in
 * the map; every function takes it, so a caller may hold the block
 * store's stripe lock around any of them.
 */
#ifndef ZRAM_SPACE_MAP_H
#define ZRAM_SPACE_MAP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPACE_MAP_SECTOR 512
#define SPACE_MAP_LEAF_SECTORS 32768    /* 16 MiB of the store */
/* A leaf's RAM: its bitmap, then a checksum for each sector. */
#define SPACE_MAP_LEAF_BYTES (SPACE_MAP_LEAF_SECTORS / 8 \
                              + SPACE_MAP_LEAF_SECTORS * 4)

/* An extent of the store, in bytes. */
struct space_run {
  uint64_t offset;
  size_t bytes;
};

struct space_map {
  pthread_mutex_t lock;         /* guards all below */
  uint64_t **leaves;            /* leaf_count bitmaps (each followed by
                                   its checksums), NULL: all free */
  uint16_t *longest;            /* the tree: 2 * tree_base nodes, 1 the
                                   root, tree_base + i leaf i's longest
                                   free run (0 past the last leaf) */
  uint16_t *longest_runs;       /* per leaf, how many of its free runs
                                   are that long */
  uint64_t leaf_count, tree_base;
  uint64_t sectors;
  uint64_t free_sectors;
  uint64_t map_bytes;           /* leaves, tree, pointers */
  struct space_run *quarantine; /* merged extents */
  size_t quarantine_count, quarantine_capacity;
  uint64_t quarantined_bytes;   /* their bytes, in whole sectors */
};

/* A map of sectors sectors, all free: 0, or -1 with errno ENOMEM (and
 * nothing to destroy).
 */
extern int space_map_init (struct space_map *map, uint64_t sectors);
extern void space_map_destroy (struct space_map *map);

/* Take a run of sectors for bytes (rounded up, at most a leaf: a run
 * lies within one): its first byte's offset.  -1 with errno ENOSPC (no
 * run that long is free, or bytes is more than a leaf, or *stopped: the
 * quarantine holds more than a quarter of the store), ENOMEM (a leaf
 * could not be allocated), EINVAL (0 bytes).
 */
extern int64_t space_map_take (struct space_map *map, size_t bytes,
                               bool *stopped);

/* Free the run of [offset, offset + bytes) unless it meets the
 * quarantine; a leaf it empties goes.
 */
extern void space_map_free (struct space_map *map, uint64_t offset,
                            size_t bytes);

/* Record an extent a request given up on may still reach. */
extern void space_map_quarantine (struct space_map *map, uint64_t offset,
                                  size_t bytes);
/* Does [offset, offset + bytes) meet the quarantine? */
extern bool space_map_quarantined (struct space_map *map, uint64_t offset,
                                   size_t bytes);

/* The checksum of a block's bytes at the sector of offset (nothing if
 * its leaf is not there); whether bytes match the one kept there.
 */
extern void space_map_checksum_set (struct space_map *map, uint64_t offset,
                                    const void *bytes, size_t length);
extern bool space_map_checksum_matches (struct space_map *map,
                                        uint64_t offset, const void *bytes,
                                        size_t length);

struct space_map_stats {
  uint64_t capacity;            /* bytes covered */
  uint64_t used;                /* bytes in taken runs */
  uint64_t map_bytes;           /* RAM the map takes now */
  uint64_t quarantined_bytes;
};
extern void space_map_stats (struct space_map *map,
                             struct space_map_stats *stats);

#endif /* ZRAM_SPACE_MAP_H */
