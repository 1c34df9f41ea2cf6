#!/usr/bin/env bash
# mem_limit: with mem_limit=4M on a 64M device, random (incompressible)
# writes fail with ENOSPC once the pool is full; the data written before
# stays readable; an overwrite refused for memory leaves the old block
# as it was; same-filled writes and zeroing - also of part of a block that
# holds data - need no memory and still work; after trims, writes succeed
# again.  The statistics agree.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh

for opts in "comp=lz4" "comp=zstd free=immediate lock=pool"; do
    echo "== test-plugin-limit: $opts"
    stats="$tmp/stats"
    rm -f "$stats"
    zram_nbdsh 64M mem_limit=4M stats="$stats" $opts <<'EOF'
import errno, os, nbd

B = 4096
K = 1024
M = 1024 * 1024
LIMIT = 4 * M

def expect_enospc(what, fn, *args):
    try:
        fn(*args)
    except nbd.Error as e:
        assert e.errnum == errno.ENOSPC, \
            "%s: errno %r (%s), want ENOSPC" % (what, e.errnum, e)
        return
    raise AssertionError("%s succeeded past the memory limit" % what)

first = os.urandom(M)
h.pwrite(first, 0)
known = (b"a known compressible block %d " % 42) * 200
known = known[:B]
h.pwrite(known, 2 * M)
known_raw = os.urandom(B)
h.pwrite(known_raw, 2 * M + B)

# Fill with random data until a write fails: it must fail with ENOSPC,
# and not before about mem_limit bytes of pool memory were used.
chunks = {}
off = 4 * M
failed_at = None
while off < 64 * M:
    chunk = os.urandom(256 * K)
    try:
        h.pwrite(chunk, off)
    except nbd.Error as e:
        assert e.errnum == errno.ENOSPC, "fill: errno %r (%s), want ENOSPC" % (e.errnum, e)
        failed_at = off
        break
    chunks[off] = chunk
    off += len(chunk)
assert failed_at is not None, "64M of random data fit in mem_limit=4M"
stored = M + 2 * B + (failed_at - 4 * M)
print("first ENOSPC at %d, %d bytes stored before" % (failed_at, stored))
assert stored >= LIMIT // 2, "ENOSPC after only %d bytes" % stored
assert stored <= LIMIT + 256 * K, "%d bytes of random data in a %d limit" % (stored, LIMIT)

# Still full: a random 4 KiB block anywhere fails, again and again.
expect_enospc("write after the limit", h.pwrite, os.urandom(B), 40 * M)
expect_enospc("write after the limit (again)", h.pwrite, os.urandom(B), 40 * M)

# Overwriting stored blocks is refused and leaves them as they were.
expect_enospc("overwrite of a compressed block", h.pwrite, os.urandom(B), 2 * M)
assert h.pread(B, 2 * M) == known, "refused overwrite changed the compressed block"
expect_enospc("overwrite of a raw block", h.pwrite, os.urandom(B), 2 * M + B)
assert h.pread(B, 2 * M + B) == known_raw, "refused overwrite changed the raw block"
expect_enospc("overwrite across two blocks", h.pwrite, os.urandom(2 * B), 2 * M)
assert h.pread(2 * B, 2 * M) == known + known_raw, "refused overwrite changed the blocks"

# Earlier data reads back intact.
assert h.pread(M, 0) == first, "first 1 MiB changed"
for o, c in chunks.items():
    assert h.pread(len(c), o) == c, "chunk at %d changed" % o

