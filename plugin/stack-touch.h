/* Touch bytes of the calling thread's stack below its caller, so that
 * they are resident (and, under mlockall, locked) before they are
 * needed: swap mode's serving threads and the full-device watch, which
 * must not fault a stack page in when memory is gone.
 */
#ifndef ZRAM_STACK_TOUCH_H
#define ZRAM_STACK_TOUCH_H

#include <stddef.h>

extern void stack_touch (size_t bytes);

#endif /* ZRAM_STACK_TOUCH_H */
