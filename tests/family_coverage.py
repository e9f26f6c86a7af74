"""family_coverage.py [BINARY]: every Hugging Face family memplan reads is covered.

The families are the model types `memplan --help` lists (model_hf.c's families[], one row
each).  Each must have a bundled config in models/hf/ (its "model_type"), a parameter-count
test in tests/test_model_hf.c (a count checked against the real model's for one of its
bundled configs) and a mention in man/memplan.1.  Prints each gap and exits 1 if any.
"""
import glob
import json
import os
import re
import subprocess
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "memplan")
out = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
m = re.search(r"of model type (.*?)\.\n", out, re.S)
if not m:
    sys.exit("family_coverage: `memplan --help` lists no model types")
types = [t.strip() for t in " ".join(m.group(1).split()).split(",")]

configs = {}
for path in sorted(glob.glob(os.path.join(root, "models", "hf", "*.json"))):
    with open(path, encoding="utf-8") as fh:
        configs.setdefault(json.load(fh).get("model_type"), []).append("models/hf/" + os.path.basename(path))
with open(os.path.join(root, "tests", "test_model_hf.c"), encoding="utf-8") as fh:
    test = fh.read()
# a path next to a count (a table row or expect_params), or a loader that a count test calls
counted = set(re.findall(r'"(models/hf/[^"]+)"[^;{}]*?(?:UINT64_C\(\d+\)|\b\d{6,}u?\b)', test))
for fn, path in re.findall(r'static void (load_\w+)\(struct mp_model \*m\)\s*\{[^}]*?"(models/hf/[^"]+)"', test):
    if re.search(r"%s\(&m\);\s*assert_int_equal\(params_of" % fn, test):
        counted.add(path)
with open(os.path.join(root, "man", "memplan.1"), encoding="utf-8") as fh:
    man = fh.read().replace("\\_", "_").replace("\\-", "-")

bad = 0
for t in types:
    gaps = []
    if t not in configs:
        gaps.append("no bundled config in models/hf/")
    elif not counted & set(configs[t]):
        gaps.append("no parameter-count test in tests/test_model_hf.c for %s" % ", ".join(configs[t]))
    if not re.search(r"\b%s\b" % re.escape(t), man):
        gaps.append("not in man/memplan.1")
    for g in gaps:
        print("FAIL family %s: %s" % (t, g))
        bad = 1
print("ok   %d families: each has a bundled config, a parameter-count test and its man-page mention"
      % len(types) if not bad else "")
sys.exit(bad)
