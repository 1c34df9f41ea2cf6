#!/usr/bin/env bash
# Batched writes (issue 20, seed 004): what a block costs, what one
# connection copies, and what a sequential writer does to reads.
#
#   bench/run-batch-bench.sh                  # about 6 minutes on 2 cores
#
# Part "instructions": bench/store-write under callgrind
# (--toggle-collect=store_write): instructions per 4 KiB block of the
# store's write path, lz4 and zstd, requests of 1 block against 32, on
# the memory image written twice (the second pass frees an old object
# per block).  OLD_STORE_WRITE=path adds the same figures for another
# build's bench/store-write (the code before a change).
#
# Part "copy": nbdcopy of the memory image on one connection
# (--connections=1) into the null plugin (the transport's ceiling),
# memory allocator=sparse, and zram lz4 and zstd with write_batch=16 and
# write_batch=1; servers alternate, REPEATS rounds, medians of MB/s.
#
# Part "reads": 4 KiB random reads at qd1 (fio, nbd engine) over the
# image's half of a zram lz4 device, RUNTIME seconds, alone and while a
# second fio job writes the other half sequentially in 256 KiB requests,
# with write_batch=16 and write_batch=1; medians of the mean and p99
# completion latency, and of the writer's MB/s (RAW=1: every run's).
#
# Environment: BUILD_DIR, NBDKIT, PLUGIN (functions.sh); IMAGE (default
# ${TMPDIR:-/tmp}/nbdkit-zram-memimage-256M.img, made if missing), REPEATS
# (3), RUNTIME (8), PARTS ("instructions copy reads").

set -euo pipefail
source "$(dirname "$(readlink -f "$0")")/functions.sh"

REPEATS=${REPEATS:-3}
RUNTIME=${RUNTIME:-8}
PARTS=${PARTS:-instructions copy reads}
IMAGE=${IMAGE:-${TMPDIR:-/tmp}/nbdkit-zram-memimage-256M.img}
[ -s "$IMAGE" ] || bench/make-memory-image.sh "$IMAGE" 256
image_bytes=$(stat -c %s "$IMAGE")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "# Batched writes: $(date -u +%F), $(nproc) cores, image $IMAGE ($((image_bytes >> 20)) MiB)"

if [[ " $PARTS " == *" instructions "* ]]; then
    echo
    echo "## Instructions per 4 KiB block (callgrind, store_write inclusive, 2 passes)"
    echo
    echo "| build | codec | 1 block per request | 32 blocks per request | 32 vs 1 |"
    echo "|---|---|---|---|---|"
    blocks=$(( image_bytes / 4096 * 2 ))
    for build in ${OLD_STORE_WRITE:+old} new; do
        binary=$BUILD_DIR/bench/store-write
        [ "$build" = old ] && binary=$OLD_STORE_WRITE
        for codec in lz4 zstd; do
            declare -A per
            for n in 1 32; do
                valgrind --tool=callgrind --toggle-collect=store_write \
                    --callgrind-out-file="$tmp/cg" "$binary" "$IMAGE" "$codec" "$n" 2 \
                    > /dev/null 2> "$tmp/cg.err"
                ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$tmp/cg.err")
                per[$n]=$(( ir / blocks ))
            done
            echo "| $build | $codec | ${per[1]} | ${per[32]} | $(awk -v a="${per[1]}" -v b="${per[32]}" 'BEGIN { printf "%+.1f %%", (b - a) * 100 / a }') |"
        done
    done
fi

