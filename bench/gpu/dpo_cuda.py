#!/usr/bin/env python3
"""dpo_cuda.py — memplan --trainer dpo against TRL's DPOTrainer step on a CUDA GPU (the GPU kit's
`dpo` part; bench/accuracy/dpo_step.py is the same step on the CPU, with CUDA's branches set by
hand).

  python3 bench/gpu/dpo_cuda.py --memplan PATH --out FILE.json [--steps N] [--budget-s S]

Rows: the tiny Llama of dpo_step.py, Llama-3.2-1B cut to 2 decoder layers (rowlib.load_config) and whole,
bf16 weights, 2 pairs x 1025 tokens (prompt 513), each with the reference as a frozen copy, the
adapter disabled (LoRA r16 all-linear), or precomputed log-probs; checkpointing none and layers;
the most informative rows first (ROWS), each written to --out as it finishes, and a row is not
started when --budget-s would not leave it the time the slowest of its config took.  After them,
KTO_ROWS: TRL's KTOTrainer (its KL forward, the policy, two reference forwards; kto_step.py's
stub and batch) at the same sequences (2 x pairs examples), against memplan --trainer kto.
The step is TRL 1.16.0's own: DPOTrainer._compute_loss on dpo_step.Stub (its docstring), then
loss.backward(), AdamW(foreach) step, zero_grad.  Here TRL's fused head takes its CUDA branches
itself (Triton kernels, compact gather): nothing is patched.  After one warm-up step,
torch.cuda.reset_peak_memory_stats(); the step's max_memory_allocated is the row's peak, and the
reference forward's own (TRL's with-block, peak stats reset at its start) its ref_forward_peak;
phase_peaks splits the step (policy forward, reference forward, the loss after it, backward,
optimizer step).  memplan: `estimate CONFIG --trainer dpo ... --workspace W --json`, W the
workspace one cuBLAS handle took here (below; memplan's default, 8519680 B, is not sm90's 32 MiB:
the first GPU run, 2026-11-28, passed none, so memplan counted 25034752 B less than the H200 has).

Two things each row also records, so that a difference can be told from a leftover:
  * alloc_start: memory_allocated() when the row starts, after gc.collect().  TRL's
    add_fused_lm_head makes a reference cycle (trl 1.16.0 trainer/utils.py:1698: the model's
    forward is a method bound to the model), so `del model` frees nothing until the cyclic
    collector runs: without gc.collect() a row counted the earlier rows' models (the first GPU
    run, 2026-11-28, did not collect).  It should be the cuBLAS workspaces alone.
  * alloc_before_step: memory_allocated() at the measured step's start (parameters, optimizer
    state, the batch, the workspaces).
The "workspaces" record (before any row): memory_allocated() with no tensor alive after a bf16
mm forward (the main thread's cuBLAS handle), after a backward through one (autograd's CUDA
device thread reserves a handle of its own, and PyTorch keeps one workspace per handle and
stream: aten/src/ATen/cuda/CublasHandlePool.cpp, getCurrentCUDABlasHandle's thread_local
PoolWindow and setWorkspaceForHandle's (handle, stream) key), and after an nn.Linear with a bias
forward and backward (the cuBLASLt epilogue path and its workspace, unified with cuBLAS's or not).
The first row also records what is live at its measured step's peak (live_at_peak: the
allocator's trace of that step, torch.cuda.memory._record_memory_history, summed by Python frame).
Writes one JSON object: {"status", "workspaces", "rows": [...]}, with torch's and memplan's bytes
and the difference in percent.
"""
import argparse
import gc
import json
import os
import sys
import tempfile
import time

T0 = time.perf_counter()  # --budget-s counts from here (the imports included)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "accuracy"))

