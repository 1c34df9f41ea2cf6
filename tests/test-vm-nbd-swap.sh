#!/usr/bin/env bash
# The real use, in a guest: the kernel's nbd driver swaps to nbdkit and
# the plugin running on the same (virtual) machine, so the server is
# starved by the very memory pressure it relieves.  (tests/test-vm-swap.sh
# swaps through QEMU's NBD client instead: the server runs on the host.)
#
# A Linux guest under QEMU (TCG) boots Debian's kernel with an initramfs
# (tests/make-initramfs.sh) holding busybox, nbdkit, the plugin,
# nbd-client, nbd.ko, every shared library they need, and the workload
# (tests/vm-nbd/touch.c) built here statically.  The root is ramfs, so
# the server's code cannot be swapped out to itself.  tests/vm-nbd/init
# sets up swap with the one command a user runs, `nbdkit-zramctl swap on`
# (the build's tools/nbdkit-zram-swap: vm.min_free_kbytes, nbdkit with
# swap=on, mem_limit, stats and ctl under /run, `nbd-client -unix SOCK
# /dev/nbd0 -b 4096 -swap`, mkswap, swapon with discard of freed pages),
# then starts at once a tmpfs fill and anonymous memory touchers: 2.25 times the
# guest's RAM by default, every page written with a pattern that
# compresses like ordinary data (8:1 with lz4, 9:1 with zstd) and
# verified twice.
#
# Hangs: a watchdog in the guest (tests/vm-nbd/watchdog.c: locked in
# memory, SCHED_FIFO 99) dumps blocked tasks, the CPUs' backtraces, memory
# and all tasks with sysrq (w, l, m, t) and says HANG when the workload
# has not moved for ZRAM_VM_STALL seconds; and when the console shows
# nothing from the guest for longer (nothing inside can run), this script
# sends the same through QEMU's keyboard (monitor: sendkey alt-sysrq-w)
# and kills QEMU.
#
# One line says what happened:
#   RESULT: OK|HANG|OOM|FAIL  with swap used, pages verified, the pool's
#   peak (mem_used_max), reserve misses and the time
# followed, for a hang, by the blocked tasks' stacks (one per kind).
# Exit status: 0 for OK, 1 otherwise; 77 (skip) when qemu-system-x86_64,
# a kernel with nbd.ko, busybox-static, nbd-client, cpio or a static C
# compiler is missing, unless VM_REQUIRED is set.
#
# Slow (several minutes under TCG): not in `make check`; `make check-swap`
# runs lz4 and zstd with SWAP_MODE=on and reports SWAP_MODE=off.
#
# Environment:
#   COMP                 lz4 (default) or zstd
#   SWAP_MODE            on (default), try or off (the plugin's swap=,
#                        given to `swap on` after the recipe's)
#   ZRAM_VM_RT           run `swap on` (so nbdkit) at SCHED_RR: 1 for
#                        priority 50, or the priority; default: no (the
#                        plugin's swap=on takes SCHED_RR 1 itself)
#   ZRAM_VM_MIN_FREE_KB  `swap on --min-free-kbytes` (0: the kernel's
#                        value); default: the tool's floor, 12288
#   ZRAM_VM_MEM_MB       guest RAM (default 384)
#   ZRAM_VM_SIZE         the device (default 1G)
#   ZRAM_VM_MEM_LIMIT    the plugin's mem_limit (default 160M)
#   ZRAM_VM_FILL_MB      the tmpfs fill (default 480)
#   ZRAM_VM_FILLERS      in how many files, written at once (default 2)
#   ZRAM_VM_TOUCH_MB     each anonymous toucher (default 192)
#   ZRAM_VM_TOUCHERS     how many (default 2)
#   ZRAM_VM_DATA         how well the pages compress: 7.5 (default:
#                        8.1:1 with lz4, 9.1:1 with zstd), 1.5 (1.5:1
#                        with both), or vmtouch's own "-r RAND -x TEXT"
#   ZRAM_VM_EXPECT       ok (default): the run must end OK; recover (an
#                        overfill cell: a device too small for the data,
#                        or data that cannot fit in RAM at its ratio):
#                        OK, or OOM - a workload process killed - with the
#                        server alive, no page of the others wrong, and
#                        the workload never stalled longer than
#                        ZRAM_VM_RECOVER_S (default 30).  The fill's
#                        files are unlinked once open: a killed filler's
#                        pages go with it.  (Files left on the tmpfs
#                        outlive every process the OOM killer can kill:
#                        past RAM and the device, no machine, with swap
#                        or without, recovers from them.)
#   ZRAM_VM_TOOL_RESTARTABLE  1: the SIGTERM cases again with
#                        swap on --restartable (a supervisor, a standby,
#                        a region), and the supervisor SIGKILLed before a
#                        swap status (the server serves on, the standby
#                        orphaned, exit 1) and a swap off (its server and
#                        standby stopped)
#   ZRAM_VM_TOOL_CASES   1: before the workload, the swap tool's cases
#                        with the real driver (SIGTERM at five points of
#                        swap on, then swap off: nothing left; a killed
#                        server whose PID went to another process: status
#                        says gone, off does not signal it)
#   ZRAM_VM_TRACE_FAULTS 1: trace the server's page faults during the
#                        workload (the kernel's page_fault_user event) and
#                        print them grouped by thread and by code address,
#                        with the server's mappings to resolve them
#   ZRAM_VM_SMP          guest CPUs (default 2)
#   ZRAM_VM_SWAP_KIND    nbd (default): swap to the server as above;
#                        kernel: to the guest kernel's own zram, with the
#                        same COMP, SIZE, MEM_LIMIT and min_free_kbytes
#                        floor (bench/run-swap-vs-zram.sh compares them)
#   ZRAM_VM_SIDES_MB     before the workload, each side of swap alone:
#                        this many MiB pushed out at once and read back
#                        (vmtouch -o), twice; default 0 (not run)
#   ZRAM_VM_RESTARTS     server restarts in the middle of the workload:
#                        KIND@MIB words (restart, kill, kill2,
#                        standbykill, killrestart, cut, stop) done once MIB
#                        are swapped out (tests/vm-nbd/init)
#   ZRAM_VM_STANDBYS     with restarts: swap on's --standbys (default:
#                        the tool's: 2, 1 below 300 MiB of RAM)
#   ZRAM_VM_NO_NOTICE    1: the supervisor does not watch the driver's
#                        notices (tests/vm-nbd/init)
#   ZRAM_VM_RESTART_STALL_MAX_S  with restarts: the longest stall the
#                        workload may see (default 12 s; 16 s when the
#                        events have a kill2: two crashes in a row, the
#                        device waits out the request timeout twice)
#   ZRAM_VM_MAX_SECTORS_KB  the nbd queue's max_sectors_kb, set after
#                        swap on (default: the driver's, 128)
#   ZRAM_VM_TIMEOUT      seconds the whole QEMU run may take (default 900)
#   ZRAM_VM_STALL        the guest watchdog: seconds without progress
#                        (default 120)
#   ZRAM_VM_HOST_STALL   seconds without a line from the guest before this
#                        script sends sysrq itself (default 240)
#   ZRAM_VM_EXTRA        more plugin parameters
#   ZRAM_VM_HEARTBEAT_S  seconds between the watchdog's progress lines,
#                        each with the server's mm_stat as last read
#                        (default 30)
#   ZRAM_VM_NBD_CLIENT_EXTRA  more nbd-client arguments (e.g. -nonetlink)
#   ZRAM_VM_APPEND       more kernel command line
#   ZRAM_VM_LOG          keep the guest's console log at this path
#   ZRAM_VM_KERNEL, ZRAM_VM_MODULES, ZRAM_VM_BUSYBOX, ZRAM_VM_NBD_CLIENT
#                        the kernel (default: the newest /boot/vmlinuz-*),
#                        its modules, a static busybox, nbd-client
#   ZRAM_VM_SECOND_DEVICE  NAME:SIZE: a second swap device of the same
#                        server (device=), attached as /dev/nbd1 and
#                        swapped on after nbd0 (a lower priority); the
#                        run fails unless it took writes
#   ZRAM_VM_ADD_DEVICE   1: that device set up by swap on itself
#                        (add-device in swap.conf: attached, supervised
#                        and restarted with nbd0), not nbd-client
#   VM_REQUIRED          a missing tool fails instead of skipping
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"

