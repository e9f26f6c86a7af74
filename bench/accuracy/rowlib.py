"""rowlib.py - the accuracy oracles' measured rows, kept as data (python3 standard library only).

Every oracle in bench/accuracy/ (torch_step.py, torch_saved.py, peft_step.py, dist_gloo.py,
optim_states.py) appends
what it measured to bench/accuracy/rows/<oracle>.jsonl, one JSON object a line, and
tests/replay_accuracy.py (run by `make test`, no torch needed) replays each row through
./memplan and checks memplan's figure against the torch figure within the row's tolerance.

A row:
  oracle       the script that measured it ("torch_step", ...)
  source       where the torch figure comes from (a run, or the log and section it was copied from)
  config       the model file, from the repository root; or config_json: the config itself (the
               HF keyword arguments the oracle built its model from)
  max_layers   with config: the file as load_config(config, max_layers) writes it (dropout off;
               0 = every layer), which is what both torch and memplan read; absent: the file as is
  args         memplan's arguments after the config path (`memplan estimate CONFIG ARGS...`)
  command      (optional) the command in place of estimate: "check" for a row that needs --vram
  figures      {name: {"torch": N, "extra": N, "pct": P, "abs": N}}: name is one of FIGURES
               below; torch is torch's figure (bytes, or a count of parameters) as measured;
               extra the bytes CUDA keeps beyond the CPU run that measured it (memplan models
               CUDA); memplan must be within abs (in the figure's unit) + pct % of torch + extra
               (pct and abs: what memplan achieved when the row was measured, plus the rounding
               of figures copied from a log)
  recorded     memplan's figures when the row was measured (for the report only)
  versions     torch, transformers, peft, memplan commit, machine
  disagrees    (rare) {"memplan": {name: N}, "why": text, "seen": commit}: a row the current memplan
               misses, kept and said rather than its tolerance widened: the replay lists it as
               KNOWN, and fails once memplan's figure moves (fixed, or further off), so that the
               mark is looked at again
"""
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS_DIR = os.path.join(ROOT, "bench", "accuracy", "rows")
MIB = 1 << 20

# the layer-count keys of the HF configs (n_layers: DistilBERT)
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "n_layers")


def load_config(path, max_layers=0):
    """The config as both sides read it: dropout off; with max_layers, at most that many
    layers (every layer is lowered the same way, so a few show the per-layer modelling
    at the real widths, and the fake run is quick)."""
    with open(path) as f:
        d = json.load(f)
    _cap(d, max_layers)
    if isinstance(d.get("text_config"), dict):  # multimodal checkpoints: the language model's config
        _cap(d["text_config"], max_layers)
    return d


def _cap(d, max_layers):
    """load_config on one (sub)config, in place."""
    if max_layers:
        for k in LAYER_KEYS:
            if isinstance(d.get(k), int) and d[k] > max_layers:
                d[k] = max_layers
        for k in ("layer_types", "no_rope_layers"):  # per-layer lists (gemma3, smollm3 ...) follow the count
            if isinstance(d.get(k), list):
                d[k] = d[k][:max_layers]
    for k, v in list(d.items()):  # dropout off: CPU masks are not CUDA's (torch_step.py's module doc)
        if ("drop" in k) and isinstance(v, (int, float)) and not isinstance(v, bool) and k != "summary_first_dropout":
            d[k] = 0.0


# ---- what CUDA keeps beyond the CPU run (the oracles run on the CPU; memplan models CUDA) ----

T5_TYPES = {"t5", "mt5", "umt5"}  # encoder-decoders with T5's position-bias attention
# eager softmax without dtype=float32 on unmasked (encoder) scores; GPT-2's is plain too, but its
# causal mask is an fp32 tensor under amp, so the scores it is added to are fp32 on both devices
PLAIN_SOFTMAX = {"bert", "roberta", "distilbert"}


