"""recipes_real.py: the recipes of tests/data/recipes/ are real ones, as their trainers read them.

Usage: python3 tests/recipes_real.py   (from the repository root; make test-cli runs it)

* every file parses as YAML (PyYAML; JSON is YAML);
* transformers: hf-trainingargs.json constructs TrainingArguments(**dump) and dumps back to the
  same keys; hf-args.yaml goes through HfArgumentParser(TrainingArguments).parse_yaml_file with no
  extra key;
* TRL: the trl-*.yaml files go through HfArgumentParser((ScriptArguments, SFTConfig, ModelConfig))
  .parse_yaml_file as `trl sft --config` reads them (no extra key), and the values memplan reads
  (tests/test_recipe.c) are the dataclasses' (max_length, bf16, gradient_checkpointing, loss_type,
  lora_* defaults);
* LLaMA-Factory, Axolotl, torchtune: their parsers need the whole package; checked when it imports.

A library that is absent is reported as "skip" and does not fail the run.  bf16=True needs a bf16
GPU in TrainingArguments' validation; on a machine without one the check is patched out for the
construction (the dump was written the same way), which is said on the line.
"""
import glob
import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
D = "tests/data/recipes"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, fail, failures, ok, skip  # noqa: E402


try:
    import yaml
except ImportError:
    yaml = None
if yaml is None:
    skip("PyYAML absent: the files' YAML syntax is not checked")
else:
    for path in sorted(glob.glob(D + "/*.yaml") + glob.glob(D + "/*.json")):
        try:
            with open(path) as f:
                doc = yaml.safe_load(f)
            check(isinstance(doc, dict), "%s: a YAML mapping" % path)
        except yaml.YAMLError as e:
            fail("%s: %s" % (path, e))

try:
    import transformers
    import transformers.training_args as ta
    from transformers import HfArgumentParser, TrainingArguments
except ImportError:
    transformers = None
if transformers is None:
    skip("transformers absent: the HF recipes are not constructed")
else:
    bf16_gpu = ta.is_torch_bf16_gpu_available()
    if not bf16_gpu:  # as on an Ampere+ GPU: this box has none (the dump was written the same way)
        ta.is_torch_bf16_gpu_available = lambda *a, **k: True
    note = "" if bf16_gpu else " (bf16 GPU check patched: no bf16 GPU here)"
    with open(D + "/hf-trainingargs.json") as f:
        dump = json.load(f)
    dump.pop("hub_token", None)  # to_json_string() masks it as "<HUB_TOKEN>"
    args = TrainingArguments(**dump)
    back = json.loads(args.to_json_string())
    check(set(back) == set(dump) | {"hub_token"},
          "hf-trainingargs.json: TrainingArguments(**dump) in transformers %s%s" % (transformers.__version__, note))
    check(args.per_device_train_batch_size == 2 and args.gradient_accumulation_steps == 8 and args.bf16 and
          args.gradient_checkpointing and args.optim == "adamw_torch",
          "hf-trainingargs.json: batch 2, accumulation 8, bf16, checkpointing, adamw_torch")
    (hy,) = HfArgumentParser(TrainingArguments).parse_yaml_file(D + "/hf-args.yaml", allow_extra_keys=False)
    check(hy.fp16 and hy.per_device_train_batch_size == 4 and hy.optim == "adamw_torch_fused" and
          not hy.gradient_checkpointing and hy.use_cache is False,
          "hf-args.yaml: HfArgumentParser reads it; fp16, batch 4, default optim adamw_torch_fused, use_cache off")

try:
    import trl
    from trl import ModelConfig, ScriptArguments, SFTConfig
except ImportError:
    trl = None
if transformers is None or trl is None:
    skip("trl absent: the TRL recipes are not parsed")
