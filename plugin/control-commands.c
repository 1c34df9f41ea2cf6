/* The control channel's commands (control-commands.h lists them): each
 * parses its words, acts on the client's store and writes its reply to
 * client->out.  Called by control.c, on the control thread or on its
 * worker; they call down into the store and the stats formatters only.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "control-internal.h"
#include "error-text.h"
#include "handover.h"
#include "listen-address.h"
#include "memory-account.h"
#include "metrics.h"
#include "monotonic.h"
#include "stats-file.h"
#include "swap-full.h"
#include "swap-mode.h"
#include "text-parse.h"


static int
parse_number (const char *text, uint64_t *value)
{
  char *end;
  errno = 0;
  unsigned long long number = strtoull (text, &end, 10);
  if (errno || end == text || *end || *text == '-')
    return -1;
  *value = number;
  return 0;
}

/* Progress lines: a long command's first comes at once, the next ones
 * this far apart.
 */
#define PROGRESS_INTERVAL_MS 500

/* A long command's keep_going question (recompress, pack, writeback):
 * whether its client is still there, and, for a client that asked
 * (progress on), a line now and then, before the reply:
 *   progress COMMAND walked=N of=M done=D
 * walked of the M block numbers the command looks at were passed, D
 * blocks were moved (recompressed, packed, written back).  The reply is
 * empty while the command runs, so the line goes out alone.
 */
struct progress_watch {
  struct client *client;
  const char *command;
  const struct store_progress *progress;
  const uint64_t *done;
};

static bool
progress_keep_going (void *opaque)
{
  struct progress_watch *watch = opaque;
  struct client *client = watch->client;
  if (client->progress) {
    uint64_t now = monotonic_ms ();
    if (client->progress_sent_ms == 0
        || now - client->progress_sent_ms >= PROGRESS_INTERVAL_MS) {
      client->progress_sent_ms = now;
      fprintf (client->out, "progress %s walked=%" PRIu64 " of=%" PRIu64
               " done=%" PRIu64 "\n", watch->command, watch->progress->walked,
               watch->progress->to_walk, *watch->done);
      reply_flush (client);
    }
  }
  return client_still_there (client);
}

/* devices: the server's exports, the default first (named -, "" on the
 * wire), one line each: NAME DISKSIZE ALGORITHM LEVEL, then for a device
 * clients=N (connected now: the swap tool's swap off asks), and cap=SIZE
 * and floor=SIZE where it has them.  Under the table's lock
 * (devices_each): the counts are of one moment.
 */
static void
device_line (struct device *device, void *opaque)
{
  FILE *out = opaque;
  fprintf (out, "%s %" PRIu64 " %s %d clients=%u", device->spec.name,
           device->spec.size, codec_name (device->spec.algorithm),
           device->spec.level, device->connections);
  if (device->spec.cap)
    fprintf (out, " cap=%" PRIu64, device->spec.cap);
  if (device->spec.floor)
    fprintf (out, " floor=%" PRIu64, device->spec.floor);
  fputc ('\n', out);
}

static int
command_devices (struct client *client, int argc, char **argv)
{
  fprintf (client->out, "- %" PRIu64 " %s %d\n", client->info->disksize,
           client->info->algorithm, client->info->level);
  devices_each (device_line, client->out);
  return 0;
}

/* add NAME SIZE [comp=A] [level=N] [cap=SIZE] [floor=SIZE]: a device
 * while serving.
 */
static int
command_add (struct client *client, int argc, char **argv)
{
  char value[256], why[256];
  size_t used = snprintf (value, sizeof value, "%s:%s", argv[1], argv[2]);
  for (int i = 3; i < argc && used < sizeof value; i++)
    used += snprintf (value + used, sizeof value - used, ":%s", argv[i]);
  if (used >= sizeof value || strchr (argv[1], ':') || strchr (argv[2], ':'))
    return reply_error (client, "usage: %s", "add NAME SIZE [comp=lz4|zstd] "
                        "[level=N] [cap=SIZE] [floor=SIZE]");
  if (devices_add (value, why, sizeof why) == -1)
    return reply_error (client, "add: %s", why);
  return 0;
}

