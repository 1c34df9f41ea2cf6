/* The region: memory that outlives the process that fills it.
 *
 * A device's data is the server's memory, so a server that exits takes
 * the device with it - unless that memory belongs to something that
 * outlives the server.  A region is one System V shared memory segment
 * whose pages hold everything needed to serve the device: the
 * allocator's pool, its zspages, descriptors and handle cells, and
 * whatever its user (the store) allocates there.  The kernel keeps the
 * segment until it is removed (region_destroy), whoever attaches it or
 * not: no holder process, so no holder whose death loses the device.  A
 * small file, the region file, names the segment (its id) and is the
 * region's lock; the next server opens it, attaches the same segment and
 * serves on.
 *
 * Why not a memfd kept in a holder (systemd's file descriptor store):
 * for swap, the region's pages must stay resident while no server runs -
 * a page of the device swapped out to the device itself while its server
 * is down never comes back - and only a segment can be locked in memory
 * on its own (SHM_LOCK: every page, present and future, unevictable
 * whoever maps it); a memfd's pages are locked only while some process
 * maps and mlocks them, page by page.  Removing the segment is the one
 * way its memory is lost: by region_destroy (the device is given up), by
 * `ipcrm`, or by a reboot.
 *
 * POINTERS
 *   Every structure in a region is full of pointers (list links, the
 *   zspage address in each handle cell), so a region is attached at the
 *   same address in every process that serves it: the address the first
 *   attach got from the kernel is written in the header, and a later
 *   process attaches there.  If something of its own already sits there
 *   (address space layouts are randomised, so the chance is small but
 *   not nil), the attach is refused with that message and the memory is
 *   untouched: a retry - a new process, a new layout - can succeed.
 *
 * ADDRESS RESERVATION
 *   A process that attaches late - a standby, which makes its heap,
 *   threads and stacks ready first and takes the region over only when
 *   told to - would find its own mappings where the region goes whenever
 *   layouts are alike (randomisation off: `setarch -R`, or
 *   kernel.randomize_va_space=0; the serving server made the region at
 *   the same point of the same start-up).  So it keeps the range first
 *   (region_reserve_address: a PROT_NONE mapping, no memory), and
 *   region_attach maps the segment over it.  Every server keeps it as
 *   soon as it knows the region's path, before its threads, heaps and
 *   codec contexts are mapped: what is left to collide with is only
 *   what the process had mapped before (its libraries).
 *
 * LAYOUT (version REGION_LAYOUT_VERSION; all sizes in 4 KiB pages)
 *   page 0          the header (struct region): identity, then
 *                   state, then the heap's own state.
 *   pages 1..       the heap's maps: a bit per page, set when the page is
 *                   taken; then a struct region_page per page (what a
 *                   taken page holds: part of a run, or a slab).
 *   the rest        the heap: runs of whole pages (a zspage chunk, a cell
 *                   block, anything larger than 1 KiB) and slabs (a page
 *                   cut into equal slots of 64..1024 bytes, for the small
 *                   descriptors).
 *   The segment is sparse: only pages that were written take memory.  A
 *   run given back is removed from it (madvise MADV_REMOVE), which
 *   returns its memory at once - MADV_DONTNEED would only drop this
 *   process's view of a shared page.  Freed slab and small run pages
 *   stay resident until region_trim, listed as ready: a new slab page
 *   or a one-page run (a cell block) takes a ready page first, so a
 *   write finds its metadata's memory there with no fault, and
 *   region_make_ready touches free pages ahead to keep enough of them
 *   (swap: a fault on the write path waits for memory that only the
 *   swap device, this server, can give back).
 *
 * THE REGION FILE
 *   One line, "nbdkit-zram region key=HEX shm=ID device=HEX": the
 *   segment's key and id, and the device id its header must carry (a
 *   segment id can be reused by another segment once the first is
 *   removed: the key and the device id tell them apart).  Written at
 *   creation, replaced atomically: each line is written to PATH.new
 *   (made with O_EXCL, never through a link, mode 0600, locked) and
 *   renamed over PATH - first "shm=-1 device=creating" with a random key
 *   before a segment of that key is made (IPC_EXCL), then the whole line
 *   once its header is written; so a creator killed at any point leaves
 *   a file that names whatever it made, and the next attach removes it
 *   (TRUST says when), or a PATH.new the next creator removes.  Two
 *   creators started at once: the second waits for the first's PATH.new
 *   (NEW_FILE_WAIT_NS at most), then finds PATH owned (locked) and is
 *   refused; a creator replaces PATH only while it holds PATH.new and
 *   PATH's own lock, and only if PATH names no segment that exists.
 *   Anything at PATH that is not one such line (empty, garbled, another
 *   file) is refused, never written over or removed.
 *
 * TRUST
 *   A server often runs as root; a region file and a segment are what
 *   others could have planted or touched.  Only what is provably this
 *   user's is used, changed or removed (as ssh's StrictModes):
 *   - the directory: owned by this user or root, not writable by group
 *     or others unless sticky;
 *   - the region file: reached by no link (O_NOFOLLOW; one name), a
 *     regular file of this user's, writable by no one else;
 *   - PATH.new: made with O_EXCL | O_NOFOLLOW; one left in the way is
 *     removed only if it is a regular file of this user's, mode 0600,
 *     whose lock no one holds;
 *   - the segment: of the key the file names, owned and made by this
 *     user, mode 0600; attached by no other process (shm_nattch, waited
 *     on ATTACHED_WAIT_NS for a moment's peek or an exit's unmapping,
 *     checked again once this process attached it): the flock is on the
 *     file's inode, and a copy of the file is another inode, so the
 *     attachment is what shows a live server;
 *   - removed on a file's word only when provably the segment the file
 *     named: a whole region header of the file's device and the
 *     segment's size, or for a region being made a header all zero or
 *     begun with the magic (its creator died before or while writing
 *     it).
 *   Everything else is refused with a message naming what and what to
 *   do, nothing written, removed or served.
 *
 * HEADER and VERSION
 *   The identity (magic, layout version, sizes, the mapping address, the
 *   device's id) is written once and covered by a CRC-32C; the state
 *   (generation, the owner's pid, how the last owner left it, the user's
 *   root object, the counts of recoveries) is covered by a second one,
 *   rewritten at each change of owner.  An attach checks, in order: the
 *   segment is at least a header long, the magic, the identity checksum,
 *   the layout version (one this build knows: REGION_LAYOUT_VERSION
 *   exactly, for now), the segment's size against the header's, the page
 *   size, the device id against the region file's, the device's size
 *   when the caller names one (not for a region still being made), the
 *   state's checksum; each failure is refused with a message naming what
 *   differed, and nothing in the segment is written.  A change to any
 *   structure kept in a region (here, in the allocator, in the store)
 *   must raise REGION_LAYOUT_VERSION.
 *
 * STATE WRITES
 *   A process can be killed between any two stores, so the state is
 *   never changed in place alone: a change is written whole, with its
 *   checksum, to the journal copy first, then to the current copy.  A
 *   kill inside the journal's write leaves current whole (the old
 *   state); a kill inside current's leaves the journal whole (the new
 *   one).  A reader takes current when its checksum holds, else the
 *   journal; only when neither holds is the state damaged.
 *
 * OWNERSHIP
 *   One process serves a region at a time: its owner holds
 *   flock(LOCK_EX) on the region file while it owns the region, and a
 *   second taker is refused (EBUSY, with the owner's pid).  The lock goes
 *   with the owner's process however it ends, so a crashed owner never
 *   blocks the next one.  The owner also has the segment attached, which
 *   a taker that holds another inode's lock (a copy of the file) finds
 *   (TRUST); the owner detaches before it unlocks.
 *
 * HANDOVER
 *   A clean handover: the owner stops every user of the region, makes its
 *   structures quiescent (the allocator drains its deferred frees), sets
 *   the state to "handed over", detaches and unlocks.  The next owner
 *   finds that state and takes the structures as they are, after
 *   initialising every lock in them anew (a pthread lock's state is the
 *   old process's); it sets "serving" only when it starts changing them
 *   (region_start_serving), so a server that fails to start between the
 *   two leaves the region clean.  A region whose state still says
 *   "serving" was left by a crash, and one that says "recovering" by a
 *   crash during the recovery of a crash: only a recovery that rebuilds
 *   what a crash can leave half done may take it; region_attach reports
 *   it (REGION_ATTACH_CRASHED) and the caller decides.
 *
 * CREATION
 *   A new region is "creating" until its user has made its structures
 *   in it and named their root (region_set_root: then "handed over",
 *   with nothing served yet).  A region still "creating" was being made
 *   when its maker died: nothing in it was ever served, so the next
 *   taker is told so (REGION_ATTACH_UNMADE) and makes it anew in place
 *   (region_remake: every allocation forgotten, every page given back),
 *   or - for a device of another size, or a region of another size -
 *   removes it and creates one; never refused for it.
 *
 * RECOVERY (after a crash)
 *   A crash may leave the heap half changed.  Its user rebuilds it from
 *   what is reachable instead: region_recover_begin forgets every
 *   allocation, region_recover_claim marks again each one the user's
 *   structures reach (its address and size: a slab slot or a run; a
 *   claim that is not a possible allocation, or that overlaps one made
 *   before, is refused), and region_recover_end threads the slabs' free
 *   slots and gives back every page nothing claimed.  So whatever the
 *   dead process was allocating or freeing is free, and nothing reached
 *   is lost.  One thread, nothing else running.
 *
 *   A recovery is itself killed sometimes (the machine that crashed once
 *   is short of memory, or is rebooting): every step of it leaves the
 *   region so that the next recovery, started over from the beginning,
 *   reaches the same result.  Its user marks the attempt first
 *   (region_recovery_start: the state "recovering", and one more
 *   recovery_restarts when the last attempt was cut short); no step
 *   destroys a fact that a later step, or the next attempt, rebuilds
 *   from (the allocator's and the store's recoveries say how, each).
 *
 * LOCKS
 *   region.heap_lock         the heap: its bitmap, its page records and
 *                             its slab lists.  A leaf: taken with any of
 *                             the allocator's or the store's locks held,
 *                             nothing taken under it.
 */

