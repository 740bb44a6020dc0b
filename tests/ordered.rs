//! --ordered: one active publisher per table, strict id order, and a batch
//! that stops at its first failure, so no consumer ever sees an event
//! before one that precedes it.

use std::collections::HashSet;
use std::process::Stdio;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::common::proxy::Proxy;
use crate::common::{Fixture, Row, amqp_addr, amqp_url_via, row};

fn ids(fx: &Fixture) -> Vec<String> {
    fx.messages().into_iter().map(|m| m.message_id).collect()
}

fn untouched(row: &Row) -> bool {
    !row.published && row.attempts == 0 && row.last_error.is_none()
}

#[test]
fn ordered_run_that_finds_the_lock_taken_exits_0_at_once() {
    let mut fx = Fixture::isolated("ordered_lock");
    fx.insert("e", 5);
    let broker = Proxy::start(amqp_addr());
    let env = [("AMQP_URL", amqp_url_via(broker.port()))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    // Another run, as far as outbox-poll can tell: the same lock, held by a
    // transaction that stays open for the rest of the test.
    let mut other = fx.connect();
    let mut tx = other.transaction().unwrap();
    let sql = format!(
        "SELECT pg_try_advisory_xact_lock(2052318419, '{}'::regclass::oid::int)",
        fx.quoted_table().replace('\'', "''")
    );
    let taken: bool = tx.query_one(&sql, &[]).unwrap().get(0);
    assert!(taken);

    let since = Instant::now();
    let run = fx.run_with(&env, &["--ordered", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(since.elapsed() < Duration::from_secs(5), "it waited");
    assert_eq!((run.field("claimed"), run.field("published")), (0, 0));
    assert_eq!(broker.connections(), 0, "the broker was never needed");
    assert!(fx.rows().iter().all(untouched));
    tx.rollback().unwrap(); // the other run ends: the next one publishes

    let run = fx.run_with(&env, &["--ordered", "--json"]);
    assert_eq!((run.code, run.field("published")), (0, 5), "{}", run.stderr);
    assert_eq!(ids(&fx), ["e-1", "e-2", "e-3", "e-4", "e-5"]);
}

#[test]
fn ordered_run_publishes_in_strict_id_order() {
    let mut fx = Fixture::isolated("ordered_order");
    // Names that sort otherwise than the ids, so only id order passes.
    let names: Vec<String> = (0..30).map(|n| format!("evt-{}", (n * 7) % 30)).collect();
    for name in &names {
        fx.insert_event(name, "order.created", "{}");
    }
    let run = fx.run(&["--ordered", "--drain", "--batch-size", "8", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("batches")), (30, 4));
    assert_eq!(ids(&fx), names, "every event once, in id order");
}

#[test]
fn ordered_run_never_skips_past_a_row_another_transaction_holds() {
    let mut fx = Fixture::isolated("ordered_no_skip");
    fx.insert("e", 3);
    // Someone (a requeue, a plain run) holds e-2 for a moment.
    let held = fx.hold_row("e-2");

    // A plain claim skips the held row (that is what keeps plain runs
    // apart); a dry run shows it without publishing anything.
    let plain = fx.run(&["--dry-run"]);
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    let claimed: Vec<String> = plain
        .stdout
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["event_id"].to_string()
        })
        .collect();
    assert_eq!(claimed, [r#""e-1""#, r#""e-3""#]);

    // An ordered run must wait for it instead of publishing e-3 first.
    let mut command = fx.command();
    command.args(["--ordered", "--json"]).stdout(Stdio::piped());
    let ordered = command.spawn().unwrap();
    sleep(Duration::from_millis(500));
    held.release();
    let output = ordered.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(ids(&fx), ["e-1", "e-2", "e-3"], "e-3 never overtook e-2");
}

/// ok-1, ok-2, then an unroutable event, then ok-4, ok-5.
fn stream_with_unroutable_third(fx: &mut Fixture) {
    fx.route_only("ok.#");
    fx.insert_event("ok-1", "ok.created", "{}");
    fx.insert_event("ok-2", "ok.created", "{}");
    fx.insert_event("bad-3", "nowhere.created", "{}");
    fx.insert_event("ok-4", "ok.created", "{}");
    fx.insert_event("ok-5", "ok.created", "{}");
}

#[test]
fn ordered_batch_stops_at_its_first_failure_and_publishes_nothing_after_it() {
    let mut fx = Fixture::isolated("ordered_stop");
    stream_with_unroutable_third(&mut fx);

    let run = fx.run(&["--ordered", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (2, 1));
    let rows = fx.rows();
    assert!(row(&rows, "ok-1").published && row(&rows, "ok-2").published);
    assert_eq!(row(&rows, "bad-3").attempts, 1);
    assert!(untouched(row(&rows, "ok-4")) && untouched(row(&rows, "ok-5")));
    assert_eq!(ids(&fx), ["ok-1", "ok-2"], "nothing after the failure");

    // While the head event backs off, nothing behind it may overtake it.
    let run = fx.run(&["--ordered", "--json"]);
    assert_eq!((run.code, run.field("claimed")), (0, 0), "{}", run.stderr);
    assert!(fx.messages().is_empty());
    let rows = fx.rows();
    assert!(untouched(row(&rows, "ok-4")) && untouched(row(&rows, "ok-5")));
}

#[test]
fn dead_head_event_no_longer_blocks_the_ordered_stream() {
    let mut fx = Fixture::isolated("ordered_dead");
    stream_with_unroutable_third(&mut fx);
    let run = fx.run(&["--ordered", "--max-attempts", "1"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(ids(&fx), ["ok-1", "ok-2"]);

    let run = fx.run(&["--ordered", "--max-attempts", "1", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("claimed"), run.field("published")), (2, 2));
    assert_eq!(ids(&fx), ["ok-4", "ok-5"]);
    let rows = fx.rows();
    let dead = row(&rows, "bad-3");
    assert_eq!((dead.published, dead.attempts), (false, 1));
}

#[test]
fn ordered_channel_error_fails_that_event_only_and_stops_the_batch() {
    let mut fx = Fixture::isolated("ordered_channel_error");
    fx.insert_event("ok-1", "ok.created", "{}");
    // Over RabbitMQ's default max_message_size: the broker closes the channel.
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload) \
         VALUES ('big-2', 'ok.created', jsonb_build_object('blob', repeat('x', 135000000)))",
    );
    fx.insert_event("ok-3", "ok.created", "{}");

    let run = fx.run(&["--ordered", "--max-attempts", "1", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (1, 1));
    let rows = fx.rows();
    let big = row(&rows, "big-2");
    assert_eq!(big.attempts, 1);
    let error = big.last_error.as_deref().unwrap_or_default();
    assert!(error.contains("closed the channel"), "{error}");
    assert!(untouched(row(&rows, "ok-3")));
    assert_eq!(ids(&fx), ["ok-1"]);

    // Dead now, it blocks nothing: the next run goes on from ok-3.
    let run = fx.run(&["--ordered", "--max-attempts", "1", "--json"]);
    assert_eq!((run.code, run.field("published")), (0, 1), "{}", run.stderr);
    assert_eq!(ids(&fx), ["ok-3"]);
}

#[test]
fn ordered_broker_cut_leaves_a_published_prefix_and_the_rerun_continues_in_order() {
    let mut fx = Fixture::isolated("ordered_cut");
    fx.insert("e", 300);
    let broker = Proxy::start(amqp_addr());
    broker.stall_upstream_after(20_000); // some dozens of events in
    let child = fx
        .command()
        .env("AMQP_URL", amqp_url_via(broker.port()))
        .args([
            "--ordered",
            "--batch-size",
            "300",
            "--confirm-timeout",
            "60s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(crate::common::wait_until(Duration::from_secs(15), || {
        broker.upstream_bytes() >= 20_000
    }));
    // What got through is queued, and its confirms are on their way back.
    assert!(crate::common::wait_until(Duration::from_secs(15), || {
        fx.amqp.queue_length(&fx.queue) > 0
    }));
    sleep(Duration::from_millis(500));
    broker.cut();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "{stderr}");

    let rows = fx.rows();
    let published = rows.iter().take_while(|row| row.published).count();
    assert!(
        published > 0 && published < rows.len(),
        "{published} published"
    );
    assert!(
        rows[published..].iter().all(untouched),
        "only a prefix is published; the rest is exactly as it was"
    );
    let first = ids(&fx);
    let prefix: Vec<String> = rows[..published]
        .iter()
        .map(|r| r.event_id.clone())
        .collect();
    assert_eq!(first[..published], prefix[..], "the prefix, in order, once");
    // At most the one event in flight at the cut reached the broker unconfirmed.
    assert!(first.len() <= published + 1, "{} arrived", first.len());

    let run = fx.run(&["--ordered", "--batch-size", "300"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let rest = ids(&fx);
    let expected: Vec<String> = rows[published..]
        .iter()
        .map(|r| r.event_id.clone())
        .collect();
    // An event in flight at the cut may come again, right where it was.
    let rest = if first.len() > published && rest.first() == first.last() {
        rest[1..].to_vec()
    } else {
        rest
    };
    assert_eq!(rest, expected, "the rest, in order, nothing lost");
    let all: HashSet<&String> = first.iter().chain(rest.iter()).collect();
    assert_eq!(all.len(), rows.len());
}
