#!/usr/bin/env python3
"""act_offload.py - TRL's activation offloading (SFTConfig(activation_offloading=True)) against
memplan --act-offload (issue 26 item 4), on the CPU under fake tensors.

  python3 bench/accuracy/act_offload.py [--only llama-3.2-1b,llama-3-8b] [--loss hf|chunked-nll]
      [--quick] [--out FILE.md] [--memplan ./memplan] [--no-save] [--show N]

What runs: TRL 1.16.0's own trl/models/activation_offloading.py, get_act_offloading_ctx_manager(model)
with its defaults (use_pin_memory=True, use_streams=True, min_offload_size=1024,
max_fwd_stash_size=5), wrapped around the forward and the backward of each step as
SFTTrainer.training_step does (trl/trainer/sft_trainer.py:1190-1193, 1690-1693); the optimizer
step runs outside it (transformers' Trainer steps after training_step returns).  The model is
built as peft_step.torch_lora_step builds it (meta device, peft LoRA, fake CPU storages), stepped
twice; step 2 is measured with torch_step.LiveTracker (512-byte rounded live storages).

The CUDA branch emulated on this GPU-less host (said here, as torch_step.py --offload says it):
  * the accelerator: OffloadActivations asks torch.accelerator.current_accelerator() (None here);
    it is told "cpu" with a device module whose streams and events do nothing (FakeDevice): the
    stream logic that decides what lives (the forward stash, the backward stash, the node hooks) is
    TRL's own Python and runs unchanged; only the waits are no-ops.
  * host memory: torch.empty_like/torch.empty(..., pin_memory=..., device="cpu") inside the module
    make the host copy; it is taken off the LiveTracker (host RAM, not device) and counted rounded
    up to a power of two, as the pinned CachingHostAllocator rounds (include/ATen/core/
    CachingHostAllocator.h:343-352).  The copy back (`.to(device)`) is a new device tensor on CUDA;
    on the CPU it would return the host tensor itself, so it is a clone here (counted).
  * storage identity: fake storages have data_ptr() 0, so TRL's deduplication key
    (_get_unique_tensor_key: data_ptr + storage_offset, dtype) and its parameter-storage filter
    would see every tensor as one storage; UntypedStorage.data_ptr is made to return the storage's
    own address (_cdata), unique while the storage lives, as a CUDA pointer is.
TRL's fused head (`--loss chunked-nll` rows, SFTTrainer's default): loss_heads.trl_cuda_branches
(its Triton branches as on CUDA), added to the base model with SFTTrainer's outputs, and the loss
as SFTTrainer.compute_loss makes it (sft_fused_loss); the tracker answers the mask's data-dependent
shapes and sums gradients in place as CUDA does (FusedTracker).
CUDA-only behaviour the CPU cannot show (bench/gpu/ list): the side stream's copies finishing
(events), record_stream delaying a block's reuse, and the reloads being allocated on the side
stream's own pool: these move reserved bytes and time, not memory_allocated.
"""
import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch_step  # noqa: E402  (its CUDA kernels for SDPA and dropout are installed on import)
import rowlib  # noqa: E402
import loss_heads  # noqa: E402  (TRL's fused head on its CUDA branches)
from torch_step import LiveTracker  # noqa: E402

CONFIGS = {"llama-3.2-1b": "models/hf/llama-3.2-1b.json", "llama-3-8b": "models/hf/llama-3-8b.json"}


def _pow2(n):
    return 1 << max(n - 1, 0).bit_length()


