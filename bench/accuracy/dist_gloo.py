#!/usr/bin/env python3
"""dist_gloo.py - memplan's per-rank memory against real PyTorch DDP and FSDP2 (CPU, gloo).

For a small Hugging Face GPT-2 (real tensors), W processes (2 and 4) run real data-parallel
training steps on the CPU with the gloo backend:

  ddp              torch.nn.parallel.DistributedDataParallel (bucket_cap_mb default: 25 MiB,
                   first bucket 1 MiB, gradient_as_bucket_view=False)
  ddp-view         the same with gradient_as_bucket_view=True (memplan --ddp-bucket-view)
  fsdp             accelerate 1.15's own fsdp2_prepare_model (called with a stand-in Accelerator):
                   fully_shard per GPT2Block, the tail [ln_f, wte = lm_head (tied)] with
                   reshard_after_forward=False, the root (wpe); reshard_after_forward=True
  fsdp-no-reshard  the same with reshard_after_forward=False
  fsdp mixed-bf16  MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)

AdamW(foreach=True) (the CUDA default; on the CPU torch would pick the per-tensor loop), two
steps, zero_grad(set_to_none=True).  Each rank measures its live bytes with the profiler's
allocation records (torch.profiler, profile_memory=True): every allocation and free of c10's
CPU allocator, with the running total, from before the model is built.  That sees what a
TorchDispatchMode cannot (FSDP2's storage.resize_, DDP's C++ buckets).  Reported per rank:
  start  live bytes when step 2 begins (parameters or shards, optimizer state, buckets, batch)
  peak   the largest live bytes during step 2 (forward, backward, optimizer step)
and memplan's per-rank figure for the same run:
  memplan estimate CONFIG --batch B --seq S --precision P --optimizer adamw --workspace 0
          --context 0 --use-cache off --gpus W --parallel S --json
  ->  memory.peak_requested_bytes (no 512-byte rounding: the CPU allocator does not round;
      --use-cache off: the model runs with use_cache=False)
Side by side: DeepSpeed's estimate_zero2/3_model_states_mem_needs (model states only), on the
same parameter count (bench/accuracy/dist_gloo_results.md explains the differences).

The live bytes are c10's exact running total (FLAGS_caffe2_report_cpu_memory_usage set through
ctypes: without it a tensor whose last reference goes on a gloo worker thread is never counted
as freed, see exact_cpu_total) less gloo's own scratch, the allocations made inside c10d
collectives or gloo's work (NCCL works in the buffers the engine hands it), tracked by address;
frees no record shows are listed in the results.  The model runs with use_cache=False and the
fused gelu_pytorch_tanh (bench/accuracy/dist_gloo_results.md says why).  DIST_GLOO_NOFLAG=1 leaves the
flag off (the old measurement, to see the artefact); DIST_GLOO_TRACE=FILE writes each rank's
step-2 allocations (and FILE.<case>.alive: what is alive when step 2 starts, with the call that
made it) for debugging.

QLoRA under FSDP2 (the qlora-* cases; run only when named in --cases, they need bitsandbytes):
the same small Llama saved once (seed 0) and loaded by every rank with from_pretrained in 4-bit
(BitsAndBytesConfig nf4, compute dtype bf16, double quant, quant_storage bf16; the other
weights in bf16), peft LoRA as the lora cases (adapters fp32: peft's autocast_adapter_dtype),
then sharded by accelerate's own fsdp2_prepare_model (accelerate.utils.fsdp_utils, called with a
stand-in Accelerator): fully_shard per LlamaDecoderLayer, embed_tokens alone, the tail (lm_head)
with reshard_after_forward=False, then the root.
  qlora-fsdp                 quant_storage bf16: the packed 4-bit weights are bf16 tensors of
                             shape (numel/4, 1), sharded by FSDP2 like any frozen parameter
  qlora-fsdp-no-reshard      the same with reshard_after_forward=False
  qlora-fsdp-mixed           accelerate's bf16 policy: MixedPrecisionPolicy(param_dtype=bf16,
                             reduce_dtype=bf16, output_dtype=bf16)
  qlora-u8-fsdp              quant_storage uint8 (bitsandbytes' default): accelerate puts the
                             frozen uint8 Params4bit in ignored_params, so every rank keeps them
                             whole (replicated); the rest is sharded as above
Besides start and peak, each qlora rank records its tensors at step start (the inventory), the
step-2 phase of its peak and what step 2 has alive then, checks that every 4-bit weight
all-gathered by FSDP2 dequantizes to exactly the single-process weight, and the main process
runs the same two steps without FSDP (one process, each rank's batch in turn, the gradients
averaged) for the reference losses.  memplan (--finetune qlora --precision bf16, or mixed-bf16)
refuses --parallel fsdp for qlora (for now): its column then records the refusal, and such a
case writes no row for rowlib.  bench/accuracy/qlora_fsdp_facts.md has the findings.

Usage: python3 bench/accuracy/dist_gloo.py [--memplan ./memplan] [--out FILE] [--quick] [--worlds 2,4]
       [--cases ddp,ddp-view,fsdp,fsdp-no-reshard,fsdp-mixed,lora-ddp,lora-fsdp,...,qlora-fsdp,...]
       (--out FILE.json: the rows as JSON, with the qlora inventories; any other name: the markdown)
"""
import argparse
import gc
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rowlib  # noqa: E402  (the measured rows, kept as data)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp

