#!/usr/bin/env bash
# A Linux guest under QEMU (TCG) swaps to the plugin's export: a virtio-blk
# disk with discard=unmap on nbd+unix, mkswap'd and swapon'd with discard
# of freed pages (tests/vm/init).  The guest fills a tmpfs well beyond its
# RAM with partly compressible files made from a template this script
# writes, reads every one back against the checksum this script computed,
# then removes them.  The test checks that:
#   - every checksum verified (the guest's PASS line);
#   - the swap was really used (more than 64 MiB, in the guest and in the
#     plugin's stored data);
#   - once the guest freed its swap, the discards reached the plugin as
#     trims (notify_free), the stored data (orig_data_size,
#     compr_data_size, mem_used_total) fell below 25 % of the peak, and
#     the server's RSS gave back at least half of what it had gained.
# A table of the figures goes to stdout (the test log).
#
# Slow (minutes under TCG): not in `make check`; `make check-vm` runs it
# with COMP=lz4 and COMP=zstd.  Needs qemu-system-x86_64, a kernel image
# with its modules, a static busybox and cpio; skips (77) without them.
#
# Environment:
#   COMP               lz4 (default) or zstd
#   ZRAM_VM_EXTRA      more plugin parameters (e.g. swap=try); default none
#   ZRAM_VM_KERNEL     the kernel (default: the newest readable
#                      /boot/vmlinuz-*)
#   ZRAM_VM_MODULES    its modules (default: /lib/modules/VERSION)
#   ZRAM_VM_BUSYBOX    a static busybox (default: busybox on PATH)
#   ZRAM_VM_MEM_MB     guest RAM (default 160)
#   ZRAM_VM_FILL_MB    what the guest writes to its tmpfs, in files of
#                      8 MiB (default 320)
#   ZRAM_VM_SMP        guest CPUs (default 2)
#   ZRAM_VM_TIMEOUT    seconds the whole QEMU run may take (default 900)
#   ZRAM_VM_APPEND     more kernel command line
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"

COMP=${COMP:-lz4}
ZRAM_VM_EXTRA=${ZRAM_VM_EXTRA:-}
VM_MEM_MB=${ZRAM_VM_MEM_MB:-160}
VM_FILL_MB=${ZRAM_VM_FILL_MB:-320}
VM_SMP=${ZRAM_VM_SMP:-2}
VM_TIMEOUT=${ZRAM_VM_TIMEOUT:-900}
SIZE=512M
MEM_LIMIT=384M

skip ()
{
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

busybox=${ZRAM_VM_BUSYBOX:-$(command -v busybox || :)}
[ -n "$busybox" ] || skip "busybox is not installed (apt-get install busybox-static)"
if ldd "$busybox" >/dev/null 2>&1; then
    skip "$busybox is not statically linked (apt-get install busybox-static)"
fi

case "$COMP" in
    lz4|zstd) ;;
    *) fail "COMP=$COMP: lz4 or zstd" ;;
esac
"$NBDKIT" --dump-plugin "$PLUGIN" 2>/dev/null | grep -qx "zram_$COMP=yes" ||
    skip "the plugin was built without $COMP"

# The guest's data: a template of random bytes of which 7 in 8 are
# turned into 'a' (unique pages that lz4 keeps in about 2.4 times less
# memory, zstd in about 4 times), and the checksums of the files the
# guest makes of it: file K is the template rotated left by K * 1237
# bytes.  Computing them here spares the guest (TCG) all but the check.
file_mb=8
nfiles=$(((VM_FILL_MB + file_mb - 1) / file_mb))
mkdir "$tmp/data"
head -c $((file_mb << 20)) /dev/urandom | tr '\040-\377' a > "$tmp/data/template"
for ((k = 0; k < nfiles; k++)); do
    off=$((k * 1237))
    sum=$({ tail -c +$((off + 1)) "$tmp/data/template"
            head -c "$off" "$tmp/data/template"; } | md5sum)
    echo "${sum%% *}  /mnt/f$k $off"
done > "$tmp/data/sums"

bash "$SRCDIR/tests/make-initramfs.sh" "$tmp/initramfs.cpio" "$modules" \
    "$busybox" "$SRCDIR/tests/vm/init" "virtio_pci virtio_blk" \
    "/data/template=$tmp/data/template" "/data/sums=$tmp/data/sums"

# ---- the server --------------------------------------------------------
sock="$tmp/sock"
pidfile="$tmp/nbdkit.pid"
stats="$tmp/stats"
log="$tmp/console.log"
t_start=$SECONDS

