#!/bin/sh
# tests/sweep.sh [-j JOBS] [-g GROUP]... [-k SUBSTRING] [-v] [BINARY]: memplan (default ./memplan)
# against edge values of every numeric option, every bundled model at huge batch and
# sequence, odd model files and odd GPU profiles, each run under 10 s and 2 GiB; counts
# sanitizer reports, internal errors (exit 5), other exits outside 0-4, timeouts, memory,
# malformed error messages and JSON, prints each offending command, exits 1 if any.
# The work is in tests/sweep.py (python3, standard library only); run from the repository
# root.  CI runs it on the sanitizer build: make sweep SAN=1 BUILD=build-san.
set -eu
if ! command -v python3 >/dev/null 2>&1; then
    echo "sweep: needs python3" >&2
    exit 2
fi
exec python3 "$(dirname "$0")/sweep.py" "$@"
