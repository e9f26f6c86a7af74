#!/usr/bin/env python3
"""grpo_cuda.py — memplan --trainer grpo against TRL's GRPOTrainer step on a CUDA GPU (the GPU kit's
`grpo` part; bench/accuracy/grpo_step.py is the same step on the CPU, with CUDA's branches set by
hand).

  python3 bench/gpu/grpo_cuda.py --memplan PATH --out FILE.json [--steps N] [--budget-s S] [--cpu-smoke]

Each row is one generation batch of TRL 1.16.0's GRPOTrainer, as grpo_step.py runs it (its module
doc): transformers' `generate` on the policy under torch.no_grad with checkpointing off and TRL's
GenerationConfig (no completion stops early); with steps_per_generation 2 over an accumulation of
1 the policy's old log-probs (GRPOTrainer._get_per_token_logps_and_entropies, a micro-batch at a
time); with beta > 0 the reference's (a frozen copy, or the adapter disabled); then
GRPOTrainer._compute_loss on the first micro-batch, backward, AdamW (foreach), zero_grad.  Here
TRL's fused head takes its CUDA branches itself (Triton, the compact gather) and generate samples
with CUDA's torch.multinomial: nothing is patched.  After one warm-up iteration the peak stats are
reset at each phase's start: each phase's max_memory_allocated is its peak (absolute: what is
resident is in it), against memplan's memory.phases figures, and the largest against
peak_allocated_bytes.  Under amp-bf16 each model's forward runs under CUDA's autocast with its
outputs made fp32 (convert_outputs_to_fp32), as accelerate wraps the model it prepares (a
PeftModel's generate calls the base model's own forward: no autocast there, which the row
checks).  memplan runs with --workspace W, W the bytes one cuBLAS
handle took here (dpo_cuda.workspace_probe).  Writes {"status", "workspaces", "rows": [...]}.
"""
import gc
import json
import os
import sys
import tempfile
import time

T0 = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "accuracy"))
sys.path.insert(0, HERE)

TINY, ONE_B = "tiny", "llama-3.2-1b (2 layers)"
# (config, finetune, checkpointing, completions, seq, prompt, beta, precision, steps_per_generation,
# temperature): the most informative first
ROWS = [(TINY, "full", "none", 8, 528, 16, 0.0, "bf16", 1, 1.0),
        (TINY, "lora", "layers", 8, 528, 16, 0.04, "bf16", 2, 1.0),
        (TINY, "full", "none", 8, 256, 128, 0.04, "bf16", 2, 1.0),
        (TINY, "lora", "layers", 8, 528, 16, 0.0, "amp-bf16", 1, 1.0),
        (TINY, "full", "none", 8, 256, 128, 0.0, "amp-bf16", 2, 0.7),
        (ONE_B, "full", "none", 8, 640, 128, 0.0, "bf16", 1, 1.0),
        (ONE_B, "lora", "layers", 8, 640, 128, 0.04, "bf16", 2, 0.7)]
FIRST_ROW_S = {TINY: 20.0, ONE_B: 60.0}


