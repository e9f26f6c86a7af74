#!/usr/bin/env python3
"""kit.py - memplan's GPU validation kit: one call, one time budget (bench/gpu/run.sh runs it).

  kit.py run OUTDIR [--budget S] [--parts LIST] [--rerun [FILE]] [--rows LIST] [--steps N] [--cpu]
      The parts in priority order, each under a time cap and the run's deadline (--budget, the
      whole run's wall seconds): a part that cannot start in what is left is skipped and says so.
      After every part (and every matrix row) OUTDIR/report.json, report.md and log.txt are
      rewritten, so a run that is cut short still leaves what it measured.  The state is also
      kept in bench/gpu/out/report.json for --rerun (re-run only what failed or is missing).
  kit.py report OUTDIR          report.md again from OUTDIR/report.json
  kit.py torch-worker [--cpu]   (internal) PyTorch rows, one JSON line in, one out
  kit.py lightning ...          (internal) Lightning's batch-size finder on GPT-2
  kit.py callback-worker ...    (internal) a transformers Trainer with memplan's MemplanCallback
  kit.py build-info / source-hash / slim-wheel / carry-report   (internal, for build.sh and prepare.sh)

Parts:
  build      the carried build-gpu/ (bench/gpu/prepare.sh) if its binaries load, match src/ and the
             GPU's arch; else bench/gpu/build.sh here.  Without a GPU: build-gpu/ if it loads and
             is current, else `make CUDA=no` (./memplan, build/tests).
  tests      the suites of `make test-gpu` (test_probe, test_probe_ops: every prim host against
             cuda, test_probe_suggest), run straight from the build directory.  On a GPU a skipped
             case is a failure (the cuda backend did not open).
  sanitizer  compute-sanitizer --tool memcheck on one small probe (a 2-layer Llama-3.2-1B shape,
             QLoRA, amp-bf16, checkpointed layers: NF4, LoRA, RMSNorm, RoPE, SDPA, SwiGLU, AdamW).
  matrix     rows: GPT-2 (8x1024) and Qwen2-0.5B (4x1024) x fp32 / amp-bf16 / bf16 x checkpointing
             none / layers, Llama-3.2-1B LoRA (bf16, layers) and QLoRA (amp-bf16, layers), 4x1024.
             1. `memplan estimate` for every row (seconds); 2. PyTorch in one worker process:
             transformers model from the bundled config (random init, nothing fetched), one
             warm-up step, torch.cuda.reset_peak_memory_stats(), N steps: max_memory_allocated,
             max_memory_reserved, mem_get_info before and after, step time, and the SDPA kernel
             the step dispatched to; 3. `memplan probe --backend cuda` for every row.  Each
             column of each row has its own status, so --rerun re-runs only what is missing.
  tune       `memplan suggest --device 0` (GPT-2, seq 1024, amp-bf16) against Lightning's
             Tuner.scale_batch_size(mode="binsearch"): wall time, trials, batch.
  steptime   probe against PyTorch step time for the matrix's rows (from the matrix's steady-state
             steps: no device time of its own).
  callback   the pip package's MemplanCallback (python/memplan/integrations/transformers.py) in a
             transformers Trainer on GPT-2 (8 x 1024, bf16 autocast, adamw_torch) with no gpu= or
             vram=: the target it finds (this CUDA device's total memory), its verdict, and its
             plan's peak allocated against torch.cuda.max_memory_allocated over the steps after
             the first (the Trainer's own step: grad clipping, its loss bookkeeping).
  sdpa       bench/gpu/sdpa_ws.py: SDPA's allocations per shape, the backward's transient against the
             rule memplan uses (docs/memory-facts.md#sdpa-gqa-backward).  GPU only.
  optim      bench/gpu/optim_step.py: each HF optimizer's state and step temporaries on GPT-2
             against memplan's.  GPU only.
  moe        bench/gpu/moe_cuda.py: what --ep's plan assumes of CUDA and the CPU bench cannot show:
             FSDP2's reduce-scatter copy-in of bf16 expert gradients into an fp32 input (no cast
             temporary on CUDA?) and grouped_mm's backward allocations and weight-gradient strides.
             GPU only.
  devbytes   bench/gpu/devbytes.py: the device bytes beside the allocator one GPU shows (issue 29
             item 2): the context, the cuBLAS workspace, the SDPA kernel torch picks per dtype /
             head dim / mask, NCCL's communicator with one rank.  GPU only.  The matrix's estimate
             column also records memplan's SDPA kernel and context for each row, beside the
             kernel torch ran and its non-allocator bytes.

Without a GPU (or with --cpu) the same parts run as the CPU fallback: the host backend, configs
shrunk to 2 layers of width 128 (batch 2 x 32), PyTorch on the CPU (no memory columns: a smoke
test of the whole flow), the sanitizer skipped.  A missing library (torch, transformers, peft,
bitsandbytes, lightning) makes the rows that need it say so; it never fails the run.
"""
import argparse
import collections
import hashlib
import importlib.util
import json
import os
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback

import gpu_json  # the op recorder (this folder: the script's own, first on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STATE_DIR = os.path.join(ROOT, "bench", "gpu", "out")   # ignored by git; kept on a warm machine
SCHEMA = 2

PARTS = ["build", "tests", "sanitizer", "matrix", "tune", "steptime", "dpo", "grpo", "orpo", "callback", "sdpa",
         "optim", "moe", "devbytes"]
# part: (cap on a GPU, cap on the CPU fallback, least seconds worth starting it with)
CAPS = {"build": (200, 400, 5), "tests": (120, 240, 15), "sanitizer": (90, 0, 20),
        "matrix": (260, 400, 30), "tune": (150, 240, 40), "steptime": (5, 5, 0), "dpo": (150, 240, 40),
        "grpo": (150, 240, 40), "orpo": (120, 240, 40),
        "callback": (90, 150, 40), "sdpa": (60, 5, 20), "optim": (60, 5, 20), "moe": (45, 5, 20),
        "devbytes": (45, 5, 15)}
RESERVE_S = 4          # kept back at the end for the last report
WORKER_START_S = (90, 120)   # (GPU, CPU): import torch + transformers, CUDA context
ROW_S = {"estimate": 30, "probe": (75, 60), "torch": (90, 90)}
# make test-gpu's suites, each capped (GPU, CPU) so that one that hangs leaves the others time
SUITES = [("probe", (60, 120)), ("probe_ops", (45, 120)), ("probe_suggest", (30, 60))]

# id, model name, config, batch, seq, precision, checkpointing, finetune
MODELS = [("gpt2", "models/hf/gpt2.json", 8, 1024), ("qwen2-0.5b", "models/hf/qwen2-0.5b.json", 4, 1024)]
PRECISIONS = ["fp32", "amp-bf16", "bf16"]
CKPTS = ["none", "layers"]
LLAMA = ("llama-3.2-1b", "models/hf/llama-3.2-1b.json", 4, 1024)
LORA_R, LORA_ALPHA = 16, 32
CPU_BATCH, CPU_SEQ = 2, 32
TUNE_SEQ = 1024

SDPA_OPS = [("cudnn_attention", "cudnn"), ("flash_attention_for_cpu", "flash (cpu)"),
            ("flash_attention", "flash"), ("efficient_attention", "efficient"),
            ("fused_attention_overrideable", "overrideable")]


def matrix_rows():
    rows = []
    for name, cfg, b, s in MODELS:
        for p in PRECISIONS:
            for c in CKPTS:
                rows.append({"id": "%s/%s/%s" % (name, p, c), "model": name, "config": cfg, "batch": b, "seq": s,
                             "precision": p, "checkpoint": c, "finetune": "full"})
    name, cfg, b, s = LLAMA
    rows.append({"id": name + "/lora/bf16/layers", "model": name, "config": cfg, "batch": b, "seq": s,
                 "precision": "bf16", "checkpoint": "layers", "finetune": "lora"})
    for c in CKPTS:  # issue 25 item 2: the peft recipe (bf16 base, fp32 adapters, bf16 autocast)
        rows.append({"id": name + "/lora/bf16-amp/" + c, "model": name, "config": cfg, "batch": b, "seq": s,
                     "precision": "bf16-amp", "checkpoint": c, "finetune": "lora"})
    rows.append({"id": name + "/qlora/amp-bf16/layers", "model": name, "config": cfg, "batch": b, "seq": s,
                 "precision": "amp-bf16", "checkpoint": "layers", "finetune": "qlora"})
    return rows


def log(*a):
    print("kit:", *a, file=sys.stderr, flush=True)


def has_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def load_config(path):
    with open(path) as f:
        cfg = json.load(f)
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def shrink(cfg):
    """A 2-layer, narrow version of an HF config (same family and options): the CPU fallback."""
    c = dict(cfg)
    for k in ("n_layer", "num_hidden_layers"):
        if k in c:
            c[k] = 2
    if "n_embd" in c:
        c.update(n_embd=128, n_head=4, n_positions=128)
        c.pop("n_inner", None)
    if "hidden_size" in c:
        heads = c.get("num_attention_heads", 4)
        kv = c.get("num_key_value_heads", heads)
        c.update(hidden_size=128, num_attention_heads=4, intermediate_size=256, max_position_embeddings=128)
        if "num_key_value_heads" in c:
            c["num_key_value_heads"] = 4 if kv == heads else 2
        c.pop("head_dim", None)
    c["vocab_size"] = 512
    for k in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        if isinstance(c.get(k), int):
            c[k] = 0
    rs = c.get("rope_scaling")
    if isinstance(rs, dict) and rs.get("original_max_position_embeddings", 0) > 64:
        c["rope_scaling"] = dict(rs, original_max_position_embeddings=64)
    return c


def pct(a, b):
    return None if not a or not b else round(100.0 * (a - b) / b, 2)


