"""checklib.py - the one-line results of the Python test scripts (recipes_real.py, emit_real.py,
py_*.py): ok / skip / FAIL lines on stdout, the failures kept in `failures` for the exit status;
have(): whether a library imports (a test that needs it skips without it)."""
failures = []


def ok(msg):
    print("ok   " + msg)


def skip(msg):
    print("skip " + msg)


def fail(msg):
    print("FAIL " + msg)
    failures.append(msg)


def check(cond, msg):
    (ok if cond else fail)(msg)


def have(mod):
    try:
        __import__(mod)
        return True
    except Exception:
        return False
