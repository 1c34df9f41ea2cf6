#!/usr/bin/env bash
# region=: a device that outlives its server.  Data written to one
# server is read back from the next (SIGTERM, start again: the store is
# taken over, nothing copied); the stats say generation, restarts,
# recovered blocks and downtime.  A second server for a region in use,
# one configured for another device, and one of another algorithm are
# refused with the reason and leave the region as it was; a server that
# fails to start before serving (its socket taken) leaves it clean; a
# server killed with SIGKILL leaves a region the next one recovers from
# its block table, every acknowledged block whole; drop gives the memory
# up at exit; handover (a planned restart's) hands it over and exits at
# once; a standby (standby=) takes the region over when told, after a
# SIGKILL or a handover.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/nbdsh ipcs

region="$tmp/region"
segment () { sed -n 's/.* shm=\([0-9]*\) .*/\1/p' "$region" 2>/dev/null; }
# ipcs -i succeeds for an id that does not exist: look in the list.
segment_exists () { ipcs -m | awk '{ print $2 }' | grep -qx "$1"; }
cleanup_add 'id=$(segment); [ -z "$id" ] || ipcrm -m "$id" 2>/dev/null'

cat > "$tmp/data.py" <<'EOF'
import os, random
# Blocks of every kind: text, random (stored raw), same-filled, partial.
def blocks(version):
    rnd = random.Random(version)
    out = {}
    for b in range(0, 2048, 3):
        kind = b % 4
        if kind == 0:
            data = (("block %d version %d " % (b, version)) * 300)[:4096].encode()
        elif kind == 1:
            data = rnd.randbytes(4096)
        elif kind == 2:
            data = bytes([b % 251]) * 4096
        else:
            data = bytes(100) + rnd.randbytes(200) + bytes(3796)
        out[b] = data
    return out
version = int(os.environ["VERSION"])
if os.environ["ACTION"] == "write":
    for b, data in blocks(version).items():
        h.pwrite(data, b * 4096)
    print("wrote version", version)
else:
    bad = [b for b, data in blocks(version).items()
           if h.pread(4096, b * 4096) != data]
    assert not bad, "blocks that differ: %s" % bad[:10]
    print("version", version, "read back whole")
EOF

serve () {
    ACTION=$1 VERSION=$2 zram_nbdkit -U - "$PLUGIN" 8M region="$region" \
        stats="$tmp/stats" ${3:-} \
        --run "ACTION=$1 VERSION=$2 nbdsh -u \"\$uri\" -c - < '$tmp/data.py'"
}
stat_of () { sed -n "s/^$1: //p" "$tmp/stats"; }

# ---- a planned restart: every block back -------------------------------
serve write 1 || fail "first server"
[ -s "$region" ] || fail "no region file after the first server"
id=$(segment)
segment_exists "$id" || fail "the segment $id is gone after the first server exited"
serve read 1 || fail "the second server did not serve the first one's data"
[ "$(stat_of generation)" = 2 ] || fail "generation $(stat_of generation), not 2"
[ "$(stat_of restarts)" = 1 ] || fail "restarts $(stat_of restarts), not 1"
blocks=$(stat_of recovered_blocks)
[ "$blocks" -gt 600 ] || fail "recovered_blocks $blocks"
echo "ok: restart: generation 2, $blocks blocks taken over, downtime $(stat_of downtime_seconds) s"
# The supervisor's measure of the downtime (the control channel's
# downtime): what stats say from then on; refused when not a number.
requires_zramctl
zram_nbdkit -U - "$PLUGIN" 8M region="$region" stats="$tmp/stats" \
    ctl="$tmp/ctl" --run "'$ZRAMCTL' downtime '$tmp/ctl' 4321 &&
        ! '$ZRAMCTL' downtime '$tmp/ctl' soon 2>'$tmp/downtime.err' &&
        sleep 1.5" || fail "a server told its downtime"
grep -q "downtime: 'soon' is not a number of milliseconds" "$tmp/downtime.err" ||
    fail "no clear refusal of 'downtime soon': $(cat "$tmp/downtime.err")"
[ "$(stat_of downtime_seconds)" = 4.321 ] ||
    fail "downtime_seconds $(stat_of downtime_seconds) after the supervisor said 4321 ms"
echo "ok: the supervisor's downtime (4321 ms) is what stats say"
serve write 2 && serve read 2 || fail "a third generation"
[ "$(segment)" = "$id" ] || fail "the segment changed across restarts"

# ---- refusals: the region as it was ------------------------------------
# A second server while one serves.
zram_nbdkit -U "$tmp/sock1" -P "$tmp/pid1" "$PLUGIN" 8M region="$region" ||
    fail "a background server"