# In the foreground, in the background of this shell: zram_nbdkit checks
# its stderr for sanitizer reports once it exits (we stop it at the end).
# shellcheck disable=SC2086   # ZRAM_VM_EXTRA: words
NBDKIT_TIMEOUT=$((VM_TIMEOUT + 300)) \
    zram_nbdkit -f -U "$sock" -P "$pidfile" "$PLUGIN" "$SIZE" comp="$COMP" \
    mem_limit="$MEM_LIMIT" stats="$stats" $ZRAM_VM_EXTRA &
server_job=$!
cleanup_add '[ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null'
for ((i = 0; i < 300; i++)); do
    [ -s "$pidfile" ] && [ -S "$sock" ] && break
    _alive "$server_job" || break
    sleep 0.1
done
[ -s "$pidfile" ] && [ -S "$sock" ] || fail "nbdkit did not start"
server_pid=$(cat "$pidfile")

# The next stats file the plugin writes (it comes every second), as
# st[key]=value; and the server's RSS in bytes, as rss.
declare -A st
sample ()
{
    local i line
    rm -f "$stats"
    for ((i = 0; i < 50; i++)); do
        [ -s "$stats" ] && break
        sleep 0.1
    done
    [ -s "$stats" ] || fail "no stats file from the plugin within 5 s"
    st=()
    while IFS= read -r line; do
        case "$line" in
            *": "*) st[${line%%: *}]=${line#*: } ;;
        esac
    done < "$stats"
    rss=$(awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$server_pid/status")
}
mib () { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

sample
idle_rss=$rss

# ---- the guest ---------------------------------------------------------
# The console: output to $log, input from a FIFO that we hold open for
# reading and writing (so that neither side blocks or sees EOF).
mkfifo "$tmp/console.in"
exec 3<>"$tmp/console.in"
cleanup_add 'exec 3>&-'

append="console=ttyS0 panic=-1 loglevel=4 mitigations=off init_on_alloc=0"
append+=" ${ZRAM_VM_APPEND:-}"
t_boot=$SECONDS
timeout -s KILL "$VM_TIMEOUT" qemu-system-x86_64 \
    -accel tcg -cpu max -smp "$VM_SMP" -m "$VM_MEM_MB" \
    -nodefaults -no-user-config -display none -serial stdio -no-reboot \
    -kernel "$kernel" -initrd "$tmp/initramfs.cpio" -append "$append" \
    -drive "file=nbd+unix:///?socket=$sock,format=raw,if=none,id=d0,discard=unmap,cache=none" \
    -device virtio-blk-pci,drive=d0 \
    <&3 >"$log" 2>&1 &
qemu_job=$!
cleanup_add 'kill -9 "$qemu_job" 2>/dev/null'
deadline=$((SECONDS + VM_TIMEOUT))

console_tail ()
{
    echo "--- guest console (last 40 lines) ---" >&2
    grep -v '^ZRAM-VM: sum ' "$log" | tail -40 | tr -d '\r' >&2 || :
    echo "---" >&2
}

# wait_for WORD: until the guest prints "ZRAM-VM: WORD" (WORD: an
# extended regular expression); the line.
wait_for ()
{
    local line
    while :; do
        line=$(grep -aE "^ZRAM-VM: ($1)" "$log" | tail -1 | tr -d '\r') || :
        [ -z "$line" ] || { printf '%s\n' "$line"; return 0; }
        if grep -aq '^ZRAM-VM: FAIL' "$log"; then
            console_tail
            fail "guest: $(grep -a '^ZRAM-VM: FAIL' "$log" | head -1 | tr -d '\r')"
        fi
        if ! _alive "$qemu_job"; then
            console_tail
            fail "QEMU exited before the guest printed $1"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            console_tail
            fail "no $1 from the guest within ${VM_TIMEOUT}s"
        fi
        sleep 0.5
    done
}

# field LINE NAME: NAME=value in a guest line.
field () { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<< "$1"; }

line=$(wait_for PEAK)
t_peak=$SECONDS
sample
declare -A peak
for k in "${!st[@]}"; do peak[$k]=${st[$k]}; done
peak_rss=$rss
swap_used=$(( $(field "$line" swap_used_kib) * 1024 ))
echo go >&3

wait_for FREED >/dev/null
t_freed=$SECONDS
# Give the discards time to arrive and the plugin time to give memory
# back (the housekeeper runs every second): wait until the figures are
# where they must be, 20 s at most, and judge the last sample.
for ((i = 0; i < 20; i++)); do
    sample
    if [ $((st[orig_data_size] * 4)) -lt "${peak[orig_data_size]}" ] &&
       [ $((st[mem_used_total] * 4)) -lt "${peak[mem_used_total]}" ] &&
       [ $(((peak_rss - rss) * 2)) -ge $((peak_rss - idle_rss)) ]; then
        break
    fi
done
after_rss=$rss
echo go >&3

result=$(wait_for 'PASS|FAIL')
rc=0
wait "$qemu_job" || rc=$?
t_end=$SECONDS
[ "$rc" = 0 ] || { console_tail; fail "QEMU exited with status $rc (137: killed after ${VM_TIMEOUT}s)"; }

# Stop the server: its exit status (and sanitizer reports) count.
kill "$server_pid"
rc=0
wait "$server_job" || rc=$?
[ "$rc" = 0 ] || fail "nbdkit exited with status $rc"

# ---- the figures ---------------------------------------------------------
written=$(grep -a '^ZRAM-VM: written:' "$log" | tr -d '\r' | sed 's/^ZRAM-VM: //')
verified=$(grep -a '^ZRAM-VM: verified:' "$log" | tr -d '\r' | sed 's/^ZRAM-VM: //')
cat <<EOF
$TEST_NAME: comp=$COMP ${ZRAM_VM_EXTRA:+($ZRAM_VM_EXTRA) }guest ${VM_MEM_MB} MiB RAM, ${VM_SMP} CPUs, $((nfiles * file_mb)) MiB written to tmpfs
  guest: $written
  guest: $verified
  guest: $result
                          peak       after free
  swap used (guest)   $(printf '%8s MiB' "$(mib "$swap_used")")
  orig_data_size      $(printf '%8s MiB   %8s MiB' "$(mib "${peak[orig_data_size]}")" "$(mib "${st[orig_data_size]}")")
  compr_data_size     $(printf '%8s MiB   %8s MiB' "$(mib "${peak[compr_data_size]}")" "$(mib "${st[compr_data_size]}")")
  mem_used_total      $(printf '%8s MiB   %8s MiB' "$(mib "${peak[mem_used_total]}")" "$(mib "${st[mem_used_total]}")")
  mem_used_max        $(printf '%8s MiB' "$(mib "${st[mem_used_max]}")")
  compression_ratio   $(printf '%8s       %8s' "${peak[compression_ratio]}" "${st[compression_ratio]}")
  memory_ratio        $(printf '%8s       %8s' "${peak[memory_ratio]}" "${st[memory_ratio]}")
  notify_free (trims) $(printf '%8s       %8s' "${peak[notify_free]}" "${st[notify_free]}")
  writes / reads      $(printf '%8s       %8s' "${st[writes]}" "${st[reads]}")
  failed writes       $(printf '%8s' "${st[failed_writes]}")
  nbdkit RSS          idle $(mib "$idle_rss") MiB, peak $(mib "$peak_rss") MiB, after free $(mib "$after_rss") MiB
  time                boot to PEAK $((t_peak - t_boot)) s, PEAK to FREED $((t_freed - t_peak)) s, QEMU $((t_end - t_boot)) s, test $((t_end - t_start)) s
EOF

# ---- the verdict ---------------------------------------------------------
case "$result" in
    "ZRAM-VM: PASS"*) ;;
    *) console_tail; fail "the guest did not verify its files: ${result:-no PASS line}" ;;
