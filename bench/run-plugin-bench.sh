#!/usr/bin/env bash
# Compare nbdkit-zram with nbdkit's memory plugin, served over a unix
# socket, driven by real clients (fio's nbd engine, nbdcopy, nbdsh).
#
#   bench/run-plugin-bench.sh                 # about 6-8 minutes on 2 cores
#   QUICK=1 bench/run-plugin-bench.sh         # smoke run, about 1 minute
#
# Servers, in turn within each repeat (the order is rotated every repeat):
#   memory-sparse   nbdkit memory SIZE allocator=sparse
#   memory-zstd     nbdkit memory SIZE allocator=zstd    (the reference)
#   zram-lz4        nbdkit PLUGIN SIZE comp=lz4  stats=FILE
#   zram-zstd       nbdkit PLUGIN SIZE comp=zstd stats=FILE
#   base-lz4        nbdkit BASE_PLUGIN SIZE comp=lz4 stats=FILE  (the
#   base-zstd       build before, for a change's hot-path check; only
#                   with BASE_PLUGIN, and only when SERVERS names them)
#
# Part "fio", one nbdkit run per server: fill the DEV_SIZE device
# sequentially (fio, bs=1m, buffer_compress_percentage=65, refill_buffers),
# read the server's VmRSS, then RUNTIME seconds of 4 KiB randwrite and of
# randread (2 jobs x iodepth 16, the same compressible data).
#
# Part "copy", one nbdkit run per server, on a memory image (see
# make-memory-image.sh) and a device of exactly its size: the RSS of the
# empty server, nbdcopy of the image in (timed), the RSS and zram's
# statistics after it, nbdcopy back out to null: (timed), a check that the
# content reads back unchanged (first repeat only), a trim of the whole
# device timed inside nbdsh, and the RSS and statistics after the trim.
#
# Medians over the repeats are printed as markdown tables.
#
# Environment:
#   BUILD_DIR   build directory holding plugin/.libs/ (default: build)
#   NBDKIT      the nbdkit server, for both the plugin and the memory
#               plugin it is compared with (default: the one BUILD_DIR was
#               configured with, see setup.sh; else nbdkit on PATH)
#   PLUGIN      the plugin .so (default: $BUILD_DIR/plugin/.libs/nbdkit-zram-plugin.so)
#   BASE_PLUGIN another build's .so (the build before a change), served as
#               base-lz4 / base-zstd: e.g. SERVERS="zram-lz4 base-lz4"
#   REPEATS     repeats, medians printed (default: 3; QUICK: 1)
#   RUNTIME     seconds per fio randwrite / randread run (default: 10; QUICK: 2)
#   DEV_SIZE    device size for part fio (default: 1G; QUICK: 256M)
#   IMAGE       memory image to use; created with make-memory-image.sh if
#               missing (default: ${TMPDIR:-/tmp}/nbdkit-zram-memimage-<MiB>M.img,
#               kept for later runs)
#   IMAGE_MIB   size of the image to create (default: 256; QUICK: 64)
#   PARTS       which parts to run (default: "fio copy")
#   SERVERS     which servers (default: "memory-sparse memory-zstd zram-lz4 zram-zstd")
#   VERIFY      1: check the copy reads back unchanged in the first repeat,
#               all: in every repeat, 0: never (default: 1)
#   RAW=1       also print every run's raw values
#   QUICK=1     smoke-run defaults (explicit settings above still win)

set -euo pipefail
export PATH=/usr/bin:/bin:/usr/sbin:/sbin:$PATH
export LC_ALL=C

SELF=$(readlink -f "$0")

die () { echo "run-plugin-bench: $*" >&2; exit 1; }
warn () { echo "run-plugin-bench: $*" >&2; }

# --------------------------------------------------------------------------
# Helpers shared by the driver and the --inner-* modes (which run inside
# nbdkit --run, as a child of nbdkit's captive parent process).

