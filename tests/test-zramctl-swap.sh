#!/usr/bin/env bash
# `nbdkit-zramctl swap on|off|status` (tools/nbdkit-zram-swap) where no
# nbd device can be attached: every bad option is refused with a message
# naming it, before anything is changed; status and off with nothing set
# up; status of a device whose server is gone; off stopping the server
# it recorded and removing its state; a recorded PID that now names
# another process (the server died, the PID was reused) never signalled,
# by off or status; a swap on that was interrupted (phase starting) shown
# by status and finished by off; a --mem-limit this machine cannot give
# refused, naming what would fit; status for a user who cannot read the
# state refused with a non-zero exit; a --restartable device whose
# supervisor was killed: status says its server serves on unsupervised
# and its standby is orphaned, exit 1, and off stops both; off (and
# restart) refused while the server's other device (device=) has a
# client, and off done once it went.  The real path (the kernel's nbd
# driver swapping to the server, SIGTERM during swap on, swap off with
# memory short) is `make check-swap`, in a guest.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires_zramctl
export NBDKIT_ZRAM_SWAP=${NBDKIT_ZRAM_SWAP:-$BUILDDIR/tools/nbdkit-zram-swap}
export NBDKIT_ZRAM_SWAP_DIR="$tmp/run"
[ -x "$ZRAMCTL" ] && [ -x "$NBDKIT_ZRAM_SWAP" ] || fail "not built: $ZRAMCTL $NBDKIT_ZRAM_SWAP"
min_free_before=$(cat /proc/sys/vm/min_free_kbytes)

# refused ARGS PATTERN: exit status 1, PATTERN on stderr, nothing made.
refused ()
{
    local pattern=$1 rc=0
    shift
    "$ZRAMCTL" swap "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
    [ "$rc" = 1 ] || fail "swap $*: exit status $rc, not 1"
    grep -q -- "$pattern" "$tmp/err" || { cat "$tmp/err" >&2; fail "swap $*: no message matching '$pattern'"; }
    [ ! -e "$tmp/run" ] || fail "swap $*: made $tmp/run"
}
refused "--size: '1X' is not a size" on --size 1X
refused "--size: '' is not a size" on --size ''
refused "--mem-limit: 'lots' is not a size" on --mem-limit lots
refused "--size: '1G2' is not a size" on --size 1G2
refused "--size: '17179869185G' is too large" on --size 17179869185G
refused "--size: '99999999999999999999' is too large" on --size 99999999999999999999
refused "--size: '9223372036854775808' is too large" on --size 9223372036854775808
refused "--mem-limit: '8796093022209M' is too large" on --mem-limit 8796093022209M
# GNU style --option=value is the option, not a KEY=VALUE for the plugin.
refused "--size: '1X' is not a size" on --size=1X
refused "--mem-limit: 'lots' is not a size" on --size=4G --mem-limit=lots
refused "--algorithm: 'brotli' is neither lz4 nor zstd" on --algorithm=brotli
refused "--mem-limit: 1M is below 16M" on --mem-limit 1M
refused "--algorithm: 'brotli' is neither lz4 nor zstd" on --algorithm brotli
refused "--priority: 'high' is not a number" on --priority high
refused "--priority: 40000 is above 32767" on --priority 40000
refused "--ratio: '0.5' is not a compression ratio" on --ratio 0.5
refused "--ratio: 'x' is not a compression ratio" on --ratio x
refused "--device: '/dev/sda' is not /dev/nbdN" on --device /dev/sda
refused "--min-free-kbytes: '-5' is not a number" on --min-free-kbytes -5
refused "--connections: 'x' is not a number from 1 to 16" on --connections x
refused "--connections: '0' is not a number from 1 to 16" on --connections 0
refused "--connections: 17 is above 16" on --connections 17
refused "--page-cluster: 'big' is neither a number from 0 to 10 nor keep" on --page-cluster big
refused "--page-cluster: 11 is above 10" on --page-cluster 11
refused "--standbys: '4' is not a number from 0 to 3" on --restartable --standbys 4
refused "--standbys: 'two' is not a number from 0 to 3" on --restartable --standbys two
refused "swap on: unknown argument '--bogus'" on --bogus
refused "--add-device: '/dev/sda:s:1G' is not /dev/nbdN:NAME:SIZE" on --add-device /dev/sda:s:1G
refused "--add-device: '/dev/nbd1' is not /dev/nbdN:NAME:SIZE" on --add-device /dev/nbd1
refused "--add-device: 'a/b' is not a device name" on --add-device /dev/nbd1:a/b:1G
refused "--add-device: 'lots' is not a size" on --add-device /dev/nbd1:s:lots
refused "--add-device: priority 'hi' is not a number from 0 to 32767" on --add-device /dev/nbd1:s:1G:hi
refused "--add-device: priority 40000 is above 32767" on --add-device /dev/nbd1:s:1G:40000
refused "--add-device: /dev/nbd1 is named twice" on --add-device /dev/nbd1:s:1G --add-device /dev/nbd1:t:1G
# The supervisor itself (what swap on runs) refuses a bad --standbys too.
rc=0
"$ZRAMCTL" supervise "$tmp/nowhere" /dev/nbd9 1 120 --standbys 9 -- /bin/true > "$tmp/out" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "supervise: --standbys: '9' is not a number from 0 to 3" "$tmp/out" ||
    fail "supervise --standbys 9: exit status $rc: $(cat "$tmp/out")"