COMP=${COMP:-lz4}
SWAP_MODE=${SWAP_MODE:-on}
RT=${ZRAM_VM_RT:-}
MIN_FREE_KB=${ZRAM_VM_MIN_FREE_KB:-}
VM_MEM_MB=${ZRAM_VM_MEM_MB:-384}
SIZE=${ZRAM_VM_SIZE:-1G}
MEM_LIMIT=${ZRAM_VM_MEM_LIMIT:-160M}
FILL_MB=${ZRAM_VM_FILL_MB:-480}
FILLERS=${ZRAM_VM_FILLERS:-2}
TOUCH_MB=${ZRAM_VM_TOUCH_MB:-192}
TOUCHERS=${ZRAM_VM_TOUCHERS:-2}
VM_SMP=${ZRAM_VM_SMP:-2}
SWAP_KIND=${ZRAM_VM_SWAP_KIND:-nbd}
SIDES_MB=${ZRAM_VM_SIDES_MB:-0}
VM_TIMEOUT=${ZRAM_VM_TIMEOUT:-900}
STALL=${ZRAM_VM_STALL:-120}
HOST_STALL=${ZRAM_VM_HOST_STALL:-240}
EXPECT=${ZRAM_VM_EXPECT:-ok}
RECOVER_S=${ZRAM_VM_RECOVER_S:-30}
case "${ZRAM_VM_DATA:-7.5}" in
    7.5) DATA= ;;
    1.5) DATA='-r 2048 -x 768' ;;
    -*) DATA=$ZRAM_VM_DATA ;;
    *) fail "ZRAM_VM_DATA=$ZRAM_VM_DATA: 7.5, 1.5 or vmtouch's options" ;;
