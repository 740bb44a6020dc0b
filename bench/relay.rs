//! The outbox-poll benchmark (`bench/run.sh`; not part of `cargo test`).
//!
//! One run, on its own schema, exchange and queue (all removed at the end):
//! fills an outbox with ~200-byte JSON events, measures the release binary's
//! `--drain` at several batch sizes (marking, and with --on-publish
//! delete), and in the same run the limits (PostgreSQL-only claim+mark
//! loop; RabbitMQ-only publish with a sliding window of 1,000 unconfirmed,
//! of the messages the contract requires and, labelled beside it, of bare
//! ones: each drain is given as a ratio to both), a naive per-event
//! baseline, the empty-run latency, memory at 1 KB payloads and at 50 MB
//! ones (bench/memory.rs), concurrent drains, --follow's latency from
//! commit to receipt, its idle CPU and what its notify trigger costs
//! producers (bench/latency.rs), and (bench/scale.rs) the table at scale:
//! millions of rows, a prune, partitions. Every measured run is verified:
//! every event arrived (duplicates and losses counted) and every row is
//! marked (or deleted); any loss is reported as FAILURE and the exit code
//! is 1. Every figure carries the load average it was taken at.
//!
//! Peak RSS comes from GNU time (/usr/bin/time), which forks the child
//! itself; without it, RSS is not reported.
//!
//! Settings (environment): BENCH_BIN (the binary to measure; default this
//! build's), BENCH_DATABASE_URL, BENCH_AMQP_URL, BENCH_EVENTS
//! (100000), BENCH_NAIVE_EVENTS (10000), BENCH_EMPTY_RUNS (50),
//! BENCH_BATCHES (100,1000,5000), BENCH_SCALING (1,2,4: concurrent drains),
//! BENCH_SCALING_BATCH (1000), BENCH_FILL (analyze, or vacuum: see
//! common::Settings), BENCH_LATENCY_RATES (100,1000),
//! BENCH_LATENCY_SECONDS (30), BENCH_IDLE_SECONDS (60),
//! BENCH_TRIGGER_SECONDS (5), BENCH_BEFORE_BIN (a build the `ordered`
//! section compares this one with), BENCH_ORDERED_EVENTS (20000),
//! BENCH_FEW_KEYS_EVENTS (20000: the 10-key by_key run), BENCH_INSERT_ROWS
//! (20000), BENCH_TRACES_EVENTS (50000) and BENCH_TRACES_ROUNDS (2) (bench/traces.rs),
//! the settings of bench/scale.rs, and BENCH_ONLY (a
//! comma-separated subset of: limits,shapes,drain,delete,naive,scaling,
//! memory,large,empty,connect,latency,trigger,ordered,by_key,inserts,
//! payloads,many_empty,many_databases,fairness,many_throughput (`many`: these
//! four, bench/many.rs),traces,size,partitions; without it, all but size and
//! partitions, which fill millions of rows). The ordered modes' sections are in bench/ordering.rs;
//! `connect` (bench/connect.rs) times the empty run with sslmode=prefer
//! (TLS) against sslmode=disable, BENCH_EMPTY_RUNS of each; `traces`
//! (bench/traces.rs) the drain and the empty run without an OTLP endpoint
//! and exporting to a local collector.

mod common;
mod connect;
mod latency;
mod many;
mod memory;
mod ordering;
mod payloads;
mod scale;
mod traces;

use std::collections::VecDeque;
use std::time::Instant;

use common::{FAILED, Figure, Fixture, Results, Settings, check, load_average};
use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation};
use outbox_poll::broker::message::{Outgoing, outgoing};
use outbox_poll::cli::{DEFAULT_MAX_ATTEMPTS, OnPublish};
use outbox_poll::config::in_flight;
use outbox_poll::relay::session::RELAY_PLANS;
use outbox_poll::sql::outbox::{Event, Order, Outbox, Start};
use outbox_poll::sql::table::TableName;
use postgres::{Client, NoTls};

/// A session of the bench's own, planning as the relay's sessions do.
fn relay_session(fx: &Fixture) -> Client {
    let mut config: postgres::Config = fx
        .settings
        .database_url
        .parse()
        .expect("BENCH_DATABASE_URL");
    config
        .options(RELAY_PLANS)
        .connect(NoTls)
        .expect("connecting to PostgreSQL")
}

