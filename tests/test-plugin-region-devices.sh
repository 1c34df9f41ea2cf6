#!/usr/bin/env bash
# Devices in a region: one region holds the default export and every
# device, declared (device=) or added while serving (add), on one pool.
#   - a clean restart (SIGTERM: handed over) and a crash (SIGKILL:
#     recovered) keep every device and its blocks, those added at run
#     time too; a device removed stays removed;
#   - a device= that differs from what the region keeps is refused,
#     naming it, and the region is left as it was;
#   - a standby takes every device over;
#   - adds, writes and removes killed at random, and the recoveries
#     after them killed too: each device whole or gone as its journal
#     allows, the declared one and the default export always whole, and
#     once the added devices are removed the pool holds what it held
#     before them (nothing of a cut add or remove left behind).
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3 ipcs

region="$tmp/region"
segment () { sed -n 's/.* shm=\([0-9]*\) .*/\1/p' "$region" 2>/dev/null; }
cleanup_add 'id=$(segment); [ -z "$id" ] || ipcrm -m "$id" 2>/dev/null'
cleanup_add 'for p in "$tmp"/pid*; do [ -e "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null; done; :'

py () { /usr/bin/python3 "$SRCDIR/tests/region-devices.py" "$@"; }
gone () { while [ -e "/proc/$(cat "$1")" ]; do sleep 0.05; done; }
# start N [PARAMETERS]: a server on sock$N, pid$N, ctl$N, with device a.
start () {
    local n=$1; shift
    rm -f "$tmp/sock$n" "$tmp/ctl$n"
    zram_nbdkit -U "$tmp/sock$n" -P "$tmp/pid$n" "$PLUGIN" 8M \
        region="$region" ctl="$tmp/ctl$n" stats="$tmp/stats" mem_limit=64M \
        device=a:8M:comp=zstd "$@"
}
ctl () { local n=$1; shift; "$ZRAMCTL" "$@" "$tmp/ctl$n"; }
ask () {    # N LINE: the control channel's reply, its last line "ok"
    /usr/bin/python3 - "$tmp/ctl$1" "$2" <<'EOF'
import os, sys
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
print("\n".join(Ctl(sys.argv[1]).ok(sys.argv[2])))
EOF
}

# ---- restarts keep every device -------------------------------------------
start 1 || fail "the first server"
ask 1 "add b 4M" >/dev/null || fail "add b"
for d in "" a b; do py write "$tmp/sock1" "$d" 1 || fail "writing '$d'"; done
kill "$(cat "$tmp/pid1")"; gone "$tmp/pid1"
start 2 || fail "after a clean exit"
ask 2 devices | grep -q "^b 4194304 lz4" || fail "b, added at run time, not kept: $(ask 2 devices)"
for d in "" a b; do py check "$tmp/sock2" "$d" 1 || fail "'$d' after a clean restart"; done
for d in "" a b; do py write "$tmp/sock2" "$d" 2 || fail "writing '$d'"; done
kill -9 "$(cat "$tmp/pid2")"; gone "$tmp/pid2"
start 3 || fail "after SIGKILL"
# From the server itself: the stats file is rewritten every second, and
# may still hold the killed server's figures (seen under TSan).
recoveries=$(ask 3 stats | sed -n 's/^recoveries: //p')
[ "$recoveries" = 1 ] || fail "recoveries '$recoveries', not 1"
for d in "" a b; do py check "$tmp/sock3" "$d" 2 || fail "'$d' after a recovery"; done
ask 3 "remove b" >/dev/null || fail "remove b"
kill -9 "$(cat "$tmp/pid3")"; gone "$tmp/pid3"
start 4 || fail "after a remove and SIGKILL"
if ask 4 devices | grep -q "^b "; then fail "b, removed, came back"; fi
for d in "" a; do py check "$tmp/sock4" "$d" 2 || fail "'$d' after b's remove"; done
ask 4 "add b 4M" >/dev/null || fail "add b again"
py check "$tmp/sock4" b 0 || fail "b added again holds the old b's blocks"
kill "$(cat "$tmp/pid4")"; gone "$tmp/pid4"
echo "ok: a clean restart and two crashes keep the default export, a (declared) and b (added); b removed stays removed, added again empty"

# ---- a device= that differs is refused -------------------------------------
id=$(segment)
for wrong in a:16M:comp=zstd a:8M:comp=lz4 a:8M:comp=zstd:cap=4M; do
    if zram_nbdkit -U - "$PLUGIN" 8M region="$region" mem_limit=64M \
        device="$wrong" --run true 2>"$tmp/wrong.err"; then
        fail "device=$wrong accepted against the region's a"
    fi
    grep -q "device: a: the region keeps it as 8388608 bytes, zstd" "$tmp/wrong.err" ||
        fail "device=$wrong: $(cat "$tmp/wrong.err")"
