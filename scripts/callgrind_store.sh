#!/usr/bin/env bash
# Instructions per check of the memory store and of governor's keyed limiter, counted by
# callgrind (repeatable on a busy machine, unlike wall time).
#
#   scripts/callgrind_store.sh [case...]     # default: every case below
#
# Each case runs the `memory_store` bench binary in its fixed-count mode (RK_BENCH_CASE,
# RK_BENCH_ITERS) and counts only the measured loop (--toggle-collect), so setup, key
# insertion and clock calibration are left out. Prints instructions per check.
#
# Deterministic: in this mode the allow quota is 1 per hour (burst 4 000 000), so no key goes
# idle during a run however slowly valgrind runs it, the memory store never sweeps and
# re-inserts a key, and both sides do the same work each run. Each case must give its
# verdict on every measured check (allow: all N allowed, deny: none), or the script fails.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-200000}
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
    for g in allow-hot allow-many deny-hot deny-many; do
        for l in governor-u64 ratekeeper-u64 governor-IpAddr ratekeeper-Key governor+foldhash-u64; do
            cases+=("$g/$l")
        done
    done
fi

bin=$(cargo bench -p ratekeeper-core --bench memory_store --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*memory_store[^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "bench binary not found" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-34s %12s\n' case instr/check
for c in "${cases[@]}"; do
    ir=$(RK_BENCH_CASE=$c RK_BENCH_ITERS=$N valgrind --tool=callgrind \
        --toggle-collect='*measured_loop*' --callgrind-out-file="$tmp/out" "$bin" 2>&1 >"$tmp/stdout" |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
    case $c in allow-*) want=$N ;; *) want=0 ;; esac
    grep -qx "$want of $N allowed" "$tmp/stdout" ||
        { echo "$c: expected $want of $N allowed, got: $(cat "$tmp/stdout")" >&2; exit 1; }
    printf '%-34s %12.1f\n' "$c" "$(echo "$ir / $N" | bc -l)"
done