now_ns () { date +%s%N; }

rss_kib () { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# nbdkit --run forks: the parent nbdkit process runs the command (its
# shell's $PPID) and its child nbdkit process is the server.  Find the
# server among the children of $1; fall back to $1 itself if it has none
# (a server that does not fork).
server_pid () {
    local parent=$1 c
    for c in $(cat /proc/"$parent"/task/*/children 2>/dev/null); do
        if [ "$(cat /proc/"$c"/comm 2>/dev/null)" = nbdkit ]; then
            echo "$c"; return 0
        fi
    done
    if [ "$(cat /proc/"$parent"/comm 2>/dev/null)" = nbdkit ]; then
        echo "$parent"; return 0
    fi
    return 1
}

# fio_json OUTFILE NAME ARGS...: run fio against $uri, JSON into OUTFILE.
fio_json () {
    local out=$1 name=$2; shift 2
    if ! fio --name="$name" --ioengine=nbd --uri="$uri" \
         --output-format=json "$@" >"$out.raw" 2>"$out.err"; then
        warn "fio $name failed:"; cat "$out.err" "$out.raw" >&2; return 1
    fi
    # The nbd engine prints lines before the JSON: keep from the first '{'.
    sed -n '/^{/,$p' "$out.raw" >"$out"
}

# fio_get FILE read|write iops|bw_bytes: summed over the (grouped) jobs.
fio_get () {
    /usr/bin/python3 -c '
import json, sys
with open(sys.argv[1]) as f:
    d = json.load(f)
jobs = d["jobs"]
err = [j["error"] for j in jobs if j.get("error")]
if err:
    sys.exit("fio reported error %s" % err)
print(sum(j[sys.argv[2]][sys.argv[3]] for j in jobs))
' "$@"
}

# wait_stats FILE PREFIX: the plugin rewrites its stats file every second
# (by rename); remove it, wait for the next one, print its fields as
# PREFIXkey=value.
wait_stats () {
    local f=$1 prefix=$2 i
    rm -f "$f"
    for i in $(seq 50); do
        [ -s "$f" ] && break
        sleep 0.1
    done
    [ -s "$f" ] || { warn "no stats file $f"; return 0; }
    awk -v p="$prefix" -F': ' 'NF == 2 && $1 ~ /^[a-z_]+$/ { print p $1 "=" $2 }' "$f"
}

trim_code='
import time
size = h.get_size()
if not h.can_trim():
    print("nan")
else:
    t = time.perf_counter()
    off = 0
    while off < size:
        n = min(size - off, 1 << 30)
        h.trim(n, off)
        off += n
    print("%.6f" % (time.perf_counter() - t))
'

# --inner-fio URI NBDKIT_PARENT_PID OUT
inner_fio () {
    uri=$1; local pid out=$3 tmp
    pid=$(server_pid "$2") || die "cannot find the nbdkit server process"
    tmp=$(dirname "$out")/fio.$$
    echo "rss_empty_kib=$(rss_kib "$pid")" >>"$out"

    local t0 t1
    t0=$(now_ns)
    fio_json "$tmp.fill" prefill --rw=write --bs=1m --iodepth=8 --numjobs=1 \
        --size="$DEV_BYTES" --buffer_compress_percentage=65 --refill_buffers
    t1=$(now_ns)
    echo "fill_ns=$((t1 - t0))" >>"$out"
    echo "fill_bw=$(fio_get "$tmp.fill" write bw_bytes)" >>"$out"
    echo "rss_fill_kib=$(rss_kib "$pid")" >>"$out"

    local rw
    for rw in randwrite randread; do
        fio_json "$tmp.$rw" "$rw" --rw="$rw" --bs=4k --numjobs=2 --iodepth=16 \
            --time_based --runtime="$RUNTIME" --group_reporting \
            --buffer_compress_percentage=65 --refill_buffers
        echo "${rw}_iops=$(fio_get "$tmp.$rw" "${rw#rand}" iops)" >>"$out"
    done
    echo "rss_end_kib=$(rss_kib "$pid")" >>"$out"
    rm -f "$tmp".*
}

# --inner-copy URI NBDKIT_PARENT_PID OUT STATSFILE|-  VERIFY(0|1)
inner_copy () {
    uri=$1; local pid out=$3 stats=$4 verify=$5 t0 t1 r
    pid=$(server_pid "$2") || die "cannot find the nbdkit server process"
    echo "rss_empty_kib=$(rss_kib "$pid")" >>"$out"

    t0=$(now_ns); nbdcopy "$IMAGE" "$uri"; t1=$(now_ns)
    echo "in_ns=$((t1 - t0))" >>"$out"
    echo "rss_copy_kib=$(rss_kib "$pid")" >>"$out"
    if [ "$stats" != - ]; then wait_stats "$stats" st_ >>"$out"; fi

    t0=$(now_ns); nbdcopy "$uri" null:; t1=$(now_ns)
    echo "out_ns=$((t1 - t0))" >>"$out"

    if [ "$verify" = 1 ]; then
        if nbdcopy "$uri" - | cmp -s - "$IMAGE"; then r=ok; else r=MISMATCH; fi
        echo "verify=$r" >>"$out"
        [ "$r" = ok ] || warn "content read back differs from the image"
    fi

    r=$(nbdsh -u "$uri" -c "$trim_code")
    echo "trim_s=$r" >>"$out"
    if [ "$stats" != - ]; then
        wait_stats "$stats" st2_ >>"$out"
    else
        sleep 1                 # same settling time as the zram runs
    fi
    echo "rss_trim_kib=$(rss_kib "$pid")" >>"$out"
}

case ${1:-} in
    --inner-fio) shift; inner_fio "$@"; exit 0 ;;
    --inner-copy) shift; inner_copy "$@"; exit 0 ;;
    "") ;;
    *) die "no arguments expected (settings come from the environment; see the header of $0)" ;;
esac

# --------------------------------------------------------------------------
# Driver.

cd "$(dirname "$SELF")/.."

if [ "${QUICK:-0}" = 1 ]; then
    : "${REPEATS:=1}" "${RUNTIME:=2}" "${DEV_SIZE:=256M}" "${IMAGE_MIB:=64}"
fi
BUILD_DIR=${BUILD_DIR:-build}
PLUGIN=${PLUGIN:-$BUILD_DIR/plugin/.libs/nbdkit-zram-plugin.so}
: "${NBDKIT:=$(sed -n 's/^NBDKIT = //p' "$BUILD_DIR/Makefile" 2>/dev/null || :)}"
NBDKIT=${NBDKIT:-nbdkit}
REPEATS=${REPEATS:-3}
RUNTIME=${RUNTIME:-10}
DEV_SIZE=${DEV_SIZE:-1G}
IMAGE_MIB=${IMAGE_MIB:-256}
IMAGE_GIVEN=${IMAGE:+1}
IMAGE=${IMAGE:-${TMPDIR:-/tmp}/nbdkit-zram-memimage-${IMAGE_MIB}M.img}
PARTS=${PARTS:-fio copy}
SERVERS=${SERVERS:-memory-sparse memory-zstd zram-lz4 zram-zstd}
VERIFY=${VERIFY:-1}

for prog in "$NBDKIT" fio nbdcopy nbdsh cmp awk; do
    command -v "$prog" >/dev/null || die "$prog not found"
done
[ -x /usr/bin/python3 ] || die "/usr/bin/python3 not found"
[ -f "$PLUGIN" ] || die "plugin $PLUGIN not found: build first (cd $BUILD_DIR && make), or set BUILD_DIR or PLUGIN"
PLUGIN=$(readlink -f "$PLUGIN")
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || die "REPEATS must be a positive integer"
[[ $RUNTIME =~ ^[1-9][0-9]*$ ]] || die "RUNTIME must be a positive integer"
[[ $IMAGE_MIB =~ ^[1-9][0-9]*$ ]] || die "IMAGE_MIB must be a positive integer"

DEV_BYTES=$(/usr/bin/python3 -c '
import sys, re
m = re.fullmatch(r"(\d+)([kKmMgGtT]?)", sys.argv[1])
if not m:
    sys.exit("DEV_SIZE: expected a number with an optional K/M/G/T suffix")
print(int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2).lower()])
' "$DEV_SIZE")

dump=$("$NBDKIT" "$PLUGIN" --dump-plugin 2>&1) || die "nbdkit cannot load $PLUGIN: $dump"
servers=()
for s in $SERVERS; do
    case $s in
        memory-sparse|memory-zstd) ;;
        zram-lz4|zram-zstd)
            grep -q "^zram_${s#zram-}=yes" <<<"$dump" ||
                { warn "$PLUGIN lacks ${s#zram-}: skipping $s"; continue; } ;;
        base-lz4|base-zstd)
            [ -f "${BASE_PLUGIN:-}" ] || die "$s needs BASE_PLUGIN, the other build's .so"
            BASE_PLUGIN=$(readlink -f "$BASE_PLUGIN") ;;
        *) die "unknown server '$s' in SERVERS" ;;
    esac
    servers+=("$s")
done
[ ${#servers[@]} -gt 0 ] || die "no servers to run"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/plugin-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
res=$tmp/results
mkdir "$res"

# server_args NAME SIZE STATSFILE: the nbdkit plugin and its parameters.
server_args () {
    case $1 in
        memory-sparse) args=(memory "$2" allocator=sparse) ;;
        memory-zstd)   args=(memory "$2" allocator=zstd) ;;
        zram-lz4)      args=("$PLUGIN" "$2" comp=lz4 stats="$3") ;;
        zram-zstd)     args=("$PLUGIN" "$2" comp=zstd stats="$3") ;;
        base-lz4)      args=("$BASE_PLUGIN" "$2" comp=lz4 stats="$3") ;;
        base-zstd)     args=("$BASE_PLUGIN" "$2" comp=zstd stats="$3") ;;
    esac
}

# One nbdkit run; a failure is reported and the benchmark goes on (its
# figures are then missing from the tables).
serve () {
    local name=$1 size=$2 stats=$3; shift 3
    server_args "$name" "$size" "$stats"
    if ! timeout -k 10 $((600 + 3 * RUNTIME)) "$NBDKIT" -U - "${args[@]}" --run "$*"; then
        warn "$name: run failed: $NBDKIT -U - ${args[*]} --run '$*'"
        return 0
    fi
}

q () { printf '%q' "$1"; }

export DEV_BYTES RUNTIME IMAGE

started=$(date +%s)
echo "# nbdkit-zram vs nbdkit memory plugin"
echo
echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- $("$NBDKIT" --version) ($NBDKIT), $(fio --version), $(nbdcopy --version 2>&1 | head -1)"
echo "- plugin: $PLUGIN"
echo "- repeats: $REPEATS (medians shown), servers alternated within each repeat"

if [[ " $PARTS " == *" copy "* ]]; then
    want=$((IMAGE_MIB * 1048576))
    if [ -f "$IMAGE" ] && { [ -n "${IMAGE_GIVEN:-}" ] || [ "$(stat -c %s "$IMAGE")" = "$want" ]; }; then
        echo "- memory image: $IMAGE (reused, $(($(stat -c %s "$IMAGE") / 1048576)) MiB)"
    else
        echo "- memory image: $IMAGE (created now)"
        bench/make-memory-image.sh "$IMAGE" "$IMAGE_MIB" | sed 's/^/    /' ||
            die "make-memory-image.sh failed"
    fi
    IMAGE=$(readlink -f "$IMAGE")
    IMAGE_BYTES=$(stat -c %s "$IMAGE")
    [ "$IMAGE_BYTES" -gt 0 ] || die "image $IMAGE is empty"
fi
echo

for rep in $(seq "$REPEATS"); do
    # Rotate the order each repeat so that no server always goes first.
    order=()
    n=${#servers[@]}
    for i in $(seq 0 $((n - 1))); do
        order+=("${servers[$(((i + rep - 1) % n))]}")
    done
    if [[ " $PARTS " == *" fio "* ]]; then
        for s in "${order[@]}"; do
            echo "run-plugin-bench: repeat $rep/$REPEATS fio $s" >&2
            out=$res/fio.$s.$rep
            : >"$out"
            serve "$s" "$DEV_BYTES" "$tmp/stats.$s" \
                "$(q "$SELF") --inner-fio \"\$uri\" \"\$PPID\" $(q "$out")"
        done
    fi
    if [[ " $PARTS " == *" copy "* ]]; then
        for s in "${order[@]}"; do
            echo "run-plugin-bench: repeat $rep/$REPEATS copy $s" >&2
            out=$res/copy.$s.$rep
            : >"$out"
            st=-
            [[ $s == zram-* || $s == base-* ]] && st=$tmp/stats.$s
            v=0
            { [ "$VERIFY" = all ] || { [ "$VERIFY" = 1 ] && [ "$rep" = 1 ]; }; } && v=1
            serve "$s" "$IMAGE_BYTES" "$tmp/stats.$s" \
                "$(q "$SELF") --inner-copy \"\$uri\" \"\$PPID\" $(q "$out") $(q "$st") $v"
        done
    fi
done

# --------------------------------------------------------------------------
# Tables.

/usr/bin/python3 - "$res" "${servers[*]}" "$PARTS" "$DEV_SIZE" "$RUNTIME" \
    "${IMAGE_BYTES:-0}" "${RAW:-0}" <<'PYEOF'
import math, os, statistics, sys

resdir, servers, parts, dev_size, runtime, image_bytes, raw = sys.argv[1:]
servers = servers.split()
image_bytes = int(image_bytes)
MiB = 1 << 20

runs = {}            # (part, server) -> list of dicts
for name in sorted(os.listdir(resdir)):
    part, server, rep = name.split(".")
    d = {}
    with open(os.path.join(resdir, name)) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            if not k:
                continue
            try:
                d[k] = float(v)
            except ValueError:
                d[k] = v
    d["rep"] = int(rep)
    runs.setdefault((part, server), []).append(d)

def med(part, server, key, f=lambda x: x):
    vals = []
    for d in runs.get((part, server), []):
        v = d.get(key)
        if isinstance(v, float) and not math.isnan(v):
            vals.append(f(v, d) if f.__code__.co_argcount == 2 else f(v))
    return statistics.median(vals) if vals else None

def fmt(v, spec):
    return "-" if v is None else format(v, spec)

def table(head, rows):
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(":---" if i == 0 else "---:" for i in range(len(head))) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()

def ratio(a, b):
    return None if a is None or not b else a / b

def nruns(part, s):
    return len(runs.get((part, s), []))

if "fio" in parts.split():
    print("## fio, %s device, 4 KiB random I/O, 2 jobs x iodepth 16, %s s each"
          % (dev_size, runtime))
    print()
    print("Device filled first with fio (bs=1m); data buffer_compress_percentage=65.")
    print()
    w_ref = med("fio", "memory-zstd", "randwrite_iops")
    r_ref = med("fio", "memory-zstd", "randread_iops")
    rows = []
    for s in servers:
        w = med("fio", s, "randwrite_iops")
        r = med("fio", s, "randread_iops")
        rows.append([s, fmt(w, ",.0f"), fmt(r, ",.0f"),
                     fmt(med("fio", s, "rss_fill_kib", lambda v: v / 1024), ".0f"),
                     fmt(ratio(w, w_ref), ".2f"), fmt(ratio(r, r_ref), ".2f"),
                     fmt(med("fio", s, "fill_bw", lambda v: v / 1e6), ".0f"),
                     str(nruns("fio", s))])
    table(["server", "randwrite IOPS", "randread IOPS", "RSS after fill MiB",
           "write ratio vs memory-zstd", "read ratio vs memory-zstd",
           "prefill MB/s", "runs"], rows)

if "copy" in parts.split():
    print("## memory image, %.0f MiB: nbdcopy in and out, trim of the whole device"
          % (image_bytes / MiB))
    print()
    rows = []
    for s in servers:
        def rss_ratio(v, d):
            delta = (d["rss_copy_kib"] - d["rss_empty_kib"]) * 1024
            return image_bytes / delta if delta > 0 else float("nan")
        ver = sorted(set(d.get("verify") for d in runs.get(("copy", s), [])
                         if "verify" in d))
        rows.append([s,
                     fmt(med("copy", s, "in_ns", lambda v: image_bytes / v * 1e3), ".0f"),
                     fmt(med("copy", s, "out_ns", lambda v: image_bytes / v * 1e3), ".0f"),
                     fmt(med("copy", s, "rss_empty_kib", lambda v: v / 1024), ".1f"),
                     fmt(med("copy", s, "rss_copy_kib", lambda v: v / 1024), ".1f"),
                     fmt(med("copy", s, "rss_copy_kib", rss_ratio), ".2f"),
                     fmt(med("copy", s, "trim_s"), ".3f"),
                     fmt(med("copy", s, "rss_trim_kib", lambda v: v / 1024), ".1f"),
                     ",".join(ver) if ver else "-",
                     str(nruns("copy", s))])
    table(["server", "copy-in MB/s", "copy-out MB/s", "RSS empty MiB",
           "RSS after copy MiB", "RSS ratio", "trim s", "RSS after trim MiB",
           "read back", "runs"], rows)
    print("RSS ratio = image size / (RSS after copy - RSS empty).  nbdcopy writes")
    print("all-zero 4 KiB blocks as zero requests (its default --sparse=4096).")
    print()
    zs = [s for s in servers if s.startswith("zram-")]
    if zs:
        print("zram statistics (stats= file) after the copy, and after the trim:")
        print()
        rows = []
        for s in zs:
            def m(k, f=lambda v: v):
                return med("copy", s, k, f)
            def mib(v):
                return v / MiB
            rows.append([s,
                         fmt(m("st_orig_data_size", mib), ".1f"),
                         fmt(m("st_compr_data_size", mib), ".1f"),
                         fmt(m("st_mem_used_total", mib), ".1f"),
                         fmt(m("st_compression_ratio"), ".2f"),
                         fmt(m("st_memory_ratio"), ".2f"),
                         fmt(m("st_same_pages"), ".0f"),
                         fmt(m("st_huge_pages"), ".0f"),
                         fmt(m("st2_orig_data_size", mib), ".1f"),
                         fmt(m("st2_mem_used_total", mib), ".1f")])
        table(["server", "orig_data_size MiB", "compr_data_size MiB",
               "mem_used_total MiB", "compression_ratio", "memory_ratio",
               "same_pages", "huge_pages", "orig_data_size after trim MiB",
               "mem_used_total after trim MiB"], rows)

if raw == "1":
    print("## raw runs")
    print()
    for (part, s), ds in sorted(runs.items()):
        for d in sorted(ds, key=lambda d: d["rep"]):
            print("- %s %s rep %d: %s" % (part, s, d["rep"], ", ".join(
                "%s=%s" % (k, v) for k, v in d.items() if k != "rep")))
    print()
PYEOF

echo "Total time: $(( $(date +%s) - started )) s; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
