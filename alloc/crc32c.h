/* CRC-32C (Castagnoli): the checksum of a region's header and of blocks
 * written back to a backing store.  Bitwise with a table made once; the
 * data it covers is small or already slow to move.
 */

#ifndef ZSALLOC_CRC32C_H
#define ZSALLOC_CRC32C_H

#include <stddef.h>
#include <stdint.h>

extern uint32_t crc32c (const void *data, size_t length);

#endif /* ZSALLOC_CRC32C_H */
