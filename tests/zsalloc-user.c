/* A program built against the installed libzsalloc through pkg-config
 * (.ci/run: cc zsalloc-user.c $(pkg-config --cflags --libs zsalloc)):
 * the public header and library alone store an object and read it back.
 */
#include <stdio.h>
#include <string.h>

#include <zsalloc.h>

int
main (void)
{
  struct zs_pool_config config;
  zs_pool_config_init (&config);
  struct zs_pool *pool = zs_pool_create (&config);
  if (!pool) {
    perror ("zs_pool_create");
    return 1;
  }
  static const char text[] = "stored through the installed libzsalloc";
  zs_handle_t handle = zs_malloc (pool, sizeof text);
  if (!handle || zs_write (pool, handle, text, sizeof text) == -1) {
    perror ("zs_malloc/zs_write");
    return 1;
  }
  const void *back = zs_read_begin (pool, handle, NULL);
  int same = memcmp (back, text, sizeof text) == 0;
  zs_read_end (pool, handle, back);
  zs_free (pool, handle);
  zs_pool_destroy (pool);
  if (!same) {
    fprintf (stderr, "zsalloc-user: the object read back differs\n");
    return 1;
  }
  printf ("zsalloc-user: %s\n", text);
  return 0;
}
