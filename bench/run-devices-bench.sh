#!/usr/bin/env bash
# Many devices against one (issue 44): one server with a 1 GiB default
# export and 8 devices of 128 MiB (device=); fio's nbd engine runs 8
# jobs of 4 KiB random writes, then reads, each job on a device of its
# own ("devices"), and the same 8 jobs on the one default export
# ("one"), alternating, REPEATS times; the medians and their ratio.
# Each layout is filled first (sequential 1 MiB writes, 65% compressible
# as the plugin bench's data), so that reads find data.
# Then the skewed case (below).
#
#   bench/run-devices-bench.sh          (from the top of the tree, built)
#
# Environment: RUNTIME seconds a run (default 5), REPEATS (default 3),
# IODEPTH per job (default 4), PLUGIN, NBDKIT.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/bin:/bin:/usr/sbin:/sbin:$PATH
RUNTIME=${RUNTIME:-5}
REPEATS=${REPEATS:-3}
IODEPTH=${IODEPTH:-4}
PLUGIN=${PLUGIN:-$PWD/build/plugin/.libs/nbdkit-zram-plugin.so}
NBDKIT=${NBDKIT:-$(sed -n 's/^NBDKIT = //p' build/Makefile)}
tmp=$(mktemp -d /tmp/zram-devices-bench.XXXXXX)
trap 'kill "$(cat "$tmp/pid" 2>/dev/null)" 2>/dev/null || :; rm -rf "$tmp"' EXIT

devices=()
for i in 1 2 3 4 5 6 7 8; do devices+=("device=d$i:128M"); done
"$NBDKIT" -U "$tmp/sock" -P "$tmp/pid" "$PLUGIN" 1G "${devices[@]}"
for _ in $(seq 50); do [ -S "$tmp/sock" ] && break; sleep 0.1; done

# jobs LAYOUT: fio's job options, 8 jobs on the layout's exports.
jobs () {
    local i
    for i in 1 2 3 4 5 6 7 8; do
        if [ "$1" = devices ]; then
            echo "--name=d$i --uri=nbd+unix:///d$i?socket=$tmp/sock"
        else
            echo "--name=one$i --uri=nbd+unix:///?socket=$tmp/sock --offset=$(( (i - 1) * 128 ))m --size=128m"
        fi
    done
}

# run LAYOUT RW: the summed IOPS of 8 jobs.
run () {
    # shellcheck disable=SC2046 # one word per option
    fio --ioengine=nbd --output-format=json --rw="$2" --bs=4k \
        --iodepth="$IODEPTH" --time_based --runtime="$RUNTIME" \
        --buffer_compress_percentage=65 --refill_buffers \
        $(jobs "$1") > "$tmp/out.raw" 2> "$tmp/out.err" ||
        { cat "$tmp/out.err" >&2; exit 1; }
    sed -n '/^{/,$p' "$tmp/out.raw" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
print(round(sum(j[sys.argv[1]]["iops"] for j in d["jobs"])))' "${2#rand}"
}

for layout in devices one; do
    # shellcheck disable=SC2046
    fio --ioengine=nbd --rw=write --bs=1m --iodepth=2 \
        --buffer_compress_percentage=65 --refill_buffers \
        $(jobs "$layout") > /dev/null 2> "$tmp/fill.err" ||
        { cat "$tmp/fill.err" >&2; exit 1; }
done

declare -A results
for r in $(seq "$REPEATS"); do
    for rw in randwrite randread; do
        for layout in devices one; do
            results[$layout.$rw]+=" $(run "$layout" "$rw")"
        done
    done
    echo "round $r: ${results[devices.randwrite]##* } / ${results[one.randwrite]##* } write," \
         "${results[devices.randread]##* } / ${results[one.randread]##* } read (devices / one)"
done

median () { printf '%s\n' $1 | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo
echo "| 8 jobs, 4 KiB, iodepth $IODEPTH | 8 devices | one device | ratio |"
echo "|---|---:|---:|---:|"
for rw in randwrite randread; do
    d=$(median "${results[devices.$rw]}") o=$(median "${results[one.$rw]}")
    echo "| $rw IOPS (median of $REPEATS) | $d | $o | $(awk -v a="$d" -v b="$o" 'BEGIN { printf "%.2f", a / b }') |"
done

# The skewed case: one device of eight written while the others idle,
# until the first ENOSPC, under a shared budget of 64 MiB (one server,
# mem_limit=64M) and under kernel zram's split (a server of its own with
# an eighth of it, mem_limit=8M): how much each holds.
cat > "$tmp/fill.py" <<'EOF'
import os, sys, nbd
h = nbd.NBD(); h.set_export_name(sys.argv[2]); h.connect_unix(sys.argv[1])
chunk = 1 << 20
written = 0
while written < h.get_size():
    data = b"".join(os.urandom(1434) + bytes(2662) for _ in range(chunk // 4096))
    try:
        h.pwrite(data, written)
    except nbd.Error:
        break
    written += chunk
print(written >> 20)
EOF
# skew EXPORT ARGS...: MiB written to EXPORT of a server of ARGS.
skew () {
    local export=$1 sock=$tmp/skew$#.sock pid
    shift
    "$NBDKIT" -U "$sock" -P "$tmp/skew.pid" "$PLUGIN" "$@"
    for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
    /usr/bin/python3 "$tmp/fill.py" "$sock" "$export"
    pid=$(cat "$tmp/skew.pid")
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}
skewed=()
for i in 1 2 3 4 5 6 7 8; do skewed+=("device=s$i:512M"); done
shared=$(skew s1 512M mem_limit=64M "${skewed[@]}")
split=$(skew "" 512M mem_limit=8M)
echo
echo "| one device of eight written, the others idle | held before the first ENOSPC |"
echo "|---|---:|"
echo "| shared budget (one server, mem_limit=64M) | $shared MiB |"
echo "| kernel zram's split (a device's eighth, mem_limit=8M) | $split MiB |"

# The cost of a device: the RSS and limit_used of a server with 64 idle
# devices of 1 GiB against one with none (each after a client listed
# the exports, so that both have served), the difference per device.
# idle COUNT: "RSS_KiB LIMIT_USED_BYTES" of a server with COUNT devices.
idle () {
    local sock=$tmp/idle.sock args=() pid
    for ((i = 1; i <= $1; i++)); do args+=("device=i$i:1G"); done
    rm -f "$sock"
    "$NBDKIT" -U "$sock" -P "$tmp/idle.pid" "$PLUGIN" 1G ctl="$tmp/idle.ctl" "${args[@]}"
    for _ in $(seq 50); do [ -S "$sock" ] && [ -S "$tmp/idle.ctl" ] && break; sleep 0.1; done
    nbdinfo --list "nbd+unix://?socket=$sock" > /dev/null
    pid=$(cat "$tmp/idle.pid")
    sleep 1
    echo "$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status")" \
         "$(SRCDIR=$PWD /usr/bin/python3 -c '
import os, sys
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
print([l.split()[1] for l in Ctl(sys.argv[1]).ok("stats")
       if l.startswith("limit_used: ")][0])' "$tmp/idle.ctl")"
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}
read -r rss0 used0 <<< "$(idle 0)"
read -r rss64 used64 <<< "$(idle 64)"
echo
echo "| idle devices of 1 GiB | RSS KiB | limit_used bytes |"
echo "|---|---:|---:|"
echo "| none | $rss0 | $used0 |"
echo "| 64 | $rss64 | $used64 |"
echo "| a device | $(( (rss64 - rss0) / 64 )) | $(( (used64 - used0) / 64 )) |"
