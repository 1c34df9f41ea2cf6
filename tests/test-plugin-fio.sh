#!/usr/bin/env bash
# Concurrent I/O with data verification: fio's nbd engine, 2 jobs x
# iodepth 16 on separate halves of the device, random writes then a
# verify pass (crc32c), and a mixed random read/write run with variable
# block sizes; half-compressible data.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires fio
# /usr/bin/python3 parses fio's JSON.
requires python3

# Check fio's JSON output: every job error 0, the expected bytes written
# and read back by the verify pass.
check_fio ()
{
    local json="$1" err="$2" what="$3" min_write="$4"
    if grep -Eiv "^fio: connected to NBD server$|^$" "$err" | grep -Eiq "verify|crc|bad|err|fail"; then
        cat "$err" >&2
        fail "$what: fio reported errors on stderr"
    fi
    python3 - "$json" "$what" "$min_write" <<'EOF' || fail "$what: fio results are wrong"
import json, sys
path, what, min_write = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(path).read()
data = json.loads(text[text.index("{"):])     # a blank line comes first
jobs = data["jobs"]
assert len(jobs) == 2, "%d jobs" % len(jobs)
for job in jobs:
    w, r = job["write"], job["read"]
    print("%s: %s error=%d wrote %d read %d" % (what, job["jobname"], job["error"],
                                              w["io_bytes"], r["io_bytes"]))
    assert job["error"] == 0, "job error %d" % job["error"]
    assert w["io_bytes"] >= min_write, "wrote %d < %d" % (w["io_bytes"], min_write)
    # The verify pass read back at least what was written.
    assert r["io_bytes"] >= min_write, "read %d < %d" % (r["io_bytes"], min_write)
EOF
}

# --uri is an option of the nbd engine: it must follow --ioengine.
common="--ioengine=nbd --numjobs=2 --iodepth=16 --verify=crc32c --do_verify=1"
common="$common --buffer_compress_percentage=50 --refill_buffers --output-format=json"
# No *-verify.state files left behind (fio also runs in $tmp).
common="$common --verify_state_save=0"
cd "$tmp"

echo "== test-plugin-fio: randwrite + verify, lz4"
zram_nbdkit -U - "$PLUGIN" 128M comp=lz4 --run "
    fio --name=randwrite $common --uri=\"\$uri\" --rw=randwrite --bs=4k \
        --size=64m --offset_increment=64m \
        > '$tmp/w.json' 2> '$tmp/w.err'" || {
    cat "$tmp/w.json" "$tmp/w.err" >&2
    fail "fio randwrite failed"
}
check_fio "$tmp/w.json" "$tmp/w.err" randwrite $((64 * 1024 * 1024))

echo "== test-plugin-fio: randrw + verify, zstd, lock=pool free=immediate"
zram_nbdkit -U - "$PLUGIN" 64M comp=zstd lock=pool free=immediate chain=2 --run "
    fio --name=randrw $common --uri=\"\$uri\" --rw=randrw --rwmixread=30 \
        --bsrange=512-64k --size=32m --offset_increment=32m \
        > '$tmp/rw.json' 2> '$tmp/rw.err'" || {
    cat "$tmp/rw.json" "$tmp/rw.err" >&2
    fail "fio randrw failed"
}
check_fio "$tmp/rw.json" "$tmp/rw.err" randrw $((8 * 1024 * 1024))

echo "== test-plugin-fio: randwrite unaligned 1k..12k + verify, lz4"
zram_nbdkit -U - "$PLUGIN" 32M --run "
    fio --name=unaligned $common --uri=\"\$uri\" --rw=randwrite \
        --bsrange=1k-12k --blockalign=1k --size=16m --offset_increment=16m \
        > '$tmp/u.json' 2> '$tmp/u.err'" || {
    cat "$tmp/u.json" "$tmp/u.err" >&2
    fail "fio unaligned randwrite failed"
}
check_fio "$tmp/u.json" "$tmp/u.err" unaligned $((16 * 1024 * 1024))
