#!/usr/bin/env python3
"""sac_step.py — memplan's --checkpoint layers+sac (selective activation checkpointing) against torch.

  python3 bench/accuracy/sac_step.py trl [--only NAME,...] [--memplan PATH] [--no-save]
      TRL 1.16's policy (trl/models/selective_activation_checkpointing.py): the model is built
      with transformers (fake tensors, the CPU), wrapped with peft LoRA all-linear r16 or trained
      whole, and TRL's own enable_selective_activation_checkpointing(model) wraps its
      gradient_checkpointing_enable, so transformers' non-reentrant checkpoint of every decoder
      layer gets TRL's context_fn (create_selective_checkpoint_contexts with the SDPA ops
      MUST_SAVE).  Two steps under peft_step.torch_lora_step (live storages, 512-byte rounded,
      AdamW foreach); step 2's peak against `memplan estimate --checkpoint layers+sac`.  Each
      setting runs plain `layers` too and prints both sides' difference (what SAC adds at the
      peak).  On the CPU SDPA runs _scaled_dot_product_flash_attention_for_cpu, whose outputs
      (the attention output, an fp32 logsumexp of b x a x s) have the bytes of CUDA's flash kernel
      (docs/memory-facts.md#sac-sdpa-outputs), so no CUDA-only bytes.  Rows to rows/sac_step.jsonl
      unless --no-save.  Results: bench/accuracy/sac_step_results.md.

  python3 bench/accuracy/sac_step.py auto [--only NAME,...] [--memplan PATH] [--no-save]
      memplan's planner (--checkpoint layers+sac:auto), full fine-tuning: for a target between the
      plain layers' peak and the peak with every candidate kept (or, in a row so marked, the device
      peak of torchtitan's policy: the two at the same memory) (--vram, --margin 0), `memplan
      check` gives the plan's peak and `memplan suggest --max-batch B --emit torch` the policy; the
      emitted context_fn (its lines, exec'd as they are) goes to transformers' non-reentrant
      checkpoint of every layer and torch's step is measured as in `trl`.  Rows to
      rows/sac_step.jsonl.

  python3 bench/accuracy/sac_step.py torchtitan [--only NAME,...] [--memplan PATH] [--no-save]
      torchtitan's SelectiveAC (pytorch/torchtitan b5bcd76c6 torchtitan/distributed/
      activation_checkpoint.py): its policy written here from that file (lines 31-93: the saved ops are
      torch's get_default_op_list().compute_intensive_ops plus SDPA cudnn/math/overrideable, aten.max,
      flex_attention, aten.linear, topk and the c10d collectives; lines 214-287: every aten.mm or
      aten.linear counted per checkpoint call, the 2nd, 4th... recomputed), given to transformers'
      non-reentrant checkpoint of every decoder layer as context_fn with early_stop=False, as
      torchtitan's ptd_checkpoint_wrapper passes it (line 285).  The CPU's SDPA op
      _scaled_dot_product_flash_attention_for_cpu stands for CUDA's _scaled_dot_product_flash_attention
      (in compute_intensive_ops; the same output bytes).  The settings are `trl`'s that checkpoint
      every layer and TITAN_SETTINGS (biased and fused Linears); each also runs the policy `suggest --emit torch` writes for it, which must give
      the same peak, and prints memplan's `layers` and TRL-policy peaks beside.  Rows to
      rows/sac_step.jsonl, results to sac_torchtitan_results.md.

  python3 bench/accuracy/sac_step.py plan-time [--memplan PATH]
      The planner's time on Llama-3.1-70B (models/hf/llama-3.1-70b.json, 80 layers; batch 1, seq
      8192, bf16): full fine-tuning at a target halfway between the plain layers' peak and every
      candidate kept (`check --vram --margin 0`), and LoRA on an H100-80GB; the best of 5 runs'
      wall time of the whole command (the planner's replays included); the issue asks under 1 s.

  python3 bench/accuracy/sac_step.py trl-peft
      What TRL 1.16's SFTTrainer does with gradient_checkpointing_kwargs={"selective": True} and a
      peft_config (transformers 5.24, peft 0.21.2): a tiny real Llama on the CPU, one step.  The
      trainer raises ValueError("Unexpected keyword arguments: selective") from torch's checkpoint:
      TRL wraps the PeftModel's gradient_checkpointing_enable, but the Trainer's
      activation_checkpointing_enable reaches the base model's own (PeftModel.__getattr__), which
      passes the key on to torch.  Why memplan's recipes and --emit hf refuse SAC with LoRA.

Needs torch, transformers, peft, trl (pip).  Not part of `make test` (the rows are).
"""
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import rowlib  # noqa: E402

