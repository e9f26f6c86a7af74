#!/usr/bin/env python3
"""peft_step.py — memplan's fine-tuning figures against transformers + peft + bitsandbytes on the CPU.

  python3 bench/peft_step.py qlora-bytes [CONFIG ...]
      QLoRA base storage as bitsandbytes really holds it: every Linear that
      transformers' bnb integration replaces (all nn.Linear but lm_head) is quantized
      with bitsandbytes.functional.quantize_4bit (nf4, blocksize 64, double quant) on
      the CPU, one real tensor per distinct shape, and the bytes of every tensor of
      its quant state are summed (packed weight, absmax, offset, second-level absmax,
      both code tables).  Non-quantized parameters (embeddings, norms, lm_head, biases)
      are counted in fp32, as after peft's prepare_model_for_kbit_training.  Prints
      memplan's weights_bytes for `--finetune qlora` beside it.

Needs torch, transformers, peft, bitsandbytes (pip).  Not part of `make test`.
"""
import json
import subprocess
import sys
import warnings
from collections import Counter

warnings.filterwarnings("ignore")


def meta_model(path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def bnb_linear_bytes(out_f, in_f, double_quant=True, quant_type="nf4"):
    import torch
    import bitsandbytes.functional as F
    w = torch.randn(out_f, in_f, dtype=torch.bfloat16)
    packed, st = F.quantize_4bit(w, blocksize=64, compress_statistics=double_quant, quant_type=quant_type)
    tensors = [packed, st.absmax, st.code]
    if st.nested:
        tensors += [st.offset, st.state2.absmax, st.state2.code]
    return sum(t.numel() * t.element_size() for t in tensors)


def qlora_bytes(path):
    import torch
    m = meta_model(path)
    head = m.get_output_embeddings()
    shapes = Counter()
    other = 0
    quantized_ids = set()
    for name, mod in m.named_modules():
        if isinstance(mod, torch.nn.Linear) and mod is not head:
            shapes[(mod.out_features, mod.in_features)] += 1
            quantized_ids.add(id(mod.weight))
    seen = set()
    for p in m.parameters():
        if id(p) in quantized_ids or id(p) in seen:
            continue
        seen.add(id(p))
        other += p.numel() * 4
    q = sum(n * bnb_linear_bytes(o, i) for (o, i), n in shapes.items())
    return q + other, q, other, dict(shapes)


def memplan_weights(path, *extra):
    out = subprocess.run(["./memplan", "estimate", path, "--seq", "16", "--json", *extra],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["memory"]["weights_bytes"]


def main(argv):
    if len(argv) >= 1 and argv[0] == "qlora-bytes":
        paths = argv[1:] or ["models/hf/llama-3-8b.json", "models/hf/llama-2-70b.json"]
        print(f"{'config':32} {'bitsandbytes':>16} {'memplan':>16}  diff   (quantized Linears / fp32 rest)")
        for p in paths:
            total, q, other, shapes = qlora_bytes(p)
            mp = memplan_weights(p, "--finetune", "qlora")
            print(f"{p:32} {total:16,d} {mp:16,d}  {mp - total:+d}   ({q:,d} / {other:,d})")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
