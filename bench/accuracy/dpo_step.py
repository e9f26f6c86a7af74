#!/usr/bin/env python3
"""dpo_step.py — memplan --trainer dpo against TRL's DPOTrainer step on the CPU (real tensors).

  python3 bench/accuracy/dpo_step.py [--memplan ./memplan] [--out FILE.md] [--rows-out FILE]

A tiny Llama (LlamaConfig: hidden 256, 2 layers, vocabulary 32000, written into each row as
config_json) runs two training steps of TRL 1.16.0's DPOTrainer on real CPU tensors, under
torch_step.LiveTracker (every storage an op makes, 512-byte rounded as CUDA's caching allocator
counts memory_allocated; parameters, buffers, the reference copy and the optimizer state
registered), and step 2's peak is compared with `memplan estimate CONFIG --trainer dpo ...
--workspace 0 --use-cache off --json` (memory.peak_allocated_bytes), and each of the step's two
phases with memory.phases: the reference forward's own peak (TRL's with-block around it) and the
rest of the step (the policy's).

What runs is TRL's own code: the loss is trl.DPOTrainer._compute_loss (trainer/dpo_trainer.py
:1285-1612) called on a stand-in for the trainer object that holds what that method reads (the
config's defaults: loss_type sigmoid, beta 0.1, f_divergence reverse_kl, no ld_alpha, no WPO
weighting; an accelerator that is one process), with the batch DPO's collator makes
(dpo_trainer.py:297-365: prompt + chosen and prompt + rejected concatenated into 2 x pairs rows,
attention_mask, completion_mask; no padding: every row full length).  The models are patched as
DPOTrainer.__init__ patches them: add_fused_lm_head on the policy (its base model under PEFT) with
the outputs DPO asks for (log_probs, entropy, mean_logits, is_top1; :955-960) and on the reference
copy (:961-962).  The reference is what __init__ makes (:908-927): a full copy in the policy's
dtype (full fine-tuning), none with PEFT (the adapter disabled in the step: use_adapter(model,
None)), none with precompute_ref_log_probs (the batch carries ref_chosen_logps and
ref_rejected_logps).  Then loss.backward(), AdamW(foreach).step(), zero_grad(set_to_none=True),
as the Trainer's training_step and its loop run them.

CPU against CUDA (memplan plans CUDA), each set to CUDA's:
  * TRL's fused head tests the device (loss_heads.trl_cuda_branches): _use_triton -> True (the
    compact gather of the rows whose label is kept), its two Triton kernels not launched (they
    fold a tile in place and allocate nothing; the values are then garbage, which memory does not
    read), _addmm_fp32 -> nothing (CUDA's addmm(out=acc) writes in place).
  * x[mask] and index_put_ with a bool mask make the mask's nonzero indices inside the kernel on
    both devices, where a dispatch mode does not see them: RealTracker counts that transient
    (kept x mask.dim() int64), as loss_heads.Tracker does under fake tensors.
  * SDPA: torch_step's CUDA-kernel patch (imported); rows here run the CPU flash kernel, whose
    saved tensors match CUDA flash's in shape (torch_step_results.md).
  * dropout 0 in the config (CPU dropout keeps an input-dtype mask).
Rows go to bench/accuracy/rows/dpo_step.jsonl (tests/replay_accuracy.py replays them: figures
peak, ref_forward_peak).  Needs torch, transformers, peft, trl.  Not part of make test.
"""
import argparse
import collections
import gc
import json
import os
import subprocess
import sys
import tempfile
import types
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402

import rowlib  # noqa: E402
from torch_step import LiveTracker, backward_and_step  # noqa: E402  (also sets torch_step's SDPA / mask patches)
from loss_heads import trl_cuda_branches  # noqa: E402

# the tiny model: a Llama at the widths the brief names (hidden 64-256, 2 layers); the vocabulary
# of a real tokenizer (one 32768-wide tile of TRL's head)
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
          "intermediate_size": 688, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 2048,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "attention_dropout": 0.0, "hidden_act": "silu", "torch_dtype": "bfloat16"}


class RealTracker(LiveTracker):
    """LiveTracker that also counts the nonzero indices a bool-mask index makes inside its kernel
    (x[mask], index_put_ with a mask: kept x mask.dim() int64, a transient)."""

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        idx = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
        bools = [i for i in idx if isinstance(i, torch.Tensor) and i.dtype == torch.bool]
        if bools and func in (torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default,
                              torch.ops.aten._index_put_impl_.default, torch.ops.aten.index_put.default):
            m = bools[0]
            with torch.utils._python_dispatch._disable_current_modes():
                kept = int(m.sum())
            n = torch.empty((kept, m.dim()), dtype=torch.int64)
            self.add(n, "nonzero")
            out = super().__torch_dispatch__(func, types_, args, kwargs)
            del n
            return out
        return super().__torch_dispatch__(func, types_, args, kwargs)


