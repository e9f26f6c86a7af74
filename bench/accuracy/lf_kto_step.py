#!/usr/bin/env python3
"""lf_kto_step.py — memplan --trainer kto --loss hf against LLaMA-Factory 0.9.5's KTO step on the CPU.

  python3 bench/accuracy/lf_kto_step.py [--memplan ./memplan] [--lf-src DIR] [--trl-src DIR]
                                       [--out FILE.md] [--rows-out FILE] [--select 0,2] [--no-1b]
                                       [--detail]

LLaMA-Factory (`stage: kto`) runs its own CustomKTOTrainer (llamafactory 0.9.5
train/kto/trainer.py) over TRL 0.24's KTOTrainer class (LLaMA-Factory 0.9.5 pins trl <= 0.24:
METADATA, extras/misc.py check_version), whose compute_loss (trl 0.24.0 trainer/kto_trainer.py
:1477-1499) calls self.get_batch_loss_metrics: CustomKTOTrainer's.  That step is what this bench
runs:
  get_batch_loss_metrics (train/kto/trainer.py:220-268): concatenated_forward on the policy, then
  compute_reference_log_probs (:201-218: the reference copy, or the policy with peft's adapter
  disabled, under torch.no_grad), TRL 0.24's kto_loss (kto_trainer.py:1119-1194), the ftx term
  (pref_ftx 0: none), the metrics (nansum of the chosen / rejected logits);
  concatenated_forward (:183-199): forward on the batch, then forward on the KL sequences under
  torch.no_grad while the batch's fp32 logits are held, then the chosen and rejected logits picked
  by kto_tags (boolean indexing: copies);
  forward (:148-181): nested_detach(batch, clone=True) (trainer_utils.py), model(...).logits
  .to(torch.float32), get_batch_logps (trainer_utils.py).
Every one of those functions runs as its source has it: importing llamafactory needs omegaconf and
more (absent here), and trl 0.24 is not installed (trl 1.16 is), so they are read out of the
wheels' source files (--lf-src: the unpacked llamafactory 0.9.5 wheel's llamafactory/, --trl-src:
the unpacked trl 0.24.0 wheel's trl/, each from `pip download ... --no-deps`) with ast and executed
unchanged, bound to a stand-in for the trainer holding what they read (FinetuningArguments'
defaults: pref_beta 0.1, kto_chosen_weight 1.0, kto_rejected_weight 1.0, pref_ftx 0; loss_type
"kto", calculate_KL True as CustomKTOTrainer.__init__ sets them; _peft_has_been_casted_to_bf16
False; one process: gather_for_metrics returns its input).

The reference as LLaMA-Factory builds it (train/kto/workflow.py, trainer_utils.py
create_ref_model): finetuning_type lora (the adapter disabled), full (the model loaded again,
frozen, in the compute dtype: the policy's here).  The model, the adapters, dropout, checkpointing
and bf16-amp as lf_dpo_step.py (its prepare).  The batch is LLaMA-Factory's
KTODataCollatorWithPadding's (data/collator.py:568-608): input_ids, attention_mask, labels (-100
over the prompt), kl_input_ids, kl_attention_mask, kl_labels (each example's prompt with the next
example's completion, data/processor/feedback.py), kto_tags (desirable, undesirable alternately),
no padding.  Two steps (loss.backward(), AdamW foreach, zero_grad) under InplaceTracker; step 2's
peak against `memplan estimate CONFIG --trainer kto --loss hf ... --optimizer adamw --workspace 0
--use-cache off --json`.  CUDA's contiguous copy before log_softmax: lf_dpo_step.cuda_softmax_copy.

Rows go to bench/accuracy/rows/lf_kto_step.jsonl (tests/replay_accuracy.py replays them: figures
peak, ref_forward_peak -- the reference's two forwards on what the policy holds --, and
policy_step_peak -- the policy's forwards (the batch, then the KL sequences) before the reference's,
and its backward).  Not part of make test.  About 5 minutes on 2 cores.
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
from collections import defaultdict
from typing import Any, Literal, Optional, Union

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402

import rowlib  # noqa: E402
import dpo_step  # noqa: E402  (its CONFIG, track_models, memplan_run)
import orpo_step  # noqa: E402  (the 1B-class config, OrpoTracker, show_live, backward_and_step)
import lf_dpo_step  # noqa: E402  (prepare, cuda_softmax_copy)

LF_SRC = "/tmp/lf/llamafactory"
TRL_SRC = "/tmp/trl024/trl"
RAM_LIMIT = 12 << 30

# (model, finetune, checkpoint, examples, seq, prompt tokens, precision)
SETTINGS = [("tiny", "full", "none", 4, 256, 128, "bf16"), ("tiny", "full", "layers", 4, 256, 128, "bf16"),
            ("tiny", "lora", "layers", 4, 256, 128, "bf16"), ("tiny", "lora", "none", 4, 256, 128, "bf16"),
            ("tiny", "lora", "layers", 4, 256, 128, "bf16-amp"), ("tiny", "full", "none", 1, 512, 8, "bf16"),
            ("tiny", "full", "layers", 8, 128, 64, "bf16"),
            ("1b", "full", "layers", 2, 256, 128, "bf16"), ("1b", "lora", "layers", 2, 256, 128, "bf16-amp")]


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


def lf_functions(lf_src, trl_src):
    """LLaMA-Factory's get_batch_logps, nested_detach and CustomKTOTrainer's methods, TRL 0.24's
    KTOTrainer.kto_loss, compute_loss and store_metrics: {name: function}."""
    ns = {"torch": torch, "F": F, "IGNORE_INDEX": -100, "Optional": Optional, "Union": Union, "Any": Any,
          "Literal": Literal, "Mapping": collections.abc.Mapping, "nullcontext": contextlib.nullcontext,
          "override": lambda f: f, "PreTrainedModel": torch.nn.Module, "nn": torch.nn,
          "autocast": torch.autocast}
    out = read_functions(os.path.join(lf_src, "train/trainer_utils.py"), ("get_batch_logps", "nested_detach"), ns)
    out.update(read_functions(os.path.join(lf_src, "train/kto/trainer.py"),
                              ("forward", "concatenated_forward", "compute_reference_log_probs",
                               "get_batch_loss_metrics"), ns))
    out.update(read_functions(os.path.join(trl_src, "trainer/kto_trainer.py"),
                              ("kto_loss", "compute_loss", "store_metrics"), ns))
    return out


class Stub:
    """What the methods read of the trainer (CustomKTOTrainer.__init__'s settings, FinetuningArguments'
    defaults, one process)."""

    def __init__(self, fns, ref):
        for name in ("forward", "concatenated_forward", "compute_reference_log_probs", "get_batch_loss_metrics",
                     "kto_loss", "compute_loss", "store_metrics"):
            setattr(self, name, types.MethodType(fns[name], self))
        self.ref_model = ref
        self.beta, self.desirable_weight, self.undesirable_weight, self.ftx_gamma = 0.1, 1.0, 1.0, 0.0
        self.loss_type, self.calculate_KL = "kto", True
        self._peft_has_been_casted_to_bf16 = False
        self._stored_metrics = defaultdict(lambda: defaultdict(list))
        self.args = types.SimpleNamespace(device=torch.device("cpu"))
        self.accelerator = types.SimpleNamespace(device=torch.device("cpu"), unwrap_model=lambda m: m,
                                                 gather_for_metrics=lambda t: t, is_main_process=True)


def lf_kto_inputs(vocab, n, seq, prompt):
    """KTODataCollatorWithPadding's batch, no padding: each KL row is the example's prompt with the
    next example's completion (feedback.py: kl_response rotated by one), kto_tags alternate."""
    p = torch.randint(0, vocab, (n, prompt))
    comp = torch.randint(0, vocab, (n, seq - prompt))
    ids = torch.cat([p, comp], 1)
    kl = torch.cat([p, comp.roll(1, 0)], 1)
    lab, kl_lab = ids.clone(), kl.clone()
    lab[:, :prompt] = -100
    kl_lab[:, :prompt] = -100
    tags = torch.tensor([i % 2 == 0 for i in range(n)])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": lab, "kl_input_ids": kl,
            "kl_attention_mask": torch.ones_like(kl), "kl_labels": kl_lab, "kto_tags": tags}


