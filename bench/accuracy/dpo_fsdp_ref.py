#!/usr/bin/env python3
"""dpo_fsdp_ref.py - what TRL 1.16's DPOTrainer reference model costs per rank under FSDP2
(real torch FSDP2 on the CPU over gloo, 2 and 4 processes).

The policy is dist_gloo.py's small Llama (LLAMA_CFG: hidden 256, 3 layers, vocab 1000, untied,
fp32, sdpa), sharded by accelerate 1.15's own fsdp2_prepare_model exactly as dist_gloo.py's
accelerate_fsdp2() calls it (units: each LlamaDecoderLayer, embed_tokens, the tail [norm,
lm_head] with reshard_after_forward=False, the root; under peft the tail is [lm_head] alone and
the final norm falls to the root: accelerate's _find_final_norm does not see through peft).  The reference, the two ways TRL runs it:

  A  full reference copy: a second Llama (same seed, same weights) prepared by TRL's own
     trl.models.utils.prepare_fsdp(ref_model, accelerator) with a stand-in accelerator (a real
     accelerate FullyShardedDataParallelPlugin(fsdp_version=2, ...)): for FSDP2 that is ONE
     fully_shard(ref_model, reshard_after_forward=plugin's, mp_policy=MixedPrecisionPolicy(),
     ignored_params=set()) on the whole model, then ref_model.eval().  The policy trains fully
     (AdamW foreach over all its parameters).
  B  PEFT: the policy wrapped by peft LoRA r 8 on q_proj,v_proj (seeded as dist_gloo's lora
     cases) before fully_shard; no copy: the reference is the same FSDP2-sharded policy run
     under `with policy.disable_adapter():` (what trl.trainer.utils.use_adapter(model, None)
     does).  AdamW over the adapters.

A step (TRL's DPOTrainer._compute_loss, batch 2 = [chosen, rejected], seq 64, ids random per
rank seeded by rank, use_cache=False):
  policy forward with grad -> per-token log-probs -> their sum per sequence (graph kept alive);
  reference forward under torch.no_grad() (A: ref_model(...), B: disable_adapter + policy(...))
  -> per-token log-probs -> sum per sequence (only that is kept);
  DPO sigmoid loss (beta 0.1) -> backward -> AdamW step -> zero_grad(set_to_none=True).
The log-probs two ways (--heads):
  logits  the brief's: the model's full logits (B, S, V) fp32, log_softmax, gathered at the
          labels (the logits and the log-softmax dropped once the log-probs are taken)
  fused   TRL 1.16's own: trl.trainer.utils.add_fused_lm_head on the policy (its base model for
          B, outputs=log_probs,entropy,mean_logits,is_top1 as DPOTrainer) and on the reference
          (log_probs), then model(..., labels=labels, fused_lm_head=True).log_probs: no (B,S,V)
          logits kept, the LM head is run in [tokens, 32768-vocab] tiles (one tile here, but
          the tile buffer is allocated 32768 wide whatever the vocabulary)

Live bytes: dist_gloo.py's method (torch.profiler profile_memory records from before the models
are built, c10's exact running total through exact_cpu_total(), gloo's scratch taken out by
address: its allocations(), live_bytes(), is_gloo_scratch()).  Two steps; step 2 measured:
  start        live bytes when step 2 begins (resident: shards, optimizer state, batch)
  before_ref   live bytes just before the reference forward starts (policy graph alive)
  ref_peak     the largest live bytes from there to the end of the reference forward (log-probs
               taken, its outputs dropped), with the op of that record and what is alive then
  after_ref    live bytes right after it
  step_peak    the largest live bytes in the whole step (forward, ref, backward, optimizer)
plus the setup: live bytes before and after the reference is built and prepared (its own share,
also summed from its shards), and snapshots of every FSDP2 unit (unsharded or not, bytes held;
the comm context's retained all-gather buffer) at the reference forward's final norm, right
after the reference forward, and right before it.  Before the reference forward (as before each
step) a barrier, gc and a 0.1 s pause let gloo's worker thread drop the finished Work that may
still hold FSDP2's last forward all-gather buffer (a gloo artefact; nothing is allocated).

Usage: python3 bench/accuracy/dpo_fsdp_ref.py [--worlds 2,4] [--cases A,B] [--reshard true,false]
       [--heads logits,fused] [--out FILE.json] [--md FILE.md]
"""
import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rowlib  # noqa: E402  (write_results)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dist_gloo import (BATCH, LLAMA_CFG, LORA_R, SEQ, accelerate_fsdp2, alive_at, allocations,  # noqa: E402
                       exact_cpu_total, free_port, is_gloo_scratch, live_before, live_bytes)

