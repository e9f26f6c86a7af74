"""deps.py BUILD_DIR: no dependency cycles between src files.

Reads every BUILD_DIR/src/*.o with nm: file A depends on file B when A uses a
function or object that B defines.  A cycle (files that depend on each other,
directly or around a loop) fails, except the cycles listed in KNOWN below, each
with why it is still there; a cycle that grows, or a new one, fails.
"""
import glob
import os
import subprocess
import sys

# Cycles still in the tree (issue 13, item 7), to be broken; none may grow.
KNOWN = {
}


def graph(build):
    defs, uses = {}, {}
    objs = glob.glob(os.path.join(build, "src", "*.o"))
    if not objs:
        sys.exit("deps.py: no objects in %s/src (build first)" % build)
    for o in objs:
        name = os.path.basename(o)[:-2]
        out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TDBR":
                defs[p[2]] = name
            elif len(p) == 2 and p[0] == "U":
                uses.setdefault(name, set()).add(p[1])
    g = {n: set() for n in set(defs.values()) | set(uses)}
    for n, us in uses.items():
        g[n] |= {defs[u] for u in us if u in defs and defs[u] != n}
    return g


def cycles(g):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


g = graph(sys.argv[1] if len(sys.argv) > 1 else "build")
bad = 0
for comp in cycles(g):
    edges = "; ".join("%s -> %s" % (a, ", ".join(sorted(g[a] & comp))) for a in sorted(comp))
    known = [k for k in KNOWN if comp <= k]  # a CUDA-less build has probe_cuda missing
    if known:
        print("known cycle (to break): %s: %s" % (" <-> ".join(sorted(comp)), KNOWN[known[0]]))
    else:
        print("FAIL dependency cycle between src files: %s" % edges)
        bad = 1
print("ok   no dependency cycles between src files beyond the known ones" if not bad else "")
sys.exit(bad)
