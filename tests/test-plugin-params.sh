#!/usr/bin/env bash
# Parameters: every bad one makes nbdkit fail at startup with a message
# naming the parameter; good ones start; --help lists every parameter;
# --dump-plugin reports the compression libraries.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"

errors=0

# bad NAME ARGS...: nbdkit with ARGS must fail to start, and an error
# message must name NAME (as a word: nbdkit's generic "size cannot be
# negative" names size, but it does not name mem_limit).
bad ()
{
    local name="$1" rc=0
    shift
    zram_nbdkit -U - "$PLUGIN" "$@" --run 'echo SERVED' > "$tmp/out" 2>/dev/null || rc=$?
    if [ "$rc" = 0 ]; then
        echo "FAIL: nbdkit $* started (exit status 0)" >&2
        errors=$((errors + 1))
    elif grep -q SERVED "$tmp/out"; then
        echo "FAIL: nbdkit $* served before failing" >&2
        errors=$((errors + 1))
    elif ! grep -Eq "error:.*\\b$name\\b" "$NBDKIT_STDERR"; then
        echo "FAIL: nbdkit $*: the error does not name '$name':" >&2
        sed 's/^/    /' "$NBDKIT_STDERR" >&2
        errors=$((errors + 1))
    else
        echo "ok: nbdkit $*: $(grep -E -m1 "error:.*\\b$name\\b" "$NBDKIT_STDERR")"
    fi
}

# bad1 NAME ARGS...: as bad, and the error is one line (nbdkit's own
# parsers log a line of their own that names nothing).
bad1 ()
{
    local before=$errors
    bad "$@"
    local lines
    lines=$(grep -c "error:" "$NBDKIT_STDERR" || :)
    if [ "$errors" = "$before" ] && [ "$lines" != 1 ]; then
        echo "FAIL: nbdkit ${*:2}: $lines error lines, not one:" >&2
        sed 's/^/    /' "$NBDKIT_STDERR" >&2
        errors=$((errors + 1))
    fi
}

bad1 backing_direct 1M backing_direct=maybe
bad1 swap_full_after 1M swap_full_after=100
bad1 swap_full_after 1M swap_full_after=soon
bad1 swap_full_available 1M swap_full_available=lots
bad1 backing_sync 1M backing_sync=perhaps
bad1 mem_limit 1M mem_limit=1MiB
bad1 mem_limit 1M mem_limit=1.5M
bad1 mem_limit 1M mem_limit=8E
bad1 size 1MB
# Two parameters naming one file (after links are followed) are refused,
# naming the second: one file's content would be lost to the other.
mkdir "$tmp/files"
ln -s "$tmp/files" "$tmp/files-link"
bad1 metrics 1M stats="$tmp/files/one" metrics="$tmp/files/one"
bad1 ctl 1M stats="$tmp/files/one" ctl="$tmp/files/one"
bad1 metrics 1M stats="$tmp/files/one" metrics="$tmp/files-link/one"
bad1 metrics 1M stats="$tmp/files/one" metrics="$tmp/files/../files/one"
bad1 backing 1M stats="$tmp/files/one" backing="$tmp/files-link/one"
bad1 standby 1M region="$tmp/files/r" standby="$tmp/files/r"

