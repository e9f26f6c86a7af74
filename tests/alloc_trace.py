"""alloc_trace.py MEMPLAN: the caching allocator model's request stream (MEMPLAN_ALLOC_TRACE)
follows PyTorch's order, and its simulation agrees with an independent one.

1. bench/alloc/cca_ref.py, a Python allocator written from CUDACachingAllocator.cpp (not from
   alloc_sim.c), replays memplan's own trace and must reach memplan's peak_reserved_bytes
   exactly: two implementations of the same rules on the same requests.
2. The warm-up step's optimizer state comes at its first optimizer.step, one tensor per moment
   (torch/optim/adam.py _init_group: state["exp_avg"] and state["exp_avg_sq"], each
   torch.zeros_like(param), parameter by parameter; sgd.py: one momentum_buffer): for AdamW two
   requests of half the state per trainable parameter, for SGD with momentum one; none in setup,
   none in the second (measured) step.
3. The backward thread's cuBLAS workspace (one per cuBLAS handle and stream, handles per thread:
   aten/src/ATen/cuda/CublasHandlePool.cpp): one more --workspace request in the warm-up's
   backward, right after the first linear's first allocation there; none in the second step.
4. A node's transient made of several tensors is as many requests (gelu_new's forward: two).
Exit 0 when all hold; else the first failure and exit 1.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "alloc"))
import cca_ref  # noqa: E402

MEMPLAN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "memplan")
WS = 33554432  # --workspace: sm90's 32 MiB (CUBLAS_WORKSPACE_CONFIG :4096:8)
fails = []


def run(cfg, *args):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.txt")
        env = dict(os.environ, MEMPLAN_ALLOC_TRACE=path)
        cmd = [MEMPLAN, "estimate", os.path.join(ROOT, cfg), "--workspace", str(WS), "--json"] + list(args)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit("alloc_trace: %s: rc %d: %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
        with open(path) as f:
            lines = [ln.split() for ln in f if ln.strip()]
        return json.loads(r.stdout), lines, path, " ".join(cmd[2:])


def check(ok, what):
    if not ok:
        fails.append(what)


def steps(lines):
    """[[(phase, fields)] per step]"""
    out, phase = [], ""
    for w in lines:
        if w[0] == "m" and w[1] == "step":
            out.append([])
        elif w[0] == "m":
            phase = w[1]
        else:
            out[-1].append((phase, w))
    return out


# (config, args, trainable parameters, state tensors per parameter)
# GPT-2: 12 blocks x 12 tensors (ln_1, c_attn, c_proj, ln_2, c_fc, mlp c_proj: weight and bias
# each) + wte, wpe, ln_f weight and bias = 148, every one trainable (lm_head is wte).
CASES = [
    ("models/hf/gpt2.json", ["--batch", "2", "--seq", "256", "--precision", "amp-bf16"], 148, 2),
    ("models/hf/gpt2.json", ["--batch", "2", "--seq", "256", "--precision", "bf16", "--checkpoint", "layers"], 148, 2),
    ("models/hf/gpt2.json", ["--batch", "2", "--seq", "128", "--optimizer", "sgd-momentum"], 148, 1),
]

for cfg, args, n_params, parts in CASES:
    rep, lines, path, name = run(cfg, *args)
    mem = rep["memory"]
    # 1. the independent simulation over memplan's own requests
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(" ".join(w) + "\n" for w in lines))
    al, _ = cca_ref.run(cca_ref.read_trace(f.name))
    os.unlink(f.name)
    check(max(al.peak_reserved, mem["peak_allocated_bytes"]) == mem["peak_reserved_bytes"],
          "%s: cca_ref's peak reserved %d, memplan's %d" % (name, al.peak_reserved, mem["peak_reserved_bytes"]))
    st = steps(lines)
    check(len(st) == 2, "%s: %d steps traced, want 2 (warm-up, measured)" % (name, len(st)))
    # 2. the optimizer state: at the warm-up's optimizer.step, per moment
    state = [(ph, w) for ph, w in st[0] if w[0] == "a" and w[3] == "opt_state"]
    check(all(ph == "optimizer.step" for ph, _ in state),
          "%s: optimizer state made in %s, want optimizer.step" % (name, sorted({ph for ph, _ in state})))
    check(len(state) == parts * n_params,
          "%s: %d optimizer-state requests, want %d x %d" % (name, len(state), parts, n_params))
    by_param = {}
    for _, w in state:
        by_param.setdefault(w[1], []).append(int(w[2]))
    check(all(len(set(v)) == 1 for v in by_param.values()),
          "%s: a parameter's moments differ in size" % name)
    check(not any(w[0] == "a" and w[3] == "opt_state" for _, w in st[1]),
          "%s: optimizer state requested again in the measured step" % name)
    # 3. the backward's workspace: after the first linear's first backward allocation
    ws = [i for i, (ph, w) in enumerate(st[0]) if w[0] == "a" and w[3] == "workspace"]
    check(len(ws) == 2 and [int(st[0][i][1][2]) for i in ws] == [WS, WS],
          "%s: %d workspace requests in the warm-up, want 2 of %d B" % (name, len(ws), WS))
    if len(ws) == 2:
        ph, w = st[0][ws[1]]
        prev = st[0][ws[1] - 1][1]
        first_bwd = next(i for i, (p, x) in enumerate(st[0]) if p == "backward" and x[0] == "a" and x[4] == "linear")
        check(ph == "backward" and ws[1] == first_bwd + 1 and prev[0] == "a",
              "%s: the backward's workspace comes at event %d (%s), want right after %d" % (name, ws[1], ph, first_bwd))
    check(not any(w[0] == "a" and w[3] == "workspace" for _, w in st[1]),
          "%s: a workspace requested in the measured step" % name)

# 4. a node's transient parts are requests of their own: gelu_new's forward (transformers
# activations.py NewGELUActivation) makes pow(x, 3) and 0.044715 * pow(x, 3) alive together,
# each the size of x: GPT-2 bf16, batch 2 x 256, x = 2 * 256 * 3072 elements x 2 B = 3,145,728 B,
# two requests, not one of 6,291,456 B.
rep, lines, path, name = run("models/hf/gpt2.json", "--batch", "2", "--seq", "256", "--precision", "bf16")
fwd = [int(w[2]) for ph, w in steps(lines)[0] if ph == "forward" and w[0] == "a" and w[3] == "tmp"
       and w[5] == "h.0.mlp.act"]
check(fwd == [3145728, 3145728], "%s: h.0.mlp.act's forward transient requested as %s, want 2 x 3145728" % (name, fwd))

if fails:
    sys.exit("alloc_trace: " + fails[0] + ("" if len(fails) == 1 else " (+%d more)" % (len(fails) - 1)))
print("alloc_trace: %d cases ok" % len(CASES))
