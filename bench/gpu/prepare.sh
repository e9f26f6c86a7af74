#!/bin/sh
# bench/gpu/prepare.sh — run HERE (a machine with apt, PyPI and nvcc) before a call to a lent GPU
# machine, which cannot fetch anything:
#
#   sh bench/gpu/prepare.sh [--no-cuda] [--arch N]
#
# 1. .deps/: the .deb files of libcjson, libyaml and libcmocka (apt-get download), unpacked with dpkg -x
#    into .deps/root (run.sh puts .deps/root/usr/lib/<triplet> on LD_LIBRARY_PATH; build.sh builds
#    against it where the system has no headers);
# 2. .deps/py/: bitsandbytes (the QLoRA row's PyTorch side; the GPU image has peft but not it),
#    its wheel slimmed to the CUDA 13.0/13.2 and CPU libraries (43 MiB -> about 9 MiB); trl,
#    datasets, dill and multiprocess for the dpo part (not in the GPU image either);
# 3. build-gpu/: `make CUDA=yes CUDA_ARCH=90` through bench/gpu/build.sh (--no-cuda skips it:
#    a CPU-only check of the kit);
# 4. prints what will travel (the limit is 64 MiB) and the exact run(...) calls.
# .deps/ and build-gpu/ are ignored by git: name them in the call's carry.  Nothing is installed.
set -u
cd "$(dirname "$0")/../.." || exit 2
ARCH=90
CUDA_BUILD=yes
while [ $# -gt 0 ]; do
    case $1 in
        --no-cuda) CUDA_BUILD=; shift ;;
        --arch) [ $# -ge 2 ] || { echo "usage: sh bench/gpu/prepare.sh [--no-cuda] [--arch N]" >&2; exit 2; }
                ARCH=$2; shift 2 ;;
        *) echo "usage: sh bench/gpu/prepare.sh [--no-cuda] [--arch N]" >&2; exit 2 ;;
    esac
done
PY=${PYTHON:-python3}
BNB_VERSION=0.50.2
TRL_VERSION=1.16.0
DATASETS_VERSION=5.2.0
status=0

# ---- 1. build dependencies as .deb files, unpacked ---------------------------------------------
mkdir -p .deps
debs="libcjson1 libcjson-dev libyaml-0-2 libyaml-dev libcmocka0 libcmocka-dev"
# shellcheck disable=SC2086
if ! (cd .deps && apt-get download $debs >/dev/null 2>&1); then
    apt-get update -qq >/dev/null 2>&1
    # shellcheck disable=SC2086
    (cd .deps && apt-get download $debs) || { echo "prepare: apt-get download failed" >&2; status=1; }
fi
rm -rf .deps/root
mkdir -p .deps/root
for f in .deps/*.deb; do
    [ -f "$f" ] || continue
    dpkg -x "$f" .deps/root || { echo "prepare: cannot unpack $f" >&2; status=1; }
done
rm -rf .deps/root/usr/share/doc .deps/root/usr/share/lintian
echo "prepare: .deps/root holds $(find .deps/root -name '*.so*' | wc -l) shared libraries and" \
     "$(find .deps/root -name '*.h' | wc -l) headers"

# ---- 2. bitsandbytes for the QLoRA row (Python 3.12 on the GPU machine) ------------------------
tmp=$(mktemp -d)
if "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$tmp" "bitsandbytes==$BNB_VERSION" >/dev/null 2>&1 && ls "$tmp"/bitsandbytes-*.whl >/dev/null 2>&1; then
    rm -rf .deps/py
    "$PY" bench/gpu/kit.py slim-wheel "$tmp"/bitsandbytes-*.whl .deps/py cpu cuda130 cuda132 || status=1
else
    echo "prepare: no bitsandbytes wheel (pip download failed): the QLoRA row's PyTorch side will say so" >&2
fi
rm -rf "$tmp"

# ---- 2b. TRL for the dpo part: the GPU image has transformers, accelerate, pyarrow, pandas and
#      xxhash but not trl, datasets, dill or multiprocess (pure-Python wheels, ~2 MiB unpacked)
tmp=$(mktemp -d)
if "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform any -d "$tmp" \
        "trl==$TRL_VERSION" "datasets==$DATASETS_VERSION" dill multiprocess >/dev/null 2>&1; then
    mkdir -p .deps/py
    for w in "$tmp"/*.whl; do
        "$PY" -m zipfile -e "$w" .deps/py/ || status=1
    done
else
    echo "prepare: no trl/datasets wheels (pip download failed): the dpo part will say so" >&2
fi
rm -rf "$tmp"

# ---- 3. the CUDA build ---------------------------------------------------------------------------
if [ -n "$CUDA_BUILD" ]; then
    if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
        t=$(date +%s)
        sh bench/gpu/build.sh "$ARCH" || status=1
        echo "prepare: CUDA build in $(($(date +%s) - t)) s"
    else
        echo "prepare: no nvcc here: build-gpu/ is not made (run.sh builds on the GPU machine, ~1-2 min)" >&2
    fi
else
    echo "prepare: --no-cuda: build-gpu/ is not made"
fi

# ---- 4. what travels, and the calls ------------------------------------------------------------
"$PY" bench/gpu/kit.py carry-report || status=1
exit $status
