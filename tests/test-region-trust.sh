#!/usr/bin/env bash
# region= against what others plant (issue 40): a root server, and files
# and segments made by nobody.  Each attack is refused with its message
# and nothing is written, removed or served:
#   - a link at PATH.new (its target, root's, was truncated and written)
#     and at PATH (a dangling one: root made its target);
#   - a planted "creating" line naming root's segment or one nobody made
#     (the segment once removed, whatever it was: it survives);
#   - a region file and segment of nobody's (once served: nobody then
#     wrote over the heap);
#   - a copy of a live region's file (once a second owner);
#   - an empty or garbled region file (once replaced by a new region, the
#     old segment orphaned: it is still there, and served once the line
#     is back);
#   - region= an ordinary file, and `nbdkit-zramctl region remove` of one
#     (once overwritten, then deleted);
#   - a region file writable by its group, a directory others may write.
# And `region remove` of a region takes its segment and file; 40 pairs of
# servers started at once on a new region end with one server each.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/nbdsh ipcs setpriv /usr/bin/python3
if [ "$(id -u)" != 0 ]; then
    echo "$TEST_NAME: SKIP: needs root (a root server against files and segments of nobody's)" >&2
    exit 77
fi
getent passwd nobody >/dev/null && getent group nogroup >/dev/null || {
    echo "$TEST_NAME: SKIP: no user nobody or group nogroup" >&2
    exit 77
}
zramctl="$BUILDDIR/tools/nbdkit-zramctl"
as_nobody () { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }

# Where nobody plants: a directory like /tmp (root's, sticky, writable by
# all), which the rules accept: there no one removes another's file.
chmod 711 "$tmp"
pub="$tmp/pub"
mkdir -m 1777 "$pub"

segment_of () { sed -n 's/.* shm=\([0-9]*\) .*/\1/p' "$1" 2>/dev/null; }
# ipcs -i succeeds for an id that does not exist: look in the list.
segment_exists () { ipcs -m | awk '{ print $2 }' | grep -qx "$1"; }
# Segments this test made, removed at the end whatever happened.
echo > "$tmp/segments"
cleanup_add 'for id in $(cat "$tmp/segments"); do ipcrm -m "$id" 2>/dev/null; done'
keep_segment () { echo "$1" >> "$tmp/segments"; }

# segment KEY BYTES [TEXT]: a segment made by whoever runs it (mode
# 0600), its first bytes TEXT; prints its id.
cat > "$tmp/segment.py" <<'EOF'
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
libc.shmdt.argtypes = [ctypes.c_void_p]
key = ctypes.c_int32(int(sys.argv[1], 16) - (1 << 32 if int(sys.argv[1], 16) >= 1 << 31 else 0)).value
shm_id = libc.shmget(key, int(sys.argv[2]), 0o1000 | 0o2000 | 0o600)
if shm_id < 0:
    raise OSError(ctypes.get_errno(), "shmget")
if len(sys.argv) > 3:
    p = libc.shmat(shm_id, None, 0)
    ctypes.memmove(p, sys.argv[3].encode(), len(sys.argv[3]))
    libc.shmdt(p)
print(shm_id)
EOF
# The first bytes of segment ID (what a refusal must leave as it was).
cat > "$tmp/peek.py" <<'EOF'
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
libc.shmdt.argtypes = [ctypes.c_void_p]
p = libc.shmat(int(sys.argv[1]), None, 0o10000)     # SHM_RDONLY
if p is None or p == ctypes.c_void_p(-1).value:
    raise OSError(ctypes.get_errno(), "shmat")
print(ctypes.string_at(p, 32).hex())
libc.shmdt(p)
EOF
segment_make () { /usr/bin/python3 "$tmp/segment.py" "$@"; }
segment_peek () { /usr/bin/python3 "$tmp/peek.py" "$1"; }
random_key () { printf '%08x' $((0x10000000 + RANDOM * 32768 + RANDOM)); }

# What is at a path (not followed; a link's target read): compared
# before and after each refusal.
look () {
    if [ -L "$1" ]; then echo "link -> $(readlink "$1")"
    elif [ -e "$1" ]; then stat -c '%F %i %a %u %s %Y' "$1"; sha256sum < "$1"
    else echo absent; fi
}

