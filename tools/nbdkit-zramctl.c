/* nbdkit-zramctl: zramctl for nbdkit-zram servers, over their control
 * channel (the plugin's ctl=PATH).  man/nbdkit-zramctl.pod is the
 * specification.
 *
 *   nbdkit-zramctl [--json] [--bytes] SOCKET...     one line per server
 *   nbdkit-zramctl COMMAND SOCKET [ARGUMENT...]     one control command
 *   nbdkit-zramctl metrics SOCKET...                Prometheus metrics
 *   nbdkit-zramctl plot SOCKET FILE.png [SECONDS [INTERVAL]]
 *                                                   a run's history
 *   nbdkit-zramctl swap on|off|status [OPTION...]   compressed swap
 */

#include <errno.h>
#include <dirent.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <time.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "control-commands.h"
#include "nbd-attach.h"
#include "region.h"
#include "registry-dir.h"
#include "supervise.h"

static const char *program = "nbdkit-zramctl";

/* The control channel's commands (plugin/control-commands.h); metrics
 * has a form of its own here (metrics SOCKET...).
 */
static const char *const commands[] = {
#define COMMAND_NAME(name, ...) #name,
  CONTROL_COMMANDS (COMMAND_NAME)
#undef COMMAND_NAME
};

/* How long a server may take to answer (--timeout): by default
 * QUERY_SECONDS for the commands that only read (a live server answers
 * them at once), MOVER_SECONDS for those that move data (a writeback of
 * hundreds of MiB takes tens of seconds); 0: no limit.
 */
#define QUERY_SECONDS 10
#define MOVER_SECONDS 600
static double timeout_given = -1;       /* -1: the command's default */
static double timeout_seconds = QUERY_SECONDS;

static void
usage (FILE *fp)
{
  fprintf (fp,
           "usage: %s [--json] [--bytes] [--raw] [-n] [-o COLUMNS|--output-all] [SERVER...]\n"
           "       %s COMMAND SERVER [ARGUMENT...]\n"
           "       %s metrics SERVER...\n"
           "       %s plot SERVER FILE.png [SECONDS [INTERVAL]]\n"
           "       %s swap on|off|status|restart [OPTION...]\n"
           "       %s nbd|supervise|region ... (the swap tool's helpers)\n"
           "SERVER is a server's ctl= socket, or its name in the registry; with no\n"
           "SERVER, every server in the registry.  Options: --json, --bytes, --raw,\n"
           "-n (no headings), -o COLUMNS (NAME,ALGORITHM,DISKSIZE,DATA,COMPR,TOTAL,\n"
           "RATIO,MEM-LIMIT,MEM-USED,ZERO-PAGES,MIGRATED,STREAMS,\n"
           "SERVES,CTL; +COLUMNS adds),\n"
           "--output-all (the listing), --timeout SECONDS (how long a server may take to answer:\n"
           "default %d s, %d s for commands that move data; 0: no limit),\n"
           "--progress / --no-progress (progress lines of writeback, recompress and\n"
           "pack on stderr; by default when it is a terminal), --version.\n"
           "COMMAND is one of:", program, program, program, program,
           program, program, QUERY_SECONDS, MOVER_SECONDS);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf (fp, " %s", commands[i]);
  fprintf (fp, "\n(see nbdkit-zramctl(1))\n");
}


static void
timeout_for (const char *command)
{
  /* The commands that only read (control-commands.h: reads_only). */
  static const struct { const char *name; bool reads_only; } queries[] = {
#define COMMAND_READS(name, min, max, usage, run, worker, reads_only) \
    { #name, reads_only },
    CONTROL_COMMANDS (COMMAND_READS)
#undef COMMAND_READS
  };
  timeout_seconds = MOVER_SECONDS;
  for (size_t i = 0; i < sizeof queries / sizeof queries[0]; i++)
    if (strcmp (command, queries[i].name) == 0 && queries[i].reads_only)
      timeout_seconds = QUERY_SECONDS;
  if (timeout_given >= 0)
    timeout_seconds = timeout_given;
}

static int
control_connect (const char *path)
{
  struct sockaddr_un address = { .sun_family = AF_UNIX };
  if (strlen (path) >= sizeof address.sun_path) {
    fprintf (stderr, "%s: %s: name too long for a socket\n", program, path);
    return -1;
  }
  struct stat st;
  if (stat (path, &st) == -1) {
    fprintf (stderr, "%s: %s: %s\n", program, path, strerror (errno));
    return -1;
  }
  if (!S_ISSOCK (st.st_mode)) {
    fprintf (stderr, "%s: %s is not an nbdkit-zram control socket (not a "
             "socket at all)\n", program, path);
    return -1;
  }
  strcpy (address.sun_path, path);
  int fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1) {
    fprintf (stderr, "%s: %s\n", program, strerror (errno));
    return -1;
  }
  /* The deadline covers the connect (a listener whose queue is full),
   * each send and each wait for a reply.
   */
  struct timeval limit = {
    .tv_sec = (time_t) timeout_seconds,
    .tv_usec = (suseconds_t) ((timeout_seconds - (time_t) timeout_seconds) * 1e6),
  };
  if (setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) == -1
      || setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) == -1
      || connect (fd, (struct sockaddr *) &address, sizeof address) == -1) {
    if (errno == ECONNREFUSED)
      fprintf (stderr, "%s: %s: no server is listening there (%s)\n",
               program, path, strerror (errno));
    else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINPROGRESS)
      fprintf (stderr, "%s: %s: the server did not take the connection "
               "within %g s\n", program, path, timeout_seconds);
    else
      fprintf (stderr, "%s: %s: %s\n", program, path, strerror (errno));
    close (fd);
    return -1;
  }
  return fd;
}

/* ---- progress of the commands that move data ------------------------- */

/* The commands whose server sends progress lines to a client that asked
 * ("progress on": plugin/control-commands.c, progress_keep_going), what
 * each line's done counts, and the reply field that counts it at the end.
 */
