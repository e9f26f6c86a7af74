#!/usr/bin/env python3
"""sdpa_math.py - SDPA's math kernel for fp32 grouped-query attention, PyTorch against memplan.

torch 2.11 on CUDA runs fp32 GQA (transformers passes enable_gqa=True without a mask) on SDPA's
math kernel (memplan --torch 2.11; docs/memory-facts.md#sdpa-math).  The math kernel is a
CompositeImplicitAutograd function (_scaled_dot_product_attention_math), the same ops on every
device, so the CPU runs it here with torch.nn.attention.sdpa_kernel(SDPBackend.MATH):

  1. one call, op by op (a TorchDispatchMode) and what autograd saves (saved_tensors_hooks,
     deduplicated by storage): the arithmetic the test of tests/cli.sh writes out;
  2. the whole training step of a Hugging Face config under FakeTensorMode with
     bench/accuracy/torch_step.py's trackers (LiveTracker: the peak as max_memory_allocated;
     SavedTracker: the saved bytes), against `memplan estimate --torch 2.11` (peak minus the cuBLAS
     workspace, which the CPU lacks).  The row goes to bench/accuracy/rows/sdpa_math.jsonl
     (bench/accuracy/rowlib.py), which tests/replay_accuracy.py replays in `make test`.

  python3 bench/accuracy/sdpa_math.py [--config models/hf/qwen2-0.5b.json] [--batch 4] [--seq 1024]
      [--max-layers 0] [--vocab 0] [--checkpoint none|layers] [--memplan ./memplan]

--vocab N shrinks the vocabulary so that the step's peak leaves the loss for the attention (its
forward and backward transients are then what is compared).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rowlib  # noqa: E402
import torch_step  # noqa: E402  (the trackers; it also routes dropout and SDPA as CUDA does)


class OpLog(TorchDispatchMode):
    """Each op's name and its outputs' shapes and dtypes."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        self.ops.append((str(func), [(tuple(o.shape), str(o.dtype)) for o in outs if isinstance(o, torch.Tensor)]))
        return out


def one_call(b, a, kv, s, d):
    """The forward ops of one causal fp32 GQA call and the bytes its autograd graph saves."""
    q = torch.randn(b, a, s, d, requires_grad=True)
    k = torch.randn(b, kv, s, d, requires_grad=True)
    v = torch.randn(b, kv, s, d, requires_grad=True)
    saved = {}

    def pack(t):
        st = t.untyped_storage()
        saved[st.data_ptr()] = (tuple(t.shape), st.nbytes())
        return t

    log = OpLog()
    with sdpa_kernel(SDPBackend.MATH), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), log:
        torch_step._SDPA(q, k, v, is_causal=True, enable_gqa=True)
    return log.ops, sorted(saved.values())


def whole_step(cfg_path, batch, seq, max_layers, vocab, ckpt):
    """The config as both sides read it (rowlib.load_config: dropout off, at most max_layers
    layers; vocab: the vocabulary's size) and torch's figures of the step."""
    cfg = rowlib.load_config(cfg_path, max_layers)
    if vocab:
        cfg["vocab_size"] = vocab
    with sdpa_kernel(SDPBackend.MATH):
        t = torch_step.measure_torch(cfg, batch, seq, "fp32", "sdpa", ckpt, "adamw")
    return cfg, t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="models/hf/qwen2-0.5b.json")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--max-layers", type=int, default=0, help="cap the decoder's layers (0: all)")
    ap.add_argument("--vocab", type=int, default=0, help="the vocabulary's size (0: the config's)")
    ap.add_argument("--checkpoint", choices=("none", "layers"), default="none")
    ap.add_argument("--memplan", default="./memplan")
    args = ap.parse_args()
    print("torch %s, transformers %s, CPU, SDPA forced to the math kernel" %
          (torch.__version__, torch_step.transformers.__version__))

    ops, saved = one_call(2, 14, 2, 16, 64)
    print("\none call, b 2, 14 q heads, 2 k/v heads, s 16, d 64 (fp32, is_causal, enable_gqa):")
    for name, outs in ops:
        print("  %-32s %s" % (name, outs))
    print("  saved (by storage): %s = %d bytes" % (saved, sum(n for _, n in saved)))

    cfg, t = whole_step(args.config, args.batch, args.seq, args.max_layers, args.vocab, args.checkpoint)
    margs = ["--batch", str(args.batch), "--seq", str(args.seq), "--precision", "fp32", "--checkpoint",
             args.checkpoint, "--use-cache", "off", "--torch", "2.11", "--json"]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    try:
        d = json.loads(subprocess.run([args.memplan, "estimate", f.name] + margs, capture_output=True, text=True,
                                      check=True).stdout)
        fused = json.loads(subprocess.run([args.memplan, "estimate", f.name] + margs[:-3] + ["--json"],
                                          capture_output=True, text=True, check=True).stdout)
    finally:
        os.unlink(f.name)
    peak = rowlib.FIGURES["peak"](d)
    saved_mp = rowlib.FIGURES["saved"](d)
    print("\n%s, %d layers, vocabulary %d, %d x %d fp32, AdamW, checkpoint %s:" %
          (args.config, cfg["num_hidden_layers"], cfg["vocab_size"], args.batch, args.seq, args.checkpoint))
    num = lambda n: "-" if n is None else "{:,}".format(n)  # noqa: E731
    print("  torch (math)         peak %15s  saved %15s  at %s" % (num(t["peak"]), num(t["saved"]), t["peak_at"]))
    print("  memplan --torch 2.11 peak %15s  saved %15s  at %s (%+.4f %%, sdpa_kernel %s)" %
          (num(peak), num(saved_mp if args.checkpoint == "none" else None), d["memory"]["peak_event"],
           100.0 * (peak - t["peak"]) / t["peak"], d["config"].get("sdpa_kernel")))
    print("  memplan (2.15)       peak %15s  (the memory-efficient kernel)" % num(rowlib.FIGURES["peak"](fused)))
    row = {"source": "bench/accuracy/sdpa_math.py run (SDPA forced to the math kernel, fake tensors)",
           "args": margs, "figures": {"peak": rowlib.figure(t["peak"], peak)},
           "recorded": {"peak_diff_pct": round(100.0 * (peak - t["peak"]) / t["peak"], 4),
                        "torch_peak_at": t["peak_at"], "memplan_peak_at": d["memory"]["peak_event"]},
           "versions": rowlib.run_versions(torch=torch.__version__,
                                           transformers=torch_step.transformers.__version__)}
    if args.checkpoint == "none":
        row["figures"]["saved"] = rowlib.figure(t["saved"], saved_mp)
    if args.vocab:
        row.update(config="%s, %d layers, vocabulary %d (sdpa_math.py --vocab)" %
                   (args.config, cfg["num_hidden_layers"], args.vocab), config_json=cfg)
    else:
        row.update(config=args.config, max_layers=args.max_layers)
    print("  row saved to %s" % rowlib.save_rows("sdpa_math", [row]))


if __name__ == "__main__":
    main()
