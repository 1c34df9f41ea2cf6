#!/usr/bin/env bash
# Build a file that looks like the memory a swap device would receive.
#
#   bench/make-memory-image.sh OUT [MiB]        (default 256 MiB)
#
# The script starts a few real processes and lets them build heaps:
#   - python3: dicts, lists, tuples, ints, floats, strings (words and lines
#     taken from the Python standard library sources), class instances,
#     JSON-like nested records, arrays of doubles, some random bytes
#     (already-compressed or encrypted data) and some zeroed buffers, with
#     part of it freed again so the heap has holes with stale data in them;
#   - perl: hashes of words, arrays of lines, nested structures, sprintf'd
#     records and pack'd binary records, from the perl modules;
#   - sort: a sort of a text file (man pages and sources), stopped while its
#     output is blocked, so its buffers hold the sorted lines;
#   - node (only when PROGRAMS names it): V8's heap of maps, objects of
#     one shape linked together, small integers and doubles, typed arrays,
#     strings of the same Python sources, parsed JSON, and Buffers of
#     random bytes and of zeros, part of it dropped again.
# PROGRAMS (default "python3 perl sort") chooses the processes, e.g.
# PROGRAMS="python3 node" for a Python and a Node heap, as issue 42's
# first image was.
# While they wait, the reader (this script's python3, their parent, so
# ptrace restrictions allow it) goes through /proc/PID/maps, keeps the
# private anonymous mappings ([heap], [stack] and mappings without a file),
# skips file mappings, unreadable ones, [vvar], [vdso] and [vsyscall], and
# uses /proc/PID/pagemap to read only the pages that are resident (or
# swapped out): the pages a real swap device would see, zero pages
# included only when the heap itself has them.  The processes contribute
# in proportion to what they hold (256 KiB pieces spread evenly over each
# process's memory), interleaved in 2 MiB slices, until OUT
# reaches the size; if they hold too little, the tail of what was read is
# repeated.  The processes are killed and a summary is printed: size,
# sources, zero pages and same-filled pages.
#
# Needs root (or ptrace rights over its own children), python3 and perl;
# no network.

set -euo pipefail
export PATH=/usr/bin:/bin:/usr/sbin:/sbin:$PATH

die () { echo "make-memory-image: $*" >&2; exit 1; }

[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 OUT [MiB]"
out=$1
mib=${2:-256}
[[ $mib =~ ^[0-9]+$ ]] && [ "$mib" -ge 1 ] || die "MiB must be a positive integer, not '$mib'"
PROGRAMS=${PROGRAMS:-python3 perl sort}
for program in $PROGRAMS; do
    case $program in
        python3|perl|sort|node) command -v "$program" >/dev/null ||
            die "$program not found (PROGRAMS)" ;;
        *) die "PROGRAMS: '$program' is not one of python3, perl, sort, node" ;;
    esac
done
export PROGRAMS
[ -x /usr/bin/python3 ] || die "/usr/bin/python3 not found"

exec /usr/bin/python3 - "$out" "$mib" <<'PYEOF'
import glob, gzip, os, random, select, signal, struct, subprocess, sys
import tempfile, time

out, mib = sys.argv[1], int(sys.argv[2])
PAGE = 4096
MiB = 1 << 20
target = mib * MiB
SLICE = 2 * MiB            # interleaving unit between processes
READY_TIMEOUT = 300        # seconds to wait for the heaps to be built

def log(*a):
    print("make-memory-image:", *a, file=sys.stderr, flush=True)

# ---------------------------------------------------------------------------
# The heap builders.  Each grows until its own VmRSS reaches its share.

