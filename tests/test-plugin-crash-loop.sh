#!/usr/bin/env bash
# A crash loop over the real server: a device kept in a region (region=),
# its movers on (idle marking, packing, recompression, writeback to a
# cold tier file, compaction: by the housekeeper's policy and asked for
# on the control channel), is killed with SIGKILL again and again, and
# every block must read back as the client's exact shadow says.
#
# Each cycle:
#   1. Most cycles (4 in 5), 1 to 3 servers are started in turn on the
#      crashed region and each killed at a random instant (uniformly) of
#      its first milliseconds, most of them while they recover it (their
#      log, -v, says where the kill landed: before the plugin's
#      get_ready, inside it - the recovery - or after the region was
#      taken over; the window follows where the kills land).
#   2. A server is started and serves: it recovers the region.  The
#      client (tests/crash_loop_client.py) reads every block and compares
#      it with its shadow (the acknowledged version, or the one in flight
#      at the last kill), then writes for a random 0.2 to 2 s - text,
#      random, same-filled, zeros, partly zero blocks, trims and zero
#      requests, 4 KiB to 256 KiB, 16 in flight - asking the control
#      channel for the movers meanwhile, and kills the server (SIGKILL)
#      with its requests in flight.  What was acknowledged is recorded.
# With CRASH_LOOP_DEVICE (default 1), the server serves a device "a" as
# well (a quarter of the size, on the same pool, budget, region and cold
# tier): a second client (MODE follow-write) checks it, writes to it and
# asks the movers for it until the first one's kill drops its connection,
# with its own shadow, so each kill lands with both exports' requests in
# flight and each recovery walks both into the one pool and space map.
# The loop runs CRASH_LOOP_SECONDS (default 60; .ci/run gives it 300),
# split between the algorithms of CRASH_LOOP_COMP (default "lz4 zstd"),
# each on a fresh region (a region's algorithm is fixed); then a last
# server recovers, is checked, stopped (SIGTERM: a clean handover), and
# the next one takes over and is checked again.
#
# Fails on a block that reads as neither its acknowledged version nor the
# one in flight (printing the block, the versions expected and the one
# read), on a server that refuses the region, exits by itself, or logs
# damaged content after a recovery, and on a sanitizer report.  Prints a
# summary line per algorithm: cycles, kills inside a recovery, writes
# acknowledged, blocks checked, mismatches.
#
# Knobs (the environment, or make check ... VAR=VALUE): CRASH_LOOP_SECONDS,
# CRASH_LOOP_COMP, CRASH_LOOP_SIZE (default 128M: 32768 blocks, a
# recovery of tens of ms), CRASH_LOOP_KILL_MS (the first window of the
# kills in a recovery, default 40; it then follows where they land),
# CRASH_LOOP_SEED (the shell's and the client's choices; the instants
# depend on the machine as well), CRASH_LOOP_DEVICE (0: the default
# export alone).
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/nbdsh ipcs ipcrm timeout

seconds=${CRASH_LOOP_SECONDS:-60}
comps=${CRASH_LOOP_COMP:-lz4 zstd}
size=${CRASH_LOOP_SIZE:-128M}
kill_ms=${CRASH_LOOP_KILL_MS:-40}
with_device=${CRASH_LOOP_DEVICE:-1}
window=$kill_ms
seed=${CRASH_LOOP_SEED:-$(( $(date +%s) % 1000000 ))}
RANDOM=$seed
client="$SRCDIR/tests/crash_loop_client.py"
zramctl="$BUILDDIR/tools/nbdkit-zramctl"
for comp in $comps; do
    case "$comp" in lz4|zstd) ;; *) fail "CRASH_LOOP_COMP: '$comp' is neither lz4 nor zstd" ;; esac
done
case "$seconds$kill_ms" in *[!0-9]*) fail "CRASH_LOOP_SECONDS and CRASH_LOOP_KILL_MS: whole numbers" ;; esac
if [ "$kill_ms" -lt 1 ] || [ "$kill_ms" -gt 2000 ]; then
    fail "CRASH_LOOP_KILL_MS: 1 to 2000"