/// The relay's own claim and mark statements (`sql::outbox`), prepared on
/// a session of the bench's: the limits measure exactly the SQL that
/// ships.
fn relay_statements(fx: &Fixture, client: &mut Client) -> Outbox {
    let table = TableName::parse(&fx.table()).expect("the bench's table name");
    Outbox::prepare(
        client,
        &table,
        DEFAULT_MAX_ATTEMPTS,
        Order::Plain,
        OnPublish::Mark,
    )
    .expect("preparing the relay's statements")
}

/// Claims up to `limit` events as the relay does, in the transaction open
/// on `client`. With no byte budget: the bench's batches hold far less than
/// the default --batch-bytes, so the relay's claim returns the same rows.
fn claim(client: &mut Client, outbox: &mut Outbox, limit: i64) -> Vec<Event> {
    outbox
        .claim(client, limit, &Start::Head, i64::MAX)
        .expect("claiming")
}

/// A publish of `event` as the relay makes it: routing key, properties
/// and body from `broker::message`, `mandatory` set. The bench's events
/// have no headers, so no frame size can refuse them.
fn publish<'c>(
    channel: &'c Channel,
    exchange: &str,
    event: &'c Event,
) -> impl Future<Output = lapin::Result<lapin::PublisherConfirm>> + 'c {
    let Outgoing {
        exchange: own,
        routing_key,
        properties,
    } = outgoing(event, u32::MAX).expect("a sendable event");
    channel.basic_publish(
        own.unwrap_or_else(|| exchange.into()),
        routing_key,
        BasicPublishOptions {
            mandatory: true,
            immediate: false,
        },
        &event.payload,
        properties,
    )
}

/// PostgreSQL alone: claim a batch, mark it, commit, with the relay's SQL
/// and prepared statements, nothing published.
fn pg_limit(fx: &mut Fixture, batch: i64, limit: bool) -> Figure {
    fx.fill(fx.settings.events, 200);
    let name = match limit {
        true => format!("limit: PostgreSQL only, claim+mark, batch {batch}"),
        false => format!("PostgreSQL only, claim+mark, batch {batch}"),
    };
    claim_and_mark(fx, name, fx.settings.events, batch)
}

