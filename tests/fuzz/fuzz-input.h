/* The fuzzers' reading of their input and their one check. */
#ifndef ZRAM_FUZZ_INPUT_H
#define ZRAM_FUZZ_INPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* The input, read from the front; past its end it reads as zeros. */
struct input {
  const uint8_t *data;
  size_t size, at;
};

/* The next bytes (1 to 4) of the input, big-endian. */
static inline unsigned
take (struct input *in, unsigned bytes)
{
  unsigned value = 0;
  for (unsigned i = 0; i < bytes; i++)
    value = value << 8 | (in->at < in->size ? in->data[in->at++] : 0);
  return value;
}

/* A failed check is a crash, which is what libFuzzer reports. */
static inline void
check (bool condition)
{
  if (!condition)
    abort ();
}

#endif /* ZRAM_FUZZ_INPUT_H */