/* remove NAME [force]: a device no client is connected to, or (force)
 * one whose clients' requests fail from now on.
 */
static int
command_remove (struct client *client, int argc, char **argv)
{
  char why[256];
  bool force = argc == 3;
  if (force && strcmp (argv[2], "force") != 0)
    return reply_error (client, "remove: NAME [force], not '%.32s'", argv[2]);
  if (devices_remove (argv[1], force, why, sizeof why) == -1)
    return reply_error (client, "remove: %s", why);
  return 0;
}

/* progress on|off: this client's progress lines (progress_keep_going). */
static int
command_progress (struct client *client, int argc, char **argv)
{
  if (strcmp (argv[1], "on") != 0 && strcmp (argv[1], "off") != 0)
    return reply_error (client, "progress: '%s' is not on or off", argv[1]);
  client->progress = strcmp (argv[1], "on") == 0;
  return 0;
}

static int
command_info (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  const struct device *device = client->device;
  struct store_stats s;
  store_stats (store, &s);
  fprintf (client->out, "disksize %" PRIu64 "\n",
           device ? device->spec.size : client->info->disksize);
  fprintf (client->out, "algorithm %s\n", device
           ? codec_name (device->spec.algorithm) : client->info->algorithm);
  fprintf (client->out, "level %d\n",
           device ? device->spec.level : client->info->level);
  fprintf (client->out, "mem_limit %" PRIu64 "\n", s.mem_limit);
  fprintf (client->out, "limit_counts %s\n",
           client->info->limit_pages_only ? "pages" : "store");
  fprintf (client->out, "uptime %" PRIu32 "\n", store_now (store));
  fprintf (client->out, "streams %u\n", s.streams);
  /* Where the device is served, as zramctl's MOUNTPOINT. */
  fprintf (client->out, "serves ");
  if (!listen_addresses_print (client->out, client->info->own_sockets))
    fprintf (client->out, "-");
  fprintf (client->out, "\n");
  return 0;
}

static int
command_zram_file (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  if (client->all_devices)
    return stats_print_zram_file_totals (store, argv[0], client->out);
  return stats_print_zram_file (store, argv[0], client->out);
}

static int
command_stats (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  stats_print (store, client->out);
  return 0;
}

static int
command_metrics (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  metrics_print (store, client->out);
  return 0;
}

static int
command_classes (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  store_print_classes (store, client->out);
  return 0;
}

static int
command_memory (struct client *client, int argc, char **argv)
{
  struct memory_account account;
  if (memory_account_take (&account) == -1)
    return reply_error (client, "cannot read /proc/self/smaps: %s",
                        strerror (errno));
  struct store_stats s;
  store_stats (client->store, &s);
  memory_account_print (&account, &s, client->out);
  return 0;
}

static int
command_compact (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  uint64_t pages = store_compact (store);
  store_flush (store);
  size_t contexts = store_release_idle_memory (store);
  fprintf (client->out, "pages_compacted %" PRIu64 "\ncontext_bytes_freed %zu\n",
           pages, contexts);
  return 0;
}

static int
command_idle (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  uint64_t age = 0;
  if (strcmp (argv[1], "all") != 0
      && (parse_number (argv[1], &age) == -1 || age > BLOCK_ATIME_MAX))
    return reply_error (client, "idle: '%s' is neither 'all' nor an age in "
                        "seconds (0..%u)", argv[1], BLOCK_ATIME_MAX);
  uint64_t marked = store_mark_idle (store, age, client_still_there, client);
  fprintf (client->out, "marked %" PRIu64 "\n", marked);
  return 0;
}

