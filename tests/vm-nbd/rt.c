/* rt: run a command at a real-time priority (the nbd swap guest's
 * ZRAM_VM_RT experiment; busybox has no chrt).  Built statically on the
 * host:  cc -static -O2 -o rt tests/vm-nbd/rt.c
 *
 * Usage: rt [-f] PRIO COMMAND [ARG]...
 *
 * SCHED_RR (-f: SCHED_FIFO) at PRIO (1-99), then exec COMMAND.  Threads
 * and children inherit the policy (pthreads' default is to inherit the
 * creator's), so every thread of an nbdkit started this way runs at PRIO.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int
main (int argc, char **argv)
{
  int policy = SCHED_RR, i = 1;
  struct sched_param sp;

  if (argc > 1 && strcmp (argv[1], "-f") == 0) {
    policy = SCHED_FIFO;
    i++;
  }
  if (argc - i < 2) {
    fprintf (stderr, "usage: rt [-f] PRIO COMMAND [ARG]...\n");
    return 2;
  }
  memset (&sp, 0, sizeof sp);
  sp.sched_priority = atoi (argv[i]);
  if (sched_setscheduler (0, policy, &sp) == -1) {
    fprintf (stderr, "rt: sched_setscheduler %s %d: %m\n",
             policy == SCHED_RR ? "SCHED_RR" : "SCHED_FIFO", sp.sched_priority);
    return 1;
  }
  execvp (argv[i + 1], argv + i + 1);
  fprintf (stderr, "rt: %s: %m\n", argv[i + 1]);
  return 127;
}