/// Claims and marks the `count` events of the table the relay's way,
/// `batch` at a time, each batch its own transaction, nothing published.
fn claim_and_mark(fx: &mut Fixture, name: String, count: i64, batch: i64) -> Figure {
    let mut client = relay_session(fx);
    let mut outbox = relay_statements(fx, &mut client);
    let started = Instant::now();
    let mut total = 0u64;
    loop {
        client.batch_execute("BEGIN").unwrap();
        let events = claim(&mut client, &mut outbox, batch);
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
    let (verified, failed) = fx.verify(count, false, true);
    check(failed, &verified);
    Figure {
        name,
        events: total,
        seconds,
        rss_kb: None,
        verified,
        load: load_average(),
    }
}

/// RabbitMQ alone, in the shape of one batch or of a drain's batches:
/// the same messages (bodies and properties) to the same kind of queue,
/// every publish of a window of `window` issued before any confirm is
/// awaited, and up to `depth` windows awaiting their confirms. Depth 1
/// waits for each window's confirms, the shape of one relay batch; a
/// drain's depth is its batches in flight.
fn broker_shape(fx: &mut Fixture, window: usize, depth: usize) -> Figure {
    let count = fx.settings.events / 2;
    let events = filled_and_read(fx, count);
    let exchange = fx.name.clone();
    let (seconds, acked) = fx.runtime.block_on(async {
        let channel = confirm_channel(&fx.connection).await;
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
    let name = match depth {
        1 => format!("RabbitMQ only, {window} then wait for their confirms"),
        _ => format!("RabbitMQ only, {window} per batch, {depth} batches in flight"),
    };
    Figure {
        name,
        events: acked,
        seconds,
        rss_kb: None,
        verified,
        load: load_average(),
    }
}

/// The messages a broker-only limit publishes.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// What the contract requires of every message, as the relay builds
    /// it (`broker::message`): `mandatory`, message_id, type, timestamp,
    /// app_id, content_type, persistent.
    Contract,
    /// The body alone, persistent, without `mandatory` or any other
    /// property: what a broker-only figure without the contract's
    /// requirements reaches. The broker spends about a third more CPU on
    /// each contract-shaped message.
    Bare,
}

/// Unconfirmed messages the broker-only limit keeps: a publisher with a
/// sliding confirm window of 1,000, a new publish as each confirm returns.
const LIMIT_WINDOW: usize = 1000;

/// RabbitMQ alone at its limit: the table's events (read as the relay
/// reads them) in `shape`, never more than LIMIT_WINDOW unconfirmed, each
/// confirm replaced at once by the next publish.
fn broker_limit(fx: &mut Fixture, shape: Shape) -> Figure {
    let count = fx.settings.events;
    let events = filled_and_read(fx, count);
    let exchange = fx.name.clone();
    let (seconds, acked) = fx.runtime.block_on(async {
        let channel = confirm_channel(&fx.connection).await;
        let send = |event| {
            let channel = &channel;
            let exchange = exchange.as_str();
            async move {
                let confirm = match shape {
                    Shape::Contract => publish(channel, exchange, event).await,
                    Shape::Bare => publish_bare(channel, exchange, event).await,
                };
                confirm.unwrap().await
            }
        };
        let started = Instant::now();
        let mut acked = 0u64;
        let mut unconfirmed = FuturesUnordered::new();
        let mut rest = events.iter();
        loop {
            while unconfirmed.len() < LIMIT_WINDOW {
                let Some(event) = rest.next() else { break };
                unconfirmed.push(send(event));
            }
            let Some(confirmation) = unconfirmed.next().await else {
                break;
            };
            acked += acks(vec![confirmation]);
        }
        let seconds = started.elapsed().as_secs_f64();
        let _ = channel.close(200, "bye".into()).await;
        (seconds, acked)
    });
    drop(events);
    let (verified, failed) = match shape {
        Shape::Contract => fx.verify(count, true, false),
        // Bare messages carry no message_id: they are counted.
        Shape::Bare => {
            let arrived = i64::from(fx.arrivals().values().sum::<u32>());
            match arrived == count {
                true => (format!("{arrived} arrived (counted)"), false),
                false => (format!("LOST {}", count - arrived), true),
            }
        }
    };
    check(failed, &verified);
    let name = match shape {
        Shape::Contract => "limit: RabbitMQ only, contract messages, 1,000 unconfirmed",
        Shape::Bare => "RabbitMQ only, bare messages, 1,000 unconfirmed",
    };
    Figure {
        name: name.into(),
        events: acked,
        seconds,
        rss_kb: None,
        verified,
        load: load_average(),
    }
}

/// A publish of `event`'s body alone (see Shape::Bare).
fn publish_bare<'c>(
    channel: &'c Channel,
    exchange: &str,
    event: &'c Event,
) -> impl Future<Output = lapin::Result<lapin::PublisherConfirm>> + 'c {
    channel.basic_publish(
        exchange.into(),
        event.event_type.as_str().into(),
        BasicPublishOptions::default(),
        &event.payload,
        BasicProperties::default().with_delivery_mode(2),
    )
}

/// Fills the table with `count` events and reads them as the relay reads
/// them (a claim, rolled back).
fn filled_and_read(fx: &mut Fixture, count: i64) -> Vec<Event> {
    fx.fill(count, 200);
    let mut client = relay_session(fx);
    let mut outbox = relay_statements(fx, &mut client);
    client.batch_execute("BEGIN").unwrap();
    let events = claim(&mut client, &mut outbox, count);
    client.batch_execute("ROLLBACK").unwrap();
    events
}

async fn confirm_channel(connection: &lapin::Connection) -> Channel {
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    channel
}

/// How many of `confirmations` are plain acks (not returned, not nacked).
fn acks(confirmations: Vec<lapin::Result<Confirmation>>) -> u64 {
    confirmations
        .into_iter()
        .filter(|c| matches!(c, Ok(Confirmation::Ack(None))))
        .count() as u64
}

