#!/usr/bin/python3
# Fuzz the plugin through the NBD request stream, nbdkit's own way
# (nbdkit's fuzzing/ directory): `nbdkit -s` serves one client on
# stdin/stdout, and stdin is a whole client byte stream - the fixed
# newstyle handshake, options (GO, INFO, LIST, STRUCTURED_REPLY,
# SET/LIST_META_CONTEXT, malformed and unknown ones), then requests
# (READ, WRITE, TRIM, WRITE_ZEROES with NO_HOLE/FAST_ZERO, FLUSH,
# BLOCK_STATUS, CACHE, DISC, bogus types and flags, offsets and lengths
# around the device's end and far beyond, zero and huge lengths, bad
# magic, truncated payloads), so that hostile sequences reach the real
# callbacks in the real server.
#
# A finding: nbdkit killed by a signal, a sanitizer report (ASan, UBSan,
# TSan) or an assertion on its stderr, no exit within the timeout, or a
# wrong answer.  For the last, every stream is parsed the way nbdkit 1.42
# parses it (which options end the handshake, which requests it refuses
# and with which error, where a write's payload ends) and the server's
# replies are followed: with one worker thread (threads=1, nbdkit -t 1)
# requests are served in order, so every READ must return what a shadow
# disk built from the stream's own successful writes, trims and zeroes
# holds (never written or trimmed: zeros; a failed write leaves its range
# unknown), every BLOCK_STATUS extent flagged zero must read as zeros, a
# request nbdkit accepts must succeed (a WRITE may fail with ENOSPC under
# mem_limit) and one it refuses must fail with the error nbdkit gives.
#
# With more worker threads (threads=2 or 16) only crashes, reports and
# hangs count: replies may come in any order.
#
# stdin and stdout are one end of a socket pair, as in nbdkit's libFuzzer
# harness (server/fuzzer.c); --pipes makes them two pipes.  With pipes and
# several worker threads nbdkit 1.42.3 itself can abort (raw_send_other:
# Assertion `sock >= 0' failed: a worker replies after another closed the
# output on a bad request; the socket path returns EBADF since 1.34), so
# that is not the default; corpus-nbd/crash-nbdkit-pipes-* reproduces it
# with --pipes, now and then.
#
# An input file is one line of plugin parameters then the stream:
#   NBDFUZZ1 size=1M comp=zstd mem_limit=256K threads=1\n<client bytes>
# (only the keys in PARAM_KEYS are passed on; a file without the line is
# all stream, served with size=1M).
#
# Modes (the server and plugin: --nbdkit, --plugin, or $NBDKIT, $PLUGIN;
# the sanitizer runtime is preloaded as tests/functions.sh does, from
# $SANITIZERS or the plugin's own dependencies):
#   nbd_stream.py --replay DIR-OR-FILE... [--random N --seed S]
#       each input once (and N generated from seed S); exit 1 on a finding
#   nbd_stream.py --write-corpus DIR --count N --seed S
#       write N generated streams as a seed corpus
#   nbd_stream.py --seconds N --corpus DIR --out DIR [--jobs J]
#       fuzz for N seconds: mutate and generate, keep the inputs that reach
#       a new reply, error or message pattern in OUT/corpus/ and every
#       finding in OUT/ (crash-SHA1 with crash-SHA1.txt saying why)
#
# The long run (from the top of the tree, with an ASan+UBSan build in
# build-asan/; here 30 minutes on 2 cores):
#   PLUGIN=build-asan/plugin/.libs/nbdkit-zram-plugin.so NBDKIT=build/nbdkit/sbin/nbdkit \
#     /usr/bin/python3 tests/fuzz/nbd_stream.py --seconds 1800 --jobs 2 \
#       --corpus tests/fuzz/corpus-nbd --out build-asan/fuzz-nbd

import argparse
import hashlib
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# ---- the protocol ---------------------------------------------------------
NBD_MAGIC = 0x4e42444d41474943            # "NBDMAGIC"
NBD_NEW_VERSION = 0x49484156454F5054      # "IHAVEOPT"
NBD_REP_MAGIC = 0x0003e889045565a9
NBD_REQUEST_MAGIC = 0x25609513
NBD_SIMPLE_REPLY_MAGIC = 0x67446698
NBD_STRUCTURED_REPLY_MAGIC = 0x668e33ef

FLAG_FIXED_NEWSTYLE = 1
FLAG_NO_ZEROES = 2

OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_PEEK_EXPORT, OPT_STARTTLS, \
    OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY, OPT_LIST_META_CONTEXT, \
    OPT_SET_META_CONTEXT, OPT_EXTENDED_HEADERS = range(1, 12)
REP_ACK, REP_SERVER, REP_INFO, REP_META_CONTEXT = 1, 2, 3, 4
INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE = 0, 1, 2, 3

CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM, CMD_CACHE, \
    CMD_WRITE_ZEROES, CMD_BLOCK_STATUS, CMD_RESIZE = range(9)
CMD_NAMES = {0: "READ", 1: "WRITE", 2: "DISC", 3: "FLUSH", 4: "TRIM",
             5: "CACHE", 6: "ZERO", 7: "BLOCK_STATUS"}
CMD_FLAG_FUA, CMD_FLAG_NO_HOLE, CMD_FLAG_DF, CMD_FLAG_REQ_ONE, \
    CMD_FLAG_FAST_ZERO, CMD_FLAG_PAYLOAD_LEN = 1, 2, 4, 8, 16, 32
KNOWN_CMD_FLAGS = 0x1f

REPLY_FLAG_DONE = 1
REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_OFFSET_HOLE, \
    REPLY_TYPE_BLOCK_STATUS = 0, 1, 2, 5
STATE_HOLE, STATE_ZERO = 1, 2

FLAG_HAS_FLAGS, FLAG_READ_ONLY, FLAG_SEND_FLUSH, FLAG_SEND_FUA = 1, 2, 4, 8
FLAG_SEND_TRIM, FLAG_SEND_WRITE_ZEROES, FLAG_SEND_CACHE = 0x20, 0x40, 0x400

# errno (Linux) -> NBD error, as nbdkit's nbd_errno maps them.
EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EROFS, ESHUTDOWN = 1, 5, 12, 22, 28, 30, 108
NBD_ERR = {0: 0, EPERM: 1, EROFS: 1, EIO: 5, ENOMEM: 12, ENOSPC: 28,
           EINVAL: 22, ESHUTDOWN: 108}

# nbdkit 1.42's limits.
MAX_NR_OPTIONS = 32
MAX_REQUEST_SIZE = 64 << 20
NBD_MAX_STRING = 4096
BLOCK = 4096

HEADER_MAGIC = b"NBDFUZZ1"
# Plugin parameters a corpus line may set, and the values they may take.
PARAM_KEYS = ("size", "comp", "level", "mem_limit", "compact", "chain",
              "lock", "free", "compact_threshold")
# nbdkit's own: threads (-t N), ro (-r).
SERVER_KEYS = ("threads", "ro")
VALUE_RE = re.compile(r"^-?[0-9A-Za-z]{1,24}$")

SANITIZER_RE = re.compile(
    r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|WARNING: ThreadSanitizer|"
    r"ThreadSanitizer:|runtime error:|UndefinedBehaviorSanitizer|"
    r"Assertion .* failed|AddressSanitizer:DEADLYSIGNAL")


def be16(b, o):
    return struct.unpack_from(">H", b, o)[0]


def be32(b, o):
    return struct.unpack_from(">I", b, o)[0]


def be64(b, o):
    return struct.unpack_from(">Q", b, o)[0]


