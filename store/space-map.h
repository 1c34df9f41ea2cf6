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
 * IN A REGION.  With a region (alloc/region.h) the map's memory - the
 * struct, its arrays, leaves and quarantine - comes from it, so that the
 * next server of the device finds the cold tier's map as it was: taken
 * over cleanly (space_map_take_over: its lock made anew), or rebuilt
 * after a crash (space_map_recover_*): its memory claimed, every run an
 * entry of the block table reaches marked again (a run reached twice, or
 * not taken in the map, is refused: that block is lost, never served
 * wrong), the runs taken but reached by none - a writeback or a release
 * the dead server was in the middle of - quarantined (an NBD store may
 * still carry out what it was sent) or freed (a file: the dead process's
 * writes are over), the tree and counts made anew.  Checksums are kept
 * as they were: a block's is written before its entry points at it.
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

struct region;

struct space_map {
  pthread_mutex_t lock;         /* guards all below */
  struct region *region;        /* where its memory comes from (NULL: the
                                   C heap); set once */
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

/* A map of sectors sectors, all free, its memory from region (NULL: the
 * C heap): 0, or -1 with errno ENOMEM (and nothing to destroy).
 */
extern int space_map_init (struct space_map *map, uint64_t sectors,
                           struct region *region);
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

/* IN A REGION, above.  space_map_take_over: a map handed over by its
 * last process.  After a crash: space_map_recover_begin (during the
 * region's recovery, between region_recover_begin and _end: it claims
 * the map's memory; NULL with errno EINVAL if its arrays are not where
 * they should be, ENOMEM), space_map_recover_run for each run an entry
 * reaches (false: refused), space_map_recover_end once the region's
 * recovery ended (keep_unreached: runs nothing reaches are quarantined,
 * else freed; it frees the recovery), or space_map_recover_abandon.
 */
struct space_map_recovery;
extern void space_map_take_over (struct space_map *map);
extern struct space_map_recovery *space_map_recover_begin (struct space_map *map);
extern bool space_map_recover_run (struct space_map_recovery *recovery,
                                   uint64_t offset, size_t bytes);
extern void space_map_recover_end (struct space_map_recovery *recovery,
                                   bool keep_unreached);
extern void space_map_recover_abandon (struct space_map_recovery *recovery);

struct space_map_stats {
  uint64_t capacity;            /* bytes covered */
  uint64_t used;                /* bytes in taken runs */
  uint64_t map_bytes;           /* RAM the map takes now */
  uint64_t quarantined_bytes;
};
extern void space_map_stats (struct space_map *map,
                             struct space_map_stats *stats);

#endif /* ZRAM_SPACE_MAP_H */
