#!/usr/bin/env bash
# `nbdkit-zramctl swap on|off|status` (tools/nbdkit-zram-swap) where no
# nbd device can be attached: every bad option is refused with a message
# naming it, before anything is changed; status and off with nothing set
# up; status of a device whose server is gone; off stopping the server
# it recorded and removing its state.  The real path (the kernel's nbd
# driver swapping to the server) is `make check-swap`, in a guest.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
ZRAMCTL=${ZRAMCTL:-$BUILDDIR/tools/nbdkit-zramctl}
export NBDKIT_ZRAM_SWAP=${NBDKIT_ZRAM_SWAP:-$BUILDDIR/tools/nbdkit-zram-swap}
export NBDKIT_ZRAM_SWAP_DIR="$tmp/run"
[ -x "$ZRAMCTL" ] && [ -x "$NBDKIT_ZRAM_SWAP" ] || fail "not built: $ZRAMCTL $NBDKIT_ZRAM_SWAP"
min_free_before=$(cat /proc/sys/vm/min_free_kbytes)

# refused ARGS PATTERN: exit status 1, PATTERN on stderr, nothing made.
refused ()
{
    local pattern=$1 rc=0
    shift
    "$ZRAMCTL" swap "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
    [ "$rc" = 1 ] || fail "swap $*: exit status $rc, not 1"
    grep -q -- "$pattern" "$tmp/err" || { cat "$tmp/err" >&2; fail "swap $*: no message matching '$pattern'"; }
    [ ! -e "$tmp/run" ] || fail "swap $*: made $tmp/run"
}
refused "--size: '1X' is not a size" on --size 1X
refused "--size: '' is not a size" on --size ''
refused "--mem-limit: 'lots' is not a size" on --mem-limit lots
refused "--mem-limit: 1M is below 16M" on --mem-limit 1M
refused "--algorithm: 'brotli' is neither lz4 nor zstd" on --algorithm brotli
refused "--priority: 'high' is not a number" on --priority high
refused "--priority: 40000 is above 32767" on --priority 40000
refused "--ratio: '0.5' is not a compression ratio" on --ratio 0.5
refused "--ratio: 'x' is not a compression ratio" on --ratio x
refused "--device: '/dev/sda' is not /dev/nbdN" on --device /dev/sda
refused "--min-free-kbytes: '-5' is not a number" on --min-free-kbytes -5
refused "swap on: unknown argument '--bogus'" on --bogus
refused "'sideways' is none of on, off, status" sideways
refused "usage:" off /dev/nbd0 /dev/nbd1
if [ "$(id -u)" != 0 ]; then
    refused "swap on: needs root" on --mem-limit 64M
fi
NBDKIT_ZRAM_SWAP="$tmp/missing" refused "swap: $tmp/missing: No such file" status

# Nothing set up.
"$ZRAMCTL" swap status > "$tmp/out" || fail "swap status with nothing set up failed"
grep -q "no swap set up by swap on" "$tmp/out" || fail "swap status: $(cat "$tmp/out")"
if [ "$(id -u)" = 0 ]; then
    "$ZRAMCTL" swap off > "$tmp/out" || fail "swap off with nothing set up failed"
    grep -q "no swap set up by swap on" "$tmp/out" || fail "swap off: $(cat "$tmp/out")"
    refused "swap off: /dev/nbd7 was not set up by swap on" off /dev/nbd7
fi

# A device whose server is gone: status says so, exit status 1.  Then one
# whose "server" runs (a stand-in process): off stops it and removes the
# state, and leaves vm.min_free_kbytes alone (this set-up did not raise
# it).
mkdir -p "$tmp/run/nbd9"
sleep 1000 & stand_in=$!
cleanup_add "kill $stand_in 2>/dev/null"
( exit 0 ) & gone=$!
wait "$gone"
printf 'device=/dev/nbd9\nserver_pid=%s\nold_min_free=\n' "$gone" > "$tmp/run/nbd9/state"
rc=0
"$ZRAMCTL" swap status > "$tmp/out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "swap status with the server gone: exit status $rc"
grep -q "^/dev/nbd9: not swapped on; server pid $gone is gone" "$tmp/out" ||
    fail "swap status: $(cat "$tmp/out")"
if [ "$(id -u)" = 0 ]; then
    printf 'device=/dev/nbd9\nserver_pid=%s\nold_min_free=\n' "$stand_in" > "$tmp/run/nbd9/state"
    "$ZRAMCTL" swap off /dev/nbd9 > "$tmp/out" 2>&1 || fail "swap off: $(cat "$tmp/out")"
    ! kill -0 "$stand_in" 2>/dev/null || fail "swap off left the server running"
    [ ! -e "$tmp/run/nbd9" ] || fail "swap off left $tmp/run/nbd9"
    [ "$(cat /proc/sys/vm/min_free_kbytes)" = "$min_free_before" ] ||
        fail "swap off changed vm.min_free_kbytes"
fi
echo "ok: nbdkit-zramctl swap"
