#!/usr/bin/env bash
# Memory of a server locked for swap: resident memory (RSS) of the
# nbdkit process, for each way of running it, alternating, REPEATS times,
# medians printed:
#
#   plain        zram SIZE mem_limit=...               (no locking)
#   swap         zram SIZE swap=on mem_limit=...       (swap=try where this
#                                                       process lacks
#                                                       CAP_SYS_RESOURCE: the
#                                                       same locking and
#                                                       reserve)
#   nbdkit-swap  nbdkit --swap zram SIZE mem_limit=... (mlockall without
#                                                       MCL_ONFAULT)
#   memory, memory --swap   nbdkit's memory plugin, for reference (idle only)
#
# Phases: idle (2 s after a first client connected and left: the worker
# threads exist), loaded (a memory image copied in with nbdcopy, 2 s
# later), trimmed (2 s after trimming the whole device).  Targets (issue
# 8): idle RSS with swap <= 1.2 x plain; 2 s after the trim, RSS within
# 16 MiB of idle.
#
#   bench/run-swap-bench.sh                 # about 2 minutes on 2 cores
#
# Environment: BUILD_DIR (build), NBDKIT (the one BUILD_DIR was configured
# with), PLUGIN, IMAGE (a memory image; made with make-memory-image.sh if
# missing), IMAGE_MIB (256), REPEATS (3), COMP (lz4).
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"

IMAGE_MIB=${IMAGE_MIB:-256}
IMAGE=${IMAGE:-${TMPDIR:-/tmp}/nbdkit-zram-memimage-${IMAGE_MIB}M.img}
REPEATS=${REPEATS:-3}
COMP=${COMP:-lz4}
SIZE=$((IMAGE_MIB * 2))M
LIMIT=$((IMAGE_MIB * 3 / 2))M

die () { echo "run-swap-bench: $*" >&2; exit 1; }
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: build first"
for prog in "$NBDKIT" nbdcopy nbdinfo nbdsh; do
    command -v "$prog" >/dev/null || die "$prog not found"
done
[ -f "$IMAGE" ] || bench/make-memory-image.sh "$IMAGE" "$IMAGE_MIB" >&2 ||
    die "make-memory-image.sh failed"

swap_mode=on
effective=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
(( (16#$effective >> 24) & 1 )) || swap_mode=try

bench_tmp


uri () { echo "nbd+unix:///?socket=$tmp/sock"; }

# measure NAME FULL(yes|no) ARGS...: one run, appends "NAME idle loaded
# trimmed" (KiB) to $tmp/results.
measure () {
    local name="$1" full="$2"
    shift 2
    serve "$@"
    nbdinfo --size "$(uri)" >/dev/null
    sleep 2
    local idle loaded=0 trimmed=0
    idle=$(rss_kib "$server_pid")
    if [ "$full" = yes ]; then
        nbdcopy "$IMAGE" "$(uri)"
        sleep 2
        loaded=$(rss_kib "$server_pid")
        nbdsh -u "$(uri)" -c 'h.trim(h.get_size(), 0)'
        sleep 2
        trimmed=$(rss_kib "$server_pid")
    fi
    stop
    echo "$name $idle $loaded $trimmed" >> "$tmp/results"
}

: > "$tmp/results"
for round in $(seq "$REPEATS"); do
    echo "run-swap-bench: round $round of $REPEATS" >&2
    measure plain yes "$PLUGIN" "$SIZE" comp="$COMP" mem_limit="$LIMIT"
    measure "swap=$swap_mode" yes "$PLUGIN" "$SIZE" comp="$COMP" \
        mem_limit="$LIMIT" swap="$swap_mode"
    measure "nbdkit --swap" yes --swap "$PLUGIN" "$SIZE" comp="$COMP" \
        mem_limit="$LIMIT"
    measure "memory" no memory "$SIZE"
    measure "memory --swap" no --swap memory "$SIZE"
done

/usr/bin/python3 - "$tmp/results" "$IMAGE_MIB" "$swap_mode" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    *name, idle, loaded, trimmed = line.split()
    rows.setdefault(" ".join(name), []).append((int(idle), int(loaded), int(trimmed)))
med = {n: [statistics.median(v[i] for v in runs) / 1024 for i in range(3)]
       for n, runs in rows.items()}
print("RSS of the nbdkit process, MiB, median of %d runs; %s MiB memory image"
      % (len(next(iter(rows.values()))), sys.argv[2]))
print()
print("| server | idle | loaded | 2 s after trimming all | trimmed - idle | idle / plain idle |")
print("|---|---:|---:|---:|---:|---:|")
plain_idle = med["plain"][0]
for name, (idle, loaded, trimmed) in med.items():
    if loaded:
        print("| %s | %.1f | %.1f | %.1f | %+.1f | %.2fx |"
              % (name, idle, loaded, trimmed, trimmed - idle, idle / plain_idle))
    else:
        print("| %s | %.1f | - | - | - | %.2fx |" % (name, idle, idle / plain_idle))
swap = med["swap=" + sys.argv[3]]
print()
print("targets: swap idle / plain idle %.2f (<= 1.2); swap trimmed - idle %.1f MiB (<= 16)"
      % (swap[0] / plain_idle, swap[2] - swap[0]))
EOF
