#!/usr/bin/env bash
# The test suite, from a fresh Debian/Ubuntu machine: the servers the tests
# talk to (started, or installed, as needed), then every test.
set -euo pipefail
cd "$(dirname "$0")/.."
tests/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
cargo test "$@"
