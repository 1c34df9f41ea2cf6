#!/usr/bin/env bash
# Block I/O beside hostile control clients (issue 19): 4 KiB random
# read/write IOPS (fio's nbd engine, 2 jobs x iodepth 16, RUNTIME s) on a
# server with ctl=, quiet and then with a hostile process on its control
# socket the whole time: silent clients, clients that ask for long
# replies and never read them, binary junk, and bursts of 200
# connections, over and over.  Alternating, REPEATS times each, medians
# and the ratio printed.  Target: hostile >= 0.9 x quiet.
#
#   bench/run-ctl-hostile-bench.sh          # about 2 minutes
#
# Environment: BUILD_DIR, NBDKIT, PLUGIN, RUNTIME (10), REPEATS (3).
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"
RUNTIME=${RUNTIME:-10}
REPEATS=${REPEATS:-3}
for prog in "$NBDKIT" fio /usr/bin/python3; do
    command -v "$prog" >/dev/null || { echo "run-ctl-hostile-bench: $prog is missing" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat > "$tmp/hostile.py" <<'EOF2'
import os, socket, sys, time
ctl = sys.argv[1]
def connect(blocking=True):
    s = socket.socket(socket.AF_UNIX)
    s.setblocking(blocking)
    try:
        s.connect(ctl)
    except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
        pass
    return s
held = []
while True:
    held += [connect() for _ in range(4)]                 # silent
    greedy = connect(False)
    try:
        for _ in range(50):
            greedy.send(b"block_state 0 100000000\n")   # never read
    except OSError:
        pass
    held.append(greedy)
    junk = connect()
    try:
        junk.send(os.urandom(900).replace(b"\n", b"x") + b"\n" + os.urandom(3000))
    except OSError:
        pass
    held.append(junk)
    held += [connect(False) for _ in range(200)]         # a burst
    time.sleep(0.5)
    for s in held:
        s.close()
    held = []
EOF2

run_fio ()
{
    local mode=$1
    rm -f "$tmp/sock" "$tmp/ctl" "$tmp/pid"
    "$NBDKIT" -U "$tmp/sock" -P "$tmp/pid" "$PLUGIN" 1G ctl="$tmp/ctl"
    for _ in $(seq 100); do [ -S "$tmp/ctl" ] && break; sleep 0.1; done
    local hostile=
    if [ "$mode" = hostile ]; then
        /usr/bin/python3 "$tmp/hostile.py" "$tmp/ctl" & hostile=$!
    fi
    fio --name=io --ioengine=nbd --uri="nbd+unix:///?socket=$tmp/sock" \
        --rw=randrw --bs=4k --size=256M --numjobs=2 --iodepth=16 \
        --time_based --runtime="$RUNTIME" --group_reporting \
        --output-format=json --output="$tmp/fio.json" >/dev/null 2>&1
    [ -z "$hostile" ] || kill "$hostile"
    kill "$(cat "$tmp/pid")"
    /usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print(int(j["read"]["iops"] + j["write"]["iops"]))' "$tmp/fio.json"
}

quiet=() hostile=()
for ((i = 1; i <= REPEATS; i++)); do
    quiet+=("$(run_fio quiet)")
    hostile+=("$(run_fio hostile)")
    echo "round $i: quiet ${quiet[-1]} IOPS, hostile ${hostile[-1]} IOPS"
done
q=$(median "${quiet[@]}") h=$(median "${hostile[@]}")
echo "median: quiet $q IOPS, with hostile control clients $h IOPS: ratio $(awk -v q="$q" -v h="$h" 'BEGIN { printf "%.2f", h / q }')"
