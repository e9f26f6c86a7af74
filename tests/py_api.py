"""py_api.py: the Python API (python/memplan) against the binary and README's JSON contract.

Usage: python3 -B tests/py_api.py [./memplan]   (from the repository root; make test-cli runs it;
       MEMPLAN_TEST_LONG=1: suggest on every bundled model too)

* README's contract: every key "JSON output (schema 1)" lists is a field of the dataclass of its
  object (python/memplan/_schema.py), and every object it names is a field of the report;
* real reports: estimate and check --json of every bundled model, suggest of some (of every one in
  the long tier), and the cases that write the optional keys (LoRA, QLoRA, MoE, T5, multimodal,
  data parallelism with offload, layers+offload, a recipe, nothing fits, host probes): each is read
  into the dataclasses and written back equal to the JSON, object by object and key by key (the
  JSON as Python's json module reads it, not the package), with no key left over in `extra`; and
  each optional field of the dataclasses is present in at least one of the reports, so the cases
  cover the schema;
* keywords: the command lines the keywords make (flags, on|off, lists, paths); a keyword the
  command does not take is a TypeError; memplan's errors are MemplanError with its one-line
  message and exit status; check's "does not fit" (exit 1) is a result whose shortfall is the peak
  less the usable bytes; suggest with nothing that fits has recommendation None;
* `import memplan` and `import memplan.integrations` load neither torch nor transformers.
"""
import dataclasses
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, fail, failures, ok  # noqa: E402

MEMPLAN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "memplan"))
os.environ["MEMPLAN_BIN"] = MEMPLAN
LONG = os.environ.get("MEMPLAN_TEST_LONG", "0") not in ("", "0")
os.chdir(ROOT)

import memplan  # noqa: E402
from memplan import _schema  # noqa: E402

# ---- README's contract ------------------------------------------------------------------------------


def contract():
    """{section: set of keys} of README's schema-1 block, and each section's raw text"""
    text = open("README.md").read().split("## JSON output (schema 1)", 1)[1]
    block = text.split("```\n", 2)[1]
    sections, cur = {}, None
    for line in block.splitlines():
        if line and not line[0].isspace():
            depth, cut = 0, None
            for i, ch in enumerate(line):  # the first ':' outside parentheses ends the section's name
                depth += ch == "("
                depth -= ch == ")"
                if ch == ":" and depth == 0:
                    cut = i
                    break
            name = "top" if cut is None else re.sub(r"\(.*?\)", "", line[:cut]).strip()
            cur = sections.setdefault(name, [])
            cur.append(line if cut is None else line[cut + 1:])
        elif cur is not None:
            cur.append(line)
    keys = {}
    for name, lines in sections.items():
        s = "\n".join(lines)
        s = re.sub(r'"[^"]*"', " ", s)         # "memplan" | "hf"
        s = re.sub(r"\[\[.*?\]", " ", s)        # segments [[start, end), ...]
        s = re.sub(r"\[(\.\.\.|text, \.\.\.)\]", " ", s)
        while re.search(r"\([^()]*\)", s):      # remarks in parentheses, nested
            s = re.sub(r"\([^()]*\)", " ", s)
        found = set()
        for m in re.finditer(r"[a-z][a-z0-9_]*", s):
            before = s[:m.start()].rstrip(" ")
            after = s[m.end():].lstrip(" ")
            listed = (not before or before[-1] in ",{:;[\n") and (not after or after[0] in ",}:;{[\n")
            if "_" in m.group() or listed:
                found.add(m.group())
        keys[name] = (found, s)
    return keys


def types_in(t):
    """t and the types inside it (Optional[List[Layer]] -> Layer, ...)"""
    yield t
    for a in getattr(t, "__args__", None) or ():
        yield from types_in(a)


def reachable(cls):
    """the dataclasses of the schema reachable from cls"""
    out, pending = [], [cls]
    while pending:
        c = pending.pop()
        if c not in out:
            out.append(c)
            pending += [t for h in _schema._hints(c).values() for t in types_in(h) if dataclasses.is_dataclass(t)]
    return out


def names(classes):
    return {_schema.json_key(f) for c in classes for f in _schema.schema_fields(c)}


