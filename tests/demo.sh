#!/usr/bin/env bash
# The main job end to end, on a fresh Debian/Ubuntu machine or this one:
# migrate, insert sample events, drain them into a queue, show what arrived.
set -euo pipefail
cd "$(dirname "$0")/.."
tests/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
cargo build --release --quiet --bin outbox-poll --example peek

export DATABASE_URL=${DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/test}
export AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}
export OUTBOX_TABLE=demo.outbox OUTBOX_EXCHANGE=outbox-demo
relay=target/release/outbox-poll
peek=target/release/examples/peek

echo "== migrate: the table $OUTBOX_TABLE"
psql "$DATABASE_URL" -qc 'CREATE SCHEMA IF NOT EXISTS demo'
"$relay" migrate

echo "== a queue bound to exchange $OUTBOX_EXCHANGE"
"$peek" bind "$OUTBOX_EXCHANGE" outbox-demo

echo "== five events, as a service would insert them"
psql "$DATABASE_URL" -qc "INSERT INTO demo.outbox (event_id, event_type, payload)
    SELECT 'demo-' || gen_random_uuid(), 'order.created', jsonb_build_object('order', g, 'total', g * 10)
    FROM generate_series(1, 5) g"

echo "== outbox-poll --drain --json"
"$relay" --drain --json

echo "== what arrived (message_id, type, body)"
"$peek" take outbox-demo

echo "== the rows, now marked"
psql "$DATABASE_URL" -c "SELECT id, event_id, published_at IS NOT NULL AS published, attempts
    FROM demo.outbox ORDER BY id DESC LIMIT 5"
