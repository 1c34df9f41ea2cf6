/* The backing store of writeback: see backing.h. */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libnbd.h>

#include "backing.h"
#include "monotonic.h"

struct connection {
  pthread_mutex_t lock;         /* guards handle, retry_at_ms, backoff_ms */
  struct nbd_handle *handle;    /* NULL: to be made again */
  uint64_t retry_at_ms;         /* no new connection before (monotonic) */
  uint64_t backoff_ms;          /* the wait after the next failure */
};

/* Waits between attempts to connect again: doubled after each failure
 * (a connection that fails or times out), from the first to the last.
 */
#define BACKOFF_FIRST_MS 1000
#define BACKOFF_LAST_MS 30000

struct backing {
  char *uri;                    /* NULL for a file */
  int fd;                       /* a file, or -1 */
  bool odirect;
  unsigned connection_count;
  struct connection connections[BACKING_CONNECTIONS];
  _Atomic unsigned next_connection;
  atomic_bool can_trim;         /* cleared when the store cannot */

  /* The space map (see backing.h): leaves of BACKING_MAP_LEAF_SECTORS
   * bits, one per sector (1: allocated), each allocated when a run first
   * lands in it and freed when its last run goes; over them a max tree
   * of the longest free run within each leaf, so that the first leaf
   * with room for a run is found in log time.
   */
  pthread_mutex_t map_lock;     /* guards the map and free_sectors */
  uint64_t **leaves;            /* leaf_count bitmaps, NULL: all free */
  uint16_t *longest;            /* the tree: 2 * tree_base nodes, 1 the
                                   root, tree_base + i leaf i's longest
                                   free run (0 past the last leaf) */
  uint16_t *longest_runs;       /* per leaf, how many of its free runs
                                   are that long */
  uint64_t leaf_count, tree_base;
  uint64_t sectors;
  uint64_t free_sectors;
  uint64_t map_bytes;           /* leaves, tree and pointers */

  /* Reads without the stripe lock (see backing.h, READS AND RELEASES):
   * the readers of each of two epochs, and the runs released while
   * readers were about, waiting for them.
   */
  _Atomic unsigned epoch;
  _Atomic uint64_t readers[2];  /* by epoch & 1 */
  pthread_mutex_t release_lock; /* guards releases, the epoch's flips and
                                   draining */
  struct run { uint64_t offset; size_t bytes; } *releases[2];
  size_t release_count[2], release_capacity[2];
  bool draining;                /* epoch - 1's runs wait for its readers */
  unsigned timeout_ms;           /* each NBD request or connection */

  /* ABANDONED REQUESTS (backing.h): the extents that a write or trim
   * given up on may still reach, merged where they overlap; their
   * sectors never go back to the map.
   */
  struct run *abandoned;        /* guarded by map_lock, as are the two
                                   below */
  size_t abandoned_count, abandoned_capacity;
  uint64_t quarantined_bytes;   /* the extents' bytes, in whole sectors */
  atomic_bool quarantine_full_logged;
  atomic_bool cancelled;        /* backing_cancel: every request fails */
  _Atomic uint64_t abandoned_requests;

  /* The store's own failures, logged through log (rate-limited). */
  backing_log_function *log;
  _Atomic int64_t log_second;   /* the second whose lines are counted */
  _Atomic unsigned log_lines;   /* lines logged in it */
  _Atomic uint64_t log_missed;  /* lines not logged since the last one */
  _Atomic uint64_t errors_nospace;
  _Atomic uint64_t errors_io;
  _Atomic uint64_t failed;
  _Atomic uint64_t reconnects;
  _Atomic uint64_t timeouts;
  _Atomic uint64_t corrupt;
};

static int map_init (struct backing *backing, uint64_t sectors);
static void log_line (struct backing *backing, const char *format, ...)
  __attribute__ ((format (printf, 2, 3)));

bool
backing_is_uri (const char *target)
{
  return strncmp (target, "nbd://", 6) == 0 || strncmp (target, "nbds://", 7) == 0
    || strncmp (target, "nbd+unix://", 11) == 0
    || strncmp (target, "nbds+unix://", 12) == 0
    || strncmp (target, "nbd+vsock://", 12) == 0;
}

static char *
message (const char *format, ...)
{
  va_list args;
  char *text = NULL;
  va_start (args, format);
  if (vasprintf (&text, format, args) == -1)
    text = NULL;
  va_end (args);
  return text;
}

/* Drive handle until done (handle) says so, or until deadline_ms: 1 done,
 * 0 the deadline passed, -1 the connection failed.  A server that accepts
 * and never answers costs the deadline, never more.
 */
static int
nbd_wait (struct backing *backing, struct nbd_handle *handle,
          uint64_t deadline_ms,
          int (*done) (struct nbd_handle *handle, int64_t cookie),
          int64_t cookie)
{
  for (;;) {
    int r = done (handle, cookie);
    if (r != 0)
      return r;
    uint64_t now = monotonic_ms ();
    if (now >= deadline_ms || atomic_load (&backing->cancelled))
      return 0;
    /* Slices of 100 ms: backing_cancel is seen that soon. */
    uint64_t left = deadline_ms - now;
    if (nbd_poll (handle, left > 100 ? 100 : (int) left) == -1)
      return -1;
  }
}

static int
connected (struct nbd_handle *handle, int64_t cookie)
{
  (void) cookie;
  if (nbd_aio_is_connecting (handle) == 1)
    return 0;
  return nbd_aio_is_ready (handle) == 1 ? 1 : -1;
}

static int
completed (struct nbd_handle *handle, int64_t cookie)
{
  return nbd_aio_command_completed (handle, cookie);
}

/* A connected handle, or NULL with a message in *error: connecting takes
 * the timeout at most, and never goes past deadline_ms (0: none).
 */
