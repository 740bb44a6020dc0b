//! What the broker says about each event decides what happens to its row:
//! confirmed events are marked, returned ones count an attempt and back
//! off, nacked ones back off without counting one, dead ones are never
//! claimed, concurrent runs never share.

use std::collections::HashSet;
use std::process::Stdio;

use crate::common::Fixture;
use lapin::types::{AMQPValue, FieldTable};

#[test]
fn six_concurrent_drains_deliver_each_of_20000_events_exactly_once() {
    let mut fx = Fixture::new("six_drains");
    fx.insert("e", 20_000);
    let children: Vec<_> = (0..6)
        .map(|_| {
            let mut command = fx.command();
            command
                .args(["--drain", "--batch-size", "200", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            command.spawn().unwrap()
        })
        .collect();
    let mut published_by_runs = 0;
    let mut runs_that_published = 0;
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let published = summary["published"].as_i64().unwrap();
        published_by_runs += published;
        runs_that_published += usize::from(published > 0);
    }
    assert_eq!(
        published_by_runs, 20_000,
        "the runs' summaries add up to the table"
    );
    assert!(
        runs_that_published >= 2,
        "the runs did not overlap; the test proved nothing"
    );
    assert_eq!(fx.published_count(), 20_000);
    let arrivals = fx.arrivals();
    assert_eq!(arrivals.len(), 20_000, "every event arrived");
    let duplicates: Vec<_> = arrivals.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicates.is_empty(),
        "SKIP LOCKED keeps runs apart, yet these arrived twice: {duplicates:?}"
    );
}

#[test]
fn unroutable_events_count_an_attempt_and_are_not_retried_before_their_backoff() {
    let mut fx = Fixture::new("unroutable");
    fx.route_only("order.#"); // only order.* has a queue
    fx.insert_event("routable-1", "order.created", "{}");
    fx.insert_event("lost-1", "nobody.listens", "{}");
    fx.insert_event("routable-2", "order.paid", "{}");

    let run = fx.run(&["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (2, 1));

    let rows = fx.rows();
    let lost = rows.iter().find(|row| row.event_id == "lost-1").unwrap();
    assert!(!lost.published);
    assert_eq!(lost.attempts, 1);
    assert!(
        lost.last_error.as_deref().unwrap().contains("NO_ROUTE"),
        "{:?}",
        lost.last_error
    );
    assert!(lost.due_in_s > 0.0, "pushed into the future");
    assert!(
        rows.iter()
            .filter(|row| row.event_id.starts_with("routable"))
            .all(|row| row.published && row.attempts == 0)
    );
    let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(ids, ["routable-1", "routable-2"]);

    let again = fx.run(&["--json"]);
    assert_eq!(
        (again.code, again.field("claimed")),
        (0, 0),
        "backing off: not claimed again yet"
    );
}

#[test]
fn returns_fail_exactly_the_unroutable_events_of_a_large_batch() {
    // Hundreds in flight, unroutable ones scattered among them: each return
    // must count against its own event (matched by message_id: lapin may
    // hand a return to whichever confirm completes next) and no other.
    let mut fx = Fixture::new("returns_by_id");
    fx.route_only("order.#");
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload) \
         SELECT 'e-' || g, CASE WHEN g % 7 IN (0, 3) THEN 'nobody.listens' ELSE 'order.created' END, '{}' \
         FROM generate_series(1, 700) g",
    );
    let run = fx.run(&["--batch-size", "700", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let unroutable = |n: i64| n % 7 == 0 || n % 7 == 3;
    for row in fx.rows() {
        let n: i64 = row.event_id[2..].parse().unwrap();
        assert_eq!(
            (row.published, row.attempts),
            (!unroutable(n), i32::from(unroutable(n))),
            "{row:?}"
        );
    }
    let arrived: HashSet<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    let expected: HashSet<String> = (1..=700)
        .filter(|n| !unroutable(*n))
        .map(|n| format!("e-{n}"))
        .collect();
    assert_eq!(arrived, expected);
}

/// A queue of the fixture's exchange that holds `room` messages and makes
/// the broker nack the rest, as a quorum queue without a majority nacks
/// every one.
fn nacking_queue(fx: &Fixture, room: i32) -> String {
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongInt(room));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    let full = format!("{}_full", fx.queue);
    fx.amqp.declare_with(&full, &full, "#", arguments);
    full
}

#[test]
fn nacked_events_count_no_attempt_back_off_and_the_rest_are_marked() {
    let mut fx = Fixture::new("nacked");
    let full = nacking_queue(&fx, 2);
    fx.insert("e", 5);

    let run = fx.run(&["--exchange", &full, "--json"]);
    fx.amqp.delete(&full, &full);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (2, 3));
    assert!(
        run.stderr.contains("not counted as an attempt"),
        "{}",
        run.stderr
    );
    let rows = fx.rows();
    let states: Vec<(bool, i32)> = rows
        .iter()
        .map(|row| (row.published, row.attempts))
        .collect();
    assert_eq!(
        states,
        [(true, 0), (true, 0), (false, 0), (false, 0), (false, 0)]
    );
    for row in &rows[2..] {
        let error = row.last_error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("nacked by the broker (not counted as an attempt)"),
            "{error}"
        );
    }
}

