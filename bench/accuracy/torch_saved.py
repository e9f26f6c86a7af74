#!/usr/bin/env python3
"""torch_saved.py - memplan's per-block activation bytes against what PyTorch autograd saves (CPU).

For small Hugging Face models (gpt2, llama with GQA, gpt_neox, qwen2) in fp32, under
torch.autocast("cpu", bfloat16) (memplan amp-bf16) and in pure bf16, one training forward
(model.train(), loss included, use_cache=False unless asked) runs with

  * torch.autograd.graph.saved_tensors_hooks: every tensor autograd saves for backward,
    deduplicated by storage (untyped_storage().data_ptr()), nbytes of the storage; parameter and
    buffer storages are excluded (docs/memory-facts.md#saved-tensors, facts 1-2);
  * a TorchDispatchMode that records, for every new storage an aten op creates, the op and
    the block running at the time (forward pre-hooks: "embed" from the model call, "h.i" from
    decoder layer i, "head" from the final norm on: final norm, lm_head, loss);
  * a walk of the autograd graph (grad_fn._saved_*) naming the nodes that save each storage;
  * weak references to every created storage, for the bytes alive at block boundaries.

Figures (bench/accuracy/torch_saved.md explains the correspondence in full):
  torch saved[i] = distinct saved storages created while block i runs, plus block outputs still
                   alive when the forward ends (the loss).  Summed over blocks this is the set
                   memplan's sum of layers[].activation_bytes describes (saved tensors + loss).
  torch live[i]  = growth of live bytes over block i (pre-hook to next pre-hook) while the caller
                   holds the model output: memplan's definition, but it also sees the returned
                   logits and tensors Python locals hold for a while.
  memplan[i]     = layers[i].activation_bytes of `memplan estimate CONFIG --json` (unrounded).
Input ids and labels exist before the forward and are excluded (memplan: memory.input_bytes).

memplan's tensor-level view comes from bench/accuracy/dump_saved (every saved tensor: dtype, bytes, block,
saving node); storages are paired with memplan tensors on dtype and bytes, preferring a matching
kind of saving node, and what stays unpaired is listed.

Build the binaries with `sh bench/accuracy/torch_saved_build.sh`, then:
  torch_saved.py [--memplan PATH] [--dump PATH] [--out FILE.md] [--detail] [--quick] [--cfgdir DIR]
      [--rows-out FILE]
Each row (use_cache and dropout rows aside: informational) also goes to bench/accuracy/rows/torch_saved.jsonl
(rowlib.py), which tests/replay_accuracy.py replays without torch.
"""
import argparse
import collections
import contextlib
import json
import os
import platform
import subprocess
import sys
import time

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.multiprocessing.reductions import StorageWeakRef

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rowlib  # noqa: E402  (the measured rows, kept as data)

MEMPLAN_DEFAULT = "/tmp/tsbuild/memplan"
DUMP_DEFAULT = "/tmp/tsbuild/dump_saved"

DT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "int64",
            torch.uint8: "uint8", torch.bool: "bool"}


def dt(t):
    return DT_NAMES.get(t, str(t).replace("torch.", ""))


# ---- models ---------------------------------------------------------------------------------------

def make_config(kind, dropout=0.0):
    """Small configs; every dropout 0 unless asked (dropout applies to embd/resid only; attn stays 0)."""
    if kind == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=1000, n_positions=256,
                                       embd_pdrop=dropout, resid_pdrop=dropout, attn_pdrop=0.0)
    if kind == "llama":
        return transformers.LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=688, vocab_size=1000,
                                        max_position_embeddings=256, attention_dropout=0.0)
    if kind == "gpt_neox":
        return transformers.GPTNeoXConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=1024, vocab_size=1000, max_position_embeddings=256,
                                          rotary_pct=0.25, attention_dropout=0.0, hidden_dropout=0.0)
    if kind == "qwen2":
        return transformers.Qwen2Config(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=688, vocab_size=1000,
                                        max_position_embeddings=256, attention_dropout=0.0)
    raise ValueError(kind)