CFG = dict(n_layer=3, n_embd=256, n_head=4, vocab_size=1000, n_positions=256, embd_pdrop=0.0, resid_pdrop=0.0,
           activation_function="gelu_pytorch_tanh",
           attn_pdrop=0.0)
BATCH, SEQ = 2, 64
# the fine-tune cases (lora-*): a small Llama (real tensors) wrapped by peft, adapters on
# q_proj and v_proj (peft's default for llama), r 8, no dropout; the base frozen in fp32
LLAMA_CFG = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256, tie_word_embeddings=False)
LORA_R = 8
# the qlora cases: finetune kind -> bnb_4bit_quant_storage (the rest of BitsAndBytesConfig is
# QLORA_BNB); the same Llama config, LoRA r and targets as the lora cases
QLORA_KINDS = {"qlora": "bfloat16", "qlora-u8": "uint8"}
QLORA_BNB = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="bfloat16",
                 bnb_4bit_use_double_quant=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(rank_main, world, *args):
    """Run rank_main(rank, world, port, *args, result_dir) in `world` spawned processes; each
    writes result_dir/r<rank>.json.  Returns those results in rank order."""
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(rank_main, args=(world, port) + args + (d,), nprocs=world, join=True, start_method="spawn")
        return [json.load(open(os.path.join(d, f"r{r}.json"))) for r in range(world)]


def ft_prefix(lora):
    """The case-name prefix of a finetune kind: '' (full), 'lora-', 'qlora-', 'qlora-u8-'."""
    return lora + "-" if lora in QLORA_KINDS else ("lora-" if lora else "")


def save_llama(path):
    """The qlora cases' checkpoint: the small Llama as make_model(True) builds it (seed 0,
    fp32), saved for from_pretrained (bitsandbytes quantizes while loading)."""
    import transformers
    cfg = transformers.LlamaConfig(**LLAMA_CFG)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)


def make_qlora(kind, ckpt):
    """The small Llama loaded in 4-bit (QLORA_BNB, quant_storage by kind, the unquantized
    weights in bf16) and wrapped by peft LoRA as the lora cases."""
    import peft
    import transformers
    bnb = transformers.BitsAndBytesConfig(**{**QLORA_BNB, "bnb_4bit_compute_dtype": torch.bfloat16,
                                             "bnb_4bit_quant_storage": getattr(torch, QLORA_KINDS[kind])})
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, quantization_config=bnb, dtype=torch.bfloat16,
                                                              device_map="cpu")
    model.config._attn_implementation = "sdpa"
    torch.manual_seed(0)  # the adapters' init (lora_A): the same on every rank and in the reference
    model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0,
                                                       target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    return model, model.config


def accelerate_fsdp2(model, strategy, mixed):
    """fully_shard the model as accelerate 1.15's Accelerator.prepare does for FSDP2
    (accelerate.utils.fsdp_utils.fsdp2_prepare_model, called with a stand-in Accelerator):
    transformer_based_wrap on the model's _no_split_modules (LlamaDecoderLayer), the input
    embedding alone, the tail with reshard_after_forward=False, the root; frozen non-floating
    Params4bit (uint8 storage) go to ignored_params.  mixed: memplan's mixed-bf16,
    MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) given as the plugin's policy (its
    own "bf16" would reduce and return outputs in bf16 too: set_mixed_precision)."""
    import types
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=(strategy == "fsdp"),
                                            auto_wrap_policy="transformer_based_wrap")
    if mixed:
        from torch.distributed.fsdp import MixedPrecisionPolicy
        plugin.mixed_precision_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    acc = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None,
                                mixed_precision="bf16" if mixed else "no", is_main_process=dist.get_rank() == 0,
                                device=torch.device("cpu"))
    return fsdp2_prepare_model(acc, model)


def make_model(lora=False, ckpt=None):
    """GPT-2 (full training), or with lora the small Llama wrapped by peft (only the adapters
    require grad), or with lora in QLORA_KINDS the same loaded in 4-bit from ckpt."""
    import transformers
    if lora in QLORA_KINDS:
        return make_qlora(lora, ckpt)
    if lora:
        cfg = transformers.LlamaConfig(**LLAMA_CFG)
    else:
        cfg = transformers.GPT2Config(**CFG)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    if not lora:
        return transformers.GPT2LMHeadModel(cfg), cfg
    import peft
    model = transformers.LlamaForCausalLM(cfg)
    model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0,
                                                       target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    return model, cfg


