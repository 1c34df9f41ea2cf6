#!/usr/bin/env bash
# The read-only control socket (ctl_ro=, issue 43): mode 0666, answers
# the commands that read the figures (to another user too, when run as
# root), refuses every one that changes something or tells the data's
# use (block_state), changes nothing when refused, and its clients never
# push the owner's out of the control channel's places.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3
requires_zramctl
chmod 711 "$tmp"
mkdir -m 755 "$tmp/pub"
export CTL="$tmp/ctl" RO="$tmp/pub/ro"

cat > "$tmp/readonly.sh" <<'EOF'
set -euo pipefail
URI=$1
[ "$(stat -c %a "$RO")" = 666 ] || { echo "ctl_ro mode $(stat -c %a "$RO")" >&2; exit 1; }
[ "$(stat -c %a "$CTL")" = 600 ] || { echo "ctl mode $(stat -c %a "$CTL")" >&2; exit 1; }
as_user () { "$@"; }
if [ "$(id -u)" = 0 ] && id nobody > /dev/null 2>&1; then
    as_user () { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
    # The owner's socket stays the owner's.
    if as_user "$ZRAMCTL" info "$CTL" > /dev/null 2>&1; then
        echo "another user reached ctl=" >&2; exit 1
    fi
fi
for command in info mm_stat io_stat bd_stat stats metrics classes memory help; do
    as_user "$ZRAMCTL" "$command" "$RO" > "$TMP/out" ||
        { echo "ctl_ro refused $command" >&2; exit 1; }
done
as_user "$ZRAMCTL" "$RO" | grep -q '^NAME' || { echo "no listing through ctl_ro" >&2; exit 1; }
for command in "compact" "idle all" "mem_limit 1M" "mem_used_max 0" \
               "block_state 0 1" "pack" "dissolve 50" "writeback idle" \
               "writeback_limit" "drop" "grace 5" "downtime 1" "handover" \
               "recompress type=idle"; do
    # shellcheck disable=SC2086 # the command's words
    set -- $command
    if as_user "$ZRAMCTL" "$1" "$RO" "${@:2}" > "$TMP/out" 2> "$TMP/err"; then
        echo "ctl_ro answered: $command" >&2; exit 1
    fi
    grep -q "not on the read-only socket (ctl_ro=)" "$TMP/err" ||
        { echo "$command: $(cat "$TMP/err")" >&2; exit 1; }
done
# Nothing changed: the owner's channel says so, and the server serves.
"$ZRAMCTL" info "$CTL" | grep -qx "mem_limit 0" || { echo "mem_limit changed" >&2; exit 1; }
nbdinfo --size "$URI" > /dev/null
# Read-only clients fill their half of the places and push out only
# their own: the owner's client, connected first and idle, still answers.
/usr/bin/python3 - <<'PY'
import os, socket, time
def connect(path):
    s = socket.socket(socket.AF_UNIX); s.connect(path); return s
def ask(s, line):
    try:
        s.sendall(line.encode() + b"\n"); data = b""
        while not (data.endswith(b"ok\n") or b"error: " in data):
            chunk = s.recv(65536)
            if not chunk:
                return None
            data += chunk
        return data.decode()
    except OSError:
        return None
owner = connect(os.environ["CTL"])
assert "disksize" in ask(owner, "info")
readers = [connect(os.environ["RO"]) for _ in range(12)]
time.sleep(0.5)                 # all accepted, the places settled
alive = [r for r in readers if "disksize" in (ask(r, "info") or "")]
assert 1 <= len(alive) <= 4, "%d read-only clients kept, want 1 to 4" % len(alive)
assert "disksize" in (ask(owner, "info") or ""), "the owner's client was pushed out"
print("ok: 12 read-only clients, %d kept, the owner's client kept" % len(alive))
for r in readers:
    r.close()
time.sleep(0.5)
# A place a read-only client left is free, not a client to push out:
# A, B, C read-only, P the owner's, D read-only (the fourth); A, B and C
# then read (D is the oldest), D and P hang up; E takes P's place, and F,
# the fifth, must push out one of A, B, C and E, never D's empty place.
def pause():
    time.sleep(0.05)
a, b, c = connect(os.environ["RO"]), connect(os.environ["RO"]), connect(os.environ["RO"])
pause()
p = connect(os.environ["CTL"]); pause()
d = connect(os.environ["RO"]); pause()
assert "disksize" in (ask(d, "info") or "")
pause()
for r in (a, b, c):
    assert "disksize" in (ask(r, "info") or "")
pause()
d.close(); p.close(); time.sleep(0.3)
e = connect(os.environ["RO"]); pause()
f = connect(os.environ["RO"]); pause()
assert "disksize" in (ask(f, "info") or ""), "the fifth read-only client"
assert "disksize" in (ask(owner, "info") or ""), "the server stopped answering"
print("ok: a place left by a read-only client is not pushed out again")
PY
echo "read-only checks done"
EOF
export TMP="$tmp"
zram_nbdkit -U - "$PLUGIN" 16M ctl="$CTL" ctl_ro="$RO" --run "bash $tmp/readonly.sh \"\$uri\"" ||
    fail "the read-only checks failed (see above)"
[ ! -e "$RO" ] || fail "the read-only socket outlived the server"
# ctl_ro= and ctl= naming one socket: refused.
if zram_nbdkit -U - "$PLUGIN" 1M ctl="$CTL" ctl_ro="$CTL" --run true 2>/dev/null; then
    fail "ctl_ro= naming the ctl= socket was accepted"
fi
grep -q "ctl_ro: .* names the same file as ctl=" "$NBDKIT_STDERR" ||
    fail "ctl_ro = ctl: $(cat "$NBDKIT_STDERR")"
echo "$TEST_NAME: ok"
