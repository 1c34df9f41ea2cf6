#!/usr/bin/env bash
# Scratch space in a container or CI job where the zram module cannot be
# loaded: an unprivileged nbdkit serves a compressed RAM disk on a Unix
# socket for the length of one command, which gets the URI in $uri.
# No root, no kernel module: clients are libnbd tools, qemu or fio.
# Usage: container.sh [SIZE] ['SHELL COMMAND using $uri']
set -euo pipefail
PLUGIN=${PLUGIN:-zram}   # or the path of a built nbdkit-zram-plugin.so
# nbdkit 1.34 or later: older ones abort when a client dies mid-request.
# On Debian 12, the one ./setup.sh builds: NBDKIT=$PWD/build/nbdkit/sbin/nbdkit
NBDKIT=${NBDKIT:-nbdkit}

SIZE=${1:-2G}
# shellcheck disable=SC2016 # $uri is expanded by nbdkit's --run shell
COMMAND=${2:-'nbdinfo "$uri" && nbdcopy --synchronous /usr/lib/os-release "$uri" && nbdinfo --map "$uri"'}

# -U - picks a private socket; --run stops the server when the command ends.
exec "$NBDKIT" -U - "$PLUGIN" "$SIZE" mem_limit=512M --run "$COMMAND"
