//! The outbox-poll benchmark (`bench/run.sh`; not part of `cargo test`).
//!
//! One run, on its own schema, exchange and queue (all removed at the end):
//! fills an outbox with ~200-byte JSON events, measures the release binary's
//! `--drain` at several batch sizes, and in the same run the two limits
//! (PostgreSQL-only claim+mark loop, RabbitMQ-only pipelined publish with
//! confirms), a naive per-event baseline, the empty-run latency, memory at
//! 1 KB payloads and concurrent drains. Every measured run is verified:
//! every event arrived (duplicates and losses counted) and every row is
//! marked; any loss is reported as FAILURE and the exit code is 1.
//!
//! Peak RSS comes from GNU time (/usr/bin/time), which forks the child
//! itself; without it, RSS is not reported.
//!
//! Settings (environment): BENCH_BIN (the binary to measure; default this
//! build's), BENCH_DATABASE_URL, BENCH_AMQP_URL, BENCH_EVENTS
//! (100000), BENCH_NAIVE_EVENTS (10000), BENCH_EMPTY_RUNS (50),
//! BENCH_BATCHES (100,1000,5000), BENCH_SCALING (1,2,4: concurrent drains),
//! BENCH_SCALING_BATCH (1000), BENCH_ONLY (a
//! comma-separated subset of: limits,shapes,drain,naive,empty,memory,
//! scaling,connect). `connect` (bench/connect.rs) times the empty run with
//! sslmode=prefer (TLS) against sslmode=disable, BENCH_EMPTY_RUNS of each.

mod common;
mod connect;

use std::collections::VecDeque;
use std::time::Instant;

use common::{FAILED, Figure, Fixture, Settings, check, header, print_figure};
use futures_util::future::join_all;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{Channel, Confirmation};
use outbox_poll::broker::message::{properties, short_strings};
use outbox_poll::cli::DEFAULT_MAX_ATTEMPTS;
use outbox_poll::config::in_flight;
use outbox_poll::sql::outbox::{Event, Outbox};
use outbox_poll::sql::table::TableName;
use postgres::{Client, NoTls};

/// The relay's own claim and mark statements (`sql::outbox`), prepared on
/// a connection of the bench's: the limits measure exactly the SQL that
/// ships.
fn relay_statements(fx: &Fixture, client: &mut Client) -> Outbox {
    let table = TableName::parse(&fx.table()).expect("the bench's table name");
    Outbox::prepare(client, &table, DEFAULT_MAX_ATTEMPTS, false)
        .expect("preparing the relay's statements")
}

/// Claims up to `limit` events as the relay does, in the transaction open
/// on `client`.
fn claim(client: &mut Client, outbox: &Outbox, limit: i64) -> Vec<Event> {
    outbox.claim(client, limit, None).expect("claiming")
}

/// A publish of `event` as the relay makes it: routing key, properties
/// and body from `broker::message`, `mandatory` set.
fn publish<'c>(
    channel: &'c Channel,
    exchange: &str,
    event: &'c Event,
) -> impl Future<Output = lapin::Result<lapin::PublisherConfirm>> + 'c {
    let (routing_key, message_id) = short_strings(event).expect("short event names");
    let properties = properties(event, routing_key.clone(), message_id);
    channel.basic_publish(
        exchange.into(),
        routing_key,
        BasicPublishOptions {
            mandatory: true,
            immediate: false,
        },
        event.payload.as_bytes(),
        properties,
    )
}

/// PostgreSQL alone: claim a batch, mark it, commit, with the relay's SQL
/// and prepared statements, nothing published.
fn pg_limit(fx: &mut Fixture, batch: i64, limit: bool) -> Figure {
    fx.fill(fx.settings.events, 200);
    let mut client = Client::connect(&fx.settings.database_url, NoTls).unwrap();
    let outbox = relay_statements(fx, &mut client);
    let started = Instant::now();
    let mut total = 0u64;
    loop {
        client.batch_execute("BEGIN").unwrap();
        let events = claim(&mut client, &outbox, batch);
        if events.is_empty() {
            client.batch_execute("COMMIT").unwrap();
            break;
        }
        let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
        outbox.mark_published(&mut client, &ids).unwrap();
        client.batch_execute("COMMIT").unwrap();
        total += ids.len() as u64;
    }
    let seconds = started.elapsed().as_secs_f64();
    let count = fx.settings.events;
    let (verified, failed) = fx.verify(count, false, true);
    check(failed, &verified);
    Figure {
        name: if limit {
            format!("limit: PostgreSQL only, claim+mark, batch {batch}")
        } else {
            format!("PostgreSQL only, claim+mark, batch {batch}")
        },
        events: total,
        seconds,
        rss_kb: None,
        verified,
    }
}

