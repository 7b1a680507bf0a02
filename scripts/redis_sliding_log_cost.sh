#!/usr/bin/env bash
# Server-side cost of one Redis sliding-log decision against the entries one key holds.
#
# Starts a throwaway redis-server on a free loopback port, fills one key with n entries
# (n = 1000, 4000, 16000; one unit each, all in the window), and runs 100 denied checks
# (cost 1 at limit n: the binary search for the entry that frees the room) through the
# Redis store's limiter script with EVALSHA. Reports Redis's own `usec_per_call` for
# EVALSHA (INFO commandstats: time inside the server, no network). Usage:
#
#   scripts/redis_sliding_log_cost.sh [git revision to compare, e.g. f5824c4]
#
# The revision's `limiter.lua` (a single file then, its op sent as the word `check`) is
# measured beside the working tree's script (assembled by the store from `lua/`, printed
# by `bench/print_script.rs`; its op sent as a number), in the
# same run and on the same server (f5824c4's members are "<ts>:<units>" before running
# totals).
set -euo pipefail
cd "$(dirname "$0")/.."

LUA=crates/ratekeeper-core/src/store/redis/limiter.lua
cargo build -q -p ratekeeper-bench --bin print_script >&2
TREE_SCRIPT=$("${CARGO_TARGET_DIR:-target}/debug/print_script" limiter)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
SERVER=$!
trap 'kill "$SERVER"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done

measure() { # label, script text, member format (2 or 3 fields), the check op's argument
    local label=$1 script=$2 fields=$3 op=$4 sha n
    sha=$(redis-cli -p "$PORT" SCRIPT LOAD "$script")
    for n in 1000 4000 16000; do
        redis-cli -p "$PORT" DEL k >/dev/null
        python3 - "$n" "$fields" <<'PY' | redis-cli -p "$PORT" >/dev/null
import sys
n, fields = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    member = f"{1000 + i}:1" + (f":{i + 1}" if fields == 3 else "")
    print(f"ZADD k {1000 + i} {member}")
PY
        redis-cli -p "$PORT" CONFIG RESETSTAT >/dev/null
        for _ in $(seq 1 100); do
            echo "EVALSHA $sha 1 k $((1000 + n)) '' $op 0 4 1000000000 $n 0 1 -1"
        done | redis-cli -p "$PORT" >/dev/null
        redis-cli -p "$PORT" INFO commandstats | tr -d '\r' |
            sed -n "s/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/| $label | $n | \1 |/p"
    done
}

echo "| script | entries | µs per denied check (server) |"
echo "|---|---|---|"
if [ $# -ge 1 ]; then
    measure "$1" "$(git show "$1:$LUA")" 2 check
fi
measure "working tree" "$TREE_SCRIPT" 3 1
