#!/usr/bin/env bash
# Trim and zero: what reads back, and what the extents say afterwards.
#   trim frees whole 4 KiB blocks only (a partial head/tail is left as is);
#   zero may trim (no NO_HOLE flag): whole blocks become holes;
#   zero with NBD_CMD_FLAG_NO_HOLE: whole blocks are stored zeros ("zero");
#   zero's partial head/tail are rewritten to zeros, the rest kept;
#   extents: never written/trimmed = hole,zero; written zeros = zero;
#   anything else = data.
# And nbdinfo --can for every capability the plugin claims.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh nbdinfo

for comp in lz4 zstd; do
    echo "== test-plugin-trim-zero: comp=$comp"
    map="$tmp/map.$comp"
    py="$tmp/setup.py"
    cat > "$py" <<'EOF'
import os, nbd

B = 4096
K = 1024
model = bytearray(h.get_size())

def write(data, offset, flags=0):
    h.pwrite(data, offset, flags)
    model[offset:offset + len(data)] = data

def check(count, offset, what):
    got = h.pread(count, offset)
    want = bytes(model[offset:offset + count])
    if got != want:
        bad = next(i for i in range(count) if got[i] != want[i])
        raise AssertionError("%s: mismatch at byte %d: got %r want %r"
                             % (what, offset + bad, got[bad:bad+8], want[bad:bad+8]))

def zeros_in_model(count, offset):
    model[offset:offset + count] = bytes(count)

# 0..64K: random data (16 blocks)
write(os.urandom(64 * K), 0)
check(64 * K, 0, "initial data")

# Trim 16K..32K: reads zeros, extents hole,zero.
h.trim(16 * K, 16 * K)
zeros_in_model(16 * K, 16 * K)
check(64 * K, 0, "after trim")
assert h.pread(16 * K, 16 * K) == bytes(16 * K)

# Zero with NO_HOLE 32K..48K: the plugin gets no MAY_TRIM, stores zero
# blocks: extents "zero" (not a hole).
h.zero(16 * K, 32 * K, nbd.CMD_FLAG_NO_HOLE)
zeros_in_model(16 * K, 32 * K)
check(64 * K, 0, "after zero NO_HOLE")

# Plain zero 48K..56K: may trim: extents hole,zero.
h.zero(8 * K, 48 * K)
zeros_in_model(8 * K, 48 * K)
check(64 * K, 0, "after zero")
# 56K..64K stay data.

