/* Recompression (zram's recompress): see block-store.h.  A mover
 * (block-store-internal.h): it calls the walks, the entries' move
 * protocol, the codecs and the allocator.
 */

#include <errno.h>
#include <string.h>

#include "block-store-internal.h"

const char *
store_recompress_algorithm (const struct block_store *store, unsigned priority)
{
  if (priority < 1 || priority > store->recomp_count)
    return NULL;
  return codec_name (store->algorithms[priority]);
}

/* A recompression run. */
struct recompress_run {
  struct block_store *store;
  const struct store_recompress_request *request;
  unsigned top_priority;          /* the highest priority tried */
  uint32_t now;                   /* store_clock when it started */
  struct store_recompress_result *result;
  bool (*keep_going) (void *opaque);
  void *opaque;
};

static bool
recompress_wanted (const struct recompress_run *batch, uint64_t state)
{
  unsigned kind = block_state_kind (state);
  if (kind != BLOCK_COMPRESSED && kind != BLOCK_RAW
      && kind != BLOCK_COMPRESSED_PADDED)
    return false;
  if ((state & BLOCK_FLAG_INCOMPRESSIBLE)
      || ((state & BLOCK_PRIORITY_MASK) >> BLOCK_PRIORITY_SHIFT)
         >= batch->top_priority)
    return false;
  if ((batch->request->type & RECOMPRESS_IDLE) && !(state & BLOCK_FLAG_IDLE))
    return false;
  if ((batch->request->type & RECOMPRESS_HUGE) && kind != BLOCK_RAW)
    return false;
  return state_is_older (state, batch->now, batch->request->min_age);
}

static bool
recompress_candidate (void *opaque, uint64_t block, uint64_t state)
{
  return recompress_wanted (opaque, state);
}

/* Recompress one block by the move protocol: claimed and decoded under
 * its stripe lock, compressed with no lock held, committed if no store
 * came between.  A block that fails to compress is skipped.  Adds to
 * result.
 */
static void
recompress_block (struct block_store *store, uint64_t block,
                  const struct recompress_run *run,
                  struct store_recompress_result *result)
{
  unsigned char plain[STORE_BLOCK_SIZE], compressed[STORE_BLOCK_SIZE];
  struct block_content old;

  if (!entry_claim (store, block, recompress_candidate, (void *) run, &old))
    return;                     /* changed since the walk, or moving */
  size_t old_size = zs_object_size (store->pool, old.value);
  size_t old_room = zs_object_room (store->pool, old.value);
  /* The zeroed overlay stays as it is: decode the object alone. */
  struct block_content stored = old;
  stored.zeroed = 0;
  int r = old_size < run->request->threshold ? -1
    : block_decode (store, &stored, plain);
  pthread_mutex_unlock (stripe_for (store, block));
  if (r == -1) {
    entry_unclaim (store, block);
    return;
  }
  result->tried++;

  /* The first algorithm, by priority, that lands in a smaller class. */
  unsigned first = run->request->priority ? run->request->priority
    : content_priority (&old) + 1;
  unsigned priority = 0;
  int length = 0;
  bool failed = false;
  for (unsigned p = first; p <= run->top_priority && !priority; p++) {
    length = codec_compress (store->codecs[p], plain, compressed,
                             store->raw_threshold - 1);
    failed |= length == -1;
    if (length > 0 && zs_size_room (store->pool, length) < old_room)
      priority = p;
  }
  if (!priority) {
    /* Nothing shrinks it: skip it from now on.  A codec that failed says
     * nothing of the block: it is tried again next time.
     */
    if (failed)
      entry_unclaim (store, block);
    else if (entry_commit_flags (store, block, BLOCK_FLAG_INCOMPRESSIBLE))
      result->incompressible++;
    return;
  }
  zs_handle_t handle = object_alloc (store, length);
  if (!handle) {
    /* At the limit: this one stays as it is, the next may fit. */
    entry_unclaim (store, block);
    return;
  }
  zs_write (store->pool, handle, compressed, length);
  struct block_content content = {
    .kind = BLOCK_COMPRESSED, .value = handle,
    .flags = priority << BLOCK_PRIORITY_SHIFT,
  };
  if (!entry_commit (store, block, &content, &old)) {
    object_free (store, handle);        /* written meanwhile: theirs stays */
    return;
  }
  content_discard (store, &old);
  result->recompressed++;
  result->bytes_saved += old_size - length;
  counter_add (&store->recomp_blocks, 1);
  counter_add (&store->recomp_bytes_saved, old_size - length);
}

static bool
recompress_more (void *opaque, unsigned *group)
{
  struct recompress_run *run = opaque;
  return !(run->request->max_blocks
           && run->result->tried >= run->request->max_blocks)
    && !(run->keep_going && !run->keep_going (run->opaque));
}

static int
recompress_one (void *opaque, const uint64_t *blocks, unsigned n)
{
  struct recompress_run *run = opaque;
  recompress_block (run->store, blocks[0], run, run->result);
  return 0;
}

int
store_recompress (struct block_store *store,
                  const struct store_recompress_request *request,
                  bool (*keep_going) (void *opaque), void *opaque,
                  struct store_recompress_result *result)
{
  memset (result, 0, sizeof *result);
  if (store->recomp_count == 0 || request->priority > store->recomp_count
      || request->type < RECOMPRESS_IDLE || request->type > RECOMPRESS_HUGE_IDLE) {
    errno = EINVAL;
    return -1;
  }
  struct recompress_run run = {
    .store = store, .request = request, .now = store_clock (store),
    .top_priority = request->priority ? request->priority : store->recomp_count,
    .result = result, .keep_going = keep_going, .opaque = opaque,
  };
  struct candidates walk = {
    .first = 0, .last = UINT64_MAX, .group = 1,
    .wanted = recompress_candidate, .more = recompress_more,
    .work = recompress_one, .opaque = &run, .progress = &result->progress,
  };
  return candidates_walk (store, &walk);
}
