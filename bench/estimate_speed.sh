#!/bin/sh
# Times `memplan estimate` on the bundled Llama-2-70B-shaped model (target: under
# 50 ms per run) and on GPT-2 small; prints the median of 11 runs of the whole
# command (process start, model parse, tensor program, two replays, report).
set -eu
cd "$(dirname "$0")/.."
BIN=${1:-./memplan}
[ -x "$BIN" ] || { echo "build first: make" >&2; exit 2; }
for spec in "models/llama-70b.json --seq 4096 --batch 1" "models/llama-70b.json --seq 4096 --batch 8 --checkpoint every:1" \
            "models/gpt2-124m.json --batch 8" "models/hf/llama-2-70b.json --seq 4096"; do
    times=""
    for i in 1 2 3 4 5 6 7 8 9 10 11; do
        t0=$(date +%s%N)
        # shellcheck disable=SC2086
        $BIN estimate $spec >/dev/null
        t1=$(date +%s%N)
        times="$times $(( (t1 - t0) / 1000 ))"
    done
    med=$(printf '%s\n' $times | sort -n | sed -n 6p)
    printf 'estimate %-60s median %7.2f ms (11 runs)\n' "$spec" "$(echo "$med / 1000" | bc -l)"
done
