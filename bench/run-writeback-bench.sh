#!/usr/bin/env bash
# Writeback: a device 4x larger than mem_limit, filled with a real memory
# image (IMAGE_MIB, comp=lz4), the coldest blocks written back by
# writeback_watermark=90 (and by writes at the limit), then 4 KiB random
# reads with a hot set, fio's zoned:80/20:20/80 (80 % of the reads to 20 %
# of the image), 2 jobs x iodepth 16, RUNTIME s.  For each backing store
# (a file; a remote nbdkit memory export over a Unix socket; the same
# over TCP on localhost) and, for reference, without a limit (all in
# RAM): load time, blocks written back, read IOPS and mean latency, the
# fraction of reads served from RAM, blocks read back into RAM, RSS.
#
#   bench/run-writeback-bench.sh            # about 3 minutes on 2 cores
#
# Environment: BUILD_DIR (build), NBDKIT, PLUGIN, IMAGE, IMAGE_MIB (256),
# RUNTIME (20), PORT (10809 + $$ % 1000).
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"

IMAGE_MIB=${IMAGE_MIB:-256}
IMAGE=${IMAGE:-${TMPDIR:-/tmp}/nbdkit-zram-memimage-${IMAGE_MIB}M.img}
RUNTIME=${RUNTIME:-20}
PORT=${PORT:-$((10809 + $$ % 1000))}
LIMIT_MIB=$((IMAGE_MIB / 4))

die () { echo "run-writeback-bench: $*" >&2; exit 1; }
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: build first"
for prog in "$NBDKIT" nbdcopy nbdinfo fio; do
    command -v "$prog" >/dev/null || die "$prog not found"
done
[ -f "$IMAGE" ] || bench/make-memory-image.sh "$IMAGE" "$IMAGE_MIB" >&2 ||
    die "make-memory-image.sh failed"

tmp=$(mktemp -d)
server_pid=
remote_pid=
cleanup () {
    [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || :
    [ -z "$remote_pid" ] || kill "$remote_pid" 2>/dev/null || :
    rm -rf "$tmp"
}
trap cleanup EXIT
fresh_stats () { rm -f "$tmp/stats"; for _ in $(seq 30); do [ -f "$tmp/stats" ] && return; sleep 0.1; done; }

# run NAME BACKING-ARGS...
run () {
    local name="$1"
    shift
    rm -f "$tmp/sock" "$tmp/stats"
    "$NBDKIT" -f -U "$tmp/sock" "$PLUGIN" "${IMAGE_MIB}M" comp=lz4 \
        stats="$tmp/stats" "$@" 2>>"$tmp/server.log" &
    server_pid=$!
    for _ in $(seq 100); do [ -S "$tmp/sock" ] && break; sleep 0.1; done
    [ -S "$tmp/sock" ] || die "the server did not start: $(tail -3 "$tmp/server.log")"
    local start load
    start=$(date +%s.%N)
    nbdcopy "$IMAGE" "nbd+unix:///?socket=$tmp/sock"
    load=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    sleep 3
    fresh_stats
    local backed reads0 bd0 back0
    backed=$(stat_of bd_count "$tmp/stats"); reads0=$(stat_of reads "$tmp/stats")
    bd0=$(stat_of bd_reads "$tmp/stats"); back0=$(stat_of bd_readbacks "$tmp/stats")
    fio --name=hot --ioengine=nbd --uri="nbd+unix:///?socket=$tmp/sock" \
        --rw=randread --bs=4k --size="${IMAGE_MIB}M" --numjobs=2 --iodepth=16 \
        --random_distribution=zoned:80/20:20/80 --time_based \
        --runtime="$RUNTIME" --group_reporting --output-format=json \
        2>"$tmp/fio.err" | sed -n '/^{/,$p' > "$tmp/fio.json"
    fresh_stats
    local rss
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$server_pid/status")
    /usr/bin/python3 - "$name" "$load" "$backed" "$reads0" "$(stat_of reads "$tmp/stats")" \
        "$bd0" "$(stat_of bd_reads "$tmp/stats")" "$back0" "$(stat_of bd_readbacks "$tmp/stats")" "$rss" \
        "$tmp/fio.json" <<'EOF'
import json, sys
name, load, backed, r0, r1, b0, b1, k0, k1, rss, fio = sys.argv[1:]
r = json.load(open(fio))["jobs"][0]["read"]
reads = int(r1) - int(r0)
from_backing = int(b1) - int(b0)
print("| %s | %s | %s | %d | %.0f | %.1f | %s | %.1f |" % (
    name, load, backed, r["iops"], r["clat_ns"]["mean"] / 1000,
    100.0 * (1 - from_backing / reads) if reads else 0,
    int(k1) - int(k0), int(rss) / 1024))
EOF
    kill "$server_pid"; wait "$server_pid" 2>/dev/null || :; server_pid=
}

remote () {
    "$NBDKIT" -f "$@" memory "${IMAGE_MIB}M" 2>>"$tmp/remote.log" &
    remote_pid=$!
    sleep 1
}
remote_stop () { kill "$remote_pid"; wait "$remote_pid" 2>/dev/null || :; remote_pid=; }

limit=(mem_limit="${LIMIT_MIB}M" writeback_watermark=90)
echo "Writeback: $IMAGE_MIB MiB device filled with the memory image (comp=lz4), mem_limit ${LIMIT_MIB}M,"
echo "then 4 KiB random reads, 80 % of them to 20 % of the image, $RUNTIME s:"
echo
echo "| backing store | load s | blocks written back | read IOPS | mean latency us | reads from RAM % | read back to RAM | RSS MiB |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
run "none, no mem_limit (all in RAM)"
run "file" "${limit[@]}" backing="$tmp/backing"
remote -U "$tmp/remote.sock"
run "nbd, Unix socket" "${limit[@]}" backing="nbd+unix:///?socket=$tmp/remote.sock"
remote_stop
remote -i 127.0.0.1 -p "$PORT"
run "nbd, TCP (localhost)" "${limit[@]}" backing="nbd://127.0.0.1:$PORT"
remote_stop
