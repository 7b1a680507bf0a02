#!/usr/bin/env bash
# Redis time per decision: the µs redis-server spends running the Redis store's script for
# one decision (`INFO commandstats`: usec / calls of fcall, evalsha and eval), per algorithm
# and per number of policies charged in one call. Redis runs every instance's decisions on
# one thread: this is what bounds the decisions per second one Redis serves.
#
#   scripts/redis_server_time.sh                 # the work tree
#   scripts/redis_server_time.sh main            # main, then the work tree, same server
#   RK_COUNT=20000 scripts/redis_server_time.sh  # decisions per cell (default 5000)
#   RK_ALGOS=gcra RK_POLICIES=1,4 scripts/redis_server_time.sh
#   RK_ROUNDS=5 scripts/redis_server_time.sh main   # 5 rounds (default 3), each cell its least
#
# Starts its own redis-server on a free loopback port (stopped on exit) and runs
# `bench/redis_server_time.rs` once per tree against it: each cell has its own store and
# key prefix, warms up, resets the server's statistics, then makes RK_COUNT decisions on
# 1 000 keys in turn (every one allowed: the common path). Each git ref given is checked
# out in a temporary worktree with this tree's bench binary copied in (it uses the public
# store API only), built in debug (the client's speed does not enter Redis time) in
# $CARGO_TARGET_DIR (default target/), one tree after the other. The trees take turns,
# RK_ROUNDS times; each cell shows its least µs over the rounds (Redis measures wall time
# around each call, so a busy machine only ever adds to it).
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in redis-server redis-cli python3; do
    command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done
export RK_ALGOS=${RK_ALGOS:-gcra,leaky_bucket,fixed_window,sliding_window,sliding_log}
export RK_POLICIES=${RK_POLICIES:-1,2,4}
export RK_COUNT=${RK_COUNT:-5000}
rounds=${RK_ROUNDS:-3}
target=${CARGO_TARGET_DIR:-$PWD/target}

tmp=$(mktemp -d)
pid=""
worktrees=()
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    for w in "${worktrees[@]}"; do git worktree remove --force "$w" >/dev/null 2>&1 || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# Build every tree first (refs given, then the work tree).
trees=()
labels=()
for ref in "$@"; do
    dir=$tmp/tree-${#trees[@]}
    git worktree add --detach -q "$dir" "$ref"
    worktrees+=("$dir")
    cp bench/redis_server_time.rs "$dir/bench/"
    # Its manifest with this binary added (the tree's other binaries as they are).
    if ! grep -q 'name = "redis_server_time"' "$dir/bench/Cargo.toml"; then
        printf '\n[[bin]]\nname = "redis_server_time"\npath = "redis_server_time.rs"\n' \
            >>"$dir/bench/Cargo.toml"
    fi
    trees+=("$dir")
    labels+=("$ref")
done
trees+=("$PWD")
labels+=("work tree")
bins=()
for i in "${!trees[@]}"; do
    echo "building ${labels[$i]}" >&2
    (cd "${trees[$i]}" && CARGO_TARGET_DIR=$target nice cargo build -q -p ratekeeper-bench --bin redis_server_time >&2)
    cp "$target/debug/redis_server_time" "$tmp/bin-$i"
    bins+=("$tmp/bin-$i")
done

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$tmp/redis.log" 2>&1 &
pid=$!
for _ in $(seq 1 500); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.01
done
export RK_URL=redis://127.0.0.1:$port/

for round in $(seq 1 "$rounds"); do
    for i in "${!trees[@]}"; do
        echo "measuring ${labels[$i]}, round $round of $rounds" >&2
        redis-cli -p "$port" flushall >/dev/null
        redis-cli -p "$port" function flush >/dev/null 2>&1 || true
        "${bins[$i]}" >>"$tmp/out-$i"
    done
done

echo "redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), $(nproc) cores, $(uname -m); $RK_COUNT decisions per cell, least of $rounds rounds, µs of Redis time per decision"
python3 - "$tmp" "${labels[@]}" <<'PY'
import sys
tmp, labels = sys.argv[1], sys.argv[2:]
cells, order = {}, []
for i, _ in enumerate(labels):
    for line in open(f"{tmp}/out-{i}"):
        algo, p, calls, usec, per = line.split()
        if (algo, p) not in order:
            order.append((algo, p))
        cells[(i, algo, p)] = min(float(per), cells.get((i, algo, p), float("inf")))
print("| algorithm | policies | " + " | ".join(labels) + " |")
print("|---|---:|" + "---:|" * len(labels))
for algo, p in order:
    vals = [f"{cells[(i, algo, p)]:.1f}" if (i, algo, p) in cells else "-" for i in range(len(labels))]
    print(f"| {algo} | {p} | " + " | ".join(vals) + " |")
PY