TINY, ONE_B, ONE_B16 = "tiny", "llama-3.2-1b (2 layers)", "llama-3.2-1b (16 layers)"
# (config, finetune, checkpointing, precompute_ref_log_probs): the most informative first (each
# reference kind on the tiny model, then the 1B-class model, then checkpointing)
ROWS = [(TINY, "full", "none", False), (TINY, "lora", "none", False), (TINY, "full", "none", True),
        (ONE_B, "full", "none", False), (ONE_B16, "full", "none", False), (TINY, "full", "layers", False), (TINY, "lora", "layers", False),
        (TINY, "full", "layers", True), (ONE_B, "lora", "none", False), (ONE_B, "full", "none", True),
        (ONE_B, "full", "layers", False), (ONE_B16, "lora", "layers", False)]
# TRL's KTOTrainer (--trainer kto, bench/accuracy/kto_step.py on the CPU): the same rows' shapes,
# 2 x pairs examples (the same sequences), after DPO's
KTO_ROWS = [(TINY, "full", "none", False), (TINY, "lora", "none", False), (ONE_B, "full", "none", False),
            (ONE_B16, "lora", "layers", False), (TINY, "full", "none", True)]
# ... and with loss_type apo_zero_unpaired (--trainer kto-apo: no KL term, one reference forward)
KTO_APO_ROWS = [(TINY, "lora", "none", False), (ONE_B16, "lora", "layers", False)]


def trainer_parts(trainer):
    """What a row of trainer ("dpo", "kto") runs: TRL's trainer class, its module (whose
    disable_gradient_checkpointing wraps the reference forwards), its stub, the policy head's
    outputs, the batch maker (vocabulary, pairs, seq, prompt, precompute, device) and memplan's
    arguments (dpo_step.memplan_args' signature)."""
    import dpo_step
    if trainer in ("kto", "kto-apo"):
        import kto_step
        kto_step.APO = trainer == "kto-apo"  # (read by its Stub, kto_inputs and memplan_args)
        from trl import KTOTrainer
        import trl.trainer.kto_trainer as mod
        return (KTOTrainer, mod, kto_step.Stub, ("log_probs", "entropy", "mean_logits"),
                lambda v, pairs, seq, prompt, pre, dev: kto_step.kto_inputs(v, 2 * pairs, seq, prompt, pre, dev),
                lambda ft, ck, pairs, seq, frac, pre: kto_step.memplan_args(ft, ck, 2 * pairs, seq, frac, pre))
    from trl import DPOTrainer
    import trl.trainer.dpo_trainer as mod
    return (DPOTrainer, mod, dpo_step.Stub, ("log_probs", "entropy", "mean_logits", "is_top1"),
            dpo_step.dpo_inputs, dpo_step.memplan_args)
FIRST_ROW_S = {TINY: 15.0, ONE_B: 40.0, ONE_B16: 40.0}  # a config's first row may take (Triton's compile, the model's init)


