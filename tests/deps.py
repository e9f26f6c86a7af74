"""deps.py BUILD_DIR: the code's structure holds.

1. No dependency cycles between src files.  Reads every BUILD_DIR/src/**/*.o with nm:
   file A depends on file B when A uses a function or object that B defines.  A cycle
   (files that depend on each other, directly or around a loop) fails, except the cycles
   listed in KNOWN below, each with why it is still there; a cycle that grows, or a new
   one, fails.
2. The folders are the pipeline, in ORDER: a file may use (nm) and include only files of
   its own folder or of folders before it.
3. A file includes another folder's code only through that folder's public header
   (PUBLIC); the other headers of a folder are its own.  kernels/ is the cuda probe's
   device code and includes only probe/mp_math.h and util/sets.h.
"""
import glob
import os
import re
import subprocess
import sys

ORDER = ["util", "json", "recipe", "model", "ir", "ckpt", "estimate", "probe", "search", "report", "cli"]
PUBLIC = {
    "util": ("util/util.h", "util/sets.h"),  # sets.h: the closed sets, for kernels/ and mp_math.h too
    "json": "json/json.h",
    "recipe": "recipe/recipe.h",
    "model": "model/model.h",
    "ir": "ir/layers.h",
    "ckpt": "ckpt/ckpt.h",
    "estimate": "estimate/estimate.h",
    "probe": "probe/probe.h",
    "search": "search/search.h",
    "report": "report/report.h",
}
KERNEL_INCLUDES = {"probe/mp_math.h", "util/sets.h"}

# Cycles still in the tree (issue 13, item 7), to be broken; none may grow.
KNOWN = {
}


def graph(build):
    defs, uses = {}, {}
    root = os.path.join(build, "src")
    objs = glob.glob(os.path.join(root, "**", "*.o"), recursive=True)
    if not objs:
        sys.exit("deps.py: no objects in %s/src (build first)" % build)
    for o in objs:
        name = os.path.relpath(o, root)[:-2]
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


def folder(name):
    """The pipeline folder of a path relative to src/ ("probe/host/x" -> "probe")."""
    return name.split("/")[0]


def rank(name):
    f = folder(name)
    if f not in ORDER:
        print("FAIL src/%s is in no folder of ORDER (tests/deps.py): add the folder there" % name)
        return None
    return ORDER.index(f)


for a in sorted(g):
    for b in sorted(g[a]):
        ra, rb = rank(a), rank(b)
        if ra is None or rb is None:
            bad = 1
        elif rb > ra:
            print("FAIL src/%s.c uses src/%s.c: %s/ comes after %s/ in the pipeline" % (a, b, folder(b), folder(a)))
            bad = 1

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
for path in sorted(glob.glob(os.path.join(src, "**", "*.[ch]"), recursive=True)):
    rel = os.path.relpath(path, src)
    here = os.path.dirname(rel)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    for inc in INCLUDE.findall(text):
        if inc.startswith("../"):  # the cuda backend's device code
            if rel.startswith("probe/cuda/") and inc.endswith("kernels/kernels.h"):
                continue
            print("FAIL src/%s includes %s: include by path from src/, not ../" % (rel, inc))
            bad = 1
            continue
        target = inc if "/" in inc else os.path.join(here, inc)
        if not os.path.exists(os.path.join(src, target)):
            print("FAIL src/%s includes %s: no such file under src/" % (rel, inc))
            bad = 1
            continue
        fa, fb = folder(rel), folder(target)
        if fa == fb:
            continue
        if fb not in ORDER or fa not in ORDER or ORDER.index(fb) > ORDER.index(fa):
            print("FAIL src/%s includes %s: %s/ comes after %s/ in the pipeline" % (rel, inc, fb, fa))
            bad = 1
        elif target not in (PUBLIC[fb] if isinstance(PUBLIC.get(fb), tuple) else (PUBLIC.get(fb),)):
            print("FAIL src/%s includes %s: another folder's code is reached through its public header %s"
                  % (rel, inc, PUBLIC.get(fb)))
            bad = 1
kdir = os.path.join(src, "..", "kernels")
for path in sorted(glob.glob(os.path.join(kdir, "*"))):
    with open(path, encoding="utf-8") as fh:
        for inc in INCLUDE.findall(fh.read()):
            if "/" in inc and inc not in KERNEL_INCLUDES:
                print("FAIL kernels/%s includes %s: kernels/ includes only %s from src/"
                      % (os.path.basename(path), inc, ", ".join(sorted(KERNEL_INCLUDES))))
                bad = 1
print("ok   folders in pipeline order, each reached through its public header" if not bad else "")
sys.exit(bad)
