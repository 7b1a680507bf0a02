#!/usr/bin/env python3
"""Fails when a locked dependency declares a `rust-version` above that of a workspace crate
that depends on it.

Each workspace member has its own minimum supported Rust version (the library crates 1.85,
ratekeeper-rls 1.88 for envoy-types). Reads `cargo metadata --locked --all-features` (every
package the lock file resolves, all targets and features) and, for each member, walks its
dependencies (its own normal, build and dev dependencies, then theirs: normal and build) and
compares each package's `rust_version` with the member's. So a `cargo update` cannot silently
raise a crate's minimum supported Rust version. Packages that declare no `rust-version` are
listed but not counted as failures.
"""
import json
import subprocess
import sys


def parse(version):
    """`1.85` and `1.85.0` alike: (1, 85, 0)."""
    parts = [int(part) for part in version.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    members = set(meta["workspace_members"])
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {node["id"]: node for node in meta["resolve"]["nodes"]}

    def deps(package_id, with_dev):
        for dep in nodes[package_id]["deps"]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            if None in kinds or "build" in kinds or (with_dev and "dev" in kinds):
                yield dep["pkg"]

    failed = False
    undeclared = set()
    for member in sorted(members, key=lambda i: packages[i]["name"]):
        name = packages[member]["name"]
        msrv = packages[member].get("rust_version")
        if msrv is None:
            sys.exit(f"workspace member {name} declares no rust-version")
        seen, stack = set(), list(deps(member, with_dev=True))
        while stack:
            package_id = stack.pop()
            if package_id in seen:
                continue
            seen.add(package_id)
            stack.extend(deps(package_id, with_dev=False))
        above = []
        for package_id in seen:
            package = packages[package_id]
            declared = package.get("rust_version")
            label = f"{package['name']} {package['version']}"
            if declared is None:
                if package_id not in members:
                    undeclared.add(label)
            elif parse(declared) > parse(msrv):
                above.append(f"{label} (rust-version {declared})")
        print(f"{name} (rust-version {msrv}): {len(seen)} locked dependencies checked")
        if above:
            failed = True
            print(f"error: {len(above)} dependencies of {name} need a newer Rust than {msrv}:")
            for line in sorted(above):
                print(f"  {line}")
    if undeclared:
        print(f"  {len(undeclared)} dependencies declare no rust-version (not checked)")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