def build(prec):
    """The tiny Llama in bf16 (memplan's bf16), or fp32 for bf16 autocast (amp-bf16)."""
    cfg = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16 if prec == "bf16" else torch.float32)
    return model, cfg


def autocast_forward(m, fp32_outputs=True):
    """What accelerate's prepare does to each model under bf16 mixed precision (accelerate 1.15
    accelerator.py prepare_model): its forward runs under autocast, the region ending as it returns,
    and convert_outputs_to_fp32 makes each half tensor it returns an fp32 copy (fp32_outputs: the
    rows measured before 2026-11-29 ran without it).  The CPU's autocast stands for CUDA's here."""
    m.forward = torch.autocast("cpu", dtype=torch.bfloat16)(m.forward)
    if fp32_outputs:
        from accelerate.utils.operations import convert_outputs_to_fp32
        m.forward = convert_outputs_to_fp32(m.forward)


class Stub:
    """What DPOTrainer._compute_loss reads of the trainer (DPOConfig's defaults, one process)."""

    def __init__(self, model, ref_model, precompute, ckpt):
        self.model = model
        self.ref_model = ref_model
        self.precompute_ref_logps = precompute
        self.aux_loss_enabled = False
        self.ld_alpha = None
        self.f_divergence_type = "reverse_kl"
        self.f_alpha_divergence_coef = 0.5
        self.loss_types = ["sigmoid"]
        self.loss_weights = [1.0]
        self.beta = 0.1
        self.label_smoothing = 0.0
        self.use_weighting = False
        self._metrics = {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}
        self._total_train_tokens = 0
        self._tp_size = 1
        self.args = types.SimpleNamespace(gradient_checkpointing_kwargs={"use_reentrant": False} if ckpt else None)
        self.accelerator = types.SimpleNamespace(device=torch.device("cpu"), unwrap_model=lambda m: m,
                                                 gather=lambda t: t, gather_for_metrics=lambda t: t)


def prepare(model, ref, ft, ckpt, precompute, add_fused_lm_head, outputs, stub_cls=None):
    """The policy (peft's LoRA r16 all-linear for ft "lora") and the reference patched as
    DPOTrainer.__init__ patches them, checkpointing as the Trainer enables it; (model, stub, AdamW)."""
    if ft == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                           target_modules="all-linear", task_type="CAUSAL_LM"))
    add_fused_lm_head(model.get_base_model() if ft == "lora" else model, outputs=outputs)
    if ref is not None:
        add_fused_lm_head(ref)
    model.train()
    if ckpt == "layers":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if ft == "lora":
            model.enable_input_require_grads()
    stub = (stub_cls or Stub)(model, ref, precompute, ckpt == "layers")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6, foreach=True)
    return model, stub, opt


def ref_copy(cfg, model):
    """The reference TRL makes for full fine-tuning without precomputed log-probs: the model again
    in its dtype, frozen, in eval mode (dpo_trainer.py:916-927, kto_trainer.py:919-938)."""
    ref = transformers.LlamaForCausalLM(cfg).to(model.dtype)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def dpo_inputs(vocab, pairs, seq, prompt, precompute, dev):
    """The batch DPO's collator makes (dpo_trainer.py:297-365), no padding: 2 x pairs full rows."""
    ids = torch.randint(0, vocab, (2 * pairs, seq), device=dev)
    comp = torch.zeros_like(ids)
    comp[:, prompt:] = 1
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": comp}
    if precompute:
        inputs["ref_chosen_logps"] = torch.zeros(pairs, device=dev)
        inputs["ref_rejected_logps"] = torch.zeros(pairs, device=dev)
    return inputs


def dpo_step(ft, ckpt, pairs, seq, prompt, precompute, prec="bf16"):
    """Step 2's peak of TRL's DPO step, and the reference forward's own peak (0: none)."""
    from trl import DPOTrainer
    model, cfg = build(prec)
    add_fused_lm_head = trl_cuda_branches()
    outputs = ("log_probs", "entropy", "mean_logits", "is_top1")  # dpo_trainer.py:957
    ref = ref_copy(cfg, model) if ft == "full" and not precompute else None  # dpo_trainer.py:916-927
    model, stub, opt = prepare(model, ref, ft, ckpt, precompute, add_fused_lm_head, outputs)
    if prec == "amp-bf16":
        for m in (model, ref):
            if m is not None:
                autocast_forward(m)
    import trl.trainer.dpo_trainer as dt
    return measured_steps(dt, model, ref, opt,
                          lambda: dpo_inputs(cfg.vocab_size, pairs, seq, prompt, precompute, torch.device("cpu")),
                          lambda inputs: DPOTrainer._compute_loss(stub, model, inputs, False))


