# The workload of tests/test-plugin-faults.sh, run against the plugin's
# fault-injection build with one call failing somewhere:
#
#   fault_workload.py URI CTL_SOCKET STATS_FILE
#
# Requests: writes (compressible, incompressible, same-filled, zero
# blocks; one block and several), partial writes, reads, trims, zeroes
# with and without may-trim, flush; control commands (idle, recompress,
# pack, writeback, compact, stats) between them.  A request may fail only
# with ENOMEM, ENOSPC or EIO, and a failed write must leave each block as
# it was or as written (one block: as it was).  A control command may
# fail or lose its connection once; asked again, it must answer.  At the
# end every block must read back as a shadow disk says and the server
# must answer on the control socket: it kept serving.  Prints what failed.
import os
import sys
import time

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ctl_client import Ctl  # noqa: E402

BS = 4096
BLOCKS = 48
uri, ctl_path, stats_path = sys.argv[1:4]
h = nbd.NBD()
try:
    h.connect_uri(uri)
except nbd.Error as e:
    # A server that failed after it began listening (say, its threads
    # could not start after nbdkit's fork): the test checks it said why.
    print("refused: %s" % e)
    sys.exit(3)
size = h.get_size()
assert size == BLOCKS * BS, size
shadow = bytearray(size)
ctl = Ctl(ctl_path)
failures = []


def tolerated(name, e):
    # nbd.Error.errno is the name of the error ("ENOMEM").
    assert e.errno in ("ENOMEM", "ENOSPC", "EIO"), (name, e)
    failures.append(name)


def block(kind, seed):
    if kind % 4 == 0:
        text = b"the quick brown fox %d " % seed
        return (text * (BS // len(text) + 1))[:BS]
    if kind % 4 == 1:
        return os.urandom(BS)
    if kind % 4 == 2:
        return bytes([0x40 + seed % 64]) * BS
    return bytes(BS)


def settle(offset, data):
    """After a failed write: each block as it was or (several) as written."""
    first, last = offset // BS, (offset + len(data) - 1) // BS
    for b in range(first, last + 1):
        got = h.pread(BS, b * BS)
        new = bytearray(shadow[b * BS:(b + 1) * BS])
        lo, hi = max(offset, b * BS), min(offset + len(data), (b + 1) * BS)
        new[lo - b * BS:hi - b * BS] = data[lo - offset:hi - offset]
        old = got == shadow[b * BS:(b + 1) * BS]
        assert old or (got == new and first != last), "block %d damaged" % b
        shadow[b * BS:(b + 1) * BS] = got


def write(offset, data):
    try:
        h.pwrite(data, offset)
        shadow[offset:offset + len(data)] = data
    except nbd.Error as e:
        tolerated("write %d+%d" % (offset, len(data)), e)
        settle(offset, data)


def zero(offset, count, may_trim):
    try:
        h.zero(count, offset, 0 if may_trim else nbd.CMD_FLAG_NO_HOLE)
        shadow[offset:offset + count] = bytes(count)
    except nbd.Error as e:
        tolerated("zero %d+%d" % (offset, count), e)
        settle(offset, bytes(count))


def trim(offset, count):
    try:
        h.trim(count, offset)
    except nbd.Error as e:
        tolerated("trim %d+%d" % (offset, count), e)
        return
    # Whole blocks only are freed; the rest keeps its data.
    first = (offset + BS - 1) // BS
    for b in range(first, (offset + count) // BS):
        shadow[b * BS:(b + 1) * BS] = bytes(BS)


def read(offset, count):
    try:
        got = h.pread(count, offset)
    except nbd.Error as e:
        tolerated("read %d+%d" % (offset, count), e)
        return
    assert got == shadow[offset:offset + count], "read %d+%d" % (offset, count)


def read_all():
    for b in range(BLOCKS):
        read(b * BS, BS)


def command(line):
    """A control command; one failure (a dropped connection, an error
    reply) is allowed, the second try must answer."""
    for attempt in (1, 2):
        try:
            lines, good, last = ctl.command(line)
            if good:
                return lines
            failures.append("ctl %s: %s" % (line, last))
        except (AssertionError, OSError) as e:
            failures.append("ctl %s: %s" % (line, e))
    raise AssertionError("ctl %r failed twice" % line)


for b in range(BLOCKS):
    write(b * BS, block(b, b))
write(40 * BS, b"".join(block(0 if i % 3 else 1, 50 + i) for i in range(8)))
read_all()
write(4 * BS + 100, os.urandom(200))
write(5 * BS + 4000, os.urandom(96))
write(10 * BS + 3000, os.urandom(2000))
trim(14 * BS + 10, 3 * BS)
zero(18 * BS, 2 * BS, True)
zero(20 * BS, 2 * BS, False)
zero(22 * BS + 10, 50, False)
h.flush()
read_all()

command("idle all")
command("recompress type=huge_idle")
command("idle all")
command("pack")
read(0, 8 * BS)
write(8 * BS + 300, os.urandom(300))
command("idle all")
command("writeback idle")
read(24 * BS, 8 * BS)
write(33 * BS, block(0, 3))
trim(35 * BS, BS)
command("compact")
read_all()



def again(name, request):
    """A request that may meet the one failing call (a late one); asked
    again, it must succeed."""
    try:
        return request()
    except nbd.Error as e:
        tolerated(name, e)
        return request()


# It kept serving: every block again, and every request answered.
for b in range(BLOCKS):
    data = block(b + 1, b + 1000)
    again("write %d" % b, lambda: h.pwrite(data, b * BS))
    shadow[b * BS:(b + 1) * BS] = data
assert again("read all", lambda: h.pread(size, 0)) == shadow, "the device"
stats = {}
for line in command("stats"):
    key, _, value = line.partition(": ")
    stats[key] = value
assert int(stats["orig_data_size"]) > 0, stats
# STATS_WAIT=1: the stats file must come to show the device's last state
# (written again after a failed write) within a few rounds.
if os.environ.get("STATS_WAIT"):
    want = "orig_data_size: %d" % int(stats["orig_data_size"])
    for _ in range(100):
        try:
            with open(stats_path) as f:
                if want in f.read().split("\n"):
                    break
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    else:
        raise AssertionError("the stats file never showed %r" % want)
h.shutdown()
print("failed: %s" % (", ".join(failures) if failures else "nothing"))