def parse_size(s):
    m = re.match(r"^([0-9]+)([kKmMgGtTpPeE]?)$", s)
    if not m:
        return None
    shift = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40, "p": 50, "e": 60}
    return int(m.group(1)) << shift[m.group(2).lower()]


# ---- inputs: a parameter line and a stream --------------------------------
def split_input(data):
    """(params dict, stream bytes) of an input file."""
    params = {}
    stream = data
    if data.startswith(HEADER_MAGIC):
        nl = data.find(b"\n")
        if nl != -1:
            line = data[len(HEADER_MAGIC):nl].decode("ascii", "replace")
            stream = data[nl + 1:]
            for word in line.split():
                k, _, v = word.partition("=")
                if (k in PARAM_KEYS or k in SERVER_KEYS) and VALUE_RE.match(v):
                    params[k] = v
    size = parse_size(params.get("size", ""))
    if size is None or not 1 <= size <= (1 << 63) - 1:
        params["size"] = "1M"
    return params, stream


def join_input(params, stream):
    line = " ".join("%s=%s" % (k, params[k]) for k in
                    list(PARAM_KEYS) + list(SERVER_KEYS) if k in params)
    return HEADER_MAGIC + b" " + line.encode() + b"\n" + stream


# ---- the server's reading of a client stream ------------------------------
class Request:
    __slots__ = ("pos", "cmd", "flags", "cookie", "offset", "count",
                 "payload", "error", "reply")

    def __init__(self, pos, cmd, flags, cookie, offset, count):
        self.pos = pos              # offset of the header in the stream
        self.cmd = cmd
        self.flags = flags
        self.cookie = cookie
        self.offset = offset
        self.count = count
        self.payload = None         # WRITE data
        self.error = None           # errno nbdkit refuses it with, or 0
        self.reply = True           # a reply is due


class Reading:
    """What nbdkit 1.42 makes of a client stream: where the handshake
    ends, what it negotiated, the requests and where each one starts."""

    def __init__(self, stream):
        self.stream = stream
        self.cflags = None
        self.options = []           # (pos, option, optlen)
        self.phase_end = None       # stream offset of the first request
        self.how = "eof-handshake"  # how the handshake ended
        self.structured = False
        self.meta = False
        self.export_name_finish = False
        self.requests = []
        self.end = None             # how the transmission phase ended
        self.parse_handshake()

    def parse_handshake(self):
        s = self.stream
        if len(s) < 4:
            self.how = "eof-cflags"
            return
        self.cflags = be32(s, 0)
        if self.cflags & ~(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES):
            self.how = "bad-cflags"
            return
        fixed = self.cflags & FLAG_FIXED_NEWSTYLE
        pos = 4
        nr = MAX_NR_OPTIONS
        list_seen = False
        meta_export = None
        while nr > 0:
            nr -= 1
            if pos + 16 > len(s):
                self.how = "eof-option"
                return
            version, option, optlen = struct.unpack_from(">QII", s, pos)
            self.options.append((pos, option, optlen))
            pos += 16
            if version != NBD_NEW_VERSION:
                self.how = "bad-option-magic"
                return
            if optlen > MAX_REQUEST_SIZE:
                self.how = "option-too-long"
                return
            if not fixed and option != OPT_EXPORT_NAME:
                continue            # ERR_INVALID, the data is not read
            data = s[pos:pos + optlen]

            def take():
                nonlocal pos
                if pos + optlen > len(s):
                    return False
                pos += optlen
                return True

            def good_string(buf, n, maxlen):
                return n <= NBD_MAX_STRING and n <= maxlen and \
                    b"\0" not in buf[:n]

            if option == OPT_EXPORT_NAME:
                if not take():
                    self.how = "eof-option-data"
                    return
                if not good_string(data, optlen, optlen):
                    self.how = "bad-export-name"
                    return
                self.finish(meta_export, data)
                self.how = "export-name"
                self.export_name_finish = True
                self.phase_end = pos
                return
            elif option == OPT_ABORT:
                self.how = "abort"
                return
            elif option in (OPT_LIST, OPT_STARTTLS, OPT_STRUCTURED_REPLY):
                if optlen != 0:
                    if not take():
                        self.how = "eof-option-data"
                        return
                    continue
                if option == OPT_LIST and not list_seen:
                    list_seen = True
                    nr += MAX_NR_OPTIONS        # one export: ""
                if option == OPT_STRUCTURED_REPLY:
                    self.structured = True
            elif option in (OPT_INFO, OPT_GO):
                if not take():
                    self.how = "eof-option-data"
                    return
                if optlen < 6:
                    continue
                namelen = be32(data, 0)
                if namelen > optlen - 6:
                    continue
                nrinfos = be16(data, 4 + namelen)
                if optlen != 4 + namelen + 2 + 2 * nrinfos:
                    continue
                name = data[4:4 + namelen]
                if not good_string(name, namelen, optlen - 6):
                    continue
                # INFO opens the export too, and drops a meta context
                # set for another name, as GO does.
                self.finish(meta_export, name)
                if option == OPT_GO:
                    self.how = "go"
                    self.phase_end = pos
                    return
            elif option in (OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT):
                if not take():
                    self.how = "eof-option-data"
                    return
                if option == OPT_SET_META_CONTEXT and not self.structured:
                    continue
                if optlen < 8:
                    continue
                namelen = be32(data, 0)
                if not good_string(data[4:], namelen, optlen - 8):
                    continue
                if option == OPT_SET_META_CONTEXT:
                    meta_export = data[4:4 + namelen]
                i = 4 + namelen
                if i + 4 > optlen:
                    continue
                nq = be32(data, i)
                i += 4
                if option == OPT_SET_META_CONTEXT:
                    self.meta = False
                while nq > 0:
                    if i + 4 > optlen:
                        break
                    ql = be32(data, i)
                    i += 4
                    if not good_string(data[i:], ql, optlen - i):
                        break
                    if data[i:i + ql] == b"base:allocation" and \
                       option == OPT_SET_META_CONTEXT:
                        self.meta = True
                    i += ql
                    nq -= 1
            else:
                if not take():
                    self.how = "eof-option-data"
                    return
        self.how = "too-many-options"

    def finish(self, meta_export, name):
        if meta_export is not None and meta_export != name:
            self.meta = False

    def parse_requests(self, size, eflags):
        """The requests after the handshake and the error nbdkit gives
        each (0: served), for a device of SIZE with export flags EFLAGS."""
        s = self.stream
        pos = self.phase_end
        while True:
            if pos == len(s):
                self.end = "eof"
                return
            if pos + 28 > len(s):
                self.end = "truncated-header"
                return
            magic, flags, cmd, cookie, offset, count = \
                struct.unpack_from(">IHHQQI", s, pos)
            r = Request(pos, cmd, flags, cookie, offset, count)
            pos += 28
            if magic != NBD_REQUEST_MAGIC:
                self.end = "bad-magic"
                return
            if cmd == CMD_DISC:
                self.end = "disc"
                return
            r.error = self.validate(r, size, eflags)
            if cmd == CMD_WRITE:
                if r.error and count > 2 * MAX_REQUEST_SIZE:
                    self.end = "write-too-large-to-skip"
                    return
                if pos + count > len(s):
                    self.end = "truncated-payload"
                    return
                r.payload = s[pos:pos + count]
                pos += count
            self.requests.append(r)

    def validate(self, r, size, eflags):
        cmd, flags, offset, count = r.cmd, r.flags, r.offset, r.count
        if eflags & FLAG_READ_ONLY and \
           cmd in (CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES):
            return EROFS
        if cmd in (CMD_READ, CMD_CACHE, CMD_WRITE, CMD_TRIM,
                   CMD_WRITE_ZEROES, CMD_BLOCK_STATUS):
            if not (count > 0 and offset <= size and offset + count <= size):
                return ENOSPC if cmd in (CMD_WRITE, CMD_WRITE_ZEROES) \
                    else EINVAL
        elif cmd == CMD_FLUSH:
            if offset != 0 or count != 0:
                return EINVAL
        else:
            return EINVAL
        if flags & ~KNOWN_CMD_FLAGS:
            return EINVAL
        if flags & CMD_FLAG_NO_HOLE and cmd != CMD_WRITE_ZEROES:
            return EINVAL
        if flags & CMD_FLAG_FAST_ZERO and cmd != CMD_WRITE_ZEROES:
            return EINVAL
        if flags & CMD_FLAG_DF:
            if cmd != CMD_READ or not self.structured:
                return EINVAL
        if flags & CMD_FLAG_REQ_ONE and cmd != CMD_BLOCK_STATUS:
            return EINVAL
        if flags & CMD_FLAG_FUA and not eflags & FLAG_SEND_FUA:
            return EINVAL
        if cmd in (CMD_WRITE, CMD_READ) and count > MAX_REQUEST_SIZE:
            return ENOMEM
        if cmd == CMD_FLUSH and not eflags & FLAG_SEND_FLUSH:
            return EINVAL
        if cmd == CMD_TRIM and not eflags & FLAG_SEND_TRIM:
            return EINVAL
        if cmd == CMD_WRITE_ZEROES and not eflags & FLAG_SEND_WRITE_ZEROES:
            return EINVAL
        if cmd == CMD_CACHE and not eflags & FLAG_SEND_CACHE:
            return EINVAL
        if cmd == CMD_BLOCK_STATUS and not (self.structured and self.meta):
            return EINVAL
        return 0


