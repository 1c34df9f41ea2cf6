#!/usr/bin/env bash
# A server that survives its clients: with -t 16, clients that die (SIGKILL)
# or close their socket with large reads and writes in flight must not
# take the server down.  Fails on nbdkit before 1.34 (Debian 12's 1.32.5
# aborts: "raw_send_socket: Assertion `sock >= 0' failed"); see
# tests/client-death.py for the clients.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires_disconnect_fix
requires python3

rc=0
zram_nbdkit -t 16 -U - "$PLUGIN" 1G \
    --run "python3 '$SRCDIR/tests/client-death.py' \"\$uri\"" || rc=$?
if grep -q "Assertion" "$NBDKIT_STDERR"; then
    fail "nbdkit $("$NBDKIT" --version | awk '{ print $2 }') aborted when a client died (exit status $rc)"
fi
[ "$rc" = 0 ] || fail "clients or server failed (exit status $rc)"
echo "ok: the server survived its dying clients"