BETA = 0.1
POLICY_FUSED_OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1")  # DPOTrainer.__init__


def make_llama():
    import transformers
    cfg = transformers.LlamaConfig(**LLAMA_CFG)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg), cfg


def make_policy(case, head):
    model, cfg = make_llama()
    if case == "B":
        import peft
        torch.manual_seed(0)  # lora_A's init, as dist_gloo's lora cases
        model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0,
                                                           target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    if head == "fused":  # DPOTrainer.__init__: on the base model under peft
        from trl.trainer.utils import add_fused_lm_head
        add_fused_lm_head(model.get_base_model() if case == "B" else model, outputs=POLICY_FUSED_OUTPUTS)
    return model, cfg


def make_ref(reshard, head):
    """TRL's full reference copy: the same Llama, (fused head), trl.models.utils.prepare_fsdp."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from trl.models.utils import prepare_fsdp
    ref, _ = make_llama()
    if head == "fused":
        from trl.trainer.utils import add_fused_lm_head
        add_fused_lm_head(ref)  # DPOTrainer.__init__: default outputs ("log_probs",)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=reshard,
                                            auto_wrap_policy="transformer_based_wrap")
    acc = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None,
                                parallelism_config=None, device=torch.device("cpu"))
    return prepare_fsdp(ref, acc)


def local_bytes(model):
    """Bytes of the model's own tensors on this rank: each parameter's local shard storage (FSDP2's
    padded shard), each buffer."""
    from torch.distributed.tensor import DTensor
    seen, n = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        loc = t.to_local() if isinstance(t, DTensor) else t
        st = loc.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            n += st.nbytes()
    return n


def unit_states(model):
    """Every FSDP2 unit of the model (each param group once): unsharded or not, the bytes of its
    unsharded parameters' storage now allocated, of its shards; and the all-gather output the
    root's comm context still holds (FSDP2 keeps the last forward all-gather's flat buffer until
    the next unit's copy-out or the root's post-forward)."""
    from torch.distributed.fsdp import FSDPModule
    out, seen, ag = [], set(), {}
    names = {id(mod): n or "(root)" for n, mod in model.named_modules()}
    for name, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        st = m._get_fsdp_state()
        for pg in st._fsdp_param_groups:
            if id(pg) in seen:
                continue
            seen.add(id(pg))
            unsh = sum(t.untyped_storage().nbytes() for p in pg.fsdp_params
                       for t in getattr(p, "all_gather_outputs", []) or [])
            shard = sum(p._sharded_param_data.untyped_storage().nbytes() for p in pg.fsdp_params)
            full = sum(p._orig_size.numel() * p.orig_dtype.itemsize for p in pg.fsdp_params)
            out.append(dict(unit="+".join(names.get(id(mod), "?") for mod in pg.modules), n_params=len(pg.fsdp_params), state=pg._sharded_state.name,
                            unsharded_bytes_allocated=unsh, shard_bytes=shard, full_bytes=full,
                            reshard_after_forward=pg.post_forward_mesh_info is not None))
            ags = pg.comm_ctx.all_gather_state
            if ags is not None:
                buf = ags.all_gather_result.all_gather_output
                ag[id(buf.untyped_storage())] = buf.untyped_storage().nbytes()
    return dict(units=out, retained_all_gather_output_bytes=sum(ag.values()),
                unsharded_total=sum(u["unsharded_bytes_allocated"] for u in out))


def classify(ctx):
    if "FSDP::all_gather_copy_out" in ctx:
        return "FSDP2 unsharded parameters (all_gather_copy_out)"
    if "FSDP::all_gather" in ctx:
        return "FSDP2 flat all-gather output (FSDP::all_gather)"
    if "FSDP::" in ctx:
        return "FSDP2 other: " + [p for p in ctx.split(" > ") if "FSDP::" in p][-1][:80]
    return None


def alive_groups(raw, t_at, t0, top=20):
    """The blocks alive at t_at: the total allocated before t0 (resident), and those allocated
    since, by kind (FSDP2's buffers) or by the op that allocated them (dist_gloo.alive_at)."""
    a = alive_at(raw, t_at, t0, top=top, classify=classify)
    return dict(allocated_before=a["before_step2"], allocated_since=a["step2_total"], groups=a["step2_groups"])


def per_token_logps(model, ids, head, fused_kwargs=None):
    """(per-token log-probs (B, S-1), output kept) the two ways."""
    if head == "fused":
        out = model(input_ids=ids, labels=ids, use_cache=False, fused_lm_head=True)
        return out.log_probs, out
    logits = model(input_ids=ids, use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return lp, None


def rank_main(rank, world, port, case, reshard, head, result_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.profiler import ProfilerActivity, profile
    m, snaps = {}, {}
    ref = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        exact_cpu_total()
        policy, cfg = make_policy(case, head)
        policy.train()
        gc.collect()
        m["ref_prep0"] = time.time_ns()
        if case == "A":  # TRL prepares the reference in __init__, the policy at train start
            ref = make_ref(reshard, head)
            gc.collect()
        m["ref_prep1"] = time.time_ns()
        ref_share_shards = local_bytes(ref) if ref is not None else 0  # (no allocation)
        policy = accelerate_fsdp2(policy, "fsdp" if reshard else "fsdp-no-reshard", False)
        gc.collect()
        m["pol_prep1"] = time.time_ns()
        policy_shards = local_bytes(policy)
        opt = torch.optim.AdamW([q for q in policy.parameters() if q.requires_grad], lr=1e-4, foreach=True)
        ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(rank))
        ref_model = ref if case == "A" else policy
        norm = ref_model.model.norm if case == "A" else policy.get_base_model().model.norm
        hook_state = {"on": False}

        def at_ref_norm(mod, inp, out):  # the reference forward's final norm: units' state
            if hook_state["on"]:
                snaps.setdefault("at_ref_final_norm", {"policy": unit_states(policy),
                                                       "ref": unit_states(ref) if ref is not None else None})

        norm.register_forward_hook(at_ref_norm)
        losses, logps = [], []
        for step in range(2):
            dist.barrier()  # as dist_gloo: let gloo's threads drop the last step's work objects
            gc.collect()
            time.sleep(0.2)
            m[(step, "start")] = time.time_ns()
            pol_lp, pol_out = per_token_logps(policy, ids, head)
            pol_seq = pol_lp.sum(dim=1)
            # FSDP2 drops its last forward all-gather buffer at the root's post-forward, but gloo's
            # worker thread may still hold the Work (and so the buffer) for a while: as before each
            # step, a barrier, gc and a pause let it go (the barrier's 4-byte tensor is freed at once;
            # on CUDA the caching allocator takes the block back when FSDP2 drops it)
            dist.barrier()
            gc.collect()
            time.sleep(0.1)
            m[(step, "ref0")] = time.time_ns()
            if step == 1:
                snaps["before_ref"] = {"policy": unit_states(policy),
                                       "ref": unit_states(ref) if ref is not None else None}
                hook_state["on"] = True
            with torch.no_grad():
                ctxm = policy.disable_adapter() if case == "B" else contextlib.nullcontext()
                with ctxm:
                    ref_lp, ref_out = per_token_logps(ref_model, ids, head)
                ref_seq = ref_lp.sum(dim=1)
                del ref_lp  # TRL keeps ref_outputs (fused: log_probs, label_mask) to the end of _compute_loss
            hook_state["on"] = False
            m[(step, "ref1")] = time.time_ns()
            if step == 1:
                snaps["after_ref"] = {"policy": unit_states(policy),
                                      "ref": unit_states(ref) if ref is not None else None}
            ch, rj = pol_seq.chunk(2)
            rch, rrj = ref_seq.chunk(2)
            loss = -torch.nn.functional.logsigmoid(BETA * ((ch - rch) - (rj - rrj))).mean()
            logps.append([pol_seq.detach().tolist(), ref_seq.tolist()])
            loss.backward()
            m[(step, "bwd")] = time.time_ns()
            losses.append(float(loss.detach()))
            del loss, pol_lp, pol_seq, pol_out, ref_seq, ref_out, ch, rj, rch, rrj
            opt.step()
            opt.zero_grad(set_to_none=True)
            m[(step, "end")] = time.time_ns()
    raw = allocations(prof)
    allocs, unseen, residual = live_bytes(raw)

    def live_at(t):  # the live bytes after the last record before t
        return live_before(allocs, t)

    def window(t0, t1):
        w = [a for a in allocs if t0 <= a[0] < t1]
        if not w:
            return live_at(t0), t0, "none"
        pk = max(w, key=lambda a: a[1])
        top = max(pk[1], live_at(t0))
        return top, pk[0], pk[2][-200:]

    s0, r0, r1, b1, e1 = (m[(1, k)] for k in ("start", "ref0", "ref1", "bwd", "end"))
    ref_peak, t_rpk, where_rpk = window(r0, r1)
    step_peak, t_spk, where_spk = window(s0, e1)
    ag_in_ref = [(a[1], a[3]) for a in raw if r0 <= a[0] < r1 and a[1] > 0 and "FSDP::all_gather" in a[3]
                 and not is_gloo_scratch(a[3])]
    # DTensor.full_tensor() outside FSDP2's hooks (TRL's fused head on a still-sharded lm_head)
    dt_in_ref = [(a[1], a[3]) for a in raw if r0 <= a[0] < r1 and a[1] > 0 and "_c10d_functional::all_gather" in a[3]
                 and not is_gloo_scratch(a[3])]
    res = dict(rank=rank, world=world, case=case, reshard_after_forward=reshard, head=head,
               setup=dict(live_before_ref_prep=live_at(m["ref_prep0"]), live_after_ref_prep=live_at(m["ref_prep1"]),
                          ref_share_measured=live_at(m["ref_prep1"]) - live_at(m["ref_prep0"]),
                          ref_share_from_shards=ref_share_shards, policy_own_bytes_from_shards=policy_shards,
                          live_after_policy_prep=live_at(m["pol_prep1"]),
                          live_step1_start=live_at(m[(0, "start")]),
                          ref_prep_alive=alive_groups(raw, m["ref_prep1"], m["ref_prep0"], top=8)),
               step2=dict(start=live_at(s0), before_ref=live_at(r0), ref_peak=ref_peak,
                          ref_peak_over_before=ref_peak - live_at(r0), after_ref=live_at(r1),
                          after_ref_over_before=live_at(r1) - live_at(r0), step_peak=step_peak,
                          step_peak_phase=("policy forward" if t_spk < r0 else "reference forward" if t_spk < r1
                                           else "backward" if t_spk < b1 else "optimizer step"),
                          ref_peak_where=where_rpk, step_peak_where=where_spk,
                          before_ref_alive=alive_groups(raw, r0, s0, top=8),
                          ref_peak_alive=alive_groups(raw, t_rpk, r0),
                          step_peak_alive=alive_groups(raw, t_spk, s0),
                          ref_all_gathers=dict(n=len(ag_in_ref), bytes=sum(a[0] for a in ag_in_ref),
                                               ops=sorted({a[1].split(" > ")[-1][:90] for a in ag_in_ref})[:12]),
                          ref_dtensor_gathers=dict(n=len(dt_in_ref), bytes=sum(a[0] for a in dt_in_ref))),
               snapshots=snaps, losses=losses, logps=logps,
               gloo_peak=max(a[3] for a in allocs) if allocs else 0,
               unseen_frees=[dict(size=u[0], ctx=u[1][-120:], gloo=u[4]) for u in unseen.values()],
               residual=residual)
    with open(os.path.join(result_dir, f"r{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run_case(world, case, reshard, head):
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(rank_main, args=(world, port, case, reshard, head, d), nprocs=world, join=True,
                           start_method="spawn")
        return [json.load(open(os.path.join(d, f"r{r}.json"))) for r in range(world)]


def hand_sizes(worlds):
    """The Llama's bytes by hand (fp32): every parameter, its per-rank shard (dim 0 padded to a
    multiple of the world), the adapters."""
    h, i, L, V = LLAMA_CFG["hidden_size"], LLAMA_CFG["intermediate_size"], LLAMA_CFG["num_hidden_layers"], \
        LLAMA_CFG["vocab_size"]
    hd = h // LLAMA_CFG["num_attention_heads"]
    kv = LLAMA_CFG["num_key_value_heads"] * hd
    shapes = [(V, h)] + L * [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i), (h,), (h,)] + [(h,), (V, h)]
    n = lambda s: s[0] * (s[1] if len(s) > 1 else 1)  # noqa: E731
    total = sum(n(s) for s in shapes)
    layer = sum(n(s) for s in shapes[1:10])
    out = dict(params=total, param_bytes=4 * total, layer_params=layer, embed_params=V * h, lm_head_params=V * h,
               rotary_inv_freq_bytes=4 * (hd // 2),
               lora_params=L * LORA_R * (h + h + h + kv), lora_bytes=4 * L * LORA_R * (h + h + h + kv))
    for w in worlds:
        pad = lambda s: -(-s[0] // w) * (s[1] if len(s) > 1 else 1)  # noqa: E731
        out[f"shard_bytes_w{w}"] = 4 * sum(pad(s) for s in shapes)
    return out


def fmt_units(snap):
    """A unit snapshot in a line: each unit U (unsharded) or s (sharded), bytes unsharded, the
    retained all-gather buffer."""
    if not snap:
        return ""
    us = " ".join(f"{u['unit'].split('.')[-1]}:{'U' if u['state'] == 'UNSHARDED' else 's'}" for u in snap["units"])
    return f"{us}; unsharded {snap['unsharded_total']:,}, retained all-gather buffer " \
           f"{snap['retained_all_gather_output_bytes']:,}"


def markdown(doc):
    h = doc["hand"]
    v = doc["versions"]
    L = ["# TRL 1.16 DPOTrainer reference model under FSDP2: per-rank bytes (CPU, gloo)", "",
         f"Generated by `python3 bench/accuracy/dpo_fsdp_ref.py --worlds {','.join(str(w) for w in doc['worlds'])} "
         f"--out FILE.json --md FILE.md` ({doc['secs']} s). Machine: {doc['machine']}; "
         + ", ".join(f"{k} {x}" for k, x in v.items()) + ".", "",
         f"Model: dist_gloo.py's LLAMA_CFG {doc['llama_cfg']} (fp32, sdpa), batch {doc['batch']} x seq {doc['seq']}, "
         f"use_cache=False, LoRA r {doc['lora_r']} on q_proj,v_proj (case B), DPO sigmoid beta {doc['beta']}, "
         "AdamW(foreach=True), two steps, step 2 measured.  `raf` = the plugin's reshard_after_forward.  "
         "`head`: logits = full (B,S,V) logits + log_softmax + gather (the brief's); fused = TRL 1.16's own "
         "add_fused_lm_head / fused_lm_head=True.", "",
         "Hand sizes (fp32): " + ", ".join(f"{k} {x:,}" for k, x in h.items()) + ".", "",
         "## Setup: resident bytes before anything runs", "",
         "| head | world | case | raf | rank | live before ref prepared | ref share (measured) | ref share (its shards+buffers) "
         "| policy own (shards+buffers) | live after policy prepared | step-1 start | step-2 start |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in doc["rows"]:
        for r in row["ranks"]:
            s = r["setup"]
            L.append(f"| {row['head']} | {row['world']} | {row['case']} | {row['reshard_after_forward']} | {r['rank']} | "
                     f"{s['live_before_ref_prep']:,} | {s['ref_share_measured']:,} | {s['ref_share_from_shards']:,} | "
                     f"{s['policy_own_bytes_from_shards']:,} | {s['live_after_policy_prep']:,} | "
                     f"{s['live_step1_start']:,} | {r['step2']['start']:,} |")
    L += ["", "## Step 2", "",
          "| head | world | case | raf | rank | start | before ref | ref peak (over before) | after ref (over before) "
          "| step peak (phase) | FSDP2 all-gathers in ref fwd (allocs, bytes) | DTensor full_tensor in ref fwd |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in doc["rows"]:
        for r in row["ranks"]:
            st = r["step2"]
            L.append(f"| {row['head']} | {row['world']} | {row['case']} | {row['reshard_after_forward']} | {r['rank']} | "
                     f"{st['start']:,} | {st['before_ref']:,} | {st['ref_peak']:,} ({st['ref_peak_over_before']:+,}) | "
                     f"{st['after_ref']:,} ({st['after_ref_over_before']:+,}) | {st['step_peak']:,} "
                     f"({st['step_peak_phase']}) | {st['ref_all_gathers']['n']}, {st['ref_all_gathers']['bytes']:,} | "
                     f"{st['ref_dtensor_gathers']['bytes']:,} |")
    L += ["", "## Where the reference forward peaks, and what is alive then (rank 0)", "",
          "Blocks allocated since the reference forward began, by kind (FSDP2's buffers) or by the op that made "
          "them; 'before' = everything alive when it began.", "",
          "| head | world | case | raf | op at the peak | before | FSDP2 unsharded params | FSDP2 flat all-gather "
          "output | other (largest) |", "|---|---|---|---|---|---|---|---|---|"]
    for row in doc["rows"]:
        r = row["ranks"][0]
        a = r["step2"]["ref_peak_alive"]
        g = {k: b for b, n, k in a["groups"]}
        unsh = sum(b for k, b in g.items() if k.startswith("FSDP2 unsharded"))
        flat = sum(b for k, b in g.items() if k.startswith("FSDP2 flat"))
        other = "; ".join(f"{k} {b:,}" for b, n, k in a["groups"] if not k.startswith("FSDP2 u")
                          and not k.startswith("FSDP2 f"))[:260]
        L.append(f"| {row['head']} | {row['world']} | {row['case']} | {row['reshard_after_forward']} | "
                 f"`{r['step2']['ref_peak_where'][-70:]}` | {a['allocated_before']:,} | {unsh:,} | {flat:,} | {other} |")
    L += ["", "## FSDP2 units (rank 0, step 2)", "",
          "U = unsharded, s = sharded; 'unsharded' = bytes of unsharded parameter storage allocated; 'retained "
          "all-gather buffer' = the flat all-gather output FSDP2's comm context still holds.", "",
          "| head | world | case | raf | model | before the ref forward | at the ref forward's final norm | "
          "right after the ref forward |", "|---|---|---|---|---|---|---|---|"]
    for row in doc["rows"]:
        sn = row["ranks"][0]["snapshots"]
        for who in ("policy", "ref"):
            if sn["before_ref"][who] is None:
                continue
            L.append(f"| {row['head']} | {row['world']} | {row['case']} | {row['reshard_after_forward']} | {who} | "
                     + " | ".join(fmt_units(sn[k][who]) for k in ("before_ref", "at_ref_final_norm", "after_ref"))
                     + " |")
    L += ["", "Frees the profiler did not record (last reference dropped on a gloo worker thread; found from the "
          "exact total), per rank:", ""]
    n = 0
    for row in doc["rows"]:
        for r in row["ranks"]:
            for u in r["unseen_frees"]:
                n += 1
                L.append(f"- {row['head']} w{row['world']} {row['case']} raf={row['reshard_after_forward']} "
                         f"r{r['rank']}: {u['size']:,} B `{u['ctx'][-90:]}`{' (gloo scratch)' if u['gloo'] else ''}")
    if not n:
        L.append("none.")
    L.append("")
    L.append("Losses (per rank, step 1 / step 2) and the residual of the exact total: " + "; ".join(
        f"{row['head']} w{row['world']} {row['case']} raf={row['reshard_after_forward']}: "
        + ", ".join(f"{x[0]:.6f}/{x[1]:.6f}" for x in sorted({tuple(r['losses']) for r in row['ranks']}))
        + f" (residual {max(r['residual'] for r in row['ranks'])})" for row in doc["rows"]) + ".")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--cases", default="A,B")
    ap.add_argument("--reshard", default="true,false")
    ap.add_argument("--heads", default="logits,fused")
    ap.add_argument("--out", default=None, help="the rows as JSON")
    ap.add_argument("--md", default=None, help="the tables as markdown (a '## Reading' section already there is kept)")
    a = ap.parse_args()
    worlds = [int(w) for w in a.worlds.split(",")]
    rows = []
    t_all = time.time()
    for head in a.heads.split(","):
        for w in worlds:
            for case in a.cases.split(","):
                for rs in [x == "true" for x in a.reshard.split(",")]:
                    t0 = time.time()
                    res = run_case(w, case, rs, head)
                    rows.append(dict(world=w, case=case, reshard_after_forward=rs, head=head, ranks=res,
                                     secs=round(time.time() - t0, 1)))
                    for r in res:
                        s, st = r["setup"], r["step2"]
                        print(f"{head:6s} w{w} {case} raf={str(rs):5s} r{r['rank']}: ref share {s['ref_share_measured']:>9,}"
                              f" (shards {s['ref_share_from_shards']:>9,}) start {st['start']:>10,} before_ref "
                              f"{st['before_ref']:>10,} ref_peak {st['ref_peak']:>10,} (+{st['ref_peak_over_before']:,})"
                              f" after_ref {st['after_ref']:>10,} (+{st['after_ref_over_before']:,}) step_peak "
                              f"{st['step_peak']:>10,} [{st['step_peak_phase']}] ref all-gathers "
                              f"{st['ref_all_gathers']['n']} {st['ref_all_gathers']['bytes']:,} B, full_tensor "
                              f"{st['ref_dtensor_gathers']['bytes']:,} B", flush=True)
                    print(f"    ({rows[-1]['secs']} s) ref peak at: {res[0]['step2']['ref_peak_where'][-120:]}",
                          flush=True)
    import importlib.metadata as md
    vers = {p: md.version(p) for p in ("torch", "transformers", "peft", "accelerate", "trl")}
    doc = dict(versions=vers, machine=f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}",
               llama_cfg=LLAMA_CFG, lora_r=LORA_R, batch=BATCH, seq=SEQ, beta=BETA, hand=hand_sizes(worlds),
               worlds=worlds, rows=rows, secs=round(time.time() - t_all, 1))
    print(json.dumps(doc["hand"]), f"total {doc['secs']} s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    text = markdown(doc)
    if a.md:
        rowlib.write_results(a.md, text)  # (its hand-written reading kept)
    else:
        print(text)


if __name__ == "__main__":
    main()
