/* Fault injection for tests: make the Nth call of a failure point fail.
 *
 * Nothing of this is in the plugin or the library users get.  A test
 * program (or the test build of the plugin, tests/nbdkit-zram-faults)
 * links tests/fault-inject.c and the code under test with
 * -Wl,--wrap=SYMBOL for every symbol below (FAULT_WRAP_FLAGS in
 * Makefile.am), so each call the code makes to, say, malloc reaches
 * __wrap_malloc here, which counts it and either fails it the way the
 * real function fails (NULL with ENOMEM, -1 with errno, MAP_FAILED, an
 * lz4 or zstd error) or calls the real one.  Calls from inside the C
 * library or the codec libraries are not seen: the points are the calls
 * our code makes.
 *
 * One point is not a failure but damage: FAULT_CORRUPT flips bits of the
 * object the Nth decompression reads, in place (in the pool's page when
 * the object lies in one page), as a stray write or a bad DIMM would.
 *
 * Counting and arming are atomic, so a point may be hit from any thread;
 * a sweep that wants the same call numbers on every run drives the code
 * from one thread.  The environment variable ZRAM_FAULTS="point=N,..."
 * arms points when the program (or the plugin) is loaded.
 */

#ifndef ZRAM_FAULT_INJECT_H
#define ZRAM_FAULT_INJECT_H

#include <stdbool.h>
#include <stdint.h>

enum fault_point {
  /* Memory: every allocation in alloc/ and plugin/. */
  FAULT_MALLOC, FAULT_CALLOC, FAULT_REALLOC, FAULT_ALIGNED_ALLOC,
  FAULT_POSIX_MEMALIGN, FAULT_STRDUP, FAULT_ZSTD_CREATE_CCTX,
  FAULT_ZSTD_CREATE_DCTX,
  /* The page source. */
  FAULT_MMAP, FAULT_MADVISE,
  /* The codec. */
  FAULT_LZ4_COMPRESS, FAULT_ZSTD_COMPRESS, FAULT_LZ4_DECOMPRESS,
  FAULT_LZ4_DECOMPRESS_PARTIAL, FAULT_ZSTD_DECOMPRESS,
  FAULT_ZSTD_COMPRESS_FRAME, FAULT_ZSTD_DECOMPRESS_STREAM,
  /* Threads. */
  FAULT_PTHREAD_CREATE,
  /* Files: the stats file, the backing file. */
  FAULT_FOPEN, FAULT_MKOSTEMP, FAULT_RENAME, FAULT_PREAD, FAULT_PWRITE, FAULT_FALLOCATE,
  /* The control socket. */
  FAULT_SOCKET, FAULT_BIND, FAULT_LISTEN, FAULT_ACCEPT4, FAULT_RECV,
  FAULT_SEND, FAULT_OPEN_MEMSTREAM,
  /* Damage, not failure: see above. */
  FAULT_CORRUPT,
  FAULT_POINTS
};

/* "malloc", "corrupt", ...: the names ZRAM_FAULTS and the tests use. */
extern const char *fault_point_name (enum fault_point point);
/* FAULT_POINTS if no point has that name. */
extern enum fault_point fault_point_by_name (const char *name);

/* Zero every count and disarm every point. */
extern void fault_reset (void);
/* The nth call of point (counting from the last reset, 1 = the next
 * call if none was made) fails; 0 disarms it.  One call fails, not every
 * call after it.
 */
extern void fault_arm (enum fault_point point, uint64_t nth);
/* Calls of point since the last reset. */
extern uint64_t fault_calls (enum fault_point point);
/* Calls failed (or objects damaged) by injection since the last reset. */
extern uint64_t fault_injected (void);

#endif /* ZRAM_FAULT_INJECT_H */