#ifndef ZSALLOC_REGION_H
#define ZSALLOC_REGION_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

#define REGION_MAGIC "ZRAMRGN"          /* 8 bytes with its NUL */
#define REGION_LAYOUT_VERSION 6   /* 6: cells keep descriptor address >> 4 */
#define REGION_PAGE_SIZE 4096

enum region_state {
  REGION_SERVING = 1,           /* an owner has it (or had it, and died) */
  REGION_HANDED_OVER = 2,       /* quiescent, its structures whole */
  REGION_CREATING = 3,          /* made, its user's structures not yet
                                   (region_set_root ends it) */
  REGION_RECOVERING = 4,        /* a recovery after a crash is rebuilding
                                   it (or was, and died) */
};

/* The state: what changes at each change of owner, written twice
 * (STATE WRITES above).
 */
struct region_state_record {
  uint64_t generation;          /* owners so far, the first one 1 */
  uint32_t state;               /* enum region_state */
  uint32_t owner_pid;           /* the last owner, for messages */
  uint64_t root;                /* the user's root object's address */
  uint64_t user_version;        /* the user's own layout version */
  uint64_t stopped_ns;          /* CLOCK_MONOTONIC when the last owner
                                   handed it over (0: it did not) */
  uint64_t recoveries;          /* owners that took it after a crash */
  uint64_t recovery_restarts;   /* recoveries started over one that
                                   did not reach serving (killed, or its
                                   server failed before it served) */
  uint32_t checksum;            /* CRC-32C of the fields above */
  uint32_t pad;
};