if zram_nbdkit -U - "$PLUGIN" 8M region="$region" --run true 2>"$tmp/second.err"; then
    fail "a second server took a region in use"
fi
grep -q "owned by another process" "$tmp/second.err" ||
    fail "second server: $(cat "$tmp/second.err")"
kill "$(cat "$tmp/pid1")"
while [ -e "/proc/$(cat "$tmp/pid1")" ]; do sleep 0.1; done
echo "ok: a second server for a region in use: refused"
for other in "16M" "8M comp=zstd" "8M mem_budget=64M"; do
    # shellcheck disable=SC2086
    if zram_nbdkit -U - "$PLUGIN" $other region="$region" --run true 2>"$tmp/other.err"; then
        fail "a server for another device ($other) took the region"
    fi
    grep -Eq "another device|another size|another algorithm|give mem_limit= again" "$tmp/other.err" ||
        fail "other device: $(cat "$tmp/other.err")"
done
echo "ok: servers for another size, algorithm or kind of limit: refused"
# A server that cannot start (its socket is taken) leaves it clean.
: > "$tmp/taken.sock"
zram_nbdkit -U "$tmp/taken.sock" "$PLUGIN" 8M region="$region" 2>/dev/null &&
    fail "a server started on a taken socket"
serve read 2 || fail "after refusals and a failed start, the data is not whole"
echo "ok: after the refusals and a failed start, every block is there"

# ---- a cold tier (backing=) kept: restart, crash, refusals ---------------
# Blocks written back to the file stay there across a planned restart and
# a SIGKILL: the next server reads them from the cold tier (bd_count says
# they are still there, not in RAM), every block whole.  A server with
# another backing file, or none, is refused and changes nothing.
cold_region="$tmp/region-cold"
cleanup_add 'id=$(sed -n "s/.* shm=\([0-9]*\) .*/\1/p" "$tmp/region-cold" 2>/dev/null); [ -z "$id" ] || ipcrm -m "$id" 2>/dev/null'
zramctl="$BUILDDIR/tools/nbdkit-zramctl"
cold () {   # ACTION VERSION [BACKING FILE] [a command after the data]
    ACTION=$1 VERSION=$2 zram_nbdkit -U - "$PLUGIN" 8M region="$cold_region" \
        backing="${3:-$tmp/cold}" ctl="$tmp/ctl-cold" stats="$tmp/stats" \
        --run "ACTION=$1 VERSION=$2 nbdsh -u \"\$uri\" -c - < '$tmp/data.py' && ${4:-true}"
}
cold write 5 "" "'$zramctl' writeback '$tmp/ctl-cold' page_indexes=0-2047 >/dev/null" ||
    fail "a server with region= and backing="
backed=$(stat_of bd_count)
[ "$backed" -gt 300 ] || fail "only $backed blocks written back"
cold read 5 || fail "after a restart, the written-back blocks are not whole"
[ "$(stat_of bd_count)" = "$backed" ] ||
    fail "after a restart bd_count is $(stat_of bd_count), not $backed"
echo "ok: restart with a cold tier: $backed blocks read back from it"
zram_nbdkit -U "$tmp/sock-cold" -P "$tmp/pid-cold" "$PLUGIN" 8M \
    region="$cold_region" backing="$tmp/cold" ctl="$tmp/ctl-cold" \
    stats="$tmp/stats" || fail "a background server with a cold tier"
ACTION=write VERSION=6 nbdsh -u "nbd+unix://?socket=$tmp/sock-cold" -c - \
    < "$tmp/data.py" || fail "writing to the background server"
"$zramctl" writeback "$tmp/ctl-cold" page_indexes=0-1023 >/dev/null ||
    fail "writeback before the crash"
kill -9 "$(cat "$tmp/pid-cold")"
while [ -e "/proc/$(cat "$tmp/pid-cold")" ]; do sleep 0.1; done
cold read 6 2>"$tmp/cold-crash.err" ||
    fail "after SIGKILL with a cold tier: $(cat "$tmp/cold-crash.err")"
[ "$(stat_of recoveries)" -ge 1 ] || fail "no recovery after SIGKILL"
[ "$(stat_of bd_count)" -gt 100 ] ||
    fail "after the recovery bd_count is $(stat_of bd_count)"
echo "ok: SIGKILL with a cold tier: recovered, $(stat_of bd_count) blocks still in it, every block whole"
if cold read 6 "$tmp/other-cold" 2>"$tmp/cold-other.err"; then
    fail "a server with another backing file took the region"
fi
grep -q "not the stored device's" "$tmp/cold-other.err" ||
    fail "another backing file: $(cat "$tmp/cold-other.err")"
if ACTION=read VERSION=6 zram_nbdkit -U - "$PLUGIN" 8M region="$cold_region" \
       --run true 2>"$tmp/cold-none.err"; then
    fail "a server without backing= took a region with a cold tier"
