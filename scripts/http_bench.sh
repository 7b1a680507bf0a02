#!/usr/bin/env bash
# HTTP load comparison on loopback: bare axum vs the same app behind ratekeeper's layer
# (nothing rejected / everything rejected), with tower_governor for reference.
#
#   scripts/http_bench.sh                 # 5 rounds x every mode x 10 s
#   ROUNDS=3 DURATION=5 scripts/http_bench.sh bare allow reject
#
# The server (bench/bench_server.rs, one tokio worker) is pinned to CPU $SERVER_CPU and
# wrk to CPU $CLIENT_CPU with taskset. Modes run interleaved (A B C A B C ...; the order
# rotates every round) so drift from other load on the machine hits every mode alike. Each
# run starts a fresh server, checks the expected status (200 or 429), warms up for 1 s and
# then measures. Prints every run, the median req/s per mode, the ratio of medians vs bare,
# the median of the per-round ratios vs bare (paired, more robust to drift), and each mode's
# best round with its ratio to bare's best (other load only ever slows a run down).
#
# It also reads the server's CPU time (utime + stime from /proc/<pid>/stat) around each run
# and prints requests per server CPU-second: with the server saturating its core this is the
# throughput it would reach alone, and it is far less sensitive to other processes taking the
# CPUs than wall-clock req/s (a descheduled server accrues no CPU time).
#
# Needs wrk (Debian: apt-get install -y wrk), curl and taskset.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-32}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PORT=${PORT:-38080}
MODES=("$@")
[ ${#MODES[@]} -gt 0 ] || MODES=(bare noop headers_min headers allow allow_info allow_outer reject reject_outer governor_allow governor_reject)

for tool in wrk curl taskset bc; do
    command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

cargo build --release -p ratekeeper-bench --bin bench_server >&2
server=${CARGO_TARGET_DIR:-target}/release/bench_server
url="http://127.0.0.1:$PORT/"
results=$(mktemp)
log=$(mktemp)
pid=
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    rm -f "$results" "$log"
}
trap cleanup EXIT

CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { # pid -> utime + stime in clock ticks (fields 14 and 15; comm has no spaces here)
    awk '{print $14 + $15}' "/proc/$1/stat"
}

expected_status() {
    case $1 in
        *reject*) echo 429 ;;
        *) echo 200 ;;
    esac
}

run_one() { # mode round
    local mode=$1 round=$2
    MODE=$mode ADDR=127.0.0.1:$PORT taskset -c "$SERVER_CPU" "$server" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        grep -q '^listening on' "$log" && break
        sleep 0.05
    done
    grep -q '^listening on' "$log" || { echo "server ($mode) did not start:" >&2; cat "$log" >&2; exit 1; }
    # The first request spends the reject modes' only unit; the second shows the steady state.
    curl -s -o /dev/null "$url"
    local status
    status=$(curl -s -o /dev/null -w '%{http_code}' "$url")
    if [ "$status" != "$(expected_status "$mode")" ]; then
        echo "mode $mode answered $status, expected $(expected_status "$mode")" >&2
        exit 1
    fi
    taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNECTIONS" -d1s "$url" >/dev/null
    local out rps non2xx requests cpu0 cpu1 per_cpu
    cpu0=$(cpu_ticks "$pid")
    out=$(taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "$url")
    cpu1=$(cpu_ticks "$pid")
    rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
    requests=$(awk '/requests in/ {print $1}' <<<"$out")
    non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
    per_cpu=$(echo "$requests * $CLK_TCK / ($cpu1 - $cpu0)" | bc -l)
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
    printf 'round %d  %-16s %10.0f req/s %10.0f req/CPU-s  non-2xx: %s\n' \
        "$round" "$mode" "$rps" "$per_cpu" "${non2xx:-0}" >&2
    echo "$round $mode $rps $per_cpu" >>"$results"
}

n=${#MODES[@]}
for round in $(seq "$ROUNDS"); do
    for i in $(seq 0 $((n - 1))); do
        run_one "${MODES[$(((i + round - 1) % n))]}" "$round"
    done
done

echo
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "wrk -t1 -c$CONNECTIONS -d${DURATION}s, $ROUNDS rounds, server on CPU $SERVER_CPU, wrk on CPU $CLIENT_CPU"
printf '%-16s %12s %8s %8s %14s %8s %12s %8s\n' mode 'req/s' 'ratio' 'paired' 'req/CPU-s' 'ratio' \
    'best req/s' 'ratio'
median() { sort -g | awk '{v[NR]=$1} END {if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
col() { awk -v m="$1" -v c="$2" '$2==m {print $c}' "$results" | median; }
# Other load on the machine only ever slows a run down, so each mode's best round is the
# least disturbed estimate of what it can do.
best() { awk -v m="$1" '$2==m {print $3}' "$results" | sort -g | tail -1; }
bare=$(col bare 3)
bare_cpu=$(col bare 4)
bare_best=$(best bare)
for mode in "${MODES[@]}"; do
    m=$(col "$mode" 3)
    c=$(col "$mode" 4)
    b=$(best "$mode")
    paired=$(awk -v m="$mode" '$2=="bare" {b[$1]=$3} $2==m {x[$1]=$3}
        END {for (r in x) if (r in b) print x[r]/b[r]}' "$results" | median)
    if [ -n "$bare" ]; then
        printf '%-16s %12.0f %8.3f %8.3f %14.0f %8.3f %12.0f %8.3f\n' "$mode" "$m" \
            "$(echo "$m / $bare" | bc -l)" "${paired:-0}" "$c" "$(echo "$c / $bare_cpu" | bc -l)" \
            "$b" "$(echo "$b / $bare_best" | bc -l)"
    else
        printf '%-16s %12.0f %8s %8s %14.0f %8s %12.0f %8s\n' "$mode" "$m" - - "$c" - "$b" -
    fi
done