# section of README -> (the dataclass its keys are fields of, the report classes that have it)
R = memplan
SECTIONS = {
    "top": (R.Report, (R.EstimateReport, R.CheckReport, R.SuggestReport)),
    "model": (R.Model, (R.EstimateReport, R.CheckReport, R.SuggestReport)),
    "config": (R.Config, (R.EstimateReport, R.CheckReport, R.SuggestReport)),
    "target": (R.Target, (R.EstimateReport, R.CheckReport, R.SuggestReport)),
    "memory": (R.Memory, (R.EstimateReport, R.CheckReport)),
    "layers": (R.Layer, (R.EstimateReport,)),
    "plan": (R.Plan, (R.EstimateReport, R.CheckReport)),
    "recommendation / candidates": (R.Candidate, (R.SuggestReport,)),
    "alternatives": (None, (R.SuggestReport,)),
    "check": (R.Check, (R.CheckReport,)),
}
NOT_IN_API = {"probe": "memplan probe has no Python function (estimate, check and suggest do)"}

c = contract()
n_keys = 0
for sec, (found, _) in sorted(c.items()):
    if sec in NOT_IN_API:
        ok("README contract: %s: not in the API (%s)" % (sec, NOT_IN_API[sec]))
        continue
    if sec not in SECTIONS:
        fail("README contract: section %r is not mapped to a dataclass (tests/py_api.py SECTIONS)" % sec)
        continue
    cls, reports = SECTIONS[sec]
    for rep in reports:
        fields = names([rep])
        for part in sec.split(" / ") if sec != "top" else []:
            check(part in fields, "README contract: %s is a field of %s" % (part, rep.__name__))
    if cls is None:
        continue
    missing = found - names(reachable(cls))
    n_keys += len(found)
    check(not missing and found, "README contract: %s: %d keys, each a field of %s%s"
          % (sec, len(found), cls.__name__, " (missing: %s)" % ", ".join(sorted(missing)) if missing else ""))
# the parse itself: keys from every kind of line (wrapped, nested, after remarks); a parse that
# finds too little would pass the check above vacuously
must = {"top": {"schema", "command", "version"},
        "config": {"recipe", "settings", "value", "unknown_keys", "label_fraction"},
        "memory": {"peak_event", "host_pinned_bytes", "ckpt_offload_pcie_bytes"}, "layers": {"index", "checkpointed"},
        "plan": {"segments", "overhead_pct"}, "recommendation / candidates": {"micro_batch", "source"},
        "check": {"fits", "shortfall_bytes"}}
for sec, want in must.items():
    check(want <= c.get(sec, (set(),))[0], "README contract parse: %s has %s" % (sec, ", ".join(sorted(want))))
check(n_keys >= 60, "README contract: %d keys read (at least 60)" % n_keys)

# ---- real reports -------------------------------------------------------------------------------------

seen = {}  # (class, optional field) -> present in some report


def walk(obj, where):
    """no key left in extra anywhere; the optional fields present"""
    bad = []
    if dataclasses.is_dataclass(obj):
        if getattr(obj, "extra", None):
            bad.append("%s: keys not in %s: %s" % (where, type(obj).__name__, ", ".join(sorted(obj.extra))))
        for f in _schema.schema_fields(type(obj)):
            v = getattr(obj, f.name)
            k = _schema.json_key(f)
            if f.metadata.get("optional"):
                seen[(type(obj).__name__, k)] = seen.get((type(obj).__name__, k), False) or v is not None
            bad += walk(v, "%s.%s" % (where, k))
    elif isinstance(obj, list):
        for i, x in enumerate(obj):
            bad += walk(x, "%s[%d]" % (where, i))
    elif isinstance(obj, dict):
        for k, x in obj.items():
            bad += walk(x, "%s.%s" % (where, k))
    return bad


