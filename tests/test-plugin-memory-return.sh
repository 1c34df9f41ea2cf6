#!/usr/bin/env bash
# Memory that really comes back: with -t 16, a client writes 96 MiB in
# 4 KiB, 256 KiB and 4 MiB requests (16 in flight), trims it all and asks
# for compaction; within 5 s the server's RSS is back within 8 MiB of
# what it was idle, in the plain server, under swap=try (memory locked
# as touched) and under nbdkit --swap.  nbdkit itself keeps, per worker
# thread, a buffer the size of the largest request the thread served,
# until the connection closes: up to 16 times the request size is allowed
# for them beyond the 8 MiB.  A second round must come back as well
# (nothing piles up), and once the client is gone RSS is within 8 MiB of
# idle with no allowance, but under swap=try, whose heap is never trimmed
# (its freed buffers below 2 MiB may stay), and whose keeper keeps 4.5
# MiB ready for writes.  RSS is read in
# builds without sanitizers only (their shadow memory counts as RSS).
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3
if [ "$SANITIZERS" != no ]; then
    echo "$TEST_NAME: SKIP: RSS is not measured in a sanitizer build" >&2
    exit 77
fi

cat > "$tmp/memory.py" <<'EOF2'
import os, sys, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl

uri, ctl_path, pid_path, request, mode = sys.argv[1:6]
request = int(request)
TOTAL, THREADS, SLACK = 96 << 20, 16, 8 << 20
# nbdkit's own per-thread request buffers: large requests are served from
# a buffer each worker thread keeps (and grows) until the connection
# closes.
nbdkit_buffers = THREADS * request if request >= (128 << 10) else 0
pid = int(open(pid_path).read())

def rss():
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10

def write_trim_settle(bound):
    """Write TOTAL bytes, trim them all, compact; RSS once within bound."""
    offset = 0
    while offset < TOTAL or h.aio_in_flight() > 0:
        while offset < TOTAL and h.aio_in_flight() < THREADS:
            h.aio_pwrite(data, offset, completion=lambda *a: 1)
            offset += request
        h.poll(-1)
    full = rss()
    h.trim(TOTAL, 0)
    Ctl(ctl_path).ok("compact")
    deadline = time.monotonic() + 5
    while True:
        time.sleep(0.25)
        after = rss()
        if after <= bound or time.monotonic() > deadline:
            return full, after

h = nbd.NBD(); h.connect_uri(uri)
time.sleep(1.5)
idle = rss()
data = os.urandom(request)
# Under swap=try the keeper keeps memory ready for writes even with
# nothing stored, beyond the reserve that idle already counts: heap room
# for the allocator's metadata (a thirty-second of the reserve, 2 MiB
# here, and half a MiB for other heap users) and freed runs made ready
# (128 pages of each of the four zspage lengths, 2 MiB).
ready = (9 << 19) if mode == "try" else 0
bound = idle + SLACK + nbdkit_buffers + ready
full, after = write_trim_settle(bound)
# Again: nothing may pile up from one round to the next.
full2, after2 = write_trim_settle(bound)
print("%-5s %7d-byte requests: idle %.1f MiB, full %.1f MiB, after trimming "
      "it all %.1f MiB (+%.1f MiB, nbdkit's buffers at most %.0f MiB), after a "
      "second round %.1f MiB"
      % (mode, request, idle / 2**20, full / 2**20, after / 2**20,
         (after - idle) / 2**20, nbdkit_buffers / 2**20, after2 / 2**20))
assert full > idle + TOTAL // 2, "the data never took memory: %d -> %d" % (idle, full)
assert after <= bound, "%.1f MiB more than idle after trimming it all" % ((after - idle) / 2**20)
assert after2 <= bound, "%.1f MiB more than idle after a second round" % ((after2 - idle) / 2**20)
# The client goes: nbdkit's threads and their buffers go, and what they
# took must go back too (not stay in the C library's arenas).  Under
# swap=try the plugin keeps the heap it touched, on purpose (no trim: a
# swap server must not fault pages back in when memory is short), so
# nbdkit's freed buffers below the 2 MiB mmap threshold may stay there,
# 16 of them at most.
kept_heap = THREADS * min(request, 2 << 20) if mode == "try" else 0
h.shutdown()
del h
deadline = time.monotonic() + 5
while True:
    time.sleep(0.25)
    gone = rss()
    if gone <= idle + SLACK + kept_heap + ready or time.monotonic() > deadline:
        break
print("%-5s %7d-byte requests: %.1f MiB once the client is gone (+%.1f MiB, "
      "heap kept by swap mode at most %.0f MiB)"
      % (mode, request, gone / 2**20, (gone - idle) / 2**20, kept_heap / 2**20))
assert gone <= idle + SLACK + kept_heap + ready, \
    "%.1f MiB more than idle with the client gone" % ((gone - idle) / 2**20)
EOF2

for mode in plain try swap; do
    case $mode in
        plain) options=() params=() ;;
        try) options=() params=(swap=try mem_limit=1G) ;;
        swap) options=(--swap) params=() ;;
    esac
    for request in 4096 262144 4194304; do
        rm -f "$tmp/ctl" "$tmp/pid"
        zram_nbdkit ${options[@]+"${options[@]}"} -t 16 -U - -P "$tmp/pid" \
            "$PLUGIN" 512M ctl="$tmp/ctl" ${params[@]+"${params[@]}"} \
            --run "/usr/bin/python3 '$tmp/memory.py' \"\$uri\" '$tmp/ctl' '$tmp/pid' $request $mode" 2>/dev/null ||
            { cat "$NBDKIT_STDERR" >&2; fail "$mode, $request-byte requests"; }
    done
done
echo "ok: memory comes back"
