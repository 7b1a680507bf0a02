#!/usr/bin/env bash
# The limitador library beside ratekeeper's stores, in one process (bench/limitador, a
# package of its own outside the workspace): decisions per second with concurrent callers,
# µs of Redis time per decision, and instructions per decision. Markdown tables on stdout.
#
#   scripts/limitador_bench.sh                       # 2 s per cell, 5 rounds, 16 callers
#   LB_SECS=3 LB_ROUNDS=7 scripts/limitador_bench.sh
#   LB_CELLS=redis LB_CALLGRIND=0 scripts/limitador_bench.sh
#   LB_PIN=1 scripts/limitador_bench.sh              # redis-server on CPU 1, the bench on CPU 0
#
# Starts its own redis-server on a free loopback port (stopped on exit). Each cell is one
# limiter driven by LB_CALLERS (default 16) tokio tasks on a multi-thread runtime for
# LB_SECS seconds, each call one decision for one of 1 000 keys in turn, cost 1, under a
# fixed window of 60 s: `loose` (1 000 000 per window: every call allowed) and `tight`
# (10 per window: nearly every call refused). limitador and ours take turns within each
# round (the order alternates); the tables show medians over the rounds, the ratio is the
# median of each round's ours / limitador. Redis time per decision is the usec / decisions
# of the script commands (`evalsha`, `fcall`) in `INFO commandstats`, reset before each cell;
# every other command a cell sends is reported on stderr.
#
# Instructions per decision (LB_CALLGRIND=1, the default; needs valgrind): one caller on a
# current-thread runtime, run twice under `valgrind --tool=callgrind` with LB_CG_SHORT and
# LB_CG_LONG decisions (default 2 000 and 12 000) after an unrecorded warm-up (every key
# present; under the tight limit, every key's window used up, so each counted decision is
# a refusal); the difference divided by the difference in decisions is the cost of one
# decision (setup, connection and warm-up cancel out). `client`: the whole bench process;
# `redis-server`: a redis-server of its own under callgrind collecting only inside the
# script commands (`--toggle-collect` on evalShaCommand, evalCommand, fcallCommand: the
# call, its Lua and every command the script runs).
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in redis-server redis-cli python3; do
    command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done
export LB_SECS=${LB_SECS:-2}
export LB_ROUNDS=${LB_ROUNDS:-5}
export LB_CALLERS=${LB_CALLERS:-16}
export LB_CELLS=${LB_CELLS:-memory,redis}
callgrind=${LB_CALLGRIND:-1}
short=${LB_CG_SHORT:-2000}
long=${LB_CG_LONG:-12000}
pin=${LB_PIN:-}
target=${CARGO_TARGET_DIR:-$PWD/bench/limitador/target}

bench/limitador/prepare.sh
(cd bench/limitador && CARGO_TARGET_DIR=$target nice cargo build -q --release)
bin=$target/release/limitador_cmp

tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_ping() {
    for _ in $(seq 1 1000); do
        redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
        sleep 0.02
    done
    echo "redis-server on port $1 did not start" >&2
    exit 1
}
redis_cpu=()
bench_cpu=()
if [ -n "$pin" ]; then
    command -v taskset >/dev/null || { echo "taskset is required for LB_PIN" >&2; exit 1; }
    redis_cpu=(taskset -c 1)
    bench_cpu=(taskset -c 0)
fi

port=$(free_port)
"${redis_cpu[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    >"$tmp/redis.log" 2>&1 &
pids+=("$!")
wait_ping "$port"
export LB_URL=redis://127.0.0.1:$port/

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "measuring: $LB_CELLS, $LB_ROUNDS rounds of $LB_SECS s per cell, $LB_CALLERS callers" >&2
"${bench_cpu[@]}" "$bin" >"$tmp/rate"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

