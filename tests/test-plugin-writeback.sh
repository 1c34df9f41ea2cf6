#!/usr/bin/env bash
# Writeback end to end, with a backing file and with a remote NBD export
# (a second nbdkit serving a file, behind nbdkit's error filter): blocks
# written, written back (by type, by index), read back, overwritten,
# trimmed, zeroed and patched across both tiers with every byte checked;
# bd_stat; bad commands; a remote that fails (injected errors: reads of
# its blocks fail with EIO, a failed writeback keeps every block in RAM)
# or dies (and comes back: the server reconnects); and writes beyond
# mem_limit that succeed because the coldest blocks go to the file.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh

cat > "$tmp/writeback.py" <<'EOF'
import os, signal, subprocess, sys, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl

uri, ctl_path, kind = sys.argv[1], sys.argv[2], sys.argv[3]
ctl = Ctl(ctl_path)
B = 4096
N = 1024
RAW = 16

def content(i, v):
    return (b"blk %06d v%03d " % (i, v)) * 200 + bytes(B - 3200)

h = nbd.NBD()
h.connect_uri(uri)
want = {}
for i in range(N):
    want[i] = content(i, 1)
    h.pwrite(want[i], i * B)
for i in range(N, N + RAW):
    want[i] = os.urandom(B)                 # stored raw: "huge"
    h.pwrite(want[i], i * B)

def verify(blocks=None):
    for i in blocks if blocks is not None else range(N + RAW):
        got = h.pread(B, i * B)
        assert got == want.get(i, bytes(B)), "block %d reads back wrong" % i

def bd_stat():
    return [int(x) for x in ctl.ok("bd_stat")[0].split()]

# Bad commands change nothing.
ctl.error("writeback", "usage: writeback idle")
ctl.error("writeback max_pages=3", "say what to write back")
ctl.error("writeback bogus", "'bogus' is not idle")
ctl.error("writeback page_indexes=9-5", "is not FIRST-LAST")
assert bd_stat() == [0, 0, 0]

# Nothing is idle yet; huge blocks first; then one index, then a range.
assert ctl.fields("writeback idle")["blocks"] == 0
ctl.ok("idle all")
assert ctl.fields("writeback huge")["blocks"] == RAW
assert ctl.fields("writeback page_index=3")["blocks"] == 1
assert ctl.fields("writeback page_indexes=10-19")["blocks"] == 10
r = ctl.fields("writeback idle")
assert r["blocks"] == N - 11, r
count, reads, writes = bd_stat()
assert count == N + RAW and writes == N + RAW and reads == 0, bd_stat()
mm = [int(x) for x in ctl.ok("mm_stat")[0].split()]
assert mm[0] == (N + RAW) * B and mm[1] == 0, mm     # orig, compr
states = ctl.ok("block_state 0 4")
assert all(l.split()[2][1] == "w" for l in states), states
assert ctl.ok("block_state %d 1" % N)[0].split()[2] == ".whi..", ctl.ok("block_state %d 1" % N)

verify()
assert bd_stat()[1] == N + RAW, bd_stat()

# Both tiers: overwrite, trim, zero, patch written-back blocks.
for i in range(0, N, 5):
    want[i] = content(i, 2)
    h.pwrite(want[i], i * B)
for i in range(1, N, 5):
    h.trim(B, i * B)
    want.pop(i)
for i in range(2, N, 5):
    h.zero(B, i * B)
    want.pop(i)
for i in range(3, N, 5):
    patched = bytearray(want[i])
    patched[100:150] = b"P" * 50
    want[i] = bytes(patched)
    h.pwrite(b"P" * 50, i * B + 100)
verify()
left = len(range(4, N, 5)) + RAW
assert bd_stat()[0] == left, (bd_stat(), left)
stats = ctl.stats()
print("%s: %d blocks left in the backing store, %s bytes in use there"
      % (kind, left, stats["backing_used"]))

if kind == "nbd-error":
    inject = os.environ["INJECT"]
    # Reads of written-back blocks fail while the remote fails; the
    # others do not.
    open(inject, "w").close()
    try:
        h.pread(B, 4 * B)
        raise AssertionError("a read of a written-back block worked while "
                             "the remote failed")
    except nbd.Error as e:
        assert e.errno == "EIO" or "Input/output" in str(e), e
    verify([0, 3, 5])
    # A writeback that fails keeps its blocks in RAM.
    for i in range(0, 40, 5):
        want[i] = content(i, 3)
        h.pwrite(want[i], i * B)
    ctl.ok("idle all")
    before = bd_stat()[0]
    ctl.error("writeback page_indexes=0-39", "Input/output error")
    assert bd_stat()[0] == before
    verify(range(0, 40, 5))
    os.unlink(inject)
    verify()