/// RabbitMQ alone: the same messages (bodies and properties) to the same
/// kind of queue, every publish of a window of `window` issued before any
/// confirm is awaited, and up to `depth` windows awaiting their confirms.
/// Depth 2 with windows of 1,000 is a continuous pipeline: the broker's
/// limit. Depth 1 waits for each window's confirms, the shape of one relay
/// batch; a drain's depth is its batches in flight.
fn broker_limit(fx: &mut Fixture, window: usize, depth: usize, limit: bool) -> Figure {
    let count = if limit {
        fx.settings.events
    } else {
        fx.settings.events / 2
    };
    fx.fill(count, 200);
    // Read as the relay reads them (a claim, rolled back).
    let mut client = Client::connect(&fx.settings.database_url, NoTls).unwrap();
    let outbox = relay_statements(fx, &mut client);
    client.batch_execute("BEGIN").unwrap();
    let events = claim(&mut client, &outbox, count);
    client.batch_execute("ROLLBACK").unwrap();
    let exchange = fx.name.clone();
    let (seconds, acked) = fx.runtime.block_on(async {
        let channel = fx.connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let acks = |confirmations: Vec<lapin::Result<Confirmation>>| {
            confirmations
                .into_iter()
                .filter(|c| matches!(c, Ok(Confirmation::Ack(None))))
                .count() as u64
        };
        let started = Instant::now();
        let mut acked = 0u64;
        let mut awaiting = VecDeque::new();
        for chunk in events.chunks(window) {
            let publishes = chunk
                .iter()
                .map(|event| publish(&channel, &exchange, event));
            let confirms: Vec<_> = join_all(publishes)
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            awaiting.push_back(confirms);
            while awaiting.len() >= depth {
                acked += acks(join_all(awaiting.pop_front().unwrap()).await);
            }
        }
        for confirms in awaiting {
            acked += acks(join_all(confirms).await);
        }
        let seconds = started.elapsed().as_secs_f64();
        let _ = channel.close(200, "bye".into()).await;
        (seconds, acked)
    });
    drop(events);
    let (verified, failed) = fx.verify(count, true, false);
    check(failed, &verified);
    let name = match (limit, depth) {
        (true, _) => format!("limit: RabbitMQ only, continuous pipeline, window {window}"),
        (false, 1) => format!("RabbitMQ only, {window} then wait for their confirms"),
        (false, _) => format!("RabbitMQ only, {window} per batch, {depth} batches in flight"),
    };
    Figure {
        name,
        events: acked,
        seconds,
        rss_kb: None,
        verified,
    }
}

