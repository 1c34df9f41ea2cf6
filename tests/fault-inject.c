/* Fault injection for tests: the wrapped calls (fault-inject.h). */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <lz4.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "fault-inject.h"

static const char *const names[FAULT_POINTS] = {
  [FAULT_MALLOC] = "malloc", [FAULT_CALLOC] = "calloc",
  [FAULT_REALLOC] = "realloc", [FAULT_ALIGNED_ALLOC] = "aligned_alloc",
  [FAULT_POSIX_MEMALIGN] = "posix_memalign", [FAULT_STRDUP] = "strdup",
  [FAULT_ZSTD_CREATE_CCTX] = "ZSTD_createCCtx",
  [FAULT_ZSTD_CREATE_DCTX] = "ZSTD_createDCtx",
  [FAULT_MMAP] = "mmap", [FAULT_MADVISE] = "madvise",
  [FAULT_LZ4_COMPRESS] = "LZ4_compress_fast_extState",
  [FAULT_ZSTD_COMPRESS] = "ZSTD_compressCCtx",
  [FAULT_LZ4_DECOMPRESS] = "LZ4_decompress_safe",
  [FAULT_LZ4_DECOMPRESS_PARTIAL] = "LZ4_decompress_safe_partial",
  [FAULT_ZSTD_DECOMPRESS] = "ZSTD_decompressDCtx",
  [FAULT_ZSTD_COMPRESS_FRAME] = "ZSTD_compress2",
  [FAULT_ZSTD_DECOMPRESS_STREAM] = "ZSTD_decompressStream",
  [FAULT_PTHREAD_CREATE] = "pthread_create",
  [FAULT_FOPEN] = "fopen", [FAULT_MKOSTEMP] = "mkostemp",
  [FAULT_RENAME] = "rename",
  [FAULT_PREAD] = "pread", [FAULT_PWRITE] = "pwrite",
  [FAULT_FALLOCATE] = "fallocate",
  [FAULT_SOCKET] = "socket", [FAULT_BIND] = "bind", [FAULT_LISTEN] = "listen",
  [FAULT_ACCEPT4] = "accept4", [FAULT_RECV] = "recv", [FAULT_SEND] = "send",
  [FAULT_OPEN_MEMSTREAM] = "open_memstream",
  [FAULT_CORRUPT] = "corrupt",
};

static _Atomic uint64_t calls[FAULT_POINTS];
static _Atomic uint64_t armed[FAULT_POINTS];
static _Atomic uint64_t injected;

const char *
fault_point_name (enum fault_point point)
{
  return point < FAULT_POINTS ? names[point] : "?";
}

enum fault_point
fault_point_by_name (const char *name)
{
  for (int point = 0; point < FAULT_POINTS; point++)
    if (strcmp (names[point], name) == 0)
      return point;
  return FAULT_POINTS;
}

void
fault_reset (void)
{
  for (int point = 0; point < FAULT_POINTS; point++) {
    atomic_store (&armed[point], 0);
    atomic_store (&calls[point], 0);
  }
  atomic_store (&injected, 0);
}

void
fault_arm (enum fault_point point, uint64_t nth)
{
  atomic_store (&armed[point], nth);
}

uint64_t
fault_calls (enum fault_point point)
{
  return atomic_load (&calls[point]);
}

uint64_t
fault_injected (void)
{
  return atomic_load (&injected);
}

/* Count a call of point; true if it is the one to fail. */
static bool
fault_hit (enum fault_point point)
{
  uint64_t call = atomic_fetch_add (&calls[point], 1) + 1;
  if (call != atomic_load (&armed[point]))
    return false;
  atomic_fetch_add (&injected, 1);
  return true;
}

/* ZRAM_FAULTS="point=N,...": arm points at load (the plugin's test build
 * is armed this way by tests/test-plugin-faults.sh).
 */
static uint64_t
total_calls (void)
{
  uint64_t total = 0;
  for (int point = 0; point < FAULT_POINTS; point++)
    total += atomic_load (&calls[point]);
  return total;
}

static bool forked;
static uint64_t calls_at_fork;

