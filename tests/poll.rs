//! The default run: claim one batch, publish, mark, commit.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use crate::common::proxy::Proxy;
use crate::common::{Fixture, Run, amqp_addr, amqp_url_via};

#[test]
fn one_run_publishes_exactly_one_batch_in_id_order() {
    let mut fx = Fixture::new("one_batch");
    fx.insert("e", 250);
    let run = fx.run(&["--batch-size", "100", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        (
            run.field("claimed"),
            run.field("published"),
            run.field("failed")
        ),
        (100, 100, 0)
    );
    let rows = fx.rows();
    assert!(
        rows[..100].iter().all(|row| row.published),
        "the first 100 rows are marked"
    );
    assert!(
        rows[100..].iter().all(|row| !row.published),
        "no row past the batch is marked"
    );
    let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    let expected: Vec<String> = (1..=100).map(|n| format!("e-{n}")).collect();
    assert_eq!(ids, expected, "the broker got the batch once, in id order");
}

#[test]
fn message_carries_the_contract_properties_and_the_stored_bytes() {
    let mut fx = Fixture::new("properties");
    fx.insert_event(
        "evt-42",
        "invoice.paid",
        r#"{"b": 1, "a": [1, 2.50], "s": "ü"}"#,
    );
    let (stored, created_at): (String, i64) = {
        let row = fx
            .db
            .query_one(
                &format!(
                    "SELECT payload::text, floor(extract(epoch FROM created_at))::bigint FROM {}",
                    fx.quoted_table()
                ),
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    let run = fx.run(&[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let messages = fx.messages();
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    assert_eq!(
        message.body,
        stored.as_bytes(),
        "the body is the jsonb as PostgreSQL prints it"
    );
    assert_eq!(message.message_id, "evt-42");
    assert_eq!(message.kind.as_deref(), Some("invoice.paid"));
    assert_eq!(message.routing_key, "invoice.paid");
    assert_eq!(message.exchange, fx.exchange);
    assert_eq!(message.content_type.as_deref(), Some("application/json"));
    assert_eq!(message.delivery_mode, Some(2));
    assert_eq!(message.timestamp, Some(created_at as u64));
    assert_eq!(message.app_id.as_deref(), Some("outbox-poll"));
}

#[test]
fn empty_run_opens_no_broker_connection() {
    let mut fx = Fixture::new("empty_run");
    let broker = Proxy::start(amqp_addr());
    let via_proxy = [("AMQP_URL", amqp_url_via(broker.port()))];
    let env: Vec<(&str, &str)> = via_proxy.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let run = fx.run_with(&env, &["--json"]);
    assert_eq!((run.code, run.field("claimed")), (0, 0), "{}", run.stderr);
    assert_eq!(
        broker.connections(),
        0,
        "an empty run must not touch the broker"
    );

    // The same proxy does see a run that has something to publish.
    fx.insert("e", 1);
    let run = fx.run_with(&env, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(broker.connections(), 1);
}

#[test]
fn successful_run_prints_nothing() {
    let mut fx = Fixture::new("silent");
    fx.insert("e", 3);
    let run = fx.run(&[]);
    assert_eq!(run.code, 0);
    assert_eq!(
        (run.stdout.as_str(), run.stderr.as_str()),
        ("", ""),
        "cron mails any output"
    );
}

#[test]
fn rust_log_reaches_lapin_logs() {
    let mut fx = Fixture::new("rust_log");
    fx.insert("e", 1);
    let run = fx.run_with(&[("RUST_LOG", "lapin=debug")], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains(" lapin"),
        "no lapin record in: {}",
        run.stderr
    );
}

#[test]
fn drain_publishes_batch_after_batch_until_none_is_claimed() {
    let mut fx = Fixture::new("drain");
    fx.insert("e", 250);
    let run = fx.run(&["--drain", "--batch-size", "100", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        (
            run.field("claimed"),
            run.field("published"),
            run.field("batches")
        ),
        (250, 250, 3)
    );
    assert_eq!(fx.published_count(), 250);
    let ids: HashSet<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(ids.len(), 250);
}

/// Holds e-1 in another transaction, starts a drain of `batch`-sized
/// batches through a broker that stalls once the drain has claimed past
/// e-1, releases e-1 and lets the broker go on. Returns the drain's run.
fn drain_past_a_held_row(fx: &mut Fixture, batch: &str) -> Run {
    let held = fx.hold_row("e-1");
    let broker = Proxy::start(amqp_addr());
    broker.stall_upstream_after(5_000);
    let url = amqp_url_via(broker.port());
    let child = fx
        .command()
        .env("AMQP_URL", &url)
        .args(["--drain", "--batch-size", batch, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Events are on the wire: the drain has claimed, and skipped e-1.
    assert!(broker.wait_for_upstream(5_000, Duration::from_secs(10)));
    held.release();
    broker.resume();
    Run::from(child.wait_with_output().unwrap())
}

#[test]
fn a_drain_claims_a_row_it_passed_while_another_run_held_it_before_it_ends() {
    let mut fx = Fixture::new("drain_passed_row");
    fx.insert("e", 100);
    let run = drain_past_a_held_row(&mut fx, "10");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 100);
    assert_eq!(fx.published_count(), 100);
    assert_eq!(fx.arrivals().get("e-1"), Some(&1));
}

#[test]
fn a_drain_whose_claims_all_came_back_full_claims_from_the_head_before_it_ends() {
    let mut fx = Fixture::new("drain_last_head_claim");
    // e-1 is held; the other 40 make exactly four full batches of ten, so
    // no claim comes back partial, and only a claim from the head of the
    // table, the last before the drain ends, can find e-1 once released.
    fx.insert("e", 41);
    let run = drain_past_a_held_row(&mut fx, "10");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 41);
    assert_eq!(fx.arrivals().get("e-1"), Some(&1));
}

#[test]
fn a_row_a_drain_passed_does_not_wait_for_the_drain_to_end() {
    let mut fx = Fixture::new("drain_passed_row_soon");
    // 2,000 batches of one: seconds of draining after e-1 is released.
    fx.insert("e", 2_000);
    let run = drain_past_a_held_row(&mut fx, "1");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(fx.published_count(), 2_000);
    let later = format!(
        "SELECT count(*) FROM {table} WHERE published_at > \
         (SELECT published_at FROM {table} WHERE event_id = 'e-1')",
        table = fx.quoted_table()
    );
    let published_later: i64 = fx.db.query_one(&later, &[]).unwrap().get(0);
    assert!(
        published_later > 100,
        "only {published_later} events were published after e-1"
    );
}

#[test]
fn max_batches_stops_a_drain() {
    let mut fx = Fixture::new("max_batches");
    fx.insert("e", 50);
    let run = fx.run(&[
        "--drain",
        "--batch-size",
        "10",
        "--max-batches",
        "2",
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("batches"), run.field("published")), (2, 20));
    assert_eq!(fx.published_count(), 20);
}

#[test]
fn max_duration_lets_no_new_batch_start() {
    let mut fx = Fixture::new("max_duration");
    fx.insert("e", 50);
    // Already past after the first batch: that one finishes, no other starts.
    let run = fx.run(&[
        "--drain",
        "--batch-size",
        "10",
        "--max-duration",
        "1ms",
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("batches"), run.field("published")), (1, 10));
}

#[test]
fn environment_variables_configure_the_run() {
    let mut fx = Fixture::new("env_vars");
    fx.insert("e", 30);
    let run = fx.run_with(
        &[
            ("OUTBOX_BATCH_SIZE", "7"),
            ("OUTBOX_DRAIN", "true"),
            ("OUTBOX_MAX_BATCHES", "2"),
        ],
        &["--json"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("claimed"), run.field("batches")), (14, 2));
}

#[test]
fn flag_wins_over_its_environment_variable() {
    let mut fx = Fixture::new("flag_wins");
    fx.insert("e", 30);
    let run = fx.run_with(
        &[("OUTBOX_BATCH_SIZE", "7")],
        &["--batch-size", "3", "--json"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("claimed"), 3);
}

#[test]
fn pg_variables_stand_in_for_a_missing_database_url() {
    let mut fx = Fixture::new("pg_vars");
    fx.insert("e", 2);
    let config: postgres::Config = crate::common::database_url().parse().unwrap();
    let port = config.get_ports()[0].to_string();
    let mut command = fx.command();
    command
        .env_remove("DATABASE_URL")
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", &port)
        .env("PGUSER", config.get_user().unwrap())
        .env("PGDATABASE", config.get_dbname().unwrap());
    let output = command.arg("--json").output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(fx.published_count(), 2);
}

#[test]
fn declare_exchange_creates_a_missing_exchange() {
    let mut fx = Fixture::new("declare_exchange");
    let exchange = format!("{}_declared", fx.exchange);
    assert!(!fx.amqp.exchange_exists(&exchange));
    fx.insert("e", 1);
    let run = fx.run(&["--exchange", &exchange, "--declare-exchange", "fanout"]);
    // Declared, but nothing is bound to it yet, so the event comes back.
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(fx.amqp.exchange_exists(&exchange));
    fx.amqp.delete_exchange(&exchange);
}