esac
case "$EXPECT" in
    ok|recover) ;;
    *) fail "ZRAM_VM_EXPECT=$EXPECT: ok or recover" ;;
esac
case "$RT" in
    ''|0|no) RT= ;;
    1|yes) RT=50 ;;
esac

skip ()
{
    if [ -n "${VM_REQUIRED:-}" ]; then
        fail "$* (VM_REQUIRED is set)"
    fi
    echo "$TEST_NAME: SKIP: $*" >&2
    exit 77
}

# ---- what the guest needs ----------------------------------------------
command -v qemu-system-x86_64 >/dev/null 2>&1 ||
    skip "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"
command -v cpio >/dev/null 2>&1 || skip "cpio is not installed"

kernel=${ZRAM_VM_KERNEL:-}
if [ -z "$kernel" ]; then
    for k in $(printf '%s\n' /boot/vmlinuz-* | sort -V); do
        [ -r "$k" ] && kernel=$k
    done
    [ -n "$kernel" ] ||
        skip "no readable kernel image /boot/vmlinuz-* (apt-get install linux-image-amd64, or set ZRAM_VM_KERNEL)"
fi
[ -r "$kernel" ] || skip "kernel image $kernel is not readable"
modules=${ZRAM_VM_MODULES:-/lib/modules/${kernel##*/vmlinuz-}}
[ -r "$modules/modules.dep" ] ||
    skip "no modules for $kernel ($modules/modules.dep; set ZRAM_VM_MODULES)"
grep -Eq '/nbd\.ko' "$modules/modules.dep" ||
    grep -Eq '/nbd\.ko' "$modules/modules.builtin" 2>/dev/null ||
    skip "the kernel $kernel has no nbd driver"

busybox=${ZRAM_VM_BUSYBOX:-$(command -v busybox || :)}
[ -n "$busybox" ] || skip "busybox is not installed (apt-get install busybox-static)"
if ldd "$busybox" >/dev/null 2>&1; then
    skip "$busybox is not statically linked (apt-get install busybox-static)"
fi
nbd_client=${ZRAM_VM_NBD_CLIENT:-$(command -v nbd-client || :)}
[ -n "$nbd_client" ] || skip "nbd-client is not installed (apt-get install nbd-client)"

[ "$SANITIZERS" = no ] ||
    skip "a sanitizer build ($SANITIZERS): the guest has no sanitizer runtime"
nbdkit_bin=$(command -v "$NBDKIT" || :)
[ -n "$nbdkit_bin" ] || fail "no nbdkit $NBDKIT"

case "$COMP" in
    lz4|zstd) ;;
    *) fail "COMP=$COMP: lz4 or zstd" ;;
esac
case "$SWAP_KIND" in
    nbd) guest_modules=nbd ;;
    # zram's compressor comes from the kernel's crypto API: its module.
    kernel) guest_modules="nbd zram $COMP" ;;
    *) fail "ZRAM_VM_SWAP_KIND=$SWAP_KIND: nbd or kernel" ;;
esac
case "$SWAP_MODE" in
    on|try|off) ;;
    *) fail "SWAP_MODE=$SWAP_MODE: on, try or off" ;;
