//! `--follow` (sections "latency" and "trigger").
//!
//! latency: end-to-end latency as a user's producers and consumers see
//! it, at steady rates for BENCH_LATENCY_SECONDS each, with `outbox-poll
//! --follow` (BENCH_BIN) started 1.5 s before the producer, on a table
//! with the notify trigger (`migrate --notify`) and on one without (the
//! follow polls). The producer is a process of its own (this bench run
//! again with PRODUCER set): single-row INSERTs, each its own transaction,
//! paced at the rate (a late one is sent at once, not skipped; the rate
//! achieved is reported). The consumer has a connection of its own, a
//! durable queue bound `#`, auto-ack. Latency = the consumer's receipt
//! minus the moment the producer's INSERT returned (its commit included),
//! both read from the system's real-time clock, the one clock two
//! processes share. Under them, RabbitMQ alone: the contract's messages
//! published by the bench at the same rate, from the publish to the
//! consumer's receipt, the floor no relay goes below. Compared in the
//! same run with an every-10-s crontab, measured: the same binary run with --drain at 10, 20 and 30 s into the
//! same producer's run (the crontab's one-batch lines could not keep up
//! with 100 events/s). Then the CPU an idle follow uses over
//! BENCH_IDLE_SECONDS, its own and that of its PostgreSQL backend (utime +
//! stime from /proc/PID/stat), for both tables.
//!
//! trigger: what the notify trigger costs producers: inserts/s into a table
//! with it and one without, single-row and 100-row transactions, 1 and 8
//! concurrent producers, BENCH_TRIGGER_SECONDS each, every pair measured
//! twice, alternating.
//!
//! Every figure is printed with the 1-minute load average when it was
//! taken: the machine may be shared.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use postgres::{Client, NoTls};

use outbox_poll::broker::message::outgoing;

use crate::common::{Fixture, check, env_list, env_or};

/// Set in the environment of the bench's own child process that produces
/// (see `producer`).
pub const PRODUCER: &str = "BENCH_LATENCY_PRODUCER";
/// How long a follow has been quiet when the producer starts: long enough
/// for a polling follow to be at its slowest.
const QUIET_BEFORE: Duration = Duration::from_millis(1500);
/// The crontab compared: a run every 10 seconds.
const CRON_EVERY: Duration = Duration::from_secs(10);
/// How long after the producer's last commit every event must have arrived.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(30);

/// Nanoseconds since the Unix epoch: the real-time clock, which the
/// producer process and the consumer read alike.
fn epoch_ns() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_nanos()).unwrap()
}

/// One table of the bench's schema, migrated with or without the trigger,
/// its own exchange and a queue bound to every key, consumed on a
/// connection of its own, and when (epoch_ns) the consumer received each
/// event id.
struct Lane {
    table: String,
    exchange: String,
    connection: Connection,
    channel: Channel,
    received: Arc<Mutex<HashMap<String, u64>>>,
}

