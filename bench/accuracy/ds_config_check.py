#!/usr/bin/env python3
"""ds_config_check.py - does `memplan suggest --emit deepspeed` load as a DeepSpeed config?

For a few suggest runs (the world memplan names for Llama-2-70B on H100s, Llama-2-7B on 8 H100s,
GPT-2 with a global batch over 4 ranks, ZeRO-3 with optimizer offload to CPU, parameter and optimizer offload to NVMe), the
emitted JSON is handed to DeepSpeed's own config class, deepspeed.runtime.config.DeepSpeedConfig
(the object deepspeed.initialize builds from a config), in a one-process gloo group with an mpu
that reports memplan's data-parallel world, so DeepSpeed's batch arithmetic
(train_batch_size = micro x accumulation x world) is checked against that world.  Then the parsed
fields are compared with memplan's JSON recommendation of the same run: ZeRO stage, micro-batch,
accumulation, global batch, bf16 / torch_autocast, offload device.

Needs deepspeed (pip); not part of make test.  Prints one line per case and exits 1 if any fails.
Usage: python3 bench/accuracy/ds_config_check.py [--memplan ./memplan]
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DataParallelMpu:
    """What DeepSpeedConfig asks an mpu for: the data-parallel world."""

    def __init__(self, world):
        self.world = world

    def get_data_parallel_world_size(self):
        return self.world

    def get_data_parallel_rank(self):
        return 0

    def get_model_parallel_world_size(self):
        return 1

    def get_sequence_parallel_world_size(self):
        return 1


def memplan(exe, args):
    r = subprocess.run([exe] + args, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memplan", default="./memplan")
    a = ap.parse_args()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    dist.init_distributed(dist_backend="gloo")

    # the world memplan names for a model that does not fit one GPU
    rc, out = memplan(a.memplan, ["suggest", "models/hf/llama-2-70b.json", "--gpu", "h100-80gb", "--no-probe",
                                  "--json"])
    world70 = None
    for alt in json.loads(out)["alternatives"]:
        m = re.match(r"--gpus (\d+) --nodes (\d+) --parallel (\S+)", alt)
        if m:
            world70 = m.groups()
    cases = []
    if world70:
        cases.append(["models/hf/llama-2-70b.json", "--gpu", "h100-80gb", "--gpus", world70[0], "--nodes",
                      world70[1]])
    else:
        print("FAIL suggest llama-2-70b --gpu h100-80gb names no world")
    cases += [["models/hf/llama-2-7b.json", "--gpu", "h100-80gb", "--gpus", "8"],
              ["models/gpt2-124m.json", "--gpu", "a100-40gb", "--gpus", "4", "--global-batch", "512"],
              ["models/gpt2-124m.json", "--gpu", "a100-40gb", "--gpus", "2", "--parallel", "zero3", "--offload",
               "optimizer"],
              ["models/gpt2-124m.json", "--gpu", "a100-40gb", "--gpus", "2", "--parallel", "zero3", "--offload",
               "params", "--offload-device", "nvme"]]
    bad = 0
    for c in cases:
        base = ["suggest"] + c + ["--no-probe"]
        rc1, js = memplan(a.memplan, base + ["--json"])
        rc2, cfg = memplan(a.memplan, base + ["--emit", "deepspeed"])
        name = "suggest " + " ".join(c) + " --emit deepspeed"
        try:
            rec = json.loads(js)["recommendation"]
            cfgd = json.loads(cfg)
            par = rec["parallel"]
            world = par["world"]
            ds = DeepSpeedConfig(cfgd, mpu=DataParallelMpu(world))
            # memplan emits the fastest DeepSpeed candidate when the recommendation is not one
            want = {"stage": {"zero1": 1, "zero2": 2, "zero3": 3}.get(par["strategy"])}
            got = dict(stage=ds.zero_optimization_stage, micro=ds.train_micro_batch_size_per_gpu,
                       accum=ds.gradient_accumulation_steps, batch=ds.train_batch_size, world=ds.world_size,
                       bf16=ds.bfloat16_config.enabled, autocast=ds.torch_autocast_enabled,
                       offload=str(ds.zero_config.offload_optimizer.device) if ds.zero_config.offload_optimizer
                       else "none")
            assert got["stage"] in (1, 2, 3), got
            assert got["batch"] == got["micro"] * got["accum"] * world, got
            if want["stage"]:  # the recommendation itself is a DeepSpeed one: the same numbers
                assert got["stage"] == want["stage"], (got, par)
                assert (got["micro"], got["accum"], got["batch"]) == (rec["micro_batch"], rec["grad_accum"],
                                                                       rec["global_batch"]), (got, rec)
                dev = par.get("offload_device", "cpu") if par.get("offload", "none") != "none" else "none"
                assert got["offload"].endswith(dev), (got, par)
                if par.get("offload") == "params":
                    assert str(ds.zero_config.offload_param.device).endswith(dev), (ds.zero_config, par)
                if got["stage"] == 3:  # memplan's plan gathers block by block: no 10^9 reuse distance
                    zc = ds.zero_config
                    assert zc.max_reuse_distance == zc.prefetch_bucket_size, zc
                if dev == "nvme":
                    assert ds.zero_config.offload_optimizer.nvme_path is not None, ds.zero_config
            assert got["bf16"] or got["autocast"], got
            print(f"ok   {name}: DeepSpeedConfig loads it, world {world}, stage {got['stage']}, micro {got['micro']}"
                  f" x accum {got['accum']} = {got['batch']}, offload {got['offload']}")
        except Exception as e:  # noqa: BLE001
            bad += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"deepspeed {deepspeed.__version__}: {len(cases) - bad} of {len(cases)} configs load")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
