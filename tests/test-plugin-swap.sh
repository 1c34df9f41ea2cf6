#!/usr/bin/env bash
# Swap mode.  Refusals: swap=on without mem_limit, without
# CAP_SYS_RESOURCE, with a finite RLIMIT_MEMLOCK and no CAP_IPC_LOCK, each
# naming what is missing; a bad swap= value; swap_reserve= without swap.
# naming what is missing, without CAP_SYS_NICE and RLIMIT_RTPRIO
# (SCHED_RR).
# Serving: swap=try (and swap=on where this process has CAP_SYS_RESOURCE)
# locks memory, reports from a worker thread whether it is an IO flusher,
# has a populated reserve before the first write and keeps it with
# nothing stored, says in the stats what it got (memory locked, IO
# flusher), logs its start line as an error only when it serves without
# something (naming it: SCHED_RR refused here) and as a debug line (-v)
# when all was had, and gives the
# memory of trimmed data back
# (RSS within 16 MiB of idle, outside sanitizer builds); nbdkit --swap
# without swap= gives it back too.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh setpriv prlimit

# A capability of this shell's effective set (bit number).
has_capability ()
{
    local effective
    effective=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
    (( (16#$effective >> $1) & 1 ))
}
CAP_IPC_LOCK=14 CAP_SYS_RESOURCE=24

# expect_refusal PATTERN ARGS...: the server must not start, and its
# message must match PATTERN.
expect_refusal ()
{
    local pattern="$1"; shift
    if zram_nbdkit "$PLUGIN" 1M "$@" --run true; then
        fail "started with $*"
    fi
    grep -Eq "$pattern" "$NBDKIT_STDERR" \
        || fail "with $*: the message does not say '$pattern'"
}

expect_refusal 'swap=on needs mem_limit' swap=on
expect_refusal 'swap=try needs mem_limit' swap=try
expect_refusal "swap: 'always' is not one of on\|try\|off" swap=always mem_limit=1M
expect_refusal 'swap_reserve: only with swap=on' swap_reserve=2M mem_limit=8M
expect_refusal 'swap_full: only with swap=on' swap_full=fail mem_limit=8M
expect_refusal "swap_full: 'kill' is not one of oom\|fail" swap=try swap_full=kill mem_limit=8M
expect_refusal 'swap_reserve: .* more than half of mem_limit' \
    swap=try swap_reserve=8M mem_limit=8M
# In whole 2 MiB units: 1M is 2M, more than half of 3M.
expect_refusal 'swap_reserve: 2097152 bytes .* more than half of mem_limit' \
    swap=try swap_reserve=1M mem_limit=3M

# The server without a capability, dropped from the bounding set (a root
# process has only what is in it), or with a small RLIMIT_MEMLOCK: the
# command before "--" runs the server, in the sanitizer environment.
expect_refusal_under ()
{
    local pattern="$1" prefix=()
    shift
    while [ "$1" != -- ]; do prefix+=("$1"); shift; done
    shift
    local err="$tmp/refusal.err"
    if env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} "${prefix[@]}" \
           "$NBDKIT" "$PLUGIN" 1M "$@" --run true 2>"$err"; then
        fail "started with $* under ${prefix[*]}"
    fi
    cat "$err" >&2
    ! grep -Eq "$SANITIZER_PATTERN" "$err" || fail "sanitizer report"
    grep -Eq "$pattern" "$err" \
        || fail "with $* under ${prefix[*]}: the message does not say '$pattern'"
}
if has_capability 8; then              # CAP_SETPCAP: may drop capabilities
    no_resource=(setpriv --bounding-set=-sys_resource --inh-caps=-sys_resource)
    no_ipc_lock=(setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock)
else
    # Then this user has neither capability unless given them on purpose.
    has_capability $CAP_SYS_RESOURCE \
        && fail "CAP_SYS_RESOURCE without CAP_SETPCAP: cannot drop it for the test"
    no_resource=(env) no_ipc_lock=(env)
fi
expect_refusal_under 'swap=on: cannot make .*PR_SET_IO_FLUSHER refused.*CAP_SYS_RESOURCE.*oom_score_adj' \
    "${no_resource[@]}" -- swap=on mem_limit=8M
expect_refusal_under 'swap=on: cannot make .*RLIMIT_MEMLOCK is 64 KiB and there is no CAP_IPC_LOCK' \
    "${no_ipc_lock[@]}" prlimit --memlock=65536 -- swap=on mem_limit=8M
if has_capability 8; then
    no_nice=(setpriv --bounding-set=-sys_nice --inh-caps=-sys_nice)
else
    has_capability 23 && fail "CAP_SYS_NICE without CAP_SETPCAP: cannot drop it for the test"
    no_nice=(env)
fi
expect_refusal_under 'swap=on: cannot make .*SCHED_RR refused \(it needs CAP_SYS_NICE, or RLIMIT_RTPRIO of at least 1' \
    "${no_nice[@]}" prlimit --rtprio=0 -- swap=on mem_limit=8M

# ---- serving ---------------------------------------------------------
cat > "$tmp/serve.py" <<'EOF'
import os, random, sys, time, nbd

sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from stats_file import next_stat

stats_path, mode, uri = sys.argv[1], sys.argv[2], sys.argv[3]
flusher_expected = int(sys.argv[4])      # -1: not looked at (no swap=)
locked_expected = sys.argv[5] == "yes"
check_rss = sys.argv[6] == "yes"
def stat(name):
    return next_stat(stats_path, name)
def server_status(key):
    # The server: the parent of the shell nbdkit's --run started.
    shell = os.getppid()
    with open("/proc/%d/stat" % shell) as f:
        server = int(f.read().rsplit(")", 1)[1].split()[1])
    # Under ThreadSanitizer's runtime --run's shell is not the server's
    # child (it runs the command another way): then None.
    if not os.path.basename(os.readlink("/proc/%d/exe" % server)).startswith("nbdkit"):
        return None
    with open("/proc/%d/status" % server) as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split()[1]
    return None
def stat_text(name):
    stat("process_rss")                    # a fresh file
    for line in open(stats_path):
        key, _, value = line.strip().partition(": ")
        if key == name:
            return value
    raise AssertionError("no %s" % name)

B = 4096
BLOCKS = 8192                              # 32 MiB
idle = stat("process_rss")
# Swap mode: the reserve is there before the first write (the first
# swap-out found it empty).
if mode != "off":
    assert stat("reserve_bytes") > 0, "no reserve before the first write"
h = nbd.NBD(); h.connect_uri(uri)
r = random.Random(1)
data = {}
for i in range(BLOCKS):
    data[i] = (r.randbytes(1800) * 3)[:B]
    h.pwrite(data[i], i * B)
for i in range(0, BLOCKS, 97):
    assert h.pread(B, i * B) == data[i], "block %d" % i
full = stat("process_rss")
assert stat_text("swap_mode") == mode, stat_text("swap_mode")
flusher = stat("swap_io_flusher_worker")
assert flusher == flusher_expected, \
    "worker thread IO flusher %d, expected %d" % (flusher, flusher_expected)
locked = stat("swap_locked_bytes")
assert (locked > 0) == locked_expected, "locked bytes %d" % locked
# What swap mode got at start, without -v: in the stats (off: nothing).
if mode == "off":
    assert stat("swap_io_flusher") == 0 and stat("swap_memory_locked") == 0
else:
    assert stat("swap_io_flusher") == flusher_expected, \
        "swap_io_flusher %d, expected %d" % (stat("swap_io_flusher"), flusher_expected)
    if locked_expected:
        assert stat("swap_memory_locked") == 1, "swap_memory_locked 0 with memory locked"
reserve, misses = stat("reserve_bytes"), stat("reserve_misses")
if mode != "off":
    assert reserve > 0, "no swap reserve"
if mode == "on":
    assert stat("swap_oom_score_adj") == -1000
# Swap mode: no transparent huge pages (khugepaged's collapses fault
# requests); without it, the system's default.
thp = server_status("THP_enabled")
if thp is None:
    print("THP_enabled: the server is not this process's grandparent here (a wrapper, or TSan): not looked at")
elif mode != "off":
    assert thp == "0", "swap=%s: THP_enabled %s" % (mode, thp)
h.trim(BLOCKS * B, 0)
time.sleep(2.5)
after = stat("process_rss")
# Nothing stored: swap mode keeps its reserve for the next swap-out.
if mode != "off":
    assert stat("reserve_bytes") > 0, "reserve given back"
else:
    assert stat("reserve_bytes") == 0, "a reserve without swap mode"
print("swap=%s: RSS idle %.1f MiB, with 32 MiB stored %.1f MiB, 2.5 s after "
      "trimming it all %.1f MiB; locked %.0f MiB (resident); reserve %.0f MiB, "
      "%d misses; worker IO flusher %d"
      % (mode, idle / 2**20, full / 2**20, after / 2**20, locked / 2**20,
         reserve / 2**20, misses, flusher))
assert full > idle + 8 * 2**20, "the data did not show in RSS"
if check_rss:
    assert after <= idle + 16 * 2**20, \
        "RSS %.1f MiB after the trim, idle %.1f MiB" % (after / 2**20, idle / 2**20)
h.shutdown()
EOF

check_rss=no
[ "$SANITIZERS" = no ] && check_rss=yes
# The sanitizer runtimes make mlockall a no-op.
can_lock=no
if [ "$SANITIZERS" = no ] \
       && { has_capability $CAP_IPC_LOCK || [ "$(ulimit -l)" = unlimited ]; }; then
    can_lock=yes
fi
flusher=0
has_capability $CAP_SYS_RESOURCE && flusher=1
stats="$tmp/stats"
zram_nbdkit -U - "$PLUGIN" 64M swap=try mem_limit=64M stats="$stats" \
    --run "python3 '$tmp/serve.py' '$stats' try \"\$uri\" $flusher $can_lock $check_rss"
if [ "$flusher" = 0 ]; then
    grep -q 'swap=try: going on without: PR_SET_IO_FLUSHER refused' "$NBDKIT_STDERR" \
        || fail "swap=try did not warn about what it went without"
fi
# The start line: an error only for what swap=try serves without (as the
# stats, read as it stopped, say), each named; all had: no error at all
# (it is a debug line, -v, below).
stat_of () { awk -v k="$1:" '$1 == k { print $2 }' "$stats"; }
without=
[ "$(stat_of swap_memory_locked)" = 1 ] || without="$without memory"
[ "$(stat_of swap_realtime_priority)" != 0 ] || without="$without real-time"
[ "$(stat_of swap_io_flusher)" = 1 ] || without="$without io-flusher"
[ "$(stat_of swap_oom_score_adj)" = -1000 ] || without="$without oom"
if [ -z "$without" ]; then
    ! grep -E 'error: .*swap=try: (memory|serving without)' "$NBDKIT_STDERR" ||
        fail "swap=try with all it asks for logged its start at error level"
else
    grep -Eq "error: zram: warning: swap=try: serving without: .*\.  Reserve of [1-9][0-9]* MiB populated, [1-9][0-9]* MiB of table, contexts and heap made ready" \
        "$NBDKIT_STDERR" || fail "swap=try without$without did not say so at start"
    for missing in $without; do
        case $missing in
            memory) pattern='memory locked as it is touched' ;;
            real-time) pattern='real-time priority \(SCHED_RR\)' ;;
            io-flusher) pattern='IO flusher' ;;
            oom) pattern='oom_score_adj -1000' ;;
        esac
        grep -Eq "serving without: ([^.]*; )?$pattern" "$NBDKIT_STDERR" ||
            fail "swap=try without $missing: its start line does not name it"
    done