[ ! -e "$tmp/nowhere" ] || fail "supervise --standbys 9 made its directory"
rc=0
"$ZRAMCTL" supervise "$tmp/nowhere" /dev/nbd9 1 120 --device /dev/nbd8 -- /bin/true > "$tmp/out" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "supervise: --device: '/dev/nbd8' is not /dev/nbdN=EXPORT" "$tmp/out" ||
    fail "supervise --device /dev/nbd8: exit status $rc: $(cat "$tmp/out")"
[ ! -e "$tmp/nowhere" ] || fail "supervise --device /dev/nbd8 made its directory"
refused "'sideways' is none of on, off, restart, status" sideways

# The configuration file (swap config prints what swap on would take
# from it): sizes, percentages and expressions of RAM, a drop-in that
# overrides, and bad lines refused with file:line.
ram_mib=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 }' /proc/meminfo)
export NBDKIT_ZRAM_SWAP_CONF="$tmp/conf/swap.conf"
mkdir -p "$tmp/conf/swap.conf.d"
cat > "$NBDKIT_ZRAM_SWAP_CONF" <<'EOF2'
# as zram-generator's
[swap]
size = min(ram / 2, 4096)      # MiB
mem-limit = 25%
algorithm = zstd
priority = 50
restartable = yes
options = pack_after=60 swap_full_after=5000
EOF2
echo "priority = 75" > "$tmp/conf/swap.conf.d/10-priority.conf"
want_size=$(( (ram_mib / 2 < 4096 ? ram_mib / 2 : 4096) << 20 ))
want_limit=$(( (ram_mib * 25 / 100) << 20 ))
got=$("$ZRAMCTL" swap config)
[ "$got" = "swap on --size $want_size --mem-limit $want_limit --algorithm zstd --priority 50 --restartable pack_after=60 swap_full_after=5000 --priority 75" ] ||
    fail "swap config: $got"
echo "ok: swap config: $got"
conf_refused ()
{
    local pattern=$1
    printf '%s\n' "$2" > "$tmp/conf/bad.conf"
    NBDKIT_ZRAM_SWAP_CONF="$tmp/conf/bad.conf" refused "$pattern" config
}
conf_refused "bad.conf:1: size: 'ram; system(\"x\")' is not a size" 'size = ram; system("x")'
conf_refused "bad.conf:1: size: 'foo / 2': 'foo' is not ram, min or max" 'size = foo / 2'
conf_refused "bad.conf:1: mem-limit: '0' is not an amount of at least 1 MiB" 'mem-limit = 0'
conf_refused "bad.conf:1: speed: unknown key" 'speed = 11'
conf_refused "bad.conf:1: '\[zram0\]' is neither key = value nor \[swap\]" '[zram0]'
conf_refused "bad.conf:1: restartable: 'maybe' is neither yes nor no" 'restartable = maybe'
conf_refused "bad.conf:1: options: 'verbose' is not a plugin KEY=VALUE" 'options = verbose'
# swap on with no options takes the file's: its bad algorithm is refused
# by swap on's own check, before anything is made.
printf 'algorithm = brotli\n' > "$tmp/conf/bad.conf"
NBDKIT_ZRAM_SWAP_CONF="$tmp/conf/bad.conf" refused "--algorithm: 'brotli' is neither lz4 nor zstd" on
# Options given win over the file's (the last of each counts).
got=$("$ZRAMCTL" swap config --priority 10 --size 1G)
[ "$got" = "swap on --size $want_size --mem-limit $want_limit --algorithm zstd --priority 50 --restartable pack_after=60 swap_full_after=5000 --priority 75 --priority 10 --size 1G" ] ||
    fail "swap config with options: $got"
