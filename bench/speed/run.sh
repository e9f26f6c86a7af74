#!/bin/sh
# All benchmarks: estimator speed, checkpoint planner speed/quality.
set -eu
cd "$(dirname "$0")/../.."
sh bench/speed/estimate_speed.sh ./memplan
sh bench/speed/bench_ckpt.sh