static void
note_fork (void)
{
  forked = true;
  calls_at_fork = total_calls ();
}

__attribute__ ((constructor))
static void
fault_arm_from_environment (void)
{
  pthread_atfork (NULL, note_fork, note_fork);
  const char *spec = getenv ("ZRAM_FAULTS");
  if (!spec)
    return;
  char copy[1024];
  snprintf (copy, sizeof copy, "%s", spec);
  char *save = NULL;
  for (char *item = strtok_r (copy, ",", &save); item;
       item = strtok_r (NULL, ",", &save)) {
    char *equals = strchr (item, '=');
    enum fault_point point = FAULT_POINTS;
    if (equals) {
      *equals = '\0';
      point = fault_point_by_name (item);
    }
    if (point == FAULT_POINTS) {
      fprintf (stderr, "ZRAM_FAULTS: '%s' is not point=N\n", item);
      abort ();
    }
    fault_arm (point, strtoull (equals + 1, NULL, 0));
  }
}

FILE *__real_fopen (const char *path, const char *mode);

/* ZRAM_FAULTS_REPORT=FILE: at exit (or unload), write "point calls" for
 * each point called, and "injected N", so a test knows what to sweep.
 * After a fork, only a process that made calls since writes it: the
 * server, not the other side of nbdkit's fork (--run, daemonizing).
 */
__attribute__ ((destructor))
static void
fault_write_report (void)
{
  const char *path = getenv ("ZRAM_FAULTS_REPORT");
  if (!path || (forked && total_calls () == calls_at_fork))
    return;
  FILE *fp = __real_fopen (path, "w");
  if (!fp)
    return;
  for (int point = 0; point < FAULT_POINTS; point++)
    if (atomic_load (&calls[point]))
      fprintf (fp, "%s %" PRIu64 "\n", names[point], atomic_load (&calls[point]));
  fprintf (fp, "injected %" PRIu64 "\n", atomic_load (&injected));
  fclose (fp);
}

/* ---- the wrapped calls ------------------------------------------------- */

#define FAIL_WITH(point, error, value)          \
  do {                                          \
    if (fault_hit (point)) {                    \
      errno = (error);                          \
      return (value);                           \
    }                                           \
  } while (0)

void *__real_malloc (size_t size);
void *__wrap_malloc (size_t size);
void *
__wrap_malloc (size_t size)
{
  FAIL_WITH (FAULT_MALLOC, ENOMEM, NULL);
  return __real_malloc (size);
}

void *__real_calloc (size_t count, size_t size);
void *__wrap_calloc (size_t count, size_t size);
void *
__wrap_calloc (size_t count, size_t size)
{
  FAIL_WITH (FAULT_CALLOC, ENOMEM, NULL);
  return __real_calloc (count, size);
}

void *__real_realloc (void *old, size_t size);
void *__wrap_realloc (void *old, size_t size);
void *
__wrap_realloc (void *old, size_t size)
{
  FAIL_WITH (FAULT_REALLOC, ENOMEM, NULL);
  return __real_realloc (old, size);
}

void *__real_aligned_alloc (size_t alignment, size_t size);
void *__wrap_aligned_alloc (size_t alignment, size_t size);
void *
__wrap_aligned_alloc (size_t alignment, size_t size)
{
  FAIL_WITH (FAULT_ALIGNED_ALLOC, ENOMEM, NULL);
  return __real_aligned_alloc (alignment, size);
}

int __real_posix_memalign (void **result, size_t alignment, size_t size);
int __wrap_posix_memalign (void **result, size_t alignment, size_t size);
int
__wrap_posix_memalign (void **result, size_t alignment, size_t size)
{
  FAIL_WITH (FAULT_POSIX_MEMALIGN, ENOMEM, ENOMEM);
  return __real_posix_memalign (result, alignment, size);
}

char *__real_strdup (const char *string);
char *__wrap_strdup (const char *string);
char *
__wrap_strdup (const char *string)
{
  FAIL_WITH (FAULT_STRDUP, ENOMEM, NULL);
  return __real_strdup (string);
}