# refused NAME PATTERN ARGS...: a server with these plugin parameters does
# not start and says PATTERN (grep -E).
refused () {
    local name=$1 pattern=$2
    shift 2
    if zram_nbdkit -U - "$PLUGIN" 8M "$@" --run true 2>"$tmp/$name.err"; then
        fail "$name: a server started"
    fi
    grep -Eq -- "$pattern" "$tmp/$name.err" ||
        fail "$name: no message matching '$pattern': $(cat "$tmp/$name.err")"
    echo "ok: $name: $(grep -o 'region: .*' "$tmp/$name.err" | head -n1)"
}
# remove_refused NAME PATTERN PATH: region remove exits non-zero saying
# PATTERN.
remove_refused () {
    local rc=0
    "$zramctl" region remove "$3" 2>"$tmp/$1.err" || rc=$?
    [ "$rc" != 0 ] || fail "$1: region remove exited 0"
    grep -Eq -- "$2" "$tmp/$1.err" ||
        fail "$1: no message matching '$2': $(cat "$tmp/$1.err")"
    echo "ok: $1: exit $rc: $(cat "$tmp/$1.err")"
}

cat > "$tmp/data.py" <<'EOF'
import os
data = (("block of version %s " % os.environ["VERSION"]) * 300)[:4096].encode()
if os.environ["ACTION"] == "write":
    for b in range(0, 2048, 5):
        h.pwrite(data, b * 4096)
else:
    bad = [b for b in range(0, 2048, 5) if h.pread(4096, b * 4096) != data]
    assert not bad, "blocks that differ: %s" % bad[:10]
EOF
serve () {   # ACTION VERSION REGION: one server, one client
    ACTION=$1 VERSION=$2 zram_nbdkit -U - "$PLUGIN" 8M region="$3" \
        --run "ACTION=$1 VERSION=$2 nbdsh -u \"\$uri\" -c - < '$tmp/data.py'"
}
background () {   # NAME REGION: a server in the background, $tmp/NAME.pid
    zram_nbdkit -U "$tmp/$1.sock" -P "$tmp/$1.pid" "$PLUGIN" 8M region="$2" ||
        fail "a background server $1"
    cleanup_add "kill \$(cat '$tmp/$1.pid' 2>/dev/null) 2>/dev/null"
}
stop () {   # NAME: SIGTERM (a handover), and gone
    local pid
    pid=$(cat "$tmp/$1.pid")
    kill "$pid"
    for _ in $(seq 100); do [ -e "/proc/$pid" ] || return 0; sleep 0.1; done
    fail "server $1 did not stop"
}

victim="$tmp/victim"
echo "root's precious file" > "$victim"
victim_before=$(look "$victim")

# ---- links ---------------------------------------------------------------
as_nobody ln -s "$victim" "$pub/region.new"
refused link-new "region: $pub/region: cannot make a region: $pub/region.new is a symbolic link: refused, not touched" \
    region="$pub/region"
[ "$(look "$victim")" = "$victim_before" ] || fail "link at PATH.new: the target was changed"
[ "$(readlink "$pub/region.new")" = "$victim" ] || fail "link at PATH.new: the link was touched"
[ ! -e "$pub/region" ] || fail "link at PATH.new: a region file was made"
rm "$pub/region.new"

as_nobody ln -s "$tmp/made-by-root" "$pub/region"
refused link-dangling "region: $pub/region: the region file is a symbolic link: refused" \
    region="$pub/region"
[ ! -e "$tmp/made-by-root" ] || fail "a dangling link at PATH: its target was made"
rm "$pub/region"
as_nobody ln -s "$victim" "$pub/region"
refused link-file "the region file is a symbolic link: refused" region="$pub/region"
remove_refused link-remove "the region file is a symbolic link" "$pub/region"
[ "$(look "$victim")" = "$victim_before" ] || fail "link at PATH: the target was changed"
[ -L "$pub/region" ] || fail "link at PATH: the link was removed"
rm "$pub/region"

# ---- a planted "creating" line -----------------------------------------
# Naming root's segment: the file is nobody's.
key=$(random_key)
root_segment=$(segment_make "$key" 1048576 "root's memory")
keep_segment "$root_segment"
root_before=$(segment_peek "$root_segment")
as_nobody sh -c "echo 'nbdkit-zram region key=$key shm=-1 device=creating' > '$pub/region'"
refused creating-root "the region file is owned by uid 65534, not this user's \(uid 0\): refused" \
    region="$pub/region"
