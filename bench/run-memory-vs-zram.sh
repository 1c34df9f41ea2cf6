#!/usr/bin/env bash
# Memory per GiB stored against the kernel's own zram: the same memory
# image written into /dev/zram0 in a QEMU guest (Debian's kernel and
# zram.ko, the given comp at the kernel's default level), and into this
# plugin on the host (after `idle all` and the default `pack type=idle`,
# as bench/run-memory-account.sh does, which also gives the peer
# `nbdkit memory allocator=zstd`).
#
# What each side costs:
#   kernel zram  mm_stat's mem_used_total (the zsmalloc pool's pages)
#                and all-in: those pages, and what the kernel's slab
#                caches (zsmalloc's handles and zspage descriptors) and
#                vmalloc (zram's table, 16 bytes a slot in 6.1) grew by
#                from before the device was made to after the write
#                (/proc/meminfo's Slab and VmallocUsed; MemFree moves
#                with the page cache and the initramfs, too noisy);
#   nbdkit-zram  the server's RSS, and its `memory` account; the all-in
#                figure is RSS (what a machine gives the process).
# Ratios are image bytes over each; ours over the kernel's.
#
#   bench/run-memory-vs-zram.sh            # a minute or two under TCG
#
# Environment: IMAGE (a memory image; made with make-memory-image.sh if
# missing), IMAGE_MIB (256), COMP (zstd), LEVEL (ours; default the
# kernel's: zstd 3, lz4 1), REPEATS (3, guest and host
# alternating), ZRAM_VM_KERNEL, ZRAM_VM_MODULES, ZRAM_VM_BUSYBOX (as
# tests/test-vm-swap.sh), VM_MEM_MB (guest RAM, default 3 x the image
# and 256 MiB more).
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"

IMAGE_MIB=${IMAGE_MIB:-256}
IMAGE=${IMAGE:-${TMPDIR:-/tmp}/nbdkit-zram-memimage-${IMAGE_MIB}M.img}
COMP=${COMP:-zstd}
REPEATS=${REPEATS:-3}
case "$COMP" in zstd) LEVEL=${LEVEL:-3} ;; *) LEVEL=${LEVEL:-1} ;; esac

die () { echo "run-memory-vs-zram: $*" >&2; exit 1; }
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: build first"
for prog in qemu-system-x86_64 cpio "$NBDKIT" nbdcopy /usr/bin/python3; do
    command -v "$prog" >/dev/null || die "$prog not found"
done
case "$COMP" in lz4|zstd) ;; *) die "COMP=$COMP: lz4 or zstd" ;; esac
[ -f "$IMAGE" ] || bench/make-memory-image.sh "$IMAGE" "$IMAGE_MIB" >&2 ||
    die "make-memory-image.sh failed"
image_bytes=$(stat -c %s "$IMAGE")
image_mib=$(( (image_bytes + (1 << 20) - 1) >> 20 ))
VM_MEM_MB=${VM_MEM_MB:-$((3 * image_mib + 256))}

kernel=${ZRAM_VM_KERNEL:-}
if [ -z "$kernel" ]; then
    for k in $(printf '%s\n' /boot/vmlinuz-* | sort -V); do
        [ -r "$k" ] && kernel=$k
    done
fi
if [ -z "$kernel" ] || ! [ -r "$kernel" ]; then
    die "no readable kernel image /boot/vmlinuz-*"
