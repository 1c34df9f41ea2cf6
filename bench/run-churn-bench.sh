#!/usr/bin/env bash
# Memory under churn: does the pool follow the live data?  With
# compact=auto and compact=off in turn (alternating, REPEATS times,
# medians printed), on the nbdkit the build was configured with:
#
#   1. fill a DEV_MIB device with pages of a real memory image (see
#      make-memory-image.sh; the image is repeated to fill the device),
#      in 64 KiB writes;
#   2. trim a random half of its 4 KiB blocks, wait 2 s;
#   3. steady churn: CHURN_OPS random operations, half overwrites with
#      other image pages, half trims, sampling the stats file every 0.5 s
#      (phases 1-3 with the default compact_threshold);
#   4. 4 KiB random-write IOPS (fio, 2 jobs x iodepth 16, RUNTIME s) over
#      a device filled the same way: every overwrite frees a slot, and
#      with compact=auto the housekeeper compacts every second that
#      anything is freeable (compact_threshold=0); compact=off never.
#
# Reported per mode: RSS above the idle server, pool pages
# (mem_used_total) and live compressed bytes (compr_data_size) after the
# fill, 2 s after the trim and during churn; pages compacted and the time
# spent compacting; IOPS.  Targets (issue 7): 2 s after trimming half, RSS
# above idle <= 55 % of what it was full; during churn pool pages <= 1.05
# x live compressed bytes; IOPS while compacting >= 0.9 x compact=off.
#
#   bench/run-churn-bench.sh                # about 6 minutes on 2 cores
#   QUICK=1 bench/run-churn-bench.sh        # about 1 minute
#
# Environment: BUILD_DIR (build), NBDKIT (the one BUILD_DIR was configured
# with), PLUGIN, DEV_MIB (1024; QUICK 128), CHURN_OPS (200000; QUICK
# 60000), RUNTIME (10; QUICK 3), REPEATS (3; QUICK 1), IMAGE (a memory
# image; made with make-memory-image.sh if missing), IMAGE_MIB (256;
# QUICK 64), COMP (lz4), PLOT (a PNG: nbdkit-zramctl plot draws the
# first compact=auto churn run's history into it).
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"

if [ "${QUICK:-0}" = 1 ]; then
    : "${DEV_MIB:=128}" "${CHURN_OPS:=60000}" "${RUNTIME:=3}" "${REPEATS:=1}" "${IMAGE_MIB:=64}"
fi
DEV_MIB=${DEV_MIB:-1024}
CHURN_OPS=${CHURN_OPS:-200000}
RUNTIME=${RUNTIME:-10}
REPEATS=${REPEATS:-3}
IMAGE_MIB=${IMAGE_MIB:-256}
IMAGE=${IMAGE:-${TMPDIR:-/tmp}/nbdkit-zram-memimage-${IMAGE_MIB}M.img}
COMP=${COMP:-lz4}

die () { echo "run-churn-bench: $*" >&2; exit 1; }
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: build first"
for prog in "$NBDKIT" fio /usr/bin/python3; do
    command -v "$prog" >/dev/null || die "$prog not found"
done
[ -f "$IMAGE" ] || bench/make-memory-image.sh "$IMAGE" "$IMAGE_MIB" >&2 ||
    die "make-memory-image.sh failed"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/churn-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The driver, run by nbdkit --run: prints one line of key=value.
cat > "$tmp/churn.py" <<'EOF'
import os, random, subprocess, sys, time, nbd

uri, image, stats, phase = sys.argv[1:5]
dev = int(os.environ["DEV_MIB"]) << 20
B = 4096
blocks = dev // B

def server_pid():
    """The nbdkit serving us: a child named nbdkit of the nbdkit above us."""
    pid = os.getppid()
    while pid > 1:
        if open("/proc/%d/comm" % pid).read().strip() == "nbdkit":
            for task in os.listdir("/proc/%d/task" % pid):
                for child in open("/proc/%d/task/%s/children" % (pid, task)).read().split():
                    if open("/proc/%s/comm" % child).read().strip() == "nbdkit":
                        return int(child)
            return pid
        pid = int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
    raise SystemExit("no nbdkit server found")

