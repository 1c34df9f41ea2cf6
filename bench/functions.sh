# The set-up every bench script shares.  Source it first thing after
# `set -euo pipefail`:
#
#   source "$(dirname "$(readlink -f "$0")")/functions.sh"
#
# It puts Debian's tools first on PATH (nbdsh needs /usr/bin/python3),
# sets LC_ALL=C (numbers parse the same everywhere), moves to the top of
# the source tree, and sets BUILD_DIR (build), PLUGIN (the built plugin,
# as an absolute path) and NBDKIT (the server BUILD_DIR was configured
# with, else nbdkit on PATH), each unless already set, and defines
# stat_of, median and rss_kib.
export PATH=/usr/bin:/bin:/usr/sbin:/sbin:$PATH
export LC_ALL=C
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

BUILD_DIR=${BUILD_DIR:-build}
PLUGIN=$(readlink -f "${PLUGIN:-$BUILD_DIR/plugin/.libs/nbdkit-zram-plugin.so}")
: "${NBDKIT:=$(sed -n 's/^NBDKIT = //p' "$BUILD_DIR/Makefile" 2>/dev/null || :)}"
NBDKIT=${NBDKIT:-nbdkit}

# stat_of KEY FILE: the value of "KEY: value" in a stats file.
stat_of () { awk -F': ' -v k="$1" '$1 == k { print $2 }' "$2"; }

# The median of the numbers given (the lower middle one of an even count).
median () { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# rss_kib PID: the process's resident memory (VmRSS), in KiB.
rss_kib () { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# bench_tmp: $tmp, a new folder removed at exit, after the server that
# serve started (server_pid) is killed.
bench_tmp () {
    tmp=$(mktemp -d)
    server_pid=
    trap bench_cleanup EXIT
}
bench_cleanup () {
    [ -z "${server_pid:-}" ] || kill "$server_pid" 2>/dev/null || :
    rm -rf "$tmp"
}

# serve NBDKIT-ARGS...: a foreground server on $tmp/sock (server_pid),
# its messages in $tmp/server.log; returns once the socket is there
# (die, the script's own, when it is not within 10 s).  stop ends it.
serve () {
    rm -f "$tmp/sock"
    "$NBDKIT" -f -U "$tmp/sock" "$@" 2>>"$tmp/server.log" &
    server_pid=$!
    for _ in $(seq 100); do
        [ -S "$tmp/sock" ] && break
        sleep 0.1
    done
    [ -S "$tmp/sock" ] || die "the server did not start: $(tail -3 "$tmp/server.log")"
}
stop () {
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null || :
    server_pid=
}
