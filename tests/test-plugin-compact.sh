#!/usr/bin/env bash
# Compaction with real clients: a device filled with blocks of every
# compressibility, then trimmed on a random half, gives most of the
# emptied memory back within a couple of seconds with compact=auto (and
# keeps it with compact=off); then two connections overwrite, trim and
# verify random blocks against a model for a few seconds while the
# housekeeper compacts beside them (compact_threshold=0), and every block
# reads back as the model says.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh

cat > "$tmp/compact.py" <<'EOF'
import os, random, sys, time, nbd

B = 4096
BLOCKS = 8192                               # 32 MiB
compact = sys.argv[1]
stats_path = os.environ["STATS"]

sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from stats_file import next_stat
def stat(name):
    return next_stat(stats_path, name)

rng = random.Random(7)
def block(i, version):
    """Compressible to a size that depends on i: every size class."""
    r = random.Random(i * 1000003 + version)
    head = bytes(r.getrandbits(8) for _ in range(64 + (i * 37) % 2900))
    return (head + b"%d/%d " % (i, version) * B)[:B]

uri = sys.argv[2]
h = nbd.NBD(); h.connect_uri(uri)
model = {}
for i in range(BLOCKS):
    model[i] = block(i, 0)
    h.pwrite(model[i], i * B)
full = stat("mem_used_total")
for i in rng.sample(range(BLOCKS), BLOCKS // 2):
    h.trim(B, i * B)
    del model[i]
time.sleep(2.2)
after = stat("mem_used_total")
compacted = stat("pages_compacted")
print("compact=%s: pool %.1f MiB full, %.1f MiB 2 s after trimming half, %d pages compacted"
      % (compact, full / 2**20, after / 2**20, compacted))
if compact == "auto":
    assert compacted > 0, "nothing compacted"
    assert after <= 0.6 * full, "pool %d of %d after trimming half" % (after, full)
else:
    assert compacted == 0, "compact=off compacted %d pages" % compacted
    assert after > 0.9 * full, "compact=off: pool %d of %d" % (after, full)

# Churn on two connections while the housekeeper compacts.
if compact == "auto":
    h2 = nbd.NBD(); h2.connect_uri(uri)
    deadline = time.monotonic() + 4
    version = 1
    while time.monotonic() < deadline:
        for handle in (h, h2):
            i = rng.randrange(BLOCKS)
            op = rng.random()
            if op < 0.5:
                model[i] = block(i, version); version += 1
                handle.pwrite(model[i], i * B)
            elif op < 0.75:
                handle.trim(B, i * B)
                model.pop(i, None)
            else:
                assert handle.pread(B, i * B) == model.get(i, bytes(B)), "block %d" % i
    print("churn: %d writes; pages compacted %d" % (version, stat("pages_compacted")))
    h2.shutdown()
for i in range(BLOCKS):
    assert h.pread(B, i * B) == model.get(i, bytes(B)), "block %d at the end" % i
h.shutdown()
EOF

for compact in auto off; do
    export STATS="$tmp/stats-$compact"
    zram_nbdkit -U - "$PLUGIN" 32M compact=$compact compact_threshold=0 \
        stats="$STATS" --run "python3 '$tmp/compact.py' $compact \"\$uri\""
done
echo "ok: compaction gives memory back under churn, data intact"