bad size                             # missing size
bad size comp=zstd                   # missing size, other keys given
bad size size=0
bad size 0
bad size size=junk
bad size junk
bad size size=-1
bad size size=9223372036854775808    # 2^63
bad comp 1M comp=lzo
bad comp 1M comp=
bad comp 1M comp=LZ4
bad level 1M comp=zstd level=0
bad level 1M comp=zstd level=99
bad level 1M comp=zstd level=23
bad level 1M level=0                 # lz4 (the default)
bad level 1M comp=lz4 level=0
bad level 1M comp=lz4 level=65538
bad level 1M comp=lz4 level=-1
bad level 1M level=abc
bad level 1M level=
bad mem_limit 1M mem_limit=junk
bad mem_limit 1M mem_limit=-1
bad mem_limit 1M mem_limit=
bad mem_budget 1M mem_budget=junk
bad mem_budget 1M mem_limit=64M mem_budget=64M   # one limit, not both
bad chain 1M chain=0
bad chain 1M chain=17
bad chain 1M chain=-1
bad chain 1M chain=x
bad lock 1M lock=global
bad lock 1M lock=
bad free 1M free=later
bad free 1M free=
bad compact 1M compact=on
bad compact 1M compact=
bad compact_threshold 1M compact_threshold=101
bad compact_threshold 1M compact_threshold=-1
bad compact_threshold 1M compact_threshold=x
bad stats 1M stats=
bad stats 1M stats=/nonexistent/directory/stats
bad pack_level 1M pack_level=0
bad pack_level 1M pack_level=23
bad pack_level 1M pack_level=x
bad pack_blocks 1M pack_blocks=1
bad pack_blocks 1M pack_blocks=65
bad pack_blocks 1M pack_blocks=-2
bad pack_blocks 1M pack_blocks=
bad write_batch 1M write_batch=0
bad write_batch 1M write_batch=17
bad write_batch 1M write_batch=many
bad decode_cache 1M decode_cache=0
bad decode_cache 1M decode_cache=lots
bad foo 1M foo=bar
bad Size 1M Size=1M

# Good parameters start and serve (the size is what was asked).
good ()
{
    local want="$1" got
    shift
    got="$(zram_nbdkit -U - "$PLUGIN" "$@" --run 'nbdinfo --size "$uri"')" ||
        fail "nbdkit $* did not start"
    [ "$got" = "$want" ] || fail "nbdkit $*: size $got, want $want"
    echo "ok: nbdkit $*: size $got"
}
requires nbdinfo
good 1073741824 size=1G comp=zstd level=3 chain=16 lock=pool free=immediate mem_limit=1G
good 1048576 1M comp=lz4 level=65537 chain=1 lock=class free=batched mem_limit=0
good 1048576 1M comp=lz4 level=1
good 1048576 1M comp=zstd level=22
good 1048576 1M comp=zstd level=-5
good 1048576 1024K comp=zstd level=1 stats="$tmp/stats"
good 4096 4k mem_limit=4k
good 1048576 1M mem_budget=8M
good 1048576 1M compact=off
good 1048576 1M swap_full_after=30000 swap_full_available=64M
good 1048576 1M compact=auto compact_threshold=0
good 1048576 1M compact_threshold=100
good 1048576 1M pack_level=19 pack_blocks=64
good 1048576 1M pack_level=-1 pack_blocks=2
good 1048576 1M write_batch=1
good 1048576 1M write_batch=16
good 1048576 1M decode_cache=1
good 1048576 1M decode_cache=64M pack_blocks=64
good 1048576 1M backing="$tmp/backing" writeback_limit=0
[ -s "$tmp/stats" ] || fail "stats=$tmp/stats: no file written"

# A remote backing store needs libnbd, loaded only then: a library that
# is not one, or one without the functions used, fails the start with a
# message naming backing and what is wrong with the library, never a
# crash at the first call.  (LD_LIBRARY_PATH comes first in the search.)
# libnbd WHY DIR: bad backing with DIR's libnbd.so.0, the error saying WHY.
libnbd ()
{
    local why="$1" dir="$2" before=$errors
    LD_LIBRARY_PATH="$dir" bad backing 1M \
        backing="nbd+unix:///?socket=$tmp/no-such-socket"
    if [ "$errors" = "$before" ] &&
       ! grep -q "error:.*backing.*$why" "$NBDKIT_STDERR"; then
        echo "FAIL: backing with $dir/libnbd.so.0: the error does not say '$why':" >&2
        sed 's/^/    /' "$NBDKIT_STDERR" >&2
        errors=$((errors + 1))
    fi
}
mkdir "$tmp/not-elf" "$tmp/no-symbols"
echo "not a library" > "$tmp/not-elf/libnbd.so.0"
libnbd "cannot load libnbd.so.0" "$tmp/not-elf"
echo 'int nbd_something_else;' > "$tmp/no-symbols.c"
if ${CC:-cc} -shared -fPIC -o "$tmp/no-symbols/libnbd.so.0" "$tmp/no-symbols.c"; then
    libnbd "libnbd.so.0 has no nbd_create: too old" "$tmp/no-symbols"
