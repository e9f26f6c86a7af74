#!/usr/bin/env python3
"""torch_step.py - the whole training step's memory, PyTorch against memplan (CPU, fake tensors).

For each Hugging Face config (models/hf/*.json, one or more per model_type memplan accepts) and
each setting (precision fp32 / amp-bf16 / bf16, attention sdpa / eager, checkpointing none /
layers, or layers:N with --every-n-layers N, AdamW or SGD with momentum, batch x sequence), the model is built and trained for two
steps under torch._subclasses.fake_tensor.FakeTensorMode on the CPU: tensors have shapes, dtypes
and storages but no data, so a 70B model costs no memory.  Step 2 is measured (step 1 creates the
optimizer state): forward with labels, backward, optimizer.step() (foreach, the CUDA default),
zero_grad(set_to_none=True).  Checkpointing is transformers' own:
gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}).

--offload: the checkpointing rows run transformers' activation_checkpointing_enable(offload=True)
(memplan --checkpoint layers[:N]+offload), with save_on_cpu replaced by CudaSaveOnCpu: on this
GPU-less host, fake CUDA tensors cannot run a backward (the autograd engine asks for a CUDA
device), so the host copy and the device copy are told apart by hand, as save_on_cpu's CUDA path
makes them (see CudaSaveOnCpu); --vocab N shrinks the vocabulary so the peak can leave the loss.

Measured:
  * LiveTracker, a TorchDispatchMode: every storage an op creates is counted, rounded up to 512 B
    as CUDA's caching allocator counts memory_allocated, until a weakref finalizer sees it die.
    Parameters, buffers and optimizer state are registered too, so the running total is what
    torch.cuda.memory_allocated() would say, and its maximum over step 2 is the step's peak
    (max_memory_allocated), with the op, the autograd node and the module where it happens.
  * SavedTracker, torch.autograd.graph.saved_tensors_hooks: what autograd saves for backward,
    deduplicated by storage, parameters and buffers excluded (no checkpointing only: the
    checkpoint installs its own hooks inside).
  * the live activations when backward starts: live bytes after the forward minus live bytes at
    the step's start (parameters, buffers, optimizer state, input ids and labels).

memplan: `memplan estimate CONFIG --batch B --seq S --precision P --optimizer O --attention A
--checkpoint C --json` on the same config file: memory.peak_allocated_bytes minus the cuBLAS
workspace (no CUDA here), memory.activations_bytes, the sum of layers[].activation_bytes.

Settings common to every run: dropout probabilities set to 0 in the config both sides read (CPU
dropout keeps an input-dtype mask where CUDA keeps a 1-byte one), use_cache=False both sides
(memplan --use-cache off) unless --use-cache is given (then use_cache=True and --use-cache on:
transformers fills a DynamicCache during training; gradient checkpointing turns it off),
model.train(), labels = input ids.  Two gotchas: transformers treats fake tensors as tracing and
would build a full 4-D causal mask, so find_packed_sequence_indices returns None (what real
unpacked inputs get); AdamW keeps its `step` counters on the CPU on CUDA too, so they are not
counted.  A dropout that does run (peft's lora_dropout in peft_step.py recompute) goes through
aten's native_dropout, CUDA's kernel and its bool mask (_dropout_cuda_kernel).

Import it to reuse the trackers (LiveTracker, SavedTracker, fake_model, train_steps); run it as
  python3 bench/accuracy/torch_step.py [--memplan ./memplan] [--out FILE.md] [--quick] [--only TYPE,...]
      [--attention all|sdpa|eager]
from the repository root.
"""
import argparse
import collections
import functools
import gc
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import weakref

import torch
import transformers
import transformers.masking_utils
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

ROUND = 512


def round512(n):
    return 0 if n == 0 else (n + ROUND - 1) // ROUND * ROUND


# Real (non-packed) inputs make transformers skip the mask; fake tensors look like tracing to it.
# --packing / --padding-free restore transformers' own function: under fake tensors it returns the
# (b, s) document indices, as it does for real packed position ids (masking_utils.py:735-764).
_FIND_PACKED = transformers.masking_utils.find_packed_sequence_indices
transformers.masking_utils.find_packed_sequence_indices = lambda position_ids: None
# trunc_normal_ initialisation (ViT) asks the data (mask.any()), which fake tensors do not have;
# values do not matter here
torch.nn.init._no_grad_trunc_normal_ = lambda tensor, *a, **k: tensor

