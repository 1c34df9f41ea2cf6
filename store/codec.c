/* Block compression with borrowed contexts: see codec.h.  A service at
 * the bottom of the store: it calls only lz4 and zstd.
 */

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include <lz4.h>
/* ZSTD_d_stableOutBuffer (codec_stream_*), dictionaries made by
 * reference (codec_encoder_make, codec_decoder_make) and trained with
 * given parameters (codec_dictionary_train): in zstd's experimental
 * API, exported by the shared library since 1.4.4.
 */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>
#define ZDICT_STATIC_LINKING_ONLY
#include <zdict.h>

#include "codec.h"

/* A compression context.  The codec owns it from its creation to
 * codec_destroy; a call borrows it (busy) for its own length.
 */
struct codec_context {
  struct codec *codec;
  atomic_bool busy;           /* borrowed by a call right now */
  bool temporary;             /* made for one call: every slot was busy */
  LZ4_stream_t *lz4_state;    /* initialized, and coherent between calls
                                 (lz4_compress) */
  ZSTD_CCtx *zstd_compress;
  ZSTD_DCtx *zstd_decompress;
  size_t accounted;           /* bytes counted in codec->memory */
};

/* More calls at once than this borrow temporary contexts. */
#define CODEC_CONTEXTS 128

struct codec {
  enum codec_algorithm algorithm;
  int level;
  /* Contexts fill the slots from the first, as many as calls ever ran
   * at once; a slot, once set, keeps its context until codec_destroy.
   */
  _Atomic (struct codec_context *) contexts[CODEC_CONTEXTS];
  _Atomic size_t memory;      /* bytes of the live contexts */
  atomic_bool prepared;       /* codec_prepare ran: codec_trim keeps them */
};

/* The slot this thread borrowed from last: a hint shared by every codec,
 * a plain thread-local with no destructor (a thread's exit runs no
 * plugin code).
 */
static __thread unsigned preferred_context;

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
    + (context->lz4_state ? sizeof *context->lz4_state : 0)
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
context_free (struct codec_context *context)
{
  atomic_fetch_sub (&context->codec->memory, context->accounted);
  free (context->lz4_state);
  ZSTD_freeCCtx (context->zstd_compress);
  ZSTD_freeDCtx (context->zstd_decompress);
  free (context);
}

/* A new context, already busy.  Its zstd contexts are made on first use
 * (zstd_ready): a server that only writes never holds a decompression
 * context, and codec_trim can drop them.
 */
static struct codec_context *
context_new (struct codec *codec)
{
  struct codec_context *context = calloc (1, sizeof *context);
  if (!context)
    return NULL;
  context->codec = codec;
  atomic_init (&context->busy, true);
  if (codec->algorithm == CODEC_LZ4) {
    if (!(context->lz4_state = malloc (sizeof *context->lz4_state))) {
      context_free (context);
      errno = ENOMEM;
      return NULL;
    }
    LZ4_initStream (context->lz4_state, sizeof *context->lz4_state);
  }
  context_account (context);
  return context;
}

/* Make the zstd context a call needs, if it was never made or trimmed.
 * false with errno ENOMEM.
 */
static bool
zstd_ready (struct codec_context *context, bool compress)
{
  if (compress ? !context->zstd_compress
      && !(context->zstd_compress = ZSTD_createCCtx ())
      : !context->zstd_decompress
      && !(context->zstd_decompress = ZSTD_createDCtx ())) {
    errno = ENOMEM;
    return false;
  }
  return true;
}

/* Borrow a context for one call: the one this thread used last if it is
 * free, else the first free one, else a new one in the first empty slot,
 * else (every slot busy) a temporary one.
 */
