#!/usr/bin/env bash
# Discovery (issue 43): servers register in one runtime directory
# (plugin/registry-dir.h) and `nbdkit-zramctl` with no argument lists
# every live one.  Three servers: one without name= or ctl= (a control
# socket of its own in the registry, zram-PID), one with name= and ctl=
# elsewhere (a link in the registry), one killed with SIGKILL (its stale
# entry skipped and removed).  The listing's columns and forms (-o,
# --output-all, --raw, -n, --bytes, --json), a server named by its name,
# entries gone at a clean exit, a registry others may write refused; and,
# as root, another user's servers in that user's own directory
# ($XDG_RUNTIME_DIR/nbdkit-zram), seen by that user and not by root.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3
requires_zramctl
registry=$NBDKIT_ZRAM_RUNTIME_DIR

# serve NAME ARGS...: a server in the background, its PID in pid_NAME,
# up once its NBD socket answers.
serve ()
{
    local name=$1
    shift
    env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} "$NBDKIT" -f -U "$tmp/$name.sock" \
        "$PLUGIN" "$@" 2> "$tmp/$name.log" &
    local pid=$!
    eval "pid_$name=$pid"
    cleanup_add "kill -9 $pid 2>/dev/null || :"
    for _ in $(seq 300); do
        [ -S "$tmp/$name.sock" ] && nbdinfo --size "nbd+unix:///?socket=$tmp/$name.sock" \
            > /dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || fail "server $name did not start: $(cat "$tmp/$name.log")"
        sleep 0.1
    done
    fail "server $name did not start in 30 s"
}
requires nbdinfo

serve plain 16M
serve named 32M name=disk1 ctl="$tmp/elsewhere.ctl" comp=zstd
serve killed 8M name=disk2
# shellcheck disable=SC2154 # set by serve
plain_entry="zram-$pid_plain"
[ -S "$registry/$plain_entry.ctl" ] || fail "no socket $registry/$plain_entry.ctl: $(ls -la "$registry")"
[ -L "$registry/disk1.ctl" ] && [ "$(readlink "$registry/disk1.ctl")" = "$tmp/elsewhere.ctl" ] ||
    fail "no link disk1.ctl to the ctl= socket: $(ls -la "$registry")"
[ -S "$registry/disk2.ctl" ] || fail "no socket disk2.ctl"
# shellcheck disable=SC2154
kill -9 "$pid_killed"
wait "$pid_killed" 2>/dev/null || :
[ -S "$registry/disk2.ctl" ] || fail "the killed server's entry should be left (stale)"

# The listing: the two live ones by name, the stale entry gone.
"$ZRAMCTL" > "$tmp/list" || fail "listing: $(cat "$tmp/list")"
cat "$tmp/list"
[ "$(wc -l < "$tmp/list")" = 3 ] || fail "listing: not a header and two servers"
awk 'NR > 1 { print $1 }' "$tmp/list" | sort > "$tmp/names"
printf '%s\n' disk1 "$plain_entry" | sort | cmp -s - "$tmp/names" ||
    fail "listing names: $(cat "$tmp/names")"
[ ! -e "$registry/disk2.ctl" ] || fail "the stale entry disk2.ctl was not removed"
grep -q "^disk1 .*zstd .* 32M " "$tmp/list" || fail "disk1's row: $(grep disk1 "$tmp/list")"

# The forms.
"$ZRAMCTL" --json > "$tmp/list.json"
/usr/bin/python3 - "$tmp/list.json" "$plain_entry" <<'EOF'
import json, sys
rows = {r["name"]: r for r in json.load(open(sys.argv[1]))["zram"]}
assert set(rows) == {"disk1", sys.argv[2]}, rows
assert rows["disk1"]["disksize"] == 32 << 20 and rows["disk1"]["algorithm"] == "zstd", rows
print("ok: --json lists", sorted(rows))
EOF
"$ZRAMCTL" -n -o NAME,CTL --raw > "$tmp/raw"
grep -qx "disk1 $tmp/elsewhere.ctl" "$tmp/raw" || fail "-n -o NAME,CTL --raw: $(cat "$tmp/raw")"
grep -qx "$plain_entry $registry/$plain_entry.ctl" "$tmp/raw" || fail "--raw: $(cat "$tmp/raw")"
"$ZRAMCTL" --output-all --bytes disk1 > "$tmp/all"
head -1 "$tmp/all" | grep -q "NAME *ALGORITHM *DISKSIZE *DATA *COMPR *TOTAL *RATIO *MEM-LIMIT *MEM-USED *ZERO-PAGES *MIGRATED *STREAMS *SERVES *CTL" ||
    fail "--output-all: $(head -1 "$tmp/all")"
grep -q " unix:$tmp/named.sock " "$tmp/all" ||
    fail "--output-all: SERVES: $(cat "$tmp/all")"
grep -q " 33554432 " "$tmp/all" || fail "--bytes: $(cat "$tmp/all")"
"$ZRAMCTL" -o +MEM-LIMIT disk1 | head -1 | grep -q "RATIO *MEM-LIMIT$" ||
    fail "-o +MEM-LIMIT: $("$ZRAMCTL" -o +MEM-LIMIT disk1)"
