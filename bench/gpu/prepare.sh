#!/bin/sh
# bench/gpu/prepare.sh — run on a machine with apt (this one), before sending the tree to a GPU
# machine that cannot fetch: downloads the .deb files of memplan's build dependencies (libcjson,
# libcmocka) into .deps/ (ignored by git; carry it: bench/gpu/README.md).  run.sh unpacks them
# under .deps/root and builds with DEPS_ROOT.  Nothing is installed here.
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .deps
cd .deps
apt-get download libcjson1 libcjson-dev libcmocka0 libcmocka-dev
ls -l ./*.deb
