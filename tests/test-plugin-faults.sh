#!/usr/bin/env bash
# Fault injection through nbdkit: the plugin's test build
# (tests/nbdkit-zram-faults-plugin.so, tests/fault-inject.h) serves
# tests/fault_workload.py with ZRAM_FAULTS failing one call.
#
# The points only the server reaches are failed at every call, or at 6
# calls spread from the first to the last where they repeat (a stats-file
# round, a control command): starting threads, the stats file, the
# control socket (socket, bind, listen, accept, recv, send, its reply
# buffer), the backing file name.  The points the block store reaches
# (memory, the page source, the codec, the backing file's I/O), which
# tests/test-faults sweeps call by call, are failed here at their first,
# middle and last call.  Each run ends
# one of two ways:
#   - the server refuses to start, exits with a status (no signal, no
#     sanitizer report) and an error message saying what failed; or
#   - it serves the whole workload: requests fail only with ENOMEM,
#     ENOSPC or EIO and lose nothing else, a control command fails at most
#     once, every block reads back, a failed stats-file write is logged
#     and the file is written again, and the server exits cleanly.
# Then damage: a corrupted object gives EIO for its block only, counted
# in failed_reads, and a rewrite heals it.
#
# FAULT_PLUGIN_ALL=1 fails every call of every point (minutes).
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3

FAULTS_PLUGIN="$BUILDDIR/tests/.libs/nbdkit-zram-faults-plugin.so"
[ -f "$FAULTS_PLUGIN" ] || fail "not built: $FAULTS_PLUGIN (make check builds it)"
# The server's own exit status must count (a crash after the workload).
export ZRAM_CAPTIVE=1
# Each run's log (nbdkit's, the workload's) goes here: shown if the test
# fails.
cleanup_add '[ "$rc" = 0 ] || cat "$tmp/log" >&2 2>/dev/null'


server_args=(
    "$FAULTS_PLUGIN" $((48 * 4096)) ctl="$tmp/ctl" stats="$tmp/stats"
    backing="$tmp/backing" pack_blocks=4 recomp_algorithm=zstd
)
workload="STATS_WAIT=\${STATS_WAIT:-} /usr/bin/python3 '$SRCDIR/tests/fault_workload.py' \"\$uri\" '$tmp/ctl' '$tmp/stats' > '$tmp/result'"

# serve SPEC: one run with ZRAM_FAULTS=SPEC; sets outcome to served or
# refused (anything else fails the test).
serve ()
{
    local rc=0
    rm -f "$tmp/ctl" "$tmp/stats" "$tmp/backing" "$tmp/result" "$tmp/report"
    ZRAM_FAULTS="$1" ZRAM_FAULTS_REPORT="$tmp/report" \
        zram_nbdkit -U - "${server_args[@]}" --run "$workload" 2>"$tmp/log" || rc=$?
    if [ "$rc" = 0 ]; then
        grep -q '^failed: ' "$tmp/result" || fail "$1: the workload said nothing"
        # A failed stats-file write is logged; the workload saw the file
        # written again with the device's last state (STATS_WAIT).
        if grep -q 'stats file .*cannot write' "$NBDKIT_STDERR"; then
            stats_failures_logged=$((stats_failures_logged + 1))
        fi
        [ -s "$tmp/stats" ] || fail "$1: no stats file"
        outcome=served
    elif { [ -e "$tmp/result" ] && ! grep -q '^refused: ' "$tmp/result"; } ||
             [ "$rc" -ge 128 ]; then
        cat "$NBDKIT_STDERR" >&2
        fail "$1: the server failed while serving (exit status $rc)"
    else
        # Refused at startup (the workload never ran or could not
        # connect), with a message.
        grep -q 'error:' "$NBDKIT_STDERR" || {
            cat "$NBDKIT_STDERR" >&2
            fail "$1: the server refused to start without a message"
        }
        outcome=refused
    fi
    # Served or refused, the server leaves no control socket behind.
    [ ! -e "$tmp/ctl" ] || fail "$1: the control socket was left behind"
    injected=$(sed -n 's/^injected //p' "$tmp/report" 2>/dev/null || echo 0)
}

