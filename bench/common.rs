//! The benchmark's harness: its own schema, exchange and queue (removed on
//! drop), the table filled with events, the binary run and timed, and every
//! measured run verified (every event arrived, every row marked).

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use postgres::{Client, NoTls};
use tokio::runtime::Runtime;

/// The binary measured: this build's, or BENCH_BIN (to compare builds).
pub fn binary() -> String {
    env_or("BENCH_BIN", env!("CARGO_BIN_EXE_outbox-poll"))
}

/// GNU time measures a child it forks itself. A child spawned straight from
/// the bench (vfork + exec) would inherit the bench's own peak RSS in
/// ru_maxrss, which Linux carries across exec.
pub const GNU_TIME: &str = "/usr/bin/time";

pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

pub fn env_list(name: &str, default: &str) -> Vec<i64> {
    env_or(name, default)
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().expect("a comma-separated list of numbers"))
        .collect()
}

#[derive(Clone)]
pub struct Settings {
    pub database_url: String,
    pub amqp_url: String,
    pub events: i64,
    pub naive_events: i64,
    pub empty_runs: usize,
    pub batches: Vec<i64>,
    pub scaling: Vec<i64>,
    pub scaling_batch: i64,
    /// Whether a fill ends with VACUUM as well as ANALYZE (BENCH_FILL=vacuum;
    /// default analyze). A relay meets a backlog its producers have just
    /// written, which no vacuum has visited: the relay's first reads of
    /// each row then set its hint bits, which a vacuumed table has already.
    pub fill_vacuum: bool,
    pub ordered_events: i64,
    pub few_keys_events: i64,
    pub insert_rows: i64,
    pub only: Option<Vec<String>>,
}

impl Settings {
    pub fn from_env() -> Settings {
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
            fill_vacuum: env_or("BENCH_FILL", "analyze") == "vacuum",
            ordered_events: env_or("BENCH_ORDERED_EVENTS", "20000").parse().unwrap(),
            few_keys_events: env_or("BENCH_FEW_KEYS_EVENTS", "20000").parse().unwrap(),
            insert_rows: env_or("BENCH_INSERT_ROWS", "20000").parse().unwrap(),
            only: std::env::var("BENCH_ONLY")
                .ok()
                .map(|s| s.split(',').map(|p| p.trim().to_string()).collect()),
        }
    }

    /// Whether to run `section`: every section when BENCH_ONLY is unset.
    pub fn wants(&self, section: &str) -> bool {
        self.only.is_none() || self.named(section)
    }

    /// Whether BENCH_ONLY names `section`: the sections that fill millions
    /// of rows run only when asked for.
    pub fn named(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_some_and(|only| only.iter().any(|s| s == section))
    }
}

/// The bench's own schema, exchange and queue; removed on drop.
pub struct Fixture {
    pub name: String,
    /// Where `own_database` was created from, to drop it.
    admin_url: String,
    /// The database this fixture created (see `in_own_database`).
    own_database: Option<String>,
    pub db: Client,
    pub runtime: Runtime,
    pub connection: Connection,
    pub channel: Channel,
    pub settings: Settings,
    /// Variables every run of the binary gets (bench/traces.rs sets the
    /// OTLP endpoint this way).
    pub env: Vec<(String, String)>,
}

/// One measured figure.
pub struct Figure {
    pub name: String,
    pub events: u64,
    pub seconds: f64,
    pub rss_kb: Option<u64>,
    pub verified: String,
    /// The machine's load average (1 minute) when the figure was taken:
    /// figures taken beside other work are not comparable.
    pub load: f64,
}

impl Figure {
    pub fn rate(&self) -> f64 {
        self.events as f64 / self.seconds
    }
}

/// The load average over the last minute, from /proc/loadavg (0 where
/// there is none).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// What the sections measured: the figures of the table, the limits they
/// are compared with, and the lines printed under it (figures that are not
/// rates: milliseconds, sizes, ratios to a baseline).
pub struct Results {
    pub figures: Vec<Figure>,
    /// The broker alone, with the messages the contract requires: the limit.
    pub broker: Option<f64>,
    /// The broker alone with bare messages, shown beside it.
    pub bare: Option<f64>,
    pub pg: Option<f64>,
    pub notes: Vec<String>,
    /// Sections of their own, printed after the table (--follow's latency).
    pub blocks: Vec<Vec<String>>,
    pub started: Instant,
}

