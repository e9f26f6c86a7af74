#!/usr/bin/env python3
"""grpo_fsdp.py - TRL 1.16 GRPO's generation and policy step under FSDP2, per rank (CPU, gloo).

  python3 bench/accuracy/grpo_fsdp.py [--memplan ./memplan] [--strategies fsdp,fsdp-no-reshard]
                                      [--out FILE.md] [--rows-out FILE.jsonl]

dist_gloo.py's small Llama (LLAMA_CFG: hidden 256, 3 layers, sdpa) with vocabulary 32,000, in bf16,
sharded over 2 gloo processes by accelerate 1.15's own fsdp2_prepare_model (dist_gloo.
accelerate_fsdp2: a unit per LlamaDecoderLayer, embed_tokens alone, the tail [norm, lm_head] with
reshard_after_forward=False, the root), after TRL's fused LM head is added as GRPOTrainer.__init__
adds it (outputs log_probs, entropy; loss_heads.trl_cuda_branches, as grpo_step.py).  Two GRPO
iterations (steps_per_generation 1, beta 0, one process's batch of completions), iteration 2
measured:

  generation  what TRL 1.16 runs for FSDP2 (grpo_trainer.py:1861-1875): unwrap_model_for_generation
              yields the module itself (models/utils.py:151-152: not ZeRO-3) and
              self._dist.summon_full_params is a no-op for FSDP2 (trl/distributed.py:74-91), so
              transformers' generate calls the fully_shard'ed model, whose hooks all-gather each
              unit in every forward (prefill and each decoding step) and reshard it after, but the
              root and units built with reshard_after_forward=False (torch 2.15
              _fsdp_param_group.py:586-590, _fsdp_state.py:222-226).  Sampling, max_new_tokens =
              completion, an eos id the vocabulary never samples (every completion full length),
              the cache on, torch.no_grad;
  step        grpo_step.py's: GRPOTrainer._compute_loss on its Stub, backward, AdamW (foreach),
              zero_grad(set_to_none=True).
Strategy "none" runs the same in one process without FSDP2 (memplan without --parallel): the
harness's own single-device check.

Live bytes: dist_gloo.py's (the profiler's allocation records, c10's exact running total, gloo's
scratch taken out).  A barrier, gc and a pause before each phase let gloo's worker drop the last
Work (and with it FSDP2's last all-gather buffer).  Compared with
  memplan estimate CONFIG --trainer grpo --batch B --num-generations B --seq S
          --completion-length C --precision bf16 --workspace 0 --use-cache off --gpus 2
          --parallel STRATEGY --json
memory.phases.generation (figure generation_peak) and memory.phases.policy_step
(policy_step_peak).  The CPU allocator does not round; memplan's figures are CUDA's 512-byte
rounded ones (a few KiB on this model).  Rows: bench/accuracy/rows/grpo_fsdp.jsonl.  Needs torch,
transformers, trl, accelerate.  Not part of make test.
"""
import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import grpo_step  # noqa: E402  (its imports set torch_step's SDPA patch, as its rows run)
import rowlib  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from dist_gloo import (LLAMA_CFG, accelerate_fsdp2, allocations, exact_cpu_total, live_before,  # noqa: E402
                       live_bytes, spawn_ranks)

WORLD = 2
# LLAMA_CFG with grpo_step.py's vocabulary (32,000): TRL's fused head allocates its tile 32,768 wide
# whatever the vocabulary, and memplan's figure for that head's backward is measured at this width
# (grpo_step_results.md); the embedding and the tail unit are then 16 MB each, gathered in generate
VOCAB = 32000
# (completions a rank generates = its step's batch, seq = prompt + completion, prompt tokens)
SETTINGS = [(8, 64, 16), (4, 128, 32)]


def policy(shape=None):
    """The measured policy: LLAMA_CFG with VOCAB (and shape's sizes over them), sdpa, bf16, seed 0,
    and TRL's fused head added as GRPOTrainer.__init__ adds it (grpo_trainer.py:1068-1077)."""
    import transformers
    from loss_heads import trl_cuda_branches
    cfg = transformers.LlamaConfig(**dict(LLAMA_CFG, vocab_size=VOCAB, **(shape or {})))
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    trl_cuda_branches()(model, outputs=("log_probs", "entropy"))
    return cfg, model