fi
blocks=$(/usr/bin/python3 -c '
import sys
s = sys.argv[1]
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
n = int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)
assert n % 4096 == 0 and n > 0, s
print(n // 4096)' "$size") || fail "CRASH_LOOP_SIZE: '$size' is not a whole number of 4 KiB blocks"
device_blocks=$((blocks / 4))
[ "$with_device" = 0 ] || [ "$device_blocks" -ge 64 ] || fail "CRASH_LOOP_SIZE: too small for a device of a quarter of it"
echo "crash loop: ${seconds}s over '$comps', a device of $size ($blocks blocks)$([ "$with_device" = 0 ] || echo " and device a of $device_blocks blocks"), kills inside recovery within ${kill_ms} ms at first, seed $seed"

region="$tmp/region"
sock="$tmp/sock"
pidfile="$tmp/pid"
ctl="$tmp/ctl"
segment () { sed -n 's/.* shm=\([0-9]*\) .*/\1/p' "$region" 2>/dev/null; }
# shellcheck disable=SC2016 # run by eval at exit
cleanup_add 'id=$(segment); [ -z "$id" ] || ipcrm -m "$id" 2>/dev/null'
# shellcheck disable=SC2016
cleanup_add '[ -z "${server_pid:-}" ] || kill -9 "$server_pid" 2>/dev/null'
stats="$tmp/stats"

# The movers on, quickly: blocks idle after 1 s are recompressed and
# packed; mem_limit is a third of the device, less than its data takes
# compressed, and the pool above 70 % of it is written back to the cold
# tier; compaction runs once 1 % of the pages could be freed.
server_args () {   # COMP
    local recompress=zstd
    [ "$1" = zstd ] && recompress="zstd:level=9"
    echo "$size comp=$1 region=$region backing=$tmp/cold ctl=$ctl stats=$stats" \
        "mem_limit=$((blocks * 4096 / 3)) writeback_watermark=70" \
        "idle_after=1 pack_after=1 recompress_after=1" \
        "recomp_algorithm=$recompress compact_threshold=1" \
        "$([ "$with_device" = 0 ] || echo "device=a:$((device_blocks * 4096))")"
}

# start_server LOG COMP [NBDKIT OPTION...]: nbdkit in the foreground of a
# background job, so that $server_pid is the server from its exec on.
# The job is a subshell that waits for it (its stderr, which would say
# "Killed" for each SIGKILL, to /dev/null): $server_job, whose exit
# status is the server's.
start_server () {
    local log=$1 comp=$2 i
    shift 2
    rm -f "$sock" "$pidfile" "$tmp/server-pid" "$tmp/stats"
    # shellcheck disable=SC2046
    ( env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} "$NBDKIT" -f "$@" -U "$sock" \
          -P "$pidfile" "$PLUGIN" $(server_args "$comp") 2>"$log" &
      echo "$!" > "$tmp/server-pid.new"
      mv "$tmp/server-pid.new" "$tmp/server-pid"
      wait "$!" ) 2>/dev/null &
    server_job=$!
    for ((i = 0; i < 10000; i++)); do
        [ -s "$tmp/server-pid" ] && break
        sleep 0.001
    done
    server_pid=$(cat "$tmp/server-pid") || fail "the server's job did not start it"
}

# The server's exit status once it is gone (137: our SIGKILL).
reap_server () {
    local rc=0
    wait "$server_job" || rc=$?
    server_pid='' server_job=
    return "$rc"
}

# A server's log says nothing is wrong: no sanitizer report, no content
# damaged by a recovery.  Damage is remembered ($damaged) rather than
# failed at once: the client's check that follows names the blocks.
damaged=
check_log () {   # LOG WHAT
    if grep -Eq "$SANITIZER_PATTERN" "$1" || _sanitizer_reports; then
        cat "$1" >&2
        fail "$2: a sanitizer report, the server's log above"
    fi
    if grep -q "content was damaged" "$1"; then
        echo "$2: $(grep "content was damaged" "$1")" >&2
        damaged="$damaged${damaged:+; }$2"
    fi
}

