"""emit_real.py: what `memplan suggest --emit hf|torch|accelerate|deepspeed` prints is loaded by the
real libraries, and holds the plan of `suggest --json`.

Usage: python3 tests/emit_real.py [./memplan]   (from the repository root; make test-cli runs it)

* hf: the file is executed with from_pretrained replaced by from_config on the meta device (the
  config memplan read; no weights, no network): TrainingArguments (or TRL's SFTConfig) is
  constructed and its fields are the recommendation's (micro-batch, accumulation, bf16/fp16,
  activation checkpointing and every_n_layers, fsdp / deepspeed); peft's LoraConfig and
  BitsAndBytesConfig are constructed; for LoRA, peft's trainable count equals memplan's;
* torch: compile()s, names nothing undefined at module level; train() runs on a tiny HF model on
  the CPU (two micro-batches, one optimizer step) when the plan is single-device;
* accelerate: the YAML loads with accelerate's load_config_from_file (ClusterConfig) with the
  planned world size and precision;
* deepspeed: the JSON loads with DeepSpeed's DeepSpeedConfig (world size patched) and its precision
  block is the plan's: torch_autocast for amp plans, bf16 only for bf16/mixed-bf16.

A library that is absent is reported as "skip" and does not fail the run.  bf16=True needs a bf16
GPU in TrainingArguments' validation; on a machine without one the check is patched out for the
construction, which is said on the line.
"""
import builtins
import copy
import json
import os
import subprocess
import sys
import tempfile
import symtable as symtable_mod
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
MEMPLAN = sys.argv[1] if len(sys.argv) > 1 else "./memplan"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, fail, failures, have, ok, skip  # noqa: E402


def refused(args, emit):
    """--ep: transformers shards the model as it loads; the snippets that shard it themselves
    (torch, accelerate, deepspeed) are refused with one line and exit 2.  Selective checkpointing:
    accelerate's and DeepSpeed's checkpointing take no policy, and a Trainer's config takes TRL's
    only (not layers+sac:auto's or :torchtitan's context_fn): refused, one line naming --emit torch."""
    sac = next((a for a in args if "+sac" in a), None)
    if sac and (emit in ("accelerate", "deepspeed") or (emit == "hf" and sac.endswith((":auto", ":torchtitan")))):
        r = subprocess.run([MEMPLAN, "suggest"] + args + ["--no-probe", "--emit", emit], capture_output=True,
                           text=True)
        check(r.returncode == 2 and r.stderr.count("\n") == 1 and "--emit torch" in r.stderr and not r.stdout,
              "%s %s: refused (exit 2, one line naming --emit torch)" % (emit, " ".join(args[:1] + [sac])))
        return True
    if "--ep" not in args or emit == "hf":
        return False
    r = subprocess.run([MEMPLAN, "suggest"] + args + ["--no-probe", "--emit", emit], capture_output=True, text=True)
    check(r.returncode == 2 and r.stderr.count("\n") == 1 and "--emit hf" in r.stderr and not r.stdout,
          "%s %s: refused (exit 2, one line naming --emit hf)" % (emit, " ".join(args[:1] + ["--ep"])))
    return True


