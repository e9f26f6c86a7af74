#!/usr/bin/env python3
"""grpo_zero3.py - TRL 1.16 GRPO's generation under DeepSpeed ZeRO-3, per rank (CPU, gloo).

  PYTHONPATH=DIR_WITH_DEEPSPEED DS_ACCELERATOR=cpu python3 bench/accuracy/grpo_zero3.py
      [--memplan ./memplan] [--gather on,off] [--finetune full,lora] [--shape small|large]
      [--settings B:S:P,...] [--out FILE.md] [--rows-out FILE.jsonl]

grpo_fsdp.py's model and settings (dist_gloo.py's Llama LLAMA_CFG, vocabulary 32,000, bf16, TRL's
fused LM head added as GRPOTrainer.__init__ adds it), on 2 gloo processes, wrapped by DeepSpeed
0.19.8's own deepspeed.initialize with ZeRO stage 3 (bf16, the client AdamW, and accelerate's
"auto" buckets: reduce hidden^2, prefetch 0.9 hidden^2, stage3_param_persistence_threshold
10 hidden, as memplan assumes; DeepSpeed's CPU accelerator, whose communication backend is gloo
without oneCCL: deepspeed/accelerator/cpu_accelerator.py).  Two GRPO iterations, iteration 2's
generation measured:

  generation  TRL's own trl.models.utils._unwrap_model_for_generation(engine, accelerator,
              gather_deepspeed3_params=G) as grpo_trainer.py:1861-1875 calls it (the accelerator
              is a stand-in carrying what TRL reads from it: deepspeed_plugin.zero_stage 3 and
              unwrap_model), then transformers' generate as grpo_fsdp.py runs it (sampling,
              max_new_tokens = completion, an eos no token samples, the cache on, no_grad).
              G true: GatheredParameters(model.parameters()) with the engine's hooks removed;
              G false: the engine's fetch/release hooks in every forward;
  step        the engine's forward on the generated sequences, a mean of the logits as the loss,
              engine.backward, engine.step: only so that iteration 2 starts from a stepped engine;
              not compared (TRL's fused-head loss fails under this engine: see rank_main).
              With --finetune lora (peft LoRA as TRL makes it under ZeRO-3: lora_wrap) the step is
              grpo_step.py's GRPOTrainer._compute_loss on the engine, engine.backward and
              engine.step, measured (memory.phases.policy_step, figure policy_step_peak).

Live bytes: dist_gloo.py's (profiler allocation records, gloo's scratch taken out), as
grpo_fsdp.py, which also takes out the CPU's mm temporaries of TRL's fused head.  Compared with
  memplan estimate CONFIG --trainer grpo --batch B --num-generations B --seq S
          --completion-length C --precision bf16 --workspace 0 --use-cache off --gpus 2
          --parallel zero3 --ds3-gather on|off --json
memory.phases.generation (figure generation_peak).  Rows: bench/accuracy/rows/grpo_zero3.jsonl.
Needs torch, transformers, trl and deepspeed (installed anywhere on PYTHONPATH; the rows replay
without it).  Not part of make test.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import grpo_step  # noqa: E402,F401  (its imports set torch_step's SDPA patch, as grpo_fsdp.py's rows run)
import rowlib  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from dist_gloo import allocations, exact_cpu_total, live_before, live_bytes, spawn_ranks  # noqa: E402
from grpo_fsdp import SETTINGS, WORLD, gen_config, next_prompts, policy, run_setup  # noqa: E402


def ds_config(hidden):
    """DeepSpeed's config as accelerate fills "auto" for ZeRO-3 (memplan's defaults)."""
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
            "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True,
                                  "reduce_bucket_size": hidden * hidden,
                                  "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                                  "stage3_param_persistence_threshold": 10 * hidden}}


# the LoRA case (--finetune lora): memplan's default rank, peft's default targets for Llama
# (q_proj, v_proj), lora_alpha 2r, no dropout
LORA_R = 16
# --shape: LLAMA_CFG's (small), or a larger one of the same family (hidden 768, 12 heads of 64, 4 kv
# heads, 4 layers), whose weights outweigh the CPU's sampling temporaries (README: results)
SHAPES = {"small": None, "large": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=4,
                                       num_attention_heads=12, num_key_value_heads=4)}


def lora_wrap(model):
    """peft's LoRA as TRL 1.16's GRPOTrainer.__init__ makes it under ZeRO-3 (grpo_trainer.py:461-476):
    get_peft_model with autocast_adapter_dtype=False for a non-quantized base, so the adapters are
    made in the base's bf16 (peft's fp32 upcast skipped); before deepspeed.initialize, which
    partitions the frozen base with them (parameter_offload.py _convert_to_zero_parameters)."""
    import peft
    torch.manual_seed(1)
    return peft.get_peft_model(model, peft.LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0,
                                                      task_type="CAUSAL_LM"), autocast_adapter_dtype=False)


def rank_main(rank, world, port, gather, ft, shape, batch, seq, prompt, result_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed
    from torch.profiler import ProfilerActivity, profile
    from transformers.integrations.deepspeed import HfDeepSpeedConfig
    from trl import GRPOTrainer
    from trl.models.utils import _unwrap_model_for_generation
    from torch_step import backward_and_step  # noqa: F401  (the module's patches)
    deepspeed.init_distributed(dist_backend="gloo")
    assert dist.get_backend() == "gloo", dist.get_backend()
    m = {}
    C = seq - prompt
    acc = types.SimpleNamespace(state=types.SimpleNamespace(deepspeed_plugin=types.SimpleNamespace(zero_stage=3)),
                                unwrap_model=lambda e: e.module)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        exact_cpu_total()
        cfg, model = policy(SHAPES[shape])
        if ft == "lora":
            model = lora_wrap(model)
        model.train()
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4, foreach=True)
        # what TrainingArguments sets under a ZeRO-3 config (transformers integrations/deepspeed.py),
        # read by TRL's fused head: maybe_gather_lm_head_ctx gathers lm_head.weight for the fused
        # kernel only when is_deepspeed_zero3_enabled() (trl/trainer/utils.py:200-230); set after
        # the model is built, so that no zero.Init wraps its construction
        hf_ds = HfDeepSpeedConfig(ds_config(cfg.hidden_size))  # noqa: F841  (a weakref is kept)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(cfg.hidden_size))
        del model, opt
        # (LoRA: the adapters bf16 as the base, autocast_adapter_dtype=False; DeepSpeed casts none)
        assert {q.dtype for q in engine.module.parameters()} == {torch.bfloat16}
        gen_cfg = gen_config(cfg, C)
        g = torch.Generator().manual_seed(rank)
        for it in range(2):
            prompts, pmask = next_prompts(cfg, g, batch, prompt)
            m[(it, "gen0")] = time.time_ns()
            with _unwrap_model_for_generation(engine, acc, gather_deepspeed3_params=gather) as um, torch.no_grad():
                out = um.generate(input_ids=prompts, attention_mask=pmask, generation_config=gen_cfg)
            m[(it, "gen1")] = time.time_ns()
            # a training step between the two generations (not compared): the model's own forward
            # (fused_lm_head unset: trl/trainer/utils.py:1602-1606) and a mean of its logits, then
            # engine.backward and engine.step.  (GRPOTrainer._compute_loss through grpo_step's Stub
            # fails here: the fused head's maybe_gather_lm_head_ctx re-partitions lm_head.weight,
            # which the engine's prefetch has in flight: partition_parameters.py:1779, "Cannot
            # partition a param in flight".)
            if ft == "lora":
                # LoRA: grpo_step.py's GRPO step (its Stub, scored_inputs, GRPOTrainer._compute_loss)
                # on the engine, then engine.backward and engine.step, measured as the policy step
                stub = grpo_step.Stub(engine, None, False, False, 0.0, 1)
                completion = out[:, prompt:].contiguous()
                del out
                inputs, held = grpo_step.scored_inputs(stub, engine, None, prompts, pmask, completion, batch, 1, 0.0,
                                                       None, lambda name, fn: fn())
                dist.barrier()
                gc.collect()
                time.sleep(0.2)
                m[(it, "step0")] = time.time_ns()
                loss = GRPOTrainer._compute_loss(stub, engine, inputs)
                engine.backward(loss)
                del loss
                engine.step()
                m[(it, "step1")] = time.time_ns()
                del inputs, held, completion
                continue
            logits = engine(input_ids=out, attention_mask=torch.ones_like(out)).logits
            loss = logits.float().mean()
            del logits
            engine.backward(loss)
            del loss
            engine.step()
            del out
    raw = allocations(prof)
    import dist_gloo  # (grpo_fsdp.py's CPU-only fused-head mm temporaries, taken out as gloo's scratch)
    gloo_scratch = dist_gloo.is_gloo_scratch
    dist_gloo.is_gloo_scratch = lambda ctx: gloo_scratch(ctx) or ctx.endswith(("ChunkedLogProbFunction > aten::mm",
                                                                                 "ChunkedLogProbFunctionBackward > aten::mm"))
    allocs, unseen, residual = live_bytes(raw)
    t0, t1 = m[(1, "gen0")], m[(1, "gen1")]
    w = [a for a in allocs if t0 <= a[0] < t1]
    start = live_before(allocs, t0)
    pk = max(w, key=lambda a: a[1]) if w else (t0, start, "none")
    step = {}
    if (1, "step0") in m:
        s0, s1 = m[(1, "step0")], m[(1, "step1")]
        ws = [a for a in allocs if s0 <= a[0] < s1]
        sk = max(ws, key=lambda a: a[1]) if ws else (s0, live_before(allocs, s0), "none")
        step = dict(step_start=live_before(allocs, s0), step_peak=max(sk[1], live_before(allocs, s0)),
                    step_where=sk[2][-160:])
        if os.environ.get("GRPO_ZERO3_ALIVE"):
            from dist_gloo import alive_at
            from dpo_fsdp_ref import classify
            print(rank, "step", json.dumps(alive_at(raw, sk[0], s0, top=30, classify=classify), indent=0))
    res = dict(rank=rank, gen_start=start, gen_peak=max(pk[1], start), gen_where=pk[2][-160:],
               gen_end=live_before(allocs, t1), unseen_frees=len(unseen), residual=residual, **step)
    if os.environ.get("GRPO_ZERO3_ALIVE"):
        from dist_gloo import alive_at
        from dpo_fsdp_ref import classify
        print(rank, "generation", json.dumps(alive_at(raw, pk[0], t0, classify=classify), indent=0))
    with open(os.path.join(result_dir, f"r{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run_case(gather, ft, shape, batch, seq, prompt):
    return spawn_ranks(rank_main, WORLD, gather, ft, shape, batch, seq, prompt)


def memplan_args(gather, ft, batch, seq, prompt):
    return ["--trainer", "grpo", "--batch", str(batch), "--num-generations", str(batch), "--seq", str(seq),
            "--completion-length", str(seq - prompt), "--steps-per-generation", "1", "--precision", "bf16",
            "--checkpoint", "none", "--workspace", "0", "--use-cache", "off", "--gpus", str(WORLD),
            "--parallel", "zero3", "--ds3-gather", gather] + (
                ["--finetune", "lora", "--lora-r", str(LORA_R)] if ft == "lora" else []) + ["--json"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memplan", default=os.path.join(rowlib.ROOT, "memplan"))
    ap.add_argument("--gather", default="on,off")
    ap.add_argument("--shape", default="small", choices=sorted(SHAPES))
    ap.add_argument("--finetune", default="full", help="full, lora, or both comma-separated")
    ap.add_argument("--settings", default=None, help="e.g. 8:64:16 (completions:seq:prompt), comma-separated")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rows-out", default=None)
    a = ap.parse_args()
    settings = SETTINGS if not a.settings else [tuple(int(x) for x in s.split(":")) for s in a.settings.split(",")]
    import deepspeed
    cj, cfgpath, versions = run_setup({"deepspeed": deepspeed.__version__},
                                      "gloo, %d processes (DeepSpeed's CPU accelerator)" % WORLD, SHAPES[a.shape])
    lines, rows = [], []
    for ft, gather in [(f, g) for f in a.finetune.split(",") for g in a.gather.split(",")]:
        for batch, seq, prompt in settings:
            t0 = time.time()
            res = run_case(gather == "on", ft, a.shape, batch, seq, prompt)
            args = memplan_args(gather, ft, batch, seq, prompt)
            d = json.loads(subprocess.run([a.memplan, "estimate", cfgpath] + args, capture_output=True, text=True,
                                          check=True).stdout)
            ph = d["memory"]["phases"]["generation"]
            mg, ms = ph["peak_allocated_bytes"], d["memory"]["phases"]["policy_step"]["peak_allocated_bytes"]
            for r in res:
                gp, sp = r["gen_peak"], r.get("step_peak")
                line = ("| %s | %s | %d | %d | %d | %d | %s | %s | %s | %+.3f %% | %s | %s | %s | %s | %.0f s |" %
                        (ft, gather, batch, seq, prompt, r["rank"], f"{r['gen_start']:,}", f"{gp:,}", f"{mg:,}",
                         100.0 * (mg - gp) / gp, f"{ph['gathered_bytes']:,}", f"{sp:,}" if sp else "-",
                         f"{ms:,}" if sp else "-", "%+.3f %%" % (100.0 * (ms - sp) / sp) if sp else "-",
                         time.time() - t0))
                print(line, "|", r["gen_where"][-90:], "|", r.get("step_where", "")[-90:], "| unseen",
                      r["unseen_frees"], "residual", r["residual"], flush=True)
                lines.append(line)
                figs = {"generation_peak": {"torch": gp, "extra": 0, "pct": 1.0, "abs": 0}}
                rec = {"generation_peak": mg}
                if sp:
                    figs["policy_step_peak"] = {"torch": sp, "extra": 0, "pct": 1.0, "abs": 0}
                    rec["policy_step_peak"] = ms
                if gather != "on":  # (--ds3-gather off: the series is not reliable, README: results)
                    continue
                # a figure beyond the replay's 1 % is shown above and not kept: the small shape's LoRA
                # generation, the CPU's sampling temporaries (grpo_zero3_results.md)
                for k in [k for k in figs if abs(rec[k] - figs[k]["torch"]) > 0.01 * figs[k]["torch"]]:
                    print("not kept:", k, "rank", r["rank"], flush=True)
                    del figs[k], rec[k]
                if not figs:
                    continue
                rows.append({"args": args, "config": "dist_gloo.py's Llama LLAMA_CFG%s, vocabulary 32000, bf16%s (rank %d)" % (
                    "" if a.shape == "small" else " (grpo_zero3.py's %s shape)" % a.shape,
                    ", peft LoRA r %d" % LORA_R if ft == "lora" else "", r["rank"]),
                             "config_json": cj, "oracle": "grpo_zero3", "figures": figs, "recorded": rec,
                             "source": "bench/accuracy/grpo_zero3.py (run %s)" % versions["memplan"],
                             "versions": versions})
    head = ["| finetune | ds3_gather | completions | seq | prompt | rank | live at start | generation (torch) | memplan | "
            "diff | memplan gathered_bytes | policy step (torch) | memplan | diff | time |", "|---" * 15 + "|"]
    if a.out:
        rowlib.write_results(a.out, "\n".join(head + lines) + "\n")
    if a.rows_out:  # (merged with the rows already there: rowlib.save_rows)
        rowlib.save_rows("grpo_zero3", rows, a.rows_out)


if __name__ == "__main__":
    main()
