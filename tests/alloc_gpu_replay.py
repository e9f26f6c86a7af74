"""alloc_gpu_replay.py [ASIM_REPLAY]: memplan's caching-allocator rules (src/estimate/alloc_sim.c)
over the H200's own request sequence give the H200's max_memory_reserved.

The input is the allocator's record of each GPU kit matrix row (bench/alloc/traces/, written on
the H200 by the kit's worker: every block handed out and taken back), replayed through
alloc_sim.c by bench/alloc/asim_replay.c, peaks reset at "step 1" as the kit resets them; the
expected figure is the row's torch.cuda.max_memory_reserved() from the kit's report (bench/results/
gpu-2026-11-28b-traces.json for the default settings, from the same run as the traces;
gpu-2026-11-28b-expandable.json for expandable_segments:True, from an earlier call of the same
session).  So neither the input nor the expected value comes from memplan's estimate.

ALLOWED is what the rules achieved when this test was written (2026-11-30), in MiB: a change to
alloc_sim.c that moves a row further off fails here.  Exact rows stay exact.  The misses and
their causes as far as known:
  default  the records miss blocks the worker's earlier rows left (cuBLAS workspaces: the
           allocated peaks differ by up to 12 MB), QLoRA -4.9 % (bitsandbytes; not found);
  expandable  gpt2/bf16/layers +8.6 %, qwen2-0.5b/amp-bf16/layers +8.0 %, and the two Llama LoRA
           checkpointed rows +10.0 % / -9.1 %, which are each other's figure to the byte (why
           is not known: the expected figures come from another call than the records, and the
           records lack when frees complete, `F` since); QLoRA -18.4 % (bitsandbytes, as
           above).  The kit now records the settings (env.alloc_conf) and free_completed; the
           next GPU run's expandable records and figures from one call settle these
           (bench/gpu/README.md).
Exit 0 when every row is within ALLOWED; else the rows that are not, and exit 1.
"""
import json
import os
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASIM = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bench", "alloc", "asim_replay")
MIB = 1 << 20

# (settings, traces, report, {row: allowed |asim - GPU| in MiB})
SETS = [
    ("", "bench/alloc/traces/h200-2026-11-28-default.tgz", "bench/results/gpu-2026-11-28b-traces.json", {
        "gpt2/fp32/none": 0, "gpt2/fp32/layers": 156, "gpt2/amp-bf16/none": 28, "gpt2/amp-bf16/layers": 100,
        "gpt2/bf16/none": 22, "gpt2/bf16/layers": 56, "qwen2-0.5b/fp32/none": 86, "qwen2-0.5b/fp32/layers": 22,
        "qwen2-0.5b/amp-bf16/none": 10, "qwen2-0.5b/amp-bf16/layers": 148, "qwen2-0.5b/bf16/none": 114,
        "qwen2-0.5b/bf16/layers": 154, "llama-3.2-1b/lora/bf16/layers": 0, "llama-3.2-1b/lora/bf16-amp/none": 4,
        "llama-3.2-1b/lora/bf16-amp/layers": 4, "llama-3.2-1b/qlora/amp-bf16/layers": 502}),
    ("expandable_segments:True", "bench/alloc/traces/h200-2026-11-28-expandable.tgz",
     "bench/results/gpu-2026-11-28b-expandable.json", {
        "gpt2/fp32/none": 0, "gpt2/fp32/layers": 20, "gpt2/amp-bf16/none": 0, "gpt2/amp-bf16/layers": 0,
        "gpt2/bf16/none": 0, "gpt2/bf16/layers": 520, "qwen2-0.5b/fp32/none": 0, "qwen2-0.5b/fp32/layers": 0,
        "qwen2-0.5b/amp-bf16/none": 0, "qwen2-0.5b/amp-bf16/layers": 1180, "qwen2-0.5b/bf16/none": 0,
        "qwen2-0.5b/bf16/layers": 20, "llama-3.2-1b/lora/bf16/layers": 980, "llama-3.2-1b/lora/bf16-amp/none": 0,
        "llama-3.2-1b/lora/bf16-amp/layers": 980, "llama-3.2-1b/qlora/amp-bf16/layers": 1980}),
]


def main():
    if not os.path.exists(ASIM):
        sys.exit("alloc_gpu_replay: %s is not built (make %s)" % (ASIM, os.path.relpath(ASIM, ROOT)))
    fails, n, exact = [], 0, 0
    for conf, tgz, report, allowed in SETS:
        with open(os.path.join(ROOT, report)) as f:
            rows = {r["id"]: r["torch"] for r in json.load(f)["matrix"]["rows"] if r.get("torch", {}).get("status") == "ok"}
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(os.path.join(ROOT, tgz)) as t:
                t.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(tmp)
            for rid, mib in sorted(allowed.items()):
                path = os.path.join(tmp, rid.replace("/", "_") + ".trace")
                if rid not in rows or not os.path.exists(path):
                    fails.append("%s %s: no GPU figure or no record" % (conf or "default", rid))
                    continue
                cmd = [ASIM, path, "--from", "step 1"] + (["--alloc-conf", conf] if conf else [])
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    fails.append("%s %s: %s" % (conf or "default", rid, r.stderr.strip()))
                    continue
                got, gpu = int(r.stdout.split()[0]), rows[rid]["peak_reserved"]
                n += 1
                exact += got == gpu
                if abs(got - gpu) > mib * MIB:
                    fails.append("%s %s: the rules give %d B over the H200's requests, the H200 %d B (%+.1f MiB, "
                                 "allowed %d)" % (conf or "default", rid, got, gpu, (got - gpu) / MIB, mib))
    for f in fails:
        print("FAIL alloc_gpu_replay: " + f)
    if not fails:
        print("ok   alloc_gpu_replay: alloc_sim.c over the H200's own requests: %d rows within what they achieved, "
              "%d to the byte" % (n, exact))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