def memplan(args):
    r = subprocess.run([MEMPLAN, "suggest"] + args + ["--no-probe"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("memplan suggest %s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr))
    return r.stdout


# (label, suggest arguments); configs from models/ (GPU profiles from configs/gpus)
CASES = [
    ("full amp-bf16 gpt2", ["models/hf/gpt2.json", "--gpu", "a100-40gb", "--seq", "512"]),
    ("full bf16 qwen2", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-40gb", "--precision", "bf16", "--seq", "512"]),
    ("lora qwen2", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-40gb", "--finetune", "lora", "--seq", "512"]),
    ("lora layers:2 liger", ["models/hf/llama-3.2-1b.json", "--gpu", "t4", "--finetune", "lora", "--seq", "1024",
                             "--checkpoint", "layers:2", "--loss", "liger"]),
    ("qlora llama-3.2-1b layers chunked-nll", ["models/hf/llama-3.2-1b.json", "--gpu", "t4", "--finetune", "qlora",
                                               "--lora-targets", "all-linear", "--seq", "1024",
                                               "--checkpoint", "layers", "--loss", "chunked-nll"]),
    ("lora layers:2+offload", ["models/hf/llama-3.2-1b.json", "--gpu", "t4", "--finetune", "lora", "--seq", "1024",
                               "--checkpoint", "layers:2+offload", "--no-probe"]),
    # TRL's activation offloading: SFTConfig(activation_offloading=True); torch: its context manager
    ("lora layers act-offload", ["models/hf/llama-3.2-1b.json", "--gpu", "t4", "--finetune", "lora", "--seq", "1024",
                                 "--loss", "chunked-nll", "--checkpoint", "layers", "--act-offload"]),
    ("lora seq-cls 5 labels", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-40gb", "--finetune", "lora",
                               "--head", "seq-cls", "--num-labels", "5", "--seq", "512"]),
    ("full checkpoint none", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-80gb", "--checkpoint", "none", "--seq", "512"]),
    ("vit lora", ["models/vit-b16.json", "--gpu", "a100-40gb", "--finetune", "lora"]),
    # a multimodal checkpoint without --images: AutoModelForImageTextToText loads it (the tower idle)
    ("qwen2-vl text-only lora", ["models/hf/qwen2-vl-7b-instruct.json", "--gpu", "a100-40gb", "--finetune", "lora",
                                 "--seq", "1024"]),
    ("mistral 8 gpus", ["models/hf/mistral-7b.json", "--gpu", "h100-80gb", "--gpus", "8"]),
    ("ddp", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-80gb", "--gpus", "8", "--parallel", "ddp", "--seq", "512"]),
    ("fsdp", ["models/hf/llama-3-8b.json", "--gpu", "a100-80gb", "--gpus", "8", "--parallel", "fsdp"]),
    ("zero3", ["models/hf/llama-3-8b.json", "--gpu", "a100-40gb", "--gpus", "8", "--parallel", "zero3"]),
    # transformers' expert parallelism: the model loaded with DistributedConfig, no fsdp= argument
    ("ep mixtral", ["models/hf/mixtral-8x7b.json", "--gpu", "h100-80gb", "--gpus", "8", "--parallel", "fsdp",
                    "--ep", "4", "--seq", "1024"]),
    ("ep mixtral offload", ["models/hf/mixtral-8x7b.json", "--gpu", "h100-80gb", "--gpus", "8", "--parallel", "fsdp",
                            "--ep", "4", "--seq", "1024", "--offload", "params"]),
    ("zero2 amp", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-40gb", "--gpus", "8", "--parallel", "zero2",
                   "--precision", "amp-bf16", "--seq", "512"]),
    # fine-tunes across GPUs (issue 28): the strategies searched for LoRA, LoRA on FSDP2, QLoRA on ZeRO-2
    ("lora 2 gpus", ["models/hf/llama-3.2-1b.json", "--gpu", "t4", "--gpus", "2", "--finetune", "lora",
                     "--seq", "1024"]),
    ("lora fsdp", ["models/hf/llama-3-8b.json", "--gpu", "a10", "--gpus", "4", "--parallel", "fsdp",
                   "--finetune", "lora", "--seq", "1024"]),
    ("qlora zero2", ["models/hf/llama-3-8b.json", "--gpu", "a10", "--gpus", "2", "--parallel", "zero2",
                     "--finetune", "qlora", "--seq", "1024"]),
    # FSDP-QLoRA: Llama-3.1-70B on 4 x A100-40GB (issue 28), the packed weights in bf16 storage
    ("qlora fsdp 70b", ["models/hf/llama-3.1-70b.json", "--gpu", "a100-40gb", "--gpus", "4", "--parallel", "fsdp",
                        "--finetune", "qlora"]),
    # the same on ZeRO-3 (bf16 storage, partitioned), and FSDP-QLoRA with CPUOffloadPolicy
    ("qlora zero3 70b", ["models/hf/llama-3.1-70b.json", "--gpu", "a100-40gb", "--gpus", "4", "--parallel", "zero3",
                         "--finetune", "qlora"]),
    ("qlora fsdp offload", ["models/hf/llama-3.2-1b.json", "--gpu", "t4", "--gpus", "2", "--parallel", "fsdp",
                            "--offload", "params", "--finetune", "qlora", "--seq", "1024"]),
    # selective checkpointing (docs/checkpointing.md#sac): TRL's key in SFTConfig, memplan's policy
    ("full layers+sac", ["models/hf/llama-3.2-1b.json", "--gpu", "a100-80gb", "--seq", "2048", "--precision", "bf16",
                         "--checkpoint", "layers+sac", "--loss", "chunked-nll", "--no-probe"]),
    ("full layers+sac:auto", ["models/hf/llama-3.2-1b.json", "--gpu", "a100-40gb", "--seq", "4096", "--precision",
                              "bf16", "--checkpoint", "layers+sac:auto", "--no-probe"]),
    # torchtitan's SelectiveAC (docs/checkpointing.md#sac-torchtitan): its policy and early_stop=False
    ("full layers+sac:torchtitan", ["models/hf/llama-3.2-1b.json", "--gpu", "a100-80gb", "--seq", "2048",
                                    "--precision", "bf16", "--checkpoint", "layers+sac:torchtitan", "--no-probe"]),
]
SAC_CASES = CASES[-3:]


# suggest --trainer dpo: --emit hf is a DPOConfig (--emit torch is refused: its loop is SFT's)
DPO_CASES = [
    ("lora qwen2", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-40gb", "--trainer", "dpo", "--finetune", "lora",
                    "--seq", "512"], False),
    ("full bf16 precomputed", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-40gb", "--trainer", "dpo",
                               "--precision", "bf16", "--seq", "1024", "--precompute-ref"], True),
    # ZeRO-2: TRL's prepare_deepspeed gives the reference copy a stage-0 engine (deepspeed= the emitted config)
    ("full zero2", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-40gb", "--trainer", "dpo", "--gpus", "2",
                    "--parallel", "zero2", "--seq", "512"], False),
    # --trainer kto: a KTOConfig, examples per device (2 or more)
    ("kto lora qwen2", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-40gb", "--trainer", "kto", "--finetune", "lora",
                        "--seq", "512"], False),
    ("kto full precomputed", ["models/hf/qwen2-0.5b.json", "--gpu", "t4", "--trainer", "kto", "--seq", "1024",
                              "--precompute-ref"], True),
    # --trainer kto-apo: a KTOConfig with loss_type apo_zero_unpaired (no KL term)
    ("kto-apo lora qwen2", ["models/hf/qwen2-0.5b.json", "--gpu", "l4", "--trainer", "kto-apo", "--finetune", "lora",
                            "--seq", "2048"], False),
]


# suggest --trainer grpo: --emit hf is a GRPOConfig; (label, arguments, the GRPOConfig fields the
# arguments ask for)
GRPO_CASES = [
    ("grpo lora vllm", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-40gb", "--trainer", "grpo", "--finetune", "lora",
                        "--seq", "768", "--completion-length", "256", "--vllm", "0.3", "--temperature", "0.7",
                        "--beta", "0.04"],
     dict(max_completion_length=256, num_generations=8, beta=0.04, temperature=0.7, use_vllm=True,
          vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, num_iterations=1, disable_dropout=False)),
    ("grpo full global batch", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-80gb", "--trainer", "grpo", "--seq",
                                "1024", "--completion-length", "512", "--global-batch", "64", "--num-iterations",
                                "2", "--disable-dropout", "on", "--num-generations", "16"],
     dict(max_completion_length=512, num_generations=16, beta=0.0, temperature=1.0, use_vllm=False,
          num_iterations=2, disable_dropout=True)),
    ("grpo sampling", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-80gb", "--trainer", "grpo", "--seq", "768",
                       "--completion-length", "256", "--top-p", "0.9", "--top-k", "50", "--repetition-penalty",
                       "1.1"],
     dict(max_completion_length=256, top_p=0.9, top_k=50, repetition_penalty=1.1, min_p=None)),
]

