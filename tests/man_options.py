"""man_options.py MEMPLAN [MANPAGE]: memplan(1) lists the options of the option table.

The table (src/cli/options.c) is read as MEMPLAN renders it: the "Options:" lines of
`MEMPLAN COMMAND --help` for each command that `MEMPLAN --help` lists.  Against the man page
(man/memplan.1 by default) it checks:

1. each command has a SYNOPSIS block (.SY memplan / .B COMMAND ... .YS), and every option the
   table has for that command (but --help) appears in it;
2. every option of the table is an item of OPTIONS (a .TP tag naming it), with the table's
   short name (-b) and the table's value name (B);
3. nothing the man page lists is missing from the table: an option in a command's SYNOPSIS
   that the command does not take, or an OPTIONS item that no command takes (--version
   excepted, which `MEMPLAN --help` names);
4. the CLI fuzzer (tests/fuzz/fuzz_cli.c) gives every option of estimate, plan, check and
   suggest (its OPTS) or says it does not (its NOT_FUZZED), and names no option they lack.

Prints one line per failure and a summary; exits 1 if any check failed.  python3 stdlib only.
"""
import os
import re
import subprocess
import sys

OPT_LINE = re.compile(r"^(?:  -(\w), |      )--([a-z][a-z0-9-]*)(?: ([^ ]+))?(?: {2,}|$)")
LONG = re.compile(r"\\-\\-([a-z][a-z0-9\\-]*)")
SHORT = re.compile(r"(?<![\\\w-])\\-([A-Za-z])\b")


def run(binary, *args):
    p = subprocess.run([binary, *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("man_options.py: %s %s: exit %d" % (binary, " ".join(args), p.returncode))
    return p.stdout


def commands(binary):
    """The commands of `memplan --help` (its "Commands:" section), without help."""
    out, cmds, on = run(binary, "--help"), [], False
    for line in out.splitlines():
        if line == "Commands:":
            on = True
        elif on and not line.strip():
            break
        elif on:
            name = line.split()[0]
            if name != "help":
                cmds.append(name)
    return cmds, out


def table(binary, cmd):
    """{long name: (short name or None, value name or None)} of `memplan CMD --help`."""
    opts, on = {}, False
    for line in run(binary, cmd, "--help").splitlines():
        if line == "Options:":
            on = True
        elif on and not line.strip():
            break
        elif on:
            m = OPT_LINE.match(line)
            if m:
                opts[m.group(2)] = (m.group(1), m.group(3))
    if not opts:
        sys.exit("man_options.py: no options in '%s %s --help'" % (binary, cmd))
    return opts


def unman(s):
    """Roman text of a man(7) line: font escapes and quotes dropped, \\- as -."""
    s = re.sub(r"\\f[BIRP]", "", s).replace("\\-", "-")
    return s.replace('"', " ")


def sections(lines):
    """{".SH name": [lines]}."""
    out, cur = {}, None
    for line in lines:
        if line.startswith(".SH "):
            cur = line[4:].strip().strip('"')
            out[cur] = []
        elif cur:
            out[cur].append(line)
    return out


def synopsis(lines):
    """{command: set of long options} of the SYNOPSIS blocks that start with .B COMMAND."""
    blocks, cur = {}, None
    for line in lines:
        if line.startswith(".SY"):
            cur = []
        elif line.startswith(".YS"):
            if cur and cur[0].startswith(".B "):
                blocks[cur[0][3:].strip()] = {m.replace("\\-", "-") for l in cur for m in LONG.findall(l)}
            cur = None
        elif cur is not None:
            cur.append(line)
    return blocks


def options_items(lines):
    """{long name: (short name or None, value name or None)} of the OPTIONS .TP tags."""
    items = {}
    for i, line in enumerate(lines[:-1]):
        if not line.startswith(".TP"):
            continue
        tag = lines[i + 1]
        longs = LONG.findall(tag)
        if not tag.startswith(".B") or not longs:
            continue
        shorts = SHORT.findall(tag.split("\\-\\-")[0])
        # the value: the word after the last long option, e.g. .BI \-\-gpu " NAME"
        rest = unman(tag[tag.rindex("\\-\\-"):]).split()
        items[longs[-1].replace("\\-", "-")] = (shorts[0] if shorts else None, rest[1] if len(rest) > 1 else None)
    return items


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python3 tests/man_options.py ./memplan [man/memplan.1]")
    binary = sys.argv[1]
    if os.sep not in binary:
        binary = os.path.join(".", binary)
    man = sys.argv[2] if len(sys.argv) == 3 else os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "man", "memplan.1")
    with open(man, encoding="utf-8") as f:
        sec = sections(f.read().splitlines())
    cmds, top = commands(binary)
    tables = {c: table(binary, c) for c in cmds}
    syn = synopsis(sec.get("SYNOPSIS", []))
    items = options_items(sec.get("OPTIONS", []))
    fails, checks = [], 0

    for c in cmds:
        checks += 1
        if c not in syn:
            fails.append("SYNOPSIS: no block for '%s' (.SY memplan / .B %s ... .YS)" % (c, c))
            continue
        for o in tables[c]:
            if o != "help" and o not in syn[c]:
                fails.append("SYNOPSIS of %s: --%s missing (%s --help has it)" % (c, o, c))
        for o in sorted(syn[c] - set(tables[c])):
            fails.append("SYNOPSIS of %s: --%s is not an option of %s (%s --help)" % (c, o, c, c))

    every = {}
    for c in cmds:
        for o, v in tables[c].items():
            every.setdefault(o, v)
    for o, (short, value) in every.items():
        checks += 1
        if o not in items:
            fails.append("OPTIONS: no item for --%s" % o)
            continue
        mshort, mvalue = items[o]
        if mshort != short:
            fails.append("OPTIONS: --%s has short name %s in the man page, %s in --help"
                         % (o, "-" + mshort if mshort else "none", "-" + short if short else "none"))
        if mvalue != value:
            fails.append("OPTIONS: --%s takes %s in the man page, %s in --help" % (o, mvalue, value))
    for o in sorted(set(items) - set(every)):
        checks += 1
        if not (o == "version" and "--version" in top):
            fails.append("OPTIONS: --%s is an item but no command takes it" % o)

    fuzz = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz", "fuzz_cli.c")
    with open(fuzz, encoding="utf-8") as f:
        src = f.read()
    listed = {}
    for arr in ("OPTS", "NOT_FUZZED"):
        m = re.search(r"static const char \*const %s\[\][^=]*= \{(.*?)\};" % arr, src, re.S)
        if not m:
            sys.exit("man_options.py: no %s[] in %s" % (arr, fuzz))
        for o in re.findall(r'"([a-z0-9-]+)"', m.group(1)):
            listed[o] = arr
    fuzzed_cmds = [c for c in ("estimate", "plan", "check", "suggest") if c in tables]
    theirs = set().union(*(tables[c] for c in fuzzed_cmds)) if fuzzed_cmds else set()
    for o in sorted(theirs):
        checks += 1
        if o not in listed:
            fails.append("fuzz_cli.c: --%s is in neither OPTS nor NOT_FUZZED" % o)
    for o in sorted(set(listed) - theirs):
        checks += 1
        fails.append("fuzz_cli.c: %s names --%s, which no fuzzed command takes" % (listed[o], o))

    for f in fails:
        print("FAIL " + f)
    shown = os.path.relpath(man) if not os.path.relpath(man).startswith("..") else man
    print("man_options: %d options of %d commands against %s: %d checks, %d failed"
          % (len(every), len(cmds), shown, checks, len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
