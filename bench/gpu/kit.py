#!/usr/bin/env python3
"""kit.py - the GPU validation kit's measurements (driven by bench/gpu/run.sh).

Subcommands (each prints or writes JSON; run.sh composes the report):

  torch-step   one training configuration of a transformers model built from an HF config.json
               (random init, nothing downloaded): 1 warm-up step, then torch.cuda.reset_peak_memory_stats()
               and N measured steps; prints {peak_allocated_bytes, peak_reserved_bytes, step_ms, losses}.
               Same step as memplan's: AdamW (torch defaults, foreach on CUDA), zero_grad(set_to_none=True),
               loss from the model's own labels path, sdpa attention, the config's dropout.
               fp32: fp32 parameters; amp-bf16: torch.autocast(bfloat16) over fp32 parameters;
               bf16: the model and AdamW states in bfloat16.  Checkpointing "layers":
               model.gradient_checkpointing_enable() (transformers' default: each decoder layer).
  matrix       for each model x precision x checkpointing: memplan estimate, memplan probe (cuda; host
               for the CPU smoke), torch-step in a subprocess; writes parts/matrix.json.
  tune         memplan suggest --device 0 vs Lightning Tuner.scale_batch_size(mode="binsearch") on GPT-2;
               writes parts/tune.json.
  report       merges parts/*.json into report.json and report.md.

Without a GPU (--cpu) the matrix shrinks each config to 2 small layers, runs memplan's host backend
and PyTorch on the CPU (a smoke test: memory columns are not comparable and are left empty), and the
tuner runs a few trials on the CPU; every skipped GPU part is listed in the report.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# model, config, batch, seq (GPU sizes); the 7B runs at a small batch
MODELS = [
    ("gpt2", "models/hf/gpt2.json", 8, 1024),
    ("qwen2-0.5b", "models/hf/qwen2-0.5b.json", 4, 1024),
    ("tinyllama-1.1b", "models/hf/tinyllama-1.1b.json", 4, 1024),
    ("llama-2-7b", "models/hf/llama-2-7b.json", 1, 512),
]
PRECISIONS = ["fp32", "amp-bf16", "bf16"]
CKPTS = ["none", "layers"]


def log(*a):
    print("kit:", *a, file=sys.stderr, flush=True)


# ---- torch-step ----------------------------------------------------------------------------------

def load_config(path):
    with open(path) as f:
        cfg = json.load(f)
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def torch_step(a):
    import torch
    import transformers

    cfg = load_config(a.config)
    mt = cfg.pop("model_type")
    conf = transformers.AutoConfig.for_model(mt, **cfg)
    conf.use_cache = False
    dev = torch.device(a.device)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    out = {"ok": False, "device": a.device}
    try:
        with dev:
            model = transformers.AutoModelForCausalLM.from_config(conf, torch_dtype=dtype,
                                                                   attn_implementation="sdpa")
        model.train()
        if a.ckpt == "layers":
            model.gradient_checkpointing_enable()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        vocab = conf.vocab_size
        ids = torch.randint(0, vocab, (a.batch, a.seq), device=dev)
        labels = ids.clone()
        cuda = dev.type == "cuda"
        times, losses = [], []
        for step in range(a.steps + 1):
            if cuda:
                torch.cuda.synchronize()
                if step == 1:  # steady state: optimizer state exists, .grad is None
                    torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            if a.precision == "amp-bf16":
                with torch.autocast(dev.type, dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=labels).loss
            else:
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            if step > 0:
                times.append((t1 - t0) * 1e3)
                losses.append(float(loss))
            del loss
        out.update(ok=True, step_ms=statistics.median(times), losses=losses)
        if cuda:
            out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    except torch.OutOfMemoryError as e:  # a result, as memplan's probe reports it
        out.update(ok=False, error="out of memory: " + str(e).splitlines()[0][:200])
    print(json.dumps(out))


# ---- helpers -------------------------------------------------------------------------------------

def run(cmd, timeout, env=None):
    """(rc, stdout, stderr, seconds); rc 124 on timeout."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        return 124, e.stdout or "", (e.stderr or "") + "\ntimed out", time.perf_counter() - t0


