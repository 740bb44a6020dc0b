//! The optional columns of migration 0006: exchange (per row), the
//! properties content_type, content_encoding, correlation_id and
//! priority, and expires_at (never published after it, AMQP expiration
//! before it).

use crate::common::scratch::Scratch;
use crate::common::{Fixture, row};

/// Inserts an event of type `order.created` with `columns` (names) set to
/// `values` (SQL literals).
fn insert_with(fx: &mut Fixture, event_id: &str, columns: &str, values: &str) {
    let (columns, values) = match columns.is_empty() {
        true => (String::new(), String::new()),
        false => (format!(", {columns}"), format!(", {values}")),
    };
    fx.execute(&format!(
        "INSERT INTO {{table}} (event_id, event_type, payload{columns}) \
         VALUES ('{event_id}', 'order.created', '{{}}'{values})"
    ));
}

#[test]
fn migrate_adds_the_message_columns_nullable() {
    let mut fx = Fixture::new("message_columns_migrate");
    let rows = fx
        .db
        .query(
            "SELECT column_name::text, data_type::text, is_nullable::text \
             FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'outbox' \
               AND column_name IN ('exchange', 'content_type', 'content_encoding', \
                                   'correlation_id', 'priority', 'expires_at') \
             ORDER BY column_name",
            &[&fx.schema],
        )
        .unwrap();
    let columns: Vec<(String, String, String)> = rows
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    let expected = [
        ("content_encoding", "text"),
        ("content_type", "text"),
        ("correlation_id", "text"),
        ("exchange", "text"),
        ("expires_at", "timestamp with time zone"),
        ("priority", "smallint"),
    ];
    let expected: Vec<(String, String, String)> = expected
        .iter()
        .map(|(name, kind)| (name.to_string(), kind.to_string(), "YES".to_string()))
        .collect();
    assert_eq!(columns, expected);
    // Again: nothing to add, nothing changes.
    assert_eq!(fx.run(&["migrate"]).code, 0);
}

