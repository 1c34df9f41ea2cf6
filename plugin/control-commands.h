/* The control channel's commands, described once: control.c runs them,
 * nbdkit-zramctl(1) offers them (tools/nbdkit-zramctl.c), and `help`
 * prints their usage.  man/nbdkit-zramctl.pod is the specification.
 *
 * COMMAND (name, min_words, max_words, usage, run, worker_words,
 * reads_only): the words counted with the name; run, control.c's
 * function; with worker_words words or more (the name too) the command
 * may wait for the backing store, or for a writeback run that waits for
 * it, and runs on control.c's worker (THE WORKER there; 0: always on the
 * control thread).  Setting the writeback limit waits for a writeback
 * run in progress (the automatic policy's too); reading it does not.
 * reads_only: the command changes nothing and tells nothing of the
 * data's use (block_state does: which blocks were read when), so the
 * read-only socket (ctl_ro=) answers it and nbdkit-zramctl gives it a
 * short deadline.
 */
#ifndef ZRAM_CONTROL_COMMANDS_H
#define ZRAM_CONTROL_COMMANDS_H

#define CONTROL_COMMANDS(COMMAND) \
  COMMAND (info, 1, 1, "info", command_info, 0, true) \
  COMMAND (devices, 1, 1, "devices", command_devices, 0, true) \
  COMMAND (add, 3, 7, "add NAME SIZE [comp=lz4|zstd] [level=N] [cap=SIZE] [floor=SIZE]", \
           command_add, 0, false) \
  COMMAND (remove, 2, 3, "remove NAME [force]", command_remove, 0, false) \
  COMMAND (mm_stat, 1, 1, "mm_stat", command_zram_file, 0, true) \
  COMMAND (io_stat, 1, 1, "io_stat", command_zram_file, 0, true) \
  COMMAND (bd_stat, 1, 1, "bd_stat", command_zram_file, 0, true) \
  COMMAND (stats, 1, 1, "stats", command_stats, 0, true) \
  COMMAND (metrics, 1, 1, "metrics", command_metrics, 0, true) \
  COMMAND (classes, 1, 1, "classes", command_classes, 0, true) \
  COMMAND (memory, 1, 1, "memory", command_memory, 0, true) \
  COMMAND (compact, 1, 1, "compact", command_compact, 0, false) \
  COMMAND (idle, 2, 2, "idle all|SECONDS", command_idle, 0, false) \
  COMMAND (mem_limit, 2, 2, "mem_limit SIZE", command_mem_limit, 0, false) \
  COMMAND (mem_used_max, 2, 2, "mem_used_max 0", command_mem_used_max, 0, false) \
  COMMAND (block_state, 3, 3, "block_state START COUNT", \
           command_block_state, 0, false) \
  COMMAND (recompress, 2, 5, "recompress type=idle|huge|huge_idle " \
           "[threshold=BYTES] [max_pages=N] [algo=NAME|priority=N]", \
           command_recompress, 0, false) \
  COMMAND (pack, 1, 3, "pack [type=idle] [max_pages=N]", command_pack, 0, false) \
  COMMAND (dissolve, 2, 2, "dissolve PERCENT", command_dissolve, 0, false) \
  COMMAND (writeback, 2, 3, "writeback idle|huge|huge_idle|incompressible|" \
           "page_index=N|page_indexes=A-B [max_pages=N]", \
           command_writeback, 2, false) \
  COMMAND (writeback_limit, 1, 2, "writeback_limit [SIZE|off]", \
           command_writeback_limit, 2, false) \
  COMMAND (drop, 1, 1, "drop", command_drop, 0, false) \
  COMMAND (grace, 2, 2, "grace SECONDS", command_grace, 0, false) \
  COMMAND (downtime, 2, 2, "downtime MILLISECONDS", command_downtime, 0, false) \
  COMMAND (handover, 1, 1, "handover", command_handover, 0, false) \
  COMMAND (progress, 2, 2, "progress on|off", command_progress, 0, true) \
  COMMAND (help, 1, 1, "help", command_help, 0, true)

#endif /* ZRAM_CONTROL_COMMANDS_H */
