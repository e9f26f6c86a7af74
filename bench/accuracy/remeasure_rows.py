#!/usr/bin/env python3
"""remeasure_rows.py — torch_step / loss_heads rows measured again under InplaceTracker.

  python3 bench/accuracy/remeasure_rows.py [--memplan ./memplan] [--write] ORACLE:LINE[,LINE...] ...

torch_step.py's LiveTracker and loss_heads.py's Tracker are TorchDispatchModes, under which the
autograd engine sums two gradients of one tensor out of place (inplace_tracker.py's doc): a tied
embedding's gradients under amp, which plain PyTorch sums in place (the lm_head's comes fresh out
of ToCopyBackward0), were counted one table too high (bench/accuracy/tied_sum_survey.md).  This
runs each chosen row (ORACLE is torch_step or loss_heads, LINE its line in rows/ORACLE.jsonl, from
1) again as its oracle does (FakeTensorMode for torch_step, the same model, batch and settings),
with InplaceTracker's gradient-sum accounting mixed into the oracle's tracker, and prints the old
and new torch peak and memplan's.  --write stores the new peak in the row: figures.peak.torch, its
tolerance (abs) what memplan achieves now, recorded.torch_peak_at, and `remeasured` {tracker,
old_torch, commit}.  Only the peak moves: the saved activations are counted before backward.
Needs torch, transformers (and peft, trl for loss_heads rows).  Not part of make test.
"""
import argparse
import gc
import json
import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import dpo_step  # noqa: E402
import inplace_tracker  # noqa: E402
import rowlib  # noqa: E402
import torch_step  # noqa: E402


def arg(a, k, d=None):
    return a[a.index(k) + 1] if k in a else d


def torch_step_row(r):
    """The row's step as torch_step.main measures it, under InplaceTracker: (peak, where)."""
    a = r["args"]
    cfg = r["config_json"] if "config_json" in r else rowlib.load_config(os.path.join(rowlib.ROOT, r["config"]),
                                                                         r.get("max_layers", 0))
    prec, attn, ck = arg(a, "--precision"), arg(a, "--attention", "sdpa"), arg(a, "--checkpoint", "none")
    packing = "rows" if "--packing" in a else "padding-free" if "--padding-free" in a else ""
    torch_step.CUDA_FLOAT_MASK = cfg.get("model_type") in rowlib.T5_TYPES
    fake = FakeTensorMode()
    model = torch_step.fake_model(cfg, prec, attn, fake)
    tr = inplace_tracker.InplaceTracker()
    params = list(model.parameters()) + list(model.buffers())
    saved = torch_step.SavedTracker(exclude=params) if ck == "none" else None
    with fake, tr:
        res = torch_step.train_steps(model, tr, int(arg(a, "--batch")), int(arg(a, "--seq")), prec,
                                     arg(a, "--optimizer", "adamw"), ck, cfg.get("vocab_size", 1000), saved=saved,
                                     use_cache=arg(a, "--use-cache", "off") == "on",
                                     target_seq=int(arg(a, "--target-seq", 0)), packing=packing)
    return res["peak"], res["peak_at"]


def loss_heads_row(r):
    """The row's step as loss_heads.py measures it, its tracker with InplaceTracker's sums."""
    import loss_heads as lh
    a = r["args"]
    base = lh.Tracker

    class Mixed(inplace_tracker.InplaceTracker, base):
        pass

    # (the MRO runs RealTracker's bool-index branch, which reads the mask's values: skipped, so
    # that loss_heads.Tracker answers the data-dependent shapes under fake tensors)
    real = dpo_step.RealTracker.__torch_dispatch__
    dpo_step.RealTracker.__torch_dispatch__ = lambda self, func, types_, args=(), kwargs=None: \
        super(dpo_step.RealTracker, self).__torch_dispatch__(func, types_, args, kwargs)
    lh.Tracker = Mixed
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = os.path.join(tmp, "config.json")
            with open(cfg, "w") as f:
                json.dump(rowlib.load_config(os.path.join(rowlib.ROOT, r["config"]), r.get("max_layers", 0)), f)
            return lh.torch_step(cfg, int(arg(a, "--batch")), int(arg(a, "--seq")), arg(a, "--precision"),
                                 arg(a, "--checkpoint"), "--finetune" in a, arg(a, "--loss"),
                                 float(arg(a, "--label-fraction", 1.0)))
    finally:
        lh.Tracker = base
        dpo_step.RealTracker.__torch_dispatch__ = real


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memplan", default="./memplan")
    ap.add_argument("--write", action="store_true", help="store the new peaks in the rows files")
    ap.add_argument("rows", nargs="+", help="ORACLE:LINE[,LINE...] (lines of rows/ORACLE.jsonl, from 1)")
    o = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    for spec in o.rows:
        oracle, lines = spec.split(":")
        if oracle not in ("torch_step", "loss_heads"):
            sys.exit("remeasure_rows: %s: torch_step or loss_heads rows only" % spec)
        path = os.path.join(rowlib.ROWS_DIR, oracle + ".jsonl")
        rows = rowlib.read_rows(path)
        for ln in (int(x) for x in lines.split(",")):
            r = rows[ln - 1]
            peak, at = (torch_step_row if oracle == "torch_step" else loss_heads_row)(r)
            gc.collect()
            with tempfile.TemporaryDirectory() as tmp:
                report, _ = rowlib.run_memplan(os.path.abspath(o.memplan), r, tmp)
            f = r["figures"]["peak"]
            got = rowlib.FIGURES["peak"](report)  # (the allocated peak less the cuBLAS workspace, as replayed)
            print("%s:%d %s %s: torch %d -> %d (%+d) at %s; memplan %d (%+.3f %%)" % (
                oracle, ln, r.get("config"), " ".join(r["args"][:12]), f["torch"], peak, peak - f["torch"], at, got,
                100.0 * (got - peak - f.get("extra", 0)) / (peak + f.get("extra", 0))), flush=True)
            if o.write:
                r["remeasured"] = {"tracker": "InplaceTracker (bench/accuracy/remeasure_rows.py)",
                                   "old_torch": f["torch"], "commit": rowlib.git_commit()}
                f["torch"] = int(peak)
                f["abs"] = abs(int(got) - int(peak) - int(f.get("extra", 0)))
                f.pop("pct", None)
                r.setdefault("recorded", {})["torch_peak_at"] = at
        if o.write:
            with open(path, "w") as fh:
                for r in rows:
                    fh.write(json.dumps(r, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