PY_BUILDER = r'''
import array, json, os, random, re, sys, time, glob
target_kib = int(sys.argv[1])
random.seed(12345)

def rss_kib():
    with open("/proc/self/status") as f:
        for l in f:
            if l.startswith("VmRSS:"):
                return int(l.split()[1])
    return 0

# Real text: lines and identifiers from the standard library sources.
lines = []
for p in sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))[:900]:
    try:
        with open(p, encoding="utf-8", errors="replace") as f:
            lines.extend(f.read().splitlines())
    except OSError:
        pass
    if len(lines) > max(20000, target_kib):
        break
if not lines:
    lines = ["line %d of some text with words in it" % i for i in range(100000)]
words = sorted(set(w for l in lines[:200000] for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{2,}", l)))
if not words:
    words = ["w%d" % i for i in range(10000)]

class Record:
    def __init__(self, i):
        self.id = i
        self.name = random.choice(words)
        self.path = "/srv/%s/%s.dat" % (random.choice(words), random.choice(words))
        self.score = random.random() * 1000
        self.tags = random.sample(words, 3)
        self.parent = None

class Point:
    __slots__ = ("x", "y", "z", "label")
    def __init__(self, x, y, z, label):
        self.x, self.y, self.z, self.label = x, y, z, label

keep = []          # what stays alive
n = 0
while rss_kib() < target_kib:
    r = {}
    # dicts of str -> int, and of int -> str
    r["index"] = {"%s_%d" % (random.choice(words), n * 5000 + i): i for i in range(5000)}
    r["rev"] = {n * 3000 + i: random.choice(lines) for i in range(3000)}
    # ints (big and small), floats, tuples
    r["ints"] = [random.randrange(-2**40, 2**40) for _ in range(8000)]
    r["small"] = [random.randrange(0, 300) for _ in range(8000)]
    r["floats"] = [random.gauss(0, 1e3) for _ in range(6000)]
    r["tuples"] = [(i, random.choice(words), random.random()) for i in range(3000)]
    # objects with a __dict__ and with __slots__
    recs = [Record(n * 2000 + i) for i in range(2000)]
    for i in range(1, len(recs)):
        recs[i].parent = recs[random.randrange(i)]
    r["recs"] = recs
    r["points"] = [Point(random.random(), random.random(), random.random(),
                         random.choice(words)) for _ in range(3000)]
    # text: lines, joined blocks, formatted strings, some non-ASCII
    start = random.randrange(max(1, len(lines) - 2000))
    r["lines"] = [l + "" for l in lines[start:start + 2000]]
    r["blob"] = "\n".join(lines[start:start + 1500])
    r["fmt"] = ["%s=%d;%0.3f;%s" % (random.choice(words), i, random.random(),
                random.choice(["été", "Straße", "日本語", "naïve", "ok"]))
                for i in range(3000)]
    # JSON-like documents, parsed
    doc = [{"id": i, "user": random.choice(words), "active": bool(i & 1),
            "email": "%s@%s.example" % (random.choice(words), random.choice(words)),
            "roles": random.sample(words, 2), "balance": round(random.random() * 1e4, 2)}
           for i in range(800)]
    r["json"] = json.loads(json.dumps(doc))
    # numeric arrays
    r["arr"] = array.array("d", (random.random() for _ in range(16000)))
    r["iarr"] = array.array("i", (random.randrange(0, 1000) for _ in range(16000)))
    # a little incompressible data, and a few zeroed buffers
    if n % 4 == 0:
        r["rand"] = os.urandom(96 * 1024)
    if n % 5 == 0:
        r["zeros"] = bytearray(64 * 1024)
    r["bytes"] = r["blob"].encode()
    keep.append(r)
    # free part of older rounds: holes with stale data in the heap
    if n > 2 and n % 3 == 0:
        old = keep[random.randrange(len(keep) - 1)]
        for k in ("tuples", "fmt", "rev"):
            old.pop(k, None)
    n += 1

print("ready", flush=True)
time.sleep(100000)
'''

