/* An errno's text, for messages. */
#ifndef ZRAM_ERROR_TEXT_H
#define ZRAM_ERROR_TEXT_H

#include <string.h>

/* Not strerror: its translation lookup, run in a process that has the
 * sanitizer runtime preloaded, left glibc's locale lock held and hung
 * nbdkit at exit; strerrordesc_np (glibc 2.32) needs no locale.
 */
static inline const char *
error_text (int err)
{
  const char *text = strerrordesc_np (err);
  return text ? text : "unknown error";
}

#endif /* ZRAM_ERROR_TEXT_H */
