#!/usr/bin/env python3
"""zero2_lora_dtype.py - the adapters' dtype after DeepSpeed ZeRO-1/2 wraps a peft LoRA model (CPU).

  PYTHONPATH=DIR_WITH_DEEPSPEED DS_ACCELERATOR=cpu python3 bench/accuracy/zero2_lora_dtype.py [--memplan ./memplan]

A small Llama (dist_gloo.py's LLAMA_CFG shape, bf16 weights, random) is wrapped by peft LoRA
(r 16, q_proj/v_proj: the adapters fp32, peft's autocast_adapter_dtype) and handed to DeepSpeed
0.19.8's own deepspeed.initialize (one gloo process, its CPU accelerator) with the config
`memplan suggest --emit deepspeed` writes for --parallel zero1 / zero2 at --precision mixed-bf16
(its "bf16": {"enabled": true}; --precision bf16 writes the same block) and at amp-bf16 (its
"torch_autocast"), train_batch_size set for the one process.  Printed per case: the dtypes of
the adapters and of the frozen base after initialize, and memplan's adapter dtype for the same
run (the estimate report's finetune line).  DeepSpeed casts every floating
parameter of a model not made under zero.Init to its bf16 (engine.py:1859-1862,
_cast_module_mixed_precision): memplan plans bf16 adapters there (mp_par_adapters_cast).

Needs torch, transformers, peft and deepspeed; not part of make test.  Exits 1 on a mismatch.
"""
import argparse
import json
import os
import socket
import subprocess
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CFG = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=1024, hidden_size=256,
           intermediate_size=704, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           max_position_embeddings=256, rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False)


def memplan_config(memplan, cfg_path, stage, precision):
    cmd = [memplan, "suggest", cfg_path, "--gpu", "a100-80gb", "--gpus", "2", "--parallel", stage,
           "--precision", precision, "--finetune", "lora", "--seq", "64", "--emit", "deepspeed"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):out.rindex("}") + 1])


def memplan_adapter_dtype(memplan, cfg_path, stage, precision):
    """The adapters' dtype the text report's finetune line states (report.c finetune_lines)."""
    cmd = [memplan, "estimate", cfg_path, "--gpus", "2", "--parallel", stage, "--precision", precision,
           "--finetune", "lora", "--seq", "64", "--batch", "2"]
    out = " ".join(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split())
    said = out[out.index("adapter params train (") + 22:].split(")")[0]
    return "fp32" if said.startswith("fp32") else "bf16" if said.startswith("bf16") else said


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memplan", default="./memplan")
    a = ap.parse_args()
    import tempfile
    import torch
    import transformers
    import peft
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", DS_ACCELERATOR="cpu")
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    d = tempfile.mkdtemp(prefix="zero2_lora_")
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(CFG, f)
    bad = 0
    print("| stage | memplan precision | DeepSpeed block | adapters after initialize | base | memplan adapters |")
    print("|---|---|---|---|---|---|")
    for stage in ("zero1", "zero2"):
        for prec in ("mixed-bf16", "bf16", "amp-bf16"):
            try:
                ds = memplan_config(a.memplan, cfg_path, stage, prec)
            except subprocess.CalledProcessError as e:  # (suggest finds no --precision bf16 DeepSpeed row)
                ds = None
                why = e.stderr.strip().splitlines()[0] if e.stderr.strip() else "rc %d" % e.returncode
            if ds is None and prec == "bf16":  # suggest skips DeepSpeed at non-mixed bf16: the block
                ds = dict(mixed_ds)                # snippet_deepspeed writes for both (report.c)
            if ds is None:
                print("| %s | %s | (suggest: %s) | | | |" % (stage, prec, why[:60]))
                continue
            if prec == "mixed-bf16":
                mixed_ds = dict(ds)
            ds["train_batch_size"] = ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"]
            torch.manual_seed(0)
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CFG)).to(torch.bfloat16)
            model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                               task_type="CAUSAL_LM"))
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
            engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
            ad = {str(p.dtype) for n, p in engine.module.named_parameters() if p.requires_grad}
            base = {str(p.dtype) for n, p in engine.module.named_parameters() if not p.requires_grad}
            mp = memplan_adapter_dtype(a.memplan, cfg_path, stage, prec)
            block = "bf16" if ds.get("bf16", {}).get("enabled") else "torch_autocast" if "torch_autocast" in ds else "none"
            want = {"torch.bfloat16"} if block == "bf16" else {"torch.float32"}
            ok = ad == want and mp == ("bf16" if block == "bf16" else "fp32")
            bad += not ok
            print("| %s | %s | %s | %s | %s | %s%s |" % (stage, prec, block, ",".join(sorted(ad)), ",".join(sorted(base)),
                                                      mp, "" if ok else " MISMATCH"), flush=True)
            del engine, model, opt
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