/// The reference article's poller: per event, publish and wait for its
/// confirm, then one UPDATE for that row; batches of 100 per transaction.
fn naive(fx: &mut Fixture) -> Figure {
    let table = fx.table();
    let count = fx.settings.naive_events;
    fx.fill(count, 200);
    let mut client = relay_session(fx);
    let mut outbox = relay_statements(fx, &mut client);
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
        let events = claim(&mut client, &mut outbox, 100);
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
        load: load_average(),
    }
}

/// `processes` concurrent `outbox-poll --drain` on one table of `count`
/// events of `bytes` bytes, marking or deleting what the broker confirmed.
fn drain(
    fx: &mut Fixture,
    name: String,
    count: i64,
    bytes: i64,
    batch: i64,
    processes: i64,
    on_publish: OnPublish,
) -> Figure {
    let mean = fx.fill(count, bytes);
    eprintln!("bench: {count} events, payload mean {mean:.0} bytes");
    drain_filled(fx, name, count, batch, processes, on_publish)
}

/// Like `drain`, on a table the caller has filled with `count` due events
/// (ev-1 ..).
fn drain_filled(
    fx: &mut Fixture,
    name: String,
    count: i64,
    batch: i64,
    processes: i64,
    on_publish: OnPublish,
) -> Figure {
    let batch_text = batch.to_string();
    let on_publish_text = match on_publish {
        OnPublish::Mark => "mark",
        OnPublish::Delete => "delete",
    };
    let args = [
        "--drain",
        "--batch-size",
        batch_text.as_str(),
        "--on-publish",
        on_publish_text,
        "--json",
    ];
    let mut figure = fx.measure(&common::binary(), name, count, processes, &args);
    if on_publish == OnPublish::Delete {
        match fx.remaining() {
            0 => figure.verified = figure.verified.replace("all marked", "all deleted"),
            left => {
                figure.verified.push_str(&format!(", {left} ROWS LEFT"));
                check(true, &figure.verified);
            }
        }
    }
    figure
}

/// The limits every other figure is compared with: the broker alone,
/// publishing the messages the contract requires (and, beside it, bare
/// messages), and PostgreSQL alone.
fn limits(fx: &mut Fixture, results: &mut Results) {
    let contract = broker_limit(fx, Shape::Contract);
    let bare = broker_limit(fx, Shape::Bare);
    results.broker = Some(contract.rate());
    results.bare = Some(bare.rate());
    results.push(contract);
    results.push(bare);
    let pg = pg_limit(fx, 1000, true);
    results.pg = Some(pg.rate());
    results.push(pg);
    results.section_done("limits");
}

/// What one batch costs on each side alone, at the batch sizes the drains
/// use: where the relay's time per batch goes.
fn shapes(fx: &mut Fixture, results: &mut Results) {
    for batch in fx.settings.batches.clone() {
        results.push(broker_shape(fx, batch as usize, 1));
        let depth = in_flight(batch as u32, true, false);
        results.push(broker_shape(fx, batch as usize, depth));
        results.push(pg_limit(fx, batch, false));
    }
    results.section_done("shapes");
}

/// `outbox-poll --drain` at each batch size, marking or deleting.
fn drains(fx: &mut Fixture, results: &mut Results, on_publish: OnPublish) {
    let events = fx.settings.events;
    for batch in fx.settings.batches.clone() {
        let name = match on_publish {
            OnPublish::Mark => format!("outbox-poll --drain --batch-size {batch}"),
            OnPublish::Delete => format!("--drain --batch-size {batch} --on-publish delete"),
        };
        results.push(drain(fx, name, events, 200, batch, 1, on_publish));
    }
    results.section_done("drains");
}

/// Several drains at once on one table.
fn scaling(fx: &mut Fixture, results: &mut Results) {
    let (events, batch) = (fx.settings.events, fx.settings.scaling_batch);
    for processes in fx.settings.scaling.clone() {
        let name = format!("{processes} concurrent --drain, batch {batch}");
        results.push(drain(
            fx,
            name,
            events,
            200,
            batch,
            processes,
            OnPublish::Mark,
        ));
    }
    results.section_done("scaling");
}