def block_modules(model):
    """(embed-start module, [decoder layers], final norm) of a *ForCausalLM."""
    base = model.base_model
    if hasattr(base, "h"):  # gpt2
        return base.h, base.ln_f
    if hasattr(base, "layers") and hasattr(base, "final_layer_norm"):  # gpt_neox
        return base.layers, base.final_layer_norm
    return base.layers, base.norm  # llama, qwen2


# ---- the torch measurement ------------------------------------------------------------------------

class Tracker:
    def __init__(self):
        self.block = "pre"
        self.created = {}      # storage ptr -> record of its latest creation
        self.records = []      # every creation (for the live-at-backward count)
        self.saved = {}        # storage ptr -> record (first pack)
        self.outputs = {}      # block -> storage ptr of its output


class CreationMode(TorchDispatchMode):
    """Records the creating aten op and block of every new storage (outputs that alias no input)."""

    def __init__(self, tr):
        super().__init__()
        self.tr = tr

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = set()
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, torch.Tensor):
                ins.add(a.untyped_storage().data_ptr())
        for o in tree_flatten(out)[0]:
            if not isinstance(o, torch.Tensor):
                continue
            st = o.untyped_storage()
            if st.nbytes() == 0 or st.data_ptr() in ins:
                continue
            rec = {"ptr": st.data_ptr(), "nbytes": st.nbytes(), "block": self.tr.block, "op": str(func),
                   "dtype": dt(o.dtype), "shape": tuple(o.shape), "weak": StorageWeakRef(st)}
            self.tr.created[st.data_ptr()] = rec
            self.tr.records.append(rec)
        return out


