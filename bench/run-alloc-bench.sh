#!/usr/bin/env bash
# Run the zsalloc benchmark on object sizes taken from memory-like data.
#
#   BUILD_DIR=build bench/run-alloc-bench.sh [zsbench options...]
#
# Run from the repository root after the build (make bench/zsbench
# bench/gen-sizes in $BUILD_DIR).  The script
#   1. builds a ~128 MiB sample that looks like a process's memory: slices
#      of shared libraries (/usr/lib/x86_64-linux-gnu), text (man pages,
#      uncompressed, and /usr/share/perl) and runs of zero pages (~8 %),
#      in a temporary directory removed on exit;
#   2. runs gen-sizes with lz4 and with zstd on it, giving two size files;
#   3. runs zsbench with the lz4 (or $ZSBENCH_ALGO) size file; extra
#      arguments are passed to zsbench and override the defaults below.
#
# Environment (defaults keep the whole run near 3 minutes on 2 cores):
#   BUILD_DIR         build directory (default: build)
#   DATA_MIB          size of the sample in MiB (default: 128)
#   ZSBENCH_ALGO      size file zsbench uses: lz4 or zstd (default: lz4)
#   ZSBENCH_THREADS   -t, thread counts for table 1 (default: 1,2,4,8)
#   ZSBENCH_N         -n, objects per thread in table 1 (default: 40000)
#   ZSBENCH_REPEATS   -r, runs per value, median printed (default: 5)
#   ZSBENCH_MIB       -m, MiB per process in table 2 (default: 256)
#   ZSBENCH_CHAINS    -c, chain limits for table 3 (default: 4,8,16)
#   ZSBENCH_SAVE_DIR  if set, the two size files are copied there

set -euo pipefail

BUILD_DIR=${BUILD_DIR:-build}
DATA_MIB=${DATA_MIB:-128}
ZSBENCH_ALGO=${ZSBENCH_ALGO:-lz4}
ZSBENCH_THREADS=${ZSBENCH_THREADS:-1,2,4,8}
ZSBENCH_N=${ZSBENCH_N:-40000}
ZSBENCH_REPEATS=${ZSBENCH_REPEATS:-5}
ZSBENCH_MIB=${ZSBENCH_MIB:-256}
ZSBENCH_CHAINS=${ZSBENCH_CHAINS:-4,8,16}

zsbench=$BUILD_DIR/bench/zsbench
gen_sizes=$BUILD_DIR/bench/gen-sizes

die () { echo "run-alloc-bench: $*" >&2; exit 1; }

for prog in "$zsbench" "$gen_sizes"; do
    [ -x "$prog" ] ||
        die "$prog not found: build first (cd $BUILD_DIR && make bench/zsbench bench/gen-sizes), or set BUILD_DIR"
done
case $ZSBENCH_ALGO in
    lz4|zstd) ;;
    *) die "ZSBENCH_ALGO must be lz4 or zstd, not '$ZSBENCH_ALGO'" ;;
esac
if ! [[ $DATA_MIB =~ ^[0-9]+$ ]] || [ "$DATA_MIB" -lt 1 ]; then
    die "DATA_MIB must be a positive integer"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/zsbench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

PAGE=4096
MiB=$((1024 * 1024))

# ---- 1. the sample -------------------------------------------------------
# Per round: 96 pages of library code/data, 64 pages of text, 14 zero
# pages (14 / 174 = 8 %).  The sources are gathered first, a bit more than
# needed, then sliced round by round so the kinds of pages are mixed the
# way they are in a real address space.
lib_pages=96
text_pages=64
zero_pages=14
round_pages=$((lib_pages + text_pages + zero_pages))
rounds=$(( (DATA_MIB * MiB / PAGE + round_pages - 1) / round_pages ))
lib_need=$((rounds * lib_pages * PAGE))
text_need=$((rounds * text_pages * PAGE))

