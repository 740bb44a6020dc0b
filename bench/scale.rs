//! The table at scale: sections `size` and `partitions`, run only when
//! BENCH_ONLY names them (they fill millions of rows: about 2 GB for
//! 5,000,000, dropped again at the end).
//!
//! `size`: a small fresh table holding only the due events is the
//! baseline; then for each of BENCH_SIZES (100000,1000000,5000000) rows of
//! events published 30 days ago beside the same due events:
//! - single polls (the binary from spawn to exit, batch 100; BENCH_POLLS
//!   of them, 20): the first and the median, and a drain of the rest of
//!   the due events at batch 100 (events/s);
//! - `prune --older-than 1d` of the old rows, row by row: its time, and
//!   the table's size before and after;
//! - right after it, without a vacuum, single polls again; and what the
//!   claim as it was before (a custom plan of `id >= $3` from the lowest
//!   id) spends planning there, from EXPLAIN (ANALYZE, SUMMARY).
//!
//! `partitions`: the plain table against the partitioned one of
//! migrations/example_partitioned_outbox.sql with each of BENCH_PARTITIONS
//! (1,60,400) daily partitions, each table holding 100,000 events
//! published over its days and the same due events: single polls, the
//! relay's claim+mark loop at batch 100 (PostgreSQL alone), a drain at
//! batch 100. Then `prune --older-than 7d` of BENCH_PRUNE_ROWS (5000000)
//! events published in 30 daily partitions older than that: its time and
//! the table's size before and after.
//!
//! The due events are BENCH_SIZE_PENDING (50000), created now.
//!
//! `prune_beside`: `prune --older-than 7d` of the partitioned table
//! beside what a retention job meets in production: a `--drain
//! --batch-size 100` of BENCH_PRUNE_BESIDE_PENDING (50000) due events
//! running, and BENCH_PRODUCERS (3) producer threads each inserting one
//! event per autocommit transaction, paced at 200/s. 30 daily partitions
//! older than 7 days hold BENCH_PRUNE_BESIDE_ROWS (300000) published
//! events. Reported: the producers' INSERT p50, p99 and max before the
//! prune (the drain alone) and during it, the prune's time, and the old
//! partitions left (0 expected). Twice: as the example creates the table
//! (DETACH ... CONCURRENTLY), and with a DEFAULT partition beside it,
//! where PostgreSQL allows only the locked DETACH (its short lock_timeout,
//! retried).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use outbox_poll::cli::OnPublish;

use postgres::{Client, NoTls};

use crate::common::{Figure, Fixture, Results, check, env_list, env_or};
use crate::{claim_and_mark, drain_filled};

/// The example that creates the partitioned outbox.
const EXAMPLE: &str = include_str!("../migrations/example_partitioned_outbox.sql");

pub fn sections(fx: &mut Fixture, results: &mut Results) {
    let settings = Scale::from_env();
    if fx.settings.named("size") {
        size(fx, results, &settings);
    }
    if fx.settings.named("partitions") {
        partitions(fx, results, &settings);
    }
    if fx.settings.named("prune_beside") {
        prune_beside(fx, results, false);
        prune_beside(fx, results, true);
        plain_table(fx);
        results.section_done("prune_beside");
    }
}

struct Scale {
    sizes: Vec<i64>,
    partitions: Vec<i64>,
    pending: i64,
    polls: usize,
    prune_rows: i64,
}

impl Scale {
    fn from_env() -> Scale {
        Scale {
            sizes: env_list("BENCH_SIZES", "100000,1000000,5000000"),
            partitions: env_list("BENCH_PARTITIONS", "1,60,400"),
            pending: env_or("BENCH_SIZE_PENDING", "50000").parse().unwrap(),
            polls: env_or("BENCH_POLLS", "20").parse().unwrap(),
            prune_rows: env_or("BENCH_PRUNE_ROWS", "5000000").parse().unwrap(),
        }
    }
}

/// Single runs of the binary (`--batch-size 100`), spawn to exit, in
/// milliseconds, in the order they ran.
struct Polls(Vec<f64>);