remove_refused creating-root-remove "owned by uid 65534" "$pub/region"
segment_exists "$root_segment" || fail "a planted 'creating' line: root's segment was removed"
[ "$(segment_peek "$root_segment")" = "$root_before" ] || fail "root's segment was changed"
rm "$pub/region"
# The same line in a file of root's (root fooled into writing it): the
# segment is not provably a region being made.
echo "nbdkit-zram region key=$key shm=-1 device=creating" > "$tmp/creating"
chmod 600 "$tmp/creating"
refused creating-root-file "holds something else than a region being made\): refused, not touched" \
    region="$tmp/creating"
remove_refused creating-root-file-remove "holds something else" "$tmp/creating"
segment_exists "$root_segment" || fail "a 'creating' line: root's segment was removed"
[ "$(segment_peek "$root_segment")" = "$root_before" ] || fail "root's segment was changed"
# Naming one nobody made (all zero, as a region being made is).
key=$(random_key)
nobody_segment=$(as_nobody /usr/bin/python3 "$tmp/segment.py" "$key" 1048576)
keep_segment "$nobody_segment"
echo "nbdkit-zram region key=$key shm=-1 device=creating" > "$tmp/creating"
refused creating-nobody "is owned by uid 65534 and was made by uid 65534, not this user's \(uid 0\): refused, not touched" \
    region="$tmp/creating"
remove_refused creating-nobody-remove "made by uid 65534" "$tmp/creating"
segment_exists "$nobody_segment" || fail "a 'creating' line: nobody's segment was removed"
rm "$tmp/creating"

# ---- a region file and segment of nobody's --------------------------------
# A region nobody made (its own server, when nobody can run one here; a
# segment and a line naming it, else).
# (Not under TSan: nbdkit --run starts its command with /bin/sh, which
# crashes with libtsan preloaded - functions.sh's zram_nbdkit says so.)
if [ "$SANITIZERS" != thread ] &&
       as_nobody test -r "$PLUGIN" && as_nobody test -x "$NBDKIT"; then
    as_nobody env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} "$NBDKIT" -U - "$PLUGIN" 8M \
        region="$pub/nobodys" --run true || fail "nobody's own server"
    made_by="nobody's own server"
else
    key=$(random_key)
    id=$(as_nobody /usr/bin/python3 "$tmp/segment.py" "$key" 16777216)
    as_nobody sh -c "echo 'nbdkit-zram region key=$key shm=$id device=0123456789abcdef0123456789abcdef' > '$pub/nobodys'"
    made_by="a segment and a line"
fi
theirs=$(segment_of "$pub/nobodys")
keep_segment "$theirs"
theirs_before=$(segment_peek "$theirs")
file_before=$(look "$pub/nobodys")
refused nobodys "the region file is owned by uid 65534, not this user's \(uid 0\): refused" \
    region="$pub/nobodys"
remove_refused nobodys-remove "owned by uid 65534" "$pub/nobodys"
# Its line copied into a file of root's: the segment is still nobody's.
cp "$pub/nobodys" "$tmp/nobodys-line"
refused nobodys-segment "the segment it names \(shm id $theirs\) is owned by uid 65534 and was made by uid 65534" \
    region="$tmp/nobodys-line"
remove_refused nobodys-segment-remove "owned by uid 65534" "$tmp/nobodys-line"
segment_exists "$theirs" || fail "nobody's segment was removed"
[ "$(segment_peek "$theirs")" = "$theirs_before" ] || fail "nobody's segment was changed"
[ "$(look "$pub/nobodys")" = "$file_before" ] || fail "nobody's region file was changed"
echo "ok: a region of nobody's ($made_by): not served, not removed"
rm "$tmp/nobodys-line"

# ---- a copy of a live region's file -----------------------------------------
live="$tmp/live"
serve write 1 "$live" || fail "a first server"
keep_segment "$(segment_of "$live")"
background first "$live"
cp "$live" "$tmp/live-copy"
refused copy "the segment it names \(shm id [0-9]+\) is attached by 1 process \(last pid [0-9]+\): another server serves it: refused" \
    region="$tmp/live-copy"
remove_refused copy-remove "another server serves it" "$tmp/live-copy"
ACTION=read VERSION=1 nbdsh -u "nbd+unix://?socket=$tmp/first.sock" -c - \
    < "$tmp/data.py" || fail "the first server, after the copy's refusal"
