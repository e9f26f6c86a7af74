#!/usr/bin/env python3
"""reserved_vs_gpu.py - memplan's simulated peak reserved against torch.cuda.max_memory_reserved()
measured on a GPU (the kit's matrix rows), and, with --trace, the same allocator rules
(cca_ref.py) replaying PyTorch's own allocation sequence of the step (torch_trace.py, fake
tensors on this CPU: about 20 s a row, full fine-tuning rows only).

  python3 bench/alloc/reserved_vs_gpu.py [--gpu bench/alloc/h200-2026-11-28.json]
      [--memplan ./memplan] [--only gpt2] [--trace]

Columns (GiB; delta = (x - GPU) / GPU): the GPU's max_memory_reserved, memplan's
memory.peak_reserved_bytes and its delta; with --trace, cca_ref's peak reserved over torch's
sequence (steps 1-4 after a warm-up, as the kit measures) and its delta.  bench/alloc/README.md
has the results and what they say.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import cca_ref  # noqa: E402

LORA_R = 16
GIB = float(1 << 30)


def memplan_reserved(memplan, r):
    cmd = [memplan, "estimate", os.path.join(ROOT, r["config"]), "--batch", str(r["batch"]), "--seq", str(r["seq"]),
           "--precision", r["precision"], "--checkpoint", r["checkpoint"], "--use-cache", "off",
           "--gpu", "h200-141gb", "--json"]
    if r["finetune"] != "full":
        cmd += ["--finetune", r["finetune"], "--lora-r", str(LORA_R)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["memory"]["peak_reserved_bytes"]


def trace_reserved(r):
    with tempfile.NamedTemporaryFile("w+", suffix=".txt") as f:
        subprocess.run([sys.executable, os.path.join(HERE, "torch_trace.py"), os.path.join(ROOT, r["config"]),
                        "--batch", str(r["batch"]), "--seq", str(r["seq"]), "--precision", r["precision"],
                        "--checkpoint", r["checkpoint"], "--steps", "4"],
                       stdout=f, stderr=subprocess.DEVNULL, check=True)
        al, _ = cca_ref.run(cca_ref.read_trace(f.name), "step 1")
        return al.peak_reserved


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", default=os.path.join(HERE, "h200-2026-11-28.json"))
    ap.add_argument("--memplan", default=os.path.join(ROOT, "memplan"))
    ap.add_argument("--only", default="", help="rows whose id starts with this")
    ap.add_argument("--trace", action="store_true", help="also replay PyTorch's own sequence (slow)")
    a = ap.parse_args()
    with open(a.gpu) as f:
        gpu = json.load(f)
    print("GPU figures: " + gpu["source"])
    head = "%-36s %9s %9s %8s" % ("row", "GPU", "memplan", "delta %")
    if a.trace:
        head += " %9s %8s" % ("torch seq", "delta %")
    print(head)
    for r in gpu["rows"]:
        if not r["id"].startswith(a.only):
            continue
        g = r["max_memory_reserved"]
        m = memplan_reserved(a.memplan, r)
        line = "%-36s %9.3f %9.3f %+8.2f" % (r["id"], g / GIB, m / GIB, 100.0 * (m - g) / g)
        if a.trace and r["finetune"] == "full":
            t = trace_reserved(r)
            line += " %9.3f %+8.2f" % (t / GIB, 100.0 * (t - g) / g)
        print(line, flush=True)


if __name__ == "__main__":
    main()