if kind == "nbd":
    # The remote dies: its blocks fail, the others are served; it comes
    # back (same file): the server reconnects.
    pid = int(open(os.environ["REMOTE_PID"]).read())
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    try:
        h.pread(B, 4 * B)
        raise AssertionError("a read of a written-back block worked with the "
                             "remote gone")
    except nbd.Error:
        pass
    verify([0, 3, 5])
    want[9] = content(9, 4)
    h.pwrite(want[9], 9 * B)                 # frees a run it cannot trim
    subprocess.check_call(["sh", "-c", os.environ["REMOTE_START"]])
    deadline = time.monotonic() + 10
    while True:
        try:
            verify()
            break
        except nbd.Error:
            assert time.monotonic() < deadline, "no reconnection in 10 s"
            time.sleep(0.3)
    stats = ctl.stats()
    assert int(stats["backing_reconnects"]) >= 1, stats
    assert int(stats["backing_failed"]) >= 1, stats
    print("nbd: reconnected (%s reconnects, %s failed requests)"
          % (stats["backing_reconnects"], stats["backing_failed"]))

h.shutdown()
EOF

# ---- a backing file ------------------------------------------------------
zram_nbdkit -U - "$PLUGIN" 16M backing="$tmp/backing" ctl="$tmp/ctl1" \
    --run "/usr/bin/python3 '$tmp/writeback.py' \"\$uri\" '$tmp/ctl1' file" ||
    fail "writeback to a file"
[ -f "$tmp/backing" ] || fail "backing=: the file was not created"

truncate -s 64M "$tmp/remote.img"
remote_cmd=(file "$tmp/remote.img")
remote_start "${remote_cmd[@]}"
export REMOTE_PID="$tmp/remote.pid"
REMOTE_START="rm -f '$tmp/remote.sock'; env -u LD_PRELOAD '$NBDKIT' -U '$tmp/remote.sock' -P '$tmp/remote.pid' file '$tmp/remote.img'"
export REMOTE_START
zram_nbdkit -U - "$PLUGIN" 16M backing="nbd+unix:///?socket=$tmp/remote.sock" \
    ctl="$tmp/ctl2" \
    --run "/usr/bin/python3 '$tmp/writeback.py' \"\$uri\" '$tmp/ctl2' nbd" ||
    fail "writeback to a remote NBD export"
remote_stop

# The same behind the error filter, errors injected while $INJECT exists.
export INJECT="$tmp/inject"
remote_start --filter=error file "$tmp/remote.img" error=EIO error-rate=100% \
    error-file="$INJECT"
zram_nbdkit -U - "$PLUGIN" 16M backing="nbd+unix:///?socket=$tmp/remote.sock" \
    ctl="$tmp/ctl3" \
    --run "/usr/bin/python3 '$tmp/writeback.py' \"\$uri\" '$tmp/ctl3' nbd-error" ||
    fail "writeback to a failing remote NBD export"
remote_stop

# ---- writes beyond mem_limit go through, the coldest blocks written back --
cat > "$tmp/beyond.py" <<'EOF'
import os, random, sys, time
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from stats_file import next_stat
B = 4096
N = 6144                                    # 24 MiB, ~11 MiB compressed

def content(i):
    return random.Random(i).randbytes(1544) + (b"blk %06d " % i) * 232

for i in range(N):
    h.pwrite(content(i), i * B)
for i in range(N):
    assert h.pread(B, i * B) == content(i), "block %d reads back wrong" % i
stats = os.environ["STATS4"]
count = next_stat(stats, "bd_count")
assert count > 0
# The policy brings the pool under the watermark (50 % of 4 MiB).
deadline = time.monotonic() + 10
while next_stat(stats, "limit_used") > 2 << 20:
    assert time.monotonic() < deadline, "still above the watermark"
print("24 MiB through a 4 MiB limit: %d blocks written back, pool %d bytes"
      % (next_stat(stats, "bd_count"), next_stat(stats, "limit_used")))
EOF
export STATS4="$tmp/stats4"
zram_nbdsh 64M mem_limit=4M backing="$tmp/backing2" writeback_watermark=50 \
    stats="$tmp/stats4" < "$tmp/beyond.py" || fail "writes beyond mem_limit with writeback"
# The same with O_DIRECT, where the file system takes it.
if dd if=/dev/zero of="$tmp/direct-probe" bs=4096 count=1 oflag=direct 2>/dev/null; then
    rm -f "$tmp/stats4"
    zram_nbdsh 64M mem_limit=4M backing="$tmp/backing3" backing_direct=true \
        writeback_watermark=50 stats="$tmp/stats4" < "$tmp/beyond.py" ||
        fail "writes beyond mem_limit with writeback, O_DIRECT"
else
    echo "O_DIRECT: $tmp's file system does not take it, not tested"
fi

# ---- writeback_limit: 0 writes nothing; changed at run time; off ---------
cat > "$tmp/wblimit.py" <<'EOF'
import os, subprocess, sys, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl

uri, ctl_path = sys.argv[1], sys.argv[2]
ctl = Ctl(ctl_path)
B = 4096
N = 256

