#!/usr/bin/env bash
# The control channel against hostile and careless clients: a silent
# client, a client that sends but never reads, binary junk, a NUL byte,
# an empty line, a burst of 1,000 connections (more than the channel
# serves at once), control bytes that must not reach the log; each time
# a well-behaved client is answered and block I/O goes on; then SIGTERM
# with a client that never reads: the server exits within 2 seconds.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh

cat > "$tmp/hostile.py" <<'EOF2'
import os, socket, sys, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl

sock_path, ctl_path, pid_path = sys.argv[1], sys.argv[2], sys.argv[3]
B = 4096
ctl = Ctl(ctl_path)
h = nbd.NBD(); h.connect_unix(sock_path)

def answered(what, deadline=8.0):
    """A well-behaved client gets its answer, and I/O works, in time."""
    start = time.monotonic()
    s = socket.socket(socket.AF_UNIX); s.settimeout(deadline)
    s.connect(ctl_path)
    lines = ctl.command("info", sock=s)[0]
    s.close()
    assert any(l.startswith("disksize ") for l in lines), lines
    data = os.urandom(B)
    h.pwrite(data, 7 * B)
    assert h.pread(B, 7 * B) == data
    took = time.monotonic() - start
    assert took < deadline, "%s: %.1f s" % (what, took)
    print("%s: answered in %.2f s" % (what, took))

# Data for long replies.
for i in range(0, 4096):
    h.pwrite((b"%d " % i) * 100 + bytes(B - len(b"%d " % i) * 100), i * B)

# A silent client holds nobody up.
silent = socket.socket(socket.AF_UNIX); silent.connect(ctl_path)
answered("beside a silent client", 2.0)

# A client that asks for long replies and never reads them is dropped
# within the send timeout; meanwhile and after, others are answered.
def non_reader():
    """A client that asks for long replies until its socket is full."""
    s = socket.socket(socket.AF_UNIX); s.connect(ctl_path)
    s.setblocking(False)
    try:
        for _ in range(200):
            s.send(b"block_state 0 4096\n")
    except BlockingIOError:
        pass
    return s

greedy = non_reader()
answered("beside a client that does not read", 4.0)
time.sleep(3)
greedy.setblocking(True); greedy.settimeout(10)
try:
    while greedy.recv(1 << 20):
        pass                        # what was sent before the drop, then EOF
    print("the non-reading client was dropped")
except (ConnectionResetError, BrokenPipeError):
    print("the non-reading client was dropped (reset)")
answered("after the non-reading client")

# Every line gets a reply: an empty line, a NUL byte, binary junk.
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(ctl_path)
lines, good, last = ctl.command("", sock=s)
assert good, last
lines, good, last = ctl.command("\0help", sock=s)
assert last == "error: the line holds a NUL byte", last
junk = bytes(range(1, 256)).replace(b"\n", b"") * 3
s.sendall(junk[:1000] + b"\n")
reply = b""
while not reply.endswith(b"\n"):
    reply += s.recv(4096)
assert reply.startswith(b"error: "), reply
lines, good, last = ctl.command("info", sock=s)
assert good, last
s.close()
answered("after junk")

# Control bytes never reach the log (checked by the shell afterwards).
err = ctl.error("mem_limit \x1b[31mRED", r"mem_limit: '.*' is not a size")
err = ctl.error("writeback_limit \x1b[31mRED", r".")

# 1,000 connections at once, held open: the channel refuses what it
# cannot serve, never wedges, and answers the next client that talks.
conns = []
not_queued = 0
for i in range(1000):
    c = socket.socket(socket.AF_UNIX)
    c.setblocking(False)
    try:
        c.connect(ctl_path)
        conns.append(c)
    except BlockingIOError:
        not_queued += 1             # the listen queue was full
        c.close()
time.sleep(1.5)
answered("beside 1,000 connections")
told = closed = held = 0
for c in conns:
    try:
        reply = c.recv(200)
        if reply.startswith(b"error: too many control clients"):
            told += 1
        elif reply == b"":
            closed += 1             # served, then its place given to another
    except BlockingIOError:
        held += 1                   # served, still open
    except ConnectionResetError:
        closed += 1
    c.close()
print("1,000 connections: %d told 'too many', %d closed for a newer one, "
      "%d still served, %d not queued" % (told, closed, held, not_queued))
assert not_queued == 0, not_queued
assert told + closed + held == 1000 and held <= 8, (told, closed, held)

# SIGTERM while a client never reads: the server exits within 2 s.
stuck = non_reader()
time.sleep(0.5)
h.shutdown()
pid = int(open(pid_path).read())
start = time.monotonic()
os.kill(pid, 15)
while time.monotonic() < start + 10:
    try:
        os.kill(pid, 0)
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
    except (ProcessLookupError, FileNotFoundError):
        break
    time.sleep(0.05)
took = time.monotonic() - start
print("SIGTERM with a client that does not read: exited in %.2f s" % took)
assert took < 2.0, took
EOF2

zram_nbdkit -f -U "$tmp/sock" -P "$tmp/pid" "$PLUGIN" 64M ctl="$tmp/ctl" &
server=$!
for _ in $(seq 100); do [ -S "$tmp/ctl" ] && [ -s "$tmp/pid" ] && break; sleep 0.1; done
[ -S "$tmp/ctl" ] || fail "the server did not start"
/usr/bin/python3 "$tmp/hostile.py" "$tmp/sock" "$tmp/ctl" "$tmp/pid" ||
    { kill "$(cat "$tmp/pid")" 2>/dev/null; wait "$server" || :; fail "hostile clients"; }
wait "$server" || :
# The server ran in a background shell: its log is the one stderr file.
logs=("$tmp"/nbdkit-stderr.*)
[ -s "${logs[0]}" ] || fail "no server log"
grep -q "client dropped: it read nothing of its reply" "${logs[@]}" ||
    fail "the dropped client was not logged"
if grep -q $'\x1b' "${logs[@]}"; then
    fail "a client's control bytes reached the log: $(grep -a $'\x1b' "${logs[@]}" | cat -v)"
fi
echo "ok: hostile control clients"
