#!/usr/bin/env bash
# Requests to a backing export that were given up on never cost data:
# NBD has no cancel, so a write or trim that timed out may still land
# later, and its extent must never hold other blocks (quarantined).
# Against an export (nbdkit's eval plugin over a file, requests run in
# parallel) whose first write, or whose trims, take 4 s with
# backing_timeout=1:
#   late trim   blocks written back, trimmed (their run released: the
#               store's trim times out), new blocks written back, the
#               late trim lands: every new block reads right;
#   late write  a batch's write times out (nothing moves), new blocks
#               written back, the old write lands: every block right;
#   runaway     a quarantine past a quarter of the store stops writeback,
#               with a log line saying so;
# and: a store that says ENOSPC is logged as full (not as memory), a
# wedged or slow store costs a write at the limit one backing_timeout at
# most,
# and a second server cannot take a backing file that one has.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires /usr/bin/python3 fallocate

# eval_export SIZE SLOW_WRITE SLOW_TRIM: an export over $tmp/remote.img
# whose first write takes 4 s (SLOW_WRITE 1), and every trim (SLOW_TRIM 1).  Each request runs in its own thread
# (parallel), as a real server's would: a slow one does not hold up the
# others, and a closed connection's request still runs to its end.
eval_export ()
{
    local size=$1 slow_write=$2 slow_trim=$3 img=$tmp/remote.img mark=$tmp/slow-done
    rm -rf "$mark" "$img"
    truncate -s "$size" "$img"
    remote_start eval \
        thread_model='echo parallel' \
        get_size="echo $size" \
        can_write='exit 0' can_trim='exit 0' can_flush='exit 0' \
        pread="dd if=$img skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none" \
        pwrite="if [ $slow_write = 1 ] && mkdir $mark 2>/dev/null; then sleep 4; fi
                dd of=$img seek=\$4 oflag=seek_bytes conv=notrunc status=none" \
        trim="if [ $slow_trim = 1 ]; then sleep 4; fi
              fallocate -p -o \$4 -l \$3 $img" \
        flush='exit 0'
}

cat > "$tmp/abandoned.py" <<'EOF'
import os, sys, time, nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl
uri, ctl_path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
B = 4096
ctl = Ctl(ctl_path)
h = nbd.NBD(); h.connect_uri(uri)

