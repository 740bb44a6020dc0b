//! `outbox-poll migrate`: creates the table, is idempotent, and upgrades a
//! table of the reference article's shape in place.

use std::process::Stdio;

use crate::common::Fixture;

fn columns(fx: &mut Fixture) -> Vec<(String, String, bool)> {
    fx.db
        .query(
            "SELECT column_name::text, data_type::text, is_nullable = 'YES' FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = 'outbox' ORDER BY ordinal_position",
            &[&fx.schema],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

fn table_oid(fx: &mut Fixture) -> u32 {
    let sql = format!("SELECT '{}'::regclass::oid", fx.quoted_table());
    fx.db.query_one(&sql, &[]).unwrap().get(0)
}

fn column(name: &str, kind: &str, nullable: bool) -> (String, String, bool) {
    (name.into(), kind.into(), nullable)
}

fn contract_columns() -> Vec<(String, String, bool)> {
    vec![
        column("id", "bigint", false),
        column("event_id", "text", false),
        column("event_type", "text", false),
        column("payload", "jsonb", false),
        column("created_at", "timestamp with time zone", false),
        column("published_at", "timestamp with time zone", true),
        column("attempts", "integer", false),
        column("last_error", "text", true),
        column("available_at", "timestamp with time zone", false),
        column("producer_xid", "xid8", false),
        column("headers", "jsonb", true),
        column("routing_key", "text", true),
        column("ordering_key", "text", true),
        column("exchange", "text", true),
        column("content_type", "text", true),
        column("content_encoding", "text", true),
        column("correlation_id", "text", true),
        column("priority", "smallint", true),
        column("expires_at", "timestamp with time zone", true),
    ]
}

#[test]
fn migrate_creates_the_contract_table_in_an_empty_schema() {
    let mut fx = Fixture::bare("migrate_empty");
    let run = fx.run(&["migrate"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(run.stdout, format!("created the table {}\n", fx.table));
    assert_eq!(columns(&mut fx), contract_columns());
}

#[test]
fn migrate_twice_changes_nothing_the_second_time() {
    let mut fx = Fixture::new("migrate_twice");
    fx.insert("e", 3);
    let run = fx.run(&["migrate"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(
        run.stdout,
        format!("the table {} is up to date: nothing to do\n", fx.table)
    );
    assert_eq!(columns(&mut fx), contract_columns());
    assert_eq!(fx.rows().len(), 3);
}

#[test]
fn migrate_and_poll_work_for_any_name_the_parser_accepts() {
    let mut fx = Fixture::bare("migrate_odd_name");
    let table = format!(r#"{}."it's $$ odd""#, fx.schema);
    let run = fx.run(&["migrate", "--table", &table]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    let insert = format!(
        r#"INSERT INTO "{}"."it's $$ odd" (event_id, event_type, payload) VALUES ('a', 't', '{{}}')"#,
        fx.schema
    );
    fx.db.execute(&insert, &[]).unwrap();
    let run = fx.run(&["--table", &table, "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 1);
}

#[test]
fn migrate_gives_a_long_tables_indexes_distinct_names() {
    let mut fx = Fixture::bare("migrate_long_name");
    let table = format!("{}.{}", fx.schema, "t".repeat(60));
    let run = fx.run(&["migrate", "--table", &table]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    let sql = format!(
        "SELECT count(*) FROM pg_index WHERE indrelid = '\"{}\".{}'::regclass",
        fx.schema,
        "t".repeat(60)
    );
    let indexes: i64 = fx.db.query_one(&sql, &[]).unwrap().get(0);
    // The primary key, event_id's unique index, and migrate's four.
    assert_eq!(indexes, 6);
}

#[test]
fn event_id_is_unique() {
    let mut fx = Fixture::new("migrate_unique");
    fx.insert_event("same", "t", "{}");
    let sql = format!(
        "INSERT INTO {} (event_id, event_type, payload) VALUES ('same', 't', '{{}}')",
        fx.quoted_table()
    );
    assert!(fx.db.execute(&sql, &[]).is_err());
}

/// The reference article's table, of seven columns.
const REFERENCE_TABLE: &str = "CREATE TABLE {table} (id bigserial PRIMARY KEY, \
     event_id text NOT NULL UNIQUE, event_type text NOT NULL, payload jsonb NOT NULL, \
     created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, \
     attempts integer NOT NULL DEFAULT 0);";

#[test]
fn migrate_upgrades_a_reference_table_in_place_keeping_its_rows() {
    let mut fx = Fixture::bare("migrate_upgrade");
    fx.execute(REFERENCE_TABLE);
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload, published_at, attempts) VALUES \
           ('old-1', 'a', '{\"k\": 1}', now(), 0), ('old-2', 'a', '{\"k\": 2}', NULL, 3);",
    );
    let oid_before = table_oid(&mut fx);

    let run = fx.run(&["migrate"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    // Says what it added: every column the reference table lacked.
    let added = format!(
        "upgraded the table {}: added the columns last_error, available_at, producer_xid, \
         headers, routing_key, ordering_key, exchange, content_type, content_encoding, \
         correlation_id, priority, expires_at; the indexes ",
        fx.table
    );
    assert!(run.stdout.starts_with(&added), "{}", run.stdout);

    assert_eq!(columns(&mut fx), contract_columns());
    let oid_after = table_oid(&mut fx);
    assert_eq!(
        oid_before, oid_after,
        "the table is upgraded, never recreated"
    );
    let rows = fx.rows();
    assert_eq!(rows.len(), 2);
    assert!(rows[0].published && rows[0].attempts == 0);
    assert!(
        !rows[1].published && rows[1].attempts == 3,
        "existing values are kept"
    );

    // And the upgraded table relays its pending event.
    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("published")), (0, 1), "{}", run.stderr);
}

#[test]
fn migrate_adds_producer_xid_without_rewriting_the_table_and_old_rows_sort_first() {
    let mut fx = Fixture::bare("migrate_producer_xid");
    fx.execute(REFERENCE_TABLE);
    fx.insert_event("old", "a", "{}");
    let filenode = |fx: &mut Fixture| -> u32 {
        let sql = format!("SELECT pg_relation_filenode('{}')", fx.quoted_table());
        fx.db.query_one(&sql, &[]).unwrap().get(0)
    };
    let before = filenode(&mut fx);
    assert_eq!(fx.run(&["migrate"]).code, 0);
    assert_eq!(filenode(&mut fx), before, "no rewrite of the table");

    fx.insert_event("new", "a", "{}");
    let sql = format!(
        "SELECT event_id, producer_xid::text FROM {} ORDER BY producer_xid, id",
        fx.quoted_table()
    );
    let rows: Vec<(String, String)> = fx
        .db
        .query(&sql, &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(rows[0], ("old".to_string(), "0".to_string()), "the oldest");
    assert_eq!(rows[1].0, "new");
    assert_ne!(rows[1].1, "0", "new rows record their transaction");
}

#[test]
fn migrate_into_a_missing_schema_exits_78_saying_so() {
    let fx = Fixture::bare("migrate_no_schema");
    let run = fx.run(&["migrate", "--table", "no_such_schema_here.outbox"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert!(run.stderr.contains("no_such_schema_here"), "{}", run.stderr);
    assert!(run.stderr.contains("CREATE SCHEMA"), "{}", run.stderr);
}

#[test]
fn concurrent_migrations_all_succeed() {
    let fx = Fixture::bare("migrate_concurrent");
    let children: Vec<_> = (0..4)
        .map(|_| {
            let mut command = fx.command();
            command
                .arg("migrate")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            command.spawn().unwrap()
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn a_reference_table_with_serial_id_and_bigint_attempts_works_with_every_command() {
    let mut fx = Fixture::bare("migrate_types");
    fx.execute(
        "CREATE TABLE {table} (id serial PRIMARY KEY, event_id varchar(100) NOT NULL UNIQUE, \
         event_type varchar(100) NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), \
         published_at timestamptz, attempts bigint NOT NULL DEFAULT 0); \
         INSERT INTO {table} (event_id, event_type, payload) VALUES ('a', 'order.created', '{}'), ('b', 'nobody.listens', '{}');",
    );
    fx.route_only("order.#");
    assert_eq!(fx.run(&["migrate"]).code, 0);
    let run = fx.run(&["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (1, 1));
    let rows = fx.rows_untyped();
    assert_eq!(
        rows,
        [("a".to_string(), true, 0), ("b".to_string(), false, 1)]
    );
    // A drain's claims start after its last one: an int4 id against a
    // bigint bound. (b, backing off, is dead to it: not retried here.)
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload) \
         VALUES ('c', 'order.created', '{}'), ('d', 'order.created', '{}')",
    );
    let args = [
        "--drain",
        "--batch-size",
        "1",
        "--max-attempts",
        "1",
        "--json",
    ];
    let drain = fx.run(&args);
    assert_eq!(drain.code, 0, "{}", drain.stderr);
    assert_eq!((drain.field("published"), drain.field("batches")), (2, 2));
    let marked = fx.rows_untyped().iter().filter(|row| row.1).count();
    assert_eq!(marked, 3, "a, c and d");
    // The operators' commands read the same table.
    let status = fx.run(&["status", "--json", "--max-attempts", "1"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert_eq!(status.summary()["dead"], 1);
    let requeue = fx.run(&["requeue", "--dead", "--max-attempts", "1"]);
    assert_eq!(requeue.code, 0, "{}", requeue.stderr);
    assert_eq!(fx.rows_untyped()[1], ("b".to_string(), false, 0));
}

/// The table's storage settings, sorted.
fn reloptions(fx: &mut Fixture) -> Vec<String> {
    let sql = format!(
        "SELECT coalesce(reloptions, '{{}}') FROM pg_class WHERE oid = '{}'::regclass",
        fx.quoted_table()
    );
    let mut options: Vec<String> = fx.db.query_one(&sql, &[]).unwrap().get(0);
    options.sort();
    options
}

#[test]
fn migrate_sets_the_outboxs_autovacuum_settings() {
    let mut fx = Fixture::new("migrate_autovacuum");
    assert_eq!(
        reloptions(&mut fx),
        [
            "autovacuum_vacuum_scale_factor=0.01",
            "autovacuum_vacuum_threshold=1000"
        ]
    );
}

#[test]
fn migrate_keeps_an_operators_own_autovacuum_setting() {
    let mut fx = Fixture::new("migrate_autovacuum_own");
    fx.execute("ALTER TABLE {table} SET (autovacuum_vacuum_scale_factor = 0.05)");
    fx.execute("ALTER TABLE {table} RESET (autovacuum_vacuum_threshold)");
    let run = fx.run(&["migrate"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(
        reloptions(&mut fx),
        [
            "autovacuum_vacuum_scale_factor=0.05",
            "autovacuum_vacuum_threshold=1000"
        ]
    );
}
