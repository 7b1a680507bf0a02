#!/usr/bin/env python3
"""Fails when rustdoc's HTML for a crate shows an intra-doc link as literal text.

Usage: unresolved-links.py <doc dir> <crate name> ...

A link rustdoc could not resolve (say, one that resolves only when the whole workspace is
documented together, with features other crates turn on) is printed as the bracketed text
itself: `[PolicyId]` or `[`Store::check`]` in the prose of a page. Code (code blocks, inline
code, item signatures) is removed first, so `&[PolicyId]` in a signature or `v[0]` in an
example is not reported.
"""

import html
import pathlib
import re
import sys

# Whole elements whose text is code or not prose.
CODE = re.compile(
    r"<(pre|code|script|style)\b[^>]*>.*?</\1>"
    r"|<(h[1-6]) class=\"code-header\"[^>]*>.*?</\2>",
    re.S,
)
TAG = re.compile(r"<[^>]+>")
# `[Name]`, `[path::Name]`, `[Name::method()]`, `[`Name`]`, `[text][Name]`: a bracketed Rust
# path (a capital or a `::` in it), optionally in backticks.
UNRESOLVED = re.compile(
    r"\[`?(?:[A-Za-z_][A-Za-z0-9_]*::)*(?:[A-Z][A-Za-z0-9_]*|[a-z_][a-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?!?`?\]"
)


def prose(page: str) -> str:
    text = CODE.sub(" ", page)
    return html.unescape(TAG.sub("", text))


def main() -> int:
    doc = pathlib.Path(sys.argv[1])
    found = 0
    for krate in sys.argv[2:]:
        root = doc / krate
        if not root.is_dir():
            print(f"error: no documentation for {krate} in {doc}", file=sys.stderr)
            return 1
        for page in sorted(root.rglob("*.html")):
            text = prose(page.read_text(encoding="utf-8", errors="replace"))
            for m in sorted(set(UNRESOLVED.findall(text))):
                print(f"{page.relative_to(doc)}: unresolved link {m}", file=sys.stderr)
                found += 1
    if found:
        print(f"error: {found} unresolved intra-doc link(s) shown as text", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
