#!/usr/bin/env python3
"""Parameter count of a Hugging Face config as transformers builds it.

Usage: python3 bench/accuracy/hf_params.py CONFIG.json [ARCHITECTURE ...]

Instantiates each architecture (default: the config's architectures[0]) from the
config on the meta device (no memory) and prints "ARCH PARAMS": parameters counted
once each (tied weights once), as model.parameters() yields them.  These are the
expected figures of tests/test_model_hf.c.  Needs torch and transformers.
"""
import json
import sys

import torch
import transformers


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
    archs = sys.argv[2:]
    if not archs:
        with open(path) as f:
            archs = json.load(f).get("architectures", [])[:1]
    for a in archs:
        print(a, count(path, a))


if __name__ == "__main__":
    main()
