#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ (libFuzzer, nightly toolchain), each for a bounded
# time, one after the other. The same generators and properties run on stable, seeded and
# bounded, in `cargo test -p ratekeeper-tests --test sweep`.
#
#   scripts/fuzz.sh                 # every target, 60 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh refund_receipts layer_trace
#
# Needs `cargo +nightly` and cargo-fuzz (installed with `cargo install cargo-fuzz` when
# missing). A failing input is saved under fuzz/artifacts/<target>/ and the script stops
# with status 1 naming it; replay it with `cd fuzz && cargo +nightly fuzz run <target> <file>`.
# The corpus each run grows is kept in fuzz/corpus/<target>/ (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${FUZZ_SECONDS:-60}
case $seconds in
    '' | *[!0-9]*) echo "FUZZ_SECONDS must be a whole number of seconds, got '$seconds'" >&2; exit 2 ;;
esac

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "the nightly toolchain is missing: rustup toolchain install nightly" >&2
    exit 2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz (cargo install cargo-fuzz)"
    cargo install cargo-fuzz
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

for t in "${targets[@]}"; do
    echo "== $t: ${seconds} s"
    mkdir -p "corpus/$t"
    if ! cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1; then
        echo "== $t FAILED: the input is in fuzz/artifacts/$t/ (replay: cd fuzz && cargo +nightly fuzz run $t <file>)" >&2
        exit 1
    fi
done
echo "== every target ran ${seconds} s without a finding"
