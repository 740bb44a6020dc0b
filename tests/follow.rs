//! --follow: a drain that keeps publishing new events as they commit until
//! --max-duration or a signal, and between them holds one idle PostgreSQL
//! session (no transaction), no broker connection and next to no CPU. The
//! notify trigger `migrate --notify` installs wakes it; without it, it
//! polls.

use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use postgres::Client;
use postgres::fallible_iterator::FallibleIterator;

use crate::common::proxy::Proxy;
use crate::common::{
    Fixture, Run, amqp_addr, assert_in_order_per_key, assert_one_clear_line, connect_db,
    database_addr, env_via, wait_until,
};

/// A table whose inserts wake followers (`migrate --notify`).
fn notifying(test: &str) -> Fixture {
    with_notify(Fixture::bare(test))
}

/// `fx`'s table, migrated with `--notify`.
fn with_notify(fx: Fixture) -> Fixture {
    let run = fx.run(&["migrate", "--notify"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    fx
}

/// The notify triggers of the fixture's table, by their type bits
/// (pg_trigger.tgtype: 1 row-level, 2 before, 4 insert, ...).
fn triggers(fx: &mut Fixture) -> Vec<i16> {
    let sql = "SELECT tgtype FROM pg_trigger WHERE tgrelid = $1::text::regclass \
               AND tgname = 'outbox_poll_notify'";
    let rows = fx.db.query(sql, &[&fx.quoted_table()]).unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

/// AFTER INSERT FOR EACH STATEMENT.
const AFTER_INSERT_STATEMENT: i16 = 4;

/// How long a test waits for a run to exit before it kills it: every
/// follow here is meant to end well before (the tests' --max-duration of
/// 60s is "not during this test").
const EXIT_LIMIT: Duration = Duration::from_secs(30);

/// `outbox-poll --follow --json ARGS` running in the background.
struct Follower {
    child: Child,
    started: Instant,
}

impl Follower {
    fn start(fx: &Fixture, env: &[(&str, String)], args: &[&str]) -> Follower {
        let args = [&["--follow", "--json"][..], args].concat();
        Follower::spawn(fx, env, &args)
    }

    /// The binary with exactly `args`.
    fn spawn(fx: &Fixture, env: &[(&str, String)], args: &[&str]) -> Follower {
        let child = fx
            .command()
            .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting outbox-poll --follow");
        Follower {
            child,
            started: Instant::now(),
        }
    }

    fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([name, &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill {name} failed");
    }

    /// Ends the follow with SIGTERM: it exits 143, having published
    /// `published` events in all.
    fn terminated_having_published(self, published: i64) -> Run {
        self.signal("-TERM");
        let (run, _) = self.finish();
        assert_eq!(
            (run.code, run.field("published")),
            (143, published),
            "{}",
            run.stderr
        );
        run
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// CPU time, user and system, the run has used so far (/proc counts
    /// it in USER_HZ, 100 a second on Linux).
    fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // The fields after the command name, which is in parentheses:
        // state is field 3, utime 14 and stime 15.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        Duration::from_millis(ticks * 10)
    }

    /// Waits for the exit, killing the run after EXIT_LIMIT (its code is
    /// then -1): the run, and how long it lasted.
    fn finish(mut self) -> (Run, Duration) {
        if !wait_until(EXIT_LIMIT, || !self.running()) {
            let _ = self.child.kill();
        }
        let took = self.started.elapsed();
        let output = self
            .child
            .wait_with_output()
            .expect("waiting for outbox-poll");
        (Run::from(output), took)
    }
}

/// A session of the run as the server sees it.
#[derive(Debug, PartialEq)]
struct Backend {
    state: String,
    /// A transaction open, or an xmin held back.
    in_transaction: bool,
    locks: i64,
}

/// The run's PostgreSQL sessions still open: those that came through
/// `proxy`, found by the port each connected from.
fn backends(db: &mut Client, proxy: &Proxy) -> Vec<Backend> {
    let ports: Vec<i32> = proxy.server_ports().into_iter().map(i32::from).collect();
    let sql = "SELECT coalesce(state, ''), xact_start IS NOT NULL OR backend_xmin IS NOT NULL, \
                      (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid) \
               FROM pg_stat_activity a WHERE client_port = ANY($1)";
    db.query(sql, &[&ports])
        .unwrap()
        .iter()
        .map(|row| Backend {
            state: row.get(0),
            in_transaction: row.get(1),
            locks: row.get(2),
        })
        .collect()
}

fn idle_backend() -> Backend {
    Backend {
        state: "idle".into(),
        in_transaction: false,
        locks: 0,
    }
}

#[test]
fn events_committed_while_following_are_published_well_before_max_duration() {
    let mut fx = notifying("follow_delivers");
    let follower = Follower::start(&fx, &[], &["--max-duration", "60s"]);
    sleep(Duration::from_millis(500));
    fx.insert_event("late-1", "order.created", "{}");
    fx.insert("late-batch", 3);
    assert!(
        wait_until(Duration::from_secs(10), || fx.published_count() == 4),
        "events committed after the start were not published while it ran"
    );
    follower.terminated_having_published(4);
    let arrivals = fx.arrivals();
    assert_eq!(arrivals.len(), 4, "{arrivals:?}");
    assert!(arrivals.values().all(|&count| count == 1), "{arrivals:?}");
}

#[test]
fn a_table_without_the_notify_trigger_is_followed_by_polling() {
    let mut fx = Fixture::new("follow_polls");
    assert!(
        triggers(&mut fx).is_empty(),
        "a plain migrate installs no trigger"
    );
    let follower = Follower::start(&fx, &[], &["--max-duration", "60s"]);
    sleep(Duration::from_millis(500));
    fx.insert("polled", 2);
    assert!(
        wait_until(Duration::from_secs(10), || fx.published_count() == 2),
        "without the trigger, new events were not published while it ran"
    );
    follower.terminated_having_published(2);
}

/// What a polling follow decided before each of its waits, from its trace
/// log: how long it would wait before looking at the table again, and how
/// long it had been quiet (since its last claim that found events), in ms.
fn planned_waits(stderr: &str) -> Vec<(u64, u64)> {
    stderr
        .lines()
        .filter_map(|line| {
            let (_, decision) = line.split_once("looking at the table again in ")?;
            let (wait, quiet) = decision.split_once(" ms, quiet for ")?;
            Some((wait.parse().ok()?, quiet.strip_suffix(" ms")?.parse().ok()?))
        })
        .collect()
}

/// The waits a polling follow plans (`planned_waits`) around 20 events
/// inserted 50 ms apart after it has been quiet for `quiet` since it
/// started, checked to include a wait planned after two thirds of that
/// quiet at least (the looks before the stream). Asserted on the plan, not
/// on latencies: a loaded machine stretches every wait and every claim,
/// but not the plan.
fn waits_around_a_stream(test: &str, quiet: Duration) -> Vec<(u64, u64)> {
    let mut fx = Fixture::new(test);
    let trace = [("RUST_LOG", "outbox_poll::relay::follow=trace".to_string())];
    let follower = Follower::start(&fx, &trace, &["--max-duration", "60s"]);
    sleep(quiet);
    let mut producer = fx.connect();
    for n in 0..20 {
        let sql = format!(
            "INSERT INTO {} (event_id, event_type, payload) VALUES ($1, 'order.created', '{{}}')",
            fx.quoted_table()
        );
        producer.execute(&sql, &[&format!("steady-{n}")]).unwrap();
        sleep(Duration::from_millis(50));
    }
    assert!(wait_until(Duration::from_secs(10), || fx.published_count() == 20));
    let run = follower.terminated_having_published(20);
    let waits = planned_waits(&run.stderr);
    let met = quiet.as_millis() as u64 * 2 / 3;
    assert!(
        waits.iter().any(|&(_, quiet)| quiet >= met),
        "the follow never met a quiet spell of {met} ms: {waits:?}"
    );
    waits
}

#[test]
fn a_steady_stream_after_a_quiet_spell_never_meets_the_quiet_interval_when_polling() {
    // Quiet for 3 s: past the 2 s a follow lingers, at its slowest by now.
    // The quiet interval (250 ms) is far from the looks it should make.
    let waits = waits_around_a_stream("follow_steady", Duration::from_secs(3));
    let slowest = waits.iter().map(|&(wait, _)| wait).max();
    assert!(
        slowest.is_some_and(|wait| wait <= 100),
        "it planned to wait {slowest:?} ms before looking again: {waits:?}"
    );
}

#[test]
fn a_stream_that_resumes_while_the_follow_lingers_is_looked_for_every_25_ms_at_most() {
    // Quiet for 1.5 s, within the 2 s a follow keeps the broker for more.
    let waits = waits_around_a_stream("follow_resumes", Duration::from_millis(1500));
    let lingering: Vec<_> = waits.iter().filter(|&&(_, quiet)| quiet < 2000).collect();
    assert!(
        lingering.iter().any(|&&(_, quiet)| quiet >= 1000),
        "it planned no wait between 1 and 2 s of quiet: {waits:?}"
    );
    assert!(
        lingering.iter().all(|&&(wait, _)| wait <= 25),
        "within 2 s of quiet it planned waits over 25 ms: {waits:?}"
    );
}

#[test]
fn a_polling_follow_that_sees_an_event_another_run_holds_backs_off_instead_of_claiming_at_every_look()
 {
    // The look sees the held row, the claim skips it: claiming after every
    // look would cost a claim every look for as long as the row is held.
    let mut fx = Fixture::new("follow_held");
    fx.insert_event("held", "order.created", "{}");
    let held = fx.hold_row("held");
    let trace = [("RUST_LOG", "outbox_poll::relay::follow=trace".to_string())];
    let follower = Follower::start(&fx, &trace, &["--max-duration", "60s"]);
    sleep(Duration::from_millis(2000));
    follower.signal("-TERM");
    let (run, _) = follower.finish();
    held.release();
    assert_eq!((run.code, run.field("claimed")), (143, 0), "{}", run.stderr);
    let waits = planned_waits(&run.stderr);
    let slowest = waits.iter().map(|&(wait, _)| wait).max();
    assert!(
        slowest.is_some_and(|wait| wait >= 200),
        "it never waited longer than {slowest:?} ms between claims: {waits:?}"
    );
}

#[test]
fn a_follow_that_starts_on_an_empty_table_never_connects_to_the_broker() {
    let fx = notifying("follow_no_broker");
    let broker = Proxy::start(amqp_addr());
    let follower = Follower::start(
        &fx,
        &env_via(Some(&broker), None),
        &["--max-duration", "2s"],
    );
    let (run, took) = follower.finish();
    assert_eq!((run.code, run.field("batches")), (0, 0), "{}", run.stderr);
    assert!(
        took >= Duration::from_secs(2),
        "it followed for {took:?} only"
    );
    assert_eq!(broker.connections(), 0, "it connected to the broker");
}

/// (rows read by sequential scans, rows updated) of the fixture's table,
/// as the server's statistics have them.
fn scanned_and_updated(fx: &mut Fixture) -> (i64, i64) {
    fx.db
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .unwrap();
    let sql = "SELECT seq_tup_read, n_tup_upd FROM pg_stat_user_tables \
               WHERE relid = $1::text::regclass";
    let row = fx.db.query_one(sql, &[&fx.quoted_table()]).unwrap();
    (row.get(0), row.get(1))
}

/// Waits until `count` distinct events arrived, taking them off the queue
/// (no query of the table: the test's own reads would count as scans).
fn await_arrivals(fx: &Fixture, seen: &mut HashMap<String, usize>, count: usize) {
    let arrived = wait_until(Duration::from_secs(10), || {
        for (id, times) in fx.arrivals() {
            *seen.entry(id).or_insert(0) += times;
        }
        seen.len() == count
    });
    assert!(
        arrived,
        "{} of {count} events arrived: {seen:?}",
        seen.len()
    );
}

#[test]
fn a_follow_that_started_on_an_empty_table_marks_by_primary_key_after_the_table_grew() {
    // The marks are planned once, at the follow's first batch: here on a
    // table of one row, where reading the whole table is the cheapest
    // plan. Every later mark must still find its rows by primary key, not
    // by reading the rows the follow has marked since.
    let mut fx = Fixture::new("follow_marks_by_key");
    let follower = Follower::start(&fx, &[], &["--max-duration", "60s"]);
    let mut seen = HashMap::new();
    fx.insert("first", 1);
    await_arrivals(&fx, &mut seen, 1);
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload, published_at) \
         SELECT 'marked-' || g, 'order.created', '{}', now() FROM generate_series(1, 2000) g",
    );
    for n in 0..3 {
        fx.insert(&format!("later-{n}"), 1);
        sleep(Duration::from_millis(50));
    }
    await_arrivals(&fx, &mut seen, 4);
    follower.terminated_having_published(4);
    // The follow's session reports its statistics when it ends: its four
    // marks and its scans together.
    let mut figures = (0, 0);
    let reported = wait_until(Duration::from_secs(10), || {
        figures = scanned_and_updated(&mut fx);
        figures.1 >= 4
    });
    assert!(reported, "the follow's marks never showed: {figures:?}");
    assert_eq!(figures.0, 0, "rows read by sequential scans");
}

#[test]
fn after_a_backlog_a_quiet_follow_lets_go_of_the_broker_and_of_its_extra_sessions() {
    let mut fx = notifying("follow_lets_go");
    fx.insert("backlog", 2000);
    let (broker, db) = (Proxy::start(amqp_addr()), Proxy::start(database_addr()));
    let env = env_via(Some(&broker), Some(&db));
    let follower = Follower::start(&fx, &env, &["--batch-size", "50", "--max-duration", "60s"]);
    assert!(wait_until(Duration::from_secs(30), || fx.published_count() == 2000));
    assert!(db.connections() > 1, "the backlog opened no other session");
    let mut observer = connect_db();
    let quiet = wait_until(Duration::from_secs(10), || {
        broker.open_connections() == 0 && backends(&mut observer, &db).len() == 1
    });
    assert!(
        quiet,
        "still open: {} broker connections, sessions {:?}",
        broker.open_connections(),
        backends(&mut observer, &db)
    );
    follower.signal("-INT");
    let (run, _) = follower.finish();
    assert_eq!(
        (run.code, run.field("published")),
        (130, 2000),
        "{}",
        run.stderr
    );
}

#[test]
fn an_idle_follow_holds_one_session_idle_outside_any_transaction() {
    // No trigger: the follow polls, as often as it ever does while idle.
    let fx = Fixture::new("follow_idle_session");
    let db = Proxy::start(database_addr());
    let follower = Follower::start(&fx, &env_via(None, Some(&db)), &["--max-duration", "60s"]);
    let mut observer = connect_db();
    assert!(wait_until(Duration::from_secs(10), || {
        !backends(&mut observer, &db).is_empty()
    }));
    // A look every 100 ms is a statement of a fraction of a millisecond,
    // outside any transaction: a few samples may catch one, most must not.
    let samples: Vec<Vec<Backend>> = (0..20)
        .map(|_| {
            sleep(Duration::from_millis(100));
            backends(&mut observer, &db)
        })
        .collect();
    let idle = samples
        .iter()
        .filter(|sample| **sample == [idle_backend()])
        .count();
    assert!(idle >= 15, "idle in {idle} of 20 samples: {samples:?}");
    follower.signal("-TERM");
    assert_eq!(follower.finish().0.code, 143);
}

#[test]
fn an_idle_follow_uses_next_to_no_cpu() {
    // No trigger: polling is the most an idle follow ever does.
    let fx = Fixture::new("follow_idle_cpu");
    let follower = Follower::start(&fx, &[], &["--max-duration", "60s"]);
    sleep(Duration::from_secs(1));
    // Both of its quiet phases: the second of the 2 s it lingers after
    // its start (a look every 25 ms), and 4 s past them (one every 100 ms).
    // CPU is counted in 10 ms ticks, and a look of the debug build over
    // TLS takes about a millisecond: a shorter window lands on the bound.
    let (cpu, wall) = (follower.cpu(), Instant::now());
    sleep(Duration::from_secs(5));
    let (used, wall) = (follower.cpu() - cpu, wall.elapsed());
    assert!(
        used * 50 < wall,
        "{used:?} of CPU in {wall:?} idle: over 2%"
    );
    follower.signal("-TERM");
    assert_eq!(follower.finish().0.code, 143);
}

/// The signal ends an idle follow soon, with its exit code and summary.
fn assert_signal_ends_an_idle_follow(test: &str, signal: &str, code: i32) {
    let fx = notifying(test);
    let follower = Follower::start(&fx, &[], &["--max-duration", "60s"]);
    sleep(Duration::from_secs(1));
    let signalled = Instant::now();
    follower.signal(signal);
    let (run, _) = follower.finish();
    let took = signalled.elapsed();
    assert_eq!((run.code, run.field("exit_code")), (code, i64::from(code)));
    // docs/src/timeouts.md says within a second; the bound is generous for a
    // machine busy with other tests.
    assert!(took < Duration::from_secs(3), "it took {took:?}");
}

#[test]
fn sigint_ends_an_idle_follow_at_once_with_130() {
    assert_signal_ends_an_idle_follow("follow_sigint", "-INT", 130);
}

#[test]
fn sigterm_ends_an_idle_follow_at_once_with_143() {
    assert_signal_ends_an_idle_follow("follow_sigterm", "-TERM", 143);
}

#[test]
fn follow_without_max_duration_is_a_usage_error() {
    let fx = Fixture::new("follow_usage");
    let env = [("OUTBOX_FOLLOW", "1".to_string())];
    for follower in [
        Follower::spawn(&fx, &[], &["--follow"]),
        Follower::spawn(&fx, &env, &[]),
    ] {
        let (run, _) = follower.finish();
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert!(run.stderr.contains("--max-duration"), "{}", run.stderr);
    }
}

#[test]
fn outbox_follow_false_is_an_ordinary_run() {
    let fx = Fixture::new("follow_false");
    let run = fx.run_with(&[("OUTBOX_FOLLOW", "false")], &["--json"]);
    assert_eq!((run.code, run.field("batches")), (0, 0), "{}", run.stderr);
}

#[test]
fn max_batches_ends_a_follow() {
    let mut fx = Fixture::new("follow_max_batches");
    fx.insert("e", 30);
    let args = [
        "--batch-size",
        "10",
        "--max-batches",
        "2",
        "--max-duration",
        "60s",
    ];
    let (run, _) = Follower::start(&fx, &[], &args).finish();
    assert_eq!((run.code, run.field("batches")), (0, 2), "{}", run.stderr);
}

#[test]
fn a_follow_opens_no_batch_once_max_duration_has_passed() {
    let mut fx = notifying("follow_ends");
    // With the trigger a quiet follow claims once a second: this event is
    // due after its claim at 1 s and before its end at 1.5 s, and no
    // insert announces it.
    fx.insert_event("late", "order.created", "{}");
    fx.execute("UPDATE {table} SET available_at = now() + interval '1200 ms'");
    let (run, _) = Follower::start(&fx, &[], &["--max-duration", "1500ms"]).finish();
    assert_eq!((run.code, run.field("batches")), (0, 0), "{}", run.stderr);
    assert_eq!(fx.published_count(), 0);
}

#[test]
fn two_followers_deliver_each_event_exactly_once() {
    let mut fx = notifying("follow_two");
    let args = ["--max-duration", "60s"];
    let followers = [
        Follower::start(&fx, &[], &args),
        Follower::start(&fx, &[], &args),
    ];
    sleep(Duration::from_millis(500));
    for n in 0..100 {
        fx.insert_event(&format!("single-{n}"), "order.created", "{}");
        if n % 10 == 0 {
            fx.insert(&format!("ten-{n}"), 10);
        }
    }
    assert!(wait_until(Duration::from_secs(20), || {
        fx.published_count() == 200
    }));
    let mut published = 0;
    for follower in followers {
        follower.signal("-TERM");
        let (run, _) = follower.finish();
        assert_eq!((run.code, run.field("failed")), (143, 0), "{}", run.stderr);
        published += run.field("published");
    }
    assert_eq!(published, 200);
    let arrivals = fx.arrivals();
    let twice: Vec<_> = arrivals.iter().filter(|(_, count)| **count > 1).collect();
    assert_eq!((arrivals.len(), twice.len()), (200, 0), "{twice:?}");
}

#[test]
fn an_ordered_follow_waits_while_another_run_holds_the_lock_then_publishes_in_order() {
    // In a database of its own: the ordered modes wait for every writing
    // transaction of their database, and other tests hold some.
    let mut fx = with_notify(Fixture::bare_isolated("follow_ordered"));
    // Another ordered run, mid-batch, as far as outbox-poll can tell.
    let mut other = fx.connect();
    let mut lock = other.transaction().unwrap();
    let sql = "SELECT pg_try_advisory_xact_lock(2052318419, $1::text::regclass::oid::int)";
    let taken: bool = lock.query_one(sql, &[&fx.quoted_table()]).unwrap().get(0);
    assert!(taken);
    let mut follower = Follower::start(&fx, &[], &["--ordered", "--max-duration", "60s"]);
    fx.insert("first", 5);
    sleep(Duration::from_secs(2));
    assert!(follower.running(), "it gave up on the lock");
    assert_eq!(
        fx.published_count(),
        0,
        "it published while the lock was taken"
    );
    lock.rollback().unwrap();
    assert!(wait_until(Duration::from_secs(10), || fx.published_count() == 5));
    fx.insert("then", 5);
    assert!(wait_until(Duration::from_secs(10), || fx.published_count() == 10));
    follower.signal("-TERM");
    assert_eq!(follower.finish().0.code, 143);
    let order: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    let expected: Vec<String> = ["first", "then"]
        .iter()
        .flat_map(|prefix| (1..=5).map(move |n| format!("{prefix}-{n}")))
        .collect();
    assert_eq!(order, expected);
}

#[test]
fn an_ordered_by_key_follow_publishes_each_keys_events_in_order_one_of_a_key_per_batch() {
    // In a database of its own, as every ordered mode's test.
    let mut fx = with_notify(Fixture::bare_isolated("follow_by_key"));
    let args = [
        "--ordered-by-key",
        "--batch-size",
        "5",
        "--max-duration",
        "60s",
    ];
    let follower = Follower::start(&fx, &[], &args);
    // Three producer transactions while it follows, each ten events of
    // each of three keys, interleaved: event n of key k is `k<k>-<n>`.
    for round in 0..3 {
        fx.execute(&format!(
            "INSERT INTO {{table}} (event_id, event_type, payload, ordering_key) \
             SELECT 'k' || g % 3 || '-' || ({round} * 10 + g / 3), 'order.created', '{{}}', \
                    'k' || g % 3 \
             FROM generate_series(0, 29) g"
        ));
    }
    assert!(wait_until(Duration::from_secs(30), || fx.published_count() == 90));
    follower.signal("-TERM");
    let (run, _) = follower.finish();
    assert_eq!(run.code, 143, "{}", run.stderr);
    // A batch holds at most one event of a key: three keys, three events.
    assert!(run.field("batches") >= 30, "{}", run.stdout);
    assert_eq!(assert_in_order_per_key(&fx.messages()), 90);
}

#[test]
fn a_follow_that_loses_its_database_connection_while_idle_exits_69_at_once() {
    let fx = notifying("follow_db_lost");
    let db = Proxy::start(database_addr());
    let follower = Follower::start(&fx, &env_via(None, Some(&db)), &["--max-duration", "60s"]);
    sleep(Duration::from_secs(1));
    db.cut();
    let (run, took) = follower.finish();
    assert_eq!(run.code, 69, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(took < Duration::from_secs(10), "it went on for {took:?}");
}

#[test]
fn migrate_notify_installs_the_trigger_once_and_a_plain_migrate_keeps_it() {
    let mut fx = Fixture::new("follow_migrate_notify");
    assert!(triggers(&mut fx).is_empty());
    for args in [
        &["migrate", "--notify"][..],
        &["migrate", "--notify"],
        &["migrate"],
    ] {
        let run = fx.run(args);
        assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{args:?}");
        assert_eq!(
            triggers(&mut fx),
            [AFTER_INSERT_STATEMENT],
            "after {args:?}"
        );
    }
}

/// The notifications on the channel of `table` while `produce` runs.
fn notifications_of(fx: &mut Fixture, table: &str, produce: impl FnOnce(&mut Fixture)) -> usize {
    let mut listener = connect_db();
    let channel: String = listener
        .query_one(
            "SELECT 'outbox_poll_' || $1::text::regclass::oid",
            &[&table],
        )
        .unwrap()
        .get(0);
    listener
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .unwrap();
    produce(fx);
    let mut notifications = listener.notifications();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut waiting = notifications.timeout_iter(Duration::from_millis(500));
    while let Some(notification) = waiting.next().unwrap() {
        *seen.entry(notification.channel().to_string()).or_default() += 1;
    }
    seen.get(&channel).copied().unwrap_or(0)
}

#[test]
fn the_trigger_notifies_once_per_producer_transaction_and_only_its_own_table() {
    let mut fx = notifying("follow_channels");
    let other = format!("\"{}\".other", fx.schema);
    let run = fx.run(&["migrate", "--notify", "--table", &other]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let table = fx.quoted_table();
    let one_transaction = |fx: &mut Fixture| {
        fx.execute(
            "BEGIN; \
             INSERT INTO {table} (event_id, event_type, payload) VALUES ('a', 't', '{}'), ('b', 't', '{}'); \
             INSERT INTO {table} (event_id, event_type, payload) VALUES ('c', 't', '{}'); \
             COMMIT",
        )
    };
    assert_eq!(notifications_of(&mut fx, &table, one_transaction), 1);
    let elsewhere = |fx: &mut Fixture| {
        let sql = format!(
            "INSERT INTO {other} (event_id, event_type, payload) VALUES ('x', 't', '{{}}')"
        );
        fx.db.batch_execute(&sql).unwrap();
    };
    assert_eq!(notifications_of(&mut fx, &table, elsewhere), 0);
}