impl Lane {
    fn new(fx: &Fixture, suffix: &str, notify: bool) -> Lane {
        let table = migrated(fx, suffix, notify);
        let exchange = format!("{}_{suffix}", fx.name);
        let received = Arc::new(Mutex::new(HashMap::new()));
        let (connection, channel) = fx.runtime.block_on(async {
            let properties = ConnectionProperties::default();
            let connection = Connection::connect(&fx.settings.amqp_url, properties)
                .await
                .expect("connecting the consumer to RabbitMQ");
            let channel = connection.create_channel().await.unwrap();
            let durable = ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            };
            let none = FieldTable::default;
            channel
                .exchange_declare(
                    exchange.as_str().into(),
                    ExchangeKind::Topic,
                    durable,
                    none(),
                )
                .await
                .unwrap();
            let queue = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            channel
                .queue_declare(exchange.as_str().into(), queue, none())
                .await
                .unwrap();
            channel
                .queue_bind(
                    exchange.as_str().into(),
                    exchange.as_str().into(),
                    "#".into(),
                    QueueBindOptions::default(),
                    none(),
                )
                .await
                .unwrap();
            let consume = BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            };
            let mut consumer = channel
                .basic_consume(exchange.as_str().into(), "latency".into(), consume, none())
                .await
                .unwrap();
            let received = Arc::clone(&received);
            tokio::spawn(async move {
                while let Some(Ok(delivery)) = consumer.next().await {
                    let at = epoch_ns();
                    if let Some(id) = delivery.properties.message_id() {
                        received.lock().unwrap().entry(id.to_string()).or_insert(at);
                    }
                }
            });
            (connection, channel)
        });
        Lane {
            table,
            exchange,
            connection,
            channel,
            received,
        }
    }

    /// The binary with this lane's table and exchange.
    fn command(&self, fx: &Fixture, args: &[&str]) -> Command {
        let mut command = fx.command();
        command
            .args(["--table", &self.table, "--exchange", &self.exchange])
            .args(args);
        command
    }

    fn empty(&self, fx: &mut Fixture) {
        empty(fx, &self.table);
        self.received.lock().unwrap().clear();
    }

    fn remove(self, fx: &Fixture) {
        fx.runtime.block_on(async {
            let _ = self
                .channel
                .queue_delete(self.exchange.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = self
                .channel
                .exchange_delete(
                    self.exchange.as_str().into(),
                    ExchangeDeleteOptions::default(),
                )
                .await;
            let _ = self.connection.close(200, "bye".into()).await;
        });
    }
}

/// A table `suffix` in the bench's schema, migrated, with the notify
/// trigger or without.
fn migrated(fx: &Fixture, suffix: &str, notify: bool) -> String {
    let table = format!("{}.{suffix}", fx.name);
    let mut migrate = fx.command();
    migrate.args(["migrate", "--table", &table]);
    if notify {
        migrate.arg("--notify");
    }
    assert!(migrate.status().unwrap().success(), "migrating {table}");
    table
}

fn empty(fx: &mut Fixture, table: &str) {
    fx.db.batch_execute(&format!("TRUNCATE {table}")).unwrap();
}

/// When (epoch_ns) each event's INSERT returned.
type Commits = Vec<(String, u64)>;

/// A way of relaying a lane's events while the producer runs at a rate
/// for a number of seconds.
type Relaying = fn(&mut Fixture, &Lane, u64, u64) -> Commits;

/// Runs the producer process, inserting `rate` events a second into
/// `table` for `seconds`; its commits, once it is done.
fn produce(url: String, table: String, rate: u64, seconds: u64) -> thread::JoinHandle<Commits> {
    // Ids of their own for each run: no late message of another run can
    // be taken for one of these.
    let tag = format!("lat-{rate}-{}", epoch_ns());
    let spec = [url, table, rate.to_string(), seconds.to_string(), tag].join("\t");
    thread::spawn(move || {
        let output = Command::new(std::env::current_exe().unwrap())
            .env(PRODUCER, spec)
            .stderr(Stdio::inherit())
            .output()
            .expect("running the producer");
        assert!(output.status.success(), "the producer failed");
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|line| {
                let (id, at) = line.split_once(' ').unwrap();
                (id.to_string(), at.parse().unwrap())
            })
            .collect()
    })
}