/* Slab slot sizes: REGION_SLAB_MIN << k, k < REGION_SLAB_CLASSES.
 * Larger allocations take whole pages.
 */
#define REGION_SLAB_MIN 64
#define REGION_SLAB_CLASSES 5           /* 64, 128, 256, 512, 1024 */
#define REGION_NO_PAGE 0                /* page 0 is the header: never listed */
/* A freed run of this many pages or more is punched out at once (a page
 * source's chunk); smaller ones stay resident until region_trim.
 */
#define REGION_PUNCH_PAGES 16

/* What one page of the region holds; guarded by heap_lock. */
struct region_page {
  uint32_t prev, next;          /* slab pages of one class with a free
                                   slot, or ready pages (free, resident:
                                   ready_head): a list by page number */
  uint32_t run_pages;           /* first page of a taken run: its length */
  uint16_t slab_used;           /* a slab: slots taken */
  uint16_t slab_free_head;      /* a slab: first free slot, threaded
                                   through the free slots' first bytes;
                                   0xffff: none */
  uint16_t slab_never_used;     /* a slab: slots >= this never taken */
  uint8_t kind;                 /* REGION_PAGE_* */
  uint8_t slab_class;
};

enum {
  REGION_PAGE_FREE = 0,         /* free, punched out (or never written) */
  REGION_PAGE_FREE_RESIDENT,    /* free, its memory still there */
  REGION_PAGE_RUN,              /* the first page of a taken run */
  REGION_PAGE_RUN_TAIL,         /* another page of a taken run */
  REGION_PAGE_SLAB,
  REGION_PAGE_MAPS,             /* the header and the maps */
};

