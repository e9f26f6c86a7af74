"""reestimate.py: memplan's estimates of a GPU kit run's matrix, again, against that run's PyTorch figures.

Usage: python3 bench/gpu/reestimate.py [STATE] [--memplan PATH] [--alloc-conf CONF]
  STATE   a kit run's report.json (default bench/results/gpu-2026-11-28b.json, the H200's second run)
  CONF    the PYTORCH_CUDA_ALLOC_CONF the PyTorch rows ran under, given to memplan's --alloc-conf
          (default: the state's env.alloc_conf, which the kit records since 2026-11-30; the H200's
          expandable matrix, gpu-2026-11-28b-expandable.json, predates it: give
          expandable_segments:True)

Each matrix row is estimated as the kit estimated it (bench/gpu/kit.py memplan_args: the same
config, batch, sequence, precision, checkpointing, fine-tuning, --gpu profile), with the torch
release the GPU's PyTorch worker had (--torch), and set against the row's measured
max_memory_allocated and max_memory_reserved.  No GPU: this measures nothing new, it tells what
a change to memplan does to the rows a GPU measured.  Prints a Markdown table; exit 1 when an
allocated peak is more than --limit percent off (default 1: issue 22 asks 2 %, the H200's rows are
within 0.2 %).  Where the state has the dpo part's rows (TRL's DPOTrainer step, dpo_cuda.py),
each is estimated again with the arguments the kit gave it, against the step's
max_memory_allocated and the reference forward's own peak (less what the row started with beyond
the step's two cuBLAS workspaces: the kit's 1 MiB cuBLASLt workspace); both within --limit too.
"""
import ast
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import kit  # noqa: E402

GiB = 2 ** 30


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("state", nargs="?", default=os.path.join(ROOT, "bench/results/gpu-2026-11-28b.json"))
    ap.add_argument("--memplan", default=os.path.join(ROOT, "memplan"))
    ap.add_argument("--limit", type=float, default=1.0, help="percent (default 1)")
    ap.add_argument("--alloc-conf", default=None, help="the rows' PYTORCH_CUDA_ALLOC_CONF (default: the state's)")
    a = ap.parse_args()
    with open(a.state) as f:
        st = json.load(f)
    m = st["matrix"]
    release = st["env"].get("torch_worker", {}).get("torch")
    conf = a.alloc_conf if a.alloc_conf is not None else st["env"].get("alloc_conf", "")
    print("%s, %s; memplan %s, profile %s, --torch %s, --alloc-conf '%s'\n" % (
        st["env"]["gpu"]["name"], a.state, a.memplan, m["profile"], release, conf))
    print("| row | estimate GiB | torch allocated GiB | Δ % | est reserved GiB | torch reserved GiB | Δ reserved % |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for r in m["rows"]:
        t = r.get("torch", {})
        if t.get("status") != "ok":
            print("| %s | | (no torch figure) | | | | |" % r["id"])
            continue
        args = kit.memplan_args(r, os.path.join(ROOT, r["config"]), r["run_batch"], r["run_seq"], release)
        p = subprocess.run([a.memplan, "estimate"] + args + ["--gpu", m["profile"], "--json"] +
                           (["--alloc-conf", conf] if conf else []), capture_output=True, text=True,
                           env=dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="", PYTORCH_ALLOC_CONF=""))
        if p.returncode != 0:
            print("| %s | FAILED: %s |" % (r["id"], p.stderr.strip()[:80]))
            worst = float("inf")
            continue
        mem = json.loads(p.stdout)["memory"]
        e, ta = mem["peak_allocated_bytes"], t["peak_allocated"]
        er, tr = mem.get("peak_reserved_bytes", 0), t["peak_reserved"]
        d = 100.0 * (e - ta) / ta
        worst = max(worst, abs(d))
        print("| %s | %.3f | %.3f | %+.2f | %.3f | %.3f | %+.2f |" % (r["id"], e / GiB, ta / GiB, d, er / GiB, tr / GiB,
                                                                     100.0 * (er - tr) / tr))
    print("\nworst allocated: %.2f %%" % worst)
    rows = (st.get("dpo") or {}).get("rows") or []
    if rows:
        worst = max(worst, dpo_rows(a.memplan, rows))
    return 0 if worst <= a.limit else 1


def dpo_configs():
    """The dpo part's model configs by name (dpo_cuda.py): the tiny Llama (dpo_step.py's CONFIG,
    read from its source: importing it needs torch) and Llama-3.2-1B, cut to 2 layers and whole."""
    src = open(os.path.join(ROOT, "bench/accuracy/dpo_step.py")).read()
    tiny = next(ast.literal_eval(n.value) for n in ast.parse(src).body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "CONFIG")
    with open(os.path.join(ROOT, "models/hf/llama-3.2-1b.json")) as f:
        one_b = json.load(f)
    two = dict(one_b, num_hidden_layers=2)
    return {"tiny": tiny, "llama-3.2-1b (2 layers)": two, "llama-3.2-1b (16 layers)": one_b}


def dpo_rows(memplan, rows):
    """The DPO rows' table; returns the worst |Δ| in percent (the step's peak and the reference's)."""
    import tempfile
    cfgs, worst = dpo_configs(), 0.0
    print("\nDPO rows: torch's figures less what the row started with beyond the two cuBLAS workspaces")
    print("\n| DPO row | torch peak | memplan | Δ % | torch reference fwd | memplan | Δ % |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for r in rows:
            path = os.path.join(tmp, "c.json")
            with open(path, "w") as f:
                json.dump(cfgs[r["config"]], f)
            p = subprocess.run([memplan, "estimate", path] + r["args"], capture_output=True, text=True)
            name = "%s %s %s %s" % (r["config"], r["finetune"], r["checkpoint"],
                                    "precomputed" if r["precompute"] else "reference")
            if p.returncode != 0:
                print("| %s | FAILED: %s |" % (name, p.stderr.strip()[:80]))
                worst = float("inf")
                continue
            m = json.loads(p.stdout)["memory"]
            # what the row started with beyond the step's cuBLAS workspaces is the kit's own
            # (dpo_cuda.py's workspace probe leaves cuBLASLt's 1 MiB from a Linear with a bias,
            # which these bias-free models never make): not the step's
            left = max(0, r.get("alloc_start", 0) - (r.get("memplan_workspace_bytes") or 0))
            e, t = m["peak_allocated_bytes"], r["torch_peak"] - left
            d = 100.0 * (e - t) / t
            worst = max(worst, abs(d))
            cells = "| | |"
            tr = r.get("torch_ref_forward_peak")
            if tr:
                tr -= left
                er = m["phases"]["reference_forward"]["peak_allocated_bytes"]
                dr = 100.0 * (er - tr) / tr
                worst = max(worst, abs(dr))
                cells = "%d | %d | %+.3f |" % (tr, er, dr)
            print("| %s | %d | %d | %+.3f | %s" % (name, t, e, d, cells))
    print("\nworst with DPO: %.2f %%" % worst)
    return worst


if __name__ == "__main__":
    sys.exit(main())