[ "$(NBDKIT_ZRAM_SWAP_CONF="$tmp/conf/none.conf" "$ZRAMCTL" swap config --size 1G)" = "swap on --size 1G" ] ||
    fail "no file: not the options alone"
# add-device: one line a device, each kept.
printf 'add-device = /dev/nbd1:swap2:1G:5\nadd-device = /dev/nbd2:swap3:512M\n' > "$tmp/conf/add.conf"
got=$(NBDKIT_ZRAM_SWAP_CONF="$tmp/conf/add.conf" "$ZRAMCTL" swap config)
[ "$got" = "swap on --add-device /dev/nbd1:swap2:1G:5 --add-device /dev/nbd2:swap3:512M" ] ||
    fail "swap config with add-device lines: $got"
unset NBDKIT_ZRAM_SWAP_CONF
refused "usage:" off /dev/nbd0 /dev/nbd1
if [ "$(id -u)" != 0 ]; then
    refused "swap on: needs root" on --mem-limit 64M
else
    # More than half of RAM for the compressed pages: refused, with what
    # would fit; and a device whose table alone is too big.
    ram_kib=$(awk '$1 == "MemTotal:" { print $2 }' /proc/meminfo)
    refused "--mem-limit: .* is more than half of this machine's .* of RAM.*at most" \
        on --mem-limit "$((ram_kib * 3 / 4 / 1024))M"
    refused "does not fit this machine's .* make the device smaller" \
        on --mem-limit 16M --size "$((ram_kib * 256 / 1024 / 1024 + 1))T"
fi
NBDKIT_ZRAM_SWAP="$tmp/missing" refused "swap: $tmp/missing: No such file" status

# Nothing set up.
"$ZRAMCTL" swap status > "$tmp/out" || fail "swap status with nothing set up failed"
grep -q "no swap set up by swap on" "$tmp/out" || fail "swap status: $(cat "$tmp/out")"
if [ "$(id -u)" = 0 ]; then
    "$ZRAMCTL" swap off > "$tmp/out" || fail "swap off with nothing set up failed"
    grep -q "no swap set up by swap on" "$tmp/out" || fail "swap off: $(cat "$tmp/out")"
    refused "swap off: /dev/nbd7 was not set up by swap on" off /dev/nbd7
fi

# A device whose server is gone: status says so, exit status 1.  Then one
# whose "server" runs (a stand-in process): off stops it and removes the
# state, and leaves vm.min_free_kbytes alone (this set-up did not raise
# it).
mkdir -p "$tmp/run/nbd9"
sleep 1000 & stand_in=$!
cleanup_add "kill $stand_in 2>/dev/null"
( exit 0 ) & gone=$!
wait "$gone"
start_of () { awk '{ sub(/.*\) /, ""); print $20 }' "/proc/$1/stat"; }
# state PID START [PHASE]: the state of a set-up whose server is PID,
# started at START, running sleep.
state ()
{
    printf 'device=/dev/nbd9\nserver_pid=%s\nserver_start=%s\nserver_exe=%s\nold_min_free=\nphase=%s\n' \
        "$1" "$2" "$(readlink -f "$(command -v sleep)")" "${3:-on}" > "$tmp/run/nbd9/state"
}
state "$gone" 12345
rc=0
"$ZRAMCTL" swap status > "$tmp/out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "swap status with the server gone: exit status $rc"
grep -q "^/dev/nbd9: not swapped on; server pid $gone is gone" "$tmp/out" ||
    fail "swap status: $(cat "$tmp/out")"