def run_json(cmd, timeout):
    rc, out, err, secs = run(cmd, timeout)
    try:
        return rc, json.loads(out), err, secs
    except ValueError:
        return rc, None, err, secs


def gpu_info():
    """(name, total bytes) of device 0 through torch, or None."""
    try:
        import torch
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            return p.name, p.total_memory
    except Exception:  # noqa: BLE001 - any failure means: no GPU part
        pass
    return None


def profile_for(name):
    n = (name or "").upper()
    for key, prof in (("H200", "h200-141gb"), ("H100", "h100-80gb"), ("A100", "a100-80gb"), ("L40S", "l40s"),
                      ("L4", "l4"), ("A10", "a10"), ("T4", "t4"), ("4090", "rtx4090"), ("3090", "rtx3090")):
        if key in n:
            return prof
    return "h100-80gb"


def workspace_of(profile):
    with open(os.path.join(ROOT, "configs/gpus", profile + ".json")) as f:
        return json.load(f).get("cublas_workspace_bytes", 8519680)


def shrink(cfg):
    """A 2-layer, narrow version of an HF config (same family and options) for the CPU smoke."""
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
    return c


def pct(a, b):
    return None if not a or not b else round(100.0 * (a - b) / b, 2)


# ---- matrix --------------------------------------------------------------------------------------

