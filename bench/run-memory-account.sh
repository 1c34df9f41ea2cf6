#!/usr/bin/env bash
# Memory per GiB stored, and where it goes: a memory image copied into
# this plugin (after `idle all` and the default `pack type=idle`, as a
# cold swap device's data ends up) and into `nbdkit memory
# allocator=zstd`, alternating, REPEATS times; printed: the medians of
# each server's RSS and its ratio (image bytes / RSS), ours over the
# peer's, and the last run's `memory` reply - our RSS by kind beside
# what the store counts (issue 42's account).
#
#   bench/run-memory-account.sh             # a few minutes on 2 cores
#
# Environment: BUILD_DIR (build), NBDKIT, PLUGIN, IMAGE (a memory image;
# made with make-memory-image.sh if missing), IMAGE_MIB (256), REPEATS
# (3), COMP (zstd), PACK (1: `idle all` + `pack type=idle` first; 0: not),
# PLUGIN_ARGS (more parameters for our server, e.g. "chain=4").
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"

IMAGE_MIB=${IMAGE_MIB:-256}
IMAGE=${IMAGE:-${TMPDIR:-/tmp}/nbdkit-zram-memimage-${IMAGE_MIB}M.img}
REPEATS=${REPEATS:-3}
COMP=${COMP:-zstd}
PACK=${PACK:-1}
PLUGIN_ARGS=${PLUGIN_ARGS:-}

die () { echo "run-memory-account: $*" >&2; exit 1; }
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: build first"
for prog in "$NBDKIT" nbdcopy /usr/bin/python3; do
    command -v "$prog" >/dev/null || die "$prog not found"
done
[ -f "$IMAGE" ] || bench/make-memory-image.sh "$IMAGE" "$IMAGE_MIB" >&2 ||
    die "make-memory-image.sh failed"
image_bytes=$(stat -c %s "$IMAGE")
size=$(( (image_bytes + (1 << 20) - 1) >> 20 ))M

bench_tmp


# ask COMMAND: the control channel's reply, without its "ok".
ask () {
    /usr/bin/python3 - "$tmp/ctl" "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
data = b""
while not (data.endswith(b"ok\n") or b"error: " in data):
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
text = data.decode()
if "error: " in text:
    sys.exit("%s: %s" % (sys.argv[2], text.strip()))
print(text[:-3], end="")
EOF
}


: > "$tmp/results"
for round in $(seq "$REPEATS"); do
    echo "run-memory-account: round $round of $REPEATS" >&2
    # shellcheck disable=SC2086 # PLUGIN_ARGS: words
    serve "$PLUGIN" "$size" comp="$COMP" ctl="$tmp/ctl" $PLUGIN_ARGS
    nbdcopy "$IMAGE" "nbd+unix:///?socket=$tmp/sock"
    if [ "$PACK" = 1 ]; then
        ask "idle all" > /dev/null
        start=$(date +%s.%N)
        ask "pack type=idle" > /dev/null
        echo "pack_seconds $(awk "BEGIN { print $(date +%s.%N) - $start }")" >> "$tmp/results"
    fi
    ask compact > /dev/null
    sleep 2
    echo "zram $(rss_kib "$server_pid")" >> "$tmp/results"
    ask memory > "$tmp/memory"
    stop
    serve memory "$size" allocator=zstd
    nbdcopy "$IMAGE" "nbd+unix:///?socket=$tmp/sock"
    sleep 2
    echo "memory-zstd $(rss_kib "$server_pid")" >> "$tmp/results"
    stop
done

/usr/bin/python3 - "$tmp/results" "$tmp/memory" "$image_bytes" "$COMP" "$PACK" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, value = line.split()
    runs.setdefault(name, []).append(float(value) if name == "pack_seconds"
                                     else int(value) * 1024)
image = int(sys.argv[3])
print("%.1f MiB image, comp=%s%s, median of %d runs" % (
    image / 2**20, sys.argv[4], ", after idle all + pack type=idle" if sys.argv[5] == "1" else "",
    len(runs["zram"])))
ratio = {}
for name in ("zram", "memory-zstd"):
    rss = statistics.median(runs[name])
    ratio[name] = image / rss
    print("  %-12s RSS %8.1f MiB  ratio %.2fx" % (name, rss / 2**20, ratio[name]))
print("  ours / nbdkit memory allocator=zstd: %.3fx" % (ratio["zram"] / ratio["memory-zstd"]))
if "pack_seconds" in runs:
    print("  pack type=idle took %.1f s" % statistics.median(runs["pack_seconds"]))
print("where our RSS goes (the last run's `memory`), MiB:")
for line in open(sys.argv[2]):
    name, value = line.split()
    print("  %-24s %10.1f" % (name, int(value) / 2**20) if name not in ("stacks",)
          else "  %-24s %10d" % (name, int(value)))
EOF
