//! `--on-publish mark|delete` (OUTBOX_ON_PUBLISH): with delete, the events
//! the broker confirmed are deleted in the batch's transaction; failed and
//! dead events stay, as with mark.

use crate::common::Fixture;

/// Three deliverable events (e-1 .. e-3), one no queue is bound for
/// (x-1, type other.thing) and one dead (e-4, attempts 10).
fn mixed_events(fx: &mut Fixture) {
    fx.route_only("order.#");
    fx.insert("e", 4);
    fx.insert_event("x-1", "other.thing", "{}");
    fx.execute("UPDATE {table} SET attempts = 10 WHERE event_id = 'e-4'");
}

fn event_ids(fx: &mut Fixture) -> Vec<String> {
    fx.rows().into_iter().map(|row| row.event_id).collect()
}

#[test]
fn delete_mode_deletes_exactly_the_confirmed_events() {
    let mut fx = Fixture::new("on_publish_delete");
    mixed_events(&mut fx);
    let run = fx.run(&["--on-publish", "delete", "--json"]);
    assert_eq!(run.code, 1, "x-1 was returned: {}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (3, 1));
    assert_eq!(event_ids(&mut fx), ["e-4", "x-1"]);
    let rows = fx.rows();
    let returned = crate::common::row(&rows, "x-1");
    assert_eq!((returned.published, returned.attempts), (false, 1));
    assert!(returned.last_error.is_some());
    let dead = crate::common::row(&rows, "e-4");
    assert_eq!((dead.published, dead.attempts), (false, 10));
    let mut arrived: Vec<String> = fx.arrivals().into_keys().collect();
    arrived.sort();
    assert_eq!(arrived, ["e-1", "e-2", "e-3"]);
}

#[test]
fn mark_mode_keeps_the_confirmed_events_marked() {
    let mut fx = Fixture::new("on_publish_mark");
    mixed_events(&mut fx);
    let run = fx.run(&["--on-publish", "mark", "--json"]);
    assert_eq!((run.code, run.field("published")), (1, 3), "{}", run.stderr);
    assert_eq!(event_ids(&mut fx), ["e-1", "e-2", "e-3", "e-4", "x-1"]);
    assert_eq!(fx.published_count(), 3);
}

#[test]
fn the_variable_selects_delete_and_the_flag_wins_over_it() {
    let mut fx = Fixture::new("on_publish_env");
    fx.insert("e", 2);
    let env = [("OUTBOX_ON_PUBLISH", "delete")];
    let run = fx.run_with(&env, &["--batch-size", "1"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(event_ids(&mut fx), ["e-2"], "e-1 was deleted");
    let run = fx.run_with(&env, &["--on-publish", "mark"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(event_ids(&mut fx), ["e-2"], "e-2 was marked, not deleted");
    assert_eq!(fx.published_count(), 1);
}

#[test]
fn a_drain_in_delete_mode_leaves_an_empty_table() {
    let mut fx = Fixture::new("on_publish_drain");
    fx.insert("e", 250);
    let args = [
        "--on-publish",
        "delete",
        "--drain",
        "--batch-size",
        "20",
        "--json",
    ];
    let run = fx.run(&args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("batches")), (250, 13));
    assert!(fx.rows().is_empty());
    let arrivals = fx.arrivals();
    assert_eq!(arrivals.len(), 250);
    assert!(arrivals.values().all(|&count| count == 1), "{arrivals:?}");
}

#[test]
fn an_unknown_on_publish_value_is_a_usage_error() {
    let mut fx = Fixture::new("on_publish_usage");
    fx.insert("e", 1);
    let run = fx.run(&["--on-publish", "remove"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("possible values: mark, delete"),
        "{}",
        run.stderr
    );
    assert_eq!(fx.published_count(), 0);
}
