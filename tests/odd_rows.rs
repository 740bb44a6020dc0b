//! One odd row never stops the table: a created_at AMQP's timestamp cannot
//! hold is published without the timestamp, and a row that cannot become
//! a message at all fails alone. The run, --ordered, --dry-run, status
//! and the metrics backlog all go on.

use crate::common::{Fixture, row};

/// An ordinary event, then created_at 'infinity', '-infinity' and one in
/// 1960 (before AMQP's unsigned timestamp begins), then another ordinary
/// one.
fn odd_timestamps(fx: &mut Fixture) {
    fx.insert_event("first", "ok.created", r#"{"n": 1}"#);
    for (event_id, created_at) in [
        ("infinity", "infinity"),
        ("minus-infinity", "-infinity"),
        ("1960", "1960-01-01 00:00:00+00"),
    ] {
        fx.insert_event(event_id, "ok.created", "{}");
        fx.execute(&format!(
            "UPDATE {{table}} SET created_at = '{created_at}' WHERE event_id = '{event_id}'"
        ));
    }
    fx.insert_event("last", "ok.created", r#"{"n": 2}"#);
}

/// Every event published, in id order, the odd ones without a timestamp.
fn assert_published_without_timestamps(fx: &mut Fixture) {
    assert!(
        fx.rows()
            .iter()
            .all(|row| row.published && row.attempts == 0)
    );
    let sent: Vec<(String, bool)> = fx
        .messages()
        .into_iter()
        .map(|message| (message.message_id, message.timestamp.is_some()))
        .collect();
    let expected = [
        ("first", true),
        ("infinity", false),
        ("minus-infinity", false),
        ("1960", false),
        ("last", true),
    ]
    .map(|(id, stamped)| (id.to_string(), stamped));
    assert_eq!(sent, expected);
}

#[test]
fn infinite_or_pre_1970_created_at_is_published_without_a_timestamp() {
    let mut fx = Fixture::new("odd_created_at");
    odd_timestamps(&mut fx);
    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("published")), (0, 5), "{}", run.stderr);
    assert_published_without_timestamps(&mut fx);
}

#[test]
fn an_ordered_run_publishes_them_too() {
    // In a database of its own: the ordered modes wait for every writing
    // transaction of their database, and other tests hold some.
    let mut fx = Fixture::isolated("odd_created_at_ordered");
    odd_timestamps(&mut fx);
    let run = fx.run(&["--ordered", "--json"]);
    assert_eq!((run.code, run.field("published")), (0, 5), "{}", run.stderr);
    assert_published_without_timestamps(&mut fx);
}

#[test]
fn a_dry_run_prints_them_with_their_created_at() {
    let mut fx = Fixture::new("odd_created_at_dry_run");
    odd_timestamps(&mut fx);
    let run = fx.run(&["--dry-run"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let printed: Vec<(String, serde_json::Value)> = run
        .stdout
        .lines()
        .map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            (
                line["event_id"].as_str().unwrap().into(),
                line["created_at"].clone(),
            )
        })
        .collect();
    assert_eq!(printed.len(), 5, "{}", run.stdout);
    assert_eq!(
        printed[1..4],
        [
            ("infinity".into(), serde_json::json!("infinity")),
            ("minus-infinity".into(), serde_json::json!("-infinity")),
            ("1960".into(), serde_json::json!("1960-01-01T00:00:00Z")),
        ]
    );
    assert!(fx.messages().is_empty());
}

