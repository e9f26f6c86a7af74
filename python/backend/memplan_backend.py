"""memplan_backend: the PEP 517 build backend of the memplan Python package, standard library only.

pip runs it from the repository root (pyproject.toml: build-backend = "memplan_backend",
backend-path = ["python/backend"]), so `pip install .` and `pip wheel .` need no network and no
setuptools.  build_wheel copies the C sources to a temporary directory, runs the repository's own
Makefile there (`make memplan CUDA=no BLAS=no`; the source tree is left untouched) and packs:

    memplan/                     python/memplan/ (the API, the console entry, the integrations)
    memplan/_bin/memplan         the binary
    memplan/_bin/configs/gpus/   the GPU profiles (the binary looks next to itself: src/search/gpu.c)
    memplan-V.data/data/share/man/man1/memplan.1

The wheel is tagged py3-none-PLATFORM (linux_x86_64 here): the binary is native code for this
platform and links the system's libcjson and libyaml dynamically, as `make` does (Debian ships
no libcjson.a), so it is a wheel for this machine or one with the same libraries (libcjson1,
libyaml-0-2), not a manylinux one.

Environment:
    MEMPLAN_CUDA=1          build the CUDA probe backend too (make CUDA=yes: needs nvcc and cuBLAS
                            headers; the build fails, saying so, without them)
    MEMPLAN_MAKEFLAGS="..." more make variables, e.g. "BLAS=auto" (OpenBLAS for host probes: the
                            binary then needs libopenblas at run time) or "CC=clang"
    MEMPLAN_JOBS=N          make -jN (default: the CPU count)
"""
import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

NAME = "memplan"
SUMMARY = "Plan GPU memory for training before you launch: estimate, check, suggest (C binary + Python API)"
REQUIRES_PYTHON = ">=3.8"
# what the C build reads (build_wheel copies these to a temporary directory)
C_TREE = ("Makefile", "src", "kernels", "configs")
# what an sdist holds: enough to build the wheel again
SDIST_TREE = ("pyproject.toml", "README.md", "Makefile", "src", "kernels", "configs", "man",
              "python/backend", "python/memplan")
SKIP = re.compile(r"(^|/)(__pycache__|\.pytest_cache)(/|$)|\.(pyc|pyo|o|d)$")


def _root():
    return os.path.abspath(os.getcwd())  # PEP 517: hooks run in the source tree


def _version(root):
    with open(os.path.join(root, "src", "util", "util.h")) as f:
        m = re.search(r'#define MEMPLAN_VERSION "([^"]+)"', f.read())
    if not m:
        raise RuntimeError("memplan build: no MEMPLAN_VERSION in src/util/util.h")
    return m.group(1)


def _tag():
    """py3-none-PLATFORM: any Python 3 (the package is Python + an executable, no extension
    module), this platform (the executable is native code)"""
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "py3-none-" + plat


def _files(root, top):
    """the files under root/top (or top itself), relative to root, sorted, without build leftovers"""
    path = os.path.join(root, top)
    if os.path.isfile(path):
        return [top]
    out = []
    for d, dirs, names in os.walk(path):
        dirs.sort()
        for n in sorted(names):
            rel = os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/")
            if not SKIP.search(rel):
                out.append(rel)
    return out


def _metadata(version):
    return ("Metadata-Version: 2.1\n"
            "Name: %s\nVersion: %s\nSummary: %s\nRequires-Python: %s\n"
            "License: see the memplan repository\n"
            "Description-Content-Type: text/markdown\n\n"
            "memplan plans GPU memory for training steps.  `memplan` is the command (see `man memplan`,\n"
            "`memplan --help`); `import memplan` gives `estimate`, `check` and `suggest` over its `--json`\n"
            "output, and `memplan.integrations.transformers.MemplanCallback` checks a Trainer's run\n"
            "before its first step.  The binary links libcjson and libyaml dynamically.\n"
            % (NAME, version, SUMMARY, REQUIRES_PYTHON))