static struct codec_context *
context_borrow (struct codec *codec)
{
  struct codec_context *context;
  unsigned n = preferred_context;

  context = atomic_load_explicit (&codec->contexts[n], memory_order_acquire);
  if (context && !atomic_exchange_explicit (&context->busy, true,
                                            memory_order_acquire))
    return context;

  for (n = 0; n < CODEC_CONTEXTS; n++) {
    context = atomic_load_explicit (&codec->contexts[n], memory_order_acquire);
    if (!context) {
      struct codec_context *empty = NULL;
      if (!(context = context_new (codec)))
        return NULL;
      if (atomic_compare_exchange_strong_explicit (&codec->contexts[n], &empty,
                                                   context,
                                                   memory_order_acq_rel,
                                                   memory_order_acquire)) {
        preferred_context = n;
        return context;
      }
      context_free (context);   /* another call filled the slot first */
      context = empty;
    }
    if (!atomic_exchange_explicit (&context->busy, true, memory_order_acquire)) {
      preferred_context = n;
      return context;
    }
  }

  if ((context = context_new (codec)))
    context->temporary = true;
  return context;
}

static void
context_return (struct codec_context *context)
{
  if (context->temporary)
    context_free (context);
  else
    atomic_store_explicit (&context->busy, false, memory_order_release);
}

/* A borrowed context whose zstd compression (or decompression) context
 * is made: NULL with errno (nothing borrowed then).
 */
static struct codec_context *
zstd_context_borrow (struct codec *codec, bool compress)
{
  struct codec_context *context = context_borrow (codec);
  if (context && !zstd_ready (context, compress)) {
    context_return (context);
    return NULL;
  }
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
  return codec;
}

/* No call may be running. */
void
codec_destroy (struct codec *codec)
{
  if (!codec)
    return;
  for (unsigned n = 0; n < CODEC_CONTEXTS; n++) {
    struct codec_context *context = atomic_load (&codec->contexts[n]);
    if (context)
      context_free (context);
  }
  free (codec);
}

/* One independent lz4 block.  LZ4_compress_fast_extState clears the
 * 16 KiB hash table before each block, which cost more than a third of
 * a 4 KiB block's instructions; a stream started with
 * LZ4_resetStream_fast keeps the table and only moves its offsets on, so
 * that the old entries are out of reach (lz4.h: a coherent stream can
 * start a new chain of blocks with almost no work).  With no block
 * before it in the chain, the block depends on nothing else.  A failed
 * call leaves the stream undefined: it is initialized again.
 */
static int
lz4_compress (LZ4_stream_t *stream, const void *src, size_t length,
              void *dst, size_t capacity, int acceleration)
{
  LZ4_resetStream_fast (stream);
  int n = LZ4_compress_fast_continue (stream, src, dst, length, capacity,
                                      acceleration);
  if (n <= 0)
    LZ4_initStream (stream, sizeof *stream);
  return n;
}

/* gcc 12's -fanalyzer (--enable-analyzer) takes every context borrowed
 * below for a leak: it lets the zstd calls, given the caller's buffers,
 * clobber the fresh context's "temporary", and it does not see the slot
 * take the context (an atomic builtin's store).  Its leak check is off
 * for these four functions only; check-valgrind (tests/test-store-*) checks them.
 */
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif

/* One compression with a borrowed context: as codec_compress_bytes. */
static int
compress_with (struct codec_context *context, const void *src, size_t length,
               void *dst, size_t capacity)
{
  struct codec *codec = context->codec;
  if (codec->algorithm == CODEC_LZ4)
    return lz4_compress (context->lz4_state, src, length, dst, capacity,
                         codec->level);
  if (!zstd_ready (context, true))
    return -1;
  size_t n = ZSTD_compressCCtx (context->zstd_compress, dst, capacity,
                                src, length, codec->level);
  context_account (context);
  if (!ZSTD_isError (n))
    return n;
  if (ZSTD_getErrorCode (n) == ZSTD_error_dstSize_tooSmall)
    return 0;
  errno = EIO;
  return -1;
}

int
codec_compress_bytes (struct codec *codec, const void *src, size_t length,
                      void *dst, size_t capacity)
{
  struct codec_context *context = context_borrow (codec);
  if (!context)
    return -1;
  int result = compress_with (context, src, length, dst, capacity);
  context_return (context);
  return result;
}

/* ---- dictionaries and frames (cold packing) ---- */

struct codec_encoder {
  ZSTD_CDict *dictionary;
};

struct codec_decoder {
  ZSTD_DDict *dictionary;
};