if [ "$callgrind" = 1 ]; then
    command -v valgrind >/dev/null || { echo "valgrind is required (or LB_CALLGRIND=0)" >&2; exit 1; }
    for cell in ${LB_CELLS//,/ }; do
        for limit in loose tight; do
            for imp in limitador ours; do
                for n in "$short" "$long"; do
                    echo "counting $imp-$cell $limit, $n decisions" >&2
                    cport=$(free_port)
                    sout=$tmp/server.cg
                    valgrind --tool=callgrind --callgrind-out-file="$sout" \
                        --toggle-collect=fcallCommand --toggle-collect=evalShaCommand \
                        --toggle-collect=evalCommand \
                        redis-server --port "$cport" --bind 127.0.0.1 --save "" --appendonly no \
                        >"$tmp/redis-cg.log" 2>&1 &
                    cpid=$!
                    pids+=("$cpid")
                    wait_ping "$cport"
                    LB_MODE=count LB_IMPL="$imp-$cell" LB_LIMIT=$limit LB_COUNT="$n" \
                        LB_URL=redis://127.0.0.1:$cport/ \
                        valgrind --tool=callgrind --callgrind-out-file="$tmp/client.cg" \
                        "$bin" >/dev/null 2>"$tmp/valgrind.log"
                    redis-cli -p "$cport" shutdown nosave >/dev/null 2>&1 || true
                    wait "$cpid" || true
                    c=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$tmp/client.cg")
                    s=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$sout")
                    echo "$cell $limit $imp $n $c ${s:-0}" >>"$tmp/cg"
                done
            done
        done
    done
fi

echo "$(nproc) cores, $(uname -m), redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p');" \
    "load average $load_start at the start, $load_end at the end${pin:+; redis-server pinned to CPU 1, the bench to CPU 0}"
echo
python3 - "$tmp" "$LB_SECS" "$LB_ROUNDS" "$LB_CALLERS" "$short" "$long" <<'PY'
import os, statistics, sys
tmp, secs, rounds, callers, short, long_ = sys.argv[1:7]
short, long_ = int(short), int(long_)
rows = {}
order = []
for line in open(f"{tmp}/rate"):
    cell, limit, imp, rnd, dec, allowed, errors, took, calls, usec = line.split()
    key = (cell, limit)
    if key not in order:
        order.append(key)
    rows.setdefault(key, {}).setdefault(imp, {})[int(rnd)] = dict(
        rate=int(dec) / float(took), allowed=int(allowed) / max(int(dec), 1),
        errors=int(errors), calls=int(calls) / max(int(dec), 1),
        usec=int(usec) / max(int(dec), 1))
med = statistics.median
print(f"Decisions per second, {callers} callers, median of {rounds} rounds of {secs} s")
print()
print("| storage | limit | limitador /s | ours /s | ours / limitador | allowed (limitador, ours) | errors |")
print("|---|---|---:|---:|---:|---|---:|")
for cell, limit in order:
    t, o = rows[(cell, limit)]["limitador"], rows[(cell, limit)]["ours"]
    ratios = [o[r]["rate"] / t[r]["rate"] for r in t if r in o and t[r]["rate"] > 0]
    errors = sum(x["errors"] for x in list(t.values()) + list(o.values()))
    print(f"| {cell} | {limit} | {med(x['rate'] for x in t.values()):,.0f} | "
          f"{med(x['rate'] for x in o.values()):,.0f} | {med(ratios):.2f} | "
          f"{med(x['allowed'] for x in t.values()):.1%}, {med(x['allowed'] for x in o.values()):.1%} | {errors} |")
redis = [(c, l) for c, l in order if c == "redis"]
if redis:
    print()
    print("Redis time per decision (`INFO commandstats`, script commands: usec / decisions), median of the rounds")
    print()
    print("| limit | limitador µs | ours µs | ours / limitador | script calls per decision (limitador, ours) |")
    print("|---|---:|---:|---:|---|")
    for cell, limit in redis:
        t, o = rows[(cell, limit)]["limitador"], rows[(cell, limit)]["ours"]
        tu, ou = med(x["usec"] for x in t.values()), med(x["usec"] for x in o.values())
        print(f"| {limit} | {tu:.2f} | {ou:.2f} | {ou / tu if tu else float('nan'):.2f} | "
              f"{med(x['calls'] for x in t.values()):.2f}, {med(x['calls'] for x in o.values()):.2f} |")
if os.path.exists(f"{tmp}/cg"):
    cg = {}
    for line in open(f"{tmp}/cg"):
        cell, limit, imp, n, c, s = line.split()
        cg[(cell, limit, imp, int(n))] = (int(c), int(s))
    print()
    print(f"Instructions per decision (callgrind, one caller: ({long_:,} - {short:,} decisions) / {long_ - short:,})")
    print()
    print("| storage | limit | limitador client | ours client | ours / limitador | limitador redis-server | ours redis-server | ours / limitador |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for cell, limit in order:
        def per(imp, k):
            a, b = cg.get((cell, limit, imp, short)), cg.get((cell, limit, imp, long_))
            if not a or not b:
                return float("nan")
            return (b[k] - a[k]) / (long_ - short)
        tc, oc, ts, os_ = per("limitador", 0), per("ours", 0), per("limitador", 1), per("ours", 1)
        server = (f"{ts:,.0f} | {os_:,.0f} | {os_ / ts:.2f}" if cell == "redis" and ts > 0
                  else "- | - | -")
        print(f"| {cell} | {limit} | {tc:,.0f} | {oc:,.0f} | {oc / tc:.2f} | {server} |")
PY
