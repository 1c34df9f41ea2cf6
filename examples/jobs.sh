#!/usr/bin/env bash
# Three jobs (containers, CI runners, VMs) with a scratch disk each, from
# one server under one memory budget: each disk is a device of its own
# (an NBD export named job1, job2, job3), and the three share the budget,
# so a job that writes a lot while the others idle may use all of it -
# where one server a disk, or kernel zram's device each, gives each job a
# fixed third.  No root, no kernel module: each job reaches its disk by
# its URI (libnbd tools, qemu, fio's nbd engine).
# Usage: jobs.sh [BUDGET] [SIZE]
set -euo pipefail
PLUGIN=${PLUGIN:-zram}   # or the path of a built nbdkit-zram-plugin.so
NBDKIT=${NBDKIT:-nbdkit} # nbdkit 1.34 or later (./setup.sh builds one)

BUDGET=${1:-512M}
SIZE=${2:-2G}

# Each job: its URI (the socket, its export), some writes, and a look at
# what it holds.  Here they run side by side in the --run shell; in real
# use each URI goes to its container or runner.
# shellcheck disable=SC2016 # expanded by nbdkit's --run shell
JOBS='
for job in job1 job2 job3; do
  disk="nbd+unix:///$job?socket=$unixsocket"
  ( nbdcopy --synchronous /usr/lib/os-release "$disk" &&
    echo "$job: $(nbdinfo --size "$disk") bytes, its data at the start: $(nbdcopy "$disk" - 2>/dev/null | head -c 40 | tr "\n" " ")" ) &
done
wait
nbdinfo --list "$uri" | grep -E "^export=|description:"
'

# -U - picks a private socket; --run stops the server when the jobs end.
exec "$NBDKIT" -U - "$PLUGIN" "$SIZE" mem_limit="$BUDGET" \
    device=job1:"$SIZE" device=job2:"$SIZE" device=job3:"$SIZE":comp=zstd \
    --run "$JOBS"