#[test]
fn status_ages_the_backlog_by_its_finite_created_at_only() {
    let mut fx = Fixture::new("odd_created_at_status");
    odd_timestamps(&mut fx);
    fx.execute("UPDATE {table} SET created_at = now() - interval '1 hour' WHERE event_id = 'last'");
    let run = fx.run(&["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let status = run.summary();
    assert_eq!(status["pending"], 5);
    // 1960 is the oldest finite created_at: its age is what status shows.
    let age = status["oldest_pending_age_s"].as_i64().unwrap();
    let since_1960 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        + 315_619_200;
    assert!((age - since_1960).abs() < 60, "{age} against {since_1960}");

    // With only infinite created_at left pending, there is no age to show.
    fx.execute(
        "UPDATE {table} SET published_at = now() WHERE event_id IN ('first', '1960', 'last')",
    );
    let run = fx.run(&["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let status = run.summary();
    assert_eq!(
        (
            status["pending"].clone(),
            status["oldest_pending_age_s"].clone()
        ),
        (2.into(), serde_json::Value::Null)
    );
}

#[test]
fn the_metrics_file_keeps_its_backlog_gauges() {
    let mut fx = Fixture::new("odd_created_at_metrics");
    odd_timestamps(&mut fx);
    let path = std::env::temp_dir().join(format!("outbox-poll-{}-odd.prom", std::process::id()));
    let run = fx.run(&[
        "--batch-size",
        "1",
        "--metrics-file",
        path.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(text.contains("outbox_poll_pending{"), "{text}");
    assert!(
        text.contains("outbox_poll_oldest_pending_age_seconds{"),
        "{text}"
    );
}

/// A table without the NOT NULL constraints of docs/src/table.md on event_type and
/// payload, holding one row with each NULL among ordinary ones.
fn null_columns(fx: &mut Fixture) {
    fx.execute(
        "ALTER TABLE {table} ALTER COLUMN payload DROP NOT NULL, \
         ALTER COLUMN event_type DROP NOT NULL",
    );
    fx.insert_event("ok-1", "ok.created", "{}");
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload) VALUES ('no-payload', 'ok.created', NULL)",
    );
    fx.insert_event("ok-2", "ok.created", "{}");
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload) VALUES ('no-type', NULL, '{}')",
    );
    fx.insert_event("ok-3", "ok.created", "{}");
}

#[test]
fn a_row_with_a_null_column_fails_alone() {
    let mut fx = Fixture::new("null_columns");
    null_columns(&mut fx);
    let run = fx.run(&["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (3, 2));
    let rows = fx.rows();
    for (event_id, column) in [("no-payload", "payload"), ("no-type", "event_type")] {
        let odd = row(&rows, event_id);
        assert_eq!((odd.published, odd.attempts), (false, 1), "{event_id}");
        let error = odd.last_error.as_deref().unwrap_or_default();
        assert!(error.starts_with(&format!("{column} is NULL")), "{error}");
    }
    let sent: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(sent, ["ok-1", "ok-2", "ok-3"]);
}

#[test]
fn a_dry_run_shows_a_row_with_a_null_column_and_why() {
    let mut fx = Fixture::new("null_columns_dry_run");
    null_columns(&mut fx);
    let run = fx.run(&["--dry-run"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 5, "{}", run.stdout);
    assert!(
        lines[1]["unreadable"]
            .as_str()
            .unwrap()
            .starts_with("payload is NULL"),
        "{}",
        lines[1]
    );
    assert_eq!(lines[2]["event_id"], "ok-2");
}

#[test]
fn a_dry_run_prints_a_payload_no_float_can_hold_as_stored() {
    let mut fx = Fixture::new("huge_number_dry_run");
    fx.insert_event("huge", "ok.created", r#"{"n": 1e400}"#);
    let run = fx.run(&["--dry-run"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let payload = run.stdout.split("\"payload\":").nth(1).unwrap_or_default();
    assert!(payload.starts_with("{\"n\": 1000"), "{}", run.stdout);
}

#[test]
fn status_reports_odd_rows_held_back_from_the_ordered_modes() {
    // In a database of its own, so that only this writer holds rows back.
    let mut fx = Fixture::isolated("odd_created_at_held_back");
    let mut writer = fx.connect();
    writer
        .batch_execute("BEGIN; SELECT pg_current_xact_id()")
        .unwrap();
    // Inserted after the writer took its xid: held back until it ends.
    odd_timestamps(&mut fx);
    let run = fx.run(&["status", "--json"]);
    writer.batch_execute("ROLLBACK").unwrap();
    assert_eq!(run.code, 0, "{}", run.stderr);
    let held = run.summary()["ordered_held_back_s"].as_i64();
    assert!(held.is_some_and(|age| age >= 0), "{}", run.stdout);
}
