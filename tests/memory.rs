//! --batch-bytes: a batch holds about that many bytes of payloads, however
//! many events --batch-size allows, so that memory follows the budget and
//! not the size of the events.

use crate::common::Fixture;

/// `count` events of about `kilobytes` kB of payload each, e-1 .. e-N.
fn insert_large(fx: &mut Fixture, count: i64, kilobytes: i64) {
    fx.execute(&format!(
        "INSERT INTO {{table}} (event_id, event_type, payload) \
         SELECT 'e-' || g, 'order.created', jsonb_build_object('blob', repeat('x', {kilobytes} * 1000)) \
         FROM generate_series(1, {count}) g"
    ));
}

#[test]
fn a_batch_claims_no_more_events_once_their_payloads_reach_batch_bytes() {
    let mut fx = Fixture::new("batch_bytes");
    insert_large(&mut fx, 10, 10);
    // 0, 10 and 20 kB come before the first three: under 25 kB.
    let run = fx.run(&["--batch-bytes", "25kB", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("claimed"), run.field("published")), (3, 3));
    let published: Vec<bool> = fx.rows().iter().map(|row| row.published).collect();
    assert_eq!(published[..4], [true, true, true, false]);
    // The rows past the budget were freed with the batch's commit.
    let run = fx.run(&["--batch-bytes", "25kB", "--json"]);
    assert_eq!((run.code, run.field("claimed")), (0, 3), "{}", run.stderr);
}

#[test]
fn an_event_larger_than_batch_bytes_is_claimed_alone() {
    let mut fx = Fixture::new("batch_bytes_alone");
    insert_large(&mut fx, 3, 100);
    let run = fx.run(&["--batch-bytes", "10kB", "--json"]);
    assert_eq!((run.code, run.field("claimed")), (0, 1), "{}", run.stderr);
    let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(ids, ["e-1"]);
}

#[test]
fn a_drain_with_a_byte_budget_delivers_every_event_once() {
    let mut fx = Fixture::new("batch_bytes_drain");
    insert_large(&mut fx, 40, 10);
    let run = fx.run(&["--drain", "--batch-bytes", "25kB", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("batches")), (40, 14));
    let arrivals = fx.arrivals();
    assert_eq!(arrivals.len(), 40);
    assert!(arrivals.values().all(|count| *count == 1));
}
