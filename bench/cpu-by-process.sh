#!/usr/bin/env bash
# CPU seconds per drain, by process: the relay, PostgreSQL's backends and
# RabbitMQ. On two cores shared by all three, throughput follows the sum,
# and CPU time is far less disturbed by other load than wall time is, so
# this says where a batch size loses even on a busy machine (see
# bench/README.md). Needs root (it reads the postmaster's and beam.smp's
# /proc entries), the local servers, a release build and examples/peek.
#
#   BATCHES="100 1000" EVENTS=50000 bench/cpu-by-process.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BENCH_BIN:-target/release/outbox-poll}
peek=${PEEK:-target/release/examples/peek}
events=${EVENTS:-50000}
export DATABASE_URL=${BENCH_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/test}
export OUTBOX_TABLE=bench_cpu.outbox OUTBOX_EXCHANGE=bench_cpu
tick=$(getconf CLK_TCK)
postmaster=$(head -n 1 "$(psql -Atqc 'SHOW data_directory' "$DATABASE_URL")/postmaster.pid")
beam=$(pgrep -o beam.smp)
own() { awk -v t="$tick" '{print ($14 + $15) / t}' "/proc/$1/stat"; }
reaped() { awk -v t="$tick" '{print ($16 + $17) / t}' "/proc/$1/stat"; }
psql -q "$DATABASE_URL" -c "CREATE SCHEMA IF NOT EXISTS bench_cpu" >/dev/null
trap 'psql -q "$DATABASE_URL" -c "DROP SCHEMA bench_cpu CASCADE" >/dev/null; rabbitmqctl -q delete_queue bench_cpu >/dev/null' EXIT
for batch in ${BATCHES:-100 1000}; do
    psql -q "$DATABASE_URL" -c "SET client_min_messages = warning; DROP TABLE IF EXISTS bench_cpu.outbox" >/dev/null
    "$bin" migrate >/dev/null
    psql -q "$DATABASE_URL" -c "INSERT INTO bench_cpu.outbox (event_id, event_type, payload)
        SELECT 'e-' || g, 'order.created', jsonb_build_object('order', g, 'customer', 'c-' || (g % 977),
            'total', g * 1.5, 'note', repeat('x', 120)) FROM generate_series(1, $events) g" >/dev/null
    psql -q "$DATABASE_URL" -c "VACUUM ANALYZE bench_cpu.outbox" >/dev/null
    "$peek" bind bench_cpu bench_cpu >/dev/null
    rabbitmqctl -q purge_queue bench_cpu >/dev/null
    pg0=$(reaped "$postmaster"); mq0=$(own "$beam"); t0=$(date +%s.%N)
    relay=$( { /usr/bin/time -f '%U %S' "$bin" --drain --batch-size "$batch" >/dev/null; } 2>&1 | tail -n 1)
    t1=$(date +%s.%N)
    sleep 0.5 # the backends exit, and the postmaster reaps them
    pg1=$(reaped "$postmaster"); mq1=$(own "$beam")
    awk -v b="$batch" -v n="$events" -v w="$(echo "$t1 - $t0" | bc)" -v r="$relay" \
        -v pg="$(echo "$pg1 - $pg0" | bc)" -v mq="$(echo "$mq1 - $mq0" | bc)" -v la="$(cut -d' ' -f1 /proc/loadavg)" \
        'BEGIN { split(r, u, " "); printf "batch %s: %d events in %.2f s; CPU s: relay %.2f, PostgreSQL %.2f, RabbitMQ %.2f (load %s)\n", b, n, w, u[1] + u[2], pg, mq, la }'
done