def source_hash():
    """What the build was made from: src/, kernels/ and the Makefile, by content."""
    h = hashlib.sha256()
    files = []
    for d in ("src", "kernels"):  # src/ is folders (src/<stage>/, src/probe/{host,cuda}/)
        for top, dirs, names in os.walk(os.path.join(ROOT, d)):
            dirs.sort()
            for n in sorted(names):
                if n.endswith((".c", ".h", ".cu", ".cuh")):
                    files.append(os.path.relpath(os.path.join(top, n), ROOT))
    files.append("Makefile")
    for f in files:
        h.update(f.encode() + b"\0")
        with open(os.path.join(ROOT, f), "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:16]


# ---- running commands under a deadline ----------------------------------------------------------

CHILDREN = set()   # live subprocesses, killed if the run is stopped


def group_kw():
    """A child in a process group of its own (so a timeout kills what it started too), but in
    this session: whatever stops the run (the device tool's time limit) still reaches it."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


def run_cmd(cmd, timeout, env=None, logf=None):
    """(rc, stdout, stderr, seconds); rc 124 on timeout (the whole process group is killed)."""
    t0 = time.perf_counter()
    timeout = max(1, timeout)
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                             errors="replace", **group_kw())
    except OSError as e:
        return 127, "", str(e), 0.0
    CHILDREN.add(p)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        kill_group(p)
        out, err = p.communicate()
        rc, err = 124, (err or "") + "\n(timed out after %d s)" % timeout
    finally:
        CHILDREN.discard(p)
    secs = time.perf_counter() - t0
    if logf:
        logf.write("$ %s  # rc %d, %.1f s\n" % (" ".join(cmd), rc, secs))
        for text in (out, err):
            if text:
                logf.write(text[-200000:])
                if not text.endswith("\n"):
                    logf.write("\n")
        logf.flush()
    return rc, out or "", err or "", secs


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.kill()
    except ProcessLookupError:
        pass


def tail(text, n=300):
    """The end of a command's error output on one line; for a Python traceback, its last line
    (the exception) first."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    if any(ln.startswith("Traceback") for ln in lines):
        exc = [ln for ln in lines if not ln.startswith(("File ", "^", "~")) and (":" in ln)]
        if exc:
            return exc[-1][:n]
    return " / ".join(lines)[-n:]


# ---- the PyTorch worker: rows in, results out, one process ------------------------------------

def worker_main(a):
    """One JSON line per row on stdin, one result line on stdout; logs on stderr."""
    hello = {"python": platform.python_version()}
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"hello": hello, "error": "no torch: %s" % e}), flush=True)
        return
    hello["torch"] = torch.__version__
    cuda = not a.cpu and torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    hello["device"] = "cuda" if cuda else "cpu"
    if cuda:
        nvml_used = None
        try:  # device memory in use before this process makes a CUDA context
            import pynvml
            pynvml.nvmlInit()
            nvml_used = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
        except Exception as e:  # noqa: BLE001 - NVML is optional
            hello["nvml_error"] = str(e)[:200]
        free, total = torch.cuda.mem_get_info()   # makes the context; nothing allocated yet
        hello.update(gpu=torch.cuda.get_device_name(0), total_bytes=total, used_after_init=total - free,
                     nvml_used_before=nvml_used, cuda=torch.version.cuda,
                     cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                     sdpa_enabled={k: getattr(torch.backends.cuda, k + "_sdp_enabled", lambda: None)()
                                   for k in ("flash", "mem_efficient", "cudnn", "math")})
        if nvml_used is not None:
            hello["context_bytes"] = total - free - nvml_used
    for mod in ("transformers", "peft", "bitsandbytes"):
        try:
            m = __import__(mod)
            hello[mod] = getattr(m, "__version__", "?")
        except Exception as e:  # noqa: BLE001 - reported per row
            hello[mod] = None
            hello[mod + "_error"] = ("%s: %s" % (type(e).__name__, e))[:200]
    print(json.dumps({"hello": hello}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        spec = json.loads(line)
        try:
            res = torch_row(spec, dev, hello)
        except Exception as e:  # noqa: BLE001 - the row's result, the worker goes on
            traceback.print_exc()
            res = {"status": "FAILED", "error": ("%s: %s" % (type(e).__name__, e))[:400]}
        cleanup(torch, cuda)
        print(json.dumps(res), flush=True)


class AllocTrace:
    """The caching allocator's own record of a row's steps (MEMPLAN_KIT_TRACE=DIR: bench/alloc/),
    from torch.cuda.memory._record_memory_history: written in torch_trace.py's format (`a ADDR
    BYTES` a block handed out, its size as the allocator rounded it; `f ADDR` its free; `m NAME`
    the marks: build, step N, end; `e` the empty_cache after the build; `F ADDR` when the freed
    block is reusable, since 2026-11-30), with `s ADDR BYTES` / `u ADDR BYTES` for each segment cudaMalloc'd / freed
    (or mapped / unmapped under expandable segments) and `o BYTES` for an OOM, which
    cca_ref.py ignores and reserved_vs_gpu.py sets beside memplan's segments."""

    def __init__(self, torch, row):
        self.torch, self.row, self.marks = torch, row, []
        rec = torch.cuda.memory._record_memory_history
        try:
            rec(enabled="all", context=None, stacks="python", max_entries=4_000_000, clear_history=True)
        except TypeError:  # a torch without clear_history: the last row's entries are cleared so
            rec(enabled=None)
            rec(enabled="all", context=None, stacks="python", max_entries=4_000_000)

    def _entries(self):
        return self.torch.cuda.memory._snapshot()["device_traces"][0]

    def mark(self, name):
        try:
            self.marks.append((len(self._entries()), name))
        except Exception:  # noqa: BLE001 - the trace only loses a mark
            pass

    def write(self, out_dir):
        ev = self._entries()
        self.torch.cuda.memory._record_memory_history(enabled=None)
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, self.row.replace("/", "_") + ".trace")
        code = {"alloc": "a", "free_requested": "f", "free_completed": "F", "segment_alloc": "s",
                "segment_free": "u", "segment_map": "s", "segment_unmap": "u", "oom": "o"}
        marks = {}
        for i, line in self.marks:
            marks.setdefault(i, []).append(line)
        with open(path, "w") as f:
            first = self.marks[0][0] if self.marks else 0  # (entries before it: an earlier row's)
            for i, e in enumerate(ev):
                if i < first:
                    continue
                for line in marks.get(i, []):
                    f.write(line + "\n")
                k = code.get(e.get("action"))
                if k == "o":
                    f.write("o %d\n" % e.get("size", 0))
                elif k in ("f", "F"):  # F: the block reusable (later than f under record_stream)
                    f.write("%s %x\n" % (k, e["addr"]))
                elif k:
                    f.write("%s %x %d\n" % (k, e["addr"], e["size"]))
            f.write("m end\n")
        return {"file": os.path.basename(path), "entries": len(ev), "dropped_at_max": len(ev) >= 4_000_000}


def segments_of(torch):
    try:
        snap = torch.cuda.memory_snapshot()
    except Exception as e:  # noqa: BLE001 - a missing measurement, not a failed row
        return {"error": str(e)[:200]}
    segs = sorted(snap, key=lambda g: g.get("address", 0))
    return [[g.get("segment_type", "?"), g.get("total_size", 0), g.get("allocated_size", 0)] for g in segs]


def cleanup(torch, cuda):
    import gc
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()


def sdpa_spy():
    """The aten op each scaled_dot_product_attention call dispatched to (torch's own SDPA choice:
    flash, efficient, cuDNN; none seen = math), in .ops (gpu_json.op_spy)."""
    return gpu_json.op_spy(lambda n: "scaled_dot_product" in n and "backward" not in n)


def sdpa_name(seen, uses_sdpa=True):
    names = []
    for op, n in sorted(seen.items()):
        label = op
        for key, lab in SDPA_OPS:
            if key in op:
                label = lab
                break
        names.append("%s x%d" % (label, n))
    if not names:
        return "math (no fused SDPA op seen)" if uses_sdpa else "none"
    return ", ".join(names)


def build_model(spec, conf, dev, hello):
    """The model of a row on dev: full / LoRA (peft) / QLoRA (bitsandbytes Linear4bit + peft)."""
    import torch
    import transformers
    ft, prec = spec["finetune"], spec["precision"]
    dtype = torch.bfloat16 if prec in ("bf16", "bf16-amp") and ft != "qlora" else torch.float32
    torch.manual_seed(0)
    with dev:
        try:
            model = transformers.AutoModelForCausalLM.from_config(conf, dtype=dtype, attn_implementation="sdpa")
        except TypeError:  # transformers before 4.56
            model = transformers.AutoModelForCausalLM.from_config(conf, torch_dtype=dtype,
                                                                   attn_implementation="sdpa")
    if ft == "full":
        return model
    import peft
    lora = peft.LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, task_type="CAUSAL_LM")
    ck = {"use_reentrant": False}
    if ft == "lora":
        return peft.get_peft_model(model, lora)
    # QLoRA as transformers' bitsandbytes integration loads it: every nn.Linear but lm_head a
    # Linear4bit (nf4, double quant, bf16 compute under amp), quantized here on the device from
    # the random fp32 weights; then peft.prepare_model_for_kbit_training and peft's LoRA.
    import bitsandbytes as bnb
    cdt = torch.bfloat16 if prec in ("amp-bf16", "bf16") else torch.float32
    for mod in list(model.modules()):
        for cname, child in list(mod.named_children()):
            if isinstance(child, torch.nn.Linear) and cname != "lm_head":
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=cdt, compress_statistics=True, quant_type="nf4", device="meta")
                q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=True,
                                             quant_type="nf4").to(dev)
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(mod, cname, q)
    model.is_loaded_in_4bit = True
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=spec["checkpoint"] == "layers",
                                                 gradient_checkpointing_kwargs=ck)
    return peft.get_peft_model(model, lora)