# (name, config source, max_layers, [(batch, seq, precision, finetune, checkpoint)])
SETTINGS = [
    ("llama-1024-v1000", "peft_step.RECOMPUTE_CONFIGS", 0,
     [(2, 2048, "bf16", "lora", "layers+sac"), (2, 2048, "bf16", "full", "layers+sac"),
      (2, 2048, "amp-bf16", "lora", "layers+sac"), (8, 2048, "amp-bf16", "full", "layers+sac"),
      (2, 2048, "bf16", "lora", "layers:2+sac")]),
    ("llama-7b-shape-v1000", "peft_step.RECOMPUTE_CONFIGS", 0,
     [(4, 2048, "bf16", "lora", "layers+sac")]),
    ("llama-3.2-1b", "models/hf/llama-3.2-1b.json", 4,
     [(1, 4096, "bf16", "lora", "layers+sac"), (1, 8192, "bf16", "lora", "layers+sac"),
      (1, 4096, "bf16", "full", "layers+sac")]),
    ("llama-3-8b", "models/hf/llama-3-8b.json", 2,
     [(1, 4096, "bf16", "lora", "layers+sac"), (1, 4096, "bf16", "full", "layers+sac")]),
]


def config_of(name, src, max_layers, tmpdir):
    """(path both sides read, the dict, the row's config keys)."""
    import peft_step
    if src.startswith("peft_step."):
        d = peft_step.RECOMPUTE_CONFIGS[name]
        keys = {"config": "peft_step.py RECOMPUTE_CONFIGS[%r]" % name, "config_json": d}
    else:
        d = rowlib.load_config(os.path.join(rowlib.ROOT, src), max_layers)
        keys = {"config": src, "max_layers": max_layers}
    path = os.path.join(tmpdir, name + ".json")
    with open(path, "w") as f:
        json.dump(d, f)
    return path, d, keys


def configs(table, only, tmpdir):
    """(name, path, the row's config keys, settings) of each table entry --only keeps."""
    for name, src, ml, rows in table:
        if not only or any(o in name for o in only):
            cfg, _, keys = config_of(name, src, ml, tmpdir)
            yield name, cfg, keys, rows


def trl_bench(only=(), memplan="./memplan", save=True):
    import peft
    import torch
    import transformers
    import trl
    import peft_step
    tmpdir = tempfile.mkdtemp(prefix="sac_step_")
    lines = ["| config | b x s | precision | finetune | checkpoint | torch peak MiB | memplan MiB | diff "
             "| SAC adds: torch MiB | memplan MiB | torch peak at | memplan peak at |", "|" + "---|" * 12]
    for name, cfg, keys, rows in configs(SETTINGS, only, tmpdir):
        for b, s, prec, ft, ck in rows:
            full = ft == "full"
            t = torch_run(cfg, b, s, prec, full, ck)
            m = peft_step.memplan_lora(cfg, b, s, prec, ck, 16, "all-linear", full, 0.0, memplan)
            base_ck = ck.replace("+sac", "")
            tb = torch_run(cfg, b, s, prec, full, base_ck)
            mb = peft_step.memplan_lora(cfg, b, s, prec, base_ck, 16, "all-linear", full, 0.0, memplan)
            row = "| %s | %dx%d | %s | %s | %s | %.2f | %.2f | %+.3f%% | %.2f | %.2f | %s | %s |" % (
                name, b, s, prec, "full" if full else "lora r16 all-linear", ck, t["peak"] / 2**20,
                m["peak"] / 2**20, 100.0 * (m["peak"] - t["peak"]) / t["peak"], (t["peak"] - tb["peak"]) / 2**20,
                (m["peak"] - mb["peak"]) / 2**20, t["peak_at"], m["peak_at"])
            print(row, flush=True)
            lines.append(row)
            if not save:
                continue
            rowlib.save_rows("sac_step", [dict(keys, **{
                "source": "bench/accuracy/sac_step.py trl run of %s" % time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                   time.gmtime()),
                "args": m["args"],
                "figures": {"trainable_params": rowlib.figure(t["trainable"], m["trainable"]),
                            "peak": rowlib.figure(t["peak"], m["peak"])},
                "recorded": {"trainable_params": m["trainable"], "peak": m["peak"], "torch_peak_at": t["peak_at"],
                             "torch_peak_without_sac": tb["peak"], "memplan_peak_without_sac": mb["peak"]},
                "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                                peft=peft.__version__, trl=trl.__version__),
            })])
    if save:
        rowlib.write_results(os.path.join(HERE, "sac_step_results.md"), "\n".join(lines) + "\n")


