"""MemplanCallback: memplan checks a transformers Trainer's run (TRL's trainers too) before its first step.

    from memplan.integrations.transformers import MemplanCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[MemplanCallback(seq=2048)])
    trainer.train()   # raises MemplanDoesNotFit before the first step when memplan says it will not fit

At on_train_begin the callback plans the run from the live objects, through memplan's own reader of
trainers' recipes (`--recipe`, README "Plan the recipe you launch"; src/recipe/):

* the arguments: `args.to_json_string()` as the recipe, format `trl` for TRL's configs (SFTConfig:
  max_length, loss_type, packing, ...) and `hf` for TrainingArguments.  memplan reads every key that
  changes memory (batch, accumulation, checkpointing and its kwargs, bf16/fp16, optim, ...) or
  refuses it (fsdp, deepspeed, torch_compile, Liger, ...), with the trainer's defaults;
* the model: the config of the model (a peft model's base) as its config.json, with the dtype its
  parameters are in (memplan turns dtype and bf16/fp16 into its precision, as for a recipe);
  a quantization_config is read by memplan (bitsandbytes 4-bit: --finetune qlora);
* peft: the LoRA adapter's r, alpha, dropout and the modules it adapts (their names);
* the attention implementation the model runs (model.config._attn_implementation), and the torch
  release that runs it (--torch: it decides SDPA's kernel for fp32 grouped-query attention);
* the world: with several processes and no fsdp/deepspeed, DDP (--gpus, --nodes, --parallel ddp);
* the GPU: gpu= (a memplan profile) or vram= (bytes or "24GiB"), else this process's CUDA device's
  total memory; with none of them, the peak only (memplan estimate), and no verdict.

What memplan cannot plan is refused (on_unsupported="raise", the default: MemplanUnsupported) or
reported (on_unsupported="warn"), never left out: a key memplan refuses, a peft method other
than LoRA, DoRA, several adapters, parameters in several dtypes, a model whose parameter or
trainable counts differ from memplan's (modules_to_save, layers_to_transform, frozen layers, ...),
an optimizer other than the one args.optim makes, checkpointing switched on outside the arguments,
nn.DataParallel.  Everything is logged (log=, default stderr, on the local main process) and kept
on the callback: .report (memplan's check or estimate report), .suggestion (memplan's suggest
report when the run does not fit), .problems, .argv (the memplan command line; keep_dir= keeps its
files so that it can be run again).

The model and the arguments are read, never changed.  torch, transformers and peft are imported
here only: `import memplan` does not import them.
"""
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections import Counter

from transformers import TrainerCallback

import memplan

# transformers' attn_implementation -> memplan's --attention (the recipe reader's table,
# src/recipe/recipe.c derive_attention)
ATTENTION = {"sdpa": "sdpa", "eager": "eager", "flash_attention_2": "flash", "flash_attention_3": "flash"}
DTYPES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}
# the keys of TrainingArguments that carry sharding: dropped from the recipe only when parallel= says
# what to plan instead (memplan refuses them in a recipe)
SHARDING_KEYS = ("fsdp", "fsdp_config", "deepspeed")


class MemplanUnsupported(memplan.MemplanError):
    """the run has a setting memplan cannot plan; .problems lists each"""

    def __init__(self, problems, code=memplan.EXIT_INPUT, argv=None, stderr=""):
        self.problems = list(problems)
        super().__init__("memplan cannot plan this run: " + "; ".join(self.problems), code, argv, stderr)


class MemplanDoesNotFit(RuntimeError):
    """memplan says the run does not fit its GPU; .report (check), .suggestion (suggest, or None)"""

    def __init__(self, message, report, suggestion):
        super().__init__(message)
        self.report = report
        self.suggestion = suggestion


def fmt_bytes(n):
    """1.50 GiB, 512.00 MiB (2^30, 2^20), as memplan writes them"""
    n = float(n)
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= size:
            return "%.2f %s" % (n / size, unit)
    return "%d B" % n


def _stderr(line):
    sys.stderr.write(line + "\n")