_SDPA = torch.nn.functional.scaled_dot_product_attention


def _sdpa_cuda_kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """SDPA with CUDA's kernel where the CPU's differs.  q/k and v head widths that differ
    (DeepSeek's multi-head latent attention: 192 and 128) rule out flash on both; the CPU then runs
    the math path, which saves the s x s probabilities, where CUDA runs the memory-efficient
    kernel.  Its aten op has a meta function, so under fake tensors it gives that kernel's
    tensors: the output (b, s, a, dv) in memory, an fp32 logsumexp (b, a, s rounded up to 32),
    q, k, v and the output saved.  Listed in torch_step_results.md."""
    t5_mask = CUDA_FLOAT_MASK and attn_mask is not None and attn_mask.is_floating_point()
    if (query.shape[-1] != value.shape[-1] or t5_mask) and not kw.get("enable_gqa"):
        if torch.is_autocast_enabled("cpu"):  # SDPA is on autocast's half list; the aten op is not
            dt = torch.get_autocast_dtype("cpu")
            query, key, value = query.to(dt), key.to(dt), value.to(dt)
            if attn_mask is not None and attn_mask.is_floating_point():
                attn_mask = attn_mask.to(dt)  # CUDA autocast casts every floating argument
        if t5_mask:  # CUDA's preprocess_mask: the bias expanded to (b, a, q, k) (a view)
            attn_mask = attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, query.requires_grad or key.requires_grad or value.requires_grad,
            dropout_p, is_causal, scale=scale)[0]
    return _SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)


torch.nn.functional.scaled_dot_product_attention = _sdpa_cuda_kernel

_DROPOUT = torch.nn.functional.dropout


def _dropout_cuda_kernel(input, p=0.5, training=True, inplace=False):
    """Dropout with CUDA's kernel.  at::dropout (aten/src/ATen/native/Dropout.cpp, torch 2.15) runs
    the fused native_dropout only where is_fused_kernel_acceptable holds (CUDA, XPU, lazy,
    PrivateUse1; 0 < p < 1): it keeps a bool mask (NativeDropoutBackward0 saves result1, 1 byte an
    element).  On the CPU it composes bernoulli_ and a multiply instead, whose MulBackward0 keeps
    the noise in the input's dtype (4 bytes an element for peft's fp32 adapter input).  memplan
    plans CUDA, so the bench runs aten's native_dropout (it has a CPU kernel and a meta function)
    where CUDA would; p = 0 and eval are untouched (dropout returns its input)."""
    if training and 0.0 < p < 1.0 and not inplace and input.numel() > 0:
        return torch.ops.aten.native_dropout(input, p, True)[0]
    return _DROPOUT(input, p, training, inplace)


torch.nn.functional.dropout = _dropout_cuda_kernel


def _nemotron_cast_like_cuda(device_type, *args):
    """Nemotron's LayerNorm1P casts x, weight + 1 and bias to the autocast dtype and runs the norm
    there when torch.is_autocast_enabled() says so: that asks CUDA's autocast, never the CPU's,
    so on the CPU the norm stays fp32 while on CUDA it runs in bf16.  memplan plans the CUDA path;
    here the device's own autocast is asked, which makes the casts CUDA makes.  Listed in
    torch_step_results.md."""
    if not torch.is_autocast_enabled(device_type):
        return args
    return torch.amp.autocast_mode._cast(args, device_type, torch.get_autocast_dtype(device_type))


try:
    import transformers.models.nemotron.modeling_nemotron as _nemotron
    _nemotron._cast_if_autocast_enabled = _nemotron_cast_like_cuda
except ImportError:  # a transformers without Nemotron
    pass
# T5 (set per config by main): a float attn_mask (its position bias) sends CUDA to the memory-
# efficient kernel, which computes the mask's gradient; the CPU runs the math path when the mask
# needs a gradient and its flash kernel otherwise.  The aten op gives CUDA's tensors here.
CUDA_FLOAT_MASK = False


# ---- trackers ---------------------------------------------------------------------------------