PERL_BUILDER = r'''
use strict; use warnings;
my $target_kib = shift @ARGV;
srand(4321);
sub rss_kib {
    open(my $f, "<", "/proc/self/status") or return 0;
    while (<$f>) { return $1 if /^VmRSS:\s+(\d+)/; }
    return 0;
}
my @lines;
my @files = (glob("/usr/share/perl/*/*.pm"), glob("/usr/share/perl/*/*/*.pm"),
             glob("/usr/share/perl/*/*/*.pod"), glob("/usr/share/perl5/*/*.pm"));
for my $p (@files) {
    open(my $f, "<", $p) or next;
    while (my $l = <$f>) { chomp $l; push @lines, $l; }
    close $f;
    last if @lines > ($target_kib > 20000 ? $target_kib : 20000);
}
@lines = map { "line $_ of generated text" } 1 .. 100000 unless @lines;
my %seen; my @words = grep { !$seen{$_}++ } map { /(\w{3,})/g } @lines[0 .. ($#lines < 100000 ? $#lines : 100000)];
@words = map { "w$_" } 1 .. 10000 unless @words;
my (@keep, %count);
my $n = 0;
while (rss_kib() < $target_kib) {
    my %r;
    # word counts and a word -> positions index
    for my $i (0 .. 3999) {
        my $w = $words[int(rand(@words))];
        $count{"$w.$n"}++;
        push @{ $r{pos}{$w} }, $i;
    }
    # arrays of lines and numbers
    my $s = int(rand(@lines > 3000 ? @lines - 3000 : 1));
    $r{lines} = [ @lines[$s .. $s + 1999] ];
    $r{nums} = [ map { int(rand(1e9)) } 1 .. 5000 ];
    $r{fl} = [ map { rand() * 1000 } 1 .. 3000 ];
    # records: hashes in arrays
    $r{recs} = [ map { { id => $n * 2000 + $_, name => $words[int(rand(@words))],
                         size => int(rand(65536)), mode => sprintf("%04o", int(rand(4096))),
                         path => "/home/" . $words[int(rand(@words))] . "/" . $words[int(rand(@words))] } } 1 .. 2000 ];
    # formatted strings and packed binary records
    $r{fmt} = [ map { sprintf("%s %08x %10.4f %s", $words[int(rand(@words))], int(rand(2**32)),
                               rand(1e5), scalar localtime(1.6e9 + int(rand(1e8)))) } 1 .. 3000 ];
    $r{packed} = join("", map { pack("NnCa16d", $_, int(rand(65536)), int(rand(256)),
                                      $words[int(rand(@words))], rand()) } 1 .. 4000);
    $r{text} = join("\n", @lines[$s .. $s + 1499]);
    push @keep, \%r;
    # drop part of an older round
    if ($n > 2 && $n % 3 == 0) { my $o = $keep[int(rand($#keep))]; delete $o->{fmt}; delete $o->{nums}; }
    $n++;
}
$| = 1;
print "ready\n";
sleep 100000;
'''

