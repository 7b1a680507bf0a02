#!/usr/bin/env bash
# User-space instructions per HTTP request of bench/bench_server.rs, per mode, counted by
# callgrind: repeatable on a busy machine, unlike wall-clock req/s. Kernel TCP work is not
# counted, so this is the layer's cost, not a throughput ratio.
#
#   scripts/callgrind_http.sh                 # every ratekeeper mode and its floors
#   scripts/callgrind_http.sh bare allow      # chosen modes
#
# Each mode starts the server under callgrind, sends two requests (the reject modes spend
# their unit), warms it up with at least $WARMUP requests, zeroes the counters, loads it with
# `wrk -t1 -c8` for $DURATION seconds, dumps and divides the instructions by the requests wrk
# counted. Needs valgrind, wrk and curl.
#
# The warm-up passes the layer's proxy-header watch (the first 4 096 requests from a private
# peer look for forwarding headers): counted, its cost would be spread over however many
# requests the run happens to count, from about 40 to 250 instructions per request with the
# machine's load.
# KEEP=dir keeps each mode's profile as dir/<mode>.callgrind (for callgrind_annotate).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-6}
WARMUP=${WARMUP:-4200}
PORT=${PORT:-38181}
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(bare noop headers_min headers allow allow_info allow_outer reject reject_outer)
for tool in valgrind callgrind_control wrk curl; do
    command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

# Release code with symbols and line tables, so callgrind_annotate can name functions.
CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_TARGET_DIR=target/callgrind \
    cargo build --release -p ratekeeper-bench --bin bench_server >&2
server=target/callgrind/release/bench_server
tmp=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
url="http://127.0.0.1:$PORT/"

printf '%-18s %10s %12s %14s\n' mode requests instructions instr/request
for mode in "${modes[@]}"; do
    MODE=$mode ADDR=127.0.0.1:$PORT valgrind --tool=callgrind --callgrind-out-file="$tmp/$mode.out" \
        "$server" >"$tmp/$mode.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do
        grep -q '^listening on' "$tmp/$mode.log" && break
        sleep 0.1
    done
    grep -q '^listening on' "$tmp/$mode.log" || { echo "server ($mode) did not start" >&2; cat "$tmp/$mode.log" >&2; exit 1; }
    curl -s -o /dev/null "$url"
    curl -s -o /dev/null "$url"
    warmed=0
    while [ "$warmed" -lt "$WARMUP" ]; do
        sent=$(wrk -t1 -c8 -d2s "$url" | awk '/requests in/ {print $1}')
        [ "${sent:-0}" -gt 0 ] || { echo "warm-up ($mode) got no answer" >&2; exit 1; }
        warmed=$((warmed + sent))
    done
    callgrind_control -z "$pid" >/dev/null 2>&1
    requests=$(wrk -t1 -c8 -d"${DURATION}s" "$url" | awk '/requests in/ {print $1}')
    callgrind_control -d "$pid" >/dev/null 2>&1
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
    # The dump after zeroing holds the measured part; the final one (at exit) the shutdown.
    dump=$(ls -t "$tmp/$mode.out"* | grep -v "\.out$" | head -1)
    instr=$(awk '/^summary:/ {print $2}' "$dump")
    printf '%-18s %10s %12s %14.0f\n' "$mode" "$requests" "$instr" "$(echo "$instr / $requests" | bc -l)"
    if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$dump" "$KEEP/$mode.callgrind"; fi
done
