#!/usr/bin/env python3
"""ep_gloo.py - real per-rank memory of transformers' native expert parallelism (CPU, gloo).

A tiny Mixtral (MIX_CFG: 2 layers, 8 experts, top-2; seed 0, fp32) is saved once with
save_pretrained; W processes (2 and 4) on the CPU with the gloo backend each load it with

  AutoModelForCausalLM.from_pretrained(ckpt, distributed_config=DistributedConfig(fsdp_size=W,
                                       ep_size=EP[, fsdp_mixed_precision=True]), dtype=float32)

which applies transformers' own FSDP2 layout (transformers/distributed/fsdp.py: the experts
module of each layer fully_shard on the efsdp mesh (W / EP ranks), each decoder layer and
embed_tokens with reshard_after_forward=True, [norm, lm_head] one unit with
reshard_after_forward=False, the root) and, for EP > 1, its expert parallelism
(transformers/distributed/expert_parallel.py: gate_up_proj / down_proj sharded on the expert
dim over the EP ranks, AllToAllEP: argsort of the (token, expert) pairs, all-to-all of the
rows, the experts' grouped_mm forward on the received rows with top-1 local ids and unit
weights, all-to-all back, the routing weights applied on the sender).  EP 1 is plain FSDP2 by
the same config (fsdp_size=W), for comparison.  Cases: W 2 with EP 1, 2; W 4 with EP 1, 2, 4;
each fp32 and with fsdp_mixed_precision (MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)); each with the model's real router and with a uniform router:

  real     MixtralTopKRouter as shipped (softmax, topk, renormalize): the rows a rank receives
           depend on the data and differ per rank and per layer
  uniform  token t picks experts (t*k + j) mod E, j < k (E experts, top-k), its weights the
           real softmax gathered at those experts and renormalized (uniform_router_forward):
           each rank then receives exactly tokens*k rows per layer.  The saved tensors are
           the real router's but one: gather saves its input (the softmax output, which softmax
           saves already: no extra bytes) and the index (int64, the shape topk's indices have)

Each rank runs two training steps (batch 2, seq 64, labels = input_ids, use_cache=False,
its own input_ids drawn with the seed of its rank), AdamW(foreach=True),
zero_grad(set_to_none=True), and measures its live bytes as bench/accuracy/dist_gloo.py does
(imported: the profiler's allocation records with profile_memory=True, c10's exact running
total through FLAGS_caffe2_report_cpu_memory_usage, gloo's own scratch taken out):
  start  live bytes when step 2 begins
  peak   the largest live bytes during step 2, with its phase and the op that allocated it
Next to them, the rows each rank received per layer in step 2's forward (AllToAllEP.
_dispatch_tokens wrapped to log recv_tokens.shape[0] and the pairs sent: ints, no tensors),
to compare with a planner that assumes uniform routing (received rows = tokens * top_k).

The op dump (--dump, on by default): W 2, EP 2, fp32, uniform routing, rank 0, one
forward + backward of model.model.layers[0].mlp in step 2: every aten / c10d op run inside
(a TorchDispatchMode: name, output shapes / dtypes, whether the output is new storage),
in the forward labelled router / dispatch / experts / combine; the tensors autograd saves
(saved_tensors_hooks, dedup by storage) with the autograd nodes that hold them (found by
walking the graph from the block's output back to its input); the CPU allocations the
profiler records in the block's forward (gloo's scratch among them).

Usage: python3 bench/accuracy/ep_gloo.py [--out FILE.md] [--worlds 2,4] [--routing real,uniform]
       [--policies fp32,mixed] [--no-dump] [--json FILE]
"""
import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_gloo  # noqa: E402  (free_port, exact_cpu_total, allocations, live_bytes, alive_at)
import rowlib  # noqa: E402  (the measured rows, kept as data)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

MIX_CFG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=1000, num_local_experts=8, num_experts_per_tok=2,
               max_position_embeddings=256, tie_word_embeddings=False, router_jitter_noise=0.0,
               attention_dropout=0.0)
