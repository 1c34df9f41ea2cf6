#!/usr/bin/env bash
# One cold tier for every device, in a region (backing=, device= and
# region= together; COLD TIER ACROSS STORES in store/block-store.h):
#   - a crash's recovery walks every device's entries into the one space
#     map: each export reads back its own blocks, those in the cold tier
#     too, and blocks written back after the recovery do not land on
#     another device's runs (a map rebuilt from the default export's
#     entries alone would give them out again);
#   - the tier's capacity is the one the map was made with: a restart
#     that declares more devices (a larger capacity asked) or fewer is
#     served, the capacity unchanged, and every block reads back;
#   - a device's forced remove gives its runs back, and a recovery after
#     it finds the same room in use;
#   - an NBD export as the tier: a restart finds it smaller than the
#     region's room and is refused, naming it; the region is kept.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3 ipcs

region="$tmp/region"
cold="$tmp/cold"
segment () { sed -n 's/.* shm=\([0-9]*\) .*/\1/p' "$region" 2>/dev/null; }
cleanup_add 'id=$(segment); [ -z "$id" ] || ipcrm -m "$id" 2>/dev/null'
cleanup_add 'for p in "$tmp"/pid*; do [ -e "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null; done; :'
gone () { while [ -e "/proc/$(cat "$1")" ]; do sleep 0.05; done; }
# start N [PARAMETERS]: a server on sock$N, pid$N, ctl$N: the default
# export 4M and a, 8M; the tier's room asked: 12M, and more with more
# devices declared.
start () {
    local n=$1; shift
    rm -f "$tmp/sock$n" "$tmp/ctl$n"
    zram_nbdkit -U "$tmp/sock$n" -P "$tmp/pid$n" "$PLUGIN" 4M \
        region="$region" backing="$cold" ctl="$tmp/ctl$n" mem_limit=64M \
        device=a:8M "$@"
}

cat > "$tmp/cold.py" <<'EOF'
# cold.py SOCKET CTL STEP: the steps below, on every export.
import os, random, sys, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
sock, ctl, step = sys.argv[1], Ctl(sys.argv[2]), sys.argv[3]
B = 4096

def block(name, i, version):
    # Incompressible (written back whole), naming its export and version.
    rng = random.Random("%s/%d/%d" % (name, i, version))
    return (name.encode() + b"/%d/%d/" % (i, version)).ljust(32, b".") \
        + rng.randbytes(B - 32)

def connect(name):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sock); return h

def on(name):
    return " device=%s" % name if name else ""

def bd(name):
    return int(ctl.ok("bd_stat" + on(name))[0].split()[0])

def stat(key):
    return int(ctl.stats()[key])

def write_back(name):
    ctl.ok("idle all" + on(name))
    lines = ctl.ok("writeback idle" + on(name))
    assert "stopped" not in lines[0], lines
    return int(lines[0].split()[1])

# What each export holds, by block: its version (0: never written).
WRITTEN = {"": range(0, 512), "a": range(0, 1024), "b": range(0, 512)}
REWRITTEN = {"a": range(0, 64)}         # version 2, after the writeback
LATER = {"": range(512, 1024)}          # after the recovery: version 1

def version(name, i, later):
    if i in REWRITTEN.get(name, ()):
        return 2
    if i in WRITTEN.get(name, ()) or (later and i in LATER.get(name, ())):
        return 1
    return 0

def check(later):
    for name in WRITTEN:
        h = connect(name)
        for i in range(1024):
            v = version(name, i, later)
            want = block(name, i, v) if v else bytes(B)
            assert h.pread(B, i * B) == want, (step, name, i, v)
        h.shutdown()

if step == "fill":
    ctl.ok("add b 4M")
    for name, blocks in WRITTEN.items():
        h = connect(name)
        for i in blocks:
            h.pwrite(block(name, i, 1), i * B)
        h.shutdown()
    counts = {name: write_back(name) for name in WRITTEN}
    assert counts == {"": 512, "a": 1024, "b": 512}, counts
    h = connect("a")
    for i in REWRITTEN["a"]:
        h.pwrite(block("a", i, 2), i * B)
    h.shutdown()
    check(False)
    print("fill: %s blocks written back; a's first 64 written again in "
          "memory; %d bytes of the tier used" % (counts, stat("backing_used")))
