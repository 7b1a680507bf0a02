#!/usr/bin/env bash
# Open-loop latency of the rate limit service (ratekeeper-rls) beside a null handler: each
# server in turn on free loopback ports, loaded by bench/rls_load.rs at each rate (requests
# scheduled on a timeline, latency from the scheduled send), one markdown table at the end
# (server x rate -> achieved, p50, p99, p99.9, max, errors, sustained).
#
#   scripts/rls_bench.sh                                  # 10 s per cell, 2k/5k/10k/20k per s
#   RLS_SECS=3 RLS_RATES="2000 10000" scripts/rls_bench.sh
#   RLS_SERVERS="null memory" RLS_KEYS=1 scripts/rls_bench.sh
#
# Servers (RLS_SERVERS, default all): null (bench/rls_null.rs: answers OK without work, the
# machine's gRPC ceiling), memory, redis and tiered (ratekeeper-rls --store ...). Redis and
# tiered share one redis-server started on a free loopback port (needs redis-server:
# apt-get install redis-server), flushed between them. Every server gets the same config
# (one rule per `user` value, 1 000 000 per second: never reached, so every answer is OK).
# RLS_KEYS (default 100) distinct `user` values, RLS_CONNECTIONS (default 4) gRPC
# connections, RLS_WARMUP (default 1) unrecorded seconds before each cell. Every process
# started here is killed on exit, and each load run is bounded by `timeout`.
#
# RLS_PIN=1 pins with taskset: the server and redis-server to CPU 0, rls_load to CPU 1.
# For redis and tiered, the Redis time per script call is read from `INFO commandstats`
# (usec / calls of fcall and evalsha, reset when the server starts) over all of its cells,
# warm-up included, and printed after the latency table.
set -euo pipefail
cd "$(dirname "$0")/.."

RATES="${RLS_RATES:-2000 5000 10000 20000}"
SECS="${RLS_SECS:-10}"
WARMUP="${RLS_WARMUP:-1}"
KEYS="${RLS_KEYS:-100}"
CONNS="${RLS_CONNECTIONS:-4}"
SERVERS="${RLS_SERVERS:-null memory redis tiered}"
server_cpu=()
load_cpu=()
if [ -n "${RLS_PIN:-}" ]; then
    server_cpu=(taskset -c 0)
    load_cpu=(taskset -c 1)
fi

nice cargo build --release -q -p ratekeeper-bench --bin rls_load --bin rls_null
nice cargo build --release -q -p ratekeeper-rls --bin ratekeeper-rls
bin="${CARGO_TARGET_DIR:-target}/release"

work="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_port() {
    for _ in $(seq 1 400); do
        if (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
            return 0
        fi
        sleep 0.05
    done
    echo "rls_bench: nothing listens on port $1" >&2
    return 1
}

cat >"$work/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000000
EOF

redis_port=""
start_redis() {
    redis_port="$(free_port)"
    "${server_cpu[@]}" redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
        >"$work/redis.log" 2>&1 &
    pids+=("$!")
    wait_port "$redis_port"
}

# Starts server $1 on a free port; sets $server_pid and $server_port.
start_server() {
    server_port="$(free_port)"
    case "$1" in
    null)
        "${server_cpu[@]}" "$bin/rls_null" --grpc "127.0.0.1:$server_port" >"$work/null.log" 2>&1 &
        ;;
    memory | redis | tiered)
        local store=(--store "$1")
        if [ "$1" != memory ]; then
            [ -n "$redis_port" ] || start_redis
            redis-cli -p "$redis_port" flushall >/dev/null
            redis-cli -p "$redis_port" config resetstat >/dev/null
            store+=(--redis "redis://127.0.0.1:$redis_port")
        fi
        "${server_cpu[@]}" "$bin/ratekeeper-rls" --config "$work/bench.yaml" \
            --grpc "127.0.0.1:$server_port" --http "127.0.0.1:$(free_port)" \
            --debug "127.0.0.1:$(free_port)" "${store[@]}" >"$work/$1.log" 2>&1 &
        ;;
    *)
        echo "rls_bench: unknown server $1 (null, memory, redis, tiered)" >&2
        exit 1
        ;;
    esac
    server_pid="$!"
    pids+=("$server_pid")
    wait_port "$server_port"
}

echo "# $(date -u +%FT%TZ), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
results="$work/results.tsv"
for server in $SERVERS; do
    start_server "$server"
    for rate in $RATES; do
        timeout "$((SECS * 3 + WARMUP + 30))" "${load_cpu[@]}" "$bin/rls_load" --addr "127.0.0.1:$server_port" \
            --rate "$rate" --duration "$SECS" --warmup "$WARMUP" --keys "$KEYS" \
            --connections "$CONNS" --label "$server" --tsv | tee -a "$results" >&2
    done
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null || true
    if [ "$server" != memory ] && [ "$server" != null ]; then
        redis-cli -p "$redis_port" info commandstats | tr -d '\r' | awk -F'[:,=]' -v s="$server" '
            /^cmdstat_(fcall|fcall_ro|evalsha|evalsha_ro|eval|eval_ro):/ { calls += $3; usec += $5 }
            END { printf "%s\t%d\t%d\n", s, calls, usec }' >>"$work/redis_time.tsv"
    fi
done

echo "# after: load $(cut -d' ' -f1-3 /proc/loadavg); $SECS s per cell, $KEYS key(s), $CONNS connection(s)${RLS_PIN:+; server and redis-server on CPU 0, rls_load on CPU 1}"
echo "| server | target /s | achieved /s | p50 ms | p99 ms | p99.9 ms | max ms | errors | sustained |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }' "$results"
if [ -s "$work/redis_time.tsv" ]; then
    echo
    echo "Redis time per script call (INFO commandstats: fcall, evalsha), every cell of the server"
    echo
    echo "| server | script calls | usec | µs per call |"
    echo "|---|---:|---:|---:|"
    awk -F'\t' '{ printf "| %s | %d | %d | %.1f |\n", $1, $2, $3, ($2 ? $3 / $2 : 0) }' "$work/redis_time.tsv"
fi
