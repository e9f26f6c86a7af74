#!/bin/sh
# tests/golden.sh OUTDIR [BINARY]: records memplan's output (stdout, stderr, exit status) for
# every bundled model x every command with its common options, text and JSON, into OUTDIR,
# one file per run.  Used to hold a refactor to byte-identical output:
#   sh tests/golden.sh /tmp/before; (change); sh tests/golden.sh /tmp/after; diff -r /tmp/before /tmp/after
# Runs two jobs at once (GOLDEN_JOBS to change); about 10 minutes on a 2-core machine.
set -eu
out=${1:?usage: tests/golden.sh OUTDIR [BINARY]}
bin=${2:-./memplan}
mkdir -p "$out"
list=$(mktemp)
trap 'rm -f "$list"' EXIT
for m in models/*.json models/hf/*.json; do
    n=$(basename "$m" .json)
    case $m in models/hf/*) n=hf-$n ;; esac
    {
        echo "$n.est|estimate $m"
        echo "$n.est.json|estimate $m --json"
        echo "$n.est.b4sqrt|estimate $m --batch 4 --checkpoint sqrt --precision fp32 --optimizer sgd-momentum"
        echo "$n.est.layers.json|estimate $m --batch 2 --checkpoint layers --precision bf16 --json"
        echo "$n.est.lora.json|estimate $m --finetune lora --json"
        echo "$n.est.qlora|estimate $m --finetune qlora --checkpoint layers"
        echo "$n.est.zero3.json|estimate $m --gpus 8 --parallel zero3 --json"
        echo "$n.est.fsdp|estimate $m --gpus 4 --parallel fsdp --precision mixed-bf16"
        echo "$n.plan|plan $m --gpu a100-40gb"
        echo "$n.plan.json|plan $m --gpu a100-40gb --batch 4 --json"
        echo "$n.sug|suggest $m --gpu a100-80gb --no-probe"
        echo "$n.sug.json|suggest $m --gpu a100-80gb --no-probe --json"
        echo "$n.sug.lora|suggest $m --gpu l4 --no-probe --finetune lora"
        echo "$n.sug.dp.json|suggest $m --gpu h100-80gb --no-probe --gpus 8 --json"
        for e in torch hf deepspeed accelerate; do
            echo "$n.emit.$e|suggest $m --gpu h100-80gb --no-probe --emit $e"
        done
        echo "$n.check|check $m --gpu a100-40gb --batch 2"
        echo "$n.check.json|check $m --gpu t4 --batch 8 --json"
    } >>"$list"
done
for o in sgd sgd-momentum adam adamw adafactor adam8bit; do
    for p in fp32 amp-bf16 amp-fp16 bf16 mixed-bf16; do
        for m in models/tiny-test.json models/gpt2-124m.json models/hf/llama-3.2-1b.json; do
            echo "opt.$o.$p.$(basename "$m" .json)|estimate $m --optimizer $o --precision $p --json" >>"$list"
        done
    done
done
for a in sdpa flash eager; do
    echo "attn.$a|estimate models/hf/qwen2-0.5b.json --attention $a --batch 2 --json" >>"$list"
done
for c in none sqrt segments:3 every:2 layers optimal optimal-segments; do
    echo "ckpt.$c|estimate models/gpt2-124m.json --checkpoint $c --batch 8 --gpu a100-40gb" >>"$list"
done
echo "timeline.gpt2|estimate models/gpt2-124m.json --timeline $out/timeline.gpt2.svg" >>"$list"
echo "timeline.t5|plan models/hf/t5-small.json --gpu t4 --timeline $out/timeline.t5.svg" >>"$list"
echo "help|--help" >>"$list"
for c in estimate plan probe suggest check; do echo "help.$c|$c --help" >>"$list"; done
echo "help.gpus|help gpus" >>"$list"
export out bin
# shellcheck disable=SC2016
tr '\n' '\0' <"$list" | xargs -0 -P "${GOLDEN_JOBS:-2}" -n 1 sh -c '
    name=${1%%|*}; args=${1#*|}
    # word splitting of args is intended: no argument here holds a space
    set +e; $bin $args >"$out/$name.out" 2>"$out/$name.err"; echo $? >"$out/$name.rc"
' golden
echo "golden: $(ls "$out" | wc -l) files in $out"
