/* The monotonic clock, for deadlines and time spent: one definition for
 * the plugin's files.
 */
#ifndef ZRAM_MONOTONIC_H
#define ZRAM_MONOTONIC_H

#include <stdint.h>
#include <time.h>

static inline uint64_t
monotonic_ns (void)
{
  struct timespec now;
  clock_gettime (CLOCK_MONOTONIC, &now);
  return (uint64_t) now.tv_sec * 1000000000 + now.tv_nsec;
}

static inline uint64_t
monotonic_ms (void)
{
  return monotonic_ns () / 1000000;
}

#endif /* ZRAM_MONOTONIC_H */
