#!/usr/bin/env python3
"""dpo_cuda.py — memplan --trainer dpo against TRL's DPOTrainer step on a CUDA GPU (the GPU kit's
`dpo` part; bench/accuracy/dpo_step.py is the same step on the CPU, with CUDA's branches set by
hand).

  python3 bench/gpu/dpo_cuda.py --memplan PATH --out FILE.json [--steps N]

Rows: the tiny Llama of dpo_step.py and Llama-3.2-1B cut to 2 decoder layers (rowlib.load_config),
bf16 weights, 2 pairs x 1024 tokens (prompt 512), each with the reference as a frozen copy, the
adapter disabled (LoRA r16 all-linear), and precomputed log-probs; checkpointing none and layers.
The step is TRL 1.16.0's own: DPOTrainer._compute_loss on dpo_step.Stub (its docstring), then
loss.backward(), AdamW(foreach) step, zero_grad.  Here TRL's fused head takes its CUDA branches
itself (Triton kernels, compact gather): nothing is patched.  After one warm-up step,
torch.cuda.reset_peak_memory_stats(); the step's max_memory_allocated is the row's peak, and the
reference forward's own (TRL's with-block, peak stats reset at its start) its ref_forward_peak.
memplan: `estimate CONFIG --trainer dpo ... --json` (its default cuBLAS workspace: torch allocates
cuBLAS's through the caching allocator).  Writes one JSON object: {"rows": [...]} with torch's and
memplan's bytes and the difference in percent.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "accuracy"))


def step_rows(memplan, steps, smoke=False):
    import torch
    import transformers
    from trl import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head
    import trl.trainer.dpo_trainer as dt
    import rowlib
    from dpo_step import CONFIG, dpo_inputs, memplan_args, memplan_run, prepare

    dev = torch.device("cpu" if smoke else "cuda")
    if smoke:  # the flow on the CPU, no memory figures (a check of the script itself)
        for fn in ("empty_cache", "reset_peak_memory_stats", "synchronize"):
            setattr(torch.cuda, fn, lambda *a, **k: None)
        torch.cuda.max_memory_allocated = lambda *a, **k: 1
    one_b = rowlib.load_config(os.path.join(ROOT, "models/hf/llama-3.2-1b.json"), 2)
    configs = [("tiny", CONFIG)] + ([] if smoke else [("llama-3.2-1b (2 layers)", one_b)])
    settings = [(ft, ck, pre) for ft, pre in (("full", False), ("lora", False), ("full", True))
                for ck in ("none", "layers")]
    pairs, seq, prompt = (1, 65, 33) if smoke else (2, 1025, 513)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfgd in configs:
            path = os.path.join(tmp, "c.json")
            with open(path, "w") as f:
                json.dump(cfgd, f)
            for ft, ck, pre in settings:
                cfg = transformers.AutoConfig.for_model(**cfgd)
                cfg._attn_implementation = "sdpa"
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(dev)
                ref = None
                if ft == "full" and not pre:
                    ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(dev).eval()
                    ref.requires_grad_(False)
                model, stub, opt = prepare(model, ref, ft, ck, pre, add_fused_lm_head,
                                           ("log_probs", "entropy", "mean_logits", "is_top1"))
                stub.accelerator.device = dev
                inputs = dpo_inputs(cfg.vocab_size, pairs, seq, prompt, pre, dev)
                ref_peak, before = [0], [0]
                orig = dt.disable_gradient_checkpointing

                class Measured:
                    def __init__(self, m, kw):
                        self.cm = orig(m, kw)

                    def __enter__(self):
                        before[0] = max(before[0], torch.cuda.max_memory_allocated())  # the policy's so far
                        torch.cuda.reset_peak_memory_stats()
                        return self.cm.__enter__()

                    def __exit__(self, *e):
                        r = self.cm.__exit__(*e)
                        ref_peak[0] = torch.cuda.max_memory_allocated()
                        return r
                dt.disable_gradient_checkpointing = Measured
                peak = 0
                try:
                    for s in range(1 + steps):
                        if s == 1:
                            torch.cuda.synchronize()
                            torch.cuda.reset_peak_memory_stats()
                            peak, ref_peak[0], before[0] = 0, 0, 0
                        loss = DPOTrainer._compute_loss(stub, model, inputs, False)
                        peak = max(peak, torch.cuda.max_memory_allocated())
                        loss.backward()
                        del loss
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                        torch.cuda.synchronize()
                        peak = max(peak, before[0], torch.cuda.max_memory_allocated())
                finally:
                    dt.disable_gradient_checkpointing = orig
                frac = (seq - prompt) / (seq - 1)
                args = [a for a in memplan_args(ft, ck, pairs, seq, frac, pre) if a not in ("--workspace", "0")]
                m = memplan_run(memplan, path, args)
                mp = m["peak_allocated_bytes"]
                mref = m.get("phases", {}).get("reference_forward", {}).get("peak_allocated_bytes", 0)
                rows.append({"config": name, "finetune": ft, "checkpoint": ck, "precompute": pre,
                             "pairs": pairs, "seq": seq, "prompt": prompt, "args": args,
                             "torch_peak": peak, "memplan_peak": mp, "peak_pct": round(100.0 * (mp - peak) / peak, 3),
                             "torch_ref_forward_peak": ref_peak[0], "memplan_ref_forward_peak": mref,
                             "ref_pct": round(100.0 * (mref - ref_peak[0]) / ref_peak[0], 3) if ref_peak[0] else None,
                             "memplan_peak_event": m["peak_event"]})
                print(json.dumps(rows[-1]), flush=True)
                del model, ref, opt, stub, inputs
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memplan", default=os.path.join(ROOT, "memplan"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--cpu-smoke", action="store_true", help="run the flow on the CPU (no memory figures)")
    a = ap.parse_args()
    import torch
    if a.cpu_smoke:
        rows = step_rows(a.memplan, 1, smoke=True)
        json.dump({"status": "smoke", "rows": rows}, open(a.out, "w"), indent=1)
        return
    if not torch.cuda.is_available():
        json.dump({"status": "skipped", "note": "no CUDA device"}, open(a.out, "w"))
        print("dpo_cuda: no CUDA device: skipped")
        return
    rows = step_rows(a.memplan, a.steps)
    json.dump({"status": "ok", "device": torch.cuda.get_device_name(0), "rows": rows}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
