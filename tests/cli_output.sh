#!/bin/sh
# tests/cli_output.sh — what memplan shows a person: the --timeline picture, text
# that fits 100 columns, and the rough edges found by a new user and a fuzzer.
#
# Usage (from the repository root):  sh tests/cli_output.sh ./memplan
# Prints "ok ..." / "FAIL ..." lines, then "N passed, M failed"; exits 1 on any
# failure.  The timeline is checked against the --json report of the same run
# (tests/timeline_check.py, python3); without python3 those checks are skipped.

[ $# -eq 1 ] || { echo "usage: sh tests/cli_output.sh ./memplan" >&2; exit 2; }
M=$1
case $M in /*) ;; *) M=$(pwd)/$M ;; esac
[ -x "$M" ] || { echo "cli_output.sh: '$1' is not an executable" >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 2
T=$(mktemp -d "${TMPDIR:-/tmp}/memplan-out.XXXXXX") || exit 2
trap 'rm -rf "$T"' EXIT
trap 'exit 130' INT TERM
pass=0
fail=0
skip=0
HAVE_PY=
command -v python3 >/dev/null 2>&1 && HAVE_PY=yes

# check DESC CONDITION-EXIT-STATUS: record the result of the last command.
check() {
    if [ "$2" -eq 0 ]; then
        pass=$((pass + 1))
        echo "ok   $1"
    else
        fail=$((fail + 1))
        echo "FAIL $1"
        sed -n '1,8s/^/#    /p' "$T/why" 2>/dev/null
    fi
}
# run ARGS...: memplan ARGS; stdout in $T/out, stderr in $T/err, status in $ec.
run() {
    : >"$T/why"
    "$M" "$@" >"$T/out" 2>"$T/err" && ec=$? || ec=$?
    echo "\$ memplan $* -> exit $ec" >"$T/why"
    sed -n '1,4s/^/stderr: /p' "$T/err" >>"$T/why"
}

# ---- --timeline: the picture agrees with the JSON report ----------------------------------

# timeline DESC [probe] -- ARGS...: memplan ARGS --json --timeline F, then F against the JSON.
timeline() {
    desc=$1
    shift
    mode=
    if [ "$1" = probe ]; then mode=probe; shift; fi
    shift # --
    if [ -z "$HAVE_PY" ]; then
        skip=$((skip + 1))
        echo "skip $desc (python3 not found)"
        return
    fi
    rm -f "$T/tl.svg"
    run "$@" --json --timeline "$T/tl.svg"
    r=1
    if [ "$ec" -le 1 ] && [ -s "$T/tl.svg" ] && python3 tests/timeline_check.py "$T/tl.svg" "$T/out" $mode >>"$T/why" 2>&1; then
        r=0
        if command -v xmllint >/dev/null 2>&1; then
            xmllint --noout "$T/tl.svg" >>"$T/why" 2>&1 || r=1
        fi
    fi
    check "$desc" $r
}

timeline "estimate --timeline: peak, phases, legend agree with --json" -- \
    estimate models/gpt2-124m.json --batch 4
timeline "estimate --gpu --checkpoint sqrt --timeline: capacity lines, recompute shaded" -- \
    estimate models/gpt2-124m.json --batch 8 --gpu a100-40gb --checkpoint sqrt
timeline "plan --timeline (optimal plan, budget from the target)" -- \
    plan models/gpt2-124m.json --batch 32 --gpu a100-40gb
timeline "plan --activation-budget --timeline (recomputes)" -- \
    plan models/gpt2-124m.json --batch 8 --activation-budget 7GiB
timeline "check --timeline on a model that does not fit (exit 1)" -- \
    check models/llama-7b.json --batch 1 --gpu a100-40gb
timeline "check --timeline: an image model" -- check models/resnet50.json --batch 16 --gpu t4
timeline "probe --timeline: the measured curve is overlaid" probe -- \
    probe models/tiny-test.json --backend host --checkpoint every:1
# 120 transformer blocks: still one picture with a zoom on the peak
sed 's/"repeat": 12/"repeat": 120/' models/gpt2-124m.json >"$T/gpt2-120.json"
timeline "plan --timeline at 122 blocks" -- plan "$T/gpt2-120.json" --batch 4 --gpu a100-80gb

run estimate models/tiny-test.json --timeline "$T/no-such-dir/x.svg"
[ "$ec" -eq 3 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "cannot write" "$T/err"
check "--timeline into a missing directory: exit 3, one line" $?
run estimate models/tiny-test.json --gpu t4 --timeline "$T/tl.svg"
[ "$ec" -eq 0 ] && [ -s "$T/tl.svg" ]
check "--timeline with the text report: exit 0, file written" $?


# ---- text fits 100 columns --------------------------------------------------------------

# width ARGS...: every stdout line of memplan ARGS is at most 100 columns (characters, as
# the terminal counts them) and has no trailing blank.
width() {
    run "$@"
    LC_ALL=C.UTF-8 awk 'length($0) > 100 { print "line " NR " has " length($0) " columns: " $0; bad = 1 }
        /[ \t]$/ { print "line " NR " ends in a blank"; bad = 1 } END { exit bad }' "$T/out" >>"$T/why" 2>&1
    r=$?
    { [ "$ec" -eq 0 ] && [ -s "$T/out" ]; } || [ "$ec" -eq 1 ] || r=1
    check "fits 100 columns: memplan $*" $r
}

for h in "--help" "help gpus" "estimate --help" "plan --help" "probe --help" "suggest --help" "check --help"; do
    # shellcheck disable=SC2086
    width $h
done
for f in models/*.json models/hf/*.json; do
    width estimate "$f"
done
width estimate models/gpt2-124m.json --gpu a100-40gb --checkpoint sqrt --all-layers
width estimate models/llama-7b.json --gpu a100-80gb --checkpoint optimal
width plan models/gpt2-124m.json --batch 8 --gpu a100-40gb
width plan models/resnet50.json --batch 64 --gpu t4
width plan models/gpt2-124m.json --batch 64 --activation-budget 1MiB
width check models/gpt2-124m.json --batch 8 --gpu a100-40gb
width check models/llama-70b.json --batch 1 --gpu t4
width suggest models/gpt2-124m.json --gpu a100-40gb --no-probe
width suggest models/gpt2-124m.json --gpu a100-40gb --no-probe --global-batch 512
width suggest models/llama-70b.json --gpu t4 --no-probe
width suggest models/resnet50.json --gpu t4 --no-probe --emit hf
width suggest models/gpt2-124m.json --gpu t4 --no-probe --emit deepspeed
width probe models/tiny-test.json --backend host
width probe models/tiny-mlp.json --backend host --capacity 1KiB

# ---- summary ----------------------------------------------------------------------------

[ "$skip" -gt 0 ] && echo "note: $skip check(s) skipped"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