def torch_row(spec, dev, hello):
    import torch
    import transformers
    cuda = dev.type == "cuda"
    need = {"lora": ["peft"], "qlora": ["peft", "bitsandbytes"]}.get(spec["finetune"], [])
    for mod in ["transformers"] + need:
        if not hello.get(mod):
            return {"status": "skipped", "error": "no %s in this Python (%s)" % (mod, hello.get(mod + "_error", ""))}
    cfg = load_config(spec["config_path"])
    mt = cfg.pop("model_type")
    conf = transformers.AutoConfig.for_model(mt, **cfg)
    conf.use_cache = False
    res = {"status": "FAILED"}
    if cuda:
        res["allocated_at_start"] = torch.cuda.memory_allocated()
    t_build = time.perf_counter()
    tracer = None
    try:
        if cuda and os.environ.get("MEMPLAN_KIT_TRACE"):
            tracer = AllocTrace(torch, spec["id"])
    except Exception as e:  # noqa: BLE001 - a missing trace, not a failed row
        res["trace"] = {"error": repr(e)[:200]}
    try:
        if tracer:
            tracer.mark("m build")
        model = build_model(spec, conf, dev, hello)
        model.train()
        if spec["checkpoint"] == "layers" and spec["finetune"] != "qlora":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        params = [p for p in model.parameters() if p.requires_grad]
        res["trainable_params"] = sum(p.numel() for p in params)
        opt = torch.optim.AdamW(params, lr=1e-4)
        ids = torch.randint(0, conf.vocab_size, (spec["batch"], spec["seq"]), device=dev)
        if cuda:
            import gc
            gc.collect()
            if tracer:
                tracer.mark("e")
            torch.cuda.empty_cache()   # the build's transients are not the step's
        res["build_s"] = round(time.perf_counter() - t_build, 2)
        times, losses = [], []
        spy = sdpa_spy()
        for step in range(spec["steps"] + 1):
            if cuda:
                torch.cuda.synchronize()
                if step == 1:  # the steady state: optimizer state exists, .grad is None
                    res["segments_after_warmup"] = segments_of(torch)  # (what the warm-up left cached)
                    torch.cuda.reset_peak_memory_stats()
                    free, total = torch.cuda.mem_get_info()
                    res["device_used_before"] = total - free
                    res["allocated_before_step"] = torch.cuda.memory_allocated()
                if tracer:
                    tracer.mark("m step %d" % step)
            t0 = time.perf_counter()
            if step == 0:
                spy.__enter__()
            try:
                if spec["precision"] in ("amp-bf16", "bf16-amp"):
                    with torch.autocast(dev.type, dtype=torch.bfloat16):
                        loss = model(input_ids=ids, labels=ids).loss
                else:
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            finally:
                if step == 0:
                    spy.__exit__(None, None, None)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            if step > 0:
                times.append((t1 - t0) * 1e3)
                losses.append(round(loss.detach().item(), 4))
            del loss
        res.update(status="ok", step_ms=round(statistics.median(times), 3), losses=losses, sdpa=sdpa_name(collections.Counter(spy.ops)))
        if tracer:
            try:
                res["trace"] = tracer.write(os.environ["MEMPLAN_KIT_TRACE"])
            except Exception as e:  # noqa: BLE001 - a missing trace, not a failed row
                res["trace"] = {"error": repr(e)[:200]}
        if cuda:
            free, total = torch.cuda.mem_get_info()
            res.update(peak_allocated=torch.cuda.max_memory_allocated(), peak_reserved=torch.cuda.max_memory_reserved(),
                       device_used_after=total - free, reserved_after=torch.cuda.memory_reserved())
            # the caching allocator's own counters, beside memplan's simulation of it (issue 29)
            ms = torch.cuda.memory_stats()
            res.update(num_alloc_retries=ms.get("num_alloc_retries"), num_ooms=ms.get("num_ooms"),
                       alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
            # the segments the allocator holds after the measured steps, in address order: [pool
            # ("large"/"small"), bytes, bytes of its blocks in use]; bench/alloc/ compares them with
            # memplan's allocator model (MEMPLAN_ALLOC_TRACE) where reserved disagrees
            res["segments"] = segments_of(torch)
            # what the device holds beyond the caching allocator: the context, cuBLAS/cuDNN handles,
            # the kernels loaded so far (this process's, on an otherwise idle GPU)
            res["non_allocator_bytes"] = res["device_used_after"] - res["reserved_after"] - (hello.get("nvml_used_before") or 0)
    except torch.OutOfMemoryError as e:  # a result, as memplan's probe reports it
        res.update(status="FAILED", error="out of memory: " + str(e).splitlines()[0][:200])
    return res


class Worker:
    """The torch-worker subprocess, talked to line by line with timeouts."""

    def __init__(self, kit, timeout):
        self.kit = kit
        self.q = queue.Queue()
        cmd = [sys.executable, os.path.abspath(__file__), "torch-worker"] + (["--cpu"] if not kit.gpu else [])
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=kit.logf, text=True,
                                  cwd=ROOT, bufsize=1, **group_kw())
        CHILDREN.add(self.p)
        threading.Thread(target=self._read, daemon=True).start()
        self.hello = None
        msg = self._get(timeout)
        if not isinstance(msg, dict) or "hello" not in msg:
            self.close()
            raise RuntimeError("the PyTorch worker did not start: %s" % (
                "no answer in %d s" % timeout if msg == "timeout" else "it exited (log.txt)" if msg is None
                else json.dumps(msg)[:200]))
        self.hello = msg["hello"]
        if msg.get("error"):
            self.close()
            raise RuntimeError(msg["error"])

    def _read(self):
        for line in self.p.stdout:
            try:
                self.q.put(json.loads(line))
            except ValueError:
                self.kit.logf.write("worker: " + line)
        self.q.put(None)

    def _get(self, timeout):
        try:
            return self.q.get(timeout=max(1, timeout))
        except queue.Empty:
            return "timeout"

    def row(self, spec, timeout):
        """The result, or None when the worker died or timed out (it is then closed)."""
        try:
            self.p.stdin.write(json.dumps(spec) + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            return {"status": "FAILED", "error": "the PyTorch worker had exited"}
        msg = self._get(timeout)
        if msg == "timeout":
            self.close()
            return {"status": "timeout", "error": "no result in %d s (worker killed)" % timeout}
        if msg is None:
            self.close()
            return {"status": "FAILED", "error": "the PyTorch worker died (rc %s; log.txt)" % self.p.poll()}
        return msg

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
                self.p.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                kill_group(self.p)
        self.p.wait()
        CHILDREN.discard(self.p)

    def alive(self):
        return self.p.poll() is None


# ---- the run -------------------------------------------------------------------------------------

class Kit:
    def __init__(self, a):
        self.a = a
        self.t0 = time.time()
        self.deadline = self.t0 + a.budget
        self.out = os.path.abspath(a.out)
        os.makedirs(self.out, exist_ok=True)
        self.logf = open(os.path.join(self.out, "log.txt"), "a")
        self.gpu = None if a.cpu else gpu_info()
        self.memplan = None
        self.testdir = None
        self.state = None
        self.part_end = self.deadline
        self.cfgdir = os.path.join(STATE_DIR, "configs")
        os.makedirs(self.cfgdir, exist_ok=True)

    # -- time
    def left(self):
        return self.deadline - time.time() - RESERVE_S

    def cap(self, part):
        c = CAPS[part][0 if self.gpu else 1]
        return min(c, self.left())

    def part_left(self):
        """Seconds the running part may still use: its cap, and the run's deadline."""
        return min(self.part_end - time.time(), self.left())

    # -- state and report
    def save(self):
        self.state["updated"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        self.state["elapsed_s"] = round(time.time() - self.t0, 1)
        for d in {self.out, STATE_DIR}:
            os.makedirs(d, exist_ok=True)
            tmp = os.path.join(d, "report.json.tmp")
            with open(tmp, "w") as f:
                json.dump(self.state, f, indent=1)
            os.replace(tmp, os.path.join(d, "report.json"))
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write(render(self.state))
        self.logf.flush()

    def say(self, msg):
        line = "run.sh: [%4.0f s] %s" % (time.time() - self.t0, msg)
        print(line, file=sys.stderr, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()


def gpu_info():
    """{name, memory_mib, driver, compute_cap, cuda_driver} of GPU 0 from nvidia-smi, or None."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        p = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version,compute_cap",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0 or not p.stdout.strip():
        return None
    f = [x.strip() for x in p.stdout.strip().splitlines()[0].split(",")]
    info = {"name": f[0], "memory_mib": int(float(f[1])) if len(f) > 1 and f[1].replace(".", "").isdigit() else None,
            "driver": f[2] if len(f) > 2 else None, "compute_cap": f[3] if len(f) > 3 else None}
    try:
        head = subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout
        for tok in head.split("CUDA Version:")[1:2]:
            info["cuda_driver"] = tok.split()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        pass
    return info


def profile_for(name):
    n = (name or "").upper()
    for key, prof in (("H200", "h200-141gb"), ("H100", "h100-80gb"), ("A100", "a100-80gb"), ("L40S", "l40s"),
                      ("L4", "l4"), ("A10", "a10"), ("T4", "t4"), ("4090", "rtx4090"), ("3090", "rtx3090")):
        if key in n and os.path.exists(os.path.join(ROOT, "configs/gpus", prof + ".json")):
            return prof
    return "h100-80gb"


def new_state(kit):
    return {"schema": SCHEMA, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "env": {}, "runs": [], "parts": {}, "matrix": {"rows": []}, "tune": {}}


def tool_version(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (p.stdout + p.stderr).strip().splitlines()[-1][:120] if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def env_info(kit):
    e = {"host": platform.node(), "python": platform.python_version(), "python_exe": sys.executable,
         "gpu": kit.gpu, "mode": "gpu" if kit.gpu else "cpu fallback",
         # the caching allocator's settings the PyTorch rows ran under (reestimate.py reads them)
         "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""}
    nv = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nv:
        v = tool_version([nv, "--version"]) or ""
        e["nvcc"] = v.split("cuda_")[-1].split("/")[0].replace(".r", " (r") + ")" if "cuda_" in v else v or None
    for m in ("torch", "transformers", "peft", "bitsandbytes", "lightning", "pytorch_lightning", "pynvml"):
        e["have_" + m] = has_module(m)
    return e


# ---- part: build ---------------------------------------------------------------------------------

def loads(path, kit):
    """'' when the binary loads (ldd finds every library), else why not."""
    if not os.path.exists(path):
        return "missing"
    if shutil.which("ldd"):
        rc, out, err, _ = run_cmd(["ldd", path], 30)
        miss = [ln.split()[0] for ln in out.splitlines() if "not found" in ln]
        if miss:
            return "cannot load " + ", ".join(miss)
    return ""


def find_cublas():
    """'' when the dynamic loader or MEMPLAN_CUDA_LIBDIR (/usr/local/cuda/lib64) finds cuBLAS 13 for
    the cuda backend's dlopen(); else a directory that has it (the nvidia-cublas wheel PyTorch
    brings), to put on LD_LIBRARY_PATH; None when there is none."""
    if os.path.exists("/usr/local/cuda/lib64/libcublas.so.13"):
        return ""
    try:
        if "libcublas.so.13" in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout:
            return ""
    except (OSError, subprocess.TimeoutExpired):
        pass
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if d and os.path.exists(os.path.join(d, "libcublas.so.13")):
            return ""
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13/lib", "cublas/lib"):
            if os.path.exists(os.path.join(base, sub, "libcublas.so.13")):
                return os.path.join(base, sub)
    return None


def part_build(kit, res):
    if kit.gpu:
        d = find_cublas()
        if d:
            os.environ["LD_LIBRARY_PATH"] = d + (":" + os.environ["LD_LIBRARY_PATH"]
                                                 if os.environ.get("LD_LIBRARY_PATH") else "")
            res["cublas"] = d
        elif d is None:
            res["cublas"] = "libcublas.so.13 not found: the cuda backend cannot open"
    gdir = os.path.join(ROOT, "build-gpu")
    info = {}
    try:
        with open(os.path.join(gdir, "BUILD_INFO")) as f:
            info = json.load(f)
    except (OSError, ValueError):
        pass
    tests = [os.path.join(gdir, "tests", "test_" + t) for t in ("probe", "probe_ops", "probe_suggest")]
    why = []
    for b in [os.path.join(gdir, "memplan")] + tests:
        w = loads(b, kit)
        if w:
            why.append("%s: %s" % (os.path.relpath(b, ROOT), w))
    if not why:
        rc, out, err, _ = run_cmd([os.path.join(gdir, "memplan"), "--version"], 30, logf=kit.logf)
        if rc != 0:
            why.append("build-gpu/memplan --version: rc %d %s" % (rc, tail(err, 120)))
    cur = source_hash()
    if info and info.get("source_hash") != cur:
        why.append("build-gpu/ was made from other sources (%s, now %s)" % (info.get("source_hash"), cur))
    arch = "90"
    if kit.gpu and kit.gpu.get("compute_cap"):
        arch = kit.gpu["compute_cap"].replace(".", "")
        built = str(info.get("arch", ""))
        if built and arch != built and not (arch.isdigit() and built.isdigit() and int(arch) > int(built)):
            why.append("built for sm_%s, the GPU is sm_%s" % (built, arch))
    res["carried"] = info or None
    if not why:
        kit.memplan, kit.testdir = os.path.join(gdir, "memplan"), os.path.join(gdir, "tests")
        res.update(status="ok", note="carried build-gpu/ (%s, sm_%s, %s) loads" % (
            info.get("commit", "?")[:12], info.get("arch", "?"), info.get("nvcc", "?")))
        return
    kit.say("build-gpu/ not used: " + "; ".join(why))
    res["not_carried_because"] = why
    env = dict(os.environ, PYTHON=sys.executable)
    if kit.gpu:
        rc, out, err, secs = run_cmd(["sh", "bench/gpu/build.sh", arch], kit.part_left(), env=env, logf=kit.logf)
        if rc == 0 and not loads(os.path.join(gdir, "memplan"), kit):
            kit.memplan, kit.testdir = os.path.join(gdir, "memplan"), os.path.join(gdir, "tests")
            res.update(status="ok", note="built here (sm_%s) in %.0f s: %s" % (arch, secs, why[0]))
        else:
            res.update(status="FAILED", note="the build here failed (rc %d): %s" % (rc, tail(err)))
        return
    jobs = str(os.cpu_count() or 2)
    rc, out, err, secs = run_cmd(["make", "-j" + jobs, "CUDA=no", "memplan", "build/tests/test_probe",
                                  "build/tests/test_probe_ops", "build/tests/test_probe_suggest"], kit.part_left(),
                                 logf=kit.logf)
    if rc == 0:
        kit.memplan, kit.testdir = os.path.join(ROOT, "memplan"), os.path.join(ROOT, "build", "tests")
        res.update(status="ok", note="no usable build-gpu/ (%s): make CUDA=no in %.0f s" % (why[0], secs))
    else:
        res.update(status="FAILED", note="make CUDA=no failed (rc %d): %s" % (rc, tail(err)))


# ---- part: tests ---------------------------------------------------------------------------------

def cmocka_counts(text):
    c = {"passed": 0, "failed": 0, "skipped": 0, "failed_tests": [], "skipped_tests": []}
    for ln in text.splitlines():
        s = ln.strip()
        for key in ("PASSED", "FAILED", "SKIPPED"):
            tag = "[  %s  ]" % key if key != "SKIPPED" else "[  SKIPPED ]"
            if s.startswith(tag):
                rest = s[len(tag):].strip()
                if rest and rest.split()[0].isdigit() and "test(s)" in rest:
                    c[key.lower()] += int(rest.split()[0])
                elif rest and key != "PASSED" and " " not in rest:
                    lst = c[key.lower() + "_tests"]
                    if rest not in lst:
                        lst.append(rest)
    return c


def part_tests(kit, res):
    suites = {}
    bad = []
    skipped = 0
    for t, caps in SUITES:
        left = min(kit.part_left(), caps[0 if kit.gpu else 1])
        if left < 5:
            suites[t] = {"status": "skipped", "note": "budget"}
            bad.append(t + " (not run: budget)")
            continue
        rc, out, err, secs = run_cmd([os.path.join(kit.testdir, "test_" + t)], left, logf=kit.logf)
        c = cmocka_counts(out + "\n" + err)
        c.update(rc=rc, seconds=round(secs, 1))
        suites[t] = c
        skipped += c["skipped"]
        if rc != 0:
            bad.append("test_%s rc %d%s" % (t, rc, (": " + ", ".join(c["failed_tests"])) if c["failed_tests"] else ""))
        kit.say("test_%s: rc %d, %d passed, %d failed, %d skipped (%.0f s)" % (
            t, rc, c["passed"], c["failed"], c["skipped"], secs))
    res["suites"] = suites
    if kit.gpu and skipped:
        bad.append("%d cuda case(s) skipped on the GPU machine: %s" % (
            skipped, ", ".join(n for s in suites.values() for n in s.get("skipped_tests", []))))
    res["status"] = "FAILED" if bad else "ok"
    n = sum(s.get("passed", 0) for s in suites.values())
    res["note"] = "; ".join(bad) if bad else "%d passed%s" % (
        n, ", %d cuda case(s) skipped: no GPU" % skipped if skipped else "")


# ---- part: sanitizer -----------------------------------------------------------------------------

def tiny_config(kit, name, path):
    """The CPU fallback's (and the sanitizer's) 2-layer version of a bundled config."""
    p = os.path.join(kit.cfgdir, name + "-tiny.json")
    with open(p, "w") as f:
        json.dump(shrink(load_config(os.path.join(ROOT, path))), f, indent=1)
    return p


def part_sanitizer(kit, res):
    if not kit.gpu:
        res.update(status="skipped", note="no GPU")
        return
    cs = shutil.which("compute-sanitizer") or next((p for p in ("/usr/local/cuda/bin/compute-sanitizer",
                                                                 "/usr/local/cuda/compute-sanitizer/compute-sanitizer")
                                                    if os.path.exists(p)), None)
    if not cs:
        res.update(status="skipped", note="compute-sanitizer not found")
        return
    cfg = tiny_config(kit, LLAMA[0], LLAMA[1])
    probe = [kit.memplan, "probe", cfg, "--batch", "2", "--seq", "64", "--precision", "amp-bf16", "--finetune",
             "qlora", "--checkpoint", "layers", "--backend", "cuda", "--steps", "1"]
    cmd = [cs, "--tool", "memcheck", "--error-exitcode", "9", "--print-limit", "20"] + probe
    rc, out, err, secs = run_cmd(cmd, kit.part_left(), logf=kit.logf)
    summ = [ln for ln in (out + err).splitlines() if "ERROR SUMMARY" in ln]
    res.update(command=" ".join(["compute-sanitizer --tool memcheck"] + [os.path.relpath(x, ROOT) if x.startswith(ROOT)
                                                                         else x for x in probe]),
               rc=rc, summary=summ[-1].strip() if summ else None)
    if rc == 124:
        res.update(status="timeout", note="no verdict in %.0f s" % secs)
    elif rc == 0 and summ and " 0 errors" in summ[-1]:
        res.update(status="ok", note="memcheck: 0 errors (%.0f s)" % secs)
    else:
        res.update(status="FAILED", note="rc %d: %s" % (rc, summ[-1].strip() if summ else tail(err)))


# ---- part: matrix --------------------------------------------------------------------------------

def row_config(kit, row):
    if kit.gpu:
        return os.path.join(ROOT, row["config"]), row["batch"], row["seq"]
    return tiny_config(kit, row["model"], row["config"]), CPU_BATCH, CPU_SEQ


def torch_release():
    """The installed torch's version (what the PyTorch worker runs), without importing torch; None
    when there is none.  memplan --torch takes it: it decides SDPA's kernel for fp32 GQA (math
    before 2.14: docs/memory-facts.md#sdpa-math)."""
    try:
        import importlib.metadata
        return importlib.metadata.version("torch")
    except Exception:
        return None


def memplan_args(row, cfg, b, s, release=None):
    """memplan's arguments for a matrix row; release: the torch that ran it (default: the installed one)"""
    args = [cfg, "--batch", str(b), "--seq", str(s), "--precision", row["precision"], "--checkpoint",
            row["checkpoint"], "--use-cache", "off"]
    release = release or torch_release()
    if release:
        args += ["--torch", release]
    if row["finetune"] != "full":
        args += ["--finetune", row["finetune"], "--lora-r", str(LORA_R)]
    return args


def want(col, rerun, selected):
    """Run this column? Everything selected by --rows; else, in a rerun, only what is not done."""
    if selected:
        return True
    if not rerun or not col:
        return True
    return col.get("status") not in ("ok", "na")


def part_matrix(kit, res):
    a = kit.a
    prof = profile_for(kit.gpu["name"] if kit.gpu else None)
    with open(os.path.join(ROOT, "configs/gpus", prof + ".json")) as f:
        ws = json.load(f).get("cublas_workspace_bytes", 8519680)
    m = kit.state["matrix"]
    m.update(profile=prof, workspace_bytes=ws, steps=a.steps, device=kit.gpu["name"] if kit.gpu else "cpu (fallback)")
    if not kit.gpu:
        m["note"] = ("CPU fallback: configs shrunk to 2 layers of width 128, batch %d x %d, memplan's host backend, "
                     "PyTorch on the CPU (no memory columns)" % (CPU_BATCH, CPU_SEQ))
    old = {r["id"]: r for r in m.get("rows", [])}
    rows = []
    for spec in matrix_rows():
        r = old.get(spec["id"], {})
        r.update(spec)
        rows.append(r)
    m["rows"] = rows
    sel = [x for x in (a.rows or "").split(",") if x]
    chosen = [r for r in rows if not sel or any(x in r["id"] for x in sel)]
    left = kit.part_left

    def selected(r):
        return bool(sel) and r in chosen

    # 1. estimates: every row (they are cheap, and a fix here changes them)
    for r in rows:
        cfg, b, s = row_config(kit, r)
        r.update(run_batch=b, run_seq=s)
        rc, out, err, secs = run_cmd([kit.memplan, "estimate"] + memplan_args(r, cfg, b, s) + ["--gpu", prof, "--json"],
                                     min(ROW_S["estimate"], max(1, left())), logf=kit.logf)
        try:
            mem = json.loads(out)["memory"]
            r["estimate"] = {"status": "ok", "peak_allocated": mem["peak_allocated_bytes"],
                             "peak_reserved": mem["peak_reserved_bytes"], "peak_device": mem["peak_device_bytes"],
                             "peak_event": mem["peak_event"], "trainable_params": json.loads(out)["model"]["trainable_params"]}
            al = mem.get("allocator") or {}   # the simulated caching allocator (issue 29)
            r["estimate"].update(alloc_simulated=al.get("simulated"), alloc_retries=al.get("num_alloc_retries"),
                                 reserved_frag=al.get("reserved_fragmentation_bytes"),
                                 device_reserved=mem.get("device_reserved_bytes"), alloc_settings=al.get("settings"))
            # the other device bytes (issue 29 item 2): the kernel memplan says torch picks, its context
            r["estimate"].update(sdpa_kernel=json.loads(out)["config"].get("sdpa_kernel"),
                                 overhead=mem.get("overhead_bytes"))
            if kit.gpu and mem["peak_device_bytes"] > 0.97 * kit.gpu["memory_mib"] * 2**20:
                r["estimate"]["over_device"] = True
        except (ValueError, KeyError, TypeError):
            r["estimate"] = {"status": "FAILED", "error": "rc %d: %s" % (rc, tail(err))}
    kit.save()

    # 2. PyTorch, one worker for every row
    torch_ok = has_module("torch") and has_module("transformers")
    worker = None
    starts, start_error = 0, None   # a worker that died is started again, 3 times in all
    wstart = WORKER_START_S[0 if kit.gpu else 1]
    for r in chosen:
        if not want(r.get("torch"), a.rerun, selected(r)):
            continue
        if not torch_ok:
            r["torch"] = {"status": "na", "error": "skipped: no torch/transformers in %s" % sys.executable}
            continue
        if r.get("estimate", {}).get("over_device"):
            r["torch"] = {"status": "na", "error": "memplan estimates more than the device holds"}
            continue
        if worker is None or not worker.alive():
            if start_error or starts >= 3:
                r["torch"] = {"status": "FAILED", "error": start_error or "the PyTorch worker died 3 times"}
                continue
            if left() < wstart / 3 + ROW_S["torch"][0] / 6:
                r["torch"] = {"status": "budget", "error": "not run: %.0f s left" % left()}
                continue
            starts += 1
            try:
                worker = Worker(kit, min(wstart, left()))
                kit.state["env"]["torch_worker"] = worker.hello
                kit.say("PyTorch worker: %s" % json.dumps(worker.hello)[:300])
            except RuntimeError as e:
                worker = None
                start_error = str(e)[:300]
                r["torch"] = {"status": "FAILED", "error": start_error}
                if "no torch" in str(e):
                    torch_ok = False
                    r["torch"]["status"] = "na"
                kit.save()
                continue
        lim = min(ROW_S["torch"][0 if kit.gpu else 1], left())
        if lim < 10:
            r["torch"] = {"status": "budget", "error": "not run: %.0f s left" % left()}
            continue
        cfg, b, s = row_config(kit, r)
        spec = {k: r[k] for k in ("id", "precision", "checkpoint", "finetune")}
        spec.update(config_path=cfg, batch=b, seq=s, steps=a.steps)
        t = time.time()
        r["torch"] = worker.row(spec, lim)
        if r["torch"].get("status") == "skipped":
            r["torch"]["status"] = "na"
        if any(k in r["torch"].get("error", "") for k in ("CUDA error", "CUBLAS_STATUS", "cuDNN error")):
            worker.close()   # a CUDA error sticks to the context: the next row gets a fresh process
        kit.say("torch %s: %s %s (%.0f s)" % (r["id"], r["torch"].get("status"), r["torch"].get("error", ""),
                                             time.time() - t))
        kit.save()
    if worker is not None:
        worker.close()

    # 3. memplan's probe, one process per row (each measures its own CUDA context)
    backend = "cuda" if kit.gpu else "host"
    for r in chosen:
        if not want(r.get("probe"), a.rerun, selected(r)):
            continue
        if a.no_probe:
            r["probe"] = {"status": "na", "error": "not run: --no-probe"}
            continue
        if r.get("estimate", {}).get("over_device"):
            r["probe"] = {"status": "na", "error": "memplan estimates more than the device holds"}
            continue
        lim = min(ROW_S["probe"][0 if kit.gpu else 1], left())
        if lim < 8:
            r["probe"] = {"status": "budget", "error": "not run: %.0f s left" % left()}
            continue
        cfg, b, s = row_config(kit, r)
        cmd = [kit.memplan, "probe"] + memplan_args(r, cfg, b, s) + ["--backend", backend, "--steps", str(a.steps),
                                                                      "--workspace", str(ws), "--json"]
        rc, out, err, secs = run_cmd(cmd, lim, logf=kit.logf)
        try:
            p = json.loads(out)["probe"]
            r["probe"] = {"status": "ok" if rc in (0, 1) else "FAILED", "backend": backend, "fits": rc == 0,
                          "peak_allocated": p.get("measured_peak_bytes"), "step_ms": p.get("step_ms"),
                          "device_used_before": p.get("device_used_before_bytes"),
                          "device_used_after": p.get("device_used_bytes"), "outside_pool": p.get("outside_pool_bytes"),
                          "gemm_tflops": p.get("gemm_tflops"), "losses": p.get("losses"), "seconds": round(secs, 1)}
            if rc == 1:
                r["probe"]["status"] = "FAILED"
                r["probe"]["error"] = "probe: out of memory"
        except (ValueError, KeyError, TypeError):
            r["probe"] = {"status": "timeout" if rc == 124 else "FAILED", "error": "rc %d: %s" % (rc, tail(err))}
        kit.say("probe %s: %s (%.0f s)" % (r["id"], r["probe"]["status"], secs))
        kit.save()

    derive(m)
    cols = [(r["id"], c, r.get(c, {}).get("status")) for r in chosen for c in ("estimate", "torch", "probe")]
    failed = [x for x in cols if x[2] in ("FAILED", "timeout")]
    missing = [x for x in cols if x[2] in (None, "budget")]
    res["status"] = "FAILED" if failed else ("partial" if missing else "ok")
    n_ok = sum(1 for x in cols if x[2] == "ok")
    res["note"] = "%d of %d cells measured" % (n_ok, len(cols))
    if failed:
        res["note"] += "; failed: " + ", ".join("%s %s" % (i, c) for i, c, _ in failed[:8])
    if missing:
        res["note"] += "; not run (budget): %d" % len(missing)
    if len(chosen) < len(rows):
        res["note"] += "; %d of %d rows chosen by --rows" % (len(chosen), len(rows))
    nas = sorted({r.get(c, {}).get("error", "") for r in rows for c in ("torch", "probe")
                  if r.get(c, {}).get("status") == "na"})
    if nas:
        res["note"] += "; n/a: " + "; ".join(nas)[:200]


def derive(m):
    for r in m["rows"]:
        e, t, p = r.get("estimate", {}), r.get("torch", {}), r.get("probe", {})
        d = {}
        if t.get("peak_allocated"):
            d["est_vs_torch_pct"] = pct(e.get("peak_allocated"), t["peak_allocated"])
            d["probe_vs_torch_pct"] = pct(p.get("peak_allocated"), t["peak_allocated"])
            d["est_reserved_vs_torch_pct"] = pct(e.get("peak_reserved"), t.get("peak_reserved"))
        if t.get("num_alloc_retries") is not None or e.get("alloc_retries") is not None:
            d["retries"] = "%s / %s" % (e.get("alloc_retries"), t.get("num_alloc_retries"))
        if p.get("peak_allocated") and e.get("peak_allocated"):
            d["probe_vs_est_pct"] = pct(p["peak_allocated"], e["peak_allocated"])
        if t.get("trainable_params") and e.get("trainable_params") and t["trainable_params"] != e["trainable_params"]:
            d["params_differ"] = "trainable params: memplan %d, torch %d" % (e["trainable_params"], t["trainable_params"])
        if p.get("step_ms") and t.get("step_ms"):
            d["step_ratio"] = round(p["step_ms"] / t["step_ms"], 3)
        r["derived"] = d


# ---- part: tune ----------------------------------------------------------------------------------

def lightning_tune(a):
    import torch
    import transformers
    try:
        import lightning as L
        from lightning.pytorch.tuner import Tuner
    except ImportError:
        import pytorch_lightning as L
        from pytorch_lightning.tuner import Tuner

    cfg = load_config(a.config)
    mt = cfg.pop("model_type")
    conf = transformers.AutoConfig.for_model(mt, **cfg)
    conf.use_cache = False
    trials = []
    seq = a.seq

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 1 << 16

        def __getitem__(self, i):
            return torch.randint(0, conf.vocab_size, (seq,), generator=torch.Generator().manual_seed(i))

    class Mod(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 2
            self.model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="sdpa")

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Data(), batch_size=self.batch_size)

        def training_step(self, batch, i):
            if not trials or trials[-1] != self.batch_size:
                trials.append(self.batch_size)
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    trainer = L.Trainer(accelerator="cpu" if a.cpu else "gpu", devices=1, precision="bf16-mixed", max_steps=10,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=os.path.join(STATE_DIR, "lightning"))
    t0 = time.perf_counter()
    found = Tuner(trainer).scale_batch_size(Mod(), mode="binsearch", steps_per_trial=3, init_val=2,
                                            max_trials=a.max_trials)
    print(json.dumps({"status": "ok", "wall_s": round(time.perf_counter() - t0, 2), "trials": len(trials),
                      "batch": found, "batches_tried": trials, "lightning": L.__version__}), flush=True)


