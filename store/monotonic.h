/* The monotonic clock, for deadlines and time spent: one definition for
 * the plugin's files.
 */
#ifndef ZRAM_MONOTONIC_H
#define ZRAM_MONOTONIC_H

#include <errno.h>
#include <pthread.h>
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

/* Lock mutex, waiting until deadline_ms (monotonic) at most; 0: no
 * deadline.  0, or ETIMEDOUT.  (pthread_mutex_timedlock takes the real
 * time clock: the wait left is carried over to it.  Not
 * pthread_mutex_clocklock, which ThreadSanitizer does not know.)
 */
static inline int
mutex_lock_until (pthread_mutex_t *mutex, uint64_t deadline_ms)
{
  if (deadline_ms == 0)
    return pthread_mutex_lock (mutex);
  uint64_t now = monotonic_ms ();
  uint64_t left_ms = deadline_ms > now ? deadline_ms - now : 0;
  struct timespec until;
  clock_gettime (CLOCK_REALTIME, &until);
  uint64_t ns = until.tv_nsec + left_ms % 1000 * 1000000;
  until.tv_sec += left_ms / 1000 + ns / 1000000000;
  until.tv_nsec = ns % 1000000000;
  return pthread_mutex_timedlock (mutex, &until);
}

#endif /* ZRAM_MONOTONIC_H */
