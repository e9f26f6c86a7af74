#!/bin/sh
# Builds the two binaries bench/accuracy/torch_saved.py uses and copies them to OUT:
#   $OUT/memplan      memplan as `make` builds it
#   $OUT/dump_saved   bench/accuracy/dump_saved.c: memplan's saved tensors, one JSON line each, linked with
#                     the same objects as the unit tests (make build/bench/accuracy/dump_saved)
# Usage: sh bench/accuracy/torch_saved_build.sh [OUT]   (default /tmp/tsbuild; run from the repository root)
set -eu
OUT=${1:-/tmp/tsbuild}
mkdir -p "$OUT"
make -s memplan build/bench/accuracy/dump_saved
cp memplan build/bench/accuracy/dump_saved "$OUT/"
echo "built $OUT/memplan $OUT/dump_saved"
