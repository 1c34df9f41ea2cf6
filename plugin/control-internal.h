/* The control channel's insides, in three layers, each calling only
 * down: control.c (the thread, its sockets, the clients' lines, the
 * worker) runs control-commands.c's commands (what each does), and both
 * send through control-client.c (replies, and the stop every wait
 * watches).  See control.h.
 */
#ifndef ZRAM_CONTROL_INTERNAL_H
#define ZRAM_CONTROL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "block-store.h"
#include "devices.h"
#include "control.h"
#include "control-commands.h"

#define CONTROL_LINE_MAX 1024

/* A connected client: what it sent that is not a whole line yet, and
 * the reply being built for it.  Owned by the control thread, except
 * while its command runs on the worker (on_worker): then the worker owns
 * gone, out, reply and the line being run, and the control thread
 * leaves the whole client alone (does not poll, read, close or evict
 * it) until it has joined the worker.
 */
struct client {
  int fd;                       /* non-blocking; -1: a free slot */
  struct block_store *store;    /* what the commands act on: the
                                   default export's store, or the
                                   device= of the line being run */
  struct device *device;  /* that device, or NULL: the default */
  bool all_devices;       /* device=*: the server's totals (mm_stat,
                             io_stat, bd_stat) */
  const struct control_info *info;
  bool gone;                    /* hung up, a send failed or timed out */
  bool read_only;               /* came in on ctl_ro=: reads_only commands */
  bool on_worker;               /* its current line runs on the worker */
  bool progress;                /* asked for progress lines (progress on) */
  uint64_t progress_sent_ms;    /* when its last progress line went */
  char *reply;                  /* open_memstream buffer */
  size_t reply_length;
  FILE *out;
  char line[CONTROL_LINE_MAX];
  size_t used;                  /* bytes in line */
  uint64_t last_heard_ms;       /* when it last sent something */
  uint64_t last_line_ms;        /* when it last finished a line (or
                                   connected): who gives up its place */
  uint64_t line_started_ms;     /* when the first byte of the line not
                                   yet finished came; 0: none */
};

struct control_command {
  const char *name;
  int min_words, max_words;     /* with the name */
  const char *usage;
  int (*run) (struct client *client, int argc, char **argv);
  int worker_words;             /* see control-commands.h */
  bool reads_only;              /* the same */
};
/* control-commands.c: the table, made from CONTROL_COMMANDS. */
extern const struct control_command control_commands[];
extern const size_t control_command_count;

/* control-client.c, below both: the replies and the stop.  Send what
 * the client's reply holds so far (a long reply, in pieces) and start it
 * again.
 */
extern void reply_flush (struct client *client);
/* "error: ..." into the client's reply; returns -1. */
extern int reply_error (struct client *client, const char *format, ...)
  __attribute__ ((format (printf, 2, 3)));
/* True while the client is connected and the server is not stopping (a
 * keep_going question for long commands).
 */
extern bool client_still_there (void *opaque);
/* Once the server is stopping, why ("the handover", "the server's
 * exit"): a long command that stops early says so in its reply; NULL
 * before.
 */
extern const char *control_stop_cause (void);
/* The stop, for control.c: the wake pipe made (0, or -1 with errno) and
 * closed; its read end, readable once client_io_wake wrote to it (every
 * wait of the channel watches it); the stop set, with its cause (under
 * control.c's worker_lock), and read.
 */
extern int client_io_open (void);
extern void client_io_close (void);
extern int client_io_wake_fd (void);
extern void client_io_wake (void);
extern void client_io_stop (const char *cause);
extern bool client_io_stopping (void);

#endif /* ZRAM_CONTROL_INTERNAL_H */
