/* The monotonic clock as the code under test sees it, moved: tests link
 * with -Wl,--wrap=clock_gettime and include this once.  The clocks run
 * clock_ahead_ns later, and stand at clock_frozen_ns (when not 0) instead
 * of running; the test's own timing uses real_now_ns.
 */
#ifndef ZRAM_TESTS_MOVED_CLOCK_H
#define ZRAM_TESTS_MOVED_CLOCK_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

static _Atomic int64_t clock_ahead_ns;
static _Atomic int64_t clock_frozen_ns;

int __real_clock_gettime (clockid_t clock, struct timespec *ts);
int __wrap_clock_gettime (clockid_t clock, struct timespec *ts);
int
__wrap_clock_gettime (clockid_t clock, struct timespec *ts)
{
  int r = __real_clock_gettime (clock, ts);
  if (r == 0 && (clock == CLOCK_MONOTONIC || clock == CLOCK_MONOTONIC_COARSE
                 || clock == CLOCK_MONOTONIC_RAW || clock == CLOCK_BOOTTIME)) {
    int64_t frozen = atomic_load (&clock_frozen_ns);
    int64_t ns = frozen ? frozen
      : (int64_t) ts->tv_sec * 1000000000 + ts->tv_nsec;
    ns += atomic_load (&clock_ahead_ns);
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
  }
  return r;
}

static inline int64_t
real_now_ns (void)
{
  struct timespec now;
  __real_clock_gettime (CLOCK_MONOTONIC, &now);
  return (int64_t) now.tv_sec * 1000000000 + now.tv_nsec;
}

#endif /* ZRAM_TESTS_MOVED_CLOCK_H */
