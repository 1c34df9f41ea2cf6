#!/usr/bin/env bash
# Build the initramfs of a test guest (tests/test-vm-swap.sh, the
# virtio-blk guest; tests/test-vm-nbd-swap.sh, the nbd swap guest): a
# static busybox, an /init, kernel modules (with their dependencies, in
# the order they must be loaded: /modules.load, for insmod), and files
# (programs, with every shared library they need (ldd), at the paths the
# dynamic loader looks in; data).
#
# Usage: make-initramfs.sh OUTPUT.cpio MODULES_DIR BUSYBOX INIT MODULES \
#            [DEST=SOURCE]...
#
#   MODULES_DIR  the kernel's /lib/modules/VERSION (with modules.dep)
#   BUSYBOX      a statically linked busybox (/bin/busybox, /bin/sh)
#   INIT         the guest's /init
#   MODULES      module names, separated by spaces ("nbd"); those the
#                kernel has built in (modules.builtin) are left out
#   DEST=SOURCE  a file to copy to DEST (an absolute path in the image);
#                a dynamically linked one brings its libraries along
#
# Compressed modules (.ko.xz, .ko.zst, .ko.gz) are stored decompressed:
# busybox's insmod loads plain .ko files.  The archive is an uncompressed
# newc cpio, which every kernel can unpack.
set -euo pipefail

usage="usage: $0 OUTPUT.cpio MODULES_DIR BUSYBOX INIT MODULES [DEST=SOURCE]..."
out=${1:?$usage}
moddir=${2:?$usage}
busybox=${3:?$usage}
init=${4:?$usage}
wanted=${5?$usage}
shift 5

die () { echo "make-initramfs.sh: $*" >&2; exit 1; }

[ -x "$busybox" ] || die "no busybox $busybox"
if ldd "$busybox" >/dev/null 2>&1; then
    die "$busybox is dynamically linked (install busybox-static)"
fi
[ -r "$init" ] || die "no init $init"
[ -r "$moddir/modules.dep" ] || die "no $moddir/modules.dep"
command -v cpio >/dev/null || die "cpio is not installed"

root="$(mktemp -d "${TMPDIR:-/tmp}/zram-initramfs.XXXXXX")"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,dev,proc,sys,mnt,run,tmp,etc,lib/modules}
cp "$busybox" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
cp "$init" "$root/init"
chmod 755 "$root/init" "$root/bin/busybox"
# The kernel's own built-in initramfs has /dev/console; add it anyway
# where we may (as root), for kernels built without one.
mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || :

# ---- programs and their libraries ------------------------------------
# copy SOURCE DEST: the file (symbolic links followed) at DEST.
copy ()
{
    mkdir -p "$root$(dirname "$2")"
    cp -L "$1" "$root$2"
}

# The libraries of an ELF file, as the paths ldd resolves them to (the
# loader's own path included), one a line; none for a static one.
libraries ()
{
    ldd "$1" 2>/dev/null | awk '
        $2 == "=>" && $3 ~ /^\// { print $3; next }
        $1 ~ /^\// { print $1 }' || :
}

declare -A have=()
for spec in "$@"; do
    dest=${spec%%=*}
    src=${spec#*=}
    [ "$dest" != "$spec" ] && [ -n "$dest" ] || die "not DEST=SOURCE: $spec"
    case "$dest" in /*) ;; *) die "$dest: not an absolute path" ;; esac
    [ -r "$src" ] || die "no $src"
    copy "$src" "$dest"
    while IFS= read -r lib; do
        [ -n "$lib" ] && [ -z "${have[$lib]:-}" ] || continue
        [ -r "$lib" ] || die "$src needs $lib, which is not readable"
        have[$lib]=1
        copy "$lib" "$lib"
    done < <(libraries "$src")
done

# ---- ICU's data: a stand-in --------------------------------------------
# libnbd (the plugin's NBD backing store) brings libxml2, which brings
# ICU, whose data library is 31 MiB.  On a real machine that file sits on
# disk and only the pages read are in RAM; here the root is ramfs, where
# every byte is RAM that can never be reclaimed: an eighth of the
# smallest guest, gone.  Nothing the guest runs calls into ICU, so the
# image gets a library of the same name with the same symbol and no data.
for lib in "${!have[@]}"; do
    case "${lib##*/}" in libicudata.so.*) ;; *) continue ;; esac
    symbol=$(nm -D --defined-only "$lib" 2>/dev/null |
        awk '$3 ~ /^icudt[0-9]+_dat$/ { print $3; exit }')
    [ -n "$symbol" ] || continue
    printf 'const char %s[16] = { 0 };\n' "$symbol" > "$root.icu.c"
    ${CC:-cc} -shared -fPIC -Wl,-soname,"${lib##*/}" -o "$root$lib" "$root.icu.c" ||
        die "cannot build the stand-in for $lib"
    rm -f "$root.icu.c"
done

# ---- kernel modules ----------------------------------------------------
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

for name in $wanted; do
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
echo "make-initramfs.sh: $out: $(($(wc -c < "$out") >> 20)) MiB;" \
    "modules: $(tr '\n' ' ' < "$root/modules.load")libraries: ${#have[@]}"