def step_rows(memplan, steps, out_path, budget_s=None, smoke=False, only=()):
    import torch
    import transformers
    from transformers import GenerationConfig
    from trl import GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import add_fused_lm_head
    import rowlib
    from dpo_cuda import finish, out_of_time, row_config, settle, start_result
    from dpo_step import CONFIG, memplan_run, prepare
    from grpo_step import Stub, memplan_args, scored_inputs

    configs = {TINY: CONFIG, ONE_B: rowlib.load_config(os.path.join(ROOT, "models/hf/llama-3.2-1b.json"), 2)}
    todo = [r for r in ROWS if r[0] == TINY][:2] if smoke else ROWS
    dev, result, save, ws_one = start_result(torch, smoke, out_path)
    slowest = {}
    with tempfile.TemporaryDirectory() as tmp:
        for row in todo:
            name, ft, ck, n, seq, prompt, beta, prec, K, temp = row
            if smoke:
                n, seq, prompt = 4, 48, 16
            label = "%s/%s/%s/%s/beta%g/K%d/T%g" % (name, ft, ck, prec, beta, K, temp)
            if only and not any(x in label for x in only):
                continue
            if out_of_time(result, label, 1.2 * slowest.get(name, FIRST_ROW_S[name]), budget_s, T0):
                continue
            t_row = time.perf_counter()
            path, cfg = row_config(transformers, configs[name], tmp)
            wdt = torch.bfloat16 if prec == "bf16" else torch.float32
            settle(torch)
            alloc_start = torch.cuda.memory_allocated()
            with torch.device(dev):
                model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=wdt).to(dev)
                ref = None
                if ft == "full" and beta > 0:  # grpo_trainer.py:983-1003: the model again, frozen
                    ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=wdt).to(dev).eval()
                    ref.requires_grad_(False)
            model, _, opt = prepare(model, ref, ft, ck, False, add_fused_lm_head, ("log_probs", "entropy"))
            stub = Stub(model, ref, False, ck == "layers", beta, K)
            stub.accelerator.device = dev
            if prec == "amp-bf16":  # accelerate's prepare: the forward under autocast, its outputs fp32
                from accelerate.utils.operations import convert_outputs_to_fp32
                for m in (model, ref):
                    if m is not None:
                        m.forward = convert_outputs_to_fp32(torch.autocast(dev.type, dtype=torch.bfloat16)(m.forward))
            C = seq - prompt
            gen_cfg = GenerationConfig(max_new_tokens=C, do_sample=True, pad_token_id=0, bos_token_id=1,
                                       eos_token_id=[cfg.vocab_size + 7], temperature=temp, top_p=1.0, top_k=0,
                                       min_p=None, repetition_penalty=1.0, cache_implementation=None,
                                       disable_compile=True)
            gc_kw = {"use_reentrant": False} if ck == "layers" else None
            ph = {}

            def phase(key, fn):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                out = fn()
                torch.cuda.synchronize()
                ph[key] = torch.cuda.max_memory_allocated()
                return out
            for s in range(1 + steps):
                ph.clear()
                prompts = torch.randint(3, cfg.vocab_size, (n * K, prompt), device=dev)
                pmask = torch.ones_like(prompts)

                def generate():
                    with torch.no_grad(), disable_gradient_checkpointing(model, gc_kw):
                        return model.generate(input_ids=prompts, attention_mask=pmask, generation_config=gen_cfg)
                out = phase("generation", generate)
                completion = out[:, prompt:].contiguous()
                del out
                inputs, held = scored_inputs(stub, model, ref, prompts, pmask, completion, n, K, beta, gc_kw,
                                             phase, ("old_logprobs_forward", "reference_forward"))
                del held  # (TRL's _generate_and_score_completions frees them as it returns)

                def policy():
                    loss = GRPOTrainer._compute_loss(stub, model, inputs)
                    loss.backward()
                    del loss
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                phase("policy_step", policy)
                del inputs, completion, prompts, pmask
            args = [a for a in memplan_args(ft, ck, n, seq, prompt, beta, prec, steps_per_generation=K,
                                            temperature=temp) if a not in ("--workspace", "0")]
            if ws_one > 0:
                args += ["--workspace", str(ws_one)]
            m = memplan_run(memplan, path, args)
            mph = {k: v["peak_allocated_bytes"] for k, v in m.get("phases", {}).items()}
            del model, ref, opt, stub
            settle(torch)
            secs = time.perf_counter() - t_row
            slowest[name] = max(slowest.get(name, 0.0), secs)
            peak = max(ph.values())
            mp = m["peak_allocated_bytes"]
            result["rows"].append({
                "config": name, "finetune": ft, "checkpoint": ck, "completions": n, "seq": seq, "prompt": prompt,
                "beta": beta, "precision": prec, "steps_per_generation": K, "temperature": temp, "args": args,
                "torch_peak": peak, "memplan_peak": mp, "peak_pct": round(100.0 * (mp - peak) / peak, 3),
                "torch_phases": dict(ph), "memplan_phases": mph,
                "phase_pct": {k: round(100.0 * (mph[k] - v) / v, 3) for k, v in ph.items() if k in mph and v},
                "memplan_peak_event": m["peak_event"], "alloc_start": alloc_start, "seconds": round(secs, 1)})
            print(json.dumps(result["rows"][-1]), flush=True)
            save()
    return finish(result, save, T0)


def main():
    from dpo_cuda import common_parser, run_rows
    run_rows(common_parser(__doc__).parse_args(), "grpo_cuda", step_rows)


if __name__ == "__main__":
    main()
