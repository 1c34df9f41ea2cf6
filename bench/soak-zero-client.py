#!/usr/bin/python3
# The soak test's fifth connection (bench/run-soak.sh): what fio's nbd
# engine cannot send.  One libnbd connection works on its own region of
# the device, against a shadow copy of that region kept in memory:
#
#   write  1-16 whole blocks, or part of one block (read-modify-write);
#   zero   1-16 whole blocks, or part of one block, with or without
#          NBD_CMD_FLAG_NO_HOLE (without it the server may trim);
#   trim   1-64 whole blocks;
#   read   1-16 blocks, compared with the shadow.
#
# The data is half random, half a repeated 16-byte word, so that it
# compresses about 2:1 like fio's.  A write or zero that fails with ENOSPC
# (the server's mem_limit) must leave the old contents: the range is read
# back at once and compared, block by block, with the old shadow; for a
# request of several blocks each block may hold either the old or the new
# contents (the server handles a request block by block), and the shadow
# takes what was read.  Any other error, or any mismatch, is counted and
# makes the exit status 1.  At the end the whole region is read back.
#
#   soak-zero-client.py URI OFFSET LENGTH SECONDS SEED JSON-OUT
import errno
import json
import random
import sys
import time

import nbd

BS = 4096


def main():
    uri, offset, length, seconds, seed, out = sys.argv[1:7]
    offset, length, seconds, seed = int(offset), int(length), float(seconds), int(seed)
    assert offset % BS == 0 and length % BS == 0 and length > 0
    nblocks = length // BS
    rng = random.Random(seed)
    h = nbd.NBD()
    h.connect_uri(uri)
    shadow = bytearray(length)  # the device is new: all zeros
    kinds = ("write", "write_partial", "zero_may_trim", "zero_no_hole",
             "zero_partial", "trim", "read")
    ops = {k: 0 for k in kinds}
    enospc = {k: 0 for k in kinds}
    ok_after_enospc = {k: 0 for k in kinds}
    first_enospc = None
    mismatches = []
    other_errors = []
    enospc_mixed = 0  # multi-block ENOSPC where some blocks took the new data
    bytes_written = 0

    def data(n):
        out = bytearray()
        while len(out) < n:
            out += rng.randbytes(2048) + rng.randbytes(16) * 128
        return bytes(out[:n])

    def check(where, off, cnt, what):
        got = h.pread(cnt, offset + off)
        want = bytes(shadow[off:off + cnt])
        if got != want:
            bad = next(i for i in range(cnt) if got[i] != want[i])
            mismatches.append("%s: offset %d (+%d bytes): byte %d differs "
                              "(read %#04x, expected %#04x)" %
                              (what, offset + off, cnt, offset + off + bad,
                               got[bad], want[bad]))
            shadow[off:off + cnt] = got  # report each corruption once
            return False
        return True

    def after_enospc(kind, off, cnt, new):
        # new: the bytes the request would have left (None: unknown).
        nonlocal enospc_mixed
        got = h.pread(cnt, offset + off)
        old = bytes(shadow[off:off + cnt])
        mixed = False
        for b in range(0, cnt, BS):
            g, o = got[b:b + BS], old[b:b + BS]
            if g == o:
                continue
            if cnt > BS and new is not None and g == new[b:b + BS]:
                mixed = True
                shadow[off + b:off + b + BS] = g
                continue
            mismatches.append("%s failed with ENOSPC but the block at "
                              "offset %d changed" % (kind, offset + off + b))
            shadow[off + b:off + b + BS] = g
        if mixed:
            enospc_mixed += 1

    def run(kind, fn, off, cnt, new):
        nonlocal first_enospc
        ops[kind] += 1
        try:
            fn()
        except nbd.Error as e:
            if e.errnum == errno.ENOSPC and kind not in ("trim", "read"):
                enospc[kind] += 1
                if first_enospc is None:
                    first_enospc = time.monotonic() - start
                after_enospc(kind, off, cnt, new)
                return False
            other_errors.append("%s at offset %d (+%d): %s" %
                                (kind, offset + off, cnt, e))
            return False
        if first_enospc is not None:
            ok_after_enospc[kind] += 1
        return True

    start = time.monotonic()
    deadline = start + seconds
    next_report = start + 60
    weights = [("write", 30), ("write_partial", 8), ("zero_may_trim", 8),
                ("zero_no_hole", 8), ("zero_partial", 6), ("trim", 12),
                ("read", 28)]
    population = [k for k, w in weights for _ in range(w)]
    while time.monotonic() < deadline and len(mismatches) < 20 \
            and len(other_errors) < 20:
        kind = rng.choice(population)
        if kind in ("write", "zero_may_trim", "zero_no_hole", "read"):
            n = min(rng.randint(1, 16), nblocks)
            off = rng.randrange(nblocks - n + 1) * BS
            cnt = n * BS
        elif kind == "trim":
            n = min(rng.randint(1, 64), nblocks)
            off = rng.randrange(nblocks - n + 1) * BS
            cnt = n * BS
        else:  # part of one block, 512-byte aligned
            a = rng.randrange(8)
            b = rng.randrange(a + 1, 9)
            off = rng.randrange(nblocks) * BS + a * 512
            cnt = (b - a) * 512
        if kind in ("write", "write_partial"):
            buf = data(cnt)
            if run(kind, lambda: h.pwrite(buf, offset + off), off, cnt, buf):
                shadow[off:off + cnt] = buf
                bytes_written += cnt
        elif kind in ("zero_may_trim", "zero_partial"):
            if run(kind, lambda: h.zero(cnt, offset + off), off, cnt,
                   bytes(cnt)):
                shadow[off:off + cnt] = bytes(cnt)
        elif kind == "zero_no_hole":
            if run(kind, lambda: h.zero(cnt, offset + off,
                                        flags=nbd.CMD_FLAG_NO_HOLE),
                   off, cnt, bytes(cnt)):
                shadow[off:off + cnt] = bytes(cnt)
        elif kind == "trim":
            if run(kind, lambda: h.trim(cnt, offset + off), off, cnt, None):
                shadow[off:off + cnt] = bytes(cnt)
        else:
            ops["read"] += 1
            check("read", off, cnt, "read")
        now = time.monotonic()
        if now >= next_report:
            next_report += 60
            print("soak-zero-client: %4.0f s: %d ops, %d ENOSPC, %d mismatches"
                  % (now - start, sum(ops.values()), sum(enospc.values()),
                     len(mismatches)), file=sys.stderr, flush=True)
    elapsed = time.monotonic() - start
    # Final sweep: the whole region, 1 MiB at a time.
    for off in range(0, length, 1 << 20):
        check("final", off, min(1 << 20, length - off), "final read")
    h.shutdown()
    result = {
        "seconds": round(elapsed, 1),
        "region_offset": offset, "region_length": length,
        "ops": ops, "enospc": enospc, "ok_after_first_enospc": ok_after_enospc,
        "first_enospc_s": None if first_enospc is None else round(first_enospc, 1),
        "enospc_partly_written": enospc_mixed,
        "ops_total": sum(ops.values()),
        "ops_per_s": round(sum(ops.values()) / elapsed, 1),
        "bytes_written": bytes_written,
        "mismatches": len(mismatches), "mismatch_list": mismatches[:20],
        "other_errors": len(other_errors), "other_error_list": other_errors[:20],
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result), file=sys.stderr)
    sys.exit(1 if mismatches or other_errors else 0)


if __name__ == "__main__":
    main()
