# The control channel (ctl=PATH) as the Python parts of the tests speak it:
#
#   sys.path.insert(0, os.path.join(os.environ["SRCDIR"], "tests"))
#   from ctl_client import Ctl
#   ctl = Ctl(path)
#   lines = ctl.ok("mm_stat")                # asserts the reply ends in ok
#   ctl.error("writeback", r"say what")       # asserts an error matching
import re
import socket


class Ctl:
    def __init__(self, path):
        self.path = path

    def command(self, line, sock=None):
        """Send a line; return (reply lines, ok?, last line)."""
        own = sock is None
        if own:
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(self.path)
        sock.sendall(line.encode() + b"\n")
        data = b""
        try:
            while True:
                chunk = sock.recv(65536)
                assert chunk, "the server closed the control connection"
                data += chunk
                lines = data.decode().split("\n")
                for i, last in enumerate(lines[:-1]):
                    if last == "ok" or last.startswith("error: "):
                        return lines[:i], last == "ok", last
        finally:
            if own:
                sock.close()

    def ok(self, line):
        lines, good, last = self.command(line)
        assert good, "%r: %s" % (line, last)
        return lines

    def error(self, line, pattern):
        lines, good, last = self.command(line)
        assert not good, "%r succeeded" % line
        assert re.search(pattern, last), "%r: %s" % (line, last)
        return last

    def fields(self, line):
        """A reply of 'key value' lines as a dict of ints."""
        return {k: int(v) for k, v in (l.split() for l in self.ok(line))}

    def stats(self, device=None):
        """The stats command's 'key: value' lines as a dict of strings,
        of the default export or of the device named device."""
        line = "stats" + (" device=" + device if device else "")
        return dict(l.split(": ", 1) for l in self.ok(line) if ": " in l)
