//! The operators' commands against the real database: status, requeue,
//! prune and poll's --dry-run, with exact figures and exit codes.

use crate::common::{Fixture, row};
use serde_json::json;

/// Ten events in known states (ids e-1 .. e-10):
/// e-1, e-2 published; e-3 (attempts 10) and e-4 (12) dead;
/// e-5 retrying and backing off for an hour; e-6 retrying and due;
/// e-7 .. e-10 fresh and due, e-7 created an hour ago.
/// With the default --max-attempts 10: pending 6, due 5, retrying 2, dead 2.
fn known_states(fx: &mut Fixture) {
    fx.insert("e", 10);
    fx.execute(
        "UPDATE {table} SET published_at = now() WHERE event_id IN ('e-1', 'e-2');
         UPDATE {table} SET attempts = 10, last_error = 'nacked' WHERE event_id = 'e-3';
         UPDATE {table} SET attempts = 12, last_error = 'nacked' WHERE event_id = 'e-4';
         UPDATE {table} SET attempts = 2, last_error = 'returned',
                available_at = now() + interval '1 hour' WHERE event_id = 'e-5';
         UPDATE {table} SET attempts = 1, last_error = 'returned',
                available_at = now() - interval '1 second' WHERE event_id = 'e-6';
         UPDATE {table} SET created_at = now() - interval '1 hour' WHERE event_id = 'e-7';",
    );
}

/// The first five fields of `status --json` (see
/// `without_what_other_tests_move`).
fn status_json(fx: &Fixture, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["status", "--json"];
    all.extend_from_slice(args);
    let run = fx.run(&all);
    assert_eq!(run.code, 0, "{}", run.stderr);
    without_what_other_tests_move(run.summary())
}

/// After the first five fields come `expired` (no event of these
/// tests expires: 0, checked and taken out), `ordered_held_back_s`,
/// `dead_tuple_ratio`, `oldest_due_age_s`, `held_back_keys` and
/// `keys_held_back`, taken out here; `ordered_held_back_s` and
/// `dead_tuple_ratio`, as their values depend on
/// what the rest of the database does: every open transaction of it,
/// which other tests share (tests/commit_order.rs checks the first in a
/// database of its own), and when the server last counted the table's
/// rows (status_reports_the_dead_tuple_ratio checks the second).
fn without_what_other_tests_move(mut status: serde_json::Value) -> serde_json::Value {
    let object = status.as_object_mut().unwrap();
    let beyond: Vec<&str> = object.keys().skip(5).take(6).map(String::as_str).collect();
    assert_eq!(
        beyond,
        [
            "expired",
            "ordered_held_back_s",
            "dead_tuple_ratio",
            "oldest_due_age_s",
            "held_back_keys",
            "keys_held_back"
        ],
        "{object:?}"
    );
    assert_eq!(object.remove("expired"), Some(json!(0)));
    // Checked by the tests of --max-age and of held-back keys.
    object.remove("oldest_due_age_s");
    object.remove("held_back_keys");
    object.remove("keys_held_back");
    object.remove("ordered_held_back_s");
    let ratio = object.remove("dead_tuple_ratio");
    assert!(
        ratio.as_ref().is_some_and(|r| r.is_null() || r.is_f64()),
        "{ratio:?}"
    );
    status
}

/// The age moves on while the test runs: a second or two of slack.
fn assert_age(status: &mut serde_json::Value, expected: i64) {
    let age = status["oldest_pending_age_s"]
        .as_i64()
        .unwrap_or_else(|| panic!("no age in {status}"));
    assert!(
        (expected..expected + 3).contains(&age),
        "age {age}, expected {expected}"
    );
    status["oldest_pending_age_s"] = json!(expected);
}

#[test]
fn status_json_counts_each_state_exactly() {
    let mut fx = Fixture::new("status_json");
    known_states(&mut fx);
    let mut status = status_json(&fx, &[]);
    assert_age(&mut status, 3600);
    assert_eq!(
        status,
        json!({"pending": 6, "due": 5, "retrying": 2, "dead": 2, "oldest_pending_age_s": 3600})
    );
}

