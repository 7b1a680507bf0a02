#!/usr/bin/env python3
"""The public API of each published crate, one line per public path and kind, from rustdoc's
JSON output; checked into `api/<crate>.txt`.

    scripts/public_api.py            # regenerate api/*.txt
    scripts/public_api.py --check    # fail (exit 1) when a listing differs from the code
    scripts/public_api.py --check ratekeeper-tower   # one crate

rustdoc's JSON output is unstable: `RUSTC_BOOTSTRAP=1` lets the stable toolchain write it
(`cargo rustdoc -p <crate> --all-features --lib -- -Z unstable-options --output-format json`),
so no nightly toolchain is needed.

Lines: `<path> <kind>` for every item reachable by a public path (modules, types, traits,
functions, constants, statics, macros, re-exported crates as `extern_crate`), then its
members: `<path>::<Variant> variant`, `<path>.<field> field`, `<path>::<item> <kind>` for the
items of inherent impls and traits, and `<path> impl <Trait>` for each trait it implements
(auto traits and blanket impls left out). Sorted, so a diff shows what changed. An item
reachable at two paths of one crate is reported on stderr (and fails `--check` for the
crates in `ONE_PATH`): each public item has one path.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRATES = ["ratekeeper-core", "ratekeeper-tower", "ratekeeper-axum", "ratekeeper-rls"]
# Crates held to one path per item (`--check` fails otherwise): every published crate.
ONE_PATH = {"ratekeeper-core", "ratekeeper-tower", "ratekeeper-axum", "ratekeeper-rls"}
API_DIR = os.path.join(ROOT, "api")


def rustdoc_json(crate):
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    subprocess.run(
        ["cargo", "rustdoc", "-q", "-p", crate, "--all-features", "--lib", "--",
         "-Z", "unstable-options", "--output-format", "json"],
        cwd=ROOT, env=env, check=True,
    )
    target = env.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    with open(os.path.join(target, "doc", crate.replace("-", "_") + ".json"), encoding="utf-8") as f:
        return json.load(f)


def kind_of(item):
    inner = item.get("inner") or {}
    return next(iter(inner)) if isinstance(inner, dict) else str(inner)


def type_name(ty):
    """A short name for a trait path in an impl."""
    if not ty:
        return "?"
    path = ty.get("path") or ty.get("name") or "?"
    return path.split("::")[-1] if "::" in path else path


def listing(doc):
    index = doc["index"]
    lines = set()
    paths_of = {}
    skip_traits = {"Send", "Sync", "Unpin", "UnwindSafe", "RefUnwindSafe", "Freeze"}

    def members(item, path):
        kind = kind_of(item)
        inner = item["inner"][kind]
        if kind == "enum":
            for vid in inner.get("variants", []):
                v = index.get(str(vid))
                if v:
                    lines.add(f"{path}::{v['name']} variant")
        if kind == "struct":
            k = inner.get("kind")
            fields = []
            if isinstance(k, dict):
                if "plain" in k:
                    fields = k["plain"].get("fields", [])
                elif "tuple" in k:
                    fields = [f for f in k["tuple"] if f is not None]
            for fid in fields:
                f = index.get(str(fid))
                if f and f.get("visibility") == "public":
                    lines.add(f"{path}.{f['name']} field")
        if kind == "trait":
            for iid in inner.get("items", []):
                it = index.get(str(iid))
                if it:
                    lines.add(f"{path}::{it['name']} {kind_of(it)}")
        for impl_id in inner.get("impls", []) if isinstance(inner, dict) else []:
            imp = index.get(str(impl_id))
            if not imp:
                continue
            ii = imp["inner"].get("impl", {})
            if ii.get("is_synthetic") or ii.get("blanket_impl"):
                continue
            trait = ii.get("trait")
            if trait:
                name = type_name(trait)
                if name not in skip_traits:
                    lines.add(f"{path} impl {name}")
                continue
            for iid in ii.get("items", []):
                it = index.get(str(iid))
                if it and it.get("visibility") == "public" and it.get("name"):
                    lines.add(f"{path}::{it['name']} {kind_of(it)}")

    def visit(item_id, path, seen):
        item = index.get(str(item_id))
        if item is None:
            return
        kind = kind_of(item)
        if kind == "use":
            use = item["inner"]["use"]
            target = use.get("id")
            if use.get("is_glob"):
                target_item = index.get(str(target)) if target is not None else None
                if target_item and kind_of(target_item) == "module":
                    for child in target_item["inner"]["module"]["items"]:
                        visit(child, path, seen)
                return
            name = use["name"]
            if target is None or str(target) not in index:
                # Another crate's item (its API is in that crate's listing).
                lines.add(f"{path}::{name} use {use['source']}")
                return
            visit_named(target, f"{path}::{name}", seen)
            return
        visit_named(item_id, f"{path}::{item['name']}", seen)

    def visit_named(item_id, path, seen):
        item = index.get(str(item_id))
        if item is None:
            return
        kind = kind_of(item)
        if kind in ("impl", "use"):
            if kind == "use":
                visit(item_id, path.rsplit("::", 1)[0], seen)
            return
        if kind != "module" or path.count("::") > 0:
            paths_of.setdefault(str(item_id), []).append(path)
        lines.add(f"{path} {kind}")
        if kind == "module":
            if str(item_id) in seen:
                return
            for child in item["inner"]["module"]["items"]:
                visit(child, path, seen | {str(item_id)})
        else:
            members(item, path)

    root = index[str(doc["root"])]
    name = root["name"]
    lines.add(f"{name} module")
    for child in root["inner"]["module"]["items"]:
        visit(child, name, {str(doc["root"])})
    dups = {i: p for i, p in paths_of.items() if len(p) > 1}
    return sorted(lines), dups


def main():
    args = sys.argv[1:]
    check = "--check" in args
    crates = [a for a in args if not a.startswith("--")] or CRATES
    os.makedirs(API_DIR, exist_ok=True)
    failed = False
    for crate in crates:
        lines, dups = listing(rustdoc_json(crate))
        for paths in dups.values():
            print(f"{crate}: one item at {len(paths)} paths: {', '.join(sorted(paths))}", file=sys.stderr)
        items = sum(1 for l in lines if " impl " not in l and l.split()[-1] not in ("variant", "field")
                    and "::" in l.split()[0] and not _member(l, lines))
        text = "".join(l + "\n" for l in lines)
        out = os.path.join(API_DIR, crate + ".txt")
        if check:
            old = open(out, encoding="utf-8").read() if os.path.exists(out) else ""
            if old != text:
                print(f"{crate}: the public API differs from {os.path.relpath(out, ROOT)}; "
                      f"run scripts/public_api.py and commit the listing", file=sys.stderr)
                failed = True
            if dups and crate in ONE_PATH:
                failed = True
        else:
            with open(out, "w", encoding="utf-8") as f:
                f.write(text)
        print(f"{crate}: {items} public items, {len(lines)} lines, {len(dups)} items at several paths")
    return 1 if failed else 0


def _member(line, lines):
    """Whether `line` is a member (method, assoc item) of a type or trait listed above it."""
    path = line.split()[0]
    parent = path.rsplit("::", 1)[0]
    return any(l.startswith(parent + " ") and l.split()[-1] in ("struct", "enum", "trait", "union")
               for l in lines)


if __name__ == "__main__":
    sys.exit(main())
