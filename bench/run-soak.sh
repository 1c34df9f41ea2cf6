#!/usr/bin/env bash
# Soak test (issue 11): a SIZE device served by the zram plugin with
# compaction on and mem_limit at half of what the data needs, for DURATION
# seconds, from five connections at once:
#
#   - 4 fio jobs (nbd engine), each its own connection and its own region,
#     verify=crc32c with verify_backlog (verification all along the run),
#     serialize_overlap=1 (a trim and the write after it to the same block
#     are never in flight together: NBD does not order them):
#       randrw-75          random writes and reads, half each
#       randrw-60          the same
#       trimwrite-40       blocks trimmed, then written, sweeping the region
#       trimwrite-25       the same
#     (the number: how compressible the data is, in per cent).
#     ENOSPC from a write is expected (continue_on_error=write,
#     ignore_error=,ENOSPC): fio drops a failed write from its verify log,
#     so it is not a verify error; any other error, and any verify failure,
#     still ends the job with an error.
#   - bench/soak-zero-client.py (libnbd): on the last region, writes (whole
#     and partial blocks), zeroes (may-trim, NO_HOLE, partial), trims and
#     reads against a shadow; a write or zero refused with ENOSPC must leave
#     the old contents.
#
# First a calibration server without a limit gets every region written
# once with its data, and its limit_used is "what the data needs";
# mem_limit defaults to half of that.  Every SAMPLE seconds the server's
# VmRSS and its stats file go to OUT/samples.csv (and OUT/rss.png when
# gnuplot is installed).  At the end it checks: no fio verify error, no
# mismatch in the client, ENOSPC happened and writes succeeded after it,
# the server is alive and exits cleanly, RSS (sampled, and VmHWM) never
# above mem_limit + OVERHEAD_MIB, and the median RSS of the last third
# of the run at most GROWTH_MIB above that of the second third.
#
#   bench/run-soak.sh                       # 30 minutes, MODE=normal
#   MODE=swap bench/run-soak.sh             # the same with swap=on
#   DURATION=60 bench/run-soak.sh           # a quick trial
#
# Environment: DURATION (1800), SIZE (2G; K/M/G), MODE (normal | swap),
# SWAP (on; in MODE=swap: on | try; on falls back to try, saying why, when
# the server refuses to start with it), OUT (/tmp/soak-results/MODE-DATE),
# MEM_LIMIT (half the calibrated need, e.g. 512M), COMP (lz4), IODEPTH (8),
# SAMPLE (10), OVERHEAD_MIB (48), GROWTH_MIB (8), BUILD_DIR (build),
# NBDKIT, PLUGIN (copied into OUT and run from there).  With gnuplot,
# nbdkit-zramctl plot draws OUT/history.png from the server's control
# channel (every 2 s: memory used against stored, ratio, compaction,
# writeback) beside OUT/rss.png.
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"

DURATION=${DURATION:-1800}
SIZE=${SIZE:-2G}
MODE=${MODE:-normal}
COMP=${COMP:-lz4}
IODEPTH=${IODEPTH:-8}
SAMPLE=${SAMPLE:-10}
OVERHEAD_MIB=${OVERHEAD_MIB:-48}
GROWTH_MIB=${GROWTH_MIB:-8}
OUT=${OUT:-/tmp/soak-results/$MODE-$(date +%Y%m%d-%H%M%S)}

die () { echo "run-soak: $*" >&2; exit 1; }
case $MODE in
    normal) SWAP=off ;;
    swap) SWAP=${SWAP:-on} ;;
    *) die "MODE must be normal or swap" ;;
esac
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: build first"
for prog in "$NBDKIT" fio /usr/bin/python3; do
    command -v "$prog" >/dev/null || die "$prog not found"
done
/usr/bin/python3 -c 'import nbd' 2>/dev/null || die "python3 lacks the nbd module (python3-libnbd)"