#[test]
fn content_type_encoding_correlation_id_and_priority_arrive_as_the_row_sets_them() {
    let mut fx = Fixture::new("message_columns_properties");
    insert_with(
        &mut fx,
        "set",
        "content_type, content_encoding, correlation_id, priority",
        "'application/x-protobuf', 'gzip', 'req-42', 7",
    );
    insert_with(&mut fx, "unset", "", "");

    let run = fx.run(&[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let messages = fx.messages();
    let set = &messages[0];
    assert_eq!(set.content_type.as_deref(), Some("application/x-protobuf"));
    assert_eq!(set.content_encoding.as_deref(), Some("gzip"));
    assert_eq!(set.correlation_id.as_deref(), Some("req-42"));
    assert_eq!(set.priority, Some(7));
    let unset = &messages[1];
    assert_eq!(unset.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        (
            &unset.content_encoding,
            &unset.correlation_id,
            unset.priority,
            &unset.expiration
        ),
        (&None, &None, None, &None)
    );
}

#[test]
fn a_priority_outside_0_to_255_fails_only_its_event() {
    let mut fx = Fixture::new("message_columns_priority");
    insert_with(&mut fx, "ok-1", "priority", "255");
    insert_with(&mut fx, "bad-2", "priority", "256");
    insert_with(&mut fx, "bad-3", "priority", "-1");
    insert_with(&mut fx, "ok-4", "priority", "0");

    let run = fx.run(&["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (2, 2));
    let rows = fx.rows();
    for bad in ["bad-2", "bad-3"] {
        let bad = row(&rows, bad);
        assert_eq!((bad.published, bad.attempts), (false, 1));
        let error = bad.last_error.as_deref().unwrap_or_default();
        assert!(error.contains("outside AMQP's 0 to 255"), "{error}");
    }
    let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(ids, ["ok-1", "ok-4"]);
}

#[test]
fn a_rows_exchange_takes_its_event_there_and_the_others_go_to_the_runs() {
    // --ordered waits for every open transaction of its database.
    let mut fx = Fixture::isolated("message_columns_exchange");
    let eu = fx.another_exchange("eu");
    insert_with(&mut fx, "eu-1", "exchange", &format!("'{eu}'"));
    insert_with(&mut fx, "plain-2", "", "");
    insert_with(&mut fx, "eu-3", "exchange", &format!("'{eu}'"));

    for mode in [None, Some("--ordered")] {
        let run = fx.run(mode.as_slice());
        assert_eq!(run.code, 0, "{mode:?}: {}", run.stderr);
        let there: Vec<String> = fx
            .amqp
            .take_all(&eu)
            .into_iter()
            .map(|m| m.message_id)
            .collect();
        assert_eq!(there, ["eu-1", "eu-3"], "{mode:?}");
        let here = fx.messages();
        assert_eq!(here.len(), 1, "{mode:?}");
        assert_eq!(here[0].message_id, "plain-2");
        fx.execute("UPDATE {table} SET published_at = NULL");
    }
}

#[test]
fn a_rows_missing_exchange_fails_only_its_events_naming_it_and_the_run_goes_on() {
    let mut fx = Fixture::new("message_columns_missing_exchange");
    let missing = format!("{}.missing", fx.exchange);
    let eu = fx.another_exchange("eu");
    insert_with(&mut fx, "ok-1", "", "");
    insert_with(&mut fx, "gone-2", "exchange", &format!("'{missing}'"));
    insert_with(&mut fx, "eu-3", "exchange", &format!("'{eu}'"));
    insert_with(&mut fx, "gone-4", "exchange", &format!("'{missing}'"));
    insert_with(&mut fx, "ok-5", "", "");

    let run = fx.run(&["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (3, 2));
    let rows = fx.rows();
    for gone in ["gone-2", "gone-4"] {
        let gone = row(&rows, gone);
        assert_eq!((gone.published, gone.attempts), (false, 1), "{gone:?}");
        assert!(gone.due_in_s > 0.0, "{gone:?} backs off");
        let error = gone.last_error.as_deref().unwrap_or_default();
        assert!(
            error.contains(&format!("exchange {missing:?}")) && error.contains("does not exist"),
            "{error}"
        );
    }
    let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(ids, ["ok-1", "ok-5"]);
    assert_eq!(fx.amqp.take_all(&eu).len(), 1);
}

#[test]
fn a_rows_missing_exchange_in_ordered_mode_fails_its_event_not_the_run() {
    let mut fx = Fixture::isolated("message_columns_missing_ordered");
    let missing = format!("{}.missing", fx.exchange);
    insert_with(&mut fx, "gone-1", "exchange", &format!("'{missing}'"));
    insert_with(&mut fx, "ok-2", "", "");

    let run = fx.run(&["--ordered", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let rows = fx.rows();
    let gone = row(&rows, "gone-1");
    assert_eq!((gone.published, gone.attempts), (false, 1));
    assert!(
        gone.last_error
            .as_deref()
            .unwrap_or_default()
            .contains(&missing)
    );
    // --ordered stops a batch at its first failure: ok-2 waits.
    assert!(!row(&rows, "ok-2").published);
}

#[test]
fn an_expired_event_is_marked_expired_unpublished_without_an_attempt_and_exits_0() {
    let mut fx = Fixture::new("message_columns_expired");
    insert_with(
        &mut fx,
        "late-1",
        "expires_at",
        "now() - interval '1 second'",
    );
    insert_with(&mut fx, "ok-2", "", "");
    let dir = Scratch::new("message_columns_expired");
    let metrics = dir.path().join("outbox.prom");

    let run = fx.run(&["--json", "--metrics-file", metrics.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        (
            run.field("claimed"),
            run.field("published"),
            run.field("failed")
        ),
        (2, 1, 0)
    );
    assert_eq!(run.field("expired"), 1);
    let rows = fx.rows();
    let late = row(&rows, "late-1");
    assert_eq!(
        (late.published, late.attempts, late.last_error.as_deref()),
        (false, 0, Some("expired"))
    );
    let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(ids, ["ok-2"]);
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert!(text.contains("outbox_poll_last_run_expired{"), "{text}");
    assert!(
        text.lines()
            .any(|line| line.starts_with("outbox_poll_expired{") && line.ends_with(" 1")),
        "{text}"
    );

    // Never claimed again.
    let again = fx.run(&["--json"]);
    assert_eq!(
        (again.code, again.field("claimed")),
        (0, 0),
        "{}",
        again.stderr
    );
}

#[test]
fn status_counts_expired_events_apart_from_pending_due_retrying_and_dead() {
    let mut fx = Fixture::new("message_columns_status");
    insert_with(&mut fx, "past-1", "expires_at", "now() - interval '1 hour'");
    insert_with(
        &mut fx,
        "past-dead-2",
        "expires_at, attempts",
        "now() - interval '1 hour', 10",
    );
    insert_with(
        &mut fx,
        "past-retrying-3",
        "expires_at, attempts",
        "now() - interval '1 hour', 2",
    );
    insert_with(
        &mut fx,
        "future-4",
        "expires_at",
        "now() + interval '1 hour'",
    );
    insert_with(&mut fx, "never-5", "", "");

    let status = fx.run(&["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let summary = status.summary();
    let figures: Vec<i64> = ["pending", "due", "retrying", "dead", "expired"]
        .iter()
        .map(|name| summary[name].as_i64().unwrap())
        .collect();
    assert_eq!(figures, [2, 2, 0, 0, 3], "{summary}");
    let keys: Vec<&String> = summary.as_object().unwrap().keys().take(6).collect();
    assert_eq!(keys[5], "expired", "after the contract's five");
    let text = fx.run(&["status"]);
    assert!(
        text.stdout.contains("expired         3\n"),
        "{}",
        text.stdout
    );
}

#[test]
fn an_event_published_before_it_expires_carries_the_milliseconds_left() {
    let mut fx = Fixture::new("message_columns_expiration");
    insert_with(&mut fx, "soon-1", "expires_at", "now() + interval '1 hour'");
    insert_with(&mut fx, "never-2", "expires_at", "'infinity'");

    let run = fx.run(&[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let messages = fx.messages();
    let left: u64 = messages[0].expiration.as_deref().unwrap().parse().unwrap();
    assert!((3_500_000..=3_600_000).contains(&left), "{left}");
    assert_eq!(messages[1].expiration, None);
}

#[test]
fn expired_events_do_not_hold_back_the_ordered_modes() {
    let mut fx = Fixture::isolated("message_columns_expired_ordered");
    for mode in ["--ordered", "--ordered-by-key"] {
        // Backing off and expired since: it will never be published.
        insert_with(
            &mut fx,
            &format!("late-{mode}"),
            "ordering_key, expires_at, available_at, attempts",
            "'k', now() - interval '1 second', now() + interval '1 hour', 1",
        );
        insert_with(&mut fx, &format!("next-{mode}"), "ordering_key", "'k'");

        let run = fx.run(&[mode, "--drain"]);
        assert_eq!(run.code, 0, "{mode}: {}", run.stderr);
        let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
        assert_eq!(ids, [format!("next-{mode}")], "{mode}");
    }
    // Expired and due: claimed, marked, and the events after it go too.
    insert_with(
        &mut fx,
        "due-late",
        "expires_at",
        "now() - interval '1 second'",
    );
    insert_with(&mut fx, "after", "", "");
    let run = fx.run(&["--ordered", "--drain"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let rows = fx.rows();
    assert_eq!(
        row(&rows, "due-late").last_error.as_deref(),
        Some("expired")
    );
    let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(ids, ["after"]);
}

#[test]
fn a_batch_of_expired_events_alone_never_connects_to_the_broker() {
    let mut fx = Fixture::new("message_columns_expired_only");
    insert_with(
        &mut fx,
        "late-1",
        "expires_at",
        "now() - interval '1 second'",
    );
    // Nothing listens there: a connection attempt would fail with 69.
    let closed = crate::common::scratch::free_port();
    let url = format!("amqp://guest:guest@127.0.0.1:{closed}/%2f");

    let run = fx.run_with(&[("AMQP_URL", &url)], &["--json"]);
    assert_eq!((run.code, run.field("expired")), (0, 1), "{}", run.stderr);
    assert_eq!(
        row(&fx.rows(), "late-1").last_error.as_deref(),
        Some("expired")
    );
}
