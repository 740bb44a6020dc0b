//! Faults lose nothing: broker and database outages, stalls, kills and
//! signals, and poison events, each injected through a proxy the test owns
//! (the shared servers are never touched). Every test checks the table and
//! the queue: a lost event is never allowed, a duplicate only where the
//! fault makes it unavoidable (the broker had the message, we never learnt
//! it did, or we could not record that it did).

use std::collections::HashMap;
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::common::proxy::{Direction, Proxy};
use crate::common::{
    Amqp, Fixture, Row, amqp_addr, amqp_url_via, assert_untouched, database_addr, database_url_via,
    env_via, row, signal, wait_until,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};

/// Client bytes let through to the broker before a stall: the handshake
/// and some dozens of the ~350-byte messages `Fixture::insert` makes, so
/// the fault lands mid-batch with some events confirmed and most not.
const STALL_AT: u64 = 20_000;

/// Generous bound for "it did not hang": many times what the run needs.
const NO_HANG: Duration = Duration::from_secs(15);

/// Every arrival of every event, across all the runs of a test.
#[derive(Default)]
struct Ledger(HashMap<String, usize>);

impl Ledger {
    /// Takes what is in the queue now into the ledger.
    fn collect(&mut self, fx: &Fixture) {
        for (id, count) in fx.arrivals() {
            *self.0.entry(id).or_insert(0) += count;
        }
    }

    fn count(&self, event_id: &str) -> usize {
        self.0.get(event_id).copied().unwrap_or(0)
    }

    /// Events that never arrived: must always be empty.
    fn lost(&self, rows: &[Row]) -> Vec<String> {
        rows.iter()
            .filter(|row| self.count(&row.event_id) == 0)
            .map(|row| row.event_id.clone())
            .collect()
    }

    /// Events that arrived more than once.
    fn duplicated(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .0
            .iter()
            .filter(|(_, count)| **count > 1)
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }
}

