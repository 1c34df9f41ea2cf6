/* A store's objects against its cap and the other stores' floors: see
 * BUDGET in block-store.h.
 *
 * The floors' unmet room (budget->unmet_floors) is kept exact without a
 * lock: each charge or discharge of a store with a floor moves its
 * quota_bytes from old to new in one atomic add, and moves the budget's
 * sum by exactly max(0, floor - new) - max(0, floor - old).  The sum of
 * such steps is the sum of the stores' unmet room whatever the order of
 * the adds.  A check reads the sum once and may see a step early or
 * late (block-store.h, struct store_budget): it is off by the claims in
 * flight, never by a lost update.
 */

#include <errno.h>
#include <stdatomic.h>
#include <unistd.h>

#include "block-store-internal.h"

/* The room below store's floor that quota_bytes of bytes leaves. */
static uint64_t
unmet (const struct block_store *store, uint64_t bytes)
{
  return store->floor > bytes ? store->floor - bytes : 0;
}

/* Move quota_bytes by delta (bytes, added or taken): its new value, and
 * the budget's unmet floors moved with it.
 */
static uint64_t
quota_move (struct block_store *store, uint64_t delta, bool add)
{
  uint64_t old = add ? atomic_fetch_add (&store->quota_bytes, delta)
    : atomic_fetch_sub (&store->quota_bytes, delta);
  uint64_t now = add ? old + delta : old - delta;
  if (store->floor) {
    uint64_t before = unmet (store, old), after = unmet (store, now);
    if (before != after)
      atomic_fetch_add (&store->budget->unmet_floors,
                        (int64_t) after - (int64_t) before);
  }
  return now;
}

/* Charge handle's object, newly allocated, to store: true, or false
 * with the charge taken back (the caller frees the object).  An object
 * counts its room (its size class's bytes), which a rewrite in place
 * (zs_resize, block_encode_in_place) never changes: the charge and the
 * discharge are the same bytes.
 */
static bool
object_charge (struct block_store *store, zs_handle_t handle)
{
  uint64_t own_unmet = 0;
  if (store->quota_counted) {
    size_t bytes = zs_object_room (store->pool, handle);
    uint64_t now = quota_move (store, bytes, true);
    own_unmet = unmet (store, now);
    if (store->cap && now > store->cap) {
      quota_move (store, bytes, false);
      goto refused;
    }
  }
  uint64_t floors = budget_unmet_floors (store->budget);
  if (floors > own_unmet) {
    uint64_t limit = zs_pool_mem_limit (store->pool);
    if (limit && zs_pool_bytes (store->pool) + (floors - own_unmet) > limit) {
      if (store->quota_counted)
        quota_move (store, zs_object_room (store->pool, handle), false);
      goto refused;
    }
  }
  return true;
 refused:
  atomic_fetch_add (&store->refused_for_budget, 1);
  return false;
}

static void
object_discharge (struct block_store *store, zs_handle_t handle)
{
  if (store->quota_counted)
    quota_move (store, zs_object_room (store->pool, handle), false);
}

zs_handle_t
object_alloc (struct block_store *store, size_t length)
{
  zs_handle_t handle = zs_malloc (store->pool, length);
  if (handle && store->budget && !object_charge (store, handle)) {
    zs_free (store->pool, handle);
    errno = ENOSPC;
    return 0;
  }
  return handle;
}

void
objects_alloc_batch (struct block_store *store, const size_t *lengths,
                     unsigned count, zs_handle_t *handles)
{
  zs_malloc_batch (store->pool, lengths, count, handles);
  if (store->budget)
    for (unsigned i = 0; i < count; i++)
      if (handles[i] && !object_charge (store, handles[i])) {
        zs_free (store->pool, handles[i]);
        handles[i] = 0;
      }
}

void
object_free (struct block_store *store, zs_handle_t handle)
{
  object_discharge (store, handle);
  zs_free (store->pool, handle);
}

void
objects_free_many (struct block_store *store, zs_handle_t *handles,
                   unsigned count)
{
  for (unsigned i = 0; i < count; i++)
    object_discharge (store, handles[i]);
  zs_free_many (store->pool, handles, count);
}

int
quota_init (struct block_store *store, const struct store_config *config)
{
  if ((config->cap || config->floor) && !config->budget) {
    errno = EINVAL;
    return -1;
  }
  if (config->cap && config->floor > config->cap) {
    errno = EINVAL;
    return -1;
  }
  store->budget = config->budget;
  store->cap = config->cap;
  store->floor = config->floor;
  store->quota_counted = config->cap || config->floor;
  if (store->floor) {
    atomic_fetch_add (&store->budget->floors, store->floor);
    atomic_fetch_add (&store->budget->unmet_floors, (int64_t) store->floor);
  }
  return 0;
}

void
quota_leave (struct block_store *store)
{
  if (store->floor) {
    atomic_fetch_sub (&store->budget->unmet_floors,
                      (int64_t) unmet (store, atomic_load (&store->quota_bytes)));
    atomic_fetch_sub (&store->budget->floors, store->floor);
  }
}

int
quota_rejoin (struct block_store *store, const struct store_config *config)
{
  store->budget = NULL;
  store->floor = 0;
  if (quota_init (store, config) == -1)
    return -1;
  if (store->floor)
    atomic_fetch_add (&store->budget->unmet_floors,
                      (int64_t) unmet (store, atomic_load (&store->quota_bytes))
                      - (int64_t) store->floor);
  return 0;
}

/* ---- COLD TIER ACROSS STORES (block-store.h) ---------------------------- */

void
budget_member_join (struct block_store *store)
{
  struct store_budget *budget = store->budget;
  if (!budget || !store->backing)
    return;
  pthread_mutex_lock (&budget->members_lock);
  store->budget_pins = 0;
  store->budget_next = budget->members;
  budget->members = store;
  store->budget_member = true;
  pthread_mutex_unlock (&budget->members_lock);
}

void
budget_member_leave (struct block_store *store)
{
  struct store_budget *budget = store->budget;
  if (!budget)
    return;
  pthread_mutex_lock (&budget->members_lock);
  if (!store->budget_member) {
    pthread_mutex_unlock (&budget->members_lock);
    return;
  }
  for (struct block_store **at = &budget->members; *at;
       at = &(*at)->budget_next)
    if (*at == store) {
      *at = store->budget_next;
      break;
    }
  store->budget_member = false;
  /* Unlinked: no new pin.  A writeback at work on it ends its slice. */
  while (store->budget_pins > 0) {
    pthread_mutex_unlock (&budget->members_lock);
    usleep (1000);
    pthread_mutex_lock (&budget->members_lock);
  }
  pthread_mutex_unlock (&budget->members_lock);
}

unsigned
budget_members_pin (struct block_store *store, struct block_store **members,
                    unsigned max)
{
  struct store_budget *budget = store->budget;
  unsigned count = 0;
  if (!budget)
    return 0;
  pthread_mutex_lock (&budget->members_lock);
  for (struct block_store *member = store->budget_member ? budget->members
         : NULL; member && count < max; member = member->budget_next)
    if (member->backing == store->backing) {
      member->budget_pins++;
      members[count++] = member;
    }
  pthread_mutex_unlock (&budget->members_lock);
  return count;
}

void
budget_members_unpin (struct block_store *const *members, unsigned count)
{
  for (unsigned i = 0; i < count; i++) {
    struct store_budget *budget = members[i]->budget;
    pthread_mutex_lock (&budget->members_lock);
    members[i]->budget_pins--;
    pthread_mutex_unlock (&budget->members_lock);
  }
}