struct region {
  /* Identity: written at creation, covered by identity_checksum. */
  char magic[8];
  uint32_t layout_version;
  uint32_t header_bytes;        /* sizeof (struct region) */
  uint64_t region_bytes;        /* the segment's size */
  uint64_t base_address;        /* where every owner maps it */
  uint64_t page_size;
  uint64_t device_bytes;        /* the user's device size */
  uint8_t device_id[16];        /* random, made at creation */
  uint64_t map_pages;           /* pages 1..map_pages hold the maps */
  uint32_t identity_checksum;
  uint32_t pad0;

  /* State: written at each change of owner, the journal copy first
   * (STATE WRITES); read from current, or from the journal when
   * current's checksum fails.
   */
  struct region_state_record current;
  struct region_state_record journal;

  /* The heap: guarded by heap_lock (its own state is rebuilt with it). */
  pthread_mutex_t heap_lock;
  uint64_t rover;               /* where the next run search starts */
  uint64_t pages_taken;         /* heap pages taken (runs and slabs) */
  uint64_t pages_resident_free; /* free pages not yet punched out */
  uint64_t high_water;          /* pages below it were ever taken */
  _Atomic uint64_t alive_ns;    /* CLOCK_MONOTONIC when its owner last
                                   said it was alive (a crash's downtime
                                   counts from here) */
  uint32_t slab_partial[REGION_SLAB_CLASSES]; /* slab pages with room */
  uint32_t ready_head;          /* free pages still resident, listed:
                                   what a one-page run or a new slab
                                   takes first (region_make_ready) */
};

/* The maps: a bit per page, then a record per page (LAYOUT). */
static inline uint64_t *
region_page_bits (struct region *region)
{
  return (uint64_t *) ((char *) region + REGION_PAGE_SIZE);
}
static inline struct region_page *
region_pages (struct region *region)
{
  uint64_t pages = region->region_bytes / REGION_PAGE_SIZE;
  return (struct region_page *) (region_page_bits (region) + (pages + 63) / 64);
}

/* A process's ownership of a region (not in the region). */
struct region_owner {
  struct region *region;        /* where it is attached */
  int shm_id;                   /* the segment */
  key_t key;                    /* its key (THE REGION FILE) */
  int lock_fd;                  /* the region file, flocked */
  char *path;                   /* the region file's */
};