class LiveTracker(TorchDispatchMode):
    """Live storages as the CUDA caching allocator counts them (512-byte rounded), their peak
    and where it happens.  Register pre-existing tensors (parameters, buffers, inputs) with
    add(); everything an op creates while the mode is active is added automatically."""

    def __init__(self, snapshot=False):
        super().__init__()
        self._refs = WeakIdKeyDictionary()    # storage -> (weakref with finalizer, bytes, label)
        self.snapshot = snapshot              # keep what is live at each new peak (peak_live)
        self.peak_live = []
        self.cur = 0
        self.peak = 0
        self.peak_at = ""
        self.phase = "setup"                 # set by the caller: forward, backward, ...
        self.module = ""                     # set by forward pre-hooks (module names)

    def add(self, t, label="tensor"):
        if not isinstance(t, torch.Tensor):
            return
        st = t.untyped_storage()
        if st in self._refs:
            return
        n = round512(st.nbytes())
        node = torch._C._current_autograd_node()
        where = node.name() if node is not None else self.module
        if self.snapshot:
            label = "%s %s %s @%s %s" % (label, str(t.dtype).replace("torch.", ""), tuple(t.shape), self.phase, where)
        self._refs[st] = (weakref.ref(st, functools.partial(self._gone, n)), n, label)
        self.cur += n
        if self.cur > self.peak:
            self.peak = self.cur
            self.peak_at = "%s:%s%s" % (self.phase, label.split(" ")[0], " (%s)" % where if where else "")
            if self.snapshot:
                self.peak_live = sorted(((e[1], e[2]) for e in self._refs.values()), reverse=True)

    def forget(self, t):
        """Stop counting t's storage (e.g. tensors that live on the CPU on CUDA too)."""
        st = t.untyped_storage()
        e = self._refs.pop(st, None)
        if e is not None:
            self.cur -= e[1]

    def reset_peak(self):
        self.peak = self.cur
        self.peak_at = self.phase

    def live(self):
        """[(bytes, label, storage)] of the storages alive now."""
        return [(e[1], e[2], st) for st, e in list(self._refs.items())]

    def _gone(self, n, _ref):
        self.cur -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.add(t, func.overloadpacket.__name__)
        return out


class SavedTracker:
    """Storages autograd saves for backward (saved_tensors_hooks), deduplicated by storage;
    `exclude` storages (parameters, buffers) are not counted.  Use as a context manager."""

    def __init__(self, exclude=()):
        self._ex = WeakIdKeyDictionary()
        for t in exclude:
            self._ex[t.untyped_storage()] = True
        self._saved = WeakIdKeyDictionary()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        st = t.untyped_storage()
        if st not in self._ex and st not in self._saved:
            self._saved[st] = st.nbytes()
        return t

    def bytes_alive(self):
        return sum(self._saved.values())

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *a):
        return self._hooks.__exit__(*a)


# ---- the model and the step -----------------------------------------------------------------

# the config both sides read, and the bytes CUDA keeps beyond the CPU run: rowlib.py (stdlib only,
# shared with tests/replay_accuracy.py)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rowlib  # noqa: E402
from rowlib import LAYER_KEYS, T5_TYPES, cuda_only_bytes, load_config  # noqa: E402


def llama4_output_fix(config_dict):
    """transformers 5.24's Llama4ForConditionalGeneration.forward ends with
    image_outputs=outputs.image_outputs, read from its language model's MoeCausalLMOutputWithPast, which
    has no such field (modeling_llama4.py:1318): every step raises AttributeError after the loss
    (return_dict=False fails in capture_outputs instead).  A None default lets the step run; it makes
    and keeps no tensor (docs/memory-facts.md#llama4)."""
    if config_dict.get("model_type") == "llama4":
        transformers.modeling_outputs.MoeCausalLMOutputWithPast.image_outputs = None


def fake_model(config_dict, precision, attention, fake):
    """The model of config_dict (class from architectures[0]) built under `fake`."""
    llama4_output_fix(config_dict)
    cfg = transformers.AutoConfig.for_model(**config_dict)
    cfg._attn_implementation = attention
    arch = (config_dict.get("architectures") or ["AutoModelForCausalLM"])[0]
    cls = getattr(transformers, arch, None) or transformers.AutoModelForCausalLM
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32  # never the config's torch_dtype
    with fake:
        model = cls._from_config(cfg, dtype=dtype)
    assert all(p.dtype == dtype for p in model.parameters())
    model.train()
    return model


def _pow2(n):
    return 1 << max(n - 1, 0).bit_length()


