#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run runs exactly this), on this
# machine or a fresh Debian or Ubuntu one: the servers and Rust
# (scripts/setup.sh), then the format, the lints, the minimum supported
# Rust version, the dependency policy and every test, one line saying what
# each step does. A guard rail whose tool is missing (no network to fetch
# it) is skipped with a line saying so. Ends with `cargo test`, whose
# closing lines are the run's verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "==> $*"; }

step "servers and Rust, started or installed as needed (scripts/setup.sh)"
. scripts/setup.sh test
step "cargo fmt --check: the code's format"
cargo fmt --check
step "cargo clippy --all-targets --locked -- -D warnings: lints; --locked fails on a stale Cargo.lock"
cargo clippy --all-targets --locked -- -D warnings
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if command -v rustup >/dev/null && rustup toolchain list | grep "^$msrv-" >/dev/null; then
    step "cargo +$msrv check --locked --all-targets: the minimum supported Rust version still builds everything"
    cargo "+$msrv" check --locked --all-targets
else
    step "skipped: the MSRV check (cargo +$msrv check), no Rust $msrv toolchain (scripts/setup.sh test installs it with rustup)"
fi
if command -v cargo-deny >/dev/null; then
    # Not advisories: their database cannot be fetched here (deny.toml).
    step "cargo deny check bans licenses sources: the dependency policy of deny.toml"
    cargo deny --locked check --hide-inclusion-graph bans licenses sources
else
    step "skipped: cargo deny, not installed (scripts/setup.sh test builds it: cargo install --locked cargo-deny)"
fi
if command -v mdbook >/dev/null; then
    step "mdbook build docs: the guide renders (into a scratch directory)"
    book=$(mktemp -d)
    mdbook build docs --dest-dir "$book"
    rm -rf "$book"
else
    step "skipped: mdbook build, not installed (not needed: tests/readme.rs checks the book's links and anchors)"
fi
step "cargo test: every test (a first run builds the dependencies first)"
cargo test