# Zeroing part of blocks that hold data needs no memory either, with or
# without NO_HOLE: the compressed block, the raw block, and two random
# blocks of the fill, unaligned.
h.zero(1000, 2 * M + 100)
known = known[:100] + bytes(1000) + known[1100:]
assert h.pread(B, 2 * M) == known, "partial zero of the compressed block"
h.zero(3000, 2 * M + B + 500, nbd.CMD_FLAG_NO_HOLE)
known_raw = known_raw[:500] + bytes(3000) + known_raw[3500:]
assert h.pread(B, 2 * M + B) == known_raw, "partial zero of the raw block"
c = chunks[4 * M]
h.zero(5000, 4 * M + 1234, nbd.CMD_FLAG_NO_HOLE)
h.zero(100, 4 * M + 3 * B + 7)
c = c[:1234] + bytes(5000) + c[6234:3 * B + 7] + bytes(100) + c[3 * B + 107:]
chunks[4 * M] = c
assert h.pread(len(c), 4 * M) == c, "partial zeroes of random blocks"
# Part of never-written blocks: they stay holes.
h.zero(5000, 60 * M + 100, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(8 * K, 60 * M) == bytes(8 * K)
# And the blocks rewritten in place can be overwritten when memory allows
# (below, after the trim).

# Same-filled blocks need no pool memory where the table has their leaf
# (2 MiB around a stored block); zeroes need none anywhere (where the
# table has no leaf and the limit refuses one, the blocks stay holes).
h.pwrite(b"\xab" * B, 2 * M + 4 * B)
assert h.pread(B, 2 * M + 4 * B) == b"\xab" * B
h.pwrite(bytes(2 * B), 50 * M + B)
h.zero(B, 51 * M, nbd.CMD_FLAG_NO_HOLE)
h.zero(B, 51 * M + B)
assert h.pread(2 * B, 51 * M) == bytes(2 * B)
assert h.pread(2 * B, 50 * M + B) == bytes(2 * B)

# Trim the fill: memory comes back and writes succeed again.
h.trim(failed_at + 256 * K - 4 * M, 4 * M)
assert h.pread(64 * K, 4 * M) == bytes(64 * K)
fresh = os.urandom(B)
h.pwrite(fresh, 2 * M)
assert h.pread(B, 2 * M) == fresh
h.pwrite(known, 2 * M + B)
assert h.pread(B, 2 * M + B) == known
again = os.urandom(2 * M)
h.pwrite(again, 8 * M)
assert h.pread(2 * M, 8 * M) == again
assert h.pread(M, 0) == first
print("mem_limit ok")
EOF
    # The statistics (written at exit) agree: limit, peak below it, and
    # the failed writes counted.
    read -r tag _ _ used limit used_max _ < "$stats"
    [ "$tag" = mm_stat ] || fail "stats: first line is not mm_stat"
    [ "$limit" = $((4 * 1024 * 1024)) ] || fail "stats: mem_limit $limit, want 4M"
    [ "$used_max" -le "$limit" ] || fail "stats: mem_used_max $used_max above mem_limit $limit"
    [ "$used" -le "$limit" ] || fail "stats: mem_used_total $used above mem_limit $limit"
    [ "$used_max" -ge $((2 * 1024 * 1024)) ] || fail "stats: mem_used_max $used_max: the pool never filled"
    read -r tag failed_reads failed_writes _ < <(sed -n 2p "$stats")
    [ "$tag" = io_stat ] || fail "stats: second line is not io_stat"
    [ "$failed_writes" -ge 6 ] || fail "stats: failed_writes $failed_writes, want >= 6"
    [ "$failed_reads" = 0 ] || fail "stats: failed_reads $failed_reads"
done

# The block table counts against mem_budget and shrinks: 16,384 NO_HOLE
# zeroes of single blocks 2 MiB apart (each wanting a table leaf) on a
# 1 TiB device with mem_budget=1M all succeed and keep the table within
# the budget; trimmed, the table goes within a couple of seconds (the
# housekeeper reclaims it); data spread the same way and trimmed too.
echo "== test-plugin-limit: block table"
stats="$tmp/stats-table"
export STATS="$stats"
zram_nbdsh 1T mem_budget=1M stats="$stats" <<'EOF'
import errno, os, sys, time, nbd

M = 1024 * 1024
SPREAD = 16384

sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from stats_file import next_stat
def stat(name):
    return next_stat(os.environ["STATS"], name)

for i in range(SPREAD):
    h.zero(4096, i * 2 * M, nbd.CMD_FLAG_NO_HOLE)
for i in range(0, SPREAD, 1001):
    assert h.pread(4096, i * 2 * M) == bytes(4096)
table, used, rss = stat("table_bytes"), stat("limit_used"), stat("process_rss")
print("after %d NO_HOLE zeroes: table %d, limit_used %d, RSS %d" % (SPREAD, table, used, rss))
assert 0 < table <= M and used <= M, "table %d / limit_used %d" % (table, used)
assert rss < 96 * M, "RSS %d" % rss

def trim_spread(count):
    for i in range(count):
        h.trim(4096, i * 2 * M)
    time.sleep(1.2)
    table = stat("table_bytes")
    print("%d blocks trimmed: table %d bytes" % (count, table))
    assert table == 0, "table_bytes %d after trimming everything" % table

trim_spread(SPREAD)

# Data spread one block per 2 MiB until the limit, then trimmed.
data = bytes(range(256)) * 16
n = 0
try:
    while n < SPREAD:
        h.pwrite(data, n * 2 * M)
        n += 1
except nbd.Error as e:
    assert e.errnum == errno.ENOSPC, e
assert n > 8, "only %d blocks stored" % n
for i in range(n):
    assert h.pread(4096, i * 2 * M) == data
trim_spread(n)
EOF

# mem_limit counts the compressed pages only, as zram's does: a block
# table of 8 MiB (1,024 NO_HOLE zeroes 2 MiB apart) beside mem_limit=2M
# refuses nothing and is not in limit_used; random blocks then fill the
# whole limit (the pages, nothing else: limit_used is mem_used_total),
# and the next one is refused with ENOSPC.  (Under mem_budget=2M the
# table alone would not fit: the zeroes would stay holes.)
echo "== test-plugin-limit: mem_limit counts the compressed pages only"
stats="$tmp/stats-pages"
export STATS="$stats"
zram_nbdsh 1T mem_limit=2M stats="$stats" <<'EOF'
import errno, os, sys, nbd

M = 1024 * 1024
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from stats_file import next_stat
def stat(name):
    return next_stat(os.environ["STATS"], name)

for i in range(1024):
    h.zero(4096, i * 2 * M, nbd.CMD_FLAG_NO_HOLE)
table, used = stat("table_bytes"), stat("limit_used")
print("1024 zeroes: table %d bytes, limit_used %d" % (table, used))
assert table >= 4 * M, "table %d bytes: the zeroes were left holes" % table
assert used == 0, "limit_used %d with no data stored" % used
n = 0
try:
    while n < 4096:
        h.pwrite(os.urandom(4096), n * 2 * M + 4096)
        n += 1
except nbd.Error as e:
    assert e.errnum == errno.ENOSPC, e
used, pages = stat("limit_used"), stat("mem_used_total")
print("%d random blocks stored before ENOSPC: limit_used %d, mem_used_total %d"
      % (n, used, pages))
assert n < 4096, "no write refused past mem_limit=2M"
assert used == pages <= 2 * M, "limit_used %d, pages %d" % (used, pages)
assert n * 4096 >= 2 * M * 9 // 10, "only %d blocks in a 2M limit" % n
for i in range(0, n, 37):
    assert h.pread(4096, i * 2 * M) == bytes(4096)
EOF

# A burst of refused writes is logged 10 lines a second at most, then
# the number not logged is said once, with the next failure a second on:
# a device at its limit must not flood the log.
echo "== test-plugin-limit: failures logged 10 a second"
zram_nbdsh 16M mem_limit=1M <<'EOF'
import errno, os, time, nbd

failed = 0
for i in range(600):
    try:
        h.pwrite(os.urandom(4096), i * 4096)
    except nbd.Error as e:
        assert e.errnum == errno.ENOSPC, e
        failed += 1
assert failed >= 50, "only %d writes refused" % failed
time.sleep(1.1)
try:
    h.pwrite(os.urandom(4096), 700 * 4096)
except nbd.Error:
    pass
print("%d writes refused" % failed)
EOF
logged=$(grep -c 'error: write of' "$NBDKIT_STDERR" || :)
[ "$logged" -le 30 ] || fail "$logged refused writes logged (10 a second at most)"
[ "$logged" -ge 10 ] || fail "only $logged refused writes logged"
grep -q 'more failed requests were not logged' "$NBDKIT_STDERR" ||
    fail "the failures not logged were not counted in the log"