# A start refused because this process has something of its own where
# the region's pointers need it (POINTERS in alloc/region.h: the layout
# is random; a new process, a new layout) is started again, and counted.
address_retries=0
wait_serving () {   # LOG WHAT COMP
    local i
    for ((i = 0; i < 6000; i++)); do
        [ -s "$pidfile" ] && return 0
        if ! _alive "$server_pid"; then
            local rc=0
            reap_server || rc=$?
            if grep -q "where its pointers need it" "$1" &&
                   [ "$address_retries" -lt 10 ]; then
                address_retries=$((address_retries + 1))
                echo "$2: the region's address was taken in the new process: started again" >&2
                start_server "$1" "$3"
                continue
            fi
            cat "$1" >&2
            fail "$2: the server exited (status $rc) before serving: the log above"
        fi
        sleep 0.01
    done
    kill -9 "$server_pid"
    fail "$2: the server did not serve within 60 s"
}

ms () { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

# Totals over the run, and per algorithm.
total_cycles=0 total_inside=0 total_acked=0 total_checked=0 total_recovery_kills=0
declare -A most=() moved=()

run_client () {   # LOG MODE [WRITE_SECONDS]
    local rc=0 wait=
    [ "$with_device" = 0 ] || [ "$2" != verify-write ] ||
        wait="CRASH_LOOP_WAIT_FOR=$tmp/device-ready"
    # shellcheck disable=SC2086
    timeout 180 env $NO_PRELOAD_ENV $wait /usr/bin/python3 "$client" "$sock" \
        "$ctl" "$stats" "$server_pid" "$shadow" "$blocks" "$RANDOM$RANDOM" \
        "$2" ${3:-} > "$1" 2>&1 || rc=$?
    return "$rc"
}
# The client of device a (CRASH_LOOP_DEVICE), its own shadow.
run_device_client () {   # LOG MODE
    local rc=0
    # shellcheck disable=SC2086
    timeout 180 env $NO_PRELOAD_ENV CRASH_LOOP_EXPORT=a \
        CRASH_LOOP_READY="$tmp/device-ready" /usr/bin/python3 "$client" \
        "$sock" "$ctl" "$stats" "$server_pid" "$device_shadow" \
        "$device_blocks" "$RANDOM$RANDOM" "$2" > "$1" 2>&1 || rc=$?
    return "$rc"
}
# The client without the sanitizer runtime.
NO_PRELOAD_ENV="-u LD_PRELOAD -u ASAN_OPTIONS -u UBSAN_OPTIONS -u TSAN_OPTIONS"

result_of () {   # LOG KEY: the client's result value (0 if none)
    local value
    value=$(sed -n "s/^result: .*\b$2=\([0-9]*\).*/\1/p" "$1" | tail -n1)
    echo "${value:-0}"
}

# The line for the closing note, for the algorithm running.
summary () {   # MISMATCHES
    echo "crash loop: comp=$comp cycles=$cycles kills_inside_recovery=$inside" \
        "(kills before it $before, after it $after) acknowledged_writes=$acked" \
        "blocks_checked=$checked mismatches=$1 requests_in_flight_at_kills=$inflight" \
        "longest_recovery_ms=$recovery_max address_retries=$address_retries (${SECONDS}s)"
}

# The client's exit status (and a recovery's log) judged.
client_verdict () {   # STATUS WHAT [CLIENT_LOG]
    local mismatches client_log=${3:-$tmp/client.log}
    case "$1" in
        0) ;;
        10)
            mismatches=$(result_of "$client_log" mismatches)
            checked=$((checked + $(result_of "$client_log" checked)))
            summary "$mismatches"
            fail "$2: $mismatches blocks read as neither their acknowledged version nor the one in flight (the first listed above: block, versions expected, what was read)${damaged:+; recoveries that said content was damaged: $damaged}" ;;
        2)
            grep -v "^nbdkit: debug: zram: p\(read\|write\)" "$log" | tail -n 30 >&2
            fail "$2: the server was unusable (above: the client, then the server's log)${damaged:+; recoveries that said content was damaged: $damaged}" ;;
        3) fail "$2: the server failed requests while serving, with a cold tier to make room in (above)" ;;
        124) fail "$2: the client did not finish within 180 s" ;;
        *) fail "$2: the client failed (status $1, above)" ;;
    esac
    [ -z "$damaged" ] ||
        fail "$2: every block read back, yet a recovery said content was damaged: $damaged"
}

