/* Cold packing: units of idle blocks compressed together, and
 * dissolving them (a mover: it claims and commits entries, and encodes
 * and decodes blocks and units through block-encode.c and unit-decode.c,
 * below it).  See block-store.h for the design.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block-store-internal.h"

/* A unit whose dissolve failed for memory is tried again after this many
 * seconds.
 */
#define DISSOLVE_RETRY_SECONDS 10
/* Units pinned by one walk of the unit list. */
#define DISSOLVE_BATCH 64

/* Drop a reference to a unit (a block's, or a pin): the last frees it. */
static void
unit_put (struct block_store *store, struct pack_unit *unit)
{
  if (atomic_fetch_sub (&unit->live, 1) == 1)
    unit_destroy (store, unit);
}

static bool
dissolve_wanted (void *opaque, uint64_t block, uint64_t state)
{
  return block_state_kind (state) == BLOCK_PACKED;
}

/* Move the blocks still in a unit out, each stored alone again by the
 * move protocol (not an access: its time and idle flag stay).  plain,
 * if not NULL, holds the unit's blocks decoded.  The caller holds a
 * reference.  Returns how many blocks moved out; *complete says whether
 * none is left (false: no memory for one, or another mover held it).
 */
static unsigned
unit_dissolve (struct block_store *store, struct pack_unit *unit,
               const unsigned char *plain, bool *complete)
{
  unsigned moved = 0;
  uint64_t blocks[STORE_PACK_MAX];
  unit_blocks_get (unit, blocks);
  *complete = true;
  for (unsigned i = 0; i < unit->count; i++) {
    uint64_t block = blocks[i];
    unsigned char decoded[STORE_BLOCK_SIZE];
    struct block_content old, content;
    struct block_entry *entry = entry_claim (store, block, dissolve_wanted,
                                             NULL, &old);
    if (!entry) {
      /* Moved out already, or another mover holds it. */
      struct block_leaf *leaf;
      pthread_mutex_lock (stripe_for (store, block));
      struct block_content now = entry_load (block_table_lookup (&store->table,
                                                                 block, false,
                                                                 &leaf));
      if (now.kind == BLOCK_PACKED && now.value == ((uintptr_t) unit | i))
        *complete = false;
      pthread_mutex_unlock (stripe_for (store, block));
      continue;
    }
    if (old.value != ((uintptr_t) unit | i)) {
      pthread_mutex_unlock (stripe_for (store, block));
      entry_unclaim (store, block);     /* in another unit */
      continue;
    }
    /* Decode the data alone: the zeroed overlay stays in the entry. */
    old.zeroed = 0;
    int r = plain ? 0 : block_decode (store, &old, decoded);
    pthread_mutex_unlock (stripe_for (store, block));
    if (r == 0)
      r = block_encode (store, plain ? plain + (size_t) i * STORE_BLOCK_SIZE
                        : decoded, &content);
    if (r == -1) {
      entry_unclaim (store, block);
      *complete = false;
      continue;
    }
    if (entry_commit (store, block, &content, &old)) {
      content_discard (store, &old);    /* the unit's reference */
      moved++;
    }
    else
      content_discard (store, &content); /* written meanwhile */
  }
  return moved;
}

/* ---- packing ---------------------------------------------------------- */

/* A packing run. */
struct pack_run {
  struct block_store *store;
  uint64_t max_blocks;
  uint32_t now, min_age;
  unsigned char *plain, *compressed;   /* pack_blocks blocks each */
  bool encoder_asked;             /* dictionary_encoder_borrow ran */
  struct codec_encoder *encoder;  /* borrowed at the first compression
                                     (NULL: none) */
  unsigned dictionary;            /* its dictionary's number (0: none) */
  struct store_pack_result *result;
  bool (*keep_going) (void *opaque);
  void *opaque;
};