/// Peak memory of drains of 1 KB events in large batches.
fn memory(fx: &mut Fixture, results: &mut Results) {
    for count in [5_000, 50_000] {
        let name = format!("memory: {count} x 1 KB events, --drain --batch-size 5000");
        results.push(drain(fx, name, count, 1024, 5000, 1, OnPublish::Mark));
    }
    results.section_done("memory");
}

/// The ordered modes, in a database of their own (see
/// `Fixture::in_own_database`).
fn ordered_modes(fx: &Fixture, results: &mut Results) {
    let mut own = Fixture::in_own_database(fx.settings.clone(), "ordering");
    for (section, run) in [
        (
            "ordered",
            ordering::ordered as fn(&mut Fixture) -> (Vec<Figure>, Vec<String>),
        ),
        ("by_key", ordering::by_key),
    ] {
        if own.settings.wants(section) {
            let (figures, notes) = run(&mut own);
            figures.into_iter().for_each(|figure| results.push(figure));
            notes.into_iter().for_each(|note| results.note(note));
        }
    }
    results.section_done("ordered modes");
}

/// Runs of the binary against an empty table: start, connect, claim
/// nothing, exit.
fn empty(fx: &mut Fixture, results: &mut Results) {
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
    results.note(format!(
        "empty run (start, connect, claim nothing, exit), {} runs: \
         median {:.1} ms, p90 {:.1} ms, min {:.1} ms",
        times.len(),
        at(0.5),
        at(0.9),
        times[0]
    ));
}

fn main() {
    // The latency section's producer: this program again, as a process of
    // its own.
    if let Ok(spec) = std::env::var(latency::PRODUCER) {
        latency::producer(&spec);
        return;
    }
    let settings = Settings::from_env();
    let mut fx = Fixture::new(settings);
    let mut results = Results::new();
    eprintln!(
        "bench: schema/exchange/queue {}; {} events",
        fx.name, fx.settings.events
    );
    let wants = |fx: &Fixture, section| fx.settings.wants(section);
    if wants(&fx, "limits") {
        limits(&mut fx, &mut results);
    }
    if wants(&fx, "shapes") {
        shapes(&mut fx, &mut results);
    }
    if wants(&fx, "drain") {
        drains(&mut fx, &mut results, OnPublish::Mark);
    }
    if wants(&fx, "delete") {
        drains(&mut fx, &mut results, OnPublish::Delete);
    }
    if wants(&fx, "naive") {
        results.push(naive(&mut fx));
    }
    if wants(&fx, "scaling") {
        scaling(&mut fx, &mut results);
    }
    if wants(&fx, "memory") {
        memory(&mut fx, &mut results);
    }
    if wants(&fx, "ordered") || wants(&fx, "by_key") {
        ordered_modes(&fx, &mut results);
    }
    if wants(&fx, "inserts") {
        for note in ordering::inserts(&mut fx) {
            results.note(note);
        }
    }
    if wants(&fx, "payloads") {
        let (figures, notes) = payloads::payloads(&mut fx);
        figures.into_iter().for_each(|figure| results.push(figure));
        notes.into_iter().for_each(|note| results.note(note));
    }
    if wants(&fx, "large") {
        results.push(memory::large_payloads(&mut fx));
    }
    if wants(&fx, "empty") {
        empty(&mut fx, &mut results);
    }
    if wants(&fx, "connect") {
        results.block(connect::empty_runs(&mut fx));
    }
    if wants(&fx, "traces") {
        results.block(traces::compare(&mut fx));
    }
    if wants(&fx, "latency") {
        results.block(latency::latency(&mut fx));
    }
    if wants(&fx, "trigger") {
        results.block(latency::trigger_cost(&mut fx));
    }
    for block in many::sections(&mut fx) {
        results.block(block);
    }
    scale::sections(&mut fx, &mut results);
    results.print();
    let failed = FAILED.load(std::sync::atomic::Ordering::SeqCst);
    drop(fx);
    if failed {
        println!("FAILURE: events were lost or rows left unmarked (see above)");
        std::process::exit(1);
    }
    println!("OK: every event arrived and every row is marked");
}
