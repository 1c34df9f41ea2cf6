#!/usr/bin/env bash
# The control channel's `memory`: the server's resident memory sorted by
# kind (files, region, heap, stacks, anonymous), beside what the store
# counts of its own.  With 32 MiB stored: the kinds add up to the total,
# the total is the process's RSS (/proc/PID/status, within what a moment
# apart allows), there is a stack for every thread, the mapped files are
# counted, and the pool's pages are in the anonymous mappings - or, with
# region=, in the region's segment.  The stats file's two figures of the
# same (process_rss_files, process_rss_beyond_store) agree with it.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh

cat > "$tmp/memory.py" <<'EOF'
import os, sys, nbd

sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl

where, uri, ctl_path, pid_path = sys.argv[1:5]
B = 4096
h = nbd.NBD(); h.connect_uri(uri)
for i in range(8192):                       # 32 MiB, about 2:1
    h.pwrite(os.urandom(B // 2) + bytes(B // 2), i * B)
pid = int(open(pid_path).read())

def status(field):
    for line in open("/proc/%d/status" % pid):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)

lines = Ctl(ctl_path).ok("memory")
m = {}
for line in lines:
    name, value = line.split()
    m[name] = int(value)
print(where, m)
kinds = ("files", "region", "heap", "stacks", "anonymous", "other")
assert sum(m["resident_" + k] for k in kinds) == m["resident"], m
rss = status("VmRSS") * 1024
assert abs(m["resident"] - rss) < 0.1 * rss, "resident %d, VmRSS %d" % (m["resident"], rss)
assert m["stacks"] >= status("Threads"), "%d stacks for %d threads" % (m["stacks"], status("Threads"))
assert m["resident_stacks"] > 0 and m["resident_files"] > 0, m
pool = m["store_pool_pages"]
assert pool > 8 << 20, m
home = m["resident_region"] if where == "region" else m["resident_anonymous"]
assert home >= pool, "%s holds %d, the pool %d" % (where, home, pool)
if where != "region":
    assert m["resident_region"] == 0, m
own = m["resident"] - m["resident_files"] - m["resident_other"]
counted = sum(m[k] for k in m if k.startswith("store_"))
assert m["not_counted_by_store"] == own - counted, m
# The stats give the same account in two figures: files, and what is
# neither files nor the store's (a moment apart from `memory`: within
# 2 MiB), and they add up with the store's own fields to process_rss.
stats = {}
for line in Ctl(ctl_path).ok("stats"):
    if ": " in line:
        key, value = line.split(": ", 1)
        stats[key] = value
files, beyond = int(stats["process_rss_files"]), int(stats["process_rss_beyond_store"])
store = sum(int(stats[k]) for k in ("mem_used_total", "reserve_bytes", "table_bytes",
                                     "metadata_bytes", "codec_bytes", "decode_cache_bytes",
                                     "pack_dictionary_bytes"))
print(where, "stats: files %d, beyond the store %d, store %d, RSS %s"
      % (files, beyond, store, stats["process_rss"]))
assert files + beyond + store == int(stats["process_rss"]), stats
assert abs(files - m["resident_files"]) < 2 << 20, (files, m)
beyond_memory = m["not_counted_by_store"] + m["resident_other"]
assert abs(beyond - beyond_memory) < 2 << 20, (beyond, beyond_memory)
h.shutdown()
EOF

for where in anonymous region; do
    extra=
    [ "$where" = anonymous ] || extra="region=$tmp/region"
    # shellcheck disable=SC2086   # extra: one word or none
    zram_nbdkit -U - -P "$tmp/pid" "$PLUGIN" 64M ctl="$tmp/ctl" $extra \
        --run "python3 '$tmp/memory.py' $where \"\$uri\" '$tmp/ctl' '$tmp/pid'"
done
echo "ok: memory: every resident byte sorted by kind, beside the store's count"
