#!/usr/bin/env bash
# Client-side instructions per Redis decision, counted by callgrind (repeatable on a busy
# machine, unlike wall time): a bare `EVALSHA` of the Redis store's own limiter script
# against the Redis store (and the tiered store, for information), same script, same
# arguments, same kind of connection, one redis-server of their own.
#
#   scripts/callgrind_redis.sh                    # bare, store, tiered
#   scripts/callgrind_redis.sh bare store         # chosen kinds (also bare-cmd, bare-manager)
#   N=20000 ROWS=many scripts/callgrind_redis.sh  # decisions per run; 10 000 keys in turn
#
# Each kind runs `bench/redis_bench.rs` in its fixed-count mode (RK_COUNT, RK_KIND): one
# caller on a current-thread tokio runtime makes RK_WARM=200 decisions (not counted), then
# N decisions one after the other on one key (ROWS=many: 10 000 keys in turn). Quota
# 1 000 000/s with burst 10 000 000 and a 5 s deadline: every decision is allowed by Redis
# (none denied, none answered by the failure policy; the script checks both and fails
# otherwise), so each side does the same work every run.
#
# Two scopes, each its own run under `valgrind --tool=callgrind --toggle-collect`:
#
# - caller (the target): `counted_poll`, every poll of the caller's loop and all it calls
#   synchronously: building the command, the store's whole `check` (key names, negative
#   cache, breaker, deadline timer, metrics, `Decisions`), its link, handing the command to
#   the connection and reading the reply. The connection's driver task (the `redis` crate's
#   multiplexed pipeline task that writes the socket and parses replies) is NOT included:
#   it runs between the caller's polls, and it is the same code on both sides (the store's
#   link sends through the same `MultiplexedConnection`). Work the store does on its own
#   tasks per decision would not show here; it shows in the thread scope.
# - thread: `runtime_block`, everything the runtime thread does during the measured loop:
#   the caller, the connection's driver task, tokio's I/O and timer drivers (so a timer the
#   store arms per decision is counted here). It depends a little on timing (how often the
#   thread parks), so it varies more between runs than the caller scope.
#
# The bare side is what a user writes: `redis::Script::prepare_invoke`, `.key`/`.arg`,
# `invoke_async` on a `MultiplexedConnection` made with the store's settings and owned by
# the caller: the baseline of the ratios. For information: `bare-cmd`, the same command
# written by hand into one `redis::Cmd`, sent with `send_packed_command` and read as a
# `redis::Value` (the leanest client call, what the store itself does), and `bare-manager`,
# `redis::Script` on a cloned `ConnectionManager` (the bare side of `scripts/redis_bench.sh`).
#
# Needs valgrind and redis-server. KEEP=dir keeps each profile as dir/<kind>.<scope>.out
# (for callgrind_annotate).
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-10000}
ROWS=${ROWS:-hot}
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(bare store tiered)
for tool in valgrind redis-server bc; do
    command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

# Release code with line tables, so callgrind_annotate can name lines (as callgrind_http.sh).
target=${RK_CALLGRIND_TARGET:-target/callgrind}
CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_TARGET_DIR=$target \
    cargo build --release -q -p ratekeeper-bench --bin redis_bench >&2
bin=$target/release/redis_bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

declare -A per
printf '%-14s %-7s %14s %14s\n' kind scope instructions instr/decision
for kind in "${kinds[@]}"; do
    for scope in caller thread; do
        case $scope in
            caller) toggle='*counted_poll*' ;;
            thread) toggle='*runtime_block*' ;;
        esac
        out="$tmp/$kind.$scope.out"
        RK_COUNT=$N RK_KIND=$kind RK_ROWS=$ROWS valgrind --tool=callgrind \
            --toggle-collect="$toggle" --callgrind-out-file="$out" "$bin" \
            >"$tmp/stdout" 2>"$tmp/stderr" ||
            { echo "$kind: the run failed:" >&2; grep -v '^==' "$tmp/stderr" | tail -5 >&2; exit 1; }
        ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$tmp/stderr")
        grep -qx "$N of $N allowed" "$tmp/stdout" && grep -qx "0 degraded" "$tmp/stdout" ||
            { echo "$kind: expected $N of $N allowed and 0 degraded, got: $(cat "$tmp/stdout")" >&2; exit 1; }
        # A toggle function that never ran (inlined, or a tail jump) would count nothing.
        [ "${ir:-0}" -gt "$N" ] ||
            { echo "$kind: callgrind collected ${ir:-nothing} in $toggle" >&2; exit 1; }
        per[$kind.$scope]=$(echo "$ir / $N" | bc -l)
        printf '%-14s %-7s %14d %14.0f\n' "$kind" "$scope" "$ir" "${per[$kind.$scope]}"
        if [ -n "${KEEP:-}" ]; then
            mkdir -p "$KEEP"
            cp "$out" "$KEEP/$kind.$scope.out"
        fi
    done
done
if [ -n "${per[bare.caller]:-}" ]; then
    echo
    for kind in "${kinds[@]}"; do
        [ "$kind" = bare ] && continue
        for scope in caller thread; do
            printf '%s / bare (%s): %.2fx\n' "$kind" "$scope" \
                "$(echo "${per[$kind.$scope]} / ${per[bare.$scope]}" | bc -l)"
        done
    done
fi
