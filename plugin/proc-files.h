/* What the plugin reads from /proc: one home below every user (swap
 * mode, the full-device watch, the stats), each read small and
 * allocation-free so that the full-device watch may call them when
 * memory is gone.
 */
#ifndef ZRAM_PROC_FILES_H
#define ZRAM_PROC_FILES_H

#include <stdint.h>

/* A "Key:   N kB" line's number from /proc/meminfo's text, in KiB, or
 * -1 when the key is missing.
 */
extern int64_t meminfo_kib (const char *text, const char *key);

/* The number of a "Name:   value" line of /proc/self/status, read in
 * base, or -1 (no such line, or no file).
 */
extern int64_t self_status_number (const char *name, int base);

/* The number a /proc/sys file holds, or -1. */
extern int64_t sysctl_number (const char *path);

#endif /* ZRAM_PROC_FILES_H */