def run_torch(kind, b, s, precision, attn, dropout=0.0, track_creation=True, seed=0, use_cache=False):
    torch.manual_seed(seed)
    cfg = make_config(kind, dropout)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    if precision == "bf16":  # pure bf16: memplan --precision bf16 (bf16 parameters, no autocast)
        model.to(torch.bfloat16)
    model.train()
    layers, fnorm = block_modules(model)
    tr = Tracker()
    pstore = {p.untyped_storage().data_ptr() for p in model.parameters()}
    pstore |= {x.untyped_storage().data_ptr() for x in model.buffers()}

    def live_now():
        """Bytes of storages created in this forward that are still alive (saved or referenced)."""
        alive = {}
        for rec in tr.records:
            if rec["ptr"] not in pstore and not rec["weak"].expired():
                alive[rec["ptr"]] = rec["nbytes"]
        return sum(alive.values())

    snaps = {}

    def set_block(name):
        def hook(mod, args, kwargs=None):
            tr.block = name
            snaps[name + ".start"] = live_now()
        return hook

    hooks = [model.register_forward_pre_hook(set_block("embed"))]
    for i, layer in enumerate(layers):
        def pre(mod, args, kwargs, i=i):
            tr.block = "h.%d" % i
            snaps["h.%d.start" % i] = live_now()
            x = args[0] if args else kwargs["hidden_states"]
            tr.outputs["embed" if i == 0 else "h.%d" % (i - 1)] = tr.created.get(x.untyped_storage().data_ptr())
        hooks.append(layer.register_forward_pre_hook(pre, with_kwargs=True))

        def post(mod, args, out, i=i):
            y = out[0] if isinstance(out, (tuple, list)) else out
            tr.outputs["h.%d" % i] = tr.created.get(y.untyped_storage().data_ptr())
        hooks.append(layer.register_forward_hook(post))
    hooks.append(fnorm.register_forward_pre_hook(set_block("head")))

    def pack(t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if st.nbytes() and ptr not in tr.saved and ptr not in pstore:
            cr = tr.created.get(ptr)
            tr.saved[ptr] = {"nbytes": st.nbytes(), "dtype": dt(t.dtype), "shape": tuple(t.shape),
                             "save_block": tr.block, "block": cr["block"] if cr else "input",
                             "op": cr["op"] if cr else "(input)", "by": []}
        return t

    ids = torch.randint(0, cfg.vocab_size, (b, s))
    labels = torch.randint(0, cfg.vocab_size, (b, s))
    amp = precision == "amp-bf16"
    with contextlib.ExitStack() as es:
        es.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        if track_creation:
            es.enter_context(CreationMode(tr))
        if amp:
            es.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        out = model(input_ids=ids, labels=labels, use_cache=use_cache)
    for h in hooks:
        h.remove()
    loss = out.loss
    tr.outputs["head"] = tr.created.get(loss.untyped_storage().data_ptr())
    snaps["head.end"] = live_now()

    # which autograd nodes save each storage
    seen, stack = set(), [loss.grad_fn]
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        for attr in dir(n):
            if not attr.startswith("_saved_"):
                continue
            try:
                v = getattr(n, attr)
            except Exception:
                continue
            for t in (v if isinstance(v, (tuple, list)) else [v]):
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                    rec = tr.saved.get(t.untyped_storage().data_ptr())
                    if rec is not None:
                        rec["by"].append("%s.%s" % (n.name(), attr[len("_saved_"):]))
        stack.extend(f for f, _ in n.next_functions)

    res = {"saved": tr.saved, "outputs": tr.outputs}
    # per block: created there and (saved or the block's output)
    blocks = ["embed"] + ["h.%d" % i for i in range(len(layers))] + ["head"]
    per, per_saved = collections.OrderedDict((k, 0) for k in blocks), collections.OrderedDict((k, 0) for k in blocks)
    counted = set()
    for ptr, rec in tr.saved.items():
        if rec["block"] in per:
            per[rec["block"]] += rec["nbytes"]
            per_saved[rec["block"]] += rec["nbytes"]
            counted.add(ptr)
    # block outputs nothing saved count only while still alive at the end of the forward (the loss;
    # a residual that the next block's norm does not save is freed by its residual add)
    out_extra, out_freed = [], []
    for blk, cr in tr.outputs.items():
        if cr is None or cr["ptr"] in counted:
            continue
        if cr["weak"].expired():
            out_freed.append((blk, cr))
            continue
        per[cr["block"]] += cr["nbytes"]
        counted.add(cr["ptr"])
        out_extra.append((blk, cr))
    res["per_block"] = per
    # memplan's exact definition: growth of live bytes over each block's forward (the caller holds `out`)
    # Block i runs from its pre-hook to the next block's pre-hook, so the release of an unsaved
    # block input (when HF's loop rebinds hidden_states) falls inside block i, as in memplan.
    starts = [snaps.get(k + ".start", 0) for k in blocks] + [snaps.get("head.end", 0)]
    res["live_growth"] = collections.OrderedDict(
        (k, starts[n + 1] - starts[n]) for n, k in enumerate(blocks)) if track_creation else None
    res["per_block_saved"] = per_saved
    res["outputs_not_saved"] = out_extra
    res["outputs_freed"] = out_freed
    res["saved_total"] = sum(r["nbytes"] for r in tr.saved.values() if r["block"] != "input")
    res["input_saved"] = [r for r in tr.saved.values() if r["block"] == "input"]
    # alive at backward start (the caller still holds `out`, as a training loop does)
    alive = {}
    for rec in tr.records:
        if not rec["weak"].expired() and rec["ptr"] not in pstore:
            alive[rec["ptr"]] = rec
    res["live_total"] = sum(r["nbytes"] for r in alive.values())
    res["saved_not_live"] = [(p, r) for p, r in tr.saved.items() if p not in alive and r["block"] != "input"]
    res["live_not_saved"] = [r for p, r in alive.items() if p not in tr.saved]
    res["blocks"] = blocks
    res["config"] = cfg
    del out, loss
    return res


# ---- memplan ---------------------------------------------------------------------------------------

def write_config(cfg, path):
    d = cfg.to_dict()
    d["model_type"] = cfg.model_type
    with open(path, "w") as f:
        json.dump(d, f, indent=1, default=str)


def run_memplan(memplan, dump, cfg_path, b, s, precision, attn, use_cache=False):
    # --use-cache as torch's forward ran (memplan otherwise follows the config's use_cache)
    cmd = [memplan, "estimate", cfg_path, "--batch", str(b), "--seq", str(s), "--precision", precision,
           "--attention", attn, "--use-cache", "on" if use_cache else "off", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise RuntimeError("memplan failed: %s\n%s" % (" ".join(cmd), r.stderr))
    j = json.loads(r.stdout)
    tensors = []
    if dump and os.path.exists(dump):
        r2 = subprocess.run([dump, cfg_path, str(b), str(s), precision, attn], capture_output=True, text=True)
        if r2.returncode == 0:
            tensors = [json.loads(x) for x in r2.stdout.splitlines() if x.strip()]
    return j, tensors, " ".join(cmd)


def save_row(rows_out, script, kind, cfg_path, cmd, t_total, mp_total):
    """The row just measured, kept as data (rowlib.py) for tests/replay_accuracy.py: the config as
    written, memplan's settings, torch's saved bytes and the CUDA-only ones (GPT-2's gelu_new)."""
    with open(cfg_path) as f:
        cfg_json = json.load(f)
    argv = cmd.split()[3:]
    b, s, prec, attn = (int(argv[argv.index("--batch") + 1]), int(argv[argv.index("--seq") + 1]),
                        argv[argv.index("--precision") + 1], argv[argv.index("--attention") + 1])
    cuda, _ = rowlib.cuda_only_bytes(cfg_json, b, s, prec, attn, "none")
    rowlib.save_rows("torch_saved", [{
        "source": "bench/accuracy/%s run of %s" % (script, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())),
        "config": "%s make_config(%r)" % (script, kind), "config_json": cfg_json,
        "args": argv, "figures": {"saved": rowlib.figure(t_total, mp_total, cuda)},
        "recorded": {"saved": mp_total},
        "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__),
    }], rows_out)


def memplan_sets(tensors):
    """Per block: distinct (saved or output) tensors memplan keeps, as (name, dtype, bytes, [savers])."""
    keep = collections.OrderedDict()
    for t in tensors:
        if t["kind"] == "saved" and t["block"] != "input":
            keep.setdefault(t["tensor"], [t["block"], t["dtype"], t["bytes"], []])[3].append(t["by"])
    for t in tensors:
        if t["kind"] == "output":
            keep.setdefault(t["tensor"], [t["block"], t["dtype"], t["bytes"], []])[3].append("output:(block output)")
    per = collections.defaultdict(list)
    for name, (blk, d, n, by) in keep.items():
        per[blk].append((name, d, n, by))
    return per


# autograd node (grad_fn name prefix) -> memplan primitives whose saved tensors it corresponds to
TORCH2MP = {
    "NativeLayerNormBackward": {"layernorm"}, "AddmmBackward": {"linear"}, "MmBackward": {"linear"},
    "ScaledDotProduct": {"attention"}, "BmmBackward": {"attention"}, "SoftmaxBackward": {"attention"},
    "WhereBackward": {"attention"}, "MaskedFillBackward": {"attention"}, "PowBackward": {"rmsnorm", "activation"},
    "RsqrtBackward": {"rmsnorm"}, "MulBackward": {"rmsnorm", "mul", "activation", "dropout", "rope"},
    "SiluBackward": {"activation"}, "GeluBackward": {"activation"}, "TanhBackward": {"activation"},
    "ReluBackward": {"activation"}, "SigmoidBackward": {"activation"}, "NativeDropoutBackward": {"dropout"},
    "LogSoftmaxBackward": {"cross_entropy"}, "NllLossBackward": {"cross_entropy"},
    "EmbeddingBackward": {"embedding"}, "(block output": {"output"},
}


def torch_kinds(rec):
    k = set()
    for by in rec["by"]:
        for pre, prims in TORCH2MP.items():
            if by.startswith(pre):
                k |= prims
    return k


def match(torch_list, mp_list):
    """Pairs torch storages with memplan tensors: same dtype and bytes, first where the saving
    node kinds agree, then on size alone.  Returns (pairs, torch unmatched, memplan unmatched)."""
    left = list(mp_list)
    pairs, extra_t = [], []
    todo = sorted(torch_list, key=lambda r: -r["nbytes"])
    for strict in (True, False):
        rest = []
        for t in todo:
            tk = torch_kinds(t)
            hit = None
            for m in left:
                if m[1] != t["dtype"] or m[2] != t["nbytes"]:
                    continue
                mk = {b.split(":")[0] for b in m[3]}
                if not strict or (tk & mk):
                    hit = m
                    break
            if hit is None:
                rest.append(t)
            else:
                left.remove(hit)
                pairs.append((t, hit))
        todo = rest
    extra_t = todo
    return pairs, extra_t, left


# ---- memplan plus the changes bench/accuracy/torch_saved.md recommends, computed ---------------------------------

def recommended_delta(kind, cfg, precision, b, s):
    """Bytes the recommended layers.c changes would add to memplan's total (use_cache=False, no dropout)."""
    pc = 4 if precision == "fp32" else 2        # matmul output dtype
    pres = 2 if precision == "bf16" else 4      # residual stream dtype (fp32 under autocast)
    d = 8 * b * s + 4                           # shifted int64 labels + nll_loss total_weight
    if kind == "gpt2":
        F = cfg.n_inner or 4 * cfg.n_embd
        d += cfg.n_layer * 3 * b * s * F * pc   # NewGELUActivation: tanh(u), 0.5*x, 1+tanh(u)
        d += 8 * s                              # position_ids (1, s) saved by wpe
        return d
    hd = cfg.hidden_size // cfg.num_attention_heads
    rot = int(hd * cfg.rope_parameters.get("partial_rotary_factor", 1.0)) if kind == "gpt_neox" else hd
    d += 2 * s * rot * pres                     # rope cos, sin (1, s, rotary_dim), once per model
    if kind == "gpt_neox":                      # SDPA output copy (q from torch.cat is (b,a,s,d)-contiguous)
        d += cfg.num_hidden_layers * b * s * cfg.hidden_size * pc
    return d


# ---- activation functions -------------------------------------------------------------------------

# what memplan's lower_act keeps for an MLP fc1 -> act -> fc2, in units of the act input's bytes N:
# act input (or output for relu/tanh/sigmoid) + fc2 input (the act output)
MP_ACT_UNITS = {"gelu": 2, "gelu_new": 2, "gelu_fast": 2, "gelu_pytorch_tanh": 2, "silu": 2, "swish": 2,
                "relu": 1, "tanh": 1, "sigmoid": 1}


def act_table():
    """Saved bytes of transformers' ACT2FN[name] between two Linears, in units of N (fc1 output bytes)."""
    from transformers.activations import ACT2FN
    rows = []
    for name in MP_ACT_UNITS:
        res = []
        for amp in (False, True):
            torch.manual_seed(0)
            act = ACT2FN[name]
            fc1, fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
            x = torch.randn(4, 32, 64, requires_grad=True)
            skip = {p.untyped_storage().data_ptr() for p in list(fc1.parameters()) + list(fc2.parameters())}
            skip.add(x.untyped_storage().data_ptr())
            saved = {}

            def pack(t):
                st = t.untyped_storage()
                if st.data_ptr() not in skip:
                    saved[st.data_ptr()] = st.nbytes()
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    h = fc1(x)
                    fc2(act(h))
            n = h.numel() * h.element_size()
            extra = (fc1.weight.numel() + fc2.weight.numel() + x.numel()) * 2 if amp else 0  # bf16 copies
            res.append((sum(saved.values()) - extra) / n)
        rows.append("| %s | %s | %.0f | %.0f | %d |" % (name, type(ACT2FN[name]).__name__, res[0], res[1],
                                                        MP_ACT_UNITS[name]))
    return rows


# ---- main ------------------------------------------------------------------------------------------

def fmt(n):
    return "{:,}".format(n)


def pct(a, b):
    return "%+.2f%%" % (100.0 * (a - b) / b) if b else "n/a"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memplan", default=MEMPLAN_DEFAULT)
    ap.add_argument("--dump", default=DUMP_DEFAULT, help="bench/accuracy/dump_saved binary (per-tensor memplan listing)")
    ap.add_argument("--out", help="also write the report (markdown) here")
    ap.add_argument("--detail", action="store_true", help="list every saved storage of embed, h.0 and head")
    ap.add_argument("--quick", action="store_true", help="one shape per model")
    ap.add_argument("--cfgdir", default="/tmp/torch_saved_configs", help="where the HF config.json files go")
    ap.add_argument("--rows-out", default=os.path.join(rowlib.ROWS_DIR, "torch_saved.jsonl"),
                    help="where the measured rows go as data for tests/replay_accuracy.py (rowlib.py); '' for none")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    tmp = args.cfgdir
    os.makedirs(tmp, exist_ok=True)

    cases = []  # (model, precision, b, s, attention, dropout, use_cache)
    shapes = [(2, 128)] if args.quick else [(2, 128), (4, 256)]
    for kind in ("gpt2", "llama", "gpt_neox", "qwen2"):
        for prec in ("fp32", "amp-bf16"):
            for (b, s) in shapes:
                cases.append((kind, prec, b, s, "sdpa", 0.0, False))
    for kind in ("gpt2", "llama"):
        for prec in ("fp32", "amp-bf16"):
            cases.append((kind, prec, 2, 128, "eager", 0.0, False))
    for kind in ("gpt2", "llama", "gpt_neox", "qwen2"):  # pure bf16 (model.to(bfloat16))
        cases.append((kind, "bf16", 2, 128, "sdpa", 0.0, False))
    # informational: HF's default use_cache=True in a training forward (DynamicCache copies k/v)
    for kind in ("gpt2", "llama", "gpt_neox", "qwen2"):
        cases.append((kind, "fp32", 2, 128, "sdpa", 0.0, True))
    # informational: CPU dropout masks have the input dtype (memplan models CUDA's 1-byte mask)
    cases.append(("gpt2", "fp32", 2, 128, "sdpa", 0.1, False))

    lines = []
    P = lines.append
    P("# memplan activation bytes vs PyTorch autograd saved tensors (CPU)\n")
    P("torch %s, transformers %s, python %s, %s; memplan %s\n" % (
        torch.__version__, transformers.__version__, platform.python_version(), platform.machine(), args.memplan))
    P("Command: `%s`\n" % " ".join([sys.executable] + sys.argv))
    P("Columns: **saved** = distinct storages autograd saved (parameters excluded), attributed to the block "
      "that created them, plus block outputs still alive when the forward ends (the loss); **live** = growth of "
      "live bytes over each block's forward (memplan's definition of layers[].activation_bytes), measured with "
      "weak references while the caller holds the model output; **memplan** = `layers[].activation_bytes`. "
      "Per-block lists are embed, h.0, h.1, head.\n")
    P("| model | prec | attn | b | s | torch saved | torch live | memplan | vs saved | vs live "
      "| per block: torch saved | torch live | memplan |")
    P("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    details = []
    fixed_rows = []
    for (kind, prec, b, s, attn, drop, uc) in cases:
        tr = run_torch(kind, b, s, prec, attn, drop, use_cache=uc)
        # cross-check: the dispatch mode must not change what is saved
        tr2 = run_torch(kind, b, s, prec, attn, drop, track_creation=False, use_cache=uc)
        tot2 = sum(r["nbytes"] for r in tr2["saved"].values())
        tot1 = sum(r["nbytes"] for r in tr["saved"].values())
        assert tot1 == tot2, (kind, prec, tot1, tot2)
        cfg_path = os.path.join(tmp, "%s%s.json" % (kind, "-drop" if drop else ""))
        write_config(tr["config"], cfg_path)
        j, tensors, cmd = run_memplan(args.memplan, args.dump, cfg_path, b, s, prec, attn, uc)
        mp_blocks = collections.OrderedDict((l["name"], l["activation_bytes"]) for l in j["layers"])
        mp_total = sum(mp_blocks.values())
        t_total = sum(tr["per_block"].values())
        name = kind + ("-dropout%.1f" % drop if drop else "") + ("-use_cache" if uc else "")
        if not uc and not drop and args.rows_out:
            save_row(args.rows_out, "torch_saved.py", kind, cfg_path, cmd, t_total, mp_total)
        if not uc and not drop:
            fixed_rows.append("| %s | %s | %s | %d | %d | %s | %s | %s | %s |" % (
                name, prec, attn, b, s, fmt(t_total), fmt(mp_total),
                fmt(mp_total + recommended_delta(kind, tr["config"], prec, b, s)),
                "%+d" % (mp_total + recommended_delta(kind, tr["config"], prec, b, s) - t_total)))
        lg = tr["live_growth"]
        assert sum(lg.values()) == tr["live_total"], (sum(lg.values()), tr["live_total"])
        P("| %s | %s | %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, prec, attn, b, s, fmt(t_total), fmt(tr["live_total"]), fmt(mp_total), pct(mp_total, t_total),
            pct(mp_total, tr["live_total"]),
            ", ".join(fmt(v) for v in tr["per_block"].values()),
            ", ".join(fmt(v) for v in lg.values()),
            ", ".join(fmt(v) for v in mp_blocks.values())))
        # differences, tensor by tensor
        mp_per = memplan_sets(tensors)
        d = ["### %s %s %s b=%d s=%d\n" % (name, prec, attn, b, s), "memplan: `%s`\n" % cmd]
        for blk in tr["blocks"]:
            tl = [dict(r, ptr=p) for p, r in tr["saved"].items() if r["block"] == blk]
            for (ob, cr) in tr["outputs_not_saved"]:
                if cr["block"] == blk:
                    tl.append({"nbytes": cr["nbytes"], "dtype": cr["dtype"], "shape": cr["shape"], "op": cr["op"],
                               "by": ["(block output, not saved)"], "save_block": "-"})
            pairs, et, em = match(tl, mp_per.get(blk, []))
            tb = tr["per_block"][blk]
            mb = mp_blocks.get(blk, 0)
            d.append("* **%s**: torch saved %s, torch live growth %s, memplan %s (%s vs saved)" % (
                blk, fmt(tb), fmt(tr["live_growth"][blk]), fmt(mb), pct(mb, tb)))
            for r in et:
                d.append("  * torch only: %s %s %s B, made by `%s`, saved by %s" % (
                    r["dtype"], list(r["shape"]), fmt(r["nbytes"]), r["op"], ", ".join(sorted(set(r["by"]))) or "-"))
            for m in em:
                d.append("  * memplan only: `%s` %s %s B, saved by %s" % (m[0], m[1], fmt(m[2]), ", ".join(m[3])))
            for (ob, cr) in tr["outputs_freed"]:
                if cr["block"] == blk:
                    d.append("  * torch: the output of %s (%s %s %s B) is saved by nothing and already freed when "
                             "the forward ends" % (ob, cr["dtype"], list(cr["shape"]), fmt(cr["nbytes"])))
            if args.detail and blk in ("embed", "h.0", "head") and (attn == "sdpa" and b == 2 and drop == 0 and not uc):
                d.append("  * matched storages of %s (torch: dtype shape bytes, creating op, saving nodes = memplan tensor):"
                         % blk)
                for (r, m) in sorted(pairs, key=lambda p: -p[0]["nbytes"]):
                    d.append("    * %s %s %s B `%s` <- %s = `%s` (%s)" % (
                        r["dtype"], list(r["shape"]), fmt(r["nbytes"]), r["op"], ", ".join(sorted(set(r["by"]))),
                        m[0], ", ".join(m[3])))
        if tr["input_saved"]:
            d.append("* inputs saved (not activations in either): " + ", ".join(
                "%s %s by %s" % (r["dtype"], list(r["shape"]), ",".join(sorted(set(r["by"]))))
                for r in tr["input_saved"]))
        lns = [r for r in tr["live_not_saved"]]
        if lns:
            d.append("* alive at backward start but not saved (held by the returned output etc.): " + "; ".join(
                "%s %s %s B (`%s`, %s)" % (r["dtype"], list(r["shape"]), fmt(r["nbytes"]), r["op"], r["block"])
                for r in lns))
        d.append("")
        details.extend(d)
        print(lines[-1], flush=True)
    P("")
    # (the recommended-delta table went away once src/ir/layers.c applied the recommendations)
    P("Activation functions (transformers ACT2FN) between two Linears: saved bytes in units of N = the "
      "activation input's bytes (act input/output + fc2 input; parameters, the fc1 input and bf16 weight "
      "copies excluded):\n")
    P("| name | class | torch fp32 | torch amp-bf16 | memplan |")
    P("|---|---|---|---|---|")
    lines.extend(act_table())
    P("")
    P("Per-tensor differences (greedy match on dtype and bytes within each block):\n")
    lines.extend(details)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
