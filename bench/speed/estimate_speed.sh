#!/bin/sh
# Times `memplan estimate` (target: under 50 ms on a Llama-2-70B-shaped model).
# Prints, per model, the median of 11 runs of the whole command (process start,
# shared libraries, model parse, tensor program, replays, report) and the median
# of the estimator itself as measured inside the process (MEMPLAN_TIMING).
set -eu
cd "$(dirname "$0")/../.."
BIN=${1:-./memplan}
[ -x "$BIN" ] || { echo "build first: make" >&2; exit 2; }
median() { sort -n | sed -n 6p; }
for spec in "models/llama-70b.json --seq 4096 --batch 1" "models/llama-70b.json --seq 4096 --batch 8 --checkpoint every:1" \
            "models/hf/llama-2-70b.json --seq 4096" "models/gpt2-124m.json --batch 8"; do
    whole=""
    inner=""
    for i in 1 2 3 4 5 6 7 8 9 10 11; do
        t0=$(date +%s%N)
        # shellcheck disable=SC2086
        in=$(MEMPLAN_TIMING=1 $BIN estimate $spec 2>&1 >/dev/null | sed -n 's/.*estimate took \([0-9.]*\) ms.*/\1/p')
        t1=$(date +%s%N)
        whole="$whole $(( (t1 - t0) / 1000 ))"
        inner="$inner $in"
    done
    w=$(printf '%s\n' $whole | median)
    n=$(printf '%s\n' $inner | median)
    printf 'estimate %-58s command %7.2f ms   estimator %7.2f ms   (median of 11)\n' "$spec" \
        "$(awk "BEGIN{print $w/1000}")" "$n"
done
