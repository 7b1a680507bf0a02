#!/usr/bin/env bash
# Puts limitador's published source in vendor/limitador (not committed), with RocksDB made
# optional: limitador 0.14.0 does not compile without its `disk_storage` feature, because two
# items its key encoding always uses (the `storage::keys::bin` module and
# `Counter::variables_for_key`) are gated on that feature. This removes those two `cfg`
# lines and nothing else; Cargo.toml's `[patch.crates-io]` builds limitador from here.
# The source comes through cargo (`cargo fetch` in a throwaway package), from crates.io.
set -euo pipefail
cd "$(dirname "$0")"
version=0.14.0
[ -f vendor/limitador/.prepared-$version ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src"
printf 'fn main() {}\n' >"$tmp/src/main.rs"
cat >"$tmp/Cargo.toml" <<TOML
[package]
name = "fetch-limitador"
version = "0.0.0"
edition = "2021"
[workspace]
[dependencies]
limitador = { version = "=$version", default-features = false }
TOML
(cd "$tmp" && cargo fetch -q)
manifest=$(cd "$tmp" && cargo metadata -q --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "limitador":
        print(p["manifest_path"])')
rm -rf vendor/limitador
mkdir -p vendor
cp -r "$(dirname "$manifest")" vendor/limitador
python3 - vendor/limitador <<'PY'
import sys
root = sys.argv[1]
gate = '#[cfg(feature = "disk_storage")]\n'
for path, follows in [("src/storage/keys.rs", "pub mod bin {"),
                      ("src/counter.rs", "    pub(crate) fn variables_for_key(")]:
    lines = open(f"{root}/{path}").read().splitlines(keepends=True)
    hits = [i for i, l in enumerate(lines[:-1])
            if l.strip() == gate.strip() and lines[i + 1].startswith(follows)]
    if len(hits) != 1:
        sys.exit(f"{path}: expected one disk_storage gate before {follows!r}, found {len(hits)}")
    del lines[hits[0]]
    open(f"{root}/{path}", "w").write("".join(lines))
PY
touch vendor/limitador/.prepared-$version
