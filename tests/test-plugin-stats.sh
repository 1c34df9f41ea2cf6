#!/usr/bin/env bash
# stats=PATH: the file is rewritten every second while serving and at
# exit; mm_stat and io_stat follow zram's column order and count what
# was written: compressible, same-filled (zero and non-zero) and random
# (stored raw: huge) blocks; trims and zeroes; the key: value lines
# agree with the two zram lines; no temporary file is left behind.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh python3

for comp in lz4 zstd; do
    echo "== test-plugin-stats: comp=$comp"
    dir="$tmp/stats.$comp"
    mkdir "$dir"
    export STATS="$dir/stats"
    zram_nbdsh 64M comp="$comp" stats="$STATS" <<'EOF'
import os, time, nbd

B = 4096
M = 1024 * 1024
path = os.environ["STATS"]

def parse():
    """The stats file as (mm_stat, io_stat, fields), or None if absent."""
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        return None
    assert lines[0].startswith("mm_stat "), lines[0]
    assert lines[1].startswith("io_stat "), lines[1]
    assert lines[2] == "bd_stat 0 0 0", lines[2]   # no backing store here
    mm = [int(x) for x in lines[0].split()[1:]]
    io = [int(x) for x in lines[1].split()[1:]]
    assert len(mm) == 9, lines[0]
    assert len(io) == 4, lines[1]
    fields = dict(l.split(": ", 1) for l in lines[3:])
    return mm, io, fields

def wait_for(what, pred, timeout=3.5):
    end = time.monotonic() + timeout
    while True:
        s = parse()
        if s is not None and pred(s):
            return s
        if time.monotonic() > end:
            raise AssertionError("stats file never showed %s within %.1f s: %r"
                                 % (what, timeout, s))
        time.sleep(0.1)

# The file appears at start-up, with nothing stored.
s = wait_for("the file", lambda s: True)
assert s[0][0] == 0, "orig_data_size %d before any write" % s[0][0]

