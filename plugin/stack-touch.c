/* The stack made resident before it is needed: see stack-touch.h. */

#include <alloca.h>
#include <stddef.h>

#include "stack-touch.h"

__attribute__ ((noinline)) void
stack_touch (size_t bytes)
{
  volatile unsigned char *stack = alloca (bytes);
  for (size_t offset = 0; offset < bytes; offset += 4096)
    stack[offset] = 0;
}
