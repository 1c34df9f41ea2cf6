/* Run a fuzzer's entry point without libFuzzer: on every file of the
 * corpus directories or files given, then on COUNT inputs made from a
 * seed (--random COUNT SEED), so that make check replays the corpus and
 * a little more with any compiler and under every sanitizer build.
 *
 *   replay CORPUS-DIR-OR-FILE... [--random COUNT SEED]
 */

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "xorshift.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

static unsigned runs;

static void
run_file (const char *path)
{
  FILE *fp = fopen (path, "rb");
  if (!fp) {
    perror (path);
    exit (EXIT_FAILURE);
  }
  static uint8_t data[1 << 20];
  size_t size = fread (data, 1, sizeof data, fp);
  fclose (fp);
  LLVMFuzzerTestOneInput (data, size);
  runs++;
}

static void
run_path (const char *path)
{
  struct stat st;
  if (stat (path, &st) == -1) {
    perror (path);
    exit (EXIT_FAILURE);
  }
  if (!S_ISDIR (st.st_mode)) {
    run_file (path);
    return;
  }
  struct dirent **names;
  int n = scandir (path, &names, NULL, alphasort);
  for (int i = 0; i < n; i++) {
    if (names[i]->d_name[0] != '.') {
      char file[4096];
      snprintf (file, sizeof file, "%s/%s", path, names[i]->d_name);
      run_file (file);
    }
    free (names[i]);
  }
  free (names);
}

int
main (int argc, char **argv)
{
  for (int i = 1; i < argc; i++) {
    if (strcmp (argv[i], "--random") == 0 && i + 2 < argc) {
      unsigned count = atoi (argv[i + 1]);
      uint64_t rng = strtoull (argv[i + 2], NULL, 0) | 1;
      static uint8_t data[4096];
      for (unsigned r = 0; r < count; r++) {
        size_t size = xorshift64 (&rng) % sizeof data;
        for (size_t b = 0; b < size; b++)
          data[b] = xorshift64 (&rng);
        LLVMFuzzerTestOneInput (data, size);
        runs++;
      }
      i += 2;
    }
    else
      run_path (argv[i]);
  }
  printf ("%s: %u inputs, no failure\n", argv[0], runs);
  return 0;
}
