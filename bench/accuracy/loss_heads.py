#!/usr/bin/env python3
"""loss_heads.py — memplan's --loss heads against PyTorch on the CPU (fake tensors).

  python3 bench/accuracy/loss_heads.py [--quick] [--only 1b,8b] [--out FILE.md] [--memplan PATH]

For each config (Llama-3.2-1B and Llama-3-8B shapes, models/hf/, cut to a few decoder layers by
rowlib.load_config), setting (LoRA r16 all-linear on a bf16 base with checkpointing, seq 2048 and
8192; full fine-tuning amp-bf16, seq 2048) and loss head, two training steps run under
FakeTensorMode (no memory used) with torch_step.LiveTracker (live storages, 512-byte rounded, as
CUDA's caching allocator counts memory_allocated) giving step 2's peak, which is compared with
`memplan estimate ... --loss K --workspace 0 --use-cache off --json` (the same config file).
The loss heads, each as its library runs it on CUDA:

  hf           model(input_ids, labels).loss (transformers ForCausalLMLoss), as peft_step.py.
  chunked-nll  TRL's own code: trl.trainer.utils.add_fused_lm_head(model) and
               model(..., fused_lm_head=True).loss (trl 1.16.0, SFTTrainer's default head).  Three
               device branches are set to what CUDA takes, since they test the device type:
               kernels.chunked_logprob._use_triton -> True (the compact path: only rows whose label
               is not -100 are gathered); its two Triton kernels (_forward_kernel, _backward_kernel:
               they fold a tile in place and allocate nothing) -> a launcher that does nothing; and
               _addmm_fp32 -> nothing (on CUDA, torch.addmm(acc, a, b, out_dtype=fp32, out=acc)
               writes into acc; the CPU branch would make fp32 copies of the tile and the weight
               chunk that CUDA does not).  Everything else (the gather, the buffers, the tile loop,
               the .to() copies, the scatter of the outputs, autograd) is TRL's code as is.
  liger        Liger's fused linear cross-entropy is Triton-only: liger_flce below re-implements
               what it allocates on CUDA following liger-kernel 0.8.5
               ops/fused_linear_cross_entropy.py line by line (cited there), with the labels as
               transformers/model/loss_utils.py LigerForCausalLMLoss shapes them; the Triton
               cross-entropy kernel (in place on the logits chunk) and element_mul (in place) are
               not run (fake tensors have no values).

--label-fraction: the chunked-nll rows marked "F 0.5" set the first half of each sequence's labels
to -100 (prompt masking): the kept label positions after the shift are s - k per row with k the
masked prefix, which is ceil(0.5 * (s - 1)) at batch 1, as memplan counts them.

Rows go to bench/accuracy/rows/loss_heads.jsonl (tests/replay_accuracy.py replays them).
Needs torch, transformers, peft, trl (pip).  Not part of `make test`.
"""
import argparse
import functools
import gc
import json
import math
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
import transformers.masking_utils  # noqa: E402
import peft  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import rowlib  # noqa: E402
from torch_step import LiveTracker  # noqa: E402  (also sets the SDPA/mask patches torch_step needs)

transformers.masking_utils.find_packed_sequence_indices = lambda position_ids: None


# ---- TRL's head, on its CUDA branches ------------------------------------------------------------

