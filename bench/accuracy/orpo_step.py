#!/usr/bin/env python3
"""orpo_step.py — memplan --trainer orpo against TRL's ORPOTrainer step on the CPU (real tensors).

  python3 bench/accuracy/orpo_step.py [--memplan ./memplan] [--out FILE.md] [--rows-out FILE]
                                     [--only bf16|amp-bf16] [--select 0,2] [--no-1b] [--detail]

Two Llamas, each written into its rows as config_json: dpo_step.py's tiny CONFIG (hidden 256,
2 layers, vocabulary 32000) and Llama-3.2-1B's shape (models/hf/llama-3.2-1b.json: hidden 2048,
intermediate 8192, 32 / 8 heads, vocabulary 128256, tied embeddings, llama3 rope scaling) cut to 2
layers.  Each runs two training steps of TRL 1.16.0's trl.experimental.orpo.ORPOTrainer on real
CPU tensors under inplace_tracker.InplaceTracker (dpo_step.RealTracker's counts: every storage an op
makes, 512-byte rounded as CUDA's caching allocator counts memory_allocated; parameters, buffers,
the batch and the optimizer state registered; and autograd's gradient sums counted in place where
plain PyTorch sums them in place: ORPO's logits get two gradients, the NLL's and the odds ratio's,
which a plain dispatch mode would see summed out of place, one logits-sized tensor too many).  Step
2's peak is compared with `memplan estimate CONFIG --trainer orpo ... --optimizer adamw --workspace 0
--use-cache off --json` (memory.peak_allocated_bytes).

What runs is TRL's own code: ORPOTrainer.compute_loss (experimental/orpo/orpo_trainer.py:879-) and
through it get_batch_loss_metrics (:824-877), concatenated_forward (:745-822), concatenated_inputs,
get_batch_logps (:705-743), odds_ratio_loss (:670-703), called unbound on a stand-in for the trainer
object holding what they read (ORPOConfig's defaults: beta 0.1; decoder-only, padding_value 0, no
router aux loss, not a 4-bit PEFT model; an accelerator that is one process, metrics not stored),
with the batch ORPO's tokenize_row and DPODataCollatorWithPadding make: `pairs` pairs, each
prompt + chosen and prompt + rejected, every row full length (no padding), chosen_/rejected_
input_ids, attention_mask, labels (the prompt's positions -100), prompt_input_ids and
prompt_attention_mask.  The model is set up as ORPOTrainer.__init__ and the Trainer set it up:
disable_dropout_in_model (ORPOConfig.disable_dropout True), peft's LoRA r16 all-linear for "lora"
(get_peft_model's defaults: the adapter in fp32), enable_input_require_grads under gradient
checkpointing (:232-239 for PEFT, :254-262 otherwise), checkpointing as the Trainer enables it
(use_reentrant False).  Then loss.backward(), AdamW(foreach).step(), zero_grad(set_to_none=True).

Under amp-bf16 (fp32 weights) each forward runs as accelerate 1.15's prepare wraps it for bf16
mixed precision (accelerator.py:1825-1835): torch.autocast around the model's forward AND
convert_outputs_to_fp32 on what it returns, so ORPO's all_logits are an fp32 copy of the bf16
lm_head output (the bf16 one dies at once), and the NLL (nn.CrossEntropyLoss) and the log-probs
run on fp32 logits outside autocast (the Trainer's compute_loss_context_manager adds no autocast).
(dpo_step.autocast_forward omits the fp32 conversion: its fused head returns fp32 already.)
CPU autocast puts cross_entropy / log_softmax on its fp32 list as CUDA's does, but that list is not
reached here: ORPO's loss is outside the autocast region.  --bf16-outputs runs without the
conversion (a what-if; its rows are not saved).

CPU against CUDA (memplan plans CUDA), each set to CUDA's:
  * trl.trainer.utils.selective_log_softmax takes its Triton path on CUDA
    (_supports_trl_loss_kernel is true for cuda tensors -> _fused_logprob_entropy =
    trl.kernels.logprob_entropy._LogProbEntropyFunction): forward 4 fp32 tensors of
    logits.shape[:-1] (logprobs, entropy, log_z, expected_logit), saves (logits -- a view of
    all_logits --, index, log_z, expected_logit, row_mask); backward grad_logits =
    empty_like(logits, contiguous).  Here _supports_trl_loss_kernel is the original asked about
    its tensors as if they were on CUDA (every other check kept), and the two Triton kernels'
    launchers do nothing (as loss_heads.trl_cuda_branches's _NoLaunch): the values are then
    garbage (torch.empty), which memory does not read.  Each step checks both launchers ran.
  * no bool-mask indexing in ORPO's step (nonzero counting unused);
  * SDPA: torch_step's CUDA-kernel patch (imported through dpo_step); the CPU flash kernel's saved
    tensors match CUDA flash's in shape (torch_step_results.md);
  * dropout 0 (config and disable_dropout_in_model).
--detail keeps the live storages at each new peak (LiveTracker snapshot) and prints, per row: the
top storages at the step's peak, those live when backward starts, the forward's own peak, and the
backward nodes in the order the engine ran them (with the live bytes after each).

Gradient sums (InplaceTracker, checked against plain torch's profiler on a tied tiny Llama): the
tied embedding's two gradients (lm_head's, embed_tokens') are summed OUT of place under bf16 (the
lm_head's arrives as a view whose base is alive) and IN place under amp-bf16 (it arrives as
ToCopyBackward0's fresh fp32 tensor); ORPO's two logits gradients are summed in place.

The table: step 2's peak (torch, memplan), where, and torch's forward peak (its loss included), the
live bytes when backward starts, and the backward's own peak.  Rows whose weights, gradients and
AdamW state pass 12 GiB are skipped (none of SETTINGS does).  Rows go to
bench/accuracy/rows/orpo_step.jsonl (tests/replay_accuracy.py replays them: figure peak; recorded:
torch_peak_at, memplan_peak_at, pct, torch_forward_peak, torch_forward_end_live,
torch_backward_peak, model).  A row memplan refuses is printed ("memplan: <error>") and not saved
(the replay would fail on it).  Needs torch, transformers, peft, accelerate, trl (triton importable).
Not part of make test.  About 6 minutes on 2 cores (the three 1B-class rows most of it).
"""
import argparse
import gc
import json
import os
import sys
import tempfile
import types
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402

