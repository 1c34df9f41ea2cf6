#!/usr/bin/env bash
# Recompression and the automatic policy, on a real memory image:
#
#   1. memory: the image (IMAGE_MIB) copied with nbdcopy into each server,
#      2 s later the logical/RSS ratio (image bytes over the server's RSS
#      above its idle RSS):
#        - nbdkit memory allocator=zstd (32 KiB units, the peer),
#        - zram comp=zstd,
#        - zram comp=lz4, then `idle all` + `recompress type=idle` with
#          recomp_algorithm=zstd:level=LEVEL through the control channel,
#        - zram comp=zstd, then the same recompression;
#      and the time recompression took.
#   1a. defaults: memory allocator=zstd against zram comp=zstd and
#      comp=lz4, each packed at the default pack_level and pack_blocks
#      (issue 20's memory targets), and with units of 8, with the
#      profile;
#   1b. the same with cold packing (`idle all` + `pack`) instead, with
#      units of 16 and 64 blocks, and a profile of where each zram server's
#      RSS goes (compressed bytes, the pool's slack, the block table, the
#      allocator's metadata, and the rest: the C library's arenas, thread
#      stacks, the libraries' pages);
#   1c. 4 KiB random reads over the whole image, packed (comp=lz4, pack)
#      against unpacked: IOPS and mean latency;
#   2. I/O beside the policy: the image loaded, then fio 4 KiB random
#      writes (2 jobs x iodepth 16, RUNTIME s) on the first 64 MiB while
#      idle_after=1 recompress_after=2 recompresses the rest, or
#      idle_after=1 pack_after=2 packs it, against the same without the
#      policy; REPEATS alternating runs, medians.
#
#   bench/run-recompress-bench.sh            # about 8 minutes on 2 cores
#
# Environment: BUILD_DIR (build), NBDKIT, PLUGIN, IMAGE, IMAGE_MIB (256),
# LEVEL (19), RUNTIME (10), REPEATS (3),
# PARTS ("memory defaults pack read io").
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"

ZRAMCTL=$(readlink -f "$BUILD_DIR/tools/nbdkit-zramctl")
IMAGE_MIB=${IMAGE_MIB:-256}
IMAGE=${IMAGE:-${TMPDIR:-/tmp}/nbdkit-zram-memimage-${IMAGE_MIB}M.img}
LEVEL=${LEVEL:-19}
RUNTIME=${RUNTIME:-10}
REPEATS=${REPEATS:-3}
SIZE=$((IMAGE_MIB * 2))M

die () { echo "run-recompress-bench: $*" >&2; exit 1; }
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: build first"
[ -x "$ZRAMCTL" ] || die "no nbdkit-zramctl: build first"
for prog in "$NBDKIT" nbdcopy nbdinfo fio; do
    command -v "$prog" >/dev/null || die "$prog not found"
done
[ -f "$IMAGE" ] || bench/make-memory-image.sh "$IMAGE" "$IMAGE_MIB" >&2 ||
    die "make-memory-image.sh failed"

bench_tmp
# serve_answering NBDKIT-ARGS...: serve (functions.sh), and once it
# has answered, a second for its housekeeper's first round.
serve_answering () {
    rm -f "$tmp/ctl"
    serve "$@"
    nbdinfo --size "nbd+unix:///?socket=$tmp/sock" >/dev/null
    sleep 1
}
image_bytes=$(stat -c %s "$IMAGE")

