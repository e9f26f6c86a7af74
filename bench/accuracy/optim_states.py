#!/usr/bin/env python3
"""optim_states.py - the optimizer state bytes of Hugging Face's low-bit optims, from the real
libraries (bitsandbytes, torchao) as transformers' Trainer builds them, on real CPU tensors.

Usage (from the repository root):
    python3 bench/accuracy/optim_states.py [--save] [CONFIG.json ...] [-- OPTIM ...]

For each config (default: models/hf/gpt2.json and models/hf/llama-3.2-1b.json: full fine-tuning,
fp32 parameters as under amp-bf16) and each HF `optim` (default: the low-bit ones memplan models),
it:
  1. builds the model on the meta device and lists its parameters as model.parameters() yields
     them (a tied weight once), each with its shape and whether an nn.Embedding owns it;
  2. builds a stand-in module with ONE real fp32 parameter of each distinct (shape, embedding)
     kind (an nn.Embedding where the model's is one), since every rule of these optimizers is
     per tensor (size thresholds, blocks);
  3. lets transformers' Trainer.create_optimizer build the optimizer (its kwargs, bitsandbytes'
     32-bit override of nn.Embedding weights: transformers trainer.py:1328), gives every
     parameter a gradient and runs optimizer.step() once (states are created by the first step);
  4. sums the bytes of every tensor in optimizer.state (a torchao subclass: its codes, scale and
     qmap), each storage once: a storage shared by several parameters (bitsandbytes' qmaps,
     the optimizer's) once for the optimizer, the others once per parameter of that kind.
torchao's state["step"] is torch.tensor(0.0) without a device (torchao/optim/adam.py:121): a host
tensor also on a GPU run, so it is not device memory and is left out.  bitsandbytes' paged
optimizers fall back to ordinary tensors on the CPU (optimizer.py get_state_buffer); their bytes
are the same (on a GPU, state tensors of 1e5 elements or more are CUDA managed memory).
Prints state bytes per optim and config next to `memplan estimate --json` (memory.optimizer_bytes);
with --save, appends rows to bench/accuracy/rows/optim_states.jsonl (rowlib.py) that
tests/replay_accuracy.py replays: the figure must match exactly.
Needs torch, transformers, bitsandbytes and torchao (CPU builds work: torchao compiles its step
with inductor's C++ backend).
"""
import collections
import json
import os
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rowlib  # noqa: E402

CONFIGS = ["models/hf/gpt2.json", "models/hf/llama-3.2-1b.json"]
OPTIMS = ["adamw_bnb_8bit", "paged_adamw_8bit", "lion_8bit", "paged_lion_8bit", "adamw_torch_8bit",
          "adamw_torch_4bit"]
MEMPLAN_ARGS = ["--precision", "amp-bf16", "--batch", "1", "--seq", "128", "--json"]


def model_params(cfg_path):
    """[(shape, is_embedding)] of the model's parameters, each once (tied weights once)."""
    import transformers
    with open(cfg_path) as f:
        d = json.load(f)
    cfg = transformers.AutoConfig.for_model(**d)
    cls = getattr(transformers, d["architectures"][0])
    with torch.device("meta"):
        model = cls(cfg)
    emb = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return [(tuple(p.shape), id(p) in emb) for p in model.parameters()]


class Kinds(torch.nn.Module):
    """One real parameter per (shape, embedding) kind: nn.Embedding modules for embeddings."""

    def __init__(self, kinds):
        super().__init__()
        self.embs = torch.nn.ModuleList()
        self.plain = torch.nn.ParameterList()
        self.order = []
        for shape, is_emb in kinds:
            if is_emb:
                self.embs.append(torch.nn.Embedding(*shape))
                self.order.append(self.embs[-1].weight)
            else:
                self.plain.append(torch.nn.Parameter(torch.randn(shape) * 0.02))
                self.order.append(self.plain[-1])