def part_tune(kit, res):
    t = kit.state["tune"]
    cfg, seq = os.path.join(ROOT, "models/hf/gpt2.json"), TUNE_SEQ
    if kit.gpu:
        cmd = [kit.memplan, "suggest", cfg, "--device", "0", "--seq", str(seq), "--precision", "amp-bf16", "--json"]
    else:
        cfg, seq = tiny_config(kit, "gpt2", "models/hf/gpt2.json"), CPU_SEQ
        t["note"] = ("CPU fallback: a 2-layer GPT-2 at seq %d; memplan suggest --backend host on a 40 MiB "
                     "target, Lightning on the CPU with 3 trials" % seq)
        cmd = [kit.memplan, "suggest", cfg, "--vram", "40MiB", "--context", "1MiB", "--backend", "host",
               "--seq", str(seq), "--precision", "amp-bf16", "--json"]
    rerun = kit.a.rerun and "tune" not in (kit.a.parts or "")
    if want(t.get("memplan"), rerun, False):
        rc, out, err, secs = run_cmd(cmd, max(1, kit.part_left() * 0.5), logf=kit.logf)
        try:
            sg = json.loads(out)
            r = sg["recommendation"]
            t["memplan"] = {"status": "ok", "wall_s": round(secs, 2), "probes": sg.get("probes"),
                            "batch": r["micro_batch"], "grad_accum": r.get("grad_accum"),
                            "checkpoint": r["plan"].get("strategy") if isinstance(r.get("plan"), dict) else None,
                            "probed": r.get("probed"), "peak_allocated": r.get("peak_allocated_bytes"),
                            "probe_step_ms": r.get("probe_step_ms"), "command": " ".join(["memplan"] + cmd[1:])}
        except (ValueError, KeyError, TypeError):
            t["memplan"] = {"status": "timeout" if rc == 124 else "FAILED", "error": "rc %d: %s" % (rc, tail(err)),
                            "command": " ".join(["memplan"] + cmd[1:])}
        t["memplan"]["command"] = t["memplan"]["command"].replace(ROOT + "/", "")
        kit.say("memplan suggest: %s" % json.dumps(t["memplan"])[:300])
        kit.save()
    if want(t.get("lightning"), rerun, False):
        if not (has_module("torch") and has_module("transformers") and
                (has_module("lightning") or has_module("pytorch_lightning"))):
            t["lightning"] = {"status": "na", "error": "skipped: needs torch, transformers and lightning"}
        else:
            lim = kit.part_left()
            if lim < 20:
                t["lightning"] = {"status": "budget", "error": "not run: %.0f s left" % lim}
            else:
                rc, out, err, secs = run_cmd([sys.executable, os.path.abspath(__file__), "lightning", "--config", cfg,
                                              "--seq", str(seq), "--max-trials", "25" if kit.gpu else "3"]
                                             + ([] if kit.gpu else ["--cpu"]), lim, logf=kit.logf)
                try:
                    t["lightning"] = json.loads(out.strip().splitlines()[-1])
                    t["lightning"]["process_s"] = round(secs, 2)
                except (ValueError, IndexError):
                    t["lightning"] = {"status": "timeout" if rc == 124 else "FAILED",
                                      "error": "rc %d: %s" % (rc, tail(err))}
        kit.say("lightning: %s" % json.dumps(t["lightning"])[:300])
    sts = [t.get(k, {}).get("status") for k in ("memplan", "lightning")]
    res["status"] = "FAILED" if any(s in ("FAILED", "timeout") for s in sts) else (
        "partial" if "budget" in sts else "ok")
    res["note"] = "memplan %s, lightning %s" % tuple(sts)


