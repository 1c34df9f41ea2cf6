# The client of tests/test-plugin-crash-loop.sh: one serving server's
# life between two SIGKILLs.
#
#   crash_loop_client.py SOCKET CTL_SOCKET STATS_FILE SERVER_PID SHADOW \
#       BLOCKS SEED MODE [WRITE_SECONDS]
#
# The shadow (a JSON file) is the exact state of the device as the
# client knows it: per block the version last acknowledged (0: never
# written) and the versions whose write was sent but never answered (in
# flight when the server died, or failed): such a block may read as any
# of them.  A block's content follows from its number and version alone,
# and says which it is where it can (text and random blocks carry both),
# so a mismatch is reported as the block, the versions expected and the
# version got.
#
# MODE verify: read every block, compare with the shadow, settle each
# block on the version it read (so the next cycle expects one version).
# MODE verify-write: the same, then (a fresh shadow: every block written
# first, so that the region holds tens of thousands of blocks) write
# with 16 requests in flight for WRITE_SECONDS, asking the control
# channel for the movers meanwhile, then SIGKILL the server with its
# requests in flight, wait for the connection to drop, and save what was
# acknowledged.  Prints one line "result: key=value ..." for the test.
# MODE follow-write: the same on another export of the server, without
# the kill: it writes until the connection drops (the verify-write
# client of the default export kills the server), the movers asked for
# that export.
#
# The environment: CRASH_LOOP_EXPORT, the export's name (default "", the
# default export); CRASH_LOOP_READY, a file made once this client has
# checked (and, fresh, filled) its export - or has failed; CRASH_LOOP_WAIT_FOR,
# such a file waited for (up to 120 s) before the writes that end in the
# kill, so that the kill never lands in another client's check.
# Exits 10 on a mismatch (the shadow is then left as it was), 2 when the
# server is unusable, 3 when it failed a request while serving (what the
# request did is still recorded as possible).
import errno
import json
import os
import random
import signal
import socket
import struct
import sys
import time

import nbd

BS = 4096
QUEUE_DEPTH = 16
READ_BLOCKS = 64                 # 256 KiB reads for the check
MISMATCHES_SHOWN = 20
MISMATCH = 10                    # the exit status (1 is Python's own)

# A version is seq << 3 | kind: unique per request, its kind inside.
TEXT, RANDOM, SAME, ZERO_WRITE, PARTIAL, TRIM, ZERO, ZERO_MAY_TRIM = range(8)
KIND_NAMES = ["text", "random", "same-filled", "zeros written", "partial",
              "trim", "zero", "zero may-trim"]
# Kinds and their weights: compressible text, incompressible (stored
# raw), same-filled, zeros written with WRITE, a block mostly zeros
# (a small size class), and the three ways to make a block zeros
# without data.
KIND_WEIGHTS = [(TEXT, 30), (RANDOM, 22), (SAME, 10), (ZERO_WRITE, 5),
                (PARTIAL, 15), (TRIM, 6), (ZERO, 6), (ZERO_MAY_TRIM, 6)]
# Request lengths in blocks (4 KiB to 256 KiB) and their weights.
LENGTH_WEIGHTS = [((1, 1), 30), ((2, 8), 40), ((9, 32), 20), ((33, 64), 10)]

# Incompressible bytes, the same in every process; a random block is a
# slice of them after a header naming the block and version.
POOL = random.Random(0x5EED).randbytes(1 << 20)
HEADER = struct.Struct("<8sQQ")
MAGIC = b"crashlp\0"
ZEROS = bytes(BS)


def version_name(v):
    if v == 0:
        return "0 (never written)"
    return "%d (%s)" % (v, KIND_NAMES[v & 7])


