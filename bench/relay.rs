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
//! scaling).

use std::collections::{HashMap, VecDeque};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::join_all;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use outbox_poll::broker::message::{properties, short_strings};
use outbox_poll::cli::DEFAULT_MAX_ATTEMPTS;
use outbox_poll::config::in_flight;
use outbox_poll::sql::outbox::{Event, Outbox};
use outbox_poll::sql::table::TableName;
use postgres::{Client, NoTls};
use tokio::runtime::Runtime;

/// The binary measured: this build's, or BENCH_BIN (to compare builds).
fn binary() -> String {
    env_or("BENCH_BIN", env!("CARGO_BIN_EXE_outbox-poll"))
}

/// GNU time measures a child it forks itself. A child spawned straight from
/// the bench (vfork + exec) would inherit the bench's own peak RSS in
/// ru_maxrss, which Linux carries across exec.
const GNU_TIME: &str = "/usr/bin/time";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

fn env_list(name: &str, default: &str) -> Vec<i64> {
    env_or(name, default)
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().expect("a comma-separated list of numbers"))
        .collect()
}

struct Settings {
    database_url: String,
    amqp_url: String,
    events: i64,
    naive_events: i64,
    empty_runs: usize,
    batches: Vec<i64>,
    scaling: Vec<i64>,
    scaling_batch: i64,
    only: Option<Vec<String>>,
}

impl Settings {
    fn from_env() -> Settings {
        Settings {
            database_url: env_or(
                "BENCH_DATABASE_URL",
                "postgresql://postgres@127.0.0.1:5432/test",
            ),
            amqp_url: env_or("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
            events: env_or("BENCH_EVENTS", "100000").parse().unwrap(),
            naive_events: env_or("BENCH_NAIVE_EVENTS", "10000").parse().unwrap(),
            empty_runs: env_or("BENCH_EMPTY_RUNS", "50").parse().unwrap(),
            batches: env_list("BENCH_BATCHES", "100,1000,5000"),
            scaling: env_list("BENCH_SCALING", "1,2,4"),
            scaling_batch: env_or("BENCH_SCALING_BATCH", "1000").parse().unwrap(),
            only: std::env::var("BENCH_ONLY")
                .ok()
                .map(|s| s.split(',').map(|p| p.trim().to_string()).collect()),
        }
    }

    fn wants(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|s| s == section))
    }
}

/// The bench's own schema, exchange and queue; removed on drop.
struct Fixture {
    name: String,
    db: Client,
    runtime: Runtime,
    connection: Connection,
    channel: Channel,
    settings: Settings,
}

/// One measured figure.
struct Figure {
    name: String,
    events: u64,
    seconds: f64,
    rss_kb: Option<u64>,
    verified: String,
}

impl Figure {
    fn rate(&self) -> f64 {
        self.events as f64 / self.seconds
    }
}

