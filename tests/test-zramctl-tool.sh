#!/usr/bin/env bash
# nbdkit-zramctl against what a user may point it at (issue 43): a server
# that never answers (a deadline, naming the socket), a socket path with
# quotes and backslashes (--json stays JSON), an NBD socket, a regular
# file or a missing one given as the control socket (said so, not a
# protocol error), a mistyped command (said so, with the nearest one), an
# empty device (no ratio), and plot with a picture name that is gnuplot
# script (passed as data: nothing runs).
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3
requires_zramctl

# expect_error STATUS_FILE TEXT COMMAND...: COMMAND fails, and its
# standard error holds TEXT.
expect_error ()
{
    local text="$1" rc=0
    shift
    "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
    [ "$rc" != 0 ] || fail "$*: exit status 0"
    grep -qF -- "$text" "$tmp/err" ||
        fail "$*: no '$text' in: $(cat "$tmp/err")"
    echo "ok: $*: $(head -1 "$tmp/err")"
}

# ---- without a server ----------------------------------------------------
"$ZRAMCTL" --version | grep -Eq '^nbdkit-zramctl [0-9]' ||
    fail "--version: $("$ZRAMCTL" --version 2>&1)"
expect_error "unknown command 'inof' (did you mean info?)" \
    "$ZRAMCTL" inof "$tmp/no-such-socket"
expect_error "unknown command 'metrcs' (did you mean metrics?)" \
    "$ZRAMCTL" metrcs
expect_error "unknown command 'zzzzzz', and no such socket" "$ZRAMCTL" zzzzzz
touch "$tmp/regular"
expect_error "$tmp/regular is not an nbdkit-zram control socket" \
    "$ZRAMCTL" info "$tmp/regular"
expect_error "$tmp/regular is not an nbdkit-zram control socket" \
    "$ZRAMCTL" "$tmp/regular"
expect_error "$tmp/missing: No such file or directory" \
    "$ZRAMCTL" info "$tmp/missing"
expect_error "--timeout: 'soon' is not a number of seconds" \
    "$ZRAMCTL" --timeout soon info "$tmp/regular"

# A listener that takes connections and never answers (a stopped
# server, another program's socket): a deadline, not a hang.
/usr/bin/python3 - "$tmp/silent" <<'EOF' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); s.listen(8)
held = []
while True:
    c, _ = s.accept()
    held.append(c)
EOF
silent_pid=$!
cleanup_add "kill $silent_pid 2>/dev/null || :"
for _ in $(seq 50); do [ -S "$tmp/silent" ] && break; sleep 0.1; done
expect_error "$tmp/silent: no reply within 1 s" \
    timeout 20 "$ZRAMCTL" --timeout 1 info "$tmp/silent"
start=$(date +%s)
expect_error "$tmp/silent: no reply within 10 s" \
    timeout 60 "$ZRAMCTL" "$tmp/silent"
took=$(( $(date +%s) - start ))
[ "$took" -le 30 ] || fail "the listing waited $took s for a silent socket"
expect_error "no reply within 10 s" timeout 60 "$ZRAMCTL" metrics "$tmp/silent"

# ---- a live server, its socket in a directory named with " and \ -------
dir="$tmp/a\"b\\c"
mkdir "$dir"
cat > "$tmp/fake-gnuplot" <<'EOF'
#!/bin/sh
# Records how it was called: the script file first, then the names.
printf '%s\n' "$@" > "$FAKE_GNUPLOT_ARGS"
cat "$2" > "$FAKE_GNUPLOT_ARGS.script"
EOF
chmod +x "$tmp/fake-gnuplot"

cat > "$tmp/live.sh" <<'EOF'
set -euo pipefail
ctl=$1 nbd=$2 tmp=$3
# The NBD socket is not a control socket: said so, not its greeting.
if "$ZRAMCTL" info "$nbd" > "$tmp/o" 2> "$tmp/e"; then
    echo "info on the NBD socket succeeded" >&2; exit 1
fi
grep -q "is not an nbdkit-zram control socket" "$tmp/e" ||
    { echo "NBD socket: $(cat "$tmp/e")" >&2; exit 1; }
if grep -q NBDMAGIC "$tmp/o" "$tmp/e"; then
    echo "the NBD greeting was printed as a reply" >&2; exit 1
fi
# --json: the quote and backslash in the path escaped; an empty device
# has no ratio (null), the table shows "-".
"$ZRAMCTL" --json "$ctl" > "$tmp/listing.json"
/usr/bin/python3 - "$tmp/listing.json" "$ctl" <<'PY'
import json, sys
listing = json.load(open(sys.argv[1]))
row = listing["zram"][0]
assert row["name"] == sys.argv[2], row
assert row["ratio"] is None, row
print("ok: --json parsed, name %r" % row["name"])
PY
"$ZRAMCTL" "$ctl" > "$tmp/table"
awk 'NR == 2 { exit !($NF == "-") }' "$tmp/table" ||
    { echo "empty device: $(cat "$tmp/table")" >&2; exit 1; }
# The header and the row have their columns at the same places, the
# NAME column as wide as the path.
head -1 "$tmp/table" | grep -q "^NAME \{$((${#ctl} - 3))\}ALGORITHM" ||
    { echo "columns: $(cat "$tmp/table")" >&2; exit 1; }
# plot: the picture's name is a name, never script text.
cd "$tmp"
evil="a.png'; system('touch ran'); set output 'b.png"
FAKE_GNUPLOT_ARGS=$tmp/args GNUPLOT=$tmp/fake-gnuplot \
    "$ZRAMCTL" plot "$ctl" "$evil" 0.6 0.2 2> "$tmp/plot.err"
[ "$(sed -n 1p "$tmp/args")" = -c ] || { echo "gnuplot not called with -c" >&2; exit 1; }
[ "$(sed -n 3p "$tmp/args")" = "$evil" ] ||
    { echo "the picture's name is not ARG1: $(cat "$tmp/args")" >&2; exit 1; }
[ "$(sed -n 4p "$tmp/args")" = "$ctl" ] ||
    { echo "the socket is not ARG2: $(cat "$tmp/args")" >&2; exit 1; }
if grep -qF "a.png" "$tmp/args.script"; then
    echo "a name reached the script text" >&2; exit 1
fi
if command -v gnuplot > /dev/null; then
    "$ZRAMCTL" plot "$ctl" "$evil" 0.6 0.2 2> "$tmp/plot.err"
    [ ! -e "$tmp/ran" ] || { echo "the name ran as gnuplot script" >&2; exit 1; }
    [ "$(head -c 4 "$evil" | od -An -c | tr -d ' ')" = "211PNG" ] ||
        { echo "no PNG at the evil name" >&2; exit 1; }
    # An empty device's flat series: gnuplot's warnings are not shown.
    if grep -qi "warning" "$tmp/plot.err"; then
        echo "gnuplot's warnings leaked: $(cat "$tmp/plot.err")" >&2; exit 1
    fi
    echo "ok: plot with real gnuplot: $(tail -1 "$tmp/plot.err")"
else
    echo "gnuplot not installed: the fake gnuplot's arguments were checked"
fi
echo "live checks done"
EOF
zram_nbdkit -U "$tmp/nbd.sock" "$PLUGIN" 16M ctl="$dir/ctl" \
    --run "bash $tmp/live.sh '$dir/ctl' '$tmp/nbd.sock' '$tmp'" \
    || fail "the live checks failed (see above)"
echo "$TEST_NAME: ok"