def blocks_of(model):
    """The repeated blocks fully_shard wraps (GPT2Block, or the peft-wrapped LlamaDecoderLayer)."""
    if hasattr(model, "transformer"):
        return model.transformer.h
    return model.base_model.model.model.layers


def allocations(prof):
    """(time, alloc_size, total_allocated) for every CPU allocation record, in time order."""
    from torch._C._profiler import _EventType
    out = []

    def walk(n, ctx):
        if n.tag == _EventType.Allocation:
            f = n.extra_fields
            if str(f.device) == "cpu":
                out.append((n.start_time_ns, f.alloc_size, f.total_allocated, ctx, f.ptr, n.start_tid))
        else:
            ctx = (ctx + " > " if ctx else "") + n.name
        for ch in n.children:
            walk(ch, ctx)

    for r in prof.profiler.kineto_results.experimental_event_tree():
        walk(r, "")
    out.sort()
    return out


def exact_cpu_total():
    """Make c10's CPU allocator keep its running total exact on every thread.

    The profiler records an allocation or a free only on a thread that carries its state
    (memoryProfilingEnabled() reads a thread-local): a tensor whose last reference goes away
    on one of gloo's worker threads, after the collective's own scope, is freed without a
    record, and without FLAGS_caffe2_report_cpu_memory_usage the allocator's running total
    (total_allocated in every later record) keeps counting it.  c10/core/CPUAllocator.cpp,
    ProfiledCPUMemoryReporter::Delete: with the flag on, the size table and the total are
    kept whatever the thread.  The flag is an exported C10 flag: set it through ctypes."""
    import ctypes
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage").value = True


def is_gloo_scratch(ctx):
    """gloo's own buffers: allocated inside a c10d collective or in gloo's work (gloo's
    reduce-scatter clones its input and all-reduces the clone; its all-gather gathers into a
    flat temporary and copies out).  NCCL reads and writes the buffers FSDP2 / DDP hand it."""
    return "c10d::" in ctx or "gloo:" in ctx


def live_bytes(raw):
    """Per allocation record: (time, live bytes without gloo's scratch, context, gloo scratch live).

    The live bytes are the allocator's exact running total (exact_cpu_total) less the gloo
    scratch blocks alive.  Blocks are tracked by address from the records, so that a gloo
    block whose free no record shows (its last reference went on a gloo worker thread) stops
    being subtracted, and so that such frees are listed.  An unrecorded free is found two
    ways: the exact total drops below the sum of the blocks believed alive by exactly one
    block's size (that block is taken out: a gloo scratch block first, then the oldest of
    that size; should a block so taken out be freed on record later, the attribution moves
    to another alive block of that size), or a new block is recorded at the address of a
    block believed alive (the old one was freed before).  Returns the series, the blocks
    freed off the record {ptr: (size, alloc context, alloc time, detection time, gloo)} and
    the largest difference left between the exact total and the blocks believed alive
    (allocations on a thread without the profiler's state would show there)."""
    alive, out, unseen = {}, [], {}  # alive: ptr -> (size, gloo, ctx, time)
    tot_alive = tot_gloo = 0
    residual = 0

    def drop(ptr, t, unrecorded):
        nonlocal tot_alive, tot_gloo
        size, g, ctx, t0 = alive.pop(ptr)
        tot_alive -= size
        tot_gloo -= size if g else 0
        if unrecorded:
            unseen[(ptr, t0)] = (size, ctx, t0, t, g)

    for t, size, total, ctx, ptr, tid in raw:
        if size > 0:
            if ptr in alive:
                drop(ptr, t, True)
            g = is_gloo_scratch(ctx)
            alive[ptr] = (size, g, ctx, t)
            tot_alive += size
            tot_gloo += size if g else 0
        elif ptr in alive:
            drop(ptr, t, False)
        else:  # freed on record after being taken out as freed off the record: wrong block
            wrong = [k for k in unseen if k[0] == ptr and unseen[k][0] == -size]
            if wrong:
                sz, _, _, t_found, _ = unseen.pop(wrong[-1])
                other = sorted((b[3], p) for p, b in alive.items() if b[0] == sz and not b[1])
                if other:  # same size, so the totals do not change
                    _, p2 = other[0]
                    b2 = alive.pop(p2)
                    unseen[(p2, b2[3])] = (b2[0], b2[2], b2[3], t_found, b2[1])
                    tot_alive -= sz
        excess = tot_alive - total
        if excess > 0:
            hits = sorted((not b[1], b[3]) + (p,) for p, b in alive.items() if b[0] == excess)
            if hits:
                drop(hits[0][2], t, True)
                excess = 0
        residual = max(residual, abs(excess))
        out.append((t, total - tot_gloo, ctx, tot_gloo))
    return out, unseen, residual


