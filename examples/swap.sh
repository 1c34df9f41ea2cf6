#!/usr/bin/env bash
# Compressed swap without the zram module, in one command.  Needs root
# and the nbd kernel module.  See "SWAP" in nbdkit-zramctl(1) and "Swap"
# in nbdkit-zram-plugin(1); examples/nbdkit-zram-swap.service.in does the
# same at boot.
#
# `nbdkit-zramctl swap on` follows the recipe that make check-swap tests
# (the kernel's nbd driver swapping to the server on the same machine,
# 2.25 times RAM arriving at once), printing what it changes:
#   1. modprobe nbd; the first free /dev/nbdN (or --device);
#   2. vm.min_free_kbytes raised to 12288 if lower (swap off puts it
#      back): the min watermark a spike cannot take;
#   3. nbdkit --unix /run/nbdkit-zram-swap/nbdN/sock zram SIZE swap=on
#      comp=ALGORITHM mem_limit=LIMIT stats=.../stats ctl=.../ctl:
#      swap=on makes the server an IO flusher, out of the OOM killer's
#      reach, memory-locked as it touches memory, SCHED_RR priority 1 (the
#      kernel lets it dip below the min watermark), with a populated
#      reserve from the start; it refuses to start, naming what is
#      missing, if it cannot be all of that;
#   4. nbd-client -unix SOCK /dev/nbdN -b 4096 -swap (a Unix socket, no
#      TLS, no proxy: their memory needs would bring the deadlock back;
#      -swap keeps nbd-client in memory), the device marked
#      non-rotational, mkswap, swapon with discard of freed pages (freed
#      swap reaches the server as trims and its memory shrinks) at
#      priority 100.
# Sizing: the device is MEM_LIMIT times the expected ratio (--ratio,
# default 3), so it cannot overfill its memory while the data compresses
# that well; data that compresses worse fills mem_limit first, and
# swap-outs past it fail (the kernel keeps those pages in RAM).
# If the server dies, what was swapped to it is gone: the kernel kills
# the processes that used those pages when they next touch them.
set -euo pipefail
# nbdkit 1.34 or later: older ones abort when a client dies mid-request.
# On Debian 12, the one ./setup.sh builds: make -C build install puts
# the plugin where that nbdkit finds it, and nbdkit-zramctl (whose swap on
# starts that nbdkit) in /usr/local/bin.
MEM_LIMIT=${MEM_LIMIT:-1G}
ALGORITHM=${ALGORITHM:-lz4}

nbdkit-zramctl swap on --mem-limit "$MEM_LIMIT" --algorithm "$ALGORITHM"
swapon --show
nbdkit-zramctl swap status

# To undo: nbdkit-zramctl swap off