# 16 MiB of compressible text (no block of it same-filled).
TEXT = 4096
text = b"".join(b"line %08d: the quick brown fox jumps over the lazy dog\n" % i
                for i in range(16 * M // 32))[:16 * M]
assert len(text) == TEXT * B
h.pwrite(text, 0)
# Zero blocks written as data: stored, same-filled (zero).
ZERO = 64
h.pwrite(bytes(ZERO * B), 20 * M)
# Same-filled non-zero: a byte and an 8-byte word.
SAME = 32
h.pwrite(b"\xab" * (SAME // 2 * B), 24 * M)
h.pwrite(b"\x01\x02\x03\x04\x05\x06\x07\x08" * (SAME // 2 * B // 8), 25 * M)
# Random blocks: incompressible, stored raw (huge).
RAND = 100
h.pwrite(os.urandom(RAND * B), 28 * M)
# Reads of never-written space store nothing.
h.pread(M, 40 * M)

blocks = TEXT + ZERO + SAME + RAND
s = wait_for("orig_data_size %d" % (blocks * B),
             lambda s: s[0][0] == blocks * B)
mm, io, fields = s
orig, compr, used, limit, used_max, same, compacted, huge, huge_since = mm
print("mm_stat", mm, "io_stat", io)
assert same == ZERO + SAME, "same_pages %d, want %d" % (same, ZERO + SAME)
assert huge == RAND, "huge_pages %d, want %d" % (huge, RAND)
assert huge_since == RAND, "huge_pages_since %d, want %d" % (huge_since, RAND)
assert 0 < compr < orig, "compr_data_size %d, orig %d" % (compr, orig)
# Random blocks take all their bytes; the text must compress well.
assert compr >= RAND * B, "compr_data_size %d < the raw blocks" % compr
assert compr - RAND * B < TEXT * B // 2, "text compressed to %d" % (compr - RAND * B)
assert used >= compr, "mem_used_total %d < compr_data_size %d" % (used, compr)
assert used_max >= used, "mem_used_max %d < mem_used_total %d" % (used_max, used)
assert limit == 0, "mem_limit %d without mem_limit=" % limit
assert io == [0, 0, 0, 0], "io_stat %r" % io

# Trim 16 text blocks and zero (no hole) 8 random ones: the file follows
# within a few seconds.
h.trim(16 * B, 0)
h.zero(8 * B, 28 * M, nbd.CMD_FLAG_NO_HOLE)
blocks2 = blocks - 16
s = wait_for("the trim and zero",
             lambda s: s[0][0] == blocks2 * B and s[0][7] == RAND - 8)
mm, io, fields = s
assert mm[5] == ZERO + SAME + 8, "same_pages %d after zero" % mm[5]
assert mm[7] == RAND - 8, "huge_pages %d after zero" % mm[7]
assert mm[8] == RAND, "huge_pages_since %d changed" % mm[8]
assert io[3] == 16 + 8, "notify_free %d, want 24" % io[3]
print("stats while serving ok")
# The last act before the client goes: 3 more random blocks, which only
# the file written at exit is sure to count.
h.pwrite(os.urandom(3 * B), 30 * M)
EOF

    # At exit the file was written once more, complete, and nothing else
    # is left in the directory.
    ls -A "$dir" > "$tmp/ls"
    [ "$(cat "$tmp/ls")" = stats ] || {
        cat "$tmp/ls" >&2
        fail "comp=$comp: the stats directory holds more than the stats file"
    }
    python3 - "$STATS" <<'EOF' || fail "comp=$comp: stats file at exit is wrong"
import sys
lines = open(sys.argv[1]).read().splitlines()
mm_line, io_line = lines[0].split(), lines[1].split()
assert mm_line[0] == "mm_stat" and len(mm_line) == 10, lines[0]
assert io_line[0] == "io_stat" and len(io_line) == 5, lines[1]
assert lines[2] == "bd_stat 0 0 0", lines[2]
mm = [int(x) for x in mm_line[1:]]
io = [int(x) for x in io_line[1:]]
fields = {}
for line in lines[3:]:
    key, sep, value = line.partition(": ")
    assert sep, "not a key: value line: %r" % line
    fields[key] = value
names = ["orig_data_size", "compr_data_size", "mem_used_total", "mem_limit",
         "mem_used_max", "same_pages", "pages_compacted", "huge_pages",
         "huge_pages_since"]
for name, value in zip(names, mm):
    assert int(fields[name]) == value, "%s: %s, mm_stat says %d" % (name, fields[name], value)
for name, value in zip(["failed_reads", "failed_writes", "invalid_io", "notify_free"], io):
    assert int(fields[name]) == value, "%s: %s, io_stat says %d" % (name, fields[name], value)
orig, compr, used = mm[0], mm[1], mm[2]
assert orig == (4096 + 64 + 32 + 100 - 16 + 3) * 4096, "orig_data_size at exit %d" % orig
assert mm[5] == 64 + 32 + 8, "same_pages at exit %d" % mm[5]
assert mm[7] == 92 + 3 and mm[8] == 103, "huge_pages at exit %d, since %d" % (mm[7], mm[8])
assert io[3] == 24, "notify_free at exit %d" % io[3]
cr = float(fields["compression_ratio"])
mr = float(fields["memory_ratio"])
assert abs(cr - orig / compr) < 0.01, "compression_ratio %s, want %.2f" % (cr, orig / compr)
assert abs(mr - orig / used) < 0.01, "memory_ratio %s, want %.2f" % (mr, orig / used)
assert cr > 1.5 and mr > 1.0, (cr, mr)
assert lines[-1].startswith("memory_ratio: "), "last line %r: file not complete" % lines[-1]
print("stats at exit ok: compression_ratio %s memory_ratio %s" % (cr, mr))
EOF
done

# ---- planted symbolic links are never followed ---------------------------
# A file the server must not touch (it runs as root in swap mode), a link
# to it planted at the stats path, and links planted at every name a
# predictable temporary could have had: after a run the file is intact,
# the stats path is a regular file of mode 0644, and no temporary is left.
printf 'precious\n' > "$tmp/victim"
chmod 600 "$tmp/victim"
mkdir "$tmp/links"
ln -s "$tmp/victim" "$tmp/links/stats"
for pid in $(seq 2 200) $(seq $$ $(($$ + 2000))); do
    ln -s "$tmp/victim" "$tmp/links/stats.tmp.$pid"
done
zram_nbdkit -U - "$PLUGIN" 1M stats="$tmp/links/stats" --run '
    nbdsh -u "$uri" -c "h.pwrite(b\"x\" * 4096, 0)"; sleep 1.5'
[ "$(cat "$tmp/victim")" = precious ] || fail "the stats file followed a planted link"
[ "$(stat -c %a "$tmp/victim")" = 600 ] || fail "the victim's mode changed"
[ -f "$tmp/links/stats" ] && [ ! -L "$tmp/links/stats" ] ||
    fail "the stats path is not a regular file"
[ "$(stat -c %a "$tmp/links/stats")" = 644 ] ||
    fail "the stats file has mode $(stat -c %a "$tmp/links/stats"), not 644"
grep -q '^orig_data_size: 4096$' "$tmp/links/stats" || fail "stats file: $(cat "$tmp/links/stats")"
left=$(find "$tmp/links" -name 'stats.tmp.*' ! -type l)
[ -z "$left" ] || fail "temporaries left: $left"
echo "ok: planted links not followed"
