#!/usr/bin/env bash
# Devices: named exports beside the default one, on one memory budget
# (device=NAME:SIZE[:comp=A][:level=N], plugin/devices.h).
#   - bad declarations refused at start, each naming device= and what is
#     wrong; the parameters devices do not go with yet refused by name
#     (swap= they do: test-plugin-swap-burst);
#   - the exports listed (NBD_OPT_LIST: the default and every device,
#     with its size and algorithm), each its own size, an unknown name
#     refused at the handshake;
#   - 18 connections over the default export and 8 devices at once,
#     random writes, trims and reads against one exact model per export
#     (a block's bytes name its export): 0 reads of another export's or a
#     stale block;
#   - one budget: a device that fills mem_limit leaves the default
#     export ENOSPC too (its old blocks intact), and its trims give the
#     room back;
#   - the control channel: devices, info/mm_stat with device=NAME,
#     unknown device refused; nbdkit-zramctl's listing, a row a device;
#   - add and remove while serving: a device added is served, a remove
#     refused while a client is connected, done once it is gone, its
#     pages back in the pool, the name refused after; added again, it is
#     empty; bad adds refused; and removes and adds in a loop beside 4
#     clients that connect, write, read back and go (every connection
#     keeps its device to its end, both windows met);
#   - caps and floors: a capped device refused (ENOSPC) at its cap with
#     its old block intact, the default export refused short of another
#     device's floor, whose device then stores its floor's worth; the
#     listing, stats and metrics show them; add with cap= and floor=,
#     and a floor that does not fit refused;
#   - the automatic policy (pack_after=) packs each device's idle blocks.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh
requires_zramctl

expect_refusal ()
{
    local text="$1"
    shift
    if zram_nbdkit -U - "$PLUGIN" 16M "$@" --run true 2>/dev/null; then
        fail "started with $*"
    fi
    grep -q -- "$text" "$NBDKIT_STDERR" ||
        fail "$*: no '$text' in: $(cat "$NBDKIT_STDERR")"
    echo "ok: refused $*: $(grep -o "error: .*" "$NBDKIT_STDERR" | head -1)"
}
expect_refusal "device: the name first" device=bad/name:1M
expect_refusal "device: d1: '' is not a size" device=d1
expect_refusal "device: d1: '1k' is not a size of 4096 bytes or more" device=d1:1k
expect_refusal "device: d1: 'comp=brotli' is not comp=lz4|zstd, level=N, cap=SIZE or floor=SIZE" device=d1:1M:comp=brotli
expect_refusal "device: d1: 'cap=lots' is not cap=SIZE" device=d1:1M:cap=lots
expect_refusal "device: d1: floor= needs mem_limit" device=d1:1M:floor=1M
expect_refusal "device: d1: floor=2097152 is above cap=1048576" device=d1:1M:cap=1M:floor=2M mem_limit=8M
expect_refusal "device: d2: floor=4194304 and the other floors (4194304) do not fit in mem_limit (6291456)" device=d1:8M:floor=4M device=d2:8M:floor=4M mem_limit=6M
expect_refusal "device: d1: level 99 is not a valid zstd level" device=d1:1M:comp=zstd:level=99
expect_refusal "device: d1 is declared twice" device=d1:1M device=d1:2M

cat > "$tmp/devices.py" <<'EOF'
import os, random, subprocess, sys, threading, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
sock, ctl = sys.argv[1], Ctl(sys.argv[2])
B = 4096
EXPORTS = {"": 16 << 20, "a": 8 << 20, "b": 8 << 20, "c": 4 << 20}
EXPORTS.update({"d%d" % i: 2 << 20 for i in range(4, 9)})   # 8 devices

def connect(name, opt=False):
    h = nbd.NBD()
    h.set_export_name(name)
    if opt:
        h.set_opt_mode(True)
    h.connect_unix(sock)
    return h