echo "run-alloc-bench: building a ${DATA_MIB} MiB memory-like sample in $tmp" >&2

# Shared libraries: up to 2 MiB from each, in a fixed (sorted) order.
libdir=/usr/lib/x86_64-linux-gnu
[ -d "$libdir" ] || libdir=/usr/lib
: > "$tmp/libs.bin"
have=0
while IFS= read -r -d '' f; do
    [ "$have" -ge "$lib_need" ] && break
    head -c $((2 * MiB)) -- "$f" >> "$tmp/libs.bin" 2>/dev/null || continue
    have=$(stat -c %s "$tmp/libs.bin")
done < <(find "$libdir" -maxdepth 2 -type f -name '*.so*' -size +16k -print0 2>/dev/null |
             sort -z)

# Text: uncompressed man pages, then perl modules.  head closes the pipe
# early, so the producers' SIGPIPE status is expected and ignored.
{
    { find /usr/share/man -type f -print0 2>/dev/null | sort -z |
          xargs -0 -r zcat -f -- 2>/dev/null || true; } | head -c $((text_need * 2 / 3)) || true
    { find /usr/share/perl /usr/share/perl5 -type f -print0 2>/dev/null | sort -z |
          xargs -0 -r cat -- 2>/dev/null || true; } | head -c "$text_need" || true
} > "$tmp/text.bin"

lib_have=$(stat -c %s "$tmp/libs.bin")
text_have=$(stat -c %s "$tmp/text.bin")
[ "$lib_have" -gt 0 ] || die "no shared libraries found under $libdir"
[ "$text_have" -gt 0 ] || die "no text found under /usr/share/man or /usr/share/perl"

# Interleave.  A source that runs short wraps around to its start.
img=$tmp/memory.img
: > "$img"
lib_blocks=$(( (lib_have + PAGE - 1) / PAGE ))
text_blocks=$(( (text_have + PAGE - 1) / PAGE ))
for ((r = 0; r < rounds; r++)); do
    dd if="$tmp/libs.bin" bs=$PAGE skip=$(( (r * lib_pages) % lib_blocks )) \
       count=$lib_pages status=none >> "$img"
    dd if="$tmp/text.bin" bs=$PAGE skip=$(( (r * text_pages) % text_blocks )) \
       count=$text_pages status=none >> "$img"
    # Keep page alignment (a short read at a source's end), then zeros.
    size=$(stat -c %s "$img")
    truncate -s $(( (size + PAGE - 1) / PAGE * PAGE + zero_pages * PAGE )) "$img"
done
rm -f "$tmp/libs.bin" "$tmp/text.bin"
printf 'run-alloc-bench: sample %d MiB (%d rounds of %d library + %d text + %d zero pages)\n' \
       $(( $(stat -c %s "$img") / MiB )) "$rounds" "$lib_pages" "$text_pages" "$zero_pages" >&2

# ---- 2. sizes ------------------------------------------------------------
for algo in lz4 zstd; do
    "$gen_sizes" -a "$algo" "$img" > "$tmp/$algo.sizes"
done
if [ -n "${ZSBENCH_SAVE_DIR:-}" ]; then
    mkdir -p -- "$ZSBENCH_SAVE_DIR"
    cp -- "$tmp/lz4.sizes" "$tmp/zstd.sizes" "$ZSBENCH_SAVE_DIR/"
    echo "run-alloc-bench: size files saved in $ZSBENCH_SAVE_DIR" >&2
fi
rm -f "$img"

# ---- 3. the benchmark ----------------------------------------------------
echo "run-alloc-bench: zsbench on the $ZSBENCH_ALGO sizes" >&2
echo >&2
"$zsbench" -s "$tmp/$ZSBENCH_ALGO.sizes" \
    -t "$ZSBENCH_THREADS" -n "$ZSBENCH_N" -r "$ZSBENCH_REPEATS" \
    -m "$ZSBENCH_MIB" -c "$ZSBENCH_CHAINS" "$@"
