#!/usr/bin/env bash
# The test suite, from a fresh Debian/Ubuntu machine: the servers the tests
# talk to (started, or installed, as needed), the style and lint checks,
# then every test. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
tests/setup.sh
if [ -f "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
cargo fmt --check
# --locked here fails the run if Cargo.lock is stale, before any test.
cargo clippy --all-targets --locked -- -D warnings
cargo test