def _make(root, work, cuda):
    """builds work/memplan from a copy of the C sources; returns its path"""
    tree = os.path.join(work, "tree")
    for top in C_TREE:
        src = os.path.join(root, top)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(tree, top), ignore=shutil.ignore_patterns("*.o", "*.d", "__pycache__"))
        elif os.path.isfile(src):
            os.makedirs(tree, exist_ok=True)
            shutil.copy2(src, os.path.join(tree, top))
    make = shutil.which("make")
    if not make:
        raise RuntimeError("memplan build: `make` was not found (apt-get install build-essential)")
    jobs = os.environ.get("MEMPLAN_JOBS") or str(os.cpu_count() or 1)
    cmd = [make, "-C", tree, "-j" + jobs, "memplan", "CUDA=" + ("yes" if cuda else "no"), "BLAS=no"]
    cmd += shlex.split(os.environ.get("MEMPLAN_MAKEFLAGS", ""))
    sys.stderr.write("memplan build: %s\n" % " ".join(cmd))
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    sys.stderr.write(r.stdout)
    if r.returncode != 0:
        hint = ""
        if re.search(r"cjson/cJSON\.h|yaml\.h|-lcjson|-lyaml", r.stdout):
            hint = " (the build needs libcjson-dev and libyaml-dev: apt-get install libcjson-dev libyaml-dev)"
        raise RuntimeError("memplan build: make failed with exit status %d%s" % (r.returncode, hint))
    exe = os.path.join(tree, "memplan")
    v = subprocess.run([exe, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    if v.returncode != 0:
        raise RuntimeError("memplan build: the built binary does not run: %s" % v.stdout.strip())
    sys.stderr.write("memplan build: %s in %.0f s\n" % (v.stdout.strip(), time.time() - t0))
    return exe


class _Wheel:
    """a wheel being written: files, their RECORD lines"""

    def __init__(self, path):
        self.zf = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, arcname, data, mode=0o644):
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | mode) << 16  # a regular file with its permission bits
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append("%s,sha256=%s,%d" % (arcname, digest, len(data)))

    def add_file(self, arcname, path, mode=0o644):
        with open(path, "rb") as f:
            self.add(arcname, f.read(), mode)

    def close(self, dist_info):
        rec = dist_info + "/RECORD"
        self.record.append(rec + ",,")
        info = zipfile.ZipInfo(rec, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o100644 << 16
        self.zf.writestr(info, "\n".join(self.record) + "\n")
        self.zf.close()


ENTRY_POINTS = "[console_scripts]\nmemplan = memplan._cli:main\n"


def _wheel_file(tag, purelib):
    return ("Wheel-Version: 1.0\nGenerator: memplan_backend\nRoot-Is-Purelib: %s\nTag: %s\n"
            % ("true" if purelib else "false", tag))


def _dist_info(w, dist_info, version, tag, purelib):
    w.add(dist_info + "/METADATA", _metadata(version).encode())
    w.add(dist_info + "/WHEEL", _wheel_file(tag, purelib).encode())
    w.add(dist_info + "/entry_points.txt", ENTRY_POINTS.encode())


# ---- PEP 517 hooks ---------------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """the .dist-info without compiling (pip reads it before it builds)"""
    root = _root()
    version = _version(root)
    dist_info = "%s-%s.dist-info" % (NAME, version)
    d = os.path.join(metadata_directory, dist_info)
    os.makedirs(d, exist_ok=True)
    files = {"METADATA": _metadata(version), "WHEEL": _wheel_file(_tag(), purelib=False),
             "entry_points.txt": ENTRY_POINTS}
    for name, text in files.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    return dist_info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    root = _root()
    version, tag = _version(root), _tag()
    cuda = os.environ.get("MEMPLAN_CUDA", "") not in ("", "0", "no")
    name = "%s-%s-%s.whl" % (NAME, version, tag)
    dist_info = "%s-%s.dist-info" % (NAME, version)
    work = tempfile.mkdtemp(prefix="memplan-build-")
    try:
        exe = _make(root, work, cuda)
        os.makedirs(wheel_directory, exist_ok=True)
        w = _Wheel(os.path.join(wheel_directory, name))
        for rel in _files(root, "python/memplan"):
            w.add_file(rel[len("python/"):], os.path.join(root, rel))
        w.add_file("memplan/_bin/memplan", exe, 0o755)
        for rel in _files(root, "configs/gpus"):
            w.add_file("memplan/_bin/" + rel, os.path.join(root, rel))
        w.add_file("%s-%s.data/data/share/man/man1/memplan.1" % (NAME, version), os.path.join(root, "man", "memplan.1"))
        _dist_info(w, dist_info, version, tag, purelib=False)
        w.close(dist_info)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """`pip install -e .`: python/ on sys.path through a .pth file; the package runs the source
    tree's ./memplan (build it with `make`), as python/memplan/_binary.py finds it"""
    root = _root()
    version, tag = _version(root), _tag()
    name = "%s-%s-%s.whl" % (NAME, version, tag)
    dist_info = "%s-%s.dist-info" % (NAME, version)
    os.makedirs(wheel_directory, exist_ok=True)
    w = _Wheel(os.path.join(wheel_directory, name))
    w.add("memplan_editable.pth", (os.path.join(root, "python") + "\n").encode())
    _dist_info(w, dist_info, version, tag, purelib=False)
    w.close(dist_info)
    return name


def build_sdist(sdist_directory, config_settings=None):
    root = _root()
    version = _version(root)
    base = "%s-%s" % (NAME, version)
    name = base + ".tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        def add(arcname, data, mode=0o644):
            ti = tarfile.TarInfo(base + "/" + arcname)
            ti.size, ti.mode, ti.mtime = len(data), mode, 1577836800
            tf.addfile(ti, io.BytesIO(data))
        add("PKG-INFO", _metadata(version).encode())
        for top in SDIST_TREE:
            for rel in _files(root, top):
                path = os.path.join(root, rel)
                with open(path, "rb") as f:
                    add(rel, f.read(), 0o755 if os.access(path, os.X_OK) else 0o644)
    return name