size_t
codec_dictionary_train (void *dictionary, size_t capacity, const void *samples,
                        const size_t *sizes, unsigned count)
{
  /* fastCover with fixed parameters: on a memory image as good as its
   * search for them (within 0.2 %) in half the time (0.1 s for 1,024
   * blocks).
   */
  ZDICT_fastCover_params_t parameters = {
    .k = 200, .d = 6, .f = 20, .accel = 1,
  };
  size_t size = ZDICT_trainFromBuffer_fastCover (dictionary, capacity, samples,
                                                 sizes, count, parameters);
  return ZDICT_isError (size) ? 0 : size;
}

struct codec_encoder *
codec_encoder_make (struct codec *codec, const void *dictionary, size_t size)
{
  if (codec->algorithm != CODEC_ZSTD) {
    errno = EINVAL;
    return NULL;
  }
  struct codec_encoder *encoder = malloc (sizeof *encoder);
  if (!encoder)
    return NULL;
  /* By reference: the dictionary outlives its encoder (the store keeps
   * a reference on it for the encoder: pack-dictionary.c).
   */
  encoder->dictionary = ZSTD_createCDict_advanced
    (dictionary, size, ZSTD_dlm_byRef, ZSTD_dct_fullDict,
     ZSTD_getCParams (codec->level, 0, size), ZSTD_defaultCMem);
  if (!encoder->dictionary) {
    free (encoder);
    errno = ENOMEM;
    return NULL;
  }
  return encoder;
}

void
codec_encoder_free (struct codec_encoder *encoder)
{
  if (encoder) {
    ZSTD_freeCDict (encoder->dictionary);
    free (encoder);
  }
}

struct codec_decoder *
codec_decoder_make (const void *dictionary, size_t size)
{
  struct codec_decoder *decoder = malloc (sizeof *decoder);
  if (!decoder)
    return NULL;
  decoder->dictionary = ZSTD_createDDict_advanced
    (dictionary, size, ZSTD_dlm_byRef, ZSTD_dct_fullDict, ZSTD_defaultCMem);
  if (!decoder->dictionary) {
    free (decoder);
    errno = ENOMEM;
    return NULL;
  }
  return decoder;
}

void
codec_decoder_free (struct codec_decoder *decoder)
{
  if (decoder) {
    ZSTD_freeDDict (decoder->dictionary);
    free (decoder);
  }
}

size_t
codec_encoder_bytes (const struct codec_encoder *encoder)
{
  return sizeof *encoder + ZSTD_sizeof_CDict (encoder->dictionary);
}

size_t
codec_decoder_bytes (const struct codec_decoder *decoder)
{
  return sizeof *decoder + ZSTD_sizeof_DDict (decoder->dictionary);
}

int
codec_compress_frames (struct codec *codec, const struct codec_encoder *encoder,
                       const void *src, size_t length, size_t frame,
                       void *dst, size_t capacity, uint32_t *lengths)
{
  if (codec->algorithm != CODEC_ZSTD) {
    errno = EINVAL;
    return -1;
  }
  struct codec_context *context = zstd_context_borrow (codec, true);
  if (!context)
    return -1;
  ZSTD_CCtx *cctx = context->zstd_compress;
  int result = 0;
  size_t out = 0;
  /* No content size, checksum or dictionary ID in the frames' headers:
   * the unit knows them (6 bytes a frame).
   */
  ZSTD_CCtx_reset (cctx, ZSTD_reset_session_and_parameters);
  if (ZSTD_isError (ZSTD_CCtx_setParameter (cctx, ZSTD_c_compressionLevel,
                                            codec->level))
      || ZSTD_isError (ZSTD_CCtx_setParameter (cctx, ZSTD_c_contentSizeFlag, 0))
      || ZSTD_isError (ZSTD_CCtx_setParameter (cctx, ZSTD_c_dictIDFlag, 0))
      || (encoder && ZSTD_isError (ZSTD_CCtx_refCDict (cctx,
                                                        encoder->dictionary))))
    result = -1;
  for (size_t at = 0, i = 0; at < length && result == 0; at += frame, i++) {
    size_t n = length - at < frame ? length - at : frame;
    size_t r = ZSTD_compress2 (cctx, (unsigned char *) dst + out,
                               capacity - out,
                               (const unsigned char *) src + at, n);
    if (ZSTD_isError (r))
      result = ZSTD_getErrorCode (r) == ZSTD_error_dstSize_tooSmall ? 1 : -1;
    else {
      lengths[i] = r;
      out += r;
    }
  }
  /* The context goes back with no dictionary referenced. */
  ZSTD_CCtx_reset (cctx, ZSTD_reset_session_and_parameters);
  context_account (context);
  context_return (context);
  if (result == 1)
    return 0;
  if (result == -1) {
    errno = EIO;
    return -1;
  }
  return out;
}

