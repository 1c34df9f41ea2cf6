#!/usr/bin/env bash
# One cold tier for every device (backing= with device=, COLD TIER ACROSS
# STORES in store/block-store.h):
#   - each device writes back into the one backing store (bd_stat its
#     own), and every export reads back its own blocks, none of another's;
#   - the backing store has room for the default export and the devices
#     declared at start, which a device added later shares: with the
#     declared devices' blocks written back it is full for the new one,
#     and a declared device's remove gives its runs back, so the new one's
#     writeback then goes through;
#   - a write refused for memory on one device writes back the coldest
#     blocks of all: another device's idle blocks first, none of its own;
#   - removes (forced) while another device's writes write back the
#     removed device's blocks: the writer's blocks read back, the server
#     lives (a store leaves the budget only once no writeback holds it);
#   - with region= as well: test-plugin-region-cold-devices.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh

# What both servers' scripts use.
cat > "$tmp/cold_common.py" <<'EOF'
import os, random, sys, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
sock, ctl = sys.argv[1], Ctl(sys.argv[2])
B = 4096
MIB = 256                       # blocks

def connect(name):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sock); return h

def block(name, i, version=0):
    # Incompressible (stored raw, written back as 8 sectors), and naming
    # its export: a read of another's block cannot pass.
    rng = random.Random("%s/%d/%d" % (name, i, version))
    return (name.encode() + b"/%d/%d/" % (i, version)).ljust(32, b".") \
        + rng.randbytes(B - 32)

def bd_count(name):
    return int(ctl.ok("bd_stat device=%s" % name if name else "bd_stat")[0].split()[0])
EOF

cat > "$tmp/cold.py" <<'EOF'
import sys
sys.path.insert(0, sys.argv[3])
from cold_common import *

def writeback(name):
    lines = ctl.ok("writeback idle" + (" device=%s" % name if name else ""))
    return int(lines[0].split()[1]), "stopped backing_full" in lines

SIZES = {"": 4 * MIB, "a": 8 * MIB, "b": 8 * MIB}   # declared: 20 MiB of room
handles = {name: connect(name) for name in SIZES}
for name, blocks in SIZES.items():
    for i in range(blocks):
        handles[name].pwrite(block(name, i), i * B)
for name in SIZES:
    ctl.ok("idle all" + (" device=%s" % name if name else ""))
assert writeback("a") == (8 * MIB, False), writeback("a")
assert writeback("b") == (8 * MIB, False)
assert bd_count("a") == 8 * MIB and bd_count("b") == 8 * MIB and bd_count("") == 0
for name, blocks in SIZES.items():
    for i in range(blocks):
        assert handles[name].pread(B, i * B) == block(name, i), (name, i)
# The metrics: each device's blocks in the tier a series of its own, the
# tier's room once.
from prometheus_client.parser import text_string_to_metric_families
families = {f.name: f for f in text_string_to_metric_families(
    "\n".join(ctl.ok("metrics")) + "\n")}
held = {s.labels["device"]: s.value
        for s in families["nbdkit_zram_backing_blocks"].samples}
assert held == {"zram": 0, "zram/a": 8 * MIB, "zram/b": 8 * MIB}, held
assert len(families["nbdkit_zram_backing_used_bytes"].samples) == 1
print("one cold tier: a and b wrote back %d blocks each into it, every "
      "export read back its own; a metrics series each" % (8 * MIB))

# A device added later shares what the declared ones left: 4 MiB.
ctl.ok("add c 8M")
c = connect("c")
for i in range(8 * MIB):
    c.pwrite(block("c", i), i * B)
ctl.ok("idle all device=c")
written, full = writeback("c")
assert full and 0 < written <= 4 * MIB, (written, full)
# a's runs back: the rest of c goes.
handles["a"].shutdown()
ctl.ok("remove a force")
more, full = writeback("c")
assert not full and written + more == 8 * MIB, (written, more, full)
for i in range(8 * MIB):
    assert c.pread(B, i * B) == block("c", i), ("c", i)
for i in range(8 * MIB):
    assert handles["b"].pread(B, i * B) == block("b", i), ("b", i)
print("a device added later: %d blocks written back before the store was "
      "full, the other %d once a's remove gave its runs back" % (written, more))
EOF

zram_nbdkit -U - "$PLUGIN" 4M device=a:8M device=b:8M backing="$tmp/cold1" \
    ctl="$tmp/ctl1" \
    --run "/usr/bin/python3 '$tmp/cold.py' \"\$unixsocket\" '$tmp/ctl1' '$tmp'" ||
    fail "one cold tier"

cat > "$tmp/room.py" <<'EOF'
import sys, threading, time
sys.path.insert(0, sys.argv[3])
from cold_common import *

# mem_limit 8M: a fills 6 MiB and goes idle; b's 6 MiB then fit only if
# a's blocks go to the cold tier: the coldest first, across devices.
a, b = connect("a"), connect("b")
for i in range(6 * MIB):
    a.pwrite(block("a", i), i * B)
ctl.ok("idle all device=a")
for i in range(6 * MIB):
    b.pwrite(block("b", i), i * B)
assert bd_count("a") > 0 and bd_count("b") == 0, (bd_count("a"), bd_count("b"))
for i in range(6 * MIB):
    assert a.pread(B, i * B) == block("a", i), ("a", i)
    assert b.pread(B, i * B) == block("b", i), ("b", i)
print("b's writes at mem_limit wrote back %d of a's idle blocks, none of "
      "its own; both read back" % bd_count("a"))

# Removes while b's writes write back the removed device's blocks.
a.shutdown()
ctl.ok("remove a force")
rounds, writes, d_written = 0, [0], 0
stop = [False]
def writer():
    h = connect("b")
    version = 1
    while not stop[0]:
        for i in range(0, 6 * MIB, 7):
            h.pwrite(block("b", i, version), i * B)
            writes[0] += 1
        version += 1
    h.shutdown()
    writes.append(version - 1)
thread = threading.Thread(target=writer)
thread.start()
deadline = time.monotonic() + 6
while time.monotonic() < deadline:
    ctl.ok("add d 8M")
    d = connect("d")
    for i in range(0, 2 * MIB):
        d.pwrite(block("d", i), i * B)
    ctl.ok("idle all device=d")
    ctl.ok("idle all device=b")
    time.sleep(0.05)
    d_written += bd_count("d")
    d.shutdown()
    ctl.ok("remove d force")
    rounds += 1
stop[0] = True
thread.join()
last = writes.pop()
for i in range(6 * MIB):
    want = block("b", i, last) if i % 7 == 0 else block("b", i)
    assert b.pread(B, i * B) == want, ("b", i)
# b's writes at the limit wrote d's idle blocks back while d was removed.
assert d_written > 0, "no writeback of d's blocks: the window was not met"
print("%d adds and forced removes of d beside %d writes to b (%d of d's "
      "blocks written back by them): b read back whole"
      % (rounds, writes[0], d_written))
EOF

zram_nbdkit -U - "$PLUGIN" 4M device=a:8M device=b:8M mem_limit=8M \
    backing="$tmp/cold2" ctl="$tmp/ctl2" \
    --run "/usr/bin/python3 '$tmp/room.py' \"\$unixsocket\" '$tmp/ctl2' '$tmp'" ||
    fail "room across devices"

echo "ok: one cold tier for every device"