fi
modules=${ZRAM_VM_MODULES:-/lib/modules/${kernel##*/vmlinuz-}}
[ -r "$modules/modules.dep" ] || die "no modules for $kernel ($modules)"
busybox=${ZRAM_VM_BUSYBOX:-$(command -v busybox || :)}
[ -n "$busybox" ] || die "busybox is not installed (busybox-static)"

bench_tmp

# ---- the guest: the image into the kernel's zram ---------------------------
cat > "$tmp/init" <<EOF
#!/bin/sh
export PATH=/bin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
say () { echo "ZRAM-MEM: \$*"; }
kernel_kib () { awk '/^(Slab|VmallocUsed):/ { n += \$2 } END { print n }' /proc/meminfo; }
for m in \$(cat /modules.load); do insmod "/lib/modules/\$m" || say "insmod \$m failed"; done
sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1
before=\$(kernel_kib)
echo $COMP > /sys/block/zram0/comp_algorithm || say "FAIL comp $COMP"
echo $((image_mib + 64))M > /sys/block/zram0/disksize || say "FAIL disksize"
dd if=/image of=/dev/zram0 bs=1M conv=fsync 2>/dev/null || say "FAIL dd"
sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1
after=\$(kernel_kib)
say "mm_stat \$(cat /sys/block/zram0/mm_stat)"
say "kernel_kib \$((after - before))"
say "comp \$(cat /sys/block/zram0/comp_algorithm)"
say "DONE"
poweroff -f
EOF
bash tests/make-initramfs.sh "$tmp/initramfs.cpio" "$modules" "$busybox" \
    "$tmp/init" "zram zsmalloc $COMP" "/image=$IMAGE" >&2

guest () {
    timeout -s KILL 600 qemu-system-x86_64 -accel tcg -cpu max -smp 2 \
        -m "$VM_MEM_MB" -nodefaults -no-user-config -display none \
        -serial stdio -no-reboot -kernel "$kernel" \
        -initrd "$tmp/initramfs.cpio" \
        -append "console=ttyS0 panic=-1 quiet" < /dev/null > "$tmp/guest.log" 2>&1 || :
    grep -aq "^ZRAM-MEM: DONE" "$tmp/guest.log" ||
        die "the guest did not finish: $(tail -5 "$tmp/guest.log")"
    ! grep -aq "^ZRAM-MEM: FAIL" "$tmp/guest.log" ||
        die "$(grep -a "^ZRAM-MEM: FAIL" "$tmp/guest.log")"
    local mm kernel
    mm=$(sed -n 's/^ZRAM-MEM: mm_stat //p' "$tmp/guest.log" | tr -d '\r')
    kernel=$(sed -n 's/^ZRAM-MEM: kernel_kib //p' "$tmp/guest.log" | tr -d '\r')
    # mm_stat: orig_data_size compr_data_size mem_used_total ...
    read -r orig compr used _ <<< "$mm"
    [ "$orig" -ge $((image_bytes * 9 / 10)) ] ||
        die "the guest's zram holds $orig bytes of a $image_bytes-byte image"
    echo "kernel $compr $used $((used + kernel * 1024))" >> "$tmp/results"
}

# ---- the host: the image into this plugin ----------------------------------
ask () {
    /usr/bin/python3 - "$tmp/ctl" "$1" <<'PYEOF'
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from ctl_client import Ctl
for line in Ctl(sys.argv[1]).ok(sys.argv[2]):
    print(line)
PYEOF
}
ours () {
    rm -f "$tmp/ctl"
    serve "$PLUGIN" "${image_mib}M" comp="$COMP" level="$LEVEL" ctl="$tmp/ctl"
    nbdcopy "$IMAGE" "nbd+unix:///?socket=$tmp/sock"
    ask "idle all" > /dev/null
    ask "pack type=idle" > /dev/null
    ask compact > /dev/null
    sleep 2
    local compr used
    compr=$(ask stats | awk -F': ' '$1 == "compr_data_size" { print $2 }')
    used=$(ask stats | awk -F': ' '$1 == "mem_used_total" { print $2 }')
    echo "zram-plugin $compr $used $(( $(rss_kib "$server_pid") * 1024 ))" >> "$tmp/results"
    ask memory > "$tmp/memory"
    stop
}

: > "$tmp/results"
for round in $(seq "$REPEATS"); do
    echo "run-memory-vs-zram: round $round of $REPEATS" >&2
    if [ $((round % 2)) = 1 ]; then guest; ours; else ours; guest; fi
done

/usr/bin/python3 - "$tmp/results" "$tmp/memory" "$image_bytes" "$COMP" "$LEVEL" <<'PYEOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, *values = line.split()
    runs.setdefault(name, []).append([int(v) for v in values])
image, comp = int(sys.argv[3]), sys.argv[4]
M = 2 ** 20
print("%.1f MiB image, comp=%s (ours at level %s, the kernel's at its default), median of %d runs each"
      % (image / M, comp, sys.argv[5], len(runs["kernel"])))
print("| | compressed bytes | pool pages | all-in | ratio (all-in) |")
print("|---|---:|---:|---:|---:|")
med = {}
for name, label in (("kernel", "kernel zram (guest)"),
                    ("zram-plugin", "nbdkit-zram, idle all + pack (host RSS)")):
    compr, used, allin = (statistics.median(v[i] for v in runs[name]) for i in range(3))
    med[name] = allin
    print("| %s | %.1f MiB | %.1f MiB | %.1f MiB | %.2fx |" % (
        label, compr / M, used / M, allin / M, image / allin))
print("ours / kernel zram, all-in: %.3fx" % (med["kernel"] / med["zram-plugin"]))
print("where our RSS goes (the last run's `memory`), MiB:")
for line in open(sys.argv[2]):
    key, value = line.split()
    print("  %-24s %10.1f" % (key, int(value) / M) if key != "stacks"
          else "  %-24s %10d" % (key, int(value)))
PYEOF