/// The reference article's poller: per event, publish and wait for its
/// confirm, then one UPDATE for that row; batches of 100 per transaction.
fn naive(fx: &mut Fixture) -> Figure {
    let table = fx.table();
    let count = fx.settings.naive_events;
    fx.fill(count, 200);
    let mut client = Client::connect(&fx.settings.database_url, NoTls).unwrap();
    let outbox = relay_statements(fx, &mut client);
    let mark = client
        .prepare(&format!(
            "UPDATE {table} SET published_at = now() WHERE id = $1"
        ))
        .unwrap();
    let exchange = fx.name.clone();
    let channel = fx.runtime.block_on(async {
        let channel = fx.connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        channel
    });
    let started = Instant::now();
    let mut total = 0u64;
    loop {
        client.batch_execute("BEGIN").unwrap();
        let events = claim(&mut client, &outbox, 100);
        if events.is_empty() {
            client.batch_execute("COMMIT").unwrap();
            break;
        }
        for event in &events {
            let confirmation = fx.runtime.block_on(async {
                publish(&channel, &exchange, event)
                    .await
                    .unwrap()
                    .await
                    .unwrap()
            });
            if let Confirmation::Ack(None) = confirmation {
                client.execute(&mark, &[&event.id]).unwrap();
                total += 1;
            }
        }
        client.batch_execute("COMMIT").unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    fx.runtime.block_on(async {
        let _ = channel.close(200, "bye".into()).await;
    });
    let (verified, failed) = fx.verify(count, true, true);
    check(failed, &verified);
    Figure {
        name: "naive: per-event publish+confirm, per-row UPDATE".into(),
        events: total,
        seconds,
        rss_kb: None,
        verified,
    }
}

/// `processes` concurrent `outbox-poll --drain` on one table of `count`
/// events of `bytes` bytes.
fn drain(
    fx: &mut Fixture,
    name: String,
    count: i64,
    bytes: i64,
    batch: i64,
    processes: i64,
) -> Figure {
    let mean = fx.fill(count, bytes);
    eprintln!("bench: {count} events, payload mean {mean:.0} bytes");
    let batch_text = batch.to_string();
    let args = ["--drain", "--batch-size", batch_text.as_str(), "--json"];
    let (seconds, published, rss, ok) = fx.run_binary(processes, &args, true);
    let (mut verified, mut failed) = fx.verify(count, true, true);
    if !ok {
        verified.push_str(", NONZERO EXIT");
        failed = true;
    }
    check(failed, &verified);
    let figure = Figure {
        name,
        events: published,
        seconds,
        rss_kb: rss,
        verified,
    };
    eprintln!(
        "bench: {}: {:.0}/s, {:?} KiB",
        figure.name,
        figure.rate(),
        rss
    );
    figure
}

fn main() {
    let settings = Settings::from_env();
    let events = settings.events;
    let mut fx = Fixture::new(settings);
    let mut figures: Vec<Figure> = Vec::new();
    let started = Instant::now();
    eprintln!("bench: schema/exchange/queue {}; {events} events", fx.name);

    let mut broker = None;
    let mut pg = None;
    if fx.settings.wants("limits") {
        let b = broker_limit(&mut fx, 1000, 2, true);
        broker = Some(b.rate());
        eprintln!("bench: {} {:.0}/s {}", b.name, b.rate(), b.verified);
        figures.push(b);
        let p = pg_limit(&mut fx, 1000, true);
        pg = Some(p.rate());
        eprintln!("bench: {} {:.0}/s {}", p.name, p.rate(), p.verified);
        figures.push(p);
        eprintln!(
            "bench: limits done at {:.0}s",
            started.elapsed().as_secs_f64()
        );
    }
    if fx.settings.wants("shapes") {
        // What one batch costs on each side alone, at the batch sizes the
        // drains use: where the relay's time per batch goes.
        for batch in fx.settings.batches.clone() {
            figures.push(broker_limit(&mut fx, batch as usize, 1, false));
            let depth = in_flight(batch as u32, true, false);
            figures.push(broker_limit(&mut fx, batch as usize, depth, false));
            figures.push(pg_limit(&mut fx, batch, false));
        }
        eprintln!(
            "bench: shapes done at {:.0}s",
            started.elapsed().as_secs_f64()
        );
    }
    if fx.settings.wants("drain") {
        for batch in fx.settings.batches.clone() {
            let name = format!("outbox-poll --drain --batch-size {batch}");
            figures.push(drain(&mut fx, name, events, 200, batch, 1));
        }
        eprintln!(
            "bench: drains done at {:.0}s",
            started.elapsed().as_secs_f64()
        );
    }
    if fx.settings.wants("naive") {
        figures.push(naive(&mut fx));
    }
    if fx.settings.wants("scaling") {
        let batch = fx.settings.scaling_batch;
        for processes in fx.settings.scaling.clone() {
            let name = format!("{processes} concurrent --drain, batch {batch}");
            figures.push(drain(&mut fx, name, events, 200, batch, processes));
        }
        eprintln!(
            "bench: scaling done at {:.0}s",
            started.elapsed().as_secs_f64()
        );
    }
    if fx.settings.wants("memory") {
        for count in [5_000, 50_000] {
            let name = format!("memory: {count} x 1 KB events, --drain --batch-size 5000");
            figures.push(drain(&mut fx, name, count, 1024, 5000, 1));
        }
    }
    let mut empty = None;
    if fx.settings.wants("empty") {
        fx.fill(0, 200);
        let mut times: Vec<f64> = (0..fx.settings.empty_runs)
            .map(|_| {
                let (seconds, _, _, ok) = fx.run_binary(1, &[], false);
                check(!ok, "the empty run failed");
                seconds * 1000.0
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times[((times.len() as f64 - 1.0) * q).round() as usize];
        empty = Some((times.len(), at(0.5), at(0.9), times[0]));
    }
    let by_sslmode = fx
        .settings
        .wants("connect")
        .then(|| connect::empty_runs(&mut fx));

    println!();
    header();
    for figure in &figures {
        print_figure(figure, broker, pg);
    }
    if let Some((runs, median, p90, min)) = empty {
        println!();
        println!(
            "empty run (start, connect, claim nothing, exit), {runs} runs: \
             median {median:.1} ms, p90 {p90:.1} ms, min {min:.1} ms"
        );
    }
    if let Some(figures) = &by_sslmode {
        connect::print(figures);
    }
    println!("\ntotal bench time {:.0}s", started.elapsed().as_secs_f64());
    let failed = FAILED.load(std::sync::atomic::Ordering::SeqCst);
    drop(fx);
    if failed {
        println!("FAILURE: events were lost or rows left unmarked (see above)");
        std::process::exit(1);
    }
    println!("OK: every event arrived and every row is marked");
}