fi

# serve_briefly PATTERN PREFIX... -- ARGS...: a swap=try server (in the
# foreground, without --run: nbdkit's --run shell crashes with
# ThreadSanitizer's runtime preloaded) run under PREFIX until its stderr
# ($tmp/brief.err) matches PATTERN (10 s at most), then stopped.
serve_briefly ()
{
    local pattern="$1" prefix=() server i
    shift
    while [ "$1" != -- ]; do prefix+=("$1"); shift; done
    shift
    rm -f "$tmp/brief.sock"
    env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} "${prefix[@]}" \
        "$NBDKIT" -f -U "$tmp/brief.sock" "$@" 2>"$tmp/brief.err" &
    server=$!
    for i in $(seq 100); do
        ! grep -Eq "$pattern" "$tmp/brief.err" || break
        kill -0 "$server" 2>/dev/null || break
        sleep 0.1
    done
    kill "$server" 2>/dev/null || :
    wait "$server" || :
    grep -Eq "$pattern" "$tmp/brief.err" ||
        { cat "$tmp/brief.err" >&2; fail "${prefix[*]} nbdkit $*: no line matching '$pattern'"; }
}
# With -v, the start line is there as a debug line: what was done.
if [ -z "$without" ]; then
    serve_briefly 'swap=try: (memory locked|serving without)' env -- \
        -v "$PLUGIN" 64M swap=try mem_limit=64M
    grep -Eq 'debug: zram: swap=try: memory locked as it is touched, reserve of [1-9][0-9]* MiB populated, [1-9][0-9]* MiB of table, contexts and heap made ready, real-time, IO flusher, oom_score_adj -1000' \
        "$tmp/brief.err" || fail "swap=try -v: no debug line saying what was done at start"
    ! grep -Eq 'error: .*swap=try: (memory|serving without)' "$tmp/brief.err" ||
        fail "swap=try -v with all it asks for logged its start at error level"
    echo "ok: all as asked: the start line is a debug line"
