#!/usr/bin/env bash
# What the tests and the demo need, made ready: PostgreSQL and RabbitMQ
# (started when they are stopped and, on Debian or Ubuntu, installed with apt
# when they are absent), promtool, then libpq's headers and a Rust toolchain (installed
# with rustup when cargo is missing or older than this crate's rust-version:
# Debian's own cargo is too old). Safe to run again and again; silent when all is ready.
#
# scripts/test.sh and scripts/demo.sh source this file, so that a Rust it
# has just installed is on their PATH for their next step. With the argument
# `rust` it sets up Rust alone (scripts/deb.sh needs no server); with `test`,
# also the tools of test.sh's guard rails (the MSRV toolchain, cargo-deny).
#
# Servers named by TEST_DATABASE_URL / TEST_AMQP_URL are left alone: they
# are someone else's to run.
set -euo pipefail

say() { echo "setup: $*"; }
fail() { echo "setup: $*" >&2; exit 1; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
    command -v apt-get >/dev/null || fail "$* missing and no apt-get here: install it by hand, then run this again"
    say "installing $* with apt"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

wait_for() { # seconds, description, command...
    local seconds=$1 what=$2; shift 2
    for _ in $(seq "$((seconds * 5))"); do "$@" && return 0; sleep 0.2; done
    fail "$what did not come up within ${seconds}s"
}

pg_up() { psql -h 127.0.0.1 -p 5432 -U postgres -d postgres -Atqc 'SELECT 1' >/dev/null 2>&1; }
pg_listening() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
amqp_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

ensure_postgres() {
    if ! pg_listening; then
        ls /etc/postgresql/*/main >/dev/null 2>&1 || apt_install postgresql postgresql-client
        local version
        version=$(ls /etc/postgresql | sort -V | tail -n 1)
        say "starting PostgreSQL $version on 127.0.0.1:5432"
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
        wait_for 30 PostgreSQL pg_listening
    fi
    if ! pg_up; then
        # A fresh Debian cluster asks TCP clients for a password; the tests
        # connect as postgres without one, as on the CI machines.
        local hba
        hba=$(ls /etc/postgresql/*/main/pg_hba.conf | sort -V | tail -n 1)
        say "allowing passwordless loopback connections in $hba (a test machine)"
        as_root sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
        as_root pg_ctlcluster --skip-systemctl-redirect "$(basename "$(dirname "$(dirname "$hba")")")" main reload
        wait_for 10 "PostgreSQL after reload" pg_up
    fi
    if [ -z "$(psql -h 127.0.0.1 -U postgres -d postgres -Atqc "SELECT 1 FROM pg_database WHERE datname = 'test'")" ]; then
        say "creating the database test"
        createdb -h 127.0.0.1 -U postgres test
    fi
}

ensure_rabbitmq() {
    amqp_up && return 0
    command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
    say "starting RabbitMQ on 127.0.0.1:5672"
    amqp_up || as_root rabbitmq-server -detached || true
    wait_for 90 RabbitMQ amqp_up
}

rust_needed=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../Cargo.toml")

# Whether the cargo on PATH is at least the crate's rust-version.
cargo_recent() {
    command -v cargo >/dev/null || return 1
    local have
    have=$(cargo --version | cut -d' ' -f2)
    [ "$(printf '%s\n%s\n' "$rust_needed" "$have" | sort -V | head -n 1)" = "$rust_needed" ]
}

# rustup-init for this machine, fetched from the toolchain's host, then run
# as the script would run it.
rustup_init_direct() {
    local arch target init
    arch=$(uname -m)
    case "$arch" in
        x86_64 | aarch64 | riscv64 | s390x | powerpc64le) target="$arch-unknown-linux-gnu" ;;
        armv7l) target="armv7-unknown-linux-gnueabihf" ;;
        *) say "no rustup-init is published for $arch"; return 1 ;;
    esac
    [ "$arch" = powerpc64le ] && target="powerpc64le-unknown-linux-gnu"
    init=$(mktemp)
    curl --proto '=https' --tlsv1.2 -sSf -o "$init" \
        "https://static.rust-lang.org/rustup/dist/$target/rustup-init" || { rm -f "$init"; return 1; }
    chmod +x "$init"
    "$init" -y --profile minimal --component rustfmt,clippy >/dev/null
    local status=$?
    rm -f "$init"
    return $status
}

