#!/usr/bin/env python3
"""grpo_zero3.py - TRL 1.16 GRPO's generation under DeepSpeed ZeRO-3, per rank (CPU, gloo).

  PYTHONPATH=DIR_WITH_DEEPSPEED DS_ACCELERATOR=cpu python3 bench/accuracy/grpo_zero3.py
      [--memplan ./memplan] [--gather on,off] [--out FILE.md] [--rows-out FILE.jsonl]

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


def rank_main(rank, world, port, gather, batch, seq, prompt, result_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed
    from torch.profiler import ProfilerActivity, profile
    from transformers.integrations.deepspeed import HfDeepSpeedConfig
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
        cfg, model = policy()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        # what TrainingArguments sets under a ZeRO-3 config (transformers integrations/deepspeed.py),
        # read by TRL's fused head: maybe_gather_lm_head_ctx gathers lm_head.weight for the fused
        # kernel only when is_deepspeed_zero3_enabled() (trl/trainer/utils.py:200-230); set after
        # the model is built, so that no zero.Init wraps its construction
        hf_ds = HfDeepSpeedConfig(ds_config(cfg.hidden_size))  # noqa: F841  (a weakref is kept)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(cfg.hidden_size))
        del model, opt
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
    res = dict(rank=rank, gen_start=start, gen_peak=max(pk[1], start), gen_where=pk[2][-160:],
               gen_end=live_before(allocs, t1), unseen_frees=len(unseen), residual=residual)
    if os.environ.get("GRPO_ZERO3_ALIVE"):
        from dist_gloo import alive_at
        from dpo_fsdp_ref import classify
        print(rank, "generation", json.dumps(alive_at(raw, pk[0], t0, classify=classify), indent=0))
    with open(os.path.join(result_dir, f"r{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run_case(gather, batch, seq, prompt):
    return spawn_ranks(rank_main, WORLD, gather, batch, seq, prompt)


def memplan_args(gather, batch, seq, prompt):
    return ["--trainer", "grpo", "--batch", str(batch), "--num-generations", str(batch), "--seq", str(seq),
            "--completion-length", str(seq - prompt), "--steps-per-generation", "1", "--precision", "bf16",
            "--checkpoint", "none", "--workspace", "0", "--use-cache", "off", "--gpus", str(WORLD),
            "--parallel", "zero3", "--ds3-gather", gather, "--json"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memplan", default=os.path.join(rowlib.ROOT, "memplan"))
    ap.add_argument("--gather", default="on,off")
    ap.add_argument("--settings", default=None, help="e.g. 8:64:16 (completions:seq:prompt), comma-separated")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rows-out", default=None)
    a = ap.parse_args()
    settings = SETTINGS if not a.settings else [tuple(int(x) for x in s.split(":")) for s in a.settings.split(",")]
    import deepspeed
    cj, cfgpath, versions = run_setup({"deepspeed": deepspeed.__version__},
                                      "gloo, %d processes (DeepSpeed's CPU accelerator)" % WORLD)
    lines, rows = [], []
    for gather in a.gather.split(","):
        for batch, seq, prompt in settings:
            t0 = time.time()
            res = run_case(gather == "on", batch, seq, prompt)
            args = memplan_args(gather, batch, seq, prompt)
            d = json.loads(subprocess.run([a.memplan, "estimate", cfgpath] + args, capture_output=True, text=True,
                                          check=True).stdout)
            ph = d["memory"]["phases"]["generation"]
            mg = ph["peak_allocated_bytes"]
            for r in res:
                gp = r["gen_peak"]
                line = ("| %s | %d | %d | %d | %d | %s | %s | %s | %+.3f %% | %s | %.0f s |" %
                        (gather, batch, seq, prompt, r["rank"], f"{r['gen_start']:,}", f"{gp:,}", f"{mg:,}",
                         100.0 * (mg - gp) / gp, f"{ph['gathered_bytes']:,}", time.time() - t0))
                print(line, "|", r["gen_where"][-90:], "| unseen", r["unseen_frees"], "residual", r["residual"],
                      flush=True)
                lines.append(line)
                rows.append({"args": args, "config": "dist_gloo.py's Llama LLAMA_CFG, vocabulary 32000, bf16 (rank %d)" % r["rank"],
                             "config_json": cj, "oracle": "grpo_zero3",
                             "figures": {"generation_peak": {"torch": gp, "extra": 0, "pct": 1.0, "abs": 0}},
                             "recorded": {"generation_peak": mg},
                             "source": "bench/accuracy/grpo_zero3.py (run %s)" % versions["memplan"],
                             "versions": versions})
    head = ["| ds3_gather | completions | seq | prompt | rank | live at start | generation (torch) | memplan | diff | "
            "memplan gathered_bytes | time |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    if a.out:
        rowlib.write_results(a.out, "\n".join(head + lines) + "\n")
    if a.rows_out:  # (merged with the rows already there: rowlib.save_rows)
        rowlib.save_rows("grpo_zero3", rows, a.rows_out)


if __name__ == "__main__":
    main()
