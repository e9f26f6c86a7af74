#!/usr/bin/env python3
"""gpu_traces.py - the caching allocator's own record of the GPU kit's PyTorch rows, replayed.

  python3 bench/alloc/gpu_traces.py [TRACES.tgz] [--state REPORT.json] [--memplan ./memplan]
                                    [--row ID] [--min BYTES]

TRACES.tgz (default traces/h200-2026-11-28-default.tgz) holds one `ROW.trace` a matrix row, written
on the GPU by the kit's worker under MEMPLAN_KIT_TRACE (bench/gpu/README.md): every block the
allocator handed out and took back, in order, from the model's build to the last measured step.
STATE is that run's report.json (default bench/results/gpu-2026-11-28b-traces.json; for the
expandable-segments traces, gpu-2026-11-28b-expandable.json: the rows' torch figures).

For each row: the GPU's max_memory_reserved, and cca_ref.py's (the independent allocator, default
settings) over the GPU's own sequence, peaks reset at "step 1" as the kit resets them; a match
says the rules hold and a miss of memplan's is in its requests.  "segments" is the peak of the
trace's own segment lines (under expandable segments the pages it mapped): only the segments the
record saw made, so a row whose build reused segments the row before left cached shows less than
the GPU's.  cca_ref knows the default settings only: it is no reference for expandable traces.  With --row ID: the requests of
step 1 by size, the GPU's against memplan's own (MEMPLAN_ALLOC_TRACE, the kit's arguments), each
size whose count differs (--min: only sizes of at least BYTES).  The GPU's sizes are as requested
(the allocator rounds them); memplan's likewise.
"""
import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
import cca_ref  # noqa: E402

GIB = float(1 << 30)


def step_sizes(path, step=1):
    """Counter of request sizes between `m step STEP` and the next step mark."""
    c, on = Counter(), False
    with open(path) as f:
        for ln in f:
            w = ln.split()
            if not w:
                continue
            if w[0] == "m" and len(w) > 2 and w[1] == "step":
                on = int(w[2]) == step
            elif w[0] == "a" and on:
                c[int(w[2])] += 1
    return c


def segment_peak(path, reset="step 1"):
    """The reserved peak from the trace's own segment lines (`s` made or mapped, `u` freed or
    unmapped), from the mark `m RESET` on: the GPU's max_memory_reserved if the record is whole."""
    cur, peak, on = 0, 0, False
    with open(path) as f:
        for ln in f:
            w = ln.split()
            if not w:
                continue
            if w[0] == "m" and " ".join(w[1:]) == reset:
                on, peak = True, cur
            elif w[0] == "s":
                cur += int(w[2])
            elif w[0] == "u":
                cur -= int(w[2])
            if on:
                peak = max(peak, cur)
    return peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="?", default=os.path.join(HERE, "traces", "h200-2026-11-28-default.tgz"))
    ap.add_argument("--state", default=os.path.join(ROOT, "bench", "results", "gpu-2026-11-28b-traces.json"))
    ap.add_argument("--memplan", default=os.path.join(ROOT, "memplan"))
    ap.add_argument("--row", default="", help="a row id: its step-1 requests, the GPU's against memplan's")
    ap.add_argument("--min", type=int, default=0, help="with --row: only sizes of at least BYTES")
    a = ap.parse_args()
    with open(a.state) as f:
        st = json.load(f)
    rows = {r["id"]: r for r in st["matrix"]["rows"]}
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(a.traces) as t:
            t.extractall(tmp, filter="data")
        files = {r: os.path.join(tmp, r.replace("/", "_") + ".trace") for r in rows}
        if a.row:
            if a.row not in rows or not os.path.exists(files[a.row]):
                sys.exit("gpu_traces: no trace of row %r in %s" % (a.row, a.traces))
            import kit
            r = rows[a.row]
            release = st["env"].get("torch_worker", {}).get("torch")
            mine = os.path.join(tmp, "memplan.trace")
            args = kit.memplan_args(r, os.path.join(ROOT, r["config"]), r["run_batch"], r["run_seq"], release)
            env = dict(os.environ, MEMPLAN_ALLOC_TRACE=mine)
            subprocess.run([a.memplan, "estimate"] + args + ["--gpu", st["matrix"]["profile"], "--json"],
                           env=env, capture_output=True, check=True)
            g, m = step_sizes(files[a.row]), step_sizes(mine)
            print("%s, step 1: %d requests on the GPU, %d memplan's" % (a.row, sum(g.values()), sum(m.values())))
            print("%14s %7s %8s" % ("bytes", "GPU", "memplan"))
            for k in sorted(set(g) | set(m), key=lambda k: -k):
                if g[k] != m[k] and k >= a.min:
                    print("%14d %7d %8d" % (k, g[k], m[k]))
            return 0
        print("%-36s %10s %10s %10s %8s" % ("row", "GPU GiB", "segments", "cca_ref", "delta %"))
        for rid, r in rows.items():
            t = r.get("torch", {})
            if t.get("status") != "ok" or not os.path.exists(files[rid]):
                continue
            al, _ = cca_ref.run(cca_ref.read_trace(files[rid]), "step 1")
            g = t["peak_reserved"]
            print("%-36s %10.3f %10.3f %10.3f %+8.2f" % (rid, g / GIB, segment_peak(files[rid]) / GIB,
                                                         al.peak_reserved / GIB, 100.0 * (al.peak_reserved - g) / g))
    return 0


if __name__ == "__main__":
    sys.exit(main())
