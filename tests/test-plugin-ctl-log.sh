#!/usr/bin/env bash
# A client's text never reaches the server's log: sizes that do not
# parse (letters and digits only, which nbdkit_parse_size would log) are
# answered with an error to the client alone, and the log holds none of
# the marker they carry.  Good sizes parse as nbdkit's sizes do.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3

marker=zzzzINJECTEDzzzz

cat > "$tmp/log.py" <<'EOF2'
import os, sys
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl

ctl_path, marker = sys.argv[1], sys.argv[2]
ctl = Ctl(ctl_path)

bad = [marker, "1" + marker, marker + "1", "12" + marker[:1], "1.5M",
       "1MiB", "-1", "0x10", "99999999999999999999", "8E", "9223372036854775808",
       "1" + marker.upper()]
for size in bad:
    for command in ("mem_limit", "writeback_limit"):
        lines, good, last = ctl.command("%s %s" % (command, size))
        assert not good, "%s %s: accepted" % (command, size)
        assert "is not a size" in last, last
        assert size in last, last   # the client is told what it sent
print("%d sizes that do not parse: refused, each with a reply" % len(bad))

# Good ones: nbdkit's suffixes, either case.
for size, value in (("0", 0), ("512M", 512 << 20), ("1g", 1 << 30),
                    ("2048s", 1 << 20), ("65536b", 65536), ("3K", 3072),
                    ("1T", 1 << 40), ("7E", 7 << 60)):
    ctl.ok("mem_limit %s" % size)
    got = int(dict(l.split() for l in ctl.ok("info"))["mem_limit"])
    assert got == value, (size, got, value)
print("sizes with each suffix: parsed as nbdkit parses them")
EOF2

zram_nbdkit -U - "$PLUGIN" 16M ctl="$tmp/ctl" \
    --run "/usr/bin/python3 '$tmp/log.py' '$tmp/ctl' '$marker'" ||
    fail "sizes on the control channel"
if grep -qi "INJECTED" "$NBDKIT_STDERR"; then
    fail "a client's text reached the server's log: $(grep -i INJECTED "$NBDKIT_STDERR")"
fi
echo "ok: a client's text never reaches the server's log"