static int
command_mem_limit (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  int64_t limit = parse_size (argv[1]);
  if (limit == -1)
    return reply_error (client, "mem_limit: '%s' is not a size (e.g. 512M)",
                        argv[1]);
  if (limit == 0 && swap_mode != SWAP_OFF)
    return reply_error (client, "mem_limit: swap mode needs a limit");
  /* The devices' floors are room kept in the limit: a limit that cannot
   * hold them would refuse every other write (and none turns them off).
   */
  uint64_t floors = atomic_load (&devices_budget ()->floors);
  if (floors && (limit == 0 || (uint64_t) limit < floors))
    return reply_error (client, "mem_limit: %s cannot hold the devices' "
                        "floors (%" PRIu64 " bytes): a floor needs a limit "
                        "above it", argv[1], floors);
  /* The pool checks and sets the limit in one step, after draining its
   * deferred frees, and says what it held when it refused.
   */
  uint64_t held;
  if (store_set_mem_limit (store, limit, &held) == -1) {
    if (errno != ENOSPC)
      return reply_error (client, "mem_limit: %s", error_text (errno));
    return reply_error (client, "mem_limit: %" PRId64 " is below the %"
                        PRIu64 " bytes held now", limit, held);
  }
  return 0;
}

static int
command_mem_used_max (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  if (strcmp (argv[1], "0") != 0)
    return reply_error (client, "mem_used_max: only 0 (a reset) can be written");
  store_reset_mem_used_max (store);
  return 0;
}

/* region=: the server's exit gives the memory up, instead of handing it
 * to the next server.
 */
static int
command_drop (struct client *client, int argc, char **argv)
{
  struct handover_status status;
  handover_status_get (&status);
  if (!status.enabled)
    return reply_error (client, "drop: the device has no region (region=): "
                        "its memory goes with the server anyway");
  handover_drop ();
  return 0;
}

/* Swap mode: the full-device watch asks the OOM killer for nothing for
 * the next SECONDS (swap-full.h: a standby being made ready beside this
 * server); 0 ends the grace asked for before.
 */
static int
command_grace (struct client *client, int argc, char **argv)
{
  uint64_t seconds;
  if (parse_number (argv[1], &seconds) == -1
      || seconds > SWAP_FULL_ASKED_GRACE_MAX_S)
    return reply_error (client, "grace: '%s' is not a number of seconds "
                        "(0..%u)", argv[1], SWAP_FULL_ASKED_GRACE_MAX_S);
  swap_full_grace (SWAP_FULL_GRACE_ASKED,
                   monotonic_ns () + seconds * UINT64_C (1000000000));
  return 0;
}

/* The supervisor's measure of this server's downtime (handover.h): the
 * longest a request to the device waited around the restart.
 */
static int
command_downtime (struct client *client, int argc, char **argv)
{
  uint64_t milliseconds;
  struct handover_status status;
  handover_status_get (&status);
  if (!status.enabled)
    return reply_error (client, "downtime: the device has no region "
                        "(region=): it is never restarted");
  if (parse_number (argv[1], &milliseconds) == -1
      || milliseconds > UINT64_C (86400000))
    return reply_error (client, "downtime: '%s' is not a number of "
                        "milliseconds (0..86400000)", argv[1]);
  handover_downtime_report (milliseconds);
  return 0;
}

/* region=: hand the device over to the next server now and exit (a
 * planned restart: tools/supervise.c), without answering the requests
 * that come meanwhile.  The reply is written before the exit.
 */
static int
command_handover (struct client *client, int argc, char **argv)
{
  if (handover_now (client->store) == -1) {
    if (errno == EINVAL)
      return reply_error (client, "handover: the device has no region "
                          "(region=)");
    /* Its threads are stopped and requests held: it exits, and the next
     * server recovers the region.
     */
    nbdkit_error ("handover: requests did not finish in 30 s: exiting "
                  "without it, the next server recovers the device");
    _exit (EXIT_FAILURE);
  }
  static const char ok[] = "ok\n";
  if (write (client->fd, ok, sizeof ok - 1) < 0) {
    /* The exit says it too: the supervisor sees the server gone. */
  }
  _exit (EXIT_SUCCESS);
}

