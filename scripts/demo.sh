#!/usr/bin/env bash
# The main job end to end, on this machine or a fresh Debian or Ubuntu one:
# the servers and Rust (scripts/setup.sh), a release build, then migrate,
# insert five events, drain them into a queue, show what arrived and the
# status, one line saying what each step does. It uses the tests' servers
# (TEST_DATABASE_URL / TEST_AMQP_URL, by default the local ones) and a table,
# exchange and queue of its own: demo.outbox, outbox-demo, outbox-demo.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "==> $*"; }

step "servers and Rust, started or installed as needed (scripts/setup.sh)"
. scripts/setup.sh
command -v psql >/dev/null || apt_install postgresql-client
step "cargo build --release: outbox-poll and examples/peek (a first build takes minutes: link-time optimisation)"
cargo build --release --locked --bin outbox-poll --example peek

export DATABASE_URL=${TEST_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/test}
export AMQP_URL=${TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}
export OUTBOX_TABLE=demo.outbox OUTBOX_EXCHANGE=outbox-demo
relay=target/release/outbox-poll
peek=target/release/examples/peek

step "outbox-poll migrate: create or upgrade the table $OUTBOX_TABLE"
psql "$DATABASE_URL" -q -c 'SET client_min_messages = warning' -c 'CREATE SCHEMA IF NOT EXISTS demo'
"$relay" migrate

step "peek bind: the exchange $OUTBOX_EXCHANGE and a queue outbox-demo bound to every routing key"
"$peek" bind "$OUTBOX_EXCHANGE" outbox-demo

step "psql: five events inserted, as a service would insert them"
psql "$DATABASE_URL" -qc "INSERT INTO demo.outbox (event_id, event_type, payload)
    SELECT 'demo-' || gen_random_uuid(), 'order.created', jsonb_build_object('order', g, 'total', g * 10)
    FROM generate_series(1, 5) g"

step "outbox-poll --drain --json: publish every due event, batch after batch"
"$relay" --drain --json

step "peek take: what arrived in the queue (message_id, type, body)"
"$peek" take outbox-demo

step "outbox-poll status: the backlog after the drain"
"$relay" status