int
codec_stream_begin (struct codec *codec, struct codec_stream *stream,
                    const struct codec_decoder *decoder,
                    void *dst, size_t capacity)
{
  stream->context = NULL;
  stream->dst = dst;
  stream->capacity = capacity;
  stream->produced = 0;
  stream->finished = false;
  if (codec->algorithm != CODEC_ZSTD) {
    errno = EINVAL;
    return -1;
  }
  struct codec_context *context = zstd_context_borrow (codec, false);
  if (!context)
    return -1;
  /* Decoded straight into dst, which stays the same buffer to the end:
   * no window buffer, no copy.
   */
  ZSTD_DCtx *dctx = context->zstd_decompress;
  ZSTD_DCtx_reset (dctx, ZSTD_reset_session_and_parameters);
  if (ZSTD_isError (ZSTD_DCtx_setParameter (dctx, ZSTD_d_stableOutBuffer, 1))
      || (decoder && ZSTD_isError (ZSTD_DCtx_refDDict (dctx,
                                                        decoder->dictionary)))) {
    ZSTD_DCtx_reset (dctx, ZSTD_reset_session_and_parameters);
    context_return (context);
    errno = EIO;
    return -1;
  }
  stream->context = context;
  return 0;
}

int
codec_stream_feed (struct codec_stream *stream, const void *src, size_t length,
                   size_t wanted)
{
  ZSTD_DCtx *dctx = stream->context->zstd_decompress;
  ZSTD_inBuffer in = { src, length, 0 };
  ZSTD_outBuffer out = { stream->dst, stream->capacity, stream->produced };
  while (!stream->finished && in.pos < in.size && out.pos < wanted) {
    size_t r = ZSTD_decompressStream (dctx, &out, &in);
    if (ZSTD_isError (r)) {
      errno = EIO;
      return -1;
    }
    stream->finished = r == 0;
  }
  stream->produced = out.pos;
  return 0;
}

void
codec_stream_end (struct codec_stream *stream)
{
  if (!stream->context)
    return;
  /* The context goes back with no dictionary referenced. */
  ZSTD_DCtx_reset (stream->context->zstd_decompress,
                   ZSTD_reset_session_and_parameters);
  context_account (stream->context);
  context_return (stream->context);
  stream->context = NULL;
}

int
codec_compress_blocks (struct codec *codec, const unsigned char *const *blocks,
                       unsigned n, unsigned char *const *dst, size_t capacity,
                       int *lengths)
{
  struct codec_context *context = context_borrow (codec);
  if (!context)
    return -1;
  int result = 0;
  for (unsigned i = 0; i < n && result == 0; i++)
    if ((lengths[i] = compress_with (context, blocks[i], CODEC_BLOCK_SIZE,
                                     dst[i], capacity)) == -1)
      result = -1;
  context_return (context);
  return result;
}

int
codec_compress (struct codec *codec, const void *block, void *dst,
                size_t capacity)
{
  return codec_compress_bytes (codec, block, CODEC_BLOCK_SIZE, dst, capacity);
}

