"""doc_refs.py [ROOT]: the reasons cited in the code are in the repository.

Code cites the facts it relies on as docs/FILE.md#ID (docs/memory-facts.md#autocast,
docs/checkpointing.md#rotor-dp).  This check fails when

  - a docs/FILE.md#ID citation (in src/, tests/, kernels/, bench/, configs/, README.md or docs/*.md)
    names a file that does not exist, or an ID that is not an anchor of that file
    (`<a id="ID"></a>`, or a heading ending in `{#ID}`); a link `](#ID)` inside docs/*.md
    must name an anchor of its own file;
  - a citation points outside the repository (src/, tests/, kernels/, bench/, configs/, README.md):
    ../shared or shared/docs, a bare memory-facts / checkpointing.md / design.md /
    trainers.md / landscape.md / style.md (documents a clone does not contain), a "§N"
    section number or "sec. N" of such a document.

Files in PENDING_REWRITE are exempt from the second rule only (a file in the middle of a
split may be listed there for a while; the list is empty on main).  Prints one line per problem and exits 1 if there is any.
"""
import os
import re
import sys

# Files whose old citations are still to be rewritten (empty on main).
PENDING_REWRITE = []

SCAN_DIRS = ["src", "tests", "kernels", "bench", "configs"]
TEXT_EXT = (".c", ".h", ".cu", ".cuh", ".py", ".sh", ".md", ".txt", ".json", "Makefile")
SELF = os.path.join("tests", "doc_refs.py")

CITE = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)(?:#([A-Za-z0-9_-]+))?")
ANCHOR = re.compile(r"<a\s+id=\"([A-Za-z0-9_-]+)\"\s*>|\{#([A-Za-z0-9_-]+)\}")
LOCAL_LINK = re.compile(r"\]\(#([A-Za-z0-9_-]+)\)")
OUTSIDE = [
    (re.compile(r"\.\./shared|shared/docs"), "a path outside the repository"),
    (re.compile(r"(?<![\w/-])(?:memory-facts|checkpointing\.md|design\.md|trainers\.md|landscape\.md"
                r"|style\.md)"), "a document that is not in the repository (cite docs/FILE.md#ID)"),
    (re.compile(r"§\s*\d|\bsec\.\s*\d"), "a section number of an outside document (cite docs/FILE.md#ID)"),
]
# A paper's own section ("Korthikanti et al. §4.1", "arXiv 2205.05198 §4") is not an outside document.
PAPER = re.compile(r"arXiv|et al\.")


def read(path, cache={}):
    if path not in cache:
        try:
            with open(path, encoding="utf-8") as f:
                cache[path] = f.read()
        except (OSError, UnicodeDecodeError):
            cache[path] = ""
    return cache[path]


def anchors(path):
    """The explicit, stable ids of a document: what code may cite."""
    return {a or b for a, b in ANCHOR.findall(read(path))}


def slugs(path):
    """The ids GitHub derives from headings: enough for links inside docs/, not for citations."""
    out = set()
    for h in re.findall(r"^#+\s+(.*?)\s*$", read(path), re.M):
        out.add(re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-"))
    return out


def files(root):
    out = []
    for d in SCAN_DIRS:
        for dirpath, dirnames, names in os.walk(os.path.join(root, d)):
            dirnames[:] = sorted(n for n in dirnames if not n.startswith(".") and n != "__pycache__")
            for n in sorted(names):
                if n.endswith(TEXT_EXT):
                    out.append(os.path.relpath(os.path.join(dirpath, n), root))
    out.append("README.md")
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        out += [os.path.join("docs", n) for n in sorted(os.listdir(docs)) if n.endswith(".md")]
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = []
    n_cites = 0
    for rel in files(root):
        if rel == SELF:
            continue
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        in_docs = rel.startswith("docs" + os.sep)
        outside_check = not in_docs and rel.replace(os.sep, "/") not in PENDING_REWRITE
        for no, line in enumerate(lines, 1):
            for m in CITE.finditer(line):
                doc, ident = m.group(1), m.group(2)
                if not os.path.exists(os.path.join(root, "docs", doc)):
                    problems.append("%s:%d: docs/%s: no such file" % (rel, no, doc))
                    continue
                if ident is None:
                    continue
                n_cites += 1
                if ident not in anchors(os.path.join(root, "docs", doc)):
                    problems.append("%s:%d: docs/%s#%s: no such id in docs/%s" % (rel, no, doc, ident, doc))
            if in_docs:
                for m in LOCAL_LINK.finditer(line):
                    here = os.path.join(root, rel)
                    if m.group(1) not in anchors(here) | slugs(here):
                        problems.append("%s:%d: #%s: no such id in this file" % (rel, no, m.group(1)))
            if outside_check:
                rest = CITE.sub("", line)
                for pat, why in OUTSIDE:
                    m = pat.search(rest)
                    if m and not (why.startswith("a section") and PAPER.search(rest)):
                        problems.append("%s:%d: %r: %s" % (rel, no, m.group(0), why))
    for p in problems:
        print("doc_refs: " + p)
    print("doc_refs: %d docs/ citations checked, %d problem(s)%s" % (
        n_cites, len(problems), "; pending rewrite: " + ", ".join(PENDING_REWRITE) if PENDING_REWRITE else ""))
    if problems and PENDING_REWRITE:
        print("doc_refs: a file split out of one in PENDING_REWRITE carries its old citations: apply "
              "the rewrites to it (or list it in PENDING_REWRITE until then)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
