/* nbdkit-zramctl: zramctl for nbdkit-zram servers, over their control
 * channel (the plugin's ctl=PATH).  man/nbdkit-zramctl.pod is the
 * specification.
 *
 *   nbdkit-zramctl [--json] [--bytes] SOCKET...     one line per server
 *   nbdkit-zramctl COMMAND SOCKET [ARGUMENT...]     one control command
 *   nbdkit-zramctl swap on|off|status [OPTION...]   compressed swap
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static const char *program = "nbdkit-zramctl";

/* The control channel's commands (plugin/control.c). */
static const char *const commands[] = {
  "info", "mm_stat", "io_stat", "bd_stat", "stats", "classes", "compact",
  "idle", "mem_limit", "mem_used_max", "block_state", "recompress", "pack",
  "dissolve", "writeback", "writeback_limit", "help",
};

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: %s [--json] [--bytes] SOCKET...\n"
           "       %s COMMAND SOCKET [ARGUMENT...]\n"
           "       %s swap on|off|status [OPTION...]\n"
           "SOCKET is a server's ctl= socket.  COMMAND is one of:", program,
           program, program);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf (fp, " %s", commands[i]);
  fprintf (fp, "\n(see nbdkit-zramctl(1))\n");
}

static int
control_connect (const char *path)
{
  struct sockaddr_un address = { .sun_family = AF_UNIX };
  if (strlen (path) >= sizeof address.sun_path) {
    fprintf (stderr, "%s: %s: name too long for a socket\n", program, path);
    return -1;
  }
  strcpy (address.sun_path, path);
  int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1 || connect (fd, (struct sockaddr *) &address, sizeof address) == -1) {
    fprintf (stderr, "%s: %s: %s\n", program, path, strerror (errno));
    if (fd != -1)
      close (fd);
    return -1;
  }
  return fd;
}

/* Send one command line and read its reply: the lines before "ok" into
 * *lines (caller frees).  0 on ok; -1 on an error reply (printed) or a
 * lost connection.
 */
static int
control_command (int fd, const char *path, const char *line, char **lines)
{
  size_t length = strlen (line);
  if (send (fd, line, length, MSG_NOSIGNAL) != (ssize_t) length
      || send (fd, "\n", 1, MSG_NOSIGNAL) != 1) {
    fprintf (stderr, "%s: %s: %s\n", program, path, strerror (errno));
    return -1;
  }
  FILE *in = fdopen (dup (fd), "r");
  if (!in) {
    fprintf (stderr, "%s: %s\n", program, strerror (errno));
    return -1;
  }
  size_t size = 0;
  FILE *out = open_memstream (lines, &size);
  char *reply = NULL;
  size_t capacity = 0;
  int r = -1;
  bool ended = false;
  while (getline (&reply, &capacity, in) != -1) {
    if (strcmp (reply, "ok\n") == 0) {
      r = 0;
      ended = true;
      break;
    }
    if (strncmp (reply, "error: ", 7) == 0) {
      fprintf (stderr, "%s: %s: %s", program, path, reply + 7);
      ended = true;
      break;
    }
    fputs (reply, out);
  }
  if (!ended)
    fprintf (stderr, "%s: %s: the server closed the connection\n", program, path);
  free (reply);
  fclose (out);
  fclose (in);
  return r;
}

/* The value of "key value" in reply lines, or 0. */
static uint64_t
reply_value (const char *lines, const char *key, char *text, size_t text_size)
{
  size_t length = strlen (key);
  for (const char *line = lines; line && *line; ) {
    if (strncmp (line, key, length) == 0 && line[length] == ' ') {
      const char *value = line + length + 1;
      if (text) {
        size_t n = strcspn (value, "\n");
        snprintf (text, text_size, "%.*s", (int) (n < text_size ? n : text_size - 1),
                  value);
      }
      return strtoull (value, NULL, 10);
    }
    line = strchr (line, '\n');
    if (line)
      line++;
  }
  return 0;
}

/* zramctl's sizes: 4G, 1.5M, 512B. */
static void
human_size (uint64_t bytes, char *text, size_t size)
{
  static const char units[] = "BKMGTPE";
  unsigned unit = 0;
  double value = bytes;
  while (value >= 1024 && unit < sizeof units - 2) {
    value /= 1024;
    unit++;
  }
  if (unit == 0 || value >= 100 || value == (uint64_t) value)
    snprintf (text, size, "%.0f%c", value, units[unit]);
  else
    snprintf (text, size, "%.1f%c", value, units[unit]);
}

struct server_row {
  const char *name;
  char algorithm[32];
  uint64_t disksize, data, compr, total;
};

static int
server_row_get (const char *path, struct server_row *row)
{
  int fd = control_connect (path);
  if (fd == -1)
    return -1;
  char *info = NULL, *mm_stat = NULL;
  int r = -1;
  if (control_command (fd, path, "info", &info) == 0
      && control_command (fd, path, "mm_stat", &mm_stat) == 0) {
    row->name = path;
    row->disksize = reply_value (info, "disksize", NULL, 0);
    reply_value (info, "algorithm", row->algorithm, sizeof row->algorithm);
    /* mm_stat: orig_data_size compr_data_size mem_used_total ... */
    if (sscanf (mm_stat, "%" SCNu64 " %" SCNu64 " %" SCNu64, &row->data,
                &row->compr, &row->total) == 3)
      r = 0;
    else
      fprintf (stderr, "%s: %s: cannot read mm_stat\n", program, path);
  }
  free (info);
  free (mm_stat);
  close (fd);
  return r;
}

