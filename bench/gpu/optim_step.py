#!/usr/bin/env python3
"""optim_step.py - each optimizer's state and step temporaries on a CUDA GPU, as the HF Trainer
builds it, against memplan's optimizer_bytes and optimizer_tmp_bytes (issue 26).

  python3 bench/gpu/optim_step.py --out FILE.json [--memplan PATH] [--budget-s S]

GPT-2 (models/hf/gpt2.json, transformers from the config) on the GPU in fp32 and in bf16, every
parameter trainable, each gradient set to randn_like; the optimizer is the one
transformers.Trainer.create_optimizer() makes for TrainingArguments(optim=NAME) (its decay and
no-decay parameter groups, its kwargs).  Step 1 (the state is made lazily in it): the bytes
memory_allocated() gained, and mem_get_info's device bytes (paged bitsandbytes states live in
CUDA managed memory, outside the caching allocator).  Step 2: max_memory_allocated() above what
was allocated before it: the step's temporaries.  memplan: `estimate gpt2.json --precision P
--optimizer NAME --json` (memory.optimizer_bytes, optimizer_tmp_bytes).  Each row is written to
FILE as it finishes; an optimizer whose library is missing is listed as such.  Without a GPU: exits
0 writing {"status": "skipped"}.
"""
import argparse
import gc
import json
import os
import subprocess
import tempfile
import time

import gpu_json

T0 = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OPTIMS = ["adamw_torch", "adamw_torch_fused", "adafactor", "adamw_bnb_8bit", "paged_adamw_8bit", "lion_8bit",
          "paged_lion_8bit", "sgd", "adamw_torch_8bit", "adamw_torch_4bit"]


def memplan_opt(memplan, prec, name):
    p = subprocess.run([memplan, "estimate", os.path.join(ROOT, "models/hf/gpt2.json"), "--batch", "1", "--seq", "128",
                        "--precision", prec, "--optimizer", name, "--json"], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        return {"error": p.stderr.strip()[:200]}
    m = json.loads(p.stdout)["memory"]
    return {"optimizer_bytes": m["optimizer_bytes"], "optimizer_tmp_bytes": m["optimizer_tmp_bytes"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--memplan", default=os.path.join(ROOT, "memplan"))
    ap.add_argument("--budget-s", type=float, default=120)
    a = ap.parse_args()
    res = gpu_json.start(a.out, "rows")
    if res is None:
        return
    import torch
    import transformers
    res["transformers"] = transformers.__version__
    with open(os.path.join(ROOT, "models/hf/gpt2.json")) as f:
        cfgd = json.load(f)
    cfgd.pop("model_type", None)
    conf = transformers.GPT2Config(**cfgd)
    with tempfile.TemporaryDirectory() as tmp:
        for prec, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            for name in OPTIMS:
                if time.perf_counter() - T0 > a.budget_s:
                    res.setdefault("skipped", []).append("%s/%s" % (prec, name))
                    continue
                row = {"precision": prec, "optim": name, "memplan": memplan_opt(a.memplan, prec, name)}
                model = opt = trainer = None
                try:
                    gc.collect()
                    torch.cuda.empty_cache()
                    with torch.device("cuda"):
                        model = transformers.GPT2LMHeadModel(conf).to(dt)
                    for p in model.parameters():
                        p.grad = torch.randn_like(p)
                    args = transformers.TrainingArguments(output_dir=tmp, optim=name, report_to=[], save_strategy="no")
                    trainer = transformers.Trainer(model=model, args=args)
                    opt = trainer.create_optimizer()
                    row["optimizer_class"] = type(opt).__module__ + "." + type(opt).__name__
                    row["groups"] = [len(g["params"]) for g in opt.param_groups]
                    torch.cuda.synchronize()
                    before, free0 = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
                    opt.step()
                    torch.cuda.synchronize()
                    row["state_allocated"] = torch.cuda.memory_allocated() - before
                    row["state_device"] = free0 - torch.cuda.mem_get_info()[0]
                    before = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    opt.step()
                    torch.cuda.synchronize()
                    row["step_tmp"] = torch.cuda.max_memory_allocated() - before
                    row["after_step2"] = torch.cuda.memory_allocated() - before
                    row["status"] = "ok"
                except Exception as e:  # noqa: BLE001 - a missing library or a refusal is a result
                    row.update(status="FAILED", error=repr(e)[:300])
                del model, opt, trainer
                res["rows"].append(row)
                gpu_json.save(a.out, res)
                print(json.dumps({k: row.get(k) for k in ("precision", "optim", "status", "state_allocated",
                                                          "state_device", "step_tmp", "memplan", "error")}),
                      flush=True)
    res["status"] = "ok"
    res["seconds"] = round(time.perf_counter() - T0, 1)
    gpu_json.save(a.out, res)


if __name__ == "__main__":
    main()
