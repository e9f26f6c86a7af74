#!/bin/sh
# Times plan, suggest, estimate and check on long chains (issue 13: plan/suggest on a
# 100,000-block model in under 10 s; issue 24: estimate and check through folds too, the
# optimal DP at --slots 100000, and a repeat nested past the model's 131,072 ops refused).
# Models are the bundled tiny-test and gpt2-124m with their repeated block repeated N times
# (N + 2 blocks: the embedding and the head), and gemma-2-2b and gemma-3-1b with N layers
# (layers that alternate: sliding and global attention, folded by period); suggest on gemma
# runs on a narrow copy (hidden 32, vocabulary 32,000: 1.6 G parameters at N = 100,000) that
# fits one GPU.  Prints, per run, the blocks, the exit status, wall seconds, CPU seconds
# (user + system) and peak RSS.  One run each: these are slow, and the machine's load shows
# in wall time (CPU time is the figure to compare on a shared machine).
# Usage: sh bench/speed/scale.sh [./memplan] [N...]   (default N: 1000 10000 100000)
set -eu
cd "$(dirname "$0")/../.."
BIN=${1:-./memplan}
[ -x "$BIN" ] || { echo "build first: make" >&2; exit 2; }
[ $# -gt 0 ] && shift
SIZES=${*:-1000 10000 100000}
T=$(mktemp -d "${TMPDIR:-/tmp}/memplan-scale.XXXXXX")
trap 'rm -rf "$T"' EXIT
printf '%-46s %7s %4s %8s %8s %8s\n' run blocks exit wall_s cpu_s rss_MiB
timeit() {
    label=$1 blocks=$2
    shift 2
    /usr/bin/time -f "%e %U %S %M" -o "$T/time" "$BIN" "$@" >"$T/out" 2>"$T/err" && ec=$? || ec=$?
    read -r wall user sys rss <<EOT
$(tail -n 1 "$T/time")
EOT
    printf '%-46s %7d %4d %8.2f %8.2f %8d\n' "$label" "$blocks" "$ec" "$wall" \
        "$(awk "BEGIN { print $user + $sys }")" $((rss / 1024))
}
for n in $SIZES; do
    sed "s/\"repeat\": 2,/\"repeat\": $n,/" models/tiny-test.json >"$T/tiny.json"
    sed "s/\"repeat\": 12,/\"repeat\": $n,/" models/gpt2-124m.json >"$T/gpt2.json"
    timeit "plan tiny-test x$n --gpu t4 --batch 1024" $((n + 2)) plan "$T/tiny.json" --gpu t4 --batch 1024
    timeit "estimate tiny-test x$n" $((n + 2)) estimate "$T/tiny.json"
    timeit "check gpt2 x$n --gpu a100-80gb --batch 1" $((n + 2)) check "$T/gpt2.json" --gpu a100-80gb --batch 1
    timeit "plan gpt2 x$n --activation-budget 1TiB" $((n + 2)) plan "$T/gpt2.json" --activation-budget 1TiB
    timeit "suggest tiny-test x$n --gpu t4" $((n + 2)) suggest "$T/tiny.json" --gpu t4 --no-probe
    # every data-parallel engine at 4 GPUs
    timeit "suggest tiny-test x$n --gpu t4 --gpus 4" $((n + 2)) suggest "$T/tiny.json" --gpu t4 --gpus 4 --no-probe
    # fits no single GPU: the smallest FSDP2 / ZeRO-3 world, then every engine there
    timeit "suggest gpt2 x$n --gpu a100-80gb" $((n + 2)) suggest "$T/gpt2.json" --gpu a100-80gb --no-probe
    # LoRA weighed against QLoRA (an HF config, for peft's default targets; width 64, so that
    # the frozen base fits one GPU)
    sed -e "s/\"n_layer\": 12,/\"n_layer\": $n,/" -e 's/"n_embd": 768,/"n_embd": 64,/' \
        -e 's/"n_head": 12,/"n_head": 4,/' models/hf/gpt2.json >"$T/gpt2-hf.json"
    timeit "suggest gpt2-hf d64 x$n --finetune lora --gpu a100" $((n + 2)) suggest "$T/gpt2-hf.json" \
        --gpu a100-80gb --finetune lora --no-probe
    for g in gemma-2-2b gemma-3-1b; do
        sed "s/\"num_hidden_layers\": [0-9]*/\"num_hidden_layers\": $n/" models/hf/$g.json >"$T/$g.json"
        sed -e 's/"hidden_size": [0-9]*/"hidden_size": 32/' -e 's/"intermediate_size": [0-9]*/"intermediate_size": 128/' \
            -e 's/"num_attention_heads": [0-9]*/"num_attention_heads": 2/' -e 's/"head_dim": [0-9]*/"head_dim": 16/' \
            -e 's/"num_key_value_heads": [0-9]*/"num_key_value_heads": 1/' -e 's/"vocab_size": [0-9]*/"vocab_size": 32000/' \
            -e 's/"query_pre_attn_scalar": [0-9]*/"query_pre_attn_scalar": 16/' "$T/$g.json" >"$T/$g-narrow.json"
        timeit "plan $g x$n --activation-budget 4TiB" $((n + 2)) plan "$T/$g.json" --activation-budget 4TiB
        timeit "estimate $g x$n" $((n + 2)) estimate "$T/$g.json"
        timeit "suggest $g-narrow x$n --gpu a100-40gb" $((n + 2)) suggest "$T/$g-narrow.json" --gpu a100-40gb \
            --no-probe
        # LoRA weighed against QLoRA: sqrt's segments of S blocks over units of six (folds of folds)
        if [ $g = gemma-3-1b ]; then
            timeit "suggest $g-narrow x$n --finetune lora" $((n + 2)) suggest "$T/$g-narrow.json" \
                --gpu a100-40gb --finetune lora --no-probe
        fi
    done
done
# the rotor DP at the most slots (82 blocks: its tables are step functions of memory)
timeit "plan llama-2-70b zero3 x8 nvme --slots 100000" 82 plan models/hf/llama-2-70b.json --gpu h100-80gb \
    --gpus 8 --parallel zero3 --offload params --offload-device nvme --slots 100000
# 1,000 x 1,000 GPT-2 blocks: over the 131,072 ops a model expands to (exit 3, nothing made)
timeit "estimate nested-repeats (refused)" 1000002 estimate tests/data/bad/nested-repeats.json