# A clean run: what each point is called, how often.
serve ""
[ "$outcome" = served ] || fail "the clean run was refused"
grep -qx 'failed: nothing' "$tmp/result" || fail "the clean run: $(cat "$tmp/result")"
cp "$tmp/report" "$tmp/reference"

server_only="strdup pthread_create fopen mkostemp rename socket bind listen accept4 recv send open_memstream"
runs=0 served=0 refused=0 missed=0 stats_failures_logged=0
while read -r point calls; do
    case $point in injected|corrupt) continue ;; esac
    # Every call of the server's points, up to 6 spread over them (their
    # calls repeat: a stats-file round, a control command); the first,
    # middle and last of the store's.
    case " $server_only " in
        *" $point "*) spread=6 ;;
        *) spread=3 ;;
    esac
    if [ "$calls" -le "$spread" ]; then
        calls_to_try=$(seq 1 "$calls")
    else
        calls_to_try=$(for ((i = 0; i < spread; i++)); do
                           echo $((1 + i * (calls - 1) / (spread - 1)))
                       done | sort -un)
    fi
    [ -z "${FAULT_PLUGIN_ALL:-}" ] || calls_to_try=$(seq 1 "$calls")
    point_injected=0
    case $point in
        fopen|mkostemp|rename) export STATS_WAIT=1 ;;
        *) unset STATS_WAIT ;;
    esac
    for nth in $calls_to_try; do
        serve "$point=$nth"
        runs=$((runs + 1))
        case $outcome in
            served) served=$((served + 1)) ;;
            refused) refused=$((refused + 1)) ;;
        esac
        # Threads make some calls at times of their own: a late call may
        # not come in a run.  The first always does.
        if [ "$injected" = 1 ]; then
            point_injected=$((point_injected + 1))
        else
            missed=$((missed + 1))
        fi
        echo "$point=$nth: $outcome ($(cat "$tmp/result" 2>/dev/null || echo 'did not run'))"
    done
    [ "$point_injected" -gt 0 ] || fail "$point: no run reached a call to fail"
done < "$tmp/reference"
unset STATS_WAIT
[ "$stats_failures_logged" -gt 0 ] || fail "no failed stats-file write was logged"
echo "$runs runs: $served served, $refused refused at startup, $missed late calls not reached"

# Damage: the first object decoded is corrupted.
export ZRAM_FAULTS=corrupt=1
zram_nbdkit -U - "$FAULTS_PLUGIN" 1M ctl="$tmp/ctl2" --run "/usr/bin/python3 -c '
import sys
sys.path.insert(0, \"$SRCDIR/tests\")
import nbd
from ctl_client import Ctl
h = nbd.NBD()
h.connect_uri(sys.argv[1])
blocks = [(b\"block %d \" % i) * 400 + bytes(4096 - 400 * len(b\"block %d \" % i)) for i in range(8)]
for i, data in enumerate(blocks):
    h.pwrite(data, i * 4096)
failed = []
for i, data in enumerate(blocks):
    try:
        assert h.pread(4096, i * 4096) == data, i
    except nbd.Error as e:
        assert e.errno == \"EIO\", e
        failed.append(i)
assert failed == [0], failed
io_stat = Ctl(\"$tmp/ctl2\").ok(\"io_stat\")[0].split()
assert int(io_stat[0]) >= 1, io_stat
h.pwrite(blocks[0], 0)
assert h.pread(8 * 4096, 0) == b\"\".join(blocks)
print(\"corruption: block 0 failed with EIO, failed_reads\", io_stat[0])
' \"\$uri\"" 2>/dev/null || { cat "$NBDKIT_STDERR" >&2; fail "corruption"; }
unset ZRAM_FAULTS
