#!/usr/bin/env python3
"""sdpa_ws.py - what SDPA's CUDA kernels allocate through the caching allocator, forward and
backward, per shape (issue 29: the attention backend's workspace).

  python3 bench/gpu/sdpa_ws.py --out FILE.json [--budget-s S]

For each case (batch, q heads, kv heads, sequence, head dim, dropout; bf16, causal, as
transformers calls it for a causal LM without a mask: k and v with kv heads and enable_gqa=True
where kv < q heads), q, k, v are made (b, heads, s, d) with requires_grad, then one warm-up
forward and backward, then a recorded one (torch.cuda.memory._record_memory_history): every
block the allocator handed out during the forward and during the backward, in order, with its
size and whether it was still alive at the phase's end; the aten op SDPA dispatched to (a
TorchDispatchMode); max_memory_allocated above the inputs in each phase.  Nothing is fetched.
Each case is written to FILE as it finishes.  Without a GPU: exits 0 writing {"status": "skipped"}.
"""
import argparse
import json
import time

import gpu_json

T0 = time.perf_counter()

# (batch, q heads, kv heads, seq, head dim, dropout); --strided: the same as GPT-2's views
STRIDED_CASES = [(8, 12, 12, 1024, 64, 0.1), (8, 12, 12, 1024, 64, 0.0), (4, 12, 12, 1024, 64, 0.0),
                 (8, 12, 12, 512, 64, 0.0), (4, 16, 16, 2048, 64, 0.0), (4, 32, 32, 1024, 128, 0.0),
                 (2, 16, 16, 1024, 256, 0.0)]
CASES = [(4, 32, 8, 1024, 64, 0.0), (4, 14, 2, 1024, 64, 0.0), (8, 12, 12, 1024, 64, 0.1), (8, 12, 12, 1024, 64, 0.0),
         (4, 32, 8, 1024, 128, 0.0), (4, 32, 32, 1024, 128, 0.0), (2, 32, 8, 2048, 128, 0.0), (1, 32, 8, 4096, 128, 0.0),
         (4, 32, 8, 2048, 64, 0.0), (2, 16, 16, 1024, 256, 0.0), (4, 32, 8, 1024, 128, 0.1), (1, 8, 8, 512, 64, 0.0)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=120)
    ap.add_argument("--strided", action="store_true",
                    help="q, k, v as GPT-2 makes them: one (b, s, 3 a d) projection split, viewed and transposed "
                         "(STRIDED_CASES; MHA only)")
    a = ap.parse_args()
    res = gpu_json.start(a.out, "cases")
    if res is None:
        return
    import torch
    import torch.nn.functional as F
    res["cudnn"] = torch.backends.cudnn.version()

    def spy_attention():
        return gpu_json.op_spy(lambda n: any(w in n for w in ("attention", "flash", "efficient", "cudnn")))

    def trace_len():
        return sum(len(d) for d in torch.cuda.memory._snapshot()["device_traces"])

    def blocks(tr, i0, i1):
        out, live = [], {}
        for e in tr[i0:i1]:
            if e["action"] == "alloc":
                live[e["addr"]] = len(out)
                out.append([e["size"], False])
            elif e["action"] == "free_requested" and e["addr"] in live:
                out[live.pop(e["addr"])][1] = True
        return [[sz, not freed] for sz, freed in out]  # [bytes, alive at the phase's end]

    for b, h, kv, s, d, p in (STRIDED_CASES if a.strided else CASES):
        if time.perf_counter() - T0 > a.budget_s:
            res.setdefault("skipped", []).append([b, h, kv, s, d, p])
            continue
        case = {"batch": b, "heads": h, "kv_heads": kv, "seq": s, "head_dim": d, "dropout": p, "strided": a.strided}
        try:
            torch.cuda.empty_cache()
            if a.strided:  # GPT2Attention: c_attn's output split, each (b, s, a, d) transposed (a view)
                qkv = torch.randn(b, s, 3 * h * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                q, k, v = (t.view(b, s, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=2))
            else:
                q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                k = torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                v = torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            kw = {"enable_gqa": True} if kv < h else {}
            for it in range(2):
                rec = it == 1
                if rec:
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
                    i0 = trace_len()
                spy = spy_attention()
                with spy:
                    o = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, **kw)
                if rec:
                    torch.cuda.synchronize()
                    case["forward_op"] = spy.ops
                    case["forward_peak_above_inputs"] = torch.cuda.max_memory_allocated() - base
                    i1 = trace_len()
                    mid = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                g = torch.randn_like(o)
                spy = spy_attention()
                with spy:
                    o.backward(g)
                if rec:
                    torch.cuda.synchronize()
                    case["backward_op"] = spy.ops
                    case["backward_peak_above_start"] = torch.cuda.max_memory_allocated() - mid
                    i2 = trace_len()
                    tr = [e for dd in torch.cuda.memory._snapshot()["device_traces"] for e in dd]
                    torch.cuda.memory._record_memory_history(enabled=None)
                    case["forward_blocks"] = blocks(tr, i0, i1)
                    case["backward_blocks"] = blocks(tr, i1, i2)
                    case["status"] = "ok"
                del o, g
                for t in ((qkv,) if a.strided else (q, k, v)):
                    t.grad = None
            del q, k, v
        except Exception as e:  # noqa: BLE001 - a case that fails is a result
            case.update(status="FAILED", error=repr(e)[:300])
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001
                pass
        res["cases"].append(case)
        gpu_json.save(a.out, res)
        print(json.dumps({k2: case.get(k2) for k2 in ("batch", "heads", "kv_heads", "seq", "head_dim", "dropout",
                                                      "forward_op", "backward_op", "status")}), flush=True)
    res["status"] = "ok"
    res["seconds"] = round(time.perf_counter() - T0, 1)
    gpu_json.save(a.out, res)


if __name__ == "__main__":
    main()
