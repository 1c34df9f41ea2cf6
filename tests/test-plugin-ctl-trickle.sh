#!/usr/bin/env bash
# Control clients that trickle bytes never lock the others out: a line
# must be finished within 2 s of its first byte (a client that does not
# is told so and closed), and when all 8 places are taken a new client
# takes the place of the one that has gone longest without finishing a
# line.  Eight clients each sending one byte every 0.5 s, and opening a
# new connection at once whenever theirs is closed: a ninth client's
# `info` is answered within a few seconds, every time.  A line sent in
# pieces within the 2 s is run as usual.  The figures are printed.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3

cat > "$tmp/trickle.py" <<'EOF2'
import os, socket, sys, threading, time
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl

ctl_path = sys.argv[1]
ctl = Ctl(ctl_path)

# A line in pieces, within the deadline: run as usual.
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(ctl_path)
for piece in (b"in", b"f", b"o\n"):
    s.sendall(piece)
    time.sleep(0.4)
reply = b""
while not reply.endswith(b"ok\n"):
    chunk = s.recv(4096)
    assert chunk, "closed: %r" % reply
    reply += chunk
assert reply.startswith(b"disksize "), reply
s.close()

# One client alone trickling: told, then closed, 2 s after its first byte.
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(ctl_path)
start = time.monotonic()
told = b""
try:
    for byte in b"info info info":
        s.send(bytes([byte]))
        time.sleep(0.5)
except (BrokenPipeError, ConnectionResetError):
    pass
try:
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        told += chunk
except ConnectionResetError:
    pass
took = time.monotonic() - start
s.close()
print("a lone trickling client: closed after %.1f s, told %r" % (took, told))
assert told == b"error: the line was not finished within 2 s of its first byte\n", told
assert 1.5 < took < 4.5, took

# Eight tricklers that come back at once whenever they are closed.
stop = threading.Event()
closed = [0] * 8
def trickler(i):
    while not stop.is_set():
        c = socket.socket(socket.AF_UNIX)
        try:
            c.connect(ctl_path)
            while not stop.is_set():
                c.send(b"x")
                time.sleep(0.5)
        except OSError:
            closed[i] += 1
        finally:
            c.close()
threads = [threading.Thread(target=trickler, args=(i,), daemon=True)
           for i in range(8)]
for t in threads:
    t.start()
time.sleep(1.0)

slowest = 0.0
for attempt in range(6):
    start = time.monotonic()
    s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(ctl_path)
    try:
        lines, good, last = ctl.command("info", sock=s)
    except (AssertionError, OSError) as e:
        raise AssertionError("attempt %d: no answer beside 8 trickling "
                             "clients: %r" % (attempt, e))
    finally:
        s.close()
    took = time.monotonic() - start
    assert good and lines[0].startswith("disksize "), (lines, last)
    slowest = max(slowest, took)
    time.sleep(0.7)
stop.set()
for t in threads:
    t.join(5)
print("beside 8 clients trickling a byte every 0.5 s: info answered 6 times "
      "of 6, slowest in %.3f s; the tricklers were closed %d times"
      % (slowest, sum(closed)))
assert slowest < 3.0, slowest
assert sum(closed) >= 8, closed
EOF2

zram_nbdkit -U - "$PLUGIN" 16M ctl="$tmp/ctl" \
    --run "/usr/bin/python3 '$tmp/trickle.py' '$tmp/ctl'" ||
    fail "trickling control clients"
echo "ok: trickling control clients lock nobody out"
