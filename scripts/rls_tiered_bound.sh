#!/usr/bin/env bash
# The tiered store's over-admission bound, over 60 s: three ratekeeper-rls processes on
# `--store tiered` (TIERED_MAX_LEASE=5) and one redis-server, offered three times a limit of
# 100 per 2 s window; prints the most admitted in one window of Redis time, which must stay
# within 100 + 3 x 5 = 115. The test suite runs the same test for 6 s.
#
# Usage: scripts/rls_tiered_bound.sh [seconds]   (default 60; needs redis-server on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
RLS_TIERED_SECS="${1:-60}" exec cargo test -p ratekeeper-rls --test extensions \
  tiered::three_tiered_replicas_admit_at_most_the_limit_plus_their_leases -- --exact --nocapture