/// The producer process (PRODUCER is "url, table, rate, seconds, tag",
/// tab-separated): as an application commits its events, one INSERT per
/// transaction, on a connection of its own, paced at the rate. Prints each
/// event id and when its INSERT returned, once done: nothing but the
/// INSERTs while it runs.
pub fn producer(spec: &str) {
    let fields: Vec<&str> = spec.split('\t').collect();
    let [url, table, rate, seconds, tag] = fields[..] else {
        panic!("{PRODUCER} should hold 5 tab-separated fields, not {spec:?}");
    };
    let (rate, seconds): (u64, u64) = (rate.parse().unwrap(), seconds.parse().unwrap());
    let mut client = Client::connect(url, NoTls).unwrap();
    let insert = client
        .prepare(&format!(
            "INSERT INTO {table} (event_id, event_type, payload) \
             VALUES ($1, 'latency.measured', jsonb_build_object('n', $2::bigint, 'note', repeat('x', 150)))"
        ))
        .unwrap();
    let events = rate * seconds;
    let mut commits = Vec::with_capacity(events as usize);
    let started = Instant::now();
    for n in 0..events {
        let due = started + Duration::from_secs_f64(n as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let id = format!("{tag}-{n}");
        client.execute(&insert, &[&id, &(n as i64)]).unwrap();
        commits.push((id, epoch_ns()));
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (id, at) in commits {
        writeln!(out, "{id} {at}").unwrap();
    }
}

/// How late a wake of the pause watcher must be to count as a pause.
const PAUSE: f64 = 5.0;

/// A thread of the bench's own that sleeps a millisecond at a time while
/// a line runs, and records each wake more than PAUSE ms late: when it
/// woke (epoch_ns) and how late (ms). The consumer runs in this process,
/// so a pause of the machine (every core busy, or taken by the host)
/// delays its receipts as much as any relay would; a slowest event whose
/// way overlaps one is told apart on stderr.
struct Pauses {
    done: Arc<AtomicBool>,
    thread: thread::JoinHandle<Vec<(u64, f64)>>,
}

impl Pauses {
    fn watch() -> Pauses {
        let done = Arc::new(AtomicBool::new(false));
        let thread = {
            let done = Arc::clone(&done);
            thread::spawn(move || {
                let mut pauses = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    let asleep = Instant::now();
                    thread::sleep(Duration::from_millis(1));
                    let late = asleep.elapsed().as_secs_f64() * 1000.0 - 1.0;
                    if late > PAUSE {
                        pauses.push((epoch_ns(), late));
                    }
                }
                pauses
            })
        };
        Pauses { done, thread }
    }

    fn end(self) -> Vec<(u64, f64)> {
        self.done.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// The CPU time the host took from this machine (steal, all CPUs), in
/// clock ticks of 10 ms (as `cpu_ms` counts them), from /proc/stat; 0
/// where it is not counted.
fn stolen_ticks() -> u64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpu = text.lines().next().unwrap_or_default();
    cpu.split_whitespace()
        .nth(8)
        .and_then(|steal| steal.parse().ok())
        .unwrap_or(0)
}

fn load() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split(' ').next().unwrap_or("?").to_string()
}

fn signal(child: &Child, name: &str) {
    let _ = Command::new("kill")
        .args([name, &child.id().to_string()])
        .status();
}

/// The latencies of the events received, in milliseconds, with the
/// seconds into the producer's run when each committed, in commit order;
/// and how many never arrived.
fn latencies(lane: &Lane, commits: &Commits) -> (Vec<(f64, f64)>, usize) {
    let received = lane.received.lock().unwrap();
    let first = commits.first().map_or(0, |(_, at)| *at);
    let latencies: Vec<(f64, f64)> = commits
        .iter()
        .filter_map(|(id, at)| {
            let got = received.get(id)?;
            let ms = got.saturating_sub(*at) as f64 / 1e6;
            Some((ms, (at - first) as f64 / 1e9))
        })
        .collect();
    let lost = commits.len() - latencies.len();
    (latencies, lost)
}

/// Waits until every committed event has arrived, at most ARRIVAL_LIMIT.
fn await_arrivals(lane: &Lane, commits: &Commits) {
    let deadline = Instant::now() + ARRIVAL_LIMIT;
    while Instant::now() < deadline && lane.received.lock().unwrap().len() < commits.len() {
        thread::sleep(Duration::from_millis(20));
    }
}

/// One line of the latency table. Where the slowest events committed is
/// told apart: the first second of a stream (which met a follow quiet for
/// QUIET_BEFORE) or later; and whether the bench itself paused (`pauses`,
/// see Pauses) within the slowest event's way.
fn latency_line(
    name: &str,
    (rate, seconds): (u64, u64),
    lane: &Lane,
    commits: &Commits,
    pauses: &[(u64, f64)],
) -> String {
    let (timed, lost) = latencies(lane, commits);
    check(
        lost > 0,
        &format!("{name} at {rate}/s: {lost} events never arrived"),
    );
    let slowest = timed.iter().copied().max_by(|a, b| a.0.total_cmp(&b.0));
    let slow = |first: bool| {
        let in_part = |at: f64| (at < 1.0) == first;
        let count = timed.iter().filter(|(ms, at)| *ms > 10.0 && in_part(*at));
        count.count()
    };
    eprintln!(
        "bench:   {name} at {rate}/s: over 10 ms: {} events in the stream's first second, {} after it",
        slow(true),
        slow(false)
    );
    // p99 over each 5 s of the stream: a latency that grows as the run
    // goes on is told apart from one spread over it. A slowed producer's
    // commits past `seconds` count in the last part.
    let parts = seconds.div_ceil(5).max(1);
    let by_part: Vec<String> = (0..parts)
        .map(|part| {
            let within = |at: f64| ((at / 5.0) as u64).min(parts - 1) == part;
            let part: Vec<f64> = timed
                .iter()
                .filter(|(_, at)| within(*at))
                .map(|(ms, _)| *ms)
                .collect();
            match part.is_empty() {
                true => "-".to_string(),
                false => format!("{:.1}", quantile(part, 0.99)),
            }
        })
        .collect();
    eprintln!(
        "bench:   {name} at {rate}/s: p99 by 5 s: {}",
        by_part.join(" ")
    );
    let latencies: Vec<f64> = timed.iter().map(|(ms, _)| *ms).collect();
    let at = |q: f64| quantile(latencies.clone(), q);
    // What the producer achieved, from its first commit to its last: a
    // busy machine slows it down.
    let span = match (commits.first(), commits.last()) {
        (Some((_, first)), Some((_, last))) if last > first => (last - first) as f64 / 1e9,
        _ => seconds as f64,
    };
    let achieved = (commits.len() - 1).max(1) as f64 / span;
    let (max, max_at) = slowest.unwrap_or((f64::NAN, f64::NAN));
    // The bench's pauses while the stream ran (from the first commit to
    // the last receipt: not the line's set-up), and those within the
    // slowest event's way, from its commit to its receipt.
    let first = commits.first().map_or(0, |(_, at)| *at);
    let last = lane.received.lock().unwrap().values().copied().max();
    let overlapping = |from: u64, to: u64| {
        pauses
            .iter()
            .filter(move |(woke, late)| *woke >= from && woke - (late * 1e6) as u64 <= to)
            .map(|(_, late)| *late)
    };
    let streamed: Vec<f64> = overlapping(first, last.unwrap_or(first)).collect();
    let within = match slowest {
        Some((max, max_at)) => {
            let committed = first + (max_at * 1e9) as u64;
            let received = committed + (max * 1e6) as u64;
            let found: Vec<String> = overlapping(committed, received)
                .map(|late| format!("{late:.1}"))
                .collect();
            match found.is_empty() {
                true => "none within the slowest event's way".to_string(),
                false => format!("within the slowest event's way: {} ms", found.join(", ")),
            }
        }
        None => "no event arrived".to_string(),
    };
    eprintln!(
        "bench:   {name} at {rate}/s: the bench's pauses over {PAUSE} ms while the stream ran: {}; {within}",
        streamed.len()
    );
    let paused = streamed.iter().copied().fold(0.0, f64::max);
    format!(
        "| {name:<34} | {rate:>6} | {achieved:>8.0} | {:>9.1} | {:>9.1} | {max:>9.1} | {max_at:>8.1} | {lost:>4} | {paused:>7.1} | {:>5} |",
        at(0.5),
        at(0.99),
        load()
    )
}

/// The `q` quantile of `values` (NaN when there are none).
fn quantile(mut values: Vec<f64>, q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n => values[((n as f64 - 1.0) * q).round() as usize],
    }
}

