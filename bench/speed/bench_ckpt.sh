#!/bin/sh
# bench_ckpt.sh — build and run the checkpoint-planner benchmark (bench_ckpt.c).
# Usage: sh bench/speed/bench_ckpt.sh [BLOCKS [SLOTS]]   (defaults: 80 blocks, 500 slots)
# Prints timings and plan costs; it never fails on timing.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${BUILD:-$root/build}/bench
mkdir -p "$out"
${CC:-gcc} -std=c11 -O2 -Wall -Wextra -Wpedantic -D_POSIX_C_SOURCE=200809L -I"$root/src" \
    "$root/bench/speed/bench_ckpt.c" "$root/src/ckpt/ckpt.c" "$root/src/util/util.c" -lm -o "$out/bench_ckpt"
exec "$out/bench_ckpt" "$@"
