#!/usr/bin/env bash
# The control channel (ctl=PATH) end to end, with the raw protocol and
# with nbdkit-zramctl: every command, bad commands (an error, nothing
# changed), idle marking and block_state against real I/O, a runtime
# mem_limit, a client that hangs up in the middle of a long command (the
# server goes on), and bad ctl= paths at startup.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh
requires_zramctl

# ---- bad ctl= paths ----------------------------------------------------
touch "$tmp/not-a-socket"
if zram_nbdkit -U - "$PLUGIN" 1M ctl="$tmp/not-a-socket" --run true; then
    fail "started with ctl= naming a regular file"
fi
grep -q "ctl: '$tmp/not-a-socket' exists and is not a socket" "$NBDKIT_STDERR" \
    || fail "no clear message for a ctl= path that is not a socket"

# ---- a live server -----------------------------------------------------
cat > "$tmp/ctl.py" <<'EOF'
import json, os, re, socket, stat, subprocess, sys, urllib.parse, nbd

uri, ctl, stats_path = sys.argv[1], sys.argv[2], sys.argv[3]
zramctl = os.environ["ZRAMCTL"]
B = 4096

sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
_ctl = Ctl(ctl)
command, ok, error = _ctl.command, _ctl.ok, _ctl.error

def info():
    return dict(l.split(" ", 1) for l in ok("info"))

assert stat.S_IMODE(os.stat(ctl).st_mode) == 0o600, oct(os.stat(ctl).st_mode)

h = nbd.NBD(); h.connect_uri(uri)
size = h.get_size()
# 300 compressible blocks, 10 zero blocks, 5 random (stored raw: huge).
for i in range(300):
    h.pwrite((b"block %06d " % i) * 300 + bytes(4096 - 3600), i * B)
for i in range(300, 310):
    h.pwrite(bytes(B), i * B)
for i in range(310, 315):
    h.pwrite(os.urandom(B), i * B)
STORED = 315

before = info()
assert int(before["disksize"]) == size, before
assert before["algorithm"] == os.environ.get("COMP", "lz4"), before
# Compression contexts: one at least (writes ran), at most one per call
# that can run at once (nbdkit's threads).
assert 1 <= int(before["streams"]) <= 64, before
# Where it serves: nbdkit's socket, not the control socket.
served = urllib.parse.unquote(re.search(r"socket=([^&]+)", uri).group(1))
assert before["serves"] == "unix:" + served, (before["serves"], uri)
mm = [int(x) for x in ok("mm_stat")[0].split()]
assert len(mm) == 9 and mm[0] == STORED * B, mm
assert len(ok("io_stat")[0].split()) == 4
assert ok("bd_stat") == ["0 0 0"]
assert any(l.startswith("compression_ratio: ") for l in ok("stats"))
assert any("size" in l for l in ok("classes"))
assert "block_state START COUNT" in ok("help")
assert "writeback_limit [SIZE|off]" in ok("help")

# Bad commands: an error each, nothing changed.
error("bogus", r"unknown command 'bogus'")
error("idle", r"usage: idle all\|SECONDS")
error("idle -1", r"idle: '-1' is neither")
error("idle soon", r"idle: 'soon' is neither")
error("mem_limit abc", r"mem_limit: 'abc' is not a size")
ok("grace 60")
ok("grace 0")
error("grace 301", r"grace: '301' is not a number of seconds \(0\.\.300\)")
error("grace soon", r"grace: 'soon' is not a number of seconds")
error("grace", r"usage: grace SECONDS")
last = error("mem_limit 1K", r"mem_limit: 1024 is below the \d+ bytes held now")
held = int(re.search(r"the (\d+) bytes", last).group(1))
assert held > 1024, last                  # what refused it: more than the limit
error("writeback_limit 1M", r"writeback_limit: the server has no backing store")
error("writeback_limit off", r"writeback_limit: the server has no backing store")
error("writeback_limit", r"writeback_limit: the server has no backing store")
error("mem_used_max 5", r"only 0")
error("block_state 0", r"usage: block_state START COUNT")
error("block_state x 1", r"START and COUNT")
error("a b c d e f g h i", r"too many words")
after = info()
del before["uptime"], after["uptime"]
assert before == after, (before, after)