# The PID recorded is alive but is not the server (another start time: the
# server died and its PID went to the stand-in): status says so, off
# does not signal it.
state "$stand_in" "$(( $(start_of "$stand_in") + 1 ))"
rc=0
"$ZRAMCTL" swap status > "$tmp/out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "swap status with a reused PID: exit status $rc"
grep -q "server pid $stand_in is gone (the pid is another process's now)" "$tmp/out" ||
    fail "swap status with a reused PID: $(cat "$tmp/out")"
if [ "$(id -u)" = 0 ]; then
    "$ZRAMCTL" swap off /dev/nbd9 > "$tmp/out" 2>&1 || fail "swap off: $(cat "$tmp/out")"
    kill -0 "$stand_in" 2>/dev/null || fail "swap off signalled pid $stand_in, which was not the server"
    grep -q "pid $stand_in is no longer the server.*not signalled" "$tmp/out" ||
        fail "swap off with a reused PID: $(cat "$tmp/out")"
    [ ! -e "$tmp/run/nbd9" ] || fail "swap off left $tmp/run/nbd9"

    # The same executable, another one: the start time tells them apart.
    mkdir -p "$tmp/run/nbd9"
    sleep 1000 & twin=$!
    cleanup_add "kill $twin 2>/dev/null"
    state "$twin" "$(( $(start_of "$twin") - 1 ))"
    "$ZRAMCTL" swap off > "$tmp/out" 2>&1 || fail "swap off: $(cat "$tmp/out")"
    kill -0 "$twin" 2>/dev/null || fail "swap off signalled a process started after the server"

    # A swap on stopped midway (SIGKILL: no trap ran): status shows it,
    # off finishes it, stopping the server it recorded.
    # It had set vm.min_free_kbytes and vm.page-cluster (the values
    # recorded are the ones there now, so that the machine is left as it
    # was), and another device, set up later, had not: off hands the old
    # values on to that one's state, whose own off puts them back.
    mkdir -p "$tmp/run/nbd9" "$tmp/run/nbd8"
    state "$stand_in" "$(start_of "$stand_in")" starting
    page_cluster_before=$(cat /proc/sys/vm/page-cluster)
    printf 'old_min_free=%s\nold_page_cluster=%s\n' "$min_free_before" \
        "$page_cluster_before" >> "$tmp/run/nbd9/state"
    printf 'device=/dev/nbd8\nserver_pid=%s\nserver_start=12345\nphase=on\n' \
        "$gone" > "$tmp/run/nbd8/state"
    rc=0
    "$ZRAMCTL" swap status > "$tmp/out" 2>&1 || rc=$?
    [ "$rc" = 1 ] || fail "swap status of an interrupted swap on: exit status $rc"
    grep -q "swap on was interrupted at: starting (swap off /dev/nbd9 finishes it)" "$tmp/out" ||
        fail "swap status of an interrupted swap on: $(cat "$tmp/out")"
    "$ZRAMCTL" swap off /dev/nbd9 > "$tmp/out" 2>&1 || fail "swap off: $(cat "$tmp/out")"
    grep -q "swap off /dev/nbd9 (a swap on that was interrupted at: starting)" "$tmp/out" ||
        fail "swap off of an interrupted swap on: $(cat "$tmp/out")"
    grep -qx "old_min_free=$min_free_before" "$tmp/run/nbd8/state" &&
        grep -qx "old_page_cluster=$page_cluster_before" "$tmp/run/nbd8/state" ||
        fail "swap off did not hand the old settings on: $(cat "$tmp/run/nbd8/state")"
    "$ZRAMCTL" swap off /dev/nbd8 > "$tmp/out" 2>&1 || fail "swap off /dev/nbd8: $(cat "$tmp/out")"
    grep -q "vm.min_free_kbytes: back to $min_free_before" "$tmp/out" &&
        grep -q "vm.page-cluster: back to $page_cluster_before" "$tmp/out" ||
        fail "the last swap off did not put the settings back: $(cat "$tmp/out")"
    [ "$(cat /proc/sys/vm/page-cluster)" = "$page_cluster_before" ] ||
        fail "swap off changed vm.page-cluster"
    ! kill -0 "$stand_in" 2>/dev/null || fail "swap off left the server running"
    [ ! -e "$tmp/run/nbd9" ] || fail "swap off left $tmp/run/nbd9"
    [ "$(cat /proc/sys/vm/min_free_kbytes)" = "$min_free_before" ] ||
        fail "swap off changed vm.min_free_kbytes"

    # A user who cannot read the state: an error, not "no swap set up".
    if command -v setpriv >/dev/null 2>&1; then
        chmod 700 "$tmp/run"
        chmod 755 "$tmp"
        rc=0
        setpriv --reuid=65534 --regid=65534 --clear-groups \
            env NBDKIT_ZRAM_SWAP_DIR="$tmp/run" NBDKIT_ZRAM_SWAP="$NBDKIT_ZRAM_SWAP" \
            "$ZRAMCTL" swap status > "$tmp/out" 2> "$tmp/err" || rc=$?
        [ "$rc" = 1 ] || fail "swap status as nobody: exit status $rc"
        grep -q "swap status: cannot read $tmp/run (root only): run it as root" "$tmp/err" ||
            fail "swap status as nobody: $(cat "$tmp/out" "$tmp/err")"
    fi