# memory NAME RECOMPRESS(yes|no) SERVER-ARGS...
memory () {
    local name="$1" recompress="$2"
    shift 2
    serve_answering "$@"
    local idle loaded seconds=-
    idle=$(rss_kib "$server_pid")
    nbdcopy "$IMAGE" "nbd+unix:///?socket=$tmp/sock"
    sleep 2
    loaded=$(rss_kib "$server_pid")
    local after=$loaded
    if [ "$recompress" != no ]; then
        "$ZRAMCTL" idle "$tmp/ctl" all >/dev/null
        local start=$SECONDS
        if [ "$recompress" = pack ]; then
            "$ZRAMCTL" pack "$tmp/ctl" > "$tmp/recompress.out"
        else
            "$ZRAMCTL" recompress "$tmp/ctl" type=idle > "$tmp/recompress.out"
        fi
        seconds=$((SECONDS - start))
        "$ZRAMCTL" compact "$tmp/ctl" >/dev/null
        sleep 2
        after=$(rss_kib "$server_pid")
    fi
    if [ -f "$tmp/stats" ]; then
        sleep 1.2               # the next stats write, after the trim
        echo "$name $(awk -F': ' '/^(compr_data_size|mem_used_total|table_bytes|metadata_bytes|codec_bytes):/ { printf "%s ", $2 }' "$tmp/stats") $((after * 1024 - idle * 1024))" >> "$tmp/profile"
        rm -f "$tmp/stats"
    fi
    stop
    /usr/bin/python3 - "$name" "$image_bytes" "$idle" "$loaded" "$after" "$seconds" <<'EOF'
import sys
name, image, idle, loaded, after, seconds = sys.argv[1:]
image, idle, loaded, after = int(image), int(idle) * 1024, int(loaded) * 1024, int(after) * 1024
print("| %s | %.1f | %.2f | %.1f | %.2f | %s |" % (
    name, (loaded - idle) / 2**20, image / (loaded - idle),
    (after - idle) / 2**20, image / (after - idle), seconds))
EOF
}
: > "$tmp/profile"
# Where the RSS above idle of each zram server (with stats=) went, MiB.
profile () {
    [ -s "$tmp/profile" ] || return 0
    echo
    echo "Profile of the RSS above idle, at the end of each zram row above (MiB):"
    echo
    echo "| server | compressed bytes | pool slack | block table | allocator metadata | codec contexts | rest | RSS above idle |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    /usr/bin/python3 - "$tmp/profile" <<'EOF'
import sys
for line in open(sys.argv[1]):
    words = line.split()
    name = " ".join(words[:-6])
    compr, pool, table, metadata, codec, rss = (int(w) / 2**20 for w in words[-6:])
    print("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |" % (
        name, compr, pool - compr, table, metadata, codec,
        rss - pool - table - metadata - codec, rss))
EOF
    : > "$tmp/profile"
}

PARTS=${PARTS:-memory defaults pack read io}
if [[ " $PARTS " = *" memory "* ]]; then
echo "Memory, $IMAGE_MIB MiB memory image, logical / (RSS - idle RSS):"
echo
echo "| server | RSS above idle, loaded (MiB) | ratio | after recompression (MiB) | ratio | recompression s |"
echo "|---|---:|---:|---:|---:|---:|"
memory "memory allocator=zstd" no memory "$SIZE" allocator=zstd
memory "zram comp=zstd" no "$PLUGIN" "$SIZE" comp=zstd stats="$tmp/stats"
memory "zram comp=lz4 + recompress zstd:$LEVEL" yes "$PLUGIN" "$SIZE" comp=lz4 \
    recomp_algorithm=zstd:level="$LEVEL" ctl="$tmp/ctl" stats="$tmp/stats"
memory "zram comp=zstd + recompress zstd:$LEVEL" yes "$PLUGIN" "$SIZE" comp=zstd \
    recomp_algorithm=zstd:level="$LEVEL" ctl="$tmp/ctl" stats="$tmp/stats"
profile
fi
if [[ " $PARTS " = *" defaults "* ]]; then
echo
echo "Packing at the defaults (idle all + pack + compact; issue 20's targets):"
echo
echo "| server | RSS above idle, loaded (MiB) | ratio | after packing (MiB) | ratio | packing s |"
echo "|---|---:|---:|---:|---:|---:|"
memory "memory allocator=zstd" no memory "$SIZE" allocator=zstd
memory "zram comp=zstd + pack (defaults)" pack "$PLUGIN" "$SIZE" \
    comp=zstd ctl="$tmp/ctl" stats="$tmp/stats"
memory "zram comp=lz4 + pack (defaults)" pack "$PLUGIN" "$SIZE" \
    comp=lz4 ctl="$tmp/ctl" stats="$tmp/stats"
# Units of 8: cold random reads at half the decode, for some memory.
memory "zram comp=zstd + pack (pack_blocks=8)" pack "$PLUGIN" "$SIZE" \
    comp=zstd pack_blocks=8 ctl="$tmp/ctl" stats="$tmp/stats"
memory "zram comp=lz4 + pack (pack_blocks=8)" pack "$PLUGIN" "$SIZE" \
    comp=lz4 pack_blocks=8 ctl="$tmp/ctl" stats="$tmp/stats"
profile
fi
if [[ " $PARTS " = *" pack "* ]]; then
echo
echo "Cold packing (idle all + pack + compact through the control channel):"
echo
echo "| server | RSS above idle, loaded (MiB) | ratio | after packing (MiB) | ratio | packing s |"
echo "|---|---:|---:|---:|---:|---:|"
memory "memory allocator=zstd" no memory "$SIZE" allocator=zstd
for blocks in 16 64; do
memory "zram comp=lz4 + pack (zstd 3, $blocks blocks)" pack "$PLUGIN" "$SIZE" \
    comp=lz4 pack_blocks=$blocks ctl="$tmp/ctl" stats="$tmp/stats"
memory "zram comp=zstd + pack (zstd 9, $blocks blocks)" pack "$PLUGIN" "$SIZE" \
    comp=zstd pack_level=9 pack_blocks=$blocks ctl="$tmp/ctl" stats="$tmp/stats"