/// RabbitMQ alone, the floor under every line: the contract's messages,
/// as the relay builds them (`broker::message`), published straight to
/// the lane's exchange at `rate`, each as it falls due, on a confirm-mode
/// channel whose confirms are awaited at the end; latency from the
/// publish. No table, no relay: what the broker's own delivery costs.
fn broker_alone(fx: &mut Fixture, lane: &Lane, rate: u64, seconds: u64) -> Commits {
    lane.empty(fx);
    let events = crate::filled_and_read(fx, (rate * seconds) as i64);
    let exchange = lane.exchange.as_str();
    // Each event's message_id, read before the clock starts.
    let ids: Vec<String> = events
        .iter()
        .map(|event| {
            let message = outgoing(event, u32::MAX).expect("a sendable event");
            message
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .to_string()
        })
        .collect();
    let commits = fx.runtime.block_on(async {
        let channel = crate::confirm_channel(&fx.connection).await;
        let started = tokio::time::Instant::now();
        let mut commits = Vec::with_capacity(events.len());
        let mut confirms = Vec::with_capacity(events.len());
        for (n, (event, id)) in events.iter().zip(ids).enumerate() {
            tokio::time::sleep_until(started + Duration::from_secs_f64(n as f64 / rate as f64))
                .await;
            commits.push((id, epoch_ns()));
            confirms.push(crate::publish(&channel, exchange, event).await.unwrap());
        }
        for confirm in confirms {
            assert!(
                confirm.await.unwrap().is_ack(),
                "the broker nacked a message"
            );
        }
        let _ = channel.close(200, "bye".into()).await;
        commits
    });
    await_arrivals(lane, &commits);
    commits
}