ZSTD_CCtx *__real_ZSTD_createCCtx (void);
ZSTD_CCtx *__wrap_ZSTD_createCCtx (void);
ZSTD_CCtx *
__wrap_ZSTD_createCCtx (void)
{
  FAIL_WITH (FAULT_ZSTD_CREATE_CCTX, ENOMEM, NULL);
  return __real_ZSTD_createCCtx ();
}

ZSTD_DCtx *__real_ZSTD_createDCtx (void);
ZSTD_DCtx *__wrap_ZSTD_createDCtx (void);
ZSTD_DCtx *
__wrap_ZSTD_createDCtx (void)
{
  FAIL_WITH (FAULT_ZSTD_CREATE_DCTX, ENOMEM, NULL);
  return __real_ZSTD_createDCtx ();
}

void *__real_mmap (void *address, size_t length, int protection, int flags,
                   int fd, off_t offset);
void *__wrap_mmap (void *address, size_t length, int protection, int flags,
                   int fd, off_t offset);
void *
__wrap_mmap (void *address, size_t length, int protection, int flags, int fd,
             off_t offset)
{
  FAIL_WITH (FAULT_MMAP, ENOMEM, MAP_FAILED);
  return __real_mmap (address, length, protection, flags, fd, offset);
}

int __real_madvise (void *address, size_t length, int advice);
int __wrap_madvise (void *address, size_t length, int advice);
int
__wrap_madvise (void *address, size_t length, int advice)
{
  FAIL_WITH (FAULT_MADVISE, ENOMEM, -1);
  return __real_madvise (address, length, advice);
}

int __real_LZ4_compress_fast_extState (void *state, const char *src,
                                       char *dst, int length, int capacity,
                                       int acceleration);
int __wrap_LZ4_compress_fast_extState (void *state, const char *src,
                                       char *dst, int length, int capacity,
                                       int acceleration);
int
__wrap_LZ4_compress_fast_extState (void *state, const char *src, char *dst,
                                   int length, int capacity, int acceleration)
{
  /* lz4 reports every failure as 0 bytes written. */
  FAIL_WITH (FAULT_LZ4_COMPRESS, 0, 0);
  return __real_LZ4_compress_fast_extState (state, src, dst, length, capacity,
                                            acceleration);
}

size_t __real_ZSTD_compressCCtx (ZSTD_CCtx *context, void *dst,
                                 size_t capacity, const void *src,
                                 size_t length, int level);
size_t __wrap_ZSTD_compressCCtx (ZSTD_CCtx *context, void *dst,
                                 size_t capacity, const void *src,
                                 size_t length, int level);
size_t
__wrap_ZSTD_compressCCtx (ZSTD_CCtx *context, void *dst, size_t capacity,
                          const void *src, size_t length, int level)
{
  FAIL_WITH (FAULT_ZSTD_COMPRESS, 0, (size_t) -ZSTD_error_memory_allocation);
  return __real_ZSTD_compressCCtx (context, dst, capacity, src, length, level);
}

/* FAULT_CORRUPT: flip the high bits of the object's first byte, where
 * both formats keep what decoding depends on (lz4's first token, zstd's
 * frame magic number).
 */
static void
maybe_corrupt (const void *src, size_t length)
{
  if (length > 0 && fault_hit (FAULT_CORRUPT))
    *(volatile unsigned char *) src ^= 0xF0;
}

int __real_LZ4_decompress_safe (const char *src, char *dst, int length,
                                int capacity);
int __wrap_LZ4_decompress_safe (const char *src, char *dst, int length,
                                int capacity);
int
__wrap_LZ4_decompress_safe (const char *src, char *dst, int length,
                            int capacity)
{
  FAIL_WITH (FAULT_LZ4_DECOMPRESS, 0, -1);
  maybe_corrupt (src, length);
  return __real_LZ4_decompress_safe (src, dst, length, capacity);
}

int __real_LZ4_decompress_safe_partial (const char *src, char *dst,
                                        int length, int target,
                                        int capacity);
int __wrap_LZ4_decompress_safe_partial (const char *src, char *dst,
                                        int length, int target,
                                        int capacity);
