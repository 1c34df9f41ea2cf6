/* The backing store of writeback: where blocks go when RAM runs short.
 *
 * A local file (created sparse if missing) or an NBD export reached with
 * libnbd (nbd://, nbds://, nbd+unix:// URIs: another nbdkit,
 * qemu-storage-daemon, an RBD image exported over NBD).  It holds blocks
 * still compressed (zram's compressed_writeback), each in a run of
 * 512-byte sectors handed out by the space map.  A batch of blocks takes
 * one run and one write.  A freed run is trimmed on the store too.
 *
 * The space map (space-map.h) hands the runs out and keeps each block's
 * checksum: it costs RAM in proportion to what is written back, 8.25
 * MiB per GiB of compressed data written back and 896 bytes per GiB of
 * capacity (the device's size at most); backing_stats' map_bytes says
 * what it takes now.
 *
 * FILES.  backing.c: this interface, the requests' dispatch, errors and
 * log, releases; backing-file.c and backing-nbd.c: the transports;
 * space-map.c: the bookkeeping, with no I/O.
 *
 * An NBD store is reached through one connection, or several when the
 * server offers multi-conn (up to BACKING_CONNECTIONS), each used by one
 * request at a time.  A request that finds its connection dead (the
 * server went away) reconnects it, at most once a second per connection,
 * and retries once; until a reconnection works, requests fail with EIO.
 *
 * ABANDONED REQUESTS.  NBD has no cancel, and nothing orders a request
 * of a closed connection against those of another: a server finishes
 * what it read from a connection after the client has gone (nbdkit's
 * connection thread waits for its requests in flight and runs them;
 * qemu-nbd's coroutines run on), and a flush on a new connection covers
 * only writes that were answered.  So a write or trim that was sent and
 * given up on (no answer within its deadline, the connection died under
 * it, or backing_cancel) may still land at any later time.  Its extent
 * is quarantined: whatever run lies in it stays allocated in the space
 * map when released (not trimmed, never handed out again) for the life
 * of the process, counted in quarantined_bytes.  Blocks already there
 * keep their checksums, and a block read from a quarantined run that a
 * late write changed fails with EIO, never wrong bytes.  A quarantine
 * past a quarter of the store stops writeback (backing_allocate gives
 * ENOSPC) with a log line: the store is being eaten by requests that
 * never finish, and a restart gives the space back.  A file store's
 * requests are system calls, never abandoned.
 *
 * ERRORS.  The store's own failures are counted by kind (no space: a
 * full file system or an export that says ENOSPC; timeouts; other I/O
 * errors) and logged through backing_set_log's function, ten lines a
 * second at most, with a count of those left out.
 *
 * ONE OWNER.  A backing file is locked (an open file description lock
 * on all of it) while the server has it open: a second server naming
 * the same file fails to start, with a message naming the holder.
 *
 * LOCKS (leaves: no other lock is taken while one is held).
 *   the space map's   its leaves, tree, counts and quarantine
 *                     (space-map.h).
 *   release_lock      the queue of runs released while reads were on.
 *   connection lock   one per NBD connection: its handle, for one request
 *                     or a reconnection (an abandoned request is recorded
 *                     after it is dropped).
 * A caller may hold a stripe lock of the block store (block-store.h)
 * while it calls the space map's functions (backing_allocate,
 * backing_release, backing_read_begin, backing_checksum_set), never
 * while a request runs: reads of written-back blocks drop the stripe
 * lock first (READS AND RELEASES), and writeback writes with none held.
 */

#ifndef ZRAM_BACKING_H
#define ZRAM_BACKING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "space-map.h"

#define BACKING_SECTOR SPACE_MAP_SECTOR
#define BACKING_CONNECTIONS 4
/* A leaf of the space map: the sectors it covers (16 MiB of the store),
 * its RAM (its bitmap and a CRC-32C for each sector).
 */
#define BACKING_MAP_LEAF_SECTORS SPACE_MAP_LEAF_SECTORS
#define BACKING_MAP_LEAF_BYTES SPACE_MAP_LEAF_BYTES

struct backing;

/* Where the backing store's failures are logged (nbdkit_error in the
 * plugin): one line, without a newline.
 */
typedef void backing_log_function (const char *line);

/* Open target (a path or an NBD URI) for capacity bytes at most (a file
 * is extended to it; an NBD export must offer at least the space map's
 * first sector, and the capacity is cut to its size).  odirect: open a
 * file with O_DIRECT.  timeout_s: an NBD connection or request not done
 * in that time fails (EIO), and its connection is dropped and made again
 * later, after a wait that doubles from 1 s to 30 s while it keeps
 * failing.  NULL with a message in *error (to free) on failure.
 */
extern struct backing *backing_open (const char *target, uint64_t capacity,
                                     bool odirect, unsigned timeout_s,
                                     char **error);
extern void backing_close (struct backing *backing);
extern void backing_set_log (struct backing *backing, backing_log_function *log);

/* From now on every NBD request (in progress too) fails within 100 ms
 * (abandoned, see ABANDONED REQUESTS): for a server that is stopping.
 */
extern void backing_cancel (struct backing *backing);

/* The deadline of one NBD request (backing_timeout=), in milliseconds. */
extern unsigned backing_timeout_ms (const struct backing *backing);