def block(b, tag):
    text = b"%s block %d " % (tag, b)
    return (text * (B // len(text) + 1))[:B]

def random_block(b):
    return os.urandom(B)

stats = ctl.stats

def backed():
    return int(ctl.ok("bd_stat")[0].split()[0])

def write_back(blocks, tag):
    for b in blocks:
        h.pwrite(block(b, tag), b * B)
    ctl.ok("idle all")
    lines, ok, last = ctl.command("writeback idle")
    return ok, last

def check(blocks, tag):
    lost = 0
    for b in blocks:
        try:
            if h.pread(B, b * B) != block(b, tag):
                lost += 1
        except nbd.Error:
            lost += 1
    return lost

if mode == "late-trim":
    old = range(0, 8)
    ok, last = write_back(old, b"old")
    assert ok and backed() == 8, (last, backed())
    h.trim(8 * B, 0)              # their run is released ...
    ctl.ok("compact")             # ... and trimmed: times out (1 s)
    time.sleep(2.5)               # the trim's timeout, the backoff
    abandoned = stats()
    new = range(100, 108)
    ok, last = write_back(new, b"new")
    assert ok and backed() == 8, (last, backed())
    time.sleep(4)                 # the late trim has landed by now
    lost = check(new, b"new")
    s = stats()
    print("late trim: %d of 8 new blocks lost; backing_corrupt %s; "
          "backing_abandoned %s, backing_quarantined_bytes %s"
          % (lost, s["backing_corrupt"], abandoned.get("backing_abandoned"),
             abandoned.get("backing_quarantined_bytes")))
    assert lost == 0 and int(s["backing_corrupt"]) == 0, s
    assert int(abandoned["backing_abandoned"]) >= 1, abandoned
    assert int(abandoned["backing_quarantined_bytes"]) > 0, abandoned

elif mode == "late-write":
    old = range(0, 8)
    ok, last = write_back(old, b"old")    # the write times out
    assert not ok and backed() == 0, (last, backed())
    abandoned = stats()
    print("late write: writeback: %s; backing_quarantined_bytes %s"
          % (last, abandoned.get("backing_quarantined_bytes")))
    time.sleep(1.5)               # the connection's backoff
    new = range(100, 108)
    for b in new:                 # other data, over the same place
        h.pwrite(block(b, b"new"), b * B)
    for b in old:
        h.pwrite(block(b, b"old2"), b * B)
    ctl.ok("idle all")
    ctl.ok("writeback idle")
    assert backed() == 16, backed()
    time.sleep(4)                 # the late write has landed by now
    lost = check(new, b"new") + check(old, b"old2")
    s = stats()
    print("late write: %d of 16 blocks lost; backing_corrupt %s"
          % (lost, s["backing_corrupt"]))
    assert lost == 0 and int(s["backing_corrupt"]) == 0, s
    assert int(abandoned["backing_abandoned"]) == 1, abandoned

elif mode == "runaway":
    # 32 incompressible blocks: 128 KiB in one write, more than a
    # quarter of the 256 KiB store.
    for b in range(32):
        h.pwrite(random_block(b), b * B)
    ctl.ok("idle all")
    lines, ok, last = ctl.command("writeback idle")
    assert not ok, last
    time.sleep(1.5)
    ctl.ok("idle all")
    lines = ctl.ok("writeback idle")
    s = stats()
    print("runaway: second writeback: %s; backing_quarantined_bytes %s"
          % (", ".join(lines), s["backing_quarantined_bytes"]))
    assert "blocks 0" in lines and "stopped backing_full" in lines, lines
    assert int(s["backing_quarantined_bytes"]) >= 128 * 1024, s
    assert backed() == 0

elif mode == "full":
    # The export refuses every write with ENOSPC: a write at the limit
    # fails, logged as the store being full.
    failed = 0
    for b in range(4096):
        try:
            h.pwrite(random_block(b), b * B)
        except nbd.Error as e:
            assert e.errno == "ENOSPC", e
            failed += 1
            if failed >= 3:
                break
    s = stats()
    print("full store: %d writes refused; backing_errors_nospace %s"
          % (failed, s["backing_errors_nospace"]))
    assert failed >= 3 and int(s["backing_errors_nospace"]) >= 1, s

elif mode == "wedged":
    # Writes to the export never answer: every write at the limit takes
    # one backing_timeout (2 s) at most, never a multiple.
    longest = 0
    failed = 0
    for b in range(4096):
        start = time.monotonic()
        try:
            h.pwrite(random_block(b), b * B)
        except nbd.Error as e:
            assert e.errno == "ENOSPC", e
            failed += 1
        longest = max(longest, time.monotonic() - start)
        if failed >= 6:
            break
    print("wedged store: %d writes refused; the longest write took %.2f s "
          "(backing_timeout 2 s)" % (failed, longest))
    assert failed >= 6, failed
    assert longest < 2.8, longest
elif mode == "slow":
    # Writes to the export take 1.5 s, within backing_timeout (2 s): a
    # write at the limit that needs several batches written back still
    # waits 2 s at most.
    longest = 0
    failed = 0
    for b in range(768):
        start = time.monotonic()
        try:
            h.pwrite(random_block(b), b * B)
        except nbd.Error as e:
            assert e.errno == "ENOSPC", e
            failed += 1
        longest = max(longest, time.monotonic() - start)
    s = stats()
    print("slow store: 768 writes, %d refused, %s blocks written back; the "
          "longest write took %.2f s (backing_timeout 2 s)"
          % (failed, s["bd_count"], longest))
    assert longest < 2.8, longest
h.shutdown()
EOF

run_mode ()
{
    local mode=$1; shift
    zram_nbdkit -U - "$PLUGIN" "$@" backing="nbd+unix:///?socket=$tmp/remote.sock" \
        ctl="$tmp/ctl-$mode" \
        --run "/usr/bin/python3 '$tmp/abandoned.py' \"\$uri\" '$tmp/ctl-$mode' $mode" ||
        fail "$mode: $(tail -5 "$NBDKIT_STDERR")"
}

eval_export 64M 0 1
run_mode late-trim 16M backing_timeout=1
remote_stop

eval_export 64M 1 0
run_mode late-write 16M backing_timeout=1
remote_stop

eval_export 256K 1 0
run_mode runaway 16M backing_timeout=1
grep -q "writeback stopped: .* quarantined" "$NBDKIT_STDERR" ||
    fail "runaway: no log line saying why writeback stopped"
remote_stop

truncate -s 64M "$tmp/full.img"
remote_start --filter=error file "$tmp/full.img" error=ENOSPC error-pwrite-rate=100%
run_mode full 64M mem_limit=1M backing_timeout=2
grep -q "backing: write of .*: the store is full" "$NBDKIT_STDERR" ||
    fail "full: the store's ENOSPC was not logged as such"
grep -q "mem_limit reached; writeback: the backing store is full" "$NBDKIT_STDERR" ||
    fail "full: the refused write's line does not say the backing store is full"
remote_stop

truncate -s 64M "$tmp/wedged.img"
remote_start --filter=delay file "$tmp/wedged.img" delay-write=60
run_mode wedged 64M mem_limit=1M backing_timeout=2
remote_stop

remote_start --filter=delay file "$tmp/wedged.img" delay-write=1500ms
run_mode slow 64M mem_limit=1M backing_timeout=2
remote_stop

# One server per backing file.
zram_nbdkit -U "$tmp/first.sock" -P "$tmp/first.pid" "$PLUGIN" 16M \
    backing="$tmp/backing.img"
cleanup_add 'kill "$(cat "$tmp/first.pid")" 2>/dev/null'
for _ in $(seq 100); do [ -s "$tmp/first.pid" ] && break; sleep 0.1; done
if zram_nbdkit -U - "$PLUGIN" 16M backing="$tmp/backing.img" --run true; then
    fail "a second server took a backing file that another has"
fi
grep -q "backing.img is in use by another server (process $(cat "$tmp/first.pid")" \
    "$NBDKIT_STDERR" || fail "no message naming the server that holds the file: $(cat "$NBDKIT_STDERR")"
echo "ok: abandoned backing requests cost no data; the store's errors say what they are"
