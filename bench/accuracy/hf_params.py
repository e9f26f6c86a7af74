#!/usr/bin/env python3
"""Parameter count of a Hugging Face config as transformers builds it.

Usage: python3 bench/accuracy/hf_params.py CONFIG.json [ARCHITECTURE ...]

Instantiates each architecture (default: the config's architectures[0]) from the
config on the meta device (no memory) and prints "ARCH PARAMS": parameters counted
once each (tied weights once), as model.parameters() yields them.  These are the
expected figures of tests/test_model_hf.c.  Needs torch and transformers.  The count of the
config's own architecture is also kept as a row (bench/accuracy/rows/hf_params.jsonl, rowlib.py)
against `./memplan estimate CONFIG --json` (model.params), replayed by tests/replay_accuracy.py.
"""
import json
import os
import sys
import tempfile
import time

import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rowlib  # noqa: E402


def count(cfg_path, arch):
    with open(cfg_path) as f:
        d = json.load(f)
    cfg = transformers.AutoConfig.for_model(**d)
    cls = getattr(transformers, arch)
    with torch.device("meta"):
        model = cls(cfg)
    return sum(p.numel() for p in model.parameters())


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    with open(path) as f:
        own = json.load(f).get("architectures", [])[:1]
    archs = sys.argv[2:] or own
    for a in archs:
        n = count(path, a)
        print(a, n)
        if a in own and os.path.exists("./memplan"):  # the evidence, kept as data
            row = {"source": "bench/accuracy/hf_params.py run of %s (%s, meta device)" % (
                       time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), a),
                   "config": os.path.relpath(os.path.abspath(path), rowlib.ROOT), "args": ["--json"]}
            with tempfile.TemporaryDirectory() as tmp:
                report, _ = rowlib.run_memplan("./memplan", row, tmp)
            row["figures"] = {"params": rowlib.figure(n, report["model"]["params"])}
            row["versions"] = rowlib.run_versions(torch=torch.__version__, transformers=transformers.__version__)
            rowlib.save_rows("hf_params", [row])


if __name__ == "__main__":
    main()
