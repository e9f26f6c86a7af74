#!/bin/sh
# bench/gpu/run.sh — memplan's GPU validation kit, one command under one time budget.
#
#   sh bench/gpu/run.sh OUTDIR [--budget S] [--parts LIST] [--rerun [FILE]] [--rows LIST]
#                              [--steps N] [--cpu]
#
# Parts, in priority order (each writes its result into OUTDIR/report.json and report.md as it
# finishes, so a run cut short still returns what it measured): build (the carried build-gpu/
# loads, else it is made here), tests (make test-gpu's suites), sanitizer (compute-sanitizer
# memcheck on one small probe), matrix (estimate vs probe vs PyTorch on GPT-2, Qwen2-0.5B,
# Llama-3.2-1B LoRA and QLoRA), tune (suggest --device 0 vs Lightning's binsearch), steptime
# (probe vs PyTorch step time), dpo (TRL's DPO step), callback (MemplanCallback in a Trainer),
# sdpa (SDPA's kernels' allocations), optim (each optimizer's state and step).  --budget S (default 420) is the whole run's wall time: a part
# gets at most its cap and what is left; one that cannot start in time is skipped and says so.
# --rerun re-runs only what failed or is missing in FILE (default bench/gpu/out/report.json, the
# last run's state; on a fresh machine carry it).  Without a GPU: the CPU fallback (host backend,
# configs shrunk, PyTorch on the CPU).  bench/gpu/README.md says how to run it through the device
# tool; bench/gpu/prepare.sh makes what it carries.  Exit 0 when nothing failed, 1 otherwise.
cd "$(dirname "$0")/../.." || exit 2
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python3 ]; then PYTHON=.venv/bin/python3; else PYTHON=python3; fi
fi
command -v "$PYTHON" >/dev/null 2>&1 || { echo "run.sh: no $PYTHON: the kit needs Python 3" >&2; exit 2; }
# carried build dependencies (prepare.sh): libcjson/libyaml/libcmocka, bitsandbytes
for d in .deps/root/usr/lib/*-linux-gnu .deps/root/usr/lib; do
    if [ -d "$d" ] && ls "$d"/libcjson.so* >/dev/null 2>&1; then
        LD_LIBRARY_PATH=$(pwd)/$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export LD_LIBRARY_PATH
        break
    fi
done
if [ -d .deps/py ]; then
    PYTHONPATH=$(pwd)/.deps/py${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONPATH
fi
# nothing is fetched: the GPU machine has no network, and a hub look-up would only wait
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE TRANSFORMERS_OFFLINE HF_DATASETS_OFFLINE PYTHONUNBUFFERED TOKENIZERS_PARALLELISM PYTHON
exec "$PYTHON" bench/gpu/kit.py run "$@"