import rowlib  # noqa: E402
import dpo_step  # noqa: E402  (its CONFIG, memplan helpers; torch_step's SDPA / mask patches)
import kto_step  # noqa: E402  (build: a Llama from any config dict)
from inplace_tracker import InplaceTracker  # noqa: E402
from torch_step import backward_and_step  # noqa: E402

ONE_B_FILE = os.path.join(rowlib.ROOT, "models", "hf", "llama-3.2-1b.json")
ONE_B_NAME = "models/hf/llama-3.2-1b.json, 2 layers (config_json)"
TINY_NAME = "tiny Llama (dpo_step.py CONFIG)"
RAM_LIMIT = 12 << 30  # rows whose weights, gradients and AdamW state pass this are skipped

# (model, finetune, checkpoint, pairs, seq, prompt tokens, precision); seq - 1 = 2 x the completion
# where the prompt is half, so that the label fraction is exact
SETTINGS = [("tiny", "full", "none", 2, 257, 129, "bf16"), ("tiny", "full", "layers", 2, 257, 129, "bf16"),
            ("tiny", "full", "none", 2, 257, 129, "amp-bf16"), ("tiny", "full", "layers", 2, 257, 129, "amp-bf16"),
            ("tiny", "lora", "layers", 2, 257, 129, "bf16"), ("tiny", "lora", "none", 2, 257, 129, "amp-bf16"),
            ("tiny", "full", "none", 1, 513, 1, "bf16"), ("tiny", "full", "layers", 4, 129, 65, "bf16"),
            ("1b", "full", "layers", 1, 257, 129, "bf16"), ("1b", "lora", "layers", 1, 257, 129, "bf16"),
            ("1b", "full", "none", 1, 129, 65, "amp-bf16")]