def lf_kto_step(fns, config, ft, ckpt, n, seq, prompt, prec, detail=False):
    """Two steps; step 2's figures: {peak, peak_at, fwd_peak, bwd_peak, ref_peak, policy_fwd_peak, ...}."""
    model, ref, opt = lf_dpo_step.prepare(config, ft, ckpt, prec)
    need = orpo_step.static_bytes(model) + (orpo_step.static_bytes(ref) // 4 if ref is not None else 0)
    if need > RAM_LIMIT:
        return {"skipped": "needs %.1f GiB > %.0f GiB" % (need / 2**30, RAM_LIMIT / 2**30)}
    stub = Stub(fns, ref)
    tr = orpo_step.OrpoTracker(snapshot=detail)
    res = {}
    # the reference's moment (compute_reference_log_probs) and the policy's KL forward's
    ref_box = [0, "", 0]
    kl_box = [0, ""]
    inner_ref, inner_fwd = stub.compute_reference_log_probs, stub.forward

    def traced_ref(model_, batch):
        keep = tr.peak, tr.peak_at, tr.peak_live
        ref_box[2] = tr.peak  # the policy's forwards, before the reference's
        tr.peak = tr.cur
        out = inner_ref(model_, batch)
        ref_box[0], ref_box[1] = tr.peak, tr.peak_at
        if tr.peak < keep[0]:
            tr.peak, tr.peak_at, tr.peak_live = keep
        return out

    def traced_fwd(model_, batch, prefix=""):
        if prefix != "kl_" or ref_box[2]:
            return inner_fwd(model_, batch, prefix)
        keep = tr.peak, tr.peak_at, tr.peak_live  # the policy's KL forward (no_grad in concatenated_forward)
        tr.peak = tr.cur
        out = inner_fwd(model_, batch, prefix)
        kl_box[0], kl_box[1] = tr.peak, tr.peak_at
        if tr.peak < keep[0]:
            tr.peak, tr.peak_at, tr.peak_live = keep
        return out
    stub.compute_reference_log_probs = traced_ref
    with tr, lf_dpo_step.cuda_softmax_copy():
        dpo_step.track_models(tr, model, ref)
        inputs = lf_kto_inputs(config["vocab_size"], n, seq, prompt)
        for t in inputs.values():
            tr.add(t, "input")
        tr.phase = "forward"
        orpo_step.backward_and_step(tr, stub.compute_loss(model, inputs), opt)
        for st in opt.state.values():
            if "step" in st and isinstance(st["step"], torch.Tensor):
                tr.forget(st["step"])  # AdamW keeps its step counters on the CPU on CUDA too
        stub._stored_metrics.clear()
        gc.collect()
        res["static"] = tr.cur
        tr.peak, tr.peak_at, tr.peak_live, tr.acc = tr.cur, "step-start", [], [0, 0]
        tr.nodes = [] if detail else None
        tr.phase = "forward"
        ref_box[2] = 0
        stub.forward = traced_fwd
        loss = stub.compute_loss(model, inputs)
        stub.forward = inner_fwd
        gc.collect()
        res.update(fwd_peak=tr.peak, fwd_peak_at=tr.peak_at, fwd_end=tr.cur, ref_peak=ref_box[0],
                   ref_peak_at=ref_box[1], policy_fwd_peak=ref_box[2], kl_peak=kl_box[0], kl_peak_at=kl_box[1])
        if detail:
            res["fwd_peak_live"] = list(tr.peak_live)
            res["fwd_end_live"] = sorted(((n_, lab) for n_, lab, _ in tr.live()), reverse=True)
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


def memplan_args(ft, ckpt, n, seq, prec):
    a = ["--trainer", "kto", "--loss", "hf", "--batch", str(n), "--seq", str(seq), "--precision", prec,
         "--checkpoint", ckpt, "--optimizer", "adamw", "--workspace", "0", "--use-cache", "off", "--json"]
    if ft == "lora":
        a += ["--finetune", "lora", "--lora-r", "16", "--lora-targets", "all-linear"]
    return a


def cli():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memplan", default="./memplan")
    ap.add_argument("--lf-src", default=LF_SRC, help="the unpacked llamafactory 0.9.5 wheel's llamafactory/")
    ap.add_argument("--trl-src", default=TRL_SRC, help="the unpacked trl 0.24.0 wheel's trl/")
    ap.add_argument("--out", default=None, help="the table (markdown) into FILE")
    ap.add_argument("--rows-out", default=os.path.join(rowlib.ROWS_DIR, "lf_kto_step.jsonl"), help="'' for none")
    ap.add_argument("--select", default="", help="comma-separated indices into SETTINGS (0-based)")
    ap.add_argument("--no-1b", action="store_true", help="skip the 1B-class rows")
    ap.add_argument("--detail", action="store_true", help="print the live storages at the peaks")
    return ap.parse_args()


def main():
    a = cli()
    torch.set_num_threads(1)
    fns = lf_functions(a.lf_src, a.trl_src)
    versions = rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                   peft=peft.__version__, llamafactory="0.9.5 (source)",
                                   trl="0.24.0 (source: kto_loss, compute_loss)", tensors="real, CPU")
    configs = {"tiny": (dpo_step.CONFIG, orpo_step.TINY_NAME), "1b": (orpo_step.one_b_config(), orpo_step.ONE_B_NAME)}
    sel = {int(x) for x in a.select.split(",") if x}
    lines = ["| setting | torch peak (B) | at | memplan (B) | diff | memplan peak at | torch policy fwd+KL (B) "
             "| torch ref-forwards peak (B) | torch bwd peak (B) |", "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for k, (cfg, _) in configs.items():
            paths[k] = os.path.join(tmp, k + ".json")
            with open(paths[k], "w") as f:
                json.dump(cfg, f)
        for i, (mk, ft, ck, n, seq, prompt, prec) in enumerate(SETTINGS):
            if (sel and i not in sel) or (a.no_1b and mk == "1b"):
                continue
            cfg, name = configs[mk]
            setting = "%s: %s, %s, ckpt %s, %d examples x s%d, prompt %d" % (
                "tiny" if mk == "tiny" else "1B-class 2 layers", "LoRA all-linear r16" if ft == "lora" else "full",
                prec, ck, n, seq, prompt)
            print("[%d] %s ..." % (i, setting), flush=True)
            t = lf_kto_step(fns, cfg, ft, ck, n, seq, prompt, prec, a.detail)
            gc.collect()
            if "skipped" in t:
                lines.append("| %s | skipped: %s | | | | | | | |" % (setting, t["skipped"]))
                continue
            args = memplan_args(ft, ck, n, seq, prec)
            try:
                m = dpo_step.memplan_run(a.memplan, paths[mk], args)
                mp = m["peak_allocated_bytes"] - m["workspace_bytes"]
                pct = 100.0 * (mp - t["peak"]) / t["peak"]
                mcol, dcol, mat = str(mp), "%+.3f %%" % pct, m.get("peak_event", "")
            except (RuntimeError, ValueError, KeyError, OSError) as e:
                m = None
                mcol, dcol, mat = "memplan: %s" % (str(e).strip().splitlines() or ["?"])[-1][:120], "-", "-"
            lines.append("| %s | %d | %s | %s | %s | %s | %d | %d | %d |" % (
                setting, t["peak"], t["peak_at"], mcol, dcol, mat, t["policy_fwd_peak"], t["ref_peak"], t["bwd_peak"]))
            print(lines[-1], flush=True)
            pol_t = max(t["policy_fwd_peak"], t["bwd_peak"])
            if m is not None:
                ph = m.get("phases", {})
                print("    policy step: torch %d (forwards before the reference's %d, KL forward %d at %s), memplan %s; "
                      "reference forwards: torch %d, memplan %s" % (
                          pol_t, t["policy_fwd_peak"], t["kl_peak"], t["kl_peak_at"],
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
            rows.append({"config": name, "config_json": cfg, "args": args,
                         "figures": {"peak": rowlib.figure(t["peak"], mp),
                                     "ref_forward_peak": rowlib.figure(t["ref_peak"], ref_mp),
                                     "policy_step_peak": rowlib.figure(pol_t, pol_mp)},
                         "recorded": {"torch_peak_at": t["peak_at"], "memplan_peak_at": m.get("peak_event", ""),
                                      "pct": round(pct, 3), "torch_policy_forwards_peak": t["policy_fwd_peak"],
                                      "torch_kl_forward_peak": t["kl_peak"],
                                      "torch_ref_forward_peak": t["ref_peak"], "torch_forward_end_live": t["fwd_end"],
                                      "torch_backward_peak": t["bwd_peak"], "model": mk},
                         "source": "bench/accuracy/lf_kto_step.py (run %s)" % versions["memplan"],
                         "versions": versions})
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if rows and a.rows_out:
        print("rows: %s" % rowlib.save_rows("lf_kto_step", rows, a.rows_out))


if __name__ == "__main__":
    main()