static const struct {
  const char *command, *done, *final_key;
} progress_commands[] = {
  { "writeback", "written back", "blocks" },
  { "recompress", "tried", "tried" },
  { "pack", "packed", "blocks" },
};
/* -1: not chosen (--progress / --no-progress): shown when stderr is a
 * terminal.
 */
static int progress_chosen = -1;
/* The command running with progress on (NULL: none), when it started,
 * and whether a line is on the terminal now.
 */
static const char *progress_done_word;
static struct timespec progress_started;
static bool progress_shown, progress_on_terminal;

static double
progress_seconds (void)
{
  struct timespec now;
  clock_gettime (CLOCK_MONOTONIC, &now);
  return (double) (now.tv_sec - progress_started.tv_sec)
    + (now.tv_nsec - progress_started.tv_nsec) / 1e9;
}

/* One progress line from the server: on a terminal it replaces the one
 * before, elsewhere (--progress) each goes on a line of its own.
 */
static void
progress_show (const char *line)
{
  char command[32];
  uint64_t walked, of, done;
  if (!progress_done_word
      || sscanf (line, "progress %31s walked=%" SCNu64 " of=%" SCNu64
                 " done=%" SCNu64, command, &walked, &of, &done) != 4)
    return;
  double seconds = progress_seconds ();
  fprintf (stderr, "%s%s: %.0f%% of the device looked at, %" PRIu64
           " blocks %s (%.0f blocks/s)%s", progress_on_terminal ? "\r" : "",
           command, of ? 100.0 * walked / of : 100.0, done, progress_done_word,
           seconds > 0 ? done / seconds : 0.0,
           progress_on_terminal ? "\033[K" : "\n");
  fflush (stderr);
  progress_shown = true;
}

/* Whether a line can be the control channel's: text, no NUL or
 * other control characters (an NBD server greets with binary magic).
 */
static bool
reply_line_is_text (const char *line, size_t length)
{
  if (length >= 8 && memcmp (line, "NBDMAGIC", 8) == 0)
    return false;
  for (size_t i = 0; i < length; i++) {
    unsigned char c = line[i];
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
      return false;
  }
  return true;
}

/* Send one command line and read its reply: the lines before "ok" into
 * *lines (caller frees), the progress lines to progress_show.  0 on ok;
 * -1 on an error reply (printed if report_errors) or a lost connection.
 */