else:
    parser = HfArgumentParser((ScriptArguments, SFTConfig, ModelConfig))
    script, sft, model = parser.parse_yaml_file(D + "/trl-sft-lora.yaml", allow_extra_keys=False)
    check(sft.per_device_train_batch_size == 4 and sft.gradient_accumulation_steps == 4 and sft.max_length == 2048 and
          sft.bf16 and sft.gradient_checkpointing and sft.loss_type == "nll" and model.dtype == "bfloat16" and
          model.use_peft and model.lora_r == 32 and model.lora_alpha == 16 and model.lora_dropout == 0.05 and
          model.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"] and model.attn_implementation == "sdpa",
          "trl-sft-lora.yaml: trl %s reads what memplan reads (bf16 and checkpointing on by default)" % trl.__version__)
    script, sft, model = parser.parse_yaml_file(D + "/trl-sft-qlora.yaml", allow_extra_keys=False)
    check(sft.max_length == 1024 and sft.per_device_train_batch_size == 8 and sft.bf16 and model.dtype == "float32" and
          model.load_in_4bit and model.use_bnb_nested_quant and model.lora_r == 16 and model.lora_alpha == 32 and
          model.bnb_4bit_quant_type == "nf4",
          "trl-sft-qlora.yaml: trl's defaults are the ones memplan applies (max_length 1024, batch 8, float32, r 16)")
    # the KTO recipes (--trainer kto): KTOConfig reads them; memplan's reading of each (estimate --json)
    # says what TRL's does: the batch, the length, LoRA, the KL term (loss_type kto)
    from trl import KTOConfig
    kparser = HfArgumentParser((ScriptArguments, KTOConfig, ModelConfig))
    _, kto, kmodel = kparser.parse_yaml_file(D + "/trl-kto-lora.yaml", allow_extra_keys=False)
    import subprocess
    mp = os.environ.get("MEMPLAN", "./memplan")
    if os.access(mp, os.X_OK):
        r = subprocess.run([mp, "estimate", "--trainer", "kto", "--recipe", D + "/trl-kto-lora.yaml", "--json"],
                           capture_output=True, text=True)
        cfg = json.loads(r.stdout)["config"] if r.returncode in (0, 1) else {}
        check(cfg.get("batch") == kto.per_device_train_batch_size and cfg.get("seq_len") == kto.max_length and
              kto.loss_type == "kto" and kto.precompute_ref_log_probs is False and kmodel.use_peft and
              cfg.get("reference") == "adapter-disabled" and cfg.get("trainer") == "kto",
              "trl-kto-lora.yaml: KTOConfig (trl %s) and memplan read batch %s, max_length %s, loss_type kto, "
              "PEFT (the reference the adapter disabled)" % (trl.__version__, cfg.get("batch"), cfg.get("seq_len")))
    # the ORPO recipe (--trainer orpo): trl 1.16's ORPOConfig (trl.experimental.orpo) reads it
    from trl.experimental.orpo import ORPOConfig
    _, orpo, omodel = HfArgumentParser((ScriptArguments, ORPOConfig, ModelConfig)).parse_yaml_file(
        D + "/trl-orpo-lora.yaml", allow_extra_keys=False)
    if os.access(mp, os.X_OK):
        r = subprocess.run([mp, "estimate", "--trainer", "orpo", "--recipe", D + "/trl-orpo-lora.yaml", "--json"],
                           capture_output=True, text=True)
        cfg = json.loads(r.stdout)["config"] if r.returncode in (0, 1) else {}
        check(cfg.get("batch") == orpo.per_device_train_batch_size and cfg.get("seq_len") == orpo.max_length and
              cfg.get("sequences") == 2 * orpo.per_device_train_batch_size and omodel.use_peft and
              (cfg.get("finetune") or {}).get("mode") == "lora" and cfg.get("loss") == "hf" and cfg.get("trainer") == "orpo" and
              cfg.get("disable_dropout") is orpo.disable_dropout is True and orpo.gradient_checkpointing and
              cfg.get("checkpoint") == "layers",
              "trl-orpo-lora.yaml: ORPOConfig (trl %s) and memplan read %s pairs (%s sequences), max_length %s, "
              "PEFT, the model's own logits (loss hf), dropout disabled, gradient checkpointing (the defaults)"
              % (trl.__version__, cfg.get("batch"), cfg.get("sequences"), cfg.get("seq_len")))
    _, apo, _ = kparser.parse_yaml_file(D + "/trl-kto-apo.yaml", allow_extra_keys=False)
    _, one, _ = kparser.parse_yaml_file(D + "/trl-kto-batch1.yaml", allow_extra_keys=False)
    check(apo.loss_type == "apo_zero_unpaired" and one.per_device_train_batch_size == 1,
          "trl-kto-apo.yaml, trl-kto-batch1.yaml: KTOConfig reads loss_type apo_zero_unpaired (memplan: "
          "--trainer kto-apo) and the batch of 1 memplan refuses for kto")

# bf16 weights with bf16=True are memplan's bf16-amp (src/recipe/recipe.c precision_of): the Trainer
# hands mixed_precision "bf16" to accelerate, whose prepare() wraps the forward in autocast whatever
# the weights' dtype.  Run here on the CPU (accelerate's CPU bf16 autocast; the GPU's is the same
# wrapper with device_type cuda).
try:
    import torch
    import accelerate
except ImportError:
    accelerate = None
if accelerate is None:
    skip("accelerate absent: bf16=True's autocast over bf16 weights not run")
else:
    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.seen = None

        def forward(self, x):
            self.seen = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
            return self.lin(x)

    acc = accelerate.Accelerator(mixed_precision="bf16", cpu=True)
    probe = acc.prepare(Probe().to(torch.bfloat16))
    probe(torch.zeros(2, 4, dtype=torch.bfloat16))
    check(probe.seen == (True, torch.bfloat16),
          "accelerate %s: mixed_precision bf16 runs a bf16 model's forward under bf16 autocast (%s): "
          "memplan's bf16-amp" % (accelerate.__version__, probe.seen))

try:
    from llamafactory.hparams import get_train_args  # noqa: F401
    have_lf = True
except Exception:  # its import pulls datasets, peft, ...
    have_lf = False
if not have_lf:
    skip("llamafactory absent: its recipes are checked as YAML only")