class CudaSaveOnCpu(torch.autograd.graph.saved_tensors_hooks):
    """torch.autograd.graph.save_on_cpu(pin_memory=True) as it runs on a CUDA device (torch 2.15
    autograd/graph.py:440-458), on this GPU-less host where host and device are the same memory.
    pack: an empty host tensor of the same size and dtype and a copy_ into it (graph.py:447-454):
    the copy is taken off the LiveTracker (it is not device memory) and counted in tr.host_packed,
    rounded up to a power of two as the pinned host caching allocator does (include/ATen/core/
    CachingHostAllocator.h:343-352).  unpack: `.to(device)` (graph.py:456-458) makes a new device
    tensor on CUDA, where on the CPU it would return the host tensor itself: a clone, counted."""

    def __init__(self, tr):
        def pack(t):
            p = torch.empty(t.size(), dtype=t.dtype, layout=t.layout)
            p.copy_(t)
            tr.forget(p)
            tr.host_packed += _pow2(p.untyped_storage().nbytes())
            tr.host_packs += 1
            return p

        def unpack(p):
            return p.clone()
        super().__init__(pack, unpack)


def backward_and_step(tr, loss, opt):
    """loss.backward(), then opt.step() and zero_grad(set_to_none=True), each phase named in tr (the
    caller passes its only reference to loss: it dies before the step)."""
    tr.phase = "backward"
    loss.backward()
    del loss
    gc.collect()
    tr.phase = "optimizer.step"
    opt.step()
    opt.zero_grad(set_to_none=True)
    gc.collect()


def train_steps(model, tr, batch, seq, precision, optimizer, ckpt, vocab, steps=2, on_backward=None,
                saved=None, use_cache=False, target_seq=0, packing=""):
    """Runs `steps` training steps inside tr (a LiveTracker, already entered with the fake mode).
    Returns a dict of what step `steps` measured.  packing "rows": each of the batch's rows packs
    documents, the collator's int64 position_ids (batch, seq) passed and transformers' own
    find_packed_sequence_indices (so SDPA gets the block-diagonal bool mask); "padding-free": TRL's
    padding-free collator (trl 1.16.0 trainer/sft_trainer.py:186-191): one row of batch x seq tokens,
    its position_ids (1, batch x seq)."""
    offload = ckpt.endswith("+offload")
    if offload:  # transformers' own offload=True path, with save_on_cpu as CUDA runs it
        ckpt = ckpt[:-len("+offload")]
        import transformers.modeling_utils as mu
        mu.save_on_cpu = lambda pin_memory=False, device_type="cuda": CudaSaveOnCpu(tr)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False},
                                              every_n_layers=int(ckpt[7:]) if ckpt.startswith("layers:") else 1,
                                              offload=True)
        ckpt = "offloaded"
    tr.host_packed = tr.host_packs = 0
    if ckpt == "layers":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif ckpt.startswith("layers:"):  # transformers >= 5.24: every N-th decoder layer, the first included
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False},
                                              every_n_layers=int(ckpt[7:]))
    for n, m in model.named_modules():
        if n.count(".") <= 3:
            m.register_forward_pre_hook(functools.partial(_set_module, tr, n or "model"))
    for p in model.parameters():
        tr.add(p, "param")
    for b in model.buffers():
        tr.add(b, "buffer")
    vision = getattr(model, "main_input_name", "input_ids") == "pixel_values"
    if vision:  # ViT: pixel values in the parameters' dtype, one class label per image
        c = model.config
        size = c.image_size if isinstance(c.image_size, (list, tuple)) else (c.image_size, c.image_size)
        ids = torch.randn(batch, c.num_channels, size[0], size[1], dtype=next(model.parameters()).dtype)
        labels = torch.randint(0, max(c.num_labels, 1), (batch,))
    elif getattr(model.config, "is_encoder_decoder", False) and target_seq:
        # T5: labels of the decoder's length; the model shifts them into decoder_input_ids
        ids = torch.randint(0, vocab, (batch, seq))
        labels = torch.randint(0, vocab, (batch, target_seq))
    else:
        ids = torch.randint(0, vocab, (1, batch * seq) if packing == "padding-free" else (batch, seq))
        labels = ids.clone()
    pos = None
    transformers.masking_utils.find_packed_sequence_indices = _FIND_PACKED if packing else (lambda position_ids: None)
    if packing:  # values do not matter under fake tensors: the shapes and the mask path do
        pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1).contiguous()
        tr.add(pos, "position_ids")
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    elif optimizer == "muon":
        opt = MuonAdamW(model)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, foreach=True)
    res = {}
    for step in range(1, steps + 1):
        last = step == steps
        if last:
            for st in opt.state.values():  # AdamW's step counters stay on the CPU on CUDA
                if "step" in st and isinstance(st["step"], torch.Tensor):
                    tr.forget(st["step"])
            gc.collect()
            res["static"] = tr.cur
            tr.host_packed = tr.host_packs = 0
            tr.phase = "step-start"
            tr.reset_peak()
        tr.phase = "forward"
        sv = saved if (last and saved is not None) else None
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "amp-bf16" else _Null()
        if sv:
            sv.__enter__()
        with ctx:
            if vision:
                loss = model(pixel_values=ids, labels=labels).loss
            else:
                kw = {"position_ids": pos} if pos is not None else {}
                loss = model(input_ids=ids, labels=labels, use_cache=use_cache, **kw).loss
        if sv:
            sv.__exit__(None, None, None)
        gc.collect()
        if last:
            res["act_at_backward"] = tr.cur - res["static"]
            res["saved"] = sv.bytes_alive() if sv else None
            res["fwd_peak"] = tr.peak
            res["fwd_peak_at"] = tr.peak_at
        tr.phase = "backward"
        loss.backward()
        del loss
        gc.collect()
        tr.phase = "optimizer.step"
        opt.step()
        opt.zero_grad(set_to_none=True)
        tr.phase = "end"
        gc.collect()
    res["peak"] = tr.peak
    res["peak_at"] = tr.peak_at
    res["host_pinned"] = tr.host_packed  # what the last step's forward packed to the host
    res["host_packs"] = tr.host_packs
    return res


