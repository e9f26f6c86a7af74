#!/bin/sh
# bench/gpu/run.sh — memplan's GPU validation kit, one command.
#
#   sh bench/gpu/run.sh OUTDIR [--parts LIST] [--models LIST] [--steps N]
#
# On a machine with an NVIDIA GPU (PyTorch, transformers and Lightning installed; nothing is
# fetched) it builds memplan with CUDA, runs `make test-gpu`, the per-op backend tests and
# compute-sanitizer memcheck on a small probe; then, for GPT-2, Qwen2-0.5B, TinyLlama-1.1B and
# Llama-2-7B (small batch) x fp32/amp-bf16/bf16 x checkpointing none/layers, memplan's estimate,
# memplan's probe and PyTorch's torch.cuda.max_memory_allocated() over the steady-state step,
# side by side with step times; then `memplan suggest --device 0` against Lightning's
# Tuner.scale_batch_size(mode="binsearch") on GPT-2.  Writes OUTDIR/report.md, report.json and
# log.txt.  Without a GPU everything but the GPU parts runs (PyTorch on the CPU at tiny sizes)
# and the report says what was skipped.
#
# LIST (comma-separated parts): build,tests,sanitizer,matrix,tune (default: all of them).  The
# report is rebuilt from every part found in OUTDIR/parts, so a long run can be split over
# several commands that share OUTDIR (the device tool's 10-minute limit: see bench/gpu/README.md).
# Build dependencies missing from the machine (libcjson, libcmocka) can come as .deb files in
# .deps/ (bench/gpu/prepare.sh fetches them beforehand, on a machine with apt).
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)

usage() { echo "usage: sh bench/gpu/run.sh OUTDIR [--parts build,tests,sanitizer,matrix,tune] [--models LIST] [--steps N]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1
shift
PARTS=build,tests,sanitizer,matrix,tune
MODELS=
STEPS=3
while [ $# -gt 0 ]; do
    case $1 in
        --parts) [ $# -ge 2 ] || usage; PARTS=$2; shift 2 ;;
        --models) [ $# -ge 2 ] || usage; MODELS=$2; shift 2 ;;
        --steps) [ $# -ge 2 ] || usage; STEPS=$2; shift 2 ;;
        *) usage ;;
    esac
done
mkdir -p "$OUT/parts" || exit 2
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/log.txt
CHECKS=$OUT/parts/checks.tsv
has() { case ",$PARTS," in *",$1,"*) return 0 ;; esac; return 1; }
say() { echo "run.sh: $*" | tee -a "$LOG" >&2; }
# check NAME RESULT SECONDS: one row of the report's check table
check() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$CHECKS"; say "$1: $2 (${3}s)"; }
now() { date +%s; }
T0=$(now)
say "started $(date -u '+%Y-%m-%d %H:%M:%S UTC') in $ROOT, parts $PARTS"

# ---- what is here -------------------------------------------------------------------------------
GPU=
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    GPU=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
fi
PY=python3
HAVE_TORCH=
$PY -c 'import torch, transformers' >/dev/null 2>&1 && HAVE_TORCH=yes
HAVE_LIGHTNING=
$PY -c 'import lightning' >/dev/null 2>&1 && HAVE_LIGHTNING=yes
if [ -n "$GPU" ]; then say "GPU: $GPU"; else say "no GPU: the GPU parts are skipped (CPU smoke tests instead)"; fi
[ -n "$HAVE_TORCH" ] || say "no torch/transformers in $PY: the PyTorch columns are skipped"
[ -n "$HAVE_LIGHTNING" ] || say "no lightning in $PY: the Lightning comparison is skipped"

# Build dependencies carried as .deb files (the GPU machine cannot fetch): unpacked under .deps/root
MAKEVARS=
if [ -d .deps ] && ls .deps/*.deb >/dev/null 2>&1; then
    mkdir -p .deps/root
    for f in .deps/*.deb; do dpkg -x "$f" .deps/root 2>>"$LOG" || say "cannot unpack $f"; done
    MAKEVARS="DEPS_ROOT=$ROOT/.deps/root"
    say "using the build dependencies in .deps/ ($MAKEVARS)"
fi
if [ -n "$GPU" ]; then CUDAVAR=CUDA=yes; else CUDAVAR=CUDA=auto; fi

# ---- build --------------------------------------------------------------------------------------
if has build; then
    t=$(now)
    # shellcheck disable=SC2086
    if make -j"$(nproc 2>/dev/null || echo 2)" $CUDAVAR $MAKEVARS memplan >>"$LOG" 2>&1; then
        check "build ($CUDAVAR)" ok $(($(now) - t))
    else
        check "build ($CUDAVAR)" FAILED $(($(now) - t))
        say "the build failed: see $LOG"
    fi
    grep '^I memplan build' "$LOG" | sed 's/^/  /' >&2
fi
BUILDLINE=$(make -n $CUDAVAR $MAKEVARS memplan 2>/dev/null | grep '^I memplan build: ' \
    | grep -v cblas | sed 's/^I memplan build: //' | paste -sd ';' -)
[ -x ./memplan ] || { say "no ./memplan: nothing else can run"; exit 1; }

# ---- tests --------------------------------------------------------------------------------------
if has tests; then
    t=$(now)
    # shellcheck disable=SC2086
    if make $CUDAVAR $MAKEVARS test-gpu >"$OUT/test-gpu.log" 2>&1; then r=ok; else r=FAILED; fi
    cat "$OUT/test-gpu.log" >>"$LOG"
    sk=$(grep 'SKIPPED \] [0-9]' "$OUT/test-gpu.log" | sed 's/.*SKIPPED \] \([0-9]*\) test.*/\1/' |
         awk '{ n += $1 } END { print n + 0 }')
    [ "$sk" -gt 0 ] && r="$r ($sk tests skipped${GPU:+ on the GPU machine!}${GPU:-: no GPU})"
    check "make test-gpu (cuda backend tests; per-op host vs cuda)" "$r" $(($(now) - t))
    rm -f "$OUT/test-gpu.log"