ensure_rust() {
    command -v cc >/dev/null || apt_install gcc libc6-dev
    # tests/libpq_differential.rs links the system's libpq (pq-sys finds it
    # with pkg-config).
    pkg-config --exists libpq 2>/dev/null || apt_install libpq-dev pkg-config
    cargo_recent && return 0
    # A rustup toolchain that is installed but not on this shell's PATH.
    if [ -f "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
    cargo_recent && return 0
    command -v curl >/dev/null || apt_install curl ca-certificates
    say "installing Rust with rustup into ~/.cargo (a minute or two)"
    if ! curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
        sh -s -- -y --profile minimal --component rustfmt,clippy >/dev/null; then
        # sh.rustup.rs only serves the installer script; the same installer
        # is published for each machine on the toolchain's own host, which
        # some networks let through when they block the script's.
        say "the rustup script could not be fetched: trying rustup-init from static.rust-lang.org"
        rustup_init_direct ||
            fail "could not install Rust with rustup (see the lines above): install Rust $rust_needed or later from https://rustup.rs, check that \`cargo --version\` works, then run this again"
    fi
    . "$HOME/.cargo/env"
    say "Rust is in ~/.cargo/bin: to use cargo in this shell, run . \"\$HOME/.cargo/env\" (new shells have it)"
}

# The minimum supported Rust version, for scripts/test.sh's MSRV check: a
# rustup toolchain of its own beside the default one (a minute to fetch).
# Without rustup, or without a way to static.rust-lang.org, the check is
# skipped, and test.sh says so.
ensure_msrv_toolchain() {
    if ! command -v rustup >/dev/null; then
        say "no rustup here to install Rust $rust_needed: scripts/test.sh skips the MSRV check"
        return 0
    fi
    # grep reads it all (no -q): under pipefail an early exit would fail rustup.
    rustup toolchain list | grep "^$rust_needed-" >/dev/null && return 0
    say "installing the Rust $rust_needed toolchain for the MSRV check (a minute)"
    rustup toolchain install "$rust_needed" --profile minimal >/dev/null 2>&1 ||
        say "could not install Rust $rust_needed (is static.rust-lang.org reachable?): scripts/test.sh skips the MSRV check"
}

# cargo-deny, for scripts/test.sh's dependency policy, built once from
# crates.io: minutes of compiling. Its build directory is kept, so a build
# cut short by the time limit (SETUP_CARGO_DENY_MINUTES, 8 by default)
# resumes on the next run instead of starting over; meanwhile test.sh
# skips `cargo deny` and says so.
ensure_cargo_deny() {
    command -v cargo-deny >/dev/null && return 0
    local minutes=${SETUP_CARGO_DENY_MINUTES:-8}
    say "building cargo-deny from crates.io for the dependency policy (once; at most $minutes minutes a run)"
    timeout "${minutes}m" cargo install --locked --quiet \
        --target-dir "$HOME/.cache/outbox-poll/cargo-deny-build" cargo-deny >/dev/null 2>&1 || true
    command -v cargo-deny >/dev/null ||
        say "cargo-deny is not installed yet (crates.io unreachable, or its build needs more time and resumes next run): scripts/test.sh skips cargo deny"
}

# tests/observability.rs checks deploy/prometheus with promtool, which
# Debian and Ubuntu ship only in the prometheus package (its server is
# installed with it, and started where systemd runs).
ensure_promtool() {
    command -v promtool >/dev/null || apt_install prometheus
}

# The servers first: they do not depend on Rust, so a failed Rust download
# still leaves them ready.
if [ "${1:-}" != rust ]; then
    [ -n "${TEST_DATABASE_URL:-}" ] || ensure_postgres
    [ -n "${TEST_AMQP_URL:-}" ] || ensure_rabbitmq
    ensure_promtool
fi
ensure_rust
# The guard rails' tools, for scripts/test.sh only (`setup.sh test`).
if [ "${1:-}" = test ]; then
    ensure_msrv_toolchain
    ensure_cargo_deny
fi
