#!/usr/bin/env bash
# Reads of packed blocks against the same blocks unpacked (issue 20,
# "cold reads at hot speed"): every server holds the memory image
# (comp=lz4), one with everything packed (`idle all`, `pack`), one as
# written; optionally (OLD_PLUGIN=) an older build's plugin packed too.
# All servers are up at once and fio runs against each in turn, pattern
# by pattern, REPEATS rounds; medians are reported with packed/unpacked.
#
#   random   4 KiB random reads (2 jobs x iodepth 16)
#   runs8    4 KiB reads in runs of 8 neighbours (rw=randread:8: a new
#            random offset every 8 reads), the same jobs
#   seq      4 KiB sequential reads, one job x iodepth 16
#   seq128k  128 KiB sequential reads, one job x iodepth 4
#
# The servers' stats files give the decode cache's hits and misses.
#
# Environment: IMAGE_MIB (256), IMAGE, RUNTIME (5), REPEATS (3),
# PATTERNS ("random runs8 seq seq128k"), PACKED_ARGS (extra plugin
# parameters of the packed server, e.g. "pack_blocks=8 decode_cache=8M"),
# OLD_PLUGIN (a plugin .so built from an older tree: a third server).
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"

ZRAMCTL=$(readlink -f "$BUILD_DIR/tools/nbdkit-zramctl")
IMAGE_MIB=${IMAGE_MIB:-256}
IMAGE=${IMAGE:-${TMPDIR:-/tmp}/nbdkit-zram-memimage-${IMAGE_MIB}M.img}
RUNTIME=${RUNTIME:-5}
REPEATS=${REPEATS:-3}
PATTERNS=${PATTERNS:-random runs8 seq seq128k}
PACKED_ARGS=${PACKED_ARGS:-}
OLD_PLUGIN=${OLD_PLUGIN:-}

die () { echo "run-cold-read-bench: $*" >&2; exit 1; }
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: build first"
[ -x "$ZRAMCTL" ] || die "no nbdkit-zramctl: build first"
for prog in "$NBDKIT" nbdcopy nbdinfo fio; do
    command -v "$prog" >/dev/null || die "$prog not found"
done
[ -z "$OLD_PLUGIN" ] || [ -f "$OLD_PLUGIN" ] || die "no plugin at $OLD_PLUGIN"
[ -f "$IMAGE" ] || bench/make-memory-image.sh "$IMAGE" "$IMAGE_MIB" >&2 ||
    die "make-memory-image.sh failed"

tmp=$(mktemp -d)
pids=()
cleanup () {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || :; done
    # The servers write their stats files as they exit.
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || :; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# serve NAME PACK(yes|no) PLUGIN ARGS...: a server on $tmp/NAME.sock
# holding the image, packed or not.
serve () {
    local name="$1" pack="$2" plugin="$3"
    shift 3
    "$NBDKIT" -f -U "$tmp/$name.sock" "$plugin" "$((IMAGE_MIB * 2))M" \
        comp=lz4 ctl="$tmp/$name.ctl" stats="$tmp/$name.stats" "$@" \
        2>>"$tmp/$name.log" &
    pids+=($!)
    for _ in $(seq 100); do [ -S "$tmp/$name.sock" ] && break; sleep 0.1; done
    [ -S "$tmp/$name.sock" ] || die "$name did not start: $(tail -3 "$tmp/$name.log")"
    nbdcopy "$IMAGE" "nbd+unix:///?socket=$tmp/$name.sock"
    if [ "$pack" = yes ]; then
        "$ZRAMCTL" idle "$tmp/$name.ctl" all >/dev/null
        "$ZRAMCTL" pack "$tmp/$name.ctl" >"$tmp/$name.pack"
        echo "$name: $(tr '\n' ' ' <"$tmp/$name.pack")" >&2
    fi
}

servers=(unpacked packed)
serve unpacked no "$PLUGIN"
# shellcheck disable=SC2086
serve packed yes "$PLUGIN" $PACKED_ARGS
if [ -n "$OLD_PLUGIN" ]; then
    servers+=(old-packed)
    serve old-packed yes "$OLD_PLUGIN"
fi

# fio_run NAME PATTERN: IOPS and mean completion latency (us).
fio_run () {
    local name="$1" pattern="$2" args
    case "$pattern" in
        random)  args="--rw=randread --bs=4k --numjobs=2 --iodepth=16" ;;
        runs8)   args="--rw=randread:8 --bs=4k --numjobs=2 --iodepth=16" ;;
        seq)     args="--rw=read --bs=4k --numjobs=1 --iodepth=16" ;;
        seq128k) args="--rw=read --bs=128k --numjobs=1 --iodepth=4" ;;
        *) die "unknown pattern $pattern" ;;
    esac
    # shellcheck disable=SC2086
    fio --name=read --ioengine=nbd --uri="nbd+unix:///?socket=$tmp/$name.sock" \
        $args --size="${IMAGE_MIB}M" --time_based --runtime="$RUNTIME" \
        --group_reporting --output-format=json 2>"$tmp/fio.err" |
      sed -n '/^{/,$p' |
      /usr/bin/python3 -c 'import json, sys; r = json.load(sys.stdin)["jobs"][0]["read"]; print(int(r["iops"]), round(r["clat_ns"]["mean"] / 1000, 1))'
}

: >"$tmp/runs"
for round in $(seq "$REPEATS"); do
    for pattern in $PATTERNS; do
        for name in "${servers[@]}"; do
            echo "$pattern $name $(fio_run "$name" "$pattern")" >>"$tmp/runs"
        done
    done
    echo "round $round done" >&2
done
sleep 1.2                       # the stats files' next write
for name in "${servers[@]}"; do
    [ -f "$tmp/$name.stats" ] || continue
    echo "$name: decode cache $(stat_of decode_cache_bytes "$tmp/$name.stats") bytes," \
         "$(stat_of decode_cache_hits "$tmp/$name.stats") hits," \
         "$(stat_of decode_cache_misses "$tmp/$name.stats") misses;" \
         "$(stat_of packed_blocks "$tmp/$name.stats") blocks packed in" \
         "$(stat_of pack_units "$tmp/$name.stats") units"
done

echo
echo "Reads, median of $REPEATS x $RUNTIME s (IOPS; mean completion latency us):"
echo
/usr/bin/python3 - "$tmp/runs" "${servers[@]}" <<'EOF'
import statistics, sys
runs, servers = sys.argv[1], sys.argv[2:]
table = {}
for line in open(runs):
    pattern, name, iops, latency = line.split()
    table.setdefault(pattern, {}).setdefault(name, []).append((int(iops), float(latency)))
print("| pattern | " + " | ".join(servers) + " | packed / unpacked |")
print("|---|" + "---:|" * (len(servers) + 1))
for pattern, by in table.items():
    med = {n: (statistics.median(i for i, _ in by[n]),
               statistics.median(l for _, l in by[n])) for n in servers}
    cells = ["%d; %.0f" % med[n] for n in servers]
    print("| %s | %s | %.2fx |" % (pattern, " | ".join(cells),
                                   med["packed"][0] / med["unpacked"][0]))
EOF