def cuda_only_bytes(cfg, b, s, prec, attn, ck, tgt=0):
    """What CUDA autocast keeps beyond what CPU autocast keeps, for this row (bytes, why): the
    layers that keep their activations (every layer with ck none, those not checkpointed with
    layers:N; none with layers).  memplan follows CUDA; the bench runs CPU autocast (see torch_step_results.md).
      gelu_new calls torch.pow, on CUDA's fp32 list only: pow saves an fp32 copy of x (4N
      instead of x's 2N), tanh(u) and 1+tanh(u) are fp32 (4N each instead of 2N), the output
      is fp32 and the next Linear saves its bf16 cast (2N, as on the CPU): +6N per layer,
      N = b*s*ffn.
      a plain F.softmax on bf16 scores (BERT, RoBERTa, DistilBERT eager attention: no mask) runs
      in fp32 on CUDA: fp32 probabilities (4 b a s^2) and their bf16 cast (2 b a s^2) instead of
      bf16 probabilities: +4 b a s^2 (GPT-2's scores are fp32 on both: + its fp32 causal mask)."""
    ck = ck.split("+")[0]  # layers[:N]+offload: the same layers keep their activations
    if prec != "amp-bf16" or not (ck == "none" or ck.startswith("layers:")):
        return 0, ""
    if cfg.get("model_type") in T5_TYPES:
        if ck != "none":
            return 0, ""
        return t5_cuda_only_bytes(cfg, b, s, attn, tgt)
    layers = next((cfg[k] for k in LAYER_KEYS if isinstance(cfg.get(k), int)), 0)
    if ck.startswith("layers:"):  # every N-th layer checkpointed (0, N, 2N, ...): the others keep theirs
        layers -= -(-layers // int(ck[7:]))
    h = cfg.get("hidden_size") or cfg.get("n_embd") or cfg.get("dim") or 0
    act = str(cfg.get("activation_function") or cfg.get("hidden_act") or "")
    extra, why = 0, []
    if act == "gelu_new":
        ffn = cfg.get("n_inner") or cfg.get("intermediate_size") or 4 * h
        extra += 6 * b * s * ffn * layers
        why.append("gelu_new pow")
    if attn == "eager" and cfg.get("model_type") in PLAIN_SOFTMAX:
        heads = cfg.get("n_head") or cfg.get("num_attention_heads") or cfg.get("n_heads") or 0
        extra += 4 * b * heads * s * s * layers
        why.append("fp32 softmax")
    return extra, " + ".join(why)


def t5_cuda_only_bytes(cfg, b, s, attn, tgt):
    """T5 under amp-bf16 (modeling_t5.py):
      gated-gelu (gelu_new) in every layer of both stacks: as above, and the fp32 output is also
      saved by the gate's mul (fp32 instead of bf16): +8N per layer, N = b * len * d_ff (len: s
      in the encoder, the target length in the decoder); the mul's product is then fp32 on CUDA,
      so the cast to wo's dtype copies nothing (on the CPU a transient fp32 copy);
      eager cross-attention: scores + the bf16 zeros bias are bf16, so CUDA's softmax is fp32
      (its output and the bf16 cast P@V saves) where the CPU's is bf16: +4 b a t s per decoder
      layer (self-attention scores are fp32 on both: + the fp32 position bias)."""
    enc = cfg.get("num_layers", 6)
    dec = cfg.get("num_decoder_layers") or enc
    t = tgt or s
    extra, why = 0, []
    act = cfg.get("dense_act_fn") or ""
    ffp = cfg.get("feed_forward_proj") or ("relu" if cfg.get("model_type") == "t5" else "gated-gelu")
    if act == "gelu_new" or (not act and ffp == "gated-gelu") or ffp == "gelu_new" or ffp == "gated-gelu_new":
        extra += 8 * b * cfg.get("d_ff", 2048) * (enc * s + dec * t)
        why.append("gelu_new pow")
    if attn == "eager":
        extra += 4 * b * cfg.get("num_heads", 8) * t * s * dec
        why.append("fp32 cross softmax")
    return extra, " + ".join(why)


def _memory(d):
    return d["memory"]


# memplan's figure of each name, from `memplan estimate ... --json`
FIGURES = {
    "peak": lambda d: _memory(d)["peak_allocated_bytes"] - _memory(d)["workspace_bytes"],
    "peak_requested": lambda d: _memory(d)["peak_requested_bytes"],  # dist_gloo.py's (bytes asked for)
    "activations": lambda d: _memory(d)["activations_bytes"],
    "saved": lambda d: sum(layer["activation_bytes"] for layer in d["layers"]),
    "trainable_params": lambda d: d["model"]["trainable_params"],
    "params": lambda d: d["model"]["params"],
    "optimizer_state": lambda d: _memory(d)["optimizer_bytes"],  # optim_states.py's (state bytes)
    "host_pinned": lambda d: _memory(d).get("host_pinned_bytes", 0),  # torch_step.py --offload
    # peft_step.py qlora-bytes: a 4-bit base's storage (weights less the fp32 adapters)
    "qlora_base": lambda d: _memory(d)["weights_bytes"] - 4 * d["model"]["trainable_params"],
    # dpo_step.py: the reference forward's peak (memory.phases, --trainer dpo)
    "ref_forward_peak": lambda d: _memory(d)["phases"]["reference_forward"]["peak_allocated_bytes"]
    - _memory(d)["workspace_bytes"],
    # lf_dpo_step.py: the policy's own step (its forward and backward, the reference's forward apart)
    "policy_step_peak": lambda d: _memory(d)["phases"]["policy_step"]["peak_allocated_bytes"]
    - _memory(d)["workspace_bytes"],
    # grpo_step.py: transformers' generate call's peak (memory.phases, --trainer grpo)
    "generation_peak": lambda d: _memory(d)["phases"]["generation"]["peak_allocated_bytes"]
    - _memory(d)["workspace_bytes"],
    # grpo_step.py: the policy's no-grad forward for the old log-probs (steps_per_generation > accumulation)
    "old_forward_peak": lambda d: _memory(d)["phases"]["old_logprobs_forward"]["peak_allocated_bytes"]
    - _memory(d)["workspace_bytes"],
}


def git_commit():
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return r.stdout.strip()


def _key(r):
    return json.dumps([r.get("config"), r.get("config_json"), r.get("max_layers"), r["args"]], sort_keys=True)


def save_rows(oracle, rows, path=None):
    """What an oracle run measured, into rows/<oracle>.jsonl (or path): a row with the same config
    and settings as an earlier one replaces it (the newer measurement wins), the others are kept.
    An earlier row's `disagrees` mark stays on a new row that carries none when torch measured the
    same figures again: the miss is unchanged, and the replay still checks memplan against it."""
    path = path or os.path.join(ROWS_DIR, oracle + ".jsonl")
    new = {_key(r): dict(r, oracle=oracle) for r in rows}
    earlier = read_rows(path) if os.path.exists(path) else []
    for r in earlier:
        n = new.get(_key(r))
        if n is not None and r.get("disagrees") and "disagrees" not in n and _torch_figures(n) == _torch_figures(r):
            n["disagrees"] = r["disagrees"]
    old = [r for r in earlier if _key(r) not in new]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for r in old + list(new.values()):
            f.write(json.dumps(r, sort_keys=True) + "\n")
    return path


def _torch_figures(row):
    return {name: (f.get("torch"), f.get("extra", 0)) for name, f in row.get("figures", {}).items()}


def figure(torch_value, memplan_value, extra=0):
    """A figure of a row just measured: the tolerance is what memplan achieved (exact bytes)."""
    return {"torch": int(torch_value), "extra": int(extra), "abs": abs(int(memplan_value) - int(torch_value) - int(extra))}


def run_versions(**libs):
    """The versions a row was measured with: the given libraries, memplan's commit, the machine."""
    import platform
    return dict(libs, memplan=git_commit(), python=platform.python_version(),
                machine="%s, %d cores" % (platform.machine(), os.cpu_count() or 0))


def write_results(path, text):
    """Write a results file, keeping its hand-written "## Reading" section (from that heading to
    the end) across reruns."""
    keep = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        if "\n## Reading" in old:
            keep = old[old.index("\n## Reading"):]
    with open(path, "w") as f:
        f.write(text + keep)


def read_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def config_file(row, tmpdir):
    """The file memplan reads for this row (written under tmpdir when the row edits or carries it)."""
    if "config_json" in row:
        d = row["config_json"]
    elif "max_layers" in row:
        d = load_config(os.path.join(ROOT, row["config"]), row["max_layers"])
    else:
        return os.path.join(ROOT, row["config"])
    fd, path = tempfile.mkstemp(suffix=".json", dir=tmpdir)
    with os.fdopen(fd, "w") as f:
        json.dump(d, f)
    return path


def run_memplan(memplan, row, tmpdir):
    """memplan's JSON report for the row (or raises RuntimeError) and the command line run.  A
    model without a k/v cache (encoders, ViT) refuses --use-cache (exit 2): it is dropped, as
    the oracles do."""
    cfg = config_file(row, tmpdir)
    cmd = [memplan, row.get("command", "estimate"), cfg] + list(row["args"])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode == 2 and "--use-cache" in r.stderr and "--use-cache" in cmd:
        i = cmd.index("--use-cache")
        cmd = cmd[:i] + cmd[i + 2:]
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise RuntimeError("exit %d: %s" % (r.returncode, r.stderr.strip()))
    return json.loads(r.stdout), cmd


def check(row, report):
    """[(figure, memplan, expected, allowed, ok)] for each of the row's figures."""
    out = []
    for name, f in sorted(row["figures"].items()):
        got = FIGURES[name](report)
        want = f["torch"] + f.get("extra", 0)
        allowed = f.get("abs", 0) + f.get("pct", 0.0) / 100.0 * abs(want)
        out.append((name, got, want, allowed, abs(got - want) <= allowed))
    return out
