"""Running the memplan binary: where it is, the options a command takes, one report.

The options are not copied here: a command's options are the ones its `memplan COMMAND --help`
synopsis lists (generated from the option table, src/cli/options.c OPTS[]: `[--name ARG]`, or
`[--name]` for a flag), read once per binary and command.
"""
import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import List, Mapping

from ._errors import EXIT_INTERNAL, EXIT_NO_BINARY, MemplanError, SchemaError
from ._schema import read_report

# options the API sets or cannot take: the report is --json; --emit prints a snippet instead
NOT_KEYWORDS = {"json": "the API always reads the --json report",
                "help": "run `memplan COMMAND --help`",
                "emit": "--emit prints a snippet, not a report: run the memplan command"}


def binary():
    """the memplan executable this package runs: $MEMPLAN_BIN, else the one installed with the
    package (memplan/_bin/memplan), else a source checkout's ./memplan (python/memplan is
    in-tree: `make` builds it)"""
    env = os.environ.get("MEMPLAN_BIN")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    packaged = os.path.join(here, "_bin", "memplan")
    if os.path.isfile(packaged):
        return packaged
    root = os.path.dirname(os.path.dirname(here))
    built = os.path.join(root, "memplan")
    if os.path.isfile(built) and os.path.isfile(os.path.join(root, "src", "cli", "main.c")):
        return built
    raise MemplanError("no memplan binary: not installed with this package (%s), no ./memplan in a source "
                       "checkout, and MEMPLAN_BIN is not set" % packaged, EXIT_NO_BINARY)


def _exec(argv):
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    except OSError as e:
        raise MemplanError("cannot run %s: %s" % (argv[0], e), EXIT_NO_BINARY, argv)


def _lines(stderr, kind):
    p = "memplan: %s: " % kind
    return [ln[len(p):] for ln in stderr.splitlines() if ln.startswith(p)]


def _failure(r, argv):
    errors = _lines(r.stderr, "error")
    last = r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else []
    msg = errors[-1] if errors else last[0] if last else "exit status %d with no message" % r.returncode
    return MemplanError(msg, r.returncode, argv, r.stderr)


@functools.lru_cache(maxsize=None)
def _options(exe, command):
    argv = [exe, command, "--help"]
    r = _exec(argv)
    if r.returncode != 0:
        raise _failure(r, argv)
    synopsis = r.stdout.split("\n\n", 1)[0]
    if not synopsis.startswith("Usage: memplan %s " % command):
        raise MemplanError("memplan %s --help: no usage line" % command, EXIT_INTERNAL, argv, r.stdout)
    return {m.group(1): m.group(2) for m in re.finditer(r"\[--([a-z][a-z0-9-]*)(?: ([^\]]+))?\]", synopsis)}


def options(command):
    """{option: its argument's name, or None for a flag} of `memplan COMMAND`, as its --help lists them"""
    return dict(_options(binary(), command))


def _value(command, name, arg, v):
    """the command-line value of keyword `name`, None to leave the option out"""
    kw = name.replace("-", "_")
    if arg is None:  # a flag
        if not isinstance(v, bool):
            raise TypeError("memplan.%s(): %s is a flag: True or False, got %r" % (command, kw, v))
        return "" if v else None
    if isinstance(v, bool):
        if arg != "on|off":
            raise TypeError("memplan.%s(): %s takes %s, got %r" % (command, kw, arg, v))
        return "on" if v else "off"
    if isinstance(v, (list, tuple, set, frozenset)):
        items = sorted(v) if isinstance(v, (set, frozenset)) else v
        return ",".join(str(x) for x in items)
    if isinstance(v, float):
        return repr(v)
    return os.fspath(v) if hasattr(v, "__fspath__") else str(v)


def argv_of(command, model=None, **kw):
    """the command line of memplan.COMMAND(model, **kw), without --json"""
    exe = binary()
    opts = _options(exe, command)
    argv = [exe, command]
    if model is not None:
        argv.append(os.fspath(model))
    for key, v in kw.items():
        name = key.replace("_", "-")
        if name in NOT_KEYWORDS:
            raise TypeError("memplan.%s(): %s is not a keyword argument: %s" % (command, key, NOT_KEYWORDS[name]))
        if name not in opts:
            raise TypeError("memplan.%s() got an unexpected keyword argument %r (memplan %s takes: %s)"
                            % (command, key, command,
                               ", ".join(sorted(o.replace("-", "_") for o in opts if o not in NOT_KEYWORDS))))
        if v is None:
            continue
        val = _value(command, name, opts[name], v)
        if val is None:
            continue
        argv += ["--" + name] + ([val] if val != "" else [])
    return argv


@dataclass
class Run:
    """how a report was made: the command line, its exit status, memplan's warnings (stderr
    lines "memplan: warning: ...", without the prefix), all of stderr, and stdout (the JSON)"""
    argv: List[str]
    returncode: int
    warnings: List[str] = field(default_factory=list)
    stderr: str = ""
    stdout: str = field(default="", repr=False)


def model_dir_name(d, default="model"):
    """a directory name for a model given as a dict (memplan names an HF config by its directory):
    its "name", else the last part of "_name_or_path", else default"""
    name = d.get("name") or os.path.basename(str(d.get("_name_or_path") or "").rstrip("/")) or default
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).strip(".-") or "model"


def report(command, model=None, **kw):
    """runs `memplan COMMAND [MODEL] OPTIONS --json` and reads its report.  model: a file, a model
    directory, a Hub id in the local HF cache, or a mapping (an HF config.json or memplan model as
    a dict: written to a temporary NAME/config.json, NAME its "name" or "_name_or_path").  Exit 0,
    and exit 1 with a report (check: does not fit; suggest: nothing fits), are results; any other
    exit raises MemplanError."""
    tmp = None
    try:
        if isinstance(model, Mapping):
            tmp = tempfile.mkdtemp(prefix="memplan-model-")
            path = os.path.join(tmp, model_dir_name(model), "config.json")
            os.makedirs(os.path.dirname(path))
            with open(path, "w") as f:
                json.dump(model, f)
            model = path
        argv = argv_of(command, model, **kw) + ["--json"]
        r = _exec(argv)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if r.returncode not in (0, 1) or not r.stdout.strip():
        raise _failure(r, argv)
    try:
        d = json.loads(r.stdout)
    except ValueError as e:
        raise SchemaError("the --json report is not JSON: %s" % e, argv, r.stderr)
    try:
        rep = read_report(command, d)
    except SchemaError as e:
        raise SchemaError(e.message, argv, r.stderr)
    rep.run = Run(argv, r.returncode, _lines(r.stderr, "warning"), r.stderr, r.stdout)
    return rep


def version():
    """the binary's version ("0.1.0")"""
    argv = [binary(), "--version"]
    r = _exec(argv)
    if r.returncode != 0:
        raise _failure(r, argv)
    return r.stdout.split()[-1]