comps_count=$(echo "$comps" | wc -w)
per_comp=$((seconds / comps_count))
[ "$per_comp" -ge 1 ] || per_comp=1
for comp in $comps; do
    shadow="$tmp/shadow-$comp.json"
    device_shadow="$tmp/shadow-$comp-a.json"
    rm -f "$tmp/cold"
    cycles=0 inside=0 before=0 after=0 acked=0 checked=0 inflight=0 recovery_max=0
    start=$SECONDS
    while [ $((SECONDS - start)) -lt "$per_comp" ]; do
        cycles=$((cycles + 1))
        cycle="$comp cycle $cycles"
        # ---- kills inside a recovery ----------------------------------
        depth=0
        if [ "$cycles" -gt 1 ] && [ $((RANDOM % 10)) -ge 2 ]; then
            depth=$((1 + RANDOM % 3))
        fi
        for ((k = 1; k <= depth; k++)); do
            log="$tmp/recovery.log"
            delay=$((RANDOM % (window + 1)))
            start_server "$log" "$comp" -v
            sleep "$(ms "$delay")"
            kill -9 "$server_pid" 2>/dev/null || :
            rc=0
            reap_server || rc=$?
            if [ "$rc" != 137 ]; then
                # A new process whose libraries landed where the region
                # goes exits saying so, and its supervisor starts another
                # (wait_serving does the same): not a kill that landed.
                if [ "$rc" = 1 ] && grep -q "where its pointers need it" "$log" &&
                       [ "$address_retries" -lt 10 ]; then
                    address_retries=$((address_retries + 1))
                    echo "$cycle: the region's address was taken in the new process: recovery kill $k not counted" >&2
                    continue
                fi
                cat "$log" >&2
                fail "$cycle: a server killed ${delay} ms after its start exited by itself (status $rc): the log above"
            fi
            check_log "$log" "$cycle, recovery kill $k"
            if grep -q "region: took over" "$log"; then
                where=after
            elif grep -q "zram: get_ready" "$log"; then
                where=inside
            else
                where=before    # nbdkit was still starting
            fi
            # The window follows the recovery (its start and length vary
            # with the machine, its load and the data: 2 to 40 ms here,
            # more under the sanitizers): a kill that came after it
            # narrows it by 1/4, any other widens it by 1/16, so that
            # about one kill in six lands after it, most of the others
            # inside it.
            case "$where" in
                after)
                    after=$((after + 1))
                    window=$((window - window / 4))
                    [ "$window" -ge 2 ] || window=2 ;;
                *)
                    if [ "$where" = inside ]; then
                        inside=$((inside + 1))
                    else
                        before=$((before + 1))
                    fi
                    window=$((window + window / 16 + 1))
                    [ "$window" -le 2000 ] || window=2000 ;;
            esac
            echo "$cycle: killed ${delay} ms after its start: $where the recovery (window now ${window} ms)"
        done
        # ---- serve: check the last crash's blocks, write, SIGKILL -----
        log="$tmp/server.log"
        start_server "$log" "$comp"
        wait_serving "$log" "$cycle" "$comp"
        write_ms=$((200 + RANDOM % 1801))
        rc=0 device_rc=0 device_job=
        if [ "$with_device" != 0 ]; then
            rm -f "$tmp/device-ready"
            run_device_client "$tmp/device.log" follow-write &
            device_job=$!
        fi
        run_client "$tmp/client.log" verify-write "$(ms "$write_ms")" || rc=$?
        kill -9 "$server_pid" 2>/dev/null || :
        server_rc=0
        reap_server || server_rc=$?
        [ -z "$device_job" ] || wait "$device_job" || device_rc=$?
        cat "$tmp/client.log"
        check_log "$log" "$cycle"
        client_verdict "$rc" "$cycle"
        if [ -n "$device_job" ]; then
            sed 's/^/device a: /' "$tmp/device.log"
            client_verdict "$device_rc" "$cycle, device a" "$tmp/device.log"
            acked=$((acked + $(result_of "$tmp/device.log" acked)))
            checked=$((checked + $(result_of "$tmp/device.log" checked)))
            for key in ctl_packed ctl_written_back ctl_recompressed ctl_compacted ctl_dissolved; do
                moved[$key]=$((${moved[$key]:-0} + $(result_of "$tmp/device.log" "$key")))
            done
        fi
        [ "$server_rc" = 137 ] || {
            cat "$log" >&2
            fail "$cycle: the server exited by itself (status $server_rc), not by our SIGKILL"
        }
        acked=$((acked + $(result_of "$tmp/client.log" acked)))
        checked=$((checked + $(result_of "$tmp/client.log" checked)))
        inflight=$((inflight + $(result_of "$tmp/client.log" inflight_at_kill)))
        recovery_ms=$(result_of "$tmp/client.log" recovery_ms)
        [ "${recovery_ms:-0}" -le "$recovery_max" ] || recovery_max=$recovery_ms
        # The movers: the stats at the kill (the housekeeper's work and
        # the control channel's), and what the control channel's commands
        # said they moved.
        for key in bd_writes packed_blocks recomp_blocks pages_compacted; do
            value=$(result_of "$tmp/client.log" "$key")
            [ "$value" -le "${most[$key]:-0}" ] || most[$key]=$value
        done
        for key in ctl_packed ctl_written_back ctl_recompressed ctl_compacted ctl_dissolved; do
            moved[$key]=$((${moved[$key]:-0} + $(result_of "$tmp/client.log" "$key")))
        done
    done
    # ---- the last crash recovered, then a clean handover ---------------
    for how in "recovered after the last crash" "taken over after SIGTERM"; do
        log="$tmp/server.log"
        start_server "$log" "$comp"
        wait_serving "$log" "$comp, the last check" "$comp"
        rc=0 device_rc=0
        run_client "$tmp/client.log" verify || rc=$?
        cat "$tmp/client.log"
        if [ "$with_device" != 0 ]; then
            run_device_client "$tmp/device.log" verify || device_rc=$?
            sed 's/^/device a: /' "$tmp/device.log"
        fi
        kill "$server_pid"
        for ((i = 0; i < 600; i++)); do
            _alive "$server_pid" || break
            sleep 0.1
        done
        if _alive "$server_pid"; then
            kill -9 "$server_pid"
            fail "$comp: the server did not exit within 60 s of SIGTERM"
        fi
        server_rc=0
        reap_server || server_rc=$?
        check_log "$log" "$comp, the last check"
        client_verdict "$rc" "$comp, the device $how"
        if [ "$with_device" != 0 ]; then
            client_verdict "$device_rc" "$comp, device a $how" "$tmp/device.log"
            checked=$((checked + $(result_of "$tmp/device.log" checked)))
        fi
        [ "$server_rc" = 0 ] || { cat "$log" >&2; fail "$comp: the server exited with status $server_rc after SIGTERM"; }
        checked=$((checked + $(result_of "$tmp/client.log" checked)))
        echo "ok: $comp: every block whole, $how"
    done
    "$zramctl" region remove "$region" || fail "$comp: region remove"
    summary 0
    total_cycles=$((total_cycles + cycles)) total_inside=$((total_inside + inside))
    total_recovery_kills=$((total_recovery_kills + before + inside + after))
    total_acked=$((total_acked + acked)) total_checked=$((total_checked + checked))
