#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run runs exactly this), on this
# machine or a fresh Debian or Ubuntu one: the servers and Rust
# (scripts/setup.sh), then the format, the lints and every test, one line
# saying what each step does. Ends with `cargo test`, whose closing lines
# are the run's verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "==> $*"; }

step "servers and Rust, started or installed as needed (scripts/setup.sh)"
. scripts/setup.sh
step "cargo fmt --check: the code's format"
cargo fmt --check
step "cargo clippy --all-targets --locked -- -D warnings: lints; --locked fails on a stale Cargo.lock"
cargo clippy --all-targets --locked -- -D warnings
step "cargo test: every test (a first run builds the dependencies first)"
cargo test
