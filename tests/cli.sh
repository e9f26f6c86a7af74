#!/bin/sh
# tests/cli.sh — the command-line contract of memplan, checked from the outside
# (after jq's tests/shtest and mantest).
#
# Usage (from the repository root):  sh tests/cli.sh ./memplan
#
# Two tiers (tests/tier.h): by default (make test) the loops over every bundled model take every
# fourth model and the long models with HF layers are left out; MEMPLAN_TEST_LONG=1 (make
# test-long) runs the loops' other models and those long models, and the rest of the checks again.
#
# Prints one line per check ("ok   ..." or "FAIL ..." followed by "#" detail
# lines), then the line "N passed, M failed", and exits 1 if any check failed.
# Exit statuses (README "Exit status", memplan(1) EXIT STATUS): 0 success/fits,
# 1 does not fit, 2 usage, 3 bad input, 4 probe/device unavailable, 5 internal.
# No byte figure the estimator computes is hard-coded here: the tests compare
# memplan with itself (suggest against check, JSON totals against per-layer rows).
# JSON is parsed with python3; without it those checks are reported as skipped.

# ---- setup ----------------------------------------------------------------------------

if [ $# -ne 1 ]; then
    echo "usage: sh tests/cli.sh ./memplan" >&2
    exit 2
fi
M=$1
case $M in
    */*) case $M in /*) ;; *) M=$(pwd)/$M ;; esac ;;
    *) M=$(command -v "$M") || M=$1 ;;
esac
if [ ! -x "$M" ] || [ -d "$M" ]; then
    echo "cli.sh: '$1' is not an executable" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd) || exit 2
cd "$ROOT" || exit 2

T=$(mktemp -d "${TMPDIR:-/tmp}/memplan-cli.XXXXXX") || exit 2
trap 'rm -rf "$T"' EXIT
trap 'exit 130' INT TERM

pass=0
fail=0
skip=0
LONG=
case ${MEMPLAN_TEST_LONG:-0} in 0 | "") ;; *) LONG=yes ;; esac
TAB=$(printf '\t')
HAVE_PY=
command -v python3 >/dev/null 2>&1 && HAVE_PY=yes

ok() {
    pass=$((pass + 1))
    echo "ok   $*"
}
bad() {
    fail=$((fail + 1))
    echo "FAIL $*"
    detail
}
skipped() {
    skip=$((skip + 1))
    echo "skip $*"
}
# tier_item N: item N (0, 1, ...) of a loop over models is this run's: every fourth in the quick
# tier, the others in the long one
tier_item() {
    if [ $(($1 % 4)) -eq 0 ]; then [ -z "$LONG" ]; else [ -n "$LONG" ]; fi
}
# What the last run did, as comment lines under a FAIL.
detail() {
    echo "#    \$ memplan $cmdline"
    echo "#    exit $ec; stdout $(nlines "$T/out") line(s); stderr $(nlines "$T/err") line(s)"
    sed -n '1,6s/^/#    stderr: /p' "$T/err"
    if [ -s "$T/why" ]; then sed -n '1,6s/^/#    /p' "$T/why"; fi
}
# Number of lines, counting a last line without a newline.
nlines() { awk 'END { print NR }' "$1"; }

# run ARGS...: memplan ARGS with stdout in $T/out, stderr in $T/err, status in $ec.
run() {
    cmdline=$*
    : >"$T/why"
    "$M" "$@" >"$T/out" 2>"$T/err" && ec=$? || ec=$?
}

# expect CODE DESC ARGS...: exit status CODE and nothing on stdout for a failure.
expect() {
    want=$1
    desc=$2
    shift 2
    run "$@"
    if [ "$ec" -ne "$want" ]; then
        echo "expected exit $want" >"$T/why"
        bad "$desc: exit $want"
    elif [ "$want" -ge 2 ] && [ -s "$T/out" ]; then
        echo "a failure must print nothing on stdout" >"$T/why"
        bad "$desc: exit $want, stdout empty"
    else
        ok "$desc: exit $want"
    fi
}

# expect_line CODE DESC ARGS...: as expect, and stderr is exactly one line.
expect_line() {
    want=$1
    desc=$2
    shift 2
    run "$@"
    n=$(nlines "$T/err")
    if [ "$ec" -ne "$want" ] || [ "$n" -ne 1 ] || { [ "$want" -ge 2 ] && [ -s "$T/out" ]; }; then
        echo "expected exit $want, exactly one line on stderr, nothing on stdout" >"$T/why"
        bad "$desc: exit $want, one stderr line"
    else
        ok "$desc: exit $want, one stderr line"
    fi
}

# The JSON checker: python3 "$T/jcheck.py" MODE < report.  Exit 0 and prints what
# the mode extracts; on a problem prints the reason and exits 1.
cat >"$T/jcheck.py" <<'EOF'
import json, sys

mode = sys.argv[1]
try:
    d = json.load(sys.stdin)
except ValueError as e:
    sys.exit("stdout is not one JSON document: %s" % e)

def need(obj, keys, where):
    if not isinstance(obj, dict):
        sys.exit("%s: expected an object, got %r" % (where, type(obj).__name__))
    miss = [k for k in keys if k not in obj]
    if miss:
        sys.exit("%s: missing key(s) %s" % (where, ", ".join(miss)))

MODEL = ["name", "source", "params", "trainable_params", "n_layers"]
CONFIG = ["batch", "seq_len", "precision", "optimizer", "checkpoint"]
MEMORY = ["weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_allocated_bytes",
          "peak_reserved_bytes", "overhead_bytes", "peak_device_bytes", "peak_event"]
LAYER = ["index", "name", "type", "params", "weights_bytes", "grads_bytes", "optimizer_bytes",
         "activation_bytes", "output_bytes", "fwd_flops", "checkpointed"]
PLAN = ["strategy", "checkpoints", "segments", "activation_peak_bytes", "recompute_flops", "overhead_pct"]
CAND = ["micro_batch", "grad_accum", "global_batch", "precision", "plan", "peak_device_bytes",
        "capacity_bytes", "headroom_pct", "samples_per_s", "source"]

need(d, ["schema", "command", "model"], "top level")
if d["schema"] != 1:
    sys.exit("schema is %r, expected 1" % d["schema"])
need(d["model"], MODEL, "model")
if d["model"]["source"] not in ("memplan", "hf"):
    sys.exit("model.source is %r" % d["model"]["source"])

def memory_ok():
    need(d, ["memory"], "top level")
    m = d["memory"]
    need(m, MEMORY, "memory")
    if not m["peak_allocated_bytes"] > 0:
        sys.exit("memory.peak_allocated_bytes is not positive")
    if m["peak_device_bytes"] < m["peak_allocated_bytes"]:
        sys.exit("memory.peak_device_bytes < peak_allocated_bytes")
    if m["peak_reserved_bytes"] < m["peak_allocated_bytes"]:
        sys.exit("memory.peak_reserved_bytes < peak_allocated_bytes")

def plan_ok(p, where):
    need(p, PLAN, where)
    for s in p["segments"]:
        if not (isinstance(s, list) and len(s) == 2 and s[0] < s[1]):
            sys.exit("%s.segments: %r is not [start, end)" % (where, s))

if mode in ("estimate", "plan", "check"):
    if d["command"] != mode:
        sys.exit("command is %r, expected %r" % (d["command"], mode))
    need(d, ["config"], "top level")
    need(d["config"], CONFIG, "config")
    memory_ok()
if mode == "estimate":
    need(d, ["layers"], "top level")
    L = d["layers"]
    if not isinstance(L, list) or not L:
        sys.exit("layers: expected a non-empty array")
    for i, l in enumerate(L):
        need(l, LAYER, "layers[%d]" % i)
        if l["index"] != i:
            sys.exit("layers[%d].index is %r" % (i, l["index"]))
    if len(L) != d["model"]["n_layers"]:
        sys.exit("%d layers rows, model.n_layers %d" % (len(L), d["model"]["n_layers"]))
    if not d["model"]["params"] > 0:
        sys.exit("model.params is not positive")
    if sum(l["params"] for l in L) != d["model"]["params"]:
        sys.exit("model.params %d != sum of layers[].params %d" % (d["model"]["params"], sum(l["params"] for l in L)))
    for k in ("weights_bytes", "grads_bytes", "optimizer_bytes"):
        s = sum(l[k] for l in L)
        if s != d["memory"][k]:
            sys.exit("memory.%s %d != sum of layers[].%s %d" % (k, d["memory"][k], k, s))
    if "plan" in d:
        plan_ok(d["plan"], "plan")
elif mode == "plan":
    need(d, ["plan"], "top level")
    plan_ok(d["plan"], "plan")
elif mode == "check":
    need(d, ["check"], "top level")
    need(d["check"], ["fits", "shortfall_bytes"], "check")
    if not isinstance(d["check"]["fits"], bool):
        sys.exit("check.fits is not a boolean")
    print("fits" if d["check"]["fits"] else "nofit")
elif mode in ("suggest", "recommend", "nofit"):
    if d["command"] != "suggest":
        sys.exit("command is %r, expected 'suggest'" % d["command"])
    need(d, ["recommendation", "candidates"], "top level")
    for i, c in enumerate(d["candidates"]):
        need(c, CAND, "candidates[%d]" % i)
        plan_ok(c["plan"], "candidates[%d].plan" % i)
    r = d["recommendation"]
    if mode == "nofit":
        if r is not None:
            sys.exit("recommendation is not null for a model that does not fit")
        need(d, ["alternatives"], "top level")
        if not d["alternatives"]:
            sys.exit("alternatives: empty")
        for a in d["alternatives"]:
            print(a)
        sys.exit(0)
    if r is None:
        sys.exit("recommendation is null")
    need(r, CAND, "recommendation")
    plan_ok(r["plan"], "recommendation.plan")
    if mode == "recommend":
        print(r["micro_batch"], r["grad_accum"], r["global_batch"], r["precision"], r["plan"]["strategy"])
elif mode == "ckflags":
    print("".join("1" if l["checkpointed"] else "0" for l in d["layers"]))
elif mode != "any":
    sys.exit("jcheck.py: unknown mode " + mode)
EOF

# json_check DESC MODE ARGS...: memplan ARGS (with --json) exits 0 or 1 and its
# stdout passes jcheck.py MODE.  The mode's printout is left in $T/jout.
json_check() {
    desc=$1
    mode=$2
    shift 2
    : >"$T/jout"
    if [ -z "$HAVE_PY" ]; then
        skipped "$desc (python3 not found)"
        return 1
    fi
    run "$@"
    if [ "$ec" -gt 1 ]; then
        echo "expected exit 0 or 1" >"$T/why"
        bad "$desc"
        return 1
    fi
    if python3 "$T/jcheck.py" "$mode" <"$T/out" >"$T/jout" 2>"$T/why"; then
        ok "$desc"
        return 0
    fi
    bad "$desc"
    return 1
}

# ---- help and version ---------------------------------------------------------------------

for h in --help -h help; do
    run "$h"
    if [ "$ec" -eq 0 ] && [ -s "$T/out" ] && [ ! -s "$T/err" ]; then
        ok "memplan $h: help on stdout, exit 0"
    else
        echo "expected exit 0, help on stdout, nothing on stderr" >"$T/why"
        bad "memplan $h: help on stdout, exit 0"
    fi
done

run --version
if [ "$ec" -eq 0 ] && [ "$(nlines "$T/out")" -eq 1 ] && grep -Eq '^memplan [0-9]+\.[0-9]+\.[0-9]+$' "$T/out"; then
    ok "memplan --version: prints 'memplan X.Y.Z'"
else
    echo "stdout: $(head -c 200 "$T/out")" >"$T/why"
    bad "memplan --version: prints 'memplan X.Y.Z'"
fi

# Each command's help names the core options of its synopsis (memplan(1) SYNOPSIS lists
# these and more).
help_opts() {
    case $1 in
        estimate) echo "--batch --seq --precision --optimizer --checkpoint --json --help" ;;
        plan) echo "--batch --seq --activation-budget --vram --gpu --checkpoint --json --help" ;;
        probe) echo "--batch --seq --precision --optimizer --checkpoint --steps --backend --device --json --help" ;;
        suggest) echo "--vram --gpu --device --seq --precision --optimizer --global-batch --emit --json --help" ;;
        check) echo "--batch --seq --precision --optimizer --checkpoint --vram --gpu --json --help" ;;
    esac
}
for c in estimate plan probe suggest check; do
    for form in "$c --help" "$c -h" "help $c"; do
        # shellcheck disable=SC2086
        run $form
        missing=
        for o in $(help_opts "$c"); do
            grep -Eq -e "$o([^a-z-]|\$)" "$T/out" || missing="$missing $o"
        done
        if [ "$ec" -eq 0 ] && [ -z "$missing" ] && [ ! -s "$T/err" ]; then
            ok "memplan $form: exit 0, lists its options"
        else
            echo "options not in the help:${missing:- (none)}" >"$T/why"
            bad "memplan $form: exit 0, lists its options"
        fi
    done
done

run help gpus
if [ "$ec" -eq 0 ] && grep -q 'a100-40gb' "$T/out" && grep -q 't4' "$T/out"; then
    ok "memplan help gpus: lists the bundled profiles"
else
    echo "expected exit 0 and a100-40gb, t4 in the list" >"$T/why"
    bad "memplan help gpus: lists the bundled profiles"
fi

# ---- usage errors: exit 2 -----------------------------------------------------------------

run
if [ "$ec" -eq 2 ] && [ ! -s "$T/out" ] && [ -s "$T/err" ]; then
    ok "no arguments: exit 2, usage on stderr"
else
    echo "expected exit 2, usage on stderr, nothing on stdout" >"$T/why"
    bad "no arguments: exit 2, usage on stderr"
fi

expect_line 2 "unknown command" frobnicate models/tiny-test.json
expect_line 2 "unknown option before the command" --frobnicate
expect_line 2 "unknown option of a command" estimate --frobnicate models/tiny-test.json
expect_line 2 "unknown short option" estimate -Z models/tiny-test.json
expect 2 "help for an unknown command" help frobnicate

expect 2 "estimate without MODEL" estimate
expect 2 "estimate with options but no MODEL" estimate --batch 4
expect 2 "plan without MODEL" plan --gpu a100-40gb
expect 2 "probe without MODEL" probe --backend host
expect 2 "suggest without MODEL" suggest --gpu a100-40gb
expect 2 "check without MODEL" check --batch 1 --gpu a100-40gb
expect 2 "two MODEL arguments" estimate models/tiny-test.json models/tiny-mlp.json

expect 2 "--batch 0" estimate models/tiny-test.json --batch 0
expect 2 "--batch -1" estimate models/tiny-test.json --batch -1
expect 2 "--batch abc" estimate models/tiny-test.json --batch abc
expect 2 "--batch 4x" estimate models/tiny-test.json --batch 4x
expect 2 "--batch without a value" estimate models/tiny-test.json --batch
expect 2 "--seq 0" estimate models/tiny-test.json --seq 0
expect 2 "--precision fp8" estimate models/tiny-test.json --precision fp8
expect 2 "--optimizer lion" estimate models/tiny-test.json --optimizer lion
expect 2 "--checkpoint segments:0" estimate models/tiny-test.json --checkpoint segments:0
expect 2 "--checkpoint every:0" estimate models/tiny-test.json --checkpoint every:0
expect 2 "--checkpoint segments:x" estimate models/tiny-test.json --checkpoint segments:x
expect 2 "--checkpoint segments (no K)" estimate models/tiny-test.json --checkpoint segments
expect 2 "--checkpoint bogus" estimate models/tiny-test.json --checkpoint bogus
expect 2 "--vram 12XB" check models/tiny-test.json --batch 1 --vram 12XB
expect 2 "--vram 0" check models/tiny-test.json --batch 1 --vram 0
expect 2 "--vram -4GiB" check models/tiny-test.json --batch 1 --vram -4GiB
expect 2 "--gpu with no such profile" check models/tiny-test.json --batch 1 --gpu no-such-gpu
expect 2 "--gpu and --vram together" check models/tiny-test.json --batch 1 --gpu t4 --vram 16GiB
expect 2 "--emit csv" suggest models/tiny-test.json --gpu t4 --emit csv
expect 2 "--global-batch 0" suggest models/tiny-test.json --gpu t4 --global-batch 0
expect 2 "--backend rocm" probe models/tiny-test.json --backend rocm
expect 2 "--steps 0" probe models/tiny-test.json --backend host --steps 0
expect 2 "--attention paged" estimate models/tiny-test.json --attention paged
expect 2 "--use-cache maybe" estimate models/hf/gpt2.json --use-cache maybe
expect 2 "--use-cache on for a model without a k/v cache (BERT)" estimate models/hf/bert-base-uncased.json \
    --use-cache on
expect 2 "--use-cache on for memplan JSON" estimate models/tiny-test.json --use-cache off

# --target-seq: the decoder's length of an encoder-decoder (t5); refused elsewhere
expect_line 2 "--target-seq on a decoder-only model" estimate models/hf/gpt2.json --target-seq 64
expect_line 2 "--target-seq 0" estimate models/hf/t5-small.json --target-seq 0
run estimate models/hf/t5-small.json --seq 256 --target-seq 64 --json
if [ "$ec" -eq 0 ] && grep -q '"seq_len":[[:space:]]*256' "$T/out" && grep -q '"target_seq_len":[[:space:]]*64' "$T/out"; then
    ok "t5 --target-seq 64: config.seq_len 256 and config.target_seq_len 64 in JSON"
else
    bad "t5 --target-seq 64: config.seq_len 256 and config.target_seq_len 64 in JSON"
fi
run estimate models/hf/t5-small.json --seq 256
if [ "$ec" -eq 0 ] && grep -q 'target seq 256 (= seq' "$T/out"; then
    ok "t5 without --target-seq: the default (= seq) is printed"
else
    bad "t5 without --target-seq: the default (= seq) is printed"
fi
expect_line 4 "probe of a T5 config: refused, one line" probe models/hf/t5-small.json --backend host --batch 1 \
    --seq 32
expect_line 2 "t5 with --attention flash (transformers has no flash path for T5)" estimate models/hf/t5-small.json \
    --attention flash
for ck in none layers; do
    run estimate models/hf/t5-small.json --attention eager --checkpoint "$ck" --target-seq 128
    if [ "$ec" -eq 0 ] && [ -s "$T/out" ]; then
        ok "t5 eager attention, checkpoint $ck: exit 0"
    else
        bad "t5 eager attention, checkpoint $ck: exit 0"
    fi
done
expect_line 2 "t5 with --finetune qlora (wo stays fp32 and unquantized: not modelled)" estimate \
    models/hf/t5-small.json --finetune qlora
printf '{"model_type": "t5", "architectures": ["T5ForSequenceClassification"]}' >"$T/t5seq.json"
expect_line 3 "T5ForSequenceClassification: refused with the reason" estimate "$T/t5seq.json"
printf '{"model_type": "t5", "feed_forward_proj": "gated-gelu-x"}' >"$T/t5ff.json"
expect_line 3 "t5 feed_forward_proj not gated-ACT or ACT" estimate "$T/t5ff.json"
printf '{"model_type": "t5", "architectures": ["T5ForQuestionAnswering"]}' >"$T/t5qa.json"
expect_line 2 "--target-seq for T5ForQuestionAnswering (its decoder reads the input ids)" estimate "$T/t5qa.json" \
    --target-seq 64
expect 2 "check without --batch" check models/tiny-test.json --gpu a100-40gb
expect 2 "check without a target" check models/tiny-test.json --batch 1
expect 2 "plan without a target or budget" plan models/tiny-test.json --batch 1
expect 2 "estimate --checkpoint optimal without a target" estimate models/tiny-test.json --checkpoint optimal
expect 2 "probe --checkpoint optimal" probe models/tiny-test.json --backend host --checkpoint optimal

expect 2 "option not for estimate (--global-batch)" estimate models/tiny-test.json --global-batch 8
expect 2 "option not for estimate (--backend)" estimate models/tiny-test.json --backend host
expect 2 "option not for suggest (--batch)" suggest models/tiny-test.json --gpu t4 --batch 4
expect 2 "option not for check (--steps)" check models/tiny-test.json --batch 1 --gpu t4 --steps 2
expect 2 "option not for plan (--emit)" plan models/tiny-test.json --gpu t4 --emit torch
expect 2 "option not for probe (--gpu)" probe models/tiny-test.json --gpu t4

# ---- bad input: exit 3 --------------------------------------------------------------------

BAD=tests/data/bad
if [ ! -f "$BAD/README" ]; then
    cmdline="(none)"; ec=-; : >"$T/out"; : >"$T/err"; echo "$BAD/README is missing" >"$T/why"
    bad "bad-input corpus: $BAD/README exists"
else
    nbad=0
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in '' | '#'*) continue ;; esac
        file=${line%%"$TAB"*}
        msg=${line#*"$TAB"}
        if [ "$file" = "$line" ] || [ -z "$msg" ]; then
            cmdline="(README line)"; ec=-; : >"$T/out"; : >"$T/err"
            echo "line: $line" >"$T/why"
            bad "$BAD/README: a line is not 'file<TAB>message'"
            continue
        fi
        nbad=$((nbad + 1))
        if [ ! -f "$BAD/$file" ]; then
            cmdline="estimate $BAD/$file"; ec=-; : >"$T/out"; : >"$T/err"
            echo "listed in README but not present" >"$T/why"
            bad "bad input $file: the file exists"
            continue
        fi
        run estimate "$BAD/$file"
        n=$(nlines "$T/err")
        if [ "$ec" -eq 3 ] && [ "$n" -eq 1 ] && [ ! -s "$T/out" ] && grep -qF -e "$msg" "$T/err"; then
            ok "bad input $file: exit 3, one line with '$msg'"
        else
            echo "expected exit 3, nothing on stdout, one stderr line containing: $msg" >"$T/why"
            bad "bad input $file: exit 3, one line with '$msg'"
        fi
    done <"$BAD/README"
    if [ "$nbad" -gt 0 ]; then
        ok "bad-input corpus: $nbad entries in $BAD/README"
    else
        cmdline="(none)"; ec=-; : >"$T/out"; : >"$T/err"; echo "no entries" >"$T/why"
        bad "bad-input corpus: entries in $BAD/README"
    fi
    # every corpus file is listed, so none goes untested
    for f in "$BAD"/*.json; do
        [ -e "$f" ] || continue
        b=${f##*/}
        if grep -q "^$b$TAB" "$BAD/README"; then
            :
        else
            cmdline="(none)"; ec=-; : >"$T/out"; : >"$T/err"
            echo "add a line '$b<TAB>message' to $BAD/README" >"$T/why"
            bad "bad input $b: listed in $BAD/README"
        fi
    done
fi

expect_line 3 "a directory as MODEL" estimate models
expect_line 3 "a missing MODEL file" estimate tests/data/no-such-model.json
expect_line 3 "a missing MODEL file (check)" check tests/data/no-such-model.json --batch 1 --gpu t4

# ---- sizes beyond 64 bits: exit 3 naming the file or option -------------------------------
# Never a crash (under SAN=1 the sanitizers catch a read or write past the builder's arrays)
# nor a wrapped figure ("fits" at a peak that left 64 bits).

# expect_msg CODE DESC MSG ARGS...: as expect_line, and the stderr line contains MSG.
expect_msg() {
    want=$1
    desc=$2
    msg=$3
    shift 3
    run "$@"
    n=$(nlines "$T/err")
    if [ "$ec" -eq "$want" ] && [ "$n" -eq 1 ] && [ ! -s "$T/out" ] && grep -qF -e "$msg" "$T/err"; then
        ok "$desc: exit $want, one line with '$msg'"
    else
        echo "expected exit $want, nothing on stdout, one stderr line containing: $msg" >"$T/why"
        bad "$desc: exit $want, one line with '$msg'"
    fi
}
OVF="sizes overflow 64 bits"
expect_msg 3 "batch x seq x seq beyond 64 bits (the attention mask)" "models/hf/mistral-7b.json: h.0.transformer_block: $OVF" \
    estimate models/hf/mistral-7b.json --batch 65536 --seq 16777216
expect_msg 3 "batch x seq x seq beyond 64 bits, eager attention" "models/hf/llama-2-7b.json: h.0.transformer_block: $OVF" \
    estimate models/hf/llama-2-7b.json --attention eager --batch 65536 --seq 16777216
expect_msg 3 "batch x seq beyond 64 bits (DeepSeek's MLA)" "models/hf/deepseek-v3.json: h.0.transformer_block: $OVF" \
    estimate models/hf/deepseek-v3.json --batch 16777216 --seq 16777216
expect_msg 3 "suggest at a sequence beyond 64 bits" "models/hf/mistral-7b.json: " \
    suggest --no-probe models/hf/mistral-7b.json --seq 16777216 --vram 16777215T
NEAR64=18446744073709549568 # 2^64 - 2048: refused as an option value (the cap keeps every sum
# below 2^64; the estimator's own checked sums are tested in test_estimate)
for ck in none optimal; do
    expect_msg 2 "check --context near 2^64, checkpoint $ck: not a wrapped fit" "--context: '$NEAR64' is too large (at most 1024TiB)" \
        check models/tiny-test.json --batch 1 --vram 1G --checkpoint "$ck" --context "$NEAR64"
    expect_msg 2 "check --workspace near 2^64, checkpoint $ck: not a wrapped fit" "--workspace: '$NEAR64' is too large (at most 1024TiB)" \
        check models/tiny-test.json --batch 1 --vram 1G --checkpoint "$ck" --workspace "$NEAR64"
done
expect_msg 2 "estimate --context near 2^64" "--context: '$NEAR64' is too large" estimate models/tiny-test.json --context "$NEAR64"
expect_msg 2 "suggest --context near 2^64" "--context: '$NEAR64' is too large" suggest --no-probe models/tiny-test.json --vram 1G \
    --context "$NEAR64"
expect_msg 2 "check --context near 2^64 with data parallelism (NCCL's buffers)" "--context: '$NEAR64' is too large" \
    check models/tiny-test.json --batch 1 --vram 1G --gpus 2 --parallel ddp --context "$NEAR64"
# at the cap the sums stay exact: 1024TiB of context and two workspaces of 1024TiB (the forward's
# and the backward's cuBLAS handle) on tiny-test do not fit 1G
run check models/tiny-test.json --batch 1 --vram 1G --context 1024TiB --workspace 1024TiB
if [ "$ec" -eq 1 ] && grep -q "does not fit: peak 3.00 PiB" "$T/out"; then
    ok "check --context and --workspace at their cap: exit 1, peak 3.00 PiB (no wrap)"
else
    echo "expected exit 1 and 'does not fit: peak 3.00 PiB' (3 x 1024TiB + tiny-test)" >"$T/why"
    bad "check --context and --workspace at their cap: exit 1, peak 3.00 PiB (no wrap)"
fi

# ---- output errors ------------------------------------------------------------------------

if [ -w /dev/full ]; then
    for args in "--help" "--version" "estimate models/tiny-test.json" "estimate models/gpt2-124m.json --json" \
        "check models/tiny-test.json --batch 1 --gpu t4"; do
        cmdline="$args >/dev/full"
        : >"$T/why"
        : >"$T/out"
        # shellcheck disable=SC2086
        "$M" $args >/dev/full 2>"$T/err" && ec=$? || ec=$?
        if [ "$ec" -ne 0 ] && grep -q "writing output failed" "$T/err"; then
            ok "memplan $args >/dev/full: non-zero exit, 'writing output failed'"
        else
            echo "expected a non-zero exit and 'writing output failed' on stderr" >"$T/why"
            bad "memplan $args >/dev/full: non-zero exit, 'writing output failed'"
        fi
    done
else
    skipped "writes to /dev/full (no /dev/full here)"
fi

# ---- output files: --timeline FILE -----------------------------------------------------------
# FILE is checked before the work (nothing on stdout when it is refused) and written through a
# temporary file beside it, renamed into place: never a half-written file, never through a
# symbolic link, into a FIFO or device, or over the model.  A refused FILE is a bad value of the
# option (exit 2); a failed write is exit 5 with one line naming the file and the reason.

TL=$T/tl
mkdir "$TL"
cp models/tiny-test.json "$TL/m.json"
cksum <"$TL/m.json" >"$TL/m.sum"
# tl_refused CODE DESC FILE [MODEL]: estimate MODEL --timeline FILE exits CODE before the work:
# one stderr line naming FILE, nothing on stdout, the model untouched, no temporary file left.
tl_refused() {
    want=$1 desc=$2 file=$3 model=${4:-$TL/m.json}
    run estimate "$model" --timeline "$file"
    if [ "$ec" -eq "$want" ] && [ "$(nlines "$T/err")" -eq 1 ] && [ ! -s "$T/out" ] &&
        grep -qF -e "$file" "$T/err" && cksum <"$TL/m.json" | cmp -s - "$TL/m.sum" &&
        [ -z "$(find "$TL" -name '.memplan-*')" ]; then
        ok "--timeline $desc: exit $want before the work, one line naming the file"
    else
        echo "expected exit $want, one stderr line naming $file, nothing on stdout, the model unchanged" >"$T/why"
        bad "--timeline $desc: exit $want before the work, one line naming the file"
    fi
    cp models/tiny-test.json "$TL/m.json" # written in place (its links too): as it was, for the next check
}
tl_refused 2 "the model file itself" "$TL/m.json"
tl_refused 2 "the model file spelled another way" "$TL/../tl/./m.json"
ln "$TL/m.json" "$TL/hard.json"
tl_refused 2 "a hard link to the model file" "$TL/hard.json"
ln -s m.json "$TL/sym.json"
tl_refused 2 "the model file through a symbolic link given as MODEL" "$TL/m.json" "$TL/sym.json"
ln -s "$TL/elsewhere.svg" "$TL/link.svg"
tl_refused 2 "a symbolic link (not followed)" "$TL/link.svg"
if [ -e "$TL/elsewhere.svg" ]; then
    echo "the link's target was written" >"$T/why"
    bad "--timeline a symbolic link: its target is not written"
else
    ok "--timeline a symbolic link: its target is not written"
fi
tl_refused 2 "a directory" "$TL"
tl_refused 5 "in a missing directory" "$TL/no-such-dir/x.svg"
tl_refused 5 "under a regular file" "$TL/m.json/x.svg"
if [ -c /dev/full ]; then
    tl_refused 2 "a device (/dev/full)" /dev/full
fi
if command -v mkfifo >/dev/null 2>&1 && mkfifo "$TL/fifo" && command -v timeout >/dev/null 2>&1; then
    # a regression would block in open(2) for good: the timeout turns that into a failure
    cmdline="estimate $TL/m.json --timeline $TL/fifo"
    timeout 20 "$M" estimate "$TL/m.json" --timeline "$TL/fifo" >"$T/out" 2>"$T/err" && ec=$? || ec=$?
    if [ "$ec" -eq 2 ] && [ "$(nlines "$T/err")" -eq 1 ] && [ ! -s "$T/out" ] && grep -q "FIFO" "$T/err"; then
        ok "--timeline a FIFO: exit 2 at once, one line (no hang)"
    else
        echo "expected exit 2 and one line saying it is a FIFO (124: it hung)" >"$T/why"
        bad "--timeline a FIFO: exit 2 at once, one line (no hang)"
    fi
else
    skipped "--timeline a FIFO (no mkfifo or timeout here)"
fi
# a directory memplan may not write in: as root (which writes anywhere), run as nobody
mkdir "$TL/ro"
chmod 555 "$TL/ro"
as=
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
    as="setpriv --reuid=65534 --regid=65534 --clear-groups"
    chmod 755 "$T" "$TL"
    chmod 644 "$TL/m.json"
fi
if [ "$(id -u)" -ne 0 ] || [ -n "$as" ]; then
    cmdline="estimate $TL/m.json --timeline $TL/ro/x.svg${as:+ (as nobody)}"
    $as "$M" estimate "$TL/m.json" --timeline "$TL/ro/x.svg" >"$T/out" 2>"$T/err" && ec=$? || ec=$?
    if [ "$ec" -eq 5 ] && [ "$(nlines "$T/err")" -eq 1 ] && [ ! -s "$T/out" ] &&
        grep -qF "writing the timeline $TL/ro/x.svg failed: " "$T/err"; then
        ok "--timeline in a directory that cannot be written: exit 5 before the work, one line"
    else
        echo "expected exit 5, nothing on stdout, 'writing the timeline FILE failed: REASON'" >"$T/why"
        bad "--timeline in a directory that cannot be written: exit 5 before the work, one line"
    fi
else
    skipped "--timeline in a directory that cannot be written (root without setpriv)"
fi
chmod 700 "$T" "$TL"
# a write that fails part way (the file-size limit: EFBIG, not SIGXFSZ): exit 5, one line with
# the reason, no report (the picture is written first), the old FILE as it was, no temporary left
echo "the old picture" >"$TL/t.svg"
cmdline="estimate $TL/m.json --timeline $TL/t.svg (ulimit -f 16)"
(ulimit -f 16 && trap '' XFSZ && exec "$M" estimate "$TL/m.json" --timeline "$TL/t.svg") >"$T/out" 2>"$T/err" &&
    ec=$? || ec=$?
if [ "$ec" -eq 5 ] && [ "$(nlines "$T/err")" -eq 1 ] && [ ! -s "$T/out" ] &&
    grep -qF "writing the timeline $TL/t.svg failed: File too large" "$T/err" &&
    [ "$(cat "$TL/t.svg")" = "the old picture" ] && [ -z "$(find "$TL" -name '.memplan-*')" ]; then
    ok "--timeline write fails part way: exit 5, one line, no report, the old file intact, no temporary left"
else
    echo "expected exit 5, no report, 'writing the timeline FILE failed: File too large', $TL/t.svg unchanged" >"$T/why"
    bad "--timeline write fails part way: exit 5, one line, no report, the old file intact, no temporary left"
fi
chmod 640 "$TL/t.svg"
run estimate "$TL/m.json" --timeline "$TL/t.svg"
if [ "$ec" -eq 0 ] && grep -q "^<svg" "$TL/t.svg" && [ "$(ls -l "$TL/t.svg" | cut -c1-10)" = "-rw-r-----" ] &&
    [ -z "$(find "$TL" -name '.memplan-*')" ]; then
    ok "--timeline over an existing file: replaced, its mode kept, no temporary left"
else
    echo "expected exit 0, an SVG in $TL/t.svg with mode -rw-r-----" >"$T/why"
    bad "--timeline over an existing file: replaced, its mode kept, no temporary left"
fi
(cd "$TL" && "$M" estimate m.json --timeline rel.svg >/dev/null 2>&1) && [ -s "$TL/rel.svg" ]
if [ $? -eq 0 ]; then
    ok "--timeline FILE without a directory part: written in the current directory"
else
    cmdline="(cd $TL) estimate m.json --timeline rel.svg"; : >"$T/why"
    bad "--timeline FILE without a directory part: written in the current directory"
fi

# ---- names from input files on the terminal ----------------------------------------------------
# A model's, block's, op's or GPU profile's name can carry escape sequences (clear the screen,
# set the terminal's title), a newline that would split a row, a tab, a C1 control.  Text
# reports and stderr show them escaped (\x1b, \u009b); --json keeps the exact names (JSON
# escapes them); the timeline's SVG shows '?' and stays well-formed XML.

cat >"$T/names.json" <<'JSON'
{
  "name": "evil\u001b]0;pwned\u0007\u001b[2J\nfake row",
  "input": {"tokens": 8},
  "layers": [
    {"block": "emb\u001b[31m\nx", "layers": [
      {"type": "embedding", "name": "wte\u001b[1m", "vocab": 64, "dim": 16},
      {"type": "pos_embedding", "name": "wpe", "max_positions": 8, "dim": 16}
    ]},
    {"repeat": 2, "name": "h\t\u009b", "layers": [
      {"type": "transformer_block", "dim": 16, "heads": 2, "ffn": 32,
       "norm": "layernorm", "act": "gelu_tanh", "fused_qkv": true}
    ]},
    {"block": "aaaaaaaaaaaaa\u00e9\u00e9\u00e9\u00e9", "layers": [{"type": "layernorm", "dim": 16}]},
    {"block": "head\u001b[2K", "layers": [
      {"type": "layernorm", "name": "ln\u001bf", "dim": 16},
      {"type": "lm_head", "tied": true}
    ]}
  ]
}
JSON
cat >"$T/names-gpu.json" <<'JSON'
{"name": "g\u001b[2Jpu", "description": "desc\u001b]0;t\u0007\nrow", "memory_mib": 15360,
 "tflops": {"fp32": 8, "bf16": 65, "fp16": 65}}
JSON
# an HF config whose _name_or_path carries the escapes
sed '1s/^{$/{ "_name_or_path": "gpt2\\u001b]0;pwned\\u0007\\n\\u001b[2Jfake row",/' models/hf/gpt2.json >"$T/names-hf.json"
C1=$(printf '\302[\200-\237]')
WIDE=
# clean_out DESC: stdout and stderr of the last run hold no control byte but newlines, no C1
# control, and valid UTF-8 (python3, when there); text lines fit 100 columns (unless $WIDE).
clean_out() {
    n=$(cat "$T/out" "$T/err" | LC_ALL=C tr -d '\n\040-\176\200-\377' | wc -c)
    r=0
    [ "$n" -eq 0 ] || { echo "$n control byte(s) on stdout/stderr" >"$T/why"; r=1; }
    if cat "$T/out" "$T/err" | LC_ALL=C grep -q "$C1"; then echo "a C1 control on stdout/stderr" >>"$T/why"; r=1; fi
    if [ -n "$HAVE_PY" ] && ! cat "$T/out" "$T/err" | python3 -c 'import sys; sys.stdin.buffer.read().decode("utf-8")' 2>>"$T/why"; then
        r=1
    fi
    [ -n "$WIDE" ] || LC_ALL=C.UTF-8 awk 'length($0) > 100 { print "line " NR " has " length($0) " columns"; bad = 1 }
        END { exit bad }' "$T/out" >>"$T/why" 2>&1 || r=1
    if [ "$r" -eq 0 ] && [ "$ec" -le 1 ]; then ok "$1"; else bad "$1"; fi
}
N=$T/names.json
G=$T/names-gpu.json
run estimate "$N" --gpu "$G"
clean_out "estimate: names with escapes and newlines shown escaped"
if grep -qF 'model     evil\x1b]0;pwned\x07\x1b[2J\x0afake row (memplan JSON' "$T/out" &&
    grep -qF 'target    g\x1b[2Jpu (desc\x1b]0;t\x07\x0arow)' "$T/out" &&
    grep -q '^0  *emb\\x1b\[31m\\x0ax  *embedding' "$T/out" && grep -q '^1-2  *h\\x09\\u009b\.0 x2 ' "$T/out" &&
    grep -q '^4  *head\\x1b\[2K  *layernorm' "$T/out" && ! grep -q '^fake row' "$T/out"; then
    ok "estimate: the model, GPU and block names as one escaped string each, rows unsplit"
