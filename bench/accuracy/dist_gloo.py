#!/usr/bin/env python3
"""dist_gloo.py - memplan's per-rank memory against real PyTorch DDP and FSDP2 (CPU, gloo).

For a small Hugging Face GPT-2 (real tensors), W processes (2 and 4) run real data-parallel
training steps on the CPU with the gloo backend:

  ddp              torch.nn.parallel.DistributedDataParallel (bucket_cap_mb default: 25 MiB,
                   first bucket 1 MiB, gradient_as_bucket_view=False)
  ddp-view         the same with gradient_as_bucket_view=True (memplan --ddp-bucket-view)
  fsdp             fully_shard(block) for every GPT2Block, then fully_shard(model)
                   (reshard_after_forward=True)
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

Usage: python3 bench/accuracy/dist_gloo.py [--memplan ./memplan] [--out FILE] [--quick] [--worlds 2,4]
       [--cases ddp,ddp-view,fsdp,fsdp-no-reshard,fsdp-mixed,lora-ddp,lora-fsdp,...]
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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(lora=False):
    """GPT-2 (full training), or with lora the small Llama wrapped by peft (only the adapters
    require grad)."""
    import transformers
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


def rank_main(rank, world, port, strategy, mixed, result_dir, lora=False):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.profiler import ProfilerActivity, profile
    marks = {}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if not os.environ.get("DIST_GLOO_NOFLAG"):
            exact_cpu_total()
        model, cfg = make_model(lora)
        model.train()
        if strategy in ("ddp", "ddp-view"):
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, gradient_as_bucket_view=(strategy == "ddp-view"))
        else:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            kw = dict(reshard_after_forward=(strategy == "fsdp"))
            if mixed:
                kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for blk in blocks_of(model):
                fully_shard(blk, **kw)
            fully_shard(model, **{**kw, "reshard_after_forward": False} if strategy == "fsdp" else kw)
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
            loss.backward()
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
        base = os.environ["DIST_GLOO_TRACE"] + f".w{world}.{'lora-' if lora else ''}{strategy}" \
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


def run_case(world, strategy, mixed, lora=False):
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(rank_main, args=(world, port, strategy, mixed, d, lora), nprocs=world, join=True,
                           start_method="spawn")
        return [json.load(open(os.path.join(d, f"r{r}.json"))) for r in range(world)]


def memplan_peak(exe, cfgpath, world, strategy, mixed, lora=False):
    prec = "mixed-bf16" if mixed else "fp32"
    cmd = [exe, "estimate", cfgpath, "--batch", str(BATCH), "--seq", str(SEQ), "--precision", prec, "--optimizer",
           "adamw", "--workspace", "0", "--context", "0", "--use-cache", "off", "--gpus", str(world), "--json"]
    cmd += ["--parallel", "ddp", "--ddp-bucket-view"] if strategy == "ddp-view" else ["--parallel", strategy]
    if lora:
        cmd += ["--finetune", "lora", "--lora-r", str(LORA_R), "--lora-targets", "q_proj,v_proj"]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return r["memory"], cmd[1:]


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
    """--cases' name of a case: ddp, fsdp-mixed, lora-ddp, lora-fsdp-no-reshard-mixed, ..."""
    return ("lora-" if lora else "") + strategy + ("-mixed" if mixed else "")


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
                    "lora-fsdp-no-reshard,lora-fsdp-mixed (default: all)")
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
    if a.cases:
        cases = [c for c in cases if case_name(*c) in a.cases.split(",")]
    worlds = [2] if a.quick else [int(w) for w in a.worlds.split(",")]
    rows = []
    for w in worlds:
        for strat, mixed, lora in cases:
            t0 = time.time()
            res = run_case(w, strat, mixed, lora)
            cpath = lcfgpath if lora else cfgpath
            mem, cmd = memplan_peak(a.memplan, cpath, w, strat, mixed, lora)
            for r in res:
                r["memplan_peak"] = mem["peak_requested_bytes"]
            worst = max(abs(r["peak"] - r["memplan_peak"]) / r["peak"] for r in res)
            rows.append(dict(world=w, strategy=("lora-" if lora else "") + strat, mixed=mixed, ranks=res, memplan=mem,
                             cmd=" ".join(cmd), worst=worst, secs=time.time() - t0))
            if a.rows_out:  # the evidence, kept as data (rowlib.py): one row per rank
                with open(cpath) as f:
                    cfg_json = json.load(f)
                rowlib.save_rows("dist_gloo", [{
                    "source": "bench/accuracy/dist_gloo.py run of %s (rank %d)" % (
                        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), r["rank"]),
                    "config": "dist_gloo.py's %s config (rank %d)" % (
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
        for r in row["ranks"]:
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
    if a.out:
        keep = ""  # the hand-written reading of the results, kept across reruns
        if os.path.exists(a.out):
            old = open(a.out).read()
            if "\n## Reading" in old:
                keep = old[old.index("\n## Reading"):]
        with open(a.out, "w") as f:
            f.write(text + keep)


if __name__ == "__main__":
    main()
