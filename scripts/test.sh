#!/usr/bin/env bash
# Runs every test of the workspace: the README's test command, and what .ci/run calls.
#
#   scripts/test.sh                 # every test
#   scripts/test.sh --test b26_e2e  # extra arguments go to `cargo test`
#
# The Redis tests start their own redis-server processes on free loopback ports and fail (not
# skip) without one, so this installs redis-server and redis-cli from Debian's packages when
# they are missing (as root, or through sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    echo "== installing redis-server and redis-tools (the Redis tests need them)" >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools
fi

exec cargo test --workspace --all-features "$@"