class MemplanCallback(TrainerCallback):
    """Plans the Trainer's run with memplan at on_train_begin; see the module's docstring.

    gpu: a memplan GPU profile ("a100-80gb", `memplan help gpus`); vram: the target memory (bytes,
    or "24GiB"); neither: this process's CUDA device, if any.
    seq: the sequence length (TrainingArguments has none: memplan's default is the model's
    max_position_embeddings, at most 2048; TRL's configs have max_length).
    on_oom: "raise" (MemplanDoesNotFit before the first step) or "warn".
    on_unsupported: "raise" (MemplanUnsupported) or "warn".
    parallel: the sharding memplan plans when the arguments use fsdp or deepspeed
    ("fsdp", "zero3", ...: memplan's --parallel), which memplan does not read from a recipe.
    options: more memplan options, as memplan.check() takes them (label_fraction=0.3, margin=10,
    context="600MiB", optimizer="adamw" for a custom optimizer, ...); they win over the arguments.
    log: a function of one line (default: stderr on the local main process).
    keep_dir: write the model's config.json and the arguments there and keep them (default: a
    temporary directory, removed)."""

    def __init__(self, gpu=None, vram=None, seq=None, on_oom="raise", on_unsupported="raise", parallel=None,
                 options=None, log=None, keep_dir=None):
        for name, v in (("on_oom", on_oom), ("on_unsupported", on_unsupported)):
            if v not in ("raise", "warn"):
                raise ValueError("MemplanCallback: %s: expected 'raise' or 'warn', got %r" % (name, v))
        if gpu is not None and vram is not None:
            raise ValueError("MemplanCallback: give gpu= or vram=, not both")
        self.gpu, self.vram, self.seq = gpu, vram, seq
        self.on_oom, self.on_unsupported, self.parallel = on_oom, on_unsupported, parallel
        self.options = dict(options or {})
        self.log = log
        self.keep_dir = keep_dir
        self.report = self.suggestion = None
        self.problems = []
        self.argv = None
        self.target = None

    # ---- the live objects --------------------------------------------------------------------------

    def _say(self, state, line):
        if self.log is not None:
            self.log(line)
        elif state is None or state.is_local_process_zero:
            _stderr("memplan: " + line)

    @staticmethod
    def _peft(model):
        """(the base model, the LoRA config or None, problems)"""
        if not (hasattr(model, "peft_config") and hasattr(model, "get_base_model")):
            return model, None, []
        base = model.get_base_model()
        cfgs = model.peft_config
        if len(cfgs) != 1:
            return base, None, ["%d peft adapters (%s): memplan plans one" % (len(cfgs), ", ".join(cfgs))]
        (name, cfg), = cfgs.items()
        kind = str(getattr(cfg.peft_type, "value", cfg.peft_type))
        if kind != "LORA":
            return base, None, ["peft method %s: memplan plans LoRA" % kind]
        problems = []
        if getattr(cfg, "use_dora", False):
            problems.append("peft use_dora (DoRA): not modelled yet")
        return base, (name, cfg), problems

    @staticmethod
    def _lora_options(model, adapter):
        """memplan's LoRA options from the adapted modules themselves (their names and ranks)"""
        from peft.tuners.lora import LoraLayer

        name, cfg = adapter
        leaves, ranks = set(), set()
        for path, m in model.named_modules():
            if isinstance(m, LoraLayer) and name in getattr(m, "r", {}):
                leaves.add(path.rsplit(".", 1)[-1])
                ranks.add(m.r[name])
        problems = []
        if len(ranks) > 1:
            problems.append("LoRA ranks differ by module (%s: rank_pattern): memplan plans one rank"
                            % ", ".join(str(r) for r in sorted(ranks)))
        opts = {"lora_r": ranks.pop() if len(ranks) == 1 else cfg.r, "lora_alpha": float(cfg.lora_alpha),
                "lora_dropout": float(cfg.lora_dropout), "lora_targets": sorted(leaves)}
        return opts, problems

    @staticmethod
    def _dtype(base, adapters):
        """the dtype the model's (frozen, with adapters) floating-point parameters are in"""
        count = Counter(str(p.dtype) for p in base.parameters()
                        if p.is_floating_point() and not (adapters and p.requires_grad))
        if len(count) != 1:
            return None, ["parameters in %s: memplan plans one dtype" % ", ".join(
                "%s (%d tensors)" % (DTYPES.get(k, k), n) for k, n in sorted(count.items()))
                if count else "no floating-point parameters"]
        (dt, _), = count.items()
        if dt not in DTYPES:
            return None, ["parameters in %s: memplan plans float32 and bfloat16" % dt]
        return DTYPES[dt], []

    @staticmethod
    def _counts(model):
        """(parameters, trainable parameters), a 4-bit weight counted as the weight it stands for"""
        total = trainable = 0
        for p in model.parameters():
            qs = getattr(p, "quant_state", None)
            n = math.prod(qs.shape) if qs is not None and getattr(qs, "shape", None) is not None else p.numel()
            total += n
            trainable += n if p.requires_grad else 0
        return total, trainable

    @staticmethod
    def _optimizer_problem(args, model, optimizer):
        """the optimizer the Trainer holds, against the one args.optim makes"""
        if optimizer is None:
            return None
        from transformers import Trainer

        live = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
        optim = getattr(args.optim, "value", args.optim)
        try:
            cls, kw = Trainer.get_optimizer_cls_and_kwargs(args, model)
        except Exception as e:  # an optim the Trainer itself cannot make here (bitsandbytes absent, ...)
            return "optim %s: the Trainer cannot name its class here (%s)" % (optim, e)
        if isinstance(cls, type) and not isinstance(live, cls):
            return ("the optimizer is a %s.%s, not the %s args.optim=%s makes: give options={'optimizer': "
                    "NAME} (memplan's --optimizer)" % (type(live).__module__, type(live).__name__, cls.__name__,
                                                       optim))
        if "fused" in kw and bool(kw["fused"]) != bool(getattr(live, "defaults", {}).get("fused")):
            return "the optimizer's fused=%s is not args.optim=%s's" % (live.defaults.get("fused"), optim)
        return None

    def _world(self, args, dump, opts):
        """DDP or the sharding of parallel=, as options; problems"""
        from transformers.training_args import ParallelMode

        sharded = [k for k in SHARDING_KEYS if dump.get(k)]
        world = int(args.world_size)
        if self.parallel:
            for k in SHARDING_KEYS:
                dump.pop(k, None)
        mode = args.parallel_mode
        if mode == ParallelMode.NOT_DISTRIBUTED:
            return ["nn.DataParallel (%d GPUs in one process): not modelled; launch with torchrun" % args.n_gpu]
        if world > 1 or self.parallel:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            opts.update(gpus=local, nodes=max(1, world // max(1, local)),
                        parallel=self.parallel or ("ddp" if not sharded else None))
            if opts["parallel"] is None:
                opts.pop("parallel")
        return []

    def _target(self, args):
        if self.gpu is not None:
            self.target = "gpu %s" % self.gpu
            return {"gpu": self.gpu}
        if self.vram is not None:
            self.target = "vram %s" % self.vram
            return {"vram": self.vram}
        import torch

        if torch.cuda.is_available():
            dev = args.device if getattr(args.device, "type", "") == "cuda" else torch.device("cuda")
            idx = dev.index if dev.index is not None else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(idx)
            self.target = "cuda:%d %s" % (idx, props.name)
            return {"vram": int(props.total_memory)}
        self.target = None
        return {}

    # ---- the plan ------------------------------------------------------------------------------------

    def plan(self, args, model, optimizer=None, state=None):
        """memplan's report of this run (check with a target, else estimate); sets .report,
        .suggestion, .problems, .argv; raises as on_oom / on_unsupported say"""
        self.report = self.suggestion = self.argv = None
        self.problems = problems = []
        base, adapter, p = self._peft(model)
        problems += p
        opts = {}
        if adapter:
            lo, p = self._lora_options(model, adapter)
            problems += p
            opts.update(lo)
        config = json.loads(base.config.to_json_string(use_diff=False))  # as save_pretrained writes it
        qc = config.get("quantization_config") or {}
        if adapter:
            opts["finetune"] = "qlora" if qc.get("load_in_4bit") else "lora"
        dtype, p = self._dtype(base, adapter is not None)
        problems += p
        attn = getattr(base.config, "_attn_implementation", None) or "sdpa"
        if attn in ATTENTION:
            opts["attention"] = ATTENTION[attn]
        else:
            problems.append("attention implementation %r: memplan models %s" % (attn, ", ".join(sorted(ATTENTION))))
        gc_model = bool(getattr(base, "is_gradient_checkpointing", False))
        gc_args = bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None))
        if gc_model and not gc_args:
            problems.append("the model checkpoints its layers (gradient_checkpointing_enable) but the arguments do "
                            "not: set gradient_checkpointing=True so that memplan plans it")
        p = self._optimizer_problem(args, model, optimizer)
        if p and "optimizer" not in self.options:
            problems.append(p)
        dump = json.loads(args.to_json_string())
        fmt = "trl" if type(args).__module__.split(".")[0] == "trl" else "hf"
        problems += self._world(args, dump, opts)
        if dtype:
            config["dtype"] = dtype
            config.pop("torch_dtype", None)
            if fmt == "trl":  # TRL's ModelConfig key (`trl sft` loads the model in it)
                dump["dtype"] = dtype
        if self.seq is not None:
            opts["seq"] = self.seq
        opts.update(self._target(args))
        release = getattr(sys.modules.get("torch"), "__version__", None)
        if release:  # the torch that runs the step: it picks SDPA's kernel (memplan --torch)
            opts["torch"] = str(release)
        opts.update(self.options)

        work = self.keep_dir or tempfile.mkdtemp(prefix="memplan-run-")
        try:
            mdir = os.path.join(work, memplan._run.model_dir_name(config, config.get("model_type") or "model"))
            os.makedirs(mdir, exist_ok=True)
            with open(os.path.join(mdir, "config.json"), "w") as f:
                json.dump(config, f, indent=1)
            recipe = os.path.join(work, "training_args.json")
            with open(recipe, "w") as f:
                json.dump(dump, f, indent=1)
            self._run(state, mdir, recipe, fmt, opts, problems, model)
        finally:
            if not self.keep_dir:
                shutil.rmtree(work, ignore_errors=True)
        return self.report

    def _unsupported(self, state, problems, code=memplan.EXIT_INPUT, err=None):
        self.problems = list(problems)
        if self.on_unsupported == "raise":
            raise MemplanUnsupported(problems, code, err.argv if err else self.argv, err.stderr if err else "")
        for p in problems:
            self._say(state, "warning: cannot plan this run exactly: " + p)

    def _run(self, state, mdir, recipe, fmt, opts, problems, model):
        command = memplan.check if ("gpu" in opts or "vram" in opts) else memplan.estimate
        kw = dict(opts, recipe=recipe, recipe_format=fmt)
        self.argv = memplan._run.argv_of(command.__name__, mdir, **kw)
        try:
            rep, err = command(mdir, **kw), None
        except memplan.MemplanError as e:
            rep, err = None, e
        if err is not None:  # memplan refused a setting (exit 3) or an option (exit 2)
            self._unsupported(state, problems + [err.message], err.code, err)
            return
        self.report = rep
        total, trainable = self._counts(model)
        if rep.model.params is not None and (rep.model.params, rep.model.trainable_params) != (total, trainable):
            problems.append("memplan's model has %d parameters, %d trainable; the live model %d, %d trainable "
                            "(modules_to_save, layers_to_transform, frozen or added parameters?)"
                            % (rep.model.params, rep.model.trainable_params, total, trainable))
        if problems:
            self._unsupported(state, problems)
        unknown = rep.config.recipe.unknown_keys if rep.config.recipe else []
        if unknown:
            self._say(state, "warning: keys of the arguments memplan does not know (not planned): "
                      + ", ".join(unknown))
        for w in rep.run.warnings:
            self._say(state, "warning: " + w)
        self._say(state, self._summary(rep))
        if isinstance(rep, memplan.CheckReport) and not rep.fits:
            self._does_not_fit(state, mdir, kw, rep)

    @staticmethod
    def _setting(rep, option, default):
        """a setting memplan read from the recipe (or its trainer's default), else default"""
        st = rep.config.recipe.settings.get(option) if rep.config.recipe else None
        return st.value if st else default

    def _summary(self, rep):
        c, m = rep.config, rep.memory
        ft = c.finetune
        what = "%s r %d on %s" % (ft.mode, ft.lora_r, ft.lora_targets) if ft.mode in ("lora", "qlora") else ft.mode
        ga = int(self._setting(rep, "grad-accum", "1"))
        seq_from = "" if self.seq is not None or self._setting(rep, "seq", None) else \
            " (memplan's default: seq= sets it)"
        line = ("plan: %s, %s of %s parameters train (%s), batch %d%s, seq %d%s, %s, %s, checkpoint %s, loss %s: "
                % (rep.model.name, format(rep.model.trainable_params, ","), format(rep.model.params, ","), what,
                   c.batch, " x %d accumulated" % ga if ga > 1 else "", c.seq_len,
                   seq_from, c.precision,
                   c.optimizer, c.checkpoint, c.loss))
        line += "peak %s on the device (%s allocated) at %s" % (fmt_bytes(m.peak_device_bytes),
                                                               fmt_bytes(m.peak_allocated_bytes), m.peak_event)
        if isinstance(rep, memplan.CheckReport):
            k = rep.check
            line += "; %s %s: %s usable, %s %s (%.1f%%)" % (
                "fits" if k.fits else "DOES NOT FIT", self.target or rep.target.name, fmt_bytes(k.usable_bytes),
                "headroom" if k.fits else "short by", fmt_bytes(abs(rep.headroom_bytes)),
                100.0 * abs(rep.headroom_bytes) / k.usable_bytes)
        else:
            line += "; no GPU here and no gpu= or vram=: no verdict"
        return line

    def _does_not_fit(self, state, mdir, kw, rep):
        batch, ga = rep.config.batch, int(self._setting(rep, "grad-accum", "1"))
        takes = memplan.options("suggest")
        skw = {k: v for k, v in kw.items() if k.replace("_", "-") in takes}
        skw.update(global_batch=batch * ga, no_probe=True)
        try:
            self.suggestion = memplan.suggest(mdir, **skw)
            change = self._change(self.suggestion, batch, ga, rep.config.checkpoint)
        except memplan.MemplanError as e:
            self.suggestion = None
            change = "memplan suggest failed: " + e.message
        msg = ("this run does not fit %s: peak %s of %s usable, short by %s (at %s). %s"
               % (self.target or rep.target.name, fmt_bytes(rep.check.peak_device_bytes),
                  fmt_bytes(rep.check.usable_bytes), fmt_bytes(rep.check.shortfall_bytes), rep.memory.peak_event,
                  change))
        if self.on_oom == "raise":
            raise MemplanDoesNotFit("memplan: " + msg, rep, self.suggestion)
        self._say(state, "warning: " + msg)

    @staticmethod
    def _change(s, batch, ga, checkpoint):
        """the TrainingArguments that differ in suggest's recommendation"""
        r = s.recommendation
        if r is None:
            alts = "; ".join(s.alternatives[:3])
            return "Nothing fits at global batch %d%s" % (batch * ga, (": " + alts) if alts else "")
        fields = []
        if r.micro_batch != batch:
            fields.append("per_device_train_batch_size=%d" % r.micro_batch)
        if r.grad_accum != ga:
            fields.append("gradient_accumulation_steps=%d" % r.grad_accum)
        strategy = r.plan.strategy
        if strategy == checkpoint:
            pass
        elif strategy == "none":
            fields.append("gradient_checkpointing=False")
        elif strategy.startswith("layers"):
            fields.append("gradient_checkpointing=True")
            n = re.match(r"layers:(\d+)", strategy)
            if n:
                fields.append("gradient_checkpointing_kwargs={'every_n_layers': %s}" % n.group(1))
        return ("Would fit: %s (global batch %d; %s, %s): peak %s, %.1f%% headroom"
                % (", ".join(fields), r.global_batch, r.precision, "checkpoint " + strategy,
                   fmt_bytes(r.peak_device_bytes), r.headroom_pct))

    # ---- the callback ---------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None:
            self._unsupported(state, ["on_train_begin without the model"])
            return control
        self.plan(args, model, optimizer, state)
        return control
