#!/usr/bin/env bash
# Compressed swap without the zram module: serve a device with nbdkit,
# attach it with nbd-client, and swap on it.  Needs root and the nbd kernel
# module (modprobe nbd).  Keep the server itself out of swap, or it can
# deadlock swapping to itself: run it under the systemd unit beside this
# script (MemorySwapMax=0), and set mem_limit below the RAM you can spare.
set -euo pipefail
PLUGIN=${PLUGIN:-zram}   # or the path of a built nbdkit-zram-plugin.so
# nbdkit 1.34 or later: older ones abort when a client dies mid-request.
# On Debian 12, the one ./setup.sh builds: NBDKIT=$PWD/build/nbdkit/sbin/nbdkit
NBDKIT=${NBDKIT:-nbdkit}

SIZE=${SIZE:-4G}
MEM_LIMIT=${MEM_LIMIT:-1G}
SOCKET=${SOCKET:-/run/nbdkit-zram.sock}
DEVICE=${DEVICE:-/dev/nbd0}

modprobe nbd
"$NBDKIT" --unix "$SOCKET" --pidfile /run/nbdkit-zram.pid \
  "$PLUGIN" "$SIZE" mem_limit="$MEM_LIMIT" stats=/run/nbdkit-zram.stats
nbd-client -unix "$SOCKET" "$DEVICE" -b 4096
mkswap "$DEVICE"
swapon --priority 100 "$DEVICE"
swapon --show

# To undo: swapoff "$DEVICE"; nbd-client -d "$DEVICE"; kill "$(cat /run/nbdkit-zram.pid)"
