#!/usr/bin/env bash
# A QEMU guest whose disk is a compressed RAM disk: copy an image into the
# device, then boot from it.  Everything the guest writes stays compressed
# in the server's memory and vanishes when the server stops.
# Usage: qemu-guest.sh IMAGE [SIZE]
set -euo pipefail
PLUGIN=${PLUGIN:-zram}   # or the path of a built nbdkit-zram-plugin.so
# nbdkit 1.34 or later: older ones abort when a client dies mid-request.
# On Debian 12, the one ./setup.sh builds: NBDKIT=$PWD/build/nbdkit/sbin/nbdkit
NBDKIT=${NBDKIT:-nbdkit}

IMAGE=${1:?usage: $0 IMAGE [SIZE]}
SIZE=${2:-$(qemu-img info --output=json "$IMAGE" | sed -n 's/.*"virtual-size": \([0-9]*\).*/\1/p')}
SOCKET=$(mktemp -u /tmp/zram-XXXXXX.sock)

"$NBDKIT" --unix "$SOCKET" --pidfile "$SOCKET.pid" "$PLUGIN" "$SIZE" comp=zstd
trap 'kill "$(cat "$SOCKET.pid")"' EXIT
qemu-img convert -n -O raw "$IMAGE" "nbd+unix:///?socket=$SOCKET"
qemu-system-x86_64 -m 1G -nographic \
  -drive "file=nbd+unix:///?socket=$SOCKET,format=raw,if=virtio,cache=none"
