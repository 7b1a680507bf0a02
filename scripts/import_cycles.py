#!/usr/bin/env python3
"""Import cycles between sibling modules of a Rust crate.

    scripts/import_cycles.py crates/ratekeeper-core                   # every folder module
    scripts/import_cycles.py crates/ratekeeper-core store::redis      # one module's children
    scripts/import_cycles.py --include-tests crates/ratekeeper-tower  # count test modules too
    scripts/import_cycles.py --edges crates/ratekeeper-core store::redis  # also list the edges

Reads the crate's module tree from its files (`src/lib.rs` or `src/main.rs`, `foo.rs`,
`foo/mod.rs`, `foo.rs` + `foo/`), then every path a module names: the paths of its `use`
items (brace groups expanded) and the `crate::`, `super::`, `self::` paths in its code.
Each path resolves to the deepest module it names. Two sibling modules A and B (children of
the same parent P) depend on each other when something inside A names something inside B;
the parent's own file is left out (a parent declares and re-exports its children, which is
not a cycle). Every strongly connected group of two or more siblings is printed as a cycle,
with one path that closes it.

Code inside `#[cfg(test)]` modules is skipped unless `--include-tests`. Comments, string
literals and `macro_rules!` bodies are ignored. `#[path]` attributes are not followed.

Exit status: 0 when no cycle is found, 1 when one is, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text: str) -> str:
    """Blanks comments, string and char literals, keeping line structure."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            hashes = m.group(1)
            end = text.find('"' + hashes, i + m.end())
            end = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # char literal ('a', '\n', '\u{..}') vs lifetime ('a)
            m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:])
            if m:
                out.append("' '")
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(text: str, open_at: int) -> int:
    """Index just past the brace block whose `{` is at open_at."""
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def drop_blocks(text: str, include_tests: bool) -> str:
    """Removes macro_rules bodies and (unless include_tests) #[cfg(test)] inline modules."""
    patterns = [r"macro_rules!\s*" + IDENT + r"\s*\{"]
    if not include_tests:
        patterns.append(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{")
    for pat in patterns:
        while True:
            m = re.search(pat, text)
            if not m:
                break
            end = block_end(text, m.end() - 1)
            text = text[: m.start()] + "\n" * text.count("\n", m.start(), end) + text[end:]
    return text


def expand_use_tree(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (renames and globs dropped)."""
    tree = re.sub(r"\s+", "", tree)
    m = re.search(r"\{", tree)
    if not m:
        tree = re.sub(r"as" + IDENT + "$", "", tree) if "as" in tree else tree
        return [tree.rstrip(":")]
    prefix = tree[: m.start()]
    end = block_end(tree, m.start())
    inner = tree[m.start() + 1 : end - 1]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    paths = []
    for part in parts:
        if not part:
            continue
        for sub in expand_use_tree(part):
            paths.append(prefix + sub if sub != "self" else prefix.rstrip(":"))
    return paths


class Crate:
    def __init__(self, root: str, include_tests: bool):
        src = os.path.join(root, "src")
        top = next((os.path.join(src, f) for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))), None)
        if top is None:
            raise SystemExit(f"{root}: no src/lib.rs or src/main.rs")
        self.include_tests = include_tests
        self.files: dict[tuple, str] = {}  # module path -> file
        self.children: dict[tuple, set] = defaultdict(set)
        self.inline: dict[tuple, str] = {}  # module path -> code of inline modules
        self._load((), top, src)

    def _load(self, path: tuple, file: str, dir_for_children: str) -> None:
        self.files[path] = file
        with open(file, encoding="utf-8") as fh:
            text = drop_blocks(strip_comments_and_strings(fh.read()), self.include_tests)
        self.inline[path] = text
        for m in re.finditer(r"(?:^|[;}\s])(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text):
            name = m.group(1)
            child = path + (name,)
            self.children[path].add(name)
            for cand, sub in (
                (os.path.join(dir_for_children, name + ".rs"), os.path.join(dir_for_children, name)),
                (os.path.join(dir_for_children, name, "mod.rs"), os.path.join(dir_for_children, name)),
            ):
                if os.path.exists(cand):
                    self._load(child, cand, sub)
                    break

    def resolve(self, here: tuple, path: str) -> tuple | None:
        segs = [s for s in path.split("::") if s]
        if not segs:
            return None
        if segs[0] == "crate":
            base, segs = (), segs[1:]
        elif segs[0] in ("super", "self"):
            base = here
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    if not base:
                        return None
                    base = base[:-1]
                segs = segs[1:]
        elif segs[0] in self.children.get(here, ()):
            base = here
        else:
            return None  # an external crate, std, or a local item
        mod = base
        for s in segs:
            if s in self.children.get(mod, ()):
                mod = mod + (s,)
            else:
                break
        return mod

    def references(self, here: tuple) -> set:
        text = self.inline[here]
        found = set()
        for m in re.finditer(r"\buse\s+([^;]*);", text):
            for p in expand_use_tree(m.group(1)):
                r = self.resolve(here, p)
                if r is not None:
                    found.add(r)
        code = re.sub(r"\buse\s+[^;]*;", "", text)
        for m in re.finditer(r"\b(?:crate|super|self)(?:::" + IDENT + ")+", code):
            r = self.resolve(here, m.group(0))
            if r is not None:
                found.add(r)
        return found

    def edges(self) -> dict:
        """(parent) -> {child_a: {child_b: (from_module, to_module)}}"""
        out: dict = defaultdict(lambda: defaultdict(dict))
        for here in self.files:
            for target in self.references(here):
                # common ancestor; edge between its two distinct children
                k = 0
                while k < min(len(here), len(target)) and here[k] == target[k]:
                    k += 1
                if k >= len(here) or k >= len(target):
                    continue  # one contains the other (parent/child), not siblings
                parent = here[:k]
                a, b = here[k], target[k]
                out[parent][a].setdefault(b, (here, target))
        return out


def sccs(nodes, graph):
    index, low, stack, on, res, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
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
            res.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return res


def cycle_path(comp, graph):
    """One cycle through the first node of comp, inside comp (BFS back to the start)."""
    start = comp[0]
    members = set(comp)
    prev = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, {})):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("crate", help="crate directory (holding src/)")
    ap.add_argument("module", nargs="?", help="only this module's children, e.g. store::redis")
    ap.add_argument("--include-tests", action="store_true", help="count #[cfg(test)] modules")
    ap.add_argument("--edges", action="store_true", help="print every sibling edge too")
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(args.crate, "src")):
        print(f"{args.crate}: no src/ folder", file=sys.stderr)
        return 2
    crate = Crate(args.crate, args.include_tests)
    only = tuple(s for s in args.module.split("::") if s) if args.module else None
    if only is not None and only not in crate.files:
        print(f"{args.module}: no such module in {args.crate}", file=sys.stderr)
        return 2
    all_edges = crate.edges()
    parents = [only] if only is not None else sorted(crate.children)
    cycles = 0
    for parent in parents:
        graph = all_edges.get(parent, {})
        name = "::".join(("crate",) + parent)
        if args.edges:
            for a in sorted(graph):
                for b in sorted(graph[a]):
                    src, dst = graph[a][b]
                    print(f"{name}: {a} -> {b}   ({'::'.join(src)} names {'::'.join(dst)})")
        for comp in sccs(crate.children.get(parent, set()), graph):
            if len(comp) < 2:
                continue
            cycles += 1
            path = cycle_path(comp, graph)
            print(f"cycle in {name} among {', '.join(comp)}: {' -> '.join(path)}")
            for a, b in zip(path, path[1:]):
                src, dst = graph[a][b]
                print(f"    {a} -> {b}: {'::'.join(src)} names {'::'.join(dst)}")
    scope = f"crate::{args.module}" if only is not None else args.crate
    if cycles == 0:
        print(f"no import cycle between sibling modules in {scope}")
        return 0
    print(f"{cycles} import cycle(s) in {scope}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
