#!/usr/bin/env bash
# Progress of a long command (issue 43): a writeback of 64 MiB to a slow
# backing export (nbdkit's delay filter, 10 ms a write) run by
# nbdkit-zramctl
#   - on a pseudo-terminal (script(1)): progress lines on stderr, each
#     replacing the one before, their share of the device and their
#     count of blocks written back never going down and the count going
#     up, then a summary line with the whole count; the reply on stdout
#     as without progress;
#   - through a pipe: no progress (stderr empty), the same reply;
#     --progress there: the lines, one a line;
#   - on the control channel: `progress on|off` per connection, a bad
#     word refused, pack's progress lines, a client that did not ask
#     gets none.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3 script nbdkit
requires_zramctl

BLOCKS=16384                    # 64 MiB

cat > "$tmp/fill.py" <<'EOF'
import sys, nbd
sock, blocks = sys.argv[1], int(sys.argv[2])
h = nbd.NBD(); h.connect_unix(sock)
for b in range(0, blocks, 64):
    h.pwrite(b"".join((b"block %08d " % i) * 256 + bytes(4096 - 15 * 256)
                      for i in range(b, b + 64)), b * 4096)
h.shutdown()
EOF

cat > "$tmp/protocol.py" <<'EOF'
import os, socket, sys
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
ctl = Ctl(sys.argv[1])
ctl.error("progress maybe", "'maybe' is not on or off")
ctl.error("progress", "usage: progress on|off")
assert ctl.ok("progress on") == [] and ctl.ok("progress off") == []
# pack says its progress as writeback does, the first line at once, to
# the connection that asked only.
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
def ok(line):
    lines, good, last = ctl.command(line, sock=s)
    assert good, "%r: %s" % (line, last)
    return lines
assert ok("progress on") == []
lines = ok("pack max_pages=64")
assert lines[0].startswith("progress pack walked=0 of=16384 done=0"), lines
assert "blocks 64" in lines, lines
assert ok("progress off") == []
assert not any(l.startswith("progress") for l in ok("pack max_pages=64")), lines
s.close()
# Without progress on, a writeback's reply holds no progress line.
lines = ctl.ok("writeback page_indexes=0-1023")
assert [l.split()[0] for l in lines] == ["blocks", "bytes"], lines
assert lines[0] == "blocks 1024", lines
print("protocol: progress on|off answered, a bad word refused, none unasked")
EOF

cat > "$tmp/run.sh" <<'EOF'
set -euo pipefail
sock=$1 ctl=$2 out=$3
/usr/bin/python3 "$out/fill.py" "$sock" 16384
"$ZRAMCTL" idle "$ctl" all > /dev/null
/usr/bin/python3 "$out/protocol.py" "$ctl"
# A pseudo-terminal: script(1) gives the tool one for stdin, stdout and
# stderr alike; its stderr is told apart by the progress lines' text.
script -qec "'$ZRAMCTL' writeback '$ctl' page_indexes=1024-12287" /dev/null \
    > "$out/tty.out"
# A pipe: nothing but the reply; then --progress on a pipe.
"$ZRAMCTL" writeback "$ctl" page_indexes=12288-13311 > "$out/pipe.out" 2> "$out/pipe.err"
"$ZRAMCTL" --progress writeback "$ctl" idle > "$out/forced.out" 2> "$out/forced.err"
EOF

truncate -s 128M "$tmp/remote.img"
remote_start --filter=delay file "$tmp/remote.img" delay-write=10ms
zram_nbdkit -U - "$PLUGIN" 64M backing="nbd+unix:///?socket=$tmp/remote.sock" \
    ctl="$tmp/ctl" \
    --run "bash '$tmp/run.sh' \"\$unixsocket\" '$tmp/ctl' '$tmp'" ||
    fail "the server, or the commands run against it"

/usr/bin/python3 - "$tmp" <<'EOF' || fail "the progress shown"
import re, sys
out = sys.argv[1]
tty = open(out + "/tty.out", "rb").read().decode()
# Progress lines are rewritten with "\r", each ended by "erase to the
# end of the line"; the summary and the reply come after.
pattern = re.compile(r"\r(\w+): (\d+)% of the device looked at, (\d+) blocks "
                     r"written back \((\d+) blocks/s\)\x1b\[K")
shown = [(int(m.group(2)), int(m.group(3))) for m in pattern.finditer(tty)]
assert len(shown) >= 3, "only %d progress lines on the terminal: %r" % (len(shown), tty[:500])
assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(shown, shown[1:])), shown
assert shown[-1][1] > shown[0][1], shown
summary = re.search(r"\r\x1b\[Kwriteback: (\d+) blocks written back in "
                    r"([0-9.]+) s \((\d+) blocks/s\)\r?\n", tty)
assert summary and summary.group(1) == "11264", repr(tty[-400:])
assert re.search(r"^blocks 11264\r?$", tty, re.M), repr(tty[-400:])
print("terminal: %d progress lines, written back %s, then the summary: %s"
      % (len(shown), " ".join("%d%%/%d" % s for s in shown),
         summary.group(0).strip("\r\n\x1b[K")))

pipe_err = open(out + "/pipe.err").read()
assert pipe_err == "", "progress on a pipe unasked: %r" % pipe_err
assert open(out + "/pipe.out").read().splitlines()[0] == "blocks 1024"
forced = open(out + "/forced.err").read().splitlines()
lines = [l for l in forced if "of the device looked at" in l]
assert lines and all("\r" not in l and "\x1b" not in l for l in forced), forced
assert re.match(r"writeback: \d+ blocks written back in", forced[-1]), forced
assert open(out + "/forced.out").read().splitlines()[0] == "blocks 3072"
print("pipe: no progress unless asked; --progress: %d lines, then %r"
      % (len(lines), forced[-1]))
EOF
echo "ok: progress of a writeback on a terminal, through a pipe, on the channel"
