#!/usr/bin/env python3
"""moe_cuda.py - the two CUDA facts memplan's --ep plan rests on that a CPU run cannot show
(bench/accuracy/ep_gloo_results.md, "memplan against these"), on one GPU.

  python3 bench/gpu/moe_cuda.py --out FILE.json [--budget-s S]

  chunk_cat  FSDP2's reduce-scatter copy-in, torch.ops.fsdp.chunk_cat_mixed_dtype, of bf16 expert
             gradients (Mixtral-shaped stacks: E experts' gate_up (E, 2F, h) and down (E, h, F))
             into an fp32 input of num_chunks rows, as foreach_reduce makes it under
             MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32).  On the CPU it casts each
             gradient first (an aten::empty_like per gradient); memplan plans no such temporary.
             Recorded: every block the caching allocator hands out during the call, and
             max_memory_allocated above what was allocated before it.
  grouped_mm transformers' grouped_mm experts forward and backward (MixtralExperts,
             experts_implementation "grouped_mm", bf16 and fp32) on R routed rows: every block
             allocated in the backward with its size and whether it is alive at the end, and the
             weight gradients' strides (a gradient that breaks the parameter's layout would be
             copied by AccumulateGrad).

Each row is written to FILE as it finishes (gpu_json.py).  Without a GPU: exits 0 writing
{"status": "skipped"}.  Nothing is fetched.
"""
import argparse
import time

import gpu_json

T0 = time.perf_counter()

# (experts, hidden, ffn, chunks): Mixtral-8x7B's 8 experts at a small width, and the tiny Mixtral
# of bench/accuracy/ep_gloo.py (4 local experts, h 256, F 512) over 2 efsdp ranks
CHUNK_CASES = [(4, 256, 512, 2), (4, 256, 512, 1), (8, 1024, 3584, 4), (2, 4096, 14336, 2)]
# (experts, hidden, ffn, rows, dtype)
GMM_CASES = [(4, 256, 512, 256, "bfloat16"), (4, 256, 512, 256, "float32"), (8, 1024, 3584, 4096, "bfloat16")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=60)
    a = ap.parse_args()
    res = gpu_json.start(a.out, "chunk_cat")
    if res is None:
        return
    import torch
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  (registers fsdp:: ops)
    res["grouped_mm"] = []
    dev = torch.device("cuda")

    def trace_len():
        return sum(len(d) for d in torch.cuda.memory._snapshot()["device_traces"])

    def blocks(i0):
        tr = [e for d in torch.cuda.memory._snapshot()["device_traces"] for e in d][i0:]
        out, live = [], {}
        for e in tr:
            if e["action"] == "alloc":
                live[e["addr"]] = len(out)
                out.append([e["size"], False])
            elif e["action"] == "free_requested" and e["addr"] in live:
                out[live.pop(e["addr"])][1] = True
        return [[sz, not freed] for sz, freed in out]  # [bytes, alive at the end]

    torch.cuda.memory._record_memory_history(max_entries=100000)
    for E, h, F, chunks in CHUNK_CASES:
        if time.perf_counter() - T0 > a.budget_s:
            res.setdefault("skipped", []).append(["chunk_cat", E, h, F, chunks])
            continue
        row = {"experts": E, "hidden": h, "ffn": F, "chunks": chunks}
        try:
            grads = [torch.randn(E, 2 * F, h, device=dev, dtype=torch.bfloat16),
                     torch.randn(E, h, F, device=dev, dtype=torch.bfloat16)]
            n = sum(g.numel() for g in grads)
            out = torch.empty(chunks, n // chunks, device=dev, dtype=torch.float32)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            i0 = trace_len()
            torch.ops.fsdp.chunk_cat_mixed_dtype(grads, dim=0, num_chunks=chunks, out=out)
            torch.cuda.synchronize()
            row.update(status="ok", grads_bytes=n * 2, out_bytes=n * 4,
                       peak_above_bytes=torch.cuda.max_memory_allocated() - before, blocks=blocks(i0))
            del grads, out
        except Exception as e:  # noqa: BLE001  (a row says what failed; the others still run)
            row.update(status="error", error="%s: %s" % (type(e).__name__, e))
        res["chunk_cat"].append(row)
        gpu_json.save(a.out, res)

    try:
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    except Exception as e:  # noqa: BLE001
        res["grouped_mm_error"] = "%s: %s" % (type(e).__name__, e)
        MixtralExperts = None
    for E, h, F, R, dt in GMM_CASES if MixtralExperts else []:
        if time.perf_counter() - T0 > a.budget_s:
            res.setdefault("skipped", []).append(["grouped_mm", E, h, F, R, dt])
            continue
        row = {"experts": E, "hidden": h, "ffn": F, "rows": R, "dtype": dt}
        try:
            cfg = MixtralConfig(hidden_size=h, intermediate_size=F, num_local_experts=E, num_experts_per_tok=1)
            cfg._experts_implementation = "grouped_mm"
            dtype = getattr(torch, dt)
            m = MixtralExperts(cfg).to(device=dev, dtype=dtype)
            strides = {}
            for name, p in m.named_parameters():
                p.register_hook(lambda g, name=name: strides.__setitem__(name, [list(g.stride()), g.is_contiguous()]))
            x = torch.randn(R, h, device=dev, dtype=dtype, requires_grad=True)
            idx = torch.randint(0, E, (R, 1), device=dev)
            w = torch.ones(R, 1, device=dev, dtype=dtype)
            for _ in range(2):  # a warm-up, then the recorded one
                m.zero_grad(set_to_none=True)
                y = m(x, idx, w)
                g = torch.ones_like(y)
                torch.cuda.synchronize()
                i0 = trace_len()
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                y.backward(g)
                torch.cuda.synchronize()
            row.update(status="ok", weight_grad_strides=strides, backward_blocks=blocks(i0),
                       backward_peak_above_bytes=torch.cuda.max_memory_allocated() - before,
                       weight_bytes={n: p.numel() * p.element_size() for n, p in m.named_parameters()})
            del m, x, y, g
        except Exception as e:  # noqa: BLE001
            row.update(status="error", error="%s: %s" % (type(e).__name__, e))
        res["grouped_mm"].append(row)
        gpu_json.save(a.out, res)
    torch.cuda.memory._record_memory_history(enabled=None)
    res["status"] = "ok"
    gpu_json.save(a.out, res)


if __name__ == "__main__":
    main()