else:
    from llamafactory.hparams.parser import _TRAIN_ARGS
    for name in ("llamafactory-lora.yaml", "llamafactory-defaults.yaml", "llamafactory-dpo-lora.yaml",
                 "llamafactory-kto-lora.yaml"):
        HfArgumentParser(_TRAIN_ARGS).parse_yaml_file(os.path.join(D, name), allow_extra_keys=False)
        ok("%s: LLaMA-Factory's parser reads it" % name)

for mod, what in (("axolotl", "Axolotl"), ("torchtune", "torchtune")):
    try:
        __import__(mod)
        skip("%s imports, but its config validation needs a GPU environment: YAML only" % what)
    except Exception:
        skip("%s absent: its recipes are checked as YAML only" % what)

# suggest --write-recipe: the recipe memplan hands back is read by the trainer's own parser, and
# says the recommendation's micro-batch and accumulation (memplan's --json), every other key as it was
MEMPLAN = os.environ.get("MEMPLAN", "./memplan")
WRITTEN = [  # (recipe, MODEL or None, the dataclasses that read it, more arguments)
    ("hf-trainingargs.json", "models/hf/llama-3.2-1b.json", "hf-json", []),
    ("hf-args.yaml", "models/hf/gpt2.json", "hf-yaml", []),
    ("trl-sft-lora.yaml", None, "trl", []),
    ("llamafactory-lora.yaml", None, "lf", []),
    ("llamafactory-dpo-lora.yaml", None, "lf", ["--trainer", "dpo"]),
    ("llamafactory-kto-lora.yaml", None, "lf", ["--trainer", "kto"]),
    # a GRPOConfig (GRPOConfig has no length: --seq); its __post_init__ checks the generation batch
    # holds whole groups of num_generations
    ("trl-grpo-vllm.yaml", None, "trl-grpo", ["--trainer", "grpo", "--seq", "768"]),
    ("trl-grpo-sampling.yaml", None, "trl-grpo", ["--trainer", "grpo", "--seq", "512"]),
    ("trl-orpo-lora.yaml", None, "trl-orpo", ["--trainer", "orpo"]),
]
if not os.access(MEMPLAN, os.X_OK):
    skip("%s not built: the written recipes are not checked" % MEMPLAN)
elif transformers is None:
    skip("transformers absent: the written recipes are not parsed")
else:
    import subprocess
    import tempfile
    tmp = tempfile.mkdtemp(prefix="memplan-recipes-")
    for name, model, how, more in WRITTEN:
        src, out = os.path.join(D, name), os.path.join(tmp, name)
        cmd = [MEMPLAN, "suggest"] + ([model] if model else []) + ["--recipe", src, "--gpu", "a100-40gb",
                                                                  "--no-probe", "--json", "--write-recipe", out] + more
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            fail("%s: %s exited %d: %s" % (name, " ".join(cmd), p.returncode, p.stderr.strip()))
            continue
        rec = json.loads(p.stdout)["recommendation"]
        mb, ga = rec["micro_batch"], rec["grad_accum"]
        if how == "hf-json":
            with open(out) as f:
                args = TrainingArguments(**{k: v for k, v in json.load(f).items() if k != "hub_token"})
        elif how == "hf-yaml":
            (args,) = HfArgumentParser(TrainingArguments).parse_yaml_file(out, allow_extra_keys=False)
        elif how in ("trl", "trl-grpo", "trl-orpo"):
            if trl is None:
                skip("%s: trl absent: the written recipe is not parsed" % name)
                continue
            from trl import GRPOConfig
            from trl.experimental.orpo import ORPOConfig
            cls = {"trl-grpo": GRPOConfig, "trl-orpo": ORPOConfig}.get(how, SFTConfig)
            _, args, _ = HfArgumentParser((ScriptArguments, cls, ModelConfig)).parse_yaml_file(
                out, allow_extra_keys=False)
            if how == "trl-grpo":
                check(args.steps_per_generation * args.per_device_train_batch_size % args.num_generations == 0,
                      "%s: GRPOConfig's generation batch (%d x %d) holds whole groups of %d" % (
                          name, args.steps_per_generation, args.per_device_train_batch_size, args.num_generations))
        else:
            if not have_lf:
                skip("%s: llamafactory absent: the written recipe is checked as YAML only" % name)
                args = None
            else:
                args = HfArgumentParser(_TRAIN_ARGS).parse_yaml_file(out, allow_extra_keys=False)[2]
        if yaml is not None:
            with open(src) as f:
                before = yaml.safe_load(f)
            with open(out) as f:
                after = yaml.safe_load(f)
            changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
            check(changed <= {"per_device_train_batch_size", "gradient_accumulation_steps"},
                  "%s: written: only the batch and accumulation keys differ (%s)" % (name, sorted(changed)))
        if args is not None:
            check(args.per_device_train_batch_size == mb and args.gradient_accumulation_steps == ga,
                  "%s: --write-recipe: the trainer's parser reads micro-batch %d and accumulation %d, memplan's "
                  "recommendation" % (name, mb, ga))

print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