/* Create a region of bytes (rounded up to whole pages; at least enough
 * for its header and maps) for a device of device_bytes, named by the
 * region file at path (made, or replaced if it is a region file of this
 * user's that names no segment that exists: THE REGION FILE, TRUST),
 * attach it and own it.  locked: its pages are never swapped out
 * (SHM_LOCK; swap).  NULL with errno on failure (EBUSY: another process
 * owns the file, or writes PATH.new; EEXIST: the file names a region
 * that exists; EPERM: a path or file not trusted; EINVAL: not a region
 * file) and, from region_create_explained, a message for the user in
 * why[].
 */
extern struct region_owner *region_create (const char *path, uint64_t bytes,
                                           uint64_t device_bytes, bool locked);
extern struct region_owner *region_create_explained (const char *path,
                                                     uint64_t bytes,
                                                     uint64_t device_bytes,
                                                     bool locked, char *why,
                                                     size_t why_bytes);

enum region_attach_result {
  REGION_ATTACH_CLEAN,          /* handed over: its structures are whole */
  REGION_ATTACH_CRASHED,        /* its owner died serving it, or
                                   recovering it */
  REGION_ATTACH_UNMADE,         /* its maker died making it (CREATION):
                                   region_remake, then make its
                                   structures */
};

/* Take over the region that the file at path names.  device_bytes: the
 * device size the caller serves, checked against the header's (0: any).
 * NULL on refusal, with errno (ENOENT: no region file, or its segment is
 * gone, or it was being made by a server that died - create one;
 * EINVAL: not a region file, or a segment that is not a region, is
 * damaged or is another device's; EPROTO: a layout of another version;
 * EBUSY: another process owns it, or has its segment attached; EPERM: a
 * directory, file or segment that is not this user's (TRUST); EEXIST:
 * its address is taken in this process; ENOMEM) and a message for the
 * user in why[].  On success *how says how
 * the last owner left it, and the region is this process's, its state
 * unchanged until region_start_serving: a process that attaches and
 * stops before it serves (its server failed to start) leaves the region
 * as it found it.
 */
extern struct region_owner *region_attach (const char *path,
                                           uint64_t device_bytes,
                                           enum region_attach_result *how,
                                           char *why, size_t why_bytes);

/* Keep the address range of the region the file at path names for a
 * later region_attach in this process (ADDRESS RESERVATION).  0, or -1
 * with errno: ENOENT (no region yet), EINVAL (not a region), EPERM (a
 * file or segment not trusted: TRUST), EEXIST (the range is taken in
 * this process already), EALREADY (one is kept).  A
 * region_attach of another region gives it back.
 */
extern int region_reserve_address (const char *path);

/* The user's root object and its layout version, set by the creator
 * once its structures are made: the region is made from then ("handed
 * over", CREATION).
 */
extern void region_set_root (struct region *region, void *root,
                             uint64_t user_version);
extern void *region_root (const struct region *region);

/* The state as read (STATE WRITES): current, or the journal when
 * current was torn.
 */
extern const struct region_state_record *
region_state_read (const struct region *region);

/* A region REGION_ATTACH_UNMADE made anew in place: its heap emptied
 * (every page given back), its state "creating" again, ready for its
 * user's structures.  Its identity (device size, segment size) is never
 * rewritten: a caller that needs another gives it up (region_destroy)
 * and creates one.
 */
extern void region_remake (struct region_owner *owner);

/* A recovery after a crash starts (RECOVERY): the state "recovering",
 * and one more recovery_restarts when the last recovery did not reach
 * serving (cut short, or its server failed before it served).
 */
extern void region_recovery_start (struct region *region);

/* Tests only: called with a step's name at each step of a recovery (the
 * region's, the allocator's, the store's), so that a test can kill it
 * there.  NULL in a server.
 */
extern void (*region_recovery_step) (const char *step);
static inline void
recovery_step (const char *step)
{
  if (region_recovery_step)
    region_recovery_step (step);
}

/* Mark the region handed over, clean (every user stopped, every
 * structure quiescent; stopped_ns: when its users stopped), detach it and
 * give up ownership.
 */
extern void region_hand_over (struct region_owner *owner, uint64_t stopped_ns);