server = server_pid()
def rss():
    for line in open("/proc/%d/status" % server):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

def stat(fresh=True):
    """The stats file as a dict: the next one the housekeeper writes, or
    (not fresh) the current one.
    """
    if fresh:
        try:
            os.unlink(stats)
        except FileNotFoundError:
            pass
    for _ in range(50):
        try:
            fields = {}
            for line in open(stats):
                key, sep, value = line.partition(": ")
                if sep and key.isidentifier():
                    try:
                        fields[key] = float(value)
                    except ValueError:
                        pass            # swap_mode: off, and other words
            if "mem_used_total" in fields:
                return fields
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    raise SystemExit("no stats file")

data = open(image, "rb").read()
pages = len(data) // B
h = nbd.NBD()
h.connect_uri(uri)
rng = random.Random(42)
out = {}

time.sleep(1.2)
out["idle_rss"] = rss()
# 64 KiB requests: nbdkit keeps a buffer per worker thread as big as
# the largest request it served, which would count as RSS here.
chunk = 1 << 16
for off in range(0, dev, chunk):
    start = off % (len(data) - chunk + 1)
    h.pwrite(data[start:start + chunk], off)
s = stat()
out["full_rss"] = rss()
out["full_pool"], out["full_live"] = s["mem_used_total"], s["compr_data_size"]

