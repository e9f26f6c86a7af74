#!/usr/bin/env python3
"""lf_dpo_step.py — memplan --trainer dpo --loss hf against LLaMA-Factory 0.9.5's DPO step on the CPU.

  python3 bench/accuracy/lf_dpo_step.py [--memplan ./memplan] [--lf-src DIR] [--out FILE.md]
                                       [--rows-out FILE] [--select 0,2] [--no-1b] [--detail]

LLaMA-Factory (`stage: dpo`) runs its own CustomDPOTrainer (llamafactory 0.9.5
train/dpo/trainer.py) over TRL's DPOTrainer class, and LLaMA-Factory 0.9.5 pins trl <= 0.24
(its METADATA; extras/misc.py check_version), whose DPOTrainer.compute_loss calls
self.get_batch_loss_metrics: CustomDPOTrainer's.  That step is what this bench runs:
  get_batch_loss_metrics (trainer.py:276-317): concatenated_forward on the policy, then
  compute_reference_log_probs (:254-274: the reference copy, or the policy with peft's adapter
  disabled, under torch.no_grad), compute_preference_loss (:187-216) -> self.dpo_loss;
  concatenated_forward (:218-252): nested_detach(batch, clone=True) (trainer_utils.py:829-845),
  model(**batch, use_cache=False).logits.to(torch.float32), get_batch_logps
  (trainer_utils.py:592-636), the splits.
LLaMA-Factory's own functions run: importing llamafactory needs omegaconf and other packages absent
here, so the functions above are read out of the wheel's source files (--lf-src: the unpacked
wheel's llamafactory/, from `pip download llamafactory==0.9.5 --no-deps`) with ast and executed
unchanged, bound to a stand-in for the trainer holding what they read (FinetuningArguments'
defaults: pref_loss sigmoid, pref_beta 0.1, pref_ftx 0, pref_bco_weight 0, ld_alpha None,
use_ref_model True).  Two pieces are this file's own, both on b-sized tensors: TRL 0.24's
DPOTrainer.compute_loss (nullcontext -- LLaMA-Factory sets _peft_has_been_casted_to_bf16 False --,
get_batch_loss_metrics, loss.to(device), store_metrics) and its dpo_loss's sigmoid branch.

The reference as LLaMA-Factory builds it (train/dpo/workflow.py:56-63, trainer_utils.py
create_ref_model:116-148): finetuning_type lora, none (the adapter disabled); full, the model
loaded again, frozen, in the compute dtype (here the policy's: the rows are bf16 or bf16 weights).
The model: dpo_step's tiny Llama and Llama-3.2-1B's shape cut to 2 layers (orpo_step's), in bf16
(memplan's bf16), or bf16 weights under accelerate's autocast and convert_outputs_to_fp32
(bf16-amp: what LLaMA-Factory runs with bf16: true and a LoRA adapter); dropout off
(disable_dropout_in_model: CustomDPOTrainer's disable_dropout True); LoRA r16 all-linear through
peft (adapters fp32, as LLaMA-Factory's cast_trainable_params_to_fp32); checkpointing as
transformers enables it with use_reentrant False (memplan's --checkpoint layers).  The batch is
LLaMA-Factory's PairwiseDataCollatorWithPadding's: the chosen rows then the rejected, input_ids,
attention_mask, labels (-100 over the prompt), no padding.  Two steps (loss.backward(), AdamW
foreach, zero_grad) under inplace_tracker.InplaceTracker; step 2's peak is compared with
`memplan estimate CONFIG --trainer dpo --loss hf ... --optimizer adamw --workspace 0 --use-cache off
--json` (memory.peak_allocated_bytes).  CPU against CUDA: log_softmax of the non-contiguous
logits[:, :-1] copies its input contiguous on both (SoftMax.cpp, SoftMax.cu host_softmax), and
GatherBackward0 is new_zeros + scatter_add_ on both; the CPU's copy is made inside its kernel, out of
the tracker's sight, so cuda_softmax_copy allocates it beside the op; SDPA: torch_step's CUDA-kernel
patch.

Rows go to bench/accuracy/rows/lf_dpo_step.jsonl (tests/replay_accuracy.py replays them: figures
peak, ref_forward_peak -- the reference's forward on what the policy holds --, and policy_step_peak --
the policy's forward before the reference's and its backward).  Not part of make test.  About 4 minutes on 2 cores.
"""
import argparse
import ast
import collections.abc
import contextlib
import gc
import json
import os
import sys
import tempfile
import textwrap
import types
import warnings
from typing import Literal, Optional, Union

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402