def one_b_config():
    """Llama-3.2-1B's config.json cut to 2 layers (rowlib.load_config: dropout 0), its comment dropped."""
    return {k: v for k, v in rowlib.load_config(ONE_B_FILE, 2).items() if not k.startswith("_")}


# ---- CUDA's branches of TRL's log-prob kernel ---------------------------------------------------

class _NoLaunch:
    """A Triton kernel's grid launcher that launches nothing (the kernels write into tensors the
    Python side allocated, and allocate nothing); counts its launches."""

    def __init__(self):
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*a, **k):
            self.launches += 1
        return launch


class _OnCuda:
    """A tensor as _supports_trl_loss_kernel sees it on CUDA: every attribute its own, the device cuda."""
    device = torch.device("cuda")

    def __init__(self, t):
        self._t = t

    def __getattr__(self, k):
        return getattr(self._t, k)


def trl_logprob_cuda_branch():
    """Make selective_log_softmax take its Triton path (_LogProbEntropyFunction) on CPU tensors, its
    kernels not launched; returns (forward launcher, backward launcher)."""
    import trl.trainer.utils as tu
    import trl.kernels.logprob_entropy as le
    from transformers.utils import is_triton_available
    assert is_triton_available() and tu._fused_logprob_entropy is le.selective_log_softmax_and_entropy
    orig = getattr(tu._supports_trl_loss_kernel, "_orig", tu._supports_trl_loss_kernel)

    def supports(logits, index=None, row_mask=None):
        ts = [logits, index, row_mask]
        if all(t is None or t.device.type == "cpu" for t in ts):  # the CPU stands for one CUDA device
            ts = [None if t is None else _OnCuda(t) for t in ts]
        return orig(*ts)
    supports._orig = orig
    tu._supports_trl_loss_kernel = supports
    le._forward_kernel = _NoLaunch()
    le._backward_kernel = _NoLaunch()
    return le._forward_kernel, le._backward_kernel


# ---- the trainer's stand-in, the batch, the model ----------------------------------------------

class Stub:
    """What ORPOTrainer.compute_loss and the methods it calls read of the trainer (ORPOConfig's
    defaults, one process)."""

    def __init__(self):
        from trl.experimental.orpo import ORPOTrainer
        for name in ("get_batch_loss_metrics", "concatenated_forward", "odds_ratio_loss"):
            setattr(self, name, types.MethodType(getattr(ORPOTrainer, name), self))
        self.concatenated_inputs = ORPOTrainer.concatenated_inputs  # static methods
        self.get_batch_logps = ORPOTrainer.get_batch_logps
        self.beta = 0.1
        self.is_encoder_decoder = False
        self.padding_value = 0
        self.aux_loss_enabled = False
        self.aux_loss_coef = 0.0
        self._peft_has_been_casted_to_bf16 = False
        self.args = types.SimpleNamespace(device=torch.device("cpu"))
        self.accelerator = types.SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda t: t)

    def store_metrics(self, metrics, train_eval="train"):
        pass


def orpo_inputs(vocab, pairs, seq, prompt, dev):
    """The batch ORPO's tokenize_row + DPODataCollatorWithPadding make, no padding: pairs rows of
    prompt + chosen and of prompt + rejected (the same prompt), labels -100 over the prompt."""
    p = torch.randint(0, vocab, (pairs, prompt), device=dev)
    out = {"prompt_input_ids": p, "prompt_attention_mask": torch.ones_like(p)}
    for side in ("chosen", "rejected"):
        ids = torch.cat([p, torch.randint(0, vocab, (pairs, seq - prompt), device=dev)], 1)
        lab = ids.clone()
        lab[:, :prompt] = -100
        out.update({side + "_input_ids": ids, side + "_attention_mask": torch.ones_like(ids), side + "_labels": lab})
    return out


