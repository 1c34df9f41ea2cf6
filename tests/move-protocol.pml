/* The block store's move protocol (store/block-store.h, MOVING A BLOCK),
 * checked exhaustively by spin: tests/test-move-protocol.sh.
 *
 * One block entry, written by two writers and marked idle by the idle
 * marker while two movers (packing, writeback, recompression, dissolving:
 * all alike here) move it to a new encoding.  A mover copies the entry
 * under the stripe lock, encodes with no lock, and commits under the lock
 * again if its rule says the entry is unchanged.  The property: a commit
 * installs the newest data written, never older data (no lost write).
 *
 * RULE selects how the mover decides "unchanged" (spin -DRULE=N):
 *   1  identity (the old code): the handle and the state word (kind, idle
 *      flag, access time in whole seconds) are as the mover copied them.
 *      FAILS.  A partial write in place keeps the handle and, in the same
 *      second, the state word; a full write takes a new handle and frees
 *      the old one, so a second full write gets the first handle back
 *      (most recently freed first); the idle marker sets the idle flag a
 *      write cleared.  Equal identity, newer bytes: the commit puts the
 *      copied (old) bytes over them.
 *   2  one bit: a claim flag a mover sets (only where clear) and every
 *      store clears; commit if it is still set.  FAILS: mover B claims
 *      v1, a write stores v2 (clearing the flag), mover C claims v2
 *      (setting it again), and B sees "its" flag set and commits v1.
 *   3  two bits (the code now): MOVE_HELD is set by a claim where clear
 *      and cleared only by the claiming mover's commit or unclaim, so no
 *      second mover can claim while the first still holds the entry;
 *      MOVE_INTACT is set with it and cleared by every store.  Set at
 *      commit time means nothing was stored since this mover's own claim
 *      (nobody else can have re-set it), so the bytes it copied are the
 *      entry's bytes.  HOLDS.
 *
 * -DNO_PARTIAL -DNO_TRIM leave the writers full writes only: the identity
 * rule still fails there, on handle recycling alone.
 *
 * Versions stand for the bytes: each store writes a new version number,
 * so "the data the entry holds" is e_ver and the newest written is newest.
 * A lock section is an atomic block (the stripe lock; the pool's own lock
 * for a bare allocation).  A write here is one locked section, allocation
 * and free included: the real write allocates before the lock and frees
 * after it, which changes nothing the movers can see in the entry, and
 * freeing at once is the worst case of the deferred free batches (a batch
 * drained right away).
 */

#ifndef RULE
#define RULE 3
#endif

#define NH          4   /* handles in the pool: entry, two movers' new
                           objects, a writer's new object */
#define NONE        255 /* no handle: the entry is empty (trimmed) */
#define WRITER_OPS  3   /* operations per writer */
#define IDLE_MARKS  2   /* idle all runs */
#define MOVER_MOVES 2   /* move attempts per mover */
#define TICKS       1   /* the clock may advance this many seconds */

/* ---- the entry ---------------------------------------------------------
 * e_ver is the truth (which data it holds); e_handle, e_idle and e_atime
 * (with the kind, empty where e_handle is NONE) are the identity the old
 * rule compared. */
byte e_ver = 1;
byte e_handle = 0;
bit  e_idle = 0;
byte e_atime = 0;
bit  e_held = 0;       /* RULE 3: MOVE_HELD */
bit  e_intact = 0;     /* RULE 3: MOVE_INTACT; RULE 2: the one claim bit */

byte now = 0;          /* the store's clock, whole seconds */
byte next_ver = 2;     /* the next version a store writes */
byte newest = 1;       /* the version of the latest store (ghost) */

/* ---- the allocator's handles: a stack, the most recently freed on top */
byte pool[NH];
byte nfree = 0;

inline pool_alloc(h)
{
  assert(nfree > 0);
  nfree--;
  h = pool[nfree];
  pool[nfree] = 0
}

inline pool_free(h)
{
  pool[nfree] = h;
  nfree++
}

/* A store into the entry (entry_store): new data, an access (idle flag
 * cleared, time now), and MOVE_INTACT (or the one-bit claim) cleared. */
inline store_version()
{
  e_ver = next_ver;
  newest = next_ver;
  next_ver++;
  e_idle = 0;
  e_atime = now;
  e_intact = 0
}