def live_before(allocs, t):
    """The live bytes after the last record before time t (a live_bytes series)."""
    v = 0
    for a in allocs:
        if a[0] >= t:
            break
        v = a[1]
    return v


def alive_at(raw, t_peak, start2, top=14, classify=None):
    """What is alive at the step-2 peak (the allocation records up to t_peak, by address, gloo
    scratch left out): the bytes allocated before step 2 and, by the op that allocated them (or
    by classify(ctx) where it names a kind), those allocated in step 2 (the largest groups)."""
    alive = {}
    for t, size, total, ctx, ptr, tid in raw:
        if t > t_peak:
            break
        if size > 0:
            alive[ptr] = (size, ctx, t)
        else:
            alive.pop(ptr, None)
    before, groups = 0, {}
    for size, ctx, t in alive.values():
        if is_gloo_scratch(ctx):
            continue
        if t < start2:
            before += size
            continue
        key = (classify and classify(ctx)) or " > ".join(ctx.split(" > ")[-3:])[-150:]
        g = groups.setdefault(key, [0, 0])
        g[0] += size
        g[1] += 1
    step2 = sorted(([b, n, k] for k, (b, n) in groups.items()), reverse=True)
    return dict(before_step2=before, step2_total=sum(g[0] for g in step2), step2_groups=step2[:top])


def is_bnb_4bit(m):
    """bitsandbytes' Linear4bit (not peft's lora.Linear4bit around it)."""
    import bitsandbytes as bnb
    return isinstance(m, bnb.nn.Linear4bit)


def inventory(model, opt, batch):
    """Every tensor this rank holds at step start (the layout does not change between steps):
    parameters (the local shard of a DTensor), buffers, the quant_state of each Linear4bit
    (a module attribute that fully_shard does not see), optimizer state, the batch.  One row
    each: name, kind, dtype, shape, bytes (the storage's, FSDP2's padding included), layout."""
    from torch.distributed.tensor import DTensor
    rows, seen = [], set()

    def add(name, kind, t, layout):
        st = t.untyped_storage()
        if st.data_ptr() in seen or st.nbytes() == 0:
            return
        seen.add(st.data_ptr())
        rows.append(dict(name=name, kind=kind, dtype=str(t.dtype).replace("torch.", ""), shape=list(t.shape),
                         bytes=st.nbytes(), layout=layout))

    four_bit = {n + ".weight": m for n, m in model.named_modules() if is_bnb_4bit(m)}
    pname = {}
    for n, p in model.named_parameters():
        pname[id(p)] = n
        kind = ("4-bit weight" if n in four_bit else "adapter" if "lora_" in n else "norm" if "norm" in n
                else "embedding" if "embed" in n else "lm_head" if "lm_head" in n else "other")
        if isinstance(p, DTensor):
            loc = p.to_local()
            add(n, kind, loc, f"sharded {tuple(p.placements)}: local {tuple(loc.shape)} of {tuple(p.shape)}")
        else:
            add(n, kind, p, f"replicated ({type(p).__name__}, not managed by FSDP2: ignored_params)")
    for n, b in model.named_buffers():
        add(n, "buffer", b, "replicated (buffer)")
    for n, m in four_bit.items():
        qs = m.quant_state
        base = n[:-len(".weight")] + ".quant_state"
        for k, t in (("absmax", qs.absmax), ("code", qs.code), ("offset", qs.offset),
                     ("state2.absmax", getattr(qs.state2, "absmax", None)),
                     ("state2.code", getattr(qs.state2, "code", None))):
            if isinstance(t, torch.Tensor):
                add(f"{base}.{k}", "quant_state", t, "replicated (Linear4bit.quant_state: not a parameter or buffer)")
    for p, st in opt.state.items():
        for k, t in st.items():
            if isinstance(t, torch.Tensor):
                loc = t.to_local() if isinstance(t, DTensor) else t
                add(f"{pname.get(id(p), '?')}:{k}", "optimizer", loc,
                    "sharded (as its parameter)" if isinstance(t, DTensor) else "replicated")
    for k, t in batch.items():
        add(k, "batch", t, "per rank")
    totals = {}
    for r in rows:
        totals[r["kind"]] = totals.get(r["kind"], 0) + r["bytes"]
    return dict(rows=rows, totals=totals, total=sum(r["bytes"] for r in rows))


