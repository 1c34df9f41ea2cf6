#!/usr/bin/env bash
# The control channel beside a wedged backing store: with an NBD backing
# export whose writes are answered only after 60 s (nbdkit's delay
# filter), `writeback idle` runs on the control channel's worker thread,
# so that while it waits for the export
#   - `info` and `stats` from other clients answer at once (< 2 s);
#   - a second writeback (or writeback_limit SIZE) is answered "busy";
#   - the client that asked gets its reply when the writeback ends (an
#     error after backing_timeout: the blocks stay in RAM), and its
#     connection goes on;
#   - SIGTERM stops the server within 2 s, the worker being inside a
#     backing request (control_stop cuts it short).
# The figures measured are printed.  Before the worker, `info` got no
# reply in 5 s and SIGTERM took 54 s.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3

server_stop ()
{
    [ -s "$tmp/server.pid" ] && kill -9 "$(cat "$tmp/server.pid")" 2>/dev/null || :
}
cleanup_add server_stop

cat > "$tmp/wedged.py" <<'EOF2'
import os, socket, sys, threading, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl

sock_path, ctl_path, pid_path, mode = sys.argv[1:5]
B = 4096
ctl = Ctl(ctl_path)
h = nbd.NBD(); h.connect_unix(sock_path)
for b in range(64):
    h.pwrite((b"block %d " % b) * 400 + bytes(B - len(b"block %d " % b) * 400),
             b * B)
assert ctl.fields("idle all") == {"marked": 64}
h.shutdown()

# The writeback, on a connection of its own: its reply comes when the
# worker is done (phase "reply"), or never (phase "sigterm").
writer = socket.socket(socket.AF_UNIX); writer.connect(ctl_path)
outcome = {}
def write_back():
    start = time.monotonic()
    try:
        outcome["reply"] = ctl.command("writeback idle", sock=writer)
    except (AssertionError, OSError) as e:
        outcome["reply"] = e
    outcome["took"] = time.monotonic() - start
thread = threading.Thread(target=write_back, daemon=True)
thread.start()
time.sleep(1.0)
assert thread.is_alive(), "the writeback ended at once: %r" % outcome

# Other clients are answered while the worker waits for the export.
slowest = 0.0
for i in range(3):
    for command in ("info", "stats"):
        start = time.monotonic()
        s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(ctl_path)
        lines, good, last = ctl.command(command, sock=s)
        s.close()
        took = time.monotonic() - start
        assert good, "%s: %s" % (command, last)
        slowest = max(slowest, took)
print("%s: info and stats beside a writeback waiting for the export: "
      "slowest answer %.3f s" % (mode, slowest))
assert slowest < 2.0, slowest
for line in ("writeback huge", "writeback_limit 1M"):
    err = ctl.error(line, r"^error: busy: 'writeback' is running")
print("%s: a second command that waits for the backing store: %s" % (mode, err))
assert ctl.ok("writeback_limit") == ["writeback_limit off"]
assert thread.is_alive(), "the writeback ended while others were served"

if mode == "reply":
    thread.join(60)
    assert not thread.is_alive(), "no reply to the writeback in 60 s"
    lines, good, last = outcome["reply"]
    print("reply: the writeback's own reply after %.1f s: %s"
          % (outcome["took"], last))
    assert not good and last.startswith("error: writeback: "), last
    assert 1.5 < outcome["took"] < 30, outcome["took"]
    assert ctl.ok("bd_stat")[0].split()[0] == "0"
    # Its connection goes on, and the worker is free again.
    lines, good, last = ctl.command("info", sock=writer)
    assert good, last
    lines, good, last = ctl.command("writeback huge_idle")
    assert not last.startswith("error: busy"), last
    sys.exit(0)

# SIGTERM while the worker is inside a backing request.
pid = int(open(pid_path).read())
start = time.monotonic()
os.kill(pid, 15)
while time.monotonic() < start + 90:
    try:
        os.kill(pid, 0)
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
    except (ProcessLookupError, FileNotFoundError):
        break
    time.sleep(0.02)
took = time.monotonic() - start
print("sigterm: the server exited %.2f s after SIGTERM, its writeback "
      "waiting for the export" % took)
assert took < 2.0, took
thread.join(5)
assert not thread.is_alive(), "the writeback's client was left hanging"
print("sigterm: the writeback's client got: %r" % (outcome["reply"],))
EOF2

truncate -s 64M "$tmp/remote.img"
remote_start --filter=delay file "$tmp/remote.img" delay-write=60
backing="nbd+unix:///?socket=$tmp/remote.sock"

# The reply case, with a short deadline.
zram_nbdkit -U - -P "$tmp/server.pid" "$PLUGIN" 16M backing="$backing" \
    backing_timeout=2 ctl="$tmp/ctl-reply" \
    --run "/usr/bin/python3 '$tmp/wedged.py' \"\$unixsocket\" '$tmp/ctl-reply' '$tmp/server.pid' reply" ||
    fail "the writeback's reply"

# SIGTERM: a server of our own (not --run), backing_timeout=5.
rm -f "$tmp/server.pid"
zram_nbdkit -f -U "$tmp/sock" -P "$tmp/server.pid" "$PLUGIN" 16M \
    backing="$backing" backing_timeout=5 ctl="$tmp/ctl" &
server=$!
for _ in $(seq 100); do [ -S "$tmp/ctl" ] && [ -s "$tmp/server.pid" ] && break; sleep 0.1; done
[ -S "$tmp/ctl" ] || fail "the server did not start"
/usr/bin/python3 "$tmp/wedged.py" "$tmp/sock" "$tmp/ctl" "$tmp/server.pid" sigterm ||
    { server_stop; wait "$server" || :; fail "SIGTERM beside a wedged writeback"; }
wait "$server" || :
[ ! -S "$tmp/ctl" ] || fail "the control socket was left behind"
echo "ok: the control channel beside a wedged backing store"