static int
emit_block_state (void *opaque, const struct store_block_state *state)
{
  struct client *client = opaque;
  /* zram's format: index, access time (s.us), flags s w h i r n. */
  fprintf (client->out, "%12" PRIu64 " %12" PRIu32 ".%06u %c%c%c%c%c%c\n",
           state->block, state->atime, 0u,
           state->same ? 's' : '.', state->written_back ? 'w' : '.',
           state->huge ? 'h' : '.',
           state->idle ? 'i' : '.', state->recompressed ? 'r' : '.',
           state->incompressible ? 'n' : '.');
  if (ftell (client->out) >= 65536) {
    reply_flush (client);
    if (!client_still_there (client))
      return -1;
  }
  return client->gone ? -1 : 0;
}

static int
command_block_state (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  uint64_t first, count;
  if (parse_number (argv[1], &first) == -1 || parse_number (argv[2], &count) == -1)
    return reply_error (client, "block_state: START and COUNT are block numbers");
  store_block_state (store, first, count, emit_block_state, client);
  return 0;
}

/* recompress type=idle|huge|huge_idle [threshold=BYTES] [max_pages=N]
 * [algo=NAME|priority=N], zram's syntax.
 */
static int
command_recompress (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  static const char *const types[] = { NULL, "idle", "huge", "huge_idle" };
  struct store_recompress_request request = { 0 };
  const char *algorithm = NULL;
  unsigned priority = 0;        /* priority= */
  for (int i = 1; i < argc; i++) {
    char *value = strchr (argv[i], '=');
    if (!value)
      return reply_error (client, "recompress: '%s' is not KEY=VALUE", argv[i]);
    *value++ = '\0';
    uint64_t number = 0;
    if (strcmp (argv[i], "type") == 0) {
      for (int t = RECOMPRESS_IDLE; t <= RECOMPRESS_HUGE_IDLE; t++)
        if (strcmp (value, types[t]) == 0)
          request.type = t;
      if (!request.type)
        return reply_error (client, "recompress: type '%s' is not one of "
                            "idle|huge|huge_idle", value);
    }
    else if (strcmp (argv[i], "algo") == 0)
      algorithm = value;
    else if (parse_number (value, &number) == -1)
      return reply_error (client, "recompress: %s: '%s' is not a number",
                          argv[i], value);
    else if (strcmp (argv[i], "threshold") == 0)
      request.threshold = number;
    else if (strcmp (argv[i], "max_pages") == 0)
      request.max_blocks = number;
    else if (strcmp (argv[i], "priority") == 0) {
      if (number > STORE_RECOMP_MAX || !store_recompress_algorithm (store, number))
        return reply_error (client, "recompress: no algorithm has priority "
                            "%" PRIu64, number);
      priority = number;
    }
    else
      return reply_error (client, "recompress: unknown key '%s'", argv[i]);
  }
  if (!request.type)
    return reply_error (client, "recompress: type=idle|huge|huge_idle is needed");
  /* algo= names an algorithm, priority= picks one: either, or both if
   * they agree; a name that is none of the server's is refused whatever
   * else is given.
   */
  request.priority = priority;
  if (algorithm) {
    unsigned named = 0;
    for (unsigned p = 1; p <= STORE_RECOMP_MAX
           && store_recompress_algorithm (store, p); p++)
      if (strcmp (store_recompress_algorithm (store, p), algorithm) == 0) {
        named = p;
        break;
      }
    if (!named)
      return reply_error (client, "recompress: algo=%s is not a recompression "
                          "algorithm (recomp_algorithm=)", algorithm);
    if (priority && priority != named)
      return reply_error (client, "recompress: algo=%s has priority %u, not "
                          "priority=%u", algorithm, named, priority);
    request.priority = named;
  }
  if (!store_recompress_algorithm (store, 1))
    return reply_error (client, "recompress: the server has no recompression "
                        "algorithm (recomp_algorithm=)");
  struct store_recompress_result result;
  struct progress_watch watch = {
    client, argv[0], &result.progress, &result.tried,
  };
  client->progress_sent_ms = 0;
  if (store_recompress (store, &request, progress_keep_going, &watch,
                        &result) == -1)
    return reply_error (client, "recompress: %s", error_text (errno));
  fprintf (client->out, "tried %" PRIu64 "\nrecompressed %" PRIu64
           "\nincompressible %" PRIu64 "\nbytes_saved %" PRIu64 "\n",
           result.tried, result.recompressed, result.incompressible,
           result.bytes_saved);
  return 0;
}