def dequant_check(model, kind, ckpt):
    """Whether the 4-bit weights survive FSDP2: unshard each decoder layer (the all-gather the
    forward does), dequantize every Linear4bit's weight with the module's quant_state and
    compare with the same weight of the model loaded without FSDP (bitwise)."""
    import bitsandbytes.functional as bf
    from torch.distributed.fsdp import FSDPModule
    ref, _ = make_qlora(kind, ckpt)
    ref_mods = dict(ref.named_modules())
    n = bad = 0
    worst = 0.0
    seen_types = set()
    for blk in blocks_of(model):
        if isinstance(blk, FSDPModule):
            blk.unshard()
        for name, m in blk.named_modules():
            if not is_bnb_4bit(m):
                continue
            full = [k for k, v in model.named_modules() if v is m][0]
            w = m.weight
            if name.endswith("q_proj.base_layer"):  # what the forward finds as the module's weight
                seen_types.add(f"{type(w).__name__} {str(w.dtype).replace('torch.', '')} {tuple(w.shape)}, "
                               f"quant_state on it: {getattr(w, 'quant_state', None) is not None}")
            got = bf.dequantize_4bit(w.detach(), m.quant_state)
            r = ref_mods[full]
            want = bf.dequantize_4bit(r.weight.detach(), r.weight.quant_state)
            d = float((got.float() - want.float()).abs().max())
            worst = max(worst, d)
            bad += int(not torch.equal(got, want))
            n += 1
        if isinstance(blk, FSDPModule):
            blk.reshard()
    return dict(n_weights=n, n_different=bad, max_abs_diff=worst, q_proj_weight_after_unshard=sorted(seen_types))