def matrix(a):
    gpu = None if a.cpu else gpu_info()
    parts = os.path.join(a.out, "parts")
    os.makedirs(parts, exist_ok=True)
    rows, skipped = [], []
    prof = profile_for(gpu[0] if gpu else None)
    ws = workspace_of(prof)
    cfgdir = os.path.join(a.out, "configs")
    os.makedirs(cfgdir, exist_ok=True)
    models = [m for m in MODELS if not a.models or m[0] in a.models.split(",")]
    if not gpu:
        skipped.append("memplan probe on the cuda backend and torch.cuda.max_memory_allocated(): no GPU "
                       "(CPU smoke: configs shrunk to 2 layers of width 128, batch 2 x 32, host backend)")
    for name, path, batch, seq in models:
        cfg_path = os.path.join(ROOT, path)
        if not gpu:
            c = shrink(load_config(cfg_path))
            cfg_path = os.path.join(cfgdir, name + "-tiny.json")
            with open(cfg_path, "w") as f:
                json.dump(c, f, indent=1)
            batch, seq = 2, 32
        for prec in PRECISIONS:
            for ck in CKPTS:
                row = {"model": name, "config": os.path.relpath(cfg_path, ROOT), "batch": batch, "seq": seq,
                       "precision": prec, "checkpoint": ck, "device": gpu[0] if gpu else "cpu (smoke)"}
                common = [cfg_path, "--batch", str(batch), "--seq", str(seq), "--precision", prec,
                          "--checkpoint", ck, "--json"]
                rc, est, err, _ = run_json([a.memplan, "estimate"] + common + ["--gpu", prof], 120)
                if est is None:
                    row["error"] = "memplan estimate: " + err.strip()[-300:]
                    rows.append(row)
                    log(name, prec, ck, row["error"])
                    continue
                mem = est["memory"]
                row["estimate_peak_allocated_bytes"] = mem["peak_allocated_bytes"]
                row["estimate_peak_device_bytes"] = mem["peak_device_bytes"]
                if gpu and mem["peak_device_bytes"] > 0.97 * gpu[1]:
                    row["skipped"] = "memplan estimates %.1f GiB > the device's %.1f GiB" % (
                        mem["peak_device_bytes"] / 2**30, gpu[1] / 2**30)
                    rows.append(row)
                    log(name, prec, ck, "skipped:", row["skipped"])
                    continue
                backend = "cuda" if gpu else "host"
                rc, pr, err, secs = run_json([a.memplan, "probe"] + common + ["--backend", backend, "--steps",
                                             str(a.steps), "--workspace", str(ws)], a.timeout)
                if pr and "probe" in pr:
                    p = pr["probe"]
                    row.update(probe_backend=backend, probe_fits=rc == 0,
                               probe_peak_allocated_bytes=p.get("measured_peak_bytes"),
                               probe_step_ms=p.get("step_ms"), probe_device_used_before=p.get("device_used_before_bytes"),
                               probe_device_used_after=p.get("device_used_bytes"),
                               probe_gemm_tflops=p.get("gemm_tflops"))
                else:
                    row["probe_error"] = ("rc %d: " % rc) + err.strip()[-300:]
                rc, ts, err, secs = run_json([sys.executable, os.path.abspath(__file__), "torch-step", "--config",
                                              cfg_path, "--batch", str(batch), "--seq", str(seq), "--precision",
                                              prec, "--ckpt", ck, "--steps", str(a.steps), "--device",
                                              "cuda" if gpu else "cpu"], a.timeout)
                if ts and ts.get("ok"):
                    row.update(torch_step_ms=round(ts["step_ms"], 3), torch_losses=ts["losses"])
                    if "peak_allocated_bytes" in ts:
                        row["torch_peak_allocated_bytes"] = ts["peak_allocated_bytes"]
                        row["torch_peak_reserved_bytes"] = ts["peak_reserved_bytes"]
                        row["estimate_delta_pct"] = pct(row["estimate_peak_allocated_bytes"],
                                                        ts["peak_allocated_bytes"])
                        if row.get("probe_peak_allocated_bytes"):
                            row["probe_delta_pct"] = pct(row["probe_peak_allocated_bytes"],
                                                         ts["peak_allocated_bytes"])
                    if row.get("probe_step_ms") and gpu:
                        row["step_time_ratio"] = round(row["probe_step_ms"] / ts["step_ms"], 3)
                else:
                    row["torch_error"] = (ts or {}).get("error") or ("rc %d: " % rc) + err.strip()[-300:]
                rows.append(row)
                log(name, prec, ck, "estimate", row.get("estimate_peak_allocated_bytes"), "probe",
                    row.get("probe_peak_allocated_bytes"), "torch", row.get("torch_peak_allocated_bytes"),
                    row.get("torch_error", ""), row.get("probe_error", ""))
    # runs of other models (an earlier --models call into the same OUTDIR) are kept
    mpath = os.path.join(parts, "matrix.json")
    if os.path.exists(mpath):
        with open(mpath) as f:
            old = json.load(f)
        done = {r["model"] for r in rows}
        rows = [r for r in old.get("rows", []) if r["model"] not in done] + rows
        rows.sort(key=lambda r: [m[0] for m in MODELS].index(r["model"]) if r["model"] in
                  [m[0] for m in MODELS] else 99)
    with open(mpath, "w") as f:
        json.dump({"gpu": gpu[0] if gpu else None, "profile": prof, "workspace_bytes": ws, "rows": rows,
                   "skipped": skipped}, f, indent=1)


# ---- tune: memplan suggest vs Lightning's batch-size finder --------------------------------------

