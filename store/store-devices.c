/* The devices a region's root store holds: see DEVICES IN A REGION in
 * block-store.h.
 *
 * The table is one allocation in the region, made at the first publish
 * and pointed to by the root from then on (the pointer written after
 * the table is zeroed: a kill between leaves a table no one reaches,
 * which recovery gives back).  A slot is free while its store pointer
 * is 0.  Publishing writes the spec and its CRC, then the pointer;
 * unpublishing clears the pointer alone.  Both are done by the one
 * thread that adds and removes devices, so no lock: what the ordering
 * must hold against is a kill, not another thread, and a release store
 * keeps the spec's writes before the pointer's.
 */

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "block-store-internal.h"
#include "crc32c.h"

struct store_devices {
  struct device_slot {
    _Atomic uint64_t store;       /* struct block_store *; 0: free */
    struct device_spec spec;
    uint32_t spec_crc;            /* CRC-32C of spec */
  } slots[DEVICES_MAX];
};

static uint32_t
spec_checksum (const struct device_spec *spec)
{
  return crc32c (spec, sizeof *spec);
}

static struct store_devices *
table_made (struct block_store *root)
{
  struct store_devices *table = atomic_load (&root->devices);
  if (table)
    return table;
  table = region_alloc (root->region, sizeof *table, 16);
  if (!table)
    return NULL;
  memset (table, 0, sizeof *table);
  atomic_store_explicit (&root->devices, table, memory_order_release);
  return table;
}

int
store_device_publish (struct block_store *root, const struct device_spec *spec,
                      struct block_store *store)
{
  if (!root->region || store->region != root->region
      || store->pool != root->pool) {
    errno = EINVAL;
    return -1;
  }
  struct store_devices *table = table_made (root);
  if (!table) {
    errno = ENOMEM;
    return -1;
  }
  for (unsigned i = 0; i < DEVICES_MAX; i++) {
    struct device_slot *slot = &table->slots[i];
    if (atomic_load_explicit (&slot->store, memory_order_relaxed))
      continue;
    /* The spec whole, with no stray bytes (its padding and the name's
     * tail are checksummed too).
     */
    memset (&slot->spec, 0, sizeof slot->spec);
    memcpy (slot->spec.name, spec->name,
            strnlen (spec->name, DEVICE_NAME_MAX));
    slot->spec.size = spec->size;
    slot->spec.algorithm = spec->algorithm;
    slot->spec.level = spec->level;
    slot->spec.cap = spec->cap;
    slot->spec.floor = spec->floor;
    slot->spec_crc = spec_checksum (&slot->spec);
    atomic_store_explicit (&slot->store, (uint64_t) (uintptr_t) store,
                           memory_order_release);
    return 0;
  }
  errno = ENOSPC;
  return -1;
}

void
store_device_unpublish (struct block_store *root, struct block_store *store)
{
  struct store_devices *table = root->region ? atomic_load (&root->devices)
    : NULL;
  if (!table)
    return;
  for (unsigned i = 0; i < DEVICES_MAX; i++)
    if (atomic_load (&table->slots[i].store) == (uint64_t) (uintptr_t) store)
      atomic_store (&table->slots[i].store, 0);
}

unsigned
store_devices_held (struct block_store *root, struct device_spec *specs,
                    struct block_store **stores, unsigned max)
{
  struct store_devices *table = root->region ? atomic_load (&root->devices)
    : NULL;
  unsigned count = 0;
  for (unsigned i = 0; table && i < DEVICES_MAX && count < max; i++) {
    uint64_t store = atomic_load (&table->slots[i].store);
    if (!store)
      continue;
    if (specs)
      specs[count] = table->slots[i].spec;
    stores[count++] = (struct block_store *) (uintptr_t) store;
  }
  return count;
}

unsigned
store_devices_recover (struct block_store *root,
                       bool (*walk) (struct block_store *store, void *opaque),
                       void *opaque)
{
  struct store_devices *table = atomic_load (&root->devices);
  if (!table)
    return 0;
  if (!region_recover_claim (root->region, table, sizeof *table, 16)) {
    /* Not a table: the devices are lost (the root's blocks are not). */
    atomic_store (&root->devices, NULL);
    return 0;
  }
  unsigned lost = 0;
  for (unsigned i = 0; i < DEVICES_MAX; i++) {
    struct device_slot *slot = &table->slots[i];
    uint64_t store = atomic_load (&slot->store);
    if (!store)
      continue;
    /* A slot refused now is refused by every later attempt too (its
     * bytes are not changed but for this clearing): a recovery killed
     * and started over reaches the same table.
     */
    if (spec_checksum (&slot->spec) != slot->spec_crc
        || slot->spec.name[DEVICE_NAME_MAX] != '\0'
        || !walk ((struct block_store *) (uintptr_t) store, opaque)) {
      atomic_store (&slot->store, 0);
      lost++;
    }
  }
  return lost;
}

void
store_devices_free (struct block_store *root)
{
  struct store_devices *table = root->region ? atomic_load (&root->devices)
    : NULL;
  if (!table)
    return;
  atomic_store (&root->devices, NULL);
  region_free (root->region, table);
}
