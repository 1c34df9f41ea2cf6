#!/usr/bin/env bash
# The store and the plugin in layers: every file calls only down.  From
# the built libraries' symbols (nm), an edge from each object to the
# objects that define what it calls; the test fails on any cycle and
# names its files and the symbols that close it.  (alloc/'s core is
# one design, as zsmalloc's one file, and is not held to it.)  Before
# this test the plugin had two cycles: swap mode, the full-device watch,
# the parameters and the stats through /proc helpers and the size
# parser; the control thread and its commands through the replies.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nm /usr/bin/python3

libraries=()
for library in store/.libs/libzram-store.a plugin/.libs/libzram-plugin-core.a; do
    [ -f "$BUILDDIR/$library" ] || fail "not built: $BUILDDIR/$library"
    libraries+=("$BUILDDIR/$library")
done
nm -A "${libraries[@]}" > "$tmp/symbols"

/usr/bin/python3 - "$tmp/symbols" <<'PY'
import collections, re, sys
defined, wanted = {}, collections.defaultdict(set)
for line in open(sys.argv[1]):
    where, _, rest = line.rpartition(":")
    name = re.sub(r"^.*_la-|\.o$", "", where.rsplit(":", 1)[-1])
    fields = rest.split()
    if len(fields) == 3 and fields[1] in "TDBR":
        defined[fields[2]] = name
    elif len(fields) == 2 and fields[0] == "U":
        wanted[name].add(fields[1])
files = set(defined.values()) | set(wanted)
calls = {f: {defined[s] for s in wanted[f] if s in defined and defined[s] != f}
         for f in files}
# Tarjan's strongly connected components: a component of more than one
# file is a cycle.
index, low, stack, on_stack, cycles = {}, {}, [], set(), []
def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v); on_stack.add(v)
    for w in sorted(calls[v]):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on_stack:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        component = []
        while True:
            w = stack.pop(); on_stack.discard(w); component.append(w)
            if w == v:
                break
        if len(component) > 1:
            cycles.append(sorted(component))
sys.setrecursionlimit(10000)
for f in sorted(files):
    if f not in index:
        visit(f)
for cycle in cycles:
    print("cycle:", " ".join(cycle))
    for f in cycle:
        for s in sorted(wanted[f]):
            if defined.get(s) in cycle and defined[s] != f:
                print("   %s calls %s (%s)" % (f, s, defined[s]))
print("%d files, %d calls between them, %d cycles"
      % (len(files), sum(len(c) for c in calls.values()), len(cycles)))
sys.exit(1 if cycles else 0)
PY
echo "ok: the store and the plugin call only down"