if phase == "churn":
    for i in rng.sample(range(blocks), blocks // 2):
        h.trim(B, i * B)
    time.sleep(2)
    s = stat()
    out["trim_rss"] = rss()
    out["trim_pool"], out["trim_live"] = s["mem_used_total"], s["compr_data_size"]

    samples = []
    next_sample = time.monotonic() + 0.5
    t = time.monotonic()
    for n in range(int(os.environ["CHURN_OPS"])):
        i = rng.randrange(blocks)
        if rng.random() < 0.5:
            p = rng.randrange(pages)
            h.pwrite(data[p * B:(p + 1) * B], i * B)
        else:
            h.trim(B, i * B)
        if time.monotonic() >= next_sample:
            s = stat(fresh=False)
            samples.append(s["mem_used_total"] / max(s["compr_data_size"], 1))
            next_sample = time.monotonic() + 0.5
    out["churn_s"] = time.monotonic() - t
    samples.sort()
    out["churn_pool_over_live"] = samples[len(samples) // 2] if samples else 0
    out["churn_pool_over_live_max"] = samples[-1] if samples else 0
    s = stat()
    out["churn_rss"] = rss()
    out["churn_pool"], out["churn_live"] = s["mem_used_total"], s["compr_data_size"]
    out["pages_compacted"], out["compact_ms"] = s["pages_compacted"], s["compact_ms"]
else:
    # fio overwrites the full device: every write frees a slot somewhere,
    # and the housekeeper compacts what that leaves (threshold 0).
    h.shutdown()
    compacted_before = s["pages_compacted"]
    r = subprocess.run(["fio", "--name=w", "--ioengine=nbd", "--uri=" + uri,
                        "--rw=randwrite", "--bs=4k", "--numjobs=2", "--iodepth=16",
                        "--time_based", "--runtime=" + os.environ["RUNTIME"],
                        "--size=%d" % (dev // 2), "--offset_increment=%d" % (dev // 2),
                        "--buffer_compress_percentage=65", "--refill_buffers",
                        "--group_reporting", "--output-format=terse", "--terse-version=3"],
                       capture_output=True, text=True, check=True)
    line = [l for l in r.stdout.splitlines() if l.startswith("3;")][0].split(";")
    out["iops"] = float(line[48])     # terse v3: write iops
    s = stat()
    out["fio_compacted"] = s["pages_compacted"] - compacted_before
print(" ".join("%s=%s" % kv for kv in out.items()))
EOF

plotted=
run () {
    local mode=$1 phase=$2 out=$3 threshold=2 ctl=() plotter=
    [ "$phase" != fio ] || threshold=0
    if [ -n "${PLOT:-}" ] && [ -z "$plotted" ] && [ "$mode" = auto ] &&
        [ "$phase" = churn ]; then
        plotted=yes
        rm -f "$tmp/ctl"
        ctl=(ctl="$tmp/ctl")
        (for _ in $(seq 100); do [ -S "$tmp/ctl" ] && break; sleep 0.05; done
         "$BUILD_DIR/tools/nbdkit-zramctl" plot "$tmp/ctl" "$PLOT" 0 0.5) &
        plotter=$!
    fi
    DEV_MIB=$DEV_MIB CHURN_OPS=$CHURN_OPS RUNTIME=$RUNTIME \
        "$NBDKIT" -U - "$PLUGIN" "${DEV_MIB}M" comp="$COMP" compact="$mode" \
        compact_threshold=$threshold ${ctl[@]+"${ctl[@]}"} \
        stats="$tmp/stats" --run "/usr/bin/python3 '$tmp/churn.py' \"\$uri\" '$IMAGE' '$tmp/stats' $phase" \
        >> "$out"
    [ -z "$plotter" ] || wait "$plotter" || echo "run-churn-bench: the plot failed" >&2
}

echo "# Memory under churn: compact=auto against compact=off"
echo
echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $("$NBDKIT" --version), comp=$COMP"
echo "- ${DEV_MIB} MiB device filled from $IMAGE ($(($(stat -c %s "$IMAGE") >> 20)) MiB, repeated)"
echo "- churn: $CHURN_OPS operations (half overwrites, half trims); fio: ${RUNTIME} s"
echo "- repeats: $REPEATS, modes alternated, medians"
for r in $(seq "$REPEATS"); do
    for mode in auto off; do
        echo "run-churn-bench: repeat $r, compact=$mode" >&2
        run "$mode" churn "$tmp/churn-$mode"
        run "$mode" fio "$tmp/fio-$mode"
    done
done

/usr/bin/python3 - "$tmp" <<'EOF'
import statistics, sys
tmp = sys.argv[1]
def load(name):
    rows = []
    for line in open("%s/%s" % (tmp, name)):
        rows.append({k: float(v) for k, v in (f.split("=") for f in line.split())})
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}
M = 2 ** 20
res = {m: (load("churn-" + m), load("fio-" + m)) for m in ("auto", "off")}
print()
print("| compact | pool full MiB | live full MiB | RSS-idle full MiB | pool 2 s after trimming half | live | RSS-idle | RSS kept | churn: pool / live (median, max) | pool / live after churn | pages compacted | compact ms |")
print("|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for m in ("auto", "off"):
    c, f = res[m]
    kept = (c["trim_rss"] - c["idle_rss"]) / (c["full_rss"] - c["idle_rss"])
    print("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f %% | %.3f, %.3f | %.3f | %d | %d |" % (
        m, c["full_pool"] / M, c["full_live"] / M, (c["full_rss"] - c["idle_rss"]) / M,
        c["trim_pool"] / M, c["trim_live"] / M, (c["trim_rss"] - c["idle_rss"]) / M,
        100 * kept, c["churn_pool_over_live"], c["churn_pool_over_live_max"],
        c["churn_pool"] / max(c["churn_live"], 1), c["pages_compacted"], c["compact_ms"]))
print()
print("| compact | randwrite IOPS over the full device | pages compacted meanwhile |")
print("|:--|--:|--:|")
for m in ("auto", "off"):
    f = res[m][1]
    print("| %s | %.0f | %d |" % (m, f["iops"], f["fio_compacted"]))
print()
print("IOPS while compacting, auto / off: %.2f" % (res["auto"][1]["iops"] / res["off"][1]["iops"]))
EOF
