//! --ordered-by-key: order per ordering_key, one event of a key at a time,
//! keys in parallel across batches in flight and concurrent runs; a failed
//! event holds back the later events of its key, and only its key, until
//! it is published or dead.

use std::collections::HashSet;
use std::process::Stdio;

use crate::common::{Extra, Fixture, Message, Row, assert_in_order_per_key, row};

const BY_KEY: &str = "--ordered-by-key";

fn keyed(key: &str) -> Extra<'_> {
    Extra {
        ordering_key: Some(key),
        ..Extra::default()
    }
}

fn ids(messages: &[Message]) -> Vec<&str> {
    messages.iter().map(|m| m.message_id.as_str()).collect()
}

fn untouched(row: &Row) -> bool {
    !row.published && row.attempts == 0 && row.last_error.is_none()
}

#[test]
fn concurrent_keyed_drains_publish_every_event_once_and_in_order_per_key() {
    let mut fx = Fixture::isolated("by_key_concurrent");
    // 20 keys x 150 events, interleaved: event n of key k is `k<k>-<n>`,
    // inserted in the order k0-0, k1-0, ..., k19-0, k0-1, ...
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload, ordering_key) \
         SELECT 'k' || g % 20 || '-' || g / 20, 'order.created', '{}', 'k' || g % 20 \
         FROM generate_series(0, 2999) g",
    );
    let children: Vec<_> = (0..4)
        .map(|_| {
            let mut command = fx.command();
            command
                .args([BY_KEY, "--drain", "--batch-size", "8"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            command.spawn().unwrap()
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
    }
    assert!(
        fx.rows().iter().all(|row| row.published),
        "every row marked"
    );

    let messages = fx.messages();
    let unique: HashSet<&str> = ids(&messages).into_iter().collect();
    assert_eq!((messages.len(), unique.len()), (3000, 3000), "each once");
    assert_in_order_per_key(&messages);
}

/// Keys a and b, four events each; a-2 is unroutable (its routing_key
/// reaches no queue).
fn key_a_with_an_unroutable_second_event(fx: &mut Fixture) {
    fx.route_only("order.#");
    for n in 1..=4 {
        let unroutable = Extra {
            routing_key: Some("nowhere.created"),
            ..keyed("a")
        };
        let a = if n == 2 { unroutable } else { keyed("a") };
        fx.insert_extra(&format!("a-{n}"), a);
        fx.insert_extra(&format!("b-{n}"), keyed("b"));
    }
}

#[test]
fn a_failed_event_holds_back_its_key_and_only_its_key() {
    let mut fx = Fixture::isolated("by_key_failure");
    key_a_with_an_unroutable_second_event(&mut fx);

    let run = fx.run(&[BY_KEY, "--drain", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (5, 1));
    let messages = fx.messages();
    let mut b: Vec<&str> = ids(&messages);
    b.retain(|id| id.starts_with('b'));
    assert_eq!(b, ["b-1", "b-2", "b-3", "b-4"], "key b drained, in order");
    assert!(ids(&messages).contains(&"a-1"));
    let rows = fx.rows();
    assert_eq!(row(&rows, "a-2").attempts, 1);
    assert!(untouched(row(&rows, "a-3")) && untouched(row(&rows, "a-4")));

    // While a-2 backs off (for an hour, so that the check cannot race
    // its 1-2 s backoff), nothing of key a may overtake it.
    fx.execute(
        "UPDATE {table} SET available_at = now() + interval '1 hour' WHERE event_id = 'a-2'",
    );
    let run = fx.run(&[BY_KEY, "--drain", "--json"]);
    assert_eq!((run.code, run.field("claimed")), (0, 0), "{}", run.stderr);
    assert!(fx.messages().is_empty());
}

#[test]
fn a_dead_event_no_longer_holds_its_key_back() {
    let mut fx = Fixture::isolated("by_key_dead");
    key_a_with_an_unroutable_second_event(&mut fx);
    let run = fx.run(&[BY_KEY, "--drain"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    fx.messages();

    // One failed attempt is all --max-attempts 1 allows: a-2 is dead.
    let run = fx.run(&[BY_KEY, "--drain", "--max-attempts", "1", "--json"]);
    assert_eq!((run.code, run.field("published")), (0, 2), "{}", run.stderr);
    assert_eq!(ids(&fx.messages()), ["a-3", "a-4"]);
    let rows = fx.rows();
    let dead = row(&rows, "a-2");
    assert_eq!((dead.published, dead.attempts), (false, 1));
}

#[test]
fn events_without_a_key_go_out_while_a_key_is_held() {
    let mut fx = Fixture::isolated("by_key_null_keys");
    fx.insert_extra("a-1", keyed("a"));
    fx.insert_extra("a-2", keyed("a"));
    fx.insert("plain", 3);
    // Another run is publishing a-1 for the moment.
    let held = fx.hold_row("a-1");

    let run = fx.run(&[BY_KEY, "--json"]);
    assert_eq!((run.code, run.field("published")), (0, 3), "{}", run.stderr);
    assert_eq!(ids(&fx.messages()), ["plain-1", "plain-2", "plain-3"]);
    held.release();
}

#[test]
fn ordered_and_ordered_by_key_together_are_a_usage_error() {
    let fx = Fixture::isolated("by_key_conflict");
    let run = fx.run(&["--ordered", BY_KEY]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("exclude each other"), "{}", run.stderr);
    let run = fx.run_with(&[("OUTBOX_ORDERED", "true")], &[BY_KEY]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    let run = fx.run_with(
        &[("OUTBOX_ORDERED_BY_KEY", "yes"), ("OUTBOX_ORDERED", "1")],
        &[],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
}