to_mib () {
    local s=$1
    case $s in
        *[kK]) echo $(( ${s%?} / 1024 )) ;;
        *[mM]) echo "${s%?}" ;;
        *[gG]) echo $(( ${s%?} * 1024 )) ;;
        *) echo $(( s / 1048576 )) ;;
    esac
}
SIZE_MIB=$(to_mib "$SIZE")
[ "$SIZE_MIB" -ge 64 ] || die "SIZE must be at least 64M"
# Regions: 4 for fio, what is left (about 1/16) for the client.
PY_MIB=$(( SIZE_MIB / 16 ))
REGION_MIB=$(( (SIZE_MIB - PY_MIB) / 4 ))
PY_MIB=$(( SIZE_MIB - 4 * REGION_MIB ))
PY_OFFSET=$(( 4 * REGION_MIB * 1048576 ))

mkdir -p "$OUT"
OUT=$(readlink -f "$OUT")
# Run a private copy: a rebuild must not rewrite the .so under a running server.
cp "$PLUGIN" "$OUT/plugin.so"
sock=$OUT/sock
uri="nbd+unix:///?socket=$sock"
server_pid=
sampler_pid=
cleanup () {
    [ -z "$sampler_pid" ] || kill "$sampler_pid" 2>/dev/null || :
    [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || :
    rm -f "$sock" "$OUT/stats.tmp"
}
trap cleanup EXIT
log () { echo "run-soak: $(date +%T) $*" | tee -a "$OUT/summary.txt" >&2; }

# start_server LOGNAME ARGS...: start nbdkit on $sock, set server_pid.
start_server () {
    local name=$1
    shift
    rm -f "$sock"
    # The plugin logs every write refused for mem_limit (millions here):
    # keep the first 20 of them and count the rest.
    "$NBDKIT" -f -U "$sock" "$OUT/plugin.so" "${SIZE_MIB}M" comp="$COMP" "$@" \
        2> >(awk '/mem_limit reached/ { if (++n > 20) next }
                  { print; fflush() }
                  END { if (n > 20) print "run-soak: " n - 20 " more mem_limit errors not kept" }' \
             >> "$OUT/$name.log") &
    server_pid=$!
    for _ in $(seq 100); do
        [ -S "$sock" ] && return 0
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    wait "$server_pid" 2>/dev/null || :
    server_pid=
    sleep 0.5  # the log's awk
    return 1
}
stop_server () {
    local rc=0
    kill "$server_pid"
    wait "$server_pid" || rc=$?
    server_pid=
    return "$rc"
}

# The fio jobs: name rw compress-percentage.
# Not randtrimwrite: in fio 3.33 it only trims when its offset is not 0,
# and at offset 0 its verification is wrong once writes fail: a block
# written in one pass is trimmed in the next before fio verified it, the
# write after the trim fails with ENOSPC and is dropped from the verify
# log, but the entry of the older write is still there and reads zeros
# ("bad magic header 0"; the server's log filter shows Trim return=0,
# Write return=-1 error=ENOSPC, then the Read).  trimwrite sweeps its
# region, so fio has long verified a block when it comes back to it.
jobs=("randrw-75 randrw 75" "randrw-60 randrw 60"
      "trimwrite-40 trimwrite 40" "trimwrite-25 trimwrite 25")
fio_jobfile () {  # fio_jobfile calibrate|soak
    local i=0 name rw pct
    echo "[global]"
    echo "ioengine=nbd"
    echo "uri=$uri"
    echo "size=${REGION_MIB}m"
    echo "refill_buffers"
    if [ "$1" = calibrate ]; then
        echo "rw=write"
        echo "bs=1m"
        echo "iodepth=4"
    else
        echo "bs=4k"
        echo "iodepth=$IODEPTH"
        echo "time_based"
        echo "runtime=$DURATION"
        echo "verify=crc32c"
        echo "verify_backlog=256"
        echo "serialize_overlap=1"
        echo "verify_state_save=0"
        echo "continue_on_error=write"
        echo "ignore_error=,ENOSPC"
    fi
    for j in "${jobs[@]}"; do
        read -r name rw pct <<<"$j"
        echo
        echo "[$name]"
        [ "$1" = calibrate ] || echo "rw=$rw"
        [ "$1" = calibrate ] || [ "$rw" != randrw ] || echo "rwmixread=50"
        echo "offset=$(( i * REGION_MIB ))m"
        echo "buffer_compress_percentage=$pct"
        i=$((i + 1))
    done
    if [ "$1" = calibrate ]; then  # the client's region, with data like its own
        echo
        echo "[client-region]"
        echo "offset=$(( 4 * REGION_MIB ))m"
        echo "size=${PY_MIB}m"
        echo "buffer_compress_percentage=50"
    fi
}

: > "$OUT/summary.txt"
log "soak: MODE=$MODE SIZE=${SIZE_MIB}M DURATION=${DURATION}s COMP=$COMP, fio regions 4 x ${REGION_MIB} MiB, client region ${PY_MIB} MiB; output in $OUT"
log "nbdkit: $("$NBDKIT" --version | head -1); plugin copied from $PLUGIN"

# 1. Calibration: what the data needs with every region written once.
if [ -z "${MEM_LIMIT:-}" ]; then
    start_server calibrate stats="$OUT/calibrate.stats" ||
        die "the calibration server did not start: $(tail -3 "$OUT/calibrate.log")"
    fio_jobfile calibrate > "$OUT/calibrate.fio"
    fio "$OUT/calibrate.fio" > "$OUT/calibrate-fio.out" 2>&1 || die "calibration fio failed"
    sleep 2.5
    need=$(stat_of limit_used "$OUT/calibrate.stats")
    stop_server || :
    MEM_LIMIT=$(( need / 2 / 1048576 ))M
    log "calibration: the data of all regions needs $(( need / 1048576 )) MiB (limit_used, everything written once); mem_limit=$MEM_LIMIT"
fi
LIMIT_BYTES=$(( $(to_mib "$MEM_LIMIT") * 1048576 ))

# 2. The soak server.
args=(mem_limit="$MEM_LIMIT" stats="$OUT/stats" ctl="$OUT/ctl" compact=auto compact_threshold=2)
swap_note=
if [ "$SWAP" != off ]; then
    if ! start_server server "${args[@]}" swap="$SWAP"; then
        [ "$SWAP" = on ] || die "the server did not start: $(tail -3 "$OUT/server.log")"
        swap_note="swap=on refused to start: $(grep -m1 'swap=on' "$OUT/server.log" | sed 's/^nbdkit: error: //')"
        log "$swap_note"
        log "going on with swap=try (mlockall(MCL_ONFAULT) and the reserve, without what was refused)"
        SWAP=try
        start_server server "${args[@]}" swap=try ||
            die "the server did not start: $(tail -3 "$OUT/server.log")"
    fi
    args+=(swap="$SWAP")
else
    start_server server "${args[@]}" ||
        die "the server did not start: $(tail -3 "$OUT/server.log")"
fi
log "server: pid $server_pid, $NBDKIT -U $sock plugin.so ${SIZE_MIB}M comp=$COMP ${args[*]}"
# The run's history, drawn when the server goes away.
zramctl=$(readlink -f "$BUILD_DIR/tools/nbdkit-zramctl")
if command -v gnuplot >/dev/null && [ -x "$zramctl" ]; then
    for _ in $(seq 50); do [ -S "$OUT/ctl" ] && break; sleep 0.1; done
    "$zramctl" plot "$OUT/ctl" "$OUT/history.png" 0 2 2>>"$OUT/plot.log" &
fi
grep -i warning "$OUT/server.log" | sed 's/^/run-soak: server: /' >&2 || :
sleep 2.5
cp "$OUT/stats" "$OUT/stats.idle"
idle_rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$server_pid/status")
log "idle server: VmRSS $idle_rss KiB, metadata_bytes $(stat_of metadata_bytes "$OUT/stats.idle"), table_bytes $(stat_of table_bytes "$OUT/stats.idle"), codec_bytes $(stat_of codec_bytes "$OUT/stats.idle")"

# 3. The sampler: VmRSS, VmHWM, VmLck and the stats file every SAMPLE s.
fields="limit_used mem_used_total orig_data_size compr_data_size failed_writes writes reads notify_free pages_compacted pages_freeable compact_ms table_bytes metadata_bytes codec_bytes reserve_bytes reserve_misses"
echo "t_s,rss_kib,hwm_kib,lck_kib,${fields// /,}" > "$OUT/samples.csv"
(
    t0=$(date +%s)
    while kill -0 "$server_pid" 2>/dev/null; do
        st=$(awk '/^(VmRSS|VmHWM|VmLck):/ { v[$1] = $2 }
                  END { printf "%s,%s,%s,", v["VmRSS:"], v["VmHWM:"], v["VmLck:"] }' \
                 "/proc/$server_pid/status" 2>/dev/null) || break
        vals=$(awk -F': ' -v f="$fields" 'BEGIN { n = split(f, k, " ") }
                 { v[$1] = $2 } END { for (i = 1; i <= n; i++) printf "%s%s", (i > 1 ? "," : ""), v[k[i]] }' "$OUT/stats")
        echo "$(( $(date +%s) - t0 )),${st}${vals}" >> "$OUT/samples.csv"
        sleep "$SAMPLE"
    done
) &
sampler_pid=$!

# 4. The load.
fio_jobfile soak > "$OUT/soak.fio"
log "load: fio $OUT/soak.fio (4 connections) and soak-zero-client.py (1 connection), ${DURATION}s"
fio_rc=0
fio --output-format=json "$OUT/soak.fio" > "$OUT/fio.out" 2> "$OUT/fio.err" &
fio_pid=$!
py_rc=0
/usr/bin/python3 bench/soak-zero-client.py "$uri" "$PY_OFFSET" $(( PY_MIB * 1048576 )) \
    "$DURATION" "$$" "$OUT/client.json" 2> "$OUT/client.log" || py_rc=$?
wait "$fio_pid" || fio_rc=$?
sed -n '/^{/,$p' "$OUT/fio.out" > "$OUT/fio.json"
sleep 3
cp "$OUT/stats" "$OUT/stats.end"
alive=no
kill -0 "$server_pid" 2>/dev/null && alive=yes
hwm=$(awk '/^VmHWM:/ { print $2 }' "/proc/$server_pid/status" 2>/dev/null || echo 0)
sleep "$SAMPLE"  # one more sample, idle after the load
kill "$sampler_pid" 2>/dev/null || :
wait "$sampler_pid" 2>/dev/null || :
sampler_pid=
server_rc=0
if [ "$alive" = yes ]; then stop_server || server_rc=$?; else server_rc=dead; fi

# 5. The figures and the checks.
/usr/bin/python3 - "$OUT" "$LIMIT_BYTES" "$OVERHEAD_MIB" "$GROWTH_MIB" "$idle_rss" \
    "$hwm" "$alive" "$server_rc" "$fio_rc" "$py_rc" "$DURATION" "$SWAP" \
    "$swap_note" <<'EOF' | tee -a "$OUT/summary.txt"
import csv, json, re, statistics, sys
(out, limit, overhead_mib, growth_mib, idle_rss, hwm, alive, server_rc,
 fio_rc, py_rc, duration, swap, swap_note) = sys.argv[1:]
limit = int(limit); overhead = float(overhead_mib) * 1048576
MiB = 1048576.0
fails = []
def stats(path):
    d = {}
    for line in open(path):
        if ": " in line:
            k, v = line.rstrip("\n").split(": ", 1)
            d[k] = v
    return d
idle, end = stats(out + "/stats.idle"), stats(out + "/stats.end")

# fio
fj = json.load(open(out + "/fio.json"))
err = open(out + "/fio.err").read()
verify_errors = len(re.findall(r"verify failed|bad magic|bad header|verify: ", err))
print("\n| fio job | s | reads | writes | trims | read IOPS | write IOPS | trim IOPS | ENOSPC (failed writes) | error |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
tot = {"read": 0, "write": 0, "trim": 0, "err": 0}
for j in fj["jobs"]:
    s = j["job_runtime"] / 1000.0
    e = j.get("total_err", 0)
    print("| %s | %.0f | %d | %d | %d | %.0f | %.0f | %.0f | %d | %d |" % (
        j["jobname"], s, j["read"]["total_ios"], j["write"]["total_ios"],
        j["trim"]["total_ios"], j["read"]["iops"], j["write"]["iops"],
        j["trim"]["iops"], e, j["error"]))
    for d in ("read", "write", "trim"):
        tot[d] += j[d]["total_ios"]
    tot["err"] += e
    if j["error"] not in (0, 28):
        fails.append("fio job %s ended with error %d" % (j["jobname"], j["error"]))
        if j["error"] == 84:
            verify_errors += 1
if int(fio_rc):
    fails.append("fio exited with %s" % fio_rc)
if verify_errors:
    fails.append("fio: %d verify errors (see fio.err)" % verify_errors)

# client
try:
    c = json.load(open(out + "/client.json"))
except Exception as ex:
    c = None
    fails.append("soak-zero-client.py left no result (%s)" % ex)
if c:
    print("\n| client op | ops | ENOSPC | succeeded after the first ENOSPC |")
    print("|---|--:|--:|--:|")
    for k in c["ops"]:
        print("| %s | %d | %d | %d |" % (k, c["ops"][k], c["enospc"][k],
                                         c["ok_after_first_enospc"][k]))
    print("client: %d ops in %.0f s (%.0f/s), first ENOSPC at %s s, %d ENOSPC on several blocks that left some of them written, %d mismatches, %d other errors" % (
        c["ops_total"], c["seconds"], c["ops_per_s"], c["first_enospc_s"],
        c["enospc_partly_written"], c["mismatches"], c["other_errors"]))
    if c["mismatches"] or c["other_errors"]:
        fails.append("client: %d mismatches, %d other errors: %s" % (
            c["mismatches"], c["other_errors"],
            (c["mismatch_list"] + c["other_error_list"])[:3]))
if int(py_rc):
    fails.append("soak-zero-client.py exited with %s" % py_rc)

# ENOSPC and recovery, from the samples
rows = list(csv.DictReader(open(out + "/samples.csv")))
rows = [r for r in rows if r["rss_kib"] and r["limit_used"]]
def num(r, k): return float(r[k] or 0)
failed = int(end.get("failed_writes", 0))
first = next((r for r in rows if num(r, "failed_writes") > 0), None)
writes_after = (int(end["writes"]) - int(num(first, "writes"))) if first else 0
intervals = 0; recovered = 0
for a, b in zip(rows, rows[1:]):
    if num(b, "failed_writes") > num(a, "failed_writes"):
        intervals += 1
        if num(b, "writes") > num(a, "writes"):
            recovered += 1
print("\nENOSPC: server failed_writes %d (fio %d, client %d); first seen at %s s; %d writes succeeded after it; %d of %d sample intervals with failed writes also had successful writes" % (
    failed, tot["err"], sum(c["enospc"].values()) if c else 0,
    first["t_s"] if first else "-", writes_after, recovered, len(rows) - 1))
if failed == 0:
    fails.append("no ENOSPC happened: mem_limit too high for this load")
elif writes_after == 0:
    fails.append("no write succeeded after the first ENOSPC")

# RSS
rss = [num(r, "rss_kib") * 1024 for r in rows]
load_rows = [r for r in rows if num(r, "t_s") <= float(duration)]
lrss = [num(r, "rss_kib") * 1024 for r in load_rows] or rss
over = [num(r, "rss_kib") * 1024 - num(r, "limit_used") for r in rows]
hwm_b = int(hwm) * 1024
bound = limit + overhead
n = len(lrss)
second = lrss[n // 3: 2 * n // 3] or lrss
last = lrss[2 * n // 3:] or lrss
growth = statistics.median(last) - statistics.median(second)
lu = [num(r, "limit_used") for r in load_rows] or [0]
print("\nRSS (%d samples): min %.1f / median %.1f / max %.1f MiB, VmHWM %.1f MiB; mem_limit %.0f MiB + overhead %.0f MiB = %.0f MiB" % (
    len(rss), min(rss) / MiB, statistics.median(rss) / MiB, max(rss) / MiB,
    hwm_b / MiB, limit / MiB, overhead / MiB, bound / MiB))
print("limit_used: median %.1f, max %.1f MiB; RSS - limit_used (the stats file lags RSS by up to 1 s, so while memory grows this includes up to a second of growth): min %.1f / median %.1f / max %.1f MiB; idle server %.1f MiB (metadata %.2f MiB, codec %.2f MiB)" % (
    statistics.median(lu) / MiB, max(lu) / MiB, min(over) / MiB,
    statistics.median(over) / MiB, max(over) / MiB, int(idle_rss) / 1024.0,
    int(idle.get("metadata_bytes", 0)) / MiB, int(idle.get("codec_bytes", 0)) / MiB))
print("end of load: table %.2f MiB, metadata %.2f MiB, codec %.2f MiB, pages_compacted %s, compact_ms %s, compression_ratio %s" % (
    int(end.get("table_bytes", 0)) / MiB, int(end.get("metadata_bytes", 0)) / MiB,
    int(end.get("codec_bytes", 0)) / MiB, end.get("pages_compacted"),
    end.get("compact_ms"), end.get("compression_ratio")))
print("steady state: median RSS %.1f MiB in the second third, %.1f MiB in the last third: %+.1f MiB (allowed %s)" % (
    statistics.median(second) / MiB, statistics.median(last) / MiB, growth / MiB, growth_mib))
at = [o for r, o in zip(rows, over) if num(r, "limit_used") >= 0.95 * limit]
if at:
    print("at the limit (limit_used >= 95 %% of mem_limit, %d samples): RSS - limit_used min %.1f / median %.1f / max %.1f MiB; VmHWM - mem_limit %.1f MiB" % (
        len(at), min(at) / MiB, statistics.median(at) / MiB, max(at) / MiB,
        (hwm_b - limit) / MiB))
if max(rss) > bound or hwm_b > bound:
    fails.append("RSS above mem_limit + %s MiB (max sampled %.1f MiB, VmHWM %.1f MiB)" % (
        overhead_mib, max(rss) / MiB, hwm_b / MiB))
if growth > float(growth_mib) * MiB:
    fails.append("RSS grew %.1f MiB from the second to the last third" % (growth / MiB))
if "pages_compacted" in end and int(end["pages_compacted"]) == 0:
    fails.append("compaction never ran (pages_compacted 0)")

print("\nserver: swap=%s%s; alive at the end: %s; exit status %s" % (
    swap, " (" + swap_note + ")" if swap_note else "", alive, server_rc))
if alive != "yes":
    fails.append("the server died")
elif server_rc != "0":
    fails.append("the server exited with %s" % server_rc)
print("\n| check | result |\n|---|---|")
print("| fio verify errors | %d |" % verify_errors)
print("| client mismatches | %s |" % (c["mismatches"] if c else "-"))
print("| ENOSPC (failed writes) / writes after the first | %d / %d |" % (failed, writes_after))
print("| RSS max (sampled / VmHWM) vs mem_limit + overhead | %.1f / %.1f vs %.0f MiB |" % (max(rss) / MiB, hwm_b / MiB, bound / MiB))
print("| steady-state growth | %+.1f MiB |" % (growth / MiB))
print("| server alive, clean exit | %s, %s |" % (alive, server_rc))
print("\n" + ("PASS" if not fails else "FAIL:\n  " + "\n  ".join(fails)))
open(out + "/result", "w").write("PASS\n" if not fails else "FAIL\n")
EOF

if command -v gnuplot >/dev/null; then
    gnuplot <<EOF 2>>"$OUT/gnuplot.log" || log "gnuplot failed (see $OUT/gnuplot.log)"
set terminal pngcairo size 1200,700 noenhanced
set output "$OUT/rss.png"
set datafile separator ","
set key below
set yrange [0:*]
set y2range [0:*]
set title "nbdkit-zram soak, MODE=$MODE (swap=$SWAP), ${SIZE_MIB} MiB device, mem_limit $MEM_LIMIT"
set xlabel "seconds"
set ylabel "MiB"
set y2label "failed writes per second"
set y2tics
set ytics nomirror
prev = 0
plot "$OUT/samples.csv" every ::1 using 1:(\$2/1024) with lines lw 2 title "VmRSS", \
     "" every ::1 using 1:(\$5/1048576) with lines title "limit_used", \
     "" every ::1 using 1:(\$6/1048576) with lines title "mem_used_total", \
     $(( LIMIT_BYTES / 1048576 )) with lines dt 2 title "mem_limit", \
     $(( LIMIT_BYTES / 1048576 + OVERHEAD_MIB )) with lines dt 3 title "mem_limit + overhead", \
     "" every ::1 using 1:(d = \$9 - prev, prev = \$9, d / $SAMPLE) axes x1y2 with impulses title "ENOSPC/s"
EOF
    [ -f "$OUT/rss.png" ] && log "plot: $OUT/rss.png"
else
    log "gnuplot not installed: no plot ($OUT/samples.csv has the figures)"
fi
grep -qx PASS "$OUT/result"