fi
grep -q "give its backing= again" "$tmp/cold-none.err" ||
    fail "no backing=: $(cat "$tmp/cold-none.err")"
cold read 6 || fail "after the refusals, the data is not whole"
echo "ok: another backing file, or none: refused, the data whole"

# ---- a crash: recovered from the block table ------------------------------
zram_nbdkit -U "$tmp/sock2" -P "$tmp/pid2" "$PLUGIN" 8M region="$region" \
    stats="$tmp/stats" || fail "a background server"
ACTION=write VERSION=3 nbdsh -u "nbd+unix://?socket=$tmp/sock2" -c - \
    < "$tmp/data.py" || fail "writing to the background server"
sleep 1.2                       # a housekeeping round: a sign of life
kill -9 "$(cat "$tmp/pid2")"
while [ -e "/proc/$(cat "$tmp/pid2")" ]; do sleep 0.1; done
segment_exists "$id" || fail "the crashed region's memory is gone"
serve read 3 2>"$tmp/crash.err" || fail "after SIGKILL: $(cat "$tmp/crash.err")"
[ "$(stat_of recoveries)" = 1 ] || fail "recoveries $(stat_of recoveries), not 1"
echo "ok: after SIGKILL, every acknowledged block recovered ($(stat_of recovered_blocks) blocks in $(stat_of recovery_seconds) s, down $(stat_of downtime_seconds) s)"
serve read 3 || fail "after the recovery, a clean restart"

# ---- handover: a planned restart without nbdkit's shutdown ---------------
zram_nbdkit -U "$tmp/sock3" -P "$tmp/pid3" "$PLUGIN" 8M region="$region" \
    ctl="$tmp/ctl3" stats="$tmp/stats" || fail "a background server"
ACTION=write VERSION=4 nbdsh -u "nbd+unix://?socket=$tmp/sock3" -c - \
    < "$tmp/data.py" || fail "writing to the background server"
"$BUILDDIR/tools/nbdkit-zramctl" handover "$tmp/ctl3" || fail "handover"
for _ in $(seq 100); do [ -e "/proc/$(cat "$tmp/pid3")" ] || break; sleep 0.1; done
[ ! -e "/proc/$(cat "$tmp/pid3")" ] || fail "the server still runs after handover"
recoveries=$(stat_of recoveries)
serve read 4 || fail "after handover, the next server does not serve the data"
[ "$(stat_of recoveries)" = "$recoveries" ] ||
    fail "after handover the next server recovered (a crash), not took over"
echo "ok: handover: the server exits, the next takes the region over clean"

# ---- a standby: made ready ahead, serving once told to take over ----------
# standby=: the handshake is answered (the size), requests are refused,
# "takeover" is refused while the region's server lives and taken once
# it died (SIGKILL: a recovery) or handed over (the control channel's
# handover: clean); each time every block is whole.
if zram_nbdkit -U - "$PLUGIN" 8M standby="$tmp/sb" --run true 2>"$tmp/sb.err"; then
    fail "standby= without region= was accepted"
fi
grep -q "standby: needs region=" "$tmp/sb.err" || fail "standby alone: $(cat "$tmp/sb.err")"
cat > "$tmp/ask.py" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
print(s.makefile().readline().strip())
EOF
ask () { /usr/bin/python3 "$tmp/ask.py" "$@"; }
gone () { while [ -e "/proc/$(cat "$1")" ]; do sleep 0.1; done; }
take_over () {   # SOCKET WHAT: the standby on SOCKET serves, or fail WHAT
    answer=$(ask "$1" takeover)
    case "$answer" in ok\ *) ;; *) fail "$2: $answer" ;; esac
}
standby () {   # N: a standby on sock$N, pid$N, standby$N
    zram_nbdkit -U "$tmp/sock$1" -P "$tmp/pid$1" "$PLUGIN" 8M \
        region="$region" ctl="$tmp/ctl4" stats="$tmp/stats" \
        standby="$tmp/standby$1" || fail "a standby"
}
zram_nbdkit -U "$tmp/sock4" -P "$tmp/pid4" "$PLUGIN" 8M region="$region" \
    ctl="$tmp/ctl4" stats="$tmp/stats" || fail "a background server"
ACTION=write VERSION=7 nbdsh -u "nbd+unix://?socket=$tmp/sock4" -c - \
    < "$tmp/data.py" || fail "writing to the background server"