impl Polls {
    fn run(fx: &mut Fixture, count: usize) -> Polls {
        let times = (0..count)
            .map(|_| {
                let (seconds, published, _, ok) = fx.run_binary(1, &["--json"], false);
                check(!ok || published != 100, "a single poll did not publish 100");
                seconds * 1000.0
            })
            .collect();
        Polls(times)
    }

    fn first(&self) -> f64 {
        self.0[0]
    }

    fn median(&self) -> f64 {
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    }
}

/// `pending` due events ev-1 .. in place of those of the last round (and
/// an empty queue); the rest of the table is left as it is, unvacuumed.
fn replace_pending(fx: &mut Fixture, pending: i64) {
    fx.purge();
    let sql = format!("DELETE FROM {} WHERE event_id LIKE 'ev-%'", fx.table());
    fx.db.batch_execute(&sql).unwrap();
    fx.insert_events("ev", pending, 200, "now()", false, None);
}

/// An empty table, `published` events published 30 days ago and
/// vacuumed (as autovacuum leaves an old table), then the due events.
fn fill_sized(fx: &mut Fixture, published: i64, pending: i64) {
    fx.purge();
    let table = fx.table();
    let truncate = format!("TRUNCATE {table} RESTART IDENTITY");
    fx.db.batch_execute(&truncate).unwrap();
    let created = "now() - interval '30 days'";
    fx.insert_events("old", published, 200, created, true, None);
    fx.db
        .batch_execute(&format!("VACUUM ANALYZE {table}"))
        .unwrap();
    fx.insert_events("ev", pending, 200, "now()", false, None);
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// What the claim as it was before this change plans, right now: `id >=
/// $3` from the lowest id, planned for that value as PostgreSQL does by
/// default. Milliseconds of planning, twice (the first walk kills what it
/// can of the dead index entries).
fn old_claim_planning(fx: &mut Fixture) -> (f64, f64) {
    let prepare = format!(
        "BEGIN; PREPARE old_claim(int, bigint, bigint) AS SELECT id FROM {} \
         WHERE published_at IS NULL AND attempts < $1 AND available_at <= now() \
           AND id >= $3 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED",
        fx.table()
    );
    fx.db.batch_execute(&prepare).unwrap();
    let mut planning = || {
        let explain = "EXPLAIN (ANALYZE, SUMMARY) \
                       EXECUTE old_claim(10, 100, -9223372036854775808)";
        let lines = fx.db.simple_query(explain).unwrap();
        lines
            .iter()
            .filter_map(|message| match message {
                postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .find_map(|line| {
                let ms = line.strip_prefix("Planning Time: ")?.strip_suffix(" ms")?;
                ms.parse::<f64>().ok()
            })
            .expect("EXPLAIN prints the planning time")
    };
    let times = (planning(), planning());
    fx.db
        .batch_execute("ROLLBACK; DEALLOCATE old_claim")
        .unwrap();
    times
}

/// Runs `outbox-poll prune` with `args`; its seconds and --json summary.
fn prune(fx: &mut Fixture, args: &[&str]) -> (f64, serde_json::Value) {
    let started = Instant::now();
    let output = fx
        .command()
        .arg("prune")
        .args(args)
        .arg("--json")
        .output()
        .expect("running outbox-poll prune");
    let seconds = started.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&output.stdout);
    check(!output.status.success(), "prune failed");
    let summary = serde_json::from_str(text.trim()).unwrap_or_default();
    (seconds, summary)
}

/// A drain of the due events at batch 100, as a figure named `name`.
fn drain_pending(fx: &mut Fixture, name: String, pending: i64) -> Figure {
    drain_filled(fx, name, pending, 100, 1, OnPublish::Mark)
}

fn size(fx: &mut Fixture, results: &mut Results, scale: &Scale) {
    let (pending, polls) = (scale.pending, scale.polls);
    fill_sized(fx, 0, pending);
    let small = Polls::run(fx, polls);
    results.note(format!(
        "size: small fresh table ({pending} due events): single poll first {:.1} ms, \
         median {:.1} ms",
        small.first(),
        small.median()
    ));
    let rest = pending - 100 * polls as i64;
    replace_pending(fx, rest);
    results.push(drain_pending(
        fx,
        "size: drain, batch 100, small table".into(),
        rest,
    ));
    for rows in scale.sizes.clone() {
        fill_sized(fx, rows, pending);
        let before = Polls::run(fx, polls);
        results.note(format!(
            "size: {rows} rows: single poll first {:.1} ms, median {:.1} ms ({:.2}x the small table)",
            before.first(),
            before.median(),
            before.median() / small.median()
        ));
        replace_pending(fx, rest);
        let name = format!("size: drain, batch 100, {rows} rows");
        results.push(drain_pending(fx, name, rest));
        let size_before = fx.table_size();
        let (seconds, summary) = prune(fx, &["--older-than", "1d"]);
        let size_after = fx.table_size();
        results.note(format!(
            "size: {rows} rows: prune (row by row) deleted {} in {seconds:.1} s \
             ({:.0} rows/s); table {:.1} MiB before, {:.1} MiB after",
            summary["published"],
            rows as f64 / seconds,
            mib(size_before),
            mib(size_after)
        ));
        replace_pending(fx, 100 * polls as i64);
        let after = Polls::run(fx, polls);
        let (old_first, old_then) = old_claim_planning(fx);
        results.note(format!(
            "size: {rows} rows pruned, no vacuum: single poll first {:.1} ms, median {:.1} ms \
             ({:.2}x the small table); the claim before this change planned {old_first:.1} ms, \
             then {old_then:.1} ms",
            after.first(),
            after.median(),
            after.median() / small.median()
        ));
    }
    fx.fill(0, 200);
    results.section_done("size");
}

/// The fixture's table made partitioned as the example makes it, with
/// `days` daily partitions from `first` days from today (UTC), and
/// migrated.
fn partitioned_table(fx: &mut Fixture, first: i64, days: i64) {
    // The example, without its last statement (the partitions it creates).
    let (example, _) = EXAMPLE
        .rsplit_once("SELECT outbox_add_partitions(")
        .expect("the example ends by adding partitions");
    let sql = format!(
        "DROP TABLE {table}; SET search_path TO {schema}; {example}; RESET search_path; \
         SELECT {schema}.outbox_add_partitions('{table}', \
           (now() AT TIME ZONE 'UTC')::date + {first}, {days})",
        table = fx.table(),
        schema = fx.name
    );
    fx.db.batch_execute(&sql).unwrap();
    migrate(fx);
}

/// The fixture's plain table again.
fn plain_table(fx: &mut Fixture) {
    let sql = format!("DROP TABLE {}", fx.table());
    fx.db.batch_execute(&sql).unwrap();
    migrate(fx);
}

fn migrate(fx: &mut Fixture) {
    let status = fx.command().arg("migrate").status().unwrap();
    assert!(status.success(), "outbox-poll migrate failed");
}

/// Midnight UTC of the day `days` from today, plus the hours of the
/// series number g: published events spread over `spread` days from it.
fn spread_over(first: i64, spread: i64) -> String {
    format!(
        "(((now() AT TIME ZONE 'UTC')::date + {first} + (g % {spread})::int)::timestamp \
         + make_interval(secs => g % 86000)) AT TIME ZONE 'UTC'"
    )
}

/// On the table as it stands (partitioned over `days` days from `first`,
/// or plain): 100,000 events published over those days, then single
/// polls, the claim+mark loop and a drain, each on fresh due events.
/// Returns the median poll, the loop's and the drain's events/s.
fn measure_table(
    fx: &mut Fixture,
    results: &mut Results,
    label: &str,
    (first, days): (i64, i64),
    scale: &Scale,
) -> (f64, f64, f64) {
    let pending = scale.pending;
    fx.purge();
    let truncate = format!("TRUNCATE {} RESTART IDENTITY", fx.table());
    fx.db.batch_execute(&truncate).unwrap();
    let spread = (days - 1).max(1);
    fx.insert_events("old", 100_000, 200, &spread_over(first, spread), true, None);
    let analyze = format!("VACUUM ANALYZE {}", fx.table());
    fx.db.batch_execute(&analyze).unwrap();
    replace_pending(fx, 100 * scale.polls as i64);
    let polls = Polls::run(fx, scale.polls);
    replace_pending(fx, pending);
    let name = format!("partitions: claim+mark, batch 100, {label}");
    let marks = claim_and_mark(fx, name, pending, 100);
    let marks_rate = marks.rate();
    results.push(marks);
    replace_pending(fx, pending);
    let drain = drain_pending(
        fx,
        format!("partitions: drain, batch 100, {label}"),
        pending,
    );
    let drain_rate = drain.rate();
    results.push(drain);
    (polls.median(), marks_rate, drain_rate)
}

fn partitions(fx: &mut Fixture, results: &mut Results, scale: &Scale) {
    let plain = measure_table(fx, results, "plain table", (-59, 60), scale);
    results.note(format!(
        "partitions: plain table: single poll median {:.1} ms",
        plain.0
    ));
    for count in scale.partitions.clone() {
        // Up to today and one day ahead, so that a run across midnight
        // still finds today's partition.
        let first = if count > 1 { 2 - count } else { 0 };
        partitioned_table(fx, first, count);
        let label = format!("{count} daily partitions");
        let (poll, marks, drain) = measure_table(fx, results, &label, (first, count), scale);
        results.note(format!(
            "partitions: {label}: single poll median {poll:.1} ms ({:.2}x plain), \
             claim+mark {:.2}x plain, drain {:.2}x plain",
            poll / plain.0,
            marks / plain.1,
            drain / plain.2
        ));
    }
    prune_partitions(fx, results, scale.prune_rows);
    plain_table(fx);
    results.section_done("partitions");
}

/// `rows` events published in 30 daily partitions older than 7 days,
/// pruned with --older-than 7d: whole partitions dropped.
fn prune_partitions(fx: &mut Fixture, results: &mut Results, rows: i64) {
    partitioned_table(fx, -37, 32);
    fx.insert_events("old", rows, 200, &spread_over(-37, 30), true, None);
    let analyze = format!("VACUUM ANALYZE {}", fx.table());
    fx.db.batch_execute(&analyze).unwrap();
    let size_before = fx.table_size();
    let (seconds, summary) = prune(fx, &["--older-than", "7d"]);
    let size_after = fx.table_size();
    let dropped = summary["partitions_dropped"].as_array().map_or(0, Vec::len);
    check(
        summary["published"] != serde_json::json!(rows),
        "the partitioned prune did not delete every old event",
    );
    results.note(format!(
        "partitions: prune of {} events in {dropped} dropped partitions: {seconds:.1} s; \
         table {:.1} MiB before, {:.1} MiB after",
        summary["published"],
        mib(size_before),
        mib(size_after)
    ));
}

/// One producer INSERT: when it started (from the producers' start) and
/// how long it took.
type Insert = (Duration, Duration);

/// `prune_beside` (see the top of this file), with a DEFAULT partition
/// when `default_partition`.
fn prune_beside(fx: &mut Fixture, results: &mut Results, default_partition: bool) {
    let pending: i64 = env_or("BENCH_PRUNE_BESIDE_PENDING", "50000")
        .parse()
        .unwrap();
    let rows: i64 = env_or("BENCH_PRUNE_BESIDE_ROWS", "300000").parse().unwrap();
    let producers: usize = env_or("BENCH_PRODUCERS", "3").parse().unwrap();
    let label = match default_partition {
        true => "with a DEFAULT partition (locked DETACH)",
        false => "as the example (DETACH CONCURRENTLY)",
    };
    fx.purge();
    // From 37 days ago to tomorrow: 30 old days, then the recent week.
    partitioned_table(fx, -37, 39);
    if default_partition {
        let sql = format!(
            "CREATE TABLE {schema}.outbox_default PARTITION OF {table} DEFAULT",
            schema = fx.name,
            table = fx.table()
        );
        fx.db.batch_execute(&sql).unwrap();
    }
    fx.insert_events("old", rows, 200, &spread_over(-37, 30), true, None);
    fx.insert_events("due", pending, 200, "now()", false, None);
    let analyze = format!("VACUUM ANALYZE {}", fx.table());
    fx.db.batch_execute(&analyze).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let threads: Vec<_> = (0..producers)
        .map(|n| {
            let (url, table, stop) = (fx.settings.database_url.clone(), fx.table(), stop.clone());
            std::thread::spawn(move || produce(&url, &table, n, started, &stop))
        })
        .collect();
    let mut drain = fx
        .command()
        .args(["--drain", "--batch-size", "100"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("starting the drain");
    // When the drain ends, to tell how much of the prune it overlapped.
    let drain = std::thread::spawn(move || {
        let status = drain.wait().unwrap();
        (status.success(), started.elapsed())
    });
    // The drain alone beside the producers first: the baseline.
    std::thread::sleep(Duration::from_secs(1));
    let prune_from = started.elapsed();
    let (seconds, summary) = prune(fx, &["--older-than", "7d"]);
    let prune_to = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let inserts: Vec<Insert> = threads
        .into_iter()
        .flat_map(|thread| thread.join().unwrap())
        .collect();
    let (drained, drain_end) = drain.join().unwrap();
    check(!drained, "the drain beside prune failed");

    let left: i64 = fx
        .db
        .query_one(
            "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = $1::text::regclass AND c.relname LIKE 'outbox\\_p%' \
               AND c.relname < 'outbox_p' || \
               to_char((now() AT TIME ZONE 'UTC')::date - 7, 'YYYYMMDD')",
            &[&fx.table()],
        )
        .unwrap()
        .get(0);
    check(
        summary["published"] != serde_json::json!(rows),
        "prune beside the drain did not delete every old event",
    );
    let before = quantiles(&inserts, Duration::ZERO, prune_from);
    let during = quantiles(&inserts, prune_from, prune_to);
    results.note(format!(
        "prune beside a drain, {label}: prune {seconds:.2} s, the drain running for \
         {:.2} s of it; {left} of 30 old partitions left; {producers} producers' INSERT \
         p50/p99/max before {before}, during the prune {during}",
        drain_end
            .min(prune_to)
            .saturating_sub(prune_from)
            .as_secs_f64(),
    ));
}

/// Inserts one event per autocommit transaction into `table`, 200 a
/// second, until `stop`: each INSERT's start (from `started`) and time.
fn produce(url: &str, table: &str, n: usize, started: Instant, stop: &AtomicBool) -> Vec<Insert> {
    let mut db = Client::connect(url, NoTls).expect("connecting a producer");
    let insert = db
        .prepare(&format!(
            "INSERT INTO {table} (event_id, event_type, payload) \
             VALUES ($1, 'order.created', '{{\"order_id\": 1}}')"
        ))
        .unwrap();
    let pace = Duration::from_millis(5);
    let mut inserts = Vec::new();
    let mut next = Instant::now();
    for count in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let at = Instant::now();
        db.execute(&insert, &[&format!("producer-{n}-{count}")])
            .expect("a producer's INSERT");
        inserts.push((at - started, at.elapsed()));
        next += pace;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    inserts
}

/// "p50/p99/max ms (N inserts)" of the inserts started in [from, to).
fn quantiles(inserts: &[Insert], from: Duration, to: Duration) -> String {
    let mut times: Vec<f64> = inserts
        .iter()
        .filter(|(at, _)| (from..to).contains(at))
        .map(|(_, took)| took.as_secs_f64() * 1000.0)
        .collect();
    if times.is_empty() {
        return "(none)".to_string();
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    format!(
        "{:.1}/{:.1}/{:.1} ms ({} inserts)",
        at(0.5),
        at(0.99),
        at(1.0),
        times.len()
    )
}