else
    fail "cannot build a stand-in libnbd.so.0 with ${CC:-cc}"
fi

# --help lists every parameter (config_help).
help="$(zram_nbdkit "$PLUGIN" --help)"
for param in size= comp= lz4 zstd level= mem_limit= stats= chain= lock= class pool \
             free= batched immediate compact= auto off compact_threshold= \
             ctl= recomp_algorithm= idle_after= recompress_after= pack_after= \
             pack_level= pack_blocks= swap= swap_reserve= backing= backing_direct= \
             writeback_limit= writeback_batch_size= writeback_watermark= \
             write_batch= decode_cache=; do
    grep -qF -- "$param" <<<"$help" || fail "nbdkit --help does not mention '$param'"
done
grep -qE -- '^writeback_limit=SIZE .*\(0 = nothing' <<<"$help" ||
    fail "nbdkit --help does not say what writeback_limit=0 means"

# --dump-plugin: the plugin's name and its features.
dump="$(zram_nbdkit "$PLUGIN" --dump-plugin)"
for line in name=zram zram_lz4=yes zram_zstd=yes; do
    grep -qx -- "$line" <<<"$dump" || fail "nbdkit --dump-plugin lacks '$line'"
done
grep -q '^zram_lz4_version=[0-9]' <<<"$dump" || fail "--dump-plugin: no zram_lz4_version"
grep -q '^zram_zstd_version=[0-9]' <<<"$dump" || fail "--dump-plugin: no zram_zstd_version"
grep -q '^thread_model=parallel$' <<<"$dump" || fail "--dump-plugin: thread_model is not parallel"
# The parameter table (params.c) against the man page, the
# specification: the same keys, and each choice of a key with choices
# (zram_param_comp=lz4|zstd) an item of its own there (B<comp=lz4>).
man="$SRCDIR/man/nbdkit-zram-plugin.pod"
table_keys=$(sed -n 's/^zram_params=//p' <<<"$dump" | tr , '\n' | sort)
[ -n "$table_keys" ] || fail "--dump-plugin: no zram_params"
man_keys=$(sed -n '/^=head1 PARAMETERS/,/^=head1 /s/^=item \[\{0,1\}B<\([a-z_]*\)=.*/\1/p' "$man" | sort -u)
if [ "$table_keys" != "$man_keys" ]; then
    diff <(echo "$table_keys") <(echo "$man_keys") >&2 || :
    fail "the parameter table and the man page's PARAMETERS differ (< table, > man page)"
fi
while IFS='=' read -r key syntax; do
    key=${key#zram_param_}
    case "$syntax" in
        *[A-Z]*|*'['*) continue ;;      # a value, not choices
    esac
    for choice in ${syntax//|/ }; do
        grep -q "^=item B<$key=$choice>" "$man" ||
            fail "man page: no item B<$key=$choice> (the table's $key=$syntax)"
    done
done < <(grep '^zram_param_' <<<"$dump")
# ... and in its SYNOPSIS.
synopsis=$(sed -n '/^=head1 SYNOPSIS/,/^=head1 DESCRIPTION/p' "$man")
for key in $table_keys; do
    grep -Eq "(\[|\| |^ nbdkit zram \[)$key=" <<<"$synopsis" ||
        fail "man page: $key= is not in the SYNOPSIS"
done
echo "ok: $(wc -l <<<"$table_keys") parameters, the same in the table and the man page"
[ "$errors" = 0 ] || fail "$errors bad parameter check(s) failed (see above)"
echo "params ok"