class HostTracker(LiveTracker):
    """LiveTracker that leaves host storages (marked by host()) out."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        from torch.utils.weak import WeakIdKeyDictionary
        self._host = WeakIdKeyDictionary()
        self.host_bytes = 0
        self.host_packs = 0
        self.off = False  # making a host copy: not device memory, not counted at all

    @contextlib.contextmanager
    def hosting(self):
        self.off = True
        try:
            yield
        finally:
            self.off = False

    def host(self, t):
        st = t.untyped_storage()
        self.forget(t)
        self._host[st] = True
        self.host_bytes += _pow2(st.nbytes())
        self.host_packs += 1

    def add(self, t, label="tensor"):
        if self.off or (isinstance(t, torch.Tensor) and t.untyped_storage() in self._host):
            return
        super().add(t, label)


class _Event:
    def synchronize(self):
        pass


class _Stream:
    def record_event(self, *a):
        return _Event()

    def wait_event(self, *a):
        pass

    def wait_stream(self, *a):
        pass

    def synchronize(self):
        pass


class FakeDevice:
    """The device module OffloadActivations drives (torch.cuda's calls it makes): no-op streams."""

    def __init__(self):
        self._s0 = _Stream()

    def Stream(self):  # noqa: N802 (torch.cuda.Stream)
        return _Stream()

    def current_stream(self):
        return self._s0

    @contextlib.contextmanager
    def stream(self, s):
        yield

    def empty_cache(self):
        pass


class TorchProxy:
    """The `torch` the TRL module sees: host copies marked as host memory, everything else torch's."""

    def __init__(self, tr):
        self._tr = tr

    def __getattr__(self, name):
        return getattr(torch, name)

    def _host(self, t):
        self._tr.host(t)
        t.to = lambda *a, **k: t.clone()  # CUDA: the copy back is a new device tensor
        return t

    def empty_like(self, x, pin_memory=False, device=None, **k):
        with self._tr.hosting():
            return self._host(torch.empty_like(x, device="cpu", **k))

    def empty(self, *a, pin_memory=False, device=None, **k):
        with self._tr.hosting():
            return self._host(torch.empty(*a, device="cpu", **k))


class FusedTracker(HostTracker, loss_heads.inplace_sums()):
    """HostTracker that answers the data-dependent shapes of TRL's fused head under fake tensors
    as loss_heads.Tracker does (the mask's nonzero indices, the gathered rows, masked_select), with
    inplace_tracker's gradient sums (loss_heads.inplace_sums: in place where CUDA sums in place;
    the tied embedding's gradient meets the fused head's weight gradient in full fine-tuning)."""


def sft_fused_loss(model, ids, labels):
    """SFTTrainer.compute_loss's default branch (trl 1.16.0 sft_trainer.py:1611-1618), with no
    num_items_in_batch: the fused head's outputs, the loss from -log_probs over the kept labels;
    the outputs go when compute_loss returns."""
    out = model(input_ids=ids, labels=labels, use_cache=False, fused_lm_head=True)
    lo = (-out.log_probs).sum() / torch.as_tensor(out.label_mask.sum()).clamp(min=1)
    return lo


def offload_ctx(model, tr):
    """TRL's get_act_offloading_ctx_manager(model) with its defaults, on the emulated device."""
    import trl.models.activation_offloading as ao
    ao.torch = TorchProxy(tr)
    cur, gdm = torch.accelerator.current_accelerator, torch.get_device_module
    torch.accelerator.current_accelerator = lambda *a: torch.device("cpu")
    torch.get_device_module = lambda *a: FakeDevice()
    try:
        return ao.get_act_offloading_ctx_manager(model=model)
    finally:
        torch.accelerator.current_accelerator, torch.get_device_module = cur, gdm


def axolotl_pack(ctx):
    """Axolotl 0.19's patch of TRL's pack hook (core/trainers/mixins/activation_checkpointing.py
    _patch_trl_offload_compute_stream_clone, written here from its rule): before TRL's pack, a
    device tensor that is not a Parameter and is not contiguous or starts at an offset is cloned
    (contiguous) on the compute stream, so TRL's pack sees the clone (its storage key, its size).
    The emulated accelerator is the CPU here (offload_ctx), so "device" is "cpu"."""
    pack = ctx.pack_hook

    def pack_contiguous(t):
        if (torch.is_tensor(t) and t.device.type == "cpu" and not isinstance(t, torch.nn.Parameter) and
                (not t.is_contiguous() or t.storage_offset() != 0)):
            t = t.clone(memory_format=torch.contiguous_format)
        return pack(t)

    ctx.pack_hook = pack_contiguous
    return ctx


def torch_run(cfg_path, batch, seq, precision, full, r=16, targets="all-linear", offload=True, show=0,
              loss="hf", axolotl=False):
    import peft
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    transformers.masking_utils.find_packed_sequence_indices = lambda position_ids: None
    with open(cfg_path) as f:
        d = json.load(f)
    cfg = transformers.AutoConfig.for_model(**d)
    cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        if not full:
            model = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0,
                                                               task_type="CAUSAL_LM", target_modules=targets))
    with fake:
        model.to_empty(device="cpu")
        (model.get_base_model() if not full else model).tie_weights()
    if loss == "chunked-nll":
        # SFTTrainer (trl 1.16.0 sft_trainer.py:1142-1147): TRL's fused head on the base model, with
        # these outputs, on its CUDA branches (loss_heads.trl_cuda_branches)
        loss_heads.trl_cuda_branches()(model.get_base_model() if not full else model,
                                       outputs=("log_probs", "entropy", "is_top1"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    tr = (HostTracker if loss == "hf" else FusedTracker)(snapshot=bool(show))
    tr.kept = batch * (seq - 1)  # (FusedTracker: every shifted label kept)
    data_ptr, record_stream = torch.UntypedStorage.data_ptr, torch.Tensor.record_stream
    torch.UntypedStorage.data_ptr = lambda self: self._cdata  # (module doc: storage identity)
    torch.Tensor.record_stream = lambda self, s: None  # (a no-op stream; memory_allocated drops at free)
    try:
        with fake, tr:
            if axolotl:
                # Axolotl 0.19, full fine-tuning with activation_offloading: true (loaders/model.py
                # _apply_activation_checkpointing, ac_wrap_hf_model): torch's checkpoint_wrapper
                # (non-reentrant) on every GradientCheckpointingLayer, HF's checkpointing off
                from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import \
                    apply_activation_checkpointing
                from torch.distributed.fsdp.wrap import ModuleWrapPolicy
                apply_activation_checkpointing(model, auto_wrap_policy=ModuleWrapPolicy(
                    {transformers.modeling_layers.GradientCheckpointingLayer}))
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            for p in model.parameters():
                tr.add(p, "param")
            for b in model.buffers():
                tr.add(b, "buffer")
            ctx = offload_ctx(model, tr) if offload else contextlib.nullcontext()
            if offload and axolotl:
                ctx = axolotl_pack(ctx)
            ids = torch.randint(0, cfg.vocab_size, (batch, seq))
            labels = ids.clone()
            opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
            for step in (1, 2):
                if step == 2:
                    for st in opt.state.values():
                        if "step" in st and isinstance(st["step"], torch.Tensor):
                            tr.forget(st["step"])
                    gc.collect()
                    tr.peak, tr.peak_at = tr.cur, "step-start"
                    tr.host_bytes = tr.host_packs = 0
                ac = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "amp-bf16" else None
                with ctx:  # SFTTrainer.training_step: forward and backward inside the context
                    tr.phase = "forward"
                    if ac:
                        ac.__enter__()
                    if loss == "hf":
                        lo = model(input_ids=ids, labels=labels, use_cache=False).loss
                    else:
                        lo = sft_fused_loss(model, ids, labels)
                    if ac:
                        ac.__exit__(None, None, None)
                    tr.phase = "backward"
                    lo.backward()
                    del lo
                    gc.collect()
                tr.phase = "optimizer.step"
                opt.step()
                opt.zero_grad(set_to_none=True)
                gc.collect()
    finally:
        torch.UntypedStorage.data_ptr, torch.Tensor.record_stream = data_ptr, record_stream
    res = {"peak": tr.peak, "peak_at": tr.peak_at, "host_pinned": tr.host_bytes, "host_packs": tr.host_packs}
    if show:
        res["live_at_peak"] = tr.peak_live[:show]
    return res


def memplan_run(memplan, cfg_path, batch, seq, precision, full, r=16, targets="all-linear", offload=True,
                loss="hf"):
    args = ["--batch", str(batch), "--seq", str(seq), "--precision", precision, "--checkpoint", "layers",
            "--workspace", "0", "--use-cache", "off"]
    if loss != "hf":
        args += ["--loss", loss]
    if offload:
        args += ["--act-offload"]
    if not full:
        args += ["--finetune", "lora", "--lora-r", str(r), "--lora-targets", targets]
    args += ["--json"]
    out = subprocess.run([memplan, "estimate", cfg_path] + args, check=True, capture_output=True,
                         text=True).stdout
    m = json.loads(out)["memory"]
    return {"peak": m["peak_allocated_bytes"], "peak_at": m["peak_event"],
            "host_pinned": m.get("host_pinned_bytes", 0), "args": args}


def settings(quick):
    # (name, layers, batch, seq, precision, full, vocabulary: 0 the model's; 1,000 moves the peak
    # off the loss, into the layers' recompute and backward, where the reloads' rules decide it)
    rows = [("llama-3.2-1b", 4, 1, 2048, "bf16", False, 0), ("llama-3.2-1b", 4, 1, 8192, "bf16", False, 0),
            ("llama-3.2-1b", 4, 2, 4096, "amp-bf16", True, 0),
            ("llama-3-8b", 2, 1, 2048, "bf16", False, 0), ("llama-3-8b", 2, 1, 8192, "bf16", False, 0),
            ("llama-3-8b", 2, 1, 4096, "amp-bf16", True, 0),
            ("llama-3.2-1b", 4, 1, 4096, "bf16", False, 1000), ("llama-3.2-1b", 4, 1, 4096, "amp-bf16", True, 1000),
            ("llama-3-8b", 2, 1, 8192, "bf16", False, 1000),
            # full bf16 with a small vocabulary at 2 x 8192: the peak leaves the optimizer step
            ("llama-3.2-1b", 4, 2, 8192, "bf16", True, 1000), ("llama-3-8b", 2, 1, 8192, "bf16", True, 1000)]
    rows = [r + ("hf",) for r in rows]
    # TRL's fused head (SFTTrainer's default, --loss chunked-nll)
    rows += [("llama-3.2-1b", 4, 1, 2048, "bf16", False, 0, "chunked-nll"),
             ("llama-3.2-1b", 4, 1, 8192, "bf16", False, 0, "chunked-nll"),
             ("llama-3.2-1b", 4, 2, 2048, "amp-bf16", False, 0, "chunked-nll"),
             ("llama-3.2-1b", 4, 2, 4096, "amp-bf16", True, 0, "chunked-nll"),
             ("llama-3-8b", 2, 1, 2048, "bf16", False, 0, "chunked-nll"),
             ("llama-3-8b", 2, 1, 8192, "bf16", False, 0, "chunked-nll"),
             ("llama-3-8b", 2, 1, 4096, "amp-bf16", True, 0, "chunked-nll"),
             ("llama-3.2-1b", 4, 1, 4096, "bf16", False, 1000, "chunked-nll"),
             ("llama-3-8b", 2, 1, 8192, "bf16", False, 1000, "chunked-nll"),
             # narrow MLPs, full bf16: the peak is the fused head's backward (its reloads)
             ("llama-3.2-1b", 2, 1, 8192, "bf16", True, 0, "chunked-nll", 1024)]
    return rows[:2] if quick else rows


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--memplan", default="./memplan")
    ap.add_argument("--only", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--torch-only", action="store_true", help="print torch's figures, run no memplan")
    ap.add_argument("--show", type=int, default=0)
    ap.add_argument("--plain", action="store_true", help="also run the step without offloading")
    ap.add_argument("--loss", default="", help="only the rows of this loss head (hf, chunked-nll)")
    ap.add_argument("--axolotl", action="store_true",
                    help="Axolotl 0.19's activation_offloading: true for full fine-tuning (its checkpoint_wrapper "
                         "and pack patch) on the full rows with HF's loss, against the same memplan command")
    a = ap.parse_args(argv)
    only = set(a.only.split(",")) if a.only else None
    rows, lines = [], []
    import peft
    import transformers
    import trl
    versions = rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                   peft=peft.__version__, trl=trl.__version__)
    table = ["| model (layers) | training | batch x seq | precision | torch peak | memplan | diff | "
             "without offload | host pinned (torch = memplan) | torch peak at |", "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    tmp = tempfile.mkdtemp()
    for name, layers, b, s, prec, full, vocab, loss, *inter in settings(a.quick):
        inter = inter[0] if inter else 0
        if (only and name not in only) or (a.loss and loss != a.loss):
            continue
        if a.axolotl and (not full or loss != "hf"):
            continue  # (Axolotl: LoRA offloads instead of checkpointing; its trainer's loss is HF's)
        d = rowlib.load_config(CONFIGS[name], layers)
        if vocab:
            d["vocab_size"] = vocab
        if inter:
            d["intermediate_size"] = inter
        cfg_path = os.path.join(tmp, "%s-%d-%d-%d.json" % (name, layers, vocab, inter))
        with open(cfg_path, "w") as f:
            json.dump(d, f)
        t = torch_run(cfg_path, b, s, prec, full, show=a.show, loss=loss, axolotl=a.axolotl)
        what = (("full" if full else "lora all-linear r16") + (" (Axolotl)" if a.axolotl else "") + (", vocab %d" % vocab if vocab else "") +
                (", intermediate %d" % inter if inter else "") +
                (", --loss %s" % loss if loss != "hf" else ""))
        line = "%s L%d %s b%d s%d %s: torch peak %.1f MiB at %s, host pinned %.1f MiB (%d packs)" % (
            name, layers, what, b, s, prec, t["peak"] / 2**20, t["peak_at"], t["host_pinned"] / 2**20,
            t["host_packs"])
        p = None
        if a.plain:
            p = torch_run(cfg_path, b, s, prec, full, offload=False, loss=loss)
            line += "; without offload %.1f MiB at %s" % (p["peak"] / 2**20, p["peak_at"])
        for sz, lab in t.get("live_at_peak", []):
            line += "\n    %10.1f MiB %s" % (sz / 2**20, lab)
        if not a.torch_only:
            m = memplan_run(a.memplan, cfg_path, b, s, prec, full, loss=loss)
            diff = 100.0 * (m["peak"] - t["peak"]) / t["peak"]
            line += "\n    memplan %.1f MiB (%+.2f %%) at %s, host pinned %.1f MiB" % (
                m["peak"] / 2**20, diff, m["peak_at"], m["host_pinned"] / 2**20)
            where = ({"config_json": d, "config": "%s, vocab_size %d, %d layers (config_json)" % (name, vocab, layers)}
                     if vocab else {"config": CONFIGS[name], "max_layers": layers})
            if inter:
                where = {"config_json": d, "config": "%s, intermediate_size %d, %d layers (config_json)" % (
                    name, inter, layers)}
            rows.append(dict(where, oracle="act_offload", source="bench/accuracy/act_offload.py", args=m["args"],
                         figures={"peak": rowlib.figure(t["peak"], m["peak"]),
                                  "host_pinned": rowlib.figure(t["host_pinned"], m["host_pinned"])},
                         recorded={"peak_mib": round(m["peak"] / 2**20, 1), "peak_diff_pct": round(diff, 3),
                                      "torch_peak_at": t["peak_at"], "host_packs": t["host_packs"],
                                      "without_offload_mib": round(p["peak"] / 2**20, 1) if p else None},
                         versions=versions))
            table.append("| %s (%d) | %s | %d x %d | %s | %.1f | %.1f | %+.2f %% | %s | %.1f MiB | %s |" % (
                name, layers, what, b, s, prec, t["peak"] / 2**20, m["peak"] / 2**20, diff,
                "%.1f" % (p["peak"] / 2**20) if p else "-", t["host_pinned"] / 2**20, t["peak_at"]))
        print(line, flush=True)
        lines.append(line)
    if rows and not a.no_save:  # (Axolotl's rows: the same memplan commands, their own file)
        rowlib.save_rows("act_offload_axolotl" if a.axolotl else "act_offload", rows)
    if a.out:
        head = ("# bench/accuracy/act_offload.py: %s activation offloading (issue 26 item 4)\n\n"
                "Run of %s: `python3 bench/accuracy/act_offload.py --plain%s --out %s`\n"
                "(torch %s, transformers %s, peft %s, trl %s; %s).  MiB; memplan minus torch.\n\n" % (
                    "Axolotl 0.19's (full fine-tuning)" if a.axolotl else "TRL's",
                    __import__("datetime").date.today().isoformat(), " --axolotl" if a.axolotl else "", a.out,
                    versions["torch"],
                    versions["transformers"], versions["peft"], versions["trl"], versions["machine"]))
        rowlib.write_results(a.out, head + "\n".join(table) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
