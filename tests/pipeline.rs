//! A batch goes out pipelined (every publish issued before any confirm is
//! awaited): order, window boundaries and the attribution of returns must
//! be what they were when events went one at a time. A drain with a
//! backlog keeps several batches in flight, each on a session of its own.

use std::time::Duration;

use crate::common::proxy::Proxy;
use crate::common::{
    Fixture, amqp_addr, amqp_url_via, database_addr, database_url_via, row, wait_until,
};

#[test]
fn a_batch_larger_than_the_publish_window_arrives_once_in_id_order() {
    let mut fx = Fixture::new("pipeline_window");
    fx.insert("e", 2_500);
    let run = fx.run(&["--batch-size", "2500", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (2_500, 0));
    assert_eq!(fx.published_count(), 2_500);
    let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    let expected: Vec<String> = (1..=2_500).map(|n| format!("e-{n}")).collect();
    assert_eq!(ids, expected, "each event once, in id order");
}

#[test]
fn returns_in_a_pipelined_batch_fail_exactly_their_own_events() {
    let mut fx = Fixture::new("pipeline_returns");
    // An exchange that routes only order.* events: the rest come back.
    let routed = format!("{}_routed", fx.exchange);
    fx.amqp.declare(&routed, &routed, "order.*");
    for n in 1..=30u32 {
        let kind = if n.is_multiple_of(3) {
            "invoice.paid"
        } else {
            "order.created"
        };
        fx.insert_event(&format!("e-{n}"), kind, r#"{"n": 1}"#);
    }
    let run = fx.run_with(&[("OUTBOX_EXCHANGE", &routed)], &["--json"]);
    let arrived: Vec<String> = fx
        .amqp
        .take_all(&routed)
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    fx.amqp.delete(&routed, &routed);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (20, 10));
    for row in fx.rows() {
        let n: u32 = row.event_id[2..].parse().unwrap();
        if n.is_multiple_of(3) {
            assert!(!row.published, "{} was returned", row.event_id);
            assert_eq!(row.attempts, 1, "{}", row.event_id);
            let error = row.last_error.unwrap_or_default();
            assert!(error.contains("unroutable"), "{}: {error}", row.event_id);
        } else {
            assert!(row.published, "{} was routed", row.event_id);
            assert_eq!(row.attempts, 0, "{}", row.event_id);
        }
    }
    let expected: Vec<String> = (1..=30u32)
        .filter(|n| !n.is_multiple_of(3))
        .map(|n| format!("e-{n}"))
        .collect();
    assert_eq!(arrived, expected);
}

#[test]
fn an_outage_in_the_middle_of_a_pipelined_batch_marks_only_what_was_confirmed() {
    let mut fx = Fixture::new("pipeline_outage");
    fx.insert("e", 3_000);
    // The broker gets the handshake and a few hundred messages, then
    // nothing more: the rest of the batch is never confirmed.
    let broker = Proxy::start(amqp_addr());
    broker.stall_upstream_after(200_000);
    let url = amqp_url_via(broker.port());
    let run = fx.run_with(
        &[("AMQP_URL", url.as_str())],
        &["--batch-size", "3000", "--confirm-timeout", "2s", "--json"],
    );
    assert_eq!(run.code, 69, "{}", run.stderr);
    let rows = fx.rows();
    let marked: Vec<&str> = rows
        .iter()
        .filter(|row| row.published)
        .map(|row| row.event_id.as_str())
        .collect();
    assert!(
        !marked.is_empty() && marked.len() < 3_000,
        "{} marked",
        marked.len()
    );
    assert_eq!(run.field("published"), marked.len() as i64);
    for row in rows.iter().filter(|row| !row.published) {
        assert_eq!(
            (row.attempts, row.last_error.as_deref()),
            (0, None),
            "{} was left as it was",
            row.event_id
        );
    }
    let arrivals = fx.arrivals();
    for id in &marked {
        assert!(arrivals.contains_key(*id), "{id} marked but not delivered");
    }
}

/// How many sessions hold row locks on the fixture's table (FOR UPDATE
/// takes a RowShareLock on it for as long as the transaction lasts).
fn sessions_holding_rows(fx: &mut Fixture) -> i64 {
    let sql = format!(
        "SELECT count(DISTINCT pid) FROM pg_locks \
         WHERE relation = '{}'::regclass AND mode = 'RowShareLock'",
        fx.quoted_table()
    );
    fx.db.query_one(&sql, &[]).unwrap().get(0)
}

/// Drains (with `args`, --batch-size among them) through a broker that
/// takes the first `through` bytes and then hears nothing more: the first
/// batches are confirmed, their sessions and channels are reused, and the
/// drain is caught with every batch it may have in flight awaiting its
/// confirms. Returns whether `expected` sessions were seen holding rows at
/// once, and how many PostgreSQL connections the run opened in all.
fn in_flight_when_the_broker_stalls(
    fx: &mut Fixture,
    args: &[&str],
    through: u64,
    expected: i64,
) -> (bool, usize) {
    let broker = Proxy::start(amqp_addr());
    broker.stall_upstream_after(through);
    let db = Proxy::start(database_addr());
    let (amqp, database) = (amqp_url_via(broker.port()), database_url_via(db.port()));
    let env = [
        ("AMQP_URL", amqp.as_str()),
        ("DATABASE_URL", database.as_str()),
    ];
    let mut child = fx
        .command()
        .envs(env)
        .args(["--drain", "--confirm-timeout", "5s"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Every confirm for what got through is back: the drain has started
    // all the batches it will, and waits.
    let limit = Duration::from_secs(10);
    assert!(broker.wait_for_upstream(through, limit));
    assert!(broker.wait_for_quiet_downstream(Duration::from_millis(500), limit));
    let seen = wait_until(limit, || sessions_holding_rows(fx) == expected);
    let _ = child.kill();
    let _ = child.wait();
    (seen, db.connections())
}

#[test]
fn a_drain_of_small_batches_holds_four_in_flight_and_commits_on_a_fifth_session() {
    let mut fx = Fixture::new("pipeline_four_in_flight");
    fx.insert("e", 400);
    // Batches of 20 take about 6.5 KB on the wire: some 9 get through.
    let (seen, connections) =
        in_flight_when_the_broker_stalls(&mut fx, &["--batch-size", "20"], 60_000, 4);
    assert!(seen, "four transactions never held rows at once");
    assert_eq!(connections, 5);
}

#[test]
fn a_drain_of_large_batches_holds_two_in_flight_and_commits_on_a_third_session() {
    let mut fx = Fixture::new("pipeline_two_in_flight");
    fx.insert("e", 4_000);
    // Batches of 400 take about 130 KB on the wire: some 3 get through.
    let (seen, connections) =
        in_flight_when_the_broker_stalls(&mut fx, &["--batch-size", "400"], 400_000, 2);
    assert!(seen, "two transactions never held rows at once");
    assert_eq!(connections, 3);
}

/// Inserts `count` events e-1, e-2, ... of 10 kB payloads each.
fn insert_10_kb_events(fx: &mut Fixture, count: u32) {
    fx.execute(&format!(
        "INSERT INTO {{table}} (event_id, event_type, payload) \
         SELECT 'e-' || g, 'order.created', jsonb_build_object('blob', repeat('x', 10000)) \
         FROM generate_series(1, {count}) g"
    ));
}

#[test]
fn a_drain_holds_no_more_payload_bytes_in_flight_than_batch_bytes() {
    let mut fx = Fixture::new("pipeline_bytes_in_flight");
    insert_10_kb_events(&mut fx, 40);
    // Full batches of three 10 kB events: by count the drain would keep
    // four in flight, but the first already holds more than 25 kB.
    let args = ["--batch-size", "3", "--batch-bytes", "25kB"];
    let (seen, connections) = in_flight_when_the_broker_stalls(&mut fx, &args, 5_000, 1);
    assert!(seen, "more than one batch was in flight");
    assert_eq!(connections, 1);
}

#[test]
fn the_batch_a_drain_commits_still_counts_against_batch_bytes() {
    let mut fx = Fixture::new("pipeline_bytes_committing");
    insert_10_kb_events(&mut fx, 12);
    // Each full batch holds more than 25 kB: while one commits, its
    // events still count, so the next waits for its session.
    let db = Proxy::start(database_addr());
    let url = database_url_via(db.port());
    let args = [
        "--drain",
        "--batch-size",
        "3",
        "--batch-bytes",
        "25kB",
        "--json",
    ];
    let run = fx.run_with(&[("DATABASE_URL", url.as_str())], &args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("batches")), (12, 4));
    assert_eq!(db.connections(), 1);
}

#[test]
fn a_batch_that_fails_to_mark_still_lets_the_batches_in_flight_behind_it_be_marked() {
    let mut fx = Fixture::new("pipeline_mark_fails");
    fx.insert("e", 60);
    // The second batch (e-11 .. e-20) cannot be marked: a failure of
    // PostgreSQL's, not the broker's, with batches sent behind it.
    fx.execute(&format!(
        "CREATE FUNCTION \"{schema}\".refuse_e15() RETURNS trigger LANGUAGE plpgsql AS $$ \
           BEGIN \
             IF NEW.event_id = 'e-15' AND NEW.published_at IS NOT NULL THEN \
               RAISE EXCEPTION 'the test refuses to mark e-15'; \
             END IF; \
             RETURN NEW; \
           END $$; \
         CREATE TRIGGER refuse_e15 BEFORE UPDATE ON {{table}} \
           FOR EACH ROW EXECUTE FUNCTION \"{schema}\".refuse_e15();",
        schema = fx.schema
    ));
    let run = fx.run(&["--drain", "--batch-size", "10", "--json"]);
    assert_eq!(run.code, 69, "{}", run.stderr);
    assert!(
        run.stderr.contains("refuses to mark e-15"),
        "{}",
        run.stderr
    );
    let arrived = fx.arrivals();
    let rows = fx.rows();
    let in_the_failed_batch = |id: &str| (11..=20).any(|n| id == format!("e-{n}"));
    let unmarked: Vec<&str> = rows
        .iter()
        .filter(|row| arrived.contains_key(&row.event_id) && !row.published)
        .map(|row| row.event_id.as_str())
        .filter(|id| !in_the_failed_batch(id))
        .collect();
    assert_eq!(
        unmarked,
        Vec::<&str>::new(),
        "sent, confirmed, yet not marked"
    );
    // Batches three and four were in flight when the second failed.
    assert!((21..=40).all(|n| row(&rows, &format!("e-{n}")).published));
}

#[test]
fn a_drain_of_less_than_a_batch_opens_one_session() {
    let mut fx = Fixture::new("pipeline_one_session");
    fx.insert("e", 30);
    let db = Proxy::start(database_addr());
    let url = database_url_via(db.port());
    let args = ["--drain", "--batch-size", "100", "--json"];
    let run = fx.run_with(&[("DATABASE_URL", url.as_str())], &args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 30);
    assert_eq!(db.connections(), 1);
}

#[test]
fn a_drain_with_batches_in_flight_delivers_each_event_once_and_marks_every_row() {
    let mut fx = Fixture::new("pipeline_drain");
    fx.insert("e", 1_050);
    let run = fx.run(&["--drain", "--batch-size", "100", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("batches")), (1_050, 11));
    assert_eq!(fx.published_count(), 1_050);
    let mut ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    ids.sort();
    let mut expected: Vec<String> = (1..=1_050).map(|n| format!("e-{n}")).collect();
    expected.sort();
    assert_eq!(ids, expected, "each event exactly once");
}