fi
# swap on --restartable whose supervisor was killed (SIGKILL): the server
# and the two ready standbys it started (--standbys 2, the default) serve
# on, unsupervised.  Stand-ins:
# for the supervisor, a process started before the servers and killed
# after; for the server and the standby, servers of this plugin started
# as the supervisor starts them (--unix DIR/sock --pidfile DIR/pid, and
# .standby and .standby2), the standbys' pids in DIR/standby.ready and
# DIR/standby2.ready.  status must say the server serves on but nothing
# restarts it, must not call a standby ready, and exits 1 (degraded); a pid file naming a process
# that is not this device's server (another command line, or started
# before the supervisor: a recycled pid) is not taken for one; off stops
# all three servers, signals nothing else, and leaves no directory.
d="$tmp/run/nbd9"
mkdir -p "$d"
chmod 700 "$tmp/run" "$d"
# Started before the supervisor, with a command line naming the
# standby's socket: a process whose pid a standby's pid file may name
# once the standby is gone and the pid recycled.
python3 -c 'import time; time.sleep(1000)' --unix "$d/sock.standby" & early=$!
cleanup_add "kill $early 2>/dev/null"
sleep 0.1
sleep 1000 & supervisor=$!
supervisor_start=$(start_of "$supervisor")
sleep 1000 & live=$!
cleanup_add "kill $live 2>/dev/null"
sleep 0.1
# server_start_of SUFFIX: this plugin served as the supervisor serves it.
server_start_of ()
{
    env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} "$NBDKIT" --unix "$d/sock$1" \
        --pidfile "$d/pid$1" "$PLUGIN" 1M ctl="$d/ctl$1" ||
        fail "nbdkit --unix $d/sock$1 did not start"
    local i
    for i in $(seq 100); do
        [ ! -s "$d/pid$1" ] || break
        sleep 0.1
    done
    [ -s "$d/pid$1" ] || fail "nbdkit --unix $d/sock$1 wrote no pid file in 10 s"
    cleanup_add "kill $(cat "$d/pid$1") 2>/dev/null"
}
server_start_of ""
server_start_of .standby
server_start_of .standby2
server=$(cat "$d/pid") standby=$(cat "$d/pid.standby") standby2=$(cat "$d/pid.standby2")
cp "$d/pid.standby" "$d/standby.ready"
cp "$d/pid.standby2" "$d/standby2.ready"
kill -KILL "$supervisor"
wait "$supervisor" 2>/dev/null || :
printf 'device=/dev/nbd9\nserver_pid=%s\nserver_start=%s\nserver_exe=%s\nsupervised=1\nphase=on\n' \
    "$supervisor" "$supervisor_start" "$(readlink -f "$(command -v sleep)")" > "$d/state"
