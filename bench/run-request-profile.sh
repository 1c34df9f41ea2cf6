#!/usr/bin/env bash
# Where a swapped page's instructions go inside the server: nbdkit and
# the plugin under callgrind, served on a Unix socket, fed requests the
# size swap sends them (bench/run-swap-vs-zram.sh measures those in the
# guest: swap-out writes of up to 32 pages merged (17 on average), swap-in
# reads of 8 at most, a
# page-cluster's readahead) with the guest workload's own pages
# (tests/vm-nbd/touch.c -d: 8:1 with lz4).
#
# Instructions per 4 KiB page, inclusive, for the writes and the reads:
#   server    every instruction of the nbdkit process (its threads)
#   plugin    the plugin's pwrite/pread callbacks (lookup, allocation,
#             locks, copies, compression)
#   codec     compression (LZ4_compress_fast_continue, ZSTD_compressCCtx)
#             or decompression (LZ4_decompress_safe, ZSTD_decompressDCtx;
#             their streaming forms too)
#   nbdkit    server less plugin: request parsing, the socket calls' user
#             side, thread hand-offs
# The kernel's side of the socket calls is not counted (callgrind sees
# user space only): the guest profile's "server system" column is that.
#
#   bench/run-request-profile.sh          # about 2 minutes on 2 cores
#
# Environment: BUILD_DIR, NBDKIT, PLUGIN (functions.sh); MIB (64: the
# data), WRITE_KIB (128), READ_KIB (32: powers of 2, as nbdcopy takes), REQUESTS (4: requests in flight,
# nbdcopy --requests), COMPS ("lz4 zstd"), EXTRA (more plugin parameters).
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"

MIB=${MIB:-64}
WRITE_KIB=${WRITE_KIB:-128}
READ_KIB=${READ_KIB:-32}
REQUESTS=${REQUESTS:-4}
COMPS=${COMPS:-lz4 zstd}
EXTRA=${EXTRA:-}

die () { echo "run-request-profile: $*" >&2; exit 1; }
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: build first"
for prog in valgrind callgrind_annotate nbdcopy cc; do
    command -v "$prog" >/dev/null || die "$prog not found"
done

tmp=$(mktemp -d)
server=
cleanup () { [ -z "$server" ] || kill "$server" 2>/dev/null || :; rm -rf "$tmp"; }
trap cleanup EXIT

cc -O2 -o "$tmp/touch" tests/vm-nbd/touch.c
"$tmp/touch" -d "$MIB" 7 > "$tmp/pages.img"
pages=$((MIB * 256))

# inclusive FILE FUNCTION...: the summed inclusive instructions of the
# functions named (callgrind_annotate's inclusive list).
inclusive ()
{
    local file=$1; shift
    callgrind_annotate --inclusive=yes --threshold=100 "$file" 2>/dev/null |
        awk -v names="$*" '
            BEGIN { n = split(names, want, " "); for (i = 1; i <= n; i++) w[want[i]] = 1 }
            $2 ~ /^\(/ {
                count = $1; gsub(/,/, "", count)
                fn = $0; sub(/ \[[^]]*\]$/, "", fn); sub(/^.*:/, "", fn)
                if (count ~ /^[0-9]+$/ && (fn in w) && !(fn in seen)) { seen[fn] = 1; sum += count }
            }
            END { print sum + 0 }'
}
total () { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(/,/, "", $1); print $1; done = 1 }'; }

# run COMP PHASE: a server under callgrind for one phase, its profile in
# $tmp/COMP-PHASE.out.  Both servers take the writes (the pages copied
# in); the read server then serves the reads too, so the reads' figures
# are its figures less the write server's.
run ()
{
    local comp=$1 phase=$2 sock=$tmp/sock out=$tmp/$1-$2.out
    rm -f "$sock"
    valgrind --tool=callgrind --callgrind-out-file="$out" \
        "$NBDKIT" -f -U "$sock" "$PLUGIN" $((MIB * 2))M comp="$comp" $EXTRA \
        2> "$tmp/valgrind.log" &
    server=$!
    for ((i = 0; i < 600; i++)); do [ -S "$sock" ] && break; sleep 0.1; done
    [ -S "$sock" ] || die "the server did not start: $(tail -5 "$tmp/valgrind.log")"
    nbdcopy --requests="$REQUESTS" --connections=1 --request-size=$((WRITE_KIB * 1024)) \
        "$tmp/pages.img" "nbd+unix:///?socket=$sock"
    if [ "$phase" = read ]; then
        nbdcopy --requests="$REQUESTS" --connections=1 --request-size=$((READ_KIB * 1024)) \
            "nbd+unix:///?socket=$sock" null:
    fi
    kill "$server"
    wait "$server" 2>/dev/null || :
    server=
    [ -s "$out" ] || die "no callgrind output for $comp $phase"
}

echo "# Instructions per 4 KiB page inside the server (callgrind)"
echo
echo "- $(date -u '+%Y-%m-%d %H:%M UTC'); $MIB MiB of the guest workload's pages; writes of $WRITE_KIB KiB, reads of $READ_KIB KiB, $REQUESTS in flight, one connection"
echo "- plugin: $PLUGIN ${EXTRA:+($EXTRA)}"
echo
echo "| comp | side | server | plugin | codec | nbdkit (server less plugin) | plugin share |"
echo "|---|---|---:|---:|---:|---:|---:|"
for comp in $COMPS; do
    run "$comp" write
    run "$comp" read
    w=$tmp/$comp-write.out r=$tmp/$comp-read.out
    w_total=$(total "$w") r_total=$(total "$r")
    w_plugin=$(inclusive "$w" zram_pwrite)
    w_codec=$(inclusive "$w" LZ4_compress_fast_continue ZSTD_compressCCtx ZSTD_compressStream2)
    # The read server also did the writes: its figures less the write server's.
    r_all_plugin=$(inclusive "$r" zram_pread zram_pwrite)
    r_plugin=$((r_all_plugin - w_plugin))
    r_codec=$(inclusive "$r" LZ4_decompress_safe LZ4_decompress_safe_partial ZSTD_decompressDCtx ZSTD_decompressStream)
    r_server=$((r_total - w_total))
    for side in write read; do
        if [ $side = write ]; then s=$w_total p=$w_plugin c=$w_codec; else s=$r_server p=$r_plugin c=$r_codec; fi
        awk -v comp="$comp" -v side="$side" -v s="$s" -v p="$p" -v c="$c" -v n="$pages" 'BEGIN {
            printf "| %s | %s | %d | %d | %d | %d | %.0f%% |\n", comp, side, s / n, p / n, c / n, (s - p) / n, 100 * p / s }'
    done
done