BATCH, SEQ = 2, 64
TOKENS = BATCH * SEQ
TOP_K = MIX_CFG["num_experts_per_tok"]


def save_mixtral(path):
    import transformers
    torch.manual_seed(0)
    transformers.MixtralForCausalLM(transformers.MixtralConfig(**MIX_CFG)).save_pretrained(path)


def uniform_router_forward(self, hidden_states):
    """MixtralTopKRouter.forward with a fixed, even routing: token t -> experts (t*k + j) mod E.
    The real router's ops but topk, which gather replaces (same-shaped index; gather also saves
    its input, the softmax output that softmax already saves)."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = torch.nn.functional.linear(hidden_states, self.weight)
    router_probs = torch.nn.functional.softmax(router_logits.float(), dim=-1)
    t = torch.arange(router_probs.size(0), device=router_probs.device)
    j = torch.arange(self.top_k, device=router_probs.device)
    router_indices = (t[:, None] * self.top_k + j[None, :]) % self.num_experts
    router_top_value = router_probs.gather(-1, router_indices)
    router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
    return router_logits, router_top_value, router_indices


def use_routing(routing):
    if routing == "uniform":
        from transformers.models.mixtral import modeling_mixtral
        modeling_mixtral.MixtralTopKRouter.forward = uniform_router_forward


def log_received_rows(log, step_of):
    """Wrap AllToAllEP._dispatch_tokens so each call appends (step, layer, rows received, pairs
    sent, rows from each EP rank) to log: ints only.  The layer is found from the experts module
    the implementation runs (its experts_forward is that module's bound forward)."""
    from transformers.distributed.expert_parallel import AllToAllEP
    original = AllToAllEP._dispatch_tokens

    def dispatch_tokens(self, hidden_states, top_k_index, top_k_weights):
        out = original(self, hidden_states, top_k_index, top_k_weights)
        state = out[3]
        log.append(dict(step=step_of(), layer=getattr(self.experts_forward.__self__, "_ep_gloo_layer", None),
                        recv=int(out[0].shape[0]), sent=int(sum(state.send_sizes)),
                        recv_from=[int(x) for x in state.recv_sizes]))
        return out

    AllToAllEP._dispatch_tokens = dispatch_tokens


def load_model(ckpt, world, ep, mixed):
    import transformers
    from transformers.distributed import DistributedConfig
    dc = DistributedConfig(fsdp_size=world, ep_size=ep, fsdp_mixed_precision=mixed)
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, distributed_config=dc, dtype=torch.float32)
    for i, layer in enumerate(model.model.layers):
        layer.mlp.experts._ep_gloo_layer = i
    model.train()
    return model


def local_bytes(model):
    """This rank's parameter bytes (the local shard of each DTensor's own elements), experts and
    the rest; and `mapped`: the shards that are views into a larger storage, which on the CPU is
    the checkpoint's memory-mapped safetensors tensor (transformers loads each rank's slice of a
    dense parameter as such a view: its storage holds the whole parameter, and c10's allocator
    never allocated it, so the live bytes miss it).  On a GPU the slice is copied to the device
    (allocated), as memplan plans it: the rows count it as CUDA's extra bytes."""
    out = {"experts": 0, "other": 0, "mapped": 0}
    for n, p in model.named_parameters():
        loc = p.to_local() if hasattr(p, "to_local") else p
        own = loc.numel() * loc.element_size()
        out["experts" if ".experts." in n else "other"] += own
        if loc.untyped_storage().nbytes() > own:
            out["mapped"] += own
    return out