else
    echo "expected the escaped names in the header and the block table" >"$T/why"
    bad "estimate: the model, GPU and block names as one escaped string each, rows unsplit"
fi
# a name cut to fit its column is cut between characters (13 bytes, not 14 into an e-acute)
if grep -q '^3  *aaaaaaaaaaaaa\.\.  *layernorm' "$T/out"; then
    ok "estimate: a long UTF-8 block name is cut between characters"
else
    echo "expected block 3 shown as 'aaaaaaaaaaaaa..'" >"$T/why"
    bad "estimate: a long UTF-8 block name is cut between characters"
fi
WIDE=yes
run estimate "$N" --gpu "$G" --wide --all-layers
clean_out "estimate --wide --all-layers: names escaped"
WIDE=
run check "$N" --batch 1 --gpu "$G"
clean_out "check: the peak event escaped"
run check "$N" --batch 1 --vram 1MiB
clean_out "check that does not fit: the event escaped on stdout and stderr"
run plan "$N" --activation-budget 1MiB
clean_out "plan: names escaped"
run suggest "$N" --gpu "$G" --no-probe
clean_out "suggest: model and GPU names escaped"
run suggest "$N" --gpu "$G" --no-probe --finetune lora --emit torch
clean_out "suggest --emit torch: the snippet is clean"
# suggest's table: the checkpoint and parallel columns as wide as their longest entry, within 100
# columns; the header's columns in the rows' order (tune, then parallel)
L1=models/hf/llama-3.2-1b.json
run suggest "$L1" --gpu a100-40gb --no-probe --checkpoint layers+sac:torchtitan --global-batch 32
clean_out "suggest --checkpoint layers+sac:torchtitan: the table within 100 columns"
if grep -q '^precision  checkpoint  *micro' "$T/out" &&
    grep -q '^amp-bf16   layers+sac:torchtitan  *2  *16 .* <- recommended$' "$T/out"; then
    ok "suggest: a 21-character checkpoint spec keeps the columns aligned"
else
    echo "expected 'layers+sac:torchtitan' in its own column and the recommended row marked" >"$T/why"
    bad "suggest: a 21-character checkpoint spec keeps the columns aligned"
fi
run suggest "$L1" --gpu a100-40gb --no-probe --gpus 8 --parallel fsdp --finetune lora --checkpoint layers+sac:axolotl
clean_out "suggest --parallel fsdp --finetune lora +sac:axolotl: the table within 100 columns"
if grep -q '^tune  parallel precision  checkpoint  *micro' "$T/out" &&
    grep -q '^lora  fsdp x8  [a-z0-9-]*  *layers+sac:axolotl  ' "$T/out" && grep -q ' <-$' "$T/out"; then
    ok "suggest: tune and parallel columns headed in the rows' order"
else
    echo "expected the header 'tune  parallel precision' over rows 'lora  fsdp x8 ...'" >"$T/why"
    bad "suggest: tune and parallel columns headed in the rows' order"
fi
run probe "$N" --backend host --capacity 1KiB
clean_out "probe out of memory: the event escaped"
run estimate "$T/names-hf.json"
clean_out "estimate of an HF config: _name_or_path escaped"
if grep -qF 'model     gpt2\x1b]0;pwned\x07\x0a\x1b[2Jfake row (HF config' "$T/out"; then
    ok "estimate of an HF config: _name_or_path shown escaped on one line"
else
    echo "expected the escaped _name_or_path on the model line" >"$T/why"
    bad "estimate of an HF config: _name_or_path shown escaped on one line"