static int
list_servers (int count, char **paths, bool json, bool bytes)
{
  int failures = 0;
  if (json)
    printf ("{\n  \"zram\": [");
  else
    printf ("%-24s %-9s %8s %8s %8s %8s %6s\n", "NAME", "ALGORITHM",
            "DISKSIZE", "DATA", "COMPR", "TOTAL", "RATIO");
  bool first = true;
  for (int i = 0; i < count; i++) {
    struct server_row row = { 0 };
    if (server_row_get (paths[i], &row) == -1) {
      failures++;
      continue;
    }
    double ratio = row.total ? (double) row.data / row.total : 0;
    if (json) {
      printf ("%s\n    {\"name\": \"%s\", \"algorithm\": \"%s\", "
              "\"disksize\": %" PRIu64 ", \"data\": %" PRIu64 ", "
              "\"compr\": %" PRIu64 ", \"total\": %" PRIu64 ", "
              "\"ratio\": %.2f}", first ? "" : ",", row.name, row.algorithm,
              row.disksize, row.data, row.compr, row.total, ratio);
      first = false;
      continue;
    }
    char sizes[4][32];
    uint64_t values[4] = { row.disksize, row.data, row.compr, row.total };
    for (int k = 0; k < 4; k++) {
      if (bytes)
        snprintf (sizes[k], sizeof sizes[k], "%" PRIu64, values[k]);
      else
        human_size (values[k], sizes[k], sizeof sizes[k]);
    }
    printf ("%-24s %-9s %8s %8s %8s %8s %6.2f\n", row.name, row.algorithm,
            sizes[0], sizes[1], sizes[2], sizes[3], ratio);
  }
  if (json)
    printf ("\n  ]\n}\n");
  return failures ? EXIT_FAILURE : EXIT_SUCCESS;
}

static int
run_command (const char *command, const char *path, int argc, char **argv)
{
  char line[1024];
  size_t used = snprintf (line, sizeof line, "%s", command);
  for (int i = 0; i < argc && used < sizeof line; i++)
    used += snprintf (line + used, sizeof line - used, " %s", argv[i]);
  if (used >= sizeof line || strchr (line, '\n')) {
    fprintf (stderr, "%s: the command is too long or has a newline\n", program);
    return EXIT_FAILURE;
  }
  int fd = control_connect (path);
  if (fd == -1)
    return EXIT_FAILURE;
  char *reply = NULL;
  int r = control_command (fd, path, line, &reply);
  if (reply)
    fputs (reply, stdout);
  free (reply);
  close (fd);
  return r == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* swap on|off|status: the shell script that sets up swap (it runs
 * modprobe, nbdkit, nbd-client, mkswap, swapon), told where this program
 * is so that `swap status` can print the table.
 */
static int
run_swap_helper (int argc, char **argv)
{
  const char *helper = getenv ("NBDKIT_ZRAM_SWAP");
  if (!helper || !*helper)
    helper = SWAP_HELPER;
  char self[4096];
  ssize_t length = readlink ("/proc/self/exe", self, sizeof self - 1);
  if (length > 0) {
    self[length] = '\0';
    setenv ("NBDKIT_ZRAMCTL", self, 1);
  }
  char *helper_argv[argc + 2];
  helper_argv[0] = (char *) helper;
  for (int i = 0; i < argc; i++)
    helper_argv[i + 1] = argv[i];
  helper_argv[argc + 1] = NULL;
  execv (helper, helper_argv);
  fprintf (stderr, "%s: swap: %s: %s\n", program, helper, strerror (errno));
  return EXIT_FAILURE;
}

int
main (int argc, char **argv)
{
  static const struct option options[] = {
    { "json", no_argument, NULL, 'j' },
    { "bytes", no_argument, NULL, 'b' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  bool json = false, bytes = false;
  int c;
  /* "+": options only before the first word, so that a command's own
   * arguments pass through.
   */
  while ((c = getopt_long (argc, argv, "+jbh", options, NULL)) != -1) {
    switch (c) {
    case 'j': json = true; break;
    case 'b': bytes = true; break;
    case 'h': usage (stdout); return EXIT_SUCCESS;
    default: usage (stderr); return EXIT_FAILURE;
    }
  }
  if (optind >= argc) {
    usage (stderr);
    return EXIT_FAILURE;
  }
  if (strcmp (argv[optind], "swap") == 0)
    return run_swap_helper (argc - optind - 1, argv + optind + 1);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp (argv[optind], commands[i]) == 0) {
      if (optind + 1 >= argc) {
        fprintf (stderr, "%s: %s: which server's socket?\n", program, argv[optind]);
        return EXIT_FAILURE;
      }
      return run_command (argv[optind], argv[optind + 1], argc - optind - 2,
                          argv + optind + 2);
    }
  return list_servers (argc - optind, argv + optind, json, bytes);
}
