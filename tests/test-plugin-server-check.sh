#!/usr/bin/env bash
# The plugin knows whether its nbdkit survives clients that hang up with
# requests in flight (1.34 and later), says so in --dump-plugin, and on an
# older server that serves a connection with several threads prints one
# warning, once per process, naming the risk and the ways out.  CI runs
# the suite on a fixed server and on Debian 12's 1.32.5: each run checks
# the side its server is on.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh dpkg

version="$("$NBDKIT" --version | awk '$1 == "nbdkit" { print $2 }')"
[ -n "$version" ] || fail "$NBDKIT --version names no version"
if dpkg --compare-versions "$version" ge 1.34; then fixed=yes; else fixed=no; fi
echo "server: nbdkit $version ($NBDKIT), has the disconnect fix: $fixed"

dump="$(zram_nbdkit "$PLUGIN" --dump-plugin)"
grep -qx "zram_server_disconnect_fix=$fixed" <<<"$dump" ||
    fail "--dump-plugin does not say zram_server_disconnect_fix=$fixed for nbdkit $version"

# Two connections, several requests of each kind on each.
cat > "$tmp/requests.py" <<'PY'
import sys, nbd
handles = []
for _ in range(2):
    h = nbd.NBD()
    h.connect_uri(sys.argv[1])
    handles.append(h)
for i, h in enumerate(handles):
    for j in range(8):
        h.pwrite(b"%d" % j * 4096, (i * 8 + j) * 4096)
        assert h.pread(4096, (i * 8 + j) * 4096) == b"%d" % j * 4096
    h.trim(4096, 0)
    h.zero(4096, 4096)
for h in handles:
    h.shutdown()
PY

warning='zram: warning: this nbdkit is older than 1.34'
# serve THREADS: serve with -t THREADS and run the requests; $got is
# how many times the warning was given.
serve ()
{
    zram_nbdkit -t "$1" -U - "$PLUGIN" 1M --run "python3 '$tmp/requests.py' \"\$uri\""
    got="$(grep -c -F "$warning" "$NBDKIT_STDERR" || :)"
}

if [ "$fixed" = yes ]; then want=0; else want=1; fi
serve 4
[ "$got" = "$want" ] || fail "-t 4 on nbdkit $version: $got warnings, want $want"
echo "ok: -t 4 on nbdkit $version: $got warning(s)"
if [ "$want" = 1 ]; then
    for words in "-t 1" "1.34" "every client's data is lost"; do
        grep -F "$warning" "$NBDKIT_STDERR" | grep -qF -- "$words" ||
            fail "the warning does not say '$words'"
    done
fi

serve 1
[ "$got" = 0 ] || fail "-t 1 on nbdkit $version: $got warnings, want none"
echo "ok: -t 1 on nbdkit $version: no warning"