NODE_BUILDER = r'''
const fs = require("fs"), path = require("path");
const targetKib = parseInt(process.argv[process.argv.length - 1], 10);
let seed = 12345;
function rand() {             // xorshift32: the same heap on every run
  seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5;
  seed >>>= 0;
  return seed / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
// Anonymous memory only: node's own binary is most of its VmRSS.
const rssKib = () =>
  parseInt((fs.readFileSync("/proc/self/status", "utf8").match(/RssAnon:\s+(\d+)/) || [0, 0])[1], 10);

// Real text: lines and identifiers from the Python standard library
// sources, as the python3 builder takes them.
const lines = [];
function walk(dir, files) {
  let entries;
  try { entries = fs.readdirSync(dir, { withFileTypes: true }); }
  catch (e) { return; }
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of entries) {
    if (files.length >= 900) return;
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, files);
    else if (e.name.endsWith(".py")) files.push(p);
  }
}
const files = [];
for (const d of fs.readdirSync("/usr/lib").sort())
  if (/^python3/.test(d)) walk(path.join("/usr/lib", d), files);
for (const f of files) {
  lines.push(...fs.readFileSync(f, "utf8").split("\n"));
  if (lines.length > Math.max(20000, targetKib)) break;
}
if (lines.length === 0)
  for (let i = 0; i < 100000; i++) lines.push("line " + i + " of some text");
const words = [...new Set(lines.slice(0, 200000).join(" ")
                          .match(/[A-Za-z_][A-Za-z0-9_]{2,}/g) || ["w1", "w2"])].sort();

class Record {
  constructor(i) {
    this.id = i;
    this.name = pick(words);
    this.path = "/srv/" + pick(words) + "/" + pick(words) + ".dat";
    this.score = rand() * 1000;
    this.tags = [pick(words), pick(words), pick(words)];
    this.created = new Date(1.6e12 + Math.floor(rand() * 1e11));
    this.parent = null;
  }
}

const keep = [];
let n = 0;
while (rssKib() < targetKib) {
  const r = {};
  // maps of string -> number and number -> string
  r.index = new Map();
  for (let i = 0; i < 5000; i++) r.index.set(pick(words) + "_" + (n * 5000 + i), i);
  r.rev = {};
  for (let i = 0; i < 3000; i++) r.rev[n * 3000 + i] = pick(lines);
  // small integers, doubles (boxed and unboxed), typed arrays
  r.small = Array.from({ length: 8000 }, () => Math.floor(rand() * 300));
  r.mixed = Array.from({ length: 6000 }, (_, i) => (i % 3 ? rand() * 1e3 : "k" + i));
  r.doubles = new Float64Array(6000);
  for (let i = 1; i < 6000; i++) r.doubles[i] = r.doubles[i - 1] + rand() - 0.5;
  // objects of one shape, linked
  const recs = [];
  for (let i = 0; i < 2000; i++) {
    const o = new Record(n * 2000 + i);
    if (i) o.parent = recs[Math.floor(rand() * i)];
    recs.push(o);
  }
  r.recs = recs;
  // text: lines, joined blocks, template strings, some non-ASCII
  const start = Math.floor(rand() * Math.max(1, lines.length - 2000));
  r.lines = lines.slice(start, start + 2000).map((l) => (" " + l).slice(1));
  r.blob = lines.slice(start, start + 1500).join("\n");
  r.fmt = Array.from({ length: 3000 }, (_, i) =>
    `${pick(words)}=${i};${rand().toFixed(3)};${pick(["été", "Straße", "日本語", "naïve", "ok"])}`);
  // JSON documents, parsed
  r.docs = JSON.parse(JSON.stringify(recs.slice(0, 500).map((o) =>
    ({ id: o.id, name: o.name, tags: o.tags, score: o.score, path: o.path }))));
  // some random bytes (compressed or encrypted data) and zeroed buffers
  if (n % 4 === 0) {
    r.random = Buffer.alloc(16384);
    for (let i = 0; i < r.random.length; i += 4) r.random.writeUInt32LE((rand() * 4294967296) >>> 0, i);
  }
  if (n % 8 === 0) r.zeros = Buffer.alloc(32768);
  keep.push(r);
  // drop part of an older round: holes with stale data
  if (n > 2 && n % 3 === 0) {
    const o = keep[Math.floor(rand() * (keep.length - 1))];
    delete o.fmt; delete o.small;
  }
  n++;
}
process.stdout.write("ready\n");
setInterval(() => {}, 1 << 30);
'''

def text_for_sort(path, size):
    """Lines from man pages and sources, in file order, up to size bytes."""
    written = 0
    with open(path, "w", encoding="utf-8", errors="replace") as f:
        srcs = sorted(glob.glob("/usr/share/man/man*/*.gz"))
        random.Random(7).shuffle(srcs)
        srcs += sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))
        srcs += sorted(glob.glob("/usr/share/perl/**/*.p[ml]", recursive=True))
        for p in srcs:
            try:
                if p.endswith(".gz"):
                    with gzip.open(p, "rt", encoding="utf-8", errors="replace") as g:
                        t = g.read()
                else:
                    with open(p, encoding="utf-8", errors="replace") as g:
                        t = g.read()
            except (OSError, EOFError, ValueError):
                continue
            f.write(t)
            if not t.endswith("\n"):
                f.write("\n")
            written += len(t) + 1
            if written >= size:
                break
    return written

