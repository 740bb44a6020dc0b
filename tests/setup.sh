#!/usr/bin/env bash
# Everything the tests and the demo need, made ready: a Rust toolchain (by
# rustup, when cargo is missing: Debian's own cargo is too old for this
# crate) and the PostgreSQL and RabbitMQ the tests use, started when they
# are stopped and, on Debian or Ubuntu, installed with apt when they are
# absent. Safe to run again and again.
#
# Servers named by TEST_DATABASE_URL / TEST_AMQP_URL are left alone: they
# are someone else's to run.
set -euo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
    command -v apt-get >/dev/null || { echo "setup.sh: $* missing and no apt-get here: install it by hand" >&2; exit 1; }
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

wait_for() { # seconds, description, command...
    local seconds=$1 what=$2; shift 2
    for _ in $(seq "$((seconds * 5))"); do "$@" && return 0; sleep 0.2; done
    echo "setup.sh: $what did not come up within ${seconds}s" >&2
    exit 1
}

pg_up() { psql -h 127.0.0.1 -p 5432 -U postgres -d postgres -Atqc 'SELECT 1' >/dev/null 2>&1; }
pg_listening() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
amqp_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

ensure_postgres() {
    if ! pg_listening; then
        ls /etc/postgresql/*/main >/dev/null 2>&1 || apt_install postgresql postgresql-client
        version=$(ls /etc/postgresql | sort -V | tail -n 1)
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
        wait_for 30 PostgreSQL pg_listening
    fi
    if ! pg_up; then
        # A fresh Debian cluster asks TCP clients for a password; the tests
        # connect as postgres without one, as on the CI machines.
        hba=$(ls /etc/postgresql/*/main/pg_hba.conf | sort -V | tail -n 1)
        echo "setup.sh: allowing passwordless loopback connections in $hba (a test machine)" >&2
        as_root sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
        as_root pg_ctlcluster --skip-systemctl-redirect "$(basename "$(dirname "$(dirname "$hba")")")" main reload
        wait_for 10 "PostgreSQL after reload" pg_up
    fi
    if [ -z "$(psql -h 127.0.0.1 -U postgres -d postgres -Atqc "SELECT 1 FROM pg_database WHERE datname = 'test'")" ]; then
        createdb -h 127.0.0.1 -U postgres test
    fi
}

ensure_rabbitmq() {
    amqp_up && return 0
    command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
    amqp_up || as_root rabbitmq-server -detached || true
    wait_for 90 RabbitMQ amqp_up
}

ensure_rust() {
    command -v cc >/dev/null || apt_install gcc libc6-dev
    command -v cargo >/dev/null && return 0
    if [ ! -x "$HOME/.cargo/bin/cargo" ]; then
        command -v curl >/dev/null || apt_install curl ca-certificates
        echo "setup.sh: no cargo here: installing Rust with rustup" >&2
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
            sh -s -- -y --profile minimal --component rustfmt,clippy >/dev/null
    fi
    echo "setup.sh: Rust is in ~/.cargo/bin: add it to PATH (. ~/.cargo/env)" >&2
}

ensure_rust
[ -n "${TEST_DATABASE_URL:-}" ] || ensure_postgres
[ -n "${TEST_AMQP_URL:-}" ] || ensure_rabbitmq