/* Idle, old enough, an object of its own, no zeroed overlay. */
static bool
pack_candidate (void *opaque, uint64_t block, uint64_t state)
{
  const struct pack_run *run = opaque;
  unsigned kind = block_state_kind (state);
  return (state & BLOCK_FLAG_IDLE)
    && (kind == BLOCK_COMPRESSED || kind == BLOCK_RAW
        || kind == BLOCK_COMPRESSED_PADDED)
    && block_state_zeroed (state) == 0
    && state_is_older (state, run->now, run->min_age);
}

/* A block claimed for packing. */
struct pack_member {
  uint64_t block;
  size_t bytes;                   /* its object's */
};

static void
members_unclaim (struct block_store *store, const struct pack_member *members,
                 unsigned count)
{
  for (unsigned i = 0; i < count; i++)
    entry_unclaim (store, members[i].block);
}

/* A unit of count blocks, its parts holding compressed (length bytes:
 * its frames, of frame_lengths, compressed with dictionary number),
 * charged to the pool; its own reference in live, and one taken on the
 * dictionary.  NULL with errno.
 */
static struct pack_unit *
unit_create (struct block_store *store, const struct pack_member *members,
             unsigned count, const unsigned char *compressed, size_t length,
             const uint32_t *frame_lengths, unsigned dictionary)
{
  unsigned parts = (length + STORE_PACK_PART - 1) / STORE_PACK_PART;
  size_t descriptor = unit_bytes (parts, count);
  if (zs_pool_charge (store->pool, descriptor) == -1)
    return NULL;
  struct pack_unit *unit = region_memory_alloc (store->region, descriptor,
                                                STORE_PACK_MAX);
  if (!unit) {
    zs_pool_discharge (store->pool, descriptor);
    return NULL;
  }
  unit->count = count;
  unit->length = length;
  unit->prev = unit->next = NULL;
  unit->dissolve_retry = 0;
  unit->id = atomic_fetch_add (&store->unit_ids, 1) + 1;
  unit->parts = parts;
  unit->dictionary = dictionary;
  atomic_init (&unit->live, 1);
  uint64_t blocks[STORE_PACK_MAX];
  for (unsigned i = 0; i < count; i++)
    blocks[i] = members[i].block;
  unit_layout_set (unit, blocks, frame_lengths);
  for (unsigned i = 0; i < parts; i++) {
    size_t at = (size_t) i * STORE_PACK_PART;
    size_t part = length - at < STORE_PACK_PART ? length - at : STORE_PACK_PART;
    zs_handle_t handle = object_alloc (store, part);
    if (!handle) {
      int err = errno;
      for (unsigned j = 0; j < i; j++)
        object_free (store, unit_parts (unit)[j]);
      zs_pool_discharge (store->pool, descriptor);
      region_memory_free (store->region, unit);
      errno = err;
      return NULL;
    }
    zs_write (store->pool, handle, compressed + at, part);
    unit_parts (unit)[i] = handle;
  }
  dictionary_get (store, dictionary);
  counter_add (&store->compr_bytes, length);
  counter_add (&store->pack_units, 1);
  return unit;
}

/* Pack up to pack_blocks blocks into one unit by the move protocol: each
 * is claimed and decoded under its stripe lock, all are compressed with
 * no lock held, then each moves in if its claim holds.  A unit that not
 * every block moved into is kept only if it takes less than the blocks
 * that did took; else they are put back (stored alone) and it goes.
 * Adds to result what was really packed; *used: how many of the blocks
 * were tried (fewer than n when one lies too far from the one before).
 */
