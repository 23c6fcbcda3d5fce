#!/usr/bin/env python3
"""Fails when docs/ARCHITECTURE.md names a path, or a `path::symbol`, that
the tree no longer has.

Every backticked reference of the form `crates/…`, `tests/…`, `proto/…`,
`docs/…` or `deploy/…` is checked: the file or directory must exist, and
each `::symbol` after a source file must be defined in that file (as a
fn, struct, enum, trait, type, const, static, mod or macro). Run from
anywhere; prints every stale reference and exits 1 if there is one.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
REF = re.compile(
    r"`((?:crates|tests|proto|docs|deploy|helm)/[A-Za-z0-9_./*-]+?)"
    r"((?:::[A-Za-z_][A-Za-z0-9_]*)*)(?:\(\))?`"
)
DEFINITION = r"\b(?:fn|struct|enum|trait|type|const|static|mod|macro_rules!)\s+{}\b"


def main() -> int:
    text = DOC.read_text(encoding="utf-8")
    stale = []
    checked = 0
    for match in REF.finditer(text):
        path, symbols = match.group(1).rstrip("/"), match.group(2)
        checked += 1
        target = ROOT / path
        if "*" in path:
            if not list(ROOT.glob(path)):
                stale.append(f"{path}: matches nothing")
            continue
        if not target.exists():
            stale.append(f"{path}: no such file or directory")
            continue
        if not symbols:
            continue
        if not target.is_file():
            stale.append(f"{path}{symbols}: symbols need a file, not a directory")
            continue
        source = target.read_text(encoding="utf-8", errors="replace")
        for symbol in symbols.split("::")[1:]:
            if not re.search(DEFINITION.format(re.escape(symbol)), source):
                stale.append(f"{path}{symbols}: `{symbol}` is not defined in {path}")
    for line in stale:
        print(f"docs/ARCHITECTURE.md: stale reference {line}")
    print(f"code map: {checked} references checked, {len(stale)} stale")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
