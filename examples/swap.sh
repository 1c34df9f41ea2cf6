#!/usr/bin/env bash
# Compressed swap without the zram module: serve a device with nbdkit in
# swap mode, attach it with nbd-client, and swap on it with discard.
# Needs root (swap=on wants CAP_SYS_RESOURCE and CAP_IPC_LOCK) and the nbd
# kernel module (modprobe nbd).  See "Swap" in nbdkit-zram-plugin(1).
#
# - swap=on: the server is an IO flusher (reclaim does not recurse into
#   it), out of the OOM killer's reach, and locks its memory as it
#   touches it; it refuses to start if it cannot be all of that.
# - swap=on also runs the server's threads at SCHED_RR priority 1 (root
#   has CAP_SYS_NICE; else ulimit -r 1), so that the kernel lets it take
#   memory below the min watermark, and it keeps a populated reserve from
#   the start.  vm.min_free_kbytes of at least 12288 (set below) is the
#   other half of what lets it answer under a sudden spike.
# - mem_limit is required: set it below the RAM you can spare.  A full
#   device fails swap-outs with ENOSPC rather than taking the host down.
# - A Unix socket, no TLS, no proxy: their own memory needs would bring
#   the deadlock back.
# - nbd-client -swap keeps the client in memory too; -b 4096 matches the
#   plugin's block.
# - swapon --discard=pages: freed swap slots reach the server as trims and
#   its memory shrinks; without discard it keeps every page ever sent.
# - Under systemd, run the server as in nbdkit-zram.service (beside this
#   script): MemorySwapMax=0, LimitMEMLOCK=infinity.
# - If the server dies, what was swapped to it is gone: the kernel kills
#   the processes that used those pages when they next touch them.
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
if [ "$(sysctl -n vm.min_free_kbytes)" -lt 12288 ]; then
  sysctl -w vm.min_free_kbytes=12288
fi
# Not nbdkit --swap: it populates every mapping (about 200 MiB idle);
# swap=on locks memory as it is touched.
"$NBDKIT" --unix "$SOCKET" --pidfile /run/nbdkit-zram.pid \
  "$PLUGIN" "$SIZE" swap=on mem_limit="$MEM_LIMIT" stats=/run/nbdkit-zram.stats
nbd-client -unix "$SOCKET" "$DEVICE" -b 4096 -swap
mkswap "$DEVICE"
swapon --discard=pages --priority 100 "$DEVICE"
swapon --show
grep -E '^(swap_|reserve_|mem_used_total|compression_ratio)' /run/nbdkit-zram.stats

# To undo: swapoff "$DEVICE"; nbd-client -d "$DEVICE"; kill "$(cat /run/nbdkit-zram.pid)"