/// `outbox-poll --follow` on `lane` while the producer runs at `rate`.
fn follow(fx: &mut Fixture, lane: &Lane, rate: u64, seconds: u64) -> Commits {
    lane.empty(fx);
    // Ended by SIGINT once every event arrived: the limit only bounds a
    // follow left behind, and must outlast a producer that a busy machine
    // slows down.
    let limit = format!("{}s", 10 * seconds + ARRIVAL_LIMIT.as_secs());
    let follower = lane
        .command(fx, &["--follow", "--max-duration", &limit, "--json"])
        .spawn()
        .expect("starting outbox-poll --follow");
    thread::sleep(QUIET_BEFORE);
    let producer = produce(
        fx.settings.database_url.clone(),
        lane.table.clone(),
        rate,
        seconds,
    );
    let commits = producer.join().unwrap();
    await_arrivals(lane, &commits);
    signal(&follower, "-INT");
    let output = follower.wait_with_output().unwrap();
    let code = output.status.code();
    check(
        code != Some(130),
        &format!("the follow exited {code:?} on SIGINT, not 130"),
    );
    commits
}

/// The plain binary with --drain every CRON_EVERY while the producer runs.
fn cron(fx: &mut Fixture, lane: &Lane, rate: u64, seconds: u64) -> Commits {
    lane.empty(fx);
    let started = Instant::now();
    let producer = produce(
        fx.settings.database_url.clone(),
        lane.table.clone(),
        rate,
        seconds,
    );
    let mut tick = CRON_EVERY;
    while tick.as_secs() <= seconds {
        if let Some(wait) = (started + tick).checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let status = lane.command(fx, &["--drain"]).status().unwrap();
        check(!status.success(), &format!("a cron run exited {status}"));
        tick += CRON_EVERY;
    }
    let commits = producer.join().unwrap();
    // A commit after the last tick waits for the next one.
    let status = lane.command(fx, &["--drain"]).status().unwrap();
    check(!status.success(), &format!("a cron run exited {status}"));
    await_arrivals(lane, &commits);
    commits
}

