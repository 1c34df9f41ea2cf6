/* The control channel's insides, shared by control.c (the socket, the
 * clients, their lines, the worker) and control-commands.c (what each
 * command does).  See control.h.
 */
#ifndef ZRAM_CONTROL_INTERNAL_H
#define ZRAM_CONTROL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "block-store.h"
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
  struct block_store *store;    /* what the commands act on */
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

/* control.c: send what the client's reply holds so far (a long reply,
 * in pieces) and start it again.
 */
extern void reply_flush (struct client *client);
/* control.c: "error: ..." into the client's reply; returns -1. */
extern int reply_error (struct client *client, const char *format, ...)
  __attribute__ ((format (printf, 2, 3)));
/* control.c: true while the client is connected and the server is not
 * stopping (a keep_going question for long commands).
 */
extern bool client_still_there (void *opaque);
/* control.c: once the server is stopping, why ("the handover", "the
 * server's exit"): a long command that stops early says so in its
 * reply; NULL before.
 */
extern const char *control_stop_cause (void);

#endif /* ZRAM_CONTROL_INTERNAL_H */
