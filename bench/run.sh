#!/bin/sh
# All benchmarks: estimator speed, checkpoint planner speed/quality.
set -eu
cd "$(dirname "$0")/.."
sh bench/estimate_speed.sh ./memplan
sh bench/bench_ckpt.sh