# ---- part: steptime ------------------------------------------------------------------------------

def part_steptime(kit, res):
    rows = kit.state["matrix"].get("rows", [])
    derive(kit.state["matrix"])
    both = [r for r in rows if r.get("derived", {}).get("step_ratio")]
    if not both:
        res.update(status="skipped", note="no matrix row with both step times")
        return
    ratios = [r["derived"]["step_ratio"] for r in both]
    res.update(status="ok", note="%d rows; probe/torch median %.2f (min %.2f, max %.2f)%s" % (
        len(both), statistics.median(ratios), min(ratios), max(ratios),
        "" if kit.gpu else " (CPU fallback: host backend vs PyTorch CPU, tiny shapes)"))


# ---- part: dpo -------------------------------------------------------------------------------

def run_trainer_rows(kit, res, name):
    """bench/gpu/NAME_cuda.py under the part's time left (its --budget-s: 10 s kept for the last
    row's memplan and write; --cpu-smoke without a GPU): (its JSON, its rows, its exit status),
    res set where it failed, was skipped or ran on the CPU fallback."""
    if not has_module("trl") or not has_module("peft"):
        res.update(status="skipped", note="n/a: no trl or peft")
        return {}, [], 0
    out = os.path.join(kit.out, "%s.json" % name)
    if os.path.exists(out):
        os.remove(out)
    left = kit.part_left()
    cmd = [sys.executable, os.path.join(HERE, "%s_cuda.py" % name), "--memplan", kit.memplan, "--out", out,
           "--budget-s", "%.0f" % max(1.0, left - 10)]
    if not kit.gpu:
        cmd.append("--cpu-smoke")
    rc, o, e, secs = run_cmd(cmd, left, logf=kit.logf)
    d = {}
    if os.path.exists(out):
        with open(out) as f:
            d = json.load(f)
    rows = d.get("rows", [])
    if not rows:
        res.update(status="FAILED", note="%s_cuda.py rc %d: %s" % (name, rc, tail(e or o, 200)))
        return d, [], rc
    d["rc"] = rc
    kit.state[name] = d
    if not kit.gpu:
        res.update(status="ok", note="CPU fallback: the flow ran (%d rows), no memory figures" % len(rows))
    return d, rows, rc


def part_dpo(kit, res):
    """bench/gpu/dpo_cuda.py: TRL's DPOTrainer step on the GPU against memplan --trainer dpo (the
    step's and the reference forward's max_memory_allocated); the CPU fallback runs its flow only.
    dpo_cuda.py writes each row as it finishes and starts none it has no time for (--budget-s):
    a run cut short keeps its rows."""
    d, rows, rc = run_trainer_rows(kit, res, "dpo")
    if not rows or not kit.gpu:
        return
    worst = max([abs(r["peak_pct"]) for r in rows] + [abs(r["ref_pct"]) for r in rows if r.get("ref_pct") is not None]
                or [0])
    if rc != 0 or d.get("skipped"):
        res.update(status="partial", note="%d rows (rc %d, %d skipped for time); largest |memplan - torch| %.2f %% "
                   "of torch (target 1 %%)" % (len(rows), rc, len(d.get("skipped", [])), worst))
        return
    res.update(status="ok", note="%d rows; largest |memplan - torch| %.2f %% of torch (target 1 %%)" % (len(rows), worst))


# ---- part: grpo ------------------------------------------------------------------------------

def part_grpo(kit, res):
    """bench/gpu/grpo_cuda.py: TRL's GRPOTrainer generation batch on the GPU (generate, the old
    log-probs, the reference, the policy's step) against memplan --trainer grpo, each phase's
    max_memory_allocated against memory.phases; the CPU fallback runs its flow only.  Rows are
    written as they finish, and none is started without the time for it (--budget-s)."""
    d, rows, rc = run_trainer_rows(kit, res, "grpo")
    if not rows or not kit.gpu:
        return
    worst = max([abs(v) for r in rows for v in list(r.get("phase_pct", {}).values()) + [r["peak_pct"]]] or [0])
    state = "partial" if rc != 0 or d.get("skipped") else "ok"
    res.update(status=state, note="%d rows (rc %d, %d skipped for time); largest |memplan - torch| of a phase "
               "%.2f %% of torch (target 1 %%)" % (len(rows), rc, len(d.get("skipped", [])), worst))


# ---- part: orpo ------------------------------------------------------------------------------

def part_orpo(kit, res):
    """bench/gpu/orpo_cuda.py: TRL's ORPOTrainer step on the GPU (TRL's Triton log-prob kernel,
    accelerate's fp32 outputs under amp) against memplan --trainer orpo, the step's
    max_memory_allocated against peak_allocated_bytes; the CPU fallback runs its flow only."""
    d, rows, rc = run_trainer_rows(kit, res, "orpo")
    if not rows or not kit.gpu:
        return
    worst = max([abs(r["peak_pct"]) for r in rows if r.get("peak_pct") is not None] or [0])
    state = "partial" if rc != 0 or d.get("skipped") else "ok"
    res.update(status=state, note="%d rows (rc %d, %d skipped for time); largest |memplan - torch| %.2f %% of "
               "torch (target 1 %%)" % (len(rows), rc, len(d.get("skipped", [])), worst))


# ---- parts: sdpa, optim (bench/gpu/sdpa_ws.py, optim_step.py) --------------------------------------

def sdpa_rule(c):
    """The backward transient docs/memory-facts.md#sdpa-gqa-backward gives for case c (bytes)."""
    per_row = (8 if c["kv_heads"] < c["heads"] else 4) * c["head_dim"] + 4
    return c["batch"] * c["heads"] * c["seq"] * per_row + 256


def run_json_part(kit, res, script, name, extra):
    """A GPU script writing name.json into OUTDIR (gpu_json.py's frame) under the part's time; its
    result into kit.state[name], or the part's status says why not."""
    out = os.path.join(kit.out, name + ".json")
    if os.path.exists(out):
        os.remove(out)
    if not kit.gpu:
        res.update(status="skipped", note="no GPU: nothing to measure")
        return None
    left = kit.part_left()
    cmd = [sys.executable, os.path.join(HERE, script), "--out", out, "--budget-s", "%.0f" % max(1.0, left - 10)] + extra
    rc, o, e, secs = run_cmd(cmd, left, logf=kit.logf)
    d = {}
    if os.path.exists(out):
        with open(out) as f:
            d = json.load(f)
    if not d or d.get("status") == "skipped":
        res.update(status="FAILED", note="%s rc %d: %s" % (script, rc, tail(e or o, 200)))
        return None
    kit.state[name] = d
    return d