#[test]
fn status_json_of_an_empty_table_has_a_null_age() {
    let fx = Fixture::new("status_empty");
    let run = fx.run(&["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stdout,
        "{\"pending\":0,\"due\":0,\"retrying\":0,\"dead\":0,\"oldest_pending_age_s\":null,\
         \"expired\":0,\"ordered_held_back_s\":null,\"dead_tuple_ratio\":null,\"oldest_due_age_s\":null,\
         \"held_back_keys\":0,\"keys_held_back\":[]}\n"
    );
}

#[test]
fn status_reports_the_dead_tuple_ratio() {
    let mut fx = Fixture::new("status_dead_tuples");
    fx.insert("e", 1200);
    // 300 marks: 300 dead row versions beside 1,200 live ones.
    fx.execute(
        "UPDATE {table} SET published_at = now() WHERE id <= (SELECT min(id) + 299 FROM {table})",
    );
    fx.flush_stats();
    let run = fx.run(&["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.summary()["dead_tuple_ratio"], json!(0.2));
    let run = fx.run(&["status"]);
    assert!(
        run.stdout.ends_with("\ndead tuples     20.0%\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn status_shows_no_dead_tuple_figure_for_a_table_too_small_for_it_to_matter() {
    let mut fx = Fixture::new("status_dead_tuples_tiny");
    fx.insert("e", 6);
    // Two marks: two dead row versions beside six live ones, 25%.
    fx.execute("UPDATE {table} SET published_at = now() WHERE event_id IN ('e-1', 'e-2')");
    fx.flush_stats();
    let run = fx.run(&["status", "--json"]);
    assert_eq!(
        run.summary()["dead_tuple_ratio"],
        json!(0.25),
        "JSON keeps the figure"
    );
    let run = fx.run(&["status"]);
    assert!(
        run.stdout
            .ends_with("\ndead tuples     - (8 row versions: too few to matter, under 1000)\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn status_dead_follows_max_attempts() {
    let mut fx = Fixture::new("status_max_attempts");
    known_states(&mut fx);
    // With 2, e-5 (2 attempts) is dead too; e-6 (1 attempt) still retrying.
    let mut status = status_json(&fx, &["--max-attempts", "2"]);
    assert_age(&mut status, 3600);
    assert_eq!(
        status,
        json!({"pending": 5, "due": 5, "retrying": 1, "dead": 3, "oldest_pending_age_s": 3600})
    );
}

#[test]
fn status_needs_no_broker() {
    let mut fx = Fixture::new("status_no_broker");
    fx.insert("e", 3);
    let run = fx.run_with(
        &[("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f")],
        &["status", "--json"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.summary()["pending"], 3);
}

#[test]
fn status_text_is_an_aligned_table() {
    let mut fx = Fixture::new("status_text");
    known_states(&mut fx);
    let run = fx.run(&["status"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[..6],
        [
            format!("table           {}", fx.table).as_str(),
            "pending         6",
            "due             5",
            "retrying        2",
            "dead            2",
            "expired         0",
        ]
    );
    assert!(lines[6].starts_with("oldest pending  1h"), "{}", run.stdout);
    assert!(lines[7].starts_with("oldest due      1h"), "{}", run.stdout);
    assert!(lines[8].starts_with("held back       "), "{}", run.stdout);
    assert_eq!(lines[9], "held-back keys  0", "{}", run.stdout);
    assert!(lines[10].starts_with("dead tuples     "), "{}", run.stdout);
    assert_eq!(lines.len(), 11, "{}", run.stdout);
}

#[test]
fn status_by_type_counts_each_event_type() {
    let mut fx = Fixture::new("status_by_type");
    fx.insert_event("a-1", "invoice.paid", "{}");
    fx.insert_event("a-2", "invoice.paid", "{}");
    fx.insert_event("b-1", "order.created", "{}");
    fx.insert_event("b-2", "order.created", "{}");
    fx.execute(
        "UPDATE {table} SET attempts = 10 WHERE event_id = 'b-1';
         UPDATE {table} SET published_at = now() WHERE event_id = 'b-2';",
    );
    let mut status = status_json(&fx, &["--by-type"]);
    assert_age(&mut status, 0);
    assert_age(&mut status["by_type"]["invoice.paid"], 0);
    assert_eq!(
        status,
        json!({
            "pending": 2, "due": 2, "retrying": 0, "dead": 1, "oldest_pending_age_s": 0,
            "by_type": {
                "invoice.paid": {"pending": 2, "due": 2, "retrying": 0, "dead": 0,
                                 "oldest_pending_age_s": 0, "expired": 0},
                "order.created": {"pending": 0, "due": 0, "retrying": 0, "dead": 1,
                                  "oldest_pending_age_s": null, "expired": 0},
            }
        })
    );

    let run = fx.run(&["status", "--by-type"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let tail: Vec<&str> = run.stdout.lines().skip(12).collect();
    assert_eq!(
        tail,
        [
            "event type     pending  due  retrying  dead",
            "invoice.paid         2    2         0     0",
            "order.created        0    0         0     1",
        ],
        "{}",
        run.stdout
    );
}

#[test]
fn status_fail_if_dead_exits_1_only_when_an_event_is_dead() {
    let mut fx = Fixture::new("status_fail_dead");
    fx.insert("e", 2);
    let run = fx.run(&["status", "--fail-if-dead"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));

    fx.execute("UPDATE {table} SET attempts = 10 WHERE event_id = 'e-1'");
    let run = fx.run(&["status", "--json", "--fail-if-dead"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(
        run.summary()["dead"],
        1,
        "the figures are printed all the same"
    );
    assert_eq!(
        run.stderr,
        format!(
            "outbox-poll: 1 dead event (see `outbox-poll requeue --dead`) in table {}\n",
            fx.table
        )
    );
}

#[test]
fn status_fail_if_oldest_over_exits_1_past_the_threshold() {
    let mut fx = Fixture::new("status_fail_oldest");
    known_states(&mut fx); // oldest pending: one hour
    let run = fx.run(&["status", "--fail-if-oldest-over", "2h"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));

    let run = fx.run(&["status", "--fail-if-oldest-over", "30m"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .starts_with("outbox-poll: the oldest pending event is 1h"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("over the 30m allowed"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1);
}

#[test]
fn status_max_age_exits_1_when_the_oldest_due_event_is_older() {
    let mut fx = Fixture::new("status_max_age");
    known_states(&mut fx); // oldest due: e-7, one hour
    let run = fx.run(&["status", "--max-age", "2h"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    let run = fx.run(&["status", "--max-age", "30m"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .starts_with("outbox-poll: the oldest due event is 1h"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("over --max-age 30m"), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1);
    // An old event backing off is not due: not late yet.
    fx.execute(
        "UPDATE {table} SET available_at = now() + interval '1 hour' WHERE event_id = 'e-7'",
    );
    let run = fx.run(&["status", "--max-age", "30m", "--json"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert!(run.summary()["oldest_due_age_s"].as_i64().unwrap() < 1800);
}

#[test]
fn status_counts_the_keys_held_back_by_a_failed_head() {
    let mut fx = Fixture::new("status_held_keys");
    fx.insert("e", 6);
    // k1: a failed head and one behind it; k2: a dead head (it blocks
    // nothing); k3: nothing failed.
    fx.execute(
        "UPDATE {table} SET ordering_key = 'k1' WHERE event_id IN ('e-1', 'e-2');
         UPDATE {table} SET ordering_key = 'k2' WHERE event_id IN ('e-3', 'e-4');
         UPDATE {table} SET ordering_key = 'k3' WHERE event_id IN ('e-5', 'e-6');
         UPDATE {table} SET attempts = 1, last_error = 'returned',
                available_at = now() + interval '1 hour' WHERE event_id = 'e-1';
         UPDATE {table} SET attempts = 10, last_error = 'returned' WHERE event_id = 'e-3';
         UPDATE {table} SET attempts = 1, last_error = 'returned' WHERE event_id = 'e-6';",
    );
    let run = fx.run(&["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.summary()["held_back_keys"], json!(1));
    let run = fx.run(&["status"]);
    assert!(
        run.stdout.contains("\nheld-back keys  1\n"),
        "{}",
        run.stdout
    );
}

/// Key k1 with a failed head (e-1) and one event behind it, key k2 clear.
fn a_key_held_back(fx: &mut Fixture) {
    fx.insert("e", 3);
    fx.execute(
        "UPDATE {table} SET ordering_key = 'k1' WHERE event_id IN ('e-1', 'e-2');
         UPDATE {table} SET ordering_key = 'k2' WHERE event_id = 'e-3';
         UPDATE {table} SET attempts = 2, last_error = 'returned: NO_ROUTE',
                created_at = '2026-01-02T03:04:05Z',
                available_at = now() + interval '1 hour' WHERE event_id = 'e-1';",
    );
}

#[test]
fn status_lists_each_key_held_back_with_its_waiting_events_and_the_heads_error() {
    let mut fx = Fixture::new("status_held_list");
    a_key_held_back(&mut fx);
    let run = fx.run(&["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.summary()["keys_held_back"],
        json!([{"key": "k1", "waiting": 2, "since": "2026-01-02T03:04:05+00:00",
                "last_error": "returned: NO_ROUTE"}])
    );
    let run = fx.run(&["status"]);
    assert!(
        run.stdout.contains(
            "\nheld-back keys  1\n  key \"k1\": 2 events waiting since \
             2026-01-02T03:04:05+00:00, the head's last error: returned: NO_ROUTE\n"
        ),
        "{}",
        run.stdout
    );
}

#[test]
fn requeue_key_makes_the_failed_head_eligible_again() {
    let mut fx = Fixture::isolated("requeue_key");
    a_key_held_back(&mut fx);
    let run = fx.run(&["requeue", "--key", "k1", "k2", "--json"]);
    assert_eq!(run.code, 1, "k2 had no failed head: {}", run.stderr);
    assert_eq!(
        run.summary(),
        json!({"requeued": 1, "unknown": [], "already_published": [], "keys_not_held": ["k2"]})
    );
    assert_eq!(
        run.stderr,
        "outbox-poll: ordering key \"k2\" has no failed event at its head; left as it is\n"
    );
    assert_eq!(row(&fx.rows(), "e-1").attempts, 0);
    let run = fx.run(&["--ordered-by-key", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 2, "both heads went");
    let run = fx.run(&["status", "--json"]);
    assert_eq!(run.summary()["keys_held_back"], json!([]));
}

#[test]
fn status_on_a_missing_table_exits_78_naming_migrate() {
    let fx = Fixture::bare("status_missing");
    let run = fx.run(&["status"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(&fx.table) && run.stderr.contains("outbox-poll migrate"),
        "{}",
        run.stderr
    );
}

#[test]
fn requeue_dead_resets_only_dead_events() {
    let mut fx = Fixture::new("requeue_dead");
    known_states(&mut fx);
    let run = fx.run(&["requeue", "--dead"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "requeued 2 events\n"));
    let rows = fx.rows();
    for row in &rows[2..4] {
        assert_eq!(
            (row.attempts, row.last_error.as_deref()),
            (0, None),
            "{row:?}"
        );
        assert!(row.due_in_s <= 0.0, "{row:?} is due now");
    }
    assert_eq!(
        (rows[4].attempts, rows[4].last_error.as_deref()),
        (2, Some("returned")),
        "a retrying event is not dead and is left alone"
    );
    assert!(rows[..2].iter().all(|row| row.published));
    let mut status = status_json(&fx, &[]);
    assert_age(&mut status, 3600);
    assert_eq!(
        status,
        json!({"pending": 8, "due": 7, "retrying": 2, "dead": 0, "oldest_pending_age_s": 3600})
    );
}

#[test]
fn requeued_dead_events_are_published_by_the_next_run() {
    let mut fx = Fixture::new("requeue_then_poll");
    fx.insert("e", 3);
    fx.execute("UPDATE {table} SET attempts = 10 WHERE event_id IN ('e-1', 'e-2')");
    let run = fx.run(&["--json"]);
    assert_eq!(run.field("published"), 1, "dead events are not claimed");
    assert_eq!(fx.run(&["requeue", "--dead"]).code, 0);
    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("published")), (0, 2), "{}", run.stderr);
    let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(ids, ["e-3", "e-1", "e-2"]);
}

#[test]
fn requeue_event_ids_resets_the_named_events_and_reports_unknown_ones() {
    let mut fx = Fixture::new("requeue_ids");
    known_states(&mut fx);
    let run = fx.run(&[
        "requeue",
        "--event-id",
        "e-3",
        "e-5",
        "nope",
        "--event-id",
        "e-5",
    ]);
    assert_eq!(run.code, 1, "an unknown id exits 1: {}", run.stderr);
    assert_eq!(run.stdout, "requeued 2 events\n");
    assert_eq!(run.stderr, "outbox-poll: unknown event id: nope\n");
    let rows = fx.rows();
    for row in [&rows[2], &rows[4]] {
        assert_eq!((row.attempts, row.last_error.as_deref()), (0, None));
        assert!(row.due_in_s <= 0.0, "{row:?} is due now");
    }
    assert_eq!(rows[3].attempts, 12, "e-4 was not named");
}

#[test]
fn requeue_never_resends_a_published_event() {
    let mut fx = Fixture::new("requeue_published");
    known_states(&mut fx);
    let run = fx.run(&["requeue", "--json", "--event-id", "e-1", "e-6"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(
        run.summary(),
        json!({"requeued": 1, "unknown": [], "already_published": ["e-1"]})
    );
    assert_eq!(
        run.stderr,
        "outbox-poll: event id e-1 is already published; left as it is\n"
    );
    assert!(fx.rows()[0].published);
}

#[test]
fn requeue_needs_exactly_one_of_dead_and_event_id() {
    let fx = Fixture::new("requeue_usage");
    assert_eq!(fx.run(&["requeue"]).code, 2);
    assert_eq!(fx.run(&["requeue", "--dead", "--event-id", "x"]).code, 2);
}

/// Five events published 8 days ago, three a day ago, two pending, two
/// dead created 8 days ago and one dead created today: 13 rows.
fn aged_rows(fx: &mut Fixture) {
    fx.insert("e", 13);
    fx.execute(
        "UPDATE {table} SET published_at = now() - interval '8 days'
           WHERE event_id IN ('e-1', 'e-2', 'e-3', 'e-4', 'e-5');
         UPDATE {table} SET published_at = now() - interval '1 day'
           WHERE event_id IN ('e-6', 'e-7', 'e-8');
         UPDATE {table} SET attempts = 10, created_at = now() - interval '8 days'
           WHERE event_id IN ('e-11', 'e-12');
         UPDATE {table} SET attempts = 10 WHERE event_id = 'e-13';",
    );
}

fn event_ids(fx: &mut Fixture) -> Vec<String> {
    fx.rows().into_iter().map(|row| row.event_id).collect()
}

#[test]
fn prune_deletes_published_events_older_than_the_cutoff() {
    let mut fx = Fixture::new("prune");
    aged_rows(&mut fx);
    let run = fx.run(&["prune", "--older-than", "7d"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout, "deleted 5 published events older than 7d\n");
    assert_eq!(
        event_ids(&mut fx),
        ["e-6", "e-7", "e-8", "e-9", "e-10", "e-11", "e-12", "e-13"],
        "recent, pending and dead rows are kept"
    );
}

#[test]
fn prune_deletes_in_batches_of_batch_size() {
    let mut fx = Fixture::new("prune_batches");
    aged_rows(&mut fx);
    let run = fx.run(&["prune", "--older-than", "7d", "--batch-size", "2", "-v"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout, "deleted 5 published events older than 7d\n");
    let batches: Vec<&str> = run
        .stderr
        .lines()
        .filter_map(|line| line.split("pruned ").nth(1))
        .collect();
    assert_eq!(
        batches,
        [
            "2 published events (total 2)",
            "2 published events (total 4)",
            "1 published events (total 5)"
        ],
        "{}",
        run.stderr
    );
    assert_eq!(fx.rows().len(), 8);
}

#[test]
fn prune_dry_run_counts_and_deletes_nothing() {
    let mut fx = Fixture::new("prune_dry_run");
    aged_rows(&mut fx);
    let run = fx.run(&["prune", "--older-than", "7d", "--dry-run", "--include-dead"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stdout,
        "would delete 5 published events older than 7d\n\
         would delete 2 dead events older than 7d\n"
    );
    assert_eq!(fx.rows().len(), 13);
}

#[test]
fn prune_include_dead_deletes_old_dead_events_too() {
    let mut fx = Fixture::new("prune_dead");
    aged_rows(&mut fx);
    let run = fx.run(&["prune", "--older-than", "7d", "--include-dead"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stdout,
        "deleted 5 published events older than 7d\n\
         deleted 2 dead events older than 7d\n"
    );
    assert_eq!(
        event_ids(&mut fx),
        ["e-6", "e-7", "e-8", "e-9", "e-10", "e-13"]
    );
}

#[test]
fn prune_never_deletes_a_dead_event_requeued_while_it_runs() {
    let mut fx = Fixture::new("prune_requeue_race");
    aged_rows(&mut fx);
    // A requeue of e-11, not yet committed when prune starts.
    let mut other = crate::common::connect_db();
    let mut requeue = other.transaction().unwrap();
    let sql = format!(
        "UPDATE {} SET attempts = 0 WHERE event_id = 'e-11'",
        fx.quoted_table()
    );
    requeue.execute(&sql, &[]).unwrap();
    let mut command = fx.command();
    command
        .args(["prune", "--older-than", "7d", "--include-dead"])
        .stdout(std::process::Stdio::piped());
    let prune = command.spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    requeue.commit().unwrap();
    let output = prune.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    let ids = event_ids(&mut fx);
    assert!(
        ids.contains(&"e-11".to_string()),
        "the requeued event was deleted: {ids:?}"
    );
    assert!(
        !ids.contains(&"e-12".to_string()),
        "the other dead event stays deleted"
    );
}

#[test]
fn prune_include_dead_follows_max_attempts() {
    let mut fx = Fixture::new("prune_dead_max");
    aged_rows(&mut fx);
    // With 20 allowed, 10 attempts is not dead: pending, never deleted.
    let run = fx.run(&[
        "prune",
        "--older-than",
        "7d",
        "--include-dead",
        "--max-attempts",
        "20",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stdout,
        "deleted 5 published events older than 7d\n\
         deleted 0 dead events older than 7d\n"
    );
    assert_eq!(fx.rows().len(), 8);
}

#[test]
fn prune_json_reports_both_counts() {
    let mut fx = Fixture::new("prune_json");
    aged_rows(&mut fx);
    let run = fx.run(&["prune", "--older-than", "7d", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.summary(),
        json!({"published": 5, "dead": null, "dry_run": false, "partitions_dropped": []})
    );
    let run = fx.run(&[
        "prune",
        "--older-than",
        "7d",
        "--include-dead",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(
        (run.code, run.summary()),
        (
            0,
            json!({"published": 0, "dead": 2, "dry_run": true, "partitions_dropped": []})
        )
    );
    assert_eq!(run.stdout.lines().count(), 1);
}

#[test]
fn prune_needs_older_than() {
    let fx = Fixture::new("prune_usage");
    let run = fx.run(&["prune"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

#[test]
fn dry_run_prints_the_claimed_batch_and_changes_nothing() {
    let mut fx = Fixture::new("dry_run");
    fx.insert_event("a", "invoice.paid", r#"{"n": 1}"#);
    fx.insert_event("b", "order.created", r#"{"n": 2}"#);
    fx.insert_event("c", "order.created", r#"{"n": 3}"#);
    fx.execute("UPDATE {table} SET attempts = 1 WHERE event_id = 'b'");
    let run = fx.run(&["--dry-run", "--batch-size", "2"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let picked: Vec<_> = lines
        .iter()
        .map(|line| {
            (
                line["event_id"].clone(),
                line["event_type"].clone(),
                line["payload"].clone(),
                line["attempts"].clone(),
            )
        })
        .collect();
    assert_eq!(
        picked,
        [
            (json!("a"), json!("invoice.paid"), json!({"n": 1}), json!(0)),
            (
                json!("b"),
                json!("order.created"),
                json!({"n": 2}),
                json!(1)
            ),
        ]
    );
    assert!(fx.messages().is_empty(), "nothing was published");
    let rows = fx.rows();
    assert!(rows.iter().all(|row| !row.published));
    assert_eq!(
        rows.iter().map(|row| row.attempts).collect::<Vec<_>>(),
        [0, 1, 0]
    );
    // Rolled back: the rows are free, and a real run takes the same batch.
    let run = fx.run(&["--batch-size", "2", "--json"]);
    assert_eq!((run.code, run.field("published")), (0, 2), "{}", run.stderr);
}