done
echo "crash loop: movers, the stats at a kill (the most seen):" \
    "bd_writes=${most[bd_writes]:-0} packed_blocks=${most[packed_blocks]:-0}" \
    "recomp_blocks=${most[recomp_blocks]:-0} pages_compacted=${most[pages_compacted]:-0};" \
    "moved by control commands: packed=${moved[ctl_packed]:-0}" \
    "written_back=${moved[ctl_written_back]:-0} recompressed=${moved[ctl_recompressed]:-0}" \
    "compacted=${moved[ctl_compacted]:-0} dissolved=${moved[ctl_dissolved]:-0}"
[ "${most[bd_writes]:-0}" -gt 0 ] || [ "${moved[ctl_written_back]:-0}" -gt 0 ] ||
    fail "no block was written back to the cold tier: the movers did not run"
[ "${most[packed_blocks]:-0}" -gt 0 ] || [ "${moved[ctl_packed]:-0}" -gt 0 ] ||
    fail "no block was packed: the movers did not run"
[ "$total_recovery_kills" -lt 10 ] || [ "$total_inside" -gt 0 ] ||
    fail "none of $total_recovery_kills kills of a recovering server landed inside its recovery"
echo "crash loop: total cycles=$total_cycles kills_inside_recovery=$total_inside" \
    "acknowledged_writes=$total_acked blocks_checked=$total_checked mismatches=0" \
    "(${SECONDS}s, seed $seed)"