def part_sdpa(kit, res):
    """SDPA's kernel allocations per shape against the rule memplan uses for its backward."""
    d = run_json_part(kit, res, "sdpa_ws.py", "sdpa", [])
    if d is None:
        return
    worst, n = 0.0, 0
    for c in d.get("cases", []):
        if c.get("status") != "ok":
            continue
        t = [sz for sz, alive in c["backward_blocks"] if not alive]
        c["transient"] = max(t) if t else 0
        c["rule"] = sdpa_rule(c)
        worst = max(worst, abs(100.0 * (c["rule"] - c["transient"]) / max(1, c["transient"])))
        n += 1
    res.update(status="ok" if n and d.get("status") == "ok" else "partial",
               note="%d shapes; the backward transient against memplan's rule: largest |Δ| %.2f %%" % (n, worst))


def part_devbytes(kit, res):
    """The context, the cuBLAS workspace, SDPA's kernel per case and NCCL with one rank."""
    d = run_json_part(kit, res, "devbytes.py", "devbytes", [])
    if d is None:
        return
    rows = d.get("rows", [])
    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    res.update(status="ok" if d.get("status") == "ok" else "partial",
               note="%d of %d measurements (context, cuBLAS, SDPA cases, NCCL one rank)" % (len(ok), len(rows)))


def part_optim(kit, res):
    """Each HF optimizer's state and step temporaries against memplan's."""
    d = run_json_part(kit, res, "optim_step.py", "optim", ["--memplan", kit.memplan])
    if d is None:
        return
    ok = [r for r in d.get("rows", []) if r.get("status") == "ok"]
    res.update(status="ok" if ok and d.get("status") == "ok" else "partial",
               note="%d optimizer x precision rows measured (%d failed: missing libraries)" % (
                   len(ok), len(d.get("rows", [])) - len(ok)))


def part_moe(kit, res):
    """FSDP2's bf16-to-fp32 gradient copy-in and grouped_mm's backward on CUDA (--ep's assumptions)."""
    d = run_json_part(kit, res, "moe_cuda.py", "moe", [])
    if d is None:
        return
    notes = []
    for r in d.get("chunk_cat", []):
        if r.get("status") == "ok":  # a cast temporary would be a block of the gradients' size
            notes.append("chunk_cat E%d x%d: %d B above the inputs" % (r["experts"], r["chunks"],
                                                                      r["peak_above_bytes"]))
    for r in d.get("grouped_mm", []):
        if r.get("status") == "ok":
            notes.append("grouped_mm %s: grads contiguous %s" % (
                r["dtype"], all(c for _, c in r["weight_grad_strides"].values())))
    res.update(status="ok" if notes and d.get("status") == "ok" else "partial", note="; ".join(notes)[:300])


# ---- part: callback ------------------------------------------------------------------------------

CALLBACK_BATCH, CALLBACK_SEQ, CALLBACK_STEPS = 8, 1024, 4


