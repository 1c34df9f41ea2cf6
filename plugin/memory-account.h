/* Where the server's resident memory is: the process's mappings
 * (/proc/self/smaps) sorted by kind, beside what the store counts of its
 * own (store_stats), for the control channel's `memory` command.
 *
 * The kinds, by what the kernel says of each mapping:
 *   - files: mapped files - nbdkit, the plugin, the libraries;
 *   - region: the System V segment of region= ("/SYSV...");
 *   - heap: the C heap - the brk heap ("[heap]") and malloc's other
 *     arenas (an anonymous read-write mapping at the start of a 64 MiB
 *     aligned room whose rest follows it, reserved and inaccessible:
 *     the arena's room to grow);
 *   - stacks: the main thread's ("[stack]") and each other thread's (an
 *     anonymous read-write mapping right above an inaccessible guard
 *     page);
 *   - anonymous: every other anonymous mapping - the pool's page chunks,
 *     the block table, the reserve, whatever mmap gave the rest;
 *   - other: the kernel's own ([vdso], [vvar]).
 * The guard and arena rules are glibc's layout (pthread stacks and
 * malloc heaps); a mapping that fits neither is anonymous.
 *
 * Reading smaps walks every mapping's pages under the process's mmap
 * lock: it is done when asked, never on the housekeeper's round.
 */
#ifndef ZRAM_MEMORY_ACCOUNT_H
#define ZRAM_MEMORY_ACCOUNT_H

#include <stdint.h>
#include <stdio.h>

#include "block-store.h"

struct memory_account {
  uint64_t total;               /* every mapping's Rss */
  uint64_t files, region, heap, stacks, anonymous, other;
  uint64_t stack_count;         /* stacks found (threads, main's too) */
  uint64_t heap_in_use;         /* malloc: allocated (mallinfo2) */
  uint64_t heap_free_held;      /* malloc: free but kept */
};

/* Read /proc/self/smaps into account: 0, or -1 with errno. */
extern int memory_account_take (struct memory_account *account);

/* The `memory` command's reply: the account, what the store counts, and
 * what neither explains.
 */
extern void memory_account_print (const struct memory_account *account,
                                  const struct store_stats *store,
                                  FILE *fp);

#endif /* ZRAM_MEMORY_ACCOUNT_H */