def track_models(tr, model, ref):
    """Count the policy's and the reference's (None: none) parameters and buffers in tr."""
    for p in model.parameters():
        tr.add(p, "param")
    for b in model.buffers():
        tr.add(b, "buffer")
    if ref is not None:
        for p in ref.parameters():
            tr.add(p, "ref_param")
        for b in ref.buffers():
            tr.add(b, "ref_buffer")


def measured_steps(trl_module, model, ref, opt, make_inputs, loss):
    """Two training steps (loss(inputs) then backward, AdamW step, zero_grad) on the batch
    make_inputs() makes, under a RealTracker that knows the parameters, buffers, the reference copy
    and the batch: step 2's peak, where, and the peak inside
    TRL's with-block around the reference forwards (trl_module's disable_gradient_checkpointing,
    entered with torch.no_grad: dpo_trainer.py:1327-1338, kto_trainer.py:1426-1436; 0: none)."""
    tr = RealTracker()
    ref_peak = [0]
    orig = trl_module.disable_gradient_checkpointing

    def measured(m, kw):
        cm = orig(m, kw)

        class W:
            def __enter__(self):
                self.before = (tr.peak, tr.peak_at)
                tr.phase = "reference"
                tr.peak = tr.cur
                return cm.__enter__()

            def __exit__(self, *e):
                r = cm.__exit__(*e)
                ref_peak[0] = max(ref_peak[0], tr.peak)
                if self.before[0] > tr.peak:
                    tr.peak, tr.peak_at = self.before
                tr.phase = "forward"
                return r
        return W()
    trl_module.disable_gradient_checkpointing = measured
    try:
        with tr:
            track_models(tr, model, ref)
            inputs = make_inputs()
            for step in (1, 2):
                if step == 2:
                    for st in opt.state.values():
                        if "step" in st and isinstance(st["step"], torch.Tensor):
                            tr.forget(st["step"])  # AdamW keeps its step counters on the CPU on CUDA too
                    gc.collect()
                    tr.peak, tr.peak_at = tr.cur, "step-start"
                    ref_peak[0] = 0
                tr.phase = "forward"
                backward_and_step(tr, loss(inputs), opt)
    finally:
        trl_module.disable_gradient_checkpointing = orig
    return tr.peak, tr.peak_at, ref_peak[0]


def memplan_args(ft, ckpt, pairs, seq, frac, precompute, prec="bf16"):
    a = ["--trainer", "dpo", "--batch", str(pairs), "--seq", str(seq), "--precision", prec, "--checkpoint", ckpt,
         "--workspace", "0", "--use-cache", "off", "--json"]
    if frac < 1:
        a += ["--label-fraction", repr(frac)]
    if precompute:
        a += ["--precompute-ref"]
    if ft == "lora":
        a += ["--finetune", "lora", "--lora-r", "16", "--lora-targets", "all-linear"]
    return a