def trl_cuda_branches():
    """The three device tests of trl 1.16.0's chunked log-prob head set as CUDA sets them (module doc)."""
    import trl.kernels.chunked_logprob as ck
    import trl.trainer.utils as tu

    class _NoLaunch:  # a Triton kernel's grid launcher: the kernel writes in place, allocates nothing
        def __getitem__(self, grid):
            return lambda *a, **k: None

    ck._use_triton = lambda device: True
    tu._use_triton = lambda device: True
    ck._forward_kernel = _NoLaunch()
    ck._backward_kernel = _NoLaunch()
    ck._addmm_fp32 = lambda acc, a, b: None
    if not hasattr(ck, "triton"):
        ck.triton = types.SimpleNamespace(cdiv=lambda a, b: -(-a // b))
    return tu.add_fused_lm_head


# ---- Liger's fused linear cross-entropy, re-implemented for its CUDA allocations -------------------

def _next_pow2(n):
    return 1 << (n - 1).bit_length() if n > 1 else 1


class Tracker(LiveTracker):
    """torch_step.LiveTracker that also answers the two data-dependent shapes TRL's gather asks
    for under fake tensors (FakeTensorMode has no values): aten.nonzero of the label mask and
    aten.masked_select by it (MaskedScatterBackward0) get the count of kept labels the bench set
    (`kept`), which is what CUDA would compute from the real labels."""

    kept = 0

    def _nonzero(self, mask):
        """What aten.nonzero(mask) allocates (kept x mask.dim() int64): counted, then dropped."""
        t = torch.empty((self.kept, mask.dim()), dtype=torch.int64, device=mask.device)
        self.add(t, "nonzero")
        return t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.nonzero.default:
            return self._nonzero(args[0])
        bools = [i for i in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ())
                 if isinstance(i, torch.Tensor) and i.dtype == torch.bool]
        if func is torch.ops.aten.index.Tensor and bools:
            # x[mask]: the mask's nonzero indices (a transient), then the gathered rows
            src, mask = args[0], bools[0]
            idx = self._nonzero(mask)
            out = torch.empty((self.kept,) + tuple(src.shape[mask.dim():]), dtype=src.dtype, device=src.device)
            self.add(out, "index")
            del idx
            return out
        if func in (torch.ops.aten.index_put_.default, torch.ops.aten._index_put_impl_.default) and bools:
            idx = self._nonzero(bools[0])  # in place: only the indices are made
            del idx
            return args[0]
        if func is torch.ops.aten.masked_select.default:
            out = torch.empty((self.kept,), dtype=args[0].dtype, device=args[0].device)
            self.add(out, "masked_select")
            return out
        return super().__torch_dispatch__(func, types, args, kwargs)


@functools.lru_cache(maxsize=None)
def inplace_sums():
    """Tracker with inplace_tracker.InplaceTracker's gradient sums: where autograd meets two
    gradients of one tensor it counts what plain PyTorch (and CUDA) does, in place when the buffered
    gradient can be reused, not the out-of-place sum every TorchDispatchMode forces
    (input_buffer.cpp accumulate, isTensorSubclassLike).  The cce and torchtune rows are measured
    with it (INPLACE_LOSSES): torchtune sums eight weight gradients, and a fused head's weight
    gradient meets the tied embedding's; the older rows keep the plain Tracker (remeasure_rows.py
    moves a row over).  RealTracker's bool-index branch (it reads mask values) is skipped: neither
    head indexes by a mask.  (A function: inplace_tracker imports this module.)"""
    import inplace_tracker

    class InplaceSums(inplace_tracker.InplaceTracker, Tracker):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            if self._acc_node is None or func is not torch.ops.aten.add.Tensor:
                self._settle()
                return Tracker.__torch_dispatch__(self, func, types_, args, kwargs)
            return inplace_tracker.InplaceTracker.__torch_dispatch__(self, func, types_, args, kwargs)

    return InplaceSums


INPLACE_LOSSES = ("cce", "torchtune")


class LigerFLCE(torch.autograd.Function):
    """liger-kernel 0.8.5 LigerFusedLinearCrossEntropyFunction (reduction "sum", no bias, no z-loss)
    on CUDA, allocation by allocation; line numbers are ops/fused_linear_cross_entropy.py's."""

    @staticmethod
    def forward(ctx, x, w, target):
        bt, h = x.shape
        v = w.shape[0]
        inc = -(-v // h)                                  # :103 triton.cdiv(V, chunk_mem_const * H)
        chunk = min(_next_pow2(-(-bt // inc)), bt)        # :104-105
        grad_input = torch.zeros_like(x)                  # :108
        grad_weight = torch.zeros_like(w) if w.requires_grad else None  # :116 (accum_dtype None)
        loss_1d = torch.zeros(bt, dtype=torch.float32)    # :125
        target_mask = target != -100                      # :131 (.sum().item(): a scalar)
        ac = torch.is_autocast_enabled("cpu")             # stands for CUDA's autocast here
        # _can_use_mm_out (:33-48): grad mode is off inside Function.forward
        mm_out = x.dtype == w.dtype and (not ac or x.dtype == torch.get_autocast_dtype("cpu"))
        logits_storage = torch.empty((chunk, v), dtype=x.dtype) if mm_out else None  # :150-154
        for s in range(0, bt, chunk):
            e = min(s + chunk, bt)
            xc = x[s:e]
            if mm_out:
                logits = logits_storage[: e - s]
                torch.mm(xc, w.t(), out=logits)           # :164
            else:
                logits = xc @ w.t()                       # :168 (autocast: copies of xc and w)
            # :216 liger_cross_entropy_kernel writes the logits' gradient into logits in place
            if mm_out and logits.dtype == grad_input.dtype:
                torch.mm(logits, w, out=grad_input[s:e])  # :320
            else:
                grad_input[s:e] = logits @ w              # :322
            if grad_weight is not None:
                if grad_weight.dtype == torch.float32 and logits.dtype in (torch.bfloat16, torch.float16):
                    xcc = xc if xc.dtype == logits.dtype else xc.to(logits.dtype)  # :338-340
                    # :341-347 torch.addmm(grad_weight, logits.t(), xcc, out_dtype=fp32, out=grad_weight):
                    # in place on CUDA (no CPU kernel for out_dtype): nothing allocated
                    del xcc
                elif logits.dtype in (torch.bfloat16, torch.float16) and grad_weight.dtype == logits.dtype:
                    torch.addmm(grad_weight, logits.t(), xc, out=grad_weight)     # :364-369
                else:
                    grad_weight += torch.mm(logits.t(), xc).float()               # :375
            del logits, xc
        del logits_storage
        loss = torch.sum(loss_1d)                          # :402 (reduction "sum")
        ctx.save_for_backward(grad_input, grad_weight)     # :574-578
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        grad_input, grad_weight = ctx.saved_tensors
        # :420-448: element_mul_kernel scales both in place (grad_output != 1: the loss is divided)
        grad_input.mul_(grad_output)
        if grad_weight is not None:
            grad_weight.mul_(grad_output)
        return grad_input, grad_weight, None


def liger_loss(model, ids, labels):
    """transformers' use_liger_kernel path for the loss only: the backbone's hidden states, then
    LigerForCausalLMLoss (liger transformers/model/loss_utils.py:67-106): labels padded by one
    (:87), shifted into a contiguous copy (:88), hidden states viewed as BT x h (:91); reduction
    "sum" divided by the token count (fixed_fused_linear_cross_entropy :42-59)."""
    base = model.get_base_model() if isinstance(model, peft.PeftModel) else model
    out = base.model(input_ids=ids, use_cache=False)
    hidden = out[0]
    padded = torch.nn.functional.pad(labels, (0, 1), value=-100)
    shift = padded[..., 1:].contiguous()
    h = hidden.view(-1, hidden.shape[-1])
    loss = LigerFLCE.apply(h, base.lm_head.weight, shift.view(-1))
    return loss / ids.numel()


# ---- Cut Cross-Entropy (Axolotl's fork), re-implemented for its CUDA allocations ----------------

class CCEFunction(torch.autograd.Function):
    """Cut Cross-Entropy's LinearCrossEntropyFunction as Axolotl 0.19 runs it (fork
    axolotl-ai-cloud/ml-cross-entropy, read at 5f0c7a7; impl "cce", filter_eps "auto", no fp32
    accumulation, shift 1), allocation by allocation; line numbers are cut_cross_entropy/'s.  The
    Triton kernels (the LSE pass, the indexed dot, the backward) write their outputs in place and
    allocate nothing: they are not run (fake tensors have no values)."""

    @staticmethod
    def forward(ctx, e, c, targets, valids):
        n, v = valids.numel(), c.shape[0]
        # cce.py:56-57: needs_grad and filter_eps "auto" -> the logit averages are returned
        lse = e.new_full((n,), -float("inf"), dtype=torch.float32)          # cce_lse_forward.py:196
        locks = e.new_full((-(-n // 128),), 0, dtype=torch.int32)          # :197-201 (uint32 there)
        logit_avg = e.new_full((v,), 0.0, dtype=torch.float32)             # :204
        del locks                                                           # dies as the call returns
        neg_dot = e.new_zeros((n,), dtype=torch.float32)                    # indexed_dot.py:123
        neg_dot = neg_dot.to(torch.float32)                                 # :156 (itself)
        nll = neg_dot.add_(lse)                                             # cce.py:120
        loss = nll.sum()                                                    # :126 (reduction "sum")
        ctx.save_for_backward(e, c, lse, targets, valids, logit_avg)        # :132
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        e, c, lse, targets, valids, logit_avg = ctx.saved_tensors
        vocab_ordering = torch.argsort(logit_avg).to(torch.int32)           # cce.py:42-44, :143-144
        grad_out = grad_out.contiguous()                                    # cce_backward.py:358-359
        de = torch.zeros_like(e) if ctx.needs_input_grad[0] else None       # :363-364 (e's dtype)
        dc = torch.zeros_like(c) if ctx.needs_input_grad[1] else None       # :366-367
        nd = -(-c.shape[1] // 64)                                           # :422
        de_locks = e.new_zeros((-(-valids.numel() // 128), nd), dtype=torch.int32) if de is not None else None
        dc_locks = c.new_zeros((-(-c.shape[0] // 128), nd), dtype=torch.int32) if dc is not None else None
        del de_locks, dc_locks, vocab_ordering                              # the kernel ran: they go
        return de, dc, None, None                                           # :481-485: .to() no copy


def cce_loss(model, ids, labels):
    """The patched forward (transformers/llama.py:62-78) and apply_lce (transformers/utils.py:97-165):
    the backbone's hidden states whole, lm_head.weight, shift=True; the Trainer's
    num_items_in_batch makes the reduction "sum" divided after.  cce.py:263-294 with
    utils.py:25-46 (_build_flat_valids) as they run."""
    base = model.get_base_model() if isinstance(model, peft.PeftModel) else model
    hidden = base.model(input_ids=ids, use_cache=False)[0]
    e = hidden[:, slice(-0, None), :].contiguous()                          # llama.py:73; cce.py:265
    targets = labels.contiguous()                                           # cce.py:266
    t = targets[..., 1:]                                                    # utils.py:31-32 (shift 1)
    valids = (t != -100).nonzero().to(torch.int32)                          # :35
    valids[:, 0] *= t.stride(0)                                             # :41-42
    valids = valids.sum(1)                                                  # :46 (int64)
    loss = CCEFunction.apply(e.flatten(0, -2), base.lm_head.weight, targets.flatten(), valids)
    return loss / ids.numel()                                               # utils.py:162-163


# ---- torchtune's LinearCrossEntropyLoss, re-implemented (it runs on torchtune's own models) ------

def torchtune_lce(outputs, targets, weight, chunks=8):
    """LinearCrossEntropyLoss.forward (:147-188), mask_inputs (:117-145) and compute_cross_entropy
    (:87-115) as they allocate; `outputs` is the caller's tensor (the recipe still holds it)."""
    total_valid = torch.where(targets != -100)[0].numel()                  # :160
    targets = targets.reshape(-1)                                           # :171
    outputs = outputs.reshape(-1, outputs.shape[-1])                        # :172
    indices = torch.where(targets != -100)[0]                               # mask_inputs :132
    outputs = outputs.index_select(0, indices)                              # :142
    targets = targets.index_select(0, indices)                              # :144
    del indices
    total = torch.tensor(0.0)                                               # :180
    for hc, tc in zip(outputs.tensor_split(chunks, dim=0), targets.tensor_split(chunks, dim=0)):
        logits = torch.nn.functional.linear(hc, weight)                     # :107
        loss = torch.nn.functional.cross_entropy(logits.float(), tc, reduction="sum", ignore_index=-100)
        del logits                                                          # the function returns
        total += loss                                                       # :186
    return total / total_valid                                              # :188


def torchtune_loss(model, ids, labels, chunks=8):
    """torchtune main (bd2a0fc) modules/loss/cross_entropy_loss.py LinearCrossEntropyLoss.forward
    (:147-188) with its defaults (8 chunks, mask_ignored_tokens), on the backbone's final-norm
    output (set_model_output: skip_output_layer); the labels as torchtune's dataset shifts them
    (datasets/_sft.py:166-175: labels[1:] then -100), and recipes/full_finetune_single_device.py's
    _loss_step (the loss times the token count, the model output dropped after the loss)."""
    base = model.get_base_model() if isinstance(model, peft.PeftModel) else model
    weight = base.lm_head.weight
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
    num_tokens = (targets != -100).sum()                                    # the recipe's loss factor
    outputs = base.model(input_ids=ids, use_cache=False)[0]                 # _loss_step's `outputs`
    loss = torchtune_lce(outputs, targets, weight, chunks)
    del outputs                                                             # "free outputs" (_loss_step)
    return loss * num_tokens


# ---- the step ----------------------------------------------------------------------------------

def build(cfg_path, precision, lora):
    with open(cfg_path) as f:
        d = json.load(f)
    cfg = transformers.AutoConfig.for_model(**d)
    cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if precision in ("bf16", "bf16-amp") else torch.float32
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        if lora:
            model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                               target_modules="all-linear", task_type="CAUSAL_LM"))
    with fake:
        model.to_empty(device="cpu")
        (model.get_base_model() if lora else model).tie_weights()
    model.train()
    return model, fake, cfg


def torch_step(cfg_path, batch, seq, precision, ckpt, lora, loss, frac):
    model, fake, cfg = build(cfg_path, precision, lora)
    if loss == "chunked-nll":
        add_fused_lm_head = trl_cuda_branches()
        # SFTTrainer (trl 1.16.0 sft_trainer.py:1142-1147): on the base model, with these outputs
        add_fused_lm_head(model.get_base_model() if lora else model, outputs=("log_probs", "entropy", "is_top1"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    tr = (inplace_sums() if loss in INPLACE_LOSSES else Tracker)()
    with fake, tr:
        for n, m in model.named_modules():
            if n.count(".") <= 4:
                m.register_forward_pre_hook(functools.partial(_set_module, tr, n or "model"))
        if ckpt == "layers":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for p in model.parameters():
            tr.add(p, "param")
        for b in model.buffers():
            tr.add(b, "buffer")
        ids = torch.randint(0, cfg.vocab_size, (batch, seq))
        labels = ids.clone()
        k = seq - math.ceil(frac * (seq - 1)) if frac < 1 else 0
        if k:
            labels[:, :k] = -100  # prompt masking: s - k kept label positions per row after the shift
        tr.kept = batch * (seq - max(k, 1))
        opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
        for step in (1, 2):
            if step == 2:
                for st in opt.state.values():
                    if "step" in st and isinstance(st["step"], torch.Tensor):
                        tr.forget(st["step"])
                gc.collect()
                tr.peak, tr.peak_at = tr.cur, "step-start"
            tr.phase = "forward"
            ac = torch.autocast("cpu", dtype=torch.bfloat16) if precision in ("amp-bf16", "bf16-amp") else None
            if ac:
                ac.__enter__()
            if loss == "hf":
                l = model(input_ids=ids, labels=labels, use_cache=False).loss
            elif loss == "chunked-nll":
                out = model(input_ids=ids, labels=labels, use_cache=False, fused_lm_head=True)
                l = out.loss
                del out  # compute_loss returns the loss; the outputs go
            elif loss == "cce":
                l = cce_loss(model, ids, labels)
            elif loss == "torchtune":
                l = torchtune_loss(model, ids, labels)
            else:
                l = liger_loss(model, ids, labels)
            if ac:
                ac.__exit__(None, None, None)
            tr.phase = "backward"
            l.backward()
            del l
            gc.collect()
            tr.phase = "optimizer.step"
            opt.step()
            opt.zero_grad(set_to_none=True)
            gc.collect()
    return tr.peak, tr.peak_at


def _set_module(tr, name, module, args):
    tr.module = name


# Rows more than 1 % off (the target) are kept and said (rowlib's `disagrees`), by where torch peaks.
WHY = [("MmBackward0", "the step's peak is the last checkpointed block's recompute and backward (a LoRA "
                       "lora_A MmBackward0), where memplan is low (issue 26 item 5, fixed separately); the "
                       "loss head's own moment is below it"),
       ("PowBackward0", "the step's peak is the final RMSNorm's backward (PowBackward0): HF's composite "
                        "RMSNorm makes fp32 b x s x h temporaries in backward that lower_rmsnorm does not "
                        "model (it has no bwd_tmp); the head's own moment is below it")]


WHY.append(("forward:head.lm_head.torchtune",
            "memplan's peak is the head's forward, where its replay still holds the last decoder layer's "
            "b x s x h bf16 output (the chain's hold through the head block); HF drops it once the final "
            "RMSNorm has made its fp32 copy (LlamaModel.forward: hidden_states = self.norm(hidden_states)); "
            "torch's peak is the head's backward (-0.000 % there)"))


def why_off(torch_at):
    return next((w for k, w in WHY if k in torch_at), "not explained yet")


def memplan_args(batch, seq, precision, ckpt, lora, loss, frac):
    a = ["--batch", str(batch), "--seq", str(seq), "--precision", precision, "--checkpoint", ckpt,
         "--workspace", "0", "--use-cache", "off", "--json", "--loss", loss]
    if frac < 1:
        a += ["--label-fraction", repr(frac)]
    if lora:
        a += ["--finetune", "lora", "--lora-r", "16", "--lora-targets", "all-linear"]
    return a


def memplan_peak(memplan, cfg_path, args):
    r = subprocess.run([memplan, "estimate", cfg_path] + args, capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise RuntimeError(r.stderr.strip())
    m = json.loads(r.stdout)["memory"]
    return m["peak_allocated_bytes"] - m["workspace_bytes"], m["peak_event"]


CONFIGS = {"1b": "models/hf/llama-3.2-1b.json", "8b": "models/hf/llama-3-8b.json"}
# head rows: the config's hidden size and vocabulary (the head's shape) with one decoder layer whose
# MLP is narrow (intermediate_size 256), so that the step's peak is the loss head's own
HEAD_MLP = 256


def head_config(d):
    d = dict(d)
    d["intermediate_size"] = HEAD_MLP
    return d
# (head config, batch, seq, precision, checkpoint, lora, loss, label fraction, decoder layers)
LOSSES = ("hf", "chunked-nll", "liger")
SETTINGS = [(False, 1, s, "bf16", "layers", True, loss, 1.0, 2) for s in (2048, 8192) for loss in LOSSES]
SETTINGS += [(False, 1, 2048, "bf16", "layers", True, "chunked-nll", 0.5, 2)]
SETTINGS += [(False, 1, 2048, "amp-bf16", "none", False, loss, 1.0, 2) for loss in LOSSES]
SETTINGS += [(True, 1, 8192, p, "none", True, loss, 1.0, 1) for p in ("bf16", "amp-bf16") for loss in LOSSES]
SETTINGS += [(True, 1, 8192, "amp-bf16", "none", True, "chunked-nll", 0.5, 1)]
# Cut Cross-Entropy (Axolotl: bf16 weights, the Trainer's bf16 autocast: bf16-amp; fp32 weights fail
# its backward) and torchtune's LinearCrossEntropyLoss (torchtune: no autocast, bf16 weights)
for loss, full in (("cce", "bf16-amp"), ("torchtune", "bf16")):
    SETTINGS += [(False, 1, s, "bf16", "layers", True, loss, 1.0, 2) for s in (2048, 8192)]
    SETTINGS += [(False, 1, 2048, "bf16", "layers", True, loss, 0.5, 2)]
    SETTINGS += [(False, 1, 2048, full, "none", False, loss, 1.0, 2)]
    SETTINGS += [(True, 1, 8192, p, "none", True, loss, f, 1) for p in sorted({"bf16", full}) for f in (1.0, 0.5)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memplan", default="./memplan")
    ap.add_argument("--only", default="1b,8b")
    ap.add_argument("--quick", action="store_true", help="seq 2048 rows only")
    ap.add_argument("--losses", default=None, help="only these heads (comma-separated)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rows-out", default=os.path.join(rowlib.ROWS_DIR, "loss_heads.jsonl"))
    a = ap.parse_args()
    import trl
    versions = rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                   peft=peft.__version__, trl=trl.__version__, liger="0.8.5 (re-implemented)",
                                   cce="axolotl-ai-cloud/ml-cross-entropy 5f0c7a7 (re-implemented)",
                                   torchtune="main bd2a0fc (re-implemented)",
                                   fake="FakeTensorMode, CPU")
    lines = ["| config | layers | setting | loss | torch peak (MiB) | at | memplan (MiB) | at | diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in a.only.split(","):
            src = CONFIGS[key]
            for (head, b, s, prec, ck, lora, loss, frac, layers) in SETTINGS:
                if (a.quick and s > 2048) or (a.losses and loss not in a.losses.split(",")):
                    continue
                d = rowlib.load_config(os.path.join(ROOT, src), layers)
                if head:
                    d = head_config(d)
                path = os.path.join(tmp, "%s-%d%s.json" % (key, layers, "-head" if head else ""))
                with open(path, "w") as f:
                    json.dump(d, f)
                tp, tat = torch_step(path, b, s, prec, ck, lora, loss, frac)
                args = memplan_args(b, s, prec, ck, lora, loss, frac)
                mp, mat = memplan_peak(a.memplan, path, args)
                pct = 100.0 * (mp - tp) / tp
                setting = "%s%s, %s, ckpt %s, b%d s%d%s" % ("LoRA all-linear r16" if lora else "full", "", prec, ck,
                                                            b, s, ", F %g" % frac if frac < 1 else "")
                lines.append("| %s%s | %d | %s | %s | %.2f | %s | %.2f | %s | %+.3f %% |" % (
                    os.path.basename(src), " (head: MLP %d)" % HEAD_MLP if head else "", layers, setting, loss, tp / 2**20, tat, mp / 2**20, mat, pct))
                print(lines[-1], flush=True)
                row = {"config": src, "max_layers": layers} if not head else {
                    "config": "%s, one layer, intermediate_size %d (loss_heads.py head_config)" % (src, HEAD_MLP),
                    "config_json": d}
                fig = rowlib.figure(tp, mp)
                mark = {}
                if abs(pct) > 1.0:  # the target: kept and said, its tolerance not widened
                    fig = {"torch": int(tp), "extra": 0, "abs": 0, "pct": 1.0}
                    mark = {"disagrees": {"memplan": {"peak": int(mp)}, "why": why_off(tat),
                                          "seen": versions["memplan"]}}
                if 0.5 < abs(pct) <= 1.0:
                    mark = {"explained": why_off(tat if tp > mp else mat)}
                v = dict(versions, tracker="InplaceTracker sums (loss_heads.inplace_sums)") \
                    if loss in INPLACE_LOSSES else versions
                rows.append(dict(row, **mark, **{"args": args,
                             "figures": {"peak": fig},
                             "recorded": {"peak_mib": round(mp / 2**20, 2), "torch_peak_at": tat, "memplan_peak_at": mat},
                             "source": "bench/accuracy/loss_heads.py (run %s)" % versions["memplan"],
                             "versions": v}))
    out = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(out)
    rowlib.save_rows("loss_heads", rows, a.rows_out)


if __name__ == "__main__":
    main()