def torch_run(cfg, b, s, prec, full, ck):
    """peft_step.torch_lora_step under checkpoint ck: layers[:N][+sac]; N > 1 is transformers'
    every_n_layers, a keyword gradient_checkpointing_enable takes (modeling_utils.py:3200) and TRL's
    wrapper passes on."""
    import peft_step
    import transformers
    head = ck.split("+")[0]
    n = int(head[7:]) if head.startswith("layers:") else 1
    mode = "layers+sac" if ck.endswith("+sac") else "layers"
    orig = transformers.PreTrainedModel.gradient_checkpointing_enable

    def every(self, gradient_checkpointing_kwargs=None, **kw):
        return orig(self, gradient_checkpointing_kwargs=gradient_checkpointing_kwargs, every_n_layers=n)
    if n > 1:
        transformers.PreTrainedModel.gradient_checkpointing_enable = every
    try:
        return peft_step.torch_lora_step(cfg, b, s, prec, mode, 16, "all-linear", full)
    finally:
        transformers.PreTrainedModel.gradient_checkpointing_enable = orig


AUTO_SETTINGS = [
    ("llama-1024-v1000", "peft_step.RECOMPUTE_CONFIGS", 0, [(2, 2048, "bf16"), (2, 2048, "amp-bf16")]),
    ("llama-3.2-1b", "models/hf/llama-3.2-1b.json", 4, [(1, 4096, "bf16")]),
    # the target torchtitan's SelectiveAC needs (its plan's device peak): memplan's plan at its memory
    ("llama-3-8b", "models/hf/llama-3-8b.json", 2, [(1, 4096, "bf16", "torchtitan")]),
]


def dev(m):
    """What the fit holds to the target: the allocated peak + context, or reserved + context where
    the caching allocator was simulated."""
    return max(m["peak_device_bytes"], m.get("device_reserved_bytes", 0))


def memplan_json(cmd):
    import subprocess
    r = subprocess.run(cmd, capture_output=True, text=True)
    return json.loads(r.stdout)


def emitted_policy(memplan, cfg, b, s, prec, vram):
    """The context_fn `sac` that `suggest --emit torch` writes for this plan: its lines from
    `import collections` to the policy's return, exec'd as they are."""
    import subprocess
    import torch
    out = subprocess.run([memplan, "suggest", cfg, "--vram", vram, "--margin", "0", "--max-batch", str(b), "--seq",
                          str(s), "--precision", prec, "--checkpoint", "layers+sac:auto", "--workspace", "0",
                          "--use-cache", "off", "--no-probe", "--emit", "torch"], capture_output=True, text=True).stdout
    lines = out.splitlines()
    i = lines.index("import collections")
    j = next(k for k in range(i, len(lines)) if lines[k].strip().startswith("return create_selective"))
    ns = {"torch": torch}
    exec("\n".join(lines[i:j + 1]), ns)  # noqa: S102 (memplan's own output, the thing under test)
    return ns, "\n".join(lines[i:j + 1])


