#!/usr/bin/env bash
# The overload harness: an axum service with a fixed capacity (16 workers, 40 ms per request:
# 400 req/s, halved to 200 req/s in the middle of every run) loaded on loopback at 1x, 2x and
# 4x its capacity, behind no limiter, tower's ConcurrencyLimit + LoadShed (hand-tuned to 16),
# tower-acc's Gradient2 and ratekeeper's AdaptiveConcurrencyLayer (without and with
# critical 0.9 / sheddable 0.1 partitions). Prints a Markdown table (goodput, p99 of admitted
# requests, shed and timed-out shares, critical goodput, recovery and settle times), each
# target met or not, and the load average. See bench/overload.rs for what each column means.
#
#   scripts/overload.sh                                  # every mode, 1x 2x 4x: about 5 minutes
#   MODES=adaptive,tower LOADS=4 PHASE_S=5 scripts/overload.sh
#   OUT=overload.md scripts/overload.sh                  # also write the output to a file
#
# Settings (environment): MODES, LOADS, WARMUP_S (3), PHASE_S (8), CALIBRATE_S (5), TRACE=1
# (the adaptive limit every 50 ms on stderr). Bounded in time: each run lasts
# WARMUP_S + 2 * PHASE_S and every request times out after 2 s.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p ratekeeper-bench --bin overload >&2
bin=${CARGO_TARGET_DIR:-target}/release/overload
if [ -n "${OUT:-}" ]; then
    timeout 1800 "$bin" | tee "$OUT"
else
    timeout 1800 "$bin"
fi
