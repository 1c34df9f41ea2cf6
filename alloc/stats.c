/* Statistics: pool counters and zsmalloc's per-class debugfs columns. */

#include <inttypes.h>
#include <string.h>

#include "zsalloc-internal.h"

static const char *const group_names[ZS_FULLNESS_GROUPS] = {
  "empty", "10", "20", "30", "40", "50", "60", "70", "80", "90", "99", "full",
};

const char *
zs_fullness_group_name (unsigned group)
{
  return group < ZS_FULLNESS_GROUPS ? group_names[group] : NULL;
}

void
zs_pool_stats (struct zs_pool *pool, struct zs_pool_stats *stats)
{
  memset (stats, 0, sizeof *stats);
  zs_pool_flush (pool);

  for (unsigned c = 0; c < pool->distinct_classes; c++) {
    struct size_class *class = &pool->classes[c];
    pthread_mutex_lock (class->lock);
    stats->objects += class->objs_used;
    stats->bytes_stored += class->bytes_stored;
    stats->pages_freeable += class_freeable_zspages (class)
      * class->pages_per_zspage;
    pthread_mutex_unlock (class->lock);
  }
  stats->pages_used = atomic_load (&pool->pages_used);
  stats->limit_used = account_bytes (atomic_load (&pool->limit_account));
  stats->pages_used_max = atomic_load (&pool->pages_used_max);
  stats->pages_freed = atomic_load (&pool->pages.pages_returned);
  stats->limit_hits = atomic_load (&pool->limit_hits);
  stats->mem_limit = atomic_load (&pool->mem_limit);
  stats->metadata_bytes = atomic_load (&pool->metadata_bytes);
  stats->frees_pending = free_batches_pending (pool);
  stats->pages_compacted = atomic_load (&pool->pages_compacted);
  stats->reserve_bytes = page_source_reserve_pages (&pool->pages) * ZS_PAGE_SIZE;
  stats->reserve_refills = atomic_load (&pool->reserve_refills) * pool->pages.chunk_bytes;
  stats->reserve_misses = atomic_load (&pool->pages.reserve_misses);
  stats->metadata_misses = atomic_load (&pool->metadata_misses);
}

unsigned
zs_class_count (const struct zs_pool *pool)
{
  return pool->distinct_classes;
}

int
zs_class_stats (struct zs_pool *pool, unsigned class_number,
                struct zs_class_stats *stats)
{
  if (class_number >= pool->distinct_classes)
    return -1;

  struct size_class *class = &pool->classes[class_number];
  stats->size = class->size;
  stats->min_size = class->min_size;
  stats->pages_per_zspage = class->pages_per_zspage;
  stats->objs_per_zspage = class->objs_per_zspage;
  pthread_mutex_lock (class->lock);
  stats->objs_allocated = class->zspages * class->objs_per_zspage;
  stats->objs_used = class->objs_used;
  for (unsigned g = 0; g < ZS_FULLNESS_GROUPS; g++)
    stats->zspages[g] = class->group_counts[g];
  stats->pages_used = class->zspages * class->pages_per_zspage;
  stats->pages_freeable = class_freeable_zspages (class) * class->pages_per_zspage;
  pthread_mutex_unlock (class->lock);
  return 0;
}

void
zs_pool_print_stats (struct zs_pool *pool, FILE *fp)
{
  struct zs_pool_stats pool_stats;
  zs_pool_stats (pool, &pool_stats);

  fprintf (fp, "pages_used %" PRIu64 " pages_used_max %" PRIu64
           " bytes_stored %" PRIu64 " objects %" PRIu64
           " pages_freed %" PRIu64 " limit_hits %" PRIu64
           " mem_limit %" PRIu64 " metadata_bytes %" PRIu64
           " pages_compacted %" PRIu64 " pages_freeable %" PRIu64 "\n",
           pool_stats.pages_used, pool_stats.pages_used_max,
           pool_stats.bytes_stored, pool_stats.objects,
           pool_stats.pages_freed, pool_stats.limit_hits,
           pool_stats.mem_limit, pool_stats.metadata_bytes,
           pool_stats.pages_compacted, pool_stats.pages_freeable);

  fprintf (fp, " class  size");
  for (unsigned g = 0; g < ZS_FULLNESS_GROUPS; g++)
    fprintf (fp, " %5s", group_names[g]);
  fprintf (fp, " obj_allocated obj_used pages_used pages_per_zspage freeable\n");

  for (unsigned c = 0; c < pool->distinct_classes; c++) {
    struct zs_class_stats stats;
    zs_class_stats (pool, c, &stats);
    if (stats.objs_allocated == 0)
      continue;
    fprintf (fp, " %5u %5u", pool->classes[c].index, stats.size);
    for (unsigned g = 0; g < ZS_FULLNESS_GROUPS; g++)
      fprintf (fp, " %5" PRIu64, stats.zspages[g]);
    fprintf (fp, " %13" PRIu64 " %8" PRIu64 " %10" PRIu64 " %16u %8" PRIu64 "\n",
             stats.objs_allocated, stats.objs_used, stats.pages_used,
             stats.pages_per_zspage, stats.pages_freeable);
  }
}