def auto_bench(only=(), memplan="./memplan", save=True):
    import peft
    import torch
    import transformers
    import peft_step
    tmpdir = tempfile.mkdtemp(prefix="sac_auto_")
    lines = ["| config | b x s | precision | target MiB | kept | torch peak MiB | memplan MiB | diff | "
             "layers' memplan MiB |", "|" + "---|" * 9]
    for name, cfg, keys, rows in configs(AUTO_SETTINGS, only, tmpdir):
        for b, s, prec, *at in rows:
            base = [memplan, "check", cfg, "--batch", str(b), "--seq", str(s), "--precision", prec, "--workspace", "0",
                    "--use-cache", "off", "--margin", "0", "--json"]
            lo = memplan_json(base + ["--vram", "1000GiB", "--checkpoint", "layers"])["memory"]
            hi = memplan_json(base + ["--vram", "1000GiB", "--checkpoint", "layers+sac:" + (at[0] if at else "auto")])
            vram = "%dMiB" % ((dev(hi["memory"]) if at else (dev(lo) + dev(hi["memory"])) // 2) // 2**20)
            args = base[3:] + ["--vram", vram, "--checkpoint", "layers+sac:auto"]
            m = memplan_json([memplan, "check", cfg] + args)["memory"]
            ns, code = emitted_policy(memplan, cfg, b, s, prec, vram)
            kept = sorted(ns["keep_mm"]), ns["keep_sdpa"]
            want = sorted(int(x[3:]) for x in m["sac_keep"] if x.startswith("mm:")), "sdpa" in m["sac_keep"]
            assert kept == want, (kept, want)  # suggest's plan at --max-batch b is check's
            orig = transformers.PreTrainedModel.gradient_checkpointing_enable

            def with_sac(self, gradient_checkpointing_kwargs=None, **kw):
                return orig(self, gradient_checkpointing_kwargs=dict(gradient_checkpointing_kwargs or {},
                                                                     context_fn=ns["sac"]), **kw)
            transformers.PreTrainedModel.gradient_checkpointing_enable = with_sac
            try:
                t = peft_step.torch_lora_step(cfg, b, s, prec, "layers", 16, "all-linear", True)
            finally:
                transformers.PreTrainedModel.gradient_checkpointing_enable = orig
            row = "| %s | %dx%d | %s | %s | %s | %.2f | %.2f | %+.3f%% | %.2f |" % (
                name, b, s, prec, vram, " ".join(m["sac_keep"]) or "nothing", t["peak"] / 2**20,
                m["peak_allocated_bytes"] / 2**20, 100.0 * (m["peak_allocated_bytes"] - t["peak"]) / t["peak"],
                lo["peak_allocated_bytes"] / 2**20)
            print(row, flush=True)
            lines.append(row)
            if save:
                rowlib.save_rows("sac_step", [dict(keys, **{
                    "source": "bench/accuracy/sac_step.py auto run of %s" % time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                        time.gmtime()),
                    "command": "check", "args": args,
                    "figures": {"peak": rowlib.figure(t["peak"], m["peak_allocated_bytes"])},
                    "recorded": {"peak": m["peak_allocated_bytes"], "torch_peak_at": t["peak_at"],
                                 "sac_keep": m["sac_keep"], "policy": code},
                    "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                                    peft=peft.__version__),
                })])
    if save:
        rowlib.write_results(os.path.join(HERE, "sac_auto_results.md"), "\n".join(lines) + "\n")


def plan_time(memplan="./memplan"):
    """The planner's wall time on Llama-3.1-70B: full fine-tuning at a target between the plain
    layers' peak and every candidate kept (the most bisection steps), and LoRA on an H100."""
    import subprocess
    cfg = os.path.join(rowlib.ROOT, "models/hf/llama-3.1-70b.json")
    base = [memplan, "check", cfg, "--batch", "4", "--seq", "8192", "--precision", "bf16", "--margin", "0", "--json"]
    lo = dev(memplan_json(base + ["--vram", "4000GiB", "--checkpoint", "layers"])["memory"])
    hi = dev(memplan_json(base + ["--vram", "4000GiB", "--checkpoint", "layers+sac:auto"])["memory"])
    runs = [("full, batch 4, --vram between", base + ["--vram", "%dMiB" % ((lo + hi) // 2 // 2**20),
                                             "--checkpoint", "layers+sac:auto"]),
            ("LoRA r16 all-linear, h100-80gb", [memplan, "estimate", cfg, "--batch", "1", "--seq", "8192", "--gpu",
                                                "h100-80gb", "--finetune", "lora", "--lora-targets", "all-linear",
                                                "--checkpoint", "layers+sac:auto", "--json"])]
    for what, cmd in runs:
        best = None
        for _ in range(5):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True).stdout
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        m = json.loads(out)["memory"]
        print("llama-3.1-70b x8192 bf16, %s: %.3f s (best of 5, the whole command), kept %s, peak %.2f GiB "
              "(layers: %.2f GiB)" % (what, best, " ".join(m.get("sac_keep", [])) or "nothing",
                                     m["peak_device_bytes"] / 2**30, lo / 2**30))


def torchtitan_policy():
    """A context_fn making torchtitan's SelectiveAC policy for one checkpoint call (a fresh mm counter
    each call, as _get_custom_policy's `meta`).  Written from torchtitan b5bcd76c6
    activation_checkpoint.py:31-93 (the save set) and :243-276 (the policy); no MoE router here, so
    force_recompute_mm_shapes_by_fqns matches nothing, and no CUDA-to-CPU copy runs in a layer."""
    import torch
    from torch._functorch.partitioners import get_default_op_list
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    save = {op.default for op in get_default_op_list().compute_intensive_ops}
    save |= {aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_attention_math.default,
             aten._scaled_dot_product_fused_attention_overrideable.default, aten.max.default,
             torch._higher_order_ops.flex_attention, aten.linear.default, aten.topk.default,
             torch.ops._c10d_functional.reduce_scatter_tensor.default,
             torch.ops._c10d_functional.all_to_all_single.default}
    save.add(aten._scaled_dot_product_flash_attention_for_cpu.default)  # CUDA's flash op's stand-in
    mm_ops = (aten.mm.default, aten.linear.default)

    def context_fn():
        meta = {"forward": 0, "recompute": 0}

        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            if func in mm_ops:
                meta[mode] += 1
            if func in save:
                if func in mm_ops and meta[mode] % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)
    return context_fn


