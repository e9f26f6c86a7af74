#!/bin/sh
# bench/gpu/build.sh — memplan's CUDA build for the GPU kit, into build-gpu/ (ignored by git):
#
#   sh bench/gpu/build.sh [CUDA_ARCH]        (default 90: H100 and H200)
#
# Makes build-gpu/memplan, the three suites of `make test-gpu` (build-gpu/tests/test_probe,
# test_probe_ops, test_probe_suggest) and build-gpu/BUILD_INFO (commit, source hash, arch, nvcc),
# with BLAS=no so the binary needs nothing but libc, libcjson and the driver on the GPU machine
# (cuBLAS is dlopen()ed there).  Where the system has no cJSON headers (the GPU machine) the
# headers and libraries come from .deps/root (bench/gpu/prepare.sh unpacks them there).
# ./memplan, which every BUILD directory links, is left as it was: the CUDA binary is moved to
# build-gpu/memplan.  Run by prepare.sh here, and by run.sh on the GPU machine only when the
# carried build cannot be used (it does not load, is older than src/, or lacks the GPU's arch).
set -eu
cd "$(dirname "$0")/../.."
ARCH=${1:-90}
JOBS=${MAKE_JOBS:-$(nproc 2>/dev/null || echo 2)}
PY=${PYTHON:-python3}
DEPS=
if [ ! -f /usr/include/cjson/cJSON.h ] && [ -f .deps/root/usr/include/cjson/cJSON.h ]; then
    DEPS="DEPS_ROOT=$(pwd)/.deps/root"
fi
# keep ./memplan and its link stamp as they are (make relinks ./memplan for BUILD=build-gpu)
rm -f .memplan-keep .memplan-link-keep
[ -f memplan ] && cp -p memplan .memplan-keep
[ -f .memplan-link ] && cp -p .memplan-link .memplan-link-keep
restore() {
    if [ -f .memplan-keep ]; then mv -f .memplan-keep memplan; fi
    if [ -f .memplan-link-keep ]; then mv -f .memplan-link-keep .memplan-link; fi
}
TESTS="build-gpu/tests/test_probe build-gpu/tests/test_probe_ops build-gpu/tests/test_probe_suggest"
echo "bench/gpu/build.sh: make -j$JOBS CUDA=yes CUDA_ARCH=$ARCH BLAS=no BUILD=build-gpu $DEPS"
# shellcheck disable=SC2086
if ! make -j"$JOBS" CUDA=yes CUDA_ARCH="$ARCH" BLAS=no BUILD=build-gpu $DEPS memplan $TESTS; then
    rm -f memplan
    restore
    echo "bench/gpu/build.sh: the CUDA build failed" >&2
    exit 1
fi
mv -f memplan build-gpu/memplan
restore
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
DIRTY=$(git status --porcelain -- src kernels Makefile 2>/dev/null | head -1)
"$PY" bench/gpu/kit.py build-info --arch "$ARCH" --commit "$COMMIT${DIRTY:+ (src/kernels modified)}" \
    --nvcc "$("$NVCC" --version 2>/dev/null | grep -o 'release [0-9.]*' | head -1)" >build-gpu/BUILD_INFO
cat build-gpu/BUILD_INFO