static int
pack_group (struct pack_run *run, const uint64_t *blocks, unsigned n,
            unsigned *used)
{
  struct block_store *store = run->store;
  struct pack_member members[STORE_PACK_MAX];
  unsigned count = 0;
  size_t before = 0;
  *used = n;

  for (unsigned i = 0; i < n; i++) {
    struct block_content old;
    /* A unit keeps its blocks as gaps of 16 bits: one too far from the
     * last ends the group (the next group starts with it).
     */
    if (count > 0
        && blocks[i] - members[count - 1].block > UNIT_BLOCK_GAP_MAX) {
      *used = i;
      break;
    }
    if (!entry_claim (store, blocks[i], pack_candidate, run, &old))
      continue;
    size_t bytes = zs_object_size (store->pool, old.value);
    int r = block_decode (store, &old,
                          run->plain + (size_t) count * STORE_BLOCK_SIZE);
    pthread_mutex_unlock (stripe_for (store, blocks[i]));
    if (r == -1) {
      entry_unclaim (store, blocks[i]);
      continue;
    }
    members[count++] = (struct pack_member) { .block = blocks[i], .bytes = bytes };
    before += bytes;
  }
  if (count < 2) {
    members_unclaim (store, members, count);
    return 0;
  }

  /* A unit is worth it only if it takes less than its blocks did.  A
   * compression that fails skips this group: the run goes on.
   */
  if (!run->encoder_asked) {
    /* Not before: a run with nothing to pack makes no encoder. */
    run->encoder = dictionary_encoder_borrow (store, &run->dictionary);
    run->encoder_asked = true;
  }
  uint32_t frame_lengths[STORE_PACK_MAX / STORE_PACK_FRAME];
  int length = codec_compress_frames (store->pack_codec, run->encoder,
                                      run->plain,
                                      (size_t) count * STORE_BLOCK_SIZE,
                                      (size_t) STORE_PACK_FRAME * STORE_BLOCK_SIZE,
                                      run->compressed, before, frame_lengths);
  unsigned parts = length > 0 ? (length + STORE_PACK_PART - 1) / STORE_PACK_PART
    : 0;
  if (length <= 0 || (size_t) length + unit_bytes (parts, count) >= before) {
    members_unclaim (store, members, count);
    return 0;
  }
  struct pack_unit *unit = unit_create (store, members, count, run->compressed,
                                        length, frame_lengths, run->dictionary);
  if (!unit) {
    int err = errno;
    members_unclaim (store, members, count);
    errno = err;
    return err == ENOSPC ? 0 : -1;
  }

  unsigned moved = 0;
  size_t moved_bytes = 0;
  for (unsigned i = 0; i < count; i++) {
    struct block_content packed = {
      .kind = BLOCK_PACKED, .value = (uintptr_t) unit | i,
    }, old;
    /* The block's reference first: once in, a write may drop it. */
    atomic_fetch_add (&unit->live, 1);
    if (entry_commit (store, members[i].block, &packed, &old)) {
      content_discard (store, &old);
      moved++;
      moved_bytes += members[i].bytes;
    }
    else
      atomic_fetch_sub (&unit->live, 1);        /* written meanwhile */
  }
  size_t after = length + unit_bytes (parts, count);
  if (moved > 0 && moved < count && after >= moved_bytes) {
    /* Not worth it for the blocks that moved in: put them back. */
    bool complete;
    moved -= unit_dissolve (store, unit, run->plain, &complete);
    if (moved == 0)
      moved_bytes = 0;
  }
  if (moved > 0) {
    pthread_mutex_lock (&store->units_lock);
    unit->next = store->units;
    if (store->units)
      store->units->prev = unit;
    store->units = unit;
    pthread_mutex_unlock (&store->units_lock);
    run->result->units++;
    run->result->blocks += moved;
    run->result->bytes_before += moved_bytes;
    run->result->bytes_after += after;
  }
  unit_put (store, unit);       /* this call's reference */
  return 0;
}

static bool
pack_more (void *opaque, unsigned *group)
{
  struct pack_run *run = opaque;
  return !(run->max_blocks && run->result->blocks >= run->max_blocks)
    && !(run->keep_going && !run->keep_going (run->opaque));
}

static int
pack_some (void *opaque, const uint64_t *blocks, unsigned n)
{
  int r = 0;
  while (n > 0 && r == 0) {
    unsigned used;
    r = pack_group (opaque, blocks, n, &used);
    blocks += used;
    n -= used;
  }
  return r;
}