/* pack [type=idle] [max_pages=N]: cold packing of the idle blocks. */
static int
command_pack (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  uint64_t max_blocks = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp (argv[i], "type=idle") == 0)
      continue;
    if (strncmp (argv[i], "max_pages=", 10) != 0
        || parse_number (argv[i] + 10, &max_blocks) == -1)
      return reply_error (client, "pack: '%s' is not type=idle or "
                          "max_pages=N", argv[i]);
  }
  struct store_pack_result result;
  struct progress_watch watch = {
    client, argv[0], &result.progress, &result.blocks,
  };
  client->progress_sent_ms = 0;
  if (store_pack (store, max_blocks, 0, progress_keep_going, &watch, &result)
      == -1)
    return reply_error (client, "pack: %s", error_text (errno));
  fprintf (client->out, "units %" PRIu64 "\nblocks %" PRIu64 "\nbytes_before %"
           PRIu64 "\nbytes_after %" PRIu64 "\n", result.units, result.blocks,
           result.bytes_before, result.bytes_after);
  return 0;
}

/* writeback idle|huge|huge_idle|incompressible|page_index=N|
 * page_indexes=A-B [max_pages=N]: zram's writeback (type= may prefix the
 * first four, as newer kernels take it).
 */
static int
command_writeback (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  static const char *const types[] = {
    [WRITEBACK_IDLE] = "idle", [WRITEBACK_HUGE] = "huge",
    [WRITEBACK_HUGE_IDLE] = "huge_idle",
    [WRITEBACK_INCOMPRESSIBLE] = "incompressible",
  };
  struct store_writeback_request request = {
    .type = WRITEBACK_ANY, .first = 0, .last = UINT64_MAX,
  };
  bool typed = false;
  for (int i = 1; i < argc; i++) {
    const char *word = argv[i];
    uint64_t a, b;
    char *dash;
    if (strncmp (word, "type=", 5) == 0)
      word += 5;
    bool known = false;
    for (int t = WRITEBACK_IDLE; t <= WRITEBACK_INCOMPRESSIBLE; t++)
      if (strcmp (word, types[t]) == 0) {
        request.type = t;
        known = true;
      }
    if (known) {
      typed = true;
      continue;
    }
    if (strncmp (word, "page_index=", 11) == 0
        && parse_number (word + 11, &a) == 0) {
      request.first = request.last = a;
      typed = true;
    }
    else if (strncmp (word, "page_indexes=", 13) == 0
             && (dash = strchr (word + 13, '-')) != NULL) {
      *dash = '\0';
      if (parse_number (word + 13, &a) == -1 || parse_number (dash + 1, &b) == -1
          || a > b)
        return reply_error (client, "writeback: page_indexes=%s-%s is not "
                            "FIRST-LAST", word + 13, dash + 1);
      request.first = a;
      request.last = b;
      typed = true;
    }
    else if (strncmp (word, "max_pages=", 10) == 0
             && parse_number (word + 10, &a) == 0)
      request.max_blocks = a;
    else
      return reply_error (client, "writeback: '%s' is not idle, huge, "
                          "huge_idle, incompressible, page_index=N, "
                          "page_indexes=A-B or max_pages=N", argv[i]);
  }
  if (!typed)
    return reply_error (client, "writeback: say what to write back: idle, huge, "
                        "huge_idle, incompressible, page_index=N or "
                        "page_indexes=A-B");
  if (!store_has_backing (store))
    return reply_error (client, "writeback: the server has no backing store "
                        "(backing=)");
  struct store_writeback_result result;
  struct progress_watch watch = {
    client, argv[0], &result.progress, &result.blocks,
  };
  client->progress_sent_ms = 0;
  int r = store_writeback (store, &request, progress_keep_going, &watch,
                           &result);
  /* Stopped by the server's stop (its keep_going question, or its
   * backing request cut short), not by the store: say so, not as a
   * failure of the store's (its cut request is no timeout).
   */
  const char *cause = control_stop_cause ();
  if (cause) {
    nbdkit_error ("ctl: writeback cut short by %s: %" PRIu64 " blocks (%"
                  PRIu64 " bytes) written back before it, the rest stay "
                  "in RAM", cause, result.blocks, result.bytes);
    return reply_error (client, "writeback: cut short by %s: %" PRIu64
                        " blocks (%" PRIu64 " bytes) written back before "
                        "it, the rest stay in RAM", cause, result.blocks,
                        result.bytes);
  }
  if (r == -1 && !result.limited && !result.backing_full)
    return reply_error (client, "writeback: %s (%" PRIu64 " blocks written "
                        "back before)", error_text (errno), result.blocks);
  fprintf (client->out, "blocks %" PRIu64 "\nbytes %" PRIu64 "\n",
           result.blocks, result.bytes);
  if (result.limited)
    fprintf (client->out, "stopped writeback_limit\n");
  if (result.backing_full)
    fprintf (client->out, "stopped backing_full\n");
  return 0;
}

