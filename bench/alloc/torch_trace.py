#!/usr/bin/env python3
"""torch_trace.py - the device allocations and frees of the GPU kit's PyTorch step, in order, as
the CUDA caching allocator would receive them, recorded on this GPU-less host (fake tensors).

The recipe is bench/gpu/kit.py's torch_row (read it): the model built from the HF config
(from_config, dropout as the config says, sdpa), AdamW(lr=1e-4) (foreach, the CUDA default),
input_ids = labels = one (b, s) int64 tensor, torch.cuda.empty_cache() after the build, one
warm-up step, then N steps: forward (under autocast for amp-bf16), loss.backward(), opt.step(),
opt.zero_grad(set_to_none=True), `loss` kept until the next step's forward has made a new one.

Recorded with a TorchDispatchMode under FakeTensorMode (bench/accuracy/torch_step.py's patches:
CUDA's SDPA kernel where the CPU's differs, CUDA's native_dropout): every storage an op creates
is an allocation (its bytes as requested: the allocator rounds them), its death (weakref
finalizer, at refcount zero as CPython frees it) the free.

Known differences from the CUDA run, each mimicked where it changes the sequence:
  * CPU autocast keeps gelu_new's torch.pow in bf16; CUDA's autocast runs pow in fp32 (it is on
    CUDA's fp32 list only): here NewGELUActivation casts its input to fp32 for the pow under
    autocast, which makes the fp32 copy CUDA's autocast makes (rowlib.cuda_only_bytes).
  * cuBLAS workspaces: torch allocates one per (cuBLAS handle, stream) through the caching
    allocator at the first GEMM, and handles are per thread: the forward (the main thread) and
    the backward (autograd's device thread) each get one.  --workspace BYTES (32 MiB on sm90,
    CUBLAS_WORKSPACE_CONFIG's default :4096:8) is allocated at the first mm/addmm/bmm of each,
    after that op's output.
  * SDPA with dropout (GPT-2's attn_pdrop) runs the math path on the CPU: (b, a, s, s) tensors
    the GPU's fused kernels never make.  Here the memory-efficient kernel's aten op (sdpa_fused).
  * kernels' own temporaries (cuDNN attention workspaces, reductions' scratch) are not seen: on a
    CPU the kernel runs without them.

Writes one line per event: `a ID BYTES` (allocation), `f ID` (free), `e` (empty_cache),
`m NAME` (a mark: build, step N, forward, backward, optimizer, end), `x ID` (allocation ID is
host memory on CUDA: AdamW's step counters; a reader drops its events).  Usage:
  python3 bench/alloc/torch_trace.py CONFIG.json --batch 8 --seq 1024 --precision amp-bf16
      --checkpoint layers [--steps 4] [--workspace 33554432] > trace.txt
"""
import argparse
import gc
import json
import math
import os
import sys
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "accuracy"))

import torch  # noqa: E402
import transformers  # noqa: E402
import torch_step  # noqa: E402,F401 - its CUDA-kernel patches (SDPA, dropout, packed-mask lookup)
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402

GEMMS = {"mm", "addmm", "bmm", "baddbmm"}


def gelu_new_like_cuda(self, x):
    """NewGELUActivation.forward (transformers activations.py) with the pow in fp32 under
    autocast, as CUDA's autocast runs it."""
    p = torch.pow(x.float() if torch.is_autocast_enabled("cpu") else x, 3.0)
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * p)))


_SDPA = torch.nn.functional.scaled_dot_product_attention


def sdpa_fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """SDPA as a fused CUDA kernel runs it.  On the CPU, dropout_p > 0 (GPT-2's attn_pdrop in
    training) sends SDPA to the math path, which makes the (b, a, s, s) scores, probabilities and
    dropout mask; on the H200 the kit saw cuDNN (bf16) and memory-efficient (fp32) attention,
    which make none of them.  Here the memory-efficient aten op (it has a meta function): the
    output and an fp32 logsumexp (b, a, s rounded up to 32), as cuDNN's (b, a, s, 1) for s a
    multiple of 32; its backward makes dq, dk, dv."""
    if kw.get("enable_gqa") or attn_mask is not None:
        return _SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                     scale=scale, **kw)
    if torch.is_autocast_enabled("cpu"):  # SDPA is on autocast's lower-precision list
        dt = torch.get_autocast_dtype("cpu")
        query, key, value = query.to(dt), key.to(dt), value.to(dt)
    need = query.requires_grad or key.requires_grad or value.requires_grad
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, None, need, dropout_p, is_causal, scale=scale)[0]


class Recorder(TorchDispatchMode):
    def __init__(self, out, workspace):
        super().__init__()
        self.out = out
        self.ids = WeakIdKeyDictionary()
        self.n = 0
        self.workspace = workspace
        self.phase = "build"
        self.ws_done = set()

    def emit(self, line):
        self.out.write(line + "\n")

    def add(self, t):
        st = t.untyped_storage()
        if st in self.ids or st.nbytes() == 0:
            return
        self.n += 1
        i = self.n
        self.ids[st] = (weakref.ref(st, lambda _r, i=i: self.emit("f %d" % i)), i)
        self.emit("a %d %d" % (i, st.nbytes()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.add(t)
        # the GEMM's output is allocated (its structured kernel's set_output) before the cuBLAS
        # call fetches the handle and its workspace
        thread = "bwd" if self.phase == "backward" else "main"
        if self.workspace and func.overloadpacket.__name__ in GEMMS and thread not in self.ws_done:
            self.ws_done.add(thread)
            self.n += 1
            self.emit("a %d %d" % (self.n, self.workspace))  # kept for the run
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--precision", choices=["fp32", "amp-bf16", "bf16"], default="fp32")
    ap.add_argument("--checkpoint", choices=["none", "layers"], default="none")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--workspace", type=int, default=32 << 20)
    a = ap.parse_args()
    with open(a.config) as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    mt = cfg.pop("model_type")
    conf = transformers.AutoConfig.for_model(mt, **cfg)
    conf.use_cache = False
    transformers.activations.NewGELUActivation.forward = gelu_new_like_cuda
    torch.nn.functional.scaled_dot_product_attention = sdpa_fused
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    out = sys.stdout
    fake = FakeTensorMode()
    rec = Recorder(out, a.workspace)
    rec.emit("m build")
    with fake, rec:
        model = transformers.AutoModelForCausalLM.from_config(conf, dtype=dtype, attn_implementation="sdpa")
        model.train()
        if a.checkpoint == "layers":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for p in list(model.parameters()) + list(model.buffers()):
            rec.add(p)  # (made before the mode saw them, if any)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4)
        ids = torch.randint(0, conf.vocab_size, (a.batch, a.seq))
        rec.add(ids)
        gc.collect()
        rec.emit("e")
        loss = None
        for step in range(a.steps + 1):
            rec.emit("m step %d" % step)
            rec.phase = "forward"
            rec.emit("m forward")
            if a.precision == "amp-bf16":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=ids).loss
            else:
                loss = model(input_ids=ids, labels=ids).loss
            rec.phase = "backward"
            rec.emit("m backward")
            loss.backward()
            rec.phase = "optimizer"
            rec.emit("m optimizer")
            opt.step()
            for st in opt.state.values():  # AdamW's step counters: host tensors on CUDA too
                s = st.get("step")
                if isinstance(s, torch.Tensor) and s.untyped_storage() in rec.ids:
                    rec.emit("x %d" % rec.ids[s.untyped_storage()][1])
            opt.zero_grad(set_to_none=True)
            rec.phase = "end"
            rec.emit("m end")
        del loss
        gc.collect()


if __name__ == "__main__":
    main()