esac
"$NBDKIT" --dump-plugin "$PLUGIN" 2>/dev/null | grep -qx "zram_$COMP=yes" ||
    skip "the plugin was built without $COMP"

# The workload and the real-time wrapper, static: the guest has no libc
# of its own beyond what nbdkit and nbd-client bring.
command -v cc >/dev/null 2>&1 || skip "no C compiler (cc)"
for prog in touch rt watchdog conncut; do
    cc -static -O2 -o "$tmp/$prog" "$SRCDIR/tests/vm-nbd/$prog.c" 2>"$tmp/cc.log" ||
        { cat "$tmp/cc.log" >&2; skip "cc -static fails (apt-get install libc6-dev)"; }
done

# ---- the initramfs -------------------------------------------------------
cat > "$tmp/zram-vm.conf" <<EOF
COMP='$COMP'
SWAP_MODE='$SWAP_MODE'
SIZE='$SIZE'
MEM_LIMIT='$MEM_LIMIT'
FILL_MB='$FILL_MB'
FILLERS='$FILLERS'
TOUCH_MB='$TOUCH_MB'
TOUCHERS='$TOUCHERS'
RT_PRIO='$RT'
MIN_FREE_KB='$MIN_FREE_KB'
STALL_S='$STALL'
DEADLINE_S='$((VM_TIMEOUT - 120))'
HEARTBEAT_S='${ZRAM_VM_HEARTBEAT_S:-30}'
NBDKIT_EXTRA='${ZRAM_VM_EXTRA:-}'
NBD_CLIENT_EXTRA='${ZRAM_VM_NBD_CLIENT_EXTRA:-}'
DATA='$DATA'
TOOL_CASES='${ZRAM_VM_TOOL_CASES:-0}'
TOOL_RESTARTABLE='${ZRAM_VM_TOOL_RESTARTABLE:-0}'
FILL_UNLINK='$([ "$EXPECT" = recover ] && echo 1 || echo 0)'
TRACE_FAULTS='${ZRAM_VM_TRACE_FAULTS:-0}'
SWAP_KIND='$SWAP_KIND'
SIDES_MB='$SIDES_MB'
MAX_SECTORS_KB='${ZRAM_VM_MAX_SECTORS_KB:-}'
RESTARTS='${ZRAM_VM_RESTARTS:-}'
STANDBYS='${ZRAM_VM_STANDBYS:-}'
NO_NOTICE='${ZRAM_VM_NO_NOTICE:-}'
SECOND_DEVICE='${ZRAM_VM_SECOND_DEVICE:-}'
ADD_DEVICE='${ZRAM_VM_ADD_DEVICE:-}'
EOF
bash "$SRCDIR/tests/make-initramfs.sh" "$tmp/initramfs.cpio" "$modules" \
    "$busybox" "$SRCDIR/tests/vm-nbd/init" "$guest_modules" \
    "/etc/zram-vm.conf=$tmp/zram-vm.conf" \
    "/bin/nbdkit=$nbdkit_bin" \
    "/lib/nbdkit/nbdkit-zram-plugin.so=$PLUGIN" \
    "/sbin/nbd-client=$nbd_client" \
    "/bin/vmtouch=$tmp/touch" \
    "/bin/watchdog=$tmp/watchdog" \
    "/bin/rt=$tmp/rt" \
    "/bin/conncut=$tmp/conncut" \
    "/bin/nbdkit-zramctl=$BUILDDIR/tools/nbdkit-zramctl" \
    "/bin/nbdkit-zram-swap=$BUILDDIR/tools/nbdkit-zram-swap"

# ---- the guest -------------------------------------------------------------
# The guest's own lines come on its second serial port (log), apart from
# the kernel's console (kernel_log: a kernel message can land in the
# middle of a console line); once QEMU is gone the kernel's console is
# added to log, whose lines this script then reads.
log="$tmp/guest.log"
kernel_log="$tmp/console.log"
host_log="$tmp/host.log"
: > "$log"
: > "$kernel_log"
: > "$host_log"
has () { grep -aq "^ZRAM-VM: $1" "$log"; }
# A note of this script's, kept apart from the console (QEMU writes the
# file at its own offset) and added to it once QEMU is gone.
note () { echo "ZRAM-VM-HOST: $*" >> "$host_log"; }
# The host's own sysrq, through the guest's keyboard.
host_sysrq ()
{
    local k
    for k in "$@"; do
        note "sendkey alt-sysrq-$k"
        echo "sendkey alt-sysrq-$k" >&4
        sleep 10
    done
}