impl Results {
    pub fn new() -> Results {
        Results {
            figures: Vec::new(),
            broker: None,
            bare: None,
            pg: None,
            notes: Vec::new(),
            blocks: Vec::new(),
            started: Instant::now(),
        }
    }

    pub fn push(&mut self, figure: Figure) {
        eprintln!(
            "bench: {}: {:.0}/s, {} (load {:.2})",
            figure.name,
            figure.rate(),
            figure.verified,
            figure.load
        );
        self.figures.push(figure);
    }

    /// A section of its own lines, printed after the table.
    pub fn block(&mut self, lines: Vec<String>) {
        self.blocks.push(lines);
    }

    /// A line under the table, with the load average now.
    pub fn note(&mut self, line: String) {
        let line = format!("{line} (load {:.2})", load_average());
        eprintln!("bench: {line}");
        self.notes.push(line);
    }

    pub fn section_done(&self, section: &str) {
        eprintln!(
            "bench: {section} done at {:.0}s",
            self.started.elapsed().as_secs_f64()
        );
    }

    pub fn print(&self) {
        println!();
        header();
        for figure in &self.figures {
            print_figure(figure, [self.broker, self.bare, self.pg]);
        }
        if !self.notes.is_empty() {
            println!();
        }
        for note in &self.notes {
            println!("{note}");
        }
        for block in &self.blocks {
            println!();
            for line in block {
                println!("{line}");
            }
        }
        println!(
            "\ntotal bench time {:.0}s",
            self.started.elapsed().as_secs_f64()
        );
    }
}

impl Fixture {
    pub fn new(settings: Settings) -> Fixture {
        let admin_url = settings.database_url.clone();
        Fixture::named(
            format!("bench_{}", std::process::id()),
            settings,
            admin_url,
            None,
        )
    }

    /// A fixture in a database of its own, `bench_<pid>_<suffix>`, created
    /// on the server of BENCH_DATABASE_URL and dropped with the fixture.
    /// The ordered modes wait for every transaction of their database that
    /// could still insert an event sorting first: in a database of their
    /// own, no one else's transactions (tests, other benches) hold them.
    pub fn in_own_database(mut settings: Settings, suffix: &str) -> Fixture {
        let name = format!("bench_{}_{suffix}", std::process::id());
        let admin_url = settings.database_url.clone();
        let mut admin = Client::connect(&admin_url, NoTls).expect("connecting to PostgreSQL");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE template0"))
            .unwrap();
        settings.database_url = url_in_database(&admin_url, &name);
        Fixture::named(name.clone(), settings, admin_url, Some(name))
    }

    fn named(
        name: String,
        settings: Settings,
        admin_url: String,
        own_database: Option<String>,
    ) -> Fixture {
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
            admin_url,
            own_database,
            db,
            runtime,
            connection,
            channel,
            settings,
            env: Vec::new(),
        };
        let status = fixture
            .command()
            .arg("migrate")
            .status()
            .expect("running outbox-poll migrate");