def content(b, v):
    """Block b at version v."""
    if v == 0:
        return ZEROS
    kind = v & 7
    if kind == TEXT:
        line = b"block %d version %d: the quick brown fox jumps over the " \
               b"lazy dog\n" % (b, v)
        return (line * (BS // len(line) + 1))[:BS]
    if kind in (RANDOM, PARTIAL):
        start = (b * 2654435761 + v * 40503) % (len(POOL) - BS)
        header = HEADER.pack(MAGIC, b, v)
        if kind == RANDOM:
            return header + POOL[start:start + BS - HEADER.size]
        return header + POOL[start:start + 512] + bytes(BS - 512 - HEADER.size)
    if kind == SAME:
        return bytes([(b * 7 + (v >> 3)) % 255 + 1]) * BS
    return ZEROS                 # zeros written, trim, zero


def describe(b, got):
    """What a block read holds, as far as its content says."""
    if got == ZEROS:
        return "zeros"
    if got[:len(MAGIC)] == MAGIC:
        _, ob, ov = HEADER.unpack(got[:HEADER.size])
        exact = content(ob, ov) == got
        return "version %s of block %d%s" % (version_name(ov), ob,
                                             "" if exact else ", damaged")
    if got.startswith(b"block "):
        words = got[:64].split()
        try:
            ob, ov = int(words[1]), int(words[3].rstrip(b":"))
            exact = content(ob, ov) == got
            return "version %s of block %d%s" % (version_name(ov), ob,
                                                 "" if exact else ", damaged")
        except (IndexError, ValueError):
            pass
    if got == got[:1] * BS:
        return "same-filled 0x%02x" % got[0]
    return "unrecognised bytes (first 16: %s)" % got[:16].hex()


class Shadow:
    def __init__(self, path, blocks):
        self.path = path
        self.blocks = blocks
        if os.path.exists(path):
            with open(path) as f:
                state = json.load(f)
            assert state["blocks"] == blocks, (state["blocks"], blocks)
            self.seq = state["seq"]
            self.acked = state["acked"]
            self.maybe = {int(b): vs for b, vs in state["maybe"].items()}
            self.fresh = False
        else:
            self.seq = 1
            self.acked = [0] * blocks
            self.maybe = {}
            self.fresh = True

    def save(self):
        state = {"blocks": self.blocks, "seq": self.seq, "acked": self.acked,
                 "maybe": {str(b): vs for b, vs in self.maybe.items()}}
        temporary = self.path + ".new"
        with open(temporary, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(temporary, self.path)

    def next_version(self, kind):
        v = self.seq << 3 | kind
        self.seq += 1
        return v


def verify(h, shadow):
    """Read every block; returns (blocks checked, mismatches), printing
    the first mismatches.  Each matching block is settled on the version
    it read."""
    mismatches = []
    settled = {}
    for first in range(0, shadow.blocks, READ_BLOCKS):
        count = min(READ_BLOCKS, shadow.blocks - first)
        data = h.pread(count * BS, first * BS)
        for i in range(count):
            b = first + i
            got = data[i * BS:(i + 1) * BS]
            candidates = [shadow.acked[b]] + shadow.maybe.get(b, [])
            match = next((v for v in candidates if content(b, v) == got), None)
            if match is None:
                mismatches.append((b, candidates, got))
            elif b in shadow.maybe:
                settled[b] = match
    for b, candidates, got in mismatches[:MISMATCHES_SHOWN]:
        print("mismatch: block %d: expected version %s%s, got %s"
              % (b, version_name(candidates[0]),
                 "".join(" or (in flight) %s" % version_name(v)
                         for v in candidates[1:]),
                 describe(b, got)), flush=True)
    if len(mismatches) > MISMATCHES_SHOWN:
        print("mismatch: ... %d more blocks" %
              (len(mismatches) - MISMATCHES_SHOWN), flush=True)
    if not mismatches:
        for b, v in settled.items():
            shadow.acked[b] = v
        shadow.maybe.clear()
    return shadow.blocks, len(mismatches)


class Control:
    """The movers asked for on the control channel, one command at a
    time, without waiting: a command runs while the writes go on, and
    the kill may land in it."""
    COMMANDS = ["idle all", "pack", "pack max_pages=256",
                "recompress type=idle max_pages=512", "recompress type=huge",
                "writeback idle max_pages=1024", "writeback huge max_pages=256",
                "compact", "dissolve 60"]

    def __init__(self, path, rnd, export=""):
        self.rnd = rnd
        self.suffix = " device=%s" % export if export else ""
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.sock.setblocking(False)
        self.pending = None
        self.received = b""
        self.answered = 0
        self.moved = {}
        self.next_at = time.monotonic()

    def command_sync(self, line, deadline_seconds=30):
        """A command answered before it returns (the socket idle)."""
        assert self.pending is None
        self.sock.setblocking(True)
        self.sock.settimeout(deadline_seconds)
        try:
            self.sock.sendall(line.encode() + b"\n")
            data = b""
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise OSError("the control connection closed")
                data += chunk
                lines = data.decode().split("\n")
                for i, last in enumerate(lines[:-1]):
                    if last == "ok" or last.startswith("error: "):
                        return lines[:i], last == "ok"
        finally:
            self.sock.setblocking(False)

    def stats(self):
        lines, good = self.command_sync("stats")
        assert good, "control channel: stats refused"
        return dict(line.split(": ", 1) for line in lines if ": " in line)

    # What each command's reply says it moved: (command, reply key) ->
    # the name counted.
    MOVED = {("pack", "blocks"): "ctl_packed",
             ("writeback", "blocks"): "ctl_written_back",
             ("recompress", "recompressed"): "ctl_recompressed",
             ("compact", "pages_compacted"): "ctl_compacted",
             ("dissolve", "dissolved"): "ctl_dissolved"}

    def answer(self, lines):
        """Count what the pending command's reply says it moved."""
        command = self.pending.split()[0]
        for line in lines:
            words = line.split()
            if len(words) == 2 and words[1].isdigit():
                name = self.MOVED.get((command, words[0]))
                if name:
                    self.moved[name] = self.moved.get(name, 0) + int(words[1])

    def tick(self, now):
        """Collect an answer, send the next command when it is time."""
        if self.pending is not None:
            try:
                chunk = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                chunk = None
            except OSError:
                chunk = b""
            if chunk == b"":         # the server went away
                self.pending = None
                self.next_at = float("inf")
                return
            if chunk:
                self.received += chunk
                lines = self.received.decode(errors="replace").split("\n")
                for i, line in enumerate(lines[:-1]):
                    if line == "ok" or line.startswith("error: "):
                        if line == "ok":
                            self.answer(lines[:i])
                        self.pending = None
                        self.received = b""
                        self.answered += 1
                        break
        if self.pending is None and now >= self.next_at:
            line = self.rnd.choice(self.COMMANDS) + self.suffix
            try:
                self.sock.send(line.encode() + b"\n")
            except OSError:
                self.next_at = float("inf")
                return
            self.pending = line
            self.next_at = now + self.rnd.uniform(0.05, 0.3)


def read_stats(path):
    """The stats file's integer fields (none if it is not there yet)."""
    values = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(": ")
                if value.strip().isdigit():
                    values[key] = int(value)
    except FileNotFoundError:
        pass
    return values


def weighted(rnd, choices):
    total = sum(w for _, w in choices)
    pick = rnd.uniform(0, total)
    for value, weight in choices:
        pick -= weight
        if pick <= 0:
            return value
    return choices[-1][0]


class Writer:
    def __init__(self, h, shadow, rnd):
        self.h = h
        self.shadow = shadow
        self.rnd = rnd
        self.busy = bytearray(shadow.blocks)   # blocks of requests in flight
        self.inflight = {}                     # cookie -> (first, count, v, buffer)
        self.acked_requests = 0
        self.failed_requests = 0
        self.failed_while_serving = []

    def issue(self, first, count, kind):
        v = self.shadow.next_version(kind)
        offset, length = first * BS, count * BS
        buffer = None
        if kind == TRIM:
            cookie = self.h.aio_trim(length, offset)
        elif kind == ZERO:
            cookie = self.h.aio_zero(length, offset, flags=nbd.CMD_FLAG_NO_HOLE)
        elif kind == ZERO_MAY_TRIM:
            cookie = self.h.aio_zero(length, offset)
        else:
            data = b"".join(content(first + i, v) for i in range(count))
            buffer = nbd.Buffer.from_bytearray(bytearray(data))
            cookie = self.h.aio_pwrite(buffer, offset)
        for b in range(first, first + count):
            self.busy[b] = 1
            self.shadow.maybe.setdefault(b, []).append(v)
        self.inflight[cookie] = (first, count, v, buffer)

    def issue_random(self):
        low, high = weighted(self.rnd, LENGTH_WEIGHTS)
        count = self.rnd.randint(low, high)
        # Requests in flight never overlap: a block has one version in
        # flight at most, and the order of its versions is known.
        for _ in range(8):
            first = self.rnd.randrange(0, self.shadow.blocks - count + 1)
            if not any(self.busy[first:first + count]):
                self.issue(first, count, weighted(self.rnd, KIND_WEIGHTS))
                return True
        return False

    def reap(self, serving):
        """Settle the requests that completed: answered ones become the
        blocks' versions, failed ones stay possible."""
        for cookie in list(self.inflight):
            first, count, v, _ = self.inflight[cookie]
            try:
                if not self.h.aio_command_completed(cookie):
                    continue
                good = True
            except nbd.Error as e:
                good = False
                # Cut off by the kill (another client's): not a failure
                # of the serving server's.
                if serving and e.errno not in (errno.ENOTCONN, errno.ESHUTDOWN,
                                               errno.EPIPE, errno.ECONNRESET):
                    self.failed_while_serving.append(
                        "%d+%d (%s): %s" % (first, count, KIND_NAMES[v & 7], e))
            del self.inflight[cookie]
            for b in range(first, first + count):
                self.busy[b] = 0
                if good:
                    self.shadow.acked[b] = v
                    del self.shadow.maybe[b]
            if good:
                self.acked_requests += 1
            else:
                self.failed_requests += 1

    def poll(self, timeout_ms):
        """One round of the handle; False once the connection is gone."""
        try:
            self.h.poll(timeout_ms)
        except nbd.Error:
            return False
        return not (self.h.aio_is_dead() or self.h.aio_is_closed())


def fill(writer, follower=False):
    """Every block written once, in order, mixed kinds, so that the
    region holds the whole device.  False if the connection dropped
    (a follower's: the other client killed the server)."""
    first = 0
    blocks = writer.shadow.blocks
    while first < blocks or writer.inflight:
        while first < blocks and len(writer.inflight) < QUEUE_DEPTH:
            count = min(blocks - first, writer.rnd.randint(16, 64))
            kind = weighted(writer.rnd, [(TEXT, 35), (RANDOM, 25), (SAME, 10),
                                         (PARTIAL, 30)])
            writer.issue(first, count, kind)
            first += count
        if not writer.poll(1000):
            if follower:
                return False
            raise SystemExit("the server went away while the device was "
                             "being filled")
        writer.reap(serving=True)
    return True


def follow_write(writer, ctl, ready):
    """Write until the connection drops.  Returns False if it did not
    within 120 s."""
    alive = fill(writer, follower=True) if writer.shadow.fresh else True
    ready()
    deadline = time.monotonic() + 120
    while alive:
        now = time.monotonic()
        if now > deadline:
            return False
        while len(writer.inflight) < QUEUE_DEPTH:
            if not writer.issue_random():
                break
        ctl.tick(now)
        alive = writer.poll(20)
        writer.reap(serving=alive)
    writer.reap(serving=False)
    return True


def writer_result(writer, ctl, result):
    """What the writes and the movers did, into result; the requests
    acknowledged.  What never completed stays possible (shadow.maybe)."""
    result["unanswered"] = writer.failed_requests + len(writer.inflight)
    result["ctl_answered"] = ctl.answered
    result.update(ctl.moved)
    if writer.failed_while_serving:
        for line in writer.failed_while_serving[:10]:
            print("failed while serving: %s" % line, flush=True)
        result["failed_while_serving"] = len(writer.failed_while_serving)
    return writer.acked_requests


def wait_for(path):
    """False if path did not appear within 120 s."""
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def main():
    sock_path, ctl_path, stats_path, pid, shadow_path = sys.argv[1:6]
    blocks, seed = int(sys.argv[6]), int(sys.argv[7])
    mode = sys.argv[8]
    write_seconds = float(sys.argv[9]) if len(sys.argv) > 9 else 0.0
    server_pid = int(pid)
    rnd = random.Random(seed)
    shadow = Shadow(shadow_path, blocks)
    export = os.environ.get("CRASH_LOOP_EXPORT", "")
    ready_path = os.environ.get("CRASH_LOOP_READY")

    def ready():
        if ready_path:
            open(ready_path, "w").close()

    try:
        return run(sock_path, ctl_path, stats_path, server_pid, shadow,
                   blocks, rnd, mode, write_seconds, export, ready)
    finally:
        ready()


def run(sock_path, ctl_path, stats_path, server_pid, shadow, blocks, rnd,
        mode, write_seconds, export, ready):
    h = nbd.NBD()
    h.set_export_name(export)
    try:
        h.connect_unix(sock_path)
    except nbd.Error as e:
        print("the server refused the connection: %s" % e, flush=True)
        return 2
    if h.get_size() != blocks * BS:
        print("the server serves %d bytes, not %d" % (h.get_size(), blocks * BS))
        return 2
    ctl = Control(ctl_path, rnd, export)
    taken_over = ctl.stats()

    try:
        checked, mismatches = verify(h, shadow)
    except nbd.Error as e:
        print("the server failed a read of the check: %s" % e, flush=True)
        return 2
    result = {"checked": checked, "mismatches": mismatches,
              "recovered_blocks": int(taken_over.get("recovered_blocks", 0)),
              "recovery_ms": round(float(taken_over.get("recovery_seconds", 0))
                                   * 1000)}
    if mismatches:
        print("result: " + " ".join("%s=%s" % kv for kv in result.items()),
              flush=True)
        return MISMATCH

    acked = 0
    if mode == "follow-write":
        writer = Writer(h, shadow, rnd)
        if not follow_write(writer, ctl, ready):
            print("the connection did not drop within 120 s", flush=True)
            shadow.save()
            return 2
        acked = writer_result(writer, ctl, result)
    if mode == "verify-write":
        writer = Writer(h, shadow, rnd)
        if shadow.fresh:
            fill(writer)
        wait_for_path = os.environ.get("CRASH_LOOP_WAIT_FOR")
        if wait_for_path and not wait_for(wait_for_path):
            print("%s did not appear within 120 s" % wait_for_path, flush=True)
            return 2
        start = time.monotonic()
        kill_at = start + write_seconds
        killed_at = None
        alive = True
        while True:
            now = time.monotonic()
            if killed_at is None and now >= kill_at:
                # Every request slot full, the movers asked for: the
                # server dies with requests in flight.
                os.kill(server_pid, signal.SIGKILL)
                killed_at = now
                result["inflight_at_kill"] = len(writer.inflight)
                # What the movers had done by then (the stats file of the
                # last housekeeping round).
                movers = read_stats(stats_path)
                for key in ("bd_writes", "bd_count", "packed_blocks",
                            "recomp_blocks", "pages_compacted",
                            "bd_readbacks"):
                    result[key] = movers.get(key, 0)
            if killed_at is None:
                while len(writer.inflight) < QUEUE_DEPTH:
                    if not writer.issue_random():
                        break
                ctl.tick(now)
            if killed_at is not None and (not alive or not writer.inflight):
                break
            if killed_at is not None and now > killed_at + 30:
                print("the connection did not drop 30 s after the server's "
                      "SIGKILL", flush=True)
                return 2
            if alive:
                alive = writer.poll(20)
            if not alive and killed_at is None:
                print("the server went away before it was killed", flush=True)
                writer.reap(serving=False)
                shadow.save()
                return 2
            writer.reap(serving=killed_at is None)
        writer.reap(serving=False)
        acked = writer_result(writer, ctl, result)
    result["acked"] = acked
    shadow.save()
    print("result: " + " ".join("%s=%s" % kv for kv in result.items()),
          flush=True)
    # With a cold tier to make room in, a request the serving server
    # failed is a fault of its own.
    return 3 if "failed_while_serving" in result else 0


if __name__ == "__main__":
    sys.exit(main())