def setup_rank(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def batch_of(rank):
    ids = torch.randint(0, MIX_CFG["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(rank))
    return ids, ids.clone()


def rank_main(rank, world, port, ep, mixed, routing, ckpt, layers_ckpt, result_dir):
    setup_rank(rank, world, port)
    use_routing(routing)
    rows, step = [], [-1]
    log_received_rows(rows, lambda: step[0])
    from torch.profiler import ProfilerActivity, profile
    marks = {}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        dist_gloo.exact_cpu_total()
        model = load_model(ckpt, world, ep, mixed)
        if layers_ckpt:  # transformers' checkpointing of each decoder layer (memplan --checkpoint layers)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids, labels = batch_of(rank)
        losses = []
        for s in range(2):
            dist.barrier()  # let gloo's threads drop the last step's work objects (dist_gloo.py)
            gc.collect()
            time.sleep(0.2)
            step[0] = s
            marks[s] = time.time_ns()
            out = model(input_ids=ids, labels=labels, use_cache=False)
            loss = out.loss
            del out
            marks[(s, "forward")] = time.time_ns()
            loss.backward()
            marks[(s, "backward")] = time.time_ns()
            losses.append(float(loss.detach()))
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
        marks[2] = time.time_ns()
    raw = dist_gloo.allocations(prof)
    allocs, unseen, residual = dist_gloo.live_bytes(raw)
    start2 = marks[1]
    s2 = [a for a in allocs if a[0] >= start2]
    before = [a for a in allocs if a[0] < start2]
    start_live = before[-1][1] if before else 0
    peak = max([a[1] for a in s2] + [start_live])
    hit = next((a for a in s2 if a[1] == peak), None)
    t_peak = hit[0] if hit else start2
    res = dict(rank=rank, start=start_live, peak=peak, losses=losses, residual=residual, n_unseen=len(unseen),
               where=hit[2][-200:] if hit else "step start", gloo_peak=max(a[3] for a in allocs),
               peak_phase=("forward" if t_peak <= marks[(1, "forward")] else
                           "backward" if t_peak <= marks[(1, "backward")] else "optimizer step"),
               peak_alive=dist_gloo.alive_at(raw, t_peak, start2, top=8),
               param_bytes=local_bytes(model), experts_impl=str(model.config._experts_implementation),
               rows=[r for r in rows if r["step"] == 1])
    with open(os.path.join(result_dir, f"r{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run_spawn(fn, world, *args):
    port = dist_gloo.free_port()
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(fn, args=(world, port) + args + (d,), nprocs=world, join=True, start_method="spawn")
        return [json.load(open(os.path.join(d, f"r{r}.json"))) for r in range(world) if
                os.path.exists(os.path.join(d, f"r{r}.json"))]


# ---------------------------------------------------------------- the op dump (W 2, EP 2, rank 0)

def short(t):
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def storage_ptr(t):
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001  (a tensor without storage)
        return None


class OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    """Every op while .on: name, section, outputs (dtype, shape, bytes) and whether each output
    is new storage (not one of the inputs': views, in-place and out= ops are not)."""

    def __init__(self):
        super().__init__()
        self.on, self.section, self.ops, self.last = False, "", [], ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.last = str(func)
        if self.on:
            ins = set()
            for a in torch.utils._pytree.tree_leaves((args, kwargs)):
                if isinstance(a, torch.Tensor):
                    ins.add(storage_ptr(a))
            # the functional collectives' wrap / wait return their input (whose storage pointer
            # reads null while the collective is pending): not new storage
            alias = "wait_tensor" in str(func) or "_wrap_tensor_autograd" in str(func)
            outs = []
            for o in torch.utils._pytree.tree_leaves(out):
                if isinstance(o, torch.Tensor):
                    new = storage_ptr(o) not in ins and not alias
                    outs.append(dict(t=short(o), bytes=o.numel() * o.element_size() if new else 0, new=new))
            self.ops.append(dict(section=self.section, op=str(func), outs=outs))
        return out


def graph_saved(root, stop):
    """Walk the autograd graph from root back to (not into) stop: for each node its name and the
    tensors it saved (its _saved_* fields, or saved_tensors for a Python Function)."""
    seen, todo, out = set(), [root], []
    keep = []  # the node objects, so that their ids stay theirs
    while todo:
        n = todo.pop()
        if n is None or id(n) in seen or n is stop:
            continue
        seen.add(id(n))
        keep.append(n)
        saved = []
        for a in dir(n):
            if a.startswith("_saved_"):
                try:
                    v = getattr(n, a)
                except Exception:  # noqa: BLE001  (freed or not a tensor)
                    continue
                for x in (v if isinstance(v, (tuple, list)) else [v]):
                    if isinstance(x, torch.Tensor):
                        saved.append((a[len("_saved_"):], x))
        if not saved and hasattr(n, "saved_tensors"):
            try:
                saved = [(f"saved_tensors[{i}]", x) for i, x in enumerate(n.saved_tensors)
                         if isinstance(x, torch.Tensor)]
            except Exception:  # noqa: BLE001
                pass
        out.append((n.name(), [(k, storage_ptr(x), short(x), x.untyped_storage().nbytes()) for k, x in saved]))
        if n.name() != "torch::autograd::AccumulateGrad":
            todo.extend(f for f, _ in n.next_functions)
    return out


def dump_main(rank, world, port, ckpt, result_dir):
    """Step 1 plain; in step 2 rank 0 records layer 0's MoE block forward and backward."""
    setup_rank(rank, world, port)
    use_routing("uniform")
    from transformers.distributed.expert_parallel import AllToAllEP
    from torch.profiler import ProfilerActivity, profile
    model = load_model(ckpt, world, 2, False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids, labels = batch_of(rank)
    mlp = model.model.layers[0].mlp
    log = OpLog()
    packed, rec = {}, dict(on=False)
    storages = {}  # the saved storages (this run only measures ops, no bytes): FSDP may free them
    names = {}  # storage -> what it is
    for n, p in model.named_parameters():
        names[storage_ptr(p.to_local() if hasattr(p, "to_local") else p)] = f"sharded {n} (local)"

    def pack(t):
        if rec["on"]:
            k = storage_ptr(t)
            if k not in packed:
                packed[k] = dict(t=short(t), storage_bytes=t.untyped_storage().nbytes(), after_op=log.last,
                                 section=log.section)
                storages[k] = t.untyped_storage()
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    info, marks = {}, {}

    def pre(module, args):
        if not rec["on"]:
            return
        marks["fwd0"] = time.time_ns()
        info["input"] = (storage_ptr(args[0]), short(args[0]))
        names.setdefault(storage_ptr(args[0]), "the block's input (post_attention_layernorm output)")
        info["stop"] = args[0].grad_fn
        for n, p in module.named_parameters():
            if ".experts." not in "." + n:
                names.setdefault(storage_ptr(p.to_local() if hasattr(p, "to_local") else p), f"unsharded {n}")
        log.section, log.on = "router", True
        hooks.__enter__()

    def post(module, args, out):
        if not rec["on"]:
            return
        hooks.__exit__(None, None, None)
        log.on = False
        marks["fwd1"] = time.time_ns()
        info["graph"] = graph_saved(out.grad_fn, info["stop"])
        for k, st in storages.items():  # what the saved tensors still hold once the forward is over
            packed[k]["bytes_after_forward"] = st.nbytes()
        storages.clear()
        info["stop"] = None
        info["fwd_ops"] = list(log.ops)
        log.ops.clear()

        def bwd_on(g):
            log.section, log.on = "backward", True
            marks["bwd0"] = time.time_ns()

        def bwd_off(g):
            log.on = False
            marks["bwd1"] = time.time_ns()

        out.register_hook(bwd_on)
        args[0].register_hook(bwd_off)

    def experts_unshard(module, args):  # runs before FSDP's own pre-forward (prepend)
        if rec["on"]:
            log.section = "experts unit: FSDP pre-forward"

    def experts_pre(module, args):
        if rec["on"]:
            for n in ("gate_up_proj", "down_proj"):
                p = module._parameters[n]
                names.setdefault(storage_ptr(p.to_local() if hasattr(p, "to_local") else p),
                                 f"unsharded experts.{n} (FSDP's unsharded copy of this rank's experts)")
            log.section = "EP forward"

    def experts_post(module, args, out):
        if rec["on"]:
            log.section = "MoE block after the experts module"

    mlp.register_forward_pre_hook(pre)
    mlp.register_forward_hook(post)
    mlp.experts.register_forward_pre_hook(experts_unshard, prepend=True)
    mlp.experts.register_forward_pre_hook(experts_pre)
    mlp.experts.register_forward_hook(experts_post)
    orig_dispatch, orig_combine = AllToAllEP._dispatch_tokens, AllToAllEP._combine_tokens

    def dispatch(self, *a):
        log.section = "dispatch"
        out = orig_dispatch(self, *a)
        log.section = "experts forward (grouped_mm_experts_forward)"
        return out

    AllToAllEP._dispatch_tokens = dispatch

    def combine(self, *a):
        log.section = "combine"
        return orig_combine(self, *a)

    AllToAllEP._combine_tokens = combine

    with log, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for s in range(2):
            rec["on"] = s == 1 and rank == 0
            out = model(input_ids=ids, labels=labels, use_cache=False)
            loss = out.loss
            del out
            loss.backward()
            del loss
            rec["on"] = False
            opt.step()
            opt.zero_grad(set_to_none=True)
    if rank == 0:
        raw = dist_gloo.allocations(prof)
        fwd_allocs = [(size, " > ".join(ctx.split(" > ")[-2:])[-90:], dist_gloo.is_gloo_scratch(ctx))
                      for t, size, total, ctx, ptr, tid in raw if marks["fwd0"] <= t <= marks["fwd1"] and size > 0]
        res = dict(input=info["input"], graph=info["graph"], saved={str(k): v for k, v in packed.items()},
                   names={str(k): v for k, v in names.items()}, fwd_ops=info["fwd_ops"], bwd_ops=log.ops,
                   fwd_allocs=fwd_allocs, bwd_ms=(marks["bwd1"] - marks["bwd0"]) / 1e6)
        with open(os.path.join(result_dir, "r0.json"), "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- the report

def fmt_rows(r):
    if not r["rows"]:
        return "(no dispatch: EP 1)"
    return "; ".join(f"L{x['layer']}: {x['recv']} ({'+'.join(map(str, x['recv_from']))})" for x in r["rows"])


def fmt_outs(outs):
    return ", ".join(x["t"] + (f" new {x['bytes']:,} B" if x["new"] else " (view/in-place)") for x in outs)


def dump_markdown(d):
    L = ["## Op dump: layer 0's MoE block, W 2, EP 2, rank 0, fp32, uniform routing (step 2)", "",
         f"Block input: {d['input'][1]}.  Every op inside the block's forward (TorchDispatchMode); "
         "'new' = its output is new storage (bytes), else a view / in-place / out= write:", "",
         "| # | section | op | outputs |", "|---|---|---|---|"]
    for i, o in enumerate(d["fwd_ops"]):
        outs = fmt_outs(o["outs"])
        L.append(f"| {i} | {o['section']} | `{o['op']}` | {outs} |")
    names = d["names"]
    holders = {}
    freed = {}  # saved storages FSDP has freed (resharded) by the time the graph is walked
    for node, saved in d["graph"]:
        for k, ptr, t, nbytes in saved:
            held = f"{node.split('::')[-1]}.{k} {t}"
            if nbytes == 0:
                freed.setdefault(t, []).append(held + " (storage freed after the forward: FSDP reshard)")
            else:
                holders.setdefault(str(ptr), []).append(held)
    L += ["", "Tensors autograd saves in the block's forward (saved_tensors_hooks, one row per storage; the "
          "nodes that hold it from a walk of the graph, block output back to block input):", "",
          "| storage bytes when saved | after the forward | first saved as | section | last op dispatched before "
          "the pack | what the storage is | held by (node.field tensor) |",
          "|---|---|---|---|---|---|---|"]
    total = held = 0
    for ptr, s in d["saved"].items():
        total += s["storage_bytes"]
        held += s["bytes_after_forward"]
        L.append(f"| {s['storage_bytes']:,} | {s['bytes_after_forward']:,} | {s['t']} | {s['section']} | "
                 f"`{s['after_op']}` | "
                 f"{names.get(ptr, 'made in the block')} | {'; '.join(holders.get(ptr) or freed.get(s['t'], ['?']))} |")
    L += ["", f"Saved storages in all: {total:,} bytes when saved (the block's input and the weights included), "
          f"{held:,} bytes still allocated once the block's forward is over."]
    new_saved = sum(s["storage_bytes"] for p, s in d["saved"].items() if p not in names)
    L += [f"Saved storages made in the block (neither its input nor a weight): {new_saved:,} bytes.", ""]
    L += ["CPU allocations the profiler records in the block's forward (size, innermost op; gloo = gloo's "
          "own scratch, which the per-rank figures leave out):", "", "| # | bytes | op | gloo |", "|---|---|---|---|"]
    for i, (size, op, g) in enumerate(d["fwd_allocs"]):
        L.append(f"| {i} | {size:,} | `{op}` | {'yes' if g else ''} |")
    L += ["", "Ops of the block's backward (from the gradient reaching the block's output to the gradient of "
          "its input; FSDP's reduce-scatter of the experts unit falls inside):", "",
          "| # | op | outputs |", "|---|---|---|"]
    for i, o in enumerate(d["bwd_ops"]):
        outs = fmt_outs(o["outs"])
        L.append(f"| {i} | `{o['op']}` | {outs} |")
    return L


ROOT = rowlib.ROOT
# the misses not chased (CPU bf16): a row over this is marked `disagrees` with the reason, not
# given a wider tolerance (rowlib.py)
DISAGREE_PCT = 2.0
BF16_WHY = ("mixed-bf16, CPU only: FSDP2's reduce-scatter copy-in (fsdp::chunk_cat_mixed_dtype) casts each bf16 "
            "gradient to the fp32 input on the CPU first (aten::empty_like per gradient: measured, 2,097,152 + "
            "1,048,576 bytes for 4 experts' gate_up and down), where CUDA's _chunk_cat casts in its copy; the "
            "peak here is that copy-in of the layer-0 experts")


def label(c):
    """A case's routing, and its checkpointing where it has some."""
    return c["routing"] + (" + checkpoint layers" if c.get("ckpt") else "")


def memplan_case(exe, cfg_path, world, ep, mixed, layers_ckpt=False):
    """memplan's figures for a case (--ep only above 1) and the command run."""
    cmd = [exe, "estimate", cfg_path, "--batch", str(BATCH), "--seq", str(SEQ), "--precision",
           "mixed-bf16" if mixed else "fp32", "--optimizer", "adamw", "--workspace", "0", "--context", "0",
           "--use-cache", "off", "--gpus", str(world), "--json", "--parallel", "fsdp"]
    if ep > 1:
        cmd += ["--ep", str(ep)]
    if layers_ckpt:
        cmd += ["--checkpoint", "layers"]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return r["memory"], cmd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memplan", default=os.path.join(ROOT, "memplan"), help="the memplan binary")
    ap.add_argument("--rows-out", default=os.path.join(rowlib.ROWS_DIR, "ep_gloo.jsonl"),
                    help="the uniform-routing rows as data for tests/replay_accuracy.py (rowlib.py); '' for none")
    ap.add_argument("--out", default=None, help="the markdown results")
    ap.add_argument("--json", default=None, help="the raw per-rank results as JSON")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--routing", default="real,uniform")
    ap.add_argument("--policies", default="fp32,mixed")
    ap.add_argument("--checkpoint", default="none,layers",
                    help="none, and layers: fp32 uniform-routing cases again with transformers' checkpointing")
    ap.add_argument("--no-dump", action="store_true")
    a = ap.parse_args()
    import transformers
    ckpt = os.path.join(tempfile.mkdtemp(), "mixtral")
    save_mixtral(ckpt)
    cases = []
    for w in [int(x) for x in a.worlds.split(",")]:
        for ep in (1, 2, 4):
            if ep > w:
                continue
            for pol in a.policies.split(","):
                for routing in a.routing.split(","):
                    cases.append((w, ep, pol == "mixed", routing, False))
                    if "layers" in a.checkpoint.split(",") and pol == "fp32" and routing == "uniform":
                        cases.append((w, ep, False, routing, True))
    results = []
    t_all = time.time()
    cfg_json = dict(MIX_CFG, architectures=["MixtralForCausalLM"], model_type="mixtral")
    cfg_path = os.path.join(os.path.dirname(ckpt), "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg_json, f)
    for w, ep, mixed, routing, layers_ckpt in cases:
        t0 = time.time()
        res = run_spawn(rank_main, w, ep, mixed, routing, ckpt, layers_ckpt)
        mem, cmd = memplan_case(a.memplan, cfg_path, w, ep, mixed, layers_ckpt)
        for r in res:  # CUDA allocates the shards the CPU run maps (local_bytes)
            r["memplan_peak"] = mem["peak_requested_bytes"]
            r["diff_pct"] = 100.0 * (mem["peak_requested_bytes"] - r["peak"] - r["param_bytes"]["mapped"]) / (
                r["peak"] + r["param_bytes"]["mapped"])
        results.append(dict(world=w, ep=ep, mixed=mixed, routing=routing, ckpt=layers_ckpt, ranks=res, secs=time.time() - t0,
                            memplan=mem["peak_requested_bytes"], memplan_event=mem["peak_event"],
                            cmd=" ".join(cmd[1:2] + ["CONFIG"] + cmd[3:])))
        if a.rows_out and routing == "uniform":  # memplan plans uniform routing: those are its rows
            def mark(r):
                miss = abs(r["diff_pct"]) > DISAGREE_PCT
                return {"disagrees": {"memplan": {"peak_requested": mem["peak_requested_bytes"]}, "why": BF16_WHY
                                      if mixed else "not explained yet", "seen": rowlib.git_commit()}} if miss else {}
            rowlib.save_rows("ep_gloo", [dict({
                "source": "bench/accuracy/ep_gloo.py run of %s (rank %d, uniform routing)" % (
                    time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), r["rank"]),
                "config": "ep_gloo.py's Mixtral config (rank %d)" % r["rank"],
                "config_json": cfg_json,
                "args": cmd[3:],
                "figures": {"peak_requested": dict(rowlib.figure(r["peak"], mem["peak_requested_bytes"],
                                                                 r["param_bytes"]["mapped"]),
                                                   **({"abs": 0} if mark(r) else {}))},
                "recorded": {"peak_requested": mem["peak_requested_bytes"]},
                "versions": rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__,
                                                backend="gloo, %d processes" % w),
            }, **mark(r)) for r in res], a.rows_out)
        print(f"W {w} EP {ep} {'mixed' if mixed else 'fp32 '} {routing:7s}{' layers' if layers_ckpt else ''} ({time.time() - t0:.0f} s) "
              + " | ".join(f"r{r['rank']} start {r['start']:,} peak {r['peak']:,} ({r['peak_phase']}) "
                           f"rows {fmt_rows(r)}" for r in res), flush=True)
    dump = None
    if not a.no_dump:
        dump = run_spawn(dump_main, 2, ckpt)[0]
    secs = time.time() - t_all
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    L = ["# transformers native expert parallelism: per-rank memory on the CPU (gloo)", "",
         f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}; "
         f"{cpu}, {os.cpu_count()} cores; {secs:.0f} s in all.", "",
         f"Model: MixtralConfig({', '.join(f'{k}={v}' for k, v in MIX_CFG.items())}), seed 0, fp32 weights; "
         f"batch {BATCH}, seq {SEQ} ({TOKENS} tokens per rank: uniform routing would send and receive "
         f"{TOKENS * TOP_K} rows per rank per layer), AdamW(foreach=True), two steps; experts implementation "
         f"`{results[0]['ranks'][0]['experts_impl'] if results else '?'}`.", "",
         "Command: `python3 bench/accuracy/ep_gloo.py " + " ".join(sys.argv[1:]) + "`", "",
         "start = live bytes when step 2 begins; peak = the largest live bytes in step 2 (gloo's scratch out; "
         "peak gloo scratch in its own column); rows = rows received by this rank in step 2's forward per layer "
         "(from each EP rank, +); params = this rank's local parameter bytes (experts / the rest).", "",
         "| routing | policy | world | ep | rank | start | peak | peak phase | peak op | rows received (step 2) "
         "| params experts / other (mapped) | gloo scratch peak | losses | memplan peak | memplan - (peak + mapped) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in results:
        for r in c["ranks"]:
            op = r["where"].split(" > ")[-1]
            pb = r["param_bytes"]
            L.append(f"| {label(c)} | {'mixed-bf16' if c['mixed'] else 'fp32'} | {c['world']} | {c['ep']} | "
                     f"{r['rank']} | {r['start']:,} | {r['peak']:,} | {r['peak_phase']} | `{op}` | {fmt_rows(r)} | "
                     f"{pb['experts']:,} / {pb['other']:,} ({pb['mapped']:,}) | {r['gloo_peak']:,} | "
                     f"{', '.join(f'{x:.4f}' for x in r['losses'])} | {r['memplan_peak']:,} | "
                     f"{r['memplan_peak'] - r['peak'] - pb['mapped']:+,} ({r['diff_pct']:+.2f} %) |")
    L += ["", "memplan: `memplan " + (results[0]["cmd"] if results else "") + "` (per case: its --gpus, "
          "--precision, --ep); mapped: the dense parameters' shards the CPU run reads from the memory-mapped "
          "checkpoint (views, never allocated: local_bytes), which a GPU run allocates, so memplan is compared "
          "with peak + mapped.", ""]
    by_key = {(c["routing"], c["mixed"], c["world"], c["ep"]): c for c in results if not c["ckpt"]}
    pairs = [(c, by_key.get(("uniform", c["mixed"], c["world"], c["ep"]))) for c in results
             if c["routing"] == "real" and not c["ckpt"]]
    pairs = [(r, u) for r, u in pairs if u]
    if pairs:
        L += ["", f"Real routing against uniform routing (the same case): rows received per layer against "
              f"tokens * top_k = {TOKENS * TOP_K}, and the difference in start and peak bytes (real - uniform):", "",
              "| policy | world | ep | rank | rows received, real (per layer) | max / uniform | start real - uniform "
              "| peak real - uniform |", "|---|---|---|---|---|---|---|---|"]
        for rc, uc in pairs:
            for rr, ur in zip(rc["ranks"], uc["ranks"]):
                recv = [x["recv"] for x in rr["rows"]]
                ratio = f"{max(recv) / (TOKENS * TOP_K):.3f}" if recv else ""
                L.append(f"| {'mixed-bf16' if rc['mixed'] else 'fp32'} | {rc['world']} | {rc['ep']} | {rr['rank']} | "
                         f"{', '.join(map(str, recv)) or '(EP 1)'} | {ratio} | {rr['start'] - ur['start']:+,} | "
                         f"{rr['peak'] - ur['peak']:+,} |")
    L += ["", "At each peak: the largest groups of blocks allocated in step 2 and alive then (by the op "
          "context of their allocation; n blocks).  residual: how far the blocks the records show alive drift "
          "from c10's exact total (frees off the profiler's record); start and peak are the exact total.", ""]
    for c in results:
        for r in c["ranks"]:
            pa = r["peak_alive"]
            groups = "; ".join(f"{b:,} ({n}) `{' > '.join(k.split(' > ')[-2:])[-80:]}`"
                               for b, n, k in pa["step2_groups"][:6])
            L.append(f"- {label(c)} {'mixed-bf16' if c['mixed'] else 'fp32'} W {c['world']} EP {c['ep']} "
                     f"r{r['rank']}: peak {r['peak']:,} = start {r['start']:,} + {r['peak'] - r['start']:,}; "
                     f"blocks allocated in step 2 and alive at the peak {pa['step2_total']:,}: {groups}"
                     + (f"; unrecorded frees {r['n_unseen']}, residual {r['residual']:,}"
                        if r["n_unseen"] or r["residual"] else ""))
    if dump:
        L += [""] + dump_markdown(dump)
    text = "\n".join(L) + "\n"
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(results=results, dump=dump), f, indent=1)
    if a.out:
        rowlib.write_results(a.out, text)  # (its hand-written reading kept)


if __name__ == "__main__":
    main()