# ---------------------------------------------------------------------------
# Reading another process's resident anonymous memory.

def regions(pid):
    out = []
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            fields = line.split(None, 5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            perms = fields[1]
            name = fields[5].strip() if len(fields) > 5 else ""
            if perms[0] != "r" or perms[3] != "p":
                continue
            if name and not (name in ("[heap]", "[stack]") or name.startswith("[anon")):
                continue           # file mappings, [vvar], [vdso], [vsyscall]
            out.append((lo, hi))
    return out

def resident_runs(pid):
    """(address, length) runs of resident or swapped pages."""
    runs = []
    with open("/proc/%d/pagemap" % pid, "rb") as pm:
        for lo, hi in regions(pid):
            n = (hi - lo) // PAGE
            pm.seek(lo // PAGE * 8)
            raw = pm.read(n * 8)
            ents = struct.unpack("%dQ" % (len(raw) // 8), raw)
            start = None
            for i, e in enumerate(ents):
                if e >> 62:        # bit 63 present, bit 62 swapped
                    if start is None:
                        start = i
                elif start is not None:
                    runs.append((lo + start * PAGE, (i - start) * PAGE))
                    start = None
            if start is not None:
                runs.append((lo + start * PAGE, (len(ents) - start) * PAGE))
    return runs

CHUNK = 256 * 1024

def reader(pid, runs, held, quota):
    """Yield about quota bytes of the process's resident pages, in address
    order, taking CHUNK-sized pieces spread evenly over all it holds."""
    frac = quota / held if held else 0.0
    owed = 0.0             # bytes owed to the quota (error diffusion)
    with open("/proc/%d/mem" % pid, "rb", 0) as mem:
        for addr, length in runs:
            for off in range(0, length, CHUNK):
                n = min(CHUNK, length - off)
                owed += n * frac
                if owed < n / 2:
                    continue
                owed -= n
                try:
                    mem.seek(addr + off)
                    data = mem.read(n)
                except OSError:
                    continue       # unreadable: skip it
                data = data[: len(data) // PAGE * PAGE]
                if data:
                    yield data

# ---------------------------------------------------------------------------

procs = []
tmpdir = tempfile.mkdtemp(prefix="memimage.")
def cleanup():
    for name, p in procs:
        if p.poll() is None:
            p.kill()
    for name, p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for f in os.listdir(tmpdir):
        os.unlink(os.path.join(tmpdir, f))
    os.rmdir(tmpdir)

def handler(signum, frame):
    cleanup()
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, handler)
signal.signal(signal.SIGINT, handler)

try:
    # Shares of the image in proportion to these weights (by default 50 %
    # python, 30 % perl, 20 % sort), with some headroom so that padding
    # is rarely needed.
    programs = os.environ["PROGRAMS"].split()
    weights = {"python3": 0.55, "perl": 0.33, "sort": 0.16, "node": 0.5}
    scale = 1.04 / sum(weights[p] for p in programs)
    share = {p: weights[p] * scale for p in programs}
    kib = target // 1024

    t0 = time.monotonic()
    env = dict(os.environ, LC_ALL="C", PYTHONHASHSEED="0")
    builders = {"python3": ["/usr/bin/python3", "-c", PY_BUILDER],
                "perl": ["perl", "-e", PERL_BUILDER],
                "node": ["node", "-e", NODE_BUILDER]}
    for name in programs:
        if name != "sort":
            argv = builders[name] + [str(int(kib * share[name]) + 8192)]
        else:
            sort_bytes = int(target * share["sort"]) + MiB
            txt = os.path.join(tmpdir, "sort-input.txt")
            text_for_sort(txt, sort_bytes)
            # sort writes nothing until it has sorted everything; nobody
            # reads its output, so it blocks with its buffers full once
            # the pipe is full.
            argv = ["sort", "-S", "%dM" % (sort_bytes * 2 // MiB + 4), txt]
        procs.append((name, subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env)))

    waiting = {p.stdout.fileno(): (name, p) for name, p in procs}
    deadline = time.monotonic() + READY_TIMEOUT
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SystemExit("make-memory-image: timed out waiting for %s"
                             % ", ".join(n for n, p in waiting.values()))
        r, _, _ = select.select(list(waiting), [], [], min(left, 1.0))
        for fd in r:
            name, p = waiting.pop(fd)
            if name != "sort":
                if os.read(fd, 64)[:5] != b"ready":
                    raise SystemExit("make-memory-image: %s failed (exit %s)" % (name, p.wait()))
        for fd, (name, p) in list(waiting.items()):
            if p.poll() is not None:
                raise SystemExit("make-memory-image: %s exited early (%s)" % (name, p.returncode))
    time.sleep(0.5)
    log("heaps built in %.1f s" % (time.monotonic() - t0))

    # What each process holds, and how much of it goes into the image.
    runs = {}
    held = {}
    for name, p in procs:
        runs[name] = resident_runs(p.pid)
        held[name] = sum(l for a, l in runs[name])
    total = sum(held.values())
    if total == 0:
        raise SystemExit("make-memory-image: could not read any process memory "
                         "(need root or ptrace rights)")
    quota = {}
    for name in held:
        quota[name] = min(held[name], held[name] * target // total // PAGE * PAGE)

    gens = [(name, reader(p.pid, runs[name], held[name], quota[name])) for name, p in procs]
    got = {name: 0 for name, p in procs}
    written = 0
    pending = {name: b"" for name, g in gens}
    with open(out, "wb") as f:
        # Interleave: SLICE bytes from each process in turn.
        active = list(gens)
        while active and written < target:
            nxt = []
            for name, g in active:
                buf = pending[name]
                ended = False
                while len(buf) < SLICE:
                    try:
                        buf += next(g)
                    except StopIteration:
                        ended = True
                        break
                chunk, pending[name] = buf[:SLICE], buf[SLICE:]
                chunk = chunk[: target - written]
                f.write(chunk)
                written += len(chunk)
                got[name] += len(chunk)
                if not ended or pending[name]:
                    nxt.append((name, g))
                if written >= target:
                    break
            active = nxt
    for name, p in procs:
        p.kill()

    padded = target - written
    if padded > 0:
        if written == 0:
            raise SystemExit("make-memory-image: nothing read")
        with open(out, "rb+") as f:
            tail_len = min(written, 64 * MiB)
            f.seek(written - tail_len)
            tail = f.read(tail_len)
            f.seek(written)
            left = padded
            while left > 0:
                part = tail[-left:] if left < len(tail) else tail
                f.write(part)
                left -= len(part)

    # Summary.
    pages = zero = same = 0
    with open(out, "rb") as f:
        while True:
            blk = f.read(4 * MiB)
            if not blk:
                break
            for i in range(0, len(blk), PAGE):
                pg = blk[i:i + PAGE]
                pages += 1
                if pg.count(0) == PAGE:
                    zero += 1
                elif pg == pg[:8] * (PAGE // 8):
                    same += 1
    size = os.path.getsize(out)
    print("memory image: %s" % out)
    print("  size:        %d bytes (%d MiB), %d pages" % (size, size // MiB, pages))
    for name in held:
        print("  %-12s %6.1f MiB resident anonymous, %6.1f MiB used"
              % (name + ":", held[name] / MiB, got[name] / MiB))
    print("  padding:     %.1f MiB (tail of the data repeated)" % (padded / MiB))
    print("  zero pages:  %.2f %%" % (100.0 * zero / max(pages, 1)))
    print("  same-filled: %.2f %% (non-zero, one repeated 8-byte word)"
          % (100.0 * same / max(pages, 1)))
    print("  built in %.1f s" % (time.monotonic() - t0))
finally:
    cleanup()
PYEOF