# The list, as nbdinfo --list reads it.
h = connect("", opt=True)
listed = {}
h.opt_list(lambda name, description: listed.__setitem__(name, description) or 0)
h.opt_abort()
assert set(listed) == set(EXPORTS), listed
assert listed["b"] == "8388608 bytes, zstd" and listed["a"] == "8388608 bytes, lz4", listed
for name, size in EXPORTS.items():
    h = connect(name)
    assert h.get_size() == size, (name, h.get_size())
    h.shutdown()
try:
    connect("nope")
    raise AssertionError("an unknown export was served")
except nbd.Error as e:
    print("unknown export refused: %s" % e)
print("listed: %s" % listed)

# 18 connections over the default export and 8 devices, one model each.
def content(name, block, version):
    head = b"%s/%d/%d " % (name.encode() or b"-", block, version)
    return (head * (B // len(head) + 1))[:B]

models = {name: {} for name in EXPORTS}
locks = {name: [threading.Lock() for _ in range(size // B)]
         for name, size in EXPORTS.items()}
failures = []
def worker(seed, name):
    r = random.Random(seed)
    h = connect(name)
    blocks = EXPORTS[name] // B
    model = models[name]
    try:
        for _ in range(800):
            block = r.randrange(blocks)
            with locks[name][block]:
                what = r.random()
                if what < 0.45:
                    version = model.get(block, 0) + 1
                    h.pwrite(content(name, block, version), block * B)
                    model[block] = version
                elif what < 0.55:
                    h.trim(B, block * B)
                    model.pop(block, None)
                else:
                    got = h.pread(B, block * B)
                    want = content(name, block, model[block]) if block in model else bytes(B)
                    if got != want:
                        failures.append((name, block, got[:24]))
    finally:
        h.shutdown()
threads = [threading.Thread(target=worker, args=(i, list(EXPORTS)[i % len(EXPORTS)]))
           for i in range(2 * len(EXPORTS))]
for t in threads: t.start()
for t in threads: t.join()
assert not failures, failures[:5]
stored = 0
for name, size in EXPORTS.items():
    h = connect(name)
    for block in range(size // B):
        got = h.pread(B, block * B)
        want = content(name, block, models[name][block]) if block in models[name] else bytes(B)
        assert got == want, (name, block, got[:24])
    stored += len(models[name])
    h.shutdown()
print("%d connections over %d exports: %d blocks stored, every one read back "
      "as its export's, 0 from another" % (len(threads), len(EXPORTS), stored))

# The control channel, per device.  A client's close reaches the server
# a moment after its shutdown returns (long, under a sanitizer): wait
# for the connections to be gone.
import time
deadline = time.monotonic() + 30
while True:
    lines = ctl.ok("devices")
    if all(l.endswith("clients=0") for l in lines[1:]) or time.monotonic() > deadline:
        break
    time.sleep(0.01)
assert lines == ["- 16777216 lz4 1", "a 8388608 lz4 1 clients=0", "b 8388608 zstd 1 clients=0",
                 "c 4194304 lz4 3 clients=0"] + ["d%d 2097152 lz4 1 clients=0" % i
                                                for i in range(4, 9)], lines
info = dict(l.split(" ", 1) for l in ctl.ok("info device=b"))
assert info["disksize"] == "8388608" and info["algorithm"] == "zstd", info
for name in list(EXPORTS)[1:]:
    mm = [int(x) for x in ctl.ok("mm_stat device=%s" % name)[0].split()]
    assert mm[0] == len(models[name]) * B, (name, mm, len(models[name]))
mm = [int(x) for x in ctl.ok("mm_stat")[0].split()]
assert mm[0] == len(models[""]) * B, mm
# The server's totals: the stores' own figures summed, the pool's once.
parts = [[int(x) for x in ctl.ok("mm_stat device=%s" % n)[0].split()]
         for n in EXPORTS]
total = [int(x) for x in ctl.ok("mm_stat device=*")[0].split()]
assert total[0] == sum(len(m) for m in models.values()) * B, total
assert total[0] == sum(p[0] for p in parts) and total[1] == sum(p[1] for p in parts), (total, parts)
assert total[2:5] == parts[0][2:5], (total, parts[0])    # mem_used_total, limit, max
io = [[int(x) for x in ctl.ok("io_stat device=%s" % n)[0].split()] for n in EXPORTS]
io_total = [int(x) for x in ctl.ok("io_stat device=*")[0].split()]
assert io_total[:3] == [sum(p[k] for p in io) for k in range(3)], (io_total, io)
ctl.error("info device=*", r"device=\*: only mm_stat, io_stat and bd_stat")
ctl.error("info device=nope", r"unknown device 'nope'")
print("control: devices, info and mm_stat per device; mm_stat and io_stat "
      "device=* the server's totals (%d bytes stored in all)" % total[0])
# nbdkit-zramctl lists each device of the server as a row of its own.
out = subprocess.run([os.environ["ZRAMCTL"], "--raw", "-n", "--bytes", "-o",
                      "NAME,DISKSIZE,ALGORITHM,DATA", sys.argv[2]],
                     capture_output=True, text=True, check=True).stdout
rows = [l.split() for l in out.splitlines()]
path = sys.argv[2]
assert [r[:3] for r in rows] == [[path, "16777216", "lz4"],
                                 [path + "/a", "8388608", "lz4"],
                                 [path + "/b", "8388608", "zstd"],
                                 [path + "/c", "4194304", "lz4"]] + \
    [[path + "/d%d" % i, "2097152", "lz4"] for i in range(4, 9)], rows
assert [int(r[3]) for r in rows] == [len(models[n]) * B for n in EXPORTS], rows
print("nbdkit-zramctl: a row each: %s" % " ".join(r[0].rsplit("/", 1)[-1] for r in rows))
# The metrics: each device's own figures as a series with its device
# label (SERVER/DEVICE), the pool's once; parsed as Prometheus does.
from prometheus_client.parser import text_string_to_metric_families
families = {f.name: f for f in text_string_to_metric_families(
    "\n".join(ctl.ok("metrics")) + "\n")}
orig = {s.labels["device"]: s.value for s in families["nbdkit_zram_orig_data_bytes"].samples}
assert orig == {("zram/" + n if n else "zram"): len(models[n]) * B for n in EXPORTS}, orig
sizes = {s.labels["device"]: s.value for s in families["nbdkit_zram_disk_size_bytes"].samples}
assert sizes["zram/c"] == 4 << 20, sizes
assert [s.labels["device"] for s in families["nbdkit_zram_mem_used_bytes"].samples] == ["zram"]
print("metrics: a series per device: %s" % sorted(orig))
EOF
zram_nbdkit -U - "$PLUGIN" 16M device=a:8M device=b:8M:comp=zstd \
    device=c:4M:level=3 device=d4:2M device=d5:2M device=d6:2M device=d7:2M \
    device=d8:2M ctl="$tmp/ctl" \
    --run "/usr/bin/python3 '$tmp/devices.py' \"\$unixsocket\" '$tmp/ctl'" ||
    fail "devices"

cat > "$tmp/budget.py" <<'EOF'
import os, sys, nbd
sock = sys.argv[1]
B = 4096
def connect(name):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sock); return h
default, hot = connect(""), connect("hot")
old = os.urandom(B)
default.pwrite(old, 0)
data = {}
for block in range(8 << 20 >> 12):
    data[block] = os.urandom(B)          # incompressible: a page each
    try:
        hot.pwrite(data[block], block * B)
    except nbd.Error as e:
        assert "ENOSPC" in str(e), e
        del data[block]
        break
else:
    raise AssertionError("8 MiB went into a 4 MiB budget")
filled = len(data)
try:
    default.pwrite(os.urandom(B), 0)
    raise AssertionError("the default export wrote past the shared budget")
except nbd.Error as e:
    assert "ENOSPC" in str(e), e
assert default.pread(B, 0) == old, "the refused write changed the block"
hot.trim(filled // 2 * B, 0)
for block in range(1, filled // 4):
    default.pwrite(os.urandom(B), block * B)
for block in range(filled // 2, filled):
    assert hot.pread(B, block * B) == data[block], block
print("one budget: the hot device filled it (%d blocks), the default export "
      "was refused, and wrote %d blocks once the hot one trimmed"
      % (filled, filled // 4 - 1))
EOF
zram_nbdkit -U - "$PLUGIN" 8M mem_limit=4M device=hot:8M \
    --run "/usr/bin/python3 '$tmp/budget.py' \"\$unixsocket\"" ||
    fail "one budget"
# The example: three jobs, a device each, one budget.  Run as a user
# runs it (its own nbdkit command line), so not in the sanitizer builds,
# whose plugin needs the harness's preload.
if [ "$SANITIZERS" = no ]; then
    PLUGIN="$PLUGIN" NBDKIT="$NBDKIT" "$SRCDIR/examples/jobs.sh" 64M 16M \
        > "$tmp/jobs.out" 2>&1 || fail "examples/jobs.sh: $(cat "$tmp/jobs.out")"
    for job in job1 job2 job3; do
        grep -q "^$job: 16777216 bytes, its data at the start: PRETTY_NAME=" "$tmp/jobs.out" ||
            fail "examples/jobs.sh: no $job: $(cat "$tmp/jobs.out")"
        grep -q "^export=\"$job\":" "$tmp/jobs.out" ||
            fail "examples/jobs.sh: $job not listed: $(cat "$tmp/jobs.out")"
    done
    echo "ok: examples/jobs.sh: three jobs, a device each"
fi
# Devices added and removed while serving.
cat > "$tmp/add-remove.py" <<'EOF2'
import os, sys, threading, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
sock, ctl = sys.argv[1], Ctl(sys.argv[2])
B = 4096
def connect(name):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sock); return h
def pages():
    ctl.ok("compact")
    return int(ctl.ok("mm_stat")[0].split()[2])
def refused(name):
    try:
        connect(name)
        return False
    except nbd.Error as e:
        return "no export named" in str(e)

# Before any device, any name is the default export.
assert connect("anything").get_size() == 16 << 20
empty = pages()
ctl.ok("add d1 8M comp=zstd")
assert ctl.ok("devices")[1:] == ["d1 8388608 zstd 1 clients=0"], ctl.ok("devices")
h = connect("d1")
assert h.get_size() == 8 << 20
for i in range(256):
    h.pwrite(os.urandom(B // 2) * 2, i * B)
assert int(ctl.ok("mm_stat device=d1")[0].split()[0]) == 256 * B
assert ctl.ok("devices")[1:] == ["d1 8388608 zstd 1 clients=1"], ctl.ok("devices")
full = pages()
assert full >= empty + 64 * B, (empty, full)
ctl.error("remove d1", r"remove: d1: 1 client connected: disconnect it first \(or remove d1 force\)")
h.shutdown()
# A command the worker thread runs, on the device, holds it until it
# ends (a remove waits for it): this one ends at once (no backing store)
# and lets the remove below go on.
ctl.error("writeback idle device=d1", r"writeback")
deadline = time.monotonic() + 10
while True:
    lines, good, last = ctl.command("remove d1")
    if good:
        break
    assert "client connected" in last and time.monotonic() < deadline, last
    time.sleep(0.05)
after = pages()
assert after <= empty + 4 * B, (empty, full, after)
assert refused("d1") and refused("anything"), "a removed or unknown name was served"
ctl.ok("add d1 8M")
h = connect("d1")
assert h.pread(B, 0) == bytes(B), "a device added again holds the old one's data"
h.shutdown()
for line, pattern in (("add bad/name 1M", r"add: the name first"),
                      ("add d1 1M", r"add: d1 is a device already"),
                      ("add d2 1k", r"add: d2: '1k' is not a size"),
                      ("add d2 1M comp=brotli", r"add: d2: 'comp=brotli' is not"),
                      ("remove nope", r"remove: unknown device 'nope'")):
    ctl.error(line, pattern)
print("add and remove: the pool's pages %d KiB empty, %d KiB with d1's data, "
      "%d KiB after its removal; removed and unknown names refused"
      % (empty >> 10, full >> 10, after >> 10))

# Removes and adds beside connections that come and go: a connection
# that opened keeps its device to its end (each writes, then reads its
# own block back), the others are refused.  Removes are tried while the
# four clients run (refused while one is connected, done when all four
# happen to be away), and every half second the clients are parked
# between connections, so that a remove must be done and a connection
# then refused however slow (sanitized, loaded) the machine is: no
# window rests on chance.
import random
done, paused = [False], [False]
parked = [0]
parked_lock = threading.Lock()
served, refusals, bad = [0], [0], []
def client(seed):
    block = seed
    while not done[0]:
        if paused[0]:
            with parked_lock: parked[0] += 1
            while paused[0] and not done[0]:
                time.sleep(0.001)
            with parked_lock: parked[0] -= 1
            continue
        try:
            h = connect("hot")
        except nbd.Error:
            refusals[0] += 1
            time.sleep(0.001)
            continue
        data = os.urandom(B)
        h.pwrite(data, block * B)
        time.sleep(0.002)           # hold the device: a remove meets it
        if h.pread(B, block * B) != data:
            bad.append(block)
        h.shutdown()
        served[0] += 1
        time.sleep(random.uniform(0, 0.01))
# Daemons: a server that died must fail the test, not leave it waiting.
threads = [threading.Thread(target=client, args=(i,), daemon=True)
           for i in range(4)]
ctl.ok("add hot 4M")
for t in threads: t.start()
removed = busy = parked_removes = 0
def try_remove():
    global removed, busy
    lines, good, last = ctl.command("remove hot")
    if good:
        removed += 1
    else:
        assert "client" in last, last
        busy += 1
    return good
start = time.monotonic()
rounds = 0
while time.monotonic() < start + 4 or rounds < 3:
    round_end = time.monotonic() + 0.5
    while time.monotonic() < round_end:
        if try_remove():
            time.sleep(0.01)        # a window with no device
            ctl.ok("add hot 4M")
        else:
            time.sleep(0.001)
    # Park the clients: once the last has closed, the remove is done
    # (its server side may take a moment to see the close).
    paused[0] = True
    while parked[0] < len(threads):
        time.sleep(0.001)
    deadline = time.monotonic() + 30
    while not try_remove():
        assert time.monotonic() < deadline, "no remove with every client away"
        time.sleep(0.01)
    parked_removes += 1
    assert refused("hot"), "a removed device was served"
    refusals[0] += 1
    ctl.ok("add hot 4M")
    paused[0] = False
    rounds += 1
done[0] = True
for t in threads: t.join()
assert not bad, bad
assert removed and busy and served[0] and refusals[0], (removed, busy, served, refusals)
print("beside 4 clients: %d removes done (%d with the clients parked), %d "
      "refused while a client was connected; %d connections served, %d "
      "refused, every block read back"
      % (removed, parked_removes, busy, served[0], refusals[0]))

# A forced remove: the connected clients' requests fail with ESHUTDOWN
# from then on (never reaching a store destroyed or a device added
# again under the name), the memory comes back at once.  Two clients
# write and read back in a loop while it happens: every request before
# it succeeds with the right bytes, every one after it fails.
ctl.ok("add f1 8M")
empty = pages()
hs = [connect("f1") for _ in range(2)]
errors, after_ok = [[], []], [0]
removed_at = [None]
def hammer(k):
    h = hs[k]
    i = 0
    while True:
        block = (k * 1000 + i % 500) * B
        data = os.urandom(B // 2) * 2
        try:
            h.pwrite(data, block)
            assert h.pread(B, block) == data, "a forced remove let a read see other bytes"
            if removed_at[0] is not None:
                after_ok[0] += 1
        except nbd.Error as e:
            errors[k].append(e.errno)
            return
        i += 1
threads = [threading.Thread(target=hammer, args=(k,)) for k in range(2)]
for t in threads: t.start()
time.sleep(0.5)
full = pages()
assert full >= empty + 64 * B, (empty, full)
ctl.error("remove f1", r"2 clients connected: disconnect them first \(or remove f1 force\)")
ctl.error("remove f1 now", r"remove: NAME \[force\], not 'now'")
ctl.ok("remove f1 force")
removed_at[0] = time.monotonic()
for t in threads: t.join(30)
assert not any(t.is_alive() for t in threads), "a client's request hung after a forced remove"
assert errors == [["ESHUTDOWN"], ["ESHUTDOWN"]], errors
# A request that passed its device's check before the remove may end
# after it: at most one a client.
assert after_ok[0] <= 2, after_ok
assert "f1" not in " ".join(ctl.ok("devices"))
gone = pages()
assert gone <= empty + 4 * B, (empty, gone)
# Added again under the name: the old connections still fail, a new one
# finds the new device, empty.
ctl.ok("add f1 8M")
try:
    hs[0].pread(B, 0)
    raise AssertionError("an old connection reached the device added again")
except nbd.Error as e:
    assert e.errno == "ESHUTDOWN", e
h = connect("f1")
assert h.pread(B, 0) == bytes(B)
h.shutdown()
for h in hs: h.shutdown()
ctl.ok("remove f1")
print("forced remove: 2 clients writing, each got ESHUTDOWN after it (%d "
      "requests ended after it, passed before), the pool's pages %d KiB "
      "empty, %d KiB with the device's data, %d KiB after; the name added "
      "again empty" % (after_ok[0], empty >> 10, full >> 10, gone >> 10))
EOF2
zram_nbdkit -U - "$PLUGIN" 16M ctl="$tmp/ctl-add" \
    --run "/usr/bin/python3 '$tmp/add-remove.py' \"\$unixsocket\" '$tmp/ctl-add'" ||
    fail "add and remove"

cat > "$tmp/budget.py" <<'EOF2'
import os, sys, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
sock, ctl = sys.argv[1], Ctl(sys.argv[2])
B = 4096
def connect(name):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sock); return h
def fill(h, first, count, seed):
    """Random blocks from first on until ENOSPC: how many were stored."""
    for i in range(count):
        try:
            h.pwrite(os.urandom(B), (first + i) * B)
        except nbd.Error as e:
            assert e.errno == "ENOSPC", e
            return i
    return count

assert ctl.ok("devices")[1:] == ["capped 8388608 lz4 1 clients=0 cap=1048576",
                                 "floored 8388608 lz4 1 clients=0 floor=2097152"], ctl.ok("devices")
# The cap: 1 MiB of random blocks (one 4 KiB object each), then ENOSPC,
# and a rewrite past it keeps the old block.
capped = connect("capped")
first = os.urandom(B)
capped.pwrite(first, 0)
stored = 1 + fill(capped, 1, 2048, 1)
assert stored == 256, stored
try:
    capped.pwrite(os.urandom(B), 0)
    raise AssertionError("a rewrite past the cap was stored")
except nbd.Error as e:
    assert e.errno == "ENOSPC", e
assert capped.pread(B, 0) == first
s = ctl.stats("capped")
assert int(s["quota_bytes"]) == 1 << 20 and int(s["refused_for_budget"]) >= 2, s
# The floor: the default export fills what is left of mem_limit (8 MiB)
# short of the floor's 2 MiB, which the floored device then has.
default = connect("")
taken = fill(default, 0, 4096, 2)
s = ctl.stats("")
assert int(s["limit_used"]) + (2 << 20) <= (8 << 20) + B, s
assert int(s["refused_for_budget"]) >= 1 and int(s["budget_unmet_floors"]) == 2 << 20, s
floored = connect("floored")
kept = fill(floored, 0, 512, 3)
assert kept >= 512 - 16, kept
assert int(ctl.stats("floored")["budget_unmet_floors"]) == (2 << 20) - kept * B
# The metrics: cap, floor and the budget's series.
metrics = "\n".join(ctl.ok("metrics"))
for line in ('nbdkit_zram_cap_bytes{device="zram/capped"} 1048576',
             'nbdkit_zram_floor_bytes{device="zram/floored"} 2097152',
             'nbdkit_zram_budget_floors_bytes{device="zram"} 2097152'):
    assert line in metrics, line
# Borrowed: what the exports hold beyond a third of mem_limit each.
share = (8 << 20) // 3
held = [int(ctl.stats(d)["compr_data_size"]) for d in ("", "capped", "floored")]
want = sum(max(0, h - share) for h in held)
assert 'nbdkit_zram_budget_borrowed_bytes{device="zram"} %d' % want in metrics, \
    (want, [l for l in metrics.split("\n") if "borrowed" in l])
# add with cap= and floor=; a floor that does not fit refused.
# mem_limit at run time cannot go below the floors (it would refuse
# every other write), nor to none (floors need a limit).
ctl.error("mem_limit 1M", r"mem_limit: 1M cannot hold the devices' floors \(2097152 bytes\)")
ctl.error("mem_limit 0", r"mem_limit: 0 cannot hold the devices' floors")
# add takes every option on one line.
ctl.ok("add full 4M comp=zstd level=3 cap=2M floor=1M")
assert "full 4194304 zstd 3 clients=0 cap=2097152 floor=1048576" in ctl.ok("devices"), ctl.ok("devices")
ctl.ok("remove full")
ctl.error("add extra 4M cap=512K floor=1M", r"add: extra: floor=1048576 is above cap=524288")
ctl.error("add extra 4M floor=7M", r"add: extra: floor=7340032 and the other floors \(2097152\) do not fit in mem_limit \(8388608\)")
ctl.ok("add extra 4M cap=2M")
assert ctl.ok("devices")[3] == "extra 4194304 lz4 1 clients=0 cap=2097152", ctl.ok("devices")
print("caps and floors: %d blocks under a 1 MiB cap, a rewrite past it refused "
      "with the old block kept; the default export took %d blocks and was "
      "refused short of a 2 MiB floor, whose device then stored %d blocks"
      % (stored, taken, kept))
EOF2
zram_nbdkit -U - "$PLUGIN" 16M mem_limit=8M ctl="$tmp/ctl-budget" \
    device=capped:8M:cap=1M device=floored:8M:floor=2M \
    --run "/usr/bin/python3 '$tmp/budget.py' \"\$unixsocket\" '$tmp/ctl-budget'" ||
    fail "caps and floors"

# The automatic policy (pack_after=) packs each device's idle blocks as
# it packs the default export's, and the packed blocks read back.
cat > "$tmp/policy.py" <<'EOF2'
import os, sys, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
sock, ctl = sys.argv[1], Ctl(sys.argv[2])
B = 4096
blocks = {}
for name in ("p1", "p2"):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sock)
    for i in range(256):
        blocks[name, i] = (b"%s block %d " % (name.encode(), i)) * 500
        blocks[name, i] = blocks[name, i][:B]
        h.pwrite(blocks[name, i], i * B)
    h.shutdown()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    packed = [int(ctl.stats(n)["packed_blocks"]) for n in ("p1", "p2")]
    if all(packed):
        break
    time.sleep(0.5)
assert all(packed), "the policy packed no device's blocks: %r" % packed
for name in ("p1", "p2"):
    h = nbd.NBD(); h.set_export_name(name); h.connect_unix(sock)
    for i in range(256):
        assert h.pread(B, i * B) == blocks[name, i], (name, i)
    h.shutdown()
print("policy: pack_after=1 packed %r blocks of devices p1, p2; all read back" % packed)
EOF2
zram_nbdkit -U - "$PLUGIN" 4M pack_after=1 ctl="$tmp/ctl-policy" \
    device=p1:4M device=p2:4M:comp=zstd \
    --run "/usr/bin/python3 '$tmp/policy.py' \"\$unixsocket\" '$tmp/ctl-policy'" ||
    fail "the policy on devices"

# Without device=, any export name is the one device, as before.
zram_nbdkit -U - "$PLUGIN" 1M \
    --run "nbdinfo --size 'nbd+unix:///anything?socket='\"\$unixsocket\" > '$tmp/size'" ||
    fail "a server without devices refused an export name"
[ "$(cat "$tmp/size")" = 1048576 ] || fail "export 'anything': $(cat "$tmp/size")"
echo "ok: without device=, any export name serves the one device"
echo "ok: devices"