static struct nbd_handle *
nbd_connect (struct backing *backing, uint64_t deadline_ms, char **error)
{
  const char *uri = backing->uri;
  struct nbd_handle *handle = nbd_create ();
  if (!handle) {
    *error = message ("backing: %s", nbd_get_error ());
    return NULL;
  }
  int r = nbd_aio_connect_uri (handle, uri);
  uint64_t until = monotonic_ms () + backing->timeout_ms;
  if (deadline_ms && deadline_ms < until)
    until = deadline_ms;
  if (r == 0)
    r = nbd_wait (backing, handle, until, connected, 0);
  if (r != 1) {
    *error = r == 0
      ? message ("backing: %s: no answer within %u s", uri,
                 backing->timeout_ms / 1000)
      : message ("backing: %s: %s", uri, nbd_get_error ());
    nbd_close (handle);
    return NULL;
  }
  return handle;
}

static int
open_nbd (struct backing *backing, uint64_t *capacity, char **error)
{
  struct nbd_handle *first = nbd_connect (backing, 0, error);
  if (!first)
    return -1;
  int64_t size = nbd_get_size (first);
  if (size < BACKING_SECTOR || nbd_is_read_only (first) == 1) {
    *error = message ("backing: %s: %s", backing->uri,
                      size < 0 ? nbd_get_error ()
                      : size < BACKING_SECTOR ? "the export is too small"
                      : "the export is read-only");
    nbd_close (first);
    return -1;
  }
  if ((uint64_t) size < *capacity)
    *capacity = size;
  backing->can_trim = nbd_can_trim (first) == 1;
  backing->connections[0].handle = first;
  backing->connection_count = 1;
  if (nbd_can_multi_conn (first) == 1) {
    for (unsigned i = 1; i < BACKING_CONNECTIONS; i++) {
      char *ignored = NULL;
      struct nbd_handle *more = nbd_connect (backing, 0, &ignored);
      free (ignored);
      if (!more)
        break;
      backing->connections[i].handle = more;
      backing->connection_count++;
    }
  }
  return 0;
}

/* The process holding an open file description lock on the file whose
 * device and inode are st's: a descriptor of it with an OFDLCK line in
 * its fdinfo.  (The lock itself does not say: F_OFD_GETLK and
 * /proc/locks give -1 for an OFD lock's process.)  0 if none is seen,
 * in a process this one may not look into, say.
 */
static pid_t
lock_holder (const struct stat *st)
{
  DIR *processes = opendir ("/proc");
  if (!processes)
    return 0;
  pid_t holder = 0;
  struct dirent *process;
  while (!holder && (process = readdir (processes))) {
    pid_t pid = atoi (process->d_name);
    if (pid <= 0 || pid == getpid ())
      continue;
    char path[64];
    snprintf (path, sizeof path, "/proc/%d/fd", pid);
    DIR *fds = opendir (path);
    if (!fds)
      continue;
    struct dirent *fd;
    while (!holder && (fd = readdir (fds))) {
      struct stat target;
      snprintf (path, sizeof path, "/proc/%d/fd/%.16s", pid, fd->d_name);
      if (fd->d_name[0] == '.' || stat (path, &target) == -1
          || target.st_dev != st->st_dev || target.st_ino != st->st_ino)
        continue;
      snprintf (path, sizeof path, "/proc/%d/fdinfo/%.16s", pid, fd->d_name);
      FILE *fp = fopen (path, "r");
      char line[256];
      while (fp && fgets (line, sizeof line, fp))
        if (strncmp (line, "lock:", 5) == 0 && strstr (line, "OFDLCK"))
          holder = pid;
      if (fp)
        fclose (fp);
    }
    closedir (fds);
  }
  closedir (processes);
  return holder;
}

/* Lock all of the open file (an OFD write lock, released when it is
 * closed): one server per backing file.  A message in *error if another
 * holds it.
 */
static int
lock_file (int fd, const char *path, char **error)
{
  struct flock whole = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
  if (fcntl (fd, F_OFD_SETLK, &whole) == 0)
    return 0;
  if (errno != EAGAIN && errno != EACCES) {
    *error = message ("backing: %s: cannot lock it: %s", path, strerror (errno));
    return -1;
  }
  struct stat st;
  pid_t holder = fstat (fd, &st) == 0 ? lock_holder (&st) : 0;
  char comm[64] = "";
  if (holder) {
    char comm_path[64];
    snprintf (comm_path, sizeof comm_path, "/proc/%d/comm", holder);
    FILE *fp = fopen (comm_path, "r");
    if (fp && fgets (comm, sizeof comm, fp))
      comm[strcspn (comm, "\n")] = '\0';
    if (fp)
      fclose (fp);
  }
  if (holder)
    *error = message ("backing: %s is in use by another server (process %d, "
                      "%s): two servers writing back to one file would "
                      "overwrite each other's blocks", path, (int) holder,
                      comm[0] ? comm : "?");
  else
    *error = message ("backing: %s is in use by another server (it holds a "
                      "lock on it): two servers writing back to one file "
                      "would overwrite each other's blocks", path);
  return -1;
}

