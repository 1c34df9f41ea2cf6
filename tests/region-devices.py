# The parts of test-plugin-region-devices.sh that speak NBD and the
# control channel:
#
#   region-devices.py write SOCKET NAME SEED    a device's blocks, by seed
#   region-devices.py check SOCKET NAME SEED... each block one of the seeds'
#                                               (or zeros for seed 0)
#   region-devices.py churn SOCKET CTL JOURNAL  adds, writes and removes
#                                               until killed, each step
#                                               journalled before and after
#   region-devices.py verify SOCKET CTL JOURNAL the journal's devices whole
#                                               or gone, as it allows
import os, random, sys, time
import nbd
sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
from ctl_client import Ctl

B = 4096
BLOCKS = 64                     # blocks written of each device


def block(name, seed, b):
    if seed == 0:
        return bytes(B)
    text = "%s seed %d block %d " % (name, seed, b)
    return (text * (B // len(text) + 1)).encode()[:B]


def connect(sock, name):
    h = nbd.NBD()
    h.set_export_name(name)
    h.connect_unix(sock)
    return h


def write(sock, name, seed):
    h = connect(sock, name)
    for b in range(BLOCKS):
        h.pwrite(block(name, seed, b), b * 3 * B)
    h.shutdown()


def check(sock, name, seeds):
    """Every block written is one of seeds' (a write cut short leaves
    some blocks old, some new); the blocks between are zeros."""
    h = connect(sock, name)
    for b in range(BLOCKS):
        got = h.pread(B, b * 3 * B)
        assert any(got == block(name, s, b) for s in seeds), \
            (name, b, seeds, got[:40])
        assert h.pread(B, (b * 3 + 1) * B) == bytes(B), (name, b)
    h.shutdown()


CHURN = ["c%d" % i for i in range(4)]


def churn(sock, ctl, journal):
    """Until killed: add a device, write it, remove one; each step's
    line written before it starts and after it is acknowledged."""
    rnd = random.Random(os.getpid())
    log = open(journal, "a", buffering=1)
    present = set(l.split()[0] for l in ctl.ok("devices")[1:])
    seed = int(time.time() * 1000) % 1000000 * 10
    while True:
        name = rnd.choice(CHURN)
        if name not in present:
            log.write("begin add %s\n" % name)
            ctl.ok("add %s 2M comp=%s" % (name, rnd.choice(["lz4", "zstd"])))
            log.write("end add %s\n" % name)
            present.add(name)
        elif rnd.random() < 0.6:
            seed += 1
            log.write("begin write %s %d\n" % (name, seed))
            write(sock, name, seed)
            log.write("end write %s %d\n" % (name, seed))
        else:
            log.write("begin remove %s\n" % name)
            ctl.ok("remove %s" % name)
            log.write("end remove %s\n" % name)
            present.discard(name)


def expected(journal):
    """Per device: whether it may be absent, may be present, and the
    seeds its blocks may hold if present."""
    state = {}                  # name: (present, seeds, in_flight op)
    for line in open(journal):
        words = line.split()
        if len(words) < 3:
            break               # the last line, cut by the kill
        edge, op, name = words[:3]
        present, seeds, _ = state.get(name, (False, {0}, None))
        if edge == "begin":
            if op == "write":
                seeds = seeds | {int(words[3])}
            state[name] = (present, seeds, op)
        elif op == "add":
            state[name] = (True, {0}, None)
        elif op == "remove":
            state[name] = (False, {0}, None)
        else:
            state[name] = (present, {int(words[3])}, None)
    return state


def verify(sock, ctl, journal):
    listed = set(l.split()[0] for l in ctl.ok("devices")[1:])
    kept = 0
    for name, (present, seeds, op) in expected(journal).items():
        here = name in listed
        if op == "add":
            # Cut short: whole (empty) or gone.
            if here:
                check(sock, name, {0})
        elif op == "remove":
            if here:
                check(sock, name, seeds)
        else:
            assert here == present, (name, here, present, op)
            if here:
                check(sock, name, seeds)
        kept += here
    for name in (listed & set(CHURN)) - set(expected(journal)):
        raise AssertionError("a device no step made: %s" % name)
    print(kept)


action = sys.argv[1]
if action == "write":
    write(sys.argv[2], sys.argv[3], int(sys.argv[4]))
elif action == "check":
    check(sys.argv[2], sys.argv[3], {int(s) for s in sys.argv[4:]})
elif action == "churn":
    churn(sys.argv[2], Ctl(sys.argv[3]), sys.argv[4])
elif action == "verify":
    verify(sys.argv[2], Ctl(sys.argv[3]), sys.argv[4])
else:
    raise SystemExit("unknown action %s" % action)