# 128K..136K: written zeros (pwrite): stored zero blocks: "zero".
write(bytes(8 * K), 128 * K)
# 136K..140K: a same-filled block that is not zero: data.
write(b"\xab" * B, 136 * K)
# 140K..144K: a repeated 8-byte word: data.
write(b"\x00\x00\x00\x00\x00\x00\x00\x01" * (B // 8), 140 * K)
check(16 * K, 128 * K, "same-filled")

# Partial trim of 200K+100 .. 200K+100+8K over data blocks 50..52: only
# block 51 is whole: freed; the head of block 50 and tail of block 52
# keep their data.
write(os.urandom(3 * B), 200 * K)
h.trim(2 * B, 200 * K + 100)
zeros_in_model(B, 204 * K)          # block 51 only
check(3 * B, 200 * K, "after partial trim")
assert h.pread(100, 200 * K + 100) != bytes(100), "trim zeroed a partial head"

# A trim smaller than a block changes nothing.
write(os.urandom(B), 256 * K)
h.trim(B - 1, 256 * K)
h.trim(2000, 256 * K + 1000)
check(B, 256 * K, "after sub-block trim")

# Partial zero inside a data block: only those bytes become zeros.
write(os.urandom(B), 300 * K)
h.zero(100, 300 * K + 1000)
zeros_in_model(100, 300 * K + 1000)
h.zero(1, 300 * K)
zeros_in_model(1, 300 * K)
h.zero(1, 300 * K + B - 1, nbd.CMD_FLAG_NO_HOLE)
zeros_in_model(1, 300 * K + B - 1)
check(B, 300 * K, "after partial zero")
check(3 * B, 296 * K, "around partial zero")

# Zero with unaligned head and tail over data blocks 80..84 (320K..340K):
# head (80) and tail (83) rewritten, whole blocks 81..82 holes (may trim).
write(os.urandom(5 * B), 320 * K)
h.zero(3 * B + 2000, 320 * K + 1000)
zeros_in_model(3 * B + 2000, 320 * K + 1000)
check(5 * B, 320 * K, "after unaligned zero")
# Same with NO_HOLE over 86..90 (344K..364K): 87..88 stored zeros.
write(os.urandom(5 * B), 344 * K)
h.zero(3 * B + 2000, 344 * K + 1000, nbd.CMD_FLAG_NO_HOLE)
zeros_in_model(3 * B + 2000, 344 * K + 1000)
check(5 * B, 344 * K, "after unaligned zero NO_HOLE")

# A partial zero that leaves a whole block of zeros: a zero block
# (400K: zero the first half, 402K: then the second half).
write(os.urandom(B), 400 * K)
h.zero(2 * K, 400 * K)
h.zero(2 * K, 402 * K)
zeros_in_model(B, 400 * K)
check(B, 400 * K, "zeroed by halves")

# FAST_ZERO and FUA are accepted.
write(os.urandom(2 * B), 480 * K, nbd.CMD_FLAG_FUA)
h.zero(B, 480 * K, nbd.CMD_FLAG_FAST_ZERO)
zeros_in_model(B, 480 * K)
h.zero(B, 484 * K, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FUA)
zeros_in_model(B, 484 * K)
check(8 * K, 480 * K, "after fast zero")

# Trim and zero of never-written space, and of the whole tail.
h.trim(64 * K, 512 * K)
h.zero(64 * K, 576 * K)
h.trim(h.get_size() - 640 * K, 640 * K)
check(h.get_size(), 0, "whole device")
print("trim/zero reads ok")
EOF
    zram_nbdkit -U - "$PLUGIN" 1M comp="$comp" --run "
        nbdsh -u \"\$uri\" -c - < '$py' &&
        nbdinfo --map \"\$uri\" > '$map' &&
        nbdinfo --map --totals \"\$uri\" > '$map.totals'"

    # Offsets and lengths in KiB with the description.
    actual="$(awk '{ printf "%d %d %s\n", $1 / 1024, $2 / 1024, $4 }' "$map")"
    expected="$(cat <<EOF
0 16 data
16 16 hole,zero
32 16 zero
48 8 hole,zero
56 8 data
64 64 hole,zero
128 8 zero
136 8 data
144 56 hole,zero
200 4 data
204 4 hole,zero
208 4 data
212 44 hole,zero
256 4 data
260 40 hole,zero
300 4 data
304 16 hole,zero
320 4 data
324 8 hole,zero
332 8 data
340 4 hole,zero
344 4 data
348 8 zero
356 8 data
364 36 hole,zero
400 4 zero
404 80 hole,zero
484 4 zero
488 536 hole,zero
EOF
)"
    if [ "$actual" != "$expected" ]; then
        echo "nbdinfo --map (KiB):" >&2
        diff -u <(echo "$expected") <(echo "$actual") >&2 || :
        fail "comp=$comp: extents differ from the expected map"
    fi
    cat "$map.totals"
done

# Extents of a sparse 1 TiB device: leaves far apart in the block table.
echo "== test-plugin-trim-zero: 1T sparse extents"
map="$tmp/map.1T"
zram_nbdkit -U - "$PLUGIN" 1T --run "
    nbdsh -u \"\$uri\" -c 'h.pwrite(b\"x\" * 4096, 0)' \
        -c 'h.pwrite(b\"y\" * 8192, (512 << 30) + 4096)' \
        -c 'h.zero(4096, (768 << 30) - 4096, nbd.CMD_FLAG_NO_HOLE)' \
        -c 'h.pwrite(b\"z\" * 4096, (1 << 40) - 4096)' &&
    nbdinfo --map \"\$uri\" > '$map'"
actual="$(awk '{ printf "%s %s %s\n", $1, $2, $4 }' "$map")"
G=$((1 << 30))
expected="$(cat <<EOF
0 4096 data
4096 $((512 * G)) hole,zero
$((512 * G + 4096)) 8192 data
$((512 * G + 12288)) $((256 * G - 16384)) hole,zero
$((768 * G - 4096)) 4096 zero
$((768 * G)) $((256 * G - 4096)) hole,zero
$((1024 * G - 4096)) 4096 data
EOF
)"
if [ "$actual" != "$expected" ]; then
    diff -u <(echo "$expected") <(echo "$actual") >&2 || :
    fail "1T device: extents differ from the expected map"
fi

# Every capability the plugin claims; nbdinfo --can exits 0 for yes, 2
# for no.
for can in trim zero fast-zero fua multi-conn cache flush write read; do
    rc=0
    zram_nbdkit -U - "$PLUGIN" 1M --run "nbdinfo --can $can \"\$uri\"" || rc=$?
    [ "$rc" = 0 ] || fail "nbdinfo --can $can: exit status $rc, want 0"
done
rc=0
zram_nbdkit -U - "$PLUGIN" 1M --run 'nbdinfo --is read-only "$uri"' || rc=$?
[ "$rc" = 2 ] || fail "nbdinfo --is read-only: exit status $rc, want 2 (not read-only)"