/* Detach without changing the state: a region dropped by a server that
 * stops as a crash would (or a test simulating one).
 */
extern void region_close (struct region_owner *owner);

/* The owner starts changing the region (serving): the state "serving",
 * the generation one more (the first owner's is 1), and after a crash
 * (state "serving" or "recovering") one more recovery.
 */
extern void region_start_serving (struct region_owner *owner);

/* Lock the region's pages in memory from now (SHM_LOCK), as
 * region_create's locked: 0, or -1 with errno.
 */
extern int region_lock (struct region_owner *owner);

/* Map every page the region holds into this process now (its page
 * tables made), so that serving it faults on none: a new owner's first
 * touch of each page is a fault, and a fault that needs memory for a
 * page table waits, in swap, for the device this process serves.  Pages
 * not in memory (never written, punched) stay so.  Returns the pages
 * mapped.
 */
extern uint64_t region_map_resident (struct region *region);

/* Remove the segment and the region file: the device is given up. */
extern void region_destroy (struct region_owner *owner);

/* Remove the region the file at path names, owning it for the moment
 * (nbdkit-zramctl region remove): its segment only if provably the one
 * the file names (TRUST), the file only if it is a region file of this
 * user's.  0 when removed, or when there is no file; a file naming no
 * segment that exists is removed alone.  -1 with errno and why[], nothing
 * touched: EINVAL (not a region file, or the segment is not the named
 * region), EBUSY (owned, or attached by a server), EPERM (not trusted).
 */
extern int region_remove (const char *path, char *why, size_t why_bytes);

/* The heap.  region_alloc: bytes (> 0) aligned to align (a power of two,
 * at most a page); sizes of REGION_SLAB_MIN << (REGION_SLAB_CLASSES - 1)
 * or less come from slabs, larger ones are whole pages.  NULL with errno
 * ENOMEM when the region is full.  region_free gives it back (NULL: a
 * no-op), its size known from the page records.
 */
extern void *region_alloc (struct region *region, size_t bytes, size_t align);
extern void region_free (struct region *region, void *p);
/* Give pages of a taken run back to the system (they read as zeros
 * after): a page source's purge.
 */
extern void region_punch (struct region *region, void *start, size_t bytes);
/* Make at least bytes of free pages resident (touched, so locked too
 * under SHM_LOCK) and ready for the heap's next small allocations; the
 * pages are taken while they are touched, so the heap goes on meanwhile.
 * Returns the bytes ready now (less than asked when the region or the
 * machine has no more).
 */
extern uint64_t region_make_ready (struct region *region, uint64_t bytes);
/* Punch out every free page still resident.  Returns the pages. */
extern uint64_t region_trim (struct region *region);

/* RECOVERY, above.  region_recover_claim: false when p cannot be an
 * allocation of bytes (outside the heap, misaligned for its kind) or was
 * claimed already.  region_recover_end returns the pages given back.
 */
extern void region_recover_begin (struct region *region);
extern bool region_recover_claim (struct region *region, const void *p,
                                  size_t bytes, size_t align);
extern uint64_t region_recover_end (struct region *region);

/* Memory for a structure that lives in a region when its owner does
 * (region not NULL), else on the C heap: the one way the allocator and
 * the store allocate what a take-over needs.  align: a power of two, at
 * most a page.
 */
static inline void *
region_memory_alloc (struct region *region, size_t bytes, size_t align)
{
  if (region)
    return region_alloc (region, bytes, align);
  return aligned_alloc (align, (bytes + align - 1) / align * align);
}
static inline void
region_memory_free (struct region *region, void *p)
{
  if (region)
    region_free (region, p);
  else
    free (p);
}

/* Whether [p, p + bytes) lies inside the region: what a recovery checks
 * of every address it reads before it follows it.
 */
static inline bool
region_contains (const struct region *region, const void *p, size_t bytes)
{
  uintptr_t start = (uintptr_t) region;
  return (uintptr_t) p >= start
    && (uintptr_t) p - start <= region->region_bytes - bytes;
}

#endif /* ZSALLOC_REGION_H */