/* ---- a writer: full writes, partial writes in place, trims ------------ */
proctype writer()
{
  byte n = 0;
  byte h = 0;
  do
  :: n < WRITER_OPS ->
     atomic {
       if
       :: /* full write: a new object, the old one freed */
          pool_alloc(h);
          if
          :: e_handle != NONE -> pool_free(e_handle)
          :: else -> skip
          fi;
          e_handle = h;
          h = 0
#ifndef NO_PARTIAL
       :: /* partial write: the object rewritten in place, same handle */
          e_handle != NONE -> skip
#endif
#ifndef NO_TRIM
       :: /* trim (or zero): the object freed, the entry empty */
          e_handle != NONE ->
          pool_free(e_handle);
          e_handle = NONE
#endif
       fi;
       store_version();
       n++
     }
  :: else -> break
  od
}

/* ---- the idle marker (idle all): sets the idle flag, stores nothing, so
 * it leaves MOVE_INTACT as it is; it can make an old state word again. */
proctype idler()
{
  byte n = 0;
  do
  :: n < IDLE_MARKS ->
     atomic {
       if
       :: e_handle != NONE -> e_idle = 1
       :: else -> skip
       fi;
       n++
     }
  :: else -> break
  od
}

/* ---- the clock: may advance, or not (the same second is the worst case
 * for the identity rule, a tick lets the model see both). */
proctype clock()
{
  do
  :: now < TICKS -> now++
  :: else -> break
  od
}

/* ---- a mover ----------------------------------------------------------
 * 1. under the lock: claim (RULE 2, 3) and copy the entry;
 * 2. no lock: encode into a new object (an allocation of its own);
 * 3. under the lock: commit if the rule says the entry is unchanged, else
 *    drop the new object; or give the claim up (work failed: unclaim).
 * A commit is a store of the same data in a new encoding: it is not an
 * access (idle flag and time stay) but it clears MOVE_INTACT. */
inline commit()
{
  assert(my_ver == e_ver);     /* THE PROPERTY: no older data installed */
  assert(my_ver == newest);
  if
  :: e_handle != NONE -> pool_free(e_handle)
  :: else -> skip
  fi;
  e_handle = dest;
  e_ver = my_ver;
  e_intact = 0
}

proctype mover()
{
  byte n = 0;
  bit claimed = 0;
  byte my_ver = 0, my_handle = 0, my_atime = 0;
  bit my_idle = 0;
  byte dest = 0;
  do
  :: n < MOVER_MOVES ->
     /* 1. claim and copy */
     atomic {
       n++;
       if
       :: e_handle == NONE -> skip          /* nothing to move */
#if RULE == 3
       :: e_handle != NONE && e_held -> skip   /* another mover's */
       :: e_handle != NONE && !e_held ->
          e_held = 1; e_intact = 1; claimed = 1
#elif RULE == 2
       :: e_handle != NONE && e_intact -> skip /* looks claimed */
       :: e_handle != NONE && !e_intact -> e_intact = 1; claimed = 1
#else
       :: e_handle != NONE -> claimed = 1      /* no claim at all */
#endif
       fi;
       if
       :: claimed ->
          my_ver = e_ver; my_handle = e_handle;
          my_idle = e_idle; my_atime = e_atime
       :: else -> skip
       fi
     }
     if
     :: claimed ->
        /* 2. the slow part, with no stripe lock */
        atomic { pool_alloc(dest) }
        /* 3. commit, drop, or give up */
        atomic {
          if
          :: /* the work failed: unclaim */
             pool_free(dest)
          :: /* try to commit */
#if RULE == 3
             assert(e_held);          /* only this mover clears it */
             if
             :: e_intact -> commit()
             :: else -> pool_free(dest)
             fi
#elif RULE == 2
             if
             :: e_intact -> commit()
             :: else -> pool_free(dest)
             fi
#else
             if
             :: e_handle == my_handle && e_idle == my_idle &&
                e_atime == my_atime -> commit()
             :: else -> pool_free(dest)
             fi
#endif
          fi;
#if RULE == 3
          e_held = 0;
#elif RULE == 2
          e_intact = 0;
#endif
          claimed = 0; dest = 0;
          my_ver = 0; my_handle = 0; my_idle = 0; my_atime = 0
        }
     :: else -> skip
     fi
  :: else -> break
  od
}

init
{
  atomic {
    /* handle 0 is the entry's; 1 on top of the free stack */
    pool[0] = 3; pool[1] = 2; pool[2] = 1; nfree = 3;
    run writer(); run writer(); run idler(); run clock();
    run mover(); run mover()
  }
  /* everything done: the entry holds the newest data, no claim is left,
   * and every handle is in the entry or free */
  (_nr_pr == 1);
  assert(e_ver == newest);
  assert(e_held == 0);
  assert(nfree + (e_handle != NONE) == NH)
}
