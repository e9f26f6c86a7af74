"""py_wheel.py: `pip wheel .` builds memplan's wheel (pyproject.toml, python/backend/memplan_backend.py)
and `pip install --no-index` puts it in a fresh venv, where the `memplan` command and the API work
from any directory.

Usage: python3 -B tests/py_wheel.py [./memplan]   (from the repository root; make test-long runs it:
       it compiles memplan, about 25 s of CPU)

* a fresh `python3 -m venv`; its pip runs `pip wheel ROOT --no-deps --no-index` (offline, with
  pip's build isolation: the backend needs nothing but the standard library): one wheel, tagged
  py3-none-PLATFORM for this platform (never "any"), Root-Is-Purelib false, an executable binary,
  the GPU profiles, every RECORD hash right;
* the source tree is left as it was (git status unchanged);
* `pip install --no-index WHEEL` in the venv; then, from an empty directory: `memplan --version` is
  the source's MEMPLAN_VERSION; `memplan check` finds the GPU profiles installed with the package
  and prints what ./memplan prints for the same command, exit 0, and exit 1 for a run that does not
  fit; the venv's python: memplan.binary() is the installed binary and memplan.check() equals
  ./memplan's --json; the man page is installed under the venv's share/man/man1.

Skips (without failing) when python3 has no venv module or the venv gets no pip (Debian:
python3-venv), or there is no C compiler or make.
"""
import base64
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import check, fail, failures, skip  # noqa: E402

MEMPLAN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "memplan"))


def done():
    print("%d failed" % len(failures))
    sys.exit(1 if failures else 0)


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, **kw)


if not shutil.which("make") or not (shutil.which("cc") or shutil.which("gcc")):
    skip("no make or C compiler: the wheel is not built")
    done()
tmp = tempfile.mkdtemp(prefix="memplan-wheel-")
venv = os.path.join(tmp, "venv")
r = run([sys.executable, "-m", "venv", venv])
vpy, vpip = os.path.join(venv, "bin", "python"), [os.path.join(venv, "bin", "python"), "-m", "pip"]
if r.returncode != 0 or run(vpip + ["--version"]).returncode != 0:
    skip("python3 -m venv gives no venv with pip here (Debian: apt-get install python3-venv): %s"
         % (r.stderr.strip().splitlines() or ["no pip"])[-1])
    shutil.rmtree(tmp, ignore_errors=True)
    done()
env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1", PIP_NO_INPUT="1",
           PYTHONDONTWRITEBYTECODE="1")
env.pop("MEMPLAN_BIN", None)
env.pop("PYTHONPATH", None)
status = run(["git", "status", "--porcelain", "--ignored"], cwd=ROOT).stdout
wheels = os.path.join(tmp, "wheels")
r = run(vpip + ["wheel", ROOT, "--no-deps", "--no-index", "-w", wheels], env=env, cwd=tmp)
found = glob.glob(os.path.join(wheels, "*.whl"))
check(r.returncode == 0 and len(found) == 1, "pip wheel . --no-index: one wheel%s" %
      ("" if r.returncode == 0 else ": " + (r.stdout + r.stderr).strip()[-600:]))
if not found:
    shutil.rmtree(tmp, ignore_errors=True)
    done()
whl = found[0]
check(run(["git", "status", "--porcelain", "--ignored"], cwd=ROOT).stdout == status,
      "pip wheel .: the source tree is unchanged (git status, ignored files too)")
with open(os.path.join(ROOT, "src", "util", "util.h")) as f:
    version = re.search(r'#define MEMPLAN_VERSION "([^"]+)"', f.read()).group(1)
plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
check(os.path.basename(whl) == "memplan-%s-py3-none-%s.whl" % (version, plat),
      "the wheel's name: %s (py3-none-%s: native code, not any)" % (os.path.basename(whl), plat))
with zipfile.ZipFile(whl) as z:
    names = z.namelist()
    info = z.read("memplan-%s.dist-info/WHEEL" % version).decode()
    record = z.read("memplan-%s.dist-info/RECORD" % version).decode().splitlines()
    bad = []
    for line in record:
        name, digest, size = line.rsplit(",", 2)
        if not digest:
            continue
        data = z.read(name)
        want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if digest != want or int(size) != len(data):
            bad.append(name)
    mode = z.getinfo("memplan/_bin/memplan").external_attr >> 16
check("Root-Is-Purelib: false" in info and "Tag: py3-none-%s" % plat in info,
      "WHEEL: Root-Is-Purelib false, Tag py3-none-%s" % plat)
check(not bad and len(record) == len(names), "RECORD: %d files, every hash and size right%s"
      % (len(names), " (wrong: %s)" % ", ".join(bad) if bad else ""))
profiles = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "configs", "gpus", "*.json")))
check(mode & 0o111 and sorted(n.rsplit("/", 1)[-1] for n in names if n.startswith("memplan/_bin/configs/gpus/"))
      == profiles, "the wheel holds the executable binary and the %d GPU profiles" % len(profiles))

r = run(vpip + ["install", "--no-index", whl], env=env, cwd=tmp)
check(r.returncode == 0, "pip install --no-index the wheel into the venv%s" % ("" if r.returncode == 0 else
                                                                                 ": " + r.stderr.strip()[-300:]))
elsewhere = os.path.join(tmp, "elsewhere")
os.makedirs(elsewhere)
cmd = os.path.join(venv, "bin", "memplan")
r = run([cmd, "--version"], env=env, cwd=elsewhere)
check(r.returncode == 0 and r.stdout.strip() == "memplan " + version, "venv/bin/memplan --version: %s"
      % (r.stdout.strip() or r.stderr.strip()))
model = os.path.join(ROOT, "models", "gpt2-124m.json")
for args, code in ((["check", model, "--gpu", "a100-40gb", "--batch", "8"], 0),
                   (["check", model, "--gpu", "t4", "--batch", "64"], 1)):
    a = run([cmd] + args, env=env, cwd=elsewhere)
    b = run([MEMPLAN] + args, cwd=elsewhere)
    check(a.returncode == code == b.returncode and a.stdout == b.stdout and a.stdout and a.stderr == b.stderr,
          "venv/bin/memplan %s (from an empty directory: the profiles come with the package): exit %d, the output "
          "of ./memplan" % (" ".join(args[2:]), a.returncode))
code = ("import json, memplan; r = memplan.check(%r, gpu='a100-40gb', batch=8); "
        "print(json.dumps([memplan.binary(), r.fits, memplan.to_dict(r)]))" % model)
r = run([vpy, "-c", code], env=env, cwd=elsewhere)
if r.returncode != 0:
    fail("the venv's python: %s" % r.stderr.strip()[-300:])
else:
    exe, fits, rep = json.loads(r.stdout)
    raw = json.loads(run([MEMPLAN, "check", model, "--gpu", "a100-40gb", "--batch", "8", "--json"]).stdout)
    check(exe.startswith(venv) and exe.endswith("/memplan/_bin/memplan") and fits and rep == raw,
          "the venv's python: memplan.binary() is the installed one; memplan.check() equals ./memplan's --json")
check(os.path.isfile(os.path.join(venv, "share", "man", "man1", "memplan.1")), "the man page: venv/share/man/man1")
shutil.rmtree(tmp, ignore_errors=True)
done()
