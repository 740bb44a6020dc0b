#!/usr/bin/env bash
# The outbox-poll benchmark: builds the release binary and the bench
# (bench/relay.rs, a harness-less cargo bench target), runs it once and
# prints one table. Needs the local PostgreSQL and RabbitMQ the tests use
# (BENCH_DATABASE_URL, BENCH_AMQP_URL point elsewhere). Exits non-zero if
# any event was lost or any row left unmarked. Settings: see bench/relay.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --locked --bench relay --no-run 2>&1 | grep -v '^ *Compiling' >&2 || true
echo "machine: $(nproc) cores, $(free -h | awk '/^Mem:/ {print $2}') RAM;" \
  "$(psql -Atc 'select version()' "${BENCH_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/test}" 2>/dev/null | cut -d, -f1);" \
  "RabbitMQ $(rabbitmqctl version 2>/dev/null || echo '(version: see the management UI)')"
exec cargo bench --locked --bench relay -q