fn command(fx: &Fixture, env: &[(&'static str, String)], args: &[&str]) -> Command {
    let mut command = fx.command();
    command
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn spawn(fx: &Fixture, env: &[(&'static str, String)], args: &[&str]) -> Child {
    command(fx, env, args)
        .spawn()
        .expect("starting outbox-poll")
}

/// A finished run: exit code, output, and how long it took from `since`.
struct Done {
    code: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Done {
    fn of(output: Output, since: Instant) -> Done {
        Done {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            took: since.elapsed(),
        }
    }

    fn field(&self, name: &str) -> i64 {
        let line = self.stdout.lines().last().unwrap_or_default();
        let summary: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{e}: {line:?}; stderr: {}", self.stderr));
        summary[name]
            .as_i64()
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    }
}

/// Exit 69 with one clear line on stderr: no panic, no backtrace, no
/// library noise.
fn assert_outage(done: &Done) {
    assert_eq!(done.code, 69, "{}", done.stderr);
    let lines: Vec<&str> = done.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {}", done.stderr);
    assert!(lines[0].starts_with("outbox-poll: error: "), "{}", lines[0]);
    assert!(
        !lines[0].contains("  "),
        "a broken-up message: {}",
        lines[0]
    );
}

fn run(fx: &Fixture, env: &[(&'static str, String)], args: &[&str]) -> Done {
    let since = Instant::now();
    let output = command(fx, env, args)
        .output()
        .expect("running outbox-poll");
    Done::of(output, since)
}

fn finish(child: Child, since: Instant) -> Done {
    Done::of(
        child.wait_with_output().expect("waiting for outbox-poll"),
        since,
    )
}

/// Direct runs (no proxy) until every row is published, within `limit`.
fn drain_directly(fx: &mut Fixture, limit: Duration) -> bool {
    wait_until(limit, || {
        let run = fx.run(&["--drain", "--batch-size", "1000"]);
        assert!(
            run.code == 0 || run.code == 69,
            "rerun failed: {}",
            run.stderr
        );
        fx.rows().iter().all(|row| row.published)
    })
}

/// A clean drain after the fault delivers every event (a duplicate is
/// allowed here, a loss never); the ledger holds what the queue got.
fn rerun_delivers_everything(fx: &mut Fixture) -> Ledger {
    assert!(drain_directly(fx, NO_HANG), "the rerun did not deliver");
    let mut ledger = Ledger::default();
    ledger.collect(fx);
    assert_eq!(ledger.lost(&fx.rows()), Vec::<String>::new(), "lost events");
    ledger
}

/// After a broker fault: confirmed events were marked and arrived exactly
/// once, the rest untouched; a rerun delivers everything, and duplicates
/// are only ever events the fault left unconfirmed.
fn assert_broker_fault_lost_nothing(fx: &mut Fixture, first: &Done) {
    let rows = fx.rows();
    let marked: Vec<&Row> = rows.iter().filter(|row| row.published).collect();
    assert!(
        !marked.is_empty() && marked.len() < rows.len(),
        "the fault was meant to land mid-batch; marked {} of {}",
        marked.len(),
        rows.len()
    );
    assert_eq!(first.field("published"), marked.len() as i64);
    assert_untouched(&rows);
    let mut ledger = Ledger::default();
    ledger.collect(fx);
    for row in &marked {
        assert_eq!(
            ledger.count(&row.event_id),
            1,
            "{} was marked",
            row.event_id
        );
    }

    assert!(drain_directly(fx, NO_HANG), "the rerun did not deliver");
    ledger.collect(fx);
    let rows = fx.rows();
    assert_eq!(ledger.lost(&rows), Vec::<String>::new(), "lost events");
    for id in ledger.duplicated() {
        assert!(
            !marked.iter().any(|row| row.event_id == id),
            "{id} was confirmed and marked, yet sent again"
        );
    }
}

/// A run of 400 events whose broker took the first STALL_AT bytes and
/// confirmed what was in them, the rest held back by the proxy.
fn stalled_mid_batch(fx: &mut Fixture, confirm_timeout: &str) -> (Proxy, Child, Instant) {
    stalled_after(
        fx,
        &["--batch-size", "400", "--confirm-timeout", confirm_timeout],
    )
}

/// The same with `args`, so that several batches can be in hand.
fn stalled_after(fx: &mut Fixture, args: &[&str]) -> (Proxy, Child, Instant) {
    fx.insert("e", 400);
    let broker = Proxy::start(amqp_addr());
    broker.stall_upstream_after(STALL_AT);
    let env = env_via(Some(&broker), None);
    let since = Instant::now();
    let args = [args, &["--json"]].concat();
    let child = spawn(fx, &env, &args);
    assert!(broker.wait_for_upstream(STALL_AT, NO_HANG));
    // What got through is queued, and its confirms have come back.
    assert!(wait_until(NO_HANG, || fx.amqp.queue_length(&fx.queue) > 0));
    assert!(broker.wait_for_quiet_downstream(Duration::from_millis(500), NO_HANG));
    (broker, child, since)
}

#[test]
fn broker_cut_mid_batch_marks_only_confirmed_events_and_a_rerun_delivers_the_rest() {
    let mut fx = Fixture::new("broker_cut");
    let (broker, child, since) = stalled_mid_batch(&mut fx, "60s");
    broker.cut();
    let done = finish(child, since);
    assert_outage(&done);
    assert!(done.took < NO_HANG, "took {:?}", done.took);
    assert!(done.stderr.contains("RabbitMQ"), "{}", done.stderr);
    assert_eq!(done.field("exit_code"), 69);
    assert_broker_fault_lost_nothing(&mut fx, &done);
}

#[test]
fn broker_cut_with_batches_in_flight_marks_only_confirmed_events_and_a_rerun_delivers_the_rest() {
    let mut fx = Fixture::new("broker_cut_drain");
    let args = ["--drain", "--batch-size", "20", "--confirm-timeout", "60s"];
    let (broker, child, since) = stalled_after(&mut fx, &args);
    broker.cut();
    let done = finish(child, since);
    assert_outage(&done);
    assert!(done.took < NO_HANG, "took {:?}", done.took);
    assert!(done.field("batches") >= 2, "{}", done.stdout);
    assert_broker_fault_lost_nothing(&mut fx, &done);
}

#[test]
fn broker_cut_in_the_middle_of_a_publish_frame_counts_no_attempt_and_a_rerun_delivers_everything() {
    let mut fx = Fixture::new("broker_cut_frame");
    fx.insert("e", 400);
    let broker = Proxy::start(amqp_addr());
    // Past the handshake and the first publishes, inside a message's frames.
    broker.cut_after(Direction::Upstream, STALL_AT + 77);
    let env = env_via(Some(&broker), None);
    let done = run(&fx, &env, &["--batch-size", "400", "--json"]);
    assert_outage(&done);
    assert!(done.took < NO_HANG, "took {:?}", done.took);
    assert_eq!(done.field("failed"), 0, "{}", done.stdout);
    assert_untouched(&fx.rows());

    rerun_delivers_everything(&mut fx);
}

/// Exit 69 soon after --confirm-timeout (well before NO_HANG), saying so,
/// and nothing lost.
fn assert_confirms_timed_out(fx: &mut Fixture, done: &Done) {
    assert_outage(done);
    assert!(done.took < NO_HANG, "took {:?}", done.took);
    assert!(done.stderr.contains("--confirm-timeout"), "{}", done.stderr);
    assert_broker_fault_lost_nothing(fx, done);
}

#[test]
fn broker_stall_mid_batch_exits_69_soon_after_the_confirm_timeout_and_loses_nothing() {
    let mut fx = Fixture::new("broker_stall");
    // The client's later bytes are held back; the broker's replies flow.
    let (_broker, child, since) = stalled_mid_batch(&mut fx, "2s");
    let done = finish(child, since);
    assert_confirms_timed_out(&mut fx, &done);
}

#[test]
fn broker_black_hole_after_connect_exits_69_soon_after_the_confirm_timeout() {
    let mut fx = Fixture::new("broker_black_hole");
    let (broker, child, since) = stalled_mid_batch(&mut fx, "3s");
    broker.stall(); // nothing moves either way, every socket stays open
    let done = finish(child, since);
    assert_confirms_timed_out(&mut fx, &done);
}

#[test]
fn broker_refusing_connections_at_start_exits_69_and_touches_no_row() {
    let mut fx = Fixture::new("broker_refused");
    fx.insert("e", 5);
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }; // closed again: connecting to it is refused
    let env = [("AMQP_URL", amqp_url_via(port))];
    let done = run(&fx, &env, &["--connect-timeout", "2s"]);
    assert_outage(&done);
    assert!(done.took < NO_HANG, "took {:?}", done.took);
    assert!(done.stderr.contains("RabbitMQ"), "{}", done.stderr);
    assert!(!done.stderr.contains("guest:guest"), "{}", done.stderr);
    let rows = fx.rows();
    assert!(rows.iter().all(|row| !row.published));
    assert_untouched(&rows);
    assert!(fx.messages().is_empty());
}

#[test]
fn broker_accepting_but_silent_at_start_exits_69_within_the_connect_timeout() {
    let mut fx = Fixture::new("broker_silent");
    fx.insert("e", 5);
    let broker = Proxy::start(amqp_addr());
    broker.stall();
    let env = env_via(Some(&broker), None);
    let done = run(&fx, &env, &["--connect-timeout", "2s"]);
    assert_outage(&done);
    assert!(
        done.took < NO_HANG,
        "--connect-timeout 2s took {:?}",
        done.took
    );
    assert!(done.stderr.contains("RabbitMQ"), "{}", done.stderr);
    assert_eq!(broker.connections(), 1);
    let rows = fx.rows();
    assert!(rows.iter().all(|row| !row.published));
    assert_untouched(&rows);

    broker.resume();
    let done = run(&fx, &env, &[]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert_eq!(fx.arrivals().len(), 5);
}

#[test]
fn postgres_silent_at_connect_exits_69_within_the_connect_timeout() {
    let mut fx = Fixture::new("pg_silent");
    fx.insert("e", 3);
    let db = Proxy::start(database_addr());
    let broker = Proxy::start(amqp_addr());
    db.stall(); // accepts TCP, never answers the startup
    let mut env = env_via(Some(&broker), None);
    // With a password, which no message may show.
    let url = database_url_via(db.port()).replacen('@', ":sekrit@", 1);
    env.push(("DATABASE_URL", url));
    let done = run(&fx, &env, &["--connect-timeout", "2s", "--json"]);
    assert_outage(&done);
    assert!(
        done.took < NO_HANG,
        "--connect-timeout 2s took {:?}",
        done.took
    );
    assert!(done.stderr.contains("PostgreSQL"), "{}", done.stderr);
    assert!(done.stderr.contains("--connect-timeout"), "{}", done.stderr);
    assert!(!done.stderr.contains("sekrit"), "{}", done.stderr);
    assert_eq!(done.field("exit_code"), 69);
    assert_eq!(broker.connections(), 0);
    assert_untouched(&fx.rows());
}

#[test]
fn postgres_cut_while_publishing_exits_69_and_the_rerun_delivers_everything() {
    let mut fx = Fixture::new("pg_cut");
    fx.insert("e", 400);
    let db = Proxy::start(database_addr());
    let broker = Proxy::start(amqp_addr());
    broker.stall_upstream_after(STALL_AT);
    let env = env_via(Some(&broker), Some(&db));
    let since = Instant::now();
    let child = spawn(&fx, &env, &["--batch-size", "400", "--json"]);
    assert!(broker.wait_for_upstream(STALL_AT, NO_HANG));
    db.cut();
    broker.resume(); // the confirms come back; marking them cannot
    let done = finish(child, since);
    assert_outage(&done);
    assert!(done.took < NO_HANG, "took {:?}", done.took);
    assert!(done.stderr.contains("PostgreSQL") || done.stderr.contains("table"));
    assert_eq!(done.field("published"), 0);
    let rows = fx.rows();
    assert!(
        rows.iter().all(|row| !row.published),
        "nothing was committed"
    );
    assert_untouched(&rows);
    let mut ledger = Ledger::default();
    ledger.collect(&fx);
    let sent_before = ledger.0.len();
    assert!(
        sent_before > 0,
        "the cut was meant to land after publishing"
    );

    assert!(
        drain_directly(&mut fx, NO_HANG),
        "the rerun did not deliver"
    );
    ledger.collect(&fx);
    assert_eq!(ledger.lost(&fx.rows()), Vec::<String>::new(), "lost events");
    // The broker had these before the cut; we could not record it, so the
    // rerun sends them again: the one duplicate this fault must produce.
    assert!(ledger.duplicated().len() <= sent_before);
}

#[test]
fn postgres_cut_during_the_claim_exits_69_and_cannot_duplicate() {
    let mut fx = Fixture::new("pg_cut_claim");
    fx.insert("e", 2000); // a claim answer of some 500 kB
    let db = Proxy::start(database_addr());
    let broker = Proxy::start(amqp_addr());
    // Past the startup and the prepared statements, inside the claim's rows.
    db.cut_after(Direction::Downstream, 100_000);
    let env = env_via(Some(&broker), Some(&db));
    let done = run(&fx, &env, &["--batch-size", "2000", "--json"]);
    assert_outage(&done);
    assert!(done.took < NO_HANG, "took {:?}", done.took);
    assert!(done.stderr.contains("claiming"), "{}", done.stderr);
    assert_eq!(done.field("claimed"), 0);
    assert_eq!(broker.connections(), 0, "nothing was sent");
    assert_untouched(&fx.rows());
    assert!(fx.messages().is_empty());

    let ledger = rerun_delivers_everything(&mut fx);
    assert_eq!(ledger.duplicated(), Vec::<String>::new());
}

#[test]
fn postgres_stall_while_publishing_is_ended_by_the_watchdog_and_frees_the_rows() {
    let mut fx = Fixture::new("pg_stall");
    fx.insert("e", 400);
    let db = Proxy::start(database_addr());
    let broker = Proxy::start(amqp_addr());
    broker.stall_upstream_after(STALL_AT);
    let env = env_via(Some(&broker), Some(&db));
    let since = Instant::now();
    let child = spawn(
        &fx,
        &env,
        &[
            "--batch-size",
            "400",
            "--connect-timeout",
            "1s",
            "--confirm-timeout",
            "2s",
            "--json",
        ],
    );
    assert!(broker.wait_for_upstream(STALL_AT, NO_HANG));
    db.stall(); // sockets open, nothing moves: the driver alone would wait for ever
    broker.resume();
    let done = finish(child, since);
    assert_outage(&done);
    // The batch's budget is 2 x 1 s + 2 s + 30 s statement + 5 s margin.
    assert!(done.took < Duration::from_secs(90), "took {:?}", done.took);
    assert!(
        done.stderr.contains("did not finish within"),
        "{}",
        done.stderr
    );
    assert_eq!(done.field("exit_code"), 69);
    assert_untouched(&fx.rows());

    // The proxy still holds the server's socket open, so the server ends
    // the idle transaction on its own (idle_in_transaction_session_timeout)
    // and the rows are free again: no run holds its locks for ever.
    let mut ledger = Ledger::default();
    ledger.collect(&fx);
    assert!(
        drain_directly(&mut fx, Duration::from_secs(60)),
        "the stalled run's row locks were never released"
    );
    ledger.collect(&fx);
    assert_eq!(ledger.lost(&fx.rows()), Vec::<String>::new(), "lost events");
}

#[test]
fn sigkill_mid_batch_lets_another_run_claim_the_rows_within_seconds() {
    let mut fx = Fixture::new("sigkill");
    fx.insert("e", 400);
    let broker = Proxy::start(amqp_addr());
    broker.stall_upstream_after(STALL_AT);
    let env = env_via(Some(&broker), None);
    let mut child = spawn(
        &fx,
        &env,
        &["--batch-size", "400", "--confirm-timeout", "60s"],
    );
    assert!(broker.wait_for_upstream(STALL_AT, NO_HANG));
    child.kill().unwrap(); // SIGKILL: no handler, no cleanup
    let killed = finish(child, Instant::now());
    assert_eq!(killed.code, -1, "killed by a signal");
    let rows = fx.rows();
    assert!(rows.iter().all(|row| !row.published));
    assert_untouched(&rows);
    let mut ledger = Ledger::default();
    ledger.collect(&fx);
    let sent_before = ledger.0.len();

    let since = Instant::now();
    assert!(
        drain_directly(&mut fx, Duration::from_secs(10)),
        "the killed run's rows stayed locked"
    );
    assert!(since.elapsed() < Duration::from_secs(10));
    ledger.collect(&fx);
    assert_eq!(ledger.lost(&fx.rows()), Vec::<String>::new(), "lost events");
    assert!(ledger.duplicated().len() <= sent_before);
}

#[test]
fn sigterm_during_a_drain_finishes_the_batch_starts_no_other_and_exits_143() {
    let mut fx = Fixture::new("sigterm");
    fx.insert("e", 400);
    let broker = Proxy::start(amqp_addr());
    broker.stall_upstream_after(STALL_AT); // a few batches in
    let env = env_via(Some(&broker), None);
    let since = Instant::now();
    let child = spawn(&fx, &env, &["--drain", "--batch-size", "20", "--json"]);
    assert!(broker.wait_for_upstream(STALL_AT, NO_HANG));
    signal(&child, "-TERM");
    sleep(Duration::from_millis(300));
    broker.resume();
    let done = finish(child, since);
    assert_eq!(done.code, 143, "{}", done.stderr);
    assert!(done.took < NO_HANG, "took {:?}", done.took);
    assert_eq!(done.field("exit_code"), 143);

    let rows = fx.rows();
    let published = rows.iter().filter(|row| row.published).count();
    let batches = done.field("batches") as usize;
    assert!(
        batches >= 1 && published < rows.len(),
        "{published} published"
    );
    assert_eq!(published, batches * 20, "whole batches only");
    assert!(
        rows[..published].iter().all(|row| row.published),
        "the committed batches are the first ones"
    );
    assert_untouched(&rows);
    let mut ledger = Ledger::default();
    ledger.collect(&fx);
    assert_eq!(
        ledger.0.len(),
        published,
        "nothing past the last batch was sent"
    );
    assert_eq!(ledger.duplicated(), Vec::<String>::new());
    assert_eq!(ledger.lost(&rows[..published]), Vec::<String>::new());
}

#[test]
fn sigterm_during_an_ordered_drain_claims_no_next_batch_even_one_a_held_row_would_block() {
    // In a database of its own: the ordered modes wait for every writing
    // transaction of their database, and other tests hold some.
    let mut fx = Fixture::isolated("sigterm_ordered");
    fx.insert("e", 200);
    // The ordered claim waits for a locked row rather than skip it: a
    // claim of the second batch would wait on e-150, then fail.
    let held = fx.hold_row("e-150");
    let broker = Proxy::start(amqp_addr());
    broker.stall_upstream_after(STALL_AT); // inside the first batch
    let env = env_via(Some(&broker), None);
    let since = Instant::now();
    let args = ["--ordered", "--drain", "--batch-size", "100", "--json"];
    let child = spawn(&fx, &env, &args);
    assert!(broker.wait_for_upstream(STALL_AT, NO_HANG));
    signal(&child, "-TERM");
    sleep(Duration::from_millis(300));
    broker.resume();
    let done = finish(child, since);
    held.release();
    assert_eq!(done.code, 143, "{}", done.stderr);
    assert_eq!(done.stderr, "", "nothing failed");
    assert_eq!((done.field("batches"), done.field("published")), (1, 100));
    assert!(done.took < NO_HANG, "took {:?}", done.took);
}

#[test]
fn sigint_during_a_drain_before_publishing_rolls_back_and_exits_130() {
    let mut fx = Fixture::new("sigint");
    fx.insert("e", 10);
    let db = Proxy::start(database_addr());
    let broker = Proxy::start(amqp_addr());
    db.stall(); // holds the run in its PostgreSQL connect
    let env = env_via(Some(&broker), Some(&db));
    let since = Instant::now();
    let child = spawn(
        &fx,
        &env,
        &[
            "--drain",
            "--batch-size",
            "5",
            "--connect-timeout",
            "30s",
            "--json",
        ],
    );
    assert!(wait_until(NO_HANG, || db.connections() == 1));
    sleep(Duration::from_millis(200));
    signal(&child, "-INT"); // ends the run's wait for PostgreSQL at once
    sleep(Duration::from_millis(200));
    db.resume(); // too late: the run claimed nothing
    let done = finish(child, since);
    assert_eq!(done.code, 130, "{}", done.stderr);
    assert!(done.took < NO_HANG, "took {:?}", done.took);
    assert_eq!((done.field("published"), done.field("batches")), (0, 0));
    assert_eq!(broker.connections(), 0, "nothing was published");
    let rows = fx.rows();
    assert!(rows.iter().all(|row| !row.published));
    assert_untouched(&rows);
    assert!(fx.messages().is_empty());
    // The claim was rolled back: the rows are free for the next run.
    let run = fx.run(&["--json"]);
    assert_eq!(
        (run.code, run.field("published")),
        (0, 10),
        "{}",
        run.stderr
    );
}

/// A queue of the test's own beside the fixture's, on a connection of its
/// own, deleted at the end.
struct ExtraQueue {
    amqp: Amqp,
    name: String,
}

impl ExtraQueue {
    fn new(fx: &Fixture, suffix: &str, arguments: FieldTable, binding: &str) -> Self {
        let name = format!("{}_{suffix}", fx.queue);
        let amqp = Amqp::connect();
        amqp.declare_queue(&name, arguments);
        amqp.bind(&name, &fx.exchange, binding);
        ExtraQueue { amqp, name }
    }
}

impl Drop for ExtraQueue {
    fn drop(&mut self) {
        self.amqp.delete_queue(&self.name);
    }
}

fn insert_around(fx: &mut Fixture, poison_id: &str, poison_type: &str) {
    for n in 1..=3 {
        fx.insert_event(&format!("ok-{n}"), "ok.created", r#"{"n": 1}"#);
    }
    fx.insert_event(poison_id, poison_type, r#"{"poison": true}"#);
    for n in 4..=6 {
        fx.insert_event(&format!("ok-{n}"), "ok.created", r#"{"n": 1}"#);
    }
}

/// The poison event failed once, with `reason` in its last_error; every
/// other event was published and arrived exactly once.
fn assert_only_poison_failed(fx: &mut Fixture, poison_id: &str, reason: &str) {
    let rows = fx.rows();
    let poison = row(&rows, poison_id);
    assert!(!poison.published);
    assert_eq!(poison.attempts, 1);
    let error = poison.last_error.as_deref().unwrap_or_default();
    assert!(error.contains(reason), "last_error: {error}");
    assert!(poison.due_in_s > 0.0, "a failed event backs off");
    let others: Vec<&Row> = rows.iter().filter(|r| r.event_id != poison_id).collect();
    assert!(others.iter().all(|r| r.published && r.attempts == 0));
    let mut ledger = Ledger::default();
    ledger.collect(fx);
    for other in &others {
        assert_eq!(ledger.count(&other.event_id), 1, "{}", other.event_id);
    }
    assert_eq!(ledger.count(poison_id), 0);
}

#[test]
fn nacked_event_counts_no_attempt_and_nacks_never_make_it_dead() {
    let mut fx = Fixture::new("poison_nack");
    fx.route_only("ok.#");
    let mut arguments = FieldTable::default();
    arguments.insert(ShortString::from("x-max-length"), AMQPValue::LongInt(0));
    arguments.insert(
        ShortString::from("x-overflow"),
        AMQPValue::LongString("reject-publish".into()),
    );
    let _full = ExtraQueue::new(&fx, "full", arguments, "full.#");
    insert_around(&mut fx, "full-1", "full.created");

    // Three runs past --max-attempts 2 (the backoff skipped each time): a
    // broker that keeps declining an event never makes it dead.
    for _ in 0..3 {
        let run = fx.run(&["--json", "--max-attempts", "2"]);
        assert_eq!(run.code, 1, "{}", run.stderr);
        assert_eq!(run.field("failed"), 1);
        let rows = fx.rows();
        let nacked = row(&rows, "full-1");
        assert_eq!((nacked.published, nacked.attempts), (false, 0));
        assert!(nacked.due_in_s > 0.0, "a nacked event backs off");
        fx.execute("UPDATE {table} SET available_at = now()");
    }
    let rows = fx.rows();
    assert!(
        rows.iter()
            .filter(|row| row.event_id != "full-1")
            .all(|row| row.published && row.attempts == 0)
    );
    let mut ledger = Ledger::default();
    ledger.collect(&fx);
    assert_eq!(ledger.count("ok-1"), 1);
    assert_eq!(ledger.count("full-1"), 0);
}

#[test]
fn unroutable_event_counts_against_itself_only_and_backs_off_exponentially() {
    let mut fx = Fixture::new("poison_unroutable");
    fx.route_only("ok.#");
    insert_around(&mut fx, "lost-1", "nowhere.created");

    let run = fx.run(&["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (6, 1));
    assert_only_poison_failed(&mut fx, "lost-1", "unroutable");
    // 2 s x 2^0, times a jitter factor in [0.5, 1): at least 1 s from the
    // failure, read here a little later (tests/delivery.rs pins it exactly).
    let due = row(&fx.rows(), "lost-1").due_in_s;
    assert!(due > 0.0 && due <= 2.0, "first backoff {due} s");

    fx.execute("UPDATE {table} SET available_at = now()");
    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("claimed")), (1, 1), "{}", run.stderr);
    let rows = fx.rows();
    let poison = row(&rows, "lost-1");
    assert_eq!(poison.attempts, 2);
    // 2 s x 2^1, times the jitter: at least 2 s from the failure.
    assert!(
        (0.5..=4.0).contains(&poison.due_in_s),
        "second backoff {} s",
        poison.due_in_s
    );
    assert!(fx.messages().is_empty(), "nothing was re-sent");

    // Far along, the wait is capped at an hour (times the jitter).
    fx.execute("UPDATE {table} SET available_at = now(), attempts = 20");
    let run = fx.run(&["--max-attempts", "30"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let due = row(&fx.rows(), "lost-1").due_in_s;
    assert!((1790.0..=3600.0).contains(&due), "capped backoff {due} s");
}

#[test]
fn oversized_event_closes_the_channel_yet_only_it_fails_and_then_it_is_dead() {
    let mut fx = Fixture::new("poison_oversized");
    for n in 1..=3 {
        fx.insert_event(&format!("ok-{n}"), "ok.created", r#"{"n": 1}"#);
    }
    // Over RabbitMQ's default max_message_size (128 MiB): the broker closes
    // the channel with PRECONDITION_FAILED. It compresses to almost nothing
    // in the table.
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload) \
         VALUES ('big-1', 'ok.created', jsonb_build_object('blob', repeat('x', 135000000)))",
    );
    for n in 4..=6 {
        fx.insert_event(&format!("ok-{n}"), "ok.created", r#"{"n": 1}"#);
    }

    // All seven in one batch, the events after big-1 on the wire behind it:
    // --batch-bytes would otherwise end the batch at big-1.
    let args = ["--json", "--max-attempts", "1", "--confirm-timeout", "60s"];
    let run = fx.run(&[&args[..], &["--batch-bytes", "1GiB"]].concat());
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (6, 1));
    assert_only_poison_failed(&mut fx, "big-1", "closed the channel");

    fx.insert_event("ok-7", "ok.created", "{}");
    let run = fx.run(&["--json", "--max-attempts", "1"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("claimed"), 1, "the dead event is never claimed");
    assert_eq!(fx.arrivals().get("ok-7"), Some(&1));
}

/// The simple-query message the relay sends to commit a batch.
const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

#[test]
fn a_commit_whose_answer_is_lost_says_its_outcome_is_unknown() {
    let mut fx = Fixture::new("commit_lost");
    fx.insert("e", 10);
    let db = Proxy::start(database_addr());
    db.cut_after_sending(COMMIT);
    let metrics =
        std::env::temp_dir().join(format!("outbox-poll-{}-commit.prom", std::process::id()));
    // In plain text, for the proxy to see the COMMIT go by (the default
    // sslmode, prefer, would take TLS with this server).
    let mut env = env_via(None, Some(&db));
    env.push(("PGSSLMODE", "disable".into()));
    let done = run(
        &fx,
        &env,
        &["--json", "--metrics-file", metrics.to_str().unwrap()],
    );
    let gauges = std::fs::read_to_string(&metrics).unwrap_or_default();
    let _ = std::fs::remove_file(&metrics);
    assert_eq!(done.code, 69, "{}", done.stderr);
    // The metrics file says it has no backlog (the connection is gone),
    // then the one error line.
    let error = done.stderr.lines().last().unwrap_or_default();
    assert!(
        error.starts_with("outbox-poll: error: committing the batch")
            && error.contains("the commit's outcome is unknown"),
        "{}",
        done.stderr
    );
    assert!(
        !done.stderr.contains("nothing was marked"),
        "{}",
        done.stderr
    );
    assert_eq!(
        (
            done.field("claimed"),
            done.field("published"),
            done.field("failed"),
            done.field("unknown")
        ),
        (10, 0, 0, 10)
    );
    assert!(
        gauges.contains("outbox_poll_last_run_unknown{") && gauges.contains("} 10\n"),
        "{gauges}"
    );
    // The server had the COMMIT: every row is marked, and arrived once.
    assert!(
        wait_until(NO_HANG, || fx.published_count() == 10),
        "{:?}",
        fx.rows()
    );
    assert_eq!(fx.arrivals().len(), 10);
}