/* ---- the dictionary ---------------------------------------------------- */

/* Sampling the candidates for a dictionary: a uniform sample of up to
 * STORE_DICTIONARY_SAMPLES of them in one walk (reservoir sampling; the
 * random numbers are xorshift's, from a fixed seed: nothing here needs
 * to be unpredictable).
 */
struct dictionary_sampling {
  struct pack_run *run;
  unsigned char *samples;         /* STORE_DICTIONARY_SAMPLES blocks */
  uint64_t seen;                  /* candidates met */
  unsigned taken;                 /* samples held */
  uint64_t random;
};

static bool
sampling_candidate (void *opaque, uint64_t block, uint64_t state)
{
  const struct dictionary_sampling *sampling = opaque;
  return pack_candidate (sampling->run, block, state);
}

static bool
sampling_more (void *opaque, unsigned *group)
{
  struct dictionary_sampling *sampling = opaque;
  struct pack_run *run = sampling->run;
  return !(run->keep_going && !run->keep_going (run->opaque));
}

static int
sampling_work (void *opaque, const uint64_t *blocks, unsigned n)
{
  struct dictionary_sampling *sampling = opaque;
  struct pack_run *run = sampling->run;
  struct block_store *store = run->store;
  for (unsigned i = 0; i < n; i++) {
    uint64_t at = sampling->seen++;
    if (at >= STORE_DICTIONARY_SAMPLES) {
      sampling->random ^= sampling->random << 13;
      sampling->random ^= sampling->random >> 7;
      sampling->random ^= sampling->random << 17;
      at = sampling->random % sampling->seen;
      if (at >= STORE_DICTIONARY_SAMPLES)
        continue;
    }
    /* Claimed to be read as packing reads it; nothing moves. */
    struct block_content old;
    if (!entry_claim (store, blocks[i], pack_candidate, run, &old)) {
      sampling->seen--;
      continue;
    }
    int r = block_decode (store, &old,
                          sampling->samples + at * STORE_BLOCK_SIZE);
    pthread_mutex_unlock (stripe_for (store, blocks[i]));
    entry_unclaim (store, blocks[i]);
    if (r == -1)
      memset (sampling->samples + at * STORE_BLOCK_SIZE, 0, STORE_BLOCK_SIZE);
    if (at == sampling->taken)
      sampling->taken++;
  }
  return 0;
}

/* Train a dictionary from the run's candidates and make it the store's
 * current one, if one is wanted (dictionary_wanted).  Packing goes on
 * without it if it cannot be made: -1 only if the walk failed.
 */
static int
dictionary_train (struct pack_run *run)
{
  struct block_store *store = run->store;
  /* Training takes some 8 MiB for a moment (the samples, zstd's
   * tables): not in a store kept resident (swap mode), whose memory is
   * made ready before it is needed.
   */
  if (atomic_load (&store->keep_resident)
      || !dictionary_wanted (store, run->now))
    return 0;
  struct dictionary_sampling sampling = {
    .run = run, .random = 0x9e3779b97f4a7c15ull,
    .samples = malloc ((size_t) STORE_DICTIONARY_SAMPLES * STORE_BLOCK_SIZE),
  };
  unsigned char *dictionary = malloc (STORE_DICTIONARY_BYTES);
  size_t *sizes = malloc (STORE_DICTIONARY_SAMPLES * sizeof *sizes);
  int r = 0;
  if (sampling.samples && dictionary && sizes) {
    struct candidates walk = {
      .first = 0, .last = UINT64_MAX, .group = store->pack_blocks,
      .wanted = sampling_candidate, .more = sampling_more,
      .work = sampling_work,
      .opaque = &sampling,
    };
    r = candidates_walk (store, &walk);
    size_t size = 0;
    if (r == 0 && sampling.taken >= STORE_DICTIONARY_SAMPLES_MIN) {
      for (unsigned i = 0; i < sampling.taken; i++)
        sizes[i] = STORE_BLOCK_SIZE;
      size = codec_dictionary_train (dictionary, STORE_DICTIONARY_BYTES,
                                     sampling.samples, sizes, sampling.taken);
    }
    if (size == 0
        || dictionary_install (store, dictionary, size, run->now) == -1)
      dictionary_tried (store);
  }
  free (sampling.samples);
  free (dictionary);
  free (sizes);
  return r;
}

