#!/usr/bin/env python3
"""devbytes.py - the device bytes beside the caching allocator that one GPU can show (issue 29
item 2): the CUDA context, the cuBLAS workspace, the kernel SDPA picks per dtype / head dim /
mask, and NCCL's communicator with one rank.

  python3 bench/gpu/devbytes.py --out FILE.json [--budget-s S]

rows, each {"what": ...}:
  context   NVML's used bytes before this process touched CUDA, cudaMemGetInfo's used bytes right
            after torch made its context (memplan: docs/memory-facts.md#cuda-context's table)
  cublas    the first matmul in fp32, then in bf16, on the current stream: allocated bytes above
            the operands and the result (the workspace torch takes from its allocator), and used
            bytes above reserved (the handle, the kernels loaded) (#cublas-workspace)
  sdpa      scaled_dot_product_attention forward + backward on (1, 8, 256, d) q, k, v with
            requires_grad, per dtype, head dim and mask: the aten op it dispatched to (torch's
            choice; memplan's mp_sdpa_backend says which it expects, #sdpa-backend)
  nccl      init_process_group("nccl", world_size=1, device_id) and one all-reduce of 1 MiB: the
            used bytes they add less what the allocator reserved.  One rank has no peers, so no
            ring/tree buffers: this is the communicator's own structures (docs/memory-facts.md#nccl
            counts them as small); several GPUs are needed for the buffers.
Each row is written to FILE as it finishes.  Without a GPU: exits 0 writing {"status": "skipped"}.
"""
import argparse
import os
import time

import gpu_json

T0 = time.perf_counter()
SDPA_DTYPES = ["bfloat16", "float16", "float32"]
SDPA_DIMS = [64, 128, 256]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=60)
    a = ap.parse_args()
    nvml_used = None
    try:  # before this process makes a CUDA context
        import pynvml
        pynvml.nvmlInit()
        nvml_used = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
    except Exception:  # noqa: BLE001 - NVML is optional
        pass
    res = gpu_json.start(a.out, "rows")
    if res is None:
        return
    import torch
    import torch.nn.functional as F
    free, total = torch.cuda.mem_get_info()
    major, minor = torch.cuda.get_device_capability(0)
    res.update(cc="%d.%d" % (major, minor), cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
               nccl_env={k: v for k, v in os.environ.items() if k.startswith("NCCL_")})
    res["rows"].append({"what": "context", "nvml_used_before": nvml_used, "used_after_context": total - free,
                        "context_bytes": total - free - nvml_used if nvml_used is not None else None})
    gpu_json.save(a.out, res)

    def used():
        torch.cuda.synchronize()
        f, t = torch.cuda.mem_get_info()
        return t - f

    for dt in (torch.float32, torch.bfloat16):  # the workspace: once per handle and stream
        a0, r0, u0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), used()
        x = torch.ones(1024, 1024, device="cuda", dtype=dt)
        y = x @ x
        u1 = used()
        tensors = x.numel() * x.element_size() + y.numel() * y.element_size()
        res["rows"].append({"what": "cublas", "dtype": str(dt).split(".")[1],
                            "workspace_allocated": torch.cuda.memory_allocated() - a0 - tensors,
                            "outside_allocator": (u1 - u0) - (torch.cuda.memory_reserved() - r0)})
        del x, y
        gpu_json.save(a.out, res)

    for dname in SDPA_DTYPES:
        for d in SDPA_DIMS:
            for masked in (False, True):
                if time.perf_counter() - T0 > a.budget_s * 0.7:
                    break
                row = {"what": "sdpa", "dtype": dname, "head_dim": d, "masked": masked}
                try:
                    dt = getattr(torch, dname)
                    q, k, v = (torch.randn(1, 8, 256, d, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
                    mask = torch.ones(256, 256, device="cuda", dtype=torch.bool).tril() if masked else None
                    spy = gpu_json.op_spy(lambda n: "scaled_dot_product" in n and "backward" not in n)
                    with spy:
                        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not masked)
                    o.sum().backward()
                    row.update(status="ok", ops=spy.ops or ["math (no fused op seen)"])
                    del q, k, v, o, mask
                except Exception as e:  # noqa: BLE001 - the case's result
                    row.update(status="FAILED", error=repr(e)[:200])
                res["rows"].append(row)
                gpu_json.save(a.out, res)
    torch.cuda.empty_cache()

    row = {"what": "nccl"}
    try:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        u0, r0 = used(), torch.cuda.memory_reserved()
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
        u1 = used()
        t = torch.ones(1 << 18, device="cuda")
        dist.all_reduce(t)
        u2 = used()
        row.update(status="ok", nccl=".".join(str(x) for x in torch.cuda.nccl.version()),
                   after_init=(u1 - u0), after_all_reduce=(u2 - u0),
                   reserved_delta=torch.cuda.memory_reserved() - r0,
                   outside_allocator=(u2 - u0) - (torch.cuda.memory_reserved() - r0))
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the row's result
        row.update(status="FAILED", error=repr(e)[:200])
    res["rows"].append(row)
    res["status"] = "ok"
    res["seconds"] = round(time.perf_counter() - T0, 1)
    gpu_json.save(a.out, res)


if __name__ == "__main__":
    main()
