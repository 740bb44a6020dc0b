//! Adopting an existing table: `migrate --adopt` adds only what the relay
//! lacks, and `--column ROLE=NAME` has every command read the table's own
//! names. The Debezium recipe of the README, end to end.

use std::collections::BTreeMap;

use crate::common::{Fixture, assert_one_clear_line};

/// The README's recipe for a Debezium outbox.
const DEBEZIUM: &str = "event_id=id,event_type=type,routing_key=aggregatetype";
const EXAMPLE: &str = include_str!("../migrations/example_debezium_outbox.sql");

/// The fixture's table, created by migrations/example_debezium_outbox.sql
/// as it is shipped, in the fixture's schema.
fn debezium(test: &str) -> Fixture {
    with_debezium_table(Fixture::bare(test))
}

fn with_debezium_table(mut fx: Fixture) -> Fixture {
    let sql = format!(
        "SET search_path TO \"{}\"; {EXAMPLE}; RESET search_path",
        fx.schema
    );
    fx.db.batch_execute(&sql).expect("applying the example");
    fx
}

/// Inserts an event as a Debezium producer does; returns its uuid.
fn produce(fx: &mut Fixture, aggregate: &str, kind: &str, payload: &str) -> String {
    let sql = format!(
        "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload) \
         VALUES (gen_random_uuid(), $1, '42', $2, $3::text::jsonb) RETURNING id::text",
        fx.quoted_table()
    );
    fx.db
        .query_one(&sql, &[&aggregate, &kind, &payload])
        .unwrap()
        .get(0)
}

