/* `nbdkit-zramctl supervise`: a swap device's server kept running and
 * its device reconnected across restarts (tools/supervise.c).
 */
#ifndef ZRAM_SUPERVISE_H
#define ZRAM_SUPERVISE_H

/* The exit status. */
extern int run_supervise (int argc, char **argv);

#endif /* ZRAM_SUPERVISE_H */