def emitted_titan_policy(memplan, cfg, s):
    """The context_fn `sac` that `suggest --checkpoint layers+sac:torchtitan --emit torch` writes,
    its lines exec'd as they are; the CPU's SDPA op added to its save_ops as CUDA's flash op's
    stand-in (the policy reads the module-level set)."""
    import subprocess
    import torch
    out = subprocess.run([memplan, "suggest", cfg, "--gpu", "h200-141gb", "--seq", str(s), "--checkpoint",
                          "layers+sac:torchtitan", "--workspace", "0", "--use-cache", "off", "--no-probe", "--emit",
                          "torch"], capture_output=True, text=True).stdout
    lines = out.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("from torch._functorch.partitioners"))
    j = next(k for k in range(i, len(lines)) if lines[k].strip().startswith("return create_selective"))
    ns = {"torch": torch}
    exec("\n".join(lines[i:j + 1]), ns)  # noqa: S102 (memplan's own output, the thing under test)
    ns["save_ops"].add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert any("early_stop\": False" in ln for ln in lines[j:]), "the emitted checkpoint lacks early_stop=False"
    return ns["sac"]


def torchtitan_run(cfg, b, s, prec, full, fn=None):
    """peft_step.torch_lora_step with every decoder layer under transformers' non-reentrant checkpoint
    given torchtitan's context_fn (or fn) and early_stop=False."""
    import peft_step
    import transformers
    orig = transformers.PreTrainedModel.gradient_checkpointing_enable
    fn = fn or torchtitan_policy()

    def titan(self, gradient_checkpointing_kwargs=None, **kw):
        return orig(self, gradient_checkpointing_kwargs=dict(gradient_checkpointing_kwargs or {}, context_fn=fn,
                                                             early_stop=False), **kw)
    transformers.PreTrainedModel.gradient_checkpointing_enable = titan
    try:
        return peft_step.torch_lora_step(cfg, b, s, prec, "layers", 16, "all-linear", full)
    finally:
        transformers.PreTrainedModel.gradient_checkpointing_enable = orig