/// CPU (ms) an idle follow on `lane` uses over `seconds`: its own, and its
/// PostgreSQL backend's.
fn idle_cpu(fx: &mut Fixture, lane: &Lane, seconds: u64) -> (u64, Option<u64>) {
    lane.empty(fx);
    let limit = format!("{}s", seconds + 10);
    let follower = lane
        .command(fx, &["--follow", "--max-duration", &limit])
        .spawn()
        .expect("starting outbox-poll --follow");
    thread::sleep(Duration::from_secs(2));
    let backend = backend_of(fx, follower.id());
    let before = (cpu_ms(follower.id()), backend.and_then(cpu_ms));
    thread::sleep(Duration::from_secs(seconds));
    let after = (cpu_ms(follower.id()), backend.and_then(cpu_ms));
    signal(&follower, "-TERM");
    let _ = follower.wait_with_output();
    let own = after.0.unwrap_or(0) - before.0.unwrap_or(0);
    let server = after.1.zip(before.1).map(|(after, before)| after - before);
    (own, server)
}

/// utime + stime of a process, in ms (/proc counts USER_HZ, 100 a second).
fn cpu_ms(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().ok()? + fields[12].parse::<u64>().ok()?;
    Some(ticks * 10)
}

/// The PostgreSQL backend serving `pid`'s one session: found by the local
/// port of the process's socket to the server, as pg_stat_activity shows it.
fn backend_of(fx: &mut Fixture, pid: u32) -> Option<u32> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            link.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(String::from)
        })
        .collect();
    let ports: Vec<i32> = ["tcp", "tcp6"]
        .iter()
        .filter_map(|file| std::fs::read_to_string(format!("/proc/{pid}/net/{file}")).ok())
        .flat_map(|table| table.lines().skip(1).map(String::from).collect::<Vec<_>>())
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, inode) = (fields.get(1)?, fields.get(9)?);
            let port = i32::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            inodes.contains(&inode.to_string()).then_some(port)
        })
        .collect();
    let row = fx
        .db
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY($1)",
            &[&ports],
        )
        .ok()??;
    u32::try_from(row.get::<_, i32>(0)).ok()
}

/// The "latency" section: its lines, printed after the main table.
pub fn latency(fx: &mut Fixture) -> Vec<String> {
    let seconds: u64 = env_or("BENCH_LATENCY_SECONDS", "30").parse().unwrap();
    let idle_seconds: u64 = env_or("BENCH_IDLE_SECONDS", "60").parse().unwrap();
    let rates = env_list("BENCH_LATENCY_RATES", "100,1000");
    let notified = Lane::new(fx, "latency_notify", true);
    let polled = Lane::new(fx, "latency_poll", false);
    let mut lines = vec![
        format!(
            "latency, INSERT returned to receipt, {seconds} s at each rate (one event per transaction; max at: s into the stream; pause: the longest the bench's own 1 ms sleeps overslept while the stream ran, ms, 0 for none over 5 ms):"
        ),
        format!(
            "| {:<34} | {:>6} | {:>8} | {:>9} | {:>9} | {:>9} | {:>8} | {:>4} | {:>7} | {:>5} |",
            "relay",
            "rate/s",
            "achieved",
            "p50 ms",
            "p99 ms",
            "max ms",
            "max at",
            "lost",
            "pause",
            "load"
        ),
        format!(
            "|{}|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            "-".repeat(36)
        ),
    ];
    for rate in rates {
        let rate = rate as u64;
        let runs: [(&str, &Lane, Relaying); 4] = [
            ("RabbitMQ alone, publish to receipt", &polled, broker_alone),
            ("--follow, notify trigger", &notified, follow),
            ("--follow, polling (no trigger)", &polled, follow),
            ("--drain every 10 s (cron)", &polled, cron),
        ];
        for (name, lane, run) in runs {
            let (pauses, stolen) = (Pauses::watch(), stolen_ticks());
            let commits = run(fx, lane, rate, seconds);
            let (pauses, stolen) = (pauses.end(), stolen_ticks().saturating_sub(stolen));
            eprintln!(
                "bench:   {name} at {rate}/s: CPU time the host took (steal): {} ms",
                stolen * 10
            );
            let line = latency_line(name, (rate, seconds), lane, &commits, &pauses);
            eprintln!("bench: {line}");
            lines.push(line);
        }
    }
    lines.push(format!("idle --follow, CPU over {idle_seconds} s:"));
    for (name, lane) in [("notify trigger", &notified), ("polling", &polled)] {
        let (own, server) = idle_cpu(fx, lane, idle_seconds);
        let server = server.map_or("?".into(), |ms| format!("{ms} ms"));
        let line = format!(
            "  {name}: outbox-poll {own} ms, its PostgreSQL backend {server} (load {})",
            load()
        );
        eprintln!("bench: {line}");
        lines.push(line);
    }
    notified.remove(fx);
    polled.remove(fx);
    lines
}