int
__wrap_LZ4_decompress_safe_partial (const char *src, char *dst, int length,
                                    int target, int capacity)
{
  FAIL_WITH (FAULT_LZ4_DECOMPRESS_PARTIAL, 0, -1);
  maybe_corrupt (src, length);
  return __real_LZ4_decompress_safe_partial (src, dst, length, target,
                                             capacity);
}

size_t __real_ZSTD_decompressDCtx (ZSTD_DCtx *context, void *dst,
                                   size_t capacity, const void *src,
                                   size_t length);
size_t __wrap_ZSTD_decompressDCtx (ZSTD_DCtx *context, void *dst,
                                   size_t capacity, const void *src,
                                   size_t length);
size_t
__wrap_ZSTD_decompressDCtx (ZSTD_DCtx *context, void *dst, size_t capacity,
                            const void *src, size_t length)
{
  FAIL_WITH (FAULT_ZSTD_DECOMPRESS, 0, (size_t) -ZSTD_error_corruption_detected);
  maybe_corrupt (src, length);
  return __real_ZSTD_decompressDCtx (context, dst, capacity, src, length);
}

/* Packed units: compressed a frame at a time, each frame decoded from
 * the parts that hold it.  A stream is damaged only where a frame starts
 * (its magic number), so the nth damaged decoding is the nth frame
 * decoded.
 */
size_t __real_ZSTD_compress2 (ZSTD_CCtx *context, void *dst, size_t capacity,
                              const void *src, size_t length);
size_t __wrap_ZSTD_compress2 (ZSTD_CCtx *context, void *dst, size_t capacity,
                              const void *src, size_t length);
size_t
__wrap_ZSTD_compress2 (ZSTD_CCtx *context, void *dst, size_t capacity,
                       const void *src, size_t length)
{
  FAIL_WITH (FAULT_ZSTD_COMPRESS_FRAME, 0,
             (size_t) -ZSTD_error_memory_allocation);
  return __real_ZSTD_compress2 (context, dst, capacity, src, length);
}

size_t __real_ZSTD_decompressStream (ZSTD_DCtx *context, ZSTD_outBuffer *output,
                                     ZSTD_inBuffer *input);
size_t __wrap_ZSTD_decompressStream (ZSTD_DCtx *context, ZSTD_outBuffer *output,
                                     ZSTD_inBuffer *input);
size_t
__wrap_ZSTD_decompressStream (ZSTD_DCtx *context, ZSTD_outBuffer *output,
                              ZSTD_inBuffer *input)
{
  FAIL_WITH (FAULT_ZSTD_DECOMPRESS_STREAM, 0,
             (size_t) -ZSTD_error_corruption_detected);
  const unsigned char *at = (const unsigned char *) input->src + input->pos;
  size_t left = input->size - input->pos;
  uint32_t magic;
  if (left >= sizeof magic) {
    memcpy (&magic, at, sizeof magic);
    if (magic == ZSTD_MAGICNUMBER)
      maybe_corrupt (at, left);
  }
  return __real_ZSTD_decompressStream (context, output, input);
}

int __real_pthread_create (pthread_t *thread, const pthread_attr_t *attributes,
                           void *(*start) (void *), void *argument);
int __wrap_pthread_create (pthread_t *thread, const pthread_attr_t *attributes,
                           void *(*start) (void *), void *argument);
int
__wrap_pthread_create (pthread_t *thread, const pthread_attr_t *attributes,
                       void *(*start) (void *), void *argument)
{
  FAIL_WITH (FAULT_PTHREAD_CREATE, EAGAIN, EAGAIN);
  return __real_pthread_create (thread, attributes, start, argument);
}

FILE *__real_fopen (const char *path, const char *mode);
FILE *__wrap_fopen (const char *path, const char *mode);
FILE *
__wrap_fopen (const char *path, const char *mode)
{
  FAIL_WITH (FAULT_FOPEN, ENOSPC, NULL);
  return __real_fopen (path, mode);
}