# besides SETTINGS' rows that checkpoint every layer: biased Linears (aten.addmm, saved and not
# counted: Qwen2's q/k/v, GPT-2's Conv1D) and fused projections (Phi-3's qkv_proj, gate_up_proj)
TITAN_SETTINGS = [
    ("qwen2-0.5b", "models/hf/qwen2-0.5b.json", 2,
     [(2, 1024, "bf16", "full", "layers+sac"), (2, 1024, "amp-bf16", "lora", "layers+sac")]),
    ("gpt2", "models/hf/gpt2.json", 2, [(2, 1024, "bf16", "full", "layers+sac")]),
    ("phi-3-mini-4k", "models/hf/phi-3-mini-4k.json", 2, [(4, 2048, "bf16", "full", "layers+sac")]),
]


def titan_bench(only=(), memplan="./memplan", save=True):
    import peft
    import torch
    import transformers
    import peft_step
    tmpdir = tempfile.mkdtemp(prefix="sac_titan_")
    lines = ["| config | b x s | precision | finetune | torch peak MiB | memplan MiB | diff | memplan layers MiB "
             "| memplan +sac MiB | torch peak at | memplan peak at |", "|" + "---|" * 11]
    for name, cfg, keys, rows in configs(SETTINGS + TITAN_SETTINGS, only, tmpdir):
        for b, s, prec, ft, ck in rows:
            if not ck.startswith("layers+"):
                continue  # (torchtitan wraps every layer)
            full = ft == "full"
            ck = "layers+sac:torchtitan"
            t = torchtitan_run(cfg, b, s, prec, full)
            te = torchtitan_run(cfg, b, s, prec, full, emitted_titan_policy(memplan, cfg, s))
            assert te["peak"] == t["peak"], ("--emit torch's policy", te["peak"], t["peak"])
            m = peft_step.memplan_lora(cfg, b, s, prec, ck, 16, "all-linear", full, 0.0, memplan)
            ml = peft_step.memplan_lora(cfg, b, s, prec, "layers", 16, "all-linear", full, 0.0, memplan)
            mt = peft_step.memplan_lora(cfg, b, s, prec, "layers+sac", 16, "all-linear", full, 0.0, memplan)
            row = "| %s | %dx%d | %s | %s | %.2f | %.2f | %+.3f%% | %.2f | %.2f | %s | %s |" % (
                name, b, s, prec, "full" if full else "lora r16 all-linear", t["peak"] / 2**20, m["peak"] / 2**20,
                100.0 * (m["peak"] - t["peak"]) / t["peak"], ml["peak"] / 2**20, mt["peak"] / 2**20, t["peak_at"],
                m["peak_at"])
            print(row, flush=True)
            lines.append(row)
            if not save:
                continue
            rowlib.save_rows("sac_step", [dict(keys, **{
                "source": "bench/accuracy/sac_step.py torchtitan run of %s" % time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                          time.gmtime()),
                "args": m["args"],
                "figures": {"trainable_params": rowlib.figure(t["trainable"], m["trainable"]),
                            "peak": rowlib.figure(t["peak"], m["peak"])},
                "recorded": {"trainable_params": m["trainable"], "peak": m["peak"], "torch_peak_at": t["peak_at"],
                             "memplan_peak_layers": ml["peak"], "memplan_peak_trl_sac": mt["peak"]},
                "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                                peft=peft.__version__),
            })])
    if not only or any(o in "vit" for o in only):
        lines += titan_vit(memplan, save)
    if save:
        rowlib.write_results(os.path.join(HERE, "sac_torchtitan_results.md"), "\n".join(lines) + "\n")


# ViT (HF ViTForImageClassification): the patch embedding's convolution is outside the layers the
# policy wraps; the layers' Linears have biases (aten.addmm). torch_step.py's runner (fake tensors,
# CUDA's SDPA kernel where the CPU's differs) with the policy given to transformers' checkpoint.
TITAN_VIT = ("models/hf/vit-base-patch16-224.json", [(16, "fp32"), (16, "amp-bf16"), (32, "bf16")])