/* writeback_limit [SIZE|off]: zram's writeback_limit and
 * writeback_limit_enable in one.  SIZE (bytes, with suffixes; 0: nothing
 * more may be written back) sets the limit and enables it, off disables
 * it; either way, and with no argument, the reply says the limit now:
 * what writeback may still write, as zram's writeback_limit reads.
 */
static int
command_writeback_limit (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  bool limited = true;
  int64_t bytes = 0;
  if (argc == 2) {
    if (strcmp (argv[1], "off") == 0)
      limited = false;
    else if (!*argv[1] || (bytes = parse_size (argv[1])) == -1)
      return reply_error (client, "writeback_limit: '%s' is not a size or off "
                          "(e.g. 512M, 0: nothing more is written back)",
                          argv[1]);
  }
  if (!store_has_backing (store))
    return reply_error (client, "writeback_limit: the server has no backing "
                        "store (backing=)");
  if (argc == 2 && store_set_writeback_limit (store, limited, bytes) == -1)
    return reply_error (client, "writeback_limit: %s", error_text (errno));
  struct store_stats s;
  store_stats (store, &s);
  if (s.writeback_limit_left == UINT64_MAX)
    fprintf (client->out, "writeback_limit off\n");
  else
    fprintf (client->out, "writeback_limit %" PRIu64 "\n",
             s.writeback_limit_left);
  return 0;
}

/* dissolve PERCENT: units with fewer live blocks go. */
static int
command_dissolve (struct client *client, int argc, char **argv)
{
  struct block_store *store = client->store;
  uint64_t percent;
  if (parse_number (argv[1], &percent) == -1 || percent > 100)
    return reply_error (client, "dissolve: '%s' is not a percentage", argv[1]);
  fprintf (client->out, "dissolved %" PRIu64 "\n",
           store_pack_dissolve (store, percent, client_still_there, client));
  return 0;
}

static int command_help (struct client *client, int argc, char **argv);

const struct control_command control_commands[] = {
#define COMMAND_ENTRY(name, min_words, max_words, usage, run, worker_words, \
                      reads_only) \
  { #name, min_words, max_words, usage, run, worker_words, reads_only },
  CONTROL_COMMANDS (COMMAND_ENTRY)
#undef COMMAND_ENTRY
};
const size_t control_command_count
  = sizeof control_commands / sizeof control_commands[0];

static int
command_help (struct client *client, int argc, char **argv)
{
  for (size_t i = 0; i < control_command_count; i++)
    fprintf (client->out, "%s\n", control_commands[i].usage);
  return 0;
}

