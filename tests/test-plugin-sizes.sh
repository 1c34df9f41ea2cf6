#!/usr/bin/env bash
# Device sizes from 1 byte to 2^63-1: nbdinfo reports the size, and
# writes at the start and the very end read back.  The 2^63-1 byte device
# must cost (almost) no memory: the block table is sparse.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh nbdinfo

huge=9223372036854775807

# 2M+1 and 1G+4097: one block past a level of the block table (512
# and 512^2 blocks), where an off-by-one would alias block 0.
for size in 1 4095 4096 4097 130000 2097153 16M 1073745921 $huge; do
    echo "== test-plugin-sizes: size=$size"
    case "$size" in
        16M) bytes=$((16 * 1024 * 1024)) ;;
        *) bytes=$size ;;
    esac

    # nbdinfo --size, with the key spelled out and as the magic key.
    got="$(zram_nbdkit -U - "$PLUGIN" size="$size" --run 'nbdinfo --size "$uri"')"
    [ "$got" = "$bytes" ] || fail "size=$size: nbdinfo --size says '$got', want $bytes"
    got="$(zram_nbdkit -U - "$PLUGIN" "$size" comp=zstd --run 'nbdinfo --size "$uri"')"
    [ "$got" = "$bytes" ] || fail "$size (magic key): nbdinfo --size says '$got', want $bytes"

    export bytes pidfile="$tmp/nbdkit.pid"
    rm -f "$pidfile"
    zram_nbdsh "$size" -P "$pidfile" <<'EOF'
import os

size = int(os.environ["bytes"])
assert h.get_size() == size, (h.get_size(), size)

def rw(offset, count, tag):
    data = bytes((offset + i * 7 + tag) % 251 for i in range(count))
    assert h.pread(count, offset) == bytes(count), "not zeros before write"
    h.pwrite(data, offset)
    got = h.pread(count, offset)
    assert got == data, "read back differs at %d+%d" % (offset, count)

n = min(size, 511)
rw(0, n, 1)
if size > n:
    rw(size - n, n, 2)
    assert h.pread(n, 0) == bytes((i * 7 + 1) % 251 for i in range(n))
if size > 1000000001 + 4096:
    rw(1000000001, 4096, 3)
    rw(size // 2 - 100, 300, 4)
    # Untouched areas near the writes are zeros.
    assert h.pread(4096, size - n - 4096) == bytes(4096)
    assert h.pread(512, 1000000001 + 4096) == bytes(512)

# Beyond the end: the server refuses (libnbd's own check turned off).
import nbd
h.set_strict_mode(h.get_strict_mode() & ~nbd.STRICT_BOUNDS)
for (count, offset) in ((1, size), (n + 1, size - n)):
    for what in ("read", "write"):
        try:
            if what == "read":
                h.pread(count, offset)
            else:
                h.pwrite(b"x" * count, offset)
        except nbd.Error:
            pass
        else:
            raise AssertionError("%s of %d at %d past the end succeeded"
                                 % (what, count, offset))
# The failed write past the end changed nothing.
if size > n:
    assert h.pread(n, size - n) == bytes((size - n + i * 7 + 2) % 251 for i in range(n))

# Resident memory of the server stays small (sparse table), checked in
# builds without sanitizers (their shadow memory counts as RSS).
if os.environ["SANITIZERS"] == "no":
    pid = int(open(os.environ["pidfile"]).read())
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    print("size %d: nbdkit RSS %d KiB" % (size, rss_kib))
    assert rss_kib < 64 * 1024, "nbdkit RSS %d KiB for a %d byte device" % (rss_kib, size)
EOF
done
