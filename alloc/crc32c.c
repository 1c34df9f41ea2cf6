/* CRC-32C: see crc32c.h. */

#include <pthread.h>

#include "crc32c.h"

static uint32_t crc_table[256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void
crc_table_make (void)
{
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = c & 1 ? (c >> 1) ^ 0x82f63b78 : c >> 1;
    crc_table[i] = c;
  }
}

uint32_t
crc32c (const void *data, size_t length)
{
  pthread_once (&crc_table_once, crc_table_make);
  const unsigned char *p = data;
  uint32_t c = 0xffffffff;
  while (length--)
    c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}