static int
open_file (struct backing *backing, const char *path, uint64_t capacity,
           char **error)
{
  /* A file the server makes or names itself, never one a planted
   * symbolic link points to (the server may run as root): an existing
   * file opened without following a link, a new one created exclusively;
   * a link is followed only to a block device (/dev/disk/by-id/...) or
   * through /proc/self/fd (the process's own descriptors).
   */
  int flags = O_RDWR | O_CLOEXEC | (backing->odirect ? O_DIRECT : 0);
  backing->fd = open (path, flags | O_NOFOLLOW);
  if (backing->fd == -1 && errno == ENOENT)
    backing->fd = open (path, flags | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  else if (backing->fd == -1 && errno == ELOOP) {
    struct stat target;
    if (strncmp (path, "/proc/self/fd/", 14) == 0
        || (stat (path, &target) == 0 && S_ISBLK (target.st_mode)))
      backing->fd = open (path, flags);
    else {
      *error = message ("backing: %s is a symbolic link, and not to a block "
                        "device: name the file itself", path);
      return -1;
    }
  }
  if (backing->fd == -1) {
    *error = message ("backing: %s: %s", path, strerror (errno));
    return -1;
  }
  if (lock_file (backing->fd, path, error) == -1)
    return -1;
  struct stat st;
  if (fstat (backing->fd, &st) == 0 && S_ISREG (st.st_mode)
      && (uint64_t) st.st_size < capacity
      && ftruncate (backing->fd, capacity) == -1) {
    *error = message ("backing: %s: cannot extend it to %" PRIu64 " bytes: %s",
                      path, capacity, strerror (errno));
    return -1;
  }
  backing->can_trim = true;     /* punching holes, where the fs can */
  return 0;
}

struct backing *
backing_open (const char *target, uint64_t capacity, bool odirect,
              unsigned timeout_s, char **error)
{
  *error = NULL;
  struct backing *backing = calloc (1, sizeof *backing);
  if (!backing) {
    *error = message ("backing: %s", strerror (errno));
    return NULL;
  }
  backing->fd = -1;
  backing->odirect = odirect;
  backing->timeout_ms = timeout_s * 1000;
  pthread_mutex_init (&backing->map_lock, NULL);
  pthread_mutex_init (&backing->release_lock, NULL);
  for (unsigned i = 0; i < BACKING_CONNECTIONS; i++) {
    pthread_mutex_init (&backing->connections[i].lock, NULL);
    backing->connections[i].backoff_ms = BACKOFF_FIRST_MS;
  }
  int r;
  if (backing_is_uri (target)) {
    if (odirect) {
      *error = message ("backing: O_DIRECT is for a file, not %s", target);
      backing_close (backing);
      return NULL;
    }
    backing->uri = strdup (target);
    r = backing->uri ? open_nbd (backing, &capacity, error) : -1;
  }
  else
    r = open_file (backing, target, capacity, error);
  if (r == 0)
    r = map_init (backing, capacity / BACKING_SECTOR);
  if (r == -1) {
    if (!*error)
      *error = message ("backing: %s", strerror (errno));
    backing_close (backing);
    return NULL;
  }
  return backing;
}

void
backing_close (struct backing *backing)
{
  if (!backing)
    return;
  for (unsigned i = 0; i < BACKING_CONNECTIONS; i++) {
    if (backing->connections[i].handle) {
      nbd_shutdown (backing->connections[i].handle, 0);
      nbd_close (backing->connections[i].handle);
    }
    pthread_mutex_destroy (&backing->connections[i].lock);
  }
  if (backing->fd >= 0)
    close (backing->fd);
  pthread_mutex_destroy (&backing->map_lock);
  pthread_mutex_destroy (&backing->release_lock);
  free (backing->releases[0]);
  free (backing->releases[1]);
  free (backing->abandoned);
  for (uint64_t i = 0; backing->leaves && i < backing->leaf_count; i++)
    free (backing->leaves[i]);
  free (backing->leaves);
  free (backing->longest);
  free (backing->longest_runs);
  free (backing->uri);
  free (backing);
}

/* ---- the space map --------------------------------------------------- */

#define LEAF_SECTORS BACKING_MAP_LEAF_SECTORS
#define LEAF_WORDS (LEAF_SECTORS / 64)

/* The sectors leaf i covers (the last one may be short). */
static uint32_t
leaf_sectors (const struct backing *backing, uint64_t leaf)
{
  uint64_t left = backing->sectors - leaf * LEAF_SECTORS;
  return left < LEAF_SECTORS ? left : LEAF_SECTORS;
}

static int
map_init (struct backing *backing, uint64_t sectors)
{
  backing->sectors = sectors;
  backing->free_sectors = sectors;
  backing->leaf_count = (sectors + LEAF_SECTORS - 1) / LEAF_SECTORS;
  backing->tree_base = 1;
  while (backing->tree_base < backing->leaf_count)
    backing->tree_base *= 2;
  backing->leaves = calloc (backing->leaf_count ? backing->leaf_count : 1,
                            sizeof *backing->leaves);
  backing->longest = calloc (2 * backing->tree_base, sizeof *backing->longest);
  backing->longest_runs = calloc (backing->leaf_count ? backing->leaf_count : 1,
                                  sizeof *backing->longest_runs);
  if (!backing->leaves || !backing->longest || !backing->longest_runs)
    return -1;
  backing->map_bytes = backing->leaf_count
    * (sizeof *backing->leaves + sizeof *backing->longest_runs)
    + 2 * backing->tree_base * sizeof *backing->longest;
  /* Every leaf free: its longest run is all of it. */
  for (uint64_t i = 0; i < backing->leaf_count; i++) {
    backing->longest[backing->tree_base + i] = leaf_sectors (backing, i);
    backing->longest_runs[i] = 1;
  }
  for (uint64_t node = backing->tree_base; node-- > 1;) {
    uint16_t a = backing->longest[2 * node], b = backing->longest[2 * node + 1];
    backing->longest[node] = a > b ? a : b;
  }
  return 0;
}

/* Set leaf i's longest free run and bring its ancestors up to date. */
static void
tree_set (struct backing *backing, uint64_t leaf, uint16_t longest)
{
  uint64_t node = backing->tree_base + leaf;
  backing->longest[node] = longest;
  for (node /= 2; node >= 1; node /= 2) {
    uint16_t a = backing->longest[2 * node], b = backing->longest[2 * node + 1];
    uint16_t max = a > b ? a : b;
    if (backing->longest[node] == max)
      break;                    /* and so are those above */
    backing->longest[node] = max;
  }
}

/* The first leaf with a free run of count sectors, or leaf_count. */
static uint64_t
tree_find (const struct backing *backing, uint32_t count)
{
  if (backing->longest[1] < count)
    return backing->leaf_count;
  uint64_t node = 1;
  while (node < backing->tree_base)
    node = backing->longest[2 * node] >= count ? 2 * node : 2 * node + 1;
  return node - backing->tree_base;
}

/* The first sector at or after from, below end, whose bit is set (one)
 * or clear (!one); end if none.
 */
static uint32_t
bit_find (const uint64_t *bits, uint32_t from, uint32_t end, bool one)
{
  while (from < end) {
    uint64_t word = bits[from / 64];
    if (!one)
      word = ~word;
    word &= ~0ull << (from % 64);
    if (word) {
      uint32_t at = from / 64 * 64 + __builtin_ctzll (word);
      return at < end ? at : end;
    }
    from = (from / 64 + 1) * 64;
  }
  return end;
}

/* The first sector after the last set bit below end; 0 if none. */
static uint32_t
bit_after_last_one (const uint64_t *bits, uint32_t end)
{
  while (end > 0) {
    uint32_t w = (end - 1) / 64;
    uint64_t word = bits[w];
    if (end - w * 64 < 64)
      word &= (1ull << (end - w * 64)) - 1;
    if (word)
      return w * 64 + 64 - __builtin_clzll (word);
    end = w * 64;
  }
  return 0;
}

/* The first free run of at least count sectors in a leaf of n sectors
 * (n if none), its length in *length: a word at a time over taken and
 * free stretches, stopping there.
 */
static uint32_t
leaf_first_fit (const uint64_t *bits, uint32_t n, uint32_t count,
                uint32_t *length)
{
  for (uint32_t start = bit_find (bits, 0, n, false); start < n;) {
    uint32_t end = bit_find (bits, start, n, true);
    if (end - start >= count) {
      *length = end - start;
      return start;
    }
    start = bit_find (bits, end, n, false);
  }
  return n;
}

/* Look at a whole leaf again: its longest free run, and how many are
 * that long, into the tree.
 */
static void
leaf_measure (struct backing *backing, uint64_t leaf)
{
  const uint64_t *bits = backing->leaves[leaf];
  uint32_t n = leaf_sectors (backing, leaf), longest = 0, runs = 0;
  for (uint32_t start = bit_find (bits, 0, n, false); start < n;) {
    uint32_t end = bit_find (bits, start, n, true);
    if (end - start > longest) {
      longest = end - start;
      runs = 0;
    }
    runs += end - start == longest;
    start = bit_find (bits, end, n, false);
  }
  backing->longest_runs[leaf] = runs;
  tree_set (backing, leaf, longest);
}

/* Set (or clear) the bits of [first, first + count) in a leaf; returns
 * how many changed.
 */
static uint32_t
bits_assign (uint64_t *bits, uint32_t first, uint32_t count, bool set)
{
  uint32_t changed = 0;
  while (count > 0) {
    uint32_t shift = first % 64;
    uint32_t n = 64 - shift < count ? 64 - shift : count;
    uint64_t mask = (n == 64 ? ~0ull : ((1ull << n) - 1)) << shift;
    uint64_t *word = &bits[first / 64];
    changed += __builtin_popcountll (set ? mask & ~*word : mask & *word);
    *word = set ? *word | mask : *word & ~mask;
    first += n;
    count -= n;
  }
  return changed;
}

/* Find a run of count sectors and take it; leaf_count if none.  First
 * fit: the lowest leaf with room, then its first run that fits, so that
 * runs pack at the start of the store and few leaves exist.  The tree
 * and the counts of longest runs are exact (see backing_release); were
 * a leaf to have no run that long after all, it is measured again and
 * the search goes on.
 */
/* gcc 12's -fanalyzer (--enable-analyzer) loses a leaf once it is stored
 * in backing->leaves[] (an array on the heap) and reports it leaked:
 * its leak check is off for map_take and backing_allocate only.
 * backing_close frees every leaf, backing_release each one that empties
 * (test-backing counts them).
 */
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif
static uint64_t
map_take (struct backing *backing, uint32_t count, uint32_t *start)
{
  for (;;) {
    uint64_t leaf = tree_find (backing, count);
    if (leaf == backing->leaf_count)
      return leaf;
    uint32_t n = leaf_sectors (backing, leaf), length = n;
    uint32_t longest = backing->longest[backing->tree_base + leaf];
    uint64_t *bits = backing->leaves[leaf];
    *start = 0;
    if (!bits) {
      /* The bitmap, then the checksums (leaf_sums). */
      bits = calloc (1, BACKING_MAP_LEAF_BYTES);
      if (!bits) {
        errno = ENOMEM;
        return backing->leaf_count;
      }
      backing->leaves[leaf] = bits;
      backing->map_bytes += BACKING_MAP_LEAF_BYTES;
    }
    else if ((*start = leaf_first_fit (bits, n, count, &length)) == n) {
      leaf_measure (backing, leaf);
      continue;
    }
    bits_assign (bits, *start, count, true);
    backing->free_sectors -= count;
    /* Taken from a run shorter than the longest, the longest is still
     * there; from the last of the longest, measure the leaf again.
     */
    if (length == longest && --backing->longest_runs[leaf] == 0)
      leaf_measure (backing, leaf);
    return leaf;
  }
}

int64_t
backing_allocate (struct backing *backing, size_t bytes)
{
  uint64_t count = (bytes + BACKING_SECTOR - 1) / BACKING_SECTOR;
  if (count == 0 || count > LEAF_SECTORS) {
    errno = count ? ENOSPC : EINVAL;     /* runs lie within a leaf */
    return -1;
  }
  uint32_t start = 0;
  errno = ENOSPC;
  pthread_mutex_lock (&backing->map_lock);
  /* A quarter of the store lost to abandoned requests: stop. */
  bool stopped = backing->quarantined_bytes
    > backing->sectors * BACKING_SECTOR / 4;
  uint64_t leaf = stopped ? backing->leaf_count
    : map_take (backing, count, &start);
  uint64_t quarantined_bytes = backing->quarantined_bytes;
  pthread_mutex_unlock (&backing->map_lock);
  if (stopped && !atomic_exchange (&backing->quarantine_full_logged, true))
    log_line (backing, "backing: writeback stopped: %" PRIu64 " bytes of "
              "the store are quarantined behind writes and trims that were "
              "given up on and may still land (a slow or wedged store; see "
              "backing_timeout); blocks stay in RAM; restarting the server "
              "gives the space back", quarantined_bytes);
  if (leaf == backing->leaf_count)
    return -1;                  /* errno ENOSPC, or ENOMEM */
  return (int64_t) ((leaf * LEAF_SECTORS + start) * BACKING_SECTOR);
}
#if __GNUC__ >= 10 && !defined (__clang__)
#pragma GCC diagnostic pop
#endif

/* ---- checksums -------------------------------------------------------- */

/* A leaf's checksums, one per sector, after its bitmap. */
static uint32_t *
leaf_sums (uint64_t *bits)
{
  return (uint32_t *) (bits + LEAF_WORDS);
}

/* CRC-32C (Castagnoli), bitwise with a table made once. */
static uint32_t crc_table[256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void
crc_table_make (void)
{
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = c & 1 ? (c >> 1) ^ 0x82f63b78 : c >> 1;
    crc_table[i] = c;
  }
}

static uint32_t
crc32c (const void *data, size_t length)
{
  pthread_once (&crc_table_once, crc_table_make);
  const unsigned char *p = data;
  uint32_t c = 0xffffffff;
  while (length--)
    c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
  /* Never 0, so that a sector whose checksum was never set is told
   * apart (it reads as a mismatch).
   */
  c = ~c;
  return c ? c : 1;
}

/* The checksum slot of the sector at offset; map_lock held.  NULL if its
 * leaf is not there (nothing was allocated in it).
 */
static uint32_t *
sum_slot (struct backing *backing, uint64_t offset)
{
  uint64_t sector = offset / BACKING_SECTOR;
  if (sector >= backing->sectors)
    return NULL;
  uint64_t *bits = backing->leaves[sector / LEAF_SECTORS];
  return bits ? &leaf_sums (bits)[sector % LEAF_SECTORS] : NULL;
}

void
backing_checksum_set (struct backing *backing, uint64_t offset,
                      const void *bytes, size_t length)
{
  uint32_t sum = crc32c (bytes, length);
  pthread_mutex_lock (&backing->map_lock);
  uint32_t *slot = sum_slot (backing, offset);
  if (slot)
    *slot = sum;
  pthread_mutex_unlock (&backing->map_lock);
}

static int request (struct backing *backing, char op, void *buf, size_t bytes,
                    uint64_t offset, uint64_t deadline_ms);

int
backing_read_block (struct backing *backing, void *buf, size_t length,
                    uint64_t offset)
{
  if (request (backing, 'r', buf, length, offset, 0) == -1)
    return -1;
  pthread_mutex_lock (&backing->map_lock);
  uint32_t *slot = sum_slot (backing, offset);
  uint32_t sum = slot ? *slot : 0;
  pthread_mutex_unlock (&backing->map_lock);
  if (sum != crc32c (buf, length)) {
    atomic_fetch_add (&backing->corrupt, 1);
    errno = EIO;
    return -1;
  }
  return 0;
}

/* ---- requests -------------------------------------------------------- */

/* A connection failed or timed out: drop it, and wait longer each time
 * before making it again.  With connection->lock held.
 */
static void
connection_drop (struct connection *connection)
{
  if (connection->handle) {
    nbd_close (connection->handle);
    connection->handle = NULL;
  }
  connection->retry_at_ms = monotonic_ms () + connection->backoff_ms;
  connection->backoff_ms = connection->backoff_ms * 2 > BACKOFF_LAST_MS
    ? BACKOFF_LAST_MS : connection->backoff_ms * 2;
}

/* A write or trim of [offset, offset + bytes) was sent and given up on:
 * quarantine its extent (backing.h, ABANDONED REQUESTS), merged with the
 * extents it overlaps or touches.
 */
static void
abandon (struct backing *backing, uint64_t offset, size_t bytes)
{
  uint64_t first = offset / BACKING_SECTOR * BACKING_SECTOR;
  uint64_t end = (offset + bytes + BACKING_SECTOR - 1)
    / BACKING_SECTOR * BACKING_SECTOR;
  atomic_fetch_add (&backing->abandoned_requests, 1);
  pthread_mutex_lock (&backing->map_lock);
  for (size_t i = 0; i < backing->abandoned_count;) {
    struct run *extent = &backing->abandoned[i];
    if (extent->offset <= end && first <= extent->offset + extent->bytes) {
      first = first < extent->offset ? first : extent->offset;
      end = end > extent->offset + extent->bytes
        ? end : extent->offset + extent->bytes;
      backing->quarantined_bytes -= extent->bytes;
      *extent = backing->abandoned[--backing->abandoned_count];
      continue;
    }
    i++;
  }
  if (backing->abandoned_count == backing->abandoned_capacity) {
    size_t capacity = backing->abandoned_capacity * 2 + 16;
    struct run *extents = realloc (backing->abandoned,
                                   capacity * sizeof *extents);
    if (!extents) {
      /* Unrecorded, the extent could be handed out again: keep every
       * run from now on instead (space lost, never data).
       */
      first = 0;
      end = backing->sectors * BACKING_SECTOR;
      backing->quarantined_bytes = 0;
      backing->abandoned_count = 0;
    }
    else {
      backing->abandoned = extents;
      backing->abandoned_capacity = capacity;
    }
  }
  backing->abandoned[backing->abandoned_count++]
    = (struct run) { first, end - first };
  backing->quarantined_bytes += end - first;
  pthread_mutex_unlock (&backing->map_lock);
}

/* Does [offset, offset + bytes) meet a quarantined extent?  map_lock
 * held.
 */
static bool
quarantined (const struct backing *backing, uint64_t offset, size_t bytes)
{
  for (size_t i = 0; i < backing->abandoned_count; i++) {
    const struct run *extent = &backing->abandoned[i];
    if (extent->offset < offset + bytes
        && offset < extent->offset + extent->bytes)
      return true;
  }
  return false;
}

/* Run one request on a connection, reconnecting a dead one (with
 * backoff) and retrying once.  Each attempt, connecting included, takes
 * the timeout at most, and none waits past deadline_ms (0: none): a
 * request not answered by then fails and its connection is dropped
 * (nbd_close: libnbd lets go of buf); a write or trim that was sent and
 * not answered is abandoned (its extent quarantined).  op: 'r', 'w',
 * 't' (trim), 'f' (flush).  -1 with errno ETIMEDOUT (no answer in time),
 * ECANCELED (backing_cancel), the server's error, or EIO (no connection).
 */
static int
nbd_request (struct backing *backing, char op, void *buf, size_t bytes,
             uint64_t offset, uint64_t deadline_ms)
{
  unsigned n = atomic_fetch_add (&backing->next_connection, 1)
    % backing->connection_count;
  struct connection *connection = &backing->connections[n];
  int r = -1, err = EIO;
  bool abandoned = false;
  if (mutex_lock_until (&connection->lock, deadline_ms) != 0) {
    errno = ETIMEDOUT;
    return -1;
  }
  for (int attempt = 0; attempt < 2 && r == -1; attempt++) {
    if (atomic_load (&backing->cancelled)) {
      err = ECANCELED;
      break;
    }
    if (connection->handle
        && (nbd_aio_is_dead (connection->handle) == 1
            || nbd_aio_is_closed (connection->handle) == 1))
      connection_drop (connection);
    if (!connection->handle) {
      if (monotonic_ms () < connection->retry_at_ms)
        break;                  /* backing off: EIO */
      char *error = NULL;
      connection->handle = nbd_connect (backing, deadline_ms, &error);
      free (error);
      if (!connection->handle) {
        connection_drop (connection);
        break;
      }
      atomic_fetch_add (&backing->reconnects, 1);
    }
    int64_t cookie;
    switch (op) {
    case 'r':
      cookie = nbd_aio_pread (connection->handle, buf, bytes, offset,
                              NBD_NULL_COMPLETION, 0);
      break;
    case 'w':
      cookie = nbd_aio_pwrite (connection->handle, buf, bytes, offset,
                               NBD_NULL_COMPLETION, 0);
      break;
    case 'f':
      cookie = nbd_aio_flush (connection->handle, NBD_NULL_COMPLETION, 0);
      break;
    default:
      cookie = nbd_aio_trim (connection->handle, bytes, offset,
                             NBD_NULL_COMPLETION, 0);
      break;
    }
    uint64_t until = monotonic_ms () + backing->timeout_ms;
    if (deadline_ms && deadline_ms < until)
      until = deadline_ms;
    int done = cookie == -1 ? -1
      : nbd_wait (backing, connection->handle, until, completed, cookie);
    if (done == 1) {
      r = 0;
      connection->backoff_ms = BACKOFF_FIRST_MS;
      break;
    }
    bool lost = done == 0 || nbd_aio_is_dead (connection->handle) == 1
      || nbd_aio_is_closed (connection->handle) == 1;
    if (cookie != -1 && lost && (op == 'w' || op == 't'))
      abandoned = true;
    if (done == 0) {
      /* No answer in time: this connection is wedged; no second try. */
      err = ETIMEDOUT;
      if (atomic_load (&backing->cancelled))
        err = ECANCELED;
      else
        atomic_fetch_add (&backing->timeouts, 1);
      connection_drop (connection);
      break;
    }
    if (!lost) {
      /* The server's answer: an error that is what it says. */
      err = nbd_get_errno ();
      if (err == 0)
        err = EIO;
      break;
    }
    /* Only a dead connection is worth a second try. */
  }
  pthread_mutex_unlock (&connection->lock);
  /* Recorded before this returns: only the caller releases the run. */
  if (abandoned)
    abandon (backing, offset, bytes);
  if (r == -1)
    errno = err;
  return r;
}

/* pread, pwrite (in full) or fdatasync on the file (through an aligned
 * bounce buffer with O_DIRECT, in whole sectors).  -1 with errno.
 */
static int
file_request (struct backing *backing, char op, void *buf, size_t bytes,
              uint64_t offset)
{
  if (op == 'f')
    return fdatasync (backing->fd);
  void *io = buf;
  size_t length = bytes;
  if (backing->odirect) {
    length = (bytes + BACKING_SECTOR - 1) / BACKING_SECTOR * BACKING_SECTOR;
    int err = posix_memalign (&io, 4096, length);
    if (err != 0) {
      errno = err;
      return -1;
    }
    if (op == 'w') {
      memcpy (io, buf, bytes);
      memset ((char *) io + bytes, 0, length - bytes);
    }
  }
  size_t done = 0;
  int r = 0;
  while (done < length) {
    ssize_t n = op == 'r'
      ? pread (backing->fd, (char *) io + done, length - done, offset + done)
      : pwrite (backing->fd, (char *) io + done, length - done, offset + done);
    if (n <= 0) {
      if (n == -1 && errno == EINTR)
        continue;
      if (n == 0)
        errno = EIO;            /* the file ends early: truncated */
      r = -1;
      break;
    }
    done += n;
  }
  if (io != buf) {
    int saved = errno;
    if (r == 0 && op == 'r')
      memcpy (buf, io, bytes);
    free (io);
    errno = saved;
  }
  return r;
}

/* Log a line about the store, ten a second at most (the rest counted,
 * and said with the next line logged).
 */
#define LOG_LINES_PER_SECOND 10

static void
log_line (struct backing *backing, const char *format, ...)
{
  if (!backing->log)
    return;
  int64_t second = monotonic_ms () / 1000;
  int64_t counted = atomic_load (&backing->log_second);
  if (second != counted
      && atomic_compare_exchange_strong (&backing->log_second, &counted,
                                         second))
    atomic_store (&backing->log_lines, 0);
  if (atomic_fetch_add (&backing->log_lines, 1) >= LOG_LINES_PER_SECOND) {
    atomic_fetch_add (&backing->log_missed, 1);
    return;
  }
  va_list args;
  char *text = NULL;
  va_start (args, format);
  int r = vasprintf (&text, format, args);
  va_end (args);
  if (r == -1)
    return;
  uint64_t missed = atomic_exchange (&backing->log_missed, 0);
  char *line = NULL;
  if (missed == 0
      || asprintf (&line, "%s (and %" PRIu64 " more lines about the backing "
                   "store not logged)", text, missed) == -1)
    line = NULL;
  backing->log (line ? line : text);
  free (line);
  free (text);
}

static const char *
op_name (char op)
{
  switch (op) {
  case 'r': return "read";
  case 'w': return "write";
  case 'f': return "flush";
  default: return "trim";
  }
}

/* A request failed with err: count it, log it as what it is, and give
 * the caller ENOSPC (the store is full) or EIO (anything else).
 */
static void
request_failed (struct backing *backing, char op, size_t bytes,
                uint64_t offset, int err)
{
  atomic_fetch_add (&backing->failed, 1);
  const char *where = backing->uri ? backing->uri : "the backing file";
  bool full = err == ENOSPC || err == EDQUOT || err == EFBIG;
  if (full) {
    atomic_fetch_add (&backing->errors_nospace, 1);
    log_line (backing, "backing: %s of %zu bytes at %" PRIu64 " on %s: the "
              "store is full (%s)", op_name (op), bytes, offset, where,
              strerror (err));
  }
  else {
    atomic_fetch_add (&backing->errors_io, 1);
    if (err == ETIMEDOUT)
      log_line (backing, "backing: %s of %zu bytes at %" PRIu64 " on %s: no "
                "answer in time (backing_timeout=%u)", op_name (op), bytes,
                offset, where, backing->timeout_ms / 1000);
    else if (err != ECANCELED)   /* the server is stopping: not news */
      log_line (backing, "backing: %s of %zu bytes at %" PRIu64 " on %s: %s",
                op_name (op), bytes, offset, where, strerror (err));
  }
  errno = full ? ENOSPC : EIO;
}

static int
request (struct backing *backing, char op, void *buf, size_t bytes,
         uint64_t offset, uint64_t deadline_ms)
{
  int r = backing->uri
    ? nbd_request (backing, op, buf, bytes, offset, deadline_ms)
    : file_request (backing, op, buf, bytes, offset);
  if (r == -1)
    request_failed (backing, op, bytes, offset, errno);
  return r;
}

int
backing_sync (struct backing *backing, uint64_t deadline_ms)
{
  /* One flush: more than one connection is used only where the export
   * offers multi-conn, whose flush covers the writes of them all.
   */
  return request (backing, 'f', NULL, 0, 0, deadline_ms);
}

int
backing_write (struct backing *backing, const void *buf, size_t bytes,
               uint64_t offset, uint64_t deadline_ms)
{
  return request (backing, 'w', (void *) buf, bytes, offset, deadline_ms);
}

void
backing_set_log (struct backing *backing, backing_log_function *log)
{
  backing->log = log;
}

void
backing_cancel (struct backing *backing)
{
  atomic_store (&backing->cancelled, true);
}

unsigned
backing_timeout_ms (const struct backing *backing)
{
  return backing->timeout_ms;
}

unsigned
backing_read_begin (struct backing *backing)
{
  for (;;) {
    unsigned epoch = atomic_load (&backing->epoch);
    atomic_fetch_add (&backing->readers[epoch & 1], 1);
    if (atomic_load (&backing->epoch) == epoch)
      return epoch;
    atomic_fetch_sub (&backing->readers[epoch & 1], 1);   /* it flipped */
  }
}

void
backing_read_end (struct backing *backing, unsigned epoch)
{
  atomic_fetch_sub (&backing->readers[epoch & 1], 1);
}

static void run_free (struct backing *backing, uint64_t offset, size_t bytes);

void
backing_release (struct backing *backing, uint64_t offset, size_t bytes)
{
  /* A reader that could be on the run began before the entry stopped
   * naming it (it looked the entry up under the stripe lock that the
   * change took after it): with no reader about now, none is on it.  An
   * NBD store's runs always wait for the housekeeper: their trim is a
   * request, which the writer that released the run must not wait for.
   */
  if (!backing->uri
      && atomic_load (&backing->readers[0])
         + atomic_load (&backing->readers[1]) == 0) {
    run_free (backing, offset, bytes);
    return;
  }
  pthread_mutex_lock (&backing->release_lock);
  unsigned slot = atomic_load (&backing->epoch) & 1;
  if (backing->release_count[slot] == backing->release_capacity[slot]) {
    size_t capacity = backing->release_capacity[slot] * 2 + 16;
    struct run *runs = realloc (backing->releases[slot],
                                capacity * sizeof *runs);
    if (!runs) {
      /* The run stays allocated: space lost, never data. */
      pthread_mutex_unlock (&backing->release_lock);
      return;
    }
    backing->releases[slot] = runs;
    backing->release_capacity[slot] = capacity;
  }
  backing->releases[slot][backing->release_count[slot]++]
    = (struct run) { offset, bytes };
  pthread_mutex_unlock (&backing->release_lock);
}

/* One step: move the epoch on if runs wait in the current one, and free
 * the previous epoch's runs if its readers are gone; whether it freed.
 */
static bool
settle_step (struct backing *backing)
{
  pthread_mutex_lock (&backing->release_lock);
  unsigned epoch = atomic_load (&backing->epoch);
  if (!backing->draining) {
    if (backing->release_count[epoch & 1] == 0) {
      pthread_mutex_unlock (&backing->release_lock);
      return false;
    }
    /* New readers and releases go to the other slot from now on. */
    atomic_store (&backing->epoch, ++epoch);
    backing->draining = true;
  }
  unsigned old = (epoch - 1) & 1;
  if (atomic_load (&backing->readers[old]) != 0) {
    pthread_mutex_unlock (&backing->release_lock);
    return false;               /* a read of that epoch is still on */
  }
  struct run *runs = backing->releases[old];
  size_t count = backing->release_count[old];
  backing->releases[old] = NULL;
  backing->release_count[old] = backing->release_capacity[old] = 0;
  backing->draining = false;
  pthread_mutex_unlock (&backing->release_lock);
  for (size_t i = 0; i < count; i++)
    run_free (backing, runs[i].offset, runs[i].bytes);
  free (runs);
  return true;
}

void
backing_settle_releases (struct backing *backing)
{
  /* Runs can wait in both slots: the previous epoch's, and the current
   * one's, released while the previous epoch's readers held its slot.
   * With no reader about, two steps free them all (what store_flush
   * promises); no more than two, so that writers releasing without end
   * cannot keep the caller here.
   */
  if (settle_step (backing))
    settle_step (backing);
}

/* Trim a run, then free it in the space map. */
static void
run_free (struct backing *backing, uint64_t offset, size_t bytes)
{
  uint64_t first = offset / BACKING_SECTOR;
  uint64_t count = (bytes + BACKING_SECTOR - 1) / BACKING_SECTOR;
  /* A quarantined run stays allocated, untrimmed (ABANDONED REQUESTS). */
  pthread_mutex_lock (&backing->map_lock);
  bool kept = quarantined (backing, first * BACKING_SECTOR,
                           count * BACKING_SECTOR);
  pthread_mutex_unlock (&backing->map_lock);
  if (kept)
    return;
  /* Trim first, while the run is still allocated: trimmed after it was
   * freed, it could be a new block's run by then, and lose that block.
   * A trim that fails is only space not given back: the run is free in
   * the map whatever the store says, unless the trim was abandoned and
   * may still land (quarantined, below).
   */
  if (atomic_load (&backing->can_trim)) {
    int saved = errno;
    if (backing->uri)
      request (backing, 't', NULL, count * BACKING_SECTOR, offset, 0);
    else if (fallocate (backing->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        offset, count * BACKING_SECTOR) == -1
             && (errno == EOPNOTSUPP || errno == ENODEV))
      atomic_store (&backing->can_trim, false);  /* this file system cannot */
    errno = saved;
  }
  pthread_mutex_lock (&backing->map_lock);
  if (quarantined (backing, first * BACKING_SECTOR, count * BACKING_SECTOR))
    count = 0;                  /* the trim was abandoned: kept */
  while (count > 0 && first < backing->sectors) {
    uint64_t leaf = first / LEAF_SECTORS;
    uint32_t at = first % LEAF_SECTORS, n = leaf_sectors (backing, leaf);
    uint32_t length = count < n - at ? count : n - at;
    uint64_t *bits = backing->leaves[leaf];
    uint32_t freed = bits ? bits_assign (bits, at, length, false) : 0;
    if (freed) {                /* (a leaf that is not there is free) */
      backing->free_sectors += freed;
      /* The free run the freed sectors are part of now: the runs it
       * joined were shorter than it, so the leaf's longest runs are as
       * they were, or this one is one more, or the only one.
       */
      uint32_t run = bit_find (bits, at + length, n, true)
        - bit_after_last_one (bits, at);
      uint32_t longest = backing->longest[backing->tree_base + leaf];
      if (run > longest) {
        longest = run;
        backing->longest_runs[leaf] = 1;
      }
      else if (run == longest)
        backing->longest_runs[leaf]++;
      if (longest == n) {
        /* Its last run went: the leaf goes too. */
        free (bits);
        backing->leaves[leaf] = NULL;
        backing->map_bytes -= BACKING_MAP_LEAF_BYTES;
        backing->longest_runs[leaf] = 1;
      }
      tree_set (backing, leaf, longest);
    }
    first += length;
    count -= length;
  }
  pthread_mutex_unlock (&backing->map_lock);
}

void
backing_stats (struct backing *backing, struct backing_stats *stats)
{
  pthread_mutex_lock (&backing->map_lock);
  stats->capacity = backing->sectors * BACKING_SECTOR;
  stats->used = (backing->sectors - backing->free_sectors) * BACKING_SECTOR;
  stats->map_bytes = backing->map_bytes;
  stats->failed = atomic_load (&backing->failed);
  stats->reconnects = atomic_load (&backing->reconnects);
  stats->quarantined_bytes = backing->quarantined_bytes;
  pthread_mutex_unlock (&backing->map_lock);
  stats->timeouts = atomic_load (&backing->timeouts);
  stats->abandoned = atomic_load (&backing->abandoned_requests);
  stats->errors_nospace = atomic_load (&backing->errors_nospace);
  stats->errors_io = atomic_load (&backing->errors_io);
  stats->corrupt = atomic_load (&backing->corrupt);
}