class MuonAdamW:
    """torch.optim.Muon on the hidden layers' 2-D weights, AdamW (foreach) on the rest (embeddings, the
    output layer, norms, biases): Muon's docstring's split, as memplan --optimizer muon plans it and
    its --emit torch builds it; Muon steps first, then AdamW (two optimizers stepped in turn)."""

    def __init__(self, model):
        skip = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        out = model.get_output_embeddings()
        if out is not None:
            skip |= {id(p) for p in out.parameters()}
        params = [p for p in model.parameters() if p.requires_grad]
        hidden = [p for p in params if p.ndim == 2 and id(p) not in skip]
        rest = [p for p in params if p.ndim != 2 or id(p) in skip]
        self.all = [torch.optim.Muon(hidden, lr=0.02), torch.optim.AdamW(rest, lr=1e-4, foreach=True)]
        self.state = collections.ChainMap(*(o.state for o in self.all))

    def step(self):
        for o in self.all:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.all:
            o.zero_grad(set_to_none=set_to_none)


def _set_module(tr, name, module, args):
    tr.module = name


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def measure_torch(config_dict, batch, seq, precision, attention, ckpt, optimizer, use_cache=False, target_seq=0,
                  packing=""):
    fake = FakeTensorMode()
    model = fake_model(config_dict, precision, attention, fake)
    vocab = config_dict.get("vocab_size", 1000)
    tr = LiveTracker()
    params = list(model.parameters()) + list(model.buffers())
    saved = SavedTracker(exclude=params) if ckpt == "none" else None
    with fake, tr:
        return train_steps(model, tr, batch, seq, precision, optimizer, ckpt, vocab, saved=saved,
                           use_cache=use_cache, target_seq=target_seq, packing=packing)


# ---- memplan --------------------------------------------------------------------------------

def measure_memplan(memplan, cfg_path, batch, seq, precision, attention, ckpt, optimizer, use_cache=False,
                    target_seq=0, packing=""):
    cmd = [memplan, "estimate", cfg_path, "--batch", str(batch), "--seq", str(seq), "--precision", precision,
           "--optimizer", optimizer if optimizer in ("sgd-momentum", "muon") else "adamw", "--attention", attention,
           "--checkpoint", ckpt, "--json"]
    if packing:
        cmd += ["--packing" if packing == "rows" else "--padding-free"]
    if target_seq:
        cmd += ["--target-seq", str(target_seq)]
    cmd += ["--use-cache", "on" if use_cache else "off"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode == 2 and "--use-cache" in r.stderr:  # a model without a k/v cache (encoders, ViT)
        cmd = cmd[:-2]
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip(), "cmd": " ".join(cmd)}
    d = json.loads(r.stdout)
    m = d["memory"]
    return {"peak": m["peak_allocated_bytes"] - m["workspace_bytes"], "peak_at": m["peak_event"],
            "act_at_backward": m["activations_bytes"],
            "saved": sum(l["activation_bytes"] for l in d["layers"]),
            "static": m["weights_bytes"] + m["optimizer_bytes"] + m["input_bytes"],
            "host_pinned": m.get("host_pinned_bytes", 0),
            "cmd": " ".join(cmd), "args": cmd[3:]}


