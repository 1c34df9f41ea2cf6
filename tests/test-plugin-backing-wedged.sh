#!/usr/bin/env bash
# A backing store that stalls never stalls the store: with an NBD backing
# export whose reads are never answered in time (nbdkit's delay filter),
# a read of a written-back block fails with EIO after backing_timeout,
# while reads and writes of in-RAM blocks on the same stripe (block
# numbers equal mod 1024) answer at once, and a partial write of a
# written-back block fails with EIO leaving it as it was; a slow export
# (answering within the timeout) gives the right data; an export that
# accepts and never answers the handshake fails the start within the
# timeout, with a message.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3


cat > "$tmp/wedged.py" <<'EOF2'
import os, sys, threading, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
uri, ctl_path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
B = 4096
ctl = Ctl(ctl_path)
h = nbd.NBD(); h.connect_uri(uri)
data = {b: (b"block %d " % b) * 400 + bytes(B - len(b"block %d " % b) * 400)
        for b in range(64)}
for b, d in data.items():
    h.pwrite(d, b * B)
ctl.ok("idle all")
ctl.ok("writeback idle")
backed = int(ctl.ok("bd_stat")[0].split()[0])
assert backed == 64, "written back: %d of 64" % backed
ram = {1024: b"r" * B, 2048: b"s" * B}
for b, d in ram.items():
    h.pwrite(d, b * B)

if mode == "slow":
    start = time.monotonic()
    for b in (0, 1, 2):
        assert h.pread(B, b * B) == data[b], b
    print("slow export: 3 written-back blocks read right in %.1f s"
          % (time.monotonic() - start))
    sys.exit(0)

# Wedged reads: block 0's read waits for the export; the blocks of its
# stripe do not.
outcome = {}
def read_backed():
    g = nbd.NBD(); g.connect_uri(uri)
    start = time.monotonic()
    try:
        g.pread(B, 0)
        outcome["error"] = None
    except nbd.Error as e:
        outcome["error"] = e.errno
    outcome["took"] = time.monotonic() - start
reader = threading.Thread(target=read_backed)
reader.start()
time.sleep(0.5)
start = time.monotonic()
assert h.pread(B, 1024 * B) == ram[1024]
h.pwrite(b"t" * B, 2048 * B)
assert h.pread(B, 2048 * B) == b"t" * B
took = time.monotonic() - start
print("in-RAM blocks of the stalled block's stripe: answered in %.3f s" % took)
assert took < 1.0, took
reader.join(30)
assert not reader.is_alive(), "the read of a written-back block hung"
print("read of a written-back block: %s after %.1f s" % (outcome["error"], outcome["took"]))
assert outcome["error"] == "EIO", outcome
assert 1.5 < outcome["took"] < 15, outcome

# A partial write needs the old data: EIO, and the block is left alone.
start = time.monotonic()
try:
    h.pwrite(b"x" * 100, 1 * B + 10)
    raise AssertionError("a partial write of an unreadable block succeeded")
except nbd.Error as e:
    assert e.errno == "EIO", e
print("partial write of a written-back block: EIO after %.1f s" % (time.monotonic() - start))
stats = ctl.stats()
assert int(stats["backing_timeouts"]) >= 2, stats["backing_timeouts"]
assert int(ctl.ok("bd_stat")[0].split()[0]) == 64
print("backing_timeouts: %s" % stats["backing_timeouts"])
h.shutdown()
EOF2

# A wedged export (reads answered after 60 s), then a slow one (0.5 s).
truncate -s 64M "$tmp/remote.img"
for mode in wedged slow; do
    case $mode in wedged) delay=60 ;; slow) delay=500ms ;; esac
    remote_start --filter=delay file "$tmp/remote.img" delay-read="$delay"
    zram_nbdkit -U - "$PLUGIN" 16M backing="nbd+unix:///?socket=$tmp/remote.sock" \
        backing_timeout=2 ctl="$tmp/ctl-$mode" \
        --run "/usr/bin/python3 '$tmp/wedged.py' \"\$uri\" '$tmp/ctl-$mode' $mode" ||
        fail "$mode export"
    remote_stop
done

# An export that accepts and never answers: the start fails in time.
/usr/bin/python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8)
held = []
while True:
    held.append(s.accept()[0])
' "$tmp/silent.sock" &
silent=$!
cleanup_add "kill $silent 2>/dev/null"
for _ in $(seq 50); do [ -S "$tmp/silent.sock" ] && break; sleep 0.1; done
start=$SECONDS
if zram_nbdkit -U - "$PLUGIN" 16M backing="nbd+unix:///?socket=$tmp/silent.sock" \
    backing_timeout=2 --run true; then
    fail "started with a backing export that never answers"
fi
[ $((SECONDS - start)) -lt 15 ] || fail "the start took $((SECONDS - start)) s to give up"
grep -q "no answer within 2 s" "$NBDKIT_STDERR" || fail "no clear message for a silent export"
echo "ok: a stalled backing store stalls nothing else"