        assert!(status.success(), "outbox-poll migrate failed");
        fixture
    }

    pub fn table(&self) -> String {
        format!("{}.outbox", self.name)
    }

    pub fn command(&self) -> Command {
        self.command_measured(None)
    }

    /// With `rss`, the binary runs under GNU time, which writes its peak
    /// RSS (KiB) to that file.
    pub fn command_measured(&self, rss: Option<&std::path::Path>) -> Command {
        self.command_of(&binary(), rss)
    }

    /// `command_measured` for the binary at `bin`.
    pub fn command_of(&self, bin: &str, rss: Option<&std::path::Path>) -> Command {
        let mut command = match rss {
            Some(file) => {
                let mut command = Command::new(GNU_TIME);
                command.args(["-f", "%M", "-q", "-o"]).arg(file).arg(bin);
                command
            }
            None => Command::new(bin),
        };
        for (name, _) in std::env::vars() {
            if name.starts_with("PG")
                || name.starts_with("OUTBOX_")
                || name.starts_with("OTEL_")
                || ["DATABASE_URL", "AMQP_URL", "RUST_LOG"].contains(&name.as_str())
            {
                command.env_remove(name);
            }
        }
        command.envs(self.env.iter().map(|(name, value)| (name, value)));
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
    pub fn fill(&mut self, count: i64, bytes: i64) -> f64 {
        self.fill_keyed(count, bytes, None)
    }

    /// `fill`, and with `keys` each event gets ordering_key `key-<n % keys>`:
    /// the keys interleaved, as many events each.
    /// Like `fill`, the events spread over `keys` ordering keys (with
    /// `Some`), interleaved.
    pub fn fill_keyed(&mut self, count: i64, bytes: i64, keys: Option<i64>) -> f64 {
        self.purge();
        let table = self.table();
        self.db
            .batch_execute(&format!("TRUNCATE {table} RESTART IDENTITY"))
            .unwrap();
        self.insert_events("ev", count, bytes, "now()", false, keys);
        let analyze = match self.settings.fill_vacuum {
            true => "VACUUM ANALYZE",
            false => "ANALYZE",
        };
        self.db
            .batch_execute(&format!("{analyze} {table}"))
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

    /// Inserts `count` events `<prefix>-1` .. of about `bytes` bytes of JSON
    /// each, created at `created` (an SQL expression of the series number
    /// g: the bench's own constants), and if `published` published a
    /// minute later.
    pub fn insert_events(
        &mut self,
        prefix: &str,
        count: i64,
        bytes: i64,
        created: &str,
        published: bool,
        keys: Option<i64>,
    ) {
        // The rest of the object prints as 84 to 98 bytes: the mean payload
        // is about 13 bytes under `bytes` (200: 187, 1024: 1011).
        let note = (bytes - 110).max(0) as i32;
        // With `keys`, ordering keys key-0 .. key-(keys - 1), interleaved.
        let (key_column, key_value) = match keys {
            Some(keys) => (", ordering_key", format!(", 'key-' || g % {keys}")),
            None => ("", String::new()),
        };
        let sql = format!(
            "INSERT INTO {} (event_id, event_type, payload, created_at, published_at{key_column}) \
             SELECT $3 || '-' || g, 'order.created', jsonb_build_object( \
               'order_id', g, 'customer', 'cust-' || (g % 977), \
               'amount_cents', (g * 7919) % 100000, 'currency', 'EUR', \
               'note', repeat('x', $2::int)), \
               created, CASE WHEN $4 THEN created + interval '1 minute' END{key_value} \
             FROM (SELECT g, {created} AS created FROM generate_series(1, $1::bigint) g) s",
            self.table()
        );
        self.db
            .execute(&sql, &[&count, &note, &prefix, &published])
            .unwrap();
    }

    pub fn purge(&self) {
        self.runtime.block_on(async {
            self.channel
                .queue_purge(self.name.as_str().into(), QueuePurgeOptions::default())
                .await
                .unwrap();
        });
    }

    /// The table's rows, whatever their state.
    pub fn remaining(&mut self) -> i64 {
        let sql = format!("SELECT count(*) FROM {}", self.table());
        self.db.query_one(&sql, &[]).unwrap().get(0)
    }

    /// The table's size on disk with its indexes and TOAST, its partitions
    /// summed, in bytes.
    pub fn table_size(&mut self) -> i64 {
        let sql = format!(
            "SELECT sum(pg_total_relation_size(oid))::bigint FROM pg_class \
             WHERE oid = '{t}'::regclass \
                OR oid IN (SELECT relid FROM pg_partition_tree('{t}'::regclass))",
            t = self.table()
        );
        self.db.query_one(&sql, &[]).unwrap().get(0)
    }

    pub fn unmarked(&mut self) -> i64 {
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
    pub fn arrivals(&self) -> HashMap<String, u32> {
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
    pub fn verify(&mut self, count: i64, messages: bool, rows: bool) -> (String, bool) {
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
    pub fn run_binary(
        &self,
        processes: i64,
        args: &[&str],
        rss: bool,
    ) -> (f64, u64, Option<u64>, bool) {
        self.run_binary_of(&binary(), processes, args, rss)
    }

    /// `run_binary` for the binary at `bin`.
    pub fn run_binary_of(
        &self,
        bin: &str,
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
                self.command_of(bin, rss.then_some(file.as_path()))
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

    /// Runs the binary at `bin` with `args` (which end with --json)
    /// `processes` times at once over the `count` events the table holds,
    /// and verifies that every event arrived and every row is marked.
    pub fn measure(
        &mut self,
        bin: &str,
        name: String,
        count: i64,
        processes: i64,
        args: &[&str],
    ) -> Figure {
        let (seconds, published, rss, ok) = self.run_binary_of(bin, processes, args, true);
        let (mut verified, mut failed) = self.verify(count, true, true);
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
            load: load_average(),
        };
        eprintln!(
            "bench: {}: {:.0}/s, {:?} KiB",
            figure.name,
            figure.rate(),
            rss
        );
        figure
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = match &self.own_database {
            Some(database) => Client::connect(&self.admin_url, NoTls).and_then(|mut admin| {
                admin.batch_execute(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
            }),
            None => self
                .db
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name)),
        };
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

/// `url` (a PostgreSQL URL) naming database `dbname` instead.
pub fn url_in_database(url: &str, dbname: &str) -> String {
    let config: postgres::Config = url.parse().expect("BENCH_DATABASE_URL");
    let user = config.get_user().unwrap_or("postgres");
    let password = match config.get_password() {
        Some(password) => format!(":{}", String::from_utf8_lossy(password)),
        None => String::new(),
    };
    let host = match &config.get_hosts()[0] {
        postgres::config::Host::Tcp(host) => host.clone(),
        other => panic!("the bench needs a TCP database host, not {other:?}"),
    };
    let port = config.get_ports()[0];
    // The query (sslmode, options) goes with it, so that a bench run with
    // BENCH_DATABASE_URL=...?sslmode=disable reaches every database that way.
    let query = url
        .split_once('?')
        .map_or(String::new(), |(_, query)| format!("?{query}"));
    format!("postgresql://{user}{password}@{host}:{port}/{dbname}{query}")
}

pub static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn check(failed: bool, verdict: &str) {
    if failed {
        eprintln!("FAILURE: {verdict}");
        FAILED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// `limits`: the broker's (contract messages), the broker's with bare
/// messages, PostgreSQL's.
pub fn print_figure(figure: &Figure, limits: [Option<f64>; 3]) {
    let ratio = |limit: Option<f64>| match limit {
        Some(limit) => format!("{:>5.0}%", 100.0 * figure.rate() / limit),
        None => "    -".into(),
    };
    let rss = match figure.rss_kb {
        Some(kb) => format!("{:>7.1}", kb as f64 / 1024.0),
        None => "      -".into(),
    };
    println!(
        "| {:<58} | {:>7} | {:>6.2} | {:>8.0} | {} | {} | {} | {} | {:>5.2} | {} |",
        figure.name,
        figure.events,
        figure.seconds,
        figure.rate(),
        rss,
        ratio(limits[0]),
        ratio(limits[1]),
        ratio(limits[2]),
        figure.load,
        figure.verified
    );
}

pub fn header() {
    println!(
        "| {:<58} | {:>7} | {:>6} | {:>8} | {:>7} | {:>6} | {:>6} | {:>5} | {:>5} | verified |",
        "run", "events", "s", "events/s", "RSS MiB", "/broker", "/bare", "/pg", "load"
    );
    println!(
        "|{}|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        "-".repeat(60)
    );
}

/// The median of `millis`; of an even count, the mean of the two middle
/// values (bench/many.rs's start-up loops take turns at going first, and
/// the upper middle value alone would be a slow first-place run of each).
pub fn median(mut millis: Vec<f64>) -> f64 {
    millis.sort_by(f64::total_cmp);
    let half = millis.len() / 2;
    match millis.len() % 2 {
        0 => (millis[half - 1] + millis[half]) / 2.0,
        _ => millis[half],
    }
}