fi

# ---- compute-sanitizer --------------------------------------------------------------------------
if has sanitizer; then
    t=$(now)
    CS=$(command -v compute-sanitizer || { [ -x /usr/local/cuda/bin/compute-sanitizer ] && echo /usr/local/cuda/bin/compute-sanitizer; })
    if [ -z "$GPU" ]; then
        check "compute-sanitizer memcheck (probe tiny-test, cuda)" "skipped: no GPU" 0
    elif [ -z "$CS" ]; then
        check "compute-sanitizer memcheck (probe tiny-test, cuda)" "skipped: compute-sanitizer not found" 0
    else
        ok=yes
        for m in "models/tiny-test.json --precision amp-bf16" "models/tiny-mlp.json --precision fp32" \
                 "models/tiny-test.json --precision bf16 --checkpoint every:1 --attention eager"; do
            # shellcheck disable=SC2086
            if ! "$CS" --tool memcheck --error-exitcode 9 ./memplan probe $m --backend cuda --steps 1 \
                    >>"$LOG" 2>&1; then ok=; say "memcheck failed: probe $m"; fi
        done
        if [ -n "$ok" ]; then r=ok; else r="FAILED (see log.txt)"; fi
        check "compute-sanitizer memcheck (3 small probes, cuda)" "$r" $(($(now) - t))
    fi
fi

# ---- measurements -------------------------------------------------------------------------------
CPUFLAG=
[ -z "$GPU" ] && CPUFLAG=--cpu
if has matrix; then
    t=$(now)
    if [ -n "$HAVE_TORCH" ]; then
        # shellcheck disable=SC2086
        if PYTHONUNBUFFERED=1 $PY bench/gpu/kit.py matrix --out "$OUT" --steps "$STEPS" $CPUFLAG \
                ${MODELS:+--models "$MODELS"} 2>>"$LOG"; then r=ok; else r=FAILED; fi
        [ -z "$GPU" ] && r="$r (CPU smoke; GPU columns skipped)"
    else
        r="skipped: no torch/transformers"
    fi
    check "estimate / probe / torch matrix" "$r" $(($(now) - t))
fi
if has tune; then
    t=$(now)
    if [ -n "$HAVE_TORCH" ] && [ -n "$HAVE_LIGHTNING" ]; then
        # shellcheck disable=SC2086
        if PYTHONUNBUFFERED=1 $PY bench/gpu/kit.py tune --out "$OUT" $CPUFLAG 2>>"$LOG"; then r=ok; else r=FAILED; fi
        [ -z "$GPU" ] && r="$r (CPU smoke; GPU parts skipped)"
    else
        r="skipped: needs torch, transformers and lightning"
    fi
    check "suggest --device 0 vs Lightning binsearch" "$r" $(($(now) - t))
fi

# ---- report -------------------------------------------------------------------------------------
$PY - "$OUT" "$CHECKS" "$GPU" "$BUILDLINE" <<'PYEOF'
import json, os, platform, sys, time
out, checks, gpu, build = sys.argv[1:5]
rows = {}
if os.path.exists(checks):  # the last result of each check (a part may have been run again)
    for line in open(checks):
        f = line.rstrip("\n").split("\t")
        if len(f) == 3:
            rows[f[0]] = {"name": f[0], "result": f[1], "seconds": f[2]}
rows = list(rows.values())
json.dump({"checks": rows}, open(os.path.join(out, "parts", "checks.json"), "w"), indent=1)
env_p = os.path.join(out, "parts", "env.json")
env = json.load(open(env_p)) if os.path.exists(env_p) else {}
env.update(host=platform.node(), gpu=gpu or None, build=build,
           started=env.get("started") or time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
json.dump(env, open(env_p, "w"), indent=1)
PYEOF
$PY bench/gpu/kit.py report --out "$OUT" 2>>"$LOG" || say "the report could not be written"
say "done in $(($(now) - T0)) s: $OUT/report.md"
[ -f "$OUT/report.md" ] && cat "$OUT/report.md"
if grep -q FAILED "$CHECKS" 2>/dev/null; then exit 1; fi
exit 0
