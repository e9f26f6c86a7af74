"""The `memplan` console command of the pip package: it is the binary (exec'd, not wrapped)."""
import os
import sys

from ._errors import MemplanError
from ._run import binary


def main():
    try:
        exe = binary()
    except MemplanError as e:
        sys.stderr.write("memplan: error: %s\n" % e.message)
        return e.code
    try:
        os.execv(exe, [exe] + sys.argv[1:])
    except OSError as e:
        sys.stderr.write("memplan: error: cannot run %s: %s\n" % (exe, e))
        return 127


if __name__ == "__main__":
    sys.exit(main())
