#!/usr/bin/env bash
# stats=PATH and metrics=PATH are rewritten by renaming a new file over
# PATH: a directory there (which would refuse every rename, so that the
# file would never be written) or a FIFO, socket or device (which would
# be replaced) makes nbdkit fail at startup, with a message naming the
# parameter; a regular file there, or nothing, starts and is written.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3

errors=0

# bad NAME ARGS...: nbdkit with ARGS must fail to start, and an error
# message must name NAME (as a word).
bad ()
{
    local name="$1" rc=0
    shift
    zram_nbdkit -U - "$PLUGIN" "$@" --run 'echo SERVED' > "$tmp/out" 2>/dev/null || rc=$?
    if [ "$rc" = 0 ]; then
        echo "FAIL: nbdkit $* started (exit status 0)" >&2
        errors=$((errors + 1))
    elif grep -q SERVED "$tmp/out"; then
        echo "FAIL: nbdkit $* served before failing" >&2
        errors=$((errors + 1))
    elif ! grep -Eq "error:.*\\b$name\\b" "$NBDKIT_STDERR"; then
        echo "FAIL: nbdkit $*: the error does not name '$name':" >&2
        sed 's/^/    /' "$NBDKIT_STDERR" >&2
        errors=$((errors + 1))
    else
        echo "ok: nbdkit $*: $(grep -E -m1 "error:.*\\b$name\\b" "$NBDKIT_STDERR")"
    fi
}

# Never a device outside $tmp (/dev/null): a server without the check,
# run as root, would replace it with a file.
mkdir "$tmp/dir"
mkfifo "$tmp/fifo"
/usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' \
    "$tmp/socket"
bad stats 1M stats="$tmp/dir"
bad stats 1M stats="$tmp/dir/"
bad stats 1M stats="$tmp/fifo"
bad stats 1M stats="$tmp/socket"
bad metrics 1M metrics="$tmp/dir"
bad metrics 1M metrics="$tmp/fifo"
# Nothing was left beside them, nor put in their place.
[ -d "$tmp/dir" ] && [ -p "$tmp/fifo" ] && [ -S "$tmp/socket" ] ||
    fail "the directory, FIFO or socket was replaced"
[ -z "$(ls -A "$tmp/dir")" ] || fail "files left in $tmp/dir: $(ls -A "$tmp/dir")"
left="$(find "$tmp" -maxdepth 1 -name '*.tmp.*')"
[ -z "$left" ] || fail "temporary files left: $left"

# A regular file there is replaced by the stats.  The metrics are
# written while the server serves and removed when it exits (a textfile
# collector must not report a stopped device with its last values); the
# stats file keeps the last figures.
echo old > "$tmp/stats"
zram_nbdkit -U - "$PLUGIN" 1M stats="$tmp/stats" metrics="$tmp/metrics" \
    --run "for i in \$(seq 50); do [ -s '$tmp/metrics' ] && break; sleep 0.1; done
           cp '$tmp/metrics' '$tmp/metrics.seen'" || fail "stats= on a regular file"
grep -q '^disk_size: 1048576$' "$tmp/stats" || fail "stats= on a regular file: not written"
grep -q '^nbdkit_zram_' "$tmp/metrics.seen" || fail "metrics=: not written"
[ ! -e "$tmp/metrics" ] || fail "metrics=: the file outlived the server"

[ "$errors" = 0 ] || fail "$errors bad cases"
echo "ok: stats= and metrics= refuse what they could never write"