def gen_config(cfg, completion):
    """TRL's sampling as measured here: max_new_tokens = completion, an eos id the vocabulary never
    samples (every completion full length), the cache on, no compile."""
    from transformers import GenerationConfig
    return GenerationConfig(max_new_tokens=completion, do_sample=True, pad_token_id=0, bos_token_id=1,
                            eos_token_id=[cfg.vocab_size + 7], cache_implementation=None, disable_compile=True)


def next_prompts(cfg, g, batch, prompt):
    """An iteration's prompts and mask, then a barrier, gc and a pause (gloo's worker drops its
    last Work) before the phase is timed."""
    prompts = torch.randint(3, cfg.vocab_size, (batch, prompt), generator=g)
    dist.barrier()
    gc.collect()
    time.sleep(0.2)
    return prompts, torch.ones_like(prompts)


def rank_main(rank, world, port, strategy, batch, seq, prompt, result_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.profiler import ProfilerActivity, profile
    from trl import GRPOTrainer
    from torch_step import backward_and_step  # noqa: F401  (the module's patches)
    m = {}
    C = seq - prompt
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        exact_cpu_total()
        cfg, model = policy()
        if strategy != "none":  # ("none": one process, no FSDP2: the same step on one device)
            model = accelerate_fsdp2(model, strategy, False)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        stub = grpo_step.Stub(model, None, False, False, 0.0, 1)
        gen_cfg = gen_config(cfg, C)
        g = torch.Generator().manual_seed(rank)
        for it in range(2):
            prompts, pmask = next_prompts(cfg, g, batch, prompt)
            m[(it, "gen0")] = time.time_ns()
            with torch.no_grad():
                out = model.generate(input_ids=prompts, attention_mask=pmask, generation_config=gen_cfg)
            m[(it, "gen1")] = time.time_ns()
            completion = out[:, prompt:].contiguous()
            del out
            inputs, held = grpo_step.scored_inputs(stub, model, None, prompts, pmask, completion, batch, 1, 0.0,
                                                   None, lambda name, fn: fn())
            dist.barrier()
            gc.collect()
            time.sleep(0.2)
            m[(it, "step0")] = time.time_ns()
            loss = GRPOTrainer._compute_loss(stub, model, inputs)
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
            m[(it, "step1")] = time.time_ns()
            del inputs, held, completion
    raw = allocations(prof)
    # CPU-only: TRL's fused head runs torch.mm(hidden, w.t(), out=tile) into a column slice of its
    # 32,768-wide buffer (chunked_logprob.py:413-425); the CPU's mm makes a contiguous result of its
    # own for that strided out and copies it in, cuBLAS writes the strided tile in place.  Those
    # blocks are taken out as gloo's scratch is (a dispatch-mode tracker, grpo_step.py's, never sees
    # them: mm.out returns its out)
    import dist_gloo
    gloo_scratch = dist_gloo.is_gloo_scratch
    dist_gloo.is_gloo_scratch = lambda ctx: gloo_scratch(ctx) or ctx.endswith(("ChunkedLogProbFunction > aten::mm",
                                                                                 "ChunkedLogProbFunctionBackward > aten::mm"))
    allocs, unseen, residual = live_bytes(raw)

    def live_at(t):
        return live_before(allocs, t)

    def window(t0, t1):
        w = [a for a in allocs if t0 <= a[0] < t1]
        pk = max(w, key=lambda a: a[1]) if w else (t0, live_at(t0), "none")
        return max(pk[1], live_at(t0)), pk[2][-160:], pk[0]

    gen_peak, gen_where, tg = window(m[(1, "gen0")], m[(1, "gen1")])
    step_peak, step_where, ts = window(m[(1, "step0")], m[(1, "step1")])
    if os.environ.get("GRPO_FSDP_ALIVE"):  # (what is alive at each peak, for a look)
        from dist_gloo import alive_at
        from dpo_fsdp_ref import classify
        print(rank, "generation", json.dumps(alive_at(raw, tg, m[(1, "gen0")], classify=classify), indent=0))
        print(rank, "step", json.dumps(alive_at(raw, ts, m[(1, "step0")], classify=classify), indent=0))
    res = dict(rank=rank, gen_start=live_at(m[(1, "gen0")]), gen_peak=gen_peak, gen_where=gen_where,
               step_start=live_at(m[(1, "step0")]), step_peak=step_peak, step_where=step_where,
               unseen_frees=len(unseen), residual=residual)
    with open(os.path.join(result_dir, f"r{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run_case(strategy, batch, seq, prompt):
    return spawn_ranks(rank_main, 1 if strategy == "none" else WORLD, strategy, batch, seq, prompt)


def config_json(shape=None):
    c = dict(LLAMA_CFG, vocab_size=VOCAB, **(shape or {}))
    c.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", rms_norm_eps=1e-6,
             rope_theta=10000.0, attention_dropout=0.0, torch_dtype="bfloat16")
    import transformers
    full = transformers.LlamaConfig(**LLAMA_CFG).to_dict()
    c["rms_norm_eps"], c["rope_theta"] = full["rms_norm_eps"], full.get("rope_theta", 10000.0)
    if "rope_parameters" in full and full["rope_parameters"]:
        c["rope_theta"] = full["rope_parameters"].get("rope_theta", c["rope_theta"])
    return c


def run_setup(libs, backend, shape=None):
    """config_json(shape) written to a temporary config.json, and the rows' versions (libs added)."""
    cj = config_json(shape)
    cfgpath = os.path.join(tempfile.mkdtemp(), "config.json")
    with open(cfgpath, "w") as f:
        json.dump(cj, f)
    import transformers
    import trl
    versions = dict({"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                     "python": platform.python_version(),
                     "machine": "%s, %d cores" % (platform.machine(), os.cpu_count()), "tensors": "real, CPU",
                     "backend": backend, "memplan": rowlib.git_commit()}, **libs)
    return cj, cfgpath, versions


def memplan_args(strategy, batch, seq, prompt):
    return ["--trainer", "grpo", "--batch", str(batch), "--num-generations", str(batch), "--seq", str(seq),
            "--completion-length", str(seq - prompt), "--steps-per-generation", "1", "--precision", "bf16",
            "--checkpoint", "none", "--workspace", "0", "--use-cache", "off"] + (
                [] if strategy == "none" else ["--gpus", str(WORLD), "--parallel", strategy]) + ["--json"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memplan", default=os.path.join(rowlib.ROOT, "memplan"))
    ap.add_argument("--strategies", default="none,fsdp,fsdp-no-reshard")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rows-out", default=None)
    a = ap.parse_args()
    import accelerate
    cj, cfgpath, versions = run_setup({"accelerate": accelerate.__version__}, "gloo, %d processes" % WORLD)
    lines, rows = [], []
    for strategy in a.strategies.split(","):
        for batch, seq, prompt in SETTINGS:
            t0 = time.time()
            res = run_case(strategy, batch, seq, prompt)
            args = memplan_args(strategy, batch, seq, prompt)
            d = json.loads(subprocess.run([a.memplan, "estimate", cfgpath] + args, capture_output=True, text=True,
                                          check=True).stdout)
            ph = d["memory"]["phases"]
            mg, ms = ph["generation"]["peak_allocated_bytes"], ph["policy_step"]["peak_allocated_bytes"]
            for r in res:
                gp, sp = r["gen_peak"], r["step_peak"]
                line = ("| %s | %d | %d | %d | %d | %s | %s | %+.3f %% | %s | %s | %+.3f %% | %.0f s |" %
                        (strategy, batch, seq, prompt, r["rank"], f"{gp:,}", f"{mg:,}", 100.0 * (mg - gp) / gp,
                         f"{sp:,}", f"{ms:,}", 100.0 * (ms - sp) / sp, time.time() - t0))
                print(line, "|", r["gen_where"][-80:], "|", r["step_where"][-80:], flush=True)
                lines.append(line)
                rows.append({"args": args, "config": "dist_gloo.py's Llama LLAMA_CFG, vocabulary 32000, bf16 (rank %d)" % r["rank"],
                             "config_json": cj, "oracle": "grpo_fsdp",
                             "figures": {"generation_peak": {"torch": gp, "extra": 0, "pct": 1.0, "abs": 0},
                                         "policy_step_peak": {"torch": sp, "extra": 0, "pct": 1.0, "abs": 0}},
                             "recorded": {"generation_peak": mg, "policy_step_peak": ms},
                             "source": "bench/accuracy/grpo_fsdp.py (run %s)" % versions["memplan"],
                             "versions": versions})
    head = ["| strategy | completions | seq | prompt | rank | generation (torch) | memplan | diff | "
            "policy step (torch) | memplan | diff | time |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(head + lines) + "\n")
    if a.rows_out:
        with open(a.rows_out, "w") as f:
            for r in rows:
                f.write(json.dumps(r, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
