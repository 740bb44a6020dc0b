//! Commit order: the ordered modes never publish an event while an event
//! that sorts before it could still appear. A producer whose transaction
//! inserted event 1 and is still open holds back events 2 to 5 that other
//! producers committed meanwhile, until it commits; then the queue gets
//! 1, 2, 3, 4, 5.

use postgres::Client;

use crate::common::{Extra, Fixture};

/// A producer's transaction that inserted an event and has not committed.
struct OpenProducer(Client);

impl OpenProducer {
    fn insert(fx: &Fixture, event_id: &str, key: Option<&str>) -> OpenProducer {
        let mut client = fx.connect();
        client.batch_execute("BEGIN").unwrap();
        let sql = format!(
            "INSERT INTO {} (event_id, event_type, payload, ordering_key) \
             VALUES ($1, 'order.created', '{{}}', $2)",
            fx.quoted_table()
        );
        client.execute(&sql, &[&event_id, &key]).unwrap();
        OpenProducer(client)
    }

    fn pid(&mut self) -> i32 {
        self.0
            .query_one("SELECT pg_backend_pid()", &[])
            .unwrap()
            .get(0)
    }

    fn commit(mut self) {
        self.0.batch_execute("COMMIT").unwrap();
    }
}

fn ids(fx: &Fixture) -> Vec<String> {
    fx.messages().into_iter().map(|m| m.message_id).collect()
}

/// e-1 inserted and left open, then e-2 to e-5 committed one by one.
fn late_first_event(fx: &mut Fixture, key: Option<&str>) -> OpenProducer {
    let producer = OpenProducer::insert(fx, "e-1", key);
    for n in 2..=5 {
        let extra = Extra {
            ordering_key: key,
            ..Extra::default()
        };
        fx.insert_extra(&format!("e-{n}"), extra);
    }
    producer
}

/// Drains in `mode` while e-1's producer is open, then after it commits.
fn drain_around_a_late_commit(test: &str, mode: &str, key: Option<&str>) {
    let mut fx = Fixture::isolated(test);
    let producer = late_first_event(&mut fx, key);

    let run = fx.run(&[mode, "--drain", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 0, "nothing may overtake e-1");
    assert!(ids(&fx).is_empty());

    producer.commit();
    let run = fx.run(&[mode, "--drain", "--json"]);
    assert_eq!((run.code, run.field("published")), (0, 5), "{}", run.stderr);
    assert_eq!(ids(&fx), ["e-1", "e-2", "e-3", "e-4", "e-5"]);
}

#[test]
fn an_ordered_drain_waits_for_an_earlier_event_still_being_committed() {
    drain_around_a_late_commit("commit_order_ordered", "--ordered", None);
}

#[test]
fn an_ordered_by_key_drain_waits_for_an_earlier_event_of_the_key_still_being_committed() {
    drain_around_a_late_commit("commit_order_by_key", "--ordered-by-key", Some("order-1"));
}

#[test]
fn status_shows_how_long_an_open_transaction_holds_the_ordered_modes_back() {
    let mut fx = Fixture::isolated("commit_order_status");
    let mut producer = late_first_event(&mut fx, None);
    let pid = producer.pid();

    let status = fx.run(&["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let held = &status.summary()["ordered_held_back_s"];
    assert!(held.as_i64().is_some_and(|s| s >= 0), "{}", status.stdout);
    let text = fx.run(&["status"]);
    let line = text
        .stdout
        .lines()
        .find(|l| l.starts_with("held back"))
        .unwrap();
    assert!(line.ends_with(&format!("pid {pid})")), "{line}");

    producer.commit();
    let status = fx.run(&["status", "--json"]);
    assert_eq!(
        status.summary()["ordered_held_back_s"],
        serde_json::Value::Null
    );
}
