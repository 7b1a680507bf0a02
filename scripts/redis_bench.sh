#!/usr/bin/env bash
# Decisions per second on one redis-server, side by side in one run: the bare GCRA script
# (EVALSHA from a plain redis client), the Redis store and the tiered (lease) store, on one
# hot key and on 10 000 keys, with 1 and 64 concurrent callers, plus the share of decisions
# that needed a round trip. Prints a markdown table (BENCHMARKS.md, "Redis store: round trip
# and throughput").
#
#   scripts/redis_bench.sh                  # 1 round, 2 s per cell
#   RK_ROUNDS=3 RK_SECS=2 scripts/redis_bench.sh   # median of 3 interleaved rounds
#
# The binary starts its own redis-server on a free loopback port (needs redis-server:
# apt-get install redis-server) and kills it on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ratekeeper-bench --bin redis_bench
bin="${CARGO_TARGET_DIR:-target}/release/redis_bench"
redis-server --version
"$bin"