import rowlib  # noqa: E402
import dpo_step  # noqa: E402  (its CONFIG, ref_copy, track_models, memplan_run; torch_step's SDPA patch)
import kto_step  # noqa: E402  (build: a Llama from any config dict)
import orpo_step  # noqa: E402  (the 1B-class config, OrpoTracker, show_live)

LF_SRC = "/tmp/lf/llamafactory"
TINY_NAME = orpo_step.TINY_NAME
ONE_B_NAME = orpo_step.ONE_B_NAME
RAM_LIMIT = 12 << 30

# (model, finetune, checkpoint, pairs, seq, prompt tokens, precision)
SETTINGS = [("tiny", "full", "none", 2, 256, 128, "bf16"), ("tiny", "full", "layers", 2, 256, 128, "bf16"),
            ("tiny", "lora", "layers", 2, 256, 128, "bf16"), ("tiny", "lora", "none", 2, 256, 128, "bf16"),
            ("tiny", "lora", "layers", 2, 256, 128, "bf16-amp"), ("tiny", "full", "none", 1, 512, 8, "bf16"),
            ("tiny", "full", "layers", 4, 128, 64, "bf16"),
            ("1b", "full", "layers", 1, 256, 128, "bf16"), ("1b", "lora", "layers", 1, 256, 128, "bf16-amp")]


def read_functions(path, names, ns):
    """The functions `names` of the source file `path`, executed unchanged in ns: {name: function}."""
    with open(path) as f:
        text = f.read()
    out = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name in names and node.name not in out:
            exec(textwrap.dedent(ast.get_source_segment(text, node)), ns)
            out[node.name] = ns[node.name]
    missing = [n for n in names if n not in out]
    assert not missing, "%s: no %s" % (path, missing)
    return out


def lf_functions(src):
    """LLaMA-Factory's own get_batch_logps and nested_detach (train/trainer_utils.py) and
    CustomDPOTrainer's methods (train/dpo/trainer.py), read out of its source and executed
    unchanged: {name: function}."""
    ns = {"torch": torch, "F": F, "IGNORE_INDEX": -100, "Optional": Optional, "Union": Union,
          "Literal": Literal, "Mapping": collections.abc.Mapping, "nullcontext": contextlib.nullcontext}
    out = read_functions(os.path.join(src, "train/trainer_utils.py"), ("get_batch_logps", "nested_detach"), ns)
    out.update(read_functions(os.path.join(src, "train/dpo/trainer.py"),
                              ("concatenated_forward", "compute_reference_log_probs", "get_batch_loss_metrics",
                               "compute_preference_loss"), ns))
    return out


class Stub:
    """What CustomDPOTrainer's methods read of the trainer (FinetuningArguments' defaults, one process)."""

    def __init__(self, fns, ref):
        for name in ("concatenated_forward", "compute_reference_log_probs", "get_batch_loss_metrics",
                     "compute_preference_loss"):
            setattr(self, name, types.MethodType(fns[name], self))
        fns["concatenated_forward"].__globals__.update(get_batch_logps=fns["get_batch_logps"],
                                                       nested_detach=fns["nested_detach"])
        self.finetuning_args = types.SimpleNamespace(use_ref_model=True)
        self.ref_model = ref
        self.beta, self.loss_type, self.ftx_gamma, self.bco_gemma = 0.1, "sigmoid", 0.0, 0.0
        self.label_smoothing, self.simpo_gamma, self.ld_alpha = 0.0, 0.5, None
        self.accelerator = types.SimpleNamespace(device=torch.device("cpu"), unwrap_model=lambda m: m)

    def dpo_loss(self, chosen, rejected, ref_chosen, ref_rejected):
        """TRL 0.24 DPOTrainer.dpo_loss, loss_type sigmoid, label_smoothing 0 (b-sized tensors)."""
        logits = (chosen - rejected) - (ref_chosen - ref_rejected)
        losses = -F.logsigmoid(self.beta * logits)
        return losses, self.beta * (chosen - ref_chosen).detach(), self.beta * (rejected - ref_rejected).detach()

    def compute_loss(self, model, inputs):
        """TRL 0.24 DPOTrainer.compute_loss (no autocast: _peft_has_been_casted_to_bf16 False)."""
        with contextlib.nullcontext():
            loss, metrics = self.get_batch_loss_metrics(model, inputs, train_eval="train")
        return loss.to(torch.device("cpu"))