static int
control_exchange (int fd, const char *path, const char *line, char **lines,
                  bool report_errors)
{
  size_t length = strlen (line);
  if (send (fd, line, length, MSG_NOSIGNAL) != (ssize_t) length
      || send (fd, "\n", 1, MSG_NOSIGNAL) != 1) {
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      fprintf (stderr, "%s: %s: the server did not take the command within "
               "%g s\n", program, path, timeout_seconds);
    else
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
  ssize_t got;
  while ((got = getline (&reply, &capacity, in)) != -1) {
    if (!reply_line_is_text (reply, got)) {
      fprintf (stderr, "%s: %s is not an nbdkit-zram control socket (it "
               "answered with something else)\n", program, path);
      ended = true;
      break;
    }
    if (strcmp (reply, "ok\n") == 0) {
      r = 0;
      ended = true;
      break;
    }
    if (strncmp (reply, "error: ", 7) == 0) {
      if (report_errors)
        fprintf (stderr, "%s: %s: %s", program, path, reply + 7);
      ended = true;
      break;
    }
    if (strncmp (reply, "progress ", 9) == 0) {
      progress_show (reply);
      continue;
    }
    fputs (reply, out);
  }
  if (!ended && ferror (in) && (errno == EAGAIN || errno == EWOULDBLOCK))
    fprintf (stderr, "%s: %s: no reply within %g s (a stopped server, or "
             "not an nbdkit-zram control socket; --timeout sets the "
             "limit)\n", program, path, timeout_seconds);
  else if (!ended)
    fprintf (stderr, "%s: %s: the server closed the connection\n", program, path);
  free (reply);
  fclose (out);
  fclose (in);
  return r;
}

static int
control_command (int fd, const char *path, const char *line, char **lines)
{
  return control_exchange (fd, path, line, lines, true);
}

/* Where the value of the reply line "key<separator>value" starts, or
 * NULL: "info" replies "key value", "stats" "key: value".
 */
static const char *
reply_field (const char *lines, const char *key, const char *separator)
{
  size_t length = strlen (key), gap = strlen (separator);
  for (const char *line = lines; line && *line; ) {
    if (strncmp (line, key, length) == 0
        && strncmp (line + length, separator, gap) == 0)
      return line + length + gap;
    line = strchr (line, '\n');
    if (line)
      line++;
  }
  return NULL;
}

/* The value of "key value" in reply lines, or 0. */
static uint64_t
reply_value (const char *lines, const char *key, char *text, size_t text_size)
{
  const char *value = reply_field (lines, key, " ");
  if (!value)
    return 0;
  if (text) {
    size_t n = strcspn (value, "\n");
    snprintf (text, text_size, "%.*s", (int) (n < text_size ? n : text_size - 1),
              value);
  }
  return strtoull (value, NULL, 10);
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

/* The longest device name (plugin/devices.h: DEVICE_NAME_MAX). */
#define DEVICE_LABEL_MAX 64

struct server_row {
  /* NAME: the registry's, or as given; a device's after a slash. */
  char label[4096 + 1 + DEVICE_LABEL_MAX];
  const char *path;               /* the control socket */
  char algorithm[32];
  char serves[512];               /* info's serves: where clients connect */
  /* mm_stat: orig_data_size compr_data_size mem_used_total mem_limit
   * mem_used_max same_pages pages_compacted.
   */
  uint64_t disksize, data, compr, total, mem_limit, mem_used, zero_pages,
    migrated, streams;
};

/* One export's row from the server on fd: the default export's
 * (device NULL) or a device's (device=NAME on each command).  0, or -1
 * after a message.
 */
static int
export_row_get (int fd, const char *path, const char *device,
                struct server_row *row)
{
  char info_line[128], mm_stat_line[128];
  snprintf (info_line, sizeof info_line, "info%s%s", device ? " device=" : "",
            device ? device : "");
  snprintf (mm_stat_line, sizeof mm_stat_line, "mm_stat%s%s",
            device ? " device=" : "", device ? device : "");
  char *info = NULL, *mm_stat = NULL;
  int r = -1;
  if (control_command (fd, path, info_line, &info) == 0
      && control_command (fd, path, mm_stat_line, &mm_stat) == 0) {
    row->path = path;
    row->disksize = reply_value (info, "disksize", NULL, 0);
    row->streams = reply_value (info, "streams", NULL, 0);
    if (!reply_field (info, "serves", " "))
      snprintf (row->serves, sizeof row->serves, "-");  /* an older server */
    else
      reply_value (info, "serves", row->serves, sizeof row->serves);
    reply_value (info, "algorithm", row->algorithm, sizeof row->algorithm);
    if (sscanf (mm_stat, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                " %" SCNu64 " %" SCNu64 " %" SCNu64, &row->data, &row->compr,
                &row->total, &row->mem_limit, &row->mem_used,
                &row->zero_pages, &row->migrated) == 7)
      r = 0;
    else
      fprintf (stderr, "%s: %s: cannot read mm_stat\n", program, path);
  }
  free (info);
  free (mm_stat);
  return r;
}

/* A server's rows, appended to *rows (*count of them, room for
 * *capacity): its default export's, named name, then each of its
 * devices' (the `devices` command; a server from before devices has
 * none), named name/DEVICE.  0, or -1 after a message.
 */
static int
server_rows_get (const char *name, const char *path, struct server_row **rows,
                 size_t *count, size_t *capacity)
{
  int fd = control_connect (path);
  if (fd == -1)
    return -1;
  char *devices = NULL;
  if (control_exchange (fd, path, "devices", &devices, false) == -1) {
    free (devices);
    devices = NULL;
  }
  int r = 0;
  /* The first line is the default export's ("- ..."). */
  const char *line = devices;
  for (bool first = true; r == 0; first = false) {
    char device[DEVICE_LABEL_MAX + 1] = "";
    if (!first) {
      line = line ? strchr (line, '\n') : NULL;
      if (!line || !*++line)
        break;
      if (sscanf (line, "%64s", device) != 1)
        break;
    }
    if (*count == *capacity) {
      size_t more = *capacity ? *capacity * 2 : 8;
      struct server_row *grown = realloc (*rows, more * sizeof *grown);
      if (!grown) {
        fprintf (stderr, "%s: %s\n", program, strerror (errno));
        r = -1;
        break;
      }
      *rows = grown;
      *capacity = more;
    }
    struct server_row *row = &(*rows)[*count];
    memset (row, 0, sizeof *row);
    if (first)
      snprintf (row->label, sizeof row->label, "%s", name);
    else
      snprintf (row->label, sizeof row->label, "%s/%s", name, device);
    r = export_row_get (fd, path, first ? NULL : device, row);
    if (r == 0)
      ++*count;
  }
  free (devices);
  close (fd);
  return r;
}

/* The listing's columns, zramctl's where it has them (-o, --output-all). */
enum column_kind { TEXT, SIZE, NUMBER, RATIO };
struct column {
  const char *name;
  enum column_kind kind;
  bool shown;                     /* without -o */
};
static const struct column columns[] = {
  { "NAME", TEXT, true },         /* its registry entry, or as given */
  { "ALGORITHM", TEXT, true },
  { "DISKSIZE", SIZE, true },
  { "DATA", SIZE, true },         /* orig_data_size */
  { "COMPR", SIZE, true },        /* compr_data_size */
  { "TOTAL", SIZE, true },        /* mem_used_total */
  { "RATIO", RATIO, true },       /* DATA / TOTAL; '-' for an empty device */
  { "MEM-LIMIT", SIZE, false },
  { "MEM-USED", SIZE, false },    /* mem_used_max */
  { "ZERO-PAGES", NUMBER, false },/* same_pages */
  { "MIGRATED", NUMBER, false },  /* pages_compacted */
  { "STREAMS", NUMBER, false },   /* compression contexts (info) */
  { "SERVES", TEXT, false },      /* where clients connect (info), as
                                     zramctl's MOUNTPOINT */
  { "CTL", TEXT, false },         /* the control socket */
};
enum { COLUMNS = sizeof columns / sizeof columns[0] };

/* A column's value in row, as text (sizes human or in bytes). */
static void
column_text (const struct server_row *row, unsigned c, bool bytes,
             char *text, size_t size)
{
  const uint64_t values[COLUMNS] = {
    0, 0, row->disksize, row->data, row->compr, row->total, 0,
    row->mem_limit, row->mem_used, row->zero_pages, row->migrated,
    row->streams, 0, 0,
  };
  const char *const texts[COLUMNS] = {
    [0] = row->label, [1] = row->algorithm, [COLUMNS - 2] = row->serves,
    [COLUMNS - 1] = row->path,
  };
  switch (columns[c].kind) {
  case TEXT:
    snprintf (text, size, "%s", texts[c]);
    break;
  case SIZE:
    if (bytes)
      snprintf (text, size, "%" PRIu64, values[c]);
    else
      human_size (values[c], text, size);
    break;
  case NUMBER:
    snprintf (text, size, "%" PRIu64, values[c]);
    break;
  case RATIO:
    if (row->total)
      snprintf (text, size, "%.2f", (double) row->data / row->total);
    else
      snprintf (text, size, "-");
    break;
  }
}

/* A JSON string: quoted, with \" \\ and control characters escaped. */
static void
json_string (const char *text)
{
  putchar ('"');
  for (const unsigned char *c = (const unsigned char *) text; *c; c++) {
    if (*c == '"' || *c == '\\')
      printf ("\\%c", *c);
    else if (*c < 0x20 || *c == 0x7f)
      printf ("\\u%04x", *c);
    else
      putchar (*c);
  }
  putchar ('"');
}

/* How the listing prints: which columns, in what order, and how. */
struct listing {
  unsigned order[COLUMNS], count;
  bool json, bytes, raw, headings;
};

static void
listing_defaults (struct listing *listing, bool all)
{
  listing->count = 0;
  for (unsigned c = 0; c < COLUMNS; c++)
    if (all || columns[c].shown)
      listing->order[listing->count++] = c;
}

/* -o LIST: the column names, comma-separated, either case; a leading
 * '+' adds them to the default ones.  0, or -1 (said why).
 */
static int
listing_columns (struct listing *listing, const char *list)
{
  listing->count = 0;
  if (*list == '+') {
    listing_defaults (listing, false);
    list++;
  }
  char *copy = strdup (list), *save = NULL;
  if (!copy)
    return -1;
  for (char *word = strtok_r (copy, ",", &save); word;
       word = strtok_r (NULL, ",", &save)) {
    unsigned c = 0;
    while (c < COLUMNS && strcasecmp (word, columns[c].name) != 0)
      c++;
    if (c == COLUMNS) {
      fprintf (stderr, "%s: --output: unknown column '%s' (one of", program,
               word);
      for (unsigned k = 0; k < COLUMNS; k++)
        fprintf (stderr, " %s", columns[k].name);
      fprintf (stderr, ")\n");
      free (copy);
      return -1;
    }
    if (listing->count < COLUMNS)
      listing->order[listing->count++] = c;
  }
  free (copy);
  if (listing->count == 0) {
    fprintf (stderr, "%s: --output: no columns\n", program);
    return -1;
  }
  return 0;
}

/* One cell: text left-aligned, figures right-aligned (as zramctl); the
 * last column unpadded; --raw: no padding at all.
 */
static void
print_cell (const struct listing *listing, unsigned k, int width,
            const char *text)
{
  bool last = k + 1 == listing->count;
  if (listing->raw)
    printf ("%s", text);
  else if (columns[listing->order[k]].kind == TEXT)
    printf ("%-*s", last ? 0 : width, text);
  else
    printf ("%*s", width, text);
  putchar (last ? '\n' : ' ');
}

static int
list_servers (int count, char *const *names, char *const *paths,
              const struct listing *listing)
{
  int failures = 0;
  struct server_row *rows = NULL;
  size_t row_count = 0, capacity = 0;
  for (int i = 0; i < count; i++)
    if (server_rows_get (names[i], paths[i], &rows, &row_count, &capacity)
        == -1)
      failures++;
  /* Each column as wide as its widest text (the swap tool's own socket
   * paths are 30 characters and more), so that the columns stay aligned.
   */
  int width[COLUMNS];
  char text[4096];
  for (unsigned k = 0; k < listing->count; k++) {
    unsigned c = listing->order[k];
    width[k] = strlen (columns[c].name);
    for (size_t i = 0; i < row_count; i++) {
      column_text (&rows[i], c, listing->bytes, text, sizeof text);
      if ((int) strlen (text) > width[k])
        width[k] = strlen (text);
    }
  }
  if (listing->json) {
    /* zramctl's: lower-case column names, sizes in bytes. */
    printf ("{\n  \"zram\": [");
    bool first = true;
    for (size_t i = 0; i < row_count; i++) {
      printf ("%s\n    {", first ? "" : ",");
      first = false;
      for (unsigned k = 0; k < listing->count; k++) {
        unsigned c = listing->order[k];
        char key[32];
        size_t n = 0;
        for (const char *from = columns[c].name; *from && n < sizeof key - 1;
             from++)
          key[n++] = *from >= 'A' && *from <= 'Z' ? *from + 32 : *from;
        key[n] = '\0';
        printf ("%s\"%s\": ", k ? ", " : "", key);
        column_text (&rows[i], c, true, text, sizeof text);
        if (columns[c].kind == TEXT)
          json_string (text);
        else if (columns[c].kind == RATIO && !rows[i].total)
          printf ("null");      /* no ratio for an empty device */
        else
          printf ("%s", text);
      }
      printf ("}");
    }
    printf ("\n  ]\n}\n");
  }
  else {
    if (listing->headings)
      for (unsigned k = 0; k < listing->count; k++)
        print_cell (listing, k, width[k], columns[listing->order[k]].name);
    for (size_t i = 0; i < row_count; i++)
      for (unsigned k = 0; k < listing->count; k++) {
        column_text (&rows[i], listing->order[k], listing->bytes, text,
                     sizeof text);
        print_cell (listing, k, width[k], text);
      }
  }
  free (rows);
  return failures ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---- the registry: every server this user runs (registry-dir.h) ------- */

/* The socket a word names: a path as it is (it has a '/', or a file of
 * that name is here), else the registry's entry of that name if there is
 * one, else the word (the connect says what is wrong).
 */
static const char *
server_path (const char *word, char *path, size_t size)
{
  char dir[4096];
  struct stat st;
  if (strchr (word, '/') || lstat (word, &st) == 0
      || registry_dir (dir, sizeof dir, false) == -1
      || snprintf (path, size, "%s/%s" REGISTRY_SUFFIX, dir, word) >= (int) size
      || lstat (path, &st) == -1)
    return word;
  return path;
}

/* A registry entry: its name (without the suffix) and path, in one
 * allocation.
 */
struct entry {
  char *name, *path;
};

static int
entry_compare (const void *a, const void *b)
{
  return strcmp (((const struct entry *) a)->name,
                 ((const struct entry *) b)->name);
}

/* No server named: every live one in the registry, by name.  A stale
 * entry (a socket nobody listens on, a link to nothing: its server was
 * killed) is removed if it is this user's socket or link; nothing else
 * there is touched.
 */
static int
list_registry (const struct listing *listing)
{
  char dir[4096];
  if (registry_dir (dir, sizeof dir, false) == -1) {
    if (errno == ENOENT)
      return list_servers (0, NULL, NULL, listing);
    fprintf (stderr, "%s: the registry %s: %s\n", program, dir,
             errno == EPERM ? "not a directory of this user's that only it "
             "may write: not read" : strerror (errno));
    return EXIT_FAILURE;
  }
  DIR *d = opendir (dir);
  if (!d)
    return list_servers (0, NULL, NULL, listing);
  struct entry *entries = NULL;
  int count = 0;
  size_t suffix = strlen (REGISTRY_SUFFIX);
  struct dirent *dirent;
  while ((dirent = readdir (d))) {
    size_t length = strlen (dirent->d_name);
    if (length <= suffix
        || strcmp (dirent->d_name + length - suffix, REGISTRY_SUFFIX) != 0)
      continue;
    char *path = NULL;
    if (asprintf (&path, "%s/%s", dir, dirent->d_name) == -1)
      continue;
    struct stat st;
    if (lstat (path, &st) == -1
        || !(S_ISSOCK (st.st_mode) || S_ISLNK (st.st_mode))) {
      free (path);
      continue;
    }
    if (registry_socket_answers (path) == 0) {
      /* Stale: removed if this user's and still the file judged. */
      if (st.st_uid == geteuid ())
        registry_remove_if_same (dir, path, &st);
      free (path);
      continue;
    }
    /* A link: the socket it names (what CTL shows). */
    char target[4096];
    ssize_t n = S_ISLNK (st.st_mode)
      ? readlink (path, target, sizeof target - 1) : -1;
    if (n > 0 && target[0] == '/') {
      target[n] = '\0';
      free (path);
      if (!(path = strdup (target)))
        continue;
    }
    struct entry *more = realloc (entries, (count + 1) * sizeof *entries);
    char *name = strndup (dirent->d_name, length - suffix);
    if (more)
      entries = more;
    if (!more || !name) {
      free (name);
      free (path);
      break;
    }
    entries = more;
    entries[count++] = (struct entry) { .name = name, .path = path };
  }
  closedir (d);
  qsort (entries, count, sizeof *entries, entry_compare);
  char **names = calloc (count ? count : 1, sizeof *names);
  char **paths = calloc (count ? count : 1, sizeof *paths);
  int r = EXIT_FAILURE;
  if (names && paths) {
    for (int i = 0; i < count; i++) {
      names[i] = entries[i].name;
      paths[i] = entries[i].path;
    }
    r = list_servers (count, names, paths, listing);
  }
  for (int i = 0; i < count; i++) {
    free (entries[i].name);
    free (entries[i].path);
  }
  free (entries);
  free (names);
  free (paths);
  return r;
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
  /* Progress for a command that moves data, when wanted and the server
   * offers it (one before progress lines answers an error: silent then).
   */
  size_t p = sizeof progress_commands / sizeof progress_commands[0];
  bool wanted = progress_chosen == -1 ? isatty (STDERR_FILENO) : progress_chosen;
  if (wanted)
    for (p = 0; p < sizeof progress_commands / sizeof progress_commands[0]; p++)
      if (strcmp (command, progress_commands[p].command) == 0)
        break;
  if (p < sizeof progress_commands / sizeof progress_commands[0]) {
    char *ignored = NULL;
    if (control_exchange (fd, path, "progress on", &ignored, false) == 0) {
      progress_done_word = progress_commands[p].done;
      progress_on_terminal = isatty (STDERR_FILENO);
      clock_gettime (CLOCK_MONOTONIC, &progress_started);
    }
    free (ignored);
  }
  char *reply = NULL;
  int r = control_command (fd, path, line, &reply);
  /* The progress line gives way to a summary of the whole run. */
  if (progress_shown) {
    if (progress_on_terminal)
      fputs ("\r\033[K", stderr);
    if (r == 0) {
      double seconds = progress_seconds ();
      uint64_t done = reply_value (reply, progress_commands[p].final_key,
                                   NULL, 0);
      fprintf (stderr, "%s: %" PRIu64 " blocks %s in %.1f s (%.0f blocks/s)\n",
               command, done, progress_done_word, seconds,
               seconds > 0 ? done / seconds : 0.0);
    }
  }
  if (reply)
    fputs (reply, stdout);
  free (reply);
  close (fd);
  return r == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* ---- metrics: one exposition for several servers ---------------------- */

/* A metric family: its # HELP and # TYPE lines once, then the samples of
 * every server (Prometheus allows each family once in an exposition).
 */
struct family {
  char *name;
  char *help, *type;              /* the lines, or NULL */
  char *samples;
  size_t samples_size;
  FILE *out;                      /* writes samples */
};

/* The family of that name, made (at a fixed address: its memstream
 * writes through its fields) if it is new.
 */
static struct family *
family_find (struct family ***families, size_t *count, const char *name,
             size_t length)
{
  for (size_t i = 0; i < *count; i++)
    if (strlen ((*families)[i]->name) == length
        && strncmp ((*families)[i]->name, name, length) == 0)
      return (*families)[i];
  struct family **more = realloc (*families, (*count + 1) * sizeof **families);
  struct family *family = calloc (1, sizeof *family);
  if (more)
    *families = more;
  if (!more || !family) {
    free (family);
    return NULL;
  }
  more[(*count)++] = family;
  family->name = strndup (name, length);
  family->out = open_memstream (&family->samples, &family->samples_size);
  return family->name && family->out ? family : NULL;
}

/* Add one server's exposition to the families. */
static int
families_add (struct family ***families, size_t *count, const char *text)
{
  struct family *current = NULL;
  for (const char *line = text; *line; ) {
    size_t length = strcspn (line, "\n");
    if (strncmp (line, "# HELP ", 7) == 0 || strncmp (line, "# TYPE ", 7) == 0) {
      const char *name = line + 7;
      current = family_find (families, count, name, strcspn (name, " \n"));
      if (!current)
        return -1;
      char **kept = line[2] == 'H' ? &current->help : &current->type;
      if (!*kept && !(*kept = strndup (line, length)))
        return -1;
    }
    else if (length > 0 && line[0] != '#') {
      if (!current)
        current = family_find (families, count, line, strcspn (line, "{ "));
      if (!current)
        return -1;
      fprintf (current->out, "%.*s\n", (int) length, line);
    }
    line += length;
    if (*line == '\n')
      line++;
  }
  return 0;
}

/* The device label of a server's exposition (name=), or NULL. */
static char *
exposition_device (const char *text)
{
  const char *at = strstr (text, "device=\"");
  if (!at)
    return NULL;
  at += strlen ("device=\"");
  return strndup (at, strcspn (at, "\""));
}

static int
run_metrics (int count, char **paths)
{
  struct family **families = NULL;
  size_t family_count = 0;
  int failures = 0;
  char *devices[count];
  for (int i = 0; i < count; i++) {
    devices[i] = NULL;
    int fd = control_connect (paths[i]);
    char *reply = NULL;
    if (fd == -1 || control_command (fd, paths[i], "metrics", &reply) == -1)
      failures++;
    else {
      /* Two servers of one name would give the same series twice, which
       * Prometheus refuses for the whole exposition: the second is left
       * out, and said so.
       */
      devices[i] = exposition_device (reply);
      int same = -1;
      for (int j = 0; j < i && devices[i] && same == -1; j++)
        if (devices[j] && strcmp (devices[i], devices[j]) == 0)
          same = j;
      if (same >= 0) {
        fprintf (stderr, "%s: metrics: %s and %s both call their device "
                 "'%s' (name=): left out; give each server its own name\n",
                 program, paths[same], paths[i], devices[i]);
        free (devices[i]);
        devices[i] = NULL;
        failures++;
      }
      else if (families_add (&families, &family_count, reply) == -1)
        failures++;
    }
    free (reply);
    if (fd != -1)
      close (fd);
  }
  for (int i = 0; i < count; i++)
    free (devices[i]);
  for (size_t i = 0; i < family_count; i++) {
    struct family *family = families[i];
    if (family->out)
      fclose (family->out);
    if (family->help)
      printf ("%s\n", family->help);
    if (family->type)
      printf ("%s\n", family->type);
    fputs (family->samples ? family->samples : "", stdout);
    free (family->name);
    free (family->help);
    free (family->type);
    free (family->samples);
    free (family);
  }
  free (families);
  return failures ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---- plot: a PNG of a run's history ------------------------------------- */

static volatile sig_atomic_t plot_stop;

static void
plot_signal (int signal)
{
  (void) signal;
  plot_stop = 1;
}

/* The value of "key: value" in a stats reply, or 0. */
static double
stats_value (const char *lines, const char *key)
{
  const char *value = reply_field (lines, key, ": ");
  return value ? strtod (value, NULL) : 0;
}

/* The columns of the samples file, in order: seconds since the start,
 * then these stats keys.
 */
static const char *const plot_keys[] = {
  "orig_data_size", "compr_data_size", "mem_used_total", "process_rss",
  "memory_ratio", "compression_ratio", "pages_compacted", "bd_count",
  "backing_used", "mem_limit",
};

/* Sample the server's stats every interval (seconds) until seconds have
 * passed (0: until it goes away or a signal), into FILE.png.dat, then
 * draw FILE.png with gnuplot (GNUPLOT, default gnuplot).
 */
static int
run_plot (const char *path, const char *png, double seconds, double interval)
{
  char data_path[4096];
  if (snprintf (data_path, sizeof data_path, "%s.dat", png)
      >= (int) sizeof data_path) {
    fprintf (stderr, "%s: plot: %s: name too long\n", program, png);
    return EXIT_FAILURE;
  }
  FILE *data = fopen (data_path, "w");
  if (!data) {
    fprintf (stderr, "%s: plot: %s: %s\n", program, data_path, strerror (errno));
    return EXIT_FAILURE;
  }
  fprintf (data, "# seconds");
  for (size_t k = 0; k < sizeof plot_keys / sizeof plot_keys[0]; k++)
    fprintf (data, " %s", plot_keys[k]);
  fprintf (data, "\n");
  signal (SIGINT, plot_signal);
  signal (SIGTERM, plot_signal);
  struct timespec start, now;
  clock_gettime (CLOCK_MONOTONIC, &start);
  unsigned samples = 0;
  int fd = control_connect (path);
  while (fd != -1 && !plot_stop) {
    char *reply = NULL;
    if (control_command (fd, path, "stats", &reply) == -1) {
      free (reply);
      break;                    /* the server went away: draw what we have */
    }
    clock_gettime (CLOCK_MONOTONIC, &now);
    double at = (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
    fprintf (data, "%.3f", at);
    for (size_t k = 0; k < sizeof plot_keys / sizeof plot_keys[0]; k++)
      fprintf (data, " %.6g", stats_value (reply, plot_keys[k]));
    fprintf (data, "\n");
    fflush (data);
    free (reply);
    samples++;
    if (seconds > 0 && at + interval > seconds)
      break;
    struct timespec pause = { (time_t) interval,
                              (long) ((interval - (time_t) interval) * 1e9) };
    nanosleep (&pause, NULL);
  }
  if (fd != -1)
    close (fd);
  fclose (data);
  if (samples < 2) {
    fprintf (stderr, "%s: plot: %u sample(s) from %s: nothing to draw\n",
             program, samples, path);
    return EXIT_FAILURE;
  }
  /* The script is fixed text; the names (the picture, the socket, the
   * samples file) reach gnuplot as its arguments (gnuplot -c: ARG1..3),
   * never as script text, so a name with quotes or commands in it is
   * only a name.  gnuplot's own complaints (an empty y range for a
   * series that stayed 0) are shown only if it fails.
   */
  static const char script_text[] =
    "set terminal pngcairo size 1200,900 noenhanced\n"
    "set output ARG1\n"
    "set multiplot layout 2,2 title ARG2\n"
    "set key top left\nset grid\nset xlabel 'seconds'\nset yrange [0:*]\n"
    "set ylabel 'MiB'\nset title 'memory used against data stored'\n"
    "plot ARG3 using 1:($2/1048576) with lines title 'stored', "
    "'' using 1:($4/1048576) with lines title 'pool (mem_used_total)', "
    "'' using 1:($5/1048576) with lines title 'process RSS', "
    "'' using 1:($11 > 0 ? $11/1048576 : 1/0) with lines dt 2 title 'mem_limit'\n"
    "set ylabel 'stored / used'\nset title 'ratio'\n"
    "plot ARG3 using 1:6 with lines title 'memory ratio', "
    "'' using 1:7 with lines title 'compression ratio'\n"
    "set ylabel 'pages'\nset title 'compaction'\n"
    "plot ARG3 using 1:8 with lines title 'pages compacted'\n"
    "set ylabel 'MiB'\nset title 'writeback'\n"
    "plot ARG3 using 1:($9*4096/1048576) with lines title 'written back (bd_count)', "
    "'' using 1:($10/1048576) with lines title 'backing store used'\n"
    "unset multiplot\n";
  /* Columns: 1 seconds, 2 stored, 3 compressed, 4 pool, 5 RSS, 6 memory
   * ratio, 7 compression ratio, 8 pages compacted, 9 blocks written back,
   * 10 backing bytes used, 11 mem_limit.
   */
  const char *tmpdir = getenv ("TMPDIR");
  char script[4096], errors[4096];
  snprintf (script, sizeof script, "%s/nbdkit-zramctl-plot-XXXXXX",
            tmpdir && *tmpdir ? tmpdir : "/tmp");
  snprintf (errors, sizeof errors, "%s/nbdkit-zramctl-plot-XXXXXX",
            tmpdir && *tmpdir ? tmpdir : "/tmp");
  int script_fd = mkstemp (script);
  int errors_fd = script_fd == -1 ? -1 : mkstemp (errors);
  if (script_fd == -1 || errors_fd == -1
      || write (script_fd, script_text, sizeof script_text - 1)
         != (ssize_t) sizeof script_text - 1) {
    fprintf (stderr, "%s: plot: a temporary file: %s\n", program,
             strerror (errno));
    if (script_fd != -1) {
      close (script_fd);
      unlink (script);
    }
    return EXIT_FAILURE;
  }
  close (script_fd);
  unlink (errors);
  const char *gnuplot = getenv ("GNUPLOT");
  if (!gnuplot || !*gnuplot)
    gnuplot = "gnuplot";
  int status = -1;
  pid_t child = fork ();
  if (child == 0) {
    dup2 (errors_fd, STDERR_FILENO);
    execlp (gnuplot, gnuplot, "-c", script, png, path, data_path,
            (char *) NULL);
    fprintf (stderr, "cannot run %s: %s\n", gnuplot, strerror (errno));
    _exit (127);
  }
  if (child > 0)
    while (waitpid (child, &status, 0) == -1 && errno == EINTR)
      ;
  unlink (script);
  if (child == -1 || !WIFEXITED (status) || WEXITSTATUS (status) != 0) {
    fprintf (stderr, "%s: plot: gnuplot failed%s\n", program,
             child == -1 ? " to start" : ":");
    char text[4096];
    ssize_t n;
    lseek (errors_fd, 0, SEEK_SET);
    while ((n = read (errors_fd, text, sizeof text)) > 0)
      fwrite (text, 1, n, stderr);
    close (errors_fd);
    return EXIT_FAILURE;
  }
  close (errors_fd);
  fprintf (stderr, "%s: plot: %u samples in %s, drawn in %s\n", program,
           samples, data_path, png);
  return EXIT_SUCCESS;
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

/* `region remove PATH`: the region a region file names, removed (the
 * swap tool's undo, for a server that never served): its segment only
 * if provably the named region, the file only if it is a region file
 * (region_remove).  0 also when there is none.
 */
static int
run_region (int argc, char **argv)
{
  if (argc != 2 || strcmp (argv[0], "remove") != 0) {
    fprintf (stderr, "usage: %s region remove PATH\n", program);
    return EXIT_FAILURE;
  }
  char why[512] = "";
  if (region_remove (argv[1], why, sizeof why) == -1) {
    fprintf (stderr, "%s: region remove: %s: %s\n", program, argv[1], why);
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}

/* The words this program takes besides the control commands. */
static const char *const own_words[] = {
  "metrics", "plot", "swap", "nbd", "supervise", "region",
};

/* Edits (insert, delete, change, swap two neighbours) from a to b. */
static unsigned
edit_distance (const char *a, const char *b)
{
  size_t m = strlen (a), n = strlen (b);
  if (m > 32 || n > 32)
    return 99;
  unsigned d[33][33];
  for (size_t i = 0; i <= m; i++)
    d[i][0] = i;
  for (size_t j = 0; j <= n; j++)
    d[0][j] = j;
  for (size_t i = 1; i <= m; i++)
    for (size_t j = 1; j <= n; j++) {
      unsigned best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best)
        best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best)
        best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]
          && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[m][n];
}

/* A first word that is neither a command nor a path to anything: a
 * mistyped command, said so with the nearest command (at most two edits
 * away), rather than tried as a socket.
 */
static int
unknown_command (const char *word)
{
  const char *nearest = NULL;
  unsigned best = 3;
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (edit_distance (word, commands[i]) < best) {
      best = edit_distance (word, commands[i]);
      nearest = commands[i];
    }
  for (size_t i = 0; i < sizeof own_words / sizeof own_words[0]; i++)
    if (edit_distance (word, own_words[i]) < best) {
      best = edit_distance (word, own_words[i]);
      nearest = own_words[i];
    }
  if (nearest)
    fprintf (stderr, "%s: unknown command '%s' (did you mean %s?)\n",
             program, word, nearest);
  else
    fprintf (stderr, "%s: unknown command '%s', and no such socket (see "
             "%s --help)\n", program, word, program);
  return EXIT_FAILURE;
}

int
main (int argc, char **argv)
{
  static const struct option options[] = {
    { "json", no_argument, NULL, 'J' },
    { "bytes", no_argument, NULL, 'b' },
    { "output", required_argument, NULL, 'o' },
    { "output-all", no_argument, NULL, 'A' },
    { "raw", no_argument, NULL, 'r' },
    { "noheadings", no_argument, NULL, 'n' },
    { "timeout", required_argument, NULL, 't' },
    { "progress", no_argument, NULL, 'P' },
    { "no-progress", no_argument, NULL, 'Q' },
    { "help", no_argument, NULL, 'h' },
    { "version", no_argument, NULL, 'V' },
    { NULL, 0, NULL, 0 },
  };
  struct listing listing = { .headings = true };
  listing_defaults (&listing, false);
  int c;
  char *timeout_end;
  /* "+": options only before the first word, so that a command's own
   * arguments pass through.  -j as well as -J: --json's old short form.
   */
  while ((c = getopt_long (argc, argv, "+jJbo:Arnt:hV", options, NULL)) != -1) {
    switch (c) {
    case 'j': case 'J': listing.json = true; break;
    case 'b': listing.bytes = true; break;
    case 'o':
      if (listing_columns (&listing, optarg) == -1)
        return EXIT_FAILURE;
      break;
    case 'A': listing_defaults (&listing, true); break;
    case 'r': listing.raw = true; break;
    case 'n': listing.headings = false; break;
    case 't':
      errno = 0;
      timeout_given = strtod (optarg, &timeout_end);
      if (errno || timeout_end == optarg || *timeout_end || !(timeout_given >= 0)
          || timeout_given > 1e6) {
        fprintf (stderr, "%s: --timeout: '%s' is not a number of seconds "
                 "(0: no limit)\n", program, optarg);
        return EXIT_FAILURE;
      }
      break;
    case 'P': progress_chosen = 1; break;
    case 'Q': progress_chosen = 0; break;
    case 'h': usage (stdout); return EXIT_SUCCESS;
    case 'V': printf ("%s %s\n", program, PACKAGE_VERSION); return EXIT_SUCCESS;
    default: usage (stderr); return EXIT_FAILURE;
    }
  }
  timeout_for ("info");
  /* No server named: every one in the registry. */
  if (optind >= argc)
    return list_registry (&listing);
  if (strcmp (argv[optind], "swap") == 0)
    return run_swap_helper (argc - optind - 1, argv + optind + 1);
  if (strcmp (argv[optind], "nbd") == 0)
    return run_nbd (argc - optind - 1, argv + optind + 1);
  if (strcmp (argv[optind], "supervise") == 0)
    return run_supervise (argc - optind - 1, argv + optind + 1);
  if (strcmp (argv[optind], "region") == 0)
    return run_region (argc - optind - 1, argv + optind + 1);
  /* Servers by their sockets, or by their names in the registry (kept
   * to the exit: every form below uses them).
   */
  static char (*resolved)[4096];
  static char **servers;
  resolved = calloc (argc, sizeof *resolved);
  servers = calloc (argc + 1, sizeof *servers);
  if (!resolved || !servers) {
    fprintf (stderr, "%s: %s\n", program, strerror (errno));
    return EXIT_FAILURE;
  }
  for (int i = 0; i < argc; i++)
    servers[i] = (char *) server_path (argv[i], resolved[i], sizeof resolved[i]);
  if (strcmp (argv[optind], "metrics") == 0) {
    if (optind + 1 >= argc) {
      fprintf (stderr, "%s: metrics: which servers' sockets?\n", program);
      return EXIT_FAILURE;
    }
    return run_metrics (argc - optind - 1, servers + optind + 1);
  }
  if (strcmp (argv[optind], "plot") == 0) {
    int n = argc - optind - 1;
    char *end = NULL;
    double seconds = n >= 3 ? strtod (argv[optind + 3], &end) : 0;
    double interval = 1;
    if (n >= 3 && (*end || seconds < 0))
      n = 0;
    if (n >= 4) {
      interval = strtod (argv[optind + 4], &end);
      if (*end || interval < 0.01)
        n = 0;
    }
    if (n < 2 || n > 4) {
      fprintf (stderr, "%s: plot SOCKET FILE.png [SECONDS [INTERVAL]]: "
               "SECONDS >= 0 (0: until the server goes), INTERVAL >= 0.01\n",
               program);
      return EXIT_FAILURE;
    }
    return run_plot (servers[optind + 1], argv[optind + 2], seconds, interval);
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp (argv[optind], commands[i]) == 0) {
      if (optind + 1 >= argc) {
        fprintf (stderr, "%s: %s: which server's socket?\n", program, argv[optind]);
        return EXIT_FAILURE;
      }
      timeout_for (argv[optind]);
      return run_command (argv[optind], servers[optind + 1], argc - optind - 2,
                          argv + optind + 2);
    }
  /* A first word that is no file, no name in the registry and no
   * command: a mistyped command.
   */
  struct stat st;
  if (servers[optind] == argv[optind] && !strchr (argv[optind], '/')
      && stat (argv[optind], &st) == -1)
    return unknown_command (argv[optind]);
  return list_servers (argc - optind, argv + optind, servers + optind,
                       &listing);
}