done
[ "$(segment)" = "$id" ] || fail "a refused server changed the region"
start 5 || fail "after the refusals"
for d in "" a; do py check "$tmp/sock5" "$d" 2 || fail "'$d' after the refusals"; done
echo "ok: device=a of another size, algorithm or cap refused, naming what the region keeps; the region as it was"

# ---- a standby takes every device over ---------------------------------------
ask 5 "add s 2M" >/dev/null || fail "add s"
py write "$tmp/sock5" s 3 || fail "writing s"
zram_nbdkit -U "$tmp/sock6" -P "$tmp/pid6" "$PLUGIN" 8M region="$region" \
    ctl="$tmp/ctl5" stats="$tmp/stats" mem_limit=64M device=a:8M:comp=zstd \
    standby="$tmp/standby6" || fail "a standby"
kill -9 "$(cat "$tmp/pid5")"; gone "$tmp/pid5"
answer=$(/usr/bin/python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(b"takeover\n"); print(s.makefile().readline().strip())' "$tmp/standby6")
case "$answer" in ok\ *) ;; *) fail "takeover: $answer" ;; esac
for d in "" a; do py check "$tmp/sock6" "$d" 2 || fail "'$d' after the takeover"; done
py check "$tmp/sock6" s 3 || fail "s after the takeover"
ask 5 "remove s" >/dev/null || fail "remove s on the standby"
kill "$(cat "$tmp/pid6")"; gone "$tmp/pid6"
echo "ok: a standby took the region over after SIGKILL, with a and s (added at run time)"

# ---- adds, writes and removes killed; recoveries killed --------------------
start 7 || fail "before the kills"
ask 7 compact >/dev/null
before=$(ask 7 mm_stat | awk '{ print $3 }')
cycles=${REGION_DEVICES_CYCLES:-12}
seed=${REGION_DEVICES_SEED:-$$}
RANDOM=$seed
journal="$tmp/journal"
: > "$journal"
kept_total=0 recovery_kills=0 window=40
for ((cycle = 0; cycle < cycles; cycle++)); do
    py churn "$tmp/sock7" "$tmp/ctl7" "$journal" 2>"$tmp/churn.err" &
    churn=$!
    sleep "0.$((RANDOM % 9 + 1))"
    kill -9 "$(cat "$tmp/pid7")"; gone "$tmp/pid7"
    wait "$churn" || :
    # The recovery killed too, at a random moment of its start: the
    # window follows where the kills land (narrowed by a quarter after
    # one that came after the takeover, widened by a sixteenth else).
    for ((k = 0; k < 2; k++)); do
        ( exec env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} "$NBDKIT" -f -v \
              -U "$tmp/sock-killed" "$PLUGIN" 8M region="$region" \
              mem_limit=64M device=a:8M:comp=zstd 2>"$tmp/recovery.log" ) &
        server=$!
        delay=$((RANDOM % (window + 1)))
        sleep "$(printf '0.%03d' "$delay")"
        kill -9 "$server" 2>/dev/null || :
        wait "$server" 2>/dev/null || :
        if grep -q "region: took over" "$tmp/recovery.log"; then
            window=$((window - window / 4 + 1))
        else
            grep -q "zram: get_ready" "$tmp/recovery.log" &&
                recovery_kills=$((recovery_kills + 1))
            window=$((window + window / 16 + 1))
            [ "$window" -le 900 ] || window=900
        fi
    done
    start 7 || fail "cycle $cycle: after SIGKILL"
    kept=$(py verify "$tmp/sock7" "$tmp/ctl7" "$journal") ||
        fail "cycle $cycle (seed $seed): the devices are not as the journal allows"
    kept_total=$((kept_total + kept))
    for d in "" a; do py check "$tmp/sock7" "$d" 2 || fail "cycle $cycle: '$d'"; done
done
grep -c "^end add" "$journal" > "$tmp/adds"
for d in c0 c1 c2 c3; do
    if ask 7 devices | grep -q "^$d "; then
        ask 7 "remove $d" >/dev/null || fail "remove $d"
        echo "end remove $d" >> "$journal"
    fi
done
ask 7 compact >/dev/null
after=$(ask 7 mm_stat | awk '{ print $3 }')
# The table nodes of the default export's and a's blocks may have moved
# to other pages: a few pages either way, not a device's worth.
[ "$after" -le $((before + 16 * 4096)) ] ||
    fail "the pool holds $after bytes after every added device went, $before before them"
echo "ok: $cycles kills among adds, writes and removes ($(cat "$tmp/adds") adds acknowledged), $recovery_kills servers killed inside their recovery: every device whole or gone as its journal allows ($kept_total kept in all), a and the default export whole; the pool's pages $before bytes before, $after after"