/* Whether target names an NBD export rather than a file. */
extern bool backing_is_uri (const char *target);

/* The target it was opened on, and its capacity in sectors. */
extern const char *backing_target (const struct backing *backing);
extern uint64_t backing_sectors (const struct backing *backing);

/* Whether the target can hold a space map of sectors (a map taken over
 * with a region keeps the capacity it was made with, whatever the
 * capacity asked of backing_open now): an NBD export must be that
 * large; a file is extended by backing_map_adopt.
 */
struct space_map;
extern bool backing_can_hold (const struct backing *backing,
                              uint64_t sectors);

/* Use map - a space map of a region, made there or taken over with the
 * store (space-map.h, IN A REGION) - instead of the backing store's own
 * (which goes), from before its first request; the capacity is then the
 * map's, a regular file extended to it if shorter: 0, or -1 with errno
 * (EINVAL: the target cannot hold it; ftruncate's).  backing_close
 * leaves the map.
 */
extern int backing_map_adopt (struct backing *backing, struct space_map *map);

/* A run of sectors for bytes (rounded up to sectors, at most
 * BACKING_MAP_LEAF_SECTORS of them: a run lies within a leaf): its first
 * byte's offset.  -1 with errno ENOSPC when no run that long is free
 * within a leaf (or bytes is more than a leaf), ENOMEM when a leaf could
 * not be allocated for it, EINVAL for 0 bytes.  The map grows by
 * BACKING_MAP_LEAF_BYTES when the run starts a leaf.
 */
extern int64_t backing_allocate (struct backing *backing, size_t bytes);
/* Free a run (the store is trimmed there, best effort).  The map
 * shrinks by BACKING_MAP_LEAF_BYTES for each leaf it empties.
 */
extern void backing_release (struct backing *backing, uint64_t offset,
                             size_t bytes);

/* READS AND RELEASES.  A written-back block is read with its stripe lock
 * dropped, so that a slow or wedged backing store holds up that read
 * alone; its run must then not be freed and given to other data while
 * the read is on.  The reader takes backing_read_begin under the stripe
 * lock, after looking the entry up, and backing_read_end when done with
 * the run; backing_release frees a file's run at once when no reader is
 * about, else (and always for an NBD store, whose trim is a request)
 * queues it in the current epoch; backing_settle_releases (the
 * housekeeper, every round, and store_flush) moves the epoch on and
 * frees the previous epoch's runs once its last reader is gone, and with
 * no reader about, every run queued.  A run released while
 * readers run stays allocated a round or two longer.
 */
extern unsigned backing_read_begin (struct backing *backing);
extern void backing_read_end (struct backing *backing, unsigned epoch);
extern void backing_settle_releases (struct backing *backing);

/* A written-back block's checksum: taken of its bytes (after
 * backing_write has written them, before the block's entry names the
 * run) and kept in the space map at its first sector;
 * backing_read_block reads the block and checks the bytes against it: a
 * store that lost or changed them (an export that came back empty, a file
 * truncated or overwritten) gives EIO and counts in corrupt, never wrong
 * bytes.  deadline_ms (monotonic, 0: none) cuts the read short of its
 * own timeout, as for backing_sync.
 */
extern void backing_checksum_set (struct backing *backing, uint64_t offset,
                                  const void *bytes, size_t length);
extern int backing_read_block (struct backing *backing, void *buf,
                               size_t length, uint64_t offset,
                               uint64_t deadline_ms);

/* Make what backing_write wrote durable (an NBD flush, fdatasync for a
 * file): 0, or -1 with errno EIO.  Writeback calls it before a block's
 * RAM copy goes, unless sync is off (backing_sync=false).  deadline_ms
 * (monotonic, 0: none) cuts an NBD request short of its own timeout.
 */
extern int backing_sync (struct backing *backing, uint64_t deadline_ms);

/* A whole request: 0, or -1 with errno ENOSPC (the store is full) or EIO
 * (any other failure, a timeout too).  deadline_ms as for backing_sync.
 * (Reads go through backing_read_block, which checks what comes back.)
 */
extern int backing_write (struct backing *backing, const void *buf,
                          size_t bytes, uint64_t offset, uint64_t deadline_ms);

struct backing_stats {
  uint64_t capacity;            /* bytes the space map covers */
  uint64_t used;                /* bytes in allocated runs */
  uint64_t failed;              /* requests that failed */
  uint64_t reconnects;          /* NBD connections made again */
  uint64_t timeouts;            /* NBD requests not answered in time */
  uint64_t abandoned;           /* writes and trims given up on after
                                   they were sent (ABANDONED REQUESTS) */
  uint64_t quarantined_bytes;   /* the store they may still reach */
  uint64_t errors_nospace;      /* requests the store refused for space */
  uint64_t errors_io;           /* other failed requests, timeouts too */
  uint64_t corrupt;             /* blocks read back that failed their
                                   checksum */
  uint64_t map_bytes;           /* RAM the space map takes now (its
                                   leaves, tree and pointers): to count
                                   against mem_limit */
};
extern void backing_stats (struct backing *backing, struct backing_stats *stats);

#endif /* ZRAM_BACKING_H */
