#!/usr/bin/env bash
# A handover while a writeback runs on the control channel's worker: with
# region= and a slow NBD export as backing= (nbdkit's delay filter: each
# write answered after 1 s, backing_timeout 30 s), `writeback idle` is
# started on the control channel and `handover` sent while it waits for
# the export.  The handover stops the worker first - its backing request
# cut short, the thread joined - and then hands the store over, so that:
#   - the server exits with status 0, no abort and no sanitizer report
#     (before: the store's backing store and codecs were freed under the
#     worker: "free(): corrupted unsorted chunks", exit 134, 5 runs of 6);
#   - `handover` answers ok;
#   - the writeback's client is told it was cut short by the handover
#     (with the blocks written back before), and the log says so, not
#     "no answer in time" (before: the one run of 6 that lived logged its
#     cut write as a backing_timeout);
#   - the next server, on the same region and export, takes the device
#     over clean (no recovery) and reads back every block written, the
#     blocks the reply counts from the cold tier.
# Three rounds, each a server of its own.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3 ipcs

region="$tmp/region"
cleanup_add 'id=$(sed -n "s/.* shm=\([0-9]*\) .*/\1/p" "$tmp/region" 2>/dev/null); [ -z "$id" ] || ipcrm -m "$id" 2>/dev/null'
server_stop ()
{
    [ -s "$tmp/server.pid" ] && kill -9 "$(cat "$tmp/server.pid")" 2>/dev/null || :
}
cleanup_add server_stop

cat > "$tmp/data.py" <<'EOF'
# The device's blocks for round VERSION: text (compressed), random
# (stored raw), same-filled.
import random
B = 4096
def blocks(version):
    rnd = random.Random(version)
    out = {}
    for b in range(1024):
        kind = b % 3
        if kind == 0:
            out[b] = (("block %d round %d " % (b, version)) * 300)[:B].encode()
        elif kind == 1:
            out[b] = rnd.randbytes(B)
        else:
            out[b] = bytes([(b + version) % 251]) * B
    return out
EOF

cat > "$tmp/handover.py" <<'EOF'
import os, re, socket, sys, threading, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
sys.path.insert(0, os.path.dirname(sys.argv[0]))
from ctl_client import Ctl
from data import blocks, B

sock_path, ctl_path, reply_path, version = sys.argv[1:5]
ctl = Ctl(ctl_path)
h = nbd.NBD(); h.connect_unix(sock_path)
for b, data in blocks(int(version)).items():
    h.pwrite(data, b * B)
h.flush()
h.shutdown()
assert ctl.fields("idle all")["marked"] > 600

# The writeback, on a connection of its own, on the worker.
writer = socket.socket(socket.AF_UNIX); writer.connect(ctl_path)
outcome = {}
def write_back():
    try:
        outcome["reply"] = ctl.command("writeback idle", sock=writer)
    except (AssertionError, OSError) as e:
        outcome["reply"] = e
thread = threading.Thread(target=write_back, daemon=True)
thread.start()
time.sleep(1.5)                 # a batch written (1 s), the next waiting
assert thread.is_alive(), "the writeback ended before the handover: %r" % outcome

start = time.monotonic()
lines, good, last = ctl.command("handover")
took = time.monotonic() - start
print("round %s: handover: %s after %.2f s" % (version, last, took))
assert good, "handover: %s" % last
thread.join(30)
assert not thread.is_alive(), "the writeback's client got no reply"
reply = outcome["reply"]
print("round %s: the writeback's reply: %r" % (version, reply))
assert isinstance(reply, tuple), reply
lines, good, last = reply
cut = re.match(r"error: writeback: cut short by the handover: (\d+) blocks", last)
assert not good and cut, last
# The blocks it wrote back before: they are in the cold tier now.
written = int(cut.group(1))
with open(reply_path, "w") as f:
    f.write("%d\n" % written)
EOF

cat > "$tmp/verify.py" <<'EOF'
import os, sys, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
sys.path.insert(0, os.path.dirname(sys.argv[0]))
from ctl_client import Ctl
from data import blocks, B
uri, ctl_path, version, written = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
h = nbd.NBD(); h.connect_uri(uri)
want = blocks(int(version))
bad = [b for b, data in want.items() if h.pread(B, b * B) != data]
assert not bad, "blocks that differ after the handover: %s" % bad[:10]
stats = Ctl(ctl_path).stats()
print("round %s: every block of %d read back after the handover; bd_count "
      "%s (the writeback's reply: %d); recoveries %s"
      % (version, len(want), stats["bd_count"], written, stats["recoveries"]))
assert int(stats["bd_count"]) == written, (stats["bd_count"], written)
assert int(stats["recoveries"]) == 0, stats["recoveries"]
h.shutdown()
EOF

truncate -s 64M "$tmp/remote.img"
remote_start --filter=delay file "$tmp/remote.img" delay-write=1
backing="nbd+unix:///?socket=$tmp/remote.sock"

for round in 1 2 3; do
    # The last server's sockets: a handover's exit leaves them.
    rm -f "$tmp/server.pid" "$tmp/written" "$tmp/sock" "$tmp/ctl"
    zram_nbdkit -f -U "$tmp/sock" -P "$tmp/server.pid" "$PLUGIN" 8M \
        region="$region" backing="$backing" ctl="$tmp/ctl" \
        2>"$tmp/server-$round.err" &
    server=$!
    for _ in $(seq 100); do [ -S "$tmp/ctl" ] && [ -s "$tmp/server.pid" ] && break; sleep 0.1; done
    [ -S "$tmp/ctl" ] || fail "round $round: the server did not start: $(cat "$tmp/server-$round.err")"
    /usr/bin/python3 "$tmp/handover.py" "$tmp/sock" "$tmp/ctl" "$tmp/written" "$round" ||
        { server_stop; wait "$server" || :; fail "round $round: handover beside a writeback: $(tail -5 "$tmp/server-$round.err")"; }
    rc=0
    wait "$server" || rc=$?
    cat "$tmp/server-$round.err" >&2
    [ "$rc" = 0 ] || fail "round $round: the server exited with status $rc after the handover: $(tail -5 "$tmp/server-$round.err")"
    grep -q "writeback cut short by the handover" "$tmp/server-$round.err" ||
        fail "round $round: the log does not say the writeback was cut short by the handover"
    if grep -E "no answer in time|corrupted|Aborted" "$tmp/server-$round.err"; then
        fail "round $round: the cut writeback was logged as something else"
    fi
    zram_nbdkit -U - "$PLUGIN" 8M region="$region" backing="$backing" \
        ctl="$tmp/ctl-verify" \
        --run "/usr/bin/python3 '$tmp/verify.py' \"\$uri\" '$tmp/ctl-verify' $round $(cat "$tmp/written")" ||
        fail "round $round: the next server after the handover"
done
echo "ok: a handover beside a writeback: the worker stopped first, every block kept"