def content(i):
    return (b"blk %06d " % i) * 300 + bytes(B - 3300)

def limit_line():
    lines = [l for l in ctl.ok("stats") if l.startswith("writeback_limit: ")]
    return int(lines[0].split()[1]) if lines else None

def writeback():
    lines = ctl.ok("writeback idle")
    fields = dict(l.split(" ", 1) for l in lines)
    return int(fields["blocks"]), int(fields["bytes"]), "stopped writeback_limit" in lines

h = nbd.NBD()
h.connect_uri(uri)
for i in range(N):
    h.pwrite(content(i), i * B)
ctl.ok("idle all")

# writeback_limit=0: nothing may be written back, as in zram.
assert limit_line() == 0, limit_line()
assert ctl.ok("writeback_limit") == ["writeback_limit 0"]
blocks, nbytes, stopped = writeback()
assert (blocks, nbytes, stopped) == (0, 0, True), (blocks, nbytes, stopped)
assert ctl.ok("bd_stat")[0].split()[0] == "0"

# Bad values change nothing.
ctl.error("writeback_limit lots", r"writeback_limit: 'lots' is not a size or off")
ctl.error("writeback_limit 1M 2M", r"usage: writeback_limit")
assert limit_line() == 0

# Raised at run time: writeback writes, up to the new limit.
assert ctl.ok("writeback_limit 64K") == ["writeback_limit 65536"]
assert limit_line() == 65536
blocks, nbytes, stopped = writeback()
assert blocks > 0 and 0 < nbytes <= 65536 and stopped, (blocks, nbytes, stopped)
left = limit_line()
assert 0 <= left <= 65536 - nbytes, (left, nbytes)
assert ctl.ok("writeback_limit") == ["writeback_limit %d" % left]
first = blocks

# off: no limit any more; the rest goes.
assert ctl.ok("writeback_limit off") == ["writeback_limit off"]
assert limit_line() is None
assert ctl.ok("writeback_limit") == ["writeback_limit off"]
blocks, nbytes, stopped = writeback()
assert first + blocks == N and not stopped, (first, blocks, stopped)
assert int(ctl.ok("bd_stat")[0].split()[0]) == N

# The tool passes the command on.
run = subprocess.run([os.environ["ZRAMCTL"], "writeback_limit", ctl_path, "1M"],
                     capture_output=True, text=True)
assert run.returncode == 0 and run.stdout == "writeback_limit 1048576\n", run
assert limit_line() == 1 << 20
for i in range(N):
    assert h.pread(B, i * B) == content(i), "block %d reads back wrong" % i
h.shutdown()
print("writeback_limit: ok (%d blocks under 64K)" % first)
EOF
requires_zramctl
zram_nbdkit -U - "$PLUGIN" 16M backing="$tmp/backing4" writeback_limit=0 \
    ctl="$tmp/ctl4" \
    --run "/usr/bin/python3 '$tmp/wblimit.py' \"\$uri\" '$tmp/ctl4'" ||
    fail "writeback_limit"

# ---- bad parameters --------------------------------------------------------
for bad in "writeback_watermark=50" "writeback_limit=1M" "writeback_limit=0" \
           "backing=$tmp/b writeback_limit=junk" "writeback_batch_size=8" \
           "backing=$tmp/nonexistent/dir/file" "backing=nbd+unix:///?socket=$tmp/none" \
           "backing=$tmp/b writeback_watermark=50" "backing=$tmp/b writeback_batch_size=0" \
           "backing=$tmp/b writeback_watermark=5" "backing=$tmp/b backing_timeout=0" \
           "backing=$tmp/b backing_timeout=soon"; do
    # shellcheck disable=SC2086
    if zram_nbdkit -U - "$PLUGIN" 1M $bad --run true 2>/dev/null; then
        fail "started with $bad"
    fi
    key="${bad##* }"; key="${key%%=*}"
    grep -q "$key" "$NBDKIT_STDERR" || fail "$bad: the error does not name $key"
done
# A symbolic link planted at the backing path is not followed (the server
# may run as root): the start fails, naming it, and the file it points to
# is left alone.  A new file is created with mode 0600.
printf 'precious\n' > "$tmp/victim"
ln -s "$tmp/victim" "$tmp/planted"
if zram_nbdkit -U - "$PLUGIN" 1M backing="$tmp/planted" --run true 2>/dev/null; then
    fail "started with a backing path that is a link to a regular file"
fi
grep -q "backing: $tmp/planted is a symbolic link" "$NBDKIT_STDERR" ||
    fail "no clear message for a planted link"
[ "$(cat "$tmp/victim")" = precious ] || fail "the planted link's target was changed"
zram_nbdkit -U - "$PLUGIN" 1M backing="$tmp/fresh" --run true ||
    fail "a new backing file"
[ "$(stat -c %a "$tmp/fresh")" = 600 ] || fail "a new backing file has mode $(stat -c %a "$tmp/fresh")"
echo "writeback: ok"