int
codec_decompress_bytes (struct codec *codec, const void *src, size_t length,
                        bool padded, void *dst, size_t expected)
{
  bool whole;
  if (codec->algorithm == CODEC_LZ4)
    /* lz4 decompression needs no context.  Decoding a padded block stops
     * at the expected bytes, before the padding (lz4.h allows a source
     * longer than the block when the target is the whole block).
     */
    whole = (padded
             ? LZ4_decompress_safe_partial (src, dst, length, expected, expected)
             : LZ4_decompress_safe (src, dst, length, expected))
      == (int) expected;
  else {
    if (padded) {
      /* A zstd frame says where it ends. */
      length = ZSTD_findFrameCompressedSize (src, length);
      if (ZSTD_isError (length)) {
        errno = EIO;
        return -1;
      }
    }
    struct codec_context *context = zstd_context_borrow (codec, false);
    if (!context)
      return -1;
    whole = ZSTD_decompressDCtx (context->zstd_decompress, dst, expected,
                                 src, length)
      == expected;
    context_account (context);
    context_return (context);
  }
  if (whole)
    return 0;
  errno = EIO;
  return -1;
}

int
codec_decompress (struct codec *codec, const void *src, size_t length,
                  bool padded, void *block)
{
  return codec_decompress_bytes (codec, src, length, padded, block,
                                 CODEC_BLOCK_SIZE);
}

#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic pop
#endif

int
codec_prepare (struct codec *codec, unsigned count)
{
  struct codec_context *held[CODEC_CONTEXTS];
  unsigned n;
  int result = 0;
  unsigned char block[CODEC_BLOCK_SIZE], compressed[CODEC_BLOCK_SIZE * 2];
  /* Something to compress that zstd does not take a shortcut on. */
  for (size_t i = 0; i < sizeof block; i++)
    block[i] = (i * 2654435761u) >> 13;
  if (count > CODEC_CONTEXTS)
    count = CODEC_CONTEXTS;
  /* Borrowed all at once, so that each one fills a slot of its own. */
  for (n = 0; n < count; n++) {
    if (!(held[n] = context_borrow (codec)) || held[n]->temporary) {
      if (held[n])
        context_return (held[n]);
      result = -1;
      break;
    }
  }
  for (unsigned i = 0; i < n && result == 0; i++) {
    struct codec_context *context = held[i];
    if (codec->algorithm == CODEC_LZ4) {
      if (lz4_compress (context->lz4_state, block, sizeof block, compressed,
                        sizeof compressed, codec->level) <= 0)
        result = -1;
      continue;
    }
    if (!zstd_ready (context, true) || !zstd_ready (context, false)) {
      result = -1;
      break;
    }
    size_t length = ZSTD_compressCCtx (context->zstd_compress, compressed,
                                       sizeof compressed, block, sizeof block,
                                       codec->level);
    if (ZSTD_isError (length)
        || ZSTD_decompressDCtx (context->zstd_decompress, block, sizeof block,
                                compressed, length) != sizeof block) {
      errno = EIO;
      result = -1;
    }
    context_account (context);
  }
  for (unsigned i = 0; i < n; i++)
    context_return (held[i]);
  if (result == 0)
    atomic_store (&codec->prepared, true);
  return result;
}

size_t
codec_trim (struct codec *codec)
{
  size_t before = atomic_load (&codec->memory);
  if (codec->algorithm != CODEC_ZSTD || atomic_load (&codec->prepared))
    return 0;                   /* lz4 state is fixed and small */
  for (unsigned n = 0; n < CODEC_CONTEXTS; n++) {
    struct codec_context *context = atomic_load_explicit (&codec->contexts[n],
                                                          memory_order_acquire);
    if (!context)
      break;                    /* slots fill from the first */
    /* Borrowing it, as a call would, keeps every call off it meanwhile. */
    if (atomic_exchange_explicit (&context->busy, true, memory_order_acquire))
      continue;
    ZSTD_freeCCtx (context->zstd_compress);
    ZSTD_freeDCtx (context->zstd_decompress);
    context->zstd_compress = NULL;
    context->zstd_decompress = NULL;
    context_account (context);
    context_return (context);
  }
  size_t after = atomic_load (&codec->memory);
  return before > after ? before - after : 0;
}

size_t
codec_memory (struct codec *codec)
{
  return atomic_load (&codec->memory);
}

unsigned
codec_streams (struct codec *codec)
{
  unsigned n = 0;
  while (n < CODEC_CONTEXTS && atomic_load (&codec->contexts[n]))
    n++;                        /* the slots fill from the first */
  return n;
}