esac
[ "$swap_used" -gt $((64 << 20)) ] ||
    fail "the guest used only $(mib "$swap_used") MiB of swap (64 MiB at least)"
[ "${peak[orig_data_size]}" -gt $((64 << 20)) ] ||
    fail "the plugin held only $(mib "${peak[orig_data_size]}") MiB at the peak (64 MiB at least)"
[ "${st[failed_writes]}" = 0 ] || fail "${st[failed_writes]} failed writes"
[ "${st[notify_free]}" -gt "${peak[notify_free]}" ] ||
    fail "no trim reached the plugin after the guest freed its swap (notify_free ${st[notify_free]})"
for k in orig_data_size compr_data_size mem_used_total; do
    [ $((st[$k] * 4)) -lt "${peak[$k]}" ] ||
        fail "$k after the free: $(mib "${st[$k]}") MiB, not below 25 % of the peak's $(mib "${peak[$k]}") MiB"
done
# Sanitizer runtimes keep freed memory (quarantine, shadow): RSS says
# nothing about the plugin there.
if [ "${SANITIZERS:-no}" = no ]; then
    [ $(((peak_rss - after_rss) * 2)) -ge $((peak_rss - idle_rss)) ] ||
        fail "nbdkit RSS $(mib "$after_rss") MiB after the free: gave back less than half of the $(mib $((peak_rss - idle_rss))) MiB it gained (idle $(mib "$idle_rss"), peak $(mib "$peak_rss"))"
fi
echo "ok: comp=$COMP: the guest swapped $(mib "$swap_used") MiB to the plugin, verified it, and the freed swap came back to the host"