def accelerate_amp_forward(m, fp32_outputs=True):
    """What accelerate 1.15's prepare does to the model under bf16 mixed precision
    (accelerator.py:1825-1835): autocast around its forward, then convert_outputs_to_fp32 (bf16
    outputs .float()).  The CPU's autocast stands for CUDA's."""
    from accelerate.utils.operations import convert_outputs_to_fp32
    m._original_forward = m.forward
    m.forward = types.MethodType(torch.autocast("cpu", dtype=torch.bfloat16)(m.forward.__func__), m)
    if fp32_outputs:
        m.forward = types.MethodType(convert_outputs_to_fp32(m.forward.__func__), m)


def prepare(config, ft, ckpt, prec, fp32_outputs=True):
    """The model set up as ORPOTrainer.__init__ and the Trainer set it up; (model, AdamW)."""
    from trl.trainer.utils import disable_dropout_in_model
    model, _ = kto_step.build(config, prec)
    if ft == "lora":
        if ckpt == "layers":
            model.enable_input_require_grads()  # orpo_trainer.py:232-239, before get_peft_model
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                           target_modules="all-linear", task_type="CAUSAL_LM"))
    elif ckpt == "layers":
        model.enable_input_require_grads()  # orpo_trainer.py:254-262
    disable_dropout_in_model(model)  # orpo_trainer.py:338-340
    model.train()
    if ckpt == "layers":  # the Trainer's _inner_training_loop
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if prec == "amp-bf16":
        accelerate_amp_forward(model, fp32_outputs)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6, foreach=True)
    return model, opt


def static_bytes(model):
    """Weights, gradients and AdamW's two states: what the row needs before any activation."""
    w = sum(p.numel() * p.element_size() for p in model.parameters())
    t = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return w + 3 * t


# ---- the measured step ---------------------------------------------------------------------------

class OrpoTracker(InplaceTracker):
    """InplaceTracker that logs the backward nodes as the engine runs them (name, live bytes after)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.nodes = None  # a list while logging

    def _post_hook(self, grad_inputs, grad_outputs):
        super()._post_hook(grad_inputs, grad_outputs)
        if self.nodes is not None and self._acc_node is not None:
            self.nodes.append((self._acc_node.name(), self.cur))


def orpo_step(config, ft, ckpt, pairs, seq, prompt, prec, detail=False, fp32_outputs=True):
    """Two ORPO steps; step 2's figures: {peak, peak_at, fwd_peak, fwd_peak_at, fwd_end, ...}."""
    from trl.experimental.orpo import ORPOTrainer
    fwd_k, bwd_k = trl_logprob_cuda_branch()
    model, opt = prepare(config, ft, ckpt, prec, fp32_outputs)
    need = static_bytes(model)
    if need > RAM_LIMIT:
        return {"skipped": "needs %.1f GiB > %.0f GiB" % (need / 2**30, RAM_LIMIT / 2**30)}
    stub = Stub()
    tr = OrpoTracker(snapshot=detail)
    res = {}
    with tr:
        dpo_step.track_models(tr, model, None)
        inputs = orpo_inputs(config["vocab_size"], pairs, seq, prompt, torch.device("cpu"))
        for t in inputs.values():
            tr.add(t, "input")
        # step 1 (makes AdamW's state), as dpo_step.measured_steps runs it: the loss passed on, not held
        tr.phase = "forward"
        backward_and_step(tr, ORPOTrainer.compute_loss(stub, model, inputs), opt)
        assert (fwd_k.launches, bwd_k.launches) == (1, 1), "selective_log_softmax did not take the Triton path"
        for st in opt.state.values():
            if "step" in st and isinstance(st["step"], torch.Tensor):
                tr.forget(st["step"])  # AdamW keeps its step counters on the CPU on CUDA too
        gc.collect()
        # step 2, measured: torch_step.backward_and_step with the backward's own peak read before the step
        res["static"] = tr.cur
        tr.peak, tr.peak_at, tr.peak_live, tr.acc = tr.cur, "step-start", [], [0, 0]
        tr.nodes = [] if detail else None
        tr.phase = "forward"
        loss = ORPOTrainer.compute_loss(stub, model, inputs)
        gc.collect()
        res.update(fwd_peak=tr.peak, fwd_peak_at=tr.peak_at, fwd_end=tr.cur)
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
        assert (fwd_k.launches, bwd_k.launches) == (2, 2), "selective_log_softmax did not take the Triton path"
        tr.nodes_log = tr.nodes
        tr.nodes = None
    res.update(peak=tr.peak, peak_at=tr.peak_at, acc=list(tr.acc))
    if detail:
        res["peak_live"] = list(tr.peak_live)
        res["nodes"] = tr.nodes_log
    return res


