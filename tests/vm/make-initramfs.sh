#!/usr/bin/env bash
# Build the initramfs of the swap test's guest (tests/test-vm-swap.sh):
# a static busybox, tests/vm/init as /init, and the kernel modules the
# guest needs to see a virtio-blk disk, in the order they must be loaded
# (listed in /modules.load, loaded by /init with insmod).
#
# Usage: make-initramfs.sh OUTPUT.cpio MODULES_DIR [BUSYBOX [DATA_DIR]]
#
#   MODULES_DIR  the kernel's /lib/modules/VERSION (with modules.dep)
#   BUSYBOX      a statically linked busybox (default: busybox on PATH)
#   DATA_DIR     files for the guest, copied to /data (the test's data
#                template and checksum list)
#
# Modules the kernel has built in (modules.builtin) are left out.
# Compressed modules (.ko.xz, .ko.zst, .ko.gz) are stored decompressed:
# busybox's insmod loads plain .ko files.  The archive is an uncompressed
# newc cpio, which every kernel can unpack.
set -euo pipefail

usage="usage: $0 OUTPUT.cpio MODULES_DIR [BUSYBOX [DATA_DIR]]"
out=${1:?$usage}
moddir=${2:?$usage}
busybox=${3:-$(command -v busybox || :)}
data=${4:-}
here="$(cd "$(dirname "$0")" && pwd)"

# What the guest needs: virtio over PCI, and the block driver.
WANTED="virtio_pci virtio_blk"

die () { echo "make-initramfs.sh: $*" >&2; exit 1; }

[ -n "$busybox" ] && [ -x "$busybox" ] || die "no busybox"
if ldd "$busybox" >/dev/null 2>&1; then
    die "$busybox is dynamically linked (install busybox-static)"
fi
[ -r "$moddir/modules.dep" ] || die "no $moddir/modules.dep"
command -v cpio >/dev/null || die "cpio is not installed"

root="$(mktemp -d "${TMPDIR:-/tmp}/zram-initramfs.XXXXXX")"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,dev,proc,sys,mnt,data,lib/modules}
if [ -n "$data" ]; then
    [ -d "$data" ] || die "no directory $data"
    cp -R "$data/." "$root/data/"
fi
cp "$busybox" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
cp "$here/init" "$root/init"
chmod 755 "$root/init" "$root/bin/busybox"
# The kernel's own built-in initramfs has /dev/console; add it anyway
# where we may (as root), for kernels built without one.
mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || :

# A module's path in modules.dep ("kernel/.../name.ko[.xz]") from its name.
module_path ()
{
    local name="$1" alt
    alt="${name//_/-}"
    awk -F: -v a="$name" -v b="$alt" '{
            n = $1; sub(/.*\//, "", n); sub(/\.ko(\.(xz|zst|gz))?$/, "", n)
            if (n == a || n == b) { print $1; exit }
        }' "$moddir/modules.dep"
}

module_deps ()
{
    awk -F: -v m="$1" '$1 == m { print $2; exit }' "$moddir/modules.dep"
}

builtin ()
{
    [ -r "$moddir/modules.builtin" ] &&
        grep -Eq "/(${1}|${1//_/-})\.ko\$" "$moddir/modules.builtin"
}

# Depth first: a module's dependencies before it.
order=()
add_module ()
{
    local path="$1" dep m
    for m in "${order[@]+"${order[@]}"}"; do
        [ "$m" != "$path" ] || return 0
    done
    for dep in $(module_deps "$path"); do
        add_module "$dep"
    done
    order+=("$path")
}

for name in $WANTED; do
    path="$(module_path "$name")"
    if [ -z "$path" ]; then
        builtin "$name" || die "module $name is neither in $moddir/modules.dep nor built in"
        continue
    fi
    add_module "$path"
done

: > "$root/modules.load"
for path in "${order[@]+"${order[@]}"}"; do
    src="$moddir/$path"
    [ -r "$src" ] || die "missing $src"
    base="$(basename "$path")"
    case "$base" in
        *.ko.xz)  xz -dc "$src" > "$root/lib/modules/${base%.xz}" ;;
        *.ko.zst) zstd -qdc "$src" > "$root/lib/modules/${base%.zst}" ;;
        *.ko.gz)  gzip -dc "$src" > "$root/lib/modules/${base%.gz}" ;;
        *.ko)     cp "$src" "$root/lib/modules/$base" ;;
        *) die "unknown module file $src" ;;
    esac
    echo "${base%.ko*}.ko" >> "$root/modules.load"
done

(cd "$root" && find . | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) > "$out"
echo "make-initramfs.sh: $out: $(wc -c < "$out") bytes; modules:" \
    "$(tr '\n' ' ' < "$root/modules.load")"