# ---- a sparse shadow of the disk ------------------------------------------
class Shadow:
    """Blocks never written read as zeros; byte ranges whose content is
    not known (a write or zero that failed, perhaps half way) are not
    checked until written or zeroed again.  Work is proportional to the
    blocks held, not to the length of a request (a zero may be 4 GiB)."""

    def __init__(self, size):
        self.size = size
        self.data = {}              # block -> bytearray(BLOCK)
        self.unknown = []           # [start, end) byte ranges

    @staticmethod
    def _keys(d, lo, hi):
        """The blocks of d in [lo, hi), in order."""
        if hi - lo <= 2 * len(d) + 16:
            return [k for k in range(lo, hi) if k in d]
        return sorted(k for k in d if lo <= k < hi)

    def _known(self, start, end):
        self.unknown = [(a, b) for a, b in
                        ((a, min(b, start)) for a, b in self.unknown) if a < b] + \
            [(a, b) for a, b in ((max(a, end), b) for a, b in self.unknown)
             if a < b]

    def _is_unknown(self, pos):
        return any(a <= pos < b for a, b in self.unknown)

    def _set_bytes(self, offset, data):
        """Bytes within one block."""
        b, o = divmod(offset, BLOCK)
        blk = self.data.get(b)
        if blk is None:
            if not any(data):
                return
            blk = self.data[b] = bytearray(BLOCK)
        blk[o:o + len(data)] = data

    def _put(self, offset, data):
        i = 0
        while i < len(data):
            n = min(BLOCK - (offset + i) % BLOCK, len(data) - i)
            self._set_bytes(offset + i, data[i:i + n])
            i += n

    def write(self, offset, data):
        self._put(offset, data)
        self._known(offset, offset + len(data))

    def _drop_whole(self, offset, count):
        """Drop the whole blocks of the range; the partial head and tail
        as (start, end) pairs."""
        end = offset + count
        first = -(-offset // BLOCK)
        last = end // BLOCK
        if first >= last:
            return [(offset, end)]
        for k in self._keys(self.data, first, last):
            del self.data[k]
        return [(a, b) for a, b in ((offset, first * BLOCK), (last * BLOCK, end))
                if a < b]

    def zero(self, offset, count):
        for a, b in self._drop_whole(offset, count):
            self._put(a, bytes(b - a))
        self._known(offset, offset + count)

    def trim(self, offset, count):
        """Trim frees whole blocks only (a partial head or tail is left as
        it is): they read as zeros, as the manual says.  The partial last
        block of a device is whole to a trim from its start to the end."""
        end = offset + count
        first = -(-offset // BLOCK)
        last = end // BLOCK
        tail = self.size - self.size % BLOCK
        if end == self.size and self.size % BLOCK and offset <= tail:
            last = tail // BLOCK + 1
        if first < last:
            self._drop_whole(first * BLOCK, (last - first) * BLOCK)
            self._known(first * BLOCK, last * BLOCK)

    def forget(self, offset, count):
        self.unknown.append((offset, offset + count))

    def expected(self, offset, count):
        want = bytearray(count)
        end = offset + count
        for k in self._keys(self.data, offset // BLOCK, -(-end // BLOCK)):
            bo = k * BLOCK
            a, b = max(bo, offset), min(bo + BLOCK, end)
            want[a - offset:b - offset] = self.data[k][a - bo:b - bo]
        return want

    def check(self, offset, got):
        """The first offset where GOT differs from the shadow, or None."""
        want = self.expected(offset, len(got))
        if got == want:
            return None
        for i in range(0, len(got), BLOCK):
            if got[i:i + BLOCK] != want[i:i + BLOCK]:
                for j in range(i, min(i + BLOCK, len(got))):
                    if got[j] != want[j] and not self._is_unknown(offset + j):
                        return offset + j
        return None

    def check_zero(self, offset, count):
        """The first known non-zero byte in the range, or None."""
        end = min(offset + count, self.size)
        for k in self._keys(self.data, offset // BLOCK, -(-end // BLOCK)):
            bo = k * BLOCK
            blk = self.data[k]
            for j in range(max(offset - bo, 0), min(end - bo, BLOCK)):
                if blk[j] and not self._is_unknown(bo + j):
                    return bo + j
        return None


# ---- following the server's replies ---------------------------------------
class Finding(Exception):
    pass


class Outcome:
    def __init__(self):
        self.features = set()
        self.finding = None         # (kind, text)
        self.executed = 0           # requests that reached the plugin


def follow(stream, out, params, outcome):
    """Follow the server's output OUT for client STREAM; raise Finding on a
    wrong answer.  Adds reply patterns to outcome.features."""
    feats = outcome.features
    rd = Reading(stream)
    feats.add("hs:%s:%d" % (rd.how, len(rd.options) and min(len(rd.options), 8)))
    threads = params.get("threads", "1")
    ordered = threads == "1"
    size_param = parse_size(params["size"])
    if len(out) < 18:
        raise Finding("short greeting (%d bytes)" % len(out))
    if be64(out, 0) != NBD_MAGIC or be64(out, 8) != NBD_NEW_VERSION:
        raise Finding("bad greeting")
    p = 18
    size = eflags = None
    server_done = False
    # Option replies, then the end of the handshake.
    while p < len(out):
        if rd.export_name_finish and p + 8 <= len(out) and \
           be64(out, p) != NBD_REP_MAGIC:
            want = 10 if rd.cflags & FLAG_NO_ZEROES else 134
            if p + want > len(out):
                raise Finding("short export-name reply")
            size, eflags = be64(out, p), be16(out, p + 8)
            p += want
            server_done = True
            break
        if p + 20 > len(out):
            raise Finding("truncated option reply")
        magic, opt, rep, rlen = struct.unpack_from(">QIII", out, p)
        if magic != NBD_REP_MAGIC:
            raise Finding("bad option reply magic at %d" % p)
        body = out[p + 20:p + 20 + rlen]
        if len(body) != rlen:
            raise Finding("truncated option reply body")
        p += 20 + rlen
        feats.add("opt:%d:%x" % (opt if opt < 16 else 99, rep))
        if rep == REP_INFO and rlen >= 12 and be16(body, 0) == INFO_EXPORT:
            size, eflags = be64(body, 2), be16(body, 10)
        if rep == REP_INFO and rlen == 14 and be16(body, 0) == INFO_BLOCK_SIZE:
            mn, pref, mx = struct.unpack_from(">III", body, 2)
            if (mn, pref) != (1, BLOCK) or mx != 32 << 20:
                raise Finding("block size %d/%d/%d" % (mn, pref, mx))
        if opt == OPT_GO and rep == REP_ACK:
            server_done = True
            break
    transmission = (rd.phase_end is not None)
    if server_done != transmission and ordered:
        raise Finding("handshake: the server %s, the stream reads as %s"
                      % ("finished it" if server_done else "did not finish it",
                         rd.how))
    if transmission and size is None:
        if ordered:
            raise Finding("handshake ended (%s) but no export reply" % rd.how)
        return
    if not transmission:
        if p != len(out) and ordered:
            raise Finding("%d bytes after a failed handshake (%s)"
                          % (len(out) - p, rd.how))
        return
    if size != size_param:
        raise Finding("export size %d, want %d" % (size, size_param))
    rd.parse_requests(size, eflags)
    feats.add("end:%s" % rd.end)
    if not ordered:
        for r in rd.requests:
            feats.add("mt:%s:%d" % (CMD_NAMES.get(r.cmd, "X"), r.error))
        return
    shadow = Shadow(size)
    mem_limited = "mem_limit" in params and params["mem_limit"] not in ("0",)
    for r in rd.requests:
        name = CMD_NAMES.get(r.cmd, "CMD%d" % r.cmd)
        where = "request %s at stream offset %d (flags 0x%x offset %d count %d)" \
            % (name, r.pos, r.flags, r.offset, r.count)
        if p == len(out):
            raise Finding("no reply to %s" % where)
        if p + 4 > len(out):
            raise Finding("truncated reply to %s" % where)
        magic = be32(out, p)
        data = None
        extents = None
        err = 0
        if magic == NBD_SIMPLE_REPLY_MAGIC:
            if p + 16 > len(out):
                raise Finding("truncated simple reply to %s" % where)
            err = be32(out, p + 4)
            cookie = be64(out, p + 8)
            p += 16
            if cookie != r.cookie:
                raise Finding("reply cookie %x to %s" % (cookie, where))
            if r.cmd == CMD_READ and err == 0:
                data = out[p:p + r.count]
                p += r.count
                if len(data) != r.count:
                    raise Finding("short read data for %s" % where)
        elif magic == NBD_STRUCTURED_REPLY_MAGIC:
            if not rd.structured:
                raise Finding("structured reply without negotiation: %s" % where)
            chunks = bytearray()
            got_data = False
            while True:
                if p + 20 > len(out):
                    raise Finding("truncated structured reply to %s" % where)
                magic, cflags, ctype, cookie, clen = \
                    struct.unpack_from(">IHHQI", out, p)
                if magic != NBD_STRUCTURED_REPLY_MAGIC:
                    raise Finding("bad chunk magic for %s" % where)
                if cookie != r.cookie:
                    raise Finding("chunk cookie %x to %s" % (cookie, where))
                body = out[p + 20:p + 20 + clen]
                if len(body) != clen:
                    raise Finding("truncated chunk for %s" % where)
                p += 20 + clen
                if ctype & 0x8000:                  # an error chunk
                    if clen < 6:
                        raise Finding("short error chunk for %s" % where)
                    err = be32(body, 0)
                elif ctype == REPLY_TYPE_OFFSET_DATA:
                    o = be64(body, 0)
                    if r.cmd != CMD_READ or o != r.offset + len(chunks) or \
                       len(chunks) + clen - 8 > r.count:
                        raise Finding("odd OFFSET_DATA chunk for %s" % where)
                    chunks += body[8:]
                    got_data = True
                elif ctype == REPLY_TYPE_OFFSET_HOLE:
                    o, n = be64(body, 0), be32(body, 8)
                    if r.cmd != CMD_READ or o != r.offset + len(chunks):
                        raise Finding("odd OFFSET_HOLE chunk for %s" % where)
                    chunks += bytes(n)
                    got_data = True
                elif ctype == REPLY_TYPE_BLOCK_STATUS:
                    if r.cmd != CMD_BLOCK_STATUS or clen < 12 or (clen - 4) % 8:
                        raise Finding("odd BLOCK_STATUS chunk for %s" % where)
                    extents = [struct.unpack_from(">II", body, 4 + 8 * i)
                               for i in range((clen - 4) // 8)]
                elif ctype != REPLY_TYPE_NONE:
                    raise Finding("chunk type %d for %s" % (ctype, where))
                if cflags & REPLY_FLAG_DONE:
                    break
            if r.cmd == CMD_READ and err == 0:
                if not got_data or len(chunks) != r.count:
                    raise Finding("READ reply of %d bytes for %s"
                                  % (len(chunks), where))
                data = bytes(chunks)
        else:
            raise Finding("reply magic 0x%x to %s" % (magic, where))

        want = NBD_ERR.get(r.error, 22)
        feats.add("r:%s:%x:%d:%s:%s" % (name, r.flags & 0xff, err,
                                       range_class(r.offset, r.count, size),
                                       len_class(r.count)))
        if r.error:
            if err != want:
                raise Finding("error %d, want %d (refused by nbdkit), for %s"
                              % (err, want, where))
            continue
        outcome.executed += 1
        feats.add("x:%s:%s:%s:%d" % (params.get("comp", "lz4"),
                                     "lim" if mem_limited else "-", name, err))
        if err:
            # What the plugin may refuse: a write beyond mem_limit.
            if r.cmd in (CMD_WRITE, CMD_WRITE_ZEROES) and err == 28 and \
               mem_limited:
                shadow.forget(r.offset, r.count)
                continue
            raise Finding("error %d from the plugin for %s" % (err, where))
        if r.cmd == CMD_WRITE:
            shadow.write(r.offset, r.payload)
        elif r.cmd == CMD_WRITE_ZEROES:
            shadow.zero(r.offset, r.count)
        elif r.cmd == CMD_TRIM:
            shadow.trim(r.offset, r.count)
        elif r.cmd == CMD_READ:
            bad = shadow.check(r.offset, data)
            if bad is not None:
                i = bad - r.offset
                raise Finding("READ data differs from the shadow at byte %d "
                              "(got %r) for %s" % (bad, data[i:i + 8], where))
        elif r.cmd == CMD_BLOCK_STATUS:
            if not extents:
                raise Finding("no extents for %s" % where)
            if r.flags & CMD_FLAG_REQ_ONE and len(extents) != 1:
                raise Finding("%d extents with REQ_ONE for %s"
                              % (len(extents), where))
            o = r.offset
            for n, st in extents:
                if n == 0 or o + n > size:
                    raise Finding("extent %d+%d beyond the device for %s"
                                  % (o, n, where))
                if st & ~(STATE_HOLE | STATE_ZERO):
                    raise Finding("extent flags 0x%x for %s" % (st, where))
                if st & STATE_ZERO:
                    bad = shadow.check_zero(o, n)
                    if bad is not None:
                        raise Finding("extent %d+%d flagged zero, byte %d "
                                      "is not, for %s" % (o, n, bad, where))
                feats.add("ext:%d" % st)
                o += n
            if o < r.offset + min(r.count, 1):
                raise Finding("extents cover nothing for %s" % where)
    if p != len(out):
        raise Finding("%d unexpected bytes after the last reply (end: %s)"
                      % (len(out) - p, rd.end))


def range_class(offset, count, size):
    end = offset + count
    if offset > size:
        return "beyond" if offset < (1 << 62) else "huge"
    if end > size:
        return "over-end"
    if end == size:
        return "at-end"
    return "in" if offset % BLOCK == 0 and count % BLOCK == 0 else "in-unaligned"


def len_class(n):
    if n == 0:
        return "0"
    if n < BLOCK:
        return "sub"
    if n <= 64 * BLOCK:
        return "small"
    if n <= 32 << 20:
        return "big"
    if n <= 64 << 20:
        return "over32M"
    return "huge"


# ---- running nbdkit -------------------------------------------------------
class Runner:
    def __init__(self, nbdkit, plugin, env_pairs, timeout, pipes=False):
        self.pipes = pipes
        self.nbdkit = nbdkit
        self.plugin = plugin
        self.env = dict(os.environ)
        for k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS",
                  "TSAN_OPTIONS"):
            self.env.pop(k, None)
        for pair in env_pairs:
            if not pair:
                continue
            k, _, v = pair.partition("=")
            self.env[k] = v
        self.timeout = timeout

    def argv(self, params):
        argv = [self.nbdkit, "-s"]
        t = params.get("threads", "1")
        argv += ["-t", t if t.isdigit() and 0 < int(t) <= 64 else "1"]
        if params.get("ro") == "1":
            argv.append("-r")
        argv.append(self.plugin)
        argv += ["%s=%s" % (k, params[k]) for k in PARAM_KEYS if k in params]
        return argv

    def serve(self, argv, stream):
        """Run nbdkit -s on STREAM: (exit status, stdout, stderr), or None
        on a timeout.  stdin and stdout are one end of a socket pair, as
        in nbdkit's own fuzzer (server/fuzzer.c) and as clients connect;
        with --pipes they are two pipes."""
        deadline = time.monotonic() + self.timeout
        if self.pipes:
            try:
                proc = subprocess.run(argv, input=stream, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, env=self.env,
                                      timeout=self.timeout)
            except subprocess.TimeoutExpired as e:
                return None, e.stderr or b""
            return (proc.returncode, proc.stdout, proc.stderr), None
        ours, theirs = socket.socketpair()
        proc = subprocess.Popen(argv, stdin=theirs, stdout=theirs,
                                stderr=subprocess.PIPE, env=self.env)
        theirs.close()
        err = []

        def writer():
            try:
                ours.sendall(stream)
                ours.shutdown(socket.SHUT_WR)
            except OSError:
                pass                # the server went away: so be it

        def err_reader():
            err.append(proc.stderr.read())
        threads = [threading.Thread(target=writer, daemon=True),
                   threading.Thread(target=err_reader, daemon=True)]
        for t in threads:
            t.start()
        out = bytearray()
        hung = False
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    hung = True
                    break
                ours.settimeout(left)
                try:
                    chunk = ours.recv(1 << 20)
                except socket.timeout:
                    hung = True
                    break
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            if not hung:
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    hung = True
        finally:
            if hung:
                proc.kill()
                proc.wait()
            for t in threads:
                t.join(5)
            ours.close()
        stderr = err[0] if err else b""
        if hung:
            return None, stderr
        return (proc.returncode, bytes(out), stderr), None

    def run(self, data):
        """Serve one input; an Outcome, finding or not."""
        params, stream = split_input(data)
        outcome = Outcome()
        argv = self.argv(params)
        done, hung_err = self.serve(argv, stream)
        if done is None:
            outcome.finding = ("hang", "no exit within %ds: %s\n%s" % (
                self.timeout, " ".join(argv),
                hung_err[-4000:].decode("utf-8", "replace")))
            return outcome
        rc, stdout, stderr = done
        err = stderr.decode("utf-8", "replace")
        outcome.features.add("rc:%d" % rc)
        for line in err.splitlines():
            outcome.features.add("msg:" + normalize(line))
        if SANITIZER_RE.search(err):
            outcome.finding = ("sanitizer", err[-20000:])
        elif rc < 0 or rc >= 64:
            outcome.finding = ("signal" if rc < 0 else "exit",
                               "exit status %d%s\n%s" % (
                                   rc, " (%s)" % signal.Signals(-rc).name
                                   if rc < 0 else "", err[-20000:]))
        elif not stdout and rc == 1:
            outcome.features.add("startup-failed")   # parameters refused
        else:
            try:
                follow(stream, stdout, params, outcome)
            except Finding as f:
                outcome.finding = ("wrong-answer", "%s\n%s" % (f, err[-8000:]))
        return outcome


def normalize(line):
    line = re.sub(r"^nbdkit: [^:]*: ", "", line)
    line = re.sub(r"0x[0-9a-f]+", "H", line)
    line = re.sub(r"[0-9]+", "N", line)
    return line[:100]


def sanitizer_env(plugin):
    """The environment nbdkit runs with, as tests/functions.sh makes it:
    the plugin is built with -fsanitize, nbdkit is not."""
    san = os.environ.get("SANITIZERS", "")
    if not san:
        try:
            deps = subprocess.run(["ldd", plugin], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL).stdout.decode()
        except OSError:
            deps = ""
        if "libtsan" in deps:
            san = "thread"
        else:
            san = ",".join(n for n, lib in (("address", "libasan"),
                                            ("undefined", "libubsan"))
                           if lib in deps) or "no"

    def lib(name):
        return subprocess.run(["gcc", "-print-file-name=" + name],
                              stdout=subprocess.PIPE).stdout.decode().strip()
    if san in ("", "no"):
        return []
    if san == "thread":
        return ["LD_PRELOAD=" + lib("libtsan.so"),
                "TSAN_OPTIONS=halt_on_error=1:exitcode=66:report_signal_unsafe=0"]
    pre = []
    if "address" in san:
        pre.append(lib("libasan.so"))
    if "undefined" in san:
        pre.append(lib("libubsan.so"))
    return ["LD_PRELOAD=" + ":".join(pre),
            "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0",
            "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"]


# ---- generating streams ---------------------------------------------------
SIZES = ["1", "512", "4095", "4096", "4097", "12288", "65536", "65537",
         "1M", "1048575", "64M", "1T", "9223372036854775807"]


def gen_params(rng):
    p = {"size": rng.choice(SIZES)}
    if rng.random() < 0.5:
        p["comp"] = "zstd"
        if rng.random() < 0.3:
            p["level"] = rng.choice(["-5", "3", "19"])
    elif rng.random() < 0.2:
        p["comp"] = "lz4"
        p["level"] = rng.choice(["1", "9", "65537"])
    if rng.random() < 0.35:
        p["mem_limit"] = rng.choice(["4K", "12K", "16K", "20K", "24K", "32K",
                                     "40K", "64K", "256K"])
    if rng.random() < 0.15:
        p["compact"] = "off"
    if rng.random() < 0.15:
        p["chain"] = rng.choice(["1", "2", "16"])
    if rng.random() < 0.1:
        p["lock"] = "pool"
    if rng.random() < 0.1:
        p["free"] = "immediate"
    if rng.random() < 0.1:
        p["compact_threshold"] = rng.choice(["0", "100"])
    p["threads"] = "1" if rng.random() < 0.85 else rng.choice(["2", "16"])
    if rng.random() < 0.05:
        p["ro"] = "1"
    return p


def opt(option, data=b"", optlen=None, magic=NBD_NEW_VERSION):
    return struct.pack(">QII", magic, option,
                       len(data) if optlen is None else optlen) + data


def go_data(rng, name=b"", infos=None):
    if infos is None:
        infos = rng.sample([INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION,
                            INFO_BLOCK_SIZE, 7, 0xffff], rng.randint(0, 3))
    return struct.pack(">I", len(name)) + name + \
        struct.pack(">H", len(infos)) + b"".join(struct.pack(">H", i)
                                                 for i in infos)


def meta_data(rng, queries, name=b""):
    d = struct.pack(">I", len(name)) + name + struct.pack(">I", len(queries))
    for q in queries:
        d += struct.pack(">I", len(q)) + q
    return d


def gen_option(rng):
    """One option before the end of the handshake, good or bad."""
    k = rng.randrange(16)
    if k == 0:
        return opt(OPT_STRUCTURED_REPLY)
    if k == 1:
        return opt(OPT_STRUCTURED_REPLY, b"xy")
    if k == 2:
        return opt(OPT_SET_META_CONTEXT, meta_data(rng, [b"base:allocation"]))
    if k == 3:
        return opt(OPT_SET_META_CONTEXT, meta_data(
            rng, rng.sample([b"base:allocation", b"base:", b"qemu:dirty-bitmap:x",
                             b"", b"base:allocatio"], 2),
            rng.choice([b"", b"other"])))
    if k == 4:
        return opt(OPT_LIST_META_CONTEXT, meta_data(
            rng, rng.choice([[], [b"base:"], [b"base:allocation", b"x:y"]])))
    if k == 5:                      # malformed meta: lengths that lie
        d = meta_data(rng, [b"base:allocation"])
        cut = rng.randrange(len(d))
        return opt(rng.choice([OPT_SET_META_CONTEXT, OPT_LIST_META_CONTEXT]),
                   d[:cut])
    if k == 6:
        return opt(OPT_SET_META_CONTEXT,
                   struct.pack(">I", 0) + struct.pack(">I", 3) +
                   struct.pack(">I", 0xfffffff0) + b"base:allocation")
    if k == 7:
        return opt(OPT_LIST, rng.choice([b"", b"", b"junk"]))
    if k == 8:
        return opt(OPT_INFO, go_data(rng, rng.choice([b"", b"a", b"\xff" * 3])))
    if k == 9:                      # INFO/GO with bad name length or counts
        d = bytearray(go_data(rng, b"abc", [INFO_BLOCK_SIZE]))
        which = rng.randrange(3)
        if which == 0:
            d[0:4] = struct.pack(">I", rng.choice([7, 0xffffffff, 4097]))
        elif which == 1:
            d[7:9] = struct.pack(">H", rng.choice([0, 2, 0xffff]))
        else:
            d = d[:rng.randrange(6)]
        return opt(rng.choice([OPT_INFO, OPT_GO]), bytes(d))
    if k == 10:
        return opt(OPT_GO, go_data(rng, b"a\0b"))
    if k == 11:
        return opt(OPT_STARTTLS, rng.choice([b"", b"z"]))
    if k == 12:
        return opt(rng.choice([OPT_PEEK_EXPORT, OPT_EXTENDED_HEADERS, 0, 12,
                               0x7fffffff, 0xffffffff]),
                   bytes(rng.randrange(8)))
    if k == 13:
        return opt(OPT_INFO, go_data(rng, b"x" * rng.choice([4096, 4097])))
    if k == 14:
        return opt(OPT_SET_META_CONTEXT, meta_data(
            rng, [b"base:allocation"] * rng.randint(2, 4)))
    return opt(OPT_GO, go_data(rng)[:5])       # GO too short: not the end


def gen_handshake(rng):
    """Client flags and options; whether transmission should follow."""
    r = rng.random()
    cflags = 3 if r < 0.75 else 1 if r < 0.93 else \
        rng.choice([0, 2, 4, 0xffffffff])
    out = struct.pack(">I", cflags)
    if rng.random() < 0.02:
        return out[:rng.randrange(4)], False
    pre = []
    if rng.random() < 0.75:
        pre.append(opt(OPT_STRUCTURED_REPLY))
        if rng.random() < 0.8:
            pre.append(opt(OPT_SET_META_CONTEXT,
                           meta_data(rng, [b"base:allocation"])))
    for _ in range(rng.choice([0, 0, 1, 2, 4])):
        pre.insert(rng.randrange(len(pre) + 1), gen_option(rng))
    if rng.random() < 0.01:
        pre += [opt(OPT_LIST)] * 33
    out += b"".join(pre)
    r = rng.random()
    if r < 0.75:
        out += opt(OPT_GO, go_data(rng, rng.choice([b"", b"", b"x"])))
    elif r < 0.88:
        out += opt(OPT_EXPORT_NAME, rng.choice([b"", b"name"]))
    elif r < 0.91:
        out += opt(OPT_ABORT)
        return out, False
    elif r < 0.94:
        out += opt(OPT_GO, go_data(rng), magic=rng.choice(
            [0, NBD_NEW_VERSION ^ 1, NBD_MAGIC]))
    elif r < 0.96:
        out += opt(rng.choice([OPT_GO, OPT_EXPORT_NAME]), b"",
                   optlen=rng.choice([MAX_REQUEST_SIZE + 1, 0xffffffff, 100]))
        return out, False
    elif r < 0.98:
        out += opt(OPT_EXPORT_NAME, b"x" * 4097)
    else:
        return out, False
    return out, True


def pattern(rng, n):
    k = rng.randrange(8)
    if k == 0:
        return bytes(n)
    if k == 1:
        return bytes([rng.randrange(1, 256)]) * n
    if k == 2:
        w = rng.randbytes(8)
        return (w * (n // 8 + 1))[:n]
    if k == 3:
        words = [b"zram ", b"block ", b"nbd ", b"\0\0\0\0", b"data\n"]
        s = b"".join(rng.choice(words) for _ in range(n // 4 + 1))
        return s[:n]
    if k == 4:
        return rng.randbytes(n // 2) + bytes(n - n // 2)
    if k == 5:
        return bytes(n - 1) + b"\1" if n else b""
    return rng.randbytes(n)


def pick_offset(rng, size, window):
    k = rng.randrange(20)
    if k < 8:                       # near the start, where data is
        return rng.randrange(min(size, window) + 1) if rng.random() < 0.4 \
            else rng.randrange(min(size, window) // BLOCK + 1) * BLOCK
    if k < 12:                      # near the end
        back = rng.choice([0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK,
                           rng.randrange(4 * BLOCK)])
        return max(size - back, 0)
    if k < 14:
        return size + rng.choice([1, BLOCK, 1 << 20])
    if k < 16:
        return rng.choice([(1 << 63) - 1, 1 << 63, (1 << 64) - 1,
                           (1 << 64) - BLOCK, (1 << 62), size * 2])
    if k < 18:
        return rng.randrange(size + 1)
    return rng.getrandbits(64)


def pick_count(rng, cmd, size, offset):
    k = rng.randrange(16)
    if k == 0:
        return 0
    if k < 6:
        return rng.choice([1, 511, 512, BLOCK - 1, BLOCK, BLOCK + 1,
                           2 * BLOCK, 3 * BLOCK + 17])
    if k < 9:
        return rng.randrange(1, 4 * BLOCK)
    if k < 11 and offset <= size:   # exactly to the end, or one past
        n = size - offset + rng.choice([0, 0, 1])
        if 0 < n < 1 << 32 and (cmd != CMD_WRITE or n <= 16 * BLOCK):
            return n
    if cmd == CMD_WRITE:
        return rng.randrange(1, 16 * BLOCK)
    return rng.choice([1 << 20, (32 << 20) - 1, 32 << 20, (32 << 20) + 1,
                       64 << 20, (64 << 20) + 1, 0xffffffff, 0x80000000,
                       rng.getrandbits(32)])


CMD_WEIGHTS = [(CMD_WRITE, 30), (CMD_READ, 30), (CMD_WRITE_ZEROES, 12),
               (CMD_TRIM, 10), (CMD_BLOCK_STATUS, 8), (CMD_FLUSH, 3),
               (CMD_CACHE, 3), (CMD_DISC, 1), (CMD_RESIZE, 1), (99, 1),
               (0xffff, 1)]


def flags_for(rng, cmd):
    if rng.random() < 0.06:
        return rng.choice([CMD_FLAG_PAYLOAD_LEN, 0x40, 0x8000, 0xffff,
                           rng.getrandbits(16)])
    if rng.random() < 0.05:
        return rng.choice([CMD_FLAG_NO_HOLE, CMD_FLAG_DF, CMD_FLAG_REQ_ONE,
                           CMD_FLAG_FAST_ZERO])
    f = 0
    if cmd in (CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES) and rng.random() < 0.2:
        f |= CMD_FLAG_FUA
    if cmd == CMD_WRITE_ZEROES:
        if rng.random() < 0.4:
            f |= CMD_FLAG_NO_HOLE
        if rng.random() < 0.3:
            f |= CMD_FLAG_FAST_ZERO
    if cmd == CMD_READ and rng.random() < 0.1:
        f |= CMD_FLAG_DF
    if cmd == CMD_BLOCK_STATUS and rng.random() < 0.3:
        f |= CMD_FLAG_REQ_ONE
    return f


def gen_request(rng, size, window, budget):
    cmd = rng.choices([c for c, _ in CMD_WEIGHTS],
                      [w for _, w in CMD_WEIGHTS])[0]
    flags = flags_for(rng, cmd)
    cookie = rng.choice([0, 1, 0xffffffffffffffff, rng.getrandbits(64)])
    if cmd == CMD_FLUSH and rng.random() < 0.8:
        offset = count = 0
    else:
        offset = pick_offset(rng, size, window)
        count = pick_count(rng, cmd, size, offset)
    hdr = struct.pack(">IHHQQI", NBD_REQUEST_MAGIC, flags, cmd, cookie,
                      offset, count)
    if rng.random() < 0.01:
        hdr = struct.pack(">I", rng.choice([0, NBD_SIMPLE_REPLY_MAGIC,
                                            0x21e41c71])) + hdr[4:]
    if cmd != CMD_WRITE:
        return hdr
    if count > budget and rng.random() < 0.9:
        # Mostly a write that fits the budget; else a truncated payload,
        # which ends the stream.
        count = rng.randint(1, max(budget, 1))
        hdr = hdr[:24] + struct.pack(">I", count)
    return hdr + pattern(rng, min(count, budget))


def gen_stream(rng, params, budget=6000):
    """A client stream for PARAMS, about BUDGET bytes of write payload."""
    size = parse_size(params["size"])
    out, go_on = gen_handshake(rng)
    if not go_on:
        return out
    window = rng.choice([4 * BLOCK, 16 * BLOCK, 64 * BLOCK])
    for _ in range(rng.choice([1, 3, 8, 16, 30])):
        req = gen_request(rng, size, window, budget)
        budget = max(budget - max(len(req) - 28, 0), 0)
        out += req
        if budget == 0 and rng.random() < 0.5:
            break
    if rng.random() < 0.03:
        out += rng.randbytes(rng.randrange(1, 40))
    return out


def generate(rng, budget=6000):
    params = gen_params(rng)
    return join_input(params, gen_stream(rng, params, budget))


# ---- mutating inputs ------------------------------------------------------
INTERESTING32 = [0, 1, 0x7f, 0x80, 0xff, 0x1000, 0xfff, 0x1001, 0x7fffffff,
                 0x80000000, 0xffffffff, 0xfffff000, 32 << 20, 64 << 20,
                 (64 << 20) + 1]
INTERESTING64 = [0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 64) - 4096,
                 1 << 40, 1 << 20]


def mutate(rng, data, corpus):
    params, stream = split_input(data)
    stream = bytearray(stream)
    if rng.random() < 0.1:          # another parameter set
        params = gen_params(rng) if rng.random() < 0.5 else \
            dict(params, **{k: v for k, v in gen_params(rng).items()
                            if rng.random() < 0.3})
    rd = Reading(bytes(stream))
    reqs = []
    if rd.phase_end is not None:
        size = parse_size(params["size"])
        rd.parse_requests(size, 0xffff & ~FLAG_READ_ONLY)
        reqs = rd.requests
    for _ in range(rng.choice([1, 1, 2, 3, 5])):
        k = rng.randrange(14)
        if k < 5 and reqs:          # a field of a request
            r = rng.choice(reqs)
            field = rng.choice([(4, ">H", 2), (6, ">H", 2), (16, ">Q", 8),
                                (24, ">I", 4), (16, ">Q", 8), (24, ">I", 4)])
            at = r.pos + field[0]
            if at + field[2] > len(stream):
                continue
            if field[1] == ">Q":
                v = rng.choice(INTERESTING64 + [rng.getrandbits(64),
                               be64(stream, at) + rng.choice([-1, 1, 4096, -4096])])
            elif field[1] == ">I":
                v = rng.choice(INTERESTING32 + [rng.getrandbits(32),
                               be32(stream, at) + rng.choice([-1, 1, 4096])])
            else:
                v = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 0xffff,
                                rng.getrandbits(16)])
            struct.pack_into(field[1], stream, at, v % (1 << (8 * field[2])))
        elif k == 5 and reqs:       # drop, duplicate or move requests
            r = rng.choice(reqs)
            end = r.pos + 28 + (len(r.payload) if r.payload else 0)
            piece = bytes(stream[r.pos:end])
            if rng.random() < 0.5:
                del stream[r.pos:end]
            else:
                stream[rng.choice([q.pos for q in reqs])
                       if rng.random() < 0.5 else r.pos:r.pos] = piece
            reqs = []
        elif k == 6 and rd.phase_end is not None:   # append requests
            size = parse_size(params["size"])
            for _ in range(rng.randint(1, 6)):
                stream += gen_request(rng, size, 16 * BLOCK, 4096)
        elif k == 7 and corpus:     # splice another input's tail
            o_params, o_stream = split_input(rng.choice(corpus))
            o_rd = Reading(o_stream)
            rd = Reading(bytes(stream))
            if o_rd.phase_end is not None and rd.phase_end is not None:
                stream = stream[:rng.randint(rd.phase_end, len(stream))] + \
                    o_stream[o_rd.phase_end:]
            else:
                cut = rng.randrange(len(stream) + 1)
                stream = stream[:cut] + o_stream[rng.randrange(len(o_stream) + 1):]
            reqs = []
        elif k == 8 and rd.options:     # an option's length or code
            pos, _, _ = rng.choice(rd.options)
            at = pos + rng.choice([8, 12, 12])
            if at + 4 <= len(stream):
                struct.pack_into(">I", stream, at, rng.choice(
                    INTERESTING32 + list(range(12)) + [rng.getrandbits(32)]))
            reqs = []
        elif k == 9 and stream:     # truncate
            del stream[rng.randrange(len(stream)):]
            reqs = []
        elif k == 10 and stream:    # bit flips
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(stream))
                stream[i] ^= 1 << rng.randrange(8)
        elif k == 11 and stream:    # interesting bytes / words anywhere
            i = rng.randrange(len(stream))
            w = rng.choice([1, 2, 4, 8])
            if i + w <= len(stream):
                v = rng.choice(INTERESTING64 if w == 8 else INTERESTING32)
                stream[i:i + w] = (v % (1 << (8 * w))).to_bytes(w, "big")
        elif k == 12 and stream:    # insert or delete a chunk
            i = rng.randrange(len(stream))
            n = rng.randint(1, 32)
            if rng.random() < 0.5:
                del stream[i:i + n]
            else:
                stream[i:i] = rng.randbytes(n)
            reqs = []
        elif stream:                # duplicate a chunk
            i = rng.randrange(len(stream))
            j = min(len(stream), i + rng.randint(1, 64))
            stream[i:i] = stream[i:j]
            reqs = []
    return join_input(params, bytes(stream[:64 << 10]))


# ---- the modes ------------------------------------------------------------
def sha1(data):
    return hashlib.sha1(data).hexdigest()


def save_finding(outdir, data, outcome, argv):
    name = "crash-" + sha1(data)
    path = os.path.join(outdir, name)
    with open(path, "wb") as f:
        f.write(data)
    with open(path + ".txt", "w") as f:
        f.write("%s\n%s\n\n%s\n" % (outcome.finding[0], " ".join(argv),
                                    outcome.finding[1]))
    return path


def read_inputs(paths):
    files = []
    for path in paths:
        if os.path.isdir(path):
            for n in sorted(os.listdir(path)):
                if not n.startswith(".") and not n.endswith(".txt"):
                    files.append(os.path.join(path, n))
        elif os.path.exists(path):
            files.append(path)
    out = []
    for f in files:
        with open(f, "rb") as fp:
            out.append((f, fp.read()))
    return out


def report_finding(label, runner, data, outcome):
    params, _ = split_input(data)
    print("FINDING (%s) in %s: %s" % (outcome.finding[0], label,
                                      " ".join(runner.argv(params))))
    print("  " + "\n  ".join(outcome.finding[1].strip().splitlines()[:60]))


def mode_replay(args, runner):
    inputs = read_inputs(args.replay)
    rng = random.Random(args.seed)
    for i in range(args.random):
        inputs.append(("random %d (seed %d)" % (i, args.seed), generate(rng)))
    findings = 0
    t0 = time.time()

    def one(item):
        return item, runner.run(item[1])
    with ThreadPoolExecutor(args.jobs) as pool:
        for (label, data), outcome in pool.map(one, inputs):
            if outcome.finding:
                findings += 1
                report_finding(label, runner, data, outcome)
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    save_finding(args.out, data, outcome,
                                 runner.argv(split_input(data)[0]))
            elif args.verbose:
                print("ok %s (%d requests served)" % (label, outcome.executed))
    dt = time.time() - t0
    print("nbd_stream: %d inputs replayed in %.1f s, %d findings"
          % (len(inputs), dt, findings))
    return 1 if findings else 0


def mode_write_corpus(args):
    rng = random.Random(args.seed)
    os.makedirs(args.write_corpus, exist_ok=True)
    for i in range(args.count):
        data = generate(rng, budget=3000)
        with open(os.path.join(args.write_corpus, "seed-%03d" % i), "wb") as f:
            f.write(data)
    print("nbd_stream: wrote %d inputs to %s" % (args.count, args.write_corpus))
    return 0


def mode_fuzz(args, runner):
    out = args.out
    keep = os.path.join(out, "corpus")
    os.makedirs(keep, exist_ok=True)
    corpus = [d for _, d in read_inputs((args.corpus or []) + [keep])]
    rng = random.Random(args.seed if args.seed is not None else time.time_ns())
    seen = set()
    seen_findings = set()
    execs = findings = kept = 0
    served = 0
    t0 = time.time()
    deadline = t0 + args.seconds
    last_print = t0
    # The corpus's own features first (and every finding in it).
    with ThreadPoolExecutor(args.jobs) as pool:
        for data, outcome in pool.map(lambda d: (d, runner.run(d)), corpus):
            execs += 1
            seen |= outcome.features
            if outcome.finding:
                findings += 1
                report_finding("corpus input", runner, data, outcome)
    print("nbd_stream: corpus of %d inputs: %d features" % (len(corpus),
                                                             len(seen)))

    def candidate():
        if not corpus or rng.random() < 0.2:
            return generate(rng, budget=rng.choice([2000, 6000, 20000]))
        return mutate(rng, rng.choice(corpus), corpus)

    with ThreadPoolExecutor(args.jobs) as pool:
        pending = set()
        while True:
            now = time.time()
            while now < deadline and len(pending) < 2 * args.jobs:
                data = candidate()
                pending.add(pool.submit(lambda d: (d, runner.run(d)), data))
            if not pending:
                break
            done = next(iter(pending))
            pending.discard(done)
            data, outcome = done.result()
            execs += 1
            served += outcome.executed
            if outcome.finding:
                # One file per kind of finding and first line of its text.
                key = (outcome.finding[0],
                       normalize(outcome.finding[1].splitlines()[0]
                                 if outcome.finding[1] else ""))
                findings += 1
                if key not in seen_findings:
                    seen_findings.add(key)
                    path = save_finding(out, data, outcome,
                                        runner.argv(split_input(data)[0]))
                    print("FINDING (%s): %s: %s" % (
                        outcome.finding[0], path,
                        outcome.finding[1].splitlines()[0][:200]))
                    sys.stdout.flush()
                continue
            new = outcome.features - seen
            if new:
                seen |= new
                corpus.append(data)
                kept += 1
                with open(os.path.join(keep, sha1(data)), "wb") as f:
                    f.write(data)
            if time.time() - last_print > 60:
                last_print = time.time()
                el = last_print - t0
                print("nbd_stream: %6.0f s: %d execs (%.1f/s), %d features, "
                      "corpus %d, findings %d (%d distinct)"
                      % (el, execs, execs / el, len(seen), len(corpus),
                         findings, len(seen_findings)))
                sys.stdout.flush()
    el = time.time() - t0
    print("nbd_stream: done: %d executions in %.0f s (%.1f exec/s), "
          "%d requests served by the plugin, %d features, corpus %d "
          "(%d new in %s), findings %d (%d distinct, in %s)"
          % (execs, el, execs / el, served, len(seen), len(corpus), kept,
             keep, findings, len(seen_findings), out))
    return 1 if findings else 0


def main():
    ap = argparse.ArgumentParser(
        description="Fuzz nbdkit-zram through nbdkit -s client streams")
    ap.add_argument("--nbdkit", default=os.environ.get("NBDKIT", "nbdkit"))
    ap.add_argument("--plugin", default=os.environ.get("PLUGIN"))
    ap.add_argument("--env", action="append", metavar="VAR=VALUE",
                    help="nbdkit's environment (default: the sanitizer "
                    "runtime, as tests/functions.sh preloads it)")
    ap.add_argument("--timeout", type=int, default=30)
    ap.add_argument("--pipes", action="store_true",
                    help="stdin and stdout two pipes, not a socket pair")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--replay", nargs="+", metavar="DIR-OR-FILE")
    ap.add_argument("--random", type=int, default=0)
    ap.add_argument("--write-corpus", metavar="DIR")
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seconds", type=int)
    ap.add_argument("--corpus", nargs="*", metavar="DIR")
    ap.add_argument("--out", metavar="DIR")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.write_corpus:
        args.seed = 1 if args.seed is None else args.seed
        return mode_write_corpus(args)
    if not args.plugin:
        ap.error("no plugin: --plugin or $PLUGIN")
    env = args.env if args.env is not None else sanitizer_env(args.plugin)
    runner = Runner(args.nbdkit, args.plugin, env, args.timeout, args.pipes)
    if args.replay or args.random:
        args.seed = 1 if args.seed is None else args.seed
        args.replay = args.replay or []
        return mode_replay(args, runner)
    if args.seconds is not None:
        if not args.out:
            ap.error("--seconds needs --out")
        return mode_fuzz(args, runner)
    ap.error("one of --replay, --random, --write-corpus, --seconds")


if __name__ == "__main__":
    sys.exit(main())