# suggest --images N --emit hf|torch (issue 27): the model loads as AutoModelForImageTextToText, the
# processor with the pixel bounds / pan-and-scan memplan planned, planned_size() resizes each image
# to the size planned, and TRL's SFTConfig(max_length=) counts the image tokens (or a Trainer keeps
# the image columns). With PIL installed, the model's own image processor (transformers 5.24) runs on
# an image of another size put through planned_size(): its tokens per image are memplan's.
IMAGE_CASES = [
    ("qwen2-vl lora chunked-nll 450x300", ["models/hf/qwen2-vl-7b-instruct.json", "--gpu", "a100-80gb", "--images",
                                           "1", "--image-size", "450x300", "--seq", "1024", "--loss", "chunked-nll",
                                           "--finetune", "lora"]),
    ("qwen2.5-vl lora 2 images 224x336", ["models/hf/qwen2.5-vl-7b-instruct.json", "--gpu", "a100-80gb", "--images",
                                          "2", "--image-size", "224x336", "--seq", "1024", "--finetune", "lora"]),
    ("gemma3 lora", ["models/hf/gemma-3-4b-it.json", "--gpu", "a100-80gb", "--images", "1", "--seq", "1024",
                     "--finetune", "lora"]),
    ("mistral3 qlora 784x1540 chunked-nll", ["models/hf/mistral-small-3.1-24b.json", "--gpu", "a100-80gb", "--images",
                                             "1", "--image-size", "784x1540", "--seq", "4096", "--finetune", "qlora",
                                             "--loss", "chunked-nll"]),
]

# suggest --trainer orpo --emit hf: trl 1.16's ORPOConfig (trl.experimental.orpo), the length planned, and
# disable_dropout written only where it differs from the config's default (True)
ORPO_CASES = [
    ("orpo full", ["models/hf/qwen2-0.5b.json", "--gpu", "a100-40gb", "--trainer", "orpo", "--seq", "1024"],
     dict(max_length=1024, disable_dropout=True)),
    ("orpo lora dropout on", ["models/hf/qwen2-0.5b.json", "--gpu", "t4", "--trainer", "orpo", "--finetune", "lora",
                              "--seq", "512", "--disable-dropout", "off"],
     dict(max_length=512, disable_dropout=False)),
]


def memplan_trainable(args):
    """memplan's trainable_params (estimate --json) for the same model and fine-tuning options"""
    keep = []
    i = 1
    while i < len(args):
        if args[i] in ("--finetune", "--lora-targets", "--lora-r", "--lora-alpha", "--lora-dropout", "--head",
                       "--num-labels"):
            keep += args[i:i + 2]
        i += 2 if args[i].startswith("--") else 1
    r = subprocess.run([MEMPLAN, "estimate", args[0], "--seq", "16", "--json"] + keep, capture_output=True, text=True)
    return json.loads(r.stdout)["model"]["trainable_params"]


def rec_of(args):
    j = json.loads(memplan(args + ["--json"]))
    return j["recommendation"], j


def config_path(args):
    return args[0]


# ---- hf ----------------------------------------------------------------------------------------
have_tf = have("transformers")
if not have_tf:
    skip("transformers absent: --emit hf and --emit torch are not executed")