def memplan_args(ft, ckpt, pairs, seq, prompt, prec):
    """dpo_step.memplan_args's spelling with --trainer orpo (--batch: pairs) and --optimizer adamw;
    the label fraction (ORPO's log-probs over the labelled positions after the shift: seq - prompt
    of seq - 1) passed as dpo_step passes it."""
    a = dpo_step.memplan_args(ft, ckpt, pairs, seq, (seq - prompt) / (seq - 1), False, prec)
    a[a.index("dpo")] = "orpo"
    i = a.index("--workspace")
    return a[:i] + ["--optimizer", "adamw"] + a[i:]


# ---- the report ----------------------------------------------------------------------------------

def show_live(title, live, top=14):
    """The largest storages of live [(bytes, label)], and the bytes by where they were made (the
    parameters, buffers and batch; the optimizer state; the forward's; the backward's)."""
    print("    %s: %d storages, %d B" % (title, len(live), sum(n for n, _ in live)))
    by = {}
    for n, lab in live:
        k = lab.split(" ")[0] if lab.split(" ")[0] in ("param", "buffer", "input") else lab.split("@")[-1].split(" ")[0]
        by[k] = by.get(k, 0) + n
    print("      by origin: " + ", ".join("%s %d" % kv for kv in sorted(by.items(), key=lambda kv: -kv[1])))
    for n, lab in live[:top]:
        print("      %12d  %s" % (n, lab))


def show_nodes(nodes, limit=40):
    """The backward nodes in the engine's order, until the lm_head's (the first mm whose output is
    the hidden states' gradient) and a few more."""
    print("    backward nodes (engine order; live bytes after each):")
    prev = None
    for i, (name, cur) in enumerate(nodes[:limit]):
        print("      %3d %-40s %12d %s" % (i, name, cur, "" if prev is None else "%+d" % (cur - prev)))
        prev = cur


def cli():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memplan", default="./memplan")
    ap.add_argument("--out", default=None, help="the table (markdown) into FILE")
    ap.add_argument("--rows-out", default=os.path.join(rowlib.ROWS_DIR, "orpo_step.jsonl"), help="'' for none")
    ap.add_argument("--only", choices=("bf16", "amp-bf16"), default=None, help="only the rows of one precision")
    ap.add_argument("--select", default="", help="comma-separated indices into SETTINGS (0-based)")
    ap.add_argument("--no-1b", action="store_true", help="skip the 1B-class rows")
    ap.add_argument("--detail", action="store_true",
                    help="print the live storages at the peak and at the forward's end, and the backward's nodes")
    ap.add_argument("--bf16-outputs", action="store_true",
                    help="amp-bf16 without accelerate's convert_outputs_to_fp32 (what-if; rows not saved)")
    return ap.parse_args()