/// Rows a second that `producers` connections insert into `table` in
/// transactions of `rows` rows, over `seconds`.
fn insert_rate(fx: &Fixture, table: &str, producers: usize, rows: i64, seconds: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let threads: Vec<_> = (0..producers)
        .map(|p| {
            let (url, table) = (fx.settings.database_url.clone(), table.to_string());
            thread::spawn(move || {
                let mut client = Client::connect(&url, NoTls).unwrap();
                let insert = client
                    .prepare(&format!(
                        "INSERT INTO {table} (event_id, event_type, payload) \
                         SELECT $1 || '-' || g, 'order.created', \
                                jsonb_build_object('n', g, 'note', repeat('x', 150)) \
                         FROM generate_series(1, $2::bigint) g"
                    ))
                    .unwrap();
                let mut inserted = 0;
                let mut k = 0u64;
                while Instant::now() < deadline {
                    let prefix = format!("p{p}-{k}");
                    client.execute(&insert, &[&prefix, &rows]).unwrap();
                    inserted += rows;
                    k += 1;
                }
                inserted
            })
        })
        .collect();
    let inserted: i64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    inserted as f64 / seconds
}

/// The "trigger" section: its lines, printed after the main table.
pub fn trigger_cost(fx: &mut Fixture) -> Vec<String> {
    let seconds: f64 = env_or("BENCH_TRIGGER_SECONDS", "5").parse().unwrap();
    let with = migrated(fx, "trigger_on", true);
    let without = migrated(fx, "trigger_off", false);
    let mut lines = vec![
        format!(
            "what the notify trigger costs producers, inserts/s, {seconds} s each, measured twice:"
        ),
        format!(
            "| {:<9} | {:>11} | {:>16} | {:>16} | {:>7} | {:>9} |",
            "producers", "rows per tx", "without trigger", "with trigger", "change", "load"
        ),
        "|---:|---:|---:|---:|---:|---:|".to_string(),
    ];
    for (producers, rows) in [(1, 1), (8, 1), (1, 100), (8, 100)] {
        let (mut off, mut on) = (0.0, 0.0);
        for _ in 0..2 {
            for (table, total) in [(&without, &mut off), (&with, &mut on)] {
                empty(fx, table);
                *total += insert_rate(fx, table, producers, rows, seconds) / 2.0;
            }
        }
        let line = format!(
            "| {producers:>9} | {rows:>11} | {off:>16.0} | {on:>16.0} | {:>+6.0}% | {:>9} |",
            100.0 * (on - off) / off,
            load()
        );
        eprintln!("bench: {line}");
        lines.push(line);
    }
    lines
}
