#!/usr/bin/env bash
# Memory comes back without any request asking for it: after a trim, the
# housekeeping thread drains the allocator's deferred frees and resident
# free pages within about a second, so the server's RSS falls back even
# with no stats= file.  RSS is read in builds without sanitizers (their
# shadow memory counts as RSS); the store-level accounting is checked in
# every build.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdsh

export pidfile="$tmp/nbdkit.pid"
zram_nbdsh 256M -P "$pidfile" <<'EOF'
import os, time

def rss_kib():
    pid = int(open(os.environ["pidfile"]).read())
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

measure = os.environ["SANITIZERS"] == "no"
before = rss_kib()
# Incompressible, so stored raw; in 128 KiB requests, so that nbdkit's
# own request buffers (kept by glibc's per-thread arenas) stay small.
chunk = os.urandom(128 << 10)
for i in range(512):
    h.pwrite(chunk, i << 17)
full = rss_kib()
h.trim(64 << 20, 0)
time.sleep(2.5)                      # the housekeeper runs every second
after = rss_kib()
print("RSS KiB: before %d, with 64 MiB stored %d, 2.5 s after trim %d"
      % (before, full, after))
assert h.pread(4096, 0) == bytes(4096)
if measure:
    assert full - before > 60 * 1024, "64 MiB of raw blocks did not show in RSS"
    assert after - before < 8 * 1024, \
        "RSS did not come back after trim: %d KiB above the start" % (after - before)

# Fewer blocks than one batch of deferred frees (512) and than the page
# source keeps resident: only the housekeeper gives these back.
small = os.urandom(400 * 4096)
before = rss_kib()
for i in range(400):                 # 4 KiB requests: small nbdkit buffers
    h.pwrite(small[i * 4096:(i + 1) * 4096], (128 << 20) + i * 4096)
full = rss_kib()
h.trim(len(small), 128 << 20)
time.sleep(2.5)
after = rss_kib()
print("RSS KiB: before %d, with 400 blocks %d, 2.5 s after trim %d"
      % (before, full, after))
if measure:
    grown = full - before
    assert grown > 1200, "400 raw blocks grew RSS by only %d KiB" % grown
    assert full - after > grown * 3 // 4, \
        "the housekeeper did not give back the trimmed blocks' memory"
EOF
