//! `outbox-poll wait`: until every event committed before it started is
//! published, dead or expired; at its --timeout, exit 1 saying what is left.

use std::process::{Child, Stdio};
use std::time::Duration;

use crate::common::{Fixture, Run, wait_until};

/// `wait` started in the background, with its stdout and stderr kept.
fn spawn_wait(fx: &Fixture, args: &[&str]) -> Child {
    fx.command()
        .arg("wait")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Whether the wait on `fx`'s table has taken its horizon: its session
/// has sent a statement naming the table (only the horizon's and the
/// looks that follow it do).
fn waiting(fx: &mut Fixture) -> bool {
    let sql = format!(
        "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'outbox-poll' \
           AND query LIKE '%{}%')",
        fx.schema
    );
    fx.db.query_one(&sql, &[]).unwrap().get(0)
}

#[test]
fn wait_returns_once_a_concurrent_drain_has_published_every_event_before_it() {
    let mut fx = Fixture::new("wait_drain");
    fx.insert("e", 300);
    // A dead event is never published: the wait does not wait for it.
    fx.execute("UPDATE {table} SET attempts = 10 WHERE event_id = 'e-1'");
    let wait = spawn_wait(&fx, &["--timeout", "60s", "--json"]);
    let drain = fx.run(&["--drain", "--batch-size", "20"]);
    assert_eq!(drain.code, 0, "{}", drain.stderr);
    let run = Run::from(wait.wait_with_output().unwrap());
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(run.field("left"), 0);
    assert_eq!(fx.published_count(), 299);
}

#[test]
fn wait_does_not_wait_for_events_committed_after_it_started() {
    let mut fx = Fixture::new("wait_later");
    fx.insert("e", 1);
    let wait = spawn_wait(&fx, &["--timeout", "60s"]);
    assert!(wait_until(Duration::from_secs(60), || waiting(&mut fx)));
    fx.insert("late", 1);
    fx.execute("UPDATE {table} SET published_at = now() WHERE event_id = 'e-1'");
    let run = Run::from(wait.wait_with_output().unwrap());
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(fx.published_count(), 1, "late-1 is still to publish");
}

#[test]
fn wait_does_not_wait_for_a_transaction_still_open_when_it_started() {
    let mut fx = Fixture::new("wait_open");
    // slow-1 takes its id first but commits after the wait started: it was
    // not committed before, though e-1, of a higher id, was.
    let mut producer = fx.connect();
    let sql = format!(
        "BEGIN; INSERT INTO {} (event_id, event_type, payload) VALUES ('slow-1', 't', '{{}}')",
        fx.quoted_table()
    );
    producer.batch_execute(&sql).unwrap();
    fx.insert("e", 1);
    let wait = spawn_wait(&fx, &["--timeout", "60s"]);
    assert!(wait_until(Duration::from_secs(60), || waiting(&mut fx)));
    producer.batch_execute("COMMIT").unwrap();
    fx.execute("UPDATE {table} SET published_at = now() WHERE event_id = 'e-1'");
    let run = Run::from(wait.wait_with_output().unwrap());
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(fx.published_count(), 1, "slow-1 is still to publish");
}

#[test]
fn wait_does_not_wait_for_an_event_past_its_expires_at() {
    let mut fx = Fixture::new("wait_expired");
    fx.insert("e", 2);
    // Never published, whether a run has marked it expired yet or not.
    fx.execute(
        "UPDATE {table} SET expires_at = now() - interval '1 second' WHERE event_id = 'e-2'",
    );
    fx.execute("UPDATE {table} SET published_at = now() WHERE event_id = 'e-1'");
    let run = fx.run(&["wait", "--timeout", "5s", "--json"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(run.field("left"), 0);
}

#[test]
fn wait_times_out_with_exit_1_saying_what_is_left() {
    let mut fx = Fixture::new("wait_timeout");
    fx.insert("e", 3);
    fx.execute(
        "UPDATE {table} SET available_at = now() + interval '1 hour' WHERE event_id = 'e-3'",
    );
    let run = fx.run(&["wait", "--timeout", "500ms"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.starts_with(&format!(
            "outbox-poll: timed out after 500ms: 3 events committed before the wait still \
             unpublished in table {} (2 due, 1 backing off), the oldest created ",
            fx.table
        )),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1);
    assert_eq!(fx.published_count(), 0);
}