def state_tensors(v):
    """The plain tensors a state value holds (a torchao subclass: codes, scale, qmap)."""
    if not isinstance(v, torch.Tensor):
        return []
    if hasattr(v, "codes") and hasattr(v, "scale") and hasattr(v, "qmap"):
        return [v.codes, v.scale, v.qmap]
    return [v]


def measure(optim, kinds):
    """(bytes per kind, bytes shared by the optimizer) after one real step."""
    import bitsandbytes
    import transformers
    # bitsandbytes' GlobalOptimManager is a process-wide singleton: the 32-bit overrides the
    # Trainer registers (by module, and by id(p)) outlive their optimizer, and a later
    # parameter that reuses a freed id would inherit one.  One Trainer per process has none.
    bitsandbytes.optim.GlobalOptimManager.get_instance().initialize()
    mod = Kinds(kinds)
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = transformers.TrainingArguments(output_dir=out, optim=optim, use_cpu=True, report_to=[])
        trainer = transformers.Trainer(model=mod, args=args)
        opt = trainer.create_optimizer()
        for p in mod.order:
            p.grad = torch.randn_like(p) * 0.01
        opt.step()
    owners = collections.defaultdict(set)  # storage -> the parameters whose state holds it
    nbytes = {}
    torchao = type(opt).__module__.startswith("torchao")
    for i, p in enumerate(mod.order):
        for k, v in opt.state[p].items():
            if torchao and k == "step":  # a host tensor (see the module doc)
                continue
            for t in state_tensors(v):
                s = t.untyped_storage()
                owners[s.data_ptr()].add(i)
                nbytes[s.data_ptr()] = s.nbytes()
    per = [0] * len(kinds)
    shared = 0
    for ptr, who in owners.items():
        if len(who) > 1:
            shared += nbytes[ptr]
        else:
            per[next(iter(who))] += nbytes[ptr]
    return per, shared, type(opt).__module__ + "." + type(opt).__name__


def memplan_bytes(cfg, optim, tmp):
    row = {"config": cfg, "args": ["--optimizer", optim] + MEMPLAN_ARGS}
    report, _ = rowlib.run_memplan("./memplan", row, tmp)
    return report["memory"]["optimizer_bytes"], row


def main(argv):
    save = "--save" in argv
    argv = [a for a in argv if a != "--save"]
    if "--" in argv:
        i = argv.index("--")
        cfgs, optims = argv[:i] or CONFIGS, argv[i + 1:] or OPTIMS
    else:
        cfgs, optims = argv or CONFIGS, OPTIMS
    import bitsandbytes
    import torchao
    import transformers
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in cfgs:
            params = model_params(cfg)
            count = collections.Counter(params)
            kinds = sorted(count)
            for optim in optims:
                t0 = time.time()
                per, shared, cls = measure(optim, kinds)
                total = shared + sum(b * count[k] for b, k in zip(per, kinds))
                mp, row = memplan_bytes(cfg, optim, tmp)
                print("%-28s %-18s %-40s torch %15s  memplan %15s  %+d  (%.0f s)" % (
                    os.path.basename(cfg), optim, cls, "{:,}".format(total), "{:,}".format(mp), mp - total,
                    time.time() - t0), flush=True)
                row["figures"] = {"optimizer_state": rowlib.figure(total, mp)}
                row["figures"]["optimizer_state"]["abs"] = 0  # exact: the target, whatever memplan says now
                row["source"] = ("bench/accuracy/optim_states.py run of %s: %s built by transformers' "
                                 "Trainer.create_optimizer, one step on real CPU tensors, one per kind of "
                                 "%d parameters" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), cls,
                                                   len(params)))
                row["recorded"] = {"memplan_optimizer_bytes": mp, "shared_bytes": shared}
                row["versions"] = rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                                      bitsandbytes=bitsandbytes.__version__,
                                                      torchao=torchao.__version__)
                rows.append(row)
    if save:
        print("rows:", rowlib.save_rows("optim_states", rows))


if __name__ == "__main__":
    main(sys.argv[1:])