impl Fixture {
    fn new(settings: Settings) -> Fixture {
        let name = format!("bench_{}", std::process::id());
        let mut db =
            Client::connect(&settings.database_url, NoTls).expect("connecting to PostgreSQL");
        db.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name};"
        ))
        .unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (connection, channel) = runtime.block_on(async {
            let connection =
                Connection::connect(&settings.amqp_url, ConnectionProperties::default())
                    .await
                    .expect("connecting to RabbitMQ");
            let channel = connection.create_channel().await.unwrap();
            channel
                .exchange_declare(
                    name.as_str().into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            channel
                .queue_declare(
                    name.as_str().into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            channel
                .queue_bind(
                    name.as_str().into(),
                    name.as_str().into(),
                    "#".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
            (connection, channel)
        });
        let fixture = Fixture {
            name,
            db,
            runtime,
            connection,
            channel,
            settings,
        };
        let status = fixture
            .command()
            .arg("migrate")
            .status()
            .expect("running outbox-poll migrate");

        assert!(status.success(), "outbox-poll migrate failed");
        fixture
    }

    fn table(&self) -> String {
        format!("{}.outbox", self.name)
    }

    fn command(&self) -> Command {
        self.command_measured(None)
    }

    /// With `rss`, the binary runs under GNU time, which writes its peak
    /// RSS (KiB) to that file.
    fn command_measured(&self, rss: Option<&std::path::Path>) -> Command {
        let mut command = match rss {
            Some(file) => {
                let mut command = Command::new(GNU_TIME);
                command
                    .args(["-f", "%M", "-q", "-o"])
                    .arg(file)
                    .arg(binary());
                command
            }
            None => Command::new(binary()),
        };
        for (name, _) in std::env::vars() {
            if name.starts_with("PG")
                || name.starts_with("OUTBOX_")
                || ["DATABASE_URL", "AMQP_URL", "RUST_LOG"].contains(&name.as_str())
            {
                command.env_remove(name);
            }
        }
        command
            .env("DATABASE_URL", &self.settings.database_url)
            .env("AMQP_URL", &self.settings.amqp_url)
            .env("OUTBOX_TABLE", self.table())
            .env("OUTBOX_EXCHANGE", &self.name)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        command
    }

    /// An empty table and queue, then `count` events of about `bytes` bytes
    /// of JSON each (as PostgreSQL prints them). Returns the mean size.
    fn fill(&mut self, count: i64, bytes: i64) -> f64 {
        self.purge();
        let table = self.table();
        // The rest of the object prints as 84 to 98 bytes: the mean payload
        // is about 13 bytes under `bytes` (200: 187, 1024: 1011).
        let note = (bytes - 110).max(0);
        self.db
            .batch_execute(&format!("TRUNCATE {table} RESTART IDENTITY"))
            .unwrap();
        self.db
            .execute(
                &format!(
                    "INSERT INTO {table} (event_id, event_type, payload) \
                     SELECT 'ev-' || g, 'order.created', jsonb_build_object( \
                       'order_id', g, 'customer', 'cust-' || (g % 977), \
                       'amount_cents', (g * 7919) % 100000, 'currency', 'EUR', \
                       'note', repeat('x', $2::int)) \
                     FROM generate_series(1, $1::bigint) g"
                ),
                &[&count, &(note as i32)],
            )
            .unwrap();
        self.db
            .batch_execute(&format!("VACUUM ANALYZE {table}"))
            .unwrap();
        let row = self
            .db
            .query_one(
                &format!("SELECT coalesce(avg(length(payload::text)), 0)::float8 FROM {table}"),
                &[],
            )
            .unwrap();
        row.get(0)
    }

    fn purge(&self) {
        self.runtime.block_on(async {
            self.channel
                .queue_purge(self.name.as_str().into(), QueuePurgeOptions::default())
                .await
                .unwrap();
        });
    }

    fn unmarked(&mut self) -> i64 {
        self.db
            .query_one(
                &format!(
                    "SELECT count(*) FROM {} WHERE published_at IS NULL",
                    self.table()
                ),
                &[],
            )
            .unwrap()
            .get(0)
    }

    /// Takes every message off the queue; how often each event id arrived.
    fn arrivals(&self) -> HashMap<String, u32> {
        self.runtime.block_on(async {
            let queue = self
                .channel
                .queue_declare(
                    self.name.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            let total = queue.message_count();
            let channel = self.connection.create_channel().await.unwrap();
            let mut consumer = channel
                .basic_consume(
                    self.name.as_str().into(),
                    "bench-verify".into(),
                    BasicConsumeOptions {
                        no_ack: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            let mut counts = HashMap::new();
            let mut seen = 0;
            while seen < total {
                let next = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await;
                let Ok(Some(Ok(delivery))) = next else { break };
                let id = delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.to_string())
                    .unwrap_or_default();
                *counts.entry(id).or_insert(0) += 1;
                seen += 1;
            }
            let _ = channel.close(200, "bye".into()).await;
            counts
        })
    }

    /// Checks that events ev-1..ev-`count` each arrived (at least) once and,
    /// if `rows`, that every row is marked. Returns the verdict text and
    /// whether it is a failure (a lost event, an unmarked row).
    fn verify(&mut self, count: i64, messages: bool, rows: bool) -> (String, bool) {
        let mut notes = Vec::new();
        let mut failed = false;
        if messages {
            let arrivals = self.arrivals();
            let lost = (1..=count)
                .filter(|n| !arrivals.contains_key(&format!("ev-{n}")))
                .count();
            let duplicates: u32 = arrivals.values().map(|c| c - 1).sum();
            let strangers = arrivals.len() as i64 - (count - lost as i64);
            if lost > 0 || strangers > 0 {
                failed = true;
                notes.push(format!("LOST {lost}"));
            }
            if duplicates > 0 {
                notes.push(format!("{duplicates} dup"));
            }
            if lost == 0 {
                notes.push(format!("{count} arrived"));
            }
        }
        if rows {
            let unmarked = self.unmarked();
            if unmarked > 0 {
                failed = true;
                notes.push(format!("UNMARKED {unmarked}"));
            } else {
                notes.push("all marked".into());
            }
        }
        (notes.join(", "), failed)
    }

    /// Runs `outbox-poll` with `args` `processes` times at once; the wall
    /// time of all, the events they published, the highest peak RSS (KiB,
    /// if `rss` and GNU time is installed), and whether all exited 0.
    fn run_binary(
        &self,
        processes: i64,
        args: &[&str],
        rss: bool,
    ) -> (f64, u64, Option<u64>, bool) {
        let rss = rss && std::path::Path::new(GNU_TIME).exists();
        let files: Vec<_> = (0..processes)
            .map(|i| std::env::temp_dir().join(format!("{}_{i}.rss", self.name)))
            .collect();
        let started = Instant::now();
        let children: Vec<_> = files
            .iter()
            .map(|file| {
                self.command_measured(rss.then_some(file.as_path()))
                    .args(args)
                    .spawn()
                    .expect("spawning outbox-poll")
            })
            .collect();
        let mut published = 0;
        let mut peak = None;
        let mut ok = true;
        for (mut child, file) in children.into_iter().zip(&files) {
            let status = child.wait().expect("waiting for outbox-poll");
            let mut out = String::new();
            use std::io::Read;
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut out)
                .unwrap();
            if !status.success() {
                eprintln!("outbox-poll {args:?} exited {status}: {out}");
                ok = false;
            }
            if let Some(line) = out.lines().last() {
                let summary: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
                published += summary["published"].as_u64().unwrap_or(0);
            }
            if rss {
                let text = std::fs::read_to_string(file).unwrap_or_default();
                let kb: Option<u64> = text.trim().lines().last().and_then(|l| l.parse().ok());
                peak = peak.max(kb);
                let _ = std::fs::remove_file(file);
            }
        }
        (started.elapsed().as_secs_f64(), published, peak, ok)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self
            .db
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        self.runtime.block_on(async {
            let _ = self
                .channel
                .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = self
                .channel
                .exchange_delete(self.name.as_str().into(), ExchangeDeleteOptions::default())
                .await;
            let _ = self.connection.close(200, "bye".into()).await;
        });
    }
}

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

static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn check(failed: bool, verdict: &str) {
    if failed {
        eprintln!("FAILURE: {verdict}");
        FAILED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn print_figure(figure: &Figure, broker: Option<f64>, pg: Option<f64>) {
    let ratio = |limit: Option<f64>| match limit {
        Some(limit) => format!("{:>5.0}%", 100.0 * figure.rate() / limit),
        None => "    -".into(),
    };
    let rss = match figure.rss_kb {
        Some(kb) => format!("{:>7.1}", kb as f64 / 1024.0),
        None => "      -".into(),
    };
    println!(
        "| {:<58} | {:>7} | {:>6.2} | {:>8.0} | {} | {} | {} | {} |",
        figure.name,
        figure.events,
        figure.seconds,
        figure.rate(),
        rss,
        ratio(broker),
        ratio(pg),
        figure.verified
    );
}

fn header() {
    println!(
        "| {:<58} | {:>7} | {:>6} | {:>8} | {:>7} | {:>6} | {:>5} | verified |",
        "run", "events", "s", "events/s", "RSS MiB", "/broker", "/pg"
    );
    println!("|{}|---:|---:|---:|---:|---:|---:|---|", "-".repeat(60));
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
    println!("\ntotal bench time {:.0}s", started.elapsed().as_secs_f64());
    let failed = FAILED.load(std::sync::atomic::Ordering::SeqCst);
    drop(fx);
    if failed {
        println!("FAILURE: events were lost or rows left unmarked (see above)");
        std::process::exit(1);
    }
    println!("OK: every event arrived and every row is marked");
}