else:
    import torch
    import transformers
    import transformers.training_args as ta
    from transformers import AutoConfig

    bf16_gpu = ta.is_torch_bf16_gpu_available()
    if not bf16_gpu:  # as on an Ampere+ GPU: this box has none
        ta.is_torch_bf16_gpu_available = lambda *a, **k: True
    note = "" if bf16_gpu else " (bf16 GPU check patched: no bf16 GPU here)"

    def hf_config(path):
        with open(path) as f:
            d = json.load(f)
        if "model_type" not in d:  # memplan's own vit-b16.json: google/vit-base-patch16-224's shape
            return transformers.ViTConfig(num_labels=d.get("classes", 1000))
        return AutoConfig.for_model(**d)

    loaded_with = {}

    def run_emitted(code, cfg, cwd, meta=True, world=1):
        """exec the emitted file with from_pretrained loading cfg (meta device: no weights)"""
        saved = {}
        loaded_with.clear()
        for name in dir(transformers):
            if name.startswith("AutoModel"):
                cls = getattr(transformers, name)
                saved[name] = cls.from_pretrained

                def fp(name_or_path, _cls=cls, **kw):
                    kw.pop("quantization_config", None)  # bitsandbytes needs a GPU: the shapes are the same
                    dt = kw.pop("dtype", None)
                    dc = kw.pop("distributed_config", None)  # --ep: checked, not applied (one process)
                    if dc is not None:
                        loaded_with["distributed_config"] = dc
                    c = cfg
                    if "num_labels" in kw:  # from_pretrained's config kwarg, as transformers applies it
                        c = copy.deepcopy(cfg)
                        c.num_labels = kw.pop("num_labels")
                    if kw:
                        raise TypeError("emitted from_pretrained kwargs this check does not apply: %s" % sorted(kw))
                    if meta:
                        with torch.device("meta"):
                            return _cls.from_config(c, dtype=dt)
                    return _cls.from_config(c, dtype=dt)

                cls.from_pretrained = fp
        old = os.getcwd()
        os.chdir(cwd)
        saved_ws = ta.TrainingArguments.world_size
        ta.TrainingArguments.world_size = property(lambda self: world)  # the planned ranks (one process here)
        if have("deepspeed"):
            import deepspeed.comm as dcomm
            saved_dc = dcomm.get_world_size, dcomm.get_rank
            dcomm.get_world_size, dcomm.get_rank = (lambda *a, **k: world), (lambda *a, **k: 0)
        ns = {"__name__": "emitted"}
        try:
            exec(compile(code, "<emitted>", "exec"), ns)
        finally:
            os.chdir(old)
            ta.TrainingArguments.world_size = saved_ws
            if have("deepspeed"):
                dcomm.get_world_size, dcomm.get_rank = saved_dc
            for name, f in saved.items():
                getattr(transformers, name).from_pretrained = f
        return ns

    for label, args in CASES:
        if refused(args, "hf"):
            continue
        rec, j = rec_of(args)
        code = memplan(args + ["--emit", "hf"])
        check("torch_dtype" not in code, "hf %s: no deprecated torch_dtype=" % label)
        with tempfile.TemporaryDirectory() as tmp:
            par = (rec.get("parallel") or {}).get("strategy", "none")
            if par.startswith("zero"):
                with open(os.path.join(tmp, "ds_config.json"), "w") as f:
                    f.write(memplan(args + ["--emit", "deepspeed"]))
                if not have("deepspeed"):
                    skip("hf %s: deepspeed absent, TrainingArguments(deepspeed=) not constructed" % label)
                    continue
            try:
                ns = run_emitted(code, hf_config(config_path(args)), tmp, world=(rec.get("parallel") or {}).get("world", 1))
            except Exception as e:
                fail("hf %s: the emitted file raises %s: %s" % (label, type(e).__name__, e))
                continue
            finally:  # TrainingArguments(deepspeed=) keeps a global config that zero.Init would read
                from transformers.integrations.deepspeed import unset_hf_deepspeed_config
                unset_hf_deepspeed_config()
        a = ns["args"]
        ck = rec["plan"]["strategy"]
        if ck not in ("none", "layers", "layers+sac") and not ck.startswith("layers:"):
            # a Trainer runs checkpoint none and layers[:N] only: --emit hf searches those (issue 25
            # item 2: text and --json still search sqrt/optimal), and says so
            check("searches checkpoint none and layers" in code,
                  "hf %s: --json recommends %s, which a Trainer cannot run: the file says its plan is "
                  "the best a Trainer runs" % (label, ck))
            continue
        want_ck = ck.startswith("layers")
        kw = a.activation_checkpointing_kwargs or {}
        prec = rec["precision"]
        ep = (rec.get("parallel") or {}).get("ep", 1)
        # (--ep: FSDP2's bf16 policy is DistributedConfig's fsdp_mixed_precision, no autocast)
        bf16 = ("amp-bf16", "bf16-amp") if ep > 1 else ("amp-bf16", "mixed-bf16", "bf16-amp")
        fields = (a.per_device_train_batch_size == rec["micro_batch"] and
                  a.gradient_accumulation_steps == rec["grad_accum"] and
                  a.bf16 == (prec in bf16) and a.fp16 == (prec == "amp-fp16") and
                  bool(a.activation_checkpointing) == want_ck)
        check(fields, "hf %s: %s(...) constructed (transformers %s) with micro-batch %d, accumulation %d, %s, "
              "checkpoint %s%s" % (label, type(a).__name__, transformers.__version__, rec["micro_batch"],
                                   rec["grad_accum"], prec, ck, note))
        every = [c for c in j["config"].get("checkpoint", "").split(":")[1:]] if isinstance(
            j["config"].get("checkpoint"), str) else []
        if ck.startswith("layers:2"):
            check(kw.get("every_n_layers") == 2 and kw.get("use_reentrant") is False,
                  "hf %s: activation_checkpointing_kwargs every_n_layers 2" % label)
        check(bool(kw.get("offload")) == ck.endswith("+offload"),
              "hf %s: activation_checkpointing_kwargs offload %s" % (label, ck.endswith("+offload")))
        check(bool(kw.get("selective")) == ck.endswith("+sac"),
              "hf %s: activation_checkpointing_kwargs selective %s" % (label, ck.endswith("+sac")))
        aoff = "--act-offload" in args
        check(bool(getattr(a, "activation_offloading", False)) == aoff,
              "hf %s: activation_offloading %s" % (label, aoff))
        m = ns["model"]
        pdt = next(iter(m.parameters())).dtype
        # (FSDP-QLoRA and ZeRO-3 QLoRA under mixed-bf16: loaded in the bf16 storage dtype, as the guides do)
        fsdp_qlora = rec["finetune"] == "qlora" and \
            (rec.get("parallel") or {}).get("strategy", "").startswith(("fsdp", "zero3"))
        want_dt = torch.bfloat16 if prec in ("bf16", "bf16-amp") or (fsdp_qlora and prec == "mixed-bf16") \
            else torch.float32
        check(pdt == want_dt, "hf %s: model loaded with dtype %s" % (label, want_dt))
        if label == "lora qwen2":  # issue 25 item 2: LoRA on an HF config is planned as peft runs it
            ad = {p.dtype for n, p in m.named_parameters() if "lora_" in n}
            check(prec == "bf16-amp" and ad == {torch.float32},
                  "hf %s: recommends bf16-amp (got %s): a bf16 base, peft's adapters %s (fp32 expected), bf16=True"
                  % (label, prec, sorted(str(d) for d in ad)))
        if ep > 1:
            from transformers.distributed import DistributedConfig
            dc = loaded_with.get("distributed_config")
            world = rec["parallel"]["world"]
            check(isinstance(dc, DistributedConfig) and dc.fsdp_size == world and dc.ep_size == ep and
                  dc.efsdp_size == world // ep and dc.fsdp_mixed_precision == (prec == "mixed-bf16") and
                  dc.fsdp_cpu_offload == (rec["parallel"].get("offload") == "params") and
                  not a.fsdp and not a.deepspeed,
                  "hf %s: loaded with DistributedConfig(fsdp_size=%d, ep_size=%d) (transformers' own, validated), "
                  "no fsdp= argument" % (label, world, ep))
        elif par in ("fsdp", "fsdp-no-reshard"):
            check(a.fsdp and a.fsdp_config.get("version") == 2 and
                  a.fsdp_config.get("reshard_after_forward") == (par == "fsdp"),
                  "hf %s: fsdp=True, FSDP2, reshard_after_forward as planned" % label)
        elif par.startswith("zero"):
            check(a.deepspeed == "ds_config.json" and a.hf_deepspeed_config.config["zero_optimization"]["stage"] ==
                  int(par[4]), "hf %s: deepspeed= the emitted config (ZeRO stage %s)" % (label, par[4]))
        else:
            check(not a.fsdp and not a.deepspeed, "hf %s: no fsdp/deepspeed for a %s plan" % (label, par))
        if "--loss" in args and "liger" in args:
            check(a.use_liger_kernel and a.liger_kernel_config["fused_linear_cross_entropy"],
                  "hf %s: use_liger_kernel with fused_linear_cross_entropy only" % label)
        if "chunked-nll" in args:
            # (the length planned: --seq, else the model's default, as estimate reports it)
            seq = int(args[args.index("--seq") + 1]) if "--seq" in args else \
                json.loads(subprocess.run([MEMPLAN, "estimate", args[0], "--json"], capture_output=True,
                                          text=True, check=True).stdout)["config"]["seq_len"]
            check(type(a).__name__ == "SFTConfig" and a.loss_type == "nll" and a.max_length == seq,
                  "hf %s: TRL's SFTConfig (loss_type nll, max_length %d: the length planned)"
                  % (label, seq))
        if rec["finetune"] in ("lora", "qlora"):
            lc = ns["lora_config"]
            check(type(lc).__name__ == "LoraConfig", "hf %s: peft LoraConfig constructed" % label)
            if "vit" in label:
                check(lc.task_type is None and "classifier" in lc.modules_to_save,
                      "hf %s: no task_type, the classifier kept by modules_to_save" % label)
                check(type(m.base_model.model).__name__ == "ViTForImageClassification",
                      "hf %s: AutoModelForImageClassification" % label)
            else:
                trainable = sum(p.numel() for p in m.parameters() if p.requires_grad)
                want = memplan_trainable(args)
                check(trainable == want, "hf %s: peft's trainable count on the meta-device model %d = memplan's %d"
                      % (label, trainable, want))
            if rec["finetune"] == "qlora":
                bc = ns["bnb_config"]
                check(bc.load_in_4bit and bc.bnb_4bit_quant_type == "nf4",
                      "hf %s: BitsAndBytesConfig(load_in_4bit, nf4) constructed" % label)
                # (memplan plans the packed weights sharded under FSDP2: a bf16 storage; else uint8)
                fsdp_plan = (rec.get("parallel") or {}).get("strategy", "none").startswith("fsdp")
                want_storage = "bfloat16" if fsdp_plan else "uint8"
                check(str(bc.bnb_4bit_quant_storage).replace("torch.", "") == want_storage,
                      "hf %s: bnb_4bit_quant_storage %s, as planned (%s)" % (label, bc.bnb_4bit_quant_storage,
                                                                        want_storage))

    # ---- hf, --trainer dpo / kto: TRL's DPOConfig / KTOConfig with the largest batch that fits ----
    for label, args, pre in DPO_CASES:
        rec, j = rec_of(args)
        seq = int(args[args.index("--seq") + 1])
        code = memplan(args + ["--emit", "hf"])
        par = (rec.get("parallel") or {}).get("strategy", "none")
        if par.startswith("zero"):  # deepspeed= the emitted config: TrainingArguments needs DeepSpeed to parse it
            ds = json.loads(memplan(args + ["--emit", "deepspeed"]))
            check(ds["zero_optimization"]["stage"] == int(par[4]) and
                  ds["train_micro_batch_size_per_gpu"] == rec["micro_batch"],
                  "hf dpo %s: --emit deepspeed: ZeRO stage %s, micro-batch %d" % (label, par[4], rec["micro_batch"]))
            check("deepspeed=\"ds_config.json\"" in code, "hf dpo %s: DPOConfig(deepspeed=) names it" % label)
            if not have("deepspeed"):
                skip("hf dpo %s: deepspeed absent, DPOConfig(deepspeed=) not constructed" % label)
                continue
        try:
            with tempfile.TemporaryDirectory() as tmp:
                if par.startswith("zero"):
                    with open(os.path.join(tmp, "ds_config.json"), "w") as f:
                        f.write(memplan(args + ["--emit", "deepspeed"]))
                ns = run_emitted(code, hf_config(config_path(args)), tmp)
        except Exception as e:
            fail("hf dpo %s: the emitted file raises %s: %s" % (label, type(e).__name__, e))
            continue
        finally:
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config
            unset_hf_deepspeed_config()
        a = ns["args"]
        ck = rec["plan"]["strategy"]
        cls = "DPOConfig" if "dpo" in args else "KTOConfig"
        apo = "kto-apo" in args
        check(type(a).__name__ == cls and a.per_device_train_batch_size == rec["micro_batch"] and
              (cls != "KTOConfig" or a.loss_type == ("apo_zero_unpaired" if apo else "kto")) and
              a.gradient_accumulation_steps == rec["grad_accum"] and a.max_length == seq and
              a.precompute_ref_log_probs == pre and bool(a.activation_checkpointing) == ck.startswith("layers") and
              rec["micro_batch"] >= (2 if cls == "KTOConfig" and not apo else 1),
              "hf %s: TRL's %s (trl %s) constructed with %d per device, accumulation %d, "
              "max_length %d, precompute_ref_log_probs %s, checkpoint %s%s"
              % (label, cls, __import__("trl").__version__, rec["micro_batch"], rec["grad_accum"],
                 seq, pre, ck, note))

    # ---- hf, --trainer grpo: TRL's GRPOConfig (its __post_init__ checks the groups) as planned, and
    # the same recommendation in the text, --json and the snippet ----
    def trainer_config(label, args, want):
        """suggest ARGS's recommendation, text and --emit hf file run: (rec, json, text, the config object,
        its fields named in want), or None (a failure said)"""
        rec, j = rec_of(args)
        code = memplan(args + ["--emit", "hf"])
        text = memplan(args)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                ns = run_emitted(code, hf_config(config_path(args)), tmp)
        except Exception as e:
            fail("hf %s: the emitted file raises %s: %s" % (label, type(e).__name__, e))
            return None
        a = ns["args"]
        return rec, j, text, a, {k: getattr(a, k) for k in want}

    for label, args, want in GRPO_CASES:
        got_all = trainer_config(label, args, want)
        if not got_all:
            continue
        rec, j, text, a, got = got_all
        k_given = int(args[args.index("--steps-per-generation") + 1]) if "--steps-per-generation" in args else None
        check(type(a).__name__ == "GRPOConfig" and got == want and
              a.per_device_train_batch_size == rec["micro_batch"] and a.gradient_accumulation_steps == rec["grad_accum"]
              and a.steps_per_generation == (k_given or rec["grad_accum"]) and
              "  micro-batch        %d\n" % rec["micro_batch"] in text and
              "  grad accumulation  %d " % rec["grad_accum"] in text,
              "hf %s: TRL's GRPOConfig (trl %s) constructed with %d completions per device, accumulation %d, "
              "steps_per_generation %d, %s, as --json and the text recommend%s"
              % (label, __import__("trl").__version__, rec["micro_batch"], rec["grad_accum"], a.steps_per_generation,
                 ", ".join("%s %s" % kv for kv in sorted(got.items())), note))

    for label, args, want in ORPO_CASES:
        got_all = trainer_config(label, args, want)
        if not got_all:
            continue
        rec, j, text, a, got = got_all
        check(type(a).__name__ == "ORPOConfig" and got == want and
              a.per_device_train_batch_size == rec["micro_batch"] and a.gradient_accumulation_steps == rec["grad_accum"]
              and j["config"]["trainer"] == "orpo" and
              "  micro-batch        %d\n" % rec["micro_batch"] in text and
              "  grad accumulation  %d " % rec["grad_accum"] in text,
              "hf %s: TRL's ORPOConfig (trl %s, trl.experimental.orpo) constructed with %d pairs per device, "
              "accumulation %d, %s, as --json and the text recommend%s"
              % (label, __import__("trl").__version__, rec["micro_batch"], rec["grad_accum"],
                 ", ".join("%s %s" % kv for kv in sorted(got.items())), note))

    # ---- hf, --images: the processor and the images at the size planned -----------------------
    class FakeImage:
        """what planned_size() asks of a PIL image: convert(mode), resize((width, height))"""

        def __init__(self, w, h):
            self.size = (w, h)

        def convert(self, mode):
            return self

        def resize(self, size):
            return FakeImage(*size)

    def pil_image_processor(kind, vc, kw):
        """the checkpoint's image processor class (transformers 5.24 PIL backends), built from the
        config's vision fields as its preprocessor_config holds them, with the emitted kwargs"""
        if kind == "qwen":
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
            return Qwen2VLImageProcessorPil(patch_size=vc.patch_size, merge_size=vc.spatial_merge_size,
                                            temporal_patch_size=vc.temporal_patch_size, **kw)
        if kind == "gemma3":
            from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
            return Gemma3ImageProcessorPil(size={"height": vc.image_size, "width": vc.image_size}, **kw)
        from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil
        return PixtralImageProcessorPil(size={"longest_edge": vc.image_size}, **kw)

    for label, args in IMAGE_CASES:
        rec, j = rec_of(args)
        im = j["config"]["images"]  # (suggest --json: the images as the step runs them)
        seq = int(args[args.index("--seq") + 1])
        code = memplan(args + ["--emit", "hf"])
        cfg = hf_config(config_path(args))
        proc_kw = {}
        ap = transformers.AutoProcessor
        saved_ap = ap.from_pretrained
        ap.from_pretrained = lambda name, **kw: proc_kw.update(kw) or "processor"
        try:
            with tempfile.TemporaryDirectory() as tmp:
                ns = run_emitted(code, cfg, tmp)
        except Exception as e:
            fail("hf images %s: the emitted file raises %s: %s" % (label, type(e).__name__, e))
            continue
        finally:
            ap.from_pretrained = saved_ap
        a, m = ns["args"], ns["model"]
        base = m.base_model.model if rec["finetune"] in ("lora", "qlora") else m
        from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as itt
        want_cls = itt[cfg.model_type]
        check(type(base).__name__ == want_cls, "hf images %s: AutoModelForImageTextToText loads %s (got %s)"
              % (label, want_cls, type(base).__name__))
        trl = "chunked-nll" in args
        check((a.max_length == seq and type(a).__name__ == "SFTConfig") if trl else
              (a.remove_unused_columns is False and type(a).__name__ == "TrainingArguments"),
              "hf images %s: %s" % (label, "SFTConfig(max_length=%d): the collator truncates with the image tokens "
                                    "counted" % seq if trl else "TrainingArguments(remove_unused_columns=False): "
                                    "the images reach the collator"))
        check(a.per_device_train_batch_size == rec["micro_batch"] and
              a.gradient_accumulation_steps == rec["grad_accum"],
              "hf images %s: micro-batch %d, accumulation %d as recommended" % (label, rec["micro_batch"],
                                                                               rec["grad_accum"]))
        big = ns["planned_size"]({"images": [FakeImage(1001, 999)] * im["per_sample"]})["images"]
        check([x.size for x in big] == [(im["width"], im["height"])] * im["per_sample"],
              "hf images %s: planned_size() resizes each of %d images to width %d x height %d (PIL's (w, h))"
              % (label, im["per_sample"], im["width"], im["height"]))
        kind = "qwen" if cfg.model_type.startswith("qwen") else cfg.model_type.replace("mistral3", "pixtral")
        want_kw = {"qwen": {"min_pixels", "max_pixels"}, "gemma3": {"do_pan_and_scan"}, "pixtral": set()}[kind]
        check(set(proc_kw) == want_kw, "hf images %s: AutoProcessor.from_pretrained(NAME, %s)"
              % (label, ", ".join(sorted(proc_kw))))
        tcode = memplan(args + ["--emit", "torch"])
        top = symtable_mod.symtable(tcode, "<emitted>", "exec")
        defined = {x.get_name() for x in top.get_symbols() if x.is_assigned() or x.is_imported()}
        undefined = {x.get_name() for x in top.get_symbols()
                     if x.is_referenced() and x.get_name() not in defined and not hasattr(builtins, x.get_name())}
        check(not undefined and "def planned_size" in tcode and "DataCollatorForVisionLanguageModeling" in tcode,
              "torch images %s: compiles, planned_size and TRL's vision collator, no undefined names %s"
              % (label, sorted(undefined)))
        if not have("PIL"):
            skip("hf images %s: PIL absent: the image processor's tokens per image not checked" % label)
            continue
        from PIL import Image
        vc = cfg.vision_config
        if kind == "pixtral":  # PixtralProcessor resizes at patch x spatial_merge_size (processing_pixtral.py:88)
            proc_kw["patch_size"] = {"height": vc.patch_size * cfg.spatial_merge_size,
                                     "width": vc.patch_size * cfg.spatial_merge_size}
        ip = pil_image_processor(kind, vc, proc_kw)
        real = [Image.new("RGB", x.size) for x in big]
        out = ip(images=real, return_tensors="pt")
        if kind == "qwen":
            tokens = [int(t.prod()) // vc.spatial_merge_size ** 2 for t in out["image_grid_thw"]]
        elif kind == "gemma3":  # Gemma3Processor: image_seq_length = mm_tokens_per_image tokens an image
            check(tuple(out["pixel_values"].shape) == (im["per_sample"], 3, im["height"], im["width"]),
                  "hf images %s: the image processor's pixel_values at %dx%d" % (label, im["height"], im["width"]))
            tokens = [cfg.mm_tokens_per_image] * len(real)
        else:  # processing_pixtral.py:127-129: rows x (columns + 1)
            pm = vc.patch_size * cfg.spatial_merge_size
            tokens = [int(h) // pm * (int(w) // pm + 1) for h, w in out["image_sizes"]]
        check(tokens == [im["tokens_each"]] * im["per_sample"],
              "hf images %s: the image processor (transformers %s) makes %s tokens per image = memplan's %d"
              % (label, transformers.__version__, tokens, im["tokens_each"]))

    # ---- torch: compiles, nothing undefined at module level, runs on a tiny model ---------------
    import symtable

    for label, args in CASES:
        if refused(args, "torch"):
            continue
        code = memplan(args + ["--emit", "torch"])
        try:
            compile(code, "<emitted>", "exec")
        except SyntaxError as e:
            fail("torch %s: not valid Python: %s" % (label, e))
            continue
        top = symtable.symtable(code, "<emitted>", "exec")
        defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
        undefined = {s.get_name() for s in top.get_symbols()
                     if s.is_referenced() and s.get_name() not in defined and not hasattr(builtins, s.get_name())}
        check(not undefined, "torch %s: compiles, no undefined module-level names %s" % (label, sorted(undefined)))
        check("model(**batch).loss" in code, "torch %s: the loss is model(**batch).loss" % label)

    # a real CPU run of train() for the single-device plans of a tiny Llama (2 layers, hidden 64)
    tiny = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2)
    aoff_cases = [c for c in CASES if "--act-offload" in c[1]]
    for label, args in CASES[:5] + SAC_CASES + aoff_cases:
        code = memplan(args + ["--emit", "torch"])
        rec, _ = rec_of(args)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                # (TRL's offloading pins host memory and copies on a CUDA stream: off on this CPU run)
                code = code.replace("get_act_offloading_ctx_manager(model)",
                                    "get_act_offloading_ctx_manager(model, use_pin_memory=False, use_streams=False)")
                ns = run_emitted(code.replace("quantization_config=bnb_config,", ""), tiny, tmp, meta=False)
                model = ns["model"]
                opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
                before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
                ids = torch.randint(0, 128, (2, 16))
                batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
                n = rec["grad_accum"]
                ns["train"](model, opt, [batch] * n)
                after = [p.detach() for p in model.parameters() if p.requires_grad]
                moved = any(not torch.equal(x, y) for x, y in zip(before, after))
                check(moved, "torch %s: train() ran %d micro-batch(es) and one optimizer step on a tiny Llama (CPU%s)"
                      % (label, n, ", no pinning, no streams" if "--act-offload" in args else ""))
            except Exception as e:
                fail("torch %s: train() raises %s: %s" % (label, type(e).__name__, e))

    # --parallel fsdp: the torch file's fully_shard calls, run (a one-rank gloo group, the tiny Llama,
    # untied and tied), make the units memplan plans (parallel.c fsdp_units, accelerate's layout): each
    # decoder layer and the input embedding resharded after forward, one tail unit [final norm,
    # (tied: embedding,) lm_head] kept, the root; then one train() step runs
    import torch.distributed as tdist
    from torch.distributed.fsdp import FSDPModule, fully_shard
    if not tdist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        tdist.init_process_group("gloo", rank=0, world_size=1)
    fsdp_args = dict(CASES)["fsdp"]
    fcode = memplan(fsdp_args + ["--emit", "torch"])
    for tied in (False, True):
        cfg = copy.deepcopy(tiny)
        cfg.tie_word_embeddings = tied
        with tempfile.TemporaryDirectory() as tmp:
            try:
                ns = run_emitted(fcode, cfg, tmp, meta=False)
                model = ns["model"]
                states = {}
                for name, mod in model.named_modules():
                    if isinstance(mod, FSDPModule):
                        states.setdefault(id(fully_shard.state(mod)), []).append(name or "<root>")
                units = sorted(sorted(v) for v in states.values())
                kept = {n for v in states.values() for n in v
                        if fully_shard.state(model.get_submodule(n) if n != "<root>" else model)
                        ._fsdp_param_group is not None and
                        fully_shard.state(model.get_submodule(n) if n != "<root>" else model)
                        ._fsdp_param_group.post_forward_mesh_info is None}
                want = sorted([["<root>"]] + [["model.layers.%d" % i] for i in range(cfg.num_hidden_layers)] +
                              ([["lm_head", "model.embed_tokens", "model.norm"]] if tied else
                               [["model.embed_tokens"], ["lm_head", "model.norm"]]))
                ids = torch.randint(0, 128, (2, 16))
                batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
                ns["train"](model, opt, [batch] * ns.get("grad_accum", 1))
                check(units == want and {"lm_head", "model.norm"} <= kept and "model.layers.0" not in kept and
                      ("model.embed_tokens" in kept) == tied,
                      "torch fsdp (%s): fully_shard as emitted makes accelerate's units %s, the tail kept after "
                      "forward, and train() runs a step (gloo, one rank)" % ("tied" if tied else "untied", units))
            except Exception as e:
                fail("torch fsdp (%s): the emitted fully_shard calls raise %s: %s"
                     % ("tied" if tied else "untied", type(e).__name__, e))

    # --optimizer muon: the torch file builds torch.optim.Muon on the hidden layers' 2-D weights and
    # AdamW on the rest (memplan's split, estimate/optim.c), and train() steps both
    args = ["models/hf/llama-3.2-1b.json", "--gpu", "a100-80gb", "--optimizer", "muon"]
    code = memplan(args + ["--emit", "torch"])
    rec, _ = rec_of(args)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            ns = run_emitted(code, tiny, tmp, meta=False)
            model, opt = ns["model"], ns["optimizer"]
            muon, adamw = opt.all
            hidden = {id(p) for g in muon.param_groups for p in g["params"]}
            rest = {id(p) for g in adamw.param_groups for p in g["params"]}
            out = {id(p) for p in model.get_output_embeddings().parameters()}
            emb = id(model.get_input_embeddings().weight)
            check(type(muon) is torch.optim.Muon and type(adamw) is torch.optim.AdamW and
                  len(hidden) == 7 * tiny.num_hidden_layers and emb in rest and out <= rest and
                  hidden.isdisjoint(rest) and len(hidden) + len(rest) == len(list(model.parameters())),
                  "torch muon: torch.optim.Muon on the %d hidden 2-D weights (q, k, v, o, gate, up, down a layer), "
                  "AdamW on the %d others (embedding, lm_head, norms)" % (len(hidden), len(rest)))
            before = [p.detach().clone() for p in model.parameters()]
            ids = torch.randint(0, 128, (2, 16))
            batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
            ns["train"](model, opt, [batch] * rec["grad_accum"])
            moved = all(not torch.equal(x, y) for x, y in zip(before, model.parameters()))
            check(moved, "torch muon: train() stepped Muon and AdamW: every parameter moved (CPU)")
        except Exception as e:
            fail("torch muon: the emitted file raises %s: %s" % (type(e).__name__, e))

# ---- accelerate --------------------------------------------------------------------------------
if not have("accelerate"):
    skip("accelerate absent: --emit accelerate not loaded")
else:
    import accelerate
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    for label, args in CASES:
        if refused(args, "accelerate"):
            continue
        rec, _ = rec_of(args)
        text = memplan(args + ["--emit", "accelerate"])
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(text)
        try:
            cfg = load_config_from_file(f.name)
        except Exception as e:
            fail("accelerate %s: load_config_from_file raises %s: %s" % (label, type(e).__name__, e))
            continue
        finally:
            os.unlink(f.name)
        par = rec.get("parallel") or {}
        world = par.get("world", 1)
        want = {"amp-bf16": "bf16", "mixed-bf16": "bf16", "bf16": "bf16", "bf16-amp": "bf16",
                "amp-fp16": "fp16"}.get(rec["precision"], "no")
        dist = str(cfg.distributed_type).split(".")[-1]
        want_dist = {"none": "NO", "ddp": "MULTI_GPU", "fsdp": "FSDP", "fsdp-no-reshard": "FSDP"}.get(
            par.get("strategy", "none"), "DEEPSPEED")
        check(isinstance(cfg, ClusterConfig) and cfg.num_processes == world and
              str(cfg.mixed_precision).split(".")[-1].lower() == want and dist == want_dist,
              "accelerate %s: ClusterConfig (accelerate %s), %d processes, %s, mixed_precision %s"
              % (label, accelerate.__version__, world, want_dist, want))

# ---- deepspeed ---------------------------------------------------------------------------------
for label, args in CASES:
    if refused(args, "deepspeed"):
        continue
    rec, _ = rec_of(args)
    try:
        ds = json.loads(memplan(args + ["--emit", "deepspeed"]))
    except ValueError as e:
        fail("deepspeed %s: not JSON: %s" % (label, e))
        continue
    prec = rec["precision"]
    par = (rec.get("parallel") or {}).get("strategy", "none")
    if not par.startswith("zero"):  # --emit deepspeed picks the fastest DeepSpeed candidate then
        rec = None
    if rec is not None:
        amp = prec.startswith("amp-")
        good = (ds.get("torch_autocast", {}).get("enabled") is True) == amp and \
            (ds.get("bf16", {}).get("enabled") is True) == (prec in ("bf16", "mixed-bf16")) and \
            "fp16" not in ds and ds["train_micro_batch_size_per_gpu"] == rec["micro_batch"] and \
            ds["gradient_accumulation_steps"] == rec["grad_accum"]
        check(good, "deepspeed %s: precision block of %s, micro-batch and accumulation as planned" % (label, prec))
    else:
        amp_any = "torch_autocast" in ds
        check(not ("bf16" in ds and amp_any), "deepspeed %s: one precision block" % label)
    if have("deepspeed"):
        import deepspeed
        from deepspeed.runtime.config import DeepSpeedConfig
        import deepspeed.comm as dist

        world = ds["train_batch_size"] // (ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"])
        saved = dist.get_world_size, dist.get_rank
        dist.get_world_size = lambda *a, **k: world
        dist.get_rank = lambda *a, **k: 0
        try:
            c = DeepSpeedConfig(ds)
            check(c.train_batch_size == ds["train_batch_size"] and c.bfloat16_config.enabled == ("bf16" in ds) and
                  c.torch_autocast_enabled == ("torch_autocast" in ds),
                  "deepspeed %s: DeepSpeedConfig (deepspeed %s) accepts it, world %d" % (label, deepspeed.__version__,
                                                                                        world))
        except Exception as e:
            fail("deepspeed %s: DeepSpeedConfig raises %s: %s" % (label, type(e).__name__, e))
        finally:
            dist.get_world_size, dist.get_rank = saved
    elif label == CASES[0][0]:
        skip("deepspeed absent: the JSON is checked as JSON only")

print("emit_real: %d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