# Serve with nbdkit on a unix socket; run a command with $uri set.
serve () {
    local sock=$tmp/sock
    rm -f "$sock"
    case $1 in
        null) "$NBDKIT" -f -U "$sock" null "$image_bytes" & ;;
        memory-sparse) "$NBDKIT" -f -U "$sock" memory "$image_bytes" allocator=sparse & ;;
        zram-*) local codec=${1#zram-}; codec=${codec%-b*}
                local batch=${1##*-b}
                "$NBDKIT" -f -U "$sock" "$PLUGIN" "$2" comp="$codec" write_batch="$batch" & ;;
    esac
    server=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    uri="nbd+unix:///?socket=$sock"
}
stop () { kill "$server"; wait "$server" 2>/dev/null || :; }
now_ns () { date +%s%N; }

if [[ " $PARTS " == *" copy "* ]]; then
    servers="null memory-sparse zram-lz4-b16 zram-lz4-b1 zram-zstd-b16 zram-zstd-b1"
    declare -A copy
    for round in $(seq "$REPEATS"); do
        for s in $servers; do
            serve "$s" "$image_bytes"
            t0=$(now_ns); nbdcopy --connections=1 "$IMAGE" "$uri"; t1=$(now_ns)
            stop
            copy[$s]+=" $(awk -v b="$image_bytes" -v ns=$((t1 - t0)) 'BEGIN { printf "%.0f", b / ns * 1000 }')"
        done
        servers="${servers#* } ${servers%% *}"    # rotate the order
    done
    echo
    echo "## nbdcopy of the image on one connection (MB/s, median of $REPEATS)"
    echo
    echo "| server | MB/s | vs null |"
    echo "|---|---|---|"
    null=$(median ${copy[null]})
    for s in null memory-sparse zram-lz4-b16 zram-lz4-b1 zram-zstd-b16 zram-zstd-b1; do
        m=$(median ${copy[$s]})
        echo "| $s | $m | $(awk -v a="$m" -v b="$null" 'BEGIN { printf "%.2fx", a / b }') |"
    done
fi

if [[ " $PARTS " == *" reads "* ]]; then
    half=$(( (image_bytes / 2) >> 20 ))M
    declare -A mean p99 written
    for round in $(seq "$REPEATS"); do
        for batch in 16 1; do
            for writer in alone writer; do
                serve "zram-lz4-b$batch" $(( image_bytes * 2 ))
                nbdcopy --connections=1 "$IMAGE" "$uri"
                jobs=(--name=reads --rw=randread --bs=4k --iodepth=1 --size="$half" --offset=0)
                if [ "$writer" = writer ]; then
                    jobs+=(--name=writer --rw=write --bs=256k --iodepth=4
                           --offset="$image_bytes" --size="$image_bytes"
                           --buffer_compress_percentage=65 --refill_buffers --time_based)
                fi
                fio --ioengine=nbd --uri="$uri" --runtime="$RUNTIME" --time_based \
                    --output-format=json --output="$tmp/fio.json" "${jobs[@]}" > /dev/null
                stop
                read -r m p w < <(/usr/bin/python3 -c '
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
clat = jobs[0]["read"]["clat_ns"]
written = jobs[1]["write"]["bw_bytes"] / 1e6 if len(jobs) > 1 else 0
print(round(clat["mean"] / 1000, 1), round(clat["percentile"]["99.000000"] / 1000, 1),
      round(written))' "$tmp/fio.json")
                mean[$batch-$writer]+=" $m"; p99[$batch-$writer]+=" $p"
                written[$batch-$writer]+=" $w"
                [ -z "${RAW:-}" ] || echo "raw: write_batch=$batch $writer: mean $m p99 $p writer $w MB/s" >&2
            done
        done
    done
    echo
    echo "## 4 KiB random reads at qd1 (us, median of $REPEATS), zram lz4"
    echo
    echo "| write_batch | reads alone: mean | p99 | beside a 256 KiB sequential writer: mean | p99 | the writer's MB/s |"
    echo "|---|---|---|---|---|---|"
    for batch in 16 1; do
        echo "| $batch | $(median ${mean[$batch-alone]}) | $(median ${p99[$batch-alone]}) | $(median ${mean[$batch-writer]}) | $(median ${p99[$batch-writer]}) | $(median ${written[$batch-writer]}) |"
    done
fi
