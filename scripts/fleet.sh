#!/usr/bin/env bash
# The fleet harness: N app instances (tasks with their own Redis store handles) share one
# quota through a real redis-server (or a 3 + 3 Redis Cluster) while a fault is injected:
# kill -9 an instance, SIGSTOP Redis 200 ms, restart Redis, kill the Cluster primary holding
# the key. Offered load 2x the quota (200/s, burst 20, one key); admitted units counted in
# every sliding 1 s window. Prints the markdown table of BENCHMARKS.md ("Fleet harness").
#
#   scripts/fleet.sh                         # the whole table (about 5 minutes)
#   scripts/fleet.sh tiered                  # the same faults on the tiered store (no Cluster)
#   scripts/fleet.sh reset                   # an operator's reset under load, both stores
#   scripts/fleet.sh one 4 fail-soft pause   # one run (one-tiered: on the tiered store)
#   FLEET_TRACE=1 RUST_LOG=ratekeeper_core=debug scripts/fleet.sh one 4 fail-soft kill-primary
#                                            # per-100 ms outcomes and the stores' log on stderr
#   scripts/fleet.sh flood                   # 8 instances, 12 000 checks/s against 1 000/s
#   RK_PROFILE=dev scripts/fleet.sh          # a debug build (no release build needed)
#
# Needs redis-server and redis-cli (apt-get install redis-server redis-tools); every server
# is started on free loopback ports and killed at the end of its run.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${RK_PROFILE:-release}"
if [ "$profile" = release ]; then
  cargo build --release -q -p ratekeeper-tests --bin fleet
else
  cargo build -q -p ratekeeper-tests --bin fleet
  profile=debug
fi
bin="${CARGO_TARGET_DIR:-target}/$profile/fleet"
redis-server --version
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$#" -eq 0 ]; then set -- table; fi
"$bin" "$@"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
