#!/usr/bin/env python3
"""torch_saved_families.py - saved activation bytes of the table-added HF families, memplan vs PyTorch.

Drives bench/accuracy/torch_saved.py's measurement (saved_tensors_hooks, deduplicated by storage; CPU,
CPU autocast for amp-bf16) on small configs of the decoder families added with the family
table (qwen3, olmo2, phi3, stablelm, starcoder2, gemma2, gemma3_text, granite): hidden 256, 2
layers, 4 heads / 2 kv heads, batch 2, sequence 128.  Prints one line per case: torch's total
saved bytes, memplan's sum of layers[].activation_bytes, the difference, and with --detail the
unpaired storages on either side.

Usage (from the repository root, after `make`):
  python3 bench/accuracy/torch_saved_families.py [--memplan ./memplan] [--dump PATH] [--detail]
         [--kinds qwen3,olmo2,...] [--precisions fp32,amp-bf16,bf16]
gemma2 runs with eager attention (transformers has no SDPA path for it), the others with SDPA.
--dump is bench/accuracy/dump_saved (per-tensor listing); without it only totals are compared.
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers  # noqa: E402

import torch_saved as ts  # noqa: E402

COMMON = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=688, vocab_size=1000, max_position_embeddings=256)


def make_config(kind, dropout=0.0):
    if kind == "qwen3":
        return transformers.Qwen3Config(head_dim=64, **COMMON)
    if kind == "olmo2":
        return transformers.Olmo2Config(**COMMON)
    if kind == "phi3":
        return transformers.Phi3Config(pad_token_id=0, bos_token_id=1, eos_token_id=2, **COMMON)
    if kind == "stablelm":
        return transformers.StableLmConfig(**COMMON)
    if kind == "starcoder2":
        return transformers.Starcoder2Config(**COMMON)
    if kind == "gemma2":
        return transformers.Gemma2Config(head_dim=64, **COMMON)
    if kind == "gemma3_text":
        return transformers.Gemma3TextConfig(head_dim=64, **COMMON)
    if kind == "granite":
        return transformers.GraniteConfig(embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0,
                                          attention_multiplier=0.015625, **COMMON)
    return ORIG_MAKE_CONFIG(kind, dropout)


ORIG_MAKE_CONFIG = ts.make_config
ts.make_config = make_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memplan", default="./memplan")
    ap.add_argument("--dump", default=None)
    ap.add_argument("--detail", action="store_true")
    ap.add_argument("--kinds", default="qwen3,olmo2,phi3,stablelm,starcoder2,gemma3_text,granite,gemma2")
    ap.add_argument("--precisions", default="fp32,amp-bf16,bf16")
    ap.add_argument("--cfgdir", default="/tmp/torch_saved_families")
    ap.add_argument("--rows-out", default=os.path.join(ts.rowlib.ROWS_DIR, "torch_saved.jsonl"),
                    help="where the measured rows go as data for tests/replay_accuracy.py (rowlib.py); '' for none")
    args = ap.parse_args()
    os.makedirs(args.cfgdir, exist_ok=True)
    b, s = 2, 128
    for kind in args.kinds.split(","):
        attn = "eager" if kind == "gemma2" else "sdpa"
        for prec in args.precisions.split(","):
            tr = ts.run_torch(kind, b, s, prec, attn, 0.0)
            path = os.path.join(args.cfgdir, kind + ".json")
            ts.write_config(tr["config"], path)
            j, tensors, cmd = ts.run_memplan(args.memplan, args.dump, path, b, s, prec, attn)
            mp = collections.OrderedDict((l["name"], l["activation_bytes"]) for l in j["layers"])
            t_total, m_total = sum(tr["per_block"].values()), sum(mp.values())
            if args.rows_out:
                ts.save_row(args.rows_out, "torch_saved_families.py", kind, path, cmd, t_total, m_total)
            print("%-12s %-8s %-5s torch %10d  memplan %10d  %+.2f %%" % (
                kind, prec, attn, t_total, m_total, 100.0 * (m_total - t_total) / t_total), flush=True)
            if args.detail and tensors:
                per = ts.memplan_sets(tensors)
                for blk in tr["blocks"]:
                    tl = [dict(r, ptr=p) for p, r in tr["saved"].items() if r["block"] == blk]
                    _, et, em = ts.match(tl, per.get(blk, []))
                    for r in et:
                        print("    torch only  %s %s %s %d (%s)" % (blk, r["dtype"], list(r["shape"]), r["nbytes"],
                                                                    r["op"]))
                    for x in em:
                        print("    memplan only %s %s %d" % (blk, x[0], x[2]))


if __name__ == "__main__":
    main()