# run_guest: boot the guest, follow its console until it gives a result,
# hangs or runs out of time, and stop it.  Sets hang_by when this script
# (not the guest's watchdog) found the hang.
hang_by=
run_guest ()
{
    local append qemu_job deadline lines=0 last_progress t_hang='' n i mon_cat

    # The monitor on a pair of FIFOs (QEMU's pipe chardev): sendkey
    # needs no socket client.
    mkfifo "$tmp/mon.in" "$tmp/mon.out"
    exec 4<>"$tmp/mon.in"
    cleanup_add 'exec 4>&-'
    cat "$tmp/mon.out" > "$tmp/monitor.log" 2>/dev/null &
    mon_cat=$!
    cleanup_add "kill $mon_cat 2>/dev/null"

    append="console=ttyS0 rootfstype=ramfs rdinit=/init panic=-1 loglevel=4"
    append+=" sysrq_always_enabled mitigations=off init_on_alloc=0"
    append+=" ${ZRAM_VM_APPEND:-}"
    # No timeout(1) in between: $! must be QEMU's own PID, which the loop
    # below (and the cleanup) kills.
    qemu-system-x86_64 \
        -accel tcg -cpu max -smp "$VM_SMP" -m "$VM_MEM_MB" \
        -nodefaults -no-user-config -display none -no-reboot \
        -serial "file:$kernel_log" -serial "file:$log" \
        -chardev "pipe,id=mon0,path=$tmp/mon" -mon chardev=mon0,mode=readline \
        -kernel "$kernel" -initrd "$tmp/initramfs.cpio" -append "$append" \
        </dev/null >"$tmp/qemu.log" 2>&1 &
    qemu_job=$!
    cleanup_add "kill -9 $qemu_job 2>/dev/null"
    deadline=$((SECONDS + VM_TIMEOUT))
    last_progress=$SECONDS

    while :; do
        if has RESULT; then
            # The guest powers off.
            for ((i = 0; i < 60; i++)); do
                _alive "$qemu_job" || break
                sleep 1
            done
            break
        fi
        _alive "$qemu_job" || break
        if has 'HANG ' || has 'DEADLINE '; then
            [ -n "$t_hang" ] || t_hang=$SECONDS
            if has DUMPS-DONE || [ $((SECONDS - t_hang)) -ge 120 ]; then
                has DUMPS-DONE || note "the guest's watchdog did not finish its dumps"
                sleep 3
                break
            fi
        fi
        n=$(grep -ac '^ZRAM-VM: ' "$log" || :)
        if [ "$n" != "$lines" ]; then
            lines=$n
            last_progress=$SECONDS
        fi
        if [ -z "$t_hang" ] && [ $((SECONDS - last_progress)) -ge "$HOST_STALL" ]; then
            hang_by="the host: no line from the guest for $((SECONDS - last_progress)) s"
            host_sysrq w l m t
            break
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            hang_by="the host: no result within ${VM_TIMEOUT} s"
            host_sysrq w l m t
            break
        fi
        sleep 1
    done
    kill -9 "$qemu_job" 2>/dev/null || :
    wait "$qemu_job" 2>/dev/null || :
    [ -z "$hang_by" ] || note "hang detected by $hang_by"
    cat "$host_log" >> "$log"
    echo "ZRAM-VM-HOST: the kernel's console (the guest's ttyS0) follows" >> "$log"
    cat "$kernel_log" >> "$log"
}

t_boot=$SECONDS
if [ -n "${ZRAM_VM_REPLAY:-}" ]; then
    # Read a console log kept with ZRAM_VM_LOG instead of running a guest
    # (to work on what this script makes of one).
    cp "$ZRAM_VM_REPLAY" "$log"
    hang_by=$(sed -n 's/^ZRAM-VM-HOST: hang detected by //p' "$log" | tail -1)
else
    [ -z "${ZRAM_VM_LOG:-}" ] || cleanup_add 'cp "$log" "$ZRAM_VM_LOG"'
    run_guest
fi
t_end=$SECONDS

