#!/bin/sh
# Times plan and suggest on long chains (issue 13: plan/suggest on a 100,000-block
# model in under 10 s).  Models are the bundled tiny-test and gpt2-124m with their
# repeated block repeated N times.  Prints wall, user and system seconds and peak
# RSS per run (one run each: these are slow; the machine's load shows in wall).
# Usage: sh bench/scale.sh [./memplan] [N...]   (default N: 1000 10000 100000)
set -eu
cd "$(dirname "$0")/.."
BIN=${1:-./memplan}
[ -x "$BIN" ] || { echo "build first: make" >&2; exit 2; }
[ $# -gt 0 ] && shift
SIZES=${*:-1000 10000 100000}
T=$(mktemp -d "${TMPDIR:-/tmp}/memplan-scale.XXXXXX")
trap 'rm -rf "$T"' EXIT
timeit() {
    label=$1
    shift
    /usr/bin/time -f "%e %U %S %M" -o "$T/time" "$BIN" "$@" >"$T/out" 2>"$T/err" && ec=$? || ec=$?
    read -r wall user sys rss <<EOT
$(tail -n 1 "$T/time")
EOT
    printf '%-44s exit %d  wall %6.2f s  user %6.2f s  sys %5.2f s  rss %5d MiB\n' "$label" "$ec" \
        "$wall" "$user" "$sys" $((rss / 1024))
}
for n in $SIZES; do
    sed "s/\"repeat\": 2,/\"repeat\": $n,/" models/tiny-test.json >"$T/tiny.json"
    sed "s/\"repeat\": 12,/\"repeat\": $n,/" models/gpt2-124m.json >"$T/gpt2.json"
    timeit "plan tiny-test x$n --gpu t4 --batch 1024" plan "$T/tiny.json" --gpu t4 --batch 1024
    timeit "plan gpt2 x$n --activation-budget 1TiB" plan "$T/gpt2.json" --activation-budget 1TiB
    [ "$n" -le 10000 ] && timeit "suggest tiny-test x$n --gpu t4" suggest "$T/tiny.json" --gpu t4 --no-probe
done