stop first
rm "$tmp/live-copy"
echo "ok: the first server serves on, every block whole"

# ---- empty and garbled region files -----------------------------------------
id=$(segment_of "$live")
line=$(cat "$live")
for garbled in "" "nbdkit-zram region key=zz" "$line$line" "# $line"; do
    printf '%s' "$garbled" > "$live"
    before=$(look "$live")
    refused garbled "region: $live: not a region file \(empty, or not one line 'nbdkit-zram region key=... shm=... device=...'\): refused, nothing written; remove it if it is no region's, or give region= another path" \
        region="$live"
    remove_refused garbled-remove "not a region file" "$live"
    [ "$(look "$live")" = "$before" ] || fail "a garbled region file was changed"
    segment_exists "$id" || fail "a garbled region file: its segment $id is gone"
done
echo "$line" > "$live"
serve read 1 "$live" || fail "the line put back: the region is not served whole"
echo "ok: the line put back, the region (shm id $id) is served, every block whole"

# ---- ordinary files ---------------------------------------------------------
printf 'setting = 1\n' > "$tmp/config"
before=$(look "$tmp/config")
refused config "region: $tmp/config: not a region file" region="$tmp/config"
remove_refused config-remove "not a region file" "$tmp/config"
[ "$(look "$tmp/config")" = "$before" ] || fail "an ordinary file named by region= was changed"

# ---- modes ------------------------------------------------------------------
chmod 660 "$live"
refused group-writable "the region file is writable by group or others \(mode 0660\): refused \(chmod 600 $live if it is yours\)" \
    region="$live"
chmod 600 "$live"
mkdir -m 777 "$tmp/open"
refused open-directory "its directory $tmp/open is writable by group or others and not sticky \(mode 0777\): refused" \
    region="$tmp/open/region"
[ -z "$(ls -A "$tmp/open")" ] || fail "something was made in a directory others may write"

# ---- region remove of a region ----------------------------------------------
"$zramctl" region remove "$live" || fail "region remove of a region"
[ ! -e "$live" ] || fail "region remove: the region file is still there"
! segment_exists "$id" || fail "region remove: the segment $id is still there"
"$zramctl" region remove "$live" || fail "region remove of nothing"
echo "ok: region remove: segment $id and the file gone; nothing to remove: exit 0"

# ---- creation races ---------------------------------------------------------
race="$tmp/race"
busy_attach=0 busy_create=0
for round in $(seq 40); do
    # (nbdkit leaves its socket when stopped.)
    rm -f "$tmp"/race-[ab].pid "$tmp"/race-[ab].sock
    for side in a b; do
        ( zram_nbdkit -U "$tmp/race-$side.sock" -P "$tmp/race-$side.pid" \
              "$PLUGIN" 8M region="$race" 2>"$tmp/race-$side.err" || : ) &
    done
    wait
    keep_segment "$(segment_of "$race")"
    for side in a b; do
        [ ! -s "$tmp/race-$side.pid" ] ||
            cleanup_add "kill $(cat "$tmp/race-$side.pid") 2>/dev/null"
    done
    servers=0
    for side in a b; do
        if [ -s "$tmp/race-$side.pid" ]; then
            servers=$((servers + 1))
            winner=$side
        elif grep -q "cannot make a region: the region is owned by another process" "$tmp/race-$side.err"; then
            busy_create=$((busy_create + 1))
        elif grep -q "owned by another process" "$tmp/race-$side.err"; then
            busy_attach=$((busy_attach + 1))
        else
            fail "round $round: server $side: $(cat "$tmp/race-$side.err")"
        fi
    done
    [ "$servers" = 1 ] || fail "round $round: $servers servers for one new region"
    # SIGKILL: quicker than a handover, and region remove takes the
    # region a crash left all the same.
    kill -9 "$(cat "$tmp/race-$winner.pid")"
    # Gone once a zombie (its reaper, init here, may be slow): it has
    # detached the segment and unlocked the file by then.
    for _ in $(seq 100); do _alive "$(cat "$tmp/race-$winner.pid")" || break; sleep 0.02; done
    "$zramctl" region remove "$race" || fail "round $round: region remove"
done
echo "ok: 40 pairs of servers started at once: one server each, the other refused ($busy_attach at its attach, $busy_create at its creation)"