# Idle marking and block_state.
assert ok("idle 3600") == ["marked 0"]
assert ok("idle all") == ["marked %d" % STORED]
assert ok("idle all") == ["marked 0"]
h.pread(B, 7 * B)
h.pwrite(((b"rewritten %06d " % 9) * 256)[:B], 9 * B)
line_re = re.compile(r"^ +(\d+) +(\d+)\.(\d{6}) ([s.])([w.])([h.])([i.])([r.])([n.])$")
states = {}
for l in ok("block_state 0 %d" % (size // B)):
    m = line_re.match(l)
    assert m, "block_state line %r" % l
    states[int(m.group(1))] = m.group(4) + m.group(6) + m.group(7)
assert len(states) == STORED, len(states)
assert states[7] == "..." and states[9] == "...", (states[7], states[9])
assert states[8] == "..i", states[8]
assert states[305] == "s.i" and states[312] == ".hi", (states[305], states[312])
assert ok("block_state 300 2") and len(ok("block_state 300 2")) == 2
assert ok("block_state %d 5" % (size // B)) == []
marked = ok("idle all"); assert marked == ["marked 2"], marked

# Runtime mem_limit and the high-water mark.
ok("mem_limit 64M")
assert info()["mem_limit"] == str(64 << 20)
h.pwrite(b"y" * B, 400 * B)
# A peak, then a reset: 256 raw blocks written and trimmed leave the
# high-water mark a megabyte above what is used.  After the reset it is
# what was used then.  The housekeeper may drain deferred frees between
# two commands (the use falls, the mark stays), so the mark is bounded,
# not equal.
for i in range(500, 756):
    h.pwrite(os.urandom(B), i * B)
h.trim(256 * B, 500 * B)
ok("compact")
peak = [int(x) for x in ok("mm_stat")[0].split()]
assert peak[4] >= peak[2] + (1 << 20), peak
ok("mem_used_max 0")
mm = [int(x) for x in ok("mm_stat")[0].split()]
assert mm[2] <= mm[4] <= peak[2] + (256 << 10), (peak, mm)
ok("mem_limit 0")
# Blocks trimmed just now, their frees still pending in the allocator's
# batches, do not count: a limit that fits once they are drained is
# accepted (the refusal above is for what is held after draining).
for i in range(500, 800):
    h.pwrite(os.urandom(B), i * B)        # raw: 300 pages
held = int([l for l in ok("stats") if l.startswith("limit_used: ")][0].split()[1])
h.trim(300 * B, 500 * B)
ok("mem_limit %d" % (held - (1 << 20)))
ok("mem_limit 0")
assert ok("compact")[0].startswith("pages_compacted ")

# A client that hangs up in the middle of a long reply: fill the device
# so block_state has megabytes to say, ask, and close at once.
h.pwrite(bytes(range(256)) * 16 * 4096, 0)
sock = socket.socket(socket.AF_UNIX); sock.connect(ctl)
sock.sendall(b"block_state 0 100000000\n")
sock.recv(100)
sock.close()
# The server goes on: I/O and a new control connection both work.
assert h.pread(B, 4095 * B) == bytes(range(256)) * 16
assert int(info()["disksize"]) == size

# The tool: the table, JSON, a command, an error, an unreachable socket.
table = subprocess.run([zramctl, ctl], capture_output=True, text=True, check=True).stdout
header, row = table.splitlines()
assert header.split() == ["NAME", "ALGORITHM", "DISKSIZE", "DATA", "COMPR", "TOTAL", "RATIO"], header
assert row.split()[0] == ctl and row.split()[2] == "%dM" % (size >> 20), row
doc = json.loads(subprocess.run([zramctl, "--json", ctl], capture_output=True,
                                text=True, check=True).stdout)
server = doc["zram"][0]
mm = [int(x) for x in ok("mm_stat")[0].split()]
assert server["name"] == ctl and server["disksize"] == size, server
assert server["data"] == mm[0] and server["compr"] == mm[1], (server, mm)
run = subprocess.run([zramctl, "idle", ctl, "all"], capture_output=True, text=True)
assert run.returncode == 0 and run.stdout.startswith("marked "), run
run = subprocess.run([zramctl, "mem_limit", ctl, "1K"], capture_output=True, text=True)
assert run.returncode == 1 and "is below the" in run.stderr, run
run = subprocess.run([zramctl, "writeback_limit", ctl, "1M"], capture_output=True, text=True)
assert run.returncode == 1 and "no backing store" in run.stderr, run
run = subprocess.run([zramctl, ctl + ".missing"], capture_output=True, text=True)
assert run.returncode == 1 and "No such file" in run.stderr, run
h.shutdown()
print("ok: control channel")
EOF

for comp in lz4 zstd; do
    export COMP=$comp
    zram_nbdkit -U - "$PLUGIN" 64M comp=$comp ctl="$tmp/ctl" stats="$tmp/stats" \
        --run "python3 '$tmp/ctl.py' \"\$uri\" '$tmp/ctl' '$tmp/stats'"
    [ ! -e "$tmp/ctl" ] || fail "the control socket was left behind"
done

# Served over TCP: info's serves says the address and port.
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
zram_nbdkit -i 127.0.0.1 -p "$port" "$PLUGIN" 1M ctl="$tmp/ctl-tcp" \
    --run "'$ZRAMCTL' info '$tmp/ctl-tcp' > '$tmp/info-tcp'"
grep -qx "serves tcp:127.0.0.1:$port" "$tmp/info-tcp" ||
    fail "info over TCP: $(cat "$tmp/info-tcp")"
echo "ok: info says where the server serves: $(grep serves "$tmp/info-tcp")"

# ---- recompression through the control channel -------------------------
for bad in "recomp_algorithm=brotli" "recomp_algorithm=zstd:priority=2" \
           "recomp_algorithm=zstd:level=99" "recomp_algorithm=zstd:speed=1"; do
    if zram_nbdkit -U - "$PLUGIN" 1M "$bad" --run true; then
        fail "started with $bad"
    fi
    grep -q "recomp_algorithm" "$NBDKIT_STDERR" || fail "$bad: no message naming recomp_algorithm"
done

cat > "$tmp/recomp.py" <<'EOF'
import os, random, sys, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))

uri, ctl = sys.argv[1], sys.argv[2]
B = 4096
from ctl_client import Ctl
def command(line):
    lines, _, last = Ctl(ctl).command(line)
    return lines, last

words = [w.encode() for w in "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()]
r = random.Random(5)
blocks = {}
h = nbd.NBD(); h.connect_uri(uri)
for i in range(400):
    text = b" ".join(r.choice(words) for _ in range(900))[:B]
    blocks[i] = text.ljust(B, b".")
    h.pwrite(blocks[i], i * B)

lines, last = command("recompress type=bogus")
assert last.startswith("error: recompress: type 'bogus'"), last
lines, last = command("recompress type=idle algo=lz4")
assert last.startswith("error: recompress: algo=lz4 is not"), last
lines, last = command("recompress type=idle priority=2")
assert last.startswith("error: recompress: no algorithm has priority 2"), last
lines, last = command("recompress")
assert last.startswith("error: usage: recompress"), last
# A bad algo= is refused whatever else is given, and nothing runs.
assert command("idle all")[1] == "ok"
for bad in ("recompress type=idle algo=bogus priority=1",
            "recompress type=idle priority=1 algo=bogus",
            "recompress type=idle algo=bogus"):
    lines, last = command(bad)
    assert last.startswith("error: recompress: algo=bogus is not"), (bad, last)
lines, last = command("block_state 0 400")
assert not any(l.split()[-1][4] == "r" for l in lines), "a refused recompress ran"
stats, last = command("stats")
assert "recomp_blocks: 0" in stats, [l for l in stats if "recomp" in l]

assert command("idle all")[1] == "ok"
lines, last = command("recompress type=idle threshold=100")
assert last == "ok", last
result = dict(l.split(" ", 1) for l in lines)
print("recompress:", result)
assert int(result["recompressed"]) > 300, result
assert int(result["bytes_saved"]) > 0, result
lines, last = command("block_state 0 400")
assert sum(l.split()[-1][4] == "r" for l in lines) == int(result["recompressed"])
for i, data in blocks.items():
    assert h.pread(B, i * B) == data, "block %d" % i
# A partial overwrite of a recompressed block.
h.pwrite(b"X" * 100, 5 * B + 10)
blocks[5] = blocks[5][:10] + b"X" * 100 + blocks[5][110:]
assert h.pread(B, 5 * B) == blocks[5]
stats, last = command("stats")
saved = [l for l in stats if l.startswith("recomp_bytes_saved: ")]
assert saved and int(saved[0].split()[1]) == int(result["bytes_saved"]), saved
h.shutdown()
print("ok: recompression")
EOF
zram_nbdkit -U - "$PLUGIN" 8M comp=lz4 recomp_algorithm=zstd:level=19 ctl="$tmp/ctl3" \
    --run "python3 '$tmp/recomp.py' \"\$uri\" '$tmp/ctl3'"
zram_nbdkit -U - "$PLUGIN" 1M ctl="$tmp/ctl4" --run "
    '$ZRAMCTL' recompress '$tmp/ctl4' type=idle 2>'$tmp/norecomp.err' && exit 1
    grep -q 'no recompression algorithm' '$tmp/norecomp.err'"

# ---- the automatic policy ------------------------------------------------
if zram_nbdkit -U - "$PLUGIN" 1M recompress_after=5 --run true; then
    fail "recompress_after started without recomp_algorithm"
fi
grep -q "recompress_after: needs recomp_algorithm" "$NBDKIT_STDERR" \
    || fail "recompress_after without recomp_algorithm: no clear message"

cat > "$tmp/policy.py" <<'EOF'
import os, random, sys, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from stats_file import next_stat

uri, stats_path = sys.argv[1], sys.argv[2]
next_stat(stats_path, "recomp_blocks")     # the file exists from here
B = 4096
words = [w.encode() for w in "one two three four five six seven eight nine ten".split()]
r = random.Random(9)
h = nbd.NBD(); h.connect_uri(uri)
blocks = {}
for i in range(600):
    blocks[i] = (b" ".join(r.choice(words) for _ in range(1200))[:B]).ljust(B, b"-")
    h.pwrite(blocks[i], i * B)
# Hot blocks: rewritten all along, never idle long enough.  The policy
# works a bounded time per second: wait for it (up to a minute on a busy
# machine) while the hot blocks stay hot.
start = time.monotonic()
version = 0
recompressed = 0
while time.monotonic() < start + 60 and recompressed < 590:
    for _ in range(10):
        for i in range(0, 10):
            version += 1
            # A whole block (the shortest line, "hot 0 1 ", times 600):
            # a shorter one was a partial write, and its old tail read
            # back as a mismatch whenever the versions stayed under 1000.
            blocks[i] = (b"hot %d %d " % (i, version) * 600)[:B]
            assert len(blocks[i]) == B
            h.pwrite(blocks[i], i * B)
        time.sleep(0.05)
    # The file as it is (rewritten every second): no wait, so the hot
    # blocks are never left alone for long.
    for line in open(stats_path):
        if line.startswith("recomp_blocks: "):
            recompressed = int(line.split()[1])
print("policy: %d blocks recompressed in %.1f s" % (recompressed, time.monotonic() - start))
assert recompressed >= 590, recompressed
assert recompressed <= 590, "hot blocks were recompressed too: %d" % recompressed
for i, data in blocks.items():
    assert h.pread(B, i * B) == data, "block %d" % i
h.shutdown()
print("ok: policy")
EOF
zram_nbdkit -U - "$PLUGIN" 8M comp=lz4 recomp_algorithm=zstd:level=9 \
    idle_after=2 recompress_after=3 stats="$tmp/stats5" \
    --run "python3 '$tmp/policy.py' \"\$uri\" '$tmp/stats5'"

# ---- cold packing through the control channel and the policy -------------
cat > "$tmp/pack.py" <<'EOF'
import os, random, re, socket, sys, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from stats_file import next_stat

uri, ctl, stats_path, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
B = 4096
from ctl_client import Ctl
def command(line):
    lines, _, last = Ctl(ctl).command(line)
    return lines, last

words = [w.encode() for w in "red green blue cyan magenta yellow black white".split()]
r = random.Random(3)
h = nbd.NBD(); h.connect_uri(uri)
blocks = {}
for i in range(640):
    blocks[i] = (b" ".join(r.choice(words) for _ in range(1000))[:B]).ljust(B, b"~")
    h.pwrite(blocks[i], i * B)
if mode == "ctl":
    assert command("pack max_pages=x")[1].startswith("error: pack: 'max_pages=x'")
    assert command("idle all")[1] == "ok"
    lines, last = command("pack type=idle")
    assert last == "ok", last
    result = dict(l.split(" ", 1) for l in lines)
    print("pack:", result)
    assert int(result["blocks"]) >= 600, result
    assert int(result["bytes_after"]) < int(result["bytes_before"]) // 2, result
else:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and next_stat(stats_path, "packed_blocks") < 600:
        pass
    print("policy packed:", next_stat(stats_path, "packed_blocks"))
    assert next_stat(stats_path, "packed_blocks") >= 600
for i, data in blocks.items():
    assert h.pread(B, i * B) == data, "block %d" % i
# Rewrite 3 in 4 blocks: the units fall below half live, and go.
for i in range(640):
    if i % 4:
        blocks[i] = (b"new %d " % i * 700)[:B]
        h.pwrite(blocks[i], i * B)
if mode == "ctl":
    lines, last = command("dissolve 50")
    assert last == "ok" and int(lines[0].split()[1]) > 0, (lines, last)
else:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and next_stat(stats_path, "packed_blocks") > 0:
        pass
assert next_stat(stats_path, "pack_units") == 0 or mode == "policy"
for i, data in blocks.items():
    assert h.pread(B, i * B) == data, "block %d after the rewrite" % i
h.shutdown()
print("ok: packing (%s)" % mode)
EOF
zram_nbdkit -U - "$PLUGIN" 8M comp=lz4 ctl="$tmp/ctl6" stats="$tmp/stats6" \
    --run "python3 '$tmp/pack.py' \"\$uri\" '$tmp/ctl6' '$tmp/stats6' ctl"
zram_nbdkit -U - "$PLUGIN" 8M comp=lz4 pack_after=1 ctl="$tmp/ctl7" stats="$tmp/stats7" \
    --run "python3 '$tmp/pack.py' \"\$uri\" '$tmp/ctl7' '$tmp/stats7' policy"

# A socket another server still listens on is not taken over.
zram_nbdkit -U "$tmp/sock2" -P "$tmp/pid2" "$PLUGIN" 1M ctl="$tmp/ctl2"
cleanup_add 'kill "$(cat "$tmp/pid2")"'
if zram_nbdkit -U - "$PLUGIN" 1M ctl="$tmp/ctl2" --run true; then
    fail "a second server took over the control socket"
fi
grep -q "ctl: '$tmp/ctl2' is in use by another server" "$NBDKIT_STDERR" \
    || fail "no clear message for a control socket in use"
"$ZRAMCTL" info "$tmp/ctl2" | grep -q '^disksize 1048576$' \
    || fail "the first server lost its control socket"
echo "ok: ctl= paths"