@contextlib.contextmanager
def cuda_softmax_copy():
    """log_softmax as CUDA runs it on a non-contiguous input (get_batch_logps's logits[:, :-1, :]):
    host_softmax first makes a contiguous copy, alive through the kernel (aten/src/ATen/native/cuda/
    SoftMax.cu host_softmax: input_.contiguous()).  The CPU's kernel copies inside itself, where the
    tracker (a dispatch mode) does not see it: the copy is allocated here (torch.empty of its size)
    beside the CPU op, and freed after it."""
    orig = torch.Tensor.log_softmax

    def log_softmax(x, *a, **k):
        dense = torch.empty(x.shape, dtype=x.dtype) if not x.is_contiguous() else None
        out = orig(x, *a, **k)
        del dense
        return out
    torch.Tensor.log_softmax = log_softmax
    try:
        yield
    finally:
        torch.Tensor.log_softmax = orig


def lf_inputs(vocab, pairs, seq, prompt):
    """PairwiseDataCollatorWithPadding's batch, no padding: the chosen rows, then the rejected."""
    p = torch.randint(0, vocab, (pairs, prompt))
    ids = torch.cat([torch.cat([p, torch.randint(0, vocab, (pairs, seq - prompt))], 1) for _ in range(2)], 0)
    lab = ids.clone()
    lab[:, :prompt] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": lab}


def prepare(config, ft, ckpt, prec):
    """The policy, its reference (None: the adapter disabled) and AdamW."""
    from trl.trainer.utils import disable_dropout_in_model
    model, cfg = kto_step.build(config, "bf16")
    ref = dpo_step.ref_copy(cfg, model) if ft == "full" else None
    if ft == "lora":
        if ckpt == "layers":
            model.enable_input_require_grads()
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                           target_modules="all-linear", task_type="CAUSAL_LM"))
    elif ckpt == "layers":
        model.enable_input_require_grads()
    for m in (model, ref):
        if m is not None:
            disable_dropout_in_model(m)
    model.train()
    if ckpt == "layers":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if prec == "bf16-amp":
        for m in (model, ref):
            if m is not None:
                dpo_step.autocast_forward(m)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6, foreach=True)
    return model, ref, opt


def traced(tr, fn, box):
    """fn, its own peak into box[0] (and where: box[1]) and the tracker's peak before it into box[2];
    the tracker's peak across it kept."""
    def run(*a, **k):
        keep = tr.peak, tr.peak_at, tr.peak_live
        box[2] = tr.peak
        tr.peak = tr.cur
        out = fn(*a, **k)
        box[0], box[1] = tr.peak, tr.peak_at
        if tr.peak < keep[0]:
            tr.peak, tr.peak_at, tr.peak_live = keep
        return out
    return run


def two_steps(tr, model, ref, opt, inputs, step, figures, detail):
    """Two steps (step(second) -> the loss; backward, AdamW, zero_grad) under tr; step 2's figures:
    {peak, peak_at, fwd_peak, fwd_end, bwd_peak, static, ...} and figures()'s after its forward."""
    res = {}
    with tr, cuda_softmax_copy():
        dpo_step.track_models(tr, model, ref)
        for t in inputs.values():
            tr.add(t, "input")
        tr.phase = "forward"
        orpo_step.backward_and_step(tr, step(False), opt)
        for st in opt.state.values():
            if "step" in st and isinstance(st["step"], torch.Tensor):
                tr.forget(st["step"])  # AdamW keeps its step counters on the CPU on CUDA too
        gc.collect()
        res["static"] = tr.cur
        tr.peak, tr.peak_at, tr.peak_live, tr.acc = tr.cur, "step-start", [], [0, 0]
        tr.nodes = [] if detail else None
        tr.phase = "forward"
        loss = step(True)
        gc.collect()
        res.update(fwd_peak=tr.peak, fwd_peak_at=tr.peak_at, fwd_end=tr.cur, **figures())
        if detail:
            res["fwd_peak_live"] = list(tr.peak_live)
            res["fwd_end_live"] = sorted(((n, lab) for n, lab, _ in tr.live()), reverse=True)
        kept = tr.peak, tr.peak_at, tr.peak_live
        tr.phase, tr.peak = "backward", tr.cur
        loss.backward()
        del loss
        gc.collect()
        res.update(bwd_peak=tr.peak, bwd_peak_at=tr.peak_at)
        if tr.peak < kept[0]:
            tr.peak, tr.peak_at, tr.peak_live = kept
        tr.phase = "optimizer.step"
        opt.step()
        opt.zero_grad(set_to_none=True)
        gc.collect()
        tr.nodes_log = tr.nodes
        tr.nodes = None
    res.update(peak=tr.peak, peak_at=tr.peak_at, acc=list(tr.acc))
    if detail:
        res["peak_live"] = list(tr.peak_live)
        res["nodes"] = tr.nodes_log
    return res