def memplan_run(memplan, cfg_path, args):
    r = subprocess.run([memplan, "estimate", cfg_path] + args, capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise RuntimeError(r.stderr.strip())
    return json.loads(r.stdout)["memory"]


# (finetune, checkpoint, pairs, seq, prompt tokens, precompute_ref_log_probs); seq - 1 = 2 x the
# completion so that the label fraction is exact (0.5: kept positions after the shift = seq - prompt)
SETTINGS = [("full", "none", 2, 257, 129, False), ("full", "layers", 2, 257, 129, False),
            ("full", "none", 2, 257, 129, True), ("lora", "layers", 2, 257, 129, False),
            ("lora", "none", 2, 257, 129, False), ("full", "none", 1, 513, 1, False),
            ("full", "layers", 4, 129, 65, False)]
# fp32 weights under bf16 autocast (the reference copy in fp32, the model's dtype)
AMP_SETTINGS = [("full", "none", 2, 257, 129, False), ("full", "layers", 2, 257, 129, False),
                ("lora", "layers", 2, 257, 129, False)]


def cli(oracle, doc, want_model=False):
    """The oracle's command line: --memplan, --out, --rows-out (rows/ORACLE.jsonl), --only, and
    --model CONFIG.json where want_model."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--memplan", default="./memplan")
    ap.add_argument("--out", default=None, help="the table (markdown) into FILE")
    ap.add_argument("--rows-out", default=os.path.join(rowlib.ROWS_DIR, oracle + ".jsonl"))
    ap.add_argument("--only", choices=("bf16", "amp-bf16"), default=None, help="only the rows of one precision")
    if want_model:
        ap.add_argument("--model", default=None, help="a Llama config.json: its own settings on it")
    return ap.parse_args()


def run_table(a, oracle, config, name, todo, step, margs, unit, generation=False):
    """Each setting of todo (finetune, checkpoint, batch, seq, prompt, precompute, precision) run by
    step (torch's peak, where, its reference forward's; with generation, GRPO's generate call's
    peak too, and precompute is GRPO's beta) and by memplan (margs: its arguments, on config
    written to a file): the table (a.out), the rows (a.rows_out); unit names the batch's items
    ("pairs").  A setting may carry an eighth item, a dict of keyword arguments for step and margs
    (GRPO's steps_per_generation); with generation, step's fifth figure is the policy's old
    log-probs forward (0: none)."""
    import trl
    versions = rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                   peft=peft.__version__, trl=trl.__version__, tensors="real, CPU")
    lines = ["| setting | reference | torch peak (B) | at | memplan (B) | diff | ref fwd torch (B) | memplan (B) "
             "| diff |" + (" generate torch (B) | memplan (B) | diff | old log-probs torch (B) | memplan (B) | diff |"
                            if generation else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|---|---|" if generation else "")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.json")
        with open(path, "w") as f:
            json.dump(config, f)
        for item in todo:
            (ft, ck, n, seq, prompt, pre, prec), kw = item[:7], (item[7] if len(item) > 7 else {})
            if a.only and prec != a.only:
                continue
            frac = (seq - prompt) / (seq - 1)
            measured = step(ft, ck, n, seq, prompt, pre, prec, **kw)
            tp, tat, tref = measured[:3]
            tgen = measured[3] if generation else 0
            told = measured[4] if generation and len(measured) > 4 else 0
            args = margs(ft, ck, n, seq, prompt if generation else frac, pre, prec, **kw)
            m = memplan_run(a.memplan, path, args)
            mp = m["peak_allocated_bytes"] - m["workspace_bytes"]
            mref = m.get("phases", {}).get("reference_forward", {}).get("peak_allocated_bytes", 0)
            mref = mref - m["workspace_bytes"] if mref else 0
            mgen = m.get("phases", {}).get("generation", {}).get("peak_allocated_bytes", 0)
            mgen = mgen - m["workspace_bytes"] if mgen else 0
            mold = m.get("phases", {}).get("old_logprobs_forward", {}).get("peak_allocated_bytes", 0)
            mold = mold - m["workspace_bytes"] if mold else 0
            if generation:
                refname = "none (beta 0)" if not pre else ("adapter disabled" if ft == "lora" else "copy")
            else:
                refname = "precomputed" if pre else ("adapter disabled" if ft == "lora" else "copy")
            setting = "%s, %s, ckpt %s, %d %s x s%d, prompt %d" % (
                "LoRA all-linear r16" if ft == "lora" else "full", prec, ck, n, unit, seq, prompt)
            setting += "".join(", %s %s" % (k.replace("_", " "), v) for k, v in kw.items())
            pct = 100.0 * (mp - tp) / tp
            rpct = 100.0 * (mref - tref) / tref if tref else 0.0
            lines.append("| %s | %s | %d | %s | %d | %+.3f %% | %s | %s | %s |" % (
                setting, refname, tp, tat, mp, pct, tref or "-", mref or "-", "%+.3f %%" % rpct if tref else "-"))
            gpct = 100.0 * (mgen - tgen) / tgen if tgen else 0.0
            opct = 100.0 * (mold - told) / told if told else 0.0
            if generation:
                lines[-1] += " %d | %d | %+.3f %% |" % (tgen, mgen, gpct)
                lines[-1] += (" %d | %d | %+.3f %% |" % (told, mold, opct)) if told else " - | - | - |"
            print(lines[-1], flush=True)
            figs = {"peak": rowlib.figure(tp, mp)}
            if tref:
                figs["ref_forward_peak"] = rowlib.figure(tref, mref)
            if tgen:
                figs["generation_peak"] = rowlib.figure(tgen, mgen)
            if told:
                figs["old_forward_peak"] = rowlib.figure(told, mold)
            rows.append({"config": name, "config_json": config, "args": args, "figures": figs,
                         "recorded": {"torch_peak_at": tat, "memplan_peak_at": m["peak_event"], "pct": round(pct, 3),
                                      "ref_pct": round(rpct, 3)},
                         "source": "bench/accuracy/%s.py (run %s)" % (oracle, versions["memplan"]),
                         "versions": versions})
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    rowlib.save_rows(oracle, rows, a.rows_out)


def main():
    a = cli("dpo_step", __doc__)
    todo = [s + ("bf16",) for s in SETTINGS] + [s + ("amp-bf16",) for s in AMP_SETTINGS]
    run_table(a, "dpo_step", CONFIG, "tiny Llama (dpo_step.py CONFIG)", todo, dpo_step, memplan_args, "pairs")

if __name__ == "__main__":
    main()
