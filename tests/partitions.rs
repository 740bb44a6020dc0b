//! A time-partitioned outbox, as migrations/example_partitioned_outbox.sql
//! creates it: the relay, status and requeue work on it unchanged, the
//! marks find their rows in whichever partition, and prune drops whole
//! partitions whose events were all published before the cut-off.

use std::time::Duration;

use crate::common::{Fixture, Run, row, wait_until};
use serde_json::json;

/// Inserts an event created at `created` (an SQL timestamptz expression).
fn insert_created(fx: &mut Fixture, event_id: &str, event_type: &str, created: &str) {
    fx.execute(&format!(
        "INSERT INTO {{table}} (event_id, event_type, payload, created_at) \
         VALUES ('{event_id}', '{event_type}', '{{}}', {created})"
    ));
}

/// Midnight UTC `days` days from today, where the example's partitions
/// start, plus `offset` (an SQL interval).
fn day(days: i32, offset: &str) -> String {
    format!(
        "(((now() AT TIME ZONE 'UTC')::date + {days})::timestamp \
         + interval '{offset}') AT TIME ZONE 'UTC'"
    )
}

/// Adds the example's daily partitions from `first` days from today on.
fn add_days(fx: &mut Fixture, first: i32, days: i32) {
    let sql = format!(
        "SELECT \"{}\".outbox_add_partitions('{}', (now() AT TIME ZONE 'UTC')::date + {first}, {days})",
        fx.schema,
        fx.quoted_table()
    );
    fx.db.batch_execute(&sql).unwrap();
}

/// The names of the table's partitions, in order.
fn partitions(fx: &mut Fixture) -> Vec<String> {
    let sql = format!(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = '{}'::regclass ORDER BY 1",
        fx.quoted_table()
    );
    let rows = fx.db.query(&sql, &[]).unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

/// The name of the partition of the day `days` from today (UTC).
fn partition_of(fx: &mut Fixture, days: i32) -> String {
    let sql = format!("SELECT to_char((now() AT TIME ZONE 'UTC')::date + {days}, 'YYYYMMDD')");
    let date: String = fx.db.query_one(&sql, &[]).unwrap().get(0);
    format!("outbox_p{date}")
}

fn event_ids(fx: &mut Fixture) -> Vec<String> {
    let mut ids: Vec<String> = fx.rows().into_iter().map(|row| row.event_id).collect();
    ids.sort();
    ids
}

/// Old days, each partition in a state prune must judge (the cut-off is
/// 7 days ago, some time of day 7 days back):
/// - day -11: a-1 .. a-3, all published long ago: dropped whole;
/// - day -10: b-1 published long ago, b-2 pending: kept, b-1 deleted;
/// - day -9: c-1 published long ago, c-2 dead: kept, c-1 deleted;
/// - day -8: d-1 published a day ago: kept, d-1 kept;
/// - day -7: e-1 published at midnight, before the cut-off, but the day
///   ends after it: kept, e-1 deleted;
/// - today: f-1 pending.
pub fn aged_partitions(fx: &mut Fixture) {
    add_days(fx, -11, 9);
    for (event_id, days) in [
        ("a-1", -11),
        ("a-2", -11),
        ("a-3", -11),
        ("b-1", -10),
        ("b-2", -10),
        ("c-1", -9),
        ("c-2", -9),
        ("d-1", -8),
    ] {
        insert_created(fx, event_id, "order.created", &day(days, "1 hour"));
    }
    insert_created(fx, "e-1", "order.created", &day(-7, "0 hours"));
    insert_created(fx, "f-1", "order.created", "now()");
    fx.execute(
        "UPDATE {table} SET published_at = created_at + interval '1 minute'
           WHERE event_id IN ('a-1', 'a-2', 'a-3', 'b-1', 'c-1');
         UPDATE {table} SET published_at = created_at WHERE event_id = 'e-1';
         UPDATE {table} SET published_at = now() - interval '1 day' WHERE event_id = 'd-1';
         UPDATE {table} SET attempts = 10 WHERE event_id = 'c-2';",
    );
}

#[test]
fn a_batch_spanning_two_partitions_is_marked_in_both() {
    let mut fx = Fixture::partitioned("parts_two_days");
    insert_created(&mut fx, "y-1", "order.created", &day(-1, "1 hour"));
    insert_created(&mut fx, "y-2", "order.created", &day(-1, "23 hours"));
    insert_created(&mut fx, "t-1", "order.created", "now()");
    insert_created(&mut fx, "t-2", "order.created", "now()");
    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("published")), (0, 4), "{}", run.stderr);
    assert_eq!(fx.published_count(), 4);
    assert_eq!(fx.arrivals().len(), 4);
}