rc=0
"$ZRAMCTL" swap status > "$tmp/out" 2>&1 || rc=$?
cat "$tmp/out"
[ "$rc" = 1 ] || fail "swap status with the supervisor killed: exit status $rc, not 1"
grep -q "^/dev/nbd9: not swapped on; supervisor pid $supervisor is gone: server pid $server serves on, but is not restarted if it dies; swap off stops it" "$tmp/out" ||
    fail "swap status with the supervisor killed does not say the server serves on: $(cat "$tmp/out")"
for pid in "$standby" "$standby2"; do
    grep -q "; standby pid $pid orphaned: it cannot take over (only the supervisor hands the device over); swap off stops it" "$tmp/out" ||
        fail "swap status with the supervisor killed does not say standby $pid is orphaned"
    ! grep -q "standby pid $pid ready" "$tmp/out" ||
        fail "swap status with the supervisor killed calls standby $pid ready"
done
# The orphaned server still answers its control channel: its table.
grep -q "$d/ctl" "$tmp/out" || fail "swap status did not ask the orphaned server (no $d/ctl)"
# The same with the supervisor alive (a stand-in started before the
# servers too): the server, and the standby ready.
sed -e "s/^server_pid=.*/server_pid=$live/" \
    -e "s/^server_start=.*/server_start=$(start_of "$live")/" "$d/state" > "$tmp/state.live"
cp "$d/state" "$tmp/state.killed"
cp "$tmp/state.live" "$d/state"
"$ZRAMCTL" swap status > "$tmp/out" 2>&1 || :
grep -q "^/dev/nbd9: not swapped on; supervisor pid $live, server pid $server; standby pid $standby ready; standby pid $standby2 ready$" "$tmp/out" ||
    fail "swap status with the supervisor alive: $(cat "$tmp/out")"
cp "$tmp/state.killed" "$d/state"
# Pid files naming processes that are not this device's servers: one
# started before the supervisor whose command line names the standby's
# socket (a recycled pid), one that names no socket.
cp "$d/pid" "$tmp/pid.kept"
cp "$d/pid.standby" "$tmp/pid.standby.kept"
cp "$d/pid.standby2" "$tmp/pid.standby2.kept"
echo "$early" > "$d/pid.standby"
rm "$d/pid.standby2"
echo "$live" > "$d/pid"
rc=0
"$ZRAMCTL" swap status > "$tmp/out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "swap status with the supervisor and its servers gone: exit status $rc, not 1"
grep -q "^/dev/nbd9: not swapped on; supervisor pid $supervisor is gone, and so is the server$" "$tmp/out" ||
    fail "swap status took a process that is not the device's for its server or standby: $(cat "$tmp/out")"
cp "$tmp/pid.kept" "$d/pid"
cp "$tmp/pid.standby.kept" "$d/pid.standby"
cp "$tmp/pid.standby2.kept" "$d/pid.standby2"
if [ "$(id -u)" = 0 ]; then
    "$ZRAMCTL" swap off /dev/nbd9 > "$tmp/out" 2>&1 || fail "swap off: $(cat "$tmp/out")"
    cat "$tmp/out"
    grep -q "stopped pid $server, a server its supervisor (gone) left running" "$tmp/out" &&
        grep -q "stopped pid $standby, a server its supervisor (gone) left running" "$tmp/out" &&
        grep -q "stopped pid $standby2, a server its supervisor (gone) left running" "$tmp/out" ||
        fail "swap off did not say it stopped the orphaned server and standbys: $(cat "$tmp/out")"
    # Gone, or a zombie of whoever reaps nbdkit's daemon (server_stop
    # waits for that).
    for pid in "$server" "$standby" "$standby2"; do
        process_state=$(awk '$1 == "State:" { print $2 }' "/proc/$pid/status" 2>/dev/null || :)
        [ -z "$process_state" ] || [ "$process_state" = Z ] ||
            fail "swap off left pid $pid running (state $process_state)"
    done
    kill -0 "$early" 2>/dev/null && kill -0 "$live" 2>/dev/null ||
        fail "swap off signalled a process that was not the device's"
    [ ! -e "$d" ] || fail "swap off left $d: $(ls -A "$d")"