int
store_pack (struct block_store *store, uint64_t max_blocks, uint32_t min_age,
            bool (*keep_going) (void *opaque), void *opaque,
            struct store_pack_result *result)
{
  memset (result, 0, sizeof *result);
  size_t unit_plain = (size_t) store->pack_blocks * STORE_BLOCK_SIZE;
  struct pack_run run = {
    .store = store, .max_blocks = max_blocks,
    .now = store_clock (store), .min_age = min_age,
    .plain = malloc (unit_plain), .compressed = malloc (unit_plain),
    .result = result, .keep_going = keep_going, .opaque = opaque,
  };
  struct candidates walk = {
    .first = 0, .last = UINT64_MAX, .group = store->pack_blocks,
    .wanted = pack_candidate, .more = pack_more, .work = pack_some,
    .opaque = &run, .progress = &result->progress,
  };
  /* Training walks first: its progress (keep_going) says none walked. */
  result->progress.to_walk = store->blocks;
  int r = run.plain && run.compressed ? dictionary_train (&run) : -1;
  if (r == 0)
    r = candidates_walk (store, &walk);
  if (run.encoder)
    dictionary_encoder_return (store, result->units > 0);
  free (run.plain);
  free (run.compressed);
  return r;
}

/* ---- dissolving ---------------------------------------------------------- */

/* Pin a unit to dissolve it (a reference of our own on live), if fewer
 * than live_percent of its blocks are still in it; under units_lock.
 * Never one whose last block already left (live 0): the thread that took
 * live to 0 owns it and is about to unlink and free it (it waits for
 * units_lock), so pinning it then would free it twice.
 */
static bool
unit_pin_if_sparse (struct pack_unit *unit, unsigned live_percent)
{
  uint32_t live = atomic_load (&unit->live);
  while (live > 0 && live * 100 < unit->count * live_percent)
    if (atomic_compare_exchange_weak (&unit->live, &live, live + 1))
      return true;
  return false;
}

/* Each walk of the unit list pins up to DISSOLVE_BATCH sparse units under
 * units_lock, one pass, then dissolves them with no lock held: a walk is
 * linear in the units, and writers freeing units wait for one walk at
 * most.  keep_going is asked before each unit.
 */
uint64_t
store_pack_dissolve (struct block_store *store, unsigned live_percent,
                     bool (*keep_going) (void *opaque), void *opaque)
{
  uint32_t now = store_clock (store);
  uint64_t dissolved = 0;
  bool going = true;
  while (going) {
    struct pack_unit *batch[DISSOLVE_BATCH];
    unsigned n = 0;
    pthread_mutex_lock (&store->units_lock);
    for (struct pack_unit *unit = store->units; unit && n < DISSOLVE_BATCH;
         unit = unit->next)
      if (unit->dissolve_retry <= now
          && unit_pin_if_sparse (unit, live_percent))
        batch[n++] = unit;
    pthread_mutex_unlock (&store->units_lock);
    for (unsigned i = 0; i < n; i++) {
      going = going && !(keep_going && !keep_going (opaque));
      bool complete = false;
      if (going)
        unit_dissolve (store, batch[i], NULL, &complete);
      if (complete)
        dissolved++;
      else if (going) {
        /* No memory (or a mover held a block): not again for a while. */
        pthread_mutex_lock (&store->units_lock);
        batch[i]->dissolve_retry = now + DISSOLVE_RETRY_SECONDS;
        pthread_mutex_unlock (&store->units_lock);
      }
      unit_put (store, batch[i]);
    }
    if (n < DISSOLVE_BATCH)
      break;
  }
  return dissolved;
}
