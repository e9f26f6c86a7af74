#!/usr/bin/env python3
"""replay_accuracy.py - the accuracy oracles' measured rows replayed through memplan (no torch).

Usage (from the repository root):  python3 tests/replay_accuracy.py ./memplan [ROWS.jsonl ...]

Each row of bench/accuracy/rows/*.jsonl (bench/accuracy/rowlib.py describes them) holds a torch
figure measured by an oracle (torch_step.py, torch_saved.py, peft_step.py, dist_gloo.py,
optim_states.py), the
config and memplan settings it was measured with, and the tolerance memplan achieved then.  This
runs memplan on each row and checks every figure: |memplan - (torch + extra)| <= abs + pct % of
it.  The expected values are torch's, never memplan's own.  One line per row ("ok" or "FAIL" with
the figures), a summary per oracle, exit 1 on any miss (or a row memplan refuses).  A row marked
`disagrees` (a miss found and said, rowlib.py) is listed as KNOWN while memplan's figure stays
the one it was marked with; when that figure moves the row fails until the mark is revisited.
Every row runs in make test's quick tier (some 470 rows: about 10 s, 25 s under ASan).
"""
import glob
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "accuracy"))
import rowlib  # noqa: E402


def fmt(n):
    return "{:,}".format(n)


def main():
    if len(sys.argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    memplan = os.path.abspath(sys.argv[1])
    files = sys.argv[2:] or sorted(glob.glob(os.path.join(rowlib.ROWS_DIR, "*.jsonl")))
    if not files:
        print("replay_accuracy: no rows under %s" % rowlib.ROWS_DIR, file=sys.stderr)
        return 1
    total_ok = total_fail = total_known = 0
    with tempfile.TemporaryDirectory(prefix="memplan-replay-") as tmp:
        for path in files:
            rows = rowlib.read_rows(path)
            ok = fail = known = 0
            for row in rows:
                what = "%s %s %s" % (row["oracle"], row["config"], " ".join(a for a in row["args"] if a != "--json"))
                try:
                    report, _ = rowlib.run_memplan(memplan, row, tmp)
                    checks = rowlib.check(row, report)
                except (RuntimeError, KeyError, ValueError) as e:
                    fail += 1
                    print("FAIL %s\n#    memplan: %s\n#    row: %s" % (what, e, row["source"]))
                    continue
                mark = row.get("disagrees")
                if mark:
                    now = {c[0]: c[1] for c in checks}
                    if all(now.get(k) == v for k, v in mark["memplan"].items()) and not all(c[4] for c in checks):
                        known += 1
                        print("KNOWN %s: %s (torch %s): %s" % (what, ", ".join("%s %s" % (k, fmt(v)) for k, v in
                              sorted(mark["memplan"].items())), ", ".join(fmt(c[2]) for c in checks), mark["why"]))
                        continue
                    fail += 1
                    print("FAIL %s: marked `disagrees` at %s with memplan %s, now %s: revisit the mark (%s)" % (
                        what, mark["seen"], mark["memplan"], now, row["source"]))
                    continue
                if all(c[4] for c in checks):
                    ok += 1
                    print("ok   %s: %s" % (what, ", ".join("%s %s" % (c[0], fmt(c[1])) for c in checks)))
                    continue
                fail += 1
                print("FAIL %s" % what)
                for (name, got, want, allowed, good) in checks:
                    print("#    %s %s: memplan %s, torch%s %s, off by %s (%+.3f %%), allowed %s" % (
                        "ok  " if good else "MISS", name, fmt(got), " + CUDA-only" if row["figures"][name].get("extra")
                        else "", fmt(want), fmt(got - want), 100.0 * (got - want) / want if want else 0.0,
                        fmt(int(allowed))))
                print("#    row: %s" % row["source"])
            print("%s: %d rows replayed, %d passed, %d failed, %d known misses" % (
                os.path.relpath(path, ROOT), ok + fail + known, ok, fail, known))
            total_ok += ok
            total_fail += fail
            total_known += known
    print("replay_accuracy: %d passed, %d failed, %d known misses (rows marked `disagrees`)" % (
        total_ok, total_fail, total_known))
    return 1 if total_fail or not total_ok + total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