elif step == "recovered":
    assert stat("recoveries") == 1, stat("recoveries")
    held = {name: bd(name) for name in WRITTEN}
    assert held == {"": 512, "a": 960, "b": 512}, held
    check(False)
    # New runs for the default export: none may be a device's.
    h = connect("")
    for i in LATER[""]:
        h.pwrite(block("", i, 1), i * B)
    h.shutdown()
    assert write_back("") == 512
    check(True)
    print("recovered: every export read back, the cold tier's blocks per "
          "device %s; 512 more written back after it, none over another's"
          % held)
elif step.startswith("restarted"):
    capacity = stat("backing_capacity")
    assert capacity == 12 << 20, capacity
    check(True)
    print("%s: the tier's capacity %d bytes, as made; every export read "
          "back" % (step, capacity))
elif step == "remove":
    used = stat("backing_used")
    ctl.ok("remove b force")
    after = stat("backing_used")
    assert after == used - 512 * B, (used, after)
    del WRITTEN["b"]
    check(True)
    print("remove: b's %d bytes of runs given back" % (used - after))
elif step == "stat":
    print(stat(sys.argv[4]))
elif step == "after-remove":
    del WRITTEN["b"]
    assert stat("backing_used") == int(sys.argv[4]), \
        (stat("backing_used"), sys.argv[4])
    check(True)
    print("after the remove and a crash: the same %s bytes used, every "
          "export read back" % sys.argv[4])
EOF
cold () { /usr/bin/python3 "$tmp/cold.py" "$tmp/sock$1" "$tmp/ctl$1" "${@:2}"; }

start 1 || fail "the first server"
cold 1 fill || fail "fill"
kill -9 "$(cat "$tmp/pid1")"; gone "$tmp/pid1"
start 2 || fail "the recovery"
cold 2 recovered || fail "after the recovery"
kill "$(cat "$tmp/pid2")"; gone "$tmp/pid2"
# More room asked (d declared: 20M) and less (nothing but a): the map's.
start 3 device=d:8M || fail "a restart with d declared as well"
cold 3 restarted-with-more || fail "a restart with more devices"
kill "$(cat "$tmp/pid3")"; gone "$tmp/pid3"
rm -f "$tmp/sock4" "$tmp/ctl4"
zram_nbdkit -U "$tmp/sock4" -P "$tmp/pid4" "$PLUGIN" 4M region="$region" \
    backing="$cold" ctl="$tmp/ctl4" mem_limit=64M || fail "a restart with no device declared"
cold 4 restarted-with-fewer || fail "a restart with fewer devices"
[ "$(stat -c %s "$cold")" -ge $((12 << 20)) ] || fail "the tier's file is $(stat -c %s "$cold") bytes"
cold 4 remove || fail "remove b"
used=$(cold 4 stat backing_used)
kill -9 "$(cat "$tmp/pid4")"; gone "$tmp/pid4"
start 5 || fail "the recovery after the remove"
cold 5 after-remove "$used" || fail "after the remove and a crash"
kill "$(cat "$tmp/pid5")"; gone "$tmp/pid5"

# ---- an NBD export too small for the region's room ------------------------
"$ZRAMCTL" region remove "$region" || fail "region remove"
remote_start memory 64M
cold="nbd+unix:///?socket=$tmp/remote.sock"
start 6 || fail "a server with an NBD export as its tier"
[ "$(cold 6 stat backing_capacity)" = $((12 << 20)) ] ||
    fail "the export's room is not the 12M asked"
kill "$(cat "$tmp/pid6")"; gone "$tmp/pid6"
remote_stop
remote_start memory 8M
id=$(segment)
if start 7 2>"$tmp/small.err"; then fail "an export smaller than the region's room was taken"; fi
grep -q "the cold tier (backing=) is smaller than the stored device's" "$tmp/small.err" ||
    fail "the refusal: $(cat "$tmp/small.err")"
[ "$(segment)" = "$id" ] || fail "the refused server changed the region"
echo "ok: one cold tier for every device in a region"