# ---- what the guest said -----------------------------------------------------
clean="$tmp/console.txt"
tr -d '\r' < "$log" > "$clean"
declare -A st=()
while IFS= read -r line; do
    line=${line#ZRAM-VM: stat }
    case "$line" in
        *": "*) st[${line%%: *}]=${line#*: } ;;
    esac
done < <(grep -a '^ZRAM-VM: stat ' "$clean")
field () { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<< "$1" | tail -1; }
mib () { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

result_line=$(grep -a '^ZRAM-VM: RESULT ' "$clean" | tail -1 || :)
result=$(awk '{ print $3 }' <<< "$result_line" || :)
if has 'HANG ' || [ -n "$hang_by" ]; then
    result=HANG
    [ -n "$hang_by" ] || hang_by="the guest's watchdog"
elif has 'DEADLINE '; then
    result=FAIL
    reason="too slow: the workload was still moving at the deadline (ZRAM_VM_TIMEOUT=$VM_TIMEOUT)"
fi
if [ -z "$result" ]; then
    result=FAIL
    if grep -aq 'Kernel panic' "$clean"; then
        reason="the guest's kernel panicked"
    else
        reason="QEMU exited without a result"
    fi
fi

pages=0 verified=0 bad=0
while IFS= read -r line; do
    pages=$((pages + $(field "$line" pages)))
    verified=$((verified + $(field "$line" verified)))
    bad=$((bad + $(field "$line" bad)))
done < <(grep -a '^ZRAM-VM: touch .*: done ' "$clean")
swap_kib=$(field "$result_line" swap_max_kib)
if [ -z "$swap_kib" ]; then
    swap_kib=$({ grep -a '^ZRAM-VM: \(wd\|HANG\|DEADLINE\) ' "$clean" || :; } | tail -1 |
               sed -n 's/.* swap_used_kib=\([0-9]*\).*/\1/p')
fi
guest_time=$(field "$result_line" time_s)
oom_lines=$(grep -ac 'invoked oom-killer' "$clean" || :)
# Page faults the server's threads took inside requests during the
# workload (the stats at the end less those just before it; with
# restarts, the last server's own, from its start).
faults_line=$(grep -a '^ZRAM-VM: faults before the workload: ' "$clean" | tail -1 || :)
write_faults=? read_faults=?
if [ -n "${ZRAM_VM_RESTARTS:-}" ] && [ -n "${st[swap_write_faults]:-}" ]; then
    write_faults="${st[swap_write_faults]}(last server)"
    read_faults=${st[swap_read_faults]}
elif [ -n "$faults_line" ] && [ -n "${st[swap_write_faults]:-}" ]; then
    write_faults=$(( ${st[swap_write_faults]} - $(field "$faults_line" write) ))
    read_faults=$(( ${st[swap_read_faults]} - $(field "$faults_line" read) ))
fi
knobs="swap=$SWAP_MODE"
[ "$SWAP_KIND" = nbd ] || knobs="kind=$SWAP_KIND"
[ -z "$RT" ] || knobs+=" rt=SCHED_RR:$RT"
[ -z "$MIN_FREE_KB" ] || knobs+=" min_free_kbytes=$MIN_FREE_KB"
[ -z "${ZRAM_VM_EXTRA:-}" ] || knobs+=" $ZRAM_VM_EXTRA"
[ -z "${ZRAM_VM_DATA:-}" ] || knobs+=" data=${ZRAM_VM_DATA// /}"
stall_max=$(field "$result_line" stall_max_s)
server=$(field "$result_line" server)
restarts=$(field "$result_line" restarts)
io_errors=$(field "$result_line" io_errors)
[ -z "${ZRAM_VM_RESTARTS:-}" ] || knobs+=" restarts=${ZRAM_VM_RESTARTS// /,}"
[ -z "${ZRAM_VM_STANDBYS:-}" ] || knobs+=" standbys=$ZRAM_VM_STANDBYS"
[ -z "${ZRAM_VM_NO_NOTICE:-}" ] || knobs+=" no_notice"
# The supervisor's figure of each restart ("down X s"), as the guest
# printed its lines.
downtimes=$(grep -a '^ZRAM-VM: restart ' "$clean" | grep -o 'reconnected, down [0-9.]* s' |
    awk '{ printf "%s%s", sep, $3; sep = "," }' || :)
# One crash costs the workload the request timeout (3 s), the takeover
# and the watchdog's 2 s samples on both sides: 12 s leaves TCG's noise
# room.  A kill2 kills the new server while the first crash's requests
# wait out their timeout, so the device is down for two timeouts in a
# row (seen: 14 s, when it landed in the swap-in phase, where every
# workload process needs the device; 4 s when some were still filling).
stall_default=12
case " ${ZRAM_VM_RESTARTS:-} " in *" kill2@"*) stall_default=16 ;; esac
RESTART_STALL_MAX_S=${ZRAM_VM_RESTART_STALL_MAX_S:-$stall_default}

cat <<EOF
$TEST_NAME: comp=$COMP $knobs; guest ${VM_MEM_MB} MiB RAM, ${VM_SMP} CPUs; device $SIZE, mem_limit $MEM_LIMIT; workload $FILL_MB MiB tmpfs ($FILLERS files) + $TOUCHERS x $TOUCH_MB MiB anonymous ($(awk -v a=$((FILL_MB + TOUCHERS * TOUCH_MB)) -v b="$VM_MEM_MB" 'BEGIN { printf "%.2f", a / b }')x RAM)
EOF
grep -a '^ZRAM-VM: \(tool \|restart\|dmesg\|swap off with memory short\|booted\|nbdkit:\|nbdkit threads:\|nbd0:\|server:\|kernel zram:\|vm\.min\|workload\|touch .*: \(done\|sides\)\|profile\|vmstat\|nbdkit .* gone\|HANG \|DEADLINE \|FAIL\)' "$clean" |
    sed 's/^ZRAM-VM: /  guest: /' || :
[ -z "$hang_by" ] || echo "  hang detected by $hang_by"
# At a hang the stats are the last the watchdog could read (the server's
# stats file sits on the guest's /run tmpfs, and may be swapped out).
{ grep -a '^ZRAM-VM: stats file' "$clean" || :; } | tail -1 | sed 's/^ZRAM-VM: /  /'
[ "${oom_lines:-0}" = 0 ] || echo "  the OOM killer was invoked $oom_lines times"
enospc=$(grep -ac 'Other side returned error (28)' "$clean" || :)
[ "${enospc:-0}" = 0 ] ||
    echo "  the device filled up: $enospc writes refused with ENOSPC (mem_limit $MEM_LIMIT)"
echo "RESULT: $result comp=$COMP $knobs" \
    "swap_used=$(mib $(( ${swap_kib:-0} * 1024 )))MiB" \
    "verified=$verified/$((pages * 2)) bad=$bad" \
    "pool_peak=$(mib "${st[mem_used_max]:-0}")MiB" \
    "reserve_misses=${st[reserve_misses]:-?}" \
    "orig_data=$(mib "${st[orig_data_size]:-0}")MiB" \
    "compr_data=$(mib "${st[compr_data_size]:-0}")MiB" \
    "failed_writes=${st[failed_writes]:-?}" \
    "write_faults=$write_faults read_faults=$read_faults" \
    "stack_faults=${st[swap_stack_faults]:-?} metadata_misses=${st[reserve_metadata_misses]:-?}" \
    "oom_kills_asked=${st[swap_full_oom_kills]:-?}" \
    "stall_max=${stall_max:-?}s server=${server:-?}" \
    "workload_time=${guest_time:-?}s workload_time_cs=$(field "$result_line" time_cs)" \
    "qemu_time=$((t_end - t_boot))s" \
    ${ZRAM_VM_RESTARTS:+"restarts=${restarts:-?} downtimes=${downtimes:-none} io_errors=${io_errors:-?} oom_kills=$(field "$result_line" oom_kills)"}

# ---- for a hang: who is stuck where ----------------------------------------
# Each task of the sysrq dumps (w: blocked, l: on a CPU, t: all; only the
# workload's, the server's, the client's, the watchdog's and reclaim's
# threads) with the top of its stack, identical ones counted once.
if [ "$result" != OK ] && ! [ "$result:$EXPECT" = OOM:recover ]; then
    echo "--- tasks in the sysrq dumps (count x dump: task state: frames) ---"
    awk '
        { sub(/^\[ *[0-9.]+\] /, "") }
        /sysrq: Show Blocked State/ { dump = "w"; intask = 0; next }
        /sysrq: Show backtrace of all active CPUs/ { dump = "l"; intask = 0; next }
        /sysrq: Show State/ { dump = "t"; intask = 0; next }
        /sysrq: Show Memory/ { dump = ""; intask = 0; next }
        function start(n, s) {
            name = n; state = s; frames = ""; nf = 0; intask = 1; rip = ""
            keep = (name ~ /^(nbdkit|vmtouch|watchdog|nbd-client|kswapd|init$|kworker.*nbd|knbd)/)
        }
        dump != "" && /^task:/ {
            n = $1; sub(/^task:/, "", n); s = $2; sub(/^state:/, "", s)
            start(n, s); next
        }
        dump == "l" && /^CPU: [0-9]+ PID: [0-9]+ Comm: / { start($6, "on-cpu"); next }
        intask && /^RIP: 0010:/ { rip = $2; sub(/^0010:/, "", rip); sub(/\+0x.*/, "", rip) }
        intask && /^ <TASK>/ && dump == "l" {
            frames = rip == "" ? "" : "RIP " rip; nf = rip == "" ? 0 : 1; next
        }
        intask && /<\/TASK>/ {
            if (keep) count[dump " " name " " state ": " frames]++
            intask = 0; next
        }
        intask && /^ [a-z_0-9.]+\+0x/ && nf < 14 {
            f = $1; sub(/\+0x.*/, "", f)
            if (f !~ /^(__schedule|schedule|__switch_to_asm|ret_from_fork)$/) {
                frames = frames (nf ? " < " : "") f; nf++
            }
        }
        END { for (k in count) printf "%3d x %s\n", count[k], k }
    ' "$clean" | sort -k3,3 -k4,4 | head -60
    marker="^ZRAM-VM-HOST: the kernel's console"
    echo "--- the guest's lines (last 20) ---"
    sed "/$marker/,\$d" "$clean" | grep -av '^ZRAM-VM: touch .*MiB$' | tail -20
    echo "--- the guest's kernel console (last 30 lines) ---"
    sed "1,/$marker/d" "$clean" | tail -30
    echo "---"
fi

tool_failures=$(grep -ac '^ZRAM-VM: tool .*: FAIL' "$clean" || :)
[ "${tool_failures:-0}" = 0 ] || fail "$tool_failures of the swap tool's cases failed"
if [ "${ZRAM_VM_TOOL_CASES:-0}" != 0 ]; then
    tool_ok=$(grep -ac '^ZRAM-VM: tool .*: ok$' "$clean" || :)
    tool_cases=$([ "${ZRAM_VM_TOOL_RESTARTABLE:-0}" = 0 ] && echo 6 || echo 12)
    [ "$tool_ok" = "$tool_cases" ] ||
        fail "$tool_ok of the swap tool's $tool_cases cases said ok"
fi
case "$result:$EXPECT" in
    OOM:recover)
        [ "$server" = alive ] || fail "RESULT OOM: the server is gone"
        [ "$bad" = 0 ] || fail "RESULT OOM: $bad page checks failed"
        [ -n "$stall_max" ] && [ "$stall_max" -le "$RECOVER_S" ] ||
            fail "RESULT OOM, but the workload stalled for ${stall_max:-?} s (at most $RECOVER_S)"
        echo "ok: comp=$COMP $knobs: full, recovered: a workload process killed, the server alive, the others' pages verified, never stalled more than $stall_max s" ;;
    OK:*)
        [ "$bad" = 0 ] && [ "$verified" = $((pages * 2)) ] && [ "$pages" -gt 0 ] ||
            fail "RESULT OK but $verified of $((pages * 2)) page checks passed"
        [ "${swap_kib:-0}" -gt $((64 << 10)) ] ||
            fail "RESULT OK but the guest swapped only $(mib $(( ${swap_kib:-0} * 1024 ))) MiB (64 MiB at least): the workload is too small"
        # Restarts: the workload's longest stall within a bound (a crash's
        # requests are sent again after the request timeout, 3 s: a stall
        # of 30 s and more was each kill's before; the bound leaves TCG's
        # noise room), and the downtime the supervisor reported within a
        # few seconds of it (its figure and the watchdog's, whole seconds).
        if [ -n "${ZRAM_VM_RESTARTS:-}" ]; then
            [ -n "$stall_max" ] && [ "$stall_max" -le "$RESTART_STALL_MAX_S" ] ||
                fail "RESULT OK, but the workload stalled for ${stall_max:-?} s across the restarts (at most $RESTART_STALL_MAX_S)"
            echo "ok: comp=$COMP $knobs: the longest stall the workload saw: $stall_max s; downtimes reported: ${downtimes:-none}"
        fi
        echo "ok: comp=$COMP $knobs: swapped, every page verified twice" ;;
    FAIL:*) fail "${reason:-the guest failed}" ;;
    *) fail "$result" ;;
esac
