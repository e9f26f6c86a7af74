#!/bin/sh
# parsers_check.sh - the trainers' own parsers read memplan's recipe corpus and the recipes
# `suggest --write-recipe` writes back: LLaMA-Factory 0.9.5's HfArgumentParser over its dataclasses,
# in a stack it supports (its extras/misc.py check_dependencies: transformers <= 5.6.0, peft <=
# 0.20.0, trl <= 0.24.0, datasets <= 4.0.0), Axolotl 0.19.0's pydantic AxolotlInputConfig, and
# torchtune 0.6.1's config.validate (every _component_ importable, its arguments bound; memplan
# refuses that recipe's loss, which it cannot write back).
# Needs pip and the network; installs into DIR/lf, DIR/axolotl and DIR/tt (default DIR
# /tmp/memplan-parsers)
# with --no-deps beside the system's torch and accelerate.  Not part of make test
# (tests/recipes_real.py checks these files as YAML where the trainers do not import).
#   sh bench/recipes/parsers_check.sh [DIR]
set -eu
cd "$(dirname "$0")/../.."
R=${1:-/tmp/memplan-parsers}
D=$R/lf
pip install -q --no-deps --target "$R/axolotl" axolotl==0.19.0 pillow
pip install -q --no-deps --target "$R/tt" torchtune==0.6.1 torchao==0.13.0 omegaconf antlr4-python3-runtime==4.9.3 \
    sentencepiece tiktoken
pip install -q --no-deps --target "$D" llamafactory==0.9.5 omegaconf antlr4-python3-runtime==4.9.3 \
    transformers==5.6.0 tokenizers==0.22.2 "huggingface_hub>=1.5,<2" datasets==4.0.0 peft==0.20.0 \
    trl==0.24.0 httpx httpcore h11
OUT=$(mktemp -d)
./memplan suggest --recipe tests/data/recipes/llamafactory-lora.yaml --gpu a100-40gb --no-probe --json \
    --write-recipe "$OUT/written.yaml" > "$OUT/rec.json"
PYTHONPATH="$D" python3 - "$OUT" <<'PY'
import json, sys
import transformers, peft, trl, datasets
from transformers import HfArgumentParser
import transformers.training_args as ta
ta.is_torch_bf16_gpu_available = lambda *a, **k: True  # as on an Ampere+ GPU: bf16=True needs one
from llamafactory.hparams.parser import _TRAIN_ARGS
out = sys.argv[1]
print("transformers %s, peft %s, trl %s, datasets %s" % (transformers.__version__, peft.__version__,
                                                         trl.__version__, datasets.__version__))
rec = json.load(open(out + "/rec.json"))["recommendation"]
bad = 0
for path in ("tests/data/recipes/llamafactory-lora.yaml", "tests/data/recipes/llamafactory-defaults.yaml",
             out + "/written.yaml"):
    m, d, t, f, g = HfArgumentParser(_TRAIN_ARGS).parse_yaml_file(path, allow_extra_keys=False)
    print("ok   %s: batch %d, accumulation %d, bf16 %s, %s, cutoff_len %d" % (
        path, t.per_device_train_batch_size, t.gradient_accumulation_steps, t.bf16, f.finetuning_type, d.cutoff_len))
    if path.endswith("written.yaml") and (t.per_device_train_batch_size, t.gradient_accumulation_steps) != \
            (rec["micro_batch"], rec["grad_accum"]):
        print("FAIL the written recipe is not memplan's plan (%d, %d)" % (rec["micro_batch"], rec["grad_accum"]))
        bad += 1
sys.exit(bad)
PY
./memplan suggest models/hf/llama-3.2-1b.json --recipe tests/data/recipes/axolotl-qlora.yaml --gpu a100-40gb \
    --no-probe --json --write-recipe "$OUT/written-ax.yaml" > "$OUT/rec-ax.json"
PYTHONPATH="$R/axolotl" python3 - "$OUT" <<'PY'
import json, sys
import yaml
import axolotl
from axolotl.utils.schemas.config import AxolotlInputConfig
out = sys.argv[1]
print("axolotl %s" % axolotl.__version__)
rec = json.load(open(out + "/rec-ax.json"))["recommendation"]
bad = 0
for path in ("tests/data/recipes/axolotl-full.yaml", "tests/data/recipes/axolotl-qlora.yaml", out + "/written-ax.yaml"):
    with open(path) as f:
        c = AxolotlInputConfig(**yaml.safe_load(f))
    print("ok   %s: micro_batch_size %d, gradient_accumulation_steps %d, adapter %s" % (
        path, c.micro_batch_size, c.gradient_accumulation_steps, c.adapter))
    if path.endswith("written-ax.yaml") and (c.micro_batch_size, c.gradient_accumulation_steps) != \
            (rec["micro_batch"], rec["grad_accum"]):
        print("FAIL the written recipe is not memplan's plan (%d, %d)" % (rec["micro_batch"], rec["grad_accum"]))
        bad += 1
sys.exit(bad)
PY
PYTHONPATH="$R/tt" python3 - <<'PY'
from omegaconf import OmegaConf
import torchtune
from torchtune.config._validate import validate
for path in ("tests/data/recipes/torchtune-full.yaml",):
    cfg = OmegaConf.load(path)
    validate(cfg)
    print("ok   %s: torchtune %s's config.validate (batch_size %d, gradient_accumulation_steps %d)" % (
        path, torchtune.__version__, cfg.batch_size, cfg.gradient_accumulation_steps))
PY
