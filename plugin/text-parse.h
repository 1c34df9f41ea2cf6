/* Sizes and booleans as the user writes them, in parameters, control
 * commands and the full-device watch's thresholds: one home below them
 * all, logging nothing (the caller says what was wrong, and where).
 */
#ifndef ZRAM_TEXT_PARSE_H
#define ZRAM_TEXT_PARSE_H

#include <stdint.h>

/* A size as nbdkit_parse_size reads it: decimal digits, then at most
 * one suffix, b (bytes), k m g t p e (powers of 1024) or s (512-byte
 * sectors), either case (512M, 4G).  -1 for anything else, or a size
 * past INT64_MAX.  Not nbdkit_parse_size itself: it logs what it cannot
 * read, so a bad parameter got two lines, and a control client's text
 * must never reach the server's log (the control channel replies the
 * error to the client alone).
 */
extern int64_t parse_size (const char *text);
/* nbdkit_parse_bool's words (1 true t yes y on, 0 false f no n off,
 * either case): 1, 0, or -1 for anything else, logging nothing.
 */
extern int parse_bool (const char *text);

#endif /* ZRAM_TEXT_PARSE_H */
