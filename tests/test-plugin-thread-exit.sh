#!/usr/bin/env bash
# nbdkit serves each request on the connection's own thread with -t 1 (or
# under a filter that serialises requests), and that detached thread may
# exit after nbdkit has unloaded the plugin.  Nothing of the plugin may
# run then: 30 rounds of connect, write, read,
# disconnect and server shutdown, the connection thread slowed with nice
# so that it exits late, must all end cleanly - exit status 0, no signal,
# no sanitizer report.  Before the store owned every per-thread record,
# thread-exit destructors crashed a few rounds in 30 under TSan.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires python3

cat > "$tmp/client.py" <<'PY'
import os, sys, nbd
uri, pidfile = sys.argv[1], sys.argv[2]
h = nbd.NBD()
h.connect_uri(uri)
# Slow every thread of the server but its main thread (the one that
# unloads the plugin): the connection thread then exits late.
server = int(open(pidfile).read())
for task in os.listdir("/proc/%d/task" % server):
    if int(task) != server:
        try:
            os.setpriority(os.PRIO_PROCESS, int(task), 19)
        except OSError:
            pass                # the thread is gone already
data = bytes(range(256)) * 64
for i in range(16):
    h.pwrite(data, i * 65536)
assert h.pread(len(data), 0) == data
h.trim(65536, 0)
h.shutdown()
PY

for round in $(seq 1 30); do
    for comp in lz4 zstd; do
        rc=0
        # Captive: nbdkit --run would not report how the server ended.
        ZRAM_CAPTIVE=1 zram_nbdkit -t 1 -P "$tmp/pid" -U - "$PLUGIN" 4M comp=$comp \
            --run "python3 '$tmp/client.py' \"\$uri\" '$tmp/pid'" 2>/dev/null || rc=$?
        [ "$rc" = 0 ] || {
            cat "$NBDKIT_STDERR" >&2
            fail "round $round, comp=$comp: exit status $rc"
        }
        if grep -Eq "Segmentation|SEGV|signal [0-9]|Aborted" "$NBDKIT_STDERR"; then
            cat "$NBDKIT_STDERR" >&2
            fail "round $round, comp=$comp: nbdkit crashed at exit"
        fi
    done
done
echo "ok: 30 rounds x 2 codecs of -t 1 serve-and-shut-down ended cleanly"