def rank_main(rank, world, port, strategy, mixed, result_dir, lora=False, ckpt=None):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.profiler import ProfilerActivity, profile
    marks = {}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if not os.environ.get("DIST_GLOO_NOFLAG"):
            exact_cpu_total()
        model, cfg = make_model(lora, ckpt)
        model.train()
        if strategy in ("ddp", "ddp-view"):
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, gradient_as_bucket_view=(strategy == "ddp-view"))
        elif os.environ.get("DIST_GLOO_OLD_LAYOUT"):  # (debug: each block, then the root)
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            kw = dict(reshard_after_forward=(strategy == "fsdp"))
            if mixed:
                kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for blk in blocks_of(model):
                fully_shard(blk, **kw)
            fully_shard(model, **{**kw, "reshard_after_forward": False})
        else:  # FSDP2 as accelerate lays it out (its units: memplan plans these)
            model = accelerate_fsdp2(model, strategy, mixed)
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4, foreach=True)
        g = torch.Generator().manual_seed(rank)
        ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=g)
        labels = ids.clone()
        losses = []
        for step in range(2):
            # let gloo's worker threads drop the previous step's work objects (they hold
            # references to buffers the engines have already released) before measuring
            dist.barrier()
            gc.collect()
            time.sleep(0.2)
            marks[step] = time.time_ns()
            out = model(input_ids=ids, labels=labels, use_cache=False)
            loss = out.loss
            del out
            marks[(step, "forward")] = time.time_ns()  # the phases, for the peak's (no tensor)
            loss.backward()
            marks[(step, "backward")] = time.time_ns()
            losses.append(float(loss.detach()))
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
        marks[2] = time.time_ns()
    raw = allocations(prof)
    allocs, unseen, residual = live_bytes(raw)
    start2 = marks[1]  # the allocation records carry wall-clock (epoch) nanoseconds
    s = [a for a in allocs if a[0] >= start2]
    before = [a for a in allocs if a[0] < start2]
    start_live = before[-1][1] if before else 0
    peak = max([a[1] for a in s] + [start_live])
    where = next((a[2][-160:] for a in s if a[1] == peak), "step start")
    raw_peak = max([a[2] for a in raw if a[0] >= start2] + [start_live])
    gloo_peak = max(a[3] for a in allocs) if allocs else 0
    phase = lambda t: "setup" if t < marks[0] else ("step 1" if t < marks[1] else "step 2")  # noqa: E731
    unseen = [dict(size=u[0], ctx=u[1][-120:], alloc=phase(u[2]), freed_by=phase(u[3]), gloo=u[4])
              for u in sorted(unseen.values(), key=lambda u: u[2])]
    res = dict(rank=rank, start=start_live, peak=peak, raw_peak=raw_peak, gloo_peak=gloo_peak, losses=losses,
               n_allocs=len(allocs), where=where, unseen_frees=unseen, residual=residual)
    t_peak = next((a[0] for a in s if a[1] == peak), start2)  # what step 2 holds at its peak
    res["peak_phase"] = ("forward" if t_peak <= marks[(1, "forward")] else
                         "backward" if t_peak <= marks[(1, "backward")] else "optimizer step")
    res["peak_alive"] = alive_at(raw, t_peak, start2, top=40)
    if lora in QLORA_KINDS:  # the qlora facts: the layout at step start, the weights
        res["inventory"] = inventory(model, opt, dict(input_ids=ids, labels=labels))
        res["dequant_check"] = dequant_check(model, lora, ckpt)
    if os.environ.get("DIST_GLOO_TRACE"):  # debugging: each rank's step-2 allocations
        alive = {}
        main_tid = raw[0][5] if raw else 0
        for t, size, total, ctx, ptr, tid in raw:
            if t >= start2:
                break
            if size > 0:
                phase = sum(t >= marks[k] for k in (0, 1))
                alive[ptr] = (size, ctx, tid != main_tid, phase)
            else:
                alive.pop(ptr, None)
        base = os.environ["DIST_GLOO_TRACE"] + f".w{world}.{ft_prefix(lora)}{strategy}" \
            f"{'.mixed' if mixed else ''}.r{rank}"
        with open(base + ".alive", "w") as f:
            for ptr, (size, ctx, other, phase) in sorted(alive.items(), key=lambda kv: -kv[1][0]):
                f.write(f"{size} {'thread' if other else 'main'} step{phase - 1} {ctx[-150:]}\n")
        with open(base, "w") as f:
            for a in s:
                f.write(f"{a[1]} {a[3]} {a[2][-110:]}\n")
    with open(os.path.join(result_dir, f"r{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run_case(world, strategy, mixed, lora=False, ckpt=None):
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(rank_main, args=(world, port, strategy, mixed, d, lora, ckpt), nprocs=world, join=True,
                           start_method="spawn")
        return [json.load(open(os.path.join(d, f"r{r}.json"))) for r in range(world)]


def memplan_peak(exe, cfgpath, world, strategy, mixed, lora=False):
    """memplan's figures for a case and its command; for the qlora cases a refusal (memplan
    exits non-zero) gives None and the error line in place of the figures."""
    qlora = lora in QLORA_KINDS
    prec = "mixed-bf16" if mixed else ("bf16" if qlora else "fp32")  # qlora: the base weights are bf16
    cmd = [exe, "estimate", cfgpath, "--batch", str(BATCH), "--seq", str(SEQ), "--precision", prec, "--optimizer",
           "adamw", "--workspace", "0", "--context", "0", "--use-cache", "off", "--gpus", str(world), "--json"]
    cmd += ["--parallel", "ddp", "--ddp-bucket-view"] if strategy == "ddp-view" else ["--parallel", strategy]
    if lora:
        cmd += ["--finetune", "qlora" if qlora else "lora", "--lora-r", str(LORA_R), "--lora-targets", "q_proj,v_proj"]
    if qlora:
        cmd += ["--quant-storage", QLORA_KINDS[lora]]
    if qlora:
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            return None, cmd[1:], ((p.stderr or p.stdout).strip().splitlines() or ["exit %d" % p.returncode])[-1]
        return json.loads(p.stdout)["memory"], cmd[1:], None
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return r["memory"], cmd[1:]


def qlora_reference(kind, ckpt, world):
    """The qlora cases' losses without FSDP: one process, the same model and batches; step 1
    accumulates each rank's gradient divided by the world size (FSDP2's averaged gradient; the
    batches are run one at a time, as the ranks run them, so that the bf16 matmuls round alike),
    then each rank's batch again.  Returns [[step-1 loss, step-2 loss] per rank]."""
    model, cfg = make_qlora(kind, ckpt)
    model.train()
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4, foreach=True)
    ids = [torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(r))
           for r in range(world)]
    out = [[]]
    for i in ids:
        loss = model(input_ids=i, labels=i, use_cache=False).loss
        out[0].append(float(loss.detach()))
        (loss / world).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        out.append([float(model(input_ids=i, labels=i, use_cache=False).loss) for i in ids])
    return [list(x) for x in zip(*out)]


def deepspeed_side(total_params, largest, world):
    try:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    except Exception as e:  # noqa: BLE001
        return None, str(e)
    _, z2 = estimate_zero2_model_states_mem_needs(total_params, world, 1, cpu_offload=False)
    z3 = estimate_zero3_model_states_mem_needs(total_params, largest, world, 1, cpu_offload=False,
                                                  cpu_offload_params=False)[1]
    return (z2, z3), None


