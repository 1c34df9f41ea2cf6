#!/usr/bin/env bash
# Real data through real clients: a ~64 MiB file of binaries with zero
# and same-filled stretches, its size not a multiple of 4096, copied in
# and out with nbdcopy (byte-for-byte cmp), with qemu-img convert and
# compare, and qemu-io pattern writes and reads; lz4 and zstd.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdcopy qemu-img qemu-io cmp

MiB=$((1024 * 1024))

# The stream of binaries, as long as needed.
binaries ()
{
    find /usr/lib/x86_64-linux-gnu /usr/bin -maxdepth 1 -type f -size +64k \
         -print0 2>/dev/null | sort -z | xargs -0 cat 2>/dev/null || :
}

# data: 64 MiB + 12345 bytes: 20 MiB of binaries, 3 MiB + 1000 zeros,
# 1 MiB of 0xab, 10 MiB of binaries from further on, 5 MiB of zeros,
# then binaries again to the end.
data="$tmp/data"
size=$((64 * MiB + 12345))
{
    binaries | head -c $((20 * MiB))
    head -c $((3 * MiB + 1000)) /dev/zero
    head -c $((1 * MiB)) /dev/zero | tr '\0' '\253'
    binaries | tail -c +$((40 * MiB)) | head -c $((10 * MiB))
    head -c $((5 * MiB)) /dev/zero
    binaries | tail -c +$((80 * MiB))
} | head -c "$size" > "$data" || :
actual="$(stat -c %s "$data")"
[ "$actual" = "$size" ] || fail "could not build a $size byte data file (got $actual bytes)"
# Not a file of zeros: it must hold some real data at the start and end.
head -c 4096 "$data" | cmp -s - <(head -c 4096 /dev/zero) && fail "data file starts with zeros"
tail -c 4096 "$data" | cmp -s - <(head -c 4096 /dev/zero) && fail "data file ends with zeros"

# For qemu (whose block layer rounds sizes up to 512 bytes): the same
# data padded to a multiple of 512, still not of 4096.
data512="$tmp/data512"
size512=$(( (size + 511) / 512 * 512 ))
cp "$data" "$data512"
truncate -s "$size512" "$data512"
[ $((size512 % 4096)) != 0 ] || fail "test setup: $size512 is a multiple of 4096"

for comp in lz4 zstd; do
    echo "== test-plugin-copy: comp=$comp nbdcopy"
    out="$tmp/out.$comp"
    zram_nbdkit -U - "$PLUGIN" "$size" comp="$comp" --run "
        nbdcopy '$data' \"\$uri\" &&
        nbdcopy \"\$uri\" '$out' &&
        nbdinfo --size \"\$uri\" > '$out.size'"
    [ "$(cat "$out.size")" = "$size" ] || fail "device size $(cat "$out.size"), want $size"
    [ "$(stat -c %s "$out")" = "$size" ] || fail "nbdcopy out: $(stat -c %s "$out") bytes, want $size"
    cmp "$data" "$out" || fail "comp=$comp: nbdcopy round trip differs"
    rm -f "$out"

    # Copy in twice (the second overwrites every block with itself) and
    # read back through a second connection with a second tool.
    zram_nbdkit -U - "$PLUGIN" "$size" comp="$comp" --run "
        nbdcopy '$data' \"\$uri\" &&
        nbdcopy --flush '$data' \"\$uri\" &&
        nbdcopy --connections=1 \"\$uri\" - > '$out'"
    cmp "$data" "$out" || fail "comp=$comp: second nbdcopy round trip differs"
    rm -f "$out"

    echo "== test-plugin-copy: comp=$comp qemu-img, qemu-io"
    log="$tmp/qemu.$comp.log"
    zram_nbdkit -U - "$PLUGIN" "$size512" comp="$comp" --run "
        qemu-img convert -n -f raw -O raw '$data512' \"\$uri\" &&
        qemu-img compare -f raw -F raw '$data512' \"\$uri\" &&
        qemu-img convert -f raw -O raw \"\$uri\" '$out' &&
        qemu-io -f raw \"\$uri\" \
            -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M' \
            -c 'write -P 0x5a 1234567 100k' -c 'read -P 0x5a 1234567 100k' \
            -c 'read -P 0xab 0 1M' \
            -c 'write -z 8M 64k' -c 'read -P 0 8M 64k' \
            -c 'write -P 0x11 $((size512 - 4608)) 4608' \
            -c 'read -P 0x11 $((size512 - 4608)) 4608' \
            -c 'discard 16M 1M' -c 'read -P 0 16M 1M'" > "$log" 2>&1 || {
        cat "$log" >&2
        fail "comp=$comp: qemu-img / qemu-io failed"
    }
    cat "$log"
    grep -q "Images are identical" "$log" || fail "comp=$comp: qemu-img compare did not say identical"
    # nbdkit's own lines (its stderr is in the log too) are not qemu-io's:
    # on nbdkit < 1.34 the plugin's warning is logged as "error: ...".
    if grep -v '^nbdkit: ' "$log" | grep -Eiq "Pattern verification failed|error|failed"; then
        fail "comp=$comp: qemu-io reported a failure"
    fi
    # Each qemu-io read happened.
    [ "$(grep -c '^read ' "$log")" = 6 ] || fail "comp=$comp: expected 6 qemu-io reads"
    cmp "$data512" "$out" || fail "comp=$comp: qemu-img convert out of the device differs"
    rm -f "$out"
done
