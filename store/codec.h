/* Compression of 4 KiB blocks with lz4 or zstd.
 *
 * Each call borrows a context of its own from the codec, which owns them
 * all from their creation to codec_destroy: compressions never wait on
 * each other or on a lock (one shared context would serialise every
 * writer), contexts number the
 * calls that ever ran at once (not the threads that ever existed), and no
 * thread-exit hook exists, so a thread that exits after the plugin is
 * unloaded runs none of its code.  zstd contexts
 * are sized for 4 KiB inputs by compressing with a known source size, made
 * on a context's first call that needs them, and freed again by
 * codec_trim while no call uses them.  codec_memory() reports what all
 * live contexts hold, for the memory figures.
 */

#ifndef ZRAM_CODEC_H
#define ZRAM_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CODEC_BLOCK_SIZE 4096

enum codec_algorithm { CODEC_LZ4, CODEC_ZSTD };

struct codec;

/* Level: lz4 acceleration 1..65537 (1 = best compression), zstd level
 * ZSTD_minCLevel()..ZSTD_maxCLevel() (not 0).  Returns NULL with errno.
 */
extern struct codec *codec_create (enum codec_algorithm algorithm, int level);
extern void codec_destroy (struct codec *codec);

extern const char *codec_name (enum codec_algorithm algorithm);
extern int codec_default_level (enum codec_algorithm algorithm);
extern int codec_level_is_valid (enum codec_algorithm algorithm, int level,
                                 int *min, int *max);

/* Compress one block into dst (capacity bytes).  Returns the compressed
 * size, or 0 if it would not fit in capacity (store it raw then), or -1
 * with errno on failure.
 */
extern int codec_compress (struct codec *codec, const void *block,
                           void *dst, size_t capacity);

/* Compress n blocks, blocks[i] into dst[i] (capacity bytes each), with
 * one borrowed context: lengths[i] is what codec_compress would return.
 * 0, or -1 with errno (lengths then partly set).  The context is a
 * compression context only for the batch's length: a read never waits
 * for it (borrowing never waits: a busy slot is passed over).
 */
extern int codec_compress_blocks (struct codec *codec,
                                  const unsigned char *const *blocks,
                                  unsigned n, unsigned char *const *dst,
                                  size_t capacity, int *lengths);

/* Decompress src (length bytes) into one block.  0 or -1 (errno EIO).
 * padded: the compressed bytes are only the start of src, whose tail is
 * left over from older content; the codec finds where they end.
 */
extern int codec_decompress (struct codec *codec, const void *src,
                             size_t length, bool padded, void *block);

/* The same for any length (packed units of several blocks): the
 * decompressed bytes must be exactly expected.
 */
extern int codec_compress_bytes (struct codec *codec, const void *src,
                                 size_t length, void *dst, size_t capacity);
extern int codec_decompress_bytes (struct codec *codec, const void *src,
                                   size_t length, bool padded, void *dst,
                                   size_t expected);

/* Dictionaries (cold packing's frames, block-store.h): zstd's, trained
 * from samples of a store's blocks, so that a frame of a few blocks
 * compresses about as well as a frame many times its size would alone.
 * A dictionary's bytes are its owner's; these objects only refer to
 * them and must go first.  An encoder is made for one packing run (it
 * holds zstd's tables for the level: about a megabyte), a decoder for
 * as long as units use the dictionary (about 30 KiB beside the bytes).
 */
struct codec_encoder;
struct codec_decoder;
/* Train a dictionary of at most capacity bytes from count samples laid
 * end to end in samples (their sizes in sizes).  Returns its size, or 0
 * (too few or too alike samples: pack without one).
 */
extern size_t codec_dictionary_train (void *dictionary, size_t capacity,
                                      const void *samples,
                                      const size_t *sizes, unsigned count);
/* NULL with errno (ENOMEM; EINVAL: not zstd, or not a dictionary). */
extern struct codec_encoder *codec_encoder_make (struct codec *codec,
                                                 const void *dictionary,
                                                 size_t size);
extern void codec_encoder_free (struct codec_encoder *encoder);
extern struct codec_decoder *codec_decoder_make (const void *dictionary,
                                                 size_t size);
extern void codec_decoder_free (struct codec_decoder *decoder);
/* The memory each holds, beside the dictionary's bytes. */
extern size_t codec_encoder_bytes (const struct codec_encoder *encoder);
extern size_t codec_decoder_bytes (const struct codec_decoder *decoder);

/* Compress src (length bytes) as frames of frame bytes each (the last
 * may be shorter), each a zstd frame of its own that decodes alone (with
 * the encoder's dictionary; NULL: none), one after the other into dst:
 * frame i's compressed length in lengths[i].  Returns the total, 0 if it
 * does not fit in capacity, -1 with errno.  zstd only.
 */
extern int codec_compress_frames (struct codec *codec,
                                  const struct codec_encoder *encoder,
                                  const void *src, size_t length, size_t frame,
                                  void *dst, size_t capacity,
                                  uint32_t *lengths);

/* Decoding a zstd frame fed in pieces, straight into dst, stopping when
 * enough is out.  Holds a borrowed context from begin to end.
 */
struct codec_stream {
  struct codec_context *context;
  void *dst;
  size_t capacity;
  size_t produced;              /* bytes decoded into dst so far */
  bool finished;                /* the frame ended */
};
/* 0, or -1 with errno (EINVAL: not zstd).  decoder: the frame's
 * dictionary (NULL: none), kept by the caller to the end.
 */
extern int codec_stream_begin (struct codec *codec, struct codec_stream *stream,
                               const struct codec_decoder *decoder,
                               void *dst, size_t capacity);
/* Decodes what it can of src (length bytes), stopping once produced
 * reaches wanted (whole zstd blocks: it may pass it) or the frame ends;
 * the rest of src is not needed then.  0, or -1 (errno EIO).
 */
extern int codec_stream_feed (struct codec_stream *stream, const void *src,
                              size_t length, size_t wanted);
extern void codec_stream_end (struct codec_stream *stream);

/* Make count contexts (at most 128) and run a block through each, so
 * that every workspace a call needs is allocated and touched now, not
 * when memory is short (swap mode); codec_trim keeps them from then on.
 * 0, or -1 with errno.  Before any call.
 */
extern int codec_prepare (struct codec *codec, unsigned count);

/* Free the zstd workspaces of every context no call is using (they are
 * made again on next use): the memory a burst of parallel calls grew
 * goes back.  Returns the bytes freed (0 for lz4, whose state is small
 * and fixed, and after codec_prepare).  Safe beside any call.
 */
extern size_t codec_trim (struct codec *codec);

/* Bytes held by the codec's contexts. */
extern size_t codec_memory (struct codec *codec);
/* Its contexts: the most calls that ran at once so far (zram's streams,
 * of which it keeps one a CPU).
 */
extern unsigned codec_streams (struct codec *codec);

#endif /* ZRAM_CODEC_H */