/// The table's columns and their types, in order.
fn columns(fx: &mut Fixture) -> Vec<(String, String)> {
    fx.db
        .query(
            "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped \
             ORDER BY attnum",
            &[&fx.quoted_table()],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

fn adopt(fx: &Fixture, mapping: &str) -> crate::common::Run {
    fx.run(&["--column", mapping, "migrate", "--adopt"])
}

#[test]
fn the_debezium_recipe_relays_each_uuid_routing_key_and_body_and_marks_the_rows() {
    let mut fx = debezium("adopt_debezium");
    let sent = [
        ("order", "OrderCreated", r#"{"id": 1}"#),
        ("customer", "CustomerMoved", r#"{"city": "Lyon"}"#),
        ("order", "OrderShipped", r#"{"id": 1, "by": "post"}"#),
    ];
    let ids: Vec<String> = sent
        .iter()
        .map(|(aggregate, kind, payload)| produce(&mut fx, aggregate, kind, payload))
        .collect();

    let adopted = adopt(&fx, DEBEZIUM);
    assert_eq!(adopted.code, 0, "{}", adopted.stderr);
    assert!(
        adopted.stdout.contains("outbox_seq") && adopted.stdout.contains("rewrote the table"),
        "{}",
        adopted.stdout
    );
    // A producer inserts exactly what it did before the adoption.
    let later = produce(&mut fx, "order", "OrderPaid", r#"{"id": 1, "paid": true}"#);

    let run = fx.run(&["--column", DEBEZIUM, "--drain", "--json"]);
    assert_eq!((run.code, run.field("published")), (0, 4), "{}", run.stderr);
    let messages = fx.messages();
    let expected: Vec<(&str, &str, &str)> = sent
        .iter()
        .copied()
        .chain([("order", "OrderPaid", r#"{"id": 1, "paid": true}"#)])
        .collect();
    let all_ids: Vec<&String> = ids.iter().chain([&later]).collect();
    assert_eq!(messages.len(), 4);
    for ((message, id), (aggregate, kind, payload)) in messages.iter().zip(all_ids).zip(expected) {
        assert_eq!(&message.message_id, id);
        assert_eq!(message.routing_key, aggregate);
        assert_eq!(message.kind.as_deref(), Some(kind));
        // jsonb as PostgreSQL prints it.
        let printed: String = fx
            .db
            .query_one("SELECT $1::text::jsonb::text", &[&payload])
            .unwrap()
            .get(0);
        assert_eq!(message.body, printed.as_bytes());
    }
    let unmarked: i64 = fx
        .db
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE published_at IS NULL",
                fx.quoted_table()
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(unmarked, 0);
}

#[test]
fn adopt_adds_only_what_is_missing_leaves_the_producers_columns_as_they_were_and_then_has_nothing_to_do()
 {
    let mut fx = debezium("adopt_only_missing");
    let id = produce(&mut fx, "order", "OrderCreated", r#"{"id": 7}"#);
    let before = columns(&mut fx);
    let data = |fx: &mut Fixture| -> Vec<String> {
        let sql = format!(
            "SELECT concat_ws('|', id, aggregatetype, aggregateid, type, payload) FROM {}",
            fx.quoted_table()
        );
        fx.db
            .query(&sql, &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    let rows_before = data(&mut fx);

    let first = adopt(&fx, DEBEZIUM);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let after = columns(&mut fx);
    assert_eq!(
        after[..before.len()],
        before[..],
        "the producers' columns changed"
    );
    let added: Vec<&str> = after[before.len()..]
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        added,
        [
            "outbox_seq",
            "created_at",
            "published_at",
            "attempts",
            "last_error",
            "available_at",
            "ordering_key",
            "producer_xid"
        ]
    );
    assert_eq!(data(&mut fx), rows_before);
    assert!(rows_before[0].starts_with(&id));
    assert!(
        first.stdout.contains("outbox_pending_idx"),
        "{}",
        first.stdout
    );

    let second = adopt(&fx, DEBEZIUM);
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(second.stdout.contains("nothing to do"), "{}", second.stdout);
    assert_eq!(columns(&mut fx), after);
}

#[test]
fn adopt_of_a_table_with_an_integer_primary_key_adds_no_identity_column() {
    let mut fx = Fixture::bare("adopt_integer_key");
    fx.execute(
        "CREATE TABLE {table} (seq bigserial PRIMARY KEY, uid text NOT NULL, \
         kind text NOT NULL, payload bytea, made_at timestamptz NOT NULL DEFAULT now())",
    );
    let mapping = "id=seq,event_id=uid,event_type=kind,created_at=made_at";
    let run = adopt(&fx, mapping);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stdout.contains("rewrote"), "{}", run.stdout);
    let names: Vec<String> = columns(&mut fx).into_iter().map(|(name, _)| name).collect();
    assert_eq!(
        names,
        [
            "seq",
            "uid",
            "kind",
            "payload",
            "made_at",
            "published_at",
            "attempts",
            "last_error",
            "available_at",
            "ordering_key",
            "producer_xid"
        ]
    );
    // Without the mapping of its key, adopt says which to give.
    let mut bare = Fixture::bare("adopt_integer_key_unmapped");
    bare.execute(
        "CREATE TABLE {table} (seq bigserial PRIMARY KEY, event_id text, event_type text, \
         payload jsonb)",
    );
    let refused = bare.run(&["migrate", "--adopt"]);
    assert_eq!(refused.code, 78, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("--column id=seq"),
        "{}",
        refused.stderr
    );
}

/// A migrated table whose columns have other names, and the mapping that
/// names them.
fn renamed(test: &str) -> (Fixture, &'static str) {
    let mut fx = Fixture::new(test);
    fx.execute(
        "ALTER TABLE {table} RENAME COLUMN id TO seq; \
         ALTER TABLE {table} RENAME COLUMN event_id TO uid; \
         ALTER TABLE {table} RENAME COLUMN event_type TO kind; \
         ALTER TABLE {table} RENAME COLUMN payload TO body; \
         ALTER TABLE {table} RENAME COLUMN created_at TO made_at; \
         ALTER TABLE {table} RENAME COLUMN published_at TO sent_at; \
         ALTER TABLE {table} RENAME COLUMN attempts TO tries; \
         ALTER TABLE {table} RENAME COLUMN last_error TO why; \
         ALTER TABLE {table} RENAME COLUMN available_at TO due_at",
    );
    let mapping = "id=seq,event_id=uid,event_type=kind,payload=body,created_at=made_at,\
                   published_at=sent_at,attempts=tries,last_error=why,available_at=due_at";
    (fx, mapping)
}

fn insert_renamed(fx: &mut Fixture, uid: &str) {
    let sql = format!(
        "INSERT INTO {} (uid, kind, body) VALUES ($1, 'order.created', '{{\"n\": 1}}')",
        fx.quoted_table()
    );
    fx.db.execute(&sql, &[&uid]).unwrap();
}

#[test]
fn dry_run_and_poll_read_a_renamed_table_through_the_mapping() {
    let (mut fx, mapping) = renamed("adopt_renamed_poll");
    insert_renamed(&mut fx, "e-1");
    let dry = fx.run_with(&[("OUTBOX_COLUMNS", mapping)], &["--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert!(dry.stdout.contains("\"e-1\""), "{}", dry.stdout);
    assert!(fx.messages().is_empty());

    let run = fx.run(&["--column", mapping]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let messages = fx.messages();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].message_id, "e-1");
    assert_eq!(messages[0].routing_key, "order.created");
    assert_eq!(messages[0].body, br#"{"n": 1}"#);
}

#[test]
fn status_requeue_prune_and_wait_read_a_renamed_table_through_the_mapping() {
    let (mut fx, mapping) = renamed("adopt_renamed_commands");
    for uid in ["old", "dead", "due"] {
        insert_renamed(&mut fx, uid);
    }
    fx.execute(
        "UPDATE {table} SET sent_at = now() - interval '2 days' WHERE uid = 'old'; \
         UPDATE {table} SET tries = 10, why = 'boom' WHERE uid = 'dead'",
    );
    let with = |fx: &Fixture, args: &[&str]| {
        let mut all = vec!["--column", mapping];
        all.extend_from_slice(args);
        fx.run(&all)
    };

    let status = with(&fx, &["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let figures: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(
        (figures["pending"].as_i64(), figures["dead"].as_i64()),
        (Some(1), Some(1))
    );

    let prune = with(&fx, &["prune", "--older-than", "1d"]);
    assert_eq!(prune.code, 0, "{}", prune.stderr);
    let requeue = with(&fx, &["requeue", "--event-id", "dead"]);
    assert_eq!(requeue.code, 0, "{}", requeue.stderr);
    let requeue_all = with(&fx, &["requeue", "--dead"]);
    assert_eq!(requeue_all.code, 0, "{}", requeue_all.stderr);
    let left: Vec<(String, i32)> = fx
        .db
        .query(
            &format!("SELECT uid, tries FROM {} ORDER BY seq", fx.quoted_table()),
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(left, [("dead".to_string(), 0), ("due".to_string(), 0)]);

    // Nothing published yet: the wait times out; after a drain it is done.
    let waiting = with(&fx, &["wait", "--timeout", "1s"]);
    assert_eq!(waiting.code, 1, "{}", waiting.stderr);
    assert_eq!(with(&fx, &["--drain"]).code, 0);
    let done = with(&fx, &["wait", "--timeout", "5s"]);
    assert_eq!(done.code, 0, "{}", done.stderr);
}

#[test]
fn a_mapped_column_that_does_not_exist_is_78_naming_it_and_its_role() {
    let (fx, mapping) = renamed("adopt_missing_column");
    let wrong = mapping.replace("event_type=kind", "event_type=knd");
    for args in [
        vec!["status"],
        vec!["--dry-run"],
        vec!["prune", "--older-than", "1d"],
    ] {
        let mut all = vec!["--column", wrong.as_str()];
        all.extend(args.iter().copied());
        let run = fx.run(&all);
        assert_eq!(run.code, 78, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr
                .contains("the column knd, which plays event_type, does not exist"),
            "{args:?}: {}",
            run.stderr
        );
        assert_one_clear_line(&run);
    }
}

#[test]
fn a_mapped_column_of_a_type_that_cannot_play_its_role_is_78_naming_column_type_and_role() {
    let (fx, mapping) = renamed("adopt_wrong_type");
    // tries is an integer: it cannot be a timestamp.
    let wrong = mapping.replace("created_at=made_at", "created_at=tries");
    let run = fx.run(&["--column", &wrong, "status"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("the column tries is of type integer, which cannot play created_at"),
        "{}",
        run.stderr
    );
    let text = mapping.replace("event_type=kind", "event_type=tries");
    let run = fx.run(&["--column", &text, "--dry-run"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert!(
        run.stderr.contains("cannot play event_type"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_bad_column_value_is_2_naming_the_pair_at_fault() {
    let fx = Fixture::bare("adopt_bad_value");
    for (value, named) in [
        ("event_id", "\"event_id\" is not ROLE=NAME"),
        ("evnt_id=id", "unknown role \"evnt_id\""),
        ("event_id=a,event_id=b", "the role event_id is mapped twice"),
    ] {
        for command in [&["status"][..], &["migrate", "--adopt"][..], &[][..]] {
            let mut all = vec!["--column", value];
            all.extend_from_slice(command);
            let run = fx.run(&all);
            assert_eq!(run.code, 2, "{value} {command:?}: {}", run.stderr);
            assert!(run.stderr.contains(named), "{value}: {}", run.stderr);
        }
    }
}

#[test]
fn plain_migrate_refuses_a_table_it_did_not_create_and_names_adopt() {
    let fx = debezium("adopt_plain_refused");
    let run = fx.run(&["migrate"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert!(
        run.stderr.contains("was not created by outbox-poll")
            && run.stderr.contains("migrate --adopt"),
        "{}",
        run.stderr
    );
    assert_one_clear_line(&run);
}

#[test]
fn requeue_finds_an_event_by_its_uuid_event_id() {
    let mut fx = debezium("adopt_requeue_uuid");
    let id = produce(&mut fx, "order", "OrderCreated", "{}");
    assert_eq!(adopt(&fx, DEBEZIUM).code, 0);
    fx.execute("UPDATE {table} SET attempts = 10, last_error = 'boom'");

    let run = fx.run(&["--column", DEBEZIUM, "requeue", "--event-id", &id]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let attempts: i32 = fx
        .db
        .query_one(&format!("SELECT attempts FROM {}", fx.quoted_table()), &[])
        .unwrap()
        .get(0);
    assert_eq!(attempts, 0);
}

#[test]
fn the_ordered_modes_serve_an_adopted_table_in_insert_order() {
    let mut fx = with_debezium_table(Fixture::bare_isolated("adopt_ordered"));
    let mapping = format!("{DEBEZIUM},ordering_key=aggregateid");
    let adopted = adopt(&fx, &mapping);
    assert_eq!(adopted.code, 0, "{}", adopted.stderr);
    // aggregateid plays ordering_key: adopt adds no column of that name.
    assert!(
        !columns(&mut fx)
            .iter()
            .any(|(name, _)| name == "ordering_key")
    );
    let mut ids: Vec<String> = (0..4)
        .map(|n| produce(&mut fx, "order", &format!("E{n}"), "{}"))
        .collect();

    let by_key = fx.run(&[
        "--column",
        &mapping,
        "--ordered-by-key",
        "--drain",
        "--json",
    ]);
    assert_eq!(
        (by_key.code, by_key.field("published")),
        (0, 4),
        "{}",
        by_key.stderr
    );
    ids.extend((4..6).map(|n| produce(&mut fx, "order", &format!("E{n}"), "{}")));
    let strict = fx.run(&["--column", &mapping, "--ordered", "--drain", "--json"]);
    assert_eq!(
        (strict.code, strict.field("published")),
        (0, 2),
        "{}",
        strict.stderr
    );

    let arrived: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(arrived, ids);
}

#[test]
fn check_passes_on_an_adopted_table_reading_its_grants_under_the_tables_own_column_names() {
    let mut fx = debezium("adopt_check");
    produce(&mut fx, "order", "OrderCreated", r#"{"id": 1}"#);
    assert_eq!(adopt(&fx, DEBEZIUM).code, 0);
    let run = fx.run(&["--column", DEBEZIUM, "check"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("grants"), "{}", run.stdout);
    assert!(fx.messages().is_empty());
}
