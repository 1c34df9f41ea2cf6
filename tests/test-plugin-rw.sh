#!/usr/bin/env bash
# Reads and writes through nbdsh against the plugin, checked against a
# model of the device in Python: start, middle (unaligned), end (the
# device size is not a multiple of 4 KiB), spanning block boundaries,
# partial blocks, random / compressible / same-filled data, overwrites
# that switch a block between stored kinds, and never-written areas.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh

size=$((8 * 1024 * 1024 + 1234))
export size

rw_test ()
{
    echo "== test-plugin-rw: $*"
    zram_nbdsh "$size" "$@" <<'EOF'
import os, random

size = int(os.environ["size"])
B = 4096
assert h.get_size() == size, (h.get_size(), size)
model = bytearray(size)
rng = random.Random(1234)
checks = 0

def write(data, offset):
    data = bytes(data)
    h.pwrite(data, offset)
    model[offset:offset + len(data)] = data

def check(count, offset):
    global checks
    got = h.pread(count, offset)
    want = bytes(model[offset:offset + count])
    if got != want:
        bad = next(i for i in range(count) if got[i] != want[i])
        raise AssertionError("mismatch at %d (+%d): got %r want %r"
                             % (offset + bad, bad, got[bad:bad+16], want[bad:bad+16]))
    checks += 1

def rand(n):
    return os.urandom(n)

def text(n):
    base = b"The quick brown fox jumps over the lazy dog %d. " % rng.randrange(1000)
    return (base * (n // len(base) + 1))[:n]

def word(n, w=b"\x01\x23\x45\x67\x89\xab\xcd\xef"):
    return (w * (n // len(w) + 1))[:n]

# Never written: zeros everywhere, including the partial last block.
assert h.pread(B, 0) == bytes(B)
assert h.pread(size - 8 * 1024 * 1024, 8 * 1024 * 1024) == bytes(size - 8 * 1024 * 1024)
assert h.pread(65536, 3 * 1024 * 1024 + 17) == bytes(65536)

# Start of the device.
write(rand(B), 0); check(B, 0)
write(text(3 * B), B); check(4 * B, 0)

# Middle, unaligned (+1), several blocks.
mid = size // 2 + 1
write(rand(3 * B + 100), mid); check(3 * B + 100, mid)
check(5 * B, mid - B - 1)          # with the untouched neighbours (zeros)

# End of the device: the last bytes, the last partial block, across
# the last block boundary.
write(rand(511), size - 511); check(511, size - 511)
write(text(1), size - 1); check(1, size - 1)
last_block = (size - 1) // B * B
write(text(size - last_block + 700), last_block - 700)
check(size - (last_block - 2 * B), last_block - 2 * B)

# Spanning a block boundary with a few bytes either side.
for boundary in (B, 10 * B, 100 * B):
    write(rand(2), boundary - 1); check(8, boundary - 4)
    write(text(200), boundary - 100); check(400, boundary - 200)

# Partial blocks: head, tail, inside, single bytes, into empty blocks
# and into stored ones of each kind.
base = 200 * B
write(rand(B), base)                       # raw (incompressible)
write(text(B), base + B)                   # compressed
write(b"\xab" * B, base + 2 * B)           # same-filled byte
write(word(B), base + 3 * B)               # same-filled 8-byte word
for i in range(4):
    blk = base + i * B
    write(rand(1), blk); write(rand(1), blk + B - 1)
    write(text(100), blk + 1000); write(rand(7), blk + 2047)
    check(B, blk)
write(b"\x00" * 10, base + 5 * B + 5)       # partial zeros into an empty block
check(6 * B, base)

# Random, compressible and same-filled data, 1 MiB of each kind.
region = 1024 * 1024
write(rand(region), region); check(region, region)
write(text(region), 2 * region); check(region, 2 * region)
write(b"\xab" * region, 3 * region); check(region, 3 * region)
write(word(region), 4 * region); check(region, 4 * region)
# Same-filled with a word that is not a repeated byte, unaligned.
write(word(3 * B, b"ABCDEFGH"), 5 * region + 3); check(3 * B + 10, 5 * region)

# Overwrite compressible with incompressible and back, same-filled with
# data and back, data with zeros.
o = 6 * region
for data in (text(16 * B), rand(16 * B), text(16 * B), b"\xab" * 16 * B,
             rand(16 * B), word(16 * B), bytes(16 * B), rand(16 * B),
             bytes(16 * B), text(16 * B)):
    write(data, o); check(16 * B, o)

# Random small writes all over, then check everything.
for _ in range(300):
    n = rng.choice((1, 7, 512, 4095, 4096, 4097, 9000))
    off = rng.randrange(0, size - n + 1)
    kind = rng.randrange(4)
    data = rand(n) if kind == 0 else text(n) if kind == 1 else \
        word(n) if kind == 2 else bytes(n)
    write(data, off)
    if rng.randrange(4) == 0:
        check(n, off)

# Multi-conn: what one connection writes, another reads at once.
import nbd
hs = [h] + [nbd.NBD() for _ in range(3)]
for x in hs[1:]:
    x.connect_uri(h.get_uri())
assert all(x.can_multi_conn() for x in hs)
data = rand(3 * B + 5)
hs[1].pwrite(data, 7 * region + 11)
model[7 * region + 11:7 * region + 11 + len(data)] = data
hs[1].flush()
check(4 * B, 7 * region)
assert hs[2].pread(len(data), 7 * region + 11) == data

# Concurrent partial writes of the same blocks (disjoint bytes), from
# four connections with many requests in flight each: none may lose
# another's bytes (read-modify-write under the block's lock).
conc = 7 * region + 64 * B
for rnd in range(6):
    bufs = []
    piece = (64, 100, 512, 1000, 4096 // 3, 7)[rnd]
    for blk in range(16):
        start = conc + blk * B
        pos, i = 0, 0
        while pos < B:
            n = min(piece, B - pos)
            d = rand(n) if (i + rnd) % 3 else text(n)
            buf = nbd.Buffer.from_bytearray(bytearray(d))
            conn = (blk + i) % 4
            bufs.append((conn, buf, hs[conn].aio_pwrite(buf, start + pos)))
            model[start + pos:start + pos + n] = d
            pos += n
            i += 1
    for x in hs:
        while x.aio_in_flight() > 0:
            x.poll(-1)
    for conn, buf, cookie in bufs:
        # True when done; raises nbd.Error if the write failed.
        assert hs[conn].aio_command_completed(cookie), "write %d not done" % cookie
    check(16 * B, conc)
for x in hs[1:]:
    x.shutdown()

# The whole device, 1 MiB at a time.
pos = 0
while pos < size:
    n = min(region, size - pos)
    check(n, pos)
    pos += n

# Flush and cache are accepted.
h.flush()
h.cache(B, 0)
print("rw ok: %d checks" % checks)
EOF
}

rw_test comp=lz4
rw_test comp=zstd
rw_test comp=zstd level=9 lock=pool free=immediate chain=4
rw_test comp=lz4 level=100 chain=1
