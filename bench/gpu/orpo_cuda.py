#!/usr/bin/env python3
"""orpo_cuda.py — memplan --trainer orpo against TRL's ORPOTrainer step on a CUDA GPU (the GPU kit's
`orpo` part; bench/accuracy/orpo_step.py is the same step on the CPU, with CUDA's branches set by
hand).

  python3 bench/gpu/orpo_cuda.py --memplan PATH --out FILE.json [--steps N] [--budget-s S] [--cpu-smoke]

Each row is a step of TRL 1.16.0's ORPOTrainer as orpo_step.py runs it (its module doc):
ORPOTrainer.compute_loss on a stand-in trainer with ORPOConfig's defaults, the batch ORPO's
collator makes (pairs of prompt + chosen and prompt + rejected, no padding), the model set up as
ORPOTrainer.__init__ and the Trainer set it up (dropout disabled; LoRA r16 all-linear; input
gradients and checkpointing), then backward, AdamW (foreach), zero_grad.  Here TRL's log-prob
kernel takes its Triton path itself and autograd sums gradients as plain PyTorch does: nothing is
patched.  Under amp-bf16 the forward runs as accelerate's prepare wraps it: CUDA's autocast, then
convert_outputs_to_fp32 (the logits an fp32 copy).  After one warm-up step the peak stats are
reset: the measured step's max_memory_allocated against memplan's peak_allocated_bytes (absolute:
what is resident is in both).  memplan runs with --workspace W, W the bytes one cuBLAS handle took
here (dpo_cuda.workspace_probe).  Writes {"status", "workspaces", "rows": [...]}.
"""
import json
import os
import sys
import tempfile
import time
import types

T0 = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "accuracy"))
sys.path.insert(0, HERE)

TINY, ONE_B = "tiny", "llama-3.2-1b (2 layers)"
# (config, finetune, checkpointing, pairs, seq, prompt, precision): the most informative first
ROWS = [(TINY, "full", "none", 2, 257, 129, "bf16"),
        (TINY, "full", "none", 2, 257, 129, "amp-bf16"),
        (ONE_B, "full", "layers", 1, 1025, 513, "bf16"),
        (ONE_B, "full", "none", 1, 513, 257, "amp-bf16"),
        (ONE_B, "lora", "layers", 2, 1025, 513, "bf16"),
        (TINY, "lora", "none", 2, 257, 129, "amp-bf16")]
FIRST_ROW_S = {TINY: 15.0, ONE_B: 45.0}


def prepare(torch, transformers, peft, cfg, ft, ck, prec, dev):
    """The model on dev as orpo_step.prepare sets it up (CUDA's autocast under amp-bf16); (model, AdamW)."""
    from accelerate.utils.operations import convert_outputs_to_fp32
    from trl.trainer.utils import disable_dropout_in_model
    wdt = torch.bfloat16 if prec == "bf16" else torch.float32
    with torch.device(dev):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=wdt).to(dev)
    if ck == "layers":
        model.enable_input_require_grads()  # orpo_trainer.py:232-239 (PEFT) and :254-262
    if ft == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                           target_modules="all-linear", task_type="CAUSAL_LM"))
    disable_dropout_in_model(model)
    model.train()
    if ck == "layers":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if prec == "amp-bf16":  # accelerate 1.15 prepare_model: autocast, then the outputs made fp32
        model.forward = types.MethodType(torch.autocast(dev.type, dtype=torch.bfloat16)(model.forward.__func__),
                                         model)
        model.forward = types.MethodType(convert_outputs_to_fp32(model.forward.__func__), model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6, foreach=True)
    return model, opt


def step_rows(memplan, steps, out_path, budget_s=None, smoke=False, only=()):
    import torch
    import transformers
    import peft
    from trl.experimental.orpo import ORPOTrainer
    from dpo_cuda import finish, out_of_time, row_config, settle, start_result
    from dpo_step import CONFIG, memplan_run
    import orpo_step

    configs = {TINY: CONFIG, ONE_B: orpo_step.one_b_config()}
    todo = [r for r in ROWS if r[0] == TINY][:2] if smoke else ROWS
    dev, result, save, ws_one = start_result(torch, smoke, out_path)
    slowest = {}
    with tempfile.TemporaryDirectory() as tmp:
        for row in todo:
            name, ft, ck, pairs, seq, prompt, prec = row
            if smoke:
                pairs, seq, prompt = 1, 48, 16
            label = "%s/%s/%s/%s/%dx%d" % (name, ft, ck, prec, pairs, seq)
            if only and not any(x in label for x in only):
                continue
            if out_of_time(result, label, 1.2 * slowest.get(name, FIRST_ROW_S[name]), budget_s, T0):
                continue
            t_row = time.perf_counter()
            path, cfg = row_config(transformers, configs[name], tmp)
            settle(torch)
            alloc_start = torch.cuda.memory_allocated()
            model, opt = prepare(torch, transformers, peft, cfg, ft, ck, prec, dev)
            stub = orpo_step.Stub()
            stub.args.device = stub.accelerator.device = dev
            inputs = orpo_step.orpo_inputs(cfg.vocab_size, pairs, seq, prompt, dev)
            peak = 0
            for s in range(1 + steps):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                loss = ORPOTrainer.compute_loss(stub, model, inputs)
                loss.backward()
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                if s:
                    peak = max(peak, torch.cuda.max_memory_allocated())
            args = [a for a in orpo_step.memplan_args(ft, ck, pairs, seq, prompt, prec) if a not in ("--workspace", "0")]
            if ws_one > 0:
                args += ["--workspace", str(ws_one)]
            m = memplan_run(memplan, path, args)
            del model, opt, stub, inputs
            settle(torch)
            secs = time.perf_counter() - t_row
            slowest[name] = max(slowest.get(name, 0.0), secs)
            mp = m["peak_allocated_bytes"]
            result["rows"].append({
                "config": name, "finetune": ft, "checkpoint": ck, "pairs": pairs, "seq": seq, "prompt": prompt,
                "precision": prec, "args": args, "torch_peak": peak, "memplan_peak": mp,
                "peak_pct": round(100.0 * (mp - peak) / peak, 3) if peak else None,
                "memplan_peak_event": m["peak_event"], "alloc_start": alloc_start, "seconds": round(secs, 1)})
            print(json.dumps(result["rows"][-1]), flush=True)
            save()
    return finish(result, save, T0)


def main():
    from dpo_cuda import common_parser, run_rows
    run_rows(common_parser(__doc__).parse_args(), "orpo_cuda", step_rows)


if __name__ == "__main__":
    main()