if "$ZRAMCTL" -o NAME,SPEED > "$tmp/out" 2>&1; then
    fail "-o with an unknown column succeeded"
fi
grep -q "unknown column 'SPEED'" "$tmp/out" || fail "-o SPEED: $(cat "$tmp/out")"

# A server by its name, for any command.
"$ZRAMCTL" info disk1 | grep -qx "disksize 33554432" || fail "info disk1"
"$ZRAMCTL" info "$plain_entry" | grep -qx "disksize 16777216" || fail "info $plain_entry"

# A clean exit takes its entry with it (the link, the socket).
# shellcheck disable=SC2154
kill "$pid_named"
wait "$pid_named" 2>/dev/null || :
[ ! -e "$registry/disk1.ctl" ] && [ ! -L "$registry/disk1.ctl" ] ||
    fail "disk1.ctl outlived its server"
"$ZRAMCTL" -n -o NAME > "$tmp/names"
[ "$(cat "$tmp/names")" = "$plain_entry" ] || fail "after disk1's exit: $(cat "$tmp/names")"

# A server that died leaves its link; the next one on the same ctl=
# (a restart, a standby taking over) removes it: one server, one entry.
serve first 8M name=dup ctl="$tmp/dup.ctl"
[ -L "$registry/dup.ctl" ] || fail "no link dup.ctl"
# shellcheck disable=SC2154
kill -9 "$pid_first"
wait "$pid_first" 2>/dev/null || :
serve second 8M ctl="$tmp/dup.ctl"
# shellcheck disable=SC2154
[ ! -e "$registry/dup.ctl" ] && [ ! -L "$registry/dup.ctl" ] ||
    fail "the dead server's link to the same socket was left"
[ -L "$registry/zram-$pid_second.ctl" ] || fail "no link zram-$pid_second.ctl"
"$ZRAMCTL" -n -o NAME,CTL --raw | grep -c " $tmp/dup.ctl\$" | grep -qx 1 ||
    fail "the socket is listed other than once: $("$ZRAMCTL" -n -o NAME,CTL --raw)"
kill "$pid_second"
wait "$pid_second" 2>/dev/null || :

# A registry others may write is neither read nor written.
chmod 0777 "$registry"
if "$ZRAMCTL" > "$tmp/out" 2>&1; then
    fail "a registry writable by all was read"
fi
grep -q "not a directory of this user's that only it may write" "$tmp/out" ||
    fail "unsafe registry: $(cat "$tmp/out")"
serve unsafe 8M name=unsafe
[ ! -e "$registry/unsafe.ctl" ] || fail "a server registered in a registry writable by all"
chmod 0700 "$registry"

# Another user: its own directory, by XDG_RUNTIME_DIR.
if [ "$(id -u)" = 0 ] && id nobody > /dev/null 2>&1; then
    chmod 711 "$tmp"
    mkdir -m 700 "$tmp/nobody-run"
    chown nobody "$tmp/nobody-run"
    as_nobody () {
        setpriv --reuid=nobody --regid=nogroup --clear-groups \
            env -u NBDKIT_ZRAM_RUNTIME_DIR XDG_RUNTIME_DIR="$tmp/nobody-run" "$@"
    }
    mkdir -m 777 "$tmp/nobody-sock"
    # Not through the function: $! must be the server's own PID (setpriv
    # and env exec it), not a subshell's.
    setpriv --reuid=nobody --regid=nogroup --clear-groups \
        env -u NBDKIT_ZRAM_RUNTIME_DIR XDG_RUNTIME_DIR="$tmp/nobody-run" \
        ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} "$NBDKIT" -f \
        -U "$tmp/nobody-sock/s" "$PLUGIN" 8M name=theirs 2> "$tmp/nobody.log" &
    nobody_pid=$!
    cleanup_add "kill -9 $nobody_pid 2>/dev/null || :"
    for _ in $(seq 300); do
        [ -S "$tmp/nobody-run/nbdkit-zram/theirs.ctl" ] && break
        sleep 0.1
    done
    [ -S "$tmp/nobody-run/nbdkit-zram/theirs.ctl" ] ||
        fail "nobody's server did not register: $(cat "$tmp/nobody.log")"
    as_nobody "$ZRAMCTL" -n -o NAME > "$tmp/theirs"
    [ "$(cat "$tmp/theirs")" = theirs ] || fail "nobody's listing: $(cat "$tmp/theirs")"
    "$ZRAMCTL" -n -o NAME > "$tmp/names"
    [ "$(cat "$tmp/names")" = "$plain_entry" ] || fail "root's listing shows: $(cat "$tmp/names")"
    kill "$nobody_pid"
    wait "$nobody_pid" 2>/dev/null || :
    [ ! -e "$tmp/nobody-run/nbdkit-zram/theirs.ctl" ] ||
        fail "nobody's server did not stop, or left its entry"
    echo "ok: another user's server in its own registry, seen by it alone"
else
    echo "not root: the other user's registry is not tried"
fi
echo "$TEST_NAME: ok"