int __real_mkostemp (char *template, int flags);
int __wrap_mkostemp (char *template, int flags);
int
__wrap_mkostemp (char *template, int flags)
{
  FAIL_WITH (FAULT_MKOSTEMP, ENOSPC, -1);
  return __real_mkostemp (template, flags);
}

int __real_rename (const char *from, const char *to);
int __wrap_rename (const char *from, const char *to);
int
__wrap_rename (const char *from, const char *to)
{
  FAIL_WITH (FAULT_RENAME, EIO, -1);
  return __real_rename (from, to);
}

ssize_t __real_pread (int fd, void *buf, size_t count, off_t offset);
ssize_t __wrap_pread (int fd, void *buf, size_t count, off_t offset);
ssize_t
__wrap_pread (int fd, void *buf, size_t count, off_t offset)
{
  FAIL_WITH (FAULT_PREAD, EIO, -1);
  return __real_pread (fd, buf, count, offset);
}

ssize_t __real_pwrite (int fd, const void *buf, size_t count, off_t offset);
ssize_t __wrap_pwrite (int fd, const void *buf, size_t count, off_t offset);
ssize_t
__wrap_pwrite (int fd, const void *buf, size_t count, off_t offset)
{
  FAIL_WITH (FAULT_PWRITE, EIO, -1);
  return __real_pwrite (fd, buf, count, offset);
}

int __real_fallocate (int fd, int mode, off_t offset, off_t length);
int __wrap_fallocate (int fd, int mode, off_t offset, off_t length);
int
__wrap_fallocate (int fd, int mode, off_t offset, off_t length)
{
  FAIL_WITH (FAULT_FALLOCATE, EIO, -1);
  return __real_fallocate (fd, mode, offset, length);
}

int __real_socket (int domain, int type, int protocol);
int __wrap_socket (int domain, int type, int protocol);
int
__wrap_socket (int domain, int type, int protocol)
{
  FAIL_WITH (FAULT_SOCKET, EMFILE, -1);
  return __real_socket (domain, type, protocol);
}

int __real_bind (int fd, const struct sockaddr *address, socklen_t length);
int __wrap_bind (int fd, const struct sockaddr *address, socklen_t length);
int
__wrap_bind (int fd, const struct sockaddr *address, socklen_t length)
{
  FAIL_WITH (FAULT_BIND, EADDRINUSE, -1);
  return __real_bind (fd, address, length);
}

int __real_listen (int fd, int backlog);
int __wrap_listen (int fd, int backlog);
int
__wrap_listen (int fd, int backlog)
{
  FAIL_WITH (FAULT_LISTEN, EADDRINUSE, -1);
  return __real_listen (fd, backlog);
}

int __real_accept4 (int fd, struct sockaddr *address, socklen_t *length,
                    int flags);
int __wrap_accept4 (int fd, struct sockaddr *address, socklen_t *length,
                    int flags);
int
__wrap_accept4 (int fd, struct sockaddr *address, socklen_t *length, int flags)
{
  FAIL_WITH (FAULT_ACCEPT4, EMFILE, -1);
  return __real_accept4 (fd, address, length, flags);
}

ssize_t __real_recv (int fd, void *buf, size_t count, int flags);
ssize_t __wrap_recv (int fd, void *buf, size_t count, int flags);
ssize_t
__wrap_recv (int fd, void *buf, size_t count, int flags)
{
  FAIL_WITH (FAULT_RECV, ECONNRESET, -1);
  return __real_recv (fd, buf, count, flags);
}

ssize_t __real_send (int fd, const void *buf, size_t count, int flags);
ssize_t __wrap_send (int fd, const void *buf, size_t count, int flags);
ssize_t
__wrap_send (int fd, const void *buf, size_t count, int flags)
{
  FAIL_WITH (FAULT_SEND, EPIPE, -1);
  return __real_send (fd, buf, count, flags);
}

FILE *__real_open_memstream (char **buffer, size_t *length);
FILE *__wrap_open_memstream (char **buffer, size_t *length);
FILE *
__wrap_open_memstream (char **buffer, size_t *length)
{
  FAIL_WITH (FAULT_OPEN_MEMSTREAM, ENOMEM, NULL);
  return __real_open_memstream (buffer, length);
}