def settle(torch):
    """Frees what the last row left (its cycles too) and waits for the device."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def workspace_probe(torch, dev):
    """memory_allocated() with no tensor alive: at the start, after a forward mm, after a backward
    through one, after nn.Linear(bias) forward and backward (module doc)."""
    out = {}
    settle(torch)
    out["start"] = torch.cuda.memory_allocated()
    a = torch.randn(256, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        y = a @ b
    del y
    settle(torch)
    out["after_forward_mm"] = torch.cuda.memory_allocated() - 2 * a.nbytes
    (a @ b).float().sum().backward()
    a.grad = None
    settle(torch)
    out["after_backward_mm"] = torch.cuda.memory_allocated() - 2 * a.nbytes
    del a, b
    lin = torch.nn.Linear(256, 256, bias=True, device=dev, dtype=torch.bfloat16)
    x = torch.randn(256, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
    lin(x).float().sum().backward()
    del lin, x
    settle(torch)
    out["after_linear_bias"] = torch.cuda.memory_allocated()
    return out


def live_at_peak(snap, baseline, top=25, window=None):
    """What was allocated at the peak of a recorded window: torch.cuda.memory._snapshot()'s trace
    (alloc adds, free_requested takes away: memory_allocated's own accounting) replayed twice, to
    find the peak and then the blocks made in the window that were live there, summed by their
    innermost Python frames.  peak = baseline + the trace's highest running sum, a check against
    max_memory_allocated; blocks alive before the window are in baseline, not listed.  window
    (i0, i1): the peak is looked for among the trace's entries i0..i1-1 only (the reference
    forward's), what is live there counted from the recording's start."""
    trace = [e for dev in snap.get("device_traces", []) for e in dev]
    i0, i1 = window or (0, len(trace))
    cur, best, at = 0, 0, -1
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            cur += e["size"]
        elif e["action"] == "free_requested":
            cur -= e["size"]
        if i0 <= i < i1 and (cur > best or at < 0):
            best, at = cur, i
    live = {}
    for e in trace[:at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_requested":
            live.pop(e["addr"], None)
    by = {}
    for e in live.values():
        fr = [f for f in e.get("frames", []) if f.get("filename", "").endswith(".py")][:3]
        key = " < ".join("%s:%s %s" % (os.path.basename(f["filename"]), f["line"], f["name"]) for f in fr) or "?"
        n, b = by.get(key, (0, 0))
        by[key] = (n + 1, b + e["size"])
    rows = sorted(({"bytes": b, "blocks": n, "where": k} for k, (n, b) in by.items()), key=lambda r: -r["bytes"])
    return {"peak": baseline + best, "baseline": baseline, "events": len(trace), "at_event": at,
            "live_made_in_window": sum(r["bytes"] for r in rows), "top": rows[:top]}


def start_result(torch, smoke, out_path):
    """The device (the CPU under --cpu-smoke, torch.cuda's memory figures stubbed: a check of the
    script's flow), the result begun with the workspaces (workspace_probe), and its saver (written
    atomically to out_path after each row): (dev, result, save, one cuBLAS handle's workspace)."""
    dev = torch.device("cpu" if smoke else "cuda")
    if smoke:
        for fn in ("empty_cache", "reset_peak_memory_stats", "synchronize"):
            setattr(torch.cuda, fn, lambda *a, **k: None)
        torch.cuda.max_memory_allocated = lambda *a, **k: 1
        torch.cuda.memory_allocated = lambda *a, **k: 0
    result = {"status": "partial", "workspaces": workspace_probe(torch, dev), "rows": []}
    if not smoke:
        result["device"] = torch.cuda.get_device_name(0)

    def save():
        with open(out_path + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(out_path + ".tmp", out_path)
    save()
    ws = result["workspaces"]
    return dev, result, save, ws["after_forward_mm"] - ws["start"]


def out_of_time(result, label, need, budget_s, t0):
    """Whether a row needing ~need s would end past budget_s (seconds from t0): then it is listed
    in result["skipped"]."""
    if budget_s is not None and time.perf_counter() - t0 + need > budget_s:
        result.setdefault("skipped", []).append("%s: needs ~%.0f s" % (label, need))
        return True
    return False


def finish(result, save, t0):
    """The run's result, complete: status ok, its seconds from t0, written."""
    result["status"] = "ok"
    result["seconds"] = round(time.perf_counter() - t0, 1)
    save()
    return result


def row_config(transformers, cfgd, tmp):
    """A row's config dict written for memplan (tmp/c.json) and made a transformers config (SDPA):
    (path, config)."""
    path = os.path.join(tmp, "c.json")
    with open(path, "w") as f:
        json.dump(cfgd, f)
    cfg = transformers.AutoConfig.for_model(**cfgd)
    cfg._attn_implementation = "sdpa"
    return path, cfg


def trace_len(torch):
    """Entries in the allocator's recorded trace so far (a mark in it)."""
    return sum(len(d) for d in torch.cuda.memory._snapshot().get("device_traces", []))


def step_rows(memplan, steps, out_path, budget_s=None, smoke=False, only=(), snapshot_all=False):
    import torch
    import transformers
    from trl.trainer.utils import add_fused_lm_head
    import rowlib
    from dpo_step import CONFIG, memplan_run, prepare

    t_start = T0
    one_b = os.path.join(ROOT, "models/hf/llama-3.2-1b.json")
    configs = {TINY: CONFIG, ONE_B: rowlib.load_config(one_b, 2), ONE_B16: rowlib.load_config(one_b)}
    rows = [r + ("dpo",) for r in ROWS] + [r + ("kto",) for r in KTO_ROWS] + [r + ("kto-apo",) for r in KTO_APO_ROWS]
    todo = [r for r in rows if r[0] == TINY] if smoke else rows
    pairs, seq, prompt = (1, 65, 33) if smoke else (2, 1025, 513)
    dev, result, save, ws_one = start_result(torch, smoke, out_path)  # ws_one: the main thread's handle's
    slowest = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, ft, ck, pre, trainer in todo:
            label = "%s/%s/%s/%s%s" % (name, ft, ck, "precompute" if pre else "ref", "" if trainer == "dpo" else "/" + trainer)
            if only and not any(x in label for x in only):
                continue
            if out_of_time(result, label, 1.2 * slowest.get(name, FIRST_ROW_S[name]), budget_s, t_start):
                continue
            Trainer, dt, stub_cls, outputs, make_inputs, memplan_args = trainer_parts(trainer)
            t_row = time.perf_counter()
            path, cfg = row_config(transformers, configs[name], tmp)
            settle(torch)
            alloc_start = torch.cuda.memory_allocated()
            with torch.device(dev):  # initialised on the device: no CPU init of a 128k vocabulary
                model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(dev)
                ref = None
                if ft == "full" and not pre:
                    ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(dev).eval()
                    ref.requires_grad_(False)
            model, stub, opt = prepare(model, ref, ft, ck, pre, add_fused_lm_head, outputs, stub_cls)
            stub.accelerator.device = dev
            inputs = make_inputs(cfg.vocab_size, pairs, seq, prompt, pre, dev)
            ph, alloc_before, recording, snap_note, ref_note, ref_window = {}, None, False, None, None, [0, 0]
            orig = dt.disable_gradient_checkpointing

            class Measured:
                def __init__(self, m, kw):
                    self.cm = orig(m, kw)

                def __enter__(self):
                    if recording:
                        ref_window[0] = trace_len(torch)
                    ph["policy_forward"] = torch.cuda.max_memory_allocated()  # the policy's so far
                    torch.cuda.reset_peak_memory_stats()
                    return self.cm.__enter__()

                def __exit__(self, *e):
                    r = self.cm.__exit__(*e)
                    if recording:
                        ref_window[1] = trace_len(torch)
                    ph["reference_forward"] = torch.cuda.max_memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    return r
            dt.disable_gradient_checkpointing = Measured
            try:
                for s in range(1 + steps):
                    torch.cuda.synchronize()
                    if s == 1:
                        alloc_before = torch.cuda.memory_allocated()
                    if s == 1 and (not result["rows"] or snapshot_all) and not smoke:  # what is live at its peak
                        try:
                            torch.cuda.memory._record_memory_history(max_entries=500000, stacks="python")
                            recording = True
                        except Exception as e:  # an API that moved: the row still runs
                            snap_note = "record_memory_history: %s" % e
                    torch.cuda.reset_peak_memory_stats()
                    ph.clear()
                    loss = Trainer._compute_loss(stub, model, inputs, False)
                    key = "loss" if "reference_forward" in ph else "policy_forward"
                    ph[key] = torch.cuda.max_memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    loss.backward()
                    del loss
                    torch.cuda.synchronize()
                    ph["backward"] = torch.cuda.max_memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    torch.cuda.synchronize()
                    ph["optimizer"] = torch.cuda.max_memory_allocated()
                    if recording:
                        recording = False
                        try:
                            snap = torch.cuda.memory._snapshot()
                            snap_note = live_at_peak(snap, alloc_before)
                            if ref_window[1] > ref_window[0]:
                                ref_note = live_at_peak(snap, alloc_before, window=tuple(ref_window))
                            del snap
                        except Exception as e:
                            snap_note = "snapshot: %s" % e
                        finally:
                            torch.cuda.memory._record_memory_history(enabled=None)
            finally:
                dt.disable_gradient_checkpointing = orig
            peak = max(ph.values())
            ref_peak = ph.get("reference_forward", 0)
            frac = (seq - prompt) / (seq - 1)
            args = [a for a in memplan_args(ft, ck, pairs, seq, frac, pre) if a not in ("--workspace", "0")]
            if ws_one > 0:  # this device's workspace (memplan's default is 8519680 B, sm90's is 32 MiB)
                args += ["--workspace", str(ws_one)]
            m = memplan_run(memplan, path, args)
            mp = m["peak_allocated_bytes"]
            mref = m.get("phases", {}).get("reference_forward", {}).get("peak_allocated_bytes", 0)
            del model, ref, opt, stub, inputs
            settle(torch)
            secs = time.perf_counter() - t_row
            slowest[name] = max(slowest.get(name, 0.0), secs)
            result["rows"].append({
                "config": name, "trainer": trainer, "finetune": ft, "checkpoint": ck, "precompute": pre,
                "pairs": pairs, "seq": seq,
                "prompt": prompt, "args": args, "torch_peak": peak, "memplan_peak": mp,
                "peak_pct": round(100.0 * (mp - peak) / peak, 3), "torch_ref_forward_peak": ref_peak,
                "memplan_ref_forward_peak": mref,
                "ref_pct": round(100.0 * (mref - ref_peak) / ref_peak, 3) if ref_peak else None,
                "memplan_peak_event": m["peak_event"], "memplan_workspace_bytes": m.get("workspace_bytes"),
                "alloc_start": alloc_start, "alloc_before_step": alloc_before,
                "alloc_after_row": torch.cuda.memory_allocated(), "phase_peaks": dict(ph), "seconds": round(secs, 1)})
            if snap_note is not None:
                result["rows"][-1]["live_at_peak"] = snap_note
            if ref_note is not None:
                result["rows"][-1]["live_at_ref_peak"] = ref_note
            print(json.dumps(result["rows"][-1]), flush=True)
            save()
    return finish(result, save, t_start)


def common_parser(doc):
    """The CUDA scripts' command line: --memplan, --out, --steps, --budget-s, --cpu-smoke, --rows."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--memplan", default=os.path.join(ROOT, "memplan"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1, help="measured steps after the warm-up (default 1)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="seconds from the start: a row that would not fit is skipped (listed)")
    ap.add_argument("--cpu-smoke", action="store_true", help="run the flow on the CPU (no memory figures)")
    ap.add_argument("--rows", default="", help="only the rows whose label contains one of these (comma-separated)")
    return ap


def run_rows(a, tag, rows_fn, **kw):
    """rows_fn(memplan, steps, out, budget_s, smoke=, only=, **kw) on the GPU; its flow on the CPU with
    --cpu-smoke (status "smoke"); without a CUDA device a "skipped" result."""
    only = tuple(x for x in a.rows.split(",") if x)
    import torch
    if a.cpu_smoke:
        r = rows_fn(a.memplan, 1, a.out, a.budget_s, smoke=True, only=only)
        r["status"] = "smoke"
        with open(a.out, "w") as f:
            json.dump(r, f, indent=1)
        return
    if not torch.cuda.is_available():
        with open(a.out, "w") as f:
            json.dump({"status": "skipped", "note": "no CUDA device"}, f)
        print("%s: no CUDA device: skipped" % tag)
        return
    rows_fn(a.memplan, a.steps, a.out, a.budget_s, only=only, **kw)


def main():
    ap = common_parser(__doc__)
    ap.add_argument("--snapshot-all", action="store_true",
                    help="what is live at the peak (and at the reference forward's) for every row, not the first only")
    a = ap.parse_args()
    run_rows(a, "dpo_cuda", step_rows, snapshot_all=a.snapshot_all)


if __name__ == "__main__":
    main()
