/* Block compression with per-thread contexts: see codec.h. */

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include <lz4.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "codec.h"

struct codec_context {
  struct codec *codec;
  void *lz4_state;            /* LZ4_sizeofState() bytes */
  ZSTD_CCtx *zstd_compress;
  ZSTD_DCtx *zstd_decompress;
  size_t accounted;           /* bytes counted in codec->memory */
};

struct codec {
  enum codec_algorithm algorithm;
  int level;
  pthread_key_t context_key;  /* this thread's struct codec_context */
  _Atomic size_t memory;      /* bytes of the live contexts */
};

const char *
codec_name (enum codec_algorithm algorithm)
{
  return algorithm == CODEC_LZ4 ? "lz4" : "zstd";
}

int
codec_default_level (enum codec_algorithm algorithm)
{
  /* lz4: acceleration 1, its best ratio; zstd: level 1, which keeps
   * most of level 3's ratio on 4 KiB blocks at nearly twice the speed.
   */
  (void) algorithm;
  return 1;
}

int
codec_level_is_valid (enum codec_algorithm algorithm, int level,
                      int *min, int *max)
{
  if (algorithm == CODEC_LZ4) {
    *min = 1;
    *max = 65537;             /* LZ4_ACCELERATION_MAX */
  }
  else {
    *min = ZSTD_minCLevel ();
    *max = ZSTD_maxCLevel ();
  }
  return level >= *min && level <= *max
    && !(algorithm == CODEC_ZSTD && level == 0);
}

static size_t
context_memory (const struct codec_context *context)
{
  return sizeof *context
    + (context->lz4_state ? (size_t) LZ4_sizeofState () : 0)
    + ZSTD_sizeof_CCtx (context->zstd_compress)
    + ZSTD_sizeof_DCtx (context->zstd_decompress);
}

/* zstd sizes its workspace on first use: recount after each call. */
static void
context_account (struct codec_context *context)
{
  size_t now = context_memory (context);
  if (now != context->accounted) {
    atomic_fetch_add (&context->codec->memory, now - context->accounted);
    context->accounted = now;
  }
}

static void
context_free (void *arg)
{
  struct codec_context *context = arg;
  atomic_fetch_sub (&context->codec->memory, context->accounted);
  free (context->lz4_state);
  ZSTD_freeCCtx (context->zstd_compress);
  ZSTD_freeDCtx (context->zstd_decompress);
  free (context);
}

static struct codec_context *
context_get (struct codec *codec)
{
  struct codec_context *context = pthread_getspecific (codec->context_key);
  if (context)
    return context;

  context = calloc (1, sizeof *context);
  if (!context)
    return NULL;
  context->codec = codec;
  if (codec->algorithm == CODEC_LZ4)
    context->lz4_state = malloc (LZ4_sizeofState ());
  else {
    context->zstd_compress = ZSTD_createCCtx ();
    context->zstd_decompress = ZSTD_createDCtx ();
  }
  if ((codec->algorithm == CODEC_LZ4 && !context->lz4_state)
      || (codec->algorithm == CODEC_ZSTD
          && (!context->zstd_compress || !context->zstd_decompress))
      || pthread_setspecific (codec->context_key, context) != 0) {
    free (context->lz4_state);
    ZSTD_freeCCtx (context->zstd_compress);
    ZSTD_freeDCtx (context->zstd_decompress);
    free (context);
    errno = ENOMEM;
    return NULL;
  }
  context_account (context);
  return context;
}

struct codec *
codec_create (enum codec_algorithm algorithm, int level)
{
  int min, max;
  if (!codec_level_is_valid (algorithm, level, &min, &max)) {
    errno = EINVAL;
    return NULL;
  }
  struct codec *codec = calloc (1, sizeof *codec);
  if (!codec)
    return NULL;
  codec->algorithm = algorithm;
  codec->level = level;
  if (pthread_key_create (&codec->context_key, context_free) != 0) {
    free (codec);
    errno = ENOMEM;
    return NULL;
  }
  return codec;
}

/* Threads' contexts are freed as the threads exit; the calling thread's
 * here.  Contexts of threads still alive are leaked by design: nbdkit
 * joins its worker threads before unloading the plugin.
 */
void
codec_destroy (struct codec *codec)
{
  struct codec_context *context = pthread_getspecific (codec->context_key);
  if (context)
    context_free (context);
  pthread_key_delete (codec->context_key);
  free (codec);
}

int
codec_compress (struct codec *codec, const void *block, void *dst,
                size_t capacity)
{
  struct codec_context *context = context_get (codec);
  if (!context)
    return -1;

  if (codec->algorithm == CODEC_LZ4)
    return LZ4_compress_fast_extState (context->lz4_state, block, dst,
                                       CODEC_BLOCK_SIZE, capacity,
                                       codec->level);

  size_t n = ZSTD_compressCCtx (context->zstd_compress, dst, capacity,
                                block, CODEC_BLOCK_SIZE, codec->level);
  context_account (context);
  if (ZSTD_isError (n)) {
    if (ZSTD_getErrorCode (n) == ZSTD_error_dstSize_tooSmall)
      return 0;
    errno = EIO;
    return -1;
  }
  return n;
}

int
codec_decompress (struct codec *codec, const void *src, size_t length,
                  void *block)
{
  struct codec_context *context = context_get (codec);
  if (!context)
    return -1;

  if (codec->algorithm == CODEC_LZ4) {
    if (LZ4_decompress_safe (src, block, length, CODEC_BLOCK_SIZE)
        == CODEC_BLOCK_SIZE)
      return 0;
  }
  else {
    size_t n = ZSTD_decompressDCtx (context->zstd_decompress, block,
                                    CODEC_BLOCK_SIZE, src, length);
    context_account (context);
    if (n == CODEC_BLOCK_SIZE)
      return 0;
  }
  errno = EIO;
  return -1;
}

size_t
codec_memory (struct codec *codec)
{
  return atomic_load (&codec->memory);
}
