/* Sizes and booleans as the user writes them: see text-parse.h. */

#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "text-parse.h"

int64_t
parse_size (const char *text)
{
  static const char suffixes[] = "bkmgtpe";
  uint64_t number = 0;
  const char *p = text;
  if (*p < '0' || *p > '9')
    return -1;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (number > (uint64_t) (INT64_MAX - (*p - '0')) / 10)
      return -1;
    number = number * 10 + (*p - '0');
  }
  uint64_t scale = 1;
  if (*p) {
    const char *suffix = strchr (suffixes, *p | 0x20);  /* lower case */
    if (p[1] || (!suffix && (*p | 0x20) != 's'))
      return -1;
    if (suffix)
      for (const char *k = suffixes; k < suffix; k++)
        scale *= 1024;
    else
      scale = 512;
  }
  if (number > (uint64_t) INT64_MAX / scale)
    return -1;
  return (int64_t) (number * scale);
}

int
parse_bool (const char *text)
{
  static const char *const words[2][6] = {
    { "0", "false", "f", "no", "n", "off" },
    { "1", "true", "t", "yes", "y", "on" },
  };
  for (int value = 0; value < 2; value++)
    for (size_t i = 0; i < 6; i++)
      if (strcasecmp (text, words[value][i]) == 0)
        return value;
  return -1;
}