#[test]
fn a_drain_publishes_every_event_of_a_partitioned_table() {
    let mut fx = Fixture::partitioned("parts_drain");
    for n in 0..60 {
        insert_created(
            &mut fx,
            &format!("y-{n}"),
            "order.created",
            &day(-1, "1 hour"),
        );
    }
    fx.insert("t", 240);
    let run = fx.run(&["--drain", "--batch-size", "25", "--json"]);
    assert_eq!(
        (run.code, run.field("published")),
        (0, 300),
        "{}",
        run.stderr
    );
    assert_eq!(fx.published_count(), 300);
    let arrivals = fx.arrivals();
    assert_eq!(arrivals.len(), 300);
    assert!(arrivals.values().all(|&count| count == 1));
}

#[test]
fn deletes_and_failed_attempts_reach_their_rows_in_every_partition() {
    let mut fx = Fixture::partitioned("parts_delete");
    fx.route_only("order.#");
    insert_created(&mut fx, "y-1", "order.created", &day(-1, "1 hour"));
    insert_created(&mut fx, "y-2", "other.thing", &day(-1, "2 hours"));
    insert_created(&mut fx, "t-1", "order.created", "now()");
    let run = fx.run(&["--on-publish", "delete", "--json"]);
    assert_eq!(run.code, 1, "y-2 was returned: {}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (2, 1));
    let rows = fx.rows();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((row(&rows, "y-2").attempts, rows[0].published), (1, false));
}

#[test]
fn status_and_requeue_work_on_a_partitioned_table() {
    let mut fx = Fixture::partitioned("parts_status");
    insert_created(&mut fx, "y-1", "order.created", &day(-1, "1 hour"));
    insert_created(&mut fx, "t-1", "order.created", "now()");
    fx.execute("UPDATE {table} SET attempts = 10 WHERE event_id = 'y-1'");
    let run = fx.run(&["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let status = run.summary();
    assert_eq!(
        (&status["pending"], &status["dead"]),
        (&json!(1), &json!(1))
    );
    let run = fx.run(&["requeue", "--dead"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "requeued 1 event\n"));
    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("published")), (0, 2), "{}", run.stderr);
    assert_eq!(fx.published_count(), 2);
}

#[test]
fn status_sums_the_dead_tuple_ratio_over_the_partitions() {
    let mut fx = Fixture::partitioned("parts_dead_tuples");
    for n in 0..3 {
        insert_created(
            &mut fx,
            &format!("y-{n}"),
            "order.created",
            &day(-1, "1 hour"),
        );
        insert_created(&mut fx, &format!("t-{n}"), "order.created", "now()");
    }
    // One mark in each partition: 2 dead versions beside 6 live ones.
    fx.execute("UPDATE {table} SET published_at = now() WHERE event_id IN ('y-0', 't-0')");
    fx.flush_stats();
    let run = fx.run(&["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.summary()["dead_tuple_ratio"], json!(0.25));
}

#[test]
fn prune_drops_a_partition_only_when_every_event_in_it_was_published_before_the_cutoff() {
    let mut fx = Fixture::partitioned("parts_prune");
    aged_partitions(&mut fx);
    let oldest = partition_of(&mut fx, -11);
    let run = fx.run(&["prune", "--older-than", "7d", "--json"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(
        run.stdout,
        format!(
            "{{\"published\":6,\"dead\":null,\"dry_run\":false,\
             \"partitions_dropped\":[\"{}.{oldest}\"]}}\n",
            fx.schema
        )
    );
    let left = partitions(&mut fx);
    assert!(!left.contains(&oldest), "{left:?}");
    for days in [-10, -9, -8, -7] {
        let kept = partition_of(&mut fx, days);
        assert!(left.contains(&kept), "{kept} was dropped: {left:?}");
    }
    assert_eq!(event_ids(&mut fx), ["b-2", "c-2", "d-1", "f-1"]);
}

#[test]
fn prune_dry_run_names_the_partitions_it_would_drop_and_changes_nothing() {
    let mut fx = Fixture::partitioned("parts_prune_dry");
    aged_partitions(&mut fx);
    let before = partitions(&mut fx);
    let oldest = partition_of(&mut fx, -11);
    let run = fx.run(&["prune", "--older-than", "7d", "--dry-run"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stdout,
        format!(
            "would delete 6 published events older than 7d\n\
             would drop 1 partition whole: {}.{oldest}\n",
            fx.schema
        )
    );
    assert_eq!(partitions(&mut fx), before);
    assert_eq!(fx.rows().len(), 10);
}

/// Whether a session other than the harness's has sent a DETACH
/// PARTITION on `fx`'s table (prune's, waiting or retrying).
fn prune_detaching(fx: &mut Fixture) -> bool {
    let sql = format!(
        "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
           AND query LIKE '%ALTER TABLE %{}% DETACH PARTITION %')",
        fx.schema
    );
    fx.db.query_one(&sql, &[]).unwrap().get(0)
}

/// A producer's INSERTs while prune waits: none may queue behind prune for
/// long. The bound is a lock_timeout (time spent waiting for a lock, not a
/// measure of speed): the defect made producers wait a second at a time.
fn produce_while_prune_waits(fx: &mut Fixture) {
    let mut producer = fx.connect();
    producer
        .batch_execute("SET lock_timeout = '500ms'")
        .unwrap();
    for n in 0..10 {
        let sql = format!(
            "INSERT INTO {} (event_id, event_type, payload) VALUES ('p-{n}', 'order.created', '{{}}')",
            fx.quoted_table()
        );
        producer
            .batch_execute(&sql)
            .unwrap_or_else(|error| panic!("a producer waited behind prune: {error:?}"));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Prune beside a drain's open batch (a transaction holding a row lock on
/// the table): producers go on, and once the batch ends the old partition
/// is dropped within the same prune.
fn prune_beside_a_drain_drops_without_stalling_producers(fx: &mut Fixture) {
    aged_partitions(fx);
    let oldest = partition_of(fx, -11);
    let batch = fx.hold_row("f-1");
    let prune = fx
        .command()
        .args(["prune", "--older-than", "7d", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let detaching = wait_until(Duration::from_secs(30), || prune_detaching(fx));
    produce_while_prune_waits(fx);
    batch.release();
    let run = Run::from(prune.wait_with_output().unwrap());
    assert!(detaching, "prune never detached: {}", run.stderr);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.summary(),
        json!({"published": 6, "dead": null, "dry_run": false,
               "partitions_dropped": [format!("{}.{oldest}", fx.schema)]})
    );
    assert!(!partitions(fx).contains(&oldest));
    assert_eq!(
        fx.rows().len(),
        4 + 10,
        "the producers' events are all there"
    );
}

#[test]
fn prune_detaches_concurrently_beside_a_drain_producers_go_on_and_the_partition_goes() {
    let mut fx = Fixture::partitioned("parts_prune_drain");
    prune_beside_a_drain_drops_without_stalling_producers(&mut fx);
}

#[test]
fn prune_beside_a_default_partition_locks_briefly_and_retries_until_the_drain_lets_go() {
    let mut fx = Fixture::partitioned("parts_prune_default");
    // A DEFAULT partition rules out DETACH ... CONCURRENTLY.
    fx.execute(&format!(
        "CREATE TABLE \"{}\".outbox_default PARTITION OF {{table}} DEFAULT",
        fx.schema
    ));
    prune_beside_a_drain_drops_without_stalling_producers(&mut fx);
}

#[test]
fn prune_finishes_a_detach_an_interrupted_run_left_pending_and_drops_the_partition() {
    let mut fx = Fixture::partitioned("parts_prune_pending");
    aged_partitions(&mut fx);
    let oldest = partition_of(&mut fx, -11);
    // A detach interrupted while it waited for an open batch stays pending.
    let batch = fx.hold_row("f-1");
    let mut interrupted = fx.connect();
    interrupted
        .batch_execute("SET statement_timeout = '1s'")
        .unwrap();
    let sql = format!(
        "ALTER TABLE {} DETACH PARTITION \"{}\".{oldest} CONCURRENTLY",
        fx.quoted_table(),
        fx.schema
    );
    assert!(interrupted.batch_execute(&sql).is_err());
    // The interrupted run's session ends (its session lock goes with it).
    drop(interrupted);
    batch.release();
    let pending = format!(
        "SELECT count(*) FROM pg_inherits WHERE inhdetachpending AND inhparent = '{}'::regclass",
        fx.quoted_table()
    );
    assert_eq!(fx.db.query_one(&pending, &[]).unwrap().get::<_, i64>(0), 1);
    let run = fx.run(&["prune", "--older-than", "7d", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.summary(),
        json!({"published": 6, "dead": null, "dry_run": false,
               "partitions_dropped": [format!("{}.{oldest}", fx.schema)]})
    );
    assert_eq!(fx.db.query_one(&pending, &[]).unwrap().get::<_, i64>(0), 0);
    let exists = format!(
        "SELECT to_regclass('\"{}\".{oldest}') IS NOT NULL",
        fx.schema
    );
    assert!(!fx.db.query_one(&exists, &[]).unwrap().get::<_, bool>(0));
    assert_eq!(event_ids(&mut fx), ["b-2", "c-2", "d-1", "f-1"]);
}

#[test]
fn migrate_sets_the_autovacuum_settings_on_each_partition() {
    let mut fx = Fixture::partitioned("parts_autovacuum");
    let sql = format!(
        "SELECT count(*), count(*) FILTER (WHERE c.reloptions @> \
           '{{autovacuum_vacuum_scale_factor=0.01,autovacuum_vacuum_threshold=1000}}') \
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = '{}'::regclass",
        fx.quoted_table()
    );
    let row = fx.db.query_one(&sql, &[]).unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (16, 16));
    // A day added later takes them from the others.
    add_days(&mut fx, 15, 1);
    let row = fx.db.query_one(&sql, &[]).unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (17, 17));
}