memory "zram comp=lz4 + pack (zstd $LEVEL, $blocks blocks)" pack "$PLUGIN" "$SIZE" \
    comp=lz4 pack_level="$LEVEL" pack_blocks=$blocks ctl="$tmp/ctl" stats="$tmp/stats"
done
profile
fi
# ---- reads of packed blocks ---------------------------------------------
fio_read () {
    fio --name=read --ioengine=nbd --uri="nbd+unix:///?socket=$tmp/sock" \
        --rw=randread --bs=4k --size="${IMAGE_MIB}M" --numjobs=2 --iodepth=16 \
        --time_based --runtime="$RUNTIME" --group_reporting \
        --output-format=json 2>"$tmp/fio.err" |
      sed -n '/^{/,$p' |
      /usr/bin/python3 -c 'import json, sys; r = json.load(sys.stdin)["jobs"][0]["read"]; print(int(r["iops"]), round(r["clat_ns"]["mean"] / 1000, 1))'
}
if [[ " $PARTS " = *" read "* ]]; then
    : > "$tmp/reads"
    for round in $(seq "$REPEATS"); do
        for mode in packed unpacked; do
            serve_answering "$PLUGIN" "$SIZE" comp=lz4 ctl="$tmp/ctl"
            nbdcopy "$IMAGE" "nbd+unix:///?socket=$tmp/sock"
            if [ "$mode" = packed ]; then
                "$ZRAMCTL" idle "$tmp/ctl" all >/dev/null
                "$ZRAMCTL" pack "$tmp/ctl" >/dev/null
            fi
            echo "$mode $(fio_read)" >> "$tmp/reads"
            stop
        done
    done
    echo
    /usr/bin/python3 - "$tmp/reads" "$RUNTIME" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    mode, iops, latency = line.split()
    runs.setdefault(mode, []).append((int(iops), float(latency)))
print("4 KiB random reads over the image (2 jobs x iodepth 16, %s s, median of %d):"
      % (sys.argv[2], len(runs["packed"])))
for mode in ("unpacked", "packed"):
    print("  %-8s %7d IOPS, mean completion latency %7.1f us"
          % (mode, statistics.median(i for i, _ in runs[mode]),
             statistics.median(l for _, l in runs[mode])))
print("  packed / unpacked IOPS: %.2fx"
      % (statistics.median(i for i, _ in runs["packed"])
         / statistics.median(i for i, _ in runs["unpacked"])))
EOF
fi
[[ " $PARTS " = *" io "* ]] || exit 0

# ---- I/O beside the policy ----------------------------------------------
fio_iops () {
    fio --name=hot --ioengine=nbd --uri="nbd+unix:///?socket=$tmp/sock" \
        --rw=randwrite --bs=4k --size=64M --numjobs=2 --iodepth=16 \
        --time_based --runtime="$RUNTIME" --group_reporting \
        --output-format=json 2>"$tmp/fio.err" |
      sed -n '/^{/,$p' |   # the nbd engine prints lines before the JSON
      /usr/bin/python3 -c 'import json, sys; print(int(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))'
}
: > "$tmp/iops"
for round in $(seq "$REPEATS"); do
    for mode in recompress pack off; do
        args=("$PLUGIN" "$SIZE" comp=lz4 recomp_algorithm=zstd:level="$LEVEL" stats="$tmp/stats")
        counter=recomp_blocks
        case $mode in
            recompress) args+=(idle_after=1 recompress_after=2) ;;
            pack) args+=(idle_after=1 pack_after=2); counter=packed_blocks ;;
        esac
        serve_answering "${args[@]}"
        nbdcopy "$IMAGE" "nbd+unix:///?socket=$tmp/sock"
        sleep 2
        before=$(awk -F': ' "/^$counter:/ { print \$2 }" "$tmp/stats")
        iops=$(fio_iops)
        after=$(awk -F': ' "/^$counter:/ { print \$2 }" "$tmp/stats")
        stop
        echo "$mode $iops $((after - before))" >> "$tmp/iops"
    done
done
echo
/usr/bin/python3 - "$tmp/iops" "$RUNTIME" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    mode, iops, handled = line.split()
    runs.setdefault(mode, []).append((int(iops), int(handled)))
off = statistics.median(i for i, _ in runs["off"])
print("4 KiB random writes on 64 MiB, %s s, median of %d: policy off %d IOPS"
      % (sys.argv[2], len(runs["off"]), off))
for mode, verb in (("recompress", "recompressing"), ("pack", "packing")):
    policy = statistics.median(i for i, _ in runs[mode])
    print("  %s_after: %d IOPS (%s %d blocks meanwhile): %.2fx"
          % (mode, policy, verb, statistics.median(r for _, r in runs[mode]),
             policy / off))
EOF