# ---- settings and the report -----------------------------------------------------------------

def settings(cfg, quick):
    """(batch, seq, precision, attention, ckpt, optimizer) rows for one config."""
    maxpos = cfg.get("max_position_embeddings") or cfg.get("n_positions") or 2048
    s1 = min(1024, maxpos)
    s2 = min(256, maxpos)
    rows = []
    for prec in ("fp32", "amp-bf16", "bf16"):
        for ck in ("none", "layers"):
            rows.append((2, s1, prec, "sdpa", ck, "adamw"))
    if quick:
        return rows
    # eager attention, SGD with momentum, other shapes; activation-heavy shapes so that the
    # peak is not always the optimizer step
    rows += [(2, s1, "amp-bf16", "eager", "none", "adamw"), (1, s1, "fp32", "eager", "layers", "adamw"),
             (8, s1, "amp-bf16", "sdpa", "layers", "sgd-momentum"), (4, s2, "bf16", "eager", "none", "sgd-momentum"),
             (8, s1, "amp-bf16", "sdpa", "none", "sgd-momentum"), (1, min(2 * s1, maxpos), "bf16", "sdpa", "layers",
                                                                   "sgd-momentum")]
    return rows


def core_settings(cfg):
    """Five rows per config: one per precision, both checkpointing modes, both optimizers,
    sdpa and eager, an activation-heavy batch (what `--rows core` runs)."""
    maxpos = cfg.get("max_position_embeddings") or cfg.get("n_positions") or 2048
    s1, s2 = min(1024, maxpos), min(256, maxpos)
    return [(2, s1, "fp32", "sdpa", "none", "adamw"), (2, s1, "amp-bf16", "sdpa", "layers", "adamw"),
            (8, s1, "amp-bf16", "sdpa", "none", "sgd-momentum"), (4, s2, "bf16", "eager", "none", "sgd-momentum"),
            (1, s1, "bf16", "sdpa", "layers", "sgd-momentum")]


EAGER_ONLY = {"gptj", "gemma2"}  # model types whose attention transformers runs eagerly only


def pct(a, b):
    return 100.0 * (a - b) / b if b else 0.0