def fits(model, ref):
    """None, or why the rows are skipped (RAM_LIMIT)."""
    need = orpo_step.static_bytes(model) + (orpo_step.static_bytes(ref) // 4 if ref is not None else 0)
    return "needs %.1f GiB > %.0f GiB" % (need / 2**30, RAM_LIMIT / 2**30) if need > RAM_LIMIT else None


def lf_dpo_step(fns, config, ft, ckpt, pairs, seq, prompt, prec, detail=False):
    """Two steps; step 2's figures: {peak, peak_at, fwd_peak, fwd_end, bwd_peak, ref_peak, ...}."""
    model, ref, opt = prepare(config, ft, ckpt, prec)
    if fits(model, ref):
        return {"skipped": fits(model, ref)}
    stub = Stub(fns, ref)
    tr = orpo_step.OrpoTracker(snapshot=detail)
    # the reference forward's moment: the live bytes at its peak (compute_reference_log_probs)
    ref_box = [0, "", 0]
    stub.compute_reference_log_probs = traced(tr, stub.compute_reference_log_probs, ref_box)
    inputs = lf_inputs(config["vocab_size"], pairs, seq, prompt)
    return two_steps(tr, model, ref, opt, inputs, lambda second: stub.compute_loss(model, inputs),
                     lambda: {"ref_peak": ref_box[0], "ref_peak_at": ref_box[1], "policy_fwd_peak": ref_box[2]},
                     detail)


def memplan_args(ft, ckpt, pairs, seq, prec, trainer="dpo"):
    a = ["--trainer", trainer, "--loss", "hf", "--batch", str(pairs), "--seq", str(seq), "--precision", prec,
         "--checkpoint", ckpt, "--optimizer", "adamw", "--workspace", "0", "--use-cache", "off", "--json"]
    if ft == "lora":
        a += ["--finetune", "lora", "--lora-r", "16", "--lora-targets", "all-linear"]
    return a


def cli(doc=__doc__, oracle="lf_dpo_step", trl_src=None):
    """The options (trl_src: the default of --trl-src, which only the KTO bench takes)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--memplan", default="./memplan")
    ap.add_argument("--lf-src", default=LF_SRC, help="the unpacked llamafactory 0.9.5 wheel's llamafactory/")
    if trl_src:
        ap.add_argument("--trl-src", default=trl_src, help="the unpacked trl 0.24.0 wheel's trl/")
    ap.add_argument("--out", default=None, help="the table (markdown) into FILE")
    ap.add_argument("--rows-out", default=os.path.join(rowlib.ROWS_DIR, oracle + ".jsonl"), help="'' for none")
    ap.add_argument("--select", default="", help="comma-separated indices into SETTINGS (0-based)")
    ap.add_argument("--no-1b", action="store_true", help="skip the 1B-class rows")
    ap.add_argument("--detail", action="store_true", help="print the live storages at the peaks")
    return ap.parse_args()


def run_table(a, versions, settings, measure, margs, oracle, unit, first_col):
    """Each setting through measure (a step's figures) and memplan (margs: its arguments): the table,
    the rows (three figures each).  first_col: (header, the figure's key) of the policy's forwards
    column; unit: what a batch counts ("pairs", "examples")."""
    configs = {"tiny": (dpo_step.CONFIG, TINY_NAME), "1b": (orpo_step.one_b_config(), ONE_B_NAME)}
    sel = {int(x) for x in a.select.split(",") if x}
    lines = ["| setting | torch peak (B) | at | memplan (B) | diff | memplan peak at | torch %s (B) "
             "| torch ref-forward peak (B) | torch bwd peak (B) |" % first_col[0],
             "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for k, (cfg, _) in configs.items():
            paths[k] = os.path.join(tmp, k + ".json")
            with open(paths[k], "w") as f:
                json.dump(cfg, f)
        for i, (mk, ft, ck, n, seq, prompt, prec) in enumerate(settings):
            if (sel and i not in sel) or (a.no_1b and mk == "1b"):
                continue
            cfg, name = configs[mk]
            setting = "%s: %s, %s, ckpt %s, %d %s x s%d, prompt %d" % (
                "tiny" if mk == "tiny" else "1B-class 2 layers", "LoRA all-linear r16" if ft == "lora" else "full",
                prec, ck, n, unit, seq, prompt)
            print("[%d] %s ..." % (i, setting), flush=True)
            t = measure(cfg, ft, ck, n, seq, prompt, prec, a.detail)
            gc.collect()
            if "skipped" in t:
                lines.append("| %s | skipped: %s | | | | | | | |" % (setting, t["skipped"]))
                continue
            args = margs(ft, ck, n, seq, prec)
            try:
                m = dpo_step.memplan_run(a.memplan, paths[mk], args)
                mp = m["peak_allocated_bytes"] - m["workspace_bytes"]
                pct = 100.0 * (mp - t["peak"]) / t["peak"]
                mcol, dcol, mat = str(mp), "%+.3f %%" % pct, m.get("peak_event", "")
            except (RuntimeError, ValueError, KeyError, OSError) as e:
                m = None
                mcol, dcol, mat = "memplan: %s" % (str(e).strip().splitlines() or ["?"])[-1][:120], "-", "-"
            lines.append("| %s | %d | %s | %s | %s | %s | %d | %d | %d |" % (
                setting, t["peak"], t["peak_at"], mcol, dcol, mat, t[first_col[1]], t["ref_peak"], t["bwd_peak"]))
            print(lines[-1], flush=True)
            pol_t = max(t["policy_fwd_peak"], t["bwd_peak"])
            if m is not None:
                ph = m.get("phases", {})
                print("    policy step: torch %d (its forwards before the reference's %d%s), memplan %s; reference "
                      "forward: torch %d, memplan %s" % (
                          pol_t, t["policy_fwd_peak"],
                          ", KL forward %d at %s" % (t["kl_peak"], t["kl_peak_at"]) if "kl_peak" in t else "",
                          ph.get("policy_step", {}).get("peak_allocated_bytes"), t["ref_peak"],
                          ph.get("reference_forward", {}).get("peak_allocated_bytes")), flush=True)
            print("    static %d B, fwd peak at %s, ref peak at %s, bwd peak at %s" % (
                t["static"], t["fwd_peak_at"], t["ref_peak_at"], t["bwd_peak_at"]), flush=True)
            if a.detail:
                orpo_step.show_live("live at the step's peak (%s)" % t["peak_at"], t["peak_live"])
                orpo_step.show_live("live at the forward's peak (%s)" % t["fwd_peak_at"], t["fwd_peak_live"])
                orpo_step.show_live("live when backward starts", t["fwd_end_live"])
                orpo_step.show_nodes(t["nodes"])
            if m is None:
                continue
            ph = m["phases"]
            ref_mp = ph["reference_forward"]["peak_allocated_bytes"] - m["workspace_bytes"]
            pol_mp = ph["policy_step"]["peak_allocated_bytes"] - m["workspace_bytes"]
            recorded = {"torch_peak_at": t["peak_at"], "memplan_peak_at": m.get("peak_event", ""),
                        "pct": round(pct, 3), "torch_forward_peak": t["fwd_peak"],
                        "torch_ref_forward_peak": t["ref_peak"], "torch_forward_end_live": t["fwd_end"],
                        "torch_backward_peak": t["bwd_peak"], "torch_policy_forward_peak": t["policy_fwd_peak"],
                        "model": mk}
            if "kl_peak" in t:
                recorded["torch_kl_forward_peak"] = t["kl_peak"]
            rows.append({"config": name, "config_json": cfg, "args": args,
                         "figures": {"peak": rowlib.figure(t["peak"], mp),
                                     "ref_forward_peak": rowlib.figure(t["ref_peak"], ref_mp),
                                     "policy_step_peak": rowlib.figure(pol_t, pol_mp)},
                         "recorded": recorded, "versions": versions,
                         "source": "bench/accuracy/%s.py (run %s)" % (oracle, versions["memplan"])})
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if rows and a.rows_out:
        print("rows: %s" % rowlib.save_rows(oracle, rows, a.rows_out))


def main():
    a = cli()
    torch.set_num_threads(1)
    fns = lf_functions(a.lf_src)
    versions = rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                   peft=peft.__version__, llamafactory="0.9.5 (source, trl 0.24's compute_loss)",
                                   tensors="real, CPU")
    run_table(a, versions, SETTINGS, lambda *x: lf_dpo_step(fns, *x), memplan_args, "lf_dpo_step", "pairs",
              ("fwd peak", "fwd_peak"))


if __name__ == "__main__":
    main()
