/* The tests' pseudo-random numbers: xorshift64, one state per thread, so
 * runs repeat from a seed and threads need no shared generator.
 */

#ifndef ZRAM_TESTS_XORSHIFT_H
#define ZRAM_TESTS_XORSHIFT_H

#include <stdint.h>

static inline uint64_t
xorshift64 (uint64_t *state)
{
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *state = x;
}

#endif /* ZRAM_TESTS_XORSHIFT_H */