def lightning_tune(cfg_path, seq, cpu, max_trials):
    import torch
    import transformers
    import lightning as L
    from lightning.pytorch.tuner import Tuner

    cfg = load_config(cfg_path)
    mt = cfg.pop("model_type")
    conf = transformers.AutoConfig.for_model(mt, **cfg)
    conf.use_cache = False
    trials = []

    class Data(torch.utils.data.Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return torch.randint(0, conf.vocab_size, (seq,), generator=g)

    class Mod(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 2
            self.model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="sdpa")

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Data(1 << 16), batch_size=self.batch_size)

        def training_step(self, batch, i):
            if not trials or trials[-1] != self.batch_size:
                trials.append(self.batch_size)
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    trainer = L.Trainer(accelerator="cpu" if cpu else "gpu", devices=1, precision="bf16-mixed",
                        max_steps=10, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    t0 = time.perf_counter()
    found = Tuner(trainer).scale_batch_size(Mod(), mode="binsearch", steps_per_trial=3, init_val=2,
                                            max_trials=max_trials)
    return {"wall_s": round(time.perf_counter() - t0, 2), "trials": len(trials), "batch": found,
            "batches_tried": trials}


def tune(a):
    gpu = None if a.cpu else gpu_info()
    parts = os.path.join(a.out, "parts")
    os.makedirs(parts, exist_ok=True)
    res = {"gpu": gpu[0] if gpu else None, "skipped": []}
    cfg_path, seq = os.path.join(ROOT, "models/hf/gpt2.json"), 1024
    if gpu:
        cmd = [a.memplan, "suggest", cfg_path, "--device", "0", "--seq", str(seq), "--precision", "amp-bf16",
               "--json"]
    else:
        c = shrink(load_config(cfg_path))
        cfg_path = os.path.join(a.out, "configs", "gpt2-tiny.json")
        os.makedirs(os.path.dirname(cfg_path), exist_ok=True)
        with open(cfg_path, "w") as f:
            json.dump(c, f, indent=1)
        seq = 32
        res["skipped"].append("memplan suggest --device 0 and Lightning on the GPU: no GPU (CPU smoke: "
                              "suggest --backend host on a 24 MiB target, 3 Lightning trials on the CPU)")
        cmd = [a.memplan, "suggest", cfg_path, "--vram", "24MiB", "--context", "1MiB", "--backend", "host",
               "--seq", str(seq), "--precision", "amp-bf16", "--json"]
    rc, sg, err, secs = run_json(cmd, a.timeout)
    if sg and sg.get("recommendation"):
        r = sg["recommendation"]
        res["memplan"] = {"wall_s": round(secs, 2), "probes": sg.get("probes"), "batch": r["micro_batch"],
                          "checkpoint": r["plan"]["strategy"] if isinstance(r.get("plan"), dict) else None,
                          "probed": r.get("probed"), "command": " ".join(cmd[1:])}
    else:
        res["memplan"] = {"error": ("rc %d: " % rc) + err.strip()[-300:], "command": " ".join(cmd[1:])}
    log("memplan suggest:", res["memplan"])
    rc, out, err, secs = run([sys.executable, os.path.abspath(__file__), "lightning", "--config", cfg_path,
                              "--seq", str(seq), "--max-trials", "25" if gpu else "3"] + ([] if gpu else ["--cpu"]),
                             a.timeout)
    try:
        res["lightning"] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        res["lightning"] = {"error": ("rc %d: " % rc) + err.strip()[-400:]}
    log("lightning:", res["lightning"])
    with open(os.path.join(parts, "tune.json"), "w") as f:
        json.dump(res, f, indent=1)


def lightning_cmd(a):
    print(json.dumps(lightning_tune(a.config, a.seq, a.cpu, a.max_trials)))


# ---- report --------------------------------------------------------------------------------------

def gib(b):
    return "" if b is None else "%.3f" % (b / 2**30)


def fmt(v, f="%.1f"):
    return "" if v is None else f % v


def report(a):
    parts = os.path.join(a.out, "parts")
    data = {"schema": 1, "host": platform.node(), "python": platform.python_version()}
    for name in ("env", "checks", "matrix", "tune"):
        p = os.path.join(parts, name + ".json")
        if os.path.exists(p):
            with open(p) as f:
                data[name] = json.load(f)
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(data, f, indent=1)
    L = ["# memplan GPU validation kit", ""]
    env = data.get("env", {})
    L.append("- machine: %s; GPU: %s; started %s" % (env.get("host", "?"), env.get("gpu") or "none",
                                                       env.get("started", "?")))
    L.append("- memplan build: %s" % env.get("build", "?"))
    L.append("")
    checks = data.get("checks", {}).get("checks", [])
    if checks:
        L += ["## Checks", "", "| check | result | seconds |", "|---|---|---|"]
        for c in checks:
            L.append("| %s | %s | %s |" % (c["name"], c["result"], c.get("seconds", "")))
        L.append("")
    m = data.get("matrix")
    if m:
        L += ["## Peak memory and step time (steady-state step, reset after step 1)", "",
              "Device %s, memplan profile %s (cuBLAS workspace %d B). Bytes in GiB; Δ = (memplan − torch) / torch."
              % (m.get("gpu") or "cpu (smoke)", m["profile"], m["workspace_bytes"]), "",
              "| model | b×s | precision | ckpt | estimate | probe | torch max_allocated | Δ est % | Δ probe % "
              "| probe ms | torch ms | probe/torch | note |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in m["rows"]:
            note = r.get("skipped") or r.get("error") or r.get("torch_error") or r.get("probe_error") or ""
            L.append("| %s | %d×%d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["model"], r["batch"], r["seq"], r["precision"], r["checkpoint"],
                gib(r.get("estimate_peak_allocated_bytes")), gib(r.get("probe_peak_allocated_bytes")),
                gib(r.get("torch_peak_allocated_bytes")), fmt(r.get("estimate_delta_pct"), "%+.2f"),
                fmt(r.get("probe_delta_pct"), "%+.2f"), fmt(r.get("probe_step_ms")), fmt(r.get("torch_step_ms")),
                fmt(r.get("step_time_ratio"), "%.2f"), note.replace("|", "/")[:160]))
        for s in m.get("skipped", []):
            L.append("")
            L.append("Skipped: " + s)
        L.append("")
    t = data.get("tune")
    if t:
        L += ["## Time to a recommendation (GPT-2)", "", "| tool | wall s | probes / trials | batch found | note |",
              "|---|---|---|---|---|"]
        mp, lt = t.get("memplan", {}), t.get("lightning", {})
        L.append("| memplan suggest | %s | %s | %s | %s |" % (mp.get("wall_s", ""), mp.get("probes", ""),
                                                          mp.get("batch", ""), mp.get("error", mp.get("command", ""))))
        L.append("| Lightning scale_batch_size(binsearch) | %s | %s | %s | %s |" % (
            lt.get("wall_s", ""), lt.get("trials", ""), lt.get("batch", ""),
            lt.get("error", "tried %s" % lt.get("batches_tried", ""))[:160]))
        for s in t.get("skipped", []):
            L.append("")
            L.append("Skipped: " + s)
        L.append("")
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(L) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("torch-step")
    s.add_argument("--config", required=True)
    s.add_argument("--batch", type=int, required=True)
    s.add_argument("--seq", type=int, required=True)
    s.add_argument("--precision", choices=PRECISIONS, required=True)
    s.add_argument("--ckpt", choices=CKPTS, default="none")
    s.add_argument("--steps", type=int, default=3)
    s.add_argument("--device", default="cuda")
    for name in ("matrix", "tune"):
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
        s.add_argument("--memplan", default=os.path.join(ROOT, "memplan"))
        s.add_argument("--cpu", action="store_true", help="no GPU: the CPU smoke test")
        s.add_argument("--steps", type=int, default=3)
        s.add_argument("--timeout", type=int, default=300)
        s.add_argument("--models", default="", help="comma-separated subset of " + ",".join(m[0] for m in MODELS))
    s = sub.add_parser("lightning")
    s.add_argument("--config", required=True)
    s.add_argument("--seq", type=int, required=True)
    s.add_argument("--cpu", action="store_true")
    s.add_argument("--max-trials", type=int, default=25)
    s = sub.add_parser("report")
    s.add_argument("--out", required=True)
    a = ap.parse_args()
    {"torch-step": torch_step, "matrix": matrix, "tune": tune, "lightning": lightning_cmd, "report": report}[a.cmd](a)


if __name__ == "__main__":
    main()