def titan_vit(memplan, save):
    import torch
    import transformers
    import torch_step
    path, rows = TITAN_VIT
    with open(os.path.join(rowlib.ROOT, path)) as f:
        cfg = json.load(f)
    orig = transformers.PreTrainedModel.gradient_checkpointing_enable
    fn = torchtitan_policy()

    def titan(self, gradient_checkpointing_kwargs=None, **kw):
        return orig(self, gradient_checkpointing_kwargs=dict(gradient_checkpointing_kwargs or {}, context_fn=fn,
                                                             early_stop=False), **kw)
    lines = []
    for b, prec in rows:
        transformers.PreTrainedModel.gradient_checkpointing_enable = titan
        try:
            t = torch_step.measure_torch(cfg, b, 197, prec, "sdpa", "layers", "adamw")
        finally:
            transformers.PreTrainedModel.gradient_checkpointing_enable = orig
        m = torch_step.measure_memplan(memplan, os.path.join(rowlib.ROOT, path), b, 197, prec, "sdpa",
                                       "layers+sac:torchtitan", "adamw")
        ml = torch_step.measure_memplan(memplan, os.path.join(rowlib.ROOT, path), b, 197, prec, "sdpa", "layers",
                                        "adamw")
        row = "| vit-base-patch16-224 | %dx197 | %s | full | %.2f | %.2f | %+.3f%% | %.2f | - | %s | %s |" % (
            b, prec, t["peak"] / 2**20, m["peak"] / 2**20, 100.0 * (m["peak"] - t["peak"]) / t["peak"],
            ml["peak"] / 2**20, t["peak_at"], m["peak_at"])
        print(row, flush=True)
        lines.append(row)
        if save:
            rowlib.save_rows("sac_step", [{
                "source": "bench/accuracy/sac_step.py torchtitan run of %s" % time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                          time.gmtime()),
                "config": path, "max_layers": 0, "args": m["args"][m["args"].index("--batch"):],
                "figures": {"peak": rowlib.figure(t["peak"], m["peak"])},
                "recorded": {"peak": m["peak"], "torch_peak_at": t["peak_at"], "memplan_peak_layers": ml["peak"]},
                "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__),
            }])
    return lines


def trl_peft():
    import warnings
    warnings.filterwarnings("ignore")
    import tokenizers
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel({"<pad>": 0, "a": 1, "</s>": 2},
                                                                          unk_token="a")),
        pad_token="<pad>", eos_token="</s>")
    ds = Dataset.from_dict({"input_ids": [[1, 2, 3, 4]] * 4})
    for peft_config in (None, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")):
        args = SFTConfig(output_dir=tempfile.mkdtemp(), gradient_checkpointing=True,
                         gradient_checkpointing_kwargs={"selective": True}, bf16=False, report_to=[], max_steps=1,
                         use_cpu=True)
        tr = SFTTrainer(model=transformers.LlamaForCausalLM(cfg), args=args, train_dataset=ds,
                        peft_config=peft_config, processing_class=tok)
        try:
            tr.train()
            base = tr.model.base_model.model if peft_config else tr.model
            kw = base.model.layers[0]._gradient_checkpointing_func.keywords
            print("%s: trained; the layers' checkpoint keywords: %s" % ("LoRA" if peft_config else "full",
                                                                       sorted(kw)))
        except Exception as e:  # noqa: BLE001 (the finding)
            print("%s: %s: %s" % ("LoRA" if peft_config else "full", type(e).__name__, e))


def main(argv):
    if not argv or argv[0] not in ("trl", "trl-peft", "auto", "plan-time", "torchtitan"):
        print(__doc__)
        return 2
    if argv[0] == "trl-peft":
        trl_peft()
        return 0
    only, memplan, save = (), "./memplan", True
    i = 1
    while i < len(argv):
        if argv[i] == "--only":
            only, i = tuple(argv[i + 1].split(",")), i + 1
        elif argv[i] == "--memplan":
            memplan, i = argv[i + 1], i + 1
        elif argv[i] == "--no-save":
            save = False
        i += 1
    if argv[0] == "plan-time":
        plan_time(memplan)
    elif argv[0] == "auto":
        auto_bench(only, memplan, save)
    elif argv[0] == "torchtitan":
        titan_bench(only, memplan, save)
    else:
        trl_bench(only, memplan, save)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
