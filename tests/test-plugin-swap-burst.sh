#!/usr/bin/env bash
# Swap mode under a burst of swap-outs (the first seconds of a machine
# that starts swapping): writes that find the reserve empty wait for the
# keeper's refill and are tried again, instead of failing with ENOMEM
# (which the kernel logs as a swap write error).  With the smallest
# reserve (swap_reserve=2M) and 128 MiB of incompressible 1 MiB writes,
# 4 in flight (half the reserve each: it runs dry in every build, and at
# most two refills stand between a write and its memory; with 16, and
# 8, in flight, a write under TSan on a loaded machine waited past the
# 250 ms for its turn): the reserve runs dry (reserve_misses > 0: the
# case is met), no write fails (nor counts in failed_writes: a write
# that waited and was stored is none), and every block reads back.
# Before the retry, 1 write in 10 of 128 KiB failed here.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh

cat > "$tmp/burst.py" <<'PY'
import os, sys, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
uri, ctl = sys.argv[1], Ctl(sys.argv[2])
W, TOTAL, IN_FLIGHT = 1 << 20, 128 << 20, 4
h = nbd.NBD(); h.connect_uri(uri)
data = os.urandom(TOTAL)                # incompressible, made beforehand
buffers = [nbd.Buffer.from_bytearray(bytearray(data[i * W:(i + 1) * W]))
           for i in range(TOTAL // W)]
def piece(i):
    return data[i * W:(i + 1) * W]
failed = []
def done(offset, err):
    if err.value:
        failed.append((offset, err.value))
        err.value = 0
    return 1
for i in range(TOTAL // W):
    while h.aio_in_flight() >= IN_FLIGHT:
        h.poll(-1)
    h.aio_pwrite(buffers[i], i * W,
                 completion=lambda err, offset=i * W: done(offset, err))
while h.aio_in_flight() > 0:
    h.poll(-1)
stats = dict(l.split(": ", 1) for l in ctl.ok("stats") if ": " in l)
misses = int(stats["reserve_misses"])
failed_writes = int(stats["failed_writes"])
print("burst: %d writes of 1 MiB, %d failed; the reserve ran dry %d times"
      % (TOTAL // W, len(failed), misses))
assert not failed, "writes failed: %r" % failed[:5]
assert misses > 0, "the reserve never ran dry: the case was not met"
# A write that waited and was stored is no failed write (zram's count).
assert failed_writes == 0, "failed_writes %d, no write failed" % failed_writes
for i in range(0, TOTAL // W, 7):
    assert h.pread(W, i * W) == piece(i), "write %d reads back wrong" % i
h.shutdown()
PY

zram_nbdkit -U - "$PLUGIN" 256M swap=try mem_limit=200M swap_reserve=2M \
    ctl="$tmp/ctl" \
    --run "/usr/bin/python3 '$tmp/burst.py' \"\$uri\" '$tmp/ctl'" ||
    fail "a burst of writes in swap mode"
echo "ok: a burst of swap-outs waits for the reserve's refill, none fails"