fi
mkdir "$T/names-gpus"
cp "$G" "$T/names-gpus/evil.json"
cmdline="help gpus (MEMPLAN_GPUS=$T/names-gpus)"
MEMPLAN_GPUS=$T/names-gpus "$M" help gpus >"$T/out" 2>"$T/err" && ec=$? || ec=$?
clean_out "help gpus: a profile's name and description escaped"
if [ -n "$HAVE_PY" ]; then
    run estimate "$N" --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model"]["name"] == "evil\x1b]0;pwned\x07\x1b[2J\nfake row", d["model"]["name"]
names = [l["name"] for l in d["layers"]]
assert names == ["emb\x1b[31m\nx", "h\t\x9b.0", "h\t\x9b.1", "aaaaaaaaaaaaa\xe9\xe9\xe9\xe9", "head\x1b[2K"], names
' "$T/out" 2>"$T/why" && [ "$(nlines "$T/out")" -gt 1 ] && ! LC_ALL=C grep -q "$(printf '\033')" "$T/out"; then
        ok "estimate --json: the exact names, escaped by JSON (no raw ESC)"
    else
        bad "estimate --json: the exact names, escaped by JSON (no raw ESC)"
    fi
else
    skipped "estimate --json with escapes in names (no python3)"
fi
run estimate "$N" --gpu "$G" --timeline "$T/names.svg"
r=0
n=$(LC_ALL=C tr -d '\n\t\040-\176\200-\377' <"$T/names.svg" | wc -c) # a tab is blank in SVG text
[ "$ec" -eq 0 ] && [ "$n" -eq 0 ] && ! LC_ALL=C grep -q "$C1" "$T/names.svg" &&
    grep -qF '>evil?]0;pwned??[2J?fake row: estimate<' "$T/names.svg" || r=1
if [ "$r" -eq 0 ] && command -v xmllint >/dev/null 2>&1; then
    xmllint --noout "$T/names.svg" >"$T/why" 2>&1 || r=1
fi
if [ "$r" -eq 0 ]; then
    ok "--timeline: names with escapes drawn as '?', well-formed XML"
else
    bad "--timeline: names with escapes drawn as '?', well-formed XML"
fi

# ---- every bundled model ------------------------------------------------------------------

i=0
for f in models/*.json models/hf/*.json; do
    [ -f "$f" ] || continue
    i=$((i + 1))
    tier_item $((i - 1)) || continue
    run estimate "$f"
    if [ "$ec" -eq 0 ] && [ -s "$T/out" ]; then
        ok "estimate $f: exit 0"
    else
        echo "expected exit 0 and a report on stdout" >"$T/why"
        bad "estimate $f: exit 0"
    fi
    json_check "estimate $f --json: schema 1, README's keys, totals = sum of layers" estimate \
        estimate "$f" --json
done

# every HF family through plan, suggest and check: a result (exit 0 fits, 1 does not), never
# a usage, input or internal error
i=0
for f in models/hf/*.json; do
    [ -f "$f" ] || continue
    i=$((i + 1))
    # (counted from 1: the quick tier's models are then bert, ernie, falcon-7b, gemma-3, ...,
    # mixtral, qwen1.5-moe, vit, and the 32B to 70B configs, whose suggest takes seconds, long)
    tier_item "$i" || continue
    for cmd in "plan $f --gpu a100-80gb --batch 1" "suggest $f --gpu a100-80gb --no-probe" \
        "check $f --gpu a100-80gb --batch 1"; do
        # shellcheck disable=SC2086
        run $cmd
        if { [ "$ec" -eq 0 ] && [ -s "$T/out" ]; } || { [ "$ec" -eq 1 ] && { [ -s "$T/out" ] || [ -s "$T/err" ]; }; }; then
            ok "$cmd: exit 0 or 1 with a report"
        else
            echo "expected exit 0 with a report, or 1 with a report or a reason" >"$T/why"
            bad "$cmd: exit 0 or 1 with a report"
        fi
    done
done

# Llama 4: the text model (Llama4ForCausalLM) and the multimodal checkpoint (text-only) through
# estimate, plan, suggest (one GPU and eight: no --ep candidate, Llama 4's experts under --ep are
# not modelled) and check; LoRA without targets (peft has none for llama4_text, all-linear wraps
# the router) and --ep refused with one line
for f in bench/accuracy/moe/llama4-text-shrunk.json bench/accuracy/multimodal/llama4-shrunk.json; do
    for cmd in "estimate $f --batch 1" "plan $f --gpu a100-80gb --batch 1" "suggest $f --gpu a100-80gb --no-probe" \
        "suggest $f --gpu h100-80gb --gpus 8 --seq 1024 --no-probe" "check $f --gpu a100-80gb --batch 1"; do
        # shellcheck disable=SC2086
        run $cmd
        if [ "$ec" -eq 0 ] && [ -s "$T/out" ]; then
            ok "$cmd: exit 0 with a report"
        else
            echo "expected exit 0 with a report" >"$T/why"
            bad "$cmd: exit 0 with a report"
        fi
    done
    json_check "estimate $f --json: schema 1, README's keys, totals = sum of layers" estimate \
        estimate "$f" --json
done
expect_line 2 "llama4_text --finetune lora without targets: refused" estimate \
    bench/accuracy/moe/llama4-text-shrunk.json --finetune lora
expect_line 2 "llama4 --lora-targets router: refused" estimate bench/accuracy/multimodal/llama4-shrunk.json \
    --finetune lora --lora-targets router
expect_line 2 "llama4_text --ep 2: refused" estimate bench/accuracy/moe/llama4-text-shrunk.json --gpus 8 \
    --parallel fsdp --ep 2
expect_line 3 "llama4 --images 1: refused (the text-only shrunk config's vision widths disagree)" estimate \
    bench/accuracy/multimodal/llama4-shrunk.json --images 1
expect_line 2 "llama4 --finetune qlora: refused (the quantizer's per-expert loop is not modelled)" estimate \
    bench/accuracy/multimodal/llama4-shrunk.json --finetune qlora --lora-targets q_proj,v_proj

# mixture-of-experts programs are estimated only: the probe refuses them with a reason (exit 4)
expect_line 4 "probe of an MoE config: refused, one line" probe bench/accuracy/moe/mixtral-shrunk.json --backend host \
    --batch 1 --seq 64
if grep -q "does not execute mixture-of-experts routing" "$T/err"; then
    ok "probe of an MoE config: the reason names MoE routing"
else
    echo "expected the refusal to name mixture-of-experts routing" >"$T/why"
    bad "probe of an MoE config: the reason names MoE routing"
fi
# Cohere's composite LayerNorm keeps no x for the executors' backward: refused with the reason
expect_line 4 "probe of a cohere config: refused, one line" probe models/hf/aya-expanse-8b.json --backend host \
    --batch 1 --seq 64

# --head / --num-labels: the class and classes asked, planned and emitted; refusals one line each
expect_line 2 "--head: an unknown name" estimate models/hf/llama-3.2-1b.json --head classifier
expect_line 2 "--num-labels 0: out of range" estimate models/hf/llama-3.2-1b.json --head seq-cls --num-labels 0
expect_line 3 "--head mlm on llama: transformers has none" estimate models/hf/llama-3.2-1b.json --head mlm
expect_line 3 "--num-labels on a causal LM" estimate models/hf/llama-3.2-1b.json --num-labels 4
expect_line 3 "--head on a memplan model" estimate models/gpt2-124m.json --head seq-cls
# --images: Gemma 3 steps with images; refusals one line each
expect_line 3 "--images on a text model (no vision tower)" estimate models/hf/gemma-3-1b.json --images 1
expect_line 2 "--image-size on mllama: every image runs max_num_tiles tiles" estimate \
    bench/accuracy/multimodal/mllama-shrunk.json --images 1 --image-size 224x224
expect_line 2 "--attention eager with --images on mllama: the cross-attention's eager path not modelled" estimate \
    bench/accuracy/multimodal/mllama-shrunk.json --images 1 --attention eager
expect_line 2 "--image-size without --images" estimate bench/accuracy/multimodal/qwen2-vl-shrunk.json --image-size 448x448
expect_line 2 "--image-size 448: not HxW" estimate bench/accuracy/multimodal/qwen2-vl-shrunk.json --images 1 --image-size 448
expect_line 2 "--image-size 10x3000: the processor refuses the aspect ratio" estimate bench/accuracy/multimodal/qwen2-vl-shrunk.json --images 1 --image-size 10x3000
expect_line 2 "--image-size on gemma3: only its image_size" estimate bench/accuracy/multimodal/gemma3-shrunk.json --images 1 --image-size 448x448
expect_line 3 "--images on a memplan model" estimate models/gpt2-124m.json --images 1
expect_line 2 "--images 0: out of range" estimate models/hf/gemma-3-4b-it.json --images 0
expect_line 2 "--images 5 x 256 image tokens exceed --seq 1024" estimate models/hf/gemma-3-4b-it.json --images 5 --seq 1024
# Gemma-3-4B, one image at batch 1, amp-bf16 (fp32 weights): pixel_values 1 x 3 x 896 x 896 fp32 =
# 9,633,792 bytes, input_ids, token_type_ids and labels 1,024 x 8 each: 9,658,368 input bytes; the
# parameters as transformers counts the class (4,300,079,472), the tower now trained (full)
run estimate models/hf/gemma-3-4b-it.json --images 1 --seq 1024 --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
assert r["model"]["params"] == 4300079472 and r["model"]["trainable_params"] == 4300079472, r["model"]
assert "unused_params" not in r["model"], r["model"]
assert r["memory"]["input_bytes"] == 9633792 + 3 * 8192, r["memory"]["input_bytes"]
assert r["config"]["images"] == {"per_sample": 1, "tokens_each": 256, "image_size": 896, "height": 896,
                                 "width": 896, "patches": 4096, "vision_layers": 27}, r["config"]["images"]' "$T/out"; then
    ok "--images 1 on gemma-3-4b-it: params, input bytes and config.images in --json"
else
    bad "--images 1 on gemma-3-4b-it: params, input bytes and config.images in --json"
fi
# Qwen2-VL-7B, one 450 x 300 image at batch 1, amp-bf16 (fp32 weights): smart_resize makes it
# 448 x 308 (multiples of 28: 16 x 28 and 11 x 28), 32 x 22 = 704 patches of 14 px, 176 tokens
# (2 x 2 merged); pixel_values 704 x (3 x 2 x 14 x 14) fp32 = 3,311,616 bytes, input_ids and labels
# 1,024 x 8 each, the M-RoPE position_ids 3 x 1,024 x 8: 3,352,576 input bytes
run estimate models/hf/qwen2-vl-7b-instruct.json --images 1 --image-size 450x300 --seq 1024 --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
assert r["memory"]["input_bytes"] == 3311616 + 2 * 8192 + 24576, r["memory"]["input_bytes"]
assert r["config"]["images"] == {"per_sample": 1, "tokens_each": 176, "asked_height": 450, "asked_width": 300,
                                 "height": 448, "width": 308, "patches": 704, "vision_layers": 32}, r["config"]["images"]' "$T/out"; then
    ok "--images 1 --image-size 450x300 on qwen2-vl-7b-instruct: input bytes and config.images in --json"
else
    bad "--images 1 --image-size 450x300 on qwen2-vl-7b-instruct: input bytes and config.images in --json"
fi
# suggest --json: the same images in its config (what --emit writes the processor for)
run suggest models/hf/qwen2-vl-7b-instruct.json --images 1 --image-size 450x300 --seq 1024 --gpu a100-80gb \
    --finetune lora --no-probe --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
assert r["config"]["images"] == {"per_sample": 1, "tokens_each": 176, "asked_height": 450, "asked_width": 300,
                                 "height": 448, "width": 308, "patches": 704, "vision_layers": 32}, r["config"]' "$T/out"; then
    ok "suggest --images 1 --image-size 450x300 on qwen2-vl-7b-instruct: config.images in --json"
else
    bad "suggest --images 1 --image-size 450x300 on qwen2-vl-7b-instruct: config.images in --json"
fi
expect_line 4 "--images: the probe refuses the program" probe bench/accuracy/multimodal/gemma3-shrunk.json --images 1 --seq 64 --backend host
# suggest --emit hf with the same image (448 x 308 after smart_resize, above): the model class that
# loads Qwen2-VL, the processor's pixel bounds (56 x 56 = 3,136; 28 x 28 x 1,280 = 1,003,520), the
# size planned and SFTConfig's max_length = --seq (TRL's loss)
run suggest models/hf/qwen2-vl-7b-instruct.json --images 1 --image-size 450x300 --seq 1024 --gpu a100-80gb \
    --finetune lora --loss chunked-nll --no-probe --emit hf
if [ "$ec" -eq 0 ] && grep -qF "model = AutoModelForImageTextToText.from_pretrained(NAME" "$T/out" &&
    grep -qxF "SEQ, IMAGE_H, IMAGE_W = 1024, 448, 308" "$T/out" &&
    grep -qxF "processor = AutoProcessor.from_pretrained(NAME, min_pixels=3136, max_pixels=1003520)" "$T/out" &&
    grep -qxF "    max_length=SEQ," "$T/out" && grep -qF "processing_class=processor" "$T/out"; then
    ok "suggest --images 1 --emit hf: AutoModelForImageTextToText, the processor, 448 x 308, max_length"
else
    bad "suggest --images 1 --emit hf: AutoModelForImageTextToText, the processor, 448 x 308, max_length"
fi
# --images on Mistral 3 (Pixtral) and --image-size; refusals one line each
# Llama-3.2-11B-Vision, one image at batch 1 x 2,048, bf16, full (docs/memory-facts.md#mllama-images):
# 4 tiles of 560 px, 40 x 40 patches + the class token = P 1,601 a tile, padded to 1,608: T 6,432.
# Inputs: pixel_values 1 x 4 x 3 x 560 x 560 x 2 = 7,526,400, input_ids and labels 2,048 x 8 each,
# the int64 cross_attention_mask 2,048 x 4 x 8 = 65,536.  The embeddings block keeps the pre-tile
# lookup 4 x 1,280 x 2, the tile-position lookup and layernorm_pre's input 4 x 1,601 x 1,280 x 2
# each, its fp32 mean and rstd (6,404 rows), the tower's mask 6,432^2 x 2 and the padded output
# 6,432 x 1,280 x 2.  A local layer: 8 (M, D) bf16 tensors and 2 (M, F), M 6,432, D 1,280, F 5,120,
# SDPA's fp32 logsumexp 16 x 6,432, two LayerNorms' fp32 stats.  The projector's block: the cat
# (6,404 x 7,680), the cross-attention states (6,404 x 4,096), the kept cross-attention mask
# 2,048 x 6,404 and full_text_row_masked_out_mask 2,048, all bf16, less the last global layer's
# output it frees (6,432 x 1,280 x 2).
run estimate models/hf/llama-3.2-11b-vision.json --images 1 --batch 1 --seq 2048 --precision bf16 \
    --checkpoint none --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
a = {l["name"]: l["activation_bytes"] for l in r["layers"]}
assert r["memory"]["input_bytes"] == 7526400 + 2 * 16384 + 65536, r["memory"]["input_bytes"]
M, D, F, T, P = 6432, 1280, 5120, 6432, 4 * 1601
assert a["vision.embeddings"] == 4 * D * 2 + 2 * P * D * 2 + 2 * P * 4 + T * T * 2 + M * D * 2, a
assert a["vision.transformer.layers.1"] == 8 * M * D * 2 + 2 * M * F * 2 + 16 * T * 4 + 4 * M * 4, a
assert a["vision.projector"] == P * 7680 * 2 + P * 4096 * 2 + 2048 * P * 2 + 2048 * 2 - M * D * 2, a' "$T/out"; then
    ok "--images 1 on llama-3.2-11b-vision: inputs, the tower mask, a layer, the cross-attention mask hand-worked"
else
    bad "--images 1 on llama-3.2-11b-vision: inputs, the tower mask, a layer, the cross-attention mask hand-worked"
fi
# with images the cross-attention layers run: --train-blocks 3 trains layer 3 alone, a self-attention
# layer's 218,112,000 (above) plus q_norm and k_norm (128 each) and the two gates
run estimate models/hf/llama-3.2-11b-vision.json --images 1 --finetune freeze --train-blocks 3 --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
assert r["model"]["trainable_params"] == 218112000 + 2 * 128 + 2, r["model"]["trainable_params"]' "$T/out"; then
    ok "--train-blocks 3 on llama-3.2-11b-vision with images: the cross-attention layer trains"
else
    bad "--train-blocks 3 on llama-3.2-11b-vision with images: the cross-attention layer trains"
fi
expect_line 2 "--image-size without --images" estimate bench/accuracy/multimodal/mistral3-shrunk.json --image-size 224x224
# --train-blocks on mllama numbers the decoder layers as transformers does (language_model.layers.N,
# the table's h.N): 0-4 trains h.0, h.1, h.2, h.4 (3 is a cross-attention layer, skipped without
# images), 4 x 218,112,000 (q, o 4096^2, k, v 4096 x 1024, gate/up/down 4096 x 14336, two norms)
run estimate models/hf/llama-3.2-11b-vision.json --finetune freeze --train-blocks 0-4 --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
assert r["model"]["trainable_params"] == 4 * 218112000, r["model"]["trainable_params"]' "$T/out"; then
    ok "--train-blocks 0-4 on llama-3.2-11b-vision: h.0, h.1, h.2, h.4 train"
else
    bad "--train-blocks 0-4 on llama-3.2-11b-vision: h.0, h.1, h.2, h.4 train"
fi
expect_msg 2 "--train-blocks 3 on mllama: a cross-attention layer alone" "3 names only cross-attention layers" \
    estimate models/hf/llama-3.2-11b-vision.json --finetune freeze --train-blocks 3
expect_msg 2 "--train-blocks 40 on mllama: out of range" "numbered 0 to 39" \
    estimate models/hf/llama-3.2-11b-vision.json --finetune freeze --train-blocks 40
expect_line 2 "--image-size 224x: not HxW" estimate bench/accuracy/multimodal/mistral3-shrunk.json --images 1 --image-size 224x
expect_line 2 "--image-size 100x224: not a multiple of 28" estimate bench/accuracy/multimodal/mistral3-shrunk.json --images 1 --image-size 100x224
expect_line 2 "--image-size 252x224: above image_size 224" estimate bench/accuracy/multimodal/mistral3-shrunk.json --images 1 --image-size 252x224
expect_line 2 "--image-size on gemma3: only image_size" estimate bench/accuracy/multimodal/gemma3-shrunk.json --images 1 --image-size 112x112
expect_line 2 "--images 2 x 72 tokens exceed --seq 128" estimate bench/accuracy/multimodal/mistral3-shrunk.json --images 2 --seq 128
# Mistral-Small-3.1-24B, one 1540 x 1540 image at batch 1, amp-bf16 (fp32 weights): pixel_values
# 1 x 3 x 1540 x 1540 fp32 = 28,459,200 bytes, input_ids and labels 4,096 x 8 each, image_sizes
# 1 x 2 int64 = 16: 28,524,752 input bytes; 55 rows x (55 + 1) = 3,080 tokens, 110 x 110 = 12,100
# patches; the parameters as transformers counts the class (23,340,272,640), all trained (full)
run estimate models/hf/mistral-small-3.1-24b.json --images 1 --seq 4096 --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
assert r["model"]["params"] == 23340272640 and r["model"]["trainable_params"] == 23340272640, r["model"]
assert "unused_params" not in r["model"], r["model"]
assert r["memory"]["input_bytes"] == 28459200 + 2 * 32768 + 16, r["memory"]["input_bytes"]
assert r["config"]["images"] == {"per_sample": 1, "tokens_each": 3080, "image_size": 1540, "height": 1540,
                                 "width": 1540, "patches": 12100, "vision_layers": 24}, r["config"]["images"]' "$T/out"; then
    ok "--images 1 on mistral-small-3.1-24b: params, input bytes and config.images in --json"
else
    bad "--images 1 on mistral-small-3.1-24b: params, input bytes and config.images in --json"
fi
# --images on Llama 4: refusals one line each, and Scout's hand figure
expect_line 3 "llama4 --images with flash attention: refused (transformers has none for Llama 4)" estimate \
    bench/accuracy/multimodal/llama4-shrunk-images.json --images 1 --attention flash
# transformers 5.24 classes with _supports_flash_attn False (Llama4PreTrainedModel, modeling_llama4.py:450;
# Gemma3ForConditionalGeneration, modeling_gemma3.py:751; MllamaPreTrainedModel, modeling_mllama.py:783):
# flash refused text-only too; Gemma3ForCausalLM (gemma3_text) has it
expect_line 3 "llama4_text (Scout's text model) with flash attention: refused" estimate \
    models/hf/llama-4-scout-17b-16e-text.json --attention flash --seq 512
expect_line 3 "gemma3 multimodal, text-only, with flash attention: refused" plan models/hf/gemma-3-4b-it.json \
    --attention flash --seq 512 --gpu a100-80gb
expect_line 3 "mllama, text-only, with flash attention: refused" check models/hf/llama-3.2-11b-vision.json \
    --attention flash --seq 512 --gpu h100-80gb --batch 1
expect 0 "gemma3_text with flash attention: planned (Gemma3ForCausalLM supports it)" estimate \
    models/hf/gemma-3-1b.json --attention flash --seq 512
expect_line 2 "llama4 --images 2 x 121 tokens (224x336: 7 tiles) exceed --seq 200" estimate \
    bench/accuracy/multimodal/llama4-shrunk-images.json --images 2 --image-size 224x336 --seq 200
# Llama-4-Scout, one 672 x 448 image at batch 1, amp-bf16 (fp32 weights): Llama4ImageProcessor's
# canvas for it is 2 x 2 tiles of 336 (scale min(672/672, 672/448) = 1, the least upscaling and
# then the least area), plus the global tile: 5 tiles; pixel_values 5 x 3 x 336 x 336 fp32 =
# 6,773,760 bytes, input_ids and labels 1,024 x 8 each: 6,790,144 input bytes; 24 x 24 = 576 patches
# a tile (2,880), 144 patch tokens a tile after the 2 x 2 pixel shuffle: 3 + 5 x 144 + 4 separators
# = 727 tokens; the parameters as transformers counts the class (108,641,793,536), all trained
run estimate models/hf/llama-4-scout-17b-16e.json --images 1 --image-size 672x448 --seq 1024 --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
assert r["model"]["params"] == 108641793536 and r["model"]["trainable_params"] == 108641793536, r["model"]
assert "unused_params" not in r["model"], r["model"]
assert r["memory"]["input_bytes"] == 6773760 + 2 * 8192, r["memory"]["input_bytes"]
assert r["config"]["images"] == {"per_sample": 1, "tokens_each": 727, "image_size": 336, "asked_height": 672,
                                 "asked_width": 448, "height": 672, "width": 672, "tiles": 5, "patches": 2880,
                                 "vision_layers": 34}, r["config"]["images"]' "$T/out"; then
    ok "--images 1 --image-size 672x448 on llama-4-scout: params, input bytes and config.images in --json"
else
    bad "--images 1 --image-size 672x448 on llama-4-scout: params, input bytes and config.images in --json"
fi
# --torch: SDPA's math kernel for fp32 grouped-query attention before torch 2.15
# (docs/memory-facts.md#sdpa-math).  Qwen2-0.5B: 14 q heads, 2 k/v heads, head dim 64; batch 1,
# seq 64.  What the math kernel saves, from bench/accuracy/sdpa_math.py's trace of one call
# (saved_tensors_hooks, torch 2.15, CPU): the scaled q (b,a,s,d), the scaled k^T (b,a,d,s), the
# repeated v (b,a,s,d) and the probabilities (b,a,s,s), fp32:
#   3*1*14*64*64*4 + 1*14*64*64*4 = 688,128 + 229,376 = 917,504 bytes;
# instead of what the fused kernel saves (docs/memory-facts.md#saved-tensors): q 1*64*14*64*4 = 229,376,
# k and v 1*64*2*64*4 = 32,768 each, the fp32 logsumexp 1*14*64*4 = 3,584 (the output is o_proj's
# input either way): 298,496.  Every block: +619,008 bytes; the 24 blocks +14,856,192.
expect_line 2 "--torch 2.5: before the releases transformers takes" estimate models/hf/qwen2-0.5b.json --torch 2.5
expect_line 2 "--torch 2.x: not a release" estimate models/hf/qwen2-0.5b.json --torch 2.x
run estimate models/hf/qwen2-0.5b.json --batch 1 --seq 64 --precision fp32 --use-cache off --torch 2.15 --json
cp "$T/out" "$T/fused.json"
run estimate models/hf/qwen2-0.5b.json --batch 1 --seq 64 --precision fp32 --use-cache off --torch 2.11.0+cu130 --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys
f, m = (json.load(open(p)) for p in sys.argv[1:3])
d = [a["activation_bytes"] - b["activation_bytes"] for a, b in zip(m["layers"], f["layers"]) if a["type"] == "transformer_block"]
assert len(d) == 24 and set(d) == {917504 - 298496}, d
assert m["memory"]["activations_bytes"] - f["memory"]["activations_bytes"] == 24 * 619008
assert m["config"]["torch"] == "2.11" and m["config"]["sdpa_kernel"] == "math" and "sdpa_kernel" not in f["config"]' \
    "$T/fused.json" "$T/out"; then
    ok "--torch 2.11, fp32 GQA: the math kernel saves 619,008 bytes more per block (config.sdpa_kernel math)"
else
    bad "--torch 2.11, fp32 GQA: the math kernel saves 619,008 bytes more per block (config.sdpa_kernel math)"
fi
run estimate models/hf/qwen2-0.5b.json --batch 1 --seq 64 --precision amp-bf16 --use-cache off --torch 2.11 --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["config"]
assert "sdpa_kernel" not in c, c' "$T/out"; then
    ok "--torch 2.11 under amp-bf16: half q/k/v, a fused kernel (no sdpa_kernel)"
else
    bad "--torch 2.11 under amp-bf16: half q/k/v, a fused kernel (no sdpa_kernel)"
fi
# SDPA's kernel on the target (docs/memory-facts.md#sdpa-backend): Llama 3.2 1B (head dim 64, no
# mask) in bf16 runs cuDNN attention on an H100 (sm90), flash on an A100 (sm80); fp16 on a V100
# (sm70) the memory-efficient kernel; bf16 on a T4 (sm75) math.  Without a target: not said.
for gk in h100-80gb:amp-bf16:cudnn a100-80gb:amp-bf16:flash v100-16gb:amp-fp16:efficient t4:amp-bf16:math; do
    g=${gk%%:*}; k=${gk##*:}; pr=${gk#*:}; pr=${pr%%:*}
    run estimate models/hf/llama-3.2-1b.json --batch 1 --seq 128 --gpu "$g" --precision "$pr" --json
    if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["config"]
assert c["sdpa_kernel"] == sys.argv[2], c.get("sdpa_kernel")' "$T/out" "$k" 2>"$T/why"; then
        ok "estimate --gpu $g --precision $pr: config.sdpa_kernel $k"
    else
        bad "estimate --gpu $g --precision $pr: config.sdpa_kernel $k"
    fi
done
run estimate models/hf/llama-3.2-1b.json --batch 1 --seq 128 --gpu h100-80gb
if [ "$ec" -eq 0 ] && tr '\n' ' ' <"$T/out" | tr -s ' ' | grep -q "SDPA kernel cuDNN attention (torch 2.15 on sm90, bf16, head dim 64)"; then
    ok "estimate --gpu h100-80gb: the defaults line names cuDNN attention"
else
    echo "expected 'SDPA kernel cuDNN attention (torch 2.15 on sm90, bf16, head dim 64)' on the defaults line" >"$T/why"
    bad "estimate --gpu h100-80gb: the defaults line names cuDNN attention"
fi
run estimate models/hf/llama-3.2-1b.json --seq 128 --head seq-cls --num-labels 5 --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["model"]
# LlamaForSequenceClassification: the base model and score = Linear(2048, 5, bias=False)
assert m["class"] == "LlamaForSequenceClassification" and m["params"] == 1235814400 + 2048 * 5, m' "$T/out"; then
    ok "--head seq-cls --num-labels 5: model.class and the score's params in --json"
else
    bad "--head seq-cls --num-labels 5: model.class and the score's params in --json"
fi
run estimate models/hf/llama-3.2-1b.json --seq 128 --head seq-cls --num-labels 5
if [ "$ec" -eq 0 ] && grep -qx "class     LlamaForSequenceClassification, 5 labels (--head seq-cls, --num-labels)" \
    "$T/out"; then
    ok "--head seq-cls --num-labels 5: the report's class line names what was asked"
else
    bad "--head seq-cls --num-labels 5: the report's class line names what was asked"
fi
run suggest models/hf/llama-3.2-1b.json --seq 128 --head seq-cls --num-labels 5 --finetune lora --gpu t4 \
    --no-probe --emit hf
if [ "$ec" -eq 0 ] && grep -q "AutoModelForSequenceClassification.from_pretrained(NAME, .*num_labels=5)" "$T/out" &&
    grep -q 'task_type="SEQ_CLS"' "$T/out"; then
    ok "--emit hf loads the head asked with its classes (num_labels=5, task_type SEQ_CLS)"
else
    bad "--emit hf loads the head asked with its classes (num_labels=5, task_type SEQ_CLS)"
fi

# the packing hint of a recipe that pads: listed only where the packed rows are no fewer than the
# padded ones (under SDPA TRL's padding-free mask costs rows; with flash it costs none)
run suggest --recipe tests/data/recipes/trl-sft-lora.yaml --gpu t4 --no-probe --attention flash
if [ "$ec" -eq 0 ] && grep -q "would do better    --padding-free" "$T/out"; then
    ok "suggest --recipe (TRL, pads) with flash: --padding-free would do better"
else
    bad "suggest --recipe (TRL, pads) with flash: --padding-free would do better"
fi
run suggest --recipe tests/data/recipes/trl-sft-lora.yaml --gpu t4 --no-probe
if [ "$ec" -eq 0 ] && ! grep -q -- "--padding-free" "$T/out"; then
    ok "suggest --recipe (TRL, pads) under sdpa: no --padding-free hint (its mask lowers the micro-batch)"
else
    bad "suggest --recipe (TRL, pads) under sdpa: no --padding-free hint (its mask lowers the micro-batch)"
fi

# --loss / --label-fraction: unknown names, ranges, what is not modelled, heads other than a causal
# LM's, the probe: one line each; a modelled loss is recorded (config.loss) and named in the text
expect_line 2 "--loss: an unknown name" estimate models/hf/qwen3-0.6b.json --loss frobnicate
expect_msg 2 "--loss torchtune under autocast (torchtune runs none)" "--loss torchtune: torchtune trains without autocast" \
    estimate models/hf/qwen3-0.6b.json --loss torchtune
expect_msg 2 "--loss cce on fp32 weights (its backward asserts bf16/fp16)" "--loss cce: Cut Cross-Entropy's backward" \
    estimate models/hf/qwen3-0.6b.json --loss cce
# the heads' order on a 1B at 4096 tokens, LoRA in bf16 (loss_heads_results.md): torchtune keeps every row's
# fp32 log-probs, below hf (which adds the logits and their fp32 copy); cce keeps no V-sized tensor per row
pk() { run estimate models/hf/llama-3.2-1b.json --seq 4096 --precision bf16 --finetune lora --loss "$1" --json
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["memory"]["peak_allocated_bytes"])' "$T/out"; }
if command -v python3 >/dev/null 2>&1; then
    p_hf=$(pk hf); p_tt=$(pk torchtune); p_cce=$(pk cce)
    if [ "$p_cce" -lt "$p_tt" ] && [ "$p_tt" -lt "$p_hf" ]; then
        ok "--loss cce < torchtune < hf at 4096 tokens (peaks $p_cce, $p_tt, $p_hf)"
    else
        echo "peaks cce $p_cce, torchtune $p_tt, hf $p_hf" >"$T/why"
        bad "--loss cce < torchtune < hf at 4096 tokens"
    fi
else
    skipped "--loss cce / torchtune peaks (python3 not found)"
fi
expect_line 2 "--loss liger on a masked-LM head" estimate models/hf/bert-base-uncased.json --loss liger
# Liger 0.8.5 patches only the model types of its MODEL_TYPE_TO_APPLY_LIGER_FN (gpt2 is not one:
# use_liger_kernel leaves its loss HF's); a recipe's kernel left out of liger_kernel_config runs at
# the model's default (gemma's apply function takes geglu, not swiglu)
expect_msg 2 "--loss liger where Liger patches nothing" "Liger 0.8.5 patches no model_type 'gpt2'" \
    estimate models/hf/gpt2.json --loss liger
expect_msg 2 "use_liger_kernel on Gemma: its GeGLU left on" \
    "(tests/data/recipes/hf-liger.yaml:10: use_liger_kernel: true) Liger's geglu kernel is also on for model_type 'gemma'" \
    estimate models/hf/gemma-2b.json --recipe tests/data/recipes/hf-liger.yaml
run suggest models/hf/gemma-2b.json --gpu a100-80gb --seq 1024 --loss liger --emit hf
if [ "$ec" -eq 0 ] && grep -qF '"geglu": False' "$T/out" && grep -qF '"rope": False' "$T/out" &&
    grep -qF '"rms_norm": False' "$T/out" && ! grep -qF 'swiglu' "$T/out"; then
    ok "--emit hf --loss liger on Gemma: geglu, rope, rms_norm false (no swiglu: gemma's function has none)"
else
    bad "--emit hf --loss liger on Gemma: the kernels of apply_liger_kernel_to_gemma false"
fi
expect_line 2 "--loss chunked-nll on a model without an LM head" estimate models/tiny-mlp.json --loss chunked-nll
expect_line 2 "--label-fraction 0: out of range" estimate models/hf/qwen3-0.6b.json --label-fraction 0
expect_line 2 "--label-fraction above 1" estimate models/hf/qwen3-0.6b.json --label-fraction 1.5
expect_line 4 "probe --loss liger: refused" probe models/hf/qwen3-0.6b.json --seq 16 --backend host \
    --capacity 8GiB --loss liger
run estimate models/hf/qwen3-0.6b.json --seq 512 --loss chunked-nll --label-fraction 0.5
if [ "$ec" -eq 0 ] && grep -q "^loss      chunked-nll" "$T/out" && grep -q "label fraction 0.5" "$T/out"; then
    ok "--loss chunked-nll: the text report names the loss and the label fraction"
else
    echo "expected a 'loss      chunked-nll ...; label fraction 0.5' line" >"$T/why"
    bad "--loss chunked-nll: the text report names the loss and the label fraction"
fi
run estimate models/hf/qwen3-0.6b.json --seq 512 --finetune lora --json
cp "$T/out" "$T/loss_hf.json"
run estimate models/hf/qwen3-0.6b.json --seq 512 --finetune lora --loss chunked-nll --label-fraction 0.5 --json
if [ -z "$HAVE_PY" ]; then
    skipped "--loss: config.loss (python3 not found)"
elif python3 - "$T/loss_hf.json" "$T/out" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["config"]["loss"] == "hf" and a["config"]["label_fraction"] == 1, a["config"]
assert b["config"]["loss"] == "chunked-nll" and b["config"]["label_fraction"] == 0.5, b["config"]
assert b["memory"]["peak_allocated_bytes"] < a["memory"]["peak_allocated_bytes"]
PY
then
    ok "--loss: config.loss and label_fraction recorded; the chunked head's peak is below hf's"
else
    echo "expected config.loss hf / chunked-nll, label_fraction 1 / 0.5, a lower peak" >"$T/why"
    bad "--loss: config.loss and label_fraction recorded; the chunked head's peak is below hf's"
fi

# --packing / --padding-free / --tokens-per-batch: the rules, the refusals, what is recorded; the
# same tokens in one row (--tokens-per-batch 256) plan what --padding-free --batch 2 --seq 128 plans
expect_line 2 "--tokens-per-batch with --batch" estimate models/hf/qwen3-0.6b.json --tokens-per-batch 256 --batch 2
expect_line 2 "--tokens-per-batch with --seq" estimate models/hf/qwen3-0.6b.json --tokens-per-batch 256 --seq 64
expect_line 2 "--tokens-per-batch 0" estimate models/hf/qwen3-0.6b.json --tokens-per-batch 0
expect_line 2 "--packing on a masked-LM (bidirectional attention)" estimate models/hf/bert-base-uncased.json --packing
expect_line 2 "--packing on an encoder-decoder" estimate models/hf/flan-t5-base.json --packing
expect_line 2 "--packing with learned positions (GPT-2): not modelled yet" estimate models/hf/gpt2.json --packing
expect_line 2 "--packing: not a probe option" probe models/hf/qwen3-0.6b.json --packing --backend host
run estimate models/hf/qwen3-0.6b.json --seq 128 --batch 2 --packing
if [ "$ec" -eq 0 ] && grep -q "^packing   256 tokens per micro-batch (2 rows of packed documents" "$T/out"; then
    ok "--packing: the text report says the tokens per micro-batch"
else
    echo "expected a 'packing   256 tokens per micro-batch (2 rows ...' line" >"$T/why"
    bad "--packing: the text report says the tokens per micro-batch"
fi
run estimate models/hf/qwen3-0.6b.json --seq 128 --batch 2 --json
cp "$T/out" "$T/pk_none.json"
run estimate models/hf/qwen3-0.6b.json --seq 128 --batch 2 --packing --json
cp "$T/out" "$T/pk_rows.json"
run estimate models/hf/qwen3-0.6b.json --seq 128 --batch 2 --padding-free --json
cp "$T/out" "$T/pk_flat.json"
run estimate models/hf/qwen3-0.6b.json --tokens-per-batch 256 --json
if [ -z "$HAVE_PY" ]; then
    skipped "--packing: config.packing (python3 not found)"
elif python3 - "$T/pk_none.json" "$T/pk_rows.json" "$T/pk_flat.json" "$T/out" <<'PY'
import json, sys
n, r, f, t = (json.load(open(p)) for p in sys.argv[1:5])
assert "packing" not in n["config"] and "tokens_per_micro_batch" not in n["config"], n["config"]
assert r["config"]["packing"] == "rows" and r["config"]["tokens_per_micro_batch"] == 256, r["config"]
assert f["config"]["packing"] == "padding-free" and f["config"]["tokens_per_micro_batch"] == 256, f["config"]
assert t["config"]["packing"] == "padding-free" and t["config"]["batch"] == 1 and t["config"]["seq_len"] == 256
# SDPA's block-diagonal mask costs memory: rows above unpacked; one row of 256 squares 2 x 128
act = lambda d: d["memory"]["activations_bytes"]
assert act(n) < act(r) < act(f), (act(n), act(r), act(f))
assert act(t) == act(f) and t["memory"]["peak_allocated_bytes"] == f["memory"]["peak_allocated_bytes"]
PY
then
    ok "--packing: config.packing and tokens recorded; the mask's cost; --tokens-per-batch = --padding-free"
else
    echo "expected config.packing rows / padding-free, 256 tokens, peaks none < rows < flat = tokens" >"$T/why"
    bad "--packing: config.packing and tokens recorded; the mask's cost; --tokens-per-batch = --padding-free"
fi
run estimate models/hf/qwen3-0.6b.json --seq 128 --batch 2 --attention flash --json
cp "$T/out" "$T/pk_fl0.json"
run estimate models/hf/qwen3-0.6b.json --seq 128 --batch 2 --attention flash --packing --json
if [ -n "$HAVE_PY" ] && python3 - "$T/pk_fl0.json" "$T/out" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
# flash runs varlen (no mask): the bytes of unpacked rows, but the rotary tables of every row
d = b["memory"]["activations_bytes"] - a["memory"]["activations_bytes"]
assert 0 <= d < 1 << 20, d
PY
then
    ok "--packing under flash attention: no mask (varlen)"
else
    bad "--packing under flash attention: no mask (varlen)"
fi
# the device level (the caching allocator) is not monotone in the batch: Apertus-8B, bf16,
# checkpointed layers on an A100 80GB fits the allocated bytes up to micro-batch 8, but `check`
# finds micro-batch 4 fitting the allocator's segments and 1-3, 5-8 not.  suggest recommends the
# largest batch `check` passes, not "nothing fits" (it galloped down past 4 before), and lists
# expandable segments, under which `check` passes the allocated level's micro-batch
A="models/hf/apertus-8b-2509.json --gpu a100-80gb --precision bf16 --checkpoint layers"
verdicts=""
for b in 1 2 3 4 5 6 7 8 9; do
    run check $A --batch $b
    verdicts="$verdicts$b:$ec "
done
run suggest $A --no-probe --json
if [ -z "$HAVE_PY" ]; then
    skipped "suggest: the device level's largest fitting batch (python3 not found)"
elif python3 - "$T/out" "$verdicts" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
v = {int(b): int(e) for b, e in (x.split(":") for x in sys.argv[2].split())}
fit = [b for b, e in v.items() if e == 0]
assert fit and v[1] == 1 and max(fit) < 9, v  # the case this test is for: b1 fails, some b fits
r = d["recommendation"]
assert r["micro_batch"] == max(fit), (r["micro_batch"], v)
alts = d["alternatives"]
assert any(a.startswith("--alloc-conf expandable_segments:True") for a in alts), alts
PY
then
    ok "suggest: the largest batch check passes at the device level (not monotone), expandable listed"
else
    echo "expected suggest's micro-batch to be the largest batch 'check' passes: $verdicts" >"$T/why"
    bad "suggest: the largest batch check passes at the device level (not monotone), expandable listed"
fi
expect 0 "check --alloc-conf expandable_segments:True: the allocated level's micro-batch fits" check $A --batch 8 \
    --alloc-conf expandable_segments:True
# --trainer (TRL 1.16.0): sft is today's step (no trainer keys in its JSON); dpo's batch counts pairs
# (2 sequences each) through the fused head; its reference is a resident copy (full), the adapter
# disabled (LoRA) or none (--precompute-ref); what is not modelled is refused, one line each
# orpo (trl 1.16 experimental/orpo): the model's own logits and ORPO's loss; what it does not run is
# refused, one line each
expect_msg 2 "--trainer orpo --loss chunked-nll (ORPO's loss is on the model's logits)" "(--loss hf)" \
    estimate models/hf/qwen3-0.6b.json --trainer orpo --loss chunked-nll
expect_msg 2 "--trainer orpo --packing (ORPO pads its pairs)" "pads chosen and rejected" \
    estimate models/hf/qwen3-0.6b.json --trainer orpo --packing
expect_msg 2 "suggest --trainer orpo --emit torch (an SFT loop)" "writes the ORPOConfig" \
    suggest models/hf/qwen3-0.6b.json --trainer orpo --gpu a100-40gb --no-probe --emit torch
expect_msg 2 "--trainer orpo on a masked LM" "a masked-LM head: not modelled" \
    estimate models/hf/bert-base-uncased.json --trainer orpo
expect_msg 2 "--trainer orpo on an encoder-decoder" "an encoder-decoder model: not modelled" \
    estimate models/hf/flan-t5-base.json --trainer orpo
expect_msg 2 "--trainer orpo on a classifier" "--trainer orpo: the model has no causal LM head" \
    estimate tests/data/hf-bert-base-seqcls.json --trainer orpo
sed 's/^beta: 0.1$/packing: true/' tests/data/recipes/trl-orpo-lora.yaml >"$T/orpo-packing.yaml"
expect_msg 3 "an ORPOConfig recipe with packing (not an ORPOConfig key)" "orpo-packing.yaml:13: packing" \
    estimate --trainer orpo --recipe "$T/orpo-packing.yaml"
if [ -n "$HAVE_PY" ]; then
    # TRL's trainers pass use_cache=False to the training forward: the DynamicCache's copies are not
    # planned unless --use-cache on says so (Qwen2-0.5B's config has use_cache true); ORPOConfig
    # defaults: disable_dropout, gradient checkpointing
    run estimate models/hf/qwen2-0.5b.json --trainer orpo --batch 2 --seq 256 --json
    cp "$T/out" "$T/orpo.json"
    run estimate models/hf/qwen2-0.5b.json --trainer orpo --batch 2 --seq 256 --use-cache off --json
    cp "$T/out" "$T/orpo-off.json"
    run estimate models/hf/qwen2-0.5b.json --trainer orpo --batch 2 --seq 256 --use-cache on --json
    cp "$T/out" "$T/orpo-on.json"
    run estimate --trainer orpo --recipe tests/data/recipes/trl-orpo-lora.yaml --json
    if python3 - "$T/orpo.json" "$T/orpo-off.json" "$T/orpo-on.json" "$T/out" <<'PY' 2>"$T/why"
import json, sys
d, off, on, rec = (json.load(open(f)) for f in sys.argv[1:5])
c = d["config"]
assert c["trainer"] == "orpo" and c["sequences"] == 4 and c["reference"] == "none" and c["loss"] == "hf", c
assert c["disable_dropout"] is True, c
# (the cache's copies die with the forward: here they move the forward's FLOPs (torch.cat), not the peak)
m = lambda j: (j["memory"]["peak_allocated_bytes"], j["memory"]["fwd_flops"])
assert m(d) == m(off) and m(d)[1] < m(on)[1], (m(d), m(off), m(on))
r = rec["config"]
assert r["trainer"] == "orpo" and r["batch"] == 2 and r["sequences"] == 4 and r["seq_len"] == 1024, r
assert r["checkpoint"] == "layers" and r["loss"] == "hf" and r["finetune"]["mode"] == "lora", r
assert r["recipe"]["trainer"].startswith("TRL 1.16.0 ORPOTrainer"), r["recipe"]
PY
    then
        ok "--trainer orpo: 2 sequences a pair, no reference, use_cache off (TRL's), its recipe (ORPOConfig)"
    else
        bad "--trainer orpo: 2 sequences a pair, no reference, use_cache off (TRL's), its recipe (ORPOConfig)"
    fi
else
    skipped "--trainer orpo's JSON (python3 not found)"
fi
expect_line 2 "--trainer: an unknown name" estimate models/hf/qwen3-0.6b.json --trainer ppo
expect_line 2 "--precompute-ref without --trainer dpo or kto" estimate models/hf/qwen3-0.6b.json --precompute-ref
expect_line 2 "--trainer kto --batch 1 (TRL's KL term needs 2 examples)" estimate models/hf/qwen3-0.6b.json \
    --trainer kto --batch 1
expect_line 2 "--trainer kto-apo --loss hf (TRL's KTOTrainer's head is its fused one)" \
    estimate models/hf/qwen3-0.6b.json --trainer kto-apo --loss hf
expect_msg 2 "--trainer dpo --finetune lora under FSDP (TRL's fused head on a sharded lm_head)" \
    "the fused LM head reads lm_head.weight, which peft leaves out of FSDP2's gathered units" \
    estimate models/hf/qwen3-0.6b.json --trainer dpo --finetune lora --gpus 2 --parallel fsdp
expect_msg 2 "--loss chunked-nll --finetune qlora under FSDP (the same)" "(--loss hf is)" \
    estimate models/hf/qwen3-0.6b.json --loss chunked-nll --finetune qlora --gpus 2 --parallel fsdp
expect_msg 2 "--loss cce --finetune lora under FSDP (a DTensor weight, which CCE refuses)" "which it refuses" \
    estimate models/hf/qwen3-0.6b.json --loss cce --precision bf16-amp --finetune lora --gpus 2 --parallel fsdp
expect_msg 2 "--loss cce under ZeRO-3 (it gathers the weight itself)" "(GatheredParameters)" \
    estimate models/hf/qwen3-0.6b.json --loss cce --precision bf16 --gpus 2 --parallel zero3
expect_msg 2 "--loss torchtune under DDP (torchtune's own sharding)" "training.shard_model" \
    estimate models/hf/qwen3-0.6b.json --loss torchtune --precision bf16 --gpus 2 --parallel ddp
# GRPO under ZeRO-3 / FSDP2: what generate.c does not model, one line each
expect_msg 2 "--trainer grpo --vllm under ZeRO-3 (vLLM's weight sync gathers itself)" \
    "vLLM's weight sync from a sharded policy is not modelled yet" \
    estimate models/hf/qwen3-0.6b.json --trainer grpo --vllm 0.3 --gpus 2 --parallel zero3
expect_msg 2 "--trainer grpo --finetune qlora under ZeRO-3" "generation from a sharded 4-bit base" \
    estimate models/hf/qwen3-0.6b.json --trainer grpo --finetune qlora --gpus 2 --parallel zero3
expect_msg 2 "--trainer grpo --offload params under ZeRO-3" "generation from offloaded parameters" \
    estimate models/hf/qwen3-0.6b.json --trainer grpo --gpus 2 --parallel zero3 --offload params
expect_msg 2 "--ds3-gather without --trainer grpo" "--vllm-correction and --ds3-gather need --trainer grpo" \
    estimate models/hf/qwen3-0.6b.json --ds3-gather off --gpus 2 --parallel zero3
expect_line 2 "suggest --trainer kto --max-batch 1 (below KTO's 2)" suggest models/hf/qwen3-0.6b.json --trainer kto \
    --gpu a100-40gb --no-probe --max-batch 1
# nothing fits a KTO step: the alternatives are at its least micro-batch, 2; no FSDP2 world fits
# on a T4 (TRL's reference copy is one FSDP2 unit gathered whole on every rank), a ZeRO-3 one
# does (the copy partitioned by its own stage-3 engine)
run suggest models/hf/llama-3-8b.json --trainer kto --gpu t4 --no-probe
if [ "$ec" = 1 ] && grep -q "even micro-batch 2 with every" "$T/out" && grep -q "at micro-batch 2" "$T/out" &&
    ! grep -q "micro-batch 1" "$T/out" &&
    tr '\n' ' ' <"$T/out" | tr -s ' ' | grep -q "would fit or help: --gpus [0-9]* .*--parallel zero3"; then
    ok "suggest --trainer kto, nothing fits: micro-batch 2 throughout, a ZeRO-3 world (the reference partitioned)"
else
    echo "expected exit 1, 'micro-batch 2', no micro-batch 1, and a ZeRO-3 world" >"$T/why"
    bad "suggest --trainer kto, nothing fits: micro-batch 2 throughout, a ZeRO-3 world (the reference partitioned)"
fi
expect_line 3 "a KTOConfig loss_type without a KL term read with --trainer kto: refused, naming kto-apo" \
    estimate --trainer kto --recipe tests/data/recipes/trl-kto-apo.yaml
if grep -q "trl-kto-apo.yaml:6: loss_type: apo_zero_unpaired: .*--trainer kto-apo" "$T/err"; then
    ok "the refusal names the file's line 6 and --trainer kto-apo"
else
    bad "the refusal names the file's line 6 and --trainer kto-apo"
fi
expect_line 3 "--trainer kto-apo on a KTOConfig without its loss_type (the default kto): refused" \
    estimate --trainer kto-apo --recipe tests/data/recipes/trl-kto-lora.yaml
# kto-apo (TRL 1.16 kto_trainer.py:815, 844): no KL term, so no KL forwards and one example a device is
# enough; one reference forward.  Its step holds what kto's does less the KL sequences' forwards.
if [ -n "$HAVE_PY" ]; then
    run estimate --trainer kto-apo --recipe tests/data/recipes/trl-kto-apo.yaml --batch 1 --json
    cp "$T/out" "$T/apo.json"
    run estimate --trainer kto --recipe tests/data/recipes/trl-kto-lora.yaml --json
    if python3 -c '
import json, sys
a = json.load(open(sys.argv[1]))
c, m = a["config"], a["memory"]
assert c["trainer"] == "kto-apo" and c["batch"] == 1 and c["reference"] == "copy", c
assert c["recipe"]["settings"]["batch"]["source"] == "command line"
r = m["phases"]["reference_forward"]
assert r["peak_event"].startswith("reference.forward:"), r
assert a["memory"]["peak_allocated_bytes"] == max(m["phases"]["policy_step"]["peak_allocated_bytes"],
                                                   r["peak_allocated_bytes"])
' "$T/apo.json" 2>"$T/why"; then
        ok "--trainer kto-apo --recipe: loss_type apo_zero_unpaired read, one example a device, one reference phase"
    else
        bad "--trainer kto-apo --recipe: loss_type apo_zero_unpaired read, one example a device, one reference phase"
    fi
    # the same step's FLOPs: kto runs four forwards (KL and batch, each twice: policy and reference),
    # kto-apo two (the batch: policy and reference)
    run estimate models/hf/qwen2-0.5b.json --trainer kto --batch 2 --seq 256 --json
    cp "$T/out" "$T/kto2.json"
    run estimate models/hf/qwen2-0.5b.json --trainer kto-apo --batch 2 --seq 256 --json
    if python3 -c '
import json, sys
k, a = (json.load(open(f))["memory"] for f in sys.argv[1:])
assert abs(k["fwd_flops"] - 2 * a["fwd_flops"]) <= 1e-9 * k["fwd_flops"], (k["fwd_flops"], a["fwd_flops"])
' "$T/kto2.json" "$T/out" 2>"$T/why"; then
        ok "--trainer kto-apo: two forwards of the batch (kto: four)"
    else
        bad "--trainer kto-apo: two forwards of the batch (kto: four)"
    fi
fi
expect_line 3 "a KTOConfig at one example a device: refused, naming the key" estimate --trainer kto \
    --recipe tests/data/recipes/trl-kto-batch1.yaml
expect_line 2 "--trainer kto --loss liger (KTO's head is TRL's fused one; hf is LLaMA-Factory's)" \
    estimate models/hf/qwen3-0.6b.json --trainer kto --loss liger
# under ZeRO-1/2 prepare_deepspeed gives the copy a stage-0 engine: whole on each rank, in the
# policy's bf16 (494,032,768 parameters x 2 B), its forward as on one GPU
if [ -n "$HAVE_PY" ]; then
    run estimate models/hf/qwen2-0.5b.json --trainer dpo --batch 2 --seq 512 --precision bf16 --gpus 2 --parallel zero2 \
        --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
assert m["ref_weights_bytes"] == 494032768 * 2, m["ref_weights_bytes"]
assert m["phases"]["policy_step"]["peak_allocated_bytes"] > m["ref_weights_bytes"], m["phases"]
' "$T/out" 2>"$T/why"; then
        ok "--trainer dpo under ZeRO-2: the reference copy whole on each rank in bf16 (988,065,536 B)"
    else
        bad "--trainer dpo under ZeRO-2: the reference copy whole"
    fi
    cp "$T/out" "$T/dpo-z2.json"
    # under ZeRO-3 the copy keeps its own stage-3 engine (persistence threshold 10 x 896): each
    # parameter of 8,960 or more elements partitioned, ceil(n / 2), the biases and norms whole, in bf16;
    # its forward fetches each block's parameters, the head its tied embedding (136,134,656 x 2 B)
    run estimate models/hf/qwen2-0.5b.json --trainer dpo --batch 2 --seq 512 --precision bf16 --gpus 2 --parallel zero3 \
        --json
    if [ "$ec" -eq 0 ] && python3 - "$T/dpo-z2.json" "$T/out" <<'PY' 2>"$T/why"
import json, sys
z2, z3 = (json.load(open(f))["memory"] for f in sys.argv[1:3])
h, L, V, I, kv, W = 896, 24, 151936, 4864, 128, 2
part = lambda n: n if n < 10 * h else -(-n // W)
layer = [h * h, h, h * kv, kv, h * kv, kv, h * h, h * I, h * I, I * h, h, h]
want = 2 * (part(V * h) + L * sum(part(n) for n in layer) + part(h))
assert z3["ref_weights_bytes"] == want == 494104320, (z3["ref_weights_bytes"], want)
d = z3["phases"]["reference_forward"]["tmp_bytes"] - z2["phases"]["reference_forward"]["tmp_bytes"]
assert d == V * h * 2, (d, V * h * 2)
PY
    then
        ok "--trainer dpo under ZeRO-3: the copy partitioned (494,104,320 B a rank), the head fetches the embedding"
    else
        bad "--trainer dpo under ZeRO-3: the copy partitioned, fetched block by block"
    fi
fi
# under DDP TRL prepares the reference with prepare_model(evaluation_mode=True), which wraps nothing:
# a whole frozen copy on each rank; the policy's DDP buckets are resident through both phases
if [ -n "$HAVE_PY" ]; then
    run estimate models/hf/qwen2-0.5b.json --trainer dpo --batch 2 --seq 512 --precision bf16 --json
    cp "$T/out" "$T/dpo1.json"
    run estimate models/hf/qwen2-0.5b.json --trainer dpo --batch 2 --seq 512 --precision bf16 --gpus 2 --parallel ddp \
        --json
    cp "$T/out" "$T/dpo2.json"
    run suggest models/hf/qwen2-0.5b.json --trainer dpo --gpu a100-40gb --gpus 4 --no-probe --json
    if python3 - "$T/dpo1.json" "$T/dpo2.json" "$T/out" <<'PY' 2>"$T/why"
import json, sys
one, two, sg = (json.load(open(f)) for f in sys.argv[1:4])
m1, m2 = one["memory"], two["memory"]
# Qwen2-0.5B in bf16: 494,032,768 parameters x 2 B, the reference copy on each rank
assert m1["ref_weights_bytes"] == m2["ref_weights_bytes"] == 494032768 * 2, (m1["ref_weights_bytes"], m2)
b = m2["buffers_bytes"]  # DDP's buckets (no bucket view: a second copy of the gradients)
assert abs(b - 494032768 * 2) < 1 << 20, b
for ph in ("policy_step", "reference_forward"):
    d = m2["phases"][ph]["peak_allocated_bytes"] - m1["phases"][ph]["peak_allocated_bytes"]
    assert abs(d - b) < 1 << 16, (ph, d, b)
strategies = {c["parallel"]["strategy"] for c in sg["candidates"]}
assert {"ddp", "zero1", "zero2", "zero3", "fsdp"} <= strategies, strategies
PY
    then
        ok "--trainer dpo under DDP: a whole reference copy per rank, both phases + the buckets; suggest: every strategy"
    else
        bad "--trainer dpo under DDP: a whole reference copy per rank, both phases + the buckets; suggest: every strategy"
    fi
    # FSDP2: TRL's prepare_fsdp makes the copy one unit: each rank keeps its shard (every dim 0 of
    # Qwen2-0.5B is even: half the bf16 bytes), gathers all of it for its forward beside the flat
    # all-gather output (2 x 988,065,536 bytes, each 512-rounded, more than one GPU's reference
    # forward), and without
    # reshard_after_forward keeps it gathered (shard + whole, resident)
    run estimate models/hf/qwen2-0.5b.json --trainer dpo --batch 2 --seq 512 --precision bf16 --gpus 2 \
        --parallel fsdp --json
    cp "$T/out" "$T/dpo3.json"
    run estimate models/hf/qwen2-0.5b.json --trainer dpo --batch 2 --seq 512 --precision bf16 --gpus 2 \
        --parallel fsdp-no-reshard --json
    if python3 - "$T/dpo1.json" "$T/dpo3.json" "$T/out" <<'PY' 2>"$T/why"
import json, sys
one, fs, nr = (json.load(open(f)) for f in sys.argv[1:4])
whole = 494032768 * 2
assert fs["memory"]["ref_weights_bytes"] == whole // 2, fs["memory"]["ref_weights_bytes"]
assert nr["memory"]["ref_weights_bytes"] == whole // 2 + whole, nr["memory"]["ref_weights_bytes"]
t1 = one["memory"]["phases"]["reference_forward"]["tmp_bytes"]
tf = fs["memory"]["phases"]["reference_forward"]["tmp_bytes"]
tn = nr["memory"]["phases"]["reference_forward"]["tmp_bytes"]
rounded = (whole + 511) // 512 * 512  # (each a CUDA caching allocator block)
assert tf == t1 + 2 * rounded and tn == t1, (t1, tf, tn)
PY
    then
        ok "--trainer dpo under FSDP2: the reference one unit (its shard; gathered whole + the flat output to run)"
    else
        bad "--trainer dpo under FSDP2: the reference one unit (its shard; gathered whole + the flat output to run)"
    fi
else
    skipped "--trainer dpo under DDP (python3 not found)"
fi
expect_line 2 "probe --trainer: the option does not apply" probe models/hf/qwen3-0.6b.json --trainer dpo
expect_line 2 "suggest --trainer dpo --emit torch (an SFT loop)" suggest models/hf/qwen3-0.6b.json --trainer dpo \
    --gpu a100-40gb --no-probe --emit torch
expect_line 3 "a DPOConfig key read as SFTConfig: refused with the hint" estimate \
    --recipe tests/data/recipes/trl-dpo-full.yaml
D="models/hf/llama-3.2-1b.json --batch 2 --seq 512 --precision bf16 --checkpoint layers --json"
run estimate $D --trainer sft --loss chunked-nll
cp "$T/out" "$T/sft2.json"
run estimate models/hf/llama-3.2-1b.json --batch 4 --seq 512 --precision bf16 --checkpoint layers --json \
    --loss chunked-nll
cp "$T/out" "$T/sft4.json"
run estimate $D --trainer dpo --precompute-ref
cp "$T/out" "$T/dpo_pre.json"
run estimate $D --trainer dpo
cp "$T/out" "$T/dpo_copy.json"
L="models/hf/llama-3.2-1b.json --batch 2 --seq 2048 --precision bf16 --checkpoint layers --json"
run estimate $L --trainer dpo
cp "$T/out" "$T/dpo_copy_long.json"
run estimate $L --trainer dpo --finetune lora
cp "$T/out" "$T/dpo_lora_long.json"
run estimate $D --trainer dpo --finetune lora
if [ -z "$HAVE_PY" ]; then
    skipped "--trainer dpo: phases and reference (python3 not found)"
elif python3 - "$T/sft2.json" "$T/sft4.json" "$T/dpo_pre.json" "$T/dpo_copy.json" "$T/out" \
    "$T/dpo_copy_long.json" "$T/dpo_lora_long.json" <<'PY'
import json, sys
sft2, sft4, pre, copy, lora, copy_long, lora_long = (json.load(open(p)) for p in sys.argv[1:8])
assert "trainer" not in sft2["config"] and "phases" not in sft2["memory"], "sft's JSON gained keys"
# 2 pairs are 4 sequences: with precomputed log-probs the step is SFT's at batch 4
assert pre["config"]["sequences"] == 4 and pre["config"]["reference"] == "none"
assert pre["memory"]["peak_allocated_bytes"] == sft4["memory"]["peak_allocated_bytes"]
assert "phases" not in pre["memory"]
# the copy: Llama-3.2-1B's 1,235,814,400 parameters again in bf16, 2 bytes each
m = copy["memory"]
assert copy["config"]["reference"] == "copy" and m["ref_weights_bytes"] == 1235814400 * 2, m
pol, ref = m["phases"]["policy_step"], m["phases"]["reference_forward"]
assert pol["peak_allocated_bytes"] == pre["memory"]["peak_allocated_bytes"] + m["ref_weights_bytes"]
assert m["peak_allocated_bytes"] == max(pol["peak_allocated_bytes"], ref["peak_allocated_bytes"])
assert ref["tmp_bytes"] > 0 and ref["peak_event"].startswith("reference.forward:"), ref
# LoRA: the policy with its adapter disabled, no copy
assert lora["config"]["reference"] == "adapter-disabled" and lora["memory"]["ref_weights_bytes"] == 0
assert lora["memory"]["peak_allocated_bytes"] >= lora["memory"]["phases"]["reference_forward"]["peak_allocated_bytes"]
# peft's disable_adapter runs each adapted Linear's base layer alone: the reference forward is the
# bf16 base model's, the copy's transients exactly, with no LoRA op in it (at 2 x 2048 tokens a
# layer's MLP, not the head, sets it; the GPU kit measured it so, bench/gpu/reestimate.py)
lref, cref = (x["memory"]["phases"]["reference_forward"] for x in (lora_long, copy_long))
assert ".mlp." in cref["peak_event"], cref
assert lref["tmp_bytes"] == cref["tmp_bytes"] and lref["peak_event"] == cref["peak_event"], (lref, cref)
PY
then
    ok "--trainer dpo: pairs are 2 sequences; the copy, the adapter, precomputed; the peak is the larger phase"
else
    echo "expected the DPO relations in the script above" >"$T/why"
    bad "--trainer dpo: pairs are 2 sequences; the copy, the adapter, precomputed; the peak is the larger phase"
fi
# --trainer kto: one sequence an example (the policy's step is DPO's at half the examples: the same
# sequences through the same fused head), its reference the same phase; 2 examples at least
# (estimate's default batch says so); its FLOPs four forwards (the KL sequences by the policy and
# by the reference, the batch by both), two with precomputed log-probs (the policy's KL forward)
run estimate $D --trainer kto --batch 4
cp "$T/out" "$T/kto_copy.json"
run estimate $D --trainer kto --batch 4 --precompute-ref
cp "$T/out" "$T/kto_pre.json"
run estimate models/hf/llama-3.2-1b.json --trainer kto --seq 512 --json
cp "$T/out" "$T/kto_default.json"
if [ -z "$HAVE_PY" ]; then
    skipped "--trainer kto: the step and its reference (python3 not found)"
elif python3 - "$T/dpo_copy.json" "$T/kto_copy.json" "$T/dpo_pre.json" "$T/kto_pre.json" "$T/sft4.json" \
    "$T/kto_default.json" <<'PY'
import json, sys
dpo, kto, dpo_pre, kto_pre, sft4, dflt = (json.load(open(p)) for p in sys.argv[1:7])
assert kto["config"]["trainer"] == "kto" and kto["config"]["sequences"] == 4, kto["config"]
assert kto["memory"]["peak_allocated_bytes"] == dpo["memory"]["peak_allocated_bytes"]
assert kto["memory"]["phases"] == dpo["memory"]["phases"]
assert kto_pre["memory"]["peak_allocated_bytes"] == dpo_pre["memory"]["peak_allocated_bytes"]
f = sft4["memory"]["fwd_flops"]
fk, fp = kto["memory"]["fwd_flops"], kto_pre["memory"]["fwd_flops"]
assert abs(fk - 4 * f) <= 1e-6 * f and abs(fp - 2 * f) <= 1e-6 * f, (fk, fp, f)
assert dflt["config"]["batch"] == 2, dflt["config"]
PY
then
    ok "--trainer kto: the policy's step and reference as DPO's at the same sequences; 2 examples at least"
else
    echo "expected the KTO relations in the script above" >"$T/why"
    bad "--trainer kto: the policy's step and reference as DPO's at the same sequences; 2 examples at least"
fi
# a quantized base's dequantization traffic (memory.dequant_bytes, charged at the bandwidth by
# suggest): the same bytes every pass: forward and backward (SFT), a recompute of every block more
# (layers), KTO's KL forward and two adapter-disabled reference forwards more; none without one
Q="models/hf/llama-3.2-1b.json --finetune qlora --batch 2 --seq 256 --json"
run estimate $Q --checkpoint none
cp "$T/out" "$T/dq_none.json"
run estimate $Q --checkpoint layers
cp "$T/out" "$T/dq_layers.json"
run estimate $Q --checkpoint none --trainer kto
cp "$T/out" "$T/dq_kto.json"
run estimate models/hf/llama-3.2-1b.json --finetune lora --batch 2 --seq 256 --json
if [ -z "$HAVE_PY" ]; then
    skipped "dequant_bytes: one amount a pass (python3 not found)"
elif python3 - "$T/dq_none.json" "$T/dq_layers.json" "$T/dq_kto.json" "$T/out" <<'PY'
import json, sys
none, layers, kto, lora = (json.load(open(p))["memory"] for p in sys.argv[1:5])
one = none["dequant_bytes"] / 2  # forward + backward
assert one > 0 and "dequant_bytes" not in lora, (none, lora.get("dequant_bytes"))
assert abs(layers["dequant_bytes"] - 3 * one) <= 1e-9 * one, (layers["dequant_bytes"], one)
assert abs(kto["dequant_bytes"] - 5 * one) <= 1e-9 * one, (kto["dequant_bytes"], one)
PY
then
    ok "dequant_bytes: one amount a pass (forward, backward, recompute, KTO's no-grad forwards)"
else
    echo "expected dequant_bytes in the ratios of the script above" >"$T/why"
    bad "dequant_bytes: one amount a pass (forward, backward, recompute, KTO's no-grad forwards)"
fi
# --ep (issue 28): transformers' expert parallelism, DistributedConfig(fsdp_size=W, ep_size=N). By
# hand: an expert is gate_up (2F x h) + down (h x F) = 3 F h elements (Mixtral-8x7B: F 14336, h 4096;
# Qwen3-30B-A3B: F 768, h 2048). A rank holds E/N experts of each layer, FSDP2-sharded on dim 0 over
# the W/N ranks holding the same ones (padded: ceil). mixed-bf16 keeps fp32 shards, gathers bf16, so
# weights = layers x ceil(E/N / (W/N)) x 3Fh x 4, gradients the same (fp32 reduce), AdamW twice that;
# one layer's experts unit gathered = W/N x ceil(E/N / (W/N)) x 3Fh x 2 bytes (padded shards).
for c in "mixtral-8x7b 32 8 14336 4096 8 2" "mixtral-8x7b 32 8 14336 4096 8 4" "mixtral-8x7b 32 8 14336 4096 8 8" \
    "mixtral-8x7b 32 8 14336 4096 6 2" "qwen3-30b-a3b 48 128 768 2048 8 2" "qwen3-30b-a3b 48 128 768 2048 8 4" \
    "qwen3-30b-a3b 48 128 768 2048 8 8"; do
    set -- $c
    run estimate "models/hf/$1.json" --precision mixed-bf16 --gpus "$6" --parallel fsdp --ep "$7" --seq 1024 --json
    if [ -z "$HAVE_PY" ]; then
        skipped "--ep $7 x$6 $1: per-rank expert bytes (python3 not found)"
    elif [ "$ec" -eq 0 ] && python3 - "$T/out" "$@" <<'PY' 2>"$T/why"
import json, sys
j = json.load(open(sys.argv[1]))
L, E, F, h, W, N = (int(v) for v in sys.argv[3:9])
expert = 3 * F * h
local, efsdp = E // N, W // N
per_rank = L * -(-local // efsdp) * expert
x = j["memory"]["experts"]
# (the all-gather output: efsdp padded shards, what the unsharded stacks are views of)
want = {"ep": N, "efsdp": efsdp, "weights_bytes": per_rank * 4, "grads_bytes": per_rank * 4,
        "optimizer_bytes": per_rank * 8, "gathered_unit_bytes": efsdp * -(-local // efsdp) * expert * 2}
assert x == want, (x, want)
assert j["config"]["parallel"]["ep"] == N and j["config"]["moe"]["experts_per_rank"] == local
# tokens x top-k rows reach a rank's experts under uniform routing
assert j["config"]["moe"]["received_rows_per_rank"] == 1024 * j["config"]["moe"]["top_k"]
PY
    then
        ok "--ep $7 x$6 $1: per-rank expert bytes equal the arithmetic"
    else
        bad "--ep $7 x$6 $1: per-rank expert bytes equal the arithmetic"
    fi
done
# suggest --gpus alone searches FSDP2 with the largest ep dividing the world and the experts
run suggest models/hf/mixtral-8x7b.json --gpu h100-80gb --gpus 8 --seq 1024 --no-probe --json
if [ -z "$HAVE_PY" ]; then
    skipped "suggest --gpus 8 mixtral: an fsdp + ep 8 candidate (python3 not found)"
elif [ "$ec" -le 1 ] && python3 - "$T/out" <<'PY' 2>"$T/why"
import json, sys
j = json.load(open(sys.argv[1]))
eps = {c["parallel"].get("ep", 1) for c in j["candidates"] if c["parallel"]["strategy"] == "fsdp"}
assert eps == {1, 8}, eps
PY
then
    ok "suggest --gpus 8 mixtral: an fsdp + ep 8 candidate beside plain fsdp"
else
    bad "suggest --gpus 8 mixtral: an fsdp + ep 8 candidate beside plain fsdp"
fi
expect_line 2 "--ep without FSDP2: refused" estimate models/hf/mixtral-8x7b.json --gpus 8 --parallel zero3 --ep 2
expect_line 2 "--ep not dividing the world: refused" estimate models/hf/mixtral-8x7b.json --gpus 6 --parallel fsdp --ep 4
expect_line 2 "--ep not dividing the experts: refused" estimate models/hf/mixtral-8x7b.json --gpus 16 --parallel fsdp --ep 16
expect_line 2 "--ep with LoRA: refused (not modelled)" estimate models/hf/mixtral-8x7b.json --finetune lora --gpus 8 \
    --parallel fsdp --ep 2
expect_line 2 "--ep on a dense model: refused" estimate models/hf/llama-3-8b.json --gpus 8 --parallel fsdp --ep 2
# --ep with --offload params: transformers' fsdp_cpu_offload gives every unit CPUOffloadPolicy, the
# experts' too: the weights, gradients and optimizer state planned without offload all on the host
# (none of them, the experts' share included, on the GPU), DistributedConfig(fsdp_cpu_offload=True)
if [ -n "$HAVE_PY" ]; then
    run estimate models/hf/mixtral-8x7b.json --gpus 8 --parallel fsdp --ep 4 --seq 1024 --json
    cp "$T/out" "$T/ep-on.json"
    run estimate models/hf/mixtral-8x7b.json --gpus 8 --parallel fsdp --ep 4 --seq 1024 --offload params --json
    if [ "$ec" -eq 0 ] && python3 - "$T/ep-on.json" "$T/out" <<'PY' 2>"$T/why"
import json, sys
on, off = (json.load(open(f))["memory"] for f in sys.argv[1:3])
assert off["host_bytes"] == on["weights_bytes"] + on["grads_bytes"] + on["optimizer_bytes"], (off, on)
assert off["weights_bytes"] == off["grads_bytes"] == off["optimizer_bytes"] == 0, off
assert off["experts"]["weights_bytes"] == 0 and on["experts"]["weights_bytes"] > 0, (off["experts"], on["experts"])
assert off["experts"]["gathered_unit_bytes"] == on["experts"]["gathered_unit_bytes"], off["experts"]
PY
    then
        ok "--ep 4 --offload params: every unit's state on the host, the experts' too"
    else
        bad "--ep 4 --offload params: every unit's state on the host"
    fi
fi
run suggest models/hf/mixtral-8x7b.json --gpu h100-80gb --gpus 8 --parallel fsdp --ep 4 --offload params --seq 1024 \
    --no-probe --emit hf
if [ "$ec" -eq 0 ] && tr "\n" " " <"$T/out" | tr -s " " | grep -q "DistributedConfig(fsdp_size=8, ep_size=4.*fsdp_cpu_offload=True"; then
    ok "suggest --ep 4 --offload params --emit hf: DistributedConfig(..., fsdp_cpu_offload=True)"
else
    echo "expected exit 0 and DistributedConfig(fsdp_size=8, ep_size=4, ..., fsdp_cpu_offload=True)" >"$T/why"
    bad "suggest --ep 4 --offload params --emit hf: fsdp_cpu_offload"
fi
# --parallel fsdp given searches FSDP2's mixed-bf16 too (issue 25: Mistral-7B on 8 H100s got
# micro-batch 3 at 7.6 % headroom in amp-bf16 where --gpus 8 alone found 4 at 19.9 %): the same
# FSDP2 plan either way (--gpus 8 alone's fastest fsdp candidate; its recommendation is ZeRO-3
# at the same micro-batch by 0.05 % throughput since ZeRO-3's gradient partition is bf16)
run suggest models/hf/mistral-7b.json --gpu h100-80gb --gpus 8 --parallel fsdp --no-probe --json
cp "$T/out" "$T/fsdp_given.json"
run suggest models/hf/mistral-7b.json --gpu h100-80gb --gpus 8 --no-probe --json
if [ -z "$HAVE_PY" ]; then
    skipped "suggest --parallel fsdp: mixed-bf16 searched (python3 not found)"
elif python3 - "$T/fsdp_given.json" "$T/out" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))["recommendation"]
a = max((c for c in json.load(open(sys.argv[2]))["candidates"] if c["parallel"]["strategy"] == "fsdp"),
        key=lambda c: c["samples_per_s"])
assert g["precision"] == "mixed-bf16" and g["parallel"]["strategy"] == "fsdp", (g["precision"], g["parallel"])
assert (g["micro_batch"], g["precision"], g["parallel"]["strategy"]) == \
    (a["micro_batch"], a["precision"], a["parallel"]["strategy"]), (g["micro_batch"], a["micro_batch"])
PY
then
    ok "suggest --parallel fsdp: mixed-bf16 searched, the same plan as --gpus alone"
else
    echo "expected suggest --parallel fsdp to recommend --gpus 8 alone's best fsdp candidate" >"$T/why"
    bad "suggest --parallel fsdp: mixed-bf16 searched, the same plan as --gpus alone"
fi
# DPOConfig disable_dropout: TRL zeroes every nn.Dropout (GPT-2's residual and embedding dropouts,
# peft's lora_dropout); GPT-2's attention dropout reads its module's p too, memplan keeps it (noted)
if [ -n "$HAVE_PY" ]; then
    python3 -c 'import json,sys; d=json.load(open("models/hf/gpt2.json")); d["resid_pdrop"]=d["embd_pdrop"]=0
json.dump(d, open(sys.argv[1], "w"))' "$T/gpt2-nodrop.json"
    run estimate models/hf/gpt2.json --trainer dpo --finetune lora --lora-dropout 0.1 --seq 256 --json
    cp "$T/out" "$T/dpo_drop.json"
    run estimate "$T/gpt2-nodrop.json" --trainer dpo --finetune lora --lora-dropout 0 --seq 256 --json
    if python3 - "$T/dpo_drop.json" "$T/out" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["config"]["finetune"]["lora_dropout"] == 0, a["config"]["finetune"]
assert a["memory"]["peak_allocated_bytes"] == b["memory"]["peak_allocated_bytes"]
PY
    then
        ok "--trainer dpo: disable_dropout zeroes the residual, embedding and LoRA dropouts"
    else
        echo "expected GPT-2 under dpo to plan as its config with those dropouts at 0" >"$T/why"
        bad "--trainer dpo: disable_dropout zeroes the residual, embedding and LoRA dropouts"
    fi
else
    skipped "--trainer dpo: disable_dropout (python3 not found)"
fi
run estimate --recipe tests/data/recipes/trl-dpo-lora.yaml --trainer dpo --json
if [ -z "$HAVE_PY" ]; then
    skipped "--recipe with --trainer dpo (python3 not found)"
elif [ "$ec" -eq 0 ] && python3 - "$T/out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
c = d["config"]
assert c["trainer"] == "dpo" and c["reference"] == "adapter-disabled" and c["loss"] == "chunked-nll", c
assert c["recipe"]["trainer"].startswith("TRL 1.16.0 DPOTrainer"), c["recipe"]
assert c["batch"] == 2 and c["sequences"] == 4
PY
then
    ok "--recipe with --trainer dpo: a DPOConfig, LoRA: the adapter disabled"
else
    echo "expected exit 0, config.trainer dpo, the adapter disabled, batch 2 = 4 sequences" >"$T/why"
    bad "--recipe with --trainer dpo: a DPOConfig, LoRA: the adapter disabled"
fi

run estimate --recipe tests/data/recipes/axolotl-kto-full.yaml --trainer kto --json
if [ -z "$HAVE_PY" ]; then
    skipped "--recipe Axolotl rl: kto (python3 not found)"
elif [ "$ec" -eq 0 ] && python3 - "$T/out" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["config"]
assert c["trainer"] == "kto" and c["reference"] == "copy" and c["loss"] == "chunked-nll", c
assert c["recipe"]["trainer"] == "Axolotl 0.19.0 rl: kto (TRL 1.16.0 KTOTrainer)", c["recipe"]
assert "precompute-ref" not in c["recipe"]["settings"], c["recipe"]["settings"]
PY
then
    ok "--recipe Axolotl rl: kto: KTOTrainer, a reference copy, precompute_ref_log_probs not DPO's here"
else
    bad "--recipe Axolotl rl: kto: KTOTrainer, a reference copy, precompute_ref_log_probs not DPO's here"
fi
expect_msg 3 "--recipe Axolotl rl: dpo without --trainer: refused, naming the key" \
    "axolotl-dpo-lora.yaml:6: rl: dpo: read this file with --trainer dpo" \
    estimate --recipe tests/data/recipes/axolotl-dpo-lora.yaml
printf 'base_model: models/hf/qwen2-0.5b.json\nrl: grpo\ntrl:\n  num_generations: 4\n' >"$T/axg.yaml"
expect_msg 3 "--recipe Axolotl rl: grpo: refused (Axolotl's own GRPO trainer), naming the key" \
    "axg.yaml:2: rl: grpo: Axolotl's own GRPO trainer" estimate --recipe "$T/axg.yaml" --trainer grpo --seq 512

# LLaMA-Factory's stage: dpo (CustomDPOTrainer): --trainer dpo --loss hf, the model's logits in fp32
# and get_batch_logps.  Hand-worked on a 1-layer Llama (hidden 256, vocabulary 32000, head_dim 64),
# 2 pairs (4 rows) x 256, LoRA (the reference: the adapter disabled): the reference forward's own
# peak is at its head, with L = its fp32 logits 4 x 256 x 32000 x 4 = 131,072,000, log_softmax's
# output LS = 4 x 255 x 32000 x 4 = 130,560,000 beside CUDA's contiguous copy of logits[:, :-1] (the
# same) and the batch's three int64 clones (4 x 256 x 24 = 24,576, one block with the copy:
# 130,584,576), the labels' clone 4 x 255 x 8 -> 8,192, the mask 1,020 -> 1,024, the loss 512, and
# the rotary tables memplan holds through a forward (cos, sin: 256 x 64 bf16 = 65,536):
# 392,291,840.  The reference phase stands on what the policy's forward leaves and the policy's L
# (LLaMA-Factory's get_batch_loss_metrics holds it): its peak less that tmp is at least L.
printf '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, '\
'"intermediate_size": 688, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, '\
'"vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "hidden_act": "silu", '\
'"tie_word_embeddings": false, "torch_dtype": "bfloat16"}\n' >"$T/lfd.json"
run estimate "$T/lfd.json" --trainer dpo --loss hf -b 2 -s 256 -p bf16 -c none -o adamw --workspace 0 \
    --use-cache off --finetune lora --lora-r 16 --lora-targets all-linear --json
if [ -z "$HAVE_PY" ]; then
    skipped "--trainer dpo --loss hf: LLaMA-Factory's head, hand-worked (python3 not found)"
elif [ "$ec" -eq 0 ] && python3 - "$T/out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
c, ph = d["config"], d["memory"]["phases"]
assert c["trainer"] == "dpo" and c["loss"] == "hf" and c["reference"] == "adapter-disabled", c
r = ph["reference_forward"]
assert r["tmp_bytes"] == 392291840, r
assert r["peak_event"] == "reference.forward:head.lm_head.lf_dpo", r
assert r["peak_allocated_bytes"] - r["tmp_bytes"] >= 131072000, r
assert d["memory"]["peak_allocated_bytes"] == max(r["peak_allocated_bytes"], ph["policy_step"]["peak_allocated_bytes"])
PY
then
    ok "--trainer dpo --loss hf: LLaMA-Factory's head, the reference forward's own peak hand-worked"
else
    bad "--trainer dpo --loss hf: LLaMA-Factory's head, the reference forward's own peak hand-worked"
fi
run estimate --recipe tests/data/recipes/llamafactory-dpo-lora.yaml --trainer dpo --json
if [ -z "$HAVE_PY" ]; then
    skipped "--recipe LLaMA-Factory stage: dpo (python3 not found)"
elif [ "$ec" -eq 0 ] && python3 - "$T/out" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["config"]
assert c["trainer"] == "dpo" and c["reference"] == "adapter-disabled" and c["loss"] == "hf", c
assert c["recipe"]["trainer"] == "LLaMA-Factory 0.9.5 stage: dpo (CustomDPOTrainer, TRL <= 0.24)", c["recipe"]
assert c["recipe"]["settings"]["loss"] == {"value": "hf", "key": "stage", "line": 8, "source": "recipe"}, c["recipe"]
PY
then
    ok "--recipe LLaMA-Factory stage: dpo: CustomDPOTrainer's head (--loss hf), the adapter disabled"
else
    bad "--recipe LLaMA-Factory stage: dpo: CustomDPOTrainer's head (--loss hf), the adapter disabled"
fi
expect_msg 3 "--recipe LLaMA-Factory stage: dpo without --trainer: refused, naming the key" \
    "llamafactory-dpo-lora.yaml:8: stage: dpo: LLaMA-Factory's DPO step: read this file with --trainer dpo" \
    estimate --recipe tests/data/recipes/llamafactory-dpo-lora.yaml
expect_msg 2 "--trainer dpo --loss hf --precompute-ref: refused (LLaMA-Factory has none)" \
    "computes the reference's log-probs every step" estimate "$T/lfd.json" --trainer dpo --loss hf --precompute-ref
run suggest --recipe tests/data/recipes/llamafactory-dpo-lora.yaml --trainer dpo --gpu a100-80gb
if [ "$ec" -eq 0 ] && grep -qF "# LLaMA-Factory's DPO step (stage: dpo): per_device_train_batch_size:" "$T/out" &&
    ! grep -qF "DPOConfig" "$T/out"; then
    ok "suggest --recipe LLaMA-Factory stage: dpo: its YAML's batch keys, no TRL DPOConfig"
else
    bad "suggest --recipe LLaMA-Factory stage: dpo: its YAML's batch keys, no TRL DPOConfig"
fi
expect_msg 2 "--trainer dpo --loss hf --parallel zero3: refused (LLaMA-Factory's own reference preparation)" \
    "LLaMA-Factory's DPO under ZeRO and FSDP2" estimate "$T/lfd.json" --trainer dpo --loss hf --gpus 2 --parallel zero3
run suggest "$T/lfd.json" --trainer dpo --loss hf --gpus 2 --gpu a100-80gb
if [ "$ec" -eq 0 ] && grep -q "^ddp x2 " "$T/out" && ! grep -q "^zero\|^fsdp" "$T/out"; then
    ok "suggest --trainer dpo --loss hf --gpus 2: DDP only (ZeRO and FSDP2 not modelled for LLaMA-Factory's DPO)"
else
    bad "suggest --trainer dpo --loss hf --gpus 2: DDP only (ZeRO and FSDP2 not modelled for LLaMA-Factory's DPO)"
fi
expect_msg 2 "suggest --trainer dpo --loss hf --emit hf: refused (no LLaMA-Factory emitter)" \
    "LLaMA-Factory's step has no emitter" suggest "$T/lfd.json" --trainer dpo --loss hf --gpu a100-80gb --emit hf

# LLaMA-Factory's stage: kto (CustomKTOTrainer): --trainer kto --loss hf.  On the same 1-layer Llama,
# 4 examples x 256, LoRA: each forward's head is DPO's on 4 rows, but forward() clones the whole
# batch (nested_detach: input_ids, attention_mask, labels and the KL sequences' three, 4 x 256 x 8
# each = 49,152, and kto_tags, 4 bools: 49,156 in the block with CUDA's copy, 130,560,000 ->
# 130,609,664 rounded): the reference forward's own peak is 131,072,000 (L) + 130,560,000 (LS) +
# 130,609,664 + 8,192 + 1,024 + 512 + 65,536 = 392,316,928.  Held beside it: the policy's chosen and
# rejected logits (boolean-indexed copies: L's bytes) and the reference's own batch logits through
# its KL forward (L): one L more than DPO's at the same rows, on the same policy forward.  The
# policy's KL forward (adapter on; the lm_head carries no adapter) peaks alike at its head with the
# policy's L held: the policy step is the reference phase less one L.
run estimate "$T/lfd.json" --trainer dpo --loss hf -b 2 -s 256 -p bf16 -c none -o adamw --workspace 0 \
    --use-cache off --finetune lora --lora-r 16 --lora-targets all-linear --json
cp "$T/out" "$T/lfd-out.json"
run estimate "$T/lfd.json" --trainer kto --loss hf -b 4 -s 256 -p bf16 -c none -o adamw --workspace 0 \
    --use-cache off --finetune lora --lora-r 16 --lora-targets all-linear --json
if [ -z "$HAVE_PY" ]; then
    skipped "--trainer kto --loss hf: LLaMA-Factory's KTO, hand-worked (python3 not found)"
elif [ "$ec" -eq 0 ] && python3 - "$T/out" "$T/lfd-out.json" <<'PY'
import json, sys
d, dpo = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
c, ph, m = d["config"], d["memory"]["phases"], d["memory"]
assert c["trainer"] == "kto" and c["loss"] == "hf" and c["reference"] == "adapter-disabled", c
r, L = ph["reference_forward"], 131072000
assert r["tmp_bytes"] == 392316928, r
assert r["peak_event"] == "reference.forward:head.lm_head.lf_kto", r
rd = dpo["memory"]["phases"]["reference_forward"]
assert r["peak_allocated_bytes"] - r["tmp_bytes"] - 2 * L == rd["peak_allocated_bytes"] - rd["tmp_bytes"] - L, (r, rd)
assert ph["policy_step"]["peak_allocated_bytes"] == r["peak_allocated_bytes"] - L, ph
assert m["peak_allocated_bytes"] == r["peak_allocated_bytes"] and m["peak_event"].startswith("loss:reference."), m
PY
then
    ok "--trainer kto --loss hf: LLaMA-Factory's KTO, its forwards' peaks and what they hold hand-worked"
else
    bad "--trainer kto --loss hf: LLaMA-Factory's KTO, its forwards' peaks and what they hold hand-worked"
fi
run estimate "$T/lfd.json" --trainer kto --loss hf -b 1 -s 256
if [ "$ec" -eq 0 ] && grep -qF "CustomKTOTrainer): 1 example and its KL sequence" "$T/out"; then
    ok "--trainer kto --loss hf --batch 1: no 2-example floor (LLaMA-Factory makes the KL rows itself)"
else
    bad "--trainer kto --loss hf --batch 1: no 2-example floor (LLaMA-Factory makes the KL rows itself)"
fi
run estimate --recipe tests/data/recipes/llamafactory-kto-lora.yaml --trainer kto --json
if [ -z "$HAVE_PY" ]; then
    skipped "--recipe LLaMA-Factory stage: kto (python3 not found)"
elif [ "$ec" -eq 0 ] && python3 - "$T/out" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["config"]
assert c["trainer"] == "kto" and c["reference"] == "adapter-disabled" and c["loss"] == "hf", c
assert c["recipe"]["trainer"] == "LLaMA-Factory 0.9.5 stage: kto (CustomKTOTrainer, TRL <= 0.24)", c["recipe"]
assert c["recipe"]["settings"]["loss"] == {"value": "hf", "key": "stage", "line": 8, "source": "recipe"}, c["recipe"]
assert c["recipe"]["settings"]["batch"]["value"] == "1", c["recipe"]
PY
then
    ok "--recipe LLaMA-Factory stage: kto: CustomKTOTrainer's head (--loss hf), the adapter disabled"
else
    bad "--recipe LLaMA-Factory stage: kto: CustomKTOTrainer's head (--loss hf), the adapter disabled"
fi
expect_msg 3 "--recipe LLaMA-Factory stage: kto without --trainer kto: refused, naming the key" \
    "llamafactory-kto-lora.yaml:8: stage: kto: LLaMA-Factory's KTO step: read this file with --trainer kto" \
    estimate --recipe tests/data/recipes/llamafactory-kto-lora.yaml --trainer dpo
printf 'stage: kto\nmodel_name_or_path: models/hf/qwen2-0.5b.json\nfinetuning_type: lora\nref_model: x\n' \
    >"$T/lfk.yaml"
expect_msg 3 "--recipe LLaMA-Factory stage: kto with a ref_model of its own: refused, naming the key" \
    "lfk.yaml:4: ref_model: x: a reference model of its own" estimate --recipe "$T/lfk.yaml" --trainer kto
expect_msg 2 "--trainer kto --loss hf --precompute-ref: refused (LLaMA-Factory has none)" \
    "CustomKTOTrainer computes the reference's log-probs every step" \
    estimate "$T/lfd.json" --trainer kto --loss hf --precompute-ref
expect_msg 2 "--trainer kto --loss hf --parallel fsdp: refused (LLaMA-Factory's own reference preparation)" \
    "LLaMA-Factory's KTO under ZeRO and FSDP2" estimate "$T/lfd.json" --trainer kto --loss hf --gpus 2 --parallel fsdp
expect_msg 2 "suggest --trainer kto --loss hf --emit hf: refused (no LLaMA-Factory emitter)" \
    "TRL's KTOConfig, whose head is fused" suggest "$T/lfd.json" --trainer kto --loss hf --gpu a100-80gb --emit hf
run suggest --recipe tests/data/recipes/llamafactory-kto-lora.yaml --trainer kto --gpu a100-80gb
if [ "$ec" -eq 0 ] && grep -qF "# LLaMA-Factory's KTO step (stage: kto): per_device_train_batch_size:" "$T/out" &&
    ! grep -qF "KTOConfig" "$T/out"; then
    ok "suggest --recipe LLaMA-Factory stage: kto: its YAML's batch keys, no TRL KTOConfig"
else
    bad "suggest --recipe LLaMA-Factory stage: kto: its YAML's batch keys, no TRL KTOConfig"
fi

# --moe-capacity: recorded (config.moe), the busiest expert's rows from it, the figures unchanged
# (grouped_mm: one grouped GEMM over the 2 x 64 x 2 = 256 routed rows whatever their split)
expect_line 2 "--moe-capacity below 1: usage error" estimate bench/accuracy/moe/mixtral-shrunk.json --moe-capacity 0.5
run estimate bench/accuracy/moe/mixtral-shrunk.json --batch 2 --seq 64 --json
cp "$T/out" "$T/moe1.json"
run estimate bench/accuracy/moe/mixtral-shrunk.json --batch 2 --seq 64 --moe-capacity 3 --json
if [ -z "$HAVE_PY" ]; then
    skipped "--moe-capacity: config.moe (python3 not found)"
elif python3 - "$T/moe1.json" "$T/out" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
m = b["config"]["moe"]
assert (m["experts"], m["top_k"], m["routed_rows"], m["rows_per_expert"]) == (8, 2, 256, 32), m
assert m["busiest_expert_rows"] == 96 and m["capacity"] == 3 and m["routing"] == "capacity", m
assert a["config"]["moe"]["busiest_expert_rows"] == 32 and a["config"]["moe"]["routing"] == "uniform"
assert a["memory"]["peak_allocated_bytes"] == b["memory"]["peak_allocated_bytes"]
PY
then
    ok "--moe-capacity: config.moe records it; the grouped_mm figures do not change"
else
    echo "expected config.moe with the busiest expert's 96 of 256 rows and an unchanged peak" >"$T/why"
    bad "--moe-capacity: config.moe records it; the grouped_mm figures do not change"
fi

# LoRA on MoE: peft's all-linear (and its MoE name mapping) adapt the experts' 3-D parameters, not
# modelled: refused with the reason; attention targets are modelled (39,936 trainable = peft 0.21's
# count for q_proj,v_proj on this config, meta device, bench/accuracy/peft_step.py)
expect_line 2 "--finetune lora all-linear on an MoE config: refused, one line" estimate \
    bench/accuracy/moe/mixtral-shrunk.json --finetune lora --lora-targets all-linear
run estimate bench/accuracy/moe/mixtral-shrunk.json --finetune lora --lora-targets q_proj,v_proj --json
if [ -z "$HAVE_PY" ]; then
    skipped "--finetune lora q_proj,v_proj on an MoE config (python3 not found)"
elif [ "$ec" -eq 0 ] && python3 -c 'import json,sys; assert json.load(sys.stdin)["model"]["trainable_params"] == 39936' \
    <"$T/out"; then
    ok "--finetune lora q_proj,v_proj on an MoE config: peft's trainable count"
else
    echo "expected exit 0 and model.trainable_params 39936 (peft)" >"$T/why"
    bad "--finetune lora q_proj,v_proj on an MoE config: peft's trainable count"
fi

# ---- JSON of each command -----------------------------------------------------------------

json_check "estimate --checkpoint sqrt --json: plan keys" estimate \
    estimate models/gpt2-124m.json --batch 4 --checkpoint sqrt --json
# --checkpoint layers = transformers' gradient checkpointing: the 24 decoder layers, not the
# embeddings (block 0) or the head (block 25)
if json_check "estimate --checkpoint layers: decoder layers only" ckflags \
    estimate models/hf/qwen2-0.5b.json --batch 2 --checkpoint layers --json; then
    if [ "$(cat "$T/jout")" = "01111111111111111111111110" ]; then
        ok "estimate --checkpoint layers: blocks 1..24 of 26 checkpointed"
    else
        echo "checkpointed flags $(cat "$T/jout")" >"$T/why"
        bad "estimate --checkpoint layers: blocks 1..24 of 26 checkpointed"
    fi
fi
json_check "plan --json: plan keys" plan plan models/gpt2-124m.json --batch 8 --gpu a100-40gb --json
# --checkpoint layers:3 = transformers' every_n_layers=3: decoder layers 0, 3, 6, ... (blocks 1, 4,
# 7, ... of qwen2-0.5b's 26), the others keep their activations
if json_check "estimate --checkpoint layers:3: every third decoder layer" ckflags \
    estimate models/hf/qwen2-0.5b.json --batch 2 --checkpoint layers:3 --json; then
    if [ "$(cat "$T/jout")" = "01001001001001001001001000" ]; then
        ok "estimate --checkpoint layers:3: blocks 1, 4, ..., 22 of 26 checkpointed"
    else
        echo "checkpointed flags $(cat "$T/jout")" >"$T/why"
        bad "estimate --checkpoint layers:3: blocks 1, 4, ..., 22 of 26 checkpointed"
    fi
fi
# suggest's "would do better" lines (one GPU): a loss head or optimizer the user did not pick that
# raises the micro-batch or the throughput; following one gives what it promised
if [ -n "$HAVE_PY" ]; then
    run suggest models/hf/llama-3.2-1b.json --gpu a100-40gb --no-probe --json
    hint=$(python3 -c '
import json, re, sys
for a in json.load(sys.stdin)["alternatives"]:
    m = re.match(r"--loss chunked-nll \(.*\): micro-batch (\d+) -> (\d+),", a)
    if m and int(m.group(2)) > int(m.group(1)):
        print(m.group(2))
' <"$T/out")
    run suggest models/hf/llama-3.2-1b.json --gpu a100-40gb --no-probe --json --loss chunked-nll
    got=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["recommendation"]["micro_batch"])' <"$T/out" 2>/dev/null)
    if [ -n "$hint" ] && [ "$hint" = "$got" ]; then
        ok "suggest: '--loss chunked-nll' would do better (micro-batch $hint), and suggest --loss chunked-nll gives it"
    else
        echo "hint '$hint', suggest --loss chunked-nll micro-batch '$got'" >"$T/why"
        bad "suggest: the --loss chunked-nll hint and what following it gives"
    fi
fi
# a hint whose best plan is another names the micro-batch at the recommendation's own plan too
# (Llama-3-8B LoRA on a 24 GB card: the fused heads free the logits); following it gives that
if [ -n "$HAVE_PY" ]; then
    run suggest models/hf/llama-3-8b.json --gpu rtx4090 --finetune lora --no-probe --json
    hint=$(python3 -c '
import json, re, sys
for a in json.load(sys.stdin)["alternatives"]:
    m = re.match(r"--loss chunked-nll \(.*; at checkpoint (\S+): micro-batch (\d+)$", a)
    if m:
        print(m.group(1), m.group(2))
' <"$T/out")
    rec=$(python3 -c 'import json, sys; r = json.load(sys.stdin)["recommendation"]; print(r["micro_batch"])' \
        <"$T/out" 2>/dev/null)
    run suggest models/hf/llama-3-8b.json --gpu rtx4090 --finetune lora --no-probe --json --loss chunked-nll \
        --checkpoint "${hint%% *}"
    got=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["recommendation"]["micro_batch"])' <"$T/out" 2>/dev/null)
    if [ -n "$hint" ] && [ "${hint##* }" = "$got" ] && [ "$got" -gt "${rec:-99}" ]; then
        ok "suggest: the chunked-nll hint at the recommended plan (${hint%% *}): micro-batch $rec -> $got, as following it gives"
    else
        echo "hint '$hint', recommended '$rec', suggest --loss chunked-nll --checkpoint: '$got'" >"$T/why"
        bad "suggest: the chunked-nll hint at the recommended plan and what following it gives"
    fi
fi
# the +sac:auto hint (a recommendation checkpointing layers: memplan's op-level plan at the same
# plan) and the --act-offload hint (TRL's fused head, LoRA, layers): following each gives the
# micro-batch and throughput it promised
if [ -n "$HAVE_PY" ]; then
    run suggest models/hf/llama-3.2-1b.json --gpu a100-40gb --checkpoint layers --global-batch 32 --no-probe --json
    hint=$(python3 -c '
import json, re, sys
for a in json.load(sys.stdin)["alternatives"]:
    m = re.match(r"--checkpoint (layers\S*\+sac:auto) \(.*\): micro-batch \d+ -> (\d+), .* -> ([0-9.]+) samples/s$", a)
    if m:
        print(m.group(1), m.group(2), m.group(3))
' <"$T/out")
    run suggest models/hf/llama-3.2-1b.json --gpu a100-40gb --checkpoint "${hint%% *}" --global-batch 32 --no-probe \
        --json
    got=$(python3 -c 'import json, sys; r = json.load(sys.stdin)["recommendation"]
print(r["plan"]["strategy"], r["micro_batch"], "%.1f" % r["samples_per_s"])' <"$T/out" 2>/dev/null)
    if [ -n "$hint" ] && [ "$hint" = "$got" ]; then
        ok "suggest: the +sac:auto hint ($hint: plan, micro-batch, samples/s) is what following it gives"
    else
        echo "hint '$hint', suggest --checkpoint: '$got'" >"$T/why"
        bad "suggest: the +sac:auto hint and what following it gives"
    fi
    run suggest models/hf/llama-3-8b.json --gpu rtx4090 --finetune lora --loss chunked-nll --checkpoint layers \
        --no-probe --json
    hint=$(python3 -c '
import json, re, sys
d = json.load(sys.stdin)
for a in d["alternatives"]:
    m = re.match(r"--act-offload \(.*\): micro-batch (\d+) -> (\d+), peak .*, ([0-9.]+ [KMG]iB) pinned host RAM", a)
    if m and int(m.group(2)) > d["recommendation"]["micro_batch"]:
        print(m.group(2))
' <"$T/out")
    run suggest models/hf/llama-3-8b.json --gpu rtx4090 --finetune lora --loss chunked-nll --checkpoint layers \
        --act-offload --no-probe --json
    got=$(python3 -c 'import json, sys; r = json.load(sys.stdin)["recommendation"]
assert r["host_pinned_bytes"] > 0
print(r["micro_batch"])' <"$T/out" 2>/dev/null)
    if [ -n "$hint" ] && [ "$hint" = "$got" ]; then
        ok "suggest: the --act-offload hint (micro-batch $hint) is what suggest --act-offload gives"
    else
        echo "hint '$hint', suggest --act-offload: '$got'" >"$T/why"
        bad "suggest: the --act-offload hint and what following it gives"
    fi
fi
# an HF config: suggest searches the plans transformers' Trainer runs (none, layers, layers:N), so
# the text, --json and --emit hf describe one recommendation
if [ -n "$HAVE_PY" ]; then
    run suggest models/hf/llama-3-8b.json --gpu rtx4090 --finetune lora --no-probe --json
    mb=$(python3 -c '
import json, sys
d = json.load(sys.stdin)
assert all(c["plan"]["strategy"] == "none" or c["plan"]["strategy"].startswith("layers") for c in d["candidates"])
print(d["recommendation"]["micro_batch"])' <"$T/out" 2>"$T/why")
    run suggest models/hf/llama-3-8b.json --gpu rtx4090 --finetune lora --no-probe --emit hf
    if [ -n "$mb" ] && grep -q "per_device_train_batch_size=$mb," "$T/out"; then
        ok "suggest on an HF config: Trainer plans only; --json and --emit hf agree (micro-batch $mb)"
    else
        bad "suggest on an HF config: --json and --emit hf disagree or a plan a Trainer cannot run"
    fi
fi
# suggest --gpus 8 evaluates every layout x precision x plan: ZeRO-3 with the optimizer on the
# host in mixed-bf16 is the last layout searched (a 48-candidate cap once dropped it silently)
if [ -n "$HAVE_PY" ]; then
    run suggest models/hf/llama-2-70b.json --gpu h100-80gb --no-probe --gpus 8 --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
c = json.load(sys.stdin)["candidates"]
assert any(x["parallel"]["strategy"] == "zero3" and x["parallel"]["offload"] == "optimizer"
           and x["precision"] == "mixed-bf16" for x in c), "no zero3 + optimizer offload mixed-bf16 candidate"
assert not any(x["plan"]["strategy"].startswith("layers:") and x["parallel"]["strategy"] not in ("ddp",)
               for x in c), "a layers:N candidate under FSDP/ZeRO"
' <"$T/out" 2>"$T/why"; then
        ok "suggest --gpus 8: every layout searched, layers:N only under DDP"
    else
        bad "suggest --gpus 8: every layout searched, layers:N only under DDP"
    fi
fi
json_check "plan --activation-budget --json: plan keys" plan \
    plan models/gpt2-124m.json --batch 2 --activation-budget 2GiB --json
json_check "check --json: check keys" check check models/gpt2-124m.json --batch 1 --gpu a100-40gb --json
json_check "suggest --json: recommendation and candidates keys" suggest \
    suggest models/gpt2-124m.json --gpu a100-40gb --no-probe --json

# ---- suggest and check agree --------------------------------------------------------------

# recommend DESC ARGS...: the recommendation of `memplan ARGS` (a suggest) as the line
# "micro_batch grad_accum global_batch precision strategy" in $T/jout: from --json with
# python3, else from the text report.
recommend() {
    desc=$1
    shift
    if [ -n "$HAVE_PY" ]; then
        json_check "$desc" recommend "$@" --json
        return
    fi
    run "$@"
    awk '/^  micro-batch / { b = $2 }
         /^  grad accumulation / { a = $3; g = $6; sub(/[^0-9]+$/, "", g) }
         /^  precision / { p = $2 }
         /^  checkpointing / { c = $2; sub(/:$/, "", c) }
         END { if (b != "" && a != "" && g != "" && p != "" && c != "") print b, a, g, p, c }' "$T/out" >"$T/jout"
    if [ "$ec" -eq 0 ] && [ -s "$T/jout" ]; then
        ok "$desc (from the text report: python3 not found)"
        return 0
    fi
    echo "expected exit 0 and a recommendation in the text report" >"$T/why"
    bad "$desc"
    return 1
}

GPT2=models/gpt2-124m.json
if recommend "suggest $GPT2 --gpu a100-40gb: a recommendation" suggest "$GPT2" --gpu a100-40gb --no-probe; then
    read -r B _ _ P C <"$T/jout"
    if [ "$B" -ge 1 ] 2>/dev/null; then
        expect 0 "check --batch $B (suggested) --precision $P --checkpoint $C fits" \
            check "$GPT2" --gpu a100-40gb --batch "$B" --precision "$P" --checkpoint "$C"
        B1=$((B + 1))
        run check "$GPT2" --gpu a100-40gb --batch "$B1" --precision "$P" --checkpoint "$C"
        if [ "$ec" -eq 1 ] && [ "$(nlines "$T/err")" -eq 1 ] && grep -q "short by" "$T/err"; then
            ok "check --batch $B1 (one over) does not fit: exit 1, one stderr line 'short by'"
        else
            echo "expected exit 1 and exactly one stderr line containing 'short by'" >"$T/why"
            bad "check --batch $B1 (one over) does not fit: exit 1, one stderr line 'short by'"
        fi
        for bb in "$B" "$B1"; do
            [ -n "$HAVE_PY" ] || continue
            if json_check "check --batch $bb --json" check \
                check "$GPT2" --gpu a100-40gb --batch "$bb" --precision "$P" --checkpoint "$C" --json; then
                want=fits
                want_ec=0
                if [ "$bb" = "$B1" ]; then
                    want=nofit
                    want_ec=1
                fi
                got=$(cat "$T/jout")
                if [ "$got" = "$want" ] && [ "$ec" -eq "$want_ec" ]; then
                    ok "check --batch $bb --json: check.fits agrees with the exit status"
                else
                    echo "check.fits says $got, exit $ec; expected $want, exit $want_ec" >"$T/why"
                    bad "check --batch $bb --json: check.fits agrees with the exit status"
                fi
            fi
        done
    else
        echo "recommendation.micro_batch: '$B'" >"$T/why"
        bad "suggest: recommendation.micro_batch is a positive integer"
    fi
fi

if recommend "suggest --global-batch 512: a recommendation" \
    suggest "$GPT2" --gpu a100-40gb --global-batch 512 --no-probe; then
    read -r mb acc gb _ _ <"$T/jout"
    prod=$((mb * acc))
    if [ "$prod" = 512 ] && [ "$gb" = 512 ] && [ "$ec" -eq 0 ]; then
        ok "suggest --global-batch 512: micro_batch x grad_accum = 512 exactly"
    else
        echo "micro_batch x grad_accum = $prod, global_batch = $gb, exit $ec" >"$T/why"
        bad "suggest --global-batch 512: micro_batch x grad_accum = 512 exactly"
    fi
fi

# plan: an activation budget that no plan meets is "does not fit", said in one line.
run plan "$GPT2" --batch 16 --activation-budget 1MiB
if [ "$ec" -eq 1 ] && [ "$(nlines "$T/err")" -eq 1 ]; then
    ok "plan --activation-budget 1MiB (nothing fits): exit 1, one stderr line"
else
    echo "expected exit 1 and exactly one stderr line" >"$T/why"
    bad "plan --activation-budget 1MiB (nothing fits): exit 1, one stderr line"
fi

# A model that cannot fit: suggest exits 1 and says what would help.
BIG=models/llama-70b.json
expect 1 "suggest $BIG --gpu t4: does not fit" suggest "$BIG" --gpu t4 --no-probe
# the text report wraps long lines at 100 columns: compare with blanks squeezed
tr -s ' \n' '  ' <"$T/out" >"$T/nofit.txt"
if json_check "suggest $BIG --gpu t4 --json: null recommendation, alternatives" nofit \
    suggest "$BIG" --gpu t4 --no-probe --json; then
    missing=
    while IFS= read -r alt; do
        grep -qF -e "$(printf '%s' "$alt" | tr -s ' ' ' ')" "$T/nofit.txt" || missing="$missing; $alt"
    done <"$T/jout"
    if [ "$ec" -eq 1 ] && [ -z "$missing" ]; then
        ok "suggest $BIG --gpu t4: exit 1, the text report prints the alternatives"
    else
        echo "exit $ec; alternatives missing from the text report:$missing" >"$T/why"
        bad "suggest $BIG --gpu t4: exit 1, the text report prints the alternatives"
    fi
fi
run check "$BIG" --batch 1 --gpu t4
if [ "$ec" -eq 1 ] && [ "$(nlines "$T/err")" -eq 1 ] && grep -q "short by" "$T/err"; then
    ok "check $BIG --gpu t4: exit 1, one stderr line 'short by'"
else
    echo "expected exit 1 and exactly one stderr line containing 'short by'" >"$T/why"
    bad "check $BIG --gpu t4: exit 1, one stderr line 'short by'"
fi

# ---- fine-tuning ---------------------------------------------------------------------------

expect_line 2 "--finetune with an unknown mode" estimate --finetune half models/tiny-test.json
expect_line 2 "--lora-r without --finetune lora" estimate --lora-r 8 models/tiny-test.json
expect_line 2 "--finetune freeze without --train-blocks" estimate --finetune freeze models/tiny-test.json
expect_line 2 "--train-blocks with a reversed range" estimate --finetune freeze --train-blocks 3-1 models/tiny-test.json
expect_line 2 "--lora-targets with an empty name" estimate --finetune lora --lora-targets q_proj,,v_proj models/tiny-test.json
expect_line 2 "--finetune lora with data parallel (not modelled: refused)" estimate --finetune lora --gpus 2 models/tiny-test.json
# FSDP-QLoRA: the packed 4-bit weights in a float storage are sharded (bitsandbytes' bnb_4bit_quant_storage;
# bfloat16 by default under fsdp, which the snippet sets); uint8 leaves them whole on every rank
expect_msg 2 "--quant-storage without --finetune qlora" "--quant-storage needs --finetune qlora" \
    estimate models/hf/llama-3.2-1b.json --finetune lora --quant-storage bfloat16
expect_msg 2 "--quant-storage float32 under mixed-bf16 (the policy would cast the packed weights)" \
    "the bf16 policy would cast the packed 4-bit weights" estimate models/hf/llama-3.2-1b.json --finetune qlora \
    --gpus 2 --parallel fsdp --precision mixed-bf16 --quant-storage float32
expect_msg 2 "a GPTQ base under FSDP2 (not modelled)" "only a bitsandbytes 4-bit base is modelled under FSDP2" \
    estimate tests/data/hf-qwen2-0.5b-gptq.json --finetune lora --gpus 2 --parallel fsdp
expect_line 2 "--quant-storage with an unknown dtype" estimate models/hf/llama-3.2-1b.json --finetune qlora \
    --quant-storage int4
expect_msg 2 "ZeRO-3 QLoRA with uint8 storage (not modelled)" "uint8 storage under ZeRO-3 is not modelled" \
    estimate models/hf/llama-3.2-1b.json --finetune qlora --gpus 2 --parallel zero3 --quant-storage uint8
expect_msg 2 "ZeRO-3 QLoRA, bf16, float32 storage (DeepSpeed's bf16 casts it)" "DeepSpeed's bf16 would cast" \
    estimate models/hf/llama-3.2-1b.json --finetune qlora --gpus 2 --parallel zero3 --precision bf16 \
    --quant-storage float32
if [ -n "$HAVE_PY" ]; then
    Q4="models/hf/llama-3.2-1b.json --finetune qlora --precision bf16 --gpus 2 --parallel fsdp --json"
    # shellcheck disable=SC2086
    run estimate $Q4
    cp "$T/out" "$T/q-bf16.json"
    # shellcheck disable=SC2086
    run estimate $Q4 --quant-storage uint8
    cp "$T/out" "$T/q-u8.json"
    run estimate models/hf/llama-3.2-1b.json --finetune qlora --precision bf16 --json
    cp "$T/out" "$T/q-1.json"
    # shellcheck disable=SC2086
    run estimate $Q4 --offload params
    cp "$T/out" "$T/q-off.json"
    # (16 layers x (q 2048x2048 + k, v 512x2048 + o 2048x2048 + gate, up, down 3 x 8192x2048): packed
    # 4-bit bytes = numel / 2 = 486,539,264 x 16 / 2; a rank of 2 holds half of them in bf16 storage)
    if python3 - "$T/q-bf16.json" "$T/q-u8.json" "$T/q-1.json" <<'PY' 2>"$T/why"
import json, sys
b, u, one = (json.load(open(f)) for f in sys.argv[1:4])
assert b["config"]["finetune"]["quant_storage"] == "bfloat16", b["config"]["finetune"]
assert u["config"]["finetune"]["quant_storage"] == "uint8" and one["config"]["finetune"]["quant_storage"] == "uint8"
packed = 16 * (2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 8192 * 2048) // 2
wb, wu = b["memory"]["weights_bytes"], u["memory"]["weights_bytes"]
assert wu - wb == packed // 2, (wu - wb, packed // 2)
PY
    then
        ok "FSDP-QLoRA: bfloat16 storage shards the packed weights (half of numel/2 a rank), uint8 keeps them whole"
    else
        bad "FSDP-QLoRA: bfloat16 storage shards the packed weights (half of numel/2 a rank), uint8 keeps them whole"
    fi
    # --offload params: the shards on the host, each weight's quant_state on the GPU.  Double quant,
    # blocksize 64, each tensor a 512-rounded allocation: absmax uint8 numel/64, state2.absmax fp32
    # per 256 absmax, state2.code 1,024 B, code 64 B -> 512, offset 4 B -> 512.  The load: every
    # rank's GPU holds the whole 4-bit model before fully_shard (packed numel/2 + quant_state, the
    # tied bf16 embedding, the bf16 norms, the fp32 q/v adapters r 16, the rotary buffers).
    if python3 - "$T/q-off.json" "$T/q-bf16.json" <<'PY' 2>"$T/why"
import json, sys
off, on = (json.load(open(f))["memory"] for f in sys.argv[1:3])
r512 = lambda n: -(-n // 512) * 512
def qstate(numel):
    blocks = numel // 64
    return r512(blocks) + r512(-(-blocks // 256) * 4) + 1024 + 512 + 512
shapes = [2048 * 2048, 512 * 2048, 512 * 2048, 2048 * 2048] + [8192 * 2048] * 3
qs = 16 * sum(qstate(n) for n in shapes)
assert off["weights_bytes"] == qs == 15679488, (off["weights_bytes"], qs)
packed = 16 * sum(n // 2 for n in shapes)
embed, norms = 128256 * 2048 * 2, (16 * 2 + 1) * 2048 * 2
adapters = 16 * 4 * (16 * 2048 + 2048 * 16 + 16 * 2048 + 512 * 16)
load = packed + qs + embed + norms + adapters + 2 * 32 * 4  # inv_freq, original_inv_freq
for m in (off, on):
    assert m["load_bytes"] == load, (m["load_bytes"], load)
assert off["host_bytes"] > on["weights_bytes"] - qs, (off["host_bytes"], on["weights_bytes"])
PY
    then
        ok "FSDP-QLoRA --offload params: the quant_state (15,679,488 B) stays on the GPU; load_bytes the whole model"
    else
        bad "FSDP-QLoRA --offload params: the quant_state on the GPU, the load"
    fi
    # ZeRO-3 QLoRA against ZeRO-3 LoRA (bf16, 2 ranks): the same but for the 16 layers' seven
    # projections, bf16 partitions of numel x 2 B in one, of the packed numel / 4 bf16 elements
    # (numel / 2 B) in the other, plus each weight's quant_state whole (15,679,488 B above)
    run estimate models/hf/llama-3.2-1b.json --finetune lora --precision bf16 --gpus 2 --parallel zero3 --json
    cp "$T/out" "$T/z3-lora.json"
    run estimate models/hf/llama-3.2-1b.json --finetune qlora --precision bf16 --gpus 2 --parallel zero3 --json
    cp "$T/out" "$T/z3-qlora.json"
    if python3 - "$T/z3-lora.json" "$T/z3-qlora.json" <<'PY' 2>"$T/why"
import json, sys
lo, ql = (json.load(open(f)) for f in sys.argv[1:3])
numel = 16 * (2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 8192 * 2048)
want = numel * 2 // 2 - numel // 2 // 2 - 15679488
got = lo["memory"]["weights_bytes"] - ql["memory"]["weights_bytes"]
assert got == want == 714129408, (got, want)
assert ql["config"]["finetune"]["quant_storage"] == "bfloat16", ql["config"]["finetune"]
assert ql["memory"]["load_bytes"] == 1034506496 and "load_bytes" not in lo["memory"], ql["memory"]
PY
    then
        ok "ZeRO-3 QLoRA: the packed weights partitioned in bf16 storage, the quant_state whole (714,129,408 B below LoRA)"
    else
        bad "ZeRO-3 QLoRA: the packed weights partitioned, the quant_state whole"
    fi
    # ZeRO-3 LoRA against ZeRO-2 LoRA (bf16, b 1 x s 64 = T 64 tokens, r 16 on q_proj and v_proj),
    # hand-worked: (a) ZeRO-3's LinearFunctionForZeroStage3 (deepspeed runtime/zero/linear.py) saves
    # the input of a frozen Linear that autograd records: per layer the post-attention norm's output
    # (gate/up, T h 2 B) and down_proj's input (T I 2 B), and the tied lm_head's input once (T h 2);
    # (b) the adapters are bf16 in both: TRL makes ZeRO-3's so (autocast_adapter_dtype=False), and
    # DeepSpeed's bf16 casts ZeRO-2's (engine.py:1859-1862), so nothing else differs
    run estimate models/hf/llama-3.2-1b.json --finetune lora --precision bf16 --batch 1 --seq 64 --checkpoint none \
        --gpus 2 --parallel zero2 --json
    cp "$T/out" "$T/z2-lora-act.json"
    run estimate models/hf/llama-3.2-1b.json --finetune lora --precision bf16 --batch 1 --seq 64 --checkpoint none \
        --gpus 2 --parallel zero3 --json
    cp "$T/out" "$T/z3-lora-act.json"
    if python3 - "$T/z2-lora-act.json" "$T/z3-lora-act.json" <<'PY' 2>"$T/why"
import json, sys
z2, z3 = (json.load(open(f))["memory"]["activations_bytes"] for f in sys.argv[1:3])
T, h, I, r, L = 64, 2048, 8192, 16, 16
saved = L * T * (h * 2 + I * 2) + T * h * 2
assert z3 - z2 == saved == 21233664, (z3 - z2, saved)
PY
    then
        ok "ZeRO-3 LoRA: frozen Linears' inputs saved (LinearFunctionForZeroStage3), bf16 adapters (+21,233,664 B)"
    else
        bad "ZeRO-3 LoRA: frozen Linears' inputs saved, bf16 adapters: $(tail -1 "$T/why")"
    fi
    # ZeRO-1/2 LoRA under DeepSpeed's bf16 (--precision bf16 and mixed-bf16 both write "bf16":
    # {"enabled": true}): the engine casts every parameter, the adapters too (engine.py:1859-1862;
    # bench/accuracy/zero2_lora_dtype.py saw them bf16 after deepspeed.initialize), hand-worked for
    # Llama-2-7B (6,746,804,224 params with the 8,388,608 of r 16 on q_proj and v_proj), 2 ranks:
    # weights every param in bf16 + the adapters' fp32 master partition (4 x 8,388,608 / 2), the
    # gradient partition bf16 (2 x 8,388,608 / 2), AdamW's two fp32 states (2 x 4 x 8,388,608 / 2);
    # under amp-bf16 (torch_autocast) they stay fp32 as peft makes them
    for prec in bf16 mixed-bf16 amp-bf16; do
        run estimate models/hf/llama-2-7b.json --finetune lora --precision $prec --batch 1 --seq 64 \
            --gpus 2 --parallel zero2 --json
        cp "$T/out" "$T/z2-$prec.json"
    done
    run estimate models/hf/llama-2-7b.json --finetune lora --precision bf16 --batch 1 --seq 64 --gpus 2 \
        --parallel zero1
    if python3 - "$T/z2-bf16.json" "$T/z2-mixed-bf16.json" "$T/z2-amp-bf16.json" <<'PY' 2>"$T/why" &&
import json, sys
b, mx, amp = (json.load(open(f))["memory"] for f in sys.argv[1:4])
P, A = 6746804224, 8388608
for m in (b, mx):
    assert m["weights_bytes"] == 2 * P + 4 * A // 2 == 13510385664, m["weights_bytes"]
    assert m["grads_bytes"] == 2 * A // 2 and m["optimizer_bytes"] == 2 * 4 * A // 2, m
assert amp["grads_bytes"] == 4 * A // 2, amp["grads_bytes"]
PY
        tr -s ' \n' ' ' <"$T/out" | grep -q "adapter params train (bf16: DeepSpeed's bf16 casts every parameter)"
    then
        ok "ZeRO-1/2 LoRA at bf16: DeepSpeed casts the adapters (weights 13,510,385,664 B, bf16 grad partition)"
    else
        bad "ZeRO-1/2 LoRA at bf16: DeepSpeed casts the adapters: $(tail -1 "$T/why")"
    fi
    # TRL 1.16's SFT (--loss chunked-nll), DPO, KTO and GRPO trainers cast a 4-bit model's trainable
    # parameters to bf16 after get_peft_model (sft_trainer.py:905-911); ORPO's and LLaMA-Factory's
    # (dpo --loss hf) do not.  Llama-2-7B QLoRA, amp-bf16, A = 8,388,608 adapter params: weights
    # 2 A below peft's fp32 adapters, the gradients 2 A (not 4 A), AdamW's states 2 x 2 A (zeros_like)
    for t in "sft --loss hf" "sft --loss chunked-nll" "dpo" "dpo --loss hf" "kto-apo" "orpo"; do
        # shellcheck disable=SC2086 # (the trainer and its loss, word-split on purpose)
        run estimate models/hf/llama-2-7b.json --finetune qlora --precision amp-bf16 --batch 2 --seq 64 \
            --trainer $t --json
        cp "$T/out" "$T/trlq-${t%% *}-${t##* }.json"
    done
    if python3 - "$T"/trlq-sft-hf.json "$T"/trlq-sft-chunked-nll.json "$T"/trlq-dpo-dpo.json "$T"/trlq-dpo-hf.json \
        "$T"/trlq-kto-apo-kto-apo.json "$T"/trlq-orpo-orpo.json <<'PY' 2>"$T/why"
import json, sys
hf, sft, dpo, lf, kto, orpo = (json.load(open(f))["memory"] for f in sys.argv[1:7])
A = 8388608
for fp32 in (hf, lf, orpo):
    assert fp32["grads_bytes"] == 4 * A and fp32["optimizer_bytes"] == 2 * 4 * A, fp32
for bf16 in (sft, dpo, kto):
    assert bf16["grads_bytes"] == 2 * A and bf16["optimizer_bytes"] == 2 * 2 * A, bf16
    assert hf["weights_bytes"] - bf16["weights_bytes"] == 2 * A, (hf["weights_bytes"], bf16["weights_bytes"])
PY
    then
        ok "QLoRA under TRL's SFT/DPO/KTO trainers: bf16 adapters, grads and AdamW states; ORPO and LF's fp32"
    else
        bad "QLoRA under TRL's trainers: bf16 adapters: $(tail -1 "$T/why")"
    fi
    # under DDP too: each rank's AdamW states are the bf16 adapters' zeros_like (2 x 2 A), not fp32
    run estimate models/hf/llama-2-7b.json --finetune qlora --precision amp-bf16 --batch 2 --seq 64 --loss chunked-nll \
        --gpus 2 --parallel ddp --json
    if python3 -c 'import json, sys; m = json.load(sys.stdin)["memory"]
assert m["optimizer_bytes"] == 2 * 2 * 8388608 and m["grads_bytes"] == 2 * 8388608, m' <"$T/out" 2>"$T/why"; then
        ok "QLoRA under TRL's SFTTrainer with DDP: bf16 AdamW states (33,554,432 B), bf16 gradients"
    else
        bad "QLoRA under TRL's SFTTrainer with DDP: bf16 AdamW states: $(tail -1 "$T/why")"
    fi
    run estimate models/hf/llama-2-7b.json --finetune qlora --precision amp-bf16 --batch 2 --seq 64 --loss chunked-nll
    if tr -s ' \n' ' ' <"$T/out" | grep -q "adapter params train (bf16: TRL's trainer casts them on a 4/8-bit base)"
    then
        ok "QLoRA --loss chunked-nll: the finetune line says TRL's trainer casts the adapters to bf16"
    else
        echo "expected the finetune line to name TRL's bf16 cast" >"$T/why"
        bad "QLoRA --loss chunked-nll: the finetune line"
    fi
    run suggest models/hf/llama-2-7b.json --finetune qlora --loss chunked-nll --gpu a100-80gb --no-probe --emit torch
    if [ "$ec" -eq 0 ] && grep -q "        p.data = p.data.to(torch.bfloat16)" "$T/out"; then
        ok "suggest --finetune qlora --loss chunked-nll --emit torch: the loop casts the adapters as TRL does"
    else
        echo "expected exit 0 and TRL's cast of the trainable parameters in the snippet" >"$T/why"
        bad "suggest --finetune qlora --loss chunked-nll --emit torch: TRL's cast"
    fi
else
    skipped "FSDP-QLoRA's JSON (python3 not found)"
fi
run suggest models/hf/llama-3.2-1b.json --finetune qlora --gpus 2 --parallel fsdp --gpu a100-40gb --no-probe --emit hf
if [ "$ec" -eq 0 ] && grep -q "bnb_4bit_quant_storage=torch.bfloat16" "$T/out" && grep -q "fsdp=True" "$T/out"; then
    ok "suggest --finetune qlora --parallel fsdp --emit hf: BitsAndBytesConfig(bnb_4bit_quant_storage=bfloat16), fsdp"
else
    echo "expected exit 0, bnb_4bit_quant_storage=torch.bfloat16 and fsdp=True in the snippet" >"$T/why"
    bad "suggest --finetune qlora --parallel fsdp --emit hf: the storage and fsdp in the snippet"
fi
sed 's/^lora_target_modules: all-linear$/lora_target_modules: all-linear\nbnb_4bit_quant_storage: bfloat16/' \
    tests/data/recipes/trl-sft-qlora.yaml >"$T/qlora-storage.yaml"
run estimate --recipe "$T/qlora-storage.yaml" --gpus 2 --parallel fsdp --loss hf --explain
if [ "$ec" -eq 0 ] && grep -q -- "-> quant-storage bfloat16 (bnb_4bit_quant_storage)" "$T/err"; then
    ok "a TRL recipe's bnb_4bit_quant_storage is --quant-storage"
else
    echo "expected exit 0 and '-> quant-storage bfloat16 (bnb_4bit_quant_storage)' in --explain" >"$T/why"
    bad "a TRL recipe's bnb_4bit_quant_storage is --quant-storage"
fi
# tiny-test: 2 blocks of qkv 16->48, out 16->16, fc1 16->32, fc2 32->16; no peft default for a memplan
# model, so all-linear: 2 x 4 x (64 + 32 + 48 + 48) = 1,536 adapter parameters at r 4
run estimate --finetune lora --lora-r 4 models/tiny-test.json --json
if [ "$ec" -eq 0 ] && tr -d ' \t\n' <"$T/out" | grep -q '"trainable_params":1536,'; then
    ok "estimate --finetune lora: trainable_params 1536"
else
    echo "expected exit 0 and trainable_params 1536" >"$T/why"
    bad "estimate --finetune lora: trainable_params 1536"
fi
# the issue's case: Llama-3-8B, QLoRA r 16 on all linears, a 24 GB card: a recommendation and its peft snippet
run suggest models/hf/llama-3-8b.json --finetune qlora --lora-targets all-linear --vram 24GiB --seq 1024 --emit hf
if [ "$ec" -eq 0 ] && grep -q 'target_modules="all-linear"' "$T/out" && grep -q "BitsAndBytesConfig(load_in_4bit=True" "$T/out" \
    && grep -q "per_device_train_batch_size=" "$T/out"; then
    ok "suggest --finetune qlora llama-3-8b on 24 GiB: a recommendation with LoraConfig and BitsAndBytesConfig"
else
    echo "expected exit 0 and the peft + bitsandbytes snippet" >"$T/why"
    bad "suggest --finetune qlora llama-3-8b on 24 GiB"
fi
# a token-classification head: peft's TOKEN_CLS task type (its head kept trainable), the model class that loads it
run suggest tests/data/hf-qwen2-0.5b-tokencls.json --finetune qlora --gpu a100-40gb --seq 512 --emit hf --no-probe
if [ "$ec" -eq 0 ] && grep -q 'task_type="TOKEN_CLS"' "$T/out" && grep -q "AutoModelForTokenClassification" "$T/out"; then
    ok "suggest --finetune qlora on a token-classification head: task_type TOKEN_CLS in the snippet"
else
    echo "expected exit 0, task_type=\"TOKEN_CLS\" and AutoModelForTokenClassification" >"$T/why"
    bad "suggest --finetune qlora on a token-classification head"
fi
expect_line 2 "all-linear on a token-classification head (peft refuses: modules_to_save)" \
    estimate tests/data/hf-qwen2-0.5b-tokencls.json --finetune lora --lora-targets all-linear --seq 16
# quantization_config: a quantized base trains adapters only; an unknown method is refused
expect_line 3 "full fine-tuning of a GPTQ checkpoint" estimate tests/data/hf-qwen2-0.5b-gptq.json
expect_line 3 "full fine-tuning of a bnb 4-bit checkpoint" check tests/data/hf-qwen2-0.5b-bnb4.json --batch 1 --gpu t4
expect 0 "LoRA on a GPTQ checkpoint" estimate tests/data/hf-qwen2-0.5b-gptq.json --finetune lora --seq 64
expect 0 "LoRA on a bnb 4-bit checkpoint" estimate tests/data/hf-qwen2-0.5b-bnb4.json --finetune lora --seq 64
expect_line 3 "an unsupported quant_method" estimate tests/data/hf-qwen2-0.5b-hqq.json --finetune lora
run probe models/tiny-test.json --finetune lora --backend host --steps 2 --json
if [ "$ec" -eq 0 ]; then ok "probe --finetune lora on the host backend: exit 0"; else bad "probe --finetune lora: exit 0"; fi
run probe models/tiny-test.json --finetune qlora --backend host --steps 2
if [ "$ec" -eq 0 ] && grep -q "+0.00%" "$T/out"; then ok "probe --finetune qlora (NF4 base) on the host backend: measured = estimate"
else echo "expected exit 0 and a +0.00% peak difference" >"$T/why"; bad "probe --finetune qlora on the host backend"; fi
expect_line 4 "probe of a GPTQ base (estimated only)" probe tests/data/hf-qwen2-0.5b-gptq.json --finetune lora --backend host --seq 8

# ---- data parallel: per-rank plans ----------------------------------------------------------

# A 70B model: zero3 over 8 H100s does not fit (model states alone are 16 bytes per parameter
# / 8 ranks), over 4 nodes of 8 it does; figures are per rank.
DP="check $BIG --batch 1 --gpu h100-80gb --checkpoint every:1 --parallel zero3"
expect_line 1 "$DP --gpus 8: does not fit" $DP --gpus 8
expect 0 "$DP --gpus 8 --nodes 4: fits" $DP --gpus 8 --nodes 4
if [ -n "$HAVE_PY" ]; then
    run $DP --gpus 8 --nodes 4 --json
    # every rank holds 1/32 of the fp32 parameters (padded; parameters under DeepSpeed's
    # persistence threshold, the norms, stay whole): world x weights just above 4 x params
    if python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
m, p = r["memory"], r["config"]["parallel"]
assert p["strategy"] == "zero3" and p["world"] == 32 and m["world"] == 32, p
full = 4 * r["model"]["params"]
assert full <= 32 * m["weights_bytes"] < full * 1.001, (m["weights_bytes"], full)
assert r["check"]["fits"] is True
' "$T/out" 2>"$T/why"; then
        ok "$DP --gpus 8 --nodes 4 --json: config.parallel, per-rank weights = params x 4 / 32"
    else
        bad "$DP --gpus 8 --nodes 4 --json: config.parallel, per-rank weights = params x 4 / 32"
    fi
    run $DP --gpus 8 --nodes 2 --json
    cp "$T/out" "$T/dp16.json"
    run $DP --gpus 8 --nodes 4 --json
    if python3 -c '
import json, sys
a, b = (json.load(open(f))["memory"]["peak_allocated_bytes"] for f in sys.argv[1:3])
assert b < a, (a, b)
' "$T/dp16.json" "$T/out" 2>"$T/why"; then
        ok "zero3: 32 ranks hold less per rank than 16"
    else
        bad "zero3: 32 ranks hold less per rank than 16"
    fi
else
    skipped "data-parallel JSON checks (python3 not found)"
fi
# suggest for a model that does not fit one GPU names the smallest world that fits: the named
# nodes x 8 ranks fit micro-batch 1 with every block checkpointed, one node fewer does not
# (neither fsdp nor zero3).  The issue's own example: Llama-2-70B's HF config on H100s.
# (the long tier's: this suggest takes 5 to 10 s on a loaded 2-core machine)
L70=models/hf/llama-2-70b.json
if [ -n "$HAVE_PY" ] && [ -n "$LONG" ]; then
    run suggest $L70 --gpu h100-80gb --no-probe --json
    if [ "$ec" -eq 1 ] && python3 -c '
import json, re, sys
alts = json.load(open(sys.argv[1]))["alternatives"]
m = [re.match(r"--gpus 8 --nodes (\d+) --parallel (\S+) .*samples/s", a) for a in alts]
m = [x for x in m if x]
assert len(m) == 1, alts
print(m[0].group(1), m[0].group(2))
' "$T/out" >"$T/world" 2>"$T/why"; then
        read -r NODES STRAT <"$T/world"
        W="check $L70 --batch 1 --gpu h100-80gb --checkpoint every:1 --gpus 8"
        $M $W --nodes "$NODES" --parallel "$STRAT" >/dev/null 2>&1; e0=$?
        $M $W --nodes $((NODES - 1)) --parallel fsdp >/dev/null 2>&1; e1=$?
        $M $W --nodes $((NODES - 1)) --parallel zero3 >/dev/null 2>&1; e2=$?
        if [ "$e0" -eq 0 ] && [ "$e1" -eq 1 ] && [ "$e2" -eq 1 ]; then
            ok "suggest $L70 --gpu h100-80gb: smallest world ($NODES nodes, $STRAT) with throughput"
        else
            echo "check exits: $NODES nodes $STRAT $e0 (want 0); $((NODES - 1)) nodes fsdp $e1, zero3 $e2 (want 1)" >"$T/why"
            bad "suggest $L70 --gpu h100-80gb: smallest world"
        fi
    else
        bad "suggest $L70 --gpu h100-80gb: exit 1 and one '--gpus 8 --nodes N' alternative"
    fi
fi
expect_line 2 "--gpus 8 without --parallel" check models/tiny-test.json --batch 1 --gpu t4 --gpus 8
expect_line 2 "--offload params with zero2" check models/tiny-test.json --batch 1 --gpu t4 --gpus 2 --parallel zero2 --offload params
expect_line 2 "--parallel zero9" check models/tiny-test.json --batch 1 --gpu t4 --gpus 2 --parallel zero9
expect_line 2 "suggest --gpus 4 --global-batch 510 (not a multiple of the ranks)" suggest models/tiny-test.json --gpu t4 --gpus 4 --global-batch 510 --no-probe
if [ -n "$HAVE_PY" ]; then
    run suggest models/gpt2-124m.json --gpu a100-40gb --gpus 4 --global-batch 512 --no-probe --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["recommendation"]
p = r["parallel"]
assert p["world"] == 4, p
assert r["global_batch"] == 512 == r["micro_batch"] * r["grad_accum"] * p["world"], r
' "$T/out" 2>"$T/why"; then
        ok "suggest --gpus 4 --global-batch 512: micro x accumulation x ranks = 512"
    else
        bad "suggest --gpus 4 --global-batch 512: micro x accumulation x ranks = 512"
    fi
fi
# probe of one rank on the host backend: measured = the estimate's per-rank peak; what it
# does not run is refused (offload: exit 4), a rank outside the world is a usage error.
run probe models/tiny-test.json --backend host --steps 2 --gpus 2 --parallel fsdp --rank 1
if [ "$ec" -eq 0 ] && grep -q "fsdp x2" "$T/out" && grep -q "+0.00%" "$T/out"; then
    ok "probe --gpus 2 --parallel fsdp --rank 1 on the host backend: measured = estimate"
else
    echo "expected exit 0, the parallel line and a +0.00% peak difference" >"$T/why"
    bad "probe --gpus 2 --parallel fsdp --rank 1 on the host backend"
fi
expect_line 4 "probe --parallel zero3 --offload optimizer (estimated only)" probe models/tiny-test.json --backend host --gpus 2 --parallel zero3 --offload optimizer
expect_line 2 "probe --gpus 2 --parallel ddp --rank 2" probe models/tiny-test.json --backend host --gpus 2 --parallel ddp --rank 2
expect_line 2 "--rank without --parallel" probe models/tiny-test.json --backend host --rank 1
# NCCL's own memory: a profile's nccl_overhead_mib (measured) sits beside the context when there
# are peers; else modelled from the profile's nccl_channels (docs/memory-facts.md#nccl); a profile
# without either says it is not counted.
NC="estimate models/tiny-test.json --batch 1 --parallel ddp --gpus 2"
run $NC --gpu t4
if [ "$ec" -eq 0 ] && grep -q "NCCL buffers  *not counted (profile has no nccl_channels)" "$T/out"; then
    ok "estimate --gpus 2 on a profile without nccl_channels: NCCL buffers stated as not counted"
else
    echo "expected the line 'NCCL buffers not counted (profile has no nccl_channels) ...'" >"$T/why"
    bad "estimate --gpus 2 on a profile without nccl_channels: NCCL buffers stated as not counted"
fi
# 8 x H100 DDP, hand-worked from NCCL's rules: a peer's receive side 4 KiB + LL 512 KiB + LL128
# 4,915,200 + Simple 4 MiB -> 10 MiB, its send side 4 KiB -> 2 MiB; 24 channels x 2 peers (ring,
# tree) x 12 MiB = 576 MiB; NVLS 16 x 2 x 1 MiB x 8 heads = 256 MiB: 832 MiB, on the defaults line
# and beside the context.  NCCL_NVLS_ENABLE=0: 576 MiB; NCCL_BUFFSIZE=1048576 with NVLS off: the
# receive side 4 KiB + 512 KiB + 4,915,200 + 1 MiB = 6,492,160 -> 8 MiB, 10 MiB a peer, 480 MiB.
NH="estimate models/tiny-test.json --batch 1 --parallel ddp --gpus 8 --gpu h100-80gb"
run $NH
if [ "$ec" -eq 0 ] && grep -q "NCCL buffers  *832.00 MiB   (1 comm x 24 ch x 2 peers x 12.00 MiB + NVLS 256.00 MiB)" "$T/out" &&
    tr '\n' ' ' <"$T/out" | grep -q "NCCL 832.00 MiB (24 channels (profile), *NCCL_BUFFSIZE 4.00 *MiB, *NVLS on)" &&
    grep -q "^CUDA context  *1.32 GiB   (with NCCL's buffers)" "$T/out"; then
    ok "estimate 8 x H100 DDP: NCCL 832 MiB (24 x 2 x 12 MiB + NVLS 256 MiB) on the defaults line and in the context"
else
    echo "expected NCCL buffers 832.00 MiB on its line, the defaults line and context 520 + 832 MiB" >"$T/why"
    bad "estimate 8 x H100 DDP: NCCL 832 MiB (24 x 2 x 12 MiB + NVLS 256 MiB) on the defaults line and in the context"
fi
# Llama4ForConditionalGeneration: transformers 5.24's forward fails after the loss (it reads the
# language model's image_outputs): planned, with a warning; Llama4ForCausalLM has none
run estimate models/hf/llama-4-scout-17b-16e.json --batch 1 --seq 512
if [ "$ec" -eq 0 ] && grep -q "^memplan: warning: .*image_outputs.*AttributeError" "$T/err" &&
    run estimate models/hf/llama-4-scout-17b-16e-text.json --batch 1 --seq 512 && [ "$ec" -eq 0 ] &&
    ! grep -q "image_outputs" "$T/err"; then
    ok "estimate Llama4ForConditionalGeneration: transformers 5.24's failing forward said in a warning"
else
    echo "expected one warning naming image_outputs for the llama4 class, none for llama4_text" >"$T/why"
    bad "estimate Llama4ForConditionalGeneration: transformers 5.24's failing forward said in a warning"
fi
# --ep 4 on 8 x H100 (Mixtral, FSDP2): the world's 832 MiB; the EP group's all-to-all 3 peers x 32
# P2P channels (2 x 18 NVLinks = 36 -> 64, capped by 24 channels -> 32) x 12 MiB = 1,152 MiB; the
# efsdp group of 2 ranks 24 ch x 1 peer x 12 MiB + NVLS 16 x 2 x 1 MiB x 2 = 352 MiB: 2,336 MiB
run estimate models/hf/mixtral-8x7b.json --batch 1 --seq 512 --parallel fsdp --gpus 8 --ep 4 --gpu h100-80gb
if [ "$ec" -le 1 ] && grep -q "NCCL buffers  *2.28 GiB   (1 comm x 24 ch x 2 peers x 12.00 MiB + NVLS 256.00 MiB)" "$T/out" &&
    grep -q "of them --ep's  *1.47 GiB   (all-to-all 3 peers x 32 ch x 12.00 MiB, efsdp 352.00 MiB)" "$T/out"; then
    ok "estimate --ep 4 on 8 x H100: NCCL 2,336 MiB with the EP all-to-all and the efsdp group"
else
    echo "expected NCCL buffers 2.28 GiB, of them --ep's 1.47 GiB (3 x 32 x 12 MiB + 352 MiB)" >"$T/why"
    bad "estimate --ep 4 on 8 x H100: NCCL 2,336 MiB with the EP all-to-all and the efsdp group"
fi
if [ -n "$HAVE_PY" ]; then
    export NCCL_NVLS_ENABLE=0
    run $NH --json
    cp "$T/out" "$T/nvls0.json"
    export NCCL_BUFFSIZE=1048576
    run $NH --json
    unset NCCL_NVLS_ENABLE NCCL_BUFFSIZE
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b = (json.load(open(f))["memory"] for f in sys.argv[1:3])
assert a["nccl_overhead_bytes"] == 576 << 20 and a["nccl"]["nvls_bytes"] == 0, a
assert a["nccl"]["env"] == "NCCL_NVLS_ENABLE", a["nccl"]
assert b["nccl_overhead_bytes"] == 480 << 20 and b["nccl"]["peer_bytes"] == 10 << 20, b
assert b["nccl"]["buffsize_bytes"] == 1 << 20 and b["nccl"]["source"] == "model", b["nccl"]
assert a["overhead_bytes"] - b["overhead_bytes"] == 96 << 20
' "$T/nvls0.json" "$T/out" 2>"$T/why"; then
        ok "NCCL_NVLS_ENABLE=0 and NCCL_BUFFSIZE=1048576 honoured: 576 MiB, then 480 MiB per rank"
    else
        bad "NCCL_NVLS_ENABLE=0 and NCCL_BUFFSIZE=1048576 honoured: 576 MiB, then 480 MiB per rank"
    fi
fi
# check decides with NCCL's bytes: an H100 of 1300 MiB holds the 8-rank DDP step (about 300 MiB
# reserved, 520 MiB context) without NVLS's 256 MiB (576 MiB of ring/tree buffers), not with it.
sed 's/"memory_mib": 81559/"memory_mib": 1300/' configs/gpus/h100-80gb.json >"$T/h100-small.json"
expect 1 "check 8 x DDP on a 1300 MiB H100: NCCL's 832 MiB leave it short" \
    check models/tiny-test.json --batch 1 --parallel ddp --gpus 8 --gpu "$T/h100-small.json"
export NCCL_NVLS_ENABLE=0
expect 0 "check 8 x DDP on a 1300 MiB H100 with NCCL_NVLS_ENABLE=0: fits" \
    check models/tiny-test.json --batch 1 --parallel ddp --gpus 8 --gpu "$T/h100-small.json"
unset NCCL_NVLS_ENABLE
# the timeline's context (stacked under the allocations, the reserved line over it) names
# NCCL's share of it
run estimate models/tiny-test.json --batch 1 --parallel ddp --gpus 8 --gpu h100-80gb --timeline "$T/nccl.svg"
if [ "$ec" -eq 0 ] && grep -q "CUDA context 1.32 GiB (NCCL&apos;s buffers 832.00 MiB of it)" "$T/nccl.svg" &&
    grep -q 'id="reserved"' "$T/nccl.svg"; then
    ok "--timeline with 8 x H100 DDP: the legend's context names NCCL's 832 MiB, the reserved line drawn"
else
    echo "expected the legend 'CUDA context 1.32 GiB (NCCL's buffers 832.00 MiB of it)' and the reserved line" >"$T/why"
    bad "--timeline with 8 x H100 DDP: the legend's context names NCCL's 832 MiB, the reserved line drawn"
fi
export NCCL_BUFFSIZE=4M
expect_msg 2 "NCCL_BUFFSIZE=4M refused" "NCCL_BUFFSIZE: '4M' is not a whole number" $NH
unset NCCL_BUFFSIZE
if [ -n "$HAVE_PY" ]; then
    sed 's/"nccl_overhead_mib": 0/"nccl_overhead_mib": 100/' configs/gpus/t4.json >"$T/t4-nccl.json"
    run $NC --gpu t4 --json
    cp "$T/out" "$T/nccl0.json"
    run $NC --gpu "$T/t4-nccl.json" --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b = (json.load(open(f))["memory"] for f in sys.argv[1:3])
assert a["nccl_overhead_bytes"] == 0 and b["nccl_overhead_bytes"] == 100 << 20, (a, b)
assert a["nccl"]["source"] == "none" and b["nccl"]["source"] == "profile", (a, b)
assert b["overhead_bytes"] - a["overhead_bytes"] == 100 << 20, (a["overhead_bytes"], b["overhead_bytes"])
assert b["peak_device_bytes"] - a["peak_device_bytes"] == 100 << 20
' "$T/nccl0.json" "$T/out" 2>"$T/why"; then
        ok "nccl_overhead_mib 100 in a profile: 100 MiB more overhead and peak device per rank"
    else
        bad "nccl_overhead_mib 100 in a profile: 100 MiB more overhead and peak device per rank"
    fi
    # the measured figure overrides the model
    sed 's/"nccl_overhead_mib": 0/"nccl_overhead_mib": 100/' configs/gpus/h100-80gb.json >"$T/h100-nccl.json"
    run estimate models/tiny-test.json --batch 1 --parallel ddp --gpus 8 --gpu "$T/h100-nccl.json" --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
assert m["nccl_overhead_bytes"] == 100 << 20 and m["nccl"]["source"] == "profile", m
' "$T/out" 2>"$T/why"; then
        ok "nccl_overhead_mib 100 over a profile's nccl_channels: the measured 100 MiB counted"
    else
        bad "nccl_overhead_mib 100 over a profile's nccl_channels: the measured 100 MiB counted"
    fi
fi
expect 0 "estimate --gpus 4 --parallel fsdp --precision mixed-bf16" estimate models/gpt2-124m.json --gpus 4 --parallel fsdp --precision mixed-bf16
expect 0 "estimate --gpus 2 --parallel zero2 --offload optimizer" estimate models/gpt2-124m.json --gpus 2 --parallel zero2 --offload optimizer

# ---- suggest's probe confirmation on the host backend ----------------------------------------
# A small target (24 MiB, 1 MiB context) keeps the host probes fast.  --capacity 4KiB is a
# device that holds less than the estimate assumed: every probe runs out of memory, so
# nothing is recommended (exit 1) and no snippet of an unconfirmed configuration is printed.
TINY=models/tiny-test.json
run suggest "$TINY" --vram 24MiB --context 1MiB --backend host --capacity 4KiB
if [ "$ec" -eq 1 ] && grep -q "probes ran out of memory" "$T/out" && ! grep -q "micro_batch, grad_accum" "$T/out" &&
    ! grep -q "^recommended" "$T/out"; then
    ok "suggest --backend host, probes out of memory everywhere: exit 1, no recommendation, no snippet"
else
    echo "expected exit 1, the probes' note, and no recommendation or snippet on stdout" >"$T/why"
    bad "suggest --backend host, probes out of memory everywhere: exit 1, no recommendation, no snippet"
fi
if [ -n "$HAVE_PY" ]; then
    run suggest "$TINY" --vram 24MiB --context 1MiB --backend host --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
r = d["recommendation"]
assert r["probed"] and r["source"] == "probe", r
assert d["probes"] >= 1 and d["probe_capacity_bytes"] > 0, d
# the probes ran under the target: usable (95 % of 24 MiB) less the 1 MiB context
assert d["probe_capacity_bytes"] == int(24 * 2**20 * 0.95) - 2**20, d["probe_capacity_bytes"]
assert r["probe_peak_allocated_bytes"] == r["peak_allocated_bytes"], r
' "$T/out" 2>"$T/why"; then
        ok "suggest --backend host --json: the recommendation is probe-confirmed under the target's limit"
    else
        bad "suggest --backend host --json: the recommendation is probe-confirmed under the target's limit"
    fi
else
    skipped "suggest --backend host --json (no python3)"
fi

# ---- long models: plan through folds ------------------------------------------------------
# A model of 512 blocks or more is planned through folds (fold.h); --timeline replays the whole
# model.  Both must print the same plan, figure for figure: tiny-test with 600 blocks, and
# gemma-3-1b with 600 layers (five sliding layers, then a global one: folded by period).

sed 's/"repeat": 2,/"repeat": 600,/' models/tiny-test.json >"$T/long.json"
if [ -n "$HAVE_PY" ]; then
    python3 -c '
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 600; json.dump(c, open(sys.argv[2], "w"))
' models/hf/gemma-3-1b.json "$T/long-hf.json"
fi
for lm in long long-hf; do
    [ $lm = long-hf ] && [ -z "$LONG" ] && continue # the long tier's
    [ -f "$T/$lm.json" ] || { skipped "plan $lm: folds (no python3)"; continue; }
    seq=8 budget=2MiB
    [ $lm = long-hf ] && seq=64 budget=3GiB
    for j in "" --json; do
        run plan "$T/$lm.json" --seq $seq --activation-budget $budget $j
        cp "$T/out" "$T/fold.out"
        fec=$ec
        run plan "$T/$lm.json" --seq $seq --activation-budget $budget $j --timeline "$T/long.svg"
        if [ "$fec" -eq 0 ] && [ "$ec" -eq 0 ] && cmp -s "$T/fold.out" "$T/out"; then
            ok "plan $lm $j: through folds as through the whole model"
        else
            diff "$T/fold.out" "$T/out" | head -5 >"$T/why"
            bad "plan $lm $j: through folds as through the whole model"
        fi
    done
done

# ---- long models: estimate and check through folds ----------------------------------------
# estimate and check evaluate a model of 512 blocks or more through folds too, where the whole
# program is larger than the caching-allocator model takes (MP_ASIM_MAX_NODES: reserved bytes
# are then the allocated ones either way); --timeline replays the whole model.  The reports
# must be the same, byte for byte: tiny-test with 2,000 blocks, gemma-3-1b with 1,000 layers.

sed 's/"repeat": 2,/"repeat": 2000,/' models/tiny-test.json >"$T/long2k.json"
if [ -n "$HAVE_PY" ]; then
    python3 -c '
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 1000; json.dump(c, open(sys.argv[2], "w"))
' models/hf/gemma-3-1b.json "$T/long1k-hf.json"
fi
for lm in long2k long1k-hf; do
    [ $lm = long1k-hf ] && [ -z "$LONG" ] && continue # the long tier's
    [ -f "$T/$lm.json" ] || { skipped "estimate $lm: folds (no python3)"; continue; }
    seq=8
    [ $lm = long1k-hf ] && seq=64
    for args in "estimate" "estimate --json" "estimate --checkpoint sqrt --batch 3 --json" \
        "estimate --gpus 4 --parallel zero3 --json" "estimate --finetune lora --checkpoint layers" \
        "check --batch 2 --gpu t4" "check --batch 2 --gpu t4 --checkpoint optimal --json"; do
        [ $lm = long2k ] && [ "$args" = "estimate --finetune lora --checkpoint layers" ] && continue
        # shellcheck disable=SC2086 # word splitting of args is intended
        set -- $args
        cmd=$1
        shift
        run "$cmd" "$T/$lm.json" --seq $seq "$@"
        cp "$T/out" "$T/fold.out"
        cp "$T/err" "$T/fold.err"
        fec=$ec
        run "$cmd" "$T/$lm.json" --seq $seq "$@" --timeline "$T/long.svg"
        if [ "$fec" -eq "$ec" ] && [ "$ec" -le 1 ] && cmp -s "$T/fold.out" "$T/out" && cmp -s "$T/fold.err" "$T/err"; then
            ok "$args $lm: through folds as through the whole model"
        else
            diff "$T/fold.out" "$T/out" | head -5 >"$T/why"
            bad "$args $lm: through folds as through the whole model"
        fi
    done
done

# A 100,000-block model in modest memory: through folds estimate and check take some 90 MiB where
# the whole model's replay took 1.8 GiB (out of memory under this 1 GiB limit: exit 5).  Not with
# AddressSanitizer, whose shadow memory needs far more address space than any such limit.
sed 's/"repeat": 2,/"repeat": 100000,/' models/tiny-test.json >"$T/long100k.json"
if ldd "$M" 2>/dev/null | grep -q libasan; then
    skipped "estimate and check on 100,000 blocks under a 1 GiB limit (AddressSanitizer build)"
else
    for args in "estimate" "check --batch 1 --gpu t4"; do
        # shellcheck disable=SC2086
        set -- $args
        cmd=$1
        shift
        cmdline="$cmd $T/long100k.json $* (ulimit -v 1048576)"
        : >"$T/why"
        (ulimit -v 1048576 && exec "$M" "$cmd" "$T/long100k.json" "$@") >"$T/out" 2>"$T/err" && ec=$? || ec=$?
        if [ "$ec" -le 1 ] && [ -s "$T/out" ]; then
            ok "$args on 100,000 blocks within 1 GiB of address space: exit $ec"
        else
            bad "$args on 100,000 blocks within 1 GiB of address space"
        fi
    done
fi

# ---- the man page's EXAMPLES run (jq's mantest) -------------------------------------------

MAN=man/memplan.1
if [ ! -f "$MAN" ]; then
    cmdline="(none)"; ec=-; : >"$T/out"; : >"$T/err"; echo "$MAN is missing" >"$T/why"
    bad "$MAN exists"
else
    # lines starting with "memplan " between .SH EXAMPLES and the next .SH, unescaped
    awk '/^\.SH/ { ex = ($0 ~ /^\.SH "?EXAMPLES"?[ \t]*$/); next } ex && /^memplan / { print }' "$MAN" |
        sed -e 's/\\-/-/g' -e 's/\\(aq/'"'"'/g' -e 's/\\&//g' -e 's/\\e/\\/g' >"$T/examples"
    nex=$(nlines "$T/examples")
    if [ "$nex" -ge 5 ]; then
        ok "$MAN: $nex commands in EXAMPLES"
    else
        cmdline="(none)"; ec=-; : >"$T/out"; : >"$T/err"; echo "found $nex (want at least 5)" >"$T/why"
        bad "$MAN: at least 5 commands in EXAMPLES"
    fi
    while IFS= read -r ex; do
        eval "set -- ${ex#memplan }"
        run "$@"
        if [ "$ec" -le 1 ]; then
            ok "man example: $ex: exit $ec"
        else
            echo "a man page example must exit 0 or 1" >"$T/why"
            bad "man example: $ex"
        fi
    done <"$T/examples"
fi

# ---- the sequence length: memplan's cap named as such, --seq past the model's positions -------

# an HF config whose max_position_embeddings (131072) is above memplan's default of 2048: the
# defaults line says the 2048 is memplan's, and what the model allows
run estimate models/hf/llama-3.2-1b.json
if [ "$ec" -eq 0 ] && tr '\n' ' ' <"$T/out" | tr -s ' ' | grep -q "seq 2048 (memplan's default for HF configs; the model allows 131072: --seq)"; then
    ok "estimate llama-3.2-1b: seq 2048 named as memplan's default, the model's 131072 said"
else
    echo "the defaults line must say whose 2048 it is" >"$T/why"
    bad "estimate llama-3.2-1b: seq default named"
fi
# a config whose positions are the default keeps "(model)"
run estimate models/hf/gpt2.json
if [ "$ec" -eq 0 ] && grep -q "seq 1024 (model)" "$T/out"; then
    ok "estimate gpt2: seq 1024 (model)"
else
    bad "estimate gpt2: seq 1024 (model)"
fi
# --seq beyond max_position_embeddings (a rotary model: it runs, so a warning, not an error)
run estimate models/hf/llama-3.2-1b.json --seq 200000
if [ "$ec" -eq 0 ] && [ "$(nlines "$T/err")" -eq 1 ] &&
    grep -q "^memplan: warning: models/hf/llama-3.2-1b.json: --seq 200000 exceeds max_position_embeddings 131072$" "$T/err"; then
    ok "estimate llama-3.2-1b --seq 200000: warns that the model has 131072 positions"
else
    echo "expected exit 0 and one warning line naming max_position_embeddings 131072" >"$T/why"
    bad "estimate --seq beyond max_position_embeddings warns"
fi
run estimate models/hf/llama-3.2-1b.json --seq 131072
if [ "$ec" -eq 0 ] && [ ! -s "$T/err" ]; then
    ok "estimate llama-3.2-1b --seq 131072 (= max positions): no warning"
else
    bad "estimate llama-3.2-1b --seq 131072: no warning"
fi

# ---- the attention label is the computed thing ---------------------------------------------

# Gemma-2: transformers has no SDPA path (logit soft-capping), so every layer runs eager; the
# report says eager (text and JSON) and a --attention sdpa is followed, with a warning
run estimate models/hf/gemma-2-2b.json
if [ "$ec" -eq 0 ] && grep -q "^config .*attention eager$" "$T/out" &&
    tr '\n' ' ' <"$T/out" | tr -s ' ' | grep -q "attention eager (the model's own; --attention overrides it)"; then
    ok "estimate gemma-2: attention eager in config and defaults"
else
    echo "Gemma-2 computes eager attention; the report must say so" >"$T/why"
    bad "estimate gemma-2: attention eager"
fi
run estimate models/hf/gemma-2-2b.json --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["config"]["attention"] != "eager")' "$T/out" 2>/dev/null; then
    ok "estimate gemma-2 --json: config.attention eager"
else
    bad "estimate gemma-2 --json: config.attention eager"
fi
run estimate models/hf/gemma-2-2b.json --attention sdpa
if [ "$ec" -eq 0 ] && grep -q "attention sdpa$" "$T/out" &&
    grep -q "^memplan: warning: models/hf/gemma-2-2b.json: --attention sdpa replaces the eager attention this model runs$" "$T/err"; then
    ok "estimate gemma-2 --attention sdpa: computed as asked, with a warning"
else
    bad "estimate gemma-2 --attention sdpa: warning"
fi
# a model whose layers name no implementation keeps the CLI's default, without a warning
run estimate models/hf/llama-3.2-1b.json --attention eager
if [ "$ec" -eq 0 ] && [ ! -s "$T/err" ] && grep -q "attention eager$" "$T/out"; then
    ok "estimate llama --attention eager: no warning"
else
    bad "estimate llama --attention eager: no warning"
fi

# ---- suggest proposes only what the GPU can run -------------------------------------------

# a T4 has no bf16 (its profile: tflops.bf16 0): pure bf16 is not offered there; an A10 has it
run suggest models/hf/llama-2-7b.json --gpu t4 --no-probe
if [ "$ec" -eq 1 ] && ! grep -q -- "--precision bf16" "$T/out" && grep -q "would fit or help" "$T/out"; then
    ok "suggest llama-2-7b on a t4: no --precision bf16 alternative"
else
    echo "a T4 has no bf16; the alternatives must not propose it" >"$T/why"
    bad "suggest on a t4: no bf16 alternative"
fi
run suggest models/hf/llama-2-7b.json --gpu a10 --no-probe
if [ "$ec" -eq 1 ] && grep -q -- "would fit or help: --precision bf16" "$T/out"; then
    ok "suggest llama-2-7b on an a10: --precision bf16 among the alternatives"
else
    bad "suggest on an a10: bf16 alternative"
fi

# A QLoRA 70B under FSDP2: transformers loads the 4-bit model whole onto every rank's GPU before
# fully_shard (packed 0.5 B a weight, about 31.9 GiB, plus the bf16 embedding and head, 3.9 GiB, and
# the quant_state, 1.0 GiB): no world of 24 GB cards takes it, offloaded or not, and suggest proposes
# none on an L4; four A100-40GB do, the load being the peak.  (The loop below follows the
# alternatives: check accepts them.)
run suggest models/hf/llama-3.1-70b.json --finetune qlora --gpu l4 --no-probe
if [ "$ec" -eq 1 ] && ! tr '\n' ' ' <"$T/out" | tr -s ' ' | grep -q -- "would fit or help: --gpus [0-9].* --parallel fsdp"; then
    ok "suggest qlora llama-3.1-70b on an l4: no FSDP-QLoRA world (the load does not fit)"
else
    echo "expected exit 1 and no --gpus N ... --parallel fsdp alternative" >"$T/why"
    bad "suggest qlora llama-3.1-70b on an l4: no FSDP-QLoRA world"
fi
# on one A100-40GB the smallest world is tried in mixed-bf16 too (the load in bf16, 36.93 GiB, fits
# a 40 GB card; in amp-bf16's fp32 embedding and head, 41.2 GiB, none does): two ranks, and check
# accepts the line followed
run suggest models/hf/llama-3.1-70b.json --finetune qlora --gpu a100-40gb --no-probe
if [ "$ec" -eq 1 ] && tr '\n' ' ' <"$T/out" | tr -s ' ' |
    grep -q -- "would fit or help: --gpus 2 --nodes 1 --parallel fsdp --precision mixed-bf16"; then
    run check models/hf/llama-3.1-70b.json --finetune qlora --gpu a100-40gb --gpus 2 --nodes 1 --parallel fsdp \
        --precision mixed-bf16 --batch 1 --checkpoint every:1
    if [ "$ec" -eq 0 ]; then
        ok "suggest qlora llama-3.1-70b on an a100-40gb: a 2-rank mixed-bf16 FSDP-QLoRA world, which check accepts"
    else
        echo "check of the world followed: expected exit 0" >"$T/why"
        bad "suggest qlora llama-3.1-70b on an a100-40gb: the world followed"
    fi
else
    echo "expected exit 1 and --gpus 2 --nodes 1 --parallel fsdp --precision mixed-bf16 among the alternatives" >"$T/why"
    bad "suggest qlora llama-3.1-70b on an a100-40gb: a mixed-bf16 world"
fi
run suggest models/hf/llama-3.1-70b.json --finetune qlora --gpu rtx4090 --gpus 2 --parallel fsdp --offload params \
    --no-probe
if [ "$ec" -eq 1 ] && tr '\n' ' ' <"$T/out" | tr -s ' ' | grep -q "from_pretrained loads the 4-bit model whole onto each GPU"; then
    ok "suggest qlora llama-3.1-70b on 2 x rtx4090, offloaded: does not fit, the load named"
else
    echo "expected exit 1 and the load named in the note" >"$T/why"
    bad "suggest qlora llama-3.1-70b on 2 x rtx4090, offloaded: the load"
fi
run check models/hf/llama-3.1-70b.json --finetune qlora --gpu a100-40gb --gpus 4 --parallel fsdp --precision bf16 \
    --checkpoint layers --batch 1 --json
if [ "$ec" -eq 0 ] && grep -q '"peak_event":[[:space:]]*"load:from_pretrained"' "$T/out"; then
    ok "check qlora llama-3.1-70b on 4 x a100-40gb: fits, the peak at load:from_pretrained"
else
    echo "expected exit 0 and peak_event load:from_pretrained" >"$T/why"
    bad "check qlora llama-3.1-70b on 4 x a100-40gb"
fi
run estimate models/hf/llama-3.1-70b.json --finetune qlora --gpu a100-40gb --gpus 4 --parallel fsdp --precision bf16 \
    --checkpoint layers --batch 1 --timeline "$T/load.svg"
if [ "$ec" -eq 0 ] && grep -q 'data-phase="load"' "$T/load.svg" && grep -q "load:from_pretrained" "$T/load.svg"; then
    ok "--timeline of a 70B FSDP-QLoRA: the load drawn before the step, its peak labelled"
else
    echo "expected exit 0, a load phase band and the load:from_pretrained label in the SVG" >"$T/why"
    bad "--timeline of a 70B FSDP-QLoRA: the load drawn"
fi

# Every alternative suggest names, followed: its flags (the words before its first "(" or ":")
# added to the same command (a --gpu in place of its --vram) as `check --batch 1 --checkpoint
# every:1` are accepted (exit 0 fits or 1 does not), never refused (2 usage, 3 input): one case per kind of alternative (8-bit
# optimizer, bf16, LoRA -> QLoRA, full -> QLoRA, a larger GPU, a data-parallel world, a fine-tune
# that fits no single GPU).
if [ -n "$HAVE_PY" ]; then
    for args in "models/hf/llama-3-8b.json --gpu t4" "models/hf/llama-2-7b.json --finetune lora --gpu t4" \
        "models/hf/mixtral-8x7b.json --finetune qlora --lora-targets q_proj,v_proj --gpu l4" \
        "models/hf/llama-2-70b.json --finetune qlora --vram 24GiB" \
        "models/hf/llama-3.2-1b.json --finetune freeze --train-blocks 8-15,head --gpu t4"; do
        # shellcheck disable=SC2086
        run suggest $args --no-probe --json
        if python3 -c '
import json, subprocess, sys
m, args = sys.argv[1], sys.argv[2].split()
alts = json.load(open(sys.argv[3]))["alternatives"]
bad = []
for a in alts:
    w, flags = a.split(" "), {}
    i = 0
    while i + 1 < len(w) and w[i].startswith("--") and not w[i + 1].startswith("("):
        v = w[i + 1].rstrip(":")
        flags[w[i]] = v
        i += 2
        if w[i - 1].endswith(":"):
            break
    if not flags:
        continue
    cmd = list(args)
    if "--gpu" in flags and "--vram" in cmd:  # a GPU profile instead of the given memory size
        del cmd[cmd.index("--vram"):cmd.index("--vram") + 2]
    for k, v in flags.items():
        if k in cmd:
            cmd[cmd.index(k) + 1] = v
        else:
            cmd += [k, v]
    r = subprocess.run([m, "check", *cmd, "--batch", "1", "--checkpoint", "every:1"], capture_output=True, text=True)
    if r.returncode not in (0, 1):
        bad.append("%s -> exit %d: %s" % (a[:60], r.returncode, r.stderr.strip()[:200]))
if bad or sys.argv[4] not in ("0", "1"):
    sys.exit("suggest exit %s; refused: %s" % (sys.argv[4], "; ".join(bad)))
' "$M" "$args" "$T/out" "$ec" 2>"$T/why"; then
            ok "suggest $args: every alternative followed is accepted by check"
        else
            bad "suggest $args: an alternative memplan refuses"
        fi
    done
fi

# The data-parallel world an alternative names, followed literally (its flags: the strategy, offload and
# precision the search chose included), plans what it promised: suggest there gives its micro-batch
if [ -n "$HAVE_PY" ]; then
    run suggest models/hf/llama-2-70b.json --gpu a100-40gb --no-probe --json
    world=$(python3 -c '
import json, re, sys
for a in json.load(sys.stdin)["alternatives"]:
    m = re.match(r"(--gpus .*?) \(\d+ ranks\): micro-batch (\d+) per rank", a)
    if m:
        print(m.group(2), m.group(1))
' <"$T/out")
    mb=${world%% *}
    flags=${world#* }
    # shellcheck disable=SC2086
    run suggest models/hf/llama-2-70b.json --gpu a100-40gb --no-probe --json $flags
    got=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["recommendation"]["micro_batch"])' <"$T/out" 2>/dev/null)
    if [ -n "$mb" ] && [ "$mb" = "$got" ] && echo "$flags" | grep -q -- "--parallel"; then
        ok "suggest llama-2-70b on a100-40gb: the world alternative followed ($flags) gives its micro-batch $mb"
    else
        echo "alternative '$world'; following it: micro-batch '$got'" >"$T/why"
        bad "suggest llama-2-70b on a100-40gb: the world alternative followed gives what it promised"
    fi
fi

# ---- suggest --checkpoint C and suggest --timeline ------------------------------------------

# --checkpoint: only that plan is searched, and the recommendation says it
run suggest models/gpt2-124m.json --gpu a100-40gb --no-probe --checkpoint sqrt
if [ "$ec" -eq 0 ] && grep -q "^  checkpointing      sqrt" "$T/out"; then
    ok "suggest --checkpoint sqrt: the recommendation checkpoints sqrt"
else
    bad "suggest --checkpoint sqrt"
fi
run suggest models/gpt2-124m.json --gpu a100-40gb --no-probe --checkpoint none --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(not r["candidates"] or not all(c["plan"]["strategy"] == "none" for c in r["candidates"]))' "$T/out" 2>/dev/null; then
    ok "suggest --checkpoint none --json: every candidate is checkpoint none"
else
    bad "suggest --checkpoint none --json: candidates"
fi
expect_line 2 "suggest --checkpoint sqrt --emit hf (a Trainer cannot run sqrt)" \
    suggest models/gpt2-124m.json --gpu a100-40gb --no-probe --checkpoint sqrt --emit hf
# --timeline: the recommended configuration's step, titled suggest, at the recommended batch
rm -f "$T/sug.svg"
run suggest models/gpt2-124m.json --gpu a100-40gb --no-probe --checkpoint layers --timeline "$T/sug.svg"
mb=$(sed -n 's/^  micro-batch *\([0-9]*\).*/\1/p' "$T/out")
if [ "$ec" -eq 0 ] && [ -s "$T/sug.svg" ] && grep -q "<title>gpt2-124m: suggest</title>" "$T/sug.svg" &&
    grep -q "batch $mb, seq 1024, amp-bf16, adamw, checkpoint layers" "$T/sug.svg"; then
    ok "suggest --timeline: the SVG draws the recommended step (micro-batch $mb, layers)"
else
    echo "expected an SVG of the recommended step" >"$T/why"
    bad "suggest --timeline"
fi
rm -f "$T/nofit.svg"
run suggest models/hf/llama-2-7b.json --gpu t4 --no-probe --timeline "$T/nofit.svg"
if [ "$ec" -eq 1 ] && [ ! -e "$T/nofit.svg" ] && grep -q "^memplan: warning: --timeline: nothing fits" "$T/err"; then
    ok "suggest --timeline when nothing fits: no picture, a warning"
else
    bad "suggest --timeline when nothing fits"
fi

# ---- MODEL as a model directory or a Hub id in the local Hugging Face cache ----------------

hub="$T/hub"
mkdir -p "$hub/models--acme--tiny/snapshots/c0ffee" "$hub/models--acme--tiny/snapshots/0ld" "$hub/models--acme--tiny/refs" "$T/Tiny-Model"
cp models/hf/llama-3.2-1b.json "$hub/models--acme--tiny/snapshots/c0ffee/config.json"
cp models/hf/gpt2.json "$hub/models--acme--tiny/snapshots/0ld/config.json"
echo c0ffee >"$hub/models--acme--tiny/refs/main"
cp models/hf/llama-3.2-1b.json "$T/Tiny-Model/config.json"
# the Hub id: refs/main's snapshot (the llama, not the older gpt2 one), named by the id
HF_HUB_CACHE="$hub" run estimate acme/tiny
if [ "$ec" -eq 0 ] && grep -q "^model     acme/tiny (HF config, 1,235,814,400 params, 18 blocks)$" "$T/out"; then
    ok "estimate acme/tiny: read from the HF cache's refs/main snapshot, named acme/tiny"
else
    bad "estimate ORG/NAME from the HF cache"
fi
# HF_HOME/hub when HF_HUB_CACHE is unset
mkdir -p "$T/hfhome" && ln -s "$hub" "$T/hfhome/hub"
HF_HUB_CACHE= HF_HOME="$T/hfhome" run estimate acme/tiny --json
if [ "$ec" -eq 0 ] && grep -q '"name":.*"acme/tiny"' "$T/out"; then
    ok "estimate acme/tiny with HF_HOME: \$HF_HOME/hub, JSON model.name acme/tiny"
else
    bad "estimate ORG/NAME through HF_HOME"
fi
# not in the cache: one line saying where it looked and how to fetch the config alone, exit 3
HF_HUB_CACHE="$hub" expect_line 3 "estimate acme/missing (not in the HF cache)" estimate acme/missing
if grep -q "models--acme--missing" "$T/err" && grep -q "hf download acme/missing config.json" "$T/err"; then
    ok "acme/missing: says where it looked and how to fetch only config.json"
else
    bad "acme/missing: the message"
fi
# a model directory: its config.json, named by the directory
run estimate "$T/Tiny-Model"
if [ "$ec" -eq 0 ] && grep -q "^model     Tiny-Model (HF config" "$T/out"; then
    ok "estimate DIR: the directory's config.json, named by the directory"
else
    bad "estimate a model directory"
fi
expect_line 3 "estimate a directory without config.json" estimate "$T/hfhome"
# a missing .json is a missing file, not a Hub id
expect_line 3 "estimate models/no-such.json (a missing file)" estimate models/no-such.json
grep -q "No such file" "$T/err" && ok "models/no-such.json: no such file" || bad "models/no-such.json: no such file"

# ---- model.safetensors.index.json beside the config: total_size against the parameter bytes ----

# llama-3.2-1b.json says torch_dtype bfloat16: 1,235,814,400 params x 2 = 2,471,628,800 bytes
mkdir -p "$T/Sharded"
cp models/hf/llama-3.2-1b.json "$T/Sharded/config.json"
echo '{"metadata": {"total_size": 2471628800}, "weight_map": {}}' >"$T/Sharded/model.safetensors.index.json"
run estimate "$T/Sharded"
if [ "$ec" -eq 0 ] && ! grep -q "warning" "$T/err"; then
    ok "estimate DIR with a matching model.safetensors.index.json: no warning"
else
    bad "a matching checkpoint index warns"
fi
# 2 bytes more than the parameters: one warning naming both figures, the estimate still runs
echo '{"metadata": {"total_size": 2471628802}, "weight_map": {}}' >"$T/Sharded/model.safetensors.index.json"
run estimate "$T/Sharded" --json
if [ "$ec" -eq 0 ] && [ "$(grep -c . "$T/err")" -eq 1 ] &&
    grep -q "^memplan: warning: .*model.safetensors.index.json: the checkpoint holds 2471628802 bytes of tensors (metadata.total_size) but 1235814400 parameters in bfloat16 are 2471628800 bytes$" "$T/err"; then
    ok "estimate DIR with a mismatching index: one warning naming both figures"
else
    bad "the checkpoint index mismatch warning"
fi
# an index without metadata.total_size: said, not checked, not fatal
echo '{"weight_map": {}}' >"$T/Sharded/model.safetensors.index.json"
run estimate "$T/Sharded"
if [ "$ec" -eq 0 ] && grep -q "^memplan: warning: .*metadata: expected an object; the parameter bytes are not checked$" "$T/err"; then
    ok "estimate DIR with an index without metadata: a warning, not checked"
else
    bad "an unreadable checkpoint index"
fi

# ---- suggest never switches the fine-tuning method asked for ----------------------------------

# --finetune lora on an L4: LoRA is recommended and only LoRA is searched (it used to recommend
# QLoRA without saying so); when nothing fits as LoRA, QLoRA is offered as an alternative
run suggest models/hf/llama-3.2-1b.json --gpu l4 --no-probe --finetune lora --json
if [ "$ec" -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(not r["candidates"] or r["recommendation"]["finetune"] != "lora" or any(c["finetune"] != "lora" for c in r["candidates"]))' "$T/out" 2>/dev/null; then
    ok "suggest --finetune lora (llama-3.2-1b, l4): LoRA recommended, no QLoRA candidate"
else
    echo "the method asked for must be the one recommended" >"$T/why"
    bad "suggest --finetune lora keeps LoRA"
fi
run suggest models/hf/llama-2-7b.json --gpu t4 --no-probe --finetune lora
if [ "$ec" -eq 1 ] && grep -q "would fit or help: --finetune qlora" "$T/out"; then
    ok "suggest --finetune lora where nothing fits (llama-2-7b, t4): QLoRA offered as an alternative"
else
    bad "suggest --finetune lora: QLoRA alternative"
fi
# issue 25 item 2: LoRA on an HF config is planned as peft users run it (a bf16 base, fp32 adapters,
# bf16 autocast: bf16-amp), and recommended when it fits: llama-3.2-1b on an L4 at seq 2048 has bf16
# weights (2.47 GB) where amp-bf16's fp32 base needs twice that; the QLoRA alternative is not bf16-amp
run suggest models/hf/llama-3.2-1b.json --gpu l4 --no-probe --finetune lora --json
if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
precs = {c["precision"] for c in r["candidates"]}
assert r["recommendation"]["precision"] == "bf16-amp", r["recommendation"]["precision"]
assert {"bf16-amp", "amp-bf16", "bf16"} <= precs, precs
' "$T/out" >"$T/why" 2>&1; then
    ok "suggest --finetune lora (llama-3.2-1b, l4): bf16-amp searched and recommended"
else
    bad "suggest --finetune lora: bf16-amp"
fi
expect_line 2 "estimate --precision bf16-amp on DeepSeek (fp32 router under autocast: not modelled)" \
    estimate models/hf/deepseek-v2-lite.json --precision bf16-amp
expect_line 2 "estimate --precision bf16-amp --gpus 2 --parallel ddp (not modelled)" \
    estimate models/hf/gpt2.json --precision bf16-amp --gpus 2 --parallel ddp

# ---- --recipe: a trainer's recipe read into memplan's settings --------------------------------

R=tests/data/recipes
rhub="$T/rhub"
mkdir -p "$rhub/models--meta-llama--Llama-3.2-1B/snapshots/abc"
cp models/hf/llama-3.2-1b.json "$rhub/models--meta-llama--Llama-3.2-1B/snapshots/abc/config.json"
# same_check DESC "RECIPE ARGS" "FLAGS": check --recipe and the same run spelled in flags (read off
# the recipe and its trainer's defaults by hand, tests/test_recipe.c) give one verdict, one peak
# and one config.
same_check() {
    HF_HUB_CACHE="$rhub" "$M" check $2 --gpu a100-80gb --json >"$T/r1" 2>"$T/err"; e1=$?
    HF_HUB_CACHE="$rhub" "$M" check $3 --gpu a100-80gb --json >"$T/r2" 2>>"$T/err"; e2=$?
    cmdline="check $2 --gpu a100-80gb --json"; ec=$e1
    if [ "$e1" -le 1 ] && [ "$e1" -eq "$e2" ] && python3 - "$T/r1" "$T/r2" >"$T/why" 2>&1 <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
rec = a["config"].pop("recipe")
assert "recipe" not in b["config"], "flags: no recipe"
assert a["config"] == b["config"], "config differs: %r / %r" % (a["config"], b["config"])
assert a["check"] == b["check"], "verdict differs: %r / %r" % (a["check"], b["check"])
assert a["memory"]["peak_device_bytes"] == b["memory"]["peak_device_bytes"]
assert rec["path"] and rec["format"] and rec["trainer"] and rec["settings"], rec
PYEOF
    then ok "$1: check --recipe = the flags (verdict, peak, config)"; else bad "$1: check --recipe = the flags"; fi
}
if [ -n "$HAVE_PY" ]; then
    same_check "HF to_json_string dump (bf16 checkpoint: dtype auto = bf16, bf16=True autocasts: bf16-amp)" \
        "models/hf/llama-3.2-1b.json --recipe $R/hf-trainingargs.json" \
        "models/hf/llama-3.2-1b.json -b 2 --grad-accum 8 -p bf16-amp -o adamw -c layers --use-cache off"
    same_check "HF YAML (fp16, float32 checkpoint)" "models/hf/gpt2.json --recipe $R/hf-args.yaml" \
        "models/hf/gpt2.json -b 4 --grad-accum 2 -p amp-fp16 -o adamw-fused --use-cache off"
    same_check "TRL SFT LoRA (TRL 1.16's chunked fused loss by default)" "--recipe $R/trl-sft-lora.yaml" \
        "models/hf/qwen2-0.5b.json -b 4 --grad-accum 4 -s 2048 -p bf16-amp -o adamw-fused -c layers --attention sdpa --use-cache off --finetune lora --lora-r 32 --lora-alpha 16 --lora-dropout 0.05 --lora-targets q_proj,k_proj,v_proj,o_proj --loss chunked-nll"
    same_check "Axolotl full" "--recipe $R/axolotl-full.yaml" \
        "models/hf/qwen2-0.5b.json -b 1 --grad-accum 2 -s 1024 -p bf16-amp -o adamw-fused -c layers --attention sdpa --use-cache off"
    same_check "Axolotl QLoRA (Hub id from the HF cache)" "--recipe $R/axolotl-qlora.yaml" \
        "meta-llama/Llama-3.2-1B -b 2 --grad-accum 4 -s 2048 -p bf16-amp -o paged-adam8bit -c layers --attention flash --use-cache off --finetune qlora --lora-r 32 --lora-alpha 16 --lora-dropout 0.05 --lora-targets all-linear"
    # Axolotl's rl: (core/builders/rl.py): dpo builds TRL's DPOTrainer (max_length = sequence_len,
    # with an adapter the reference is the adapter disabled); kto KTOTrainer with a second copy of
    # the model as the reference, and its precompute_ref_log_probs not handed on (DPOStrategy's alone)
    same_check "Axolotl rl: dpo, LoRA" "--recipe $R/axolotl-dpo-lora.yaml --trainer dpo" \
        "models/hf/qwen2-0.5b.json --trainer dpo -b 2 --grad-accum 4 -s 1024 -p bf16-amp -o adamw -c layers --attention sdpa --use-cache off --finetune lora --lora-r 16 --lora-alpha 32 --lora-dropout 0.05 --lora-targets all-linear"
    same_check "Axolotl rl: kto, full (a reference copy)" "--recipe $R/axolotl-kto-full.yaml --trainer kto" \
        "models/hf/qwen2-0.5b.json --trainer kto -b 4 --grad-accum 2 -s 512 -p bf16-amp -o adamw -c layers --use-cache off"
    same_check "LLaMA-Factory stage: dpo, LoRA" "--recipe $R/llamafactory-dpo-lora.yaml --trainer dpo" \
        "models/hf/qwen2-0.5b.json --trainer dpo --loss hf -b 1 --grad-accum 8 -s 1024 -p bf16-amp -o adamw-fused -c layers --use-cache off --finetune lora --lora-r 8 --lora-alpha 16 --lora-dropout 0 --lora-targets all-linear"
    same_check "LLaMA-Factory stage: kto, LoRA" "--recipe $R/llamafactory-kto-lora.yaml --trainer kto" \
        "models/hf/qwen2-0.5b.json --trainer kto --loss hf -b 1 --grad-accum 8 -s 1024 -p bf16-amp -o adamw-fused -c layers --use-cache off --finetune lora --lora-r 8 --lora-alpha 16 --lora-dropout 0 --lora-targets all-linear"
    # Liger's fused linear cross-entropy alone: transformers' use_liger_kernel with the other kernels
    # of llama's apply function false (as --emit hf writes it), Axolotl's LigerPlugin with its flag
    same_check "HF use_liger_kernel, the fused loss alone" "models/hf/llama-3.2-1b.json --recipe $R/hf-liger.yaml" \
        "models/hf/llama-3.2-1b.json -b 2 --grad-accum 4 -p bf16-amp -o adamw-fused -c layers --use-cache off --loss liger"
    same_check "Axolotl LigerPlugin, liger_fused_linear_cross_entropy" "--recipe $R/axolotl-liger.yaml" \
        "models/hf/qwen2-0.5b.json -b 2 --grad-accum 2 -s 1024 -p bf16-amp -o adamw-fused -c layers --attention sdpa --use-cache off --loss liger"
    same_check "LLaMA-Factory LoRA" "--recipe $R/llamafactory-lora.yaml" \
        "models/hf/llama-3.2-1b.json -b 1 --grad-accum 8 -s 2048 -p bf16-amp -o adamw-fused -c layers --use-cache off --finetune lora --lora-r 8 --lora-alpha 16 --lora-dropout 0 --lora-targets all-linear"
    # the command line wins, and the JSON says so
    run check --recipe $R/axolotl-full.yaml --gpu a100-80gb -b 3 -p amp-bf16 --json
    if [ "$ec" -le 1 ] && python3 -c '
import json, sys
d = json.load(open(sys.argv[1])); c = d["config"]; s = c["recipe"]["settings"]
assert c["batch"] == 3 and c["precision"] == "amp-bf16", c
assert s["batch"] == {"value": "1", "key": "micro_batch_size", "line": 9, "source": "command line"}, s["batch"]
assert s["precision"]["source"] == "command line" and s["seq"]["source"] == "recipe", s
assert s["optimizer"] == {"value": "adamw-fused", "key": "optimizer", "line": 0, "source": "trainer default"}
' "$T/out" >"$T/why" 2>&1; then
        ok "check --recipe -b 3 -p amp-bf16: the command line wins, config.recipe says which"
    else
        bad "command line over the recipe"
    fi
    run suggest --recipe $R/axolotl-full.yaml --gpu a100-80gb --no-probe --json
    if [ "$ec" -le 1 ] && python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["config"]["recipe"]["settings"]
assert s["batch"]["source"] == "not used" and s["seq"]["source"] == "recipe", s
' "$T/out" >"$T/why" 2>&1; then
        ok "suggest --recipe: the micro-batch is searched (batch: not used), config.recipe reported"
    else
        bad "suggest --recipe"
    fi
    run plan --recipe $R/axolotl-full.yaml --gpu a100-80gb --json
    if [ "$ec" -le 1 ] && python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["config"]
s = c["recipe"]["settings"]
assert s["checkpoint"]["source"] == "not used" and c["checkpoint"] != "layers", c
assert s["batch"]["source"] == "recipe" and c["batch"] == 1, c
' "$T/out" >"$T/why" 2>&1; then
        ok "plan --recipe: the checkpoints are planned (checkpoint: not used), the recipe batch kept"
    else
        bad "plan --recipe"
    fi
fi
run estimate --recipe $R/axolotl-full.yaml
if [ "$ec" -eq 0 ] && grep -q "^recipe    $R/axolotl-full.yaml (Axolotl 0.19.0)$" "$T/out" &&
    grep -q "from the recipe: batch 1, grad-accum 2, seq 1024, precision bf16-amp, checkpoint layers,$" "$T/out" &&
    [ "$(awk 'length > 100' "$T/out" | wc -l)" -eq 0 ]; then
    ok "estimate --recipe: the recipe and its settings in the report, within 100 columns"
else
    bad "estimate --recipe: the report's recipe lines"
fi
# --explain lists the keys memplan does not know; without it they are accepted quietly
HF_HUB_CACHE="$rhub" run check --recipe $R/axolotl-qlora.yaml --gpu a100-80gb --explain
if [ "$ec" -eq 0 ] && grep -q "1 key memplan does not know (accepted, not read): unknown_key_here (line 40)" "$T/err" &&
    grep -q "^-> optimizer paged-adam8bit (optimizer)$" "$T/err"; then
    ok "check --recipe --explain: the unknown key listed, each setting with its key"
else
    bad "--explain"
fi
HF_HUB_CACHE="$rhub" run check --recipe $R/axolotl-qlora.yaml --gpu a100-80gb
[ "$ec" -eq 0 ] && [ ! -s "$T/err" ] && ok "check --recipe without --explain: unknown keys accepted quietly" ||
    bad "unknown keys quiet without --explain"
# suggest --write-recipe: the recipe with the recommended micro-batch and accumulation, the rest
# of the file byte for byte; the report's "in the recipe" line says the same keys
run suggest --recipe $R/trl-sft-lora.yaml --gpu a100-40gb --no-probe --write-recipe "$T/w.yaml"
mb=$(awk '$1 == "micro-batch" { print $2; exit }' "$T/out")
ga=$(awk '$1 == "grad" && $2 == "accumulation" { print $3 }' "$T/out")
sed -e "s/^per_device_train_batch_size: 4$/per_device_train_batch_size: $mb/" \
    -e "s/^gradient_accumulation_steps: 4$/gradient_accumulation_steps: $ga/" $R/trl-sft-lora.yaml >"$T/want.yaml"
if [ "$ec" -eq 0 ] && [ -n "$mb" ] && [ "$mb" != 4 ] && cmp -s "$T/w.yaml" "$T/want.yaml" &&
    grep -q "^  in the recipe      per_device_train_batch_size 4 -> $mb (line 11)," "$T/out" &&
    grep -q "^memplan: wrote $T/w.yaml: per_device_train_batch_size 4 -> $mb, gradient_accumulation_steps 4 -> $ga$" "$T/err"; then
    ok "suggest --write-recipe: the TRL recipe with micro-batch $mb and accumulation $ga, the rest unchanged"
else
    diff "$T/w.yaml" "$T/want.yaml" >"$T/why" 2>&1
    bad "suggest --write-recipe (TRL)"
fi
expect_msg 2 "--write-recipe without --recipe" "--write-recipe needs --recipe FILE" \
    suggest models/hf/gpt2.json --gpu a100-40gb --write-recipe "$T/w2.yaml"
expect_msg 2 "--write-recipe with a setting given over the recipe" \
    "--write-recipe: --seq is given over the recipe's max_length" \
    suggest --recipe $R/trl-sft-lora.yaml --gpu a100-40gb --seq 512 --write-recipe "$T/w2.yaml"
[ ! -e "$T/w2.yaml" ] && ok "--write-recipe refused: nothing written" || bad "--write-recipe refused: nothing written"
run suggest --recipe $R/trl-sft-lora.yaml --vram 1GiB --no-probe --write-recipe "$T/w2.yaml"
if [ "$ec" -eq 1 ] && [ ! -e "$T/w2.yaml" ] && grep -q "nothing fits, so there is no plan to write" "$T/err"; then
    ok "--write-recipe when nothing fits: exit 1, a warning, nothing written"
else
    bad "--write-recipe when nothing fits"
fi
# refusals: exit 3, one line naming the file, the key (and its line)
expect_line 3 "LLaMA-Factory defaults: reentrant checkpointing refused" check --recipe $R/llamafactory-defaults.yaml --gpu a100-80gb
grep -q "use_reentrant_gc (the trainer's default): true: reentrant" "$T/err" && ok "names use_reentrant_gc" ||
    bad "LLaMA-Factory reentrant refusal message"
expect_line 3 "torchtune: its chunked loss refused" check --recipe $R/torchtune-full.yaml --gpu a100-80gb
grep -q "torchtune-full.yaml:36: loss._component_: torchtune.modules.loss.CEWithChunkedOutputLoss" "$T/err" &&
    ok "torchtune refusal names loss._component_ and line 36" || bad "torchtune refusal message"
printf 'base_model: models/hf/gpt2.json\nsample_packing: true\n' >"$T/pack.yaml"
expect_line 3 "Axolotl sample_packing under SDPA refused" check --recipe "$T/pack.yaml" --gpu a100-80gb
grep -q "pack.yaml:2: sample_packing: true: .*not modelled yet" "$T/err" && ok "names sample_packing:2" || bad "packing message"
printf 'base_model: models/hf/qwen3-0.6b.json\nsample_packing: true\nflash_attention: true\n' >"$T/pack.yaml"
run estimate --recipe "$T/pack.yaml" --json
[ "$ec" -eq 0 ] && grep -q '"packing":.*"rows"' "$T/out" && ok "Axolotl sample_packing with flash: packed rows" ||
    bad "Axolotl sample_packing with flash"
printf 'model_name_or_path: models/hf/qwen3-0.6b.json\npacking: true\nmax_length: 512\nper_device_train_batch_size: 2\n' \
    >"$T/trlpack.yaml"
run estimate --recipe "$T/trlpack.yaml" --json
[ "$ec" -eq 0 ] && grep -q '"packing":.*"padding-free"' "$T/out" &&
    grep -q '"tokens_per_micro_batch":.*1024' "$T/out" &&
    ok "TRL packing: true (bfd): padding-free, batch x max_length tokens in one row" || bad "TRL packing"
printf 'model_name_or_path: models/hf/qwen3-0.6b.json\npacking: true\npacking_strategy: wrapped\n' >"$T/trlpack.yaml"
run estimate --recipe "$T/trlpack.yaml" --json
[ "$ec" -eq 0 ] && ! grep -q '"packing"' "$T/out" && ok "TRL packing_strategy wrapped: full rows, nothing packed" ||
    bad "TRL wrapped packing"
printf 'model_name_or_path: models/hf/qwen3-0.6b.json\npacking: true\npacking_strategy: ffd\n' >"$T/trlpack.yaml"
expect_line 3 "TRL packing_strategy unknown: refused" estimate --recipe "$T/trlpack.yaml"
printf 'stage: sft\nmodel_name_or_path: models/hf/qwen3-0.6b.json\nneat_packing: true\nuse_reentrant_gc: false\n' \
    >"$T/lfpack.yaml"
expect_line 3 "LLaMA-Factory neat_packing refused" estimate --recipe "$T/lfpack.yaml"
grep -q "neat_packing: true: LLaMA-Factory's block-diagonal 4-D float mask" "$T/err" && ok "names neat_packing" ||
    bad "neat_packing message"
printf 'base_model: models/hf/gpt2.json\nmicro_batch_size: 2\nlora_r: 0\nadapter: lora\n' >"$T/r0.yaml"
expect_line 3 "a recipe's value out of range (lora_r 0)" check --recipe "$T/r0.yaml" --gpu a100-80gb
printf 'base_model: no-org/no-model\n' >"$T/nomodel.yaml"
HF_HUB_CACHE="$rhub" run check --recipe "$T/nomodel.yaml" --gpu a100-80gb
[ "$ec" -eq 3 ] && grep -q "models--no-org--no-model.*hf download no-org/no-model config.json" "$T/err" &&
    ok "a recipe's Hub id not in the cache: where it looked, how to fetch only config.json" || bad "recipe model not found"
printf 'micro_batch_size: 2\n' >"$T/nomodel2.yaml"
expect_line 2 "a recipe without a model and no MODEL" check --recipe "$T/nomodel2.yaml" --gpu a100-80gb
expect_line 2 "--recipe-format without --recipe" check models/gpt2-124m.json -b 1 --gpu a100-80gb --recipe-format hf
expect_line 2 "--recipe-format: an unknown format" check --recipe $R/hf-args.yaml --recipe-format nemo --gpu a100-80gb
expect_line 3 "--recipe: no such file" check --recipe "$T/none.yaml" --gpu a100-80gb
printf 'learning_rate: 1\n' >"$T/which.yaml"
expect_line 3 "a recipe whose format its keys do not tell" check models/gpt2-124m.json --recipe "$T/which.yaml" --gpu a100-80gb
run check models/hf/gpt2.json --recipe "$T/which.yaml" --recipe-format hf --gpu a100-80gb --json
[ "$ec" -eq 0 ] && grep -q '"format_from":.*"--recipe-format"' "$T/out" && ok "--recipe-format hf says it" ||
    bad "--recipe-format hf"

# --checkpoint layers+offload (transformers' offload=True): qwen2-0.5b's 24 decoder layers' inputs
# (batch 2 x seq 512 x hidden 896 x fp32 = 3,670,016 bytes each, rounded up to 4 MiB by the pinned
# host allocator) in pinned host RAM; on the device, layers+offload holds all 24 fewer than layers
# (the first one, the embeddings' output, too: the embedding's backward saves only the ids)
expect_line 2 "--checkpoint sqrt+offload refused" estimate models/hf/qwen2-0.5b.json --checkpoint sqrt+offload
expect_line 2 "probe --checkpoint layers+offload refused" probe models/hf/qwen2-0.5b.json --checkpoint layers+offload
if [ -n "$HAVE_PY" ]; then
    run estimate models/hf/qwen2-0.5b.json --batch 2 --seq 512 --checkpoint layers+offload --json
    cp "$T/out" "$T/off.json"
    run estimate models/hf/qwen2-0.5b.json --batch 2 --seq 512 --checkpoint layers --json
    if python3 -c '
import json, sys
o, p = (json.load(open(f))["memory"] for f in sys.argv[1:])
x = 2 * 512 * 896 * 4
assert o["host_pinned_bytes"] == 24 * 4 * 2**20, o["host_pinned_bytes"]
assert o["ckpt_offload_pcie_bytes"] == 2 * 24 * x, o["ckpt_offload_pcie_bytes"]
assert "host_pinned_bytes" not in p
assert p["activations_bytes"] - o["activations_bytes"] == 24 * x, (p["activations_bytes"], o["activations_bytes"])
' "$T/off.json" "$T/out" 2>"$T/why"; then
        ok "estimate --checkpoint layers+offload: pinned host RAM and the device bytes it frees"
    else
        bad "estimate --checkpoint layers+offload: pinned host RAM and the device bytes it frees"
    fi
fi

# --act-offload (TRL's activation_offloading): refused without --checkpoint layers, with a fused
# loss other than TRL's, another trainer or data parallelism, and by commands that do not plan
# it; a TRL recipe's key sets it (with TRL's fused loss: planned), Axolotl's key is refused.
expect_line 2 "--act-offload without --checkpoint layers refused" estimate models/hf/qwen2-0.5b.json --act-offload
expect_line 2 "--act-offload with layers+offload refused" estimate models/hf/qwen2-0.5b.json --act-offload \
    --checkpoint layers+offload
expect_line 2 "--act-offload with layers+sac refused" estimate models/hf/qwen2-0.5b.json --act-offload \
    --checkpoint layers+sac
expect_line 2 "--act-offload with --loss liger refused" estimate models/hf/qwen2-0.5b.json --act-offload \
    --checkpoint layers --loss liger
expect_line 2 "--act-offload with --trainer dpo refused" estimate models/hf/qwen2-0.5b.json --act-offload \
    --checkpoint layers --trainer dpo
expect_line 2 "--act-offload with --parallel refused" estimate models/hf/qwen2-0.5b.json --act-offload \
    --checkpoint layers --gpus 2 --parallel ddp
expect_line 2 "suggest --act-offload without --checkpoint layers refused" suggest models/hf/qwen2-0.5b.json \
    --act-offload --gpu t4
expect_line 3 "Axolotl's activation_offloading with an adapter refused" estimate --recipe $R/axolotl-lora-actoff.yaml
expect_line 3 "Axolotl's activation_offloading: legacy refused" estimate --recipe $R/axolotl-actoff-legacy.yaml
# Axolotl full fine-tuning with activation_offloading: true (llama-3.2-1b: 16 layers, hidden 2048,
# vocabulary 128,256; its defaults: 1 x 512, bf16 weights under autocast, HF's loss): by hand, each
# pack rounded up to a power of two: the 16 layer inputs (512 x 2048 x 2 = 2 MiB), the final norm's
# fp32 input (4 MiB), its rsqrt (2,048), the bf16 normalized input its trained weight's product
# saves (2 MiB), the fp32 logits (512 x 128,256 x 4 = 262,668,288 -> 256 MiB), the shifted labels
# and the token ids the trained embedding saves (4,096 each): 294 MiB + 10,240 = 308,291,584;
# gradient_checkpointing: offload is the same
if [ -n "$HAVE_PY" ]; then
    for f in axolotl-actoff axolotl-gc-offload; do
        run estimate --recipe $R/$f.yaml --json
        if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["config"]["checkpoint"] == "layers", d["config"]["checkpoint"]
assert d["memory"]["host_pinned_bytes"] == 308291584, d["memory"]["host_pinned_bytes"]
' "$T/out" 2>"$T/why"; then
            ok "estimate --recipe $f (Axolotl full, activation offloading): layers, pinned host RAM by hand"
        else
            bad "estimate --recipe $f (Axolotl full, activation offloading): layers, pinned host RAM by hand"
        fi
    done
fi
# Hand figures (qwen2-0.5b: 24 layers, hidden 896, vocab 151936; batch 1 x 512, bf16, LoRA
# all-linear, layers): offloaded packs, each rounded up to a power of two: the 24 layer inputs
# (512 x 896 x 2 = 917,504 -> 1 MiB), the final norm's fp32 input (1,835,008 -> 2 MiB) and its
# rsqrt (2,048), the fp32 log-probabilities (512 x 151936 x 4 = 311,164,928 -> 512 MiB) and the
# shifted labels (4,096): 24 MiB + 2 MiB + 2,048 + 512 MiB + 4,096 = 564,140,032.
if [ -n "$HAVE_PY" ]; then
    run estimate models/hf/qwen2-0.5b.json --batch 1 --seq 512 -p bf16 --finetune lora --lora-targets all-linear \
        --checkpoint layers --act-offload --json
    if python3 -c '
import json, sys
o = json.load(open(sys.argv[1]))["memory"]
assert o["host_pinned_bytes"] == 564140032, o["host_pinned_bytes"]
assert "ckpt_offload_pcie_bytes" not in o and o["act_offload_pcie_bytes"] > 0
' "$T/out" 2>"$T/why"; then
        ok "estimate --act-offload: pinned host RAM by hand"
    else
        bad "estimate --act-offload: pinned host RAM by hand"
    fi
fi
# TRL's fused head (--loss chunked-nll; docs/memory-facts.md#activation-offloading), qwen2-0.5b,
# batch 1 x 2048, bf16, LoRA all-linear, layers: the 24 layer inputs (2048 x 896 x 2 = 3,670,016
# -> 4 MiB), the final norm's fp32 input (7,340,032 -> 8 MiB) and rsqrt (8,192), then the head's:
# the label mask (2,047 -> 2,048), the 2,047 gathered rows (2047 x 896 x 2 = 3,668,224 -> 4 MiB),
# the targets (16,376 -> 16,384), log_z and entropy (8,188 -> 8,192 each), the mask again
# (2,048): 108 MiB + 45,056 = 113,291,264.  The TRL recipe (llama-3.2-1b, 16 layers, batch 8 x
# 2048, amp-bf16: fp32 hidden states): 16 layer inputs and the norm's input (8 x 2048 x 2048 x 4
# = 128 MiB each), rsqrt 65,536, mask 16,376 -> 16,384 (twice), 16,376 rows x 2048 x 4 =
# 134,152,192 -> 128 MiB, targets 131,008 -> 131,072, log_z and entropy 65,504 -> 65,536 each:
# 18 x 128 MiB + 360,448 = 2,416,279,552.
# suggest on the TRL recipe (activation_offloading: true; its defaults: layers, amp-bf16, the fused
# head): the recommendation's pinned host RAM is, at its micro-batch M (as in the recipe's figure
# below, each pack rounded up to a power of two): the 16 layer inputs, the final norm's input and
# the 2,047 x M gathered rows (M x 2048 x 2048 x 4 and M x 2047 x 2048 x 4), the rsqrt
# (M x 2048 x 4), the label mask twice (M x 2047), the targets (M x 2047 x 8), log_z and entropy
# (M x 2047 x 4 each); --emit hf sets SFTConfig(activation_offloading=True)
if [ -n "$HAVE_PY" ]; then
    run suggest --recipe $R/trl-sft-actoff.yaml --gpu t4 --no-probe --json
    if python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["recommendation"]
p2 = lambda x: 1 << (x - 1).bit_length()
m = r["micro_batch"]
want = 17 * p2(m * 2048 * 2048 * 4) + p2(m * 2047 * 2048 * 4) + p2(m * 2048 * 4) + 2 * p2(m * 2047) + \
    p2(m * 2047 * 8) + 2 * p2(m * 2047 * 4)
assert m > 8 and r["plan"]["strategy"] == "layers", (m, r["plan"]["strategy"])
assert r["host_pinned_bytes"] == want, (r["host_pinned_bytes"], want)
' "$T/out" 2>"$T/why"; then
        ok "suggest --recipe (TRL activation_offloading): the recommendation's pinned host RAM by hand"
    else
        bad "suggest --recipe (TRL activation_offloading): the recommendation's pinned host RAM by hand"
    fi
    run suggest --recipe $R/trl-sft-actoff.yaml --gpu t4 --no-probe --emit hf
    if [ "$ec" -eq 0 ] && grep -q "^    activation_offloading=True,$" "$T/out"; then
        ok "suggest --recipe (TRL activation_offloading) --emit hf: SFTConfig(activation_offloading=True)"
    else
        bad "suggest --recipe (TRL activation_offloading) --emit hf: SFTConfig(activation_offloading=True)"
    fi
fi
pinned_is() { # DESC BYTES: the last run's memory.host_pinned_bytes is BYTES
    if python3 -c '
import json, sys
o = json.load(open(sys.argv[1]))["memory"]
assert o["host_pinned_bytes"] == int(sys.argv[2]), o["host_pinned_bytes"]
' "$T/out" "$2" 2>"$T/why"; then ok "$1"; else bad "$1"; fi
}
if [ -n "$HAVE_PY" ]; then
    run estimate models/hf/qwen2-0.5b.json --batch 1 --seq 2048 -p bf16 --finetune lora --lora-targets all-linear \
        --checkpoint layers --act-offload --loss chunked-nll --json
    pinned_is "estimate --act-offload --loss chunked-nll: pinned host RAM by hand" 113291264
    run estimate --recipe $R/trl-sft-actoff.yaml --json
    pinned_is "a TRL recipe's activation_offloading plans with TRL's fused loss: pinned host RAM by hand" 2416279552
fi
# --checkpoint layers+sac (TRL 1.16's selective checkpointing, docs/checkpointing.md#sac):
# qwen2-0.5b's 24 checkpointed layers each keep their SDPA output (batch 2 x seq 512 x 14 heads x
# 64 x bf16 = 1,835,008 B) and fp32 logsumexp (2 x 14 x 512 x 4 = 57,344 B) to the recompute; the
# recompute skips each layer's attention (4 b a s^2 d / 2 = 939,524,096 FLOPs)
expect_line 2 "--checkpoint sqrt+sac refused" estimate models/hf/qwen2-0.5b.json --checkpoint sqrt+sac
expect_line 2 "--checkpoint layers:2+sac:torchtitan refused (torchtitan wraps every layer)" estimate \
    models/hf/qwen2-0.5b.json --checkpoint layers:2+sac:torchtitan
expect_line 2 "--checkpoint layers+sac:torchtitan with --attention eager refused (bmm saved)" estimate \
    models/hf/qwen2-0.5b.json --checkpoint layers+sac:torchtitan --attention eager
expect_line 2 "--checkpoint layers+sac:torchtitan on ResNet-50 refused (convolutions in the layers)" estimate \
    models/resnet50.json --checkpoint layers+sac:torchtitan
expect 0 "--checkpoint layers+sac:torchtitan on ViT: the patch convolution is outside the layers" estimate \
    models/hf/vit-base-patch16-224.json --checkpoint layers+sac:torchtitan
expect_line 2 "--checkpoint layers+sac with --attention flash refused" estimate models/hf/qwen2-0.5b.json \
    --checkpoint layers+sac --attention flash
expect_line 2 "probe --checkpoint layers+sac refused" probe models/hf/qwen2-0.5b.json --checkpoint layers+sac
expect_line 2 "--checkpoint layers+sac:axolotl on sliding-window layers refused" estimate models/hf/gemma-3-1b.json \
    --checkpoint layers+sac:axolotl --attention sdpa
expect_line 2 "--emit hf of layers+sac with LoRA refused" suggest models/hf/qwen2-0.5b.json --gpu a100-80gb \
    --checkpoint layers+sac --finetune lora --loss chunked-nll --emit hf --no-probe
expect_line 2 "--emit deepspeed of layers+sac refused" suggest models/hf/qwen2-0.5b.json --gpu a100-80gb \
    --checkpoint layers+sac --emit deepspeed --no-probe
if [ -n "$HAVE_PY" ]; then
    run estimate models/hf/qwen2-0.5b.json --batch 2 --seq 512 --precision bf16 --checkpoint layers+sac --json
    cp "$T/out" "$T/sac.json"
    run estimate models/hf/qwen2-0.5b.json --batch 2 --seq 512 --precision bf16 --checkpoint layers --json
    if python3 -c '
import json, sys
o, p = (json.load(open(f))["memory"] for f in sys.argv[1:])
x = 2 * 512 * 14 * 64 * 2 + 2 * 14 * 512 * 4
assert o["sac_policy"] == "trl" and o["sac_layer_bytes"] == x and o["sac_layers"] == 24, o
assert "sac_policy" not in p
assert o["activations_bytes"] - p["activations_bytes"] == 24 * x, (o["activations_bytes"], p["activations_bytes"])
assert p["recompute_flops"] - o["recompute_flops"] == 24 * 4 * 2 * 14 * 512 ** 2 * 64 / 2
' "$T/sac.json" "$T/out" 2>"$T/why"; then
        ok "estimate --checkpoint layers+sac: SDPA outputs kept per layer, the attention not recomputed"
    else
        bad "estimate --checkpoint layers+sac: SDPA outputs kept per layer, the attention not recomputed"
    fi
fi
# layers+sac:torchtitan (torchtitan's SelectiveAC, docs/checkpointing.md#sac-torchtitan): a qwen2-0.5b
# layer (2 x 512 tokens, bf16) keeps q, k and v (biased: aten.addmm, always saved, not counted),
# o_proj and up_proj (the 1st and 3rd aten.mm; gate_proj and down_proj, the 2nd and 4th, are
# recomputed) and SDPA's output and logsumexp: 1024 x (3 x 896 + 2 x 128 + 4864) x 2 + 57,344 B;
# its recompute (early_stop=False) skips those ops' 2 M n k FLOPs (and the attention's), where the
# layers' recompute, stopped at down_proj's pack, skips down_proj's mm and the residual add
if [ -n "$HAVE_PY" ]; then
    run estimate models/hf/qwen2-0.5b.json --batch 2 --seq 512 --precision bf16 --checkpoint layers+sac:torchtitan \
        --json
    cp "$T/out" "$T/titan.json"
    run estimate models/hf/qwen2-0.5b.json --batch 2 --seq 512 --precision bf16 --checkpoint layers --json
    if python3 -c '
import json, sys
o, p = (json.load(open(f))["memory"] for f in sys.argv[1:])
x = 1024 * (3 * 896 + 2 * 128 + 4864) * 2 + 2 * 14 * 512 * 4
f = 2 * 1024 * 896 * (896 + 128 + 128 + 896 + 4864) + 4 * 2 * 14 * 512 ** 2 * 64 / 2
f -= 2 * 1024 * 4864 * 896 + 1024 * 896
assert o["sac_policy"] == "torchtitan" and o["sac_layer_bytes"] == x and o["sac_layers"] == 24, o
assert o["activations_bytes"] - p["activations_bytes"] == 24 * x, (o["activations_bytes"], p["activations_bytes"])
assert abs(p["recompute_flops"] - o["recompute_flops"] - 24 * f) < 1e-6 * f, (p["recompute_flops"], o["recompute_flops"])
' "$T/titan.json" "$T/out" 2>"$T/why"; then
        ok "estimate --checkpoint layers+sac:torchtitan: addmm, odd mm and SDPA outputs kept per layer"
    else
        bad "estimate --checkpoint layers+sac:torchtitan: addmm, odd mm and SDPA outputs kept per layer"
    fi
fi
run suggest models/hf/llama-3.2-1b.json --gpu a100-80gb --checkpoint layers+sac:torchtitan --emit torch --no-probe
if [ "$ec" -eq 0 ] && grep -q 'count\[0\] % 2 == 0' "$T/out" && grep -q '"early_stop": False}' "$T/out"; then
    ok "suggest --checkpoint layers+sac:torchtitan --emit torch: the policy and early_stop=False"
else
    echo "expected exit 0, the every-second-mm test and early_stop False" >"$T/why"
    bad "suggest --checkpoint layers+sac:torchtitan --emit torch"
fi
# layers+sac:auto: with room for everything, every candidate of a Llama layer kept (q, k, v, o, gate,
# up: the layer's first six aten.mm calls, and SDPA; down_proj's mm is the recompute's stop); with
# none to spare, nothing (the plan is layers')
expect_line 2 "--checkpoint layers+sac:auto without a target refused" estimate models/hf/llama-3.2-1b.json \
    --checkpoint layers+sac:auto
expect_line 2 "--emit hf of layers+sac:auto refused" suggest models/hf/llama-3.2-1b.json --gpu a100-80gb \
    --checkpoint layers+sac:auto --loss chunked-nll --emit hf --no-probe
if [ -n "$HAVE_PY" ]; then
    run check models/hf/llama-3.2-1b.json --batch 1 --seq 1024 --precision bf16 --checkpoint layers+sac:auto \
        --vram 1000GiB --json
    cp "$T/out" "$T/auto_all.json"
    run check models/hf/llama-3.2-1b.json --batch 1 --seq 1024 --precision bf16 --checkpoint layers --vram 1000GiB \
        --json
    cp "$T/out" "$T/auto_none.json"
    run check models/hf/llama-3.2-1b.json --batch 1 --seq 1024 --precision bf16 --checkpoint layers+sac:auto \
        --vram 10GiB --json
    if python3 -c '
import json, sys
a, n, t = (json.load(open(f))["memory"] for f in sys.argv[1:])
assert a["sac_keep"] == ["mm:0", "mm:1", "mm:2", "sdpa", "mm:3", "mm:4", "mm:5"], a["sac_keep"]
assert t["sac_keep"] == [] and t["peak_allocated_bytes"] == n["peak_allocated_bytes"], t
' "$T/auto_all.json" "$T/auto_none.json" "$T/out" 2>"$T/why"; then
        ok "check --checkpoint layers+sac:auto: all candidates kept with room, none without"
    else
        bad "check --checkpoint layers+sac:auto: all candidates kept with room, none without"
    fi
fi
run suggest models/hf/llama-3.2-1b.json --gpu a100-80gb --checkpoint layers+sac --loss chunked-nll --emit hf --no-probe
if [ "$ec" -eq 0 ] && grep -q 'activation_checkpointing_kwargs={"use_reentrant": False, "selective": True}' "$T/out"; then
    ok "suggest --checkpoint layers+sac --emit hf: SFTConfig's \"selective\": True"
else
    echo "expected exit 0 and the selective key" >"$T/why"
    bad "suggest --checkpoint layers+sac --emit hf"
fi

# ---- an HF family's blocks written in memplan JSON ------------------------------------------

# tests/data/models/ holds Gemma-2-2B and Qwen3-30B-A3B written by hand in memplan JSON (the keys of
# docs/model-format.md): the memory of a step is their config.json's, bar the KV-cache copies
# (--use-cache off), which memplan JSON has no key for.
if [ -n "$HAVE_PY" ]; then
    for mm in gemma-2-2b qwen3-30b-a3b; do
        for oo in "--batch 2 --seq 512" "--batch 1 --checkpoint layers -p bf16-amp" \
            "--finetune lora --lora-targets q_proj,v_proj --batch 4 --seq 256"; do
            # shellcheck disable=SC2086
            run estimate models/hf/$mm.json --use-cache off $oo --json
            cp "$T/out" "$T/hfm.json"
            # shellcheck disable=SC2086
            run estimate tests/data/models/$mm.json $oo --json
            if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a["memory"] == b["memory"], [(k, a["memory"][k], b["memory"].get(k)) for k in a["memory"]
                                     if a["memory"][k] != b["memory"].get(k)]
assert a["model"]["params"] == b["model"]["params"]
' "$T/hfm.json" "$T/out" 2>"$T/why"; then
                ok "$mm in memplan JSON, $oo: the memory of its config.json"
            else
                bad "$mm in memplan JSON, $oo: the memory of its config.json"
            fi
        done
    done
fi
expect_msg 2 "memplan JSON mixture of experts: LoRA's all-linear default refused" \
    "peft's all-linear also adapts the MoE routers" estimate tests/data/models/qwen3-30b-a3b.json --finetune lora
expect_msg 2 "memplan JSON mixture of experts: LoRA on the MLP names refused" \
    "peft maps the MLP names" estimate tests/data/models/qwen3-30b-a3b.json --finetune qlora --lora-targets up_proj

# ---- GRPO (--trainer grpo; trl 1.16.0 grpo_trainer.py, grpo_config.py) -------------------------

expect_msg 2 "--beta without --trainer grpo: refused" "need --trainer grpo" \
    estimate models/hf/qwen2-0.5b.json --beta 0.04
expect_msg 2 "--trainer grpo --num-generations 1: refused as GRPOConfig refuses it" "2 or more completions" \
    estimate models/hf/qwen2-0.5b.json --trainer grpo --num-generations 1
expect_msg 2 "--trainer grpo: a completion as long as --seq leaves no prompt" "leaves no prompt" \
    estimate models/hf/qwen2-0.5b.json --trainer grpo --seq 512 --completion-length 512
expect_msg 2 "--trainer grpo: a generation batch that splits a prompt group: refused" \
    "--batch 3 x 1 steps x 1 ranks = 3) is not a multiple of --num-generations 8" \
    estimate models/hf/qwen2-0.5b.json --trainer grpo --batch 3
expect_msg 2 "--trainer grpo --vllm without a GPU to take a share of" "name the GPU" \
    estimate models/hf/qwen2-0.5b.json --trainer grpo --vllm 0.3
expect_msg 2 "--trainer grpo --finetune qlora: generate on a 4-bit base refused, not planned unmeasured" \
    "generate on a bitsandbytes 4-bit base is not modelled" estimate models/hf/qwen2-0.5b.json --trainer grpo \
    --finetune qlora
expect_msg 2 "--trainer grpo, LoRA on a load_in_4bit checkpoint: refused as --finetune qlora is" \
    "generate on a bitsandbytes 4-bit base is not modelled" estimate tests/data/hf-qwen2-0.5b-bnb4.json \
    --trainer grpo --finetune lora
expect_msg 2 "--trainer grpo, LoRA on a GPTQ checkpoint: generate on it refused, not planned unmeasured" \
    "generate on a gptq base is not modelled" estimate tests/data/hf-qwen2-0.5b-gptq.json --trainer grpo \
    --finetune lora
expect 0 "--trainer grpo, LoRA on a GPTQ checkpoint with --vllm 0.3: vLLM generates, so it is planned" \
    estimate tests/data/hf-qwen2-0.5b-gptq.json --trainer grpo --finetune lora --vllm 0.3 --gpu a100-80gb
expect 0 "--trainer grpo --finetune qlora --vllm 0.3: vLLM generates, so QLoRA is planned" \
    estimate models/hf/qwen2-0.5b.json --trainer grpo --finetune qlora --vllm 0.3 --gpu a100-80gb
expect_msg 2 "--trainer grpo: a sliding-window cache shorter than the sequence is refused, not ignored" \
    "sliding-window cache (window 512 < --seq 1024)" estimate models/hf/gemma-3-1b.json --trainer grpo --seq 1024 \
    --completion-length 256
if [ -n "$HAVE_PY" ]; then
    # The cache at the last decoding step, worked by hand: Qwen2-0.5B has 24 layers, 2 k/v heads of 64;
    # bf16; 8 sequences of 512 prompt + 512 completion tokens hold P + C - 1 = 1023 positions:
    # k = 8 x 2 x 1023 x 64 x 2 B = 2,095,104 B (512-aligned), k and v in 24 layers: 100,564,992 B.
    run estimate models/hf/qwen2-0.5b.json --trainer grpo --batch 8 --seq 1024 --completion-length 512 \
        --precision bf16 --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
m, c = d["memory"], d["config"]
g = m["phases"]["generation"]
assert g["kv_cache_bytes"] == 100564992, g
assert g["sequences"] == 8, g
assert g["peak_allocated_bytes"] == max(g["prefill_peak_bytes"], g["decode_peak_bytes"]), g
assert m["peak_allocated_bytes"] == max(g["peak_allocated_bytes"], m["phases"]["policy_step"]["peak_allocated_bytes"])
assert "reference_forward" not in m["phases"] and c["trainer"] == "grpo", m["phases"]
' "$T/out" 2>"$T/why"; then
        ok "--trainer grpo: the generation cache worked by hand (100,564,992 B), the peak the larger phase"
    else
        bad "--trainer grpo: the generation cache worked by hand (100,564,992 B), the peak the larger phase"
    fi
    # 4 steps per generation: 32 sequences generated at once, the cache 4 x as large
    run estimate models/hf/qwen2-0.5b.json --trainer grpo --batch 8 --seq 1024 --completion-length 512 \
        --precision bf16 --steps-per-generation 4 --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
g = json.load(open(sys.argv[1]))["memory"]["phases"]["generation"]
assert g["sequences"] == 32 and g["kv_cache_bytes"] == 4 * 100564992, g
' "$T/out" 2>"$T/why"; then
        ok "--trainer grpo --steps-per-generation 4: 32 sequences generated at once, 4 x the cache"
    else
        bad "--trainer grpo --steps-per-generation 4: 32 sequences generated at once, 4 x the cache"
    fi
    # A colocated vLLM takes 0.3 x 40 GiB = 12,884,901,888 B of an A100 40GB beside the step
    run check models/hf/qwen2-0.5b.json --trainer grpo --batch 8 --seq 1024 --gpu a100-40gb --vllm 0.3 --json
    if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
m = d["memory"]
assert m["vllm_bytes"] == 12884901888, m
assert m["peak_device_bytes"] == m["peak_allocated_bytes"] + m["overhead_bytes"] + 12884901888, m
assert "generation" not in m.get("phases", {}), m
' "$T/out" 2>"$T/why"; then
        ok "--trainer grpo --vllm 0.3: 12,884,901,888 B of an A100 40GB beside the step, no generate phase"
    else
        bad "--trainer grpo --vllm 0.3: 12,884,901,888 B of an A100 40GB beside the step, no generate phase"
    fi
    run check models/hf/qwen2-0.5b.json --trainer grpo --batch 16 --seq 1024 --gpu a100-40gb
    e16=$ec
    run check models/hf/qwen2-0.5b.json --trainer grpo --batch 16 --seq 1024 --gpu a100-40gb --vllm 0.3
    if [ "$e16" -eq 0 ] && [ "$ec" -eq 1 ]; then
        ok "--trainer grpo: 16 completions fit an A100 40GB alone (exit 0), not beside a vLLM at 0.3 (exit 1)"
    else
        bad "--trainer grpo: 16 completions fit an A100 40GB alone (exit 0), not beside a vLLM at 0.3 (exit 1)"
    fi
    # suggest: whole prompt groups (num_generations 8), and a GRPOConfig that says so
    run suggest models/hf/qwen2-0.5b.json --trainer grpo --seq 1024 --gpu a100-40gb --no-probe --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["recommendation"]
assert r["micro_batch"] % 8 == 0 and r["micro_batch"] >= 8, r
' "$T/out" 2>"$T/why"; then
        ok "suggest --trainer grpo: the micro-batch a multiple of num_generations 8"
    else
        bad "suggest --trainer grpo: the micro-batch a multiple of num_generations 8"
    fi
fi
run suggest models/hf/qwen2-0.5b.json --trainer grpo --seq 1024 --gpu a100-40gb --no-probe --emit hf --beta 0.04
if [ "$ec" -eq 0 ] && grep -q "args = GRPOConfig(" "$T/out" && grep -q "num_generations=8," "$T/out" &&
    grep -q "max_completion_length=512," "$T/out" && grep -q "beta=0.04," "$T/out" &&
    grep -q "steps_per_generation=1," "$T/out"; then
    ok "suggest --trainer grpo --emit hf: a GRPOConfig with the planned groups, completion, beta and generation"
else
    bad "suggest --trainer grpo --emit hf: a GRPOConfig with the planned groups, completion, beta and generation"
fi

# GRPO's old log-probs (grpo_trainer.py:2641-2657): a no-grad forward of the policy when the
# accumulation is not a multiple of steps_per_generation x num_iterations, or with vLLM's importance
# sampling correction; nothing else
G="models/hf/qwen2-0.5b.json --trainer grpo --batch 8 --seq 512 --completion-length 256 --precision bf16"
olds=""
for a in "--grad-accum 1 --steps-per-generation 2" "--grad-accum 2 --steps-per-generation 2" \
    "--grad-accum 2 --steps-per-generation 1" "--num-iterations 2" "--gpu a100-40gb --vllm 0.3" \
    "--gpu a100-40gb --vllm 0.3 --vllm-correction off" "--vllm server"; do
    run estimate $G $a --json
    if [ "$ec" -ne 0 ]; then
        olds="$olds error"
    elif grep -q '"old_logprobs_forward":[[:space:]]*{' "$T/out"; then
        olds="$olds y"
    else
        olds="$olds n"
    fi
done
if [ "$olds" = " y n n y y n y" ]; then
    ok "--trainer grpo: the old log-probs' forward exactly where TRL runs it"
else
    echo "got$olds, expected y n n y y n y" >"$T/why"
    bad "--trainer grpo: the old log-probs' forward exactly where TRL runs it"
fi
if [ -n "$HAVE_PY" ]; then
    # the same forward on the same resident state: the policy's old log-probs and a frozen copy's
    # reference log-probs (bf16: no autocast copies) peak alike; a vLLM server holds nothing here
    run estimate $G --grad-accum 1 --steps-per-generation 2 --beta 0.04 --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["memory"]["phases"]
o, r = p["old_logprobs_forward"], p["reference_forward"]
assert o["peak_allocated_bytes"] == r["peak_allocated_bytes"], p
assert o["peak_event"].startswith("policy.forward:") and r["peak_event"].startswith("reference.forward:"), p
assert p["generation"]["sequences"] == 16, p
' "$T/out" 2>"$T/why"; then
        ok "--trainer grpo: the old log-probs forward peaks as the frozen copy's reference forward"
    else
        bad "--trainer grpo: the old log-probs forward peaks as the frozen copy's reference forward"
    fi
    run estimate $G --vllm server --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
assert "vllm_bytes" not in m and "generation" not in m["phases"], m
assert m["peak_device_bytes"] == m["peak_allocated_bytes"] + m["overhead_bytes"], m
' "$T/out" 2>"$T/why"; then
        ok "--trainer grpo --vllm server: no generate phase, nothing of vLLM on this GPU"
    else
        bad "--trainer grpo --vllm server: no generate phase, nothing of vLLM on this GPU"
    fi
    # a GRPOConfig recipe: its generation keys as the options (vLLM 0.25 x 40 GiB = 10,737,418,240 B)
    run estimate --recipe tests/data/recipes/trl-grpo-vllm.yaml --trainer grpo --seq 768 --gpu a100-40gb --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
c, m = d["config"], d["memory"]
assert c["recipe"]["trainer"].startswith("TRL 1.16.0 GRPOTrainer"), c["recipe"]
assert c["trainer"] == "grpo" and c["reference"] == "copy" and c["batch"] == 8, c
assert m["vllm_bytes"] == 10737418240, m
assert "old_logprobs_forward" in m["phases"] and "generation" not in m["phases"], m
assert c["grpo"] == {"completion_length": 256, "num_generations": 8, "num_iterations": 1, "beta": 0.04,
                     "temperature": 0.9, "top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0,
                     "vllm": "colocate", "vllm_gpu_memory_utilization": 0.25, "vllm_correction": True,
                     "old_logprobs_forward": True, "ds3_gather_for_generation": True}, c["grpo"]
' "$T/out" 2>"$T/why"; then
        ok "--recipe GRPOConfig: vLLM colocate at 0.25, beta 0.04 (a frozen copy), old log-probs"
    else
        bad "--recipe GRPOConfig: vLLM colocate at 0.25, beta 0.04 (a frozen copy), old log-probs"
    fi
    run estimate --recipe tests/data/recipes/trl-grpo-genbatch.yaml --trainer grpo --seq 384 --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
assert m["phases"]["generation"]["sequences"] == 32, m["phases"]
assert "old_logprobs_forward" in m["phases"] and "reference_forward" not in m["phases"], m["phases"]
' "$T/out" 2>"$T/why"; then
        ok "--recipe GRPOConfig: generation_batch_size 32 / batch 8 = 4 steps, 32 sequences, old log-probs"
    else
        bad "--recipe GRPOConfig: generation_batch_size 32 / batch 8 = 4 steps, 32 sequences, old log-probs"
    fi
    # suggest --global-batch without --steps-per-generation: TRL's steps are the accumulation, so
    # generation takes the global batch (1024 completions here, the step's peak) whatever the
    # micro-batch: the plan's peak is estimate's at the chosen micro-batch and accumulation
    S="models/hf/qwen2-0.5b.json --trainer grpo --seq 1024 --completion-length 960 --gpu a100-80gb --finetune lora"
    run suggest $S --no-probe --global-batch 1024 --max-batch 4 --json
    cp "$T/out" "$T/gs.json"
    mb=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["recommendation"]; print(r["micro_batch"], r["grad_accum"], r["precision"])' "$T/gs.json" 2>/dev/null)
    mbb=${mb%% *} mpr=${mb##* } mga=${mb#* }
    mga=${mga%% *}
    run estimate $S --batch "${mbb:-0}" --grad-accum "${mga:-0}" --precision "${mpr:-x}" --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["recommendation"]
m = json.load(open(sys.argv[2]))["memory"]
assert r["micro_batch"] * r["grad_accum"] == 1024 and r["micro_batch"] < 1024, r
assert r["peak_event"].startswith("generate:"), r
assert m["phases"]["generation"]["sequences"] == 1024, m["phases"]
assert r["peak_allocated_bytes"] == m["peak_allocated_bytes"], (r["peak_allocated_bytes"], m["peak_allocated_bytes"])
' "$T/gs.json" "$T/out" 2>"$T/why"; then
        ok "suggest --trainer grpo --global-batch 1024: generation of all 1024 completions whatever the micro-batch"
    else
        bad "suggest --trainer grpo --global-batch 1024: generation of all 1024 completions whatever the micro-batch"
    fi
fi
expect_msg 2 "--recipe GRPOConfig without --seq: refused (GRPOConfig has no length)" "give --seq" \
    estimate --recipe tests/data/recipes/trl-grpo-vllm.yaml --trainer grpo --gpu a100-40gb
printf 'model_name_or_path: models/hf/qwen2-0.5b.json\nnum_generations: 8\nrepetition_penalty: 0\n' >"$T/g1.yaml"
expect_msg 3 "--recipe GRPOConfig: a repetition penalty of 0 refused (logits_process.py: above 0), naming the line" \
    "g1.yaml:3: repetition_penalty: 0" estimate --recipe "$T/g1.yaml" --trainer grpo --seq 512
printf 'model_name_or_path: models/hf/qwen2-0.5b.json\nnum_generations: 8\ntop_p: 1.5\n' >"$T/g1.yaml"
expect_msg 3 "--recipe GRPOConfig: top_p above 1 refused, naming the line" \
    "g1.yaml:3: top_p: 1.5" estimate --recipe "$T/g1.yaml" --trainer grpo --seq 512
printf 'model_name_or_path: models/hf/qwen2-0.5b.json\nmax_length: 1024\n' >"$T/g2.yaml"
expect_msg 3 "--recipe GRPOConfig: max_length is not GRPOConfig's" "not a GRPOConfig key" \
    estimate --recipe "$T/g2.yaml" --trainer grpo --seq 512
printf 'model_name_or_path: models/hf/qwen2-0.5b.json\ngeneration_batch_size: 12\n' >"$T/g3.yaml"
expect_msg 3 "--recipe GRPOConfig: a generation batch not a multiple of the micro-batch" \
    "not a multiple of per_device_train_batch_size 8" estimate --recipe "$T/g3.yaml" --trainer grpo --seq 512
expect_msg 3 "suggest on a GRPOConfig with generation_batch_size (a fixed generation batch): refused" \
    "trl-grpo-genbatch.yaml:9: generation_batch_size" suggest --recipe tests/data/recipes/trl-grpo-genbatch.yaml \
    --trainer grpo --seq 384 --gpu a100-40gb --no-probe
printf 'model_name_or_path: models/hf/qwen2-0.5b.json\nvllm_enable_sleep_mode: true\n' >"$T/g4.yaml"
expect_msg 3 "--recipe GRPOConfig: vLLM's sleep mode refused" "sleep mode" \
    estimate --recipe "$T/g4.yaml" --trainer grpo --seq 512
expect_msg 3 "a GRPOConfig key read as SFTConfig: refused with the hint" "give --trainer grpo" \
    estimate --recipe tests/data/recipes/trl-grpo-vllm.yaml --seq 512
# --timeline: generation, the old log-probs' and the reference's forwards drawn before the step,
# bracketed; the picture's peak is the estimate's (the decoding step's here: LoRA, 16 x 8
# completions of 1,536 tokens generated at once), and its label the estimate's event
if [ -n "$HAVE_PY" ]; then
    run estimate models/hf/qwen2-0.5b.json --trainer grpo --seq 2048 --completion-length 1536 --finetune lora \
        --checkpoint layers --batch 8 --grad-accum 16 --timeline "$T/g.svg" --json
    cp "$T/out" "$T/g1.json"
    run estimate $G --grad-accum 1 --steps-per-generation 2 --beta 0.04 --timeline "$T/g2.svg" --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, re, sys
for js, svg, what in ((sys.argv[1], sys.argv[2], ["generate"]),
                      (sys.argv[3], sys.argv[4], ["generate", "policy.forward", "reference.forward"])):
    m, s = json.load(open(js))["memory"], open(svg).read()
    assert re.findall(r"data-what=\"([^\"]+)\"", s) == what, (svg, re.findall(r"data-what=\"([^\"]+)\"", s))
    assert [int(x) for x in re.findall(r"data-peak-bytes=\"(\d+)\"", s)] == [m["peak_reserved_bytes"]], m
m = json.load(open(sys.argv[1]))["memory"]
assert m["peak_event"].startswith("generate:decode") and m["peak_event"] in open(sys.argv[2]).read(), m
' "$T/g1.json" "$T/g.svg" "$T/out" "$T/g2.svg" 2>"$T/why"; then
        ok "--trainer grpo --timeline: generation and the no-grad forwards drawn before the step, its peak"
    else
        bad "--trainer grpo --timeline: generation and the no-grad forwards drawn before the step, its peak"
    fi
fi
# suggest's GRPO limits at the plan: the longest completion and the largest vLLM share that still
# fit, each the boundary check draws (exit 0 at it, 1 one past it)
if [ -n "$HAVE_PY" ]; then
    run suggest models/hf/qwen2-0.5b.json --trainer grpo --seq 1024 --completion-length 512 --gpu a100-40gb \
        --no-probe --vllm 0.3 --json
    lim=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["recommendation"]
g = r["grpo_limits"]
f = g["max_vllm_fraction"]
print(r["micro_batch"], r["precision"], r["plan"]["strategy"], g["max_completion_length"], f, round(f + 0.01, 2))
' "$T/out" 2>/dev/null)
    codes=""
    if [ -n "$lim" ]; then
        set -f
        # shellcheck disable=SC2086
        set -- $lim
        set +f
        lb=$1 lp=$2 lc=$3 lmax=$4 lf=$5 lf1=$6
        C1="models/hf/qwen2-0.5b.json --trainer grpo --batch $lb --precision $lp --checkpoint $lc --gpu a100-40gb"
        run check $C1 --seq $((512 + lmax)) --completion-length "$lmax" --vllm 0.3
        codes="$codes$ec"
        run check $C1 --seq $((513 + lmax)) --completion-length $((lmax + 1)) --vllm 0.3
        codes="$codes$ec"
        run check $C1 --seq 1024 --completion-length 512 --vllm "$lf"
        codes="$codes$ec"
        run check $C1 --seq 1024 --completion-length 512 --vllm "$lf1"
        codes="$codes$ec"
        set --
    fi
    if [ "$codes" = "0101" ]; then
        ok "suggest --trainer grpo: the limits (completion $lmax, vLLM $lf) are where check turns from 0 to 1"
    else
        echo "got '$codes' for check at and past each limit ($lim), expected 0101" >"$T/why"
        bad "suggest --trainer grpo: the limits are where check turns from 0 to 1"
    fi
fi
# review fixes: the options' trainers, the recipe's booleans and its generation batch, the limits
expect_msg 2 "--disable-dropout with --trainer sft: refused (SFTConfig has no disable_dropout)" \
    "needs --trainer dpo, kto, kto-apo, orpo or grpo" estimate models/hf/gpt2.json --disable-dropout on
expect_msg 2 "--vllm-correction without vLLM: refused (it corrects vLLM's sampling)" "needs --vllm F or --vllm server" \
    estimate models/hf/qwen2-0.5b.json --trainer grpo --vllm-correction off
printf 'model_name_or_path: models/hf/qwen2-0.5b.json\nuse_vllm: maybe\n' >"$T/g5.yaml"
expect_msg 3 "--recipe GRPOConfig: use_vllm neither true nor false: refused, naming the line" \
    "g5.yaml:2: use_vllm: maybe: expected true or false" estimate --recipe "$T/g5.yaml" --trainer grpo --seq 768
printf 'model_name_or_path: models/hf/qwen2-0.5b.json\nuse_vllm: true\n' >"$T/g6.yaml"
expect_msg 2 "--recipe GRPOConfig: use_vllm without a GPU: the message names the file's key" \
    "g6.yaml:2: use_vllm: a colocated vLLM takes 0.3" estimate --recipe "$T/g6.yaml" --trainer grpo --seq 768
expect_msg 3 "--recipe GRPOConfig: generation_batch_size with --batch (it was divided by the file's batch): refused" \
    "trl-grpo-genbatch.yaml:9: generation_batch_size" estimate --recipe tests/data/recipes/trl-grpo-genbatch.yaml \
    --trainer grpo --seq 384 --batch 16
run suggest models/hf/gpt2.json --trainer grpo --seq 512 --completion-length 256 --disable-dropout on --gpu a100-40gb \
    --no-probe --emit hf
e1=$ec
cp "$T/out" "$T/em1"
run suggest models/hf/gpt2.json --trainer dpo --seq 512 --disable-dropout off --gpu a100-40gb --no-probe --emit hf
if [ "$e1" -eq 0 ] && [ "$ec" -eq 0 ] && grep -q "disable_dropout=True," "$T/em1" &&
    grep -q "disable_dropout=False," "$T/out"; then
    ok "--emit hf writes disable_dropout where it differs from the config's default (GRPO on, DPO off)"
else
    bad "--emit hf writes disable_dropout where it differs from the config's default (GRPO on, DPO off)"
fi
if [ -n "$HAVE_PY" ]; then
    # generation mid-accumulation (steps_per_generation 2 within 4 micro-steps) runs beside the
    # accumulated gradients, at the boundary (4 within 4) without them (Qwen2-0.5B, full, beta 0.04)
    A="models/hf/qwen2-0.5b.json --trainer grpo --seq 640 --completion-length 128 --batch 8 --beta 0.04 --json"
    run estimate $A --grad-accum 4 --steps-per-generation 4
    cp "$T/out" "$T/acc4.json"
    run estimate $A --grad-accum 1 --steps-per-generation 4
    cp "$T/out" "$T/acc1.json"
    run estimate $A --grad-accum 4 --steps-per-generation 2 --timeline "$T/acc.svg"
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a4, a1, mid = (json.load(open(p))["memory"] for p in sys.argv[1:4])
r = lambda m, k: m["phases"][k]["peak_allocated_bytes"]
assert r(a4, "reference_forward") == r(a1, "reference_forward"), (a4["phases"], a1["phases"])
assert r(a4, "generation") == r(a1, "generation"), (a4["phases"], a1["phases"])
g = mid["grads_bytes"]
assert r(mid, "reference_forward") - r(a4, "reference_forward") == g, (mid["phases"], g)
svg = open(sys.argv[4]).read()
assert "data-what=\"generate\"" in svg and "data-what=\"reference.forward\"" in svg
' "$T/acc4.json" "$T/acc1.json" "$T/out" "$T/acc.svg" 2>"$T/why"; then
        ok "--trainer grpo: the phases before the step hold the accumulated gradients only mid-accumulation"
    else
        bad "--trainer grpo: the phases before the step hold the accumulated gradients only mid-accumulation"
    fi
    # a limit past the model's positions is not a plan: GPT-2 (1,024 learned positions), prompt 200
    run suggest models/hf/gpt2.json --trainer grpo --seq 300 --completion-length 100 --gpu h200-141gb --no-probe \
        --max-batch 8 --json
    if [ "$ec" -eq 0 ] && python3 -c '
import json, sys
g = json.load(open(sys.argv[1]))["recommendation"]["grpo_limits"]
assert g["max_completion_length"] == 1024 - 200 and not g["at_least"], g
' "$T/out" 2>"$T/why"; then
        ok "suggest --trainer grpo: the longest completion stops at the model's positions (824 after 200)"
    else
        bad "suggest --trainer grpo: the longest completion stops at the model's positions (824 after 200)"
    fi
    # the vLLM share reported is one check accepts, never rounded up past the one planned
    run suggest models/hf/qwen2-0.5b.json --trainer grpo --seq 1024 --completion-length 512 --gpu a100-40gb \
        --no-probe --vllm 0.265 --json
    lim=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["recommendation"]
f = r["grpo_limits"]["max_vllm_fraction"]
assert f >= 0.265
print(r["micro_batch"], r["precision"], r["plan"]["strategy"], f)
' "$T/out" 2>/dev/null)
    ec=9
    if [ -n "$lim" ]; then
        set -f
        # shellcheck disable=SC2086
        set -- $lim
        set +f
        run check models/hf/qwen2-0.5b.json --trainer grpo --seq 1024 --completion-length 512 --gpu a100-40gb \
            --batch "$1" --precision "$2" --checkpoint "$3" --vllm "$4"
        set --
    fi
    if [ "$ec" -eq 0 ]; then
        ok "suggest --trainer grpo --vllm 0.265: the largest vLLM share reported fits (check exit 0)"
    else
        echo "limits: $lim" >"$T/why"
        bad "suggest --trainer grpo --vllm 0.265: the largest vLLM share reported fits (check exit 0)"
    fi
fi
# --temperature 0.7: generate's TemperatureLogitsWarper adds the scores, one 8 x 151,936 fp32 tensor
# (4,861,952 B), to the last decoding step (Qwen2-0.5B, 8 completions, the cache on)
run estimate $G --json
cp "$T/out" "$T/t1.json"
run estimate $G --temperature 0.7 --json
if [ -n "$HAVE_PY" ] && [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b = (json.load(open(p))["memory"]["phases"]["generation"] for p in sys.argv[1:3])
assert b["decode_peak_bytes"] - a["decode_peak_bytes"] == 4861952, (a, b)
assert b["prefill_peak_bytes"] - a["prefill_peak_bytes"] in (0, 4861952), (a, b)
' "$T/t1.json" "$T/out" 2>"$T/why"; then
    ok "--temperature 0.7: the decoding step holds the warper's scores, 4,861,952 B more"
elif [ -z "$HAVE_PY" ]; then
    skipped "--temperature (python3 not found)"
else
    bad "--temperature 0.7: the decoding step holds the warper's scores, 4,861,952 B more"
fi
# the other warpers, on the same 8 x 151,936 scores (fp = 4,861,952 B fp32; bo = 1,215,488 B bool;
# 9,723,904 B int64), the last decoding step's peak being its warper, beside the new copy and the
# previous step's scores and probabilities (3 fp, against 3 fp with no warper: scores are the copy):
# --top-k 50: the bool mask and masked_fill's output, bo + fp = 6,077,440 B more;
# --min-p 0.1: softmax's probs, the mask, the two 8-row fp32 (512 B each) and int64 (512 B) small
#   ones and the output, 2 fp + bo + 1,536 = 10,940,928 B more;
# --top-p 0.9: sort's values and int64 indices, and CUDA's full-sort buffers for 8 rows (2 int2
#   arrays 9,723,904 B each, the keys output 4,861,952 B, cub's alternate keys and int2 values
#   14,585,856 B): fp + 9,723,904 + 38,895,616 = 53,481,472 B more;
# all of them with --temperature 0.7: the copy, then the temperature's scores (the first warper,
#   4 fp) and top_p on the scores beside its input: 4 fp + 53,481,472 = 58,343,424 B more
for w in "--top-k 50:6077440" "--min-p 0.1:10940928" "--top-p 0.9:53481472" \
    "--temperature 0.7 --top-k 50 --top-p 0.9 --min-p 0.1:58343424"; do
    # shellcheck disable=SC2086
    run estimate $G ${w%%:*} --json
    if [ -n "$HAVE_PY" ] && [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b = (json.load(open(p))["memory"]["phases"]["generation"] for p in sys.argv[1:3])
assert b["decode_peak_bytes"] - a["decode_peak_bytes"] == int(sys.argv[3]), (a, b)
' "$T/t1.json" "$T/out" "${w##*:}" 2>"$T/why"; then
        ok "${w%%:*}: the decoding step's warpers, ${w##*:} B more"
    elif [ -z "$HAVE_PY" ]; then
        skipped "${w%%:*} (python3 not found)"
    else
        bad "${w%%:*}: the decoding step's warpers, ${w##*:} B more"
    fi
done
# --repetition-penalty 1.1: transformers' RepetitionPenaltyLogitsProcessor, before the warpers, on
# the same scores, with its ids at the last decoding step P + C - 1 = 511 columns (b x L = 4,088):
# pad's 8 x 151,937 fp32 (4,861,984 -> 4,862,464 B), positions (4,088 -> 4,096 B), the masked and
# clamped int64 ids (32,704 -> 32,768 B), gather's fp32 (16,352 -> 16,384 B), the bool (4,096 B).
# Its highest point is scatter's output beside the padded scores, the ids, positions and gather's:
# 4,096 + 32,768 + 2 x 4,862,464 + 16,384 = 9,778,176 B (where's: 4,096 + 32,768 + 4,862,464
# + 4 x 16,384 + 4,096 = 4,968,960 B, less); the padding lengths (8 int64: 512 B) held throughout.
# Its output (the padded storage, a [..., :v] view) is the step's scores, so softmax copies it
# (one fp).  The decoding step: new copy + previous scores (pad) + previous probs + the processor
# (2 fp + pad + 9,778,176) against 3 fp: pad + 9,778,176 - fp + 512 = 9,779,200 B more;
# with --top-k 50 after it (its input the padded scores, its output one fp): pad + bo + fp + 512 =
#   10,940,416 B more;
# with --top-p 0.9 after it: CUDA's sort copies its non-dense input first (Sort.cpp): pad + fp +
#   9,723,904 + (38,895,616 + fp) + 512 = 63,206,400 B more;
# with --min-p 0.1 after it: pad + 2 fp + bo + 1,536 + 512 = 15,803,904 B more;
# with --temperature 0.7 after it: the processor itself, 9,778,176 + 512 = 9,778,688 B more (the
#   scores one fp, not pad).
# The prefill's peak gains the padding lengths alone (512 B).
for w in "--repetition-penalty 1.1:9779200" "--repetition-penalty 1.1 --top-k 50:10940416" \
    "--repetition-penalty 1.1 --top-p 0.9:63206400" "--repetition-penalty 1.1 --min-p 0.1:15803904" \
    "--repetition-penalty 1.1 --temperature 0.7:9778688"; do
    # shellcheck disable=SC2086
    run estimate $G ${w%%:*} --json
    if [ -n "$HAVE_PY" ] && [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b = (json.load(open(p))["memory"]["phases"]["generation"] for p in sys.argv[1:3])
assert b["decode_peak_bytes"] - a["decode_peak_bytes"] == int(sys.argv[3]), (a, b)
assert b["prefill_peak_bytes"] - a["prefill_peak_bytes"] == 512, (a, b)
' "$T/t1.json" "$T/out" "${w##*:}" 2>"$T/why"; then
        ok "${w%%:*}: the repetition penalty before the warpers, ${w##*:} B more"
    elif [ -z "$HAVE_PY" ]; then
        skipped "${w%%:*} (python3 not found)"
    else
        bad "${w%%:*}: the repetition penalty before the warpers, ${w##*:} B more"
    fi
done
# where's operands are the processor's highest point once the ids are long against the vocabulary
# (13 b L > 4 b (v + 1)): a 1-layer Llama of vocabulary 1,000 (hidden 64, 1 kv head of 16), 2
# completions, prompt 512, 16 new tokens, L = 527 (b x L = 1,054): positions 4,608, ids 8,704,
# pad (2 x 1,001 fp32) 8,192, gather's 4,608, the bool 1,536: where's 4,608 + 8,704 + 8,192 +
# 4 x 4,608 + 1,536 = 41,472 B (scatter's 4,608 + 8,704 + 2 x 8,192 + 4,608 = 34,304 B).  fp
# 8,192 B, the logits 4,096 B, one layer's new k at 527 tokens 33,792 B: without the penalty the
# decoding step's peak is its forward (33,792 + 2 fp = 50,176 over the cache and ids), with it
# the processor (512 + 4,096 + 2 fp + pad + 41,472 = 70,656): 20,480 B more
printf '%s\n' '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,' \
    '"intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 1,' \
    '"vocab_size": 1000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16",' \
    '"tie_word_embeddings": false}' >"$T/rp.json"
RP="$T/rp.json --trainer grpo --batch 2 --num-generations 2 --seq 528 --completion-length 16 --precision bf16"
# shellcheck disable=SC2086
run estimate $RP --json
cp "$T/out" "$T/rp0.json"
# shellcheck disable=SC2086
run estimate $RP --repetition-penalty 1.1 --json
if [ -n "$HAVE_PY" ] && [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b = (json.load(open(p))["memory"]["phases"]["generation"] for p in sys.argv[1:3])
assert b["decode_peak_bytes"] - a["decode_peak_bytes"] == 20480, (a, b)
' "$T/rp0.json" "$T/out" 2>"$T/why"; then
    ok "--repetition-penalty with ids long against the vocabulary: where's operands, 20,480 B more"
elif [ -z "$HAVE_PY" ]; then
    skipped "--repetition-penalty, long ids (python3 not found)"
else
    bad "--repetition-penalty with ids long against the vocabulary: where's operands, 20,480 B more"
fi
# a GRPOConfig's repetition_penalty is the option, into the JSON and back out by --emit hf
printf '%s\n' 'model_name_or_path: models/hf/qwen2-0.5b.json' 'num_generations: 8' \
    'per_device_train_batch_size: 8' 'max_completion_length: 256' 'repetition_penalty: 1.1' >"$T/gr.yaml"
run estimate --recipe "$T/gr.yaml" --trainer grpo --seq 512 --precision bf16 --json
cp "$T/out" "$T/gr.json"
run estimate $G --repetition-penalty 1.1 --json
if [ -n "$HAVE_PY" ] && [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b, c = (json.load(open(p)) for p in sys.argv[1:4])
assert a["config"]["grpo"]["repetition_penalty"] == 1.1, a["config"]["grpo"]
assert c["config"]["grpo"]["repetition_penalty"] == 1.0, c["config"]["grpo"]
g = lambda d: d["memory"]["phases"]["generation"]["decode_peak_bytes"]
assert g(a) == g(b), (g(a), g(b))
' "$T/gr.json" "$T/out" "$T/t1.json" 2>"$T/why"; then
    ok "--recipe GRPOConfig repetition_penalty 1.1: planned as --repetition-penalty 1.1, in config.grpo"
elif [ -z "$HAVE_PY" ]; then
    skipped "--recipe GRPOConfig repetition_penalty (python3 not found)"
else
    bad "--recipe GRPOConfig repetition_penalty 1.1: planned as --repetition-penalty 1.1, in config.grpo"
fi
# GRPO under ZeRO-3 and FSDP2 (generate.c): the parameters gathered at a decoding step, hand-worked
# on a 1-layer Llama in bf16 (hidden 256, MLP 688, 4 heads, 2 kv heads of 64, vocabulary 32000,
# untied) over 2 ranks (every dim 0 even: no padding).  Its parameters: embed and lm_head 8,192,000
# each; q, o 65,536; k, v 32,768; gate, up, down 176,128; three norms of 256.
#  zero3 (ds3_gather_for_generation true): DeepSpeed's GatheredParameters makes every parameter not
#    persisted (10 x hidden = 2,560 elements and more: all but the norms) its own bf16 tensor:
#    2 x 16,384,000 + 2 x 131,072 + 2 x 65,536 + 3 x 352,256 = 34,217,984 ("whole");
#  zero3 --ds3-gather off: each block's partitions fetched by its forward, no prefetch (a layer's
#    725,504 elements are above the 0.9 x hidden^2 bucket): the largest block, the embedding,
#    16,384,000 ("per-unit");
#  fsdp-no-reshard: every unit stays gathered from the prefill on: the embedding 16,384,000, the
#    layer 2 x 725,504 = 1,451,008 and the tail [norm, lm_head] 16,384,512: 34,219,520;
#  fsdp: the tail (reshard_after_forward False) stays gathered; each step gathers the embedding
#    unit, its flat all-gather output held until the layer's copy-out beside its parameters:
#    16,384,512 + 2 x 16,384,000 = 49,152,512.
printf '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, '\
'"intermediate_size": 688, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, '\
'"vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "hidden_act": "silu", '\
'"tie_word_embeddings": false, "torch_dtype": "bfloat16"}\n' >"$T/gs.json"
for w in "zero3:whole:34217984" "zero3 --ds3-gather off:per-unit:16384000" \
    "fsdp-no-reshard:per-unit:34219520" "fsdp:per-unit:49152512"; do
    run estimate "$T/gs.json" --trainer grpo -b 8 -s 256 --completion-length 128 -p bf16 --workspace 0 \
        --gpus 2 --parallel ${w%%:*} --json
    if [ -z "$HAVE_PY" ]; then
        skipped "--trainer grpo --parallel ${w%%:*}: gathered at a decoding step (python3 not found)"
    elif [ "$ec" -eq 0 ] && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
g, want = d["memory"]["phases"]["generation"], sys.argv[2].split(":")
assert g["gather"] == want[1] and g["gathered_bytes"] == int(want[2]), g
assert d["config"]["grpo"]["ds3_gather_for_generation"] == ("off" not in want[0]), d["config"]["grpo"]
' "$T/out" "$w" 2>"$T/why"; then
        ok "--trainer grpo --parallel ${w%%:*}: ${w##*:} B gathered at a decoding step (hand-worked)"
    else
        bad "--trainer grpo --parallel ${w%%:*}: ${w##*:} B gathered at a decoding step (hand-worked)"
    fi
done
# ZeRO-3 in bf16, the same model (17,109,760 elements, 8,554,880 a rank): DeepSpeed 0.19.8 keeps the
# gradient partition in the model's dtype (engine.py get_data_types; measured in
# bench/accuracy/grpo_zero3_results.md): 8,554,880 x 2 = 17,109,760 B, not fp32's 34,219,520.  The
# step flattens it (a bf16 copy, 17,109,760) and casts that to fp32 (34,219,520) before the bf16
# copy goes (stage3.py:2683-2693): the peak is the resident state + 51,329,280 + the input and
# rotary buffer (a few 512-byte blocks)
run estimate "$T/gs.json" -b 1 -s 16 -p bf16 --checkpoint none --workspace 0 --gpus 2 --parallel zero3 --json
if [ -z "$HAVE_PY" ]; then
    skipped "zero3 bf16: gradient partition and the step's fp32 copy (python3 not found)"
elif [ "$ec" -eq 0 ] && python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
assert m["grads_bytes"] == 8554880 * 2, m["grads_bytes"]
assert m["peak_event"].endswith("fp32 grad partition"), m["peak_event"]
rest = m["peak_allocated_bytes"] - m["weights_bytes"] - m["grads_bytes"] - m["optimizer_bytes"] - m["buffers_bytes"]
assert 8554880 * (2 + 4) <= rest <= 8554880 * (2 + 4) + 4096, rest
' "$T/out" 2>"$T/why"; then
    ok "zero3 bf16: a bf16 gradient partition, the step peak at its bf16 and fp32 flat copies (hand-worked)"
else
    bad "zero3 bf16: a bf16 gradient partition, the step peak at its bf16 and fp32 flat copies (hand-worked)"
fi
# ZeRO-1/2 (as DDP) keep whole parameters: nothing is gathered for generate
run estimate "$T/gs.json" --trainer grpo -b 8 -s 256 --completion-length 128 -p bf16 --workspace 0 --gpus 2 \
    --parallel zero2 --json
if [ -n "$HAVE_PY" ] && [ "$ec" -eq 0 ] && python3 -c '
import json, sys
g = json.load(open(sys.argv[1]))["memory"]["phases"]["generation"]
assert "gather" not in g and "gathered_bytes" not in g, g
' "$T/out" 2>"$T/why"; then
    ok "--trainer grpo --parallel zero2: whole parameters, nothing gathered for generate"
elif [ -z "$HAVE_PY" ]; then
    skipped "--trainer grpo --parallel zero2 (python3 not found)"
else
    bad "--trainer grpo --parallel zero2: whole parameters, nothing gathered for generate"
fi
# suggest --trainer grpo --gpus 2 searches every strategy generate.c models: ZeRO-1/2/3 and FSDP2 beside DDP
run suggest "$T/gs.json" --trainer grpo --seq 256 --completion-length 128 --gpus 2 --gpu a100-80gb
if [ "$ec" -eq 0 ] && grep -q "^ddp x2 " "$T/out" && grep -q "^zero2 x2 " "$T/out" && grep -q "^zero3 x2 " "$T/out" &&
    grep -q "^fsdp x2 " "$T/out" && grep -q "^fsdp-no-reshard x2 " "$T/out"; then
    ok "suggest --trainer grpo --gpus 2: DDP, ZeRO-1/2/3 and FSDP2 searched"
else
    bad "suggest --trainer grpo --gpus 2: DDP, ZeRO-1/2/3 and FSDP2 searched"
fi
# a GRPOConfig's ds3_gather_for_generation is --ds3-gather; not true or false: refused, naming the line
printf '%s\n' 'model_name_or_path: models/hf/qwen2-0.5b.json' 'num_generations: 8' \
    'per_device_train_batch_size: 8' 'max_completion_length: 256' 'ds3_gather_for_generation: false' >"$T/gd.yaml"
run estimate --recipe "$T/gd.yaml" --trainer grpo --seq 512 --precision bf16 --gpus 2 --parallel zero3 --json
cp "$T/out" "$T/gd.json"
run estimate models/hf/qwen2-0.5b.json --trainer grpo --num-generations 8 -b 8 --completion-length 256 --seq 512 \
    --precision bf16 --gpus 2 --parallel zero3 --ds3-gather off --json
if [ -n "$HAVE_PY" ] && [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["config"]["grpo"]["ds3_gather_for_generation"] is False, a["config"]["grpo"]
assert a["memory"]["phases"]["generation"] == b["memory"]["phases"]["generation"]
assert a["memory"]["phases"]["generation"]["gather"] == "per-unit"
' "$T/gd.json" "$T/out" 2>"$T/why"; then
    ok "--recipe GRPOConfig ds3_gather_for_generation false: planned as --ds3-gather off"
elif [ -z "$HAVE_PY" ]; then
    skipped "--recipe GRPOConfig ds3_gather_for_generation (python3 not found)"
else
    bad "--recipe GRPOConfig ds3_gather_for_generation false: planned as --ds3-gather off"
fi
printf 'model_name_or_path: models/hf/qwen2-0.5b.json\nnum_generations: 8\nds3_gather_for_generation: 2\n' \
    >"$T/gd.yaml"
expect_msg 3 "--recipe GRPOConfig ds3_gather_for_generation: 2 refused, naming the line" \
    "gd.yaml:3: ds3_gather_for_generation: 2" estimate --recipe "$T/gd.yaml" --trainer grpo --seq 512
run suggest models/hf/qwen2-0.5b.json --trainer grpo --seq 512 --completion-length 256 --gpus 2 \
    --parallel zero3 --ds3-gather off --gpu a100-80gb --no-probe --emit hf
if [ "$ec" -eq 0 ] && grep -q "ds3_gather_for_generation=False," "$T/out"; then
    ok "suggest --trainer grpo --ds3-gather off --emit hf: ds3_gather_for_generation=False"
else
    bad "suggest --trainer grpo --ds3-gather off --emit hf: ds3_gather_for_generation=False"
fi
run suggest models/hf/qwen2-0.5b.json --trainer grpo --seq 512 --completion-length 256 --repetition-penalty 1.1 \
    --gpu a100-80gb --no-probe --emit hf
if [ "$ec" -eq 0 ] && grep -q "repetition_penalty=1.1," "$T/out"; then
    ok "suggest --repetition-penalty 1.1 --emit hf: GRPOConfig(repetition_penalty=1.1)"
else
    bad "suggest --repetition-penalty 1.1 --emit hf: GRPOConfig(repetition_penalty=1.1)"
fi
run suggest models/hf/qwen2-0.5b.json --trainer grpo --seq 512 --completion-length 256 --gpu a100-80gb --no-probe \
    --emit hf
if [ "$ec" -eq 0 ] && grep -q "args = GRPOConfig(" "$T/out" && ! grep -q "repetition_penalty" "$T/out"; then
    ok "suggest --emit hf without --repetition-penalty: TRL's default 1.0, not written"
else
    bad "suggest --emit hf without --repetition-penalty: TRL's default 1.0, not written"
fi
expect_msg 2 "--repetition-penalty without --trainer grpo: refused" "need --trainer grpo" \
    estimate models/hf/qwen2-0.5b.json --repetition-penalty 1.1
# the same warpers from a GRPOConfig recipe are the options (min_p null: none)
printf '%s\n' 'model_name_or_path: models/hf/qwen2-0.5b.json' 'num_generations: 8' \
    'per_device_train_batch_size: 8' 'max_completion_length: 256' 'top_p: 0.9' 'top_k: 50' 'min_p: null' \
    >"$T/gw.yaml"
run estimate --recipe "$T/gw.yaml" --trainer grpo --seq 512 --precision bf16 --json
cp "$T/out" "$T/gw.json"
run estimate $G --top-p 0.9 --top-k 50 --json
if [ -n "$HAVE_PY" ] && [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["config"]["grpo"]["top_p"] == 0.9 and a["config"]["grpo"]["top_k"] == 50, a["config"]["grpo"]
assert a["config"]["grpo"]["min_p"] is None, a["config"]["grpo"]
g = lambda d: d["memory"]["phases"]["generation"]["decode_peak_bytes"]
assert g(a) == g(b), (g(a), g(b))
' "$T/gw.json" "$T/out" 2>"$T/why"; then
    ok "--recipe GRPOConfig top_p 0.9, top_k 50: planned as --top-p 0.9 --top-k 50"
elif [ -z "$HAVE_PY" ]; then
    skipped "--recipe GRPOConfig warpers (python3 not found)"
else
    bad "--recipe GRPOConfig top_p 0.9, top_k 50: planned as --top-p 0.9 --top-k 50"
fi
# --disable-dropout: GPT-2's dropouts (0.1) kept by GRPO's default, zeroed on request as DPO's default
run estimate models/hf/gpt2.json --trainer grpo --seq 512 --completion-length 256 --precision bf16 --json
cp "$T/out" "$T/gd.json"
run estimate models/hf/gpt2.json --trainer grpo --seq 512 --completion-length 256 --precision bf16 --json \
    --disable-dropout on
if [ -n "$HAVE_PY" ] && [ "$ec" -eq 0 ] && python3 -c '
import json, sys
a, b = (json.load(open(p))["memory"] for p in sys.argv[1:3])
assert b["activations_bytes"] < a["activations_bytes"], (a["activations_bytes"], b["activations_bytes"])
' "$T/gd.json" "$T/out" 2>"$T/why"; then
    ok "--disable-dropout on: GPT-2 under grpo keeps no dropout masks (fewer activations than the default)"
elif [ -z "$HAVE_PY" ]; then
    skipped "--disable-dropout (python3 not found)"
else
    bad "--disable-dropout on: GPT-2 under grpo keeps no dropout masks (fewer activations than the default)"
fi

# ---- summary ------------------------------------------------------------------------------

if [ "$skip" -gt 0 ]; then
    echo "note: $skip check(s) skipped"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
