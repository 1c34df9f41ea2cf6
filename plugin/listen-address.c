/* Where this server serves: see listen-address.h. */

#include <arpa/inet.h>
#include <dirent.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "listen-address.h"

/* Sockets of the process looked at: nbdkit listens on a few. */
#define SOCKETS_MAX 256
/* A listening Unix socket: __SO_ACCEPTCON in /proc/net/unix's Flags. */
#define UNIX_ACCEPTING 0x10000
/* TCP_LISTEN in /proc/net/tcp's st. */
#define TCP_LISTENING 0x0A

struct own_sockets {
  unsigned long inodes[SOCKETS_MAX];
  size_t count;
};

static void
own_sockets_find (struct own_sockets *own)
{
  own->count = 0;
  DIR *dir = opendir ("/proc/self/fd");
  if (!dir)
    return;
  struct dirent *entry;
  while ((entry = readdir (dir)) && own->count < SOCKETS_MAX) {
    char link[64];
    ssize_t length = readlinkat (dirfd (dir), entry->d_name, link,
                                 sizeof link - 1);
    if (length <= 0)
      continue;
    link[length] = '\0';
    unsigned long inode;
    if (sscanf (link, "socket:[%lu]", &inode) == 1)
      own->inodes[own->count++] = inode;
  }
  closedir (dir);
}

static bool
own_socket (const struct own_sockets *own, unsigned long inode)
{
  for (size_t i = 0; i < own->count; i++)
    if (own->inodes[i] == inode)
      return true;
  return false;
}

static bool
skipped (const char *path, const char *const *skip)
{
  for (; skip && *skip; skip++)
    if (strcmp (path, *skip) == 0)
      return true;
  return false;
}

static void
address_print (FILE *out, unsigned *count, const char *kind,
               const char *address)
{
  fprintf (out, "%s%s:%s", *count ? " " : "", kind, address);
  ++*count;
}

/* /proc/net/unix: Num RefCount Protocol Flags Type St Inode Path. */
static void
unix_print (FILE *out, const struct own_sockets *own, const char *const *skip,
            unsigned *count)
{
  FILE *fp = fopen ("/proc/net/unix", "re");
  if (!fp)
    return;
  char *line = NULL;
  size_t capacity = 0;
  while (getline (&line, &capacity, fp) != -1) {
    unsigned long flags, inode;
    int path_at = 0;
    if (sscanf (line, "%*s %*s %*s %lx %*s %*s %lu %n", &flags, &inode,
                &path_at) != 2 || !path_at || !(flags & UNIX_ACCEPTING)
        || !own_socket (own, inode))
      continue;
    char *path = line + path_at;
    path[strcspn (path, "\n")] = '\0';
    if (*path && !skipped (path, skip))
      address_print (out, count, "unix", path);
  }
  free (line);
  fclose (fp);
}

/* /proc/net/tcp and tcp6: sl local_address rem_address st tx:rx tr:when
 * retrnsmt uid timeout inode.  An address is the kernel's network-order
 * words printed as host integers (%08X each): read back the same way,
 * they are the address's bytes again.
 */
static void
tcp_print (FILE *out, const struct own_sockets *own, bool six, unsigned *count)
{
  FILE *fp = fopen (six ? "/proc/net/tcp6" : "/proc/net/tcp", "re");
  if (!fp)
    return;
  char *line = NULL;
  size_t capacity = 0;
  while (getline (&line, &capacity, fp) != -1) {
    char hex[33];
    unsigned port, state;
    unsigned long inode;
    if (sscanf (line, "%*s %32[0-9A-Fa-f]:%x %*s %x %*s %*s %*s %*s %*s %lu",
                hex, &port, &state, &inode) != 4
        || state != TCP_LISTENING || !own_socket (own, inode)
        || strlen (hex) != (six ? 32 : 8))
      continue;
    uint32_t words[4];
    for (unsigned w = 0; w < (six ? 4u : 1u); w++) {
      char word[9];
      memcpy (word, hex + 8 * w, 8);
      word[8] = '\0';
      words[w] = (uint32_t) strtoul (word, NULL, 16);
    }
    char text[INET6_ADDRSTRLEN], address[INET6_ADDRSTRLEN + 16];
    if (!inet_ntop (six ? AF_INET6 : AF_INET, words, text, sizeof text))
      continue;
    snprintf (address, sizeof address, six ? "[%s]:%u" : "%s:%u", text, port);
    address_print (out, count, "tcp", address);
  }
  free (line);
  fclose (fp);
}

unsigned
listen_addresses_print (FILE *out, const char *const *skip)
{
  struct own_sockets *own = malloc (sizeof *own);
  if (!own)
    return 0;
  own_sockets_find (own);
  unsigned count = 0;
  unix_print (out, own, skip, &count);
  tcp_print (out, own, false, &count);
  tcp_print (out, own, true, &count);
  free (own);
  return count;
}
