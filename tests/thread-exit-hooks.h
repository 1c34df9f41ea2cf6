/* Thread-exit hooks registered by the code under test.
 *
 * The allocator and the block store must register none (no pthread key
 * with a destructor): nbdkit's detached connection threads exit after
 * the plugin is unloaded, and a destructor pointing into plugin code, or
 * at a destroyed pool, crashes them.  Test
 * programs that include this are linked with
 * -Wl,--wrap=pthread_key_create, so that every key the code under test
 * creates is counted here.
 */
#ifndef ZRAM_TEST_THREAD_EXIT_HOOKS_H
#define ZRAM_TEST_THREAD_EXIT_HOOKS_H

#include <pthread.h>
#include <stdatomic.h>

static atomic_int keys_with_destructor;

int __real_pthread_key_create (pthread_key_t *key, void (*destructor) (void *));

int __wrap_pthread_key_create (pthread_key_t *key, void (*destructor) (void *));
int
__wrap_pthread_key_create (pthread_key_t *key, void (*destructor) (void *))
{
  if (destructor)
    atomic_fetch_add (&keys_with_destructor, 1);
  return __real_pthread_key_create (key, destructor);
}

#endif /* ZRAM_TEST_THREAD_EXIT_HOOKS_H */