fi
# Without a real-time priority (no CAP_SYS_NICE, RLIMIT_RTPRIO 0):
# swap=try serves, and its start line is an error naming it.
serve_briefly 'swap=try: serving without' "${no_nice[@]}" prlimit --rtprio=0 -- \
    "$PLUGIN" 64M swap=try mem_limit=64M
grep -Eq 'error: zram: warning: swap=try: serving without: ([^.]*; )?real-time priority \(SCHED_RR\)' \
    "$tmp/brief.err" || { cat "$tmp/brief.err" >&2; fail "swap=try without SCHED_RR: the start line does not name it"; }
echo "ok: swap=try without real-time: an error naming it"
# A real-time priority the server was started with (chrt) is kept.
# (In the foreground, without --run: nbdkit's --run shell crashes with
# ThreadSanitizer's runtime preloaded.)
if command -v chrt >/dev/null && chrt -r 5 true 2>/dev/null; then
    rm -f "$stats"
    env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} chrt -r 5 \
        "$NBDKIT" -f -U "$tmp/chrt.sock" "$PLUGIN" 64M swap=try mem_limit=64M \
        stats="$stats" 2>/dev/null &
    chrt_server=$!
    prio=
    for _ in $(seq 100); do
        prio=$(awk '$1 == "swap_realtime_priority:" { print $2 }' "$stats" 2>/dev/null || :)
        [ -z "$prio" ] || break
        sleep 0.1
    done
    kill "$chrt_server"
    wait "$chrt_server" || :
    [ "$prio" = 5 ] || fail "chrt -r 5: swap_realtime_priority is '$prio', not kept at 5"
    echo "ok: a priority given with chrt is kept"
fi
if [ "$can_lock" = yes ]; then
    # Captive: nbdkit --run serves from a process it forks after its
    # mlockall, which a fork does not inherit.
    ZRAM_CAPTIVE=1 zram_nbdkit --swap -U - "$PLUGIN" 64M stats="$stats" \
        --run "python3 '$tmp/serve.py' '$stats' off \"\$uri\" -1 yes $check_rss"
fi
if [ "$flusher" = 1 ]; then
    zram_nbdkit -U - "$PLUGIN" 64M swap=on mem_limit=64M stats="$stats" \
        --run "python3 '$tmp/serve.py' '$stats' on \"\$uri\" 1 $can_lock $check_rss"
    echo "ok: swap=on served with CAP_SYS_RESOURCE"
else
    echo "note: no CAP_SYS_RESOURCE here: swap=on was shown refusing, not serving"
fi
echo "ok: swap mode"
