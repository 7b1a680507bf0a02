#!/usr/bin/env python3
"""Fails when a package in Cargo.lock declares a `rust-version` above the workspace's.

Reads `cargo metadata --locked` (every package the lock file resolves, all targets and
features) and compares each `rust_version` with `workspace.package.rust-version`, so a
`cargo update` cannot silently raise the minimum supported Rust version. Packages that
declare no `rust-version` are listed but not counted as failures.
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
            ["cargo", "metadata", "--format-version", "1", "--locked"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    members = set(meta["workspace_members"])
    ours = {p["rust_version"] for p in meta["packages"] if p["id"] in members}
    if len(ours) != 1 or None in ours:
        sys.exit(f"workspace members declare rust-version {sorted(map(str, ours))}, want one")
    msrv = ours.pop()
    resolved = {node["id"] for node in meta["resolve"]["nodes"]}
    above, undeclared = [], []
    for package in meta["packages"]:
        if package["id"] in members or package["id"] not in resolved:
            continue
        declared = package.get("rust_version")
        if declared is None:
            undeclared.append(f"{package['name']} {package['version']}")
        elif parse(declared) > parse(msrv):
            above.append(f"{package['name']} {package['version']} (rust-version {declared})")
    print(f"MSRV {msrv}: {len(resolved) - len(members)} locked packages checked")
    if undeclared:
        print(f"  {len(undeclared)} declare no rust-version (not checked)")
    if above:
        print(f"error: {len(above)} locked packages need a newer Rust than {msrv}:")
        for line in sorted(above):
            print(f"  {line}")
        sys.exit(1)


if __name__ == "__main__":
    main()
