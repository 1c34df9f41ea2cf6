#!/usr/bin/env bash
# An honest cold tier: blocks written back and then lost or changed in the
# backing store read as EIO (and count in backing_corrupt), never as
# wrong bytes: bytes flipped in a backing file, the file truncated, a
# remote export that comes back empty.  The other blocks read right.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3

cat > "$tmp/corrupt.py" <<'EOF2'
import os, subprocess, sys, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
uri, ctl_path, how, target = sys.argv[1:5]
B = 4096
ctl = Ctl(ctl_path)
h = nbd.NBD(); h.connect_uri(uri)
# Blocks 0-15 random (stored raw: a read decodes nothing, so only the
# checksum can tell damage), 16-47 compressible; written back in order,
# so the raw ones lie first in the store.
data = {b: os.urandom(B) for b in range(16)}
data.update({b: (b"block %d " % b) * 300 + os.urandom(B - len(b"block %d " % b) * 300)
             for b in range(16, 48)})
for b, d in data.items():
    h.pwrite(d, b * B)
ctl.ok("idle all")
ctl.ok("writeback idle")
assert int(ctl.ok("bd_stat")[0].split()[0]) == 48
if how == "flip":
    # Every byte of the first 8 KiB of the file inverted: the first blocks.
    with open(target, "r+b") as f:
        head = f.read(8192)
        f.seek(0)
        f.write(bytes(b ^ 0xff for b in head))
elif how == "truncate":
    os.truncate(target, 0)
else:
    subprocess.run(["sh", "-c", target], check=True)   # restart it empty
    # The connections died with it: reads fail (EIO) until one is made
    # again (after a backoff), then they reach the empty export.
    import time
    deadline = time.monotonic() + 60
    corrupt = lambda: int(ctl.stats()["backing_corrupt"])
    while corrupt() == 0 and time.monotonic() < deadline:
        try:
            h.pread(B, 0)
        except nbd.Error:
            pass
        time.sleep(0.2)
    assert corrupt() > 0, "never reached the restarted export"
bad = good = 0
for b, d in data.items():
    try:
        got = h.pread(B, b * B)
        assert got == d, "block %d read back wrong bytes" % b
        good += 1
    except nbd.Error as e:
        assert e.errno == "EIO", e
        bad += 1
stats = ctl.stats()
print("%s: %d blocks EIO, %d right; backing_corrupt %s" % (how, bad, good, stats["backing_corrupt"]))
assert bad > 0, "no block noticed the damage"
if how == "flip":
    assert good > 0 and int(stats["backing_corrupt"]) == bad, stats["backing_corrupt"]
if how == "restart":
    assert bad == 48 and int(stats["backing_corrupt"]) >= 48, stats["backing_corrupt"]
# Rewritten, a block is whole again.
h.pwrite(data[0], 0)
assert h.pread(B, 0) == data[0]
h.shutdown()
EOF2

for how in flip truncate; do
    rm -f "$tmp/backing"
    zram_nbdkit -U - "$PLUGIN" 16M backing="$tmp/backing" ctl="$tmp/ctl-$how" \
        --run "/usr/bin/python3 '$tmp/corrupt.py' \"\$uri\" '$tmp/ctl-$how' $how '$tmp/backing'" ||
        fail "$how"
done

# A remote export (nbdkit memory) that restarts empty.
remote ()
{
    env -u LD_PRELOAD "$NBDKIT" -U "$tmp/remote.sock" -P "$tmp/remote.pid" memory 64M
    for _ in $(seq 100); do [ -S "$tmp/remote.sock" ] && return 0; sleep 0.1; done
    fail "the remote did not start"
}
remote
cleanup_add 'kill "$(cat "$tmp/remote.pid")" 2>/dev/null'
# The restart, as a script: kill the export, wait for it to be gone (a
# daemon's exit leaves a zombie where nothing reaps it), start it empty.
cat > "$tmp/restart.sh" <<EOF2
p=\$(cat '$tmp/remote.pid')
kill -9 \$p   # a crash: SIGTERM waits for the connections to go
while [ -e /proc/\$p ] && [ "\$(awk '{ print \$3 }' /proc/\$p/stat)" != Z ]; do sleep 0.1; done
rm -f '$tmp/remote.sock'
env -u LD_PRELOAD '$NBDKIT' -U '$tmp/remote.sock' -P '$tmp/remote.pid' memory 64M
while [ ! -S '$tmp/remote.sock' ]; do sleep 0.1; done
EOF2
zram_nbdkit -U - "$PLUGIN" 16M backing="nbd+unix:///?socket=$tmp/remote.sock" \
    backing_timeout=5 ctl="$tmp/ctl-restart" \
    --run "/usr/bin/python3 '$tmp/corrupt.py' \"\$uri\" '$tmp/ctl-restart' restart 'sh $tmp/restart.sh'" ||
    fail "an export that restarts empty"
kill -9 "$(cat "$tmp/remote.pid")" 2>/dev/null || :

# Durable before the RAM copies go: a writeback pass flushes the export
# after its writes (nbdkit's log filter shows the requests), unless
# backing_sync=false.
for sync in true false; do
    rm -f "$tmp/remote.sock" "$tmp/requests.log"
    env -u LD_PRELOAD "$NBDKIT" -U "$tmp/remote.sock" -P "$tmp/remote.pid" \
        --filter=log memory 64M logfile="$tmp/requests.log"
    for _ in $(seq 100); do [ -S "$tmp/remote.sock" ] && break; sleep 0.1; done
    zram_nbdkit -U - "$PLUGIN" 16M backing="nbd+unix:///?socket=$tmp/remote.sock" \
        backing_sync=$sync ctl="$tmp/ctl-sync-$sync" --run "
        nbdsh -u \"\$uri\" -c 'import os; h.pwrite(os.urandom(4096 * 8), 0)'
        '$BUILDDIR/tools/nbdkit-zramctl' idle '$tmp/ctl-sync-$sync' all >/dev/null
        '$BUILDDIR/tools/nbdkit-zramctl' writeback '$tmp/ctl-sync-$sync' idle >/dev/null" ||
        fail "writeback with backing_sync=$sync"
    kill -9 "$(cat "$tmp/remote.pid")"
    writes=$(grep -c 'Write id=' "$tmp/requests.log" || :)
    flushes=$(grep -c 'Flush id=' "$tmp/requests.log" || :)
    echo "backing_sync=$sync: $writes writes, $flushes flushes"
    [ "$writes" -ge 1 ] || fail "backing_sync=$sync: nothing was written back"
    if [ $sync = true ]; then
        [ "$flushes" -ge 1 ] || fail "no flush after the writeback's writes"
        last_write=$(grep -n 'Write id=' "$tmp/requests.log" | tail -1 | cut -d: -f1)
        first_flush=$(grep -n 'Flush id=' "$tmp/requests.log" | head -1 | cut -d: -f1)
        [ "$first_flush" -gt "$last_write" ] || fail "the flush came before the writes"
    else
        [ "$flushes" = 0 ] || fail "backing_sync=false flushed"
    fi
done
echo "ok: damage in the backing store reads as EIO"