#[test]
fn a_nacked_event_waits_15_to_30_seconds_whatever_its_attempts() {
    let mut fx = Fixture::new("nack_backoff");
    let full = nacking_queue(&fx, 0);
    fx.insert("e", 20);
    // Attempts keep the event's own backoff for its own failures: a nack
    // neither reads nor changes them.
    fx.execute("UPDATE {table} SET attempts = 5 WHERE id % 2 = 0");
    let before = fx.clock();
    let run = fx.run(&["--exchange", &full, "--batch-size", "20"]);
    let after = fx.clock();
    fx.amqp.delete(&full, &full);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let sql = format!(
        "SELECT attempts, extract(epoch FROM available_at - $1)::float8, \
                extract(epoch FROM available_at - $2)::float8 FROM {} ORDER BY id",
        fx.quoted_table()
    );
    let waits: Vec<(i32, f64, f64)> = fx
        .db
        .query(&sql, &[&before, &after])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    for (n, (attempts, since_before, since_after)) in waits.iter().enumerate() {
        assert_eq!(*attempts, if n % 2 == 1 { 5 } else { 0 }, "{waits:?}");
        assert!(*since_before >= 15.0 && *since_after < 30.0, "{waits:?}");
    }
}

#[test]
fn a_drain_over_a_broker_that_nacks_everything_offers_each_event_once() {
    let mut fx = Fixture::new("nack_drain");
    let full = nacking_queue(&fx, 0);
    // Batches of one: a drain of some seconds, longer than the first step
    // of the attempt-keyed backoff (1-2 s), which a nack must not use.
    fx.insert("e", 300);
    let run = fx.run(&[
        "--exchange",
        &full,
        "--drain",
        "--batch-size",
        "1",
        "--json",
    ]);
    fx.amqp.delete(&full, &full);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(
        (
            run.field("claimed"),
            run.field("failed"),
            run.field("published")
        ),
        (300, 300, 0)
    );
    assert!(fx.rows().iter().all(|row| row.attempts == 0));
}

#[test]
fn backoff_grows_with_attempts_and_is_capped() {
    let mut fx = Fixture::new("backoff");
    fx.route_only("none");
    fx.insert("e", 3);
    fx.execute("UPDATE {table} SET attempts = CASE id WHEN 1 THEN 0 WHEN 2 THEN 5 ELSE 30 END");
    // The run's claim time lies between these two readings of the clock.
    let before = fx.clock();
    let run = fx.run(&["--max-attempts", "100"]);
    let after = fx.clock();
    assert_eq!(run.code, 1, "{}", run.stderr);
    let sql = format!(
        "SELECT id, extract(epoch FROM available_at - $1)::float8, extract(epoch FROM available_at - $2)::float8 \
         FROM {} ORDER BY id",
        fx.quoted_table()
    );
    let delays: Vec<(f64, f64)> = fx
        .db
        .query(&sql, &[&before, &after])
        .unwrap()
        .iter()
        .map(|row| (row.get(1), row.get(2)))
        .collect();
    // base 2 s * 2^attempts, times a jitter factor in [0.5, 1), capped at 1 h:
    // at least `low` after the earliest claim time, under `high` after the latest.
    for ((since_before, since_after), (low, high)) in
        delays
            .iter()
            .zip([(1.0, 2.0), (32.0, 64.0), (1800.0, 3600.0)])
    {
        assert!(*since_before >= low && *since_after < high, "{delays:?}");
    }
}

#[test]
fn events_that_fail_together_come_back_spread_over_the_jitter() {
    let mut fx = Fixture::new("jitter");
    fx.route_only("none");
    fx.insert("e", 50);
    let run = fx.run(&["--batch-size", "50"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let due: Vec<f64> = fx.rows().iter().map(|row| row.due_in_s).collect();
    let (low, high) = due.iter().fold((f64::MAX, f64::MIN), |(low, high), d| {
        (low.min(*d), high.max(*d))
    });
    // 2 s times a factor uniform in [0.5, 1): fifty draws spread over most
    // of the second between 1 and 2 s (under a quarter of it: 1 in 10^28).
    assert!(
        high - low > 0.25,
        "all back within {} s: {due:?}",
        high - low
    );
}

#[test]
fn dead_rows_are_never_claimed() {
    let mut fx = Fixture::new("dead_rows");
    fx.insert("e", 3);
    fx.execute("UPDATE {table} SET attempts = 10 WHERE id = 2");
    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("claimed")), (0, 2), "{}", run.stderr);
    let rows = fx.rows();
    assert!(
        !rows[1].published && rows[1].attempts == 10,
        "the dead row is left alone"
    );

    // The limit is --max-attempts: raised, the row is alive again.
    let run = fx.run(&["--max-attempts", "11", "--json"]);
    assert_eq!((run.code, run.field("claimed")), (0, 1), "{}", run.stderr);
}

#[test]
fn rows_not_yet_available_are_not_claimed() {
    let mut fx = Fixture::new("not_yet");
    fx.insert("e", 2);
    fx.execute("UPDATE {table} SET available_at = now() + interval '1 hour' WHERE id = 1");
    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("claimed")), (0, 1), "{}", run.stderr);
    assert!(!fx.rows()[0].published);
}

#[test]
fn published_rows_are_never_claimed_again() {
    let mut fx = Fixture::new("no_resend");
    fx.insert("e", 5);
    assert_eq!(fx.run(&[]).code, 0);
    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("claimed")), (0, 0));
    assert_eq!(fx.messages().len(), 5);
}