def callback_worker(a):
    """a Trainer with MemplanCallback on GPT-2 (or its 2-layer version on the CPU); one JSON line"""
    import torch
    import transformers
    from transformers import Trainer, TrainerCallback, TrainingArguments

    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ["MEMPLAN_BIN"] = a.memplan
    from memplan.integrations.transformers import MemplanCallback

    cfg = load_config(os.path.join(ROOT, "models/hf/gpt2.json"))
    batch, seq = (CPU_BATCH, CPU_SEQ) if a.cpu else (CALLBACK_BATCH, CALLBACK_SEQ)
    if a.cpu:
        cfg = shrink(cfg)
    mt = cfg.pop("model_type")
    conf = transformers.AutoConfig.for_model(mt, **cfg)
    model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="sdpa")
    cuda = not a.cpu and torch.cuda.is_available()
    peaks = []

    class Peak(TrainerCallback):
        """torch's peak over each step after the first"""

        def on_step_begin(self, args, state, control, **kw):
            if cuda and state.global_step >= 1:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()

        def on_step_end(self, args, state, control, **kw):
            if cuda and state.global_step >= 2:
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated())

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return batch * CALLBACK_STEPS

        def __getitem__(self, i):
            ids = torch.randint(0, conf.vocab_size, (seq,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids.clone()}

    lines = []
    cb = MemplanCallback(seq=seq, on_oom="warn", log=lines.append, vram=None if cuda else "24GiB")
    args = TrainingArguments(output_dir=os.path.join(STATE_DIR, "callback"), per_device_train_batch_size=batch,
                             max_steps=CALLBACK_STEPS, bf16=cuda, optim="adamw_torch", report_to="none",
                             save_strategy="no", logging_strategy="no", disable_tqdm=True)
    t0 = time.perf_counter()
    Trainer(model=model, args=args, train_dataset=Data(), callbacks=[cb, Peak()]).train()
    r = cb.report
    out = {"status": "ok", "wall_s": round(time.perf_counter() - t0, 2), "target": cb.target,
           "batch": batch, "seq": seq, "log": lines, "argv": " ".join(["memplan"] + (cb.argv or [])[1:])}
    if r is not None:
        out.update(fits=r.fits, precision=r.config.precision, estimate=r.memory.peak_allocated_bytes,
                   capacity=r.check.capacity_bytes)
    if cuda:
        out["device_total"] = torch.cuda.get_device_properties(0).total_memory
        out["torch_peak"] = max(peaks) if peaks else None
        if peaks and r is not None:
            out["est_vs_torch_pct"] = pct(r.memory.peak_allocated_bytes, max(peaks))
    print(json.dumps(out), flush=True)


def part_callback(kit, res):
    c = kit.state.setdefault("callback", {})
    if not (has_module("torch") and has_module("transformers")):
        c.clear()
        c.update(status="na", error="needs torch and transformers")
        res.update(status="skipped", note=c["error"])
        return
    rc, out, err, secs = run_cmd([sys.executable, os.path.abspath(__file__), "callback-worker", "--memplan",
                                  kit.memplan] + ([] if kit.gpu else ["--cpu"]), kit.part_left(), logf=kit.logf)
    c.clear()
    try:
        c.update(json.loads(out.strip().splitlines()[-1]))
        c["process_s"] = round(secs, 2)
    except (ValueError, IndexError):
        c.update(status="timeout" if rc == 124 else "FAILED", error="rc %d: %s" % (rc, tail(err)))
    kit.say("callback: %s" % json.dumps(c)[:400])
    res["status"] = c["status"] if c["status"] in ("ok", "FAILED", "timeout") else "FAILED"
    if c["status"] != "ok":
        res["note"] = c.get("error", "")
    elif kit.gpu:
        ok_target = c.get("device_total") is not None and c.get("capacity") == c.get("device_total")
        if not ok_target:
            res["status"] = "FAILED"
        res["note"] = ("target %s (capacity %s of the device's %s B), fits %s; estimate %s vs torch %s GiB (%s %%)"
                       % (c.get("target"), c.get("capacity"), c.get("device_total"), c.get("fits"),
                          gib(c.get("estimate")), gib(c.get("torch_peak")), delta(c.get("est_vs_torch_pct"))))
    else:
        res["note"] = "CPU fallback: the flow only (a 24 GiB vram target), fits %s" % c.get("fits")


PART_FN = {"build": part_build, "tests": part_tests, "sanitizer": part_sanitizer, "matrix": part_matrix,
           "tune": part_tune, "steptime": part_steptime, "dpo": part_dpo, "grpo": part_grpo, "orpo": part_orpo,
           "callback": part_callback,
           "sdpa": part_sdpa, "optim": part_optim, "moe": part_moe, "devbytes": part_devbytes}


def choose_parts(kit, prev):
    a = kit.a
    if a.parts:
        names = [p for p in a.parts.split(",") if p]
        bad = [p for p in names if p not in PARTS]
        if bad:
            sys.exit("run.sh: unknown part(s) %s (parts: %s)" % (",".join(bad), ",".join(PARTS)))
        if "build" not in names:
            names.insert(0, "build")   # the binary's path comes from it
        return [p for p in PARTS if p in names]
    if not a.rerun:
        return list(PARTS)
    todo = ["build"] + [p for p in PARTS[1:] if prev.get("parts", {}).get(p, {}).get("status") != "ok"]
    if "matrix" in todo and "steptime" not in todo:
        todo.append("steptime")
    return todo


def cmd_run(a):
    if a.steps is None:
        a.steps = 4
    kit = Kit(a)
    prev = None
    if a.rerun is not None:
        src = a.rerun or os.path.join(STATE_DIR, "report.json")
        if not os.path.exists(src) and os.path.exists(os.path.join(kit.out, "report.json")):
            src = os.path.join(kit.out, "report.json")
        try:
            with open(src) as f:
                prev = json.load(f)
            if prev.get("schema") != SCHEMA:
                raise ValueError("schema %s, not %d" % (prev.get("schema"), SCHEMA))
        except (OSError, ValueError) as e:
            sys.exit("run.sh: --rerun: cannot read %s (%s): run without --rerun" % (src, e))
        was = (prev.get("env", {}).get("gpu") or {}).get("name")
        now = kit.gpu["name"] if kit.gpu else None
        if was != now:
            kit.say("--rerun: %s was measured on %s, this is %s: everything runs again" % (
                src, was or "the CPU fallback", now or "the CPU fallback"))
            prev = None
    a.rerun = prev is not None
    kit.state = prev if prev else new_state(kit)
    parts = choose_parts(kit, prev or {})
    kit.state["env"].update(env_info(kit))
    kit.state["runs"].append({"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "budget_s": a.budget,
                              "parts": parts, "rerun": bool(prev), "rows": a.rows or None, "steps": a.steps})
    kit.say("started: %s, budget %d s, parts %s%s" % (
        "GPU " + kit.gpu["name"] if kit.gpu else "no GPU (CPU fallback)", a.budget, ",".join(parts),
        " (rerun)" if prev else ""))

    def on_term(signum, frame):
        for c in list(CHILDREN):
            kill_group(c)
        kit.say("stopped by signal %d: the report holds what finished" % signum)
        for p in parts:
            st = kit.state["parts"].get(p, {})
            if st.get("status") == "running":
                st.update(status="timeout", note="killed while running")
        kit.save()
        sys.exit(1)
    signal.signal(signal.SIGTERM, on_term)

    for p in parts:
        res = {"status": "running", "_t0": time.time()}
        if p != "build" and kit.memplan is None:
            res.update(status="skipped", note="no memplan binary (build failed)")
        elif kit.left() < CAPS[p][2]:
            res.update(status="skipped", note="budget: needs at least %d s, %.0f s left" % (CAPS[p][2], kit.left()))
        else:
            kit.state["parts"][p] = res
            kit.part_end = time.time() + kit.cap(p)
            kit.save()
            try:
                PART_FN[p](kit, res)
            except Exception as e:  # noqa: BLE001 - a kit bug must not lose the other parts
                traceback.print_exc(file=kit.logf)
                res.update(status="FAILED", note="kit error: %s: %s" % (type(e).__name__, str(e)[:200]))
        res["seconds"] = round(time.time() - res.pop("_t0"), 1)
        res["cap_s"] = CAPS[p][0 if kit.gpu else 1]
        res["run"] = len(kit.state["runs"])
        kit.state["parts"][p] = res
        kit.save()
        kit.say("%s: %s (%.0f s) %s" % (p, res["status"], res["seconds"], res.get("note", "")))
    kit.state["runs"][-1]["seconds"] = round(time.time() - kit.t0, 1)
    kit.save()
    kit.say("done in %.0f s: %s" % (time.time() - kit.t0, os.path.join(kit.out, "report.md")))
    sys.stdout.write(render(kit.state))
    sys.stdout.flush()
    failed = [p for p, r in kit.state["parts"].items() if r.get("status") in ("FAILED", "timeout")]
    return 1 if failed else 0


# ---- report --------------------------------------------------------------------------------------

def gib(b):
    return "" if b is None else "%.3f" % (b / 2**30)


def mib(b):
    return "" if b is None else "%.0f" % (b / 2**20)


def fmt(v, f="%.1f"):
    return "" if v is None else f % v


def delta(v):
    if v is None:
        return ""
    s = "%+.2f" % v
    return "**%s**" % s if abs(v) > 2 else s


def render(st):
    env = st.get("env", {})
    g = env.get("gpu") or {}
    tw = env.get("torch_worker") or {}
    L = ["# memplan GPU validation kit", ""]
    L.append("- GPU: %s" % ("%s, %s MiB, driver %s (CUDA %s), compute %s" % (
        g.get("name"), g.get("memory_mib"), g.get("driver"), g.get("cuda_driver", "?"), g.get("compute_cap"))
        if g else "none: CPU fallback (host backend, shrunk configs, PyTorch on the CPU)"))
    L.append("- software: nvcc %s; Python %s; torch %s (CUDA %s, cuDNN %s); transformers %s; peft %s; "
             "bitsandbytes %s" % (env.get("nvcc") or "none", env.get("python"), tw.get("torch", "(not started)"),
                                  tw.get("cuda", "-"), tw.get("cudnn", "-"), tw.get("transformers", "-"),
                                  tw.get("peft", "-"), tw.get("bitsandbytes", "-")))
    b = st.get("parts", {}).get("build", {})
    if b:
        L.append("- memplan: %s" % b.get("note", ""))
    runs = st.get("runs", [])
    for i, r in enumerate(runs, 1):
        L.append("- run %d: %s, budget %s s, took %s s, parts %s%s%s" % (
            i, r.get("started"), r.get("budget_s"), r.get("seconds", "?"), ",".join(r.get("parts", [])),
            " (rerun)" if r.get("rerun") else "", ", rows " + r["rows"] if r.get("rows") else ""))
    L += ["", "## Parts", "", "| part | status | seconds | cap | run | note |", "|---|---|---|---|---|---|"]
    for p in PARTS:
        r = st.get("parts", {}).get(p)
        if r:
            L.append("| %s | %s | %s | %s | %s | %s |" % (p, r.get("status"), r.get("seconds", ""), r.get("cap_s", ""),
                                                          r.get("run", ""), str(r.get("note", "")).replace("|", "/")[:300]))
        else:
            L.append("| %s | not run | | | | |" % p)
    s = st.get("parts", {}).get("sanitizer", {})
    if s.get("command"):
        L += ["", "Sanitizer: `%s` -> %s" % (s["command"], s.get("summary") or s.get("note"))]
    m = st.get("matrix", {})
    rows = m.get("rows", [])
    if rows:
        L += ["", "## Peak memory: estimate vs probe vs PyTorch (steady-state step)", "",
              "Device %s; memplan profile %s (cuBLAS workspace %s B); %s measured steps after one warm-up, "
              "torch.cuda.reset_peak_memory_stats() after it. GiB; Δ = (memplan − torch allocated) / torch "
              "allocated, bold past ±2 %%. non-alloc = mem_get_info used − reserved: the CUDA context and the "
              "libraries' own memory in the PyTorch worker. SDPA: the op torch dispatched to in the warm-up step."
              % (m.get("device"), m.get("profile"), m.get("workspace_bytes"), m.get("steps")), ""]
        if m.get("note"):
            L += [m["note"], ""]
        L += ["| row | b×s | estimate | probe | torch alloc | Δ est % | Δ probe % | probe − est % | torch reserved "
              "| est reserved | non-alloc MiB | SDPA | note |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            e, t, p, d = r.get("estimate", {}), r.get("torch", {}), r.get("probe", {}), r.get("derived", {})
            notes = ["%s: %s %s" % (c, x.get("status"), x.get("error", "")) for c, x in (("estimate", e),
                     ("torch", t), ("probe", p)) if x.get("status") not in ("ok", None)]
            notes += ["%s: not run" % c for c, x in (("torch", t), ("probe", p)) if not x]
            if d.get("params_differ"):
                notes.append(d["params_differ"])
            L.append("| %s | %s×%s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["id"], r.get("run_batch", r.get("batch")), r.get("run_seq", r.get("seq")), gib(e.get("peak_allocated")),
                gib(p.get("peak_allocated")), gib(t.get("peak_allocated")), delta(d.get("est_vs_torch_pct")),
                delta(d.get("probe_vs_torch_pct")), fmt(d.get("probe_vs_est_pct"), "%+.2f"), gib(t.get("peak_reserved")),
                gib(e.get("peak_reserved")),
                mib(t.get("non_allocator_bytes")), t.get("sdpa", ""), "; ".join(notes).replace("|", "/")[:200]))
        L += ["", "Caching allocator (issue 29): memplan's simulated peak reserved against "
              "torch.cuda.max_memory_reserved(), and its retries (cudaMalloc failed, cache freed) against "
              "memory_stats()['num_alloc_retries']; settings: PYTORCH_CUDA_ALLOC_CONF of both processes.", "",
              "| row | torch reserved | est reserved | Δ reserved % | est fragmentation MiB | retries est / torch "
              "| settings |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            e, t, d = r.get("estimate", {}), r.get("torch", {}), r.get("derived", {})
            L.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                r["id"], gib(t.get("peak_reserved")), gib(e.get("peak_reserved")),
                fmt(d.get("est_reserved_vs_torch_pct"), "%+.2f"), mib(e.get("reserved_frag")), d.get("retries", ""),
                e.get("alloc_settings") or t.get("alloc_conf") or "defaults"))
        if tw.get("used_after_init") is not None:
            L += ["", "CUDA context (PyTorch worker): %s MiB used on the device right after the context was made%s; "
                  "memplan probe: %s MiB before its first allocation (first row); profile %s says %s MiB." % (
                      mib(tw.get("used_after_init")),
                      " (%s MiB of it this process's: NVML saw %s MiB in use before)" % (
                          mib(tw.get("context_bytes")), mib(tw.get("nvml_used_before")))
                      if tw.get("context_bytes") is not None else "",
                      mib(next((r["probe"].get("device_used_before") for r in rows
                                if r.get("probe", {}).get("device_used_before")), None)) or "?",
                      m.get("profile"), profile_context(m.get("profile")))]
        L += ["", "## Step time: memplan probe vs PyTorch (median of the matrix's steady-state steps)", "",
              "| row | probe ms | torch ms | probe/torch | probe GEMM TFLOP/s |", "|---|---|---|---|---|"]
        for r in rows:
            p, t = r.get("probe", {}), r.get("torch", {})
            if p.get("step_ms") or t.get("step_ms"):
                L.append("| %s | %s | %s | %s | %s |" % (r["id"], fmt(p.get("step_ms"), "%.2f"), fmt(t.get("step_ms"), "%.2f"),
                                                        fmt(r.get("derived", {}).get("step_ratio"), "%.2f"),
                                                        fmt(p.get("gemm_tflops"), "%.1f")))
    t = st.get("tune", {})
    if t.get("memplan") or t.get("lightning"):
        mp, lt = t.get("memplan", {}), t.get("lightning", {})
        L += ["", "## Time to a recommendation (GPT-2, seq %d, amp-bf16)" % (TUNE_SEQ if g else CPU_SEQ), ""]
        if t.get("note"):
            L += [t["note"], ""]
        L += ["| tool | wall s | probes / trials | batch | note |", "|---|---|---|---|---|"]
        L.append("| memplan suggest | %s | %s | %s | %s |" % (
            mp.get("wall_s", ""), mp.get("probes", ""), mp.get("batch", ""),
            mp.get("error") or "%s, %s; `%s`" % (mp.get("checkpoint"), "probed" if mp.get("probed") else "not probed",
                                                mp.get("command", ""))))
        L.append("| Lightning scale_batch_size(binsearch) | %s | %s | %s | %s |" % (
            lt.get("wall_s", ""), lt.get("trials", ""), lt.get("batch", ""),
            (lt.get("error") or "tried %s" % lt.get("batches_tried", ""))[:200]))
    dp = st.get("dpo", {})
    if dp.get("rows") and dp.get("status") != "smoke":
        L += ["", "## DPO (TRL 1.16 DPOTrainer step, %s): max_memory_allocated vs memplan --trainer dpo" %
              dp.get("device"), "", "| config | finetune | ckpt | reference | torch peak | memplan | Δ | "
              "torch ref fwd | memplan | Δ |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in dp["rows"]:
            refk = "precomputed" if r["precompute"] else "adapter off" if r["finetune"] == "lora" else "copy"
            L.append("| %s | %s | %s | %s | %d | %d | %+.3f %% | %s | %s | %s |" % (
                r["config"], r["finetune"], r["checkpoint"], refk, r["torch_peak"], r["memplan_peak"], r["peak_pct"],
                r["torch_ref_forward_peak"] or "-", r["memplan_ref_forward_peak"] or "-",
                "%+.3f %%" % r["ref_pct"] if r.get("ref_pct") is not None else "-"))
        ws = dp.get("workspaces") or {}
        L += ["", "cuBLAS workspaces (memory_allocated, no tensor alive): start %s, after a forward mm %s, after a "
              "backward through one %s, after nn.Linear(bias) forward and backward %s; memplan counts %s." % (
                  ws.get("start"), ws.get("after_forward_mm"), ws.get("after_backward_mm"),
                  ws.get("after_linear_bias"), dp["rows"][0].get("memplan_workspace_bytes")),
              "Per row (bytes): allocated at its start (after gc.collect: the workspaces alone) / before the "
              "measured step; the step's phase peaks."]
        for r in dp["rows"]:
            L.append("- %s %s %s%s: start %s, before step %s; %s; %s s" % (
                r["config"], r["finetune"], r["checkpoint"], " precompute" if r["precompute"] else "",
                r.get("alloc_start"), r.get("alloc_before_step"),
                ", ".join("%s %s" % kv for kv in (r.get("phase_peaks") or {}).items()), r.get("seconds")))
        if dp.get("skipped"):
            L.append("- not run (time): " + "; ".join(dp["skipped"]))
        for r in dp["rows"]:
            lp = r.get("live_at_peak")
            if isinstance(lp, dict):
                L.append("- %s %s %s: live at the measured step's peak (torch.cuda.memory._snapshot's trace): "
                         "peak %s (torch %s), %s before the step, %s made in it:" % (
                             r["config"], r["finetune"], r["checkpoint"], lp["peak"], r["torch_peak"],
                             lp["baseline"], lp["live_made_in_window"]))
                L += ["  - %s B in %s block(s): %s" % (t["bytes"], t["blocks"], t["where"]) for t in lp["top"][:15]]
            elif lp:
                L.append("- %s %s %s: live at peak not recorded: %s" % (r["config"], r["finetune"], r["checkpoint"],
                                                                       lp))
    gp = st.get("grpo", {})
    if gp.get("rows") and gp.get("status") != "smoke":
        L += ["", "## GRPO (TRL 1.16 GRPOTrainer generation batch, %s): each phase's max_memory_allocated vs "
              "memplan --trainer grpo" % gp.get("device"), "",
              "| config | finetune | ckpt | precision | beta | K | T | phase | torch | memplan | Δ |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in gp["rows"]:
            for k, v in r["torch_phases"].items():
                L.append("| %s | %s | %s | %s | %g | %d | %g | %s | %d | %s | %s |" % (
                    r["config"], r["finetune"], r["checkpoint"], r["precision"], r["beta"],
                    r["steps_per_generation"], r["temperature"], k, v, r["memplan_phases"].get(k, "-"),
                    "%+.3f %%" % r["phase_pct"][k] if k in r.get("phase_pct", {}) else "-"))
        if gp.get("skipped"):
            L.append("- not run (time): " + "; ".join(gp["skipped"]))
    op = st.get("orpo", {})
    if op.get("rows") and op.get("status") != "smoke":
        L += ["", "## ORPO (TRL 1.16 ORPOTrainer step, %s): max_memory_allocated vs memplan --trainer orpo"
              % op.get("device"), "",
              "| config | finetune | ckpt | precision | pairs x seq | torch | memplan | Δ | memplan's peak at |",
              "|---|---|---|---|---|---|---|---|---|"]
        for r in op["rows"]:
            L.append("| %s | %s | %s | %s | %d x %d | %d | %d | %s | %s |" % (
                r["config"], r["finetune"], r["checkpoint"], r["precision"], r["pairs"], r["seq"], r["torch_peak"],
                r["memplan_peak"], "%+.3f %%" % r["peak_pct"] if r.get("peak_pct") is not None else "-",
                r["memplan_peak_event"]))
        if op.get("skipped"):
            L.append("- not run (time): " + "; ".join(op["skipped"]))
    cb = st.get("callback", {})
    if cb:
        L += ["", "## MemplanCallback in a transformers Trainer (GPT-2, %s x %s, %s)" % (
            cb.get("batch", ""), cb.get("seq", ""), cb.get("precision", "")), ""]
        if cb.get("status") != "ok":
            L.append("%s: %s" % (cb.get("status"), cb.get("error", "")))
        else:
            L += ["- target: %s; capacity %s B, the device's total %s B; fits %s" % (
                      cb.get("target"), cb.get("capacity"), cb.get("device_total", "-"), cb.get("fits")),
                  "- peak allocated: memplan %s GiB, torch %s GiB over steps 2-%d (Δ %s %%)" % (
                      gib(cb.get("estimate")), gib(cb.get("torch_peak")), CALLBACK_STEPS,
                      delta(cb.get("est_vs_torch_pct"))),
                  "- `%s`" % cb.get("argv", "")]
            L += ["- logged: %s" % x for x in cb.get("log", [])]
    sd = st.get("sdpa", {})
    if sd.get("cases"):
        L += ["", "## SDPA's kernels (%s, torch %s): the backward's transient against memplan's rule" % (
            sd.get("device", ""), sd.get("torch", "")), "",
              "b a s (4d + 4) + 256 bytes, (8d + 4) with grouped k/v heads: docs/memory-facts.md#sdpa-gqa-backward", "",
              "| b | heads | kv | s | d | dropout | forward op | backward transient | rule | Δ % |", "|---|---|---|---|---|---|---|---|---|---|"]
        for c in sd["cases"]:
            if c.get("status") != "ok":
                L.append("| %s | | | | | | %s | | | |" % (c.get("batch"), c.get("error", c.get("status"))))
                continue
            L.append("| %d | %d | %d | %d | %d | %s | %s | %d | %d | %s |" % (
                c["batch"], c["heads"], c["kv_heads"], c["seq"], c["head_dim"], c["dropout"],
                ",".join(c.get("forward_op", [])), c.get("transient", 0), c.get("rule", 0),
                delta(pct(c.get("rule"), c.get("transient")))))
    if rows:
        L += ["", "## Device bytes beside the allocator per row (issue 29 item 2): memplan against the worker", "",
              "| row | SDPA memplan | SDPA torch | memplan context MiB | non-alloc MiB |", "|---|---|---|---|---|"]
        for r in rows:
            e, t = r.get("estimate", {}), r.get("torch", {})
            L.append("| %s | %s | %s | %s | %s |" % (r["id"], e.get("sdpa_kernel") or "(not said)", t.get("sdpa", ""),
                                                     mib(e.get("overhead")), mib(t.get("non_allocator_bytes"))))
    db = st.get("devbytes", {})
    if db.get("rows"):
        L += ["", "## Device bytes one GPU shows (%s, sm%s, torch %s, CUDA %s, cuDNN %s)" % (
            db.get("device", ""), db.get("cc", ""), db.get("torch", ""), db.get("cuda", ""), db.get("cudnn", "")), ""]
        for r in db["rows"]:
            w = r.get("what")
            if w == "context":
                L.append("- context: %s MiB used right after torch made it (NVML before: %s MiB; this process's %s "
                         "MiB); docs/memory-facts.md#cuda-context's table" % (
                             mib(r.get("used_after_context")), mib(r.get("nvml_used_before")), mib(r.get("context_bytes"))))
            elif w == "cublas":
                L.append("- cuBLAS, first %s matmul: workspace %s B in the allocator, %s B outside it" % (
                    r.get("dtype"), r.get("workspace_allocated"), r.get("outside_allocator")))
            elif w == "nccl":
                L.append("- NCCL one rank (%s): %s" % (r.get("nccl", ""), r.get("error") or
                         "init +%s B, after an all-reduce +%s B, %s B of it outside the allocator" % (
                             r.get("after_init"), r.get("after_all_reduce"), r.get("outside_allocator"))))
        cases = [r for r in db["rows"] if r.get("what") == "sdpa"]
        if cases:
            L += ["", "| SDPA dtype | head dim | mask | op torch ran |", "|---|---|---|---|"]
            for r in cases:
                L.append("| %s | %s | %s | %s |" % (r["dtype"], r["head_dim"], r["masked"],
                                                    ",".join(r.get("ops", [])) or r.get("error", "")))
    op = st.get("optim", {})
    if op.get("rows"):
        L += ["", "## Optimizers (GPT-2, Trainer.create_optimizer, %s): state and step temporaries" % op.get("device", ""),
              "", "| precision | optim | state | memplan | Δ % | step | memplan | device (step 1) |",
              "|---|---|---|---|---|---|---|---|"]
        for r in op["rows"]:
            m = r.get("memplan", {})
            if r.get("status") != "ok":
                L.append("| %s | %s | %s | | | | | |" % (r["precision"], r["optim"], r.get("error", "")[:60]))
                continue
            # the paged states live in CUDA managed memory: the device's bytes, not the allocator's
            got = r["state_device"] if r["optim"].startswith("paged") else r["state_allocated"]
            L.append("| %s | %s | %d%s | %s | %s | %d | %s | %d |" % (
                r["precision"], r["optim"], got, " (device)" if got != r["state_allocated"] else "",
                m.get("optimizer_bytes", ""), delta(pct(m.get("optimizer_bytes"), got)) if got else "",
                r["step_tmp"], m.get("optimizer_tmp_bytes", ""), r["state_device"]))
    todo = rerun_todo(st)
    L += ["", "## Rerun", ""]
    if todo:
        L.append("Not done: %s. After a fix (or to fill them in): `sh bench/gpu/run.sh $OUT --budget 170 --rerun` "
                 "(bench/gpu/README.md)." % "; ".join(todo))
    else:
        L.append("Nothing left to rerun.")
    return "\n".join(L) + "\n"


def profile_context(prof):
    try:
        with open(os.path.join(ROOT, "configs/gpus", prof + ".json")) as f:
            return json.load(f).get("cuda_context_mib", "?")
    except (OSError, TypeError, ValueError):
        return "?"


def rerun_todo(st):
    todo = []
    for p in PARTS:
        r = st.get("parts", {}).get(p)
        if r is None:
            todo.append(p + " (not run)")
        elif r.get("status") not in ("ok", "skipped") or (r.get("status") == "skipped" and "budget" in r.get("note", "")):
            todo.append("%s (%s)" % (p, r.get("status")))
    cells = [(r["id"], c) for r in st.get("matrix", {}).get("rows", []) for c in ("torch", "probe")
             if r.get(c, {}).get("status") not in ("ok", "na")]
    if cells:
        todo.append("matrix cells: " + ", ".join("%s %s" % x for x in cells[:10]) + (" …" if len(cells) > 10 else ""))
    return todo


def cmd_report(a):
    with open(os.path.join(a.out, "report.json")) as f:
        st = json.load(f)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(render(st))


# ---- helpers for build.sh and prepare.sh ---------------------------------------------------------

def cmd_build_info(a):
    print(json.dumps({"commit": a.commit, "source_hash": source_hash(), "arch": a.arch, "nvcc": a.nvcc,
                      "built": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "host": platform.node(),
                      "libc": platform.libc_ver()[1]}, indent=1))


def cmd_slim_wheel(a):
    """Unpack a wheel into DEST keeping only the named native libraries (lib*_<NAME>.so)."""
    import zipfile
    keep = tuple("_%s.so" % k for k in a.keep)
    n = size = 0
    with zipfile.ZipFile(a.wheel) as z:
        for info in z.infolist():
            base = os.path.basename(info.filename)
            if base.endswith(".so") and not base.endswith(keep):
                continue
            z.extract(info, a.dest)
            n += 1
            size += info.file_size
    print("prepare: %s -> %s: %d files, %.1f MiB (native libraries kept: %s)" % (
        os.path.basename(a.wheel), a.dest, n, size / 2**20, ", ".join(a.keep)))


def du(path):
    total = 0
    if os.path.isfile(path) or os.path.islink(path):
        return os.lstat(path).st_size
    for d, _, files in os.walk(path):
        for f in files:
            total += os.lstat(os.path.join(d, f)).st_size
    return total


def cmd_carry_report(a):
    """What a device call sends: the working tree (tracked and untracked-not-ignored files) plus the
    carried paths; the limit is 64 MiB in all."""
    try:
        files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                               check=True).stdout.decode().split("\0")
        tree = sum(os.lstat(os.path.join(ROOT, f)).st_size for f in files if f and os.path.lexists(os.path.join(ROOT, f)))
    except (OSError, subprocess.CalledProcessError):
        tree = None
    carry = [p for p in (".deps", "build-gpu") if os.path.exists(os.path.join(ROOT, p))]
    sizes = {p: du(os.path.join(ROOT, p)) for p in carry}
    total = (tree or 0) + sum(sizes.values())
    print("\nprepare: what a device call sends (limit 64 MiB):")
    print("  working tree (git ls-files -co --exclude-standard): %s MiB" % ("?" if tree is None else "%.1f" % (tree / 2**20)))
    for p in carry:
        print("  %-10s %.1f MiB" % (p + "/", sizes[p] / 2**20))
    print("  total       %.1f MiB%s" % (total / 2**20, "  ** over the limit **" if total > 64 * 2**20 else ""))
    if "build-gpu" not in carry:
        print("  (no build-gpu/: the GPU machine builds, ~1-2 min of its time)")
    c = json.dumps(carry + ["bench/gpu/out"])
    print("""
The calls (bench/gpu/README.md):
  run(carry=%s, timeout_s=460,
      command="sh bench/gpu/run.sh $OUT --budget 420")
  give_back()   # unless the rerun follows at once
  # after a fix, here: sh bench/gpu/prepare.sh; mkdir -p bench/gpu/out; cp FILES_AT/report.json bench/gpu/out/
  run(carry=%s, timeout_s=200,
      command="sh bench/gpu/run.sh $OUT --budget 170 --rerun")
  give_back()""" % (json.dumps(carry), c))
    return 1 if total > 64 * 2**20 else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("run")
    s.add_argument("out")
    s.add_argument("--budget", type=int, default=420, help="the whole run's wall seconds (default 420)")
    s.add_argument("--parts", default="", help="comma-separated: " + ",".join(PARTS))
    s.add_argument("--rerun", nargs="?", const="", default=None, metavar="FILE",
                   help="re-run only what failed or is missing in FILE (default bench/gpu/out/report.json)")
    s.add_argument("--rows", default="", help="matrix rows whose id contains one of these (comma-separated)")
    s.add_argument("--steps", type=int, default=None, help="measured steps per row (default 4)")
    s.add_argument("--cpu", action="store_true", help="the CPU fallback even where a GPU is")
    s.add_argument("--no-probe", action="store_true", help="the matrix without memplan's probe column (estimate and PyTorch only)")
    s = sub.add_parser("report")
    s.add_argument("out")
    s = sub.add_parser("torch-worker")
    s.add_argument("--cpu", action="store_true")
    s = sub.add_parser("lightning")
    s.add_argument("--config", required=True)
    s.add_argument("--seq", type=int, required=True)
    s.add_argument("--cpu", action="store_true")
    s.add_argument("--max-trials", type=int, default=25)
    s = sub.add_parser("callback-worker")
    s.add_argument("--memplan", required=True)
    s.add_argument("--cpu", action="store_true")
    s = sub.add_parser("build-info")
    s.add_argument("--arch", required=True)
    s.add_argument("--commit", default="unknown")
    s.add_argument("--nvcc", default="")
    sub.add_parser("source-hash")
    s = sub.add_parser("slim-wheel")
    s.add_argument("wheel")
    s.add_argument("dest")
    s.add_argument("keep", nargs="+")
    sub.add_parser("carry-report")
    a = ap.parse_args()
    if a.cmd == "run":
        if a.budget < 30:
            ap.error("--budget: at least 30 s")
        if a.steps is not None and a.steps < 1:
            ap.error("--steps: at least 1")
        sys.exit(cmd_run(a))
    fn = {"report": cmd_report, "torch-worker": worker_main, "lightning": lightning_tune, "callback-worker": callback_worker,
          "build-info": cmd_build_info, "source-hash": lambda a: print(source_hash()),
          "slim-wheel": cmd_slim_wheel, "carry-report": cmd_carry_report}[a.cmd]
    sys.exit(fn(a) or 0)


if __name__ == "__main__":
    main()