def mib(n):
    return "%.1f" % (n / 2**20)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memplan", default="./memplan")
    ap.add_argument("--out", default=None, help="write the Markdown tables here (else stdout)")
    ap.add_argument("--quick", action="store_true", help="the six sdpa/adamw rows only")
    ap.add_argument("--rows", choices=("all", "core"), default="all", help="core: five rows per config")
    ap.add_argument("--only", default="", help="comma-separated model_types or file stems")
    ap.add_argument("--configs", default="models/hf/*.json")
    ap.add_argument("--json", default=None, help="also dump every row as JSON lines here")
    ap.add_argument("--rows-out", default=os.path.join(rowlib.ROWS_DIR, "torch_step.jsonl"),
                    help="where the measured rows go as data for tests/replay_accuracy.py (rowlib.py; a row "
                         "replaces the one with the same config and settings); '' for none")
    ap.add_argument("--use-cache", action="store_true",
                    help="train with use_cache=True (memplan --use-cache on): the DynamicCache rows")
    ap.add_argument("--attention", choices=("all", "sdpa", "eager"), default="all",
                    help="only the rows with this attention implementation")
    ap.add_argument("--target-seq", type=int, default=0,
                    help="encoder-decoders (t5): the decoder's length (default: half each row's --seq)")
    ap.add_argument("--every-n-layers", type=int, default=0,
                    help="N > 1: the rows checkpointing layers checkpoint every N-th layer instead "
                         "(transformers' every_n_layers; memplan --checkpoint layers:N)")
    ap.add_argument("--offload", action="store_true",
                    help="only the rows checkpointing layers, offloaded: transformers' "
                         "activation_checkpointing_enable(offload=True) (memplan --checkpoint layers[:N]+offload)")
    ap.add_argument("--vocab", type=int, default=0,
                    help="N > 0: the configs' vocab_size set to N, so that the loss holds no large logits "
                         "and a block's recompute can be the peak (the row keeps the edited config)")
    ap.add_argument("--seqs", default="",
                    help="comma-separated sequence lengths replacing each row's (e.g. 1024,4096)")
    ap.add_argument("--packing", choices=("rows", "padding-free"), default="",
                    help="packed batches: rows (each row packs documents; memplan --packing) or padding-free "
                         "(one row of batch x seq tokens, TRL; memplan --padding-free)")
    ap.add_argument("--optimizer", choices=("muon",), default="",
                    help="every row with this optimizer instead (muon: torch.optim.Muon on the hidden 2-D weights, "
                         "AdamW on the rest; memplan --optimizer muon)")
    ap.add_argument("--max-layers", type=int, default=4,
                    help="cap the decoder layers (0: as in the config; default 4)")
    a = ap.parse_args()
    files = sorted(glob.glob(a.configs))
    only = set(x for x in a.only.split(",") if x)
    tmpdir = tempfile.mkdtemp(prefix="torch_step_")
    out = open(a.out, "w") if a.out else sys.stdout
    jout = open(a.json, "w") if a.json else None
    print("# memplan vs PyTorch: whole training step (CPU, fake tensors)\n", file=out)
    print("torch %s, transformers %s, Python %s, %s; memplan at %s.\n" % (
        torch.__version__, transformers.__version__, platform.python_version(), platform.machine(),
        subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()),
        file=out)
    print("Columns: peak = step 2's peak allocated bytes (torch: LiveTracker; memplan: peak_allocated_bytes "
          "minus the cuBLAS workspace); act = activations live when backward starts; saved = what autograd "
          "saves (torch: saved_tensors_hooks, by storage; memplan: sum of layers[].activation_bytes; "
          "checkpointing none only). Differences are memplan minus torch, in % of torch.\n", file=out)
    summary = []
    global CUDA_FLOAT_MASK
    for f in files:
        raw = json.load(open(f))
        stem = os.path.splitext(os.path.basename(f))[0]
        if only and raw.get("model_type") not in only and stem not in only:
            continue
        cfg = load_config(f, a.max_layers)
        if a.vocab:
            cfg["vocab_size"] = a.vocab
        cpath = os.path.join(tmpdir, stem + ".json")
        with open(cpath, "w") as g:
            json.dump(cfg, g)
        tc = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}  # multimodal
        nl = next((c[k] for c in (cfg, tc) for k in LAYER_KEYS if isinstance(c.get(k), int)), "?")
        print("## %s (%s, %s, %s layers)\n" % (stem, cfg.get("model_type"), (cfg.get("architectures") or ["?"])[0], nl),
              file=out)
        print("| b x s | precision | attn | ckpt | optim | torch peak MiB | memplan MiB | diff | CUDA-only MiB | "
              "diff vs CUDA | torch act MiB | memplan act MiB | diff | saved diff | torch peak at | memplan peak at |",
              file=out)
        print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|", file=out)
        out.flush()
        rows = core_settings(cfg) if a.rows == "core" else settings(cfg, a.quick)
        if cfg.get("model_type") in EAGER_ONLY:  # transformers has no SDPA path for them
            rows = list(dict.fromkeys((b, s, p, "eager", c, o) for (b, s, p, _, c, o) in rows))
        if a.attention != "all":
            rows = [r for r in rows if r[3] == a.attention]
        if a.every_n_layers > 1:
            rows = [(b, s, p, a_, "layers:%d" % a.every_n_layers, o) for (b, s, p, a_, c, o) in rows if c == "layers"]
        if a.offload:
            rows = [(b, s, p, a_, c + "+offload", o) for (b, s, p, a_, c, o) in rows if c.startswith("layers")]
        if a.seqs:
            rows = list(dict.fromkeys((b, int(q), p, a_, c, o) for (b, s, p, a_, c, o) in rows
                                      for q in a.seqs.split(",")))
        if a.optimizer:
            rows = list(dict.fromkeys((b, s, p, a_, c, a.optimizer) for (b, s, p, a_, c, o) in rows))
        if "image_size" in cfg:  # ViT: the sequence is the image's patches + 1 (--seq does not apply)
            im, pt = cfg.get("image_size", 224), cfg.get("patch_size", 16)
            seq = (im // pt) ** 2 + 1
            rows = list(dict.fromkeys((8 * b, seq, p, a_, c, o) for (b, s, p, a_, c, o) in rows))
        CUDA_FLOAT_MASK = cfg.get("model_type") in T5_TYPES
        enc_dec = bool(cfg.get("is_encoder_decoder")) and "ForConditionalGeneration" in str(cfg.get("architectures"))
        for (b, s, prec, attn, ck, optim) in rows:
            t0 = time.time()
            tgt = (a.target_seq or s // 2) if enc_dec else 0
            try:
                t = measure_torch(cfg, b, s, prec, attn, ck, optim, a.use_cache, tgt, a.packing)
            except Exception as e:  # a family transformers cannot run this way: say so
                print("| %dx%d | %s | %s | %s | %s | torch failed: %s |" % (b, s, prec, attn, ck, optim,
                                                                          str(e).splitlines()[0][:80]), file=out)
                continue
            m = measure_memplan(a.memplan, cpath, b, s, prec, attn, ck, optim, a.use_cache, tgt, a.packing)
            if "error" in m:
                print("| %dx%d | %s | %s | %s | %s | memplan failed: %s |" % (b, s, prec, attn, ck, optim,
                                                                            m["error"][:80]), file=out)
                continue
            dpk = pct(m["peak"], t["peak"])
            cuda, why = cuda_only_bytes(cfg, b, s, prec, attn, ck, tgt)
            # CUDA-only bytes are activations alive at a backward-time peak; a peak in the
            # optimizer step (activations gone) is unchanged by them
            cuda_pk = cuda if t["peak_at"].startswith(("backward", "forward")) else 0
            dcu = pct(m["peak"], t["peak"] + cuda_pk)
            dact = pct(m["act_at_backward"], t["act_at_backward"])
            dsv = "%+.2f%%" % pct(m["saved"], t["saved"]) if t.get("saved") else ""
            print("| %dx%d%s | %s | %s | %s | %s | %s | %s | %+.2f%% | %s | %+.2f%% | %s | %s | %+.2f%% | %s | %s | %s |" % (
                b, s, "->%d" % tgt if tgt else "", prec, attn, ck, optim, mib(t["peak"]), mib(m["peak"]), dpk,
                ("%s (%s)" % (mib(cuda), why)) if cuda else "", dcu, mib(t["act_at_backward"]),
                mib(m["act_at_backward"]), dact, dsv, t["peak_at"], m["peak_at"]), file=out)
            out.flush()
            row = {"config": stem, "model_type": cfg.get("model_type"), "batch": b, "seq": s, "target_seq": tgt,
                   "precision": prec,
                   "attention": attn, "ckpt": ck, "optimizer": optim, "torch": t, "memplan": m,
                   "peak_diff_pct": dpk, "peak_diff_vs_cuda_pct": dcu, "cuda_only_bytes": cuda,
                   "act_diff_pct": dact, "seconds": round(time.time() - t0, 1)}
            summary.append(row)
            if a.rows_out:  # the evidence, kept as data (rowlib.py)
                rowlib.save_rows("torch_step", [{
                    "source": "bench/accuracy/torch_step.py run of %s" % time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    **({"config_json": cfg, "config": "%s, vocab_size %d, %s layers (config_json)" % (stem, a.vocab, nl)}
                       if a.vocab else
                       {"config": os.path.relpath(f, rowlib.ROOT) if os.path.isabs(f) else f, "max_layers": a.max_layers}),
                    "args": m["args"],
                    "figures": {"peak": rowlib.figure(t["peak"], m["peak"], cuda_pk),
                                "activations": rowlib.figure(t["act_at_backward"], m["act_at_backward"]),
                                **({"host_pinned": rowlib.figure(t["host_pinned"], m["host_pinned"])}
                                   if t["host_pinned"] else {})},
                    "recorded": {"peak": m["peak"], "activations": m["act_at_backward"], "torch_peak_at": t["peak_at"]},
                    "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__),
                }], a.rows_out)
            if jout:
                jout.write(json.dumps(row) + "\n")
                jout.flush()
        print("", file=out)
    worst = collections.defaultdict(float)
    for r in summary:
        k = r["config"]
        worst[k] = max(worst[k], abs(r["peak_diff_vs_cuda_pct"]))
    print("## Summary: largest |peak difference| per config, after the listed CUDA-only bytes\n", file=out)
    print("| config | rows | max abs peak diff |\n|---|---:|---:|", file=out)
    for k in sorted(worst):
        print("| %s | %d | %.2f%% |" % (k, sum(1 for r in summary if r["config"] == k), worst[k]), file=out)
    if a.out:
        out.close()


if __name__ == "__main__":
    main()
