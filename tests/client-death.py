# Clients that die with requests in flight must not take the server down.
# Run by test-plugin-client-death.sh against a server started with -t 16:
#
#   python3 client-death.py URI            the test (starts the clients below)
#   python3 client-death.py URI survivor    a client that keeps I/O in flight
#                                       until told "stop", then verifies
#   python3 client-death.py URI victim K    a client that queues large reads
#                                       and writes, never reads a reply,
#                                       and waits to be killed or told
#                                       "close" (it then closes its socket)
#
# Each round, three victims queue their requests; two are killed with
# SIGKILL, one closes its socket.  The survivor keeps working through
# every round; at the end its data must verify, and a new client must
# connect and read it.
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

import nbd

MiB = 1 << 20
REQUEST = 4 * MiB               # large requests fill the socket buffers
VICTIM_READS = 32
VICTIM_WRITES = 8
VICTIM_AREA = 128 * MiB         # victim k uses [k * VICTIM_AREA, ...)
SURVIVOR_READ_AT = 512 * MiB    # written once, read every round
SURVIVOR_WRITE_AT = 576 * MiB   # rewritten every round
SURVIVOR_REQUESTS = 8           # of each, per round
ROUNDS = 2
TIMEOUT = 60                    # seconds a client may take to answer

uri = sys.argv[1]


def pattern(offset, tag):
    """REQUEST bytes, each 4 KiB block naming its offset and a tag."""
    return b"".join(struct.pack("<QQ", offset + block * 4096, tag) * 256
                    for block in range(REQUEST // 4096))


def connect():
    h = nbd.NBD()
    h.connect_uri(uri)
    return h


def stdin_line(timeout):
    """A line from the parent, or None if none came within timeout."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return sys.stdin.readline().strip() if ready else None


def run_to_completion(h, cookies):
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for cookie in cookies:
        h.aio_command_completed(cookie)     # raises on a failed command


def survivor():
    h = connect()
    for i in range(SURVIVOR_REQUESTS):
        offset = SURVIVOR_READ_AT + i * REQUEST
        h.pwrite(pattern(offset, 1), offset)
    print("ready", flush=True)
    rounds = 0
    while True:
        tag = 100 + rounds
        reads = []
        cookies = []
        for i in range(SURVIVOR_REQUESTS):
            offset = SURVIVOR_READ_AT + i * REQUEST
            buffer = nbd.Buffer(REQUEST)
            cookies.append(h.aio_pread(buffer, offset))
            reads.append((buffer, offset))
            offset = SURVIVOR_WRITE_AT + i * REQUEST
            cookies.append(h.aio_pwrite(
                nbd.Buffer.from_bytearray(bytearray(pattern(offset, tag))), offset))
        run_to_completion(h, cookies)
        for buffer, offset in reads:
            assert buffer.to_bytearray() == pattern(offset, 1), \
                "survivor: wrong data read at %d" % offset
        rounds += 1
        if stdin_line(0) == "stop":
            break
    for i in range(SURVIVOR_REQUESTS):
        offset = SURVIVOR_WRITE_AT + i * REQUEST
        assert h.pread(REQUEST, offset) == pattern(offset, tag), \
            "survivor: its last write at %d does not read back" % offset
    h.shutdown()
    print("ok %d rounds" % rounds, flush=True)


def victim(index):
    h = connect()
    base = index * VICTIM_AREA
    buffers = []
    for i in range(VICTIM_READS):
        buffers.append(nbd.Buffer(REQUEST))
        h.aio_pread(buffers[-1], base + i * REQUEST % VICTIM_AREA)
    for i in range(VICTIM_WRITES):
        offset = base + i * REQUEST
        buffers.append(nbd.Buffer.from_bytearray(bytearray(pattern(offset, 7))))
        h.aio_pwrite(buffers[-1], offset)
    # Send what the server will take, never reading a reply.
    fd = h.aio_get_fd()
    deadline = time.monotonic() + 0.5
    while (h.aio_get_direction() & nbd.AIO_DIRECTION_WRITE
           and time.monotonic() < deadline):
        select.select([], [fd], [], 0.05)
        h.aio_notify_write()
    print("queued %d" % h.aio_in_flight(), flush=True)
    if stdin_line(None) == "close":
        sock = socket.socket(fileno=os.dup(fd))
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        os.close(fd)
        print("closed", flush=True)
        stdin_line(None)
    os._exit(0)                 # not libnbd's clean-up on a closed socket


started = []


def start(*args):
    started.append(subprocess.Popen([sys.executable, __file__, uri] + list(args),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True))
    return started[-1]


def expect(process, word, who):
    ready, _, _ = select.select([process.stdout], [], [], TIMEOUT)
    assert ready, "%s: no %s within %d s: is the server down?" % (who, word, TIMEOUT)
    line = process.stdout.readline().strip()
    assert line.startswith(word), "%s said %r, not %s" % (who, line, word)
    return line


def main():
    survivor_process = start("survivor")
    expect(survivor_process, "ready", "survivor")
    for round in range(ROUNDS):
        victims = [start("victim", str(k)) for k in range(3)]
        for k, process in enumerate(victims):
            line = expect(process, "queued", "victim %d" % k)
            in_flight = int(line.split()[1])
            assert in_flight > VICTIM_READS // 2, \
                "victim %d: only %d requests in flight" % (k, in_flight)
            print("round %d: victim %d has %d requests in flight"
                  % (round, k, in_flight))
        time.sleep(0.5)         # the server's workers block sending replies
        victims[0].kill()
        victims[1].kill()
        victims[2].stdin.write("close\n")
        victims[2].stdin.flush()
        expect(victims[2], "closed", "victim 2")
        victims[2].stdin.close()
        for process in victims:
            process.wait()
        print("round %d: two victims killed, one closed its socket" % round)
        time.sleep(0.5)
        assert survivor_process.poll() is None, \
            "survivor: failed (exit status %d): is the server down?" \
            % survivor_process.returncode
    survivor_process.stdin.write("stop\n")
    survivor_process.stdin.flush()
    print("survivor: " + expect(survivor_process, "ok", "survivor"))
    assert survivor_process.wait() == 0, "survivor failed"

    h = connect()               # the server still takes new clients
    for i in range(SURVIVOR_REQUESTS):
        offset = SURVIVOR_READ_AT + i * REQUEST
        assert h.pread(REQUEST, offset) == pattern(offset, 1), \
            "new client: wrong data at %d" % offset
    h.pwrite(b"\xa5" * 4096, 0)
    assert h.pread(4096, 0) == b"\xa5" * 4096
    h.shutdown()
    print("new client: connected, the survivor's data verifies")


def test():
    try:
        main()
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()


if __name__ == "__main__":
    if len(sys.argv) == 2:
        test()
    elif sys.argv[2] == "survivor":
        survivor()
    else:
        victim(int(sys.argv[3]))
