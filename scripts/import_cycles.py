#!/usr/bin/env python3
"""Import cycles between the source files of each crate under crates/*/src.

A node is a file (a module: `a/b.rs` or `a/b/mod.rs` is `crate::a::b`). An edge A -> B is a
path in A (a `use` item or an inline `crate::...` / `super::...` / `self::...` path) that
names module B, resolved to the longest module prefix that is a file. Not counted:

- paths to A itself or to one of A's ancestors (a child reading what its parent module
  defines or re-exports: the parent's `mod` items own the child, not the other way round);
- `pub use` / `pub(crate) use` / `pub(super) use` re-exports (a module re-exporting its
  children's items is their facade, not a dependency of its own);
- `#[cfg(test)]` test modules (`tests.rs`, `*_tests.rs`, files under a `tests/` folder).

Prints every cycle (as a strongly connected component of more than one file, with the edges
inside it and the line that makes each) and exits 1 when there is one; exits 0 otherwise.

    scripts/import_cycles.py                      # every crate
    scripts/import_cycles.py crates/ratekeeper-tower crates/ratekeeper-axum
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def is_test(rel):
    parts = rel.split(os.sep)
    name = parts[-1]
    return name == "tests.rs" or name.endswith("_tests.rs") or "tests" in parts[:-1]


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] if "//" in line else line for line in text.split("\n"))


def cut_test_modules(text):
    """Drops `#[cfg(test)] mod name { ... }` blocks (brace-matched)."""
    out = []
    i = 0
    pattern = re.compile(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{")
    while True:
        m = pattern.search(text, i)
        if not m:
            out.append(text[i:])
            break
        out.append(text[i:m.start()])
        depth = 1
        j = m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    return "".join(out)


def use_paths(text):
    """(line number, path segments) of every non-re-export path in `text`."""
    found = []
    # `use` items, with nested braces expanded.
    for m in re.finditer(r"(^|\n)(\s*)(pub(\([^)]*\))?\s+)?use\s+([^;]+);", text):
        if m.group(3):
            continue
        line = text.count("\n", 0, m.start(5)) + 1
        for path in expand(re.sub(r"\s+", "", m.group(5))):
            found.append((line, path))
    # Inline paths outside `use` items.
    no_use = re.sub(r"(^|\n)\s*(pub(\([^)]*\))?\s+)?use\s+[^;]+;", lambda m: "\n" * m.group(0).count("\n"), text)
    for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::(?:super|\w+))+)", no_use):
        line = no_use.count("\n", 0, m.start()) + 1
        found.append((line, m.group(1).split("::")))
    return found


def expand(tree):
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]]."""
    if "{" not in tree:
        return [tree.split(" as ")[0].split("as")[0].split("::")] if tree else []
    head, rest = tree.split("{", 1)
    inner = rest[: rest.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    prefix = [p for p in head.split("::") if p]
    out = []
    for part in parts:
        if not part:
            continue
        for sub in expand(part):
            out.append(prefix + sub)
    return out


def resolve(path, here, modules):
    """The module (tuple) a path names, or None for paths outside the crate."""
    if not path or path[0] not in ("crate", "super", "self"):
        return None
    cur = list(here)
    segs = list(path)
    if segs[0] == "crate":
        cur = []
        segs = segs[1:]
    while segs and segs[0] in ("super", "self"):
        if segs[0] == "super":
            cur = cur[:-1]
        segs = segs[1:]
    best = tuple(cur)
    for seg in segs:
        cand = tuple(cur + [seg])
        if cand in modules:
            cur.append(seg)
            best = cand
        else:
            break
    return best


def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def check(crate):
    src = os.path.join(crate, "src")
    files = {}
    for dirpath, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(dirpath, name)
                if is_test(os.path.relpath(path, src)):
                    continue
                files[module_of(src, path)] = path
    graph, why = {}, {}
    for mod, path in files.items():
        with open(path, encoding="utf-8") as f:
            text = cut_test_modules(strip_comments(f.read()))
        graph.setdefault(mod, set())
        for line, p in use_paths(text):
            target = resolve(p, mod, files)
            if target is None or target == mod or mod[: len(target)] == target:
                continue
            graph[mod].add(target)
            why.setdefault((mod, target), f"{os.path.relpath(path, ROOT)}:{line}: {'::'.join(p)}")
    cycles = [c for c in sccs(graph) if len(c) > 1]
    name = lambda m: "crate::" + "::".join(m) if m else "crate"
    for comp in cycles:
        members = set(comp)
        print(f"{os.path.relpath(crate, ROOT)}: import cycle between {', '.join(sorted(name(m) for m in comp))}")
        for a in sorted(comp):
            for b in sorted(graph[a] & members):
                print(f"    {name(a)} -> {name(b)}   ({why[(a, b)]})")
    return len(cycles)


def main():
    crates = sys.argv[1:] or sorted(
        os.path.join(ROOT, "crates", d) for d in os.listdir(os.path.join(ROOT, "crates"))
    )
    total = sum(check(os.path.abspath(c)) for c in crates)
    if total:
        print(f"{total} import cycle(s)", file=sys.stderr)
        return 1
    print("no import cycles in " + ", ".join(os.path.relpath(os.path.abspath(c), ROOT) for c in crates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