def diff(a, b, where=""):
    """the first difference of two JSON values, or None"""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return "%s: keys %s" % (where or ".", ", ".join(sorted(set(a) ^ set(b))))
        for k in a:
            d = diff(a[k], b[k], where + "." + k)
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return "%s: %d items, not %d" % (where, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            d = diff(x, y, "%s[%d]" % (where, i))
            if d:
                return d
        return None
    if type(a) is bool or type(b) is bool:
        return None if a is b else "%s: %r != %r" % (where, a, b)
    return None if a == b else "%s: %r != %r" % (where, a, b)


def roundtrip(label, command, model, **kw):
    """memplan.COMMAND(model, **kw) against its raw JSON (as Python's json module reads it)"""
    try:
        rep = memplan.report(command, model, **kw)
    except memplan.MemplanError as e:
        fail("%s: %s" % (label, e))
        return None
    raw = json.loads(rep.run.stdout)
    problems = walk(rep, command)
    d = diff(memplan.to_dict(rep), raw)
    if d:
        problems.append("to_dict differs from the JSON at " + d)
    if type(rep) is not _schema.REPORTS[command]:
        problems.append("a %s, not a %s" % (type(rep).__name__, _schema.REPORTS[command].__name__))
    for p in problems:
        fail("%s: %s" % (label, p))
    return rep if not problems else None


models = sorted(glob.glob("models/*.json") + glob.glob("models/hf/*.json"))
bad = 0
for m in models:
    for command, kw in (("estimate", {"gpu": "a100-80gb"}), ("check", {"gpu": "a100-80gb", "batch": 1})):
        n = len(failures)
        roundtrip("%s %s" % (command, m), command, m, **kw)
        bad += len(failures) > n
check(bad == 0, "estimate and check --json of %d bundled models: the dataclasses equal the JSON key by key"
      % len(models))

SUGGEST = models if LONG else ["models/gpt2-124m.json", "models/hf/llama-3.2-1b.json", "models/hf/mixtral-8x7b.json",
                               "models/hf/flan-t5-base.json", "models/vit-b16.json"]
bad = 0
for m in SUGGEST:
    n = len(failures)
    roundtrip("suggest %s" % m, "suggest", m, gpu="a100-40gb", no_probe=True)
    bad += len(failures) > n
check(bad == 0, "suggest --json of %d bundled models%s: the dataclasses equal the JSON" %
      (len(SUGGEST), "" if LONG else " (every one with MEMPLAN_TEST_LONG=1)"))

L1B, L8B = "models/hf/llama-3.2-1b.json", "models/hf/llama-3-8b.json"
CASES = [
    ("lora", "estimate", L1B, dict(finetune="lora", lora_r=8, lora_dropout=0.05, lora_targets=["q_proj", "v_proj"])),
    ("qlora", "check", L1B, dict(finetune="qlora", batch=2, gpu="t4", checkpoint="layers")),
    ("moe capacity", "estimate", "models/hf/mixtral-8x7b.json", dict(moe_capacity=1.5, seq=512)),
    ("expert parallel", "estimate", "models/hf/qwen3-30b-a3b.json", dict(gpus=8, parallel="fsdp", ep=4, seq=512)),
    ("t5", "estimate", "models/hf/flan-t5-base.json", dict(target_seq=128)),
    ("multimodal", "estimate", "models/hf/qwen2-vl-7b-instruct.json", dict(finetune="lora", seq=512)),
    ("images", "estimate", "models/hf/gemma-3-4b-it.json", dict(images=2, seq=1024, checkpoint="layers")),
    ("image size", "estimate", "models/hf/mistral-small-3.1-24b.json", dict(images=2, image_size="784x1540",
                                                                           seq=4096, checkpoint="layers")),
    ("images llama4", "estimate", "models/hf/llama-4-scout-17b-16e.json",
     dict(images=1, image_size="672x448", seq=1024, finetune="lora", checkpoint="layers")),
    ("images qwen2-vl", "estimate", "models/hf/qwen2-vl-7b-instruct.json",
     dict(images=1, image_size="450x300", seq=1024, checkpoint="layers")),
    ("zero3 offload nvme", "estimate", L8B, dict(gpus=8, parallel="zero3", offload="params", offload_device="nvme",
                                               gpu="a100-80gb")),
    ("nccl modelled", "estimate", "models/gpt2-124m.json", dict(gpus=8, parallel="ddp", gpu="h100-80gb", batch=2)),
    ("fsdp check", "check", L8B, dict(gpus=4, nodes=2, parallel="fsdp", batch=1, gpu="a100-80gb")),
    ("fsdp-qlora offload", "estimate", L1B, dict(finetune="qlora", gpus=2, parallel="fsdp", offload="params",
                                               precision="bf16")),
    ("layers+offload", "estimate", L1B, dict(checkpoint="layers+offload", use_cache=False)),
    ("act-offload", "estimate", L1B, dict(checkpoint="layers", act_offload=True, use_cache=False)),
    ("suggest act-offload", "suggest", L1B, dict(checkpoint="layers", act_offload=True, loss="chunked-nll",
                                                 finetune="lora", gpu="t4", no_probe=True)),
    ("layers+sac", "estimate", L1B, dict(checkpoint="layers+sac", use_cache=False)),
    ("layers+sac:auto", "estimate", L1B, dict(checkpoint="layers+sac:auto", gpu="h100-80gb", use_cache=False)),
    ("sqrt plan", "estimate", "models/gpt2-124m.json", dict(checkpoint="sqrt", batch=4)),
    ("recipe", "check", None, dict(recipe="tests/data/recipes/trl-sft-lora.yaml", gpu="a100-40gb")),
    ("recipe suggest", "suggest", None, dict(recipe="tests/data/recipes/axolotl-full.yaml", gpu="a100-40gb",
                                              no_probe=True)),
    ("suggest data parallel", "suggest", L8B, dict(gpu="a100-80gb", gpus=8, no_probe=True)),
    ("suggest nothing fits", "suggest", "models/hf/llama-2-70b.json", dict(gpu="t4", no_probe=True)),
    ("suggest host probes", "suggest", "models/tiny-mlp.json", dict(vram="1GiB", backend="host", max_batch=64)),
    ("an HF config as a dict", "estimate", json.load(open(L1B)), dict(batch=2)),
    ("packing", "estimate", L1B, dict(packing=True, batch=2, seq=512)),
    ("dpo", "estimate", L1B, dict(trainer="dpo", batch=2, seq=256)),
    ("suggest dpo", "suggest", L1B, dict(trainer="dpo", finetune="lora", seq=512, gpu="t4", no_probe=True)),
    ("orpo", "estimate", L1B, dict(trainer="orpo", batch=1, seq=512)),
    ("suggest packing", "suggest", L1B, dict(packing=True, seq=1024, gpu="a100-80gb", no_probe=True)),
    ("sdpa math", "estimate", L1B, dict(torch="2.11", precision="fp32", seq=256)),
    ("grpo", "estimate", L1B, dict(trainer="grpo", batch=8, seq=512, completion_length=256, beta=0.04,
                                   steps_per_generation=2)),
    ("grpo warpers", "estimate", L1B, dict(trainer="grpo", batch=8, seq=512, completion_length=256, top_p=0.9,
                                           top_k=50, min_p=0.05)),
    ("grpo repetition penalty", "estimate", L1B, dict(trainer="grpo", batch=8, seq=512, completion_length=256,
                                                      repetition_penalty=1.1, top_k=50)),
    ("grpo zero3 per-block", "estimate", L1B, dict(trainer="grpo", batch=8, seq=512, completion_length=256, gpus=2,
                                                  parallel="zero3", ds3_gather="off")),
    ("grpo fsdp", "estimate", L1B, dict(trainer="grpo", batch=8, seq=512, completion_length=256, gpus=2,
                                        parallel="fsdp")),
    ("suggest grpo vllm", "suggest", L1B, dict(trainer="grpo", seq=1024, completion_length=512, vllm=0.3,
                                               gpu="a100-40gb", no_probe=True)),
    ("grpo vllm", "check", L1B, dict(trainer="grpo", batch=8, seq=512, completion_length=256, vllm=0.3,
                                      gpu="a100-80gb")),
]
reps = {}
for label, command, model, kw in CASES:
    reps[label] = roundtrip(label, command, model, **kw)
    if reps[label]:
        ok("%s: %s --json read into the dataclasses and back" % (label, command))
missing = sorted("%s.%s" % k for k, v in seen.items() if not v)
check(not missing, "every optional field of the dataclasses is present in some report%s"
      % (" (never: %s)" % ", ".join(missing) if missing else ""))

# values the reports must hold (from the command lines above, not from the package)
r = reps.get("lora")
if r:
    check(r.config.finetune.mode == "lora" and r.config.finetune.lora_r == 8 and r.config.finetune.lora_dropout == 0.05
          and r.config.finetune.lora_targets == "q_proj,v_proj",
          "lora: finetune lora, r 8, dropout 0.05, targets q_proj,v_proj (the keywords reached the command line)")
r = reps.get("nccl modelled")
if r:
    n, mib = r.memory.nccl, 1 << 20
    check(n.source == "model" and n.comms == 1 and n.channels == 24 and n.peers == 2 and n.peer_bytes == 12 * mib
          and n.nvls_bytes == 256 * mib and r.memory.nccl_overhead_bytes == 832 * mib,
          "nccl modelled: 8 x H100 DDP, 24 channels x 2 peers x 12 MiB + NVLS 256 MiB = 832 MiB (NCCL's rules)")
    check(n.ep_p2p_channels == 0 and n.ep_bytes == 0 and n.efsdp_bytes == 0, "nccl modelled: no --ep groups under DDP")
r = reps.get("images")
if r:  # Gemma-3-4B: 896 x 896 images, patch 14 (4,096 patches), 256 tokens each, 27 SigLIP layers
    check(r.config.images.per_sample == 2 and r.config.images.tokens_each == 256 and r.config.images.patches == 4096
          and r.config.images.image_size == 896 and r.config.images.vision_layers == 27,
          "images: config.images 2 per sample, 256 tokens each, 4,096 patches of 896 px, 27 vision layers")
r = reps.get("image size")
if r:  # Mistral Small 3.1: 784 x 1540 px, patch 14 (56 x 110 = 6,160 patches), merged 2 x 2: 28 rows
    # x (55 + 1) = 1,568 tokens each, 24 Pixtral layers
    im = r.config.images
    check(im.per_sample == 2 and im.tokens_each == 1568 and im.patches == 6160 and im.height == 784
          and im.width == 1540 and im.image_size == 1540 and im.vision_layers == 24
          and im.asked_height == 784 and im.asked_width == 1540,
          "image size: config.images 2 per sample, 784 x 1540 px, 1,568 tokens and 6,160 patches each")
r = reps.get("images qwen2-vl")
if r:  # 450 x 300 px: smart_resize rounds each side to a multiple of 28 (448 x 308): 32 x 22 patches of 14 px,
    # 704 patches, 176 tokens (2 x 2 merged); 32 vision blocks; no vision_config.image_size
    im = r.config.images
    check(im.per_sample == 1 and im.height == 448 and im.width == 308 and im.patches == 704 and im.tokens_each == 176
          and im.vision_layers == 32 and im.image_size is None
          and im.asked_height == 450 and im.asked_width == 300,
          "images qwen2-vl: 450x300 resized to 448x308, 704 patches, 176 tokens, 32 vision blocks")
r = reps.get("images llama4")
if r:  # 672 x 448 px: Llama4ImageProcessor's canvas 2 x 2 tiles of 336 (scale 1, the least area) + the
    # global tile = 5 tiles of 24 x 24 = 576 patches; 3 + 5 x 144 + 4 separators = 727 tokens; 34 layers
    im = r.config.images
    check(im.per_sample == 1 and im.tiles == 5 and im.patches == 2880 and im.tokens_each == 727
          and im.height == 672 and im.width == 672 and im.image_size == 336 and im.vision_layers == 34
          and im.asked_height == 672 and im.asked_width == 448,
          "images llama4: 672x448 on a 2 x 2 canvas + the global tile, 2,880 patches, 727 tokens")
r = reps.get("sdpa math")
if r:  # llama-3.2-1b has 32 q heads and 8 k/v heads: fp32 GQA, torch 2.11's math kernel
    check(r.config.torch == "2.11" and r.config.sdpa_kernel == "math",
          "--torch 2.11, fp32 GQA: config.torch 2.11, config.sdpa_kernel math")
r = reps.get("an HF config as a dict")
if r:
    check(r.model.source == "hf" and r.config.batch == 2 and r.model.name == "model",
          "a dict model: written to a config.json, read as an HF config")
r = reps.get("suggest nothing fits")
if r:
    check(r.recommendation is None and r.run.returncode == 1 and r.alternatives,
          "suggest with nothing that fits: exit 1 is a result: recommendation None, %d alternatives"
          % len(r.alternatives))
r = reps.get("qlora")
if r:
    # check's verdict, by hand: fits exactly when the peak is at most the usable bytes; the shortfall
    # is the peak less the usable bytes (0 when it fits); usable = capacity x (1 - 5% margin)
    k = r.check
    short = max(0, k.peak_device_bytes - k.usable_bytes)
    check(k.fits == (k.peak_device_bytes <= k.usable_bytes) and k.shortfall_bytes == short and
          abs(k.usable_bytes - 0.95 * k.capacity_bytes) < 1e6 and r.fits == k.fits and
          r.run.returncode == (0 if k.fits else 1),
          "check qlora on a t4: fits %s, peak %d, usable %d, shortfall %d, exit %d"
          % (k.fits, k.peak_device_bytes, k.usable_bytes, k.shortfall_bytes, r.run.returncode))
r = memplan.check("models/gpt2-124m.json", gpu="t4", batch=64)
k = r.check
# the shortfall is the larger level's: the allocated peak's, or the simulated device's (reserved + context)
need = max(r.memory.peak_device_bytes, k.device_bytes if k.device_simulated and not k.fits_device else 0)
check(not r.fits and r.run.returncode == 1 and k.shortfall_bytes == need - k.usable_bytes
      and r.headroom_bytes == -k.shortfall_bytes,
      "check that does not fit: a result (exit 1), fits False, shortfall = the deciding level's peak - usable = %d"
      % k.shortfall_bytes)

# ---- keywords and errors --------------------------------------------------------------------------------

argv = memplan._run.argv_of("check", "m.json", batch=4, grad_accum=2, use_cache=False, lora_targets=("a", "b"),
                            ddp_bucket_view=True, wide=False, lora_dropout=0.1, seq=None)
check(argv[1:] == ["check", "m.json", "--batch", "4", "--grad-accum", "2", "--use-cache", "off",
                   "--lora-targets", "a,b", "--ddp-bucket-view", "--lora-dropout", "0.1"],
      "keywords to the command line: " + " ".join(argv[1:]))
for command, kw, want in (("estimate", {"vram": "24GiB"}, "unexpected keyword argument 'vram'"),
                          ("check", {"json": True}, "not a keyword argument"),
                          ("suggest", {"emit": "hf"}, "not a keyword argument"),
                          ("check", {"wide": "yes"}, "is a flag"),
                          ("check", {"batch": True}, "takes B")):
    try:
        memplan.report(command, "models/gpt2-124m.json", **kw)
        fail("%s %s: no TypeError" % (command, kw))
    except TypeError as e:
        check(want in str(e), "%s(%s): TypeError: %s" % (command, kw, e))
opts = memplan.options("check")
help_text = subprocess.run([MEMPLAN, "check", "--help"], capture_output=True, text=True).stdout
check(opts.get("batch") == "B" and opts.get("wide") is None and opts.get("use-cache") == "on|off"
      and "probe" not in opts and all("--" + o in help_text for o in opts),
      "options('check'): %d options, from its --help (batch B, wide a flag, no --no-probe)" % len(opts))
for label, call, code, text in (
        ("a model that does not exist", lambda: memplan.estimate("models/nope.json"), 3, "models/nope.json"),
        ("a value out of range", lambda: memplan.check("models/gpt2-124m.json", gpu="t4", batch=0), 2, "--batch"),
        ("a GPU with no profile", lambda: memplan.estimate("models/gpt2-124m.json", gpu="nope"), 2, "nope"),
        ("a refused recipe key", lambda: memplan.check(recipe="tests/data/recipes/llamafactory-defaults.yaml",
                                                       gpu="a100-80gb"), 3, "use_reentrant_gc")):
    try:
        call()
        fail("%s: no MemplanError" % label)
    except memplan.MemplanError as e:
        one = subprocess.run(e.argv, capture_output=True, text=True).stderr.strip().splitlines()[-1]
        check(e.code == code and text in e.message and one == "memplan: error: " + e.message,
              "%s: MemplanError exit %d, memplan's line: %s" % (label, e.code, e.message[:70]))
os.environ["MEMPLAN_BIN"] = "/nonexistent/memplan"
try:
    memplan.version()
    fail("a missing binary: no MemplanError")
except memplan.MemplanError as e:
    check(e.code == memplan.EXIT_NO_BINARY, "a missing binary: MemplanError exit %d" % e.code)
os.environ["MEMPLAN_BIN"] = MEMPLAN

# ---- no torch at import --------------------------------------------------------------------------------
code = ("import sys; import memplan, memplan.integrations; "
        "bad = [m for m in ('torch', 'transformers', 'trl', 'peft') if m in sys.modules]; "
        "print(bad); sys.exit(bool(bad))")
r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                   env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
check(r.returncode == 0, "import memplan, memplan.integrations: no torch, transformers, trl or peft imported %s"
      % r.stdout.strip())

print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