fi
# A server that also serves another device (device=) with a client
# connected: swap off refuses, naming it, and changes nothing (stopping
# the server would take the pages a kernel swapped to that device); once
# the client went, swap off stops the server.
if [ "$(id -u)" = 0 ]; then
    d=$tmp/run/nbd10
    mkdir -p "$d"
    env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} "$NBDKIT" --unix "$d/sock" \
        --pidfile "$d/pid" "$PLUGIN" 16M ctl="$d/ctl" device=swap2:16M
    for i in $(seq 100); do [ -s "$d/pid" ] && [ -S "$d/ctl" ] && break; sleep 0.1; done
    [ -s "$d/pid" ] || fail "the server with a second device wrote no pid file"
    busy_server=$(cat "$d/pid")
    cleanup_add "kill $busy_server 2>/dev/null"
    printf 'device=/dev/nbd10\nserver_pid=%s\nserver_start=%s\nserver_exe=%s\nphase=on\n' \
        "$busy_server" "$(start_of "$busy_server")" "$(readlink -f "/proc/$busy_server/exe")" > "$d/state"
    /usr/bin/python3 -c '
import sys, time, nbd
h = nbd.NBD(); h.set_export_name("swap2"); h.connect_unix(sys.argv[1])
open(sys.argv[2], "w").close()
time.sleep(60)' "$d/sock" "$tmp/client.up" &
    client=$!
    cleanup_add "kill $client 2>/dev/null"
    for i in $(seq 100); do [ -e "$tmp/client.up" ] && break; sleep 0.1; done
    [ -e "$tmp/client.up" ] || fail "the client of the second device did not connect"
    rc=0
    "$ZRAMCTL" swap off /dev/nbd10 > "$tmp/out" 2> "$tmp/err" || rc=$?
    [ "$rc" = 1 ] || fail "swap off with another device's client connected: exit status $rc, not 1: $(cat "$tmp/out" "$tmp/err")"
    grep -q "swap off /dev/nbd10: refused: its server also serves swap2 (1 client): swapoff and detach those first" "$tmp/err" ||
        fail "swap off with another device's client connected: $(cat "$tmp/err")"
    kill -0 "$busy_server" && [ -f "$d/state" ] ||
        fail "swap off refused but stopped the server or removed its state"
    echo "ok: swap off refused: $(cat "$tmp/err")"
    # swap restart too: the supervisor would reconnect nbd10 alone.  The
    # state says restartable; a refusal signals nothing (a SIGHUP would
    # have ended this unsupervised nbdkit).
    sed -i 's/^phase=on$/phase=on\nsupervised=1/' "$d/state"
    rc=0
    "$ZRAMCTL" swap restart /dev/nbd10 > "$tmp/out" 2> "$tmp/err" || rc=$?
    [ "$rc" = 1 ] || fail "swap restart with another device's client connected: exit status $rc, not 1: $(cat "$tmp/out" "$tmp/err")"
    grep -q "swap restart /dev/nbd10: refused: its server also serves swap2 (1 client), which a restart would disconnect" "$tmp/err" ||
        fail "swap restart with another device's client connected: $(cat "$tmp/err")"
    sleep 0.5
    kill -0 "$busy_server" && [ -f "$d/state" ] ||
        fail "swap restart refused but signalled the server or removed its state"
    echo "ok: swap restart refused: $(cat "$tmp/err")"
    sed -i '/^supervised=1$/d' "$d/state"
    kill "$client"; wait "$client" 2>/dev/null || :
    for i in $(seq 50); do
        "$ZRAMCTL" devices "$d/ctl" | grep -q "clients=0" && break
        sleep 0.1
    done
    "$ZRAMCTL" swap off /dev/nbd10 > "$tmp/out" 2>&1 ||
        fail "swap off once the other device's client went: $(cat "$tmp/out")"
    ! kill -0 "$busy_server" 2>/dev/null ||
        [ "$(awk '$1 == "State:" { print $2 }' "/proc/$busy_server/status" 2>/dev/null)" = Z ] ||
        fail "swap off did not stop the server once the other device was free"
fi
echo "ok: nbdkit-zramctl swap"