def main():
    a = cli()
    import trl
    versions = rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                   peft=peft.__version__, trl=trl.__version__, tensors="real, CPU")
    configs = {"tiny": (dpo_step.CONFIG, TINY_NAME), "1b": (one_b_config(), ONE_B_NAME)}
    sel = {int(x) for x in a.select.split(",") if x}
    lines = ["| setting | torch peak (B) | at | memplan (B) | diff | memplan peak at | torch fwd peak (B) "
             "| torch live at backward (B) | torch bwd peak (B) |", "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for k, (cfg, _) in configs.items():
            paths[k] = os.path.join(tmp, k + ".json")
            with open(paths[k], "w") as f:
                json.dump(cfg, f)
        for i, (mk, ft, ck, n, seq, prompt, prec) in enumerate(SETTINGS):
            if (sel and i not in sel) or (a.only and prec != a.only) or (a.no_1b and mk == "1b"):
                continue
            cfg, name = configs[mk]
            setting = "%s: %s, %s, ckpt %s, %d pairs x s%d, prompt %d" % (
                "tiny" if mk == "tiny" else "1B-class 2 layers", "LoRA all-linear r16" if ft == "lora" else "full",
                prec, ck, n, seq, prompt)
            print("[%d] %s ..." % (i, setting), flush=True)
            t = orpo_step(cfg, ft, ck, n, seq, prompt, prec, a.detail, not a.bf16_outputs)
            gc.collect()
            if "skipped" in t:
                lines.append("| %s | skipped: %s | | | | | | | |" % (setting, t["skipped"]))
                print(lines[-1], flush=True)
                continue
            args = memplan_args(ft, ck, n, seq, prompt, prec)
            try:
                m = dpo_step.memplan_run(a.memplan, paths[mk], args)
                mp = m["peak_allocated_bytes"] - m["workspace_bytes"]
                pct = 100.0 * (mp - t["peak"]) / t["peak"]
                mcol, dcol, mat = str(mp), "%+.3f %%" % pct, m.get("peak_event", "")
            except (RuntimeError, ValueError, KeyError, OSError) as e:
                m = None
                mcol, dcol, mat = "memplan: %s" % (str(e).strip().splitlines() or ["?"])[-1][:120], "-", "-"
            lines.append("| %s | %d | %s | %s | %s | %s | %d | %d | %d |" % (
                setting, t["peak"], t["peak_at"], mcol, dcol, mat, t["fwd_peak"], t["fwd_end"], t["bwd_peak"]))
            print(lines[-1], flush=True)
            print("    static %d B, forward peak at %s, backward peak at %s, gradient sums in place / out of place %s"
                  % (t["static"], t["fwd_peak_at"], t["bwd_peak_at"], t["acc"]), flush=True)
            if a.detail:
                show_live("live at the step's peak (%s)" % t["peak_at"], t["peak_live"])
                show_live("live at the forward's peak (%s)" % t["fwd_peak_at"], t["fwd_peak_live"])
                show_live("live when backward starts", t["fwd_end_live"])
                show_nodes(t["nodes"])
            if m is None or a.bf16_outputs:
                continue
            rows.append({"config": name, "config_json": cfg, "args": args,
                         "figures": {"peak": rowlib.figure(t["peak"], mp)},
                         "recorded": {"torch_peak_at": t["peak_at"], "memplan_peak_at": m.get("peak_event", ""),
                                      "pct": round(pct, 3), "torch_forward_peak": t["fwd_peak"],
                                      "torch_forward_end_live": t["fwd_end"], "torch_backward_peak": t["bwd_peak"],
                                      "model": mk},
                         "source": "bench/accuracy/orpo_step.py (run %s)" % versions["memplan"],
                         "versions": versions})
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if rows and a.rows_out:
        print("rows: %s" % rowlib.save_rows("orpo_step", rows, a.rows_out))


if __name__ == "__main__":
    main()