standby 5
[ "$(nbdsh -u "nbd+unix://?socket=$tmp/sock5" -c 'print (h.get_size ())')" = 8388608 ] ||
    fail "the standby's handshake"
if nbdsh -u "nbd+unix://?socket=$tmp/sock5" -c 'h.pread (4096, 0)' 2>/dev/null; then
    fail "a standby answered a read before its takeover"
fi
case "$(ask "$tmp/standby5" ready)" in ok\ *) ;; *) fail "the standby's ready" ;; esac
case "$(ask "$tmp/standby5" takeover)" in
    error:*) ;; *) fail "a standby took over a region whose server lives" ;;
esac
ACTION=read VERSION=7 nbdsh -u "nbd+unix://?socket=$tmp/sock4" -c - \
    < "$tmp/data.py" || fail "the server after a refused takeover"
sleep 1.2                       # a housekeeping round: its stats
recoveries=$(stat_of recoveries)
kill -9 "$(cat "$tmp/pid4")"
gone "$tmp/pid4"
take_over "$tmp/standby5" "the standby did not take over after SIGKILL"
[ ! -e "$tmp/standby5" ] || fail "the standby's socket is still there after its takeover"
ACTION=read VERSION=7 nbdsh -u "nbd+unix://?socket=$tmp/sock5" -c - \
    < "$tmp/data.py" || fail "the standby after its takeover"
sleep 1.2
[ "$(stat_of recoveries)" = $((recoveries + 1)) ] ||
    fail "the standby's takeover after SIGKILL was not a recovery"
echo "ok: a standby: handshake answered, requests refused, takeover refused while the server lived, after SIGKILL taken over with every block whole"
standby 6
ACTION=write VERSION=8 nbdsh -u "nbd+unix://?socket=$tmp/sock5" -c - \
    < "$tmp/data.py" || fail "writing to the standby that took over"
"$BUILDDIR/tools/nbdkit-zramctl" handover "$tmp/ctl4" || fail "handover to a standby"
gone "$tmp/pid5"
take_over "$tmp/standby6" "the standby did not take over after a handover"
ACTION=read VERSION=8 nbdsh -u "nbd+unix://?socket=$tmp/sock6" -c - \
    < "$tmp/data.py" || fail "the second standby after its takeover"
sleep 1.2
[ "$(stat_of recoveries)" = $((recoveries + 1)) ] ||
    fail "a takeover after a handover recovered (a crash), not took over"
kill "$(cat "$tmp/pid6")"
gone "$tmp/pid6"
serve read 8 || fail "after the standbys, the next server"
echo "ok: a standby after a handover: taken over clean, every block whole"
# With a cold tier: the standby opens backing= at its takeover (the
# serving server holds the backing file's lock until it goes).
zram_nbdkit -U "$tmp/sock7" -P "$tmp/pid7" "$PLUGIN" 8M region="$cold_region" \
    backing="$tmp/cold" ctl="$tmp/ctl7" stats="$tmp/stats" ||
    fail "a background server with a cold tier"
ACTION=write VERSION=9 nbdsh -u "nbd+unix://?socket=$tmp/sock7" -c - \
    < "$tmp/data.py" || fail "writing to the server with a cold tier"
"$zramctl" writeback "$tmp/ctl7" page_indexes=0-1023 >/dev/null ||
    fail "writeback before the standby's takeover"
zram_nbdkit -U "$tmp/sock8" -P "$tmp/pid8" "$PLUGIN" 8M region="$cold_region" \
    backing="$tmp/cold" ctl="$tmp/ctl7" stats="$tmp/stats" \
    standby="$tmp/standby8" || fail "a standby with backing="
kill -9 "$(cat "$tmp/pid7")"
gone "$tmp/pid7"
take_over "$tmp/standby8" "the standby with backing= did not take over"
ACTION=read VERSION=9 nbdsh -u "nbd+unix://?socket=$tmp/sock8" -c - \
    < "$tmp/data.py" || fail "the standby with a cold tier after its takeover"
sleep 1.2
[ "$(stat_of bd_count)" -gt 100 ] ||
    fail "after the standby's takeover bd_count is $(stat_of bd_count)"
kill "$(cat "$tmp/pid8")"
gone "$tmp/pid8"
echo "ok: a standby with a cold tier: backing= opened at the takeover, $(stat_of bd_count) blocks still in it, every block whole"

# ---- drop: the memory goes at exit -----------------------------------------
zram_nbdkit -U - "$PLUGIN" 8M region="$region" ctl="$tmp/ctl" \
    --run "cp '$region' '$tmp/dropped' && '$BUILDDIR/tools/nbdkit-zramctl' drop '$tmp/ctl'" ||
    fail "drop"
[ ! -e "$region" ] || fail "after drop the region file is still there"
id=$(sed -n 's/.* shm=\([0-9]*\) .*/\1/p' "$tmp/dropped")
[ -n "$id" ] || fail "no segment named while serving"
! segment_exists "$id" || fail "after drop the segment $id is still there"
echo "ok: drop: the segment and the region file are gone"