def case_name(strategy, mixed, lora):
    """--cases' name of a case: ddp, fsdp-mixed, lora-ddp, lora-fsdp-no-reshard-mixed, qlora-fsdp, ..."""
    return ft_prefix(lora) + strategy + ("-mixed" if mixed else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memplan", default="./memplan")
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="world 2 only")
    ap.add_argument("--worlds", default="2,4", help="comma-separated world sizes")
    ap.add_argument("--rows-out", default=os.path.join(rowlib.ROWS_DIR, "dist_gloo.jsonl"),
                    help="where the measured rows go as data for tests/replay_accuracy.py (rowlib.py); '' for none")
    ap.add_argument("--cases", default="", help="comma-separated subset: ddp,ddp-view,fsdp,fsdp-no-reshard,"
                    "fsdp-mixed,lora-ddp,lora-fsdp,"
                    "lora-fsdp-no-reshard,lora-fsdp-mixed (default: all of these); qlora-fsdp,"
                    "qlora-fsdp-no-reshard,qlora-fsdp-mixed,qlora-fsdp-no-reshard-mixed,qlora-u8-fsdp,"
                    "qlora-u8-fsdp-no-reshard (only when named: they need bitsandbytes)")
    a = ap.parse_args()
    model, cfg = make_model()
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in blk.parameters()) for blk in model.transformer.h)
    tmp = tempfile.mkdtemp()
    cfgpath = os.path.join(tmp, "config.json")
    cfg.to_json_file(cfgpath)
    del model
    lcfg = make_model(True)[1]
    lcfgpath = os.path.join(tmp, "llama", "config.json")
    os.makedirs(os.path.dirname(lcfgpath))
    lcfg.to_json_file(lcfgpath)
    # (strategy, mixed-bf16, peft LoRA on the small Llama)
    cases = [("ddp", False, False), ("ddp-view", False, False), ("fsdp", False, False),
             ("fsdp-no-reshard", False, False), ("fsdp", True, False), ("ddp", False, True), ("fsdp", False, True),
             ("fsdp-no-reshard", False, True), ("fsdp", True, True)]
    # QLoRA under FSDP2 (not in the default set): quant_storage bf16 and uint8
    qcases = [(st, m, k) for k in QLORA_KINDS for st in ("fsdp", "fsdp-no-reshard") for m in (False, True)
              if not (k == "qlora-u8" and m)]
    if a.cases:
        cases = [c for c in cases + qcases if case_name(*c) in a.cases.split(",")]
    qckpt = None
    if any(c[2] in QLORA_KINDS for c in cases):
        qckpt = os.path.join(tmp, "llama-ckpt")
        save_llama(qckpt)
    refs = {}
    worlds = [2] if a.quick else [int(w) for w in a.worlds.split(",")]
    rows = []
    for w in worlds:
        for strat, mixed, lora in cases:
            t0 = time.time()
            res = run_case(w, strat, mixed, lora, qckpt)
            cpath = lcfgpath if lora else cfgpath
            if lora in QLORA_KINDS:
                mem, cmd, refused = memplan_peak(a.memplan, cpath, w, strat, mixed, lora)
                if (lora, w) not in refs:
                    refs[(lora, w)] = qlora_reference(lora, qckpt, w)
                if mem is None:
                    print(f"world {w} {case_name(strat, mixed, lora):16s} {'mixed-bf16' if mixed else 'bf16/fp32':10s} "
                          + " ".join(f"r{r['rank']}: start {r['start']:>9} peak {r['peak']:>9}" for r in res)
                          + f" | memplan refused: {refused}", flush=True)
                    rows.append(dict(world=w, strategy=ft_prefix(lora) + strat, mixed=mixed, ranks=res, memplan=None,
                                     memplan_error=refused, cmd=" ".join(cmd), worst=None, secs=time.time() - t0,
                                     reference_losses=refs[(lora, w)]))
                    for r in res:
                        print(f"    r{r['rank']} torch peak in {r['peak_phase']}: {r['where']}; losses "
                              f"{r['losses']} (no FSDP: {refs[(lora, w)][r['rank']]}); dequant check "
                              f"{r['dequant_check']}", flush=True)
                    continue  # no memplan figure: no row for rowlib either
            else:
                mem, cmd = memplan_peak(a.memplan, cpath, w, strat, mixed, lora)
            for r in res:
                r["memplan_peak"] = mem["peak_requested_bytes"]
            worst = max(abs(r["peak"] - r["memplan_peak"]) / r["peak"] for r in res)
            rows.append(dict(world=w, strategy=ft_prefix(lora) + strat, mixed=mixed, ranks=res, memplan=mem,
                             cmd=" ".join(cmd), worst=worst, secs=time.time() - t0))
            if lora in QLORA_KINDS:
                rows[-1]["reference_losses"] = refs[(lora, w)]
            if a.rows_out:  # the evidence, kept as data (rowlib.py): one row per rank
                with open(cpath) as f:
                    cfg_json = json.load(f)
                rowlib.save_rows("dist_gloo", [{
                    "source": "bench/accuracy/dist_gloo.py run of %s (rank %d)" % (
                        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), r["rank"]),
                    "config": "dist_gloo.py's %s config (rank %d)" % (
                        ("Llama 4-bit (%s storage), peft LoRA r %d q_proj,v_proj" % (QLORA_KINDS[lora], LORA_R))
                        if lora in QLORA_KINDS else
                        "Llama, peft LoRA r %d q_proj,v_proj" % LORA_R if lora else "GPT-2", r["rank"]),
                    "config_json": cfg_json,
                    "args": cmd[2:],
                    "figures": {"peak_requested": rowlib.figure(r["peak"], mem["peak_requested_bytes"])},
                    "recorded": {"peak_requested": mem["peak_requested_bytes"]},
                    "versions": rowlib.run_versions(torch=torch.__version__, backend="gloo, %d processes" % w),
                } for r in res], a.rows_out)
            print(f"world {w} {case_name(strat, mixed, lora):16s} {'mixed-bf16' if mixed else 'fp32':10s} "
                  + " ".join(f"r{r['rank']}: start {r['start']:>9} peak {r['peak']:>9}" for r in res)
                  + f" | memplan peak {mem['peak_requested_bytes']:>9} at {mem['peak_event']}: worst {100 * worst:+.2f} %",
                  flush=True)
            for r in res:
                print(f"    r{r['rank']} torch peak in: {r['where']}", flush=True)
    ds = {w: deepspeed_side(total, largest, w) for w in worlds}
    lines = ["# memplan per-rank peak vs PyTorch DDP / FSDP2 on the CPU (gloo)", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
             f"GPT-2 config {CFG}, batch {BATCH}, seq {SEQ}, {total:,} parameters; AdamW(foreach=True).", "",
             "| world | strategy | policy | rank | live at step-2 start | torch peak (step 2) | memplan peak | diff "
             "| gloo scratch peak (taken out) |",
             "|---|---|---|---|---|---|---|---|---|"]
    off_record = []
    for row in rows:
        pol = "mixed-bf16" if row["mixed"] else "fp32"
        if row["strategy"].startswith("qlora") and not row["mixed"]:
            pol = "bf16 base, fp32 adapters"  # qlora: no FSDP2 policy
        for r in row["ranks"]:
            if row["memplan"] is None:  # a qlora case memplan refuses
                lines.append(f"| {row['world']} | {row['strategy']} | {pol} | {r['rank']} | {r['start']:,} | "
                             f"{r['peak']:,} | refused: {row['memplan_error']} | | {r['gloo_peak']:,} |")
                continue
            d = 100 * (row["memplan"]["peak_requested_bytes"] - r["peak"]) / r["peak"]
            lines.append(f"| {row['world']} | {row['strategy']} | {pol} | "
                         f"{r['rank']} | {r['start']:,} | {r['peak']:,} | {row['memplan']['peak_requested_bytes']:,} | "
                         f"{d:+.2f} % | {r['gloo_peak']:,} |")
            for u in r["unseen_frees"]:
                off_record.append(f"| {row['world']} | {row['strategy']} | {pol} | {r['rank']} | {u['size']:,} | "
                                  f"`{u['ctx'][-70:]}` | {u['alloc']} | {u['freed_by']} | "
                                  f"{'yes' if u['gloo'] else 'no'} |")
            if r["residual"]:
                off_record.append(f"| {row['world']} | {row['strategy']} | {pol} | {r['rank']} | "
                                  f"{r['residual']:,} | (unmatched: exact total minus blocks on record) | | | |")
    lines += ["", "Frees the profiler did not record (the last reference went on a gloo worker thread), found "
              "from the allocator's exact total or an address reused (this run):", ""]
    if off_record:
        lines += ["| world | strategy | policy | rank | bytes | allocated by | allocated in | found in | gloo scratch |",
                  "|---|---|---|---|---|---|---|---|---|"] + off_record
    else:
        lines.append("none in this run.")
    lines += ["", "memplan commands: `memplan " + rows[0]["cmd"] + "` (and the other strategies / worlds).", "",
              "DeepSpeed's model-state estimators on the same parameter count (GPU bytes per rank, no offload):", "",
              "| world | estimate_zero2_model_states_mem_needs | estimate_zero3_model_states_mem_needs |", "|---|---|---|"]
    for w in worlds:
        v, err = ds[w]
        lines.append(f"| {w} | {v[0]:,} | {v[1]:,} |" if v else f"| {w} | unavailable: {err} | |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out and a.out.endswith(".json"):  # the rows as data (the qlora inventories with them)
        import importlib.metadata as md
        vers = {}
        for pkg in ("torch", "transformers", "peft", "accelerate", "bitsandbytes"):
            try:
                vers[pkg] = md.version(pkg)
            except md.PackageNotFoundError:
                vers[pkg] = None
        with open(a.out, "w") as f:
            json.dump(dict(versions=vers, llama_cfg=LLAMA_CFG, lora_r=LORA_R, batch=BATCH, seq=SEQ,
                           qlora_bnb=QLORA_BNB, qlora_storage=QLORA_KINDS, rows=rows, markdown=text), f, indent=1)
    elif a.out:
        rowlib.write_results(a.out, text)  # (its hand-written reading kept)


if __name__ == "__main__":
    main()
