//! The migrations: the SQL files in migrations/, embedded as they are.
//!
//! Each is written for a table named `"outbox"` so that it also runs with
//! psql; `for_table` replaces that quoted identifier (and the `"outbox_`
//! prefix of index names) by the validated, quoted --table. That is the
//! only way a name enters the SQL: as a quoted identifier. Where a
//! migration needs the table as a value (in a DO block, a catalog lookup),
//! it reads the setting NAME_THE_TABLE sets from a bind parameter, never a
//! name pasted into a literal. Every statement is idempotent, so running
//! them again, or on a table of the reference article's seven columns,
//! only adds what is missing.

use crate::sql::table::{TableName, quote};

/// Every migration, in the order it runs.
pub const MIGRATIONS: [(&str, &str); 5] = [
    (
        "0001_create_outbox.sql",
        include_str!("../../migrations/0001_create_outbox.sql"),
    ),
    (
        "0002_retry_columns.sql",
        include_str!("../../migrations/0002_retry_columns.sql"),
    ),
    (
        "0003_ordering.sql",
        include_str!("../../migrations/0003_ordering.sql"),
    ),
    (
        "0004_notify.sql",
        include_str!("../../migrations/0004_notify.sql"),
    ),
    (
        "0005_autovacuum.sql",
        include_str!("../../migrations/0005_autovacuum.sql"),
    ),
];

/// Serialises concurrent migrations (two deploys at once), whatever table.
pub const LOCK: &str = "SELECT pg_advisory_xact_lock(2052318420)";

/// `migrate --notify`: 0004_notify.sql installs its trigger only in a
/// transaction that set this (see the file for why it is opt-in).
pub const OPT_INTO_NOTIFY: &str = "SELECT set_config('outbox_poll.notify', 'on', true)";

/// Names the table for the migrations' DO blocks, for this transaction:
/// $1 is the quoted table name; they read it with
/// `current_setting('outbox_poll.table', true)::regclass`.
pub const NAME_THE_TABLE: &str = "SELECT set_config('outbox_poll.table', $1, true)";

/// A migration's SQL for `table`. Index names first: the table's own name
/// may start with `outbox_` too, and must not be rewritten again once it is
/// in.
pub fn for_table(sql: &str, table: &TableName) -> String {
    let index_prefix = quote(&format!("{}_", table.name()));
    let index_prefix = index_prefix.trim_end_matches('"');
    sql.replace("\"outbox_", index_prefix)
        .replace("\"outbox\"", &table.quoted())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_index_names_follow_the_table() {
        let table = TableName::parse("app.events").unwrap();
        let sql = for_table(MIGRATIONS[1].1, &table);
        assert!(
            sql.contains(r#"INDEX IF NOT EXISTS "events_pending_idx" ON "app"."events""#),
            "{sql}"
        );
        assert!(!sql.contains("\"outbox"), "{sql}");
    }

    #[test]
    fn a_table_named_like_the_placeholder_is_left_as_named() {
        let table = TableName::parse("outbox_archive.outbox_orders").unwrap();
        let sql = for_table(MIGRATIONS[1].1, &table);
        assert!(
            sql.contains(r#""outbox_orders_pending_idx" ON "outbox_archive"."outbox_orders""#),
            "{sql}"
        );
    }

    #[test]
    fn no_name_is_pasted_inside_a_literal_or_a_do_block() {
        let table = TableName::parse(r#"s."it's odd""#).unwrap();
        for (name, sql) in MIGRATIONS {
            let sql = for_table(sql, &table);
            for (i, block) in sql.split("$$").enumerate().filter(|(i, _)| i % 2 == 1) {
                assert!(!block.contains("it's"), "{name}, block {i}: {block}");
            }
        }
    }

    #[test]
    fn every_file_in_migrations_is_embedded() {
        let mut on_disk: Vec<String> =
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
                .unwrap()
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .filter(|name| {
                    name.ends_with(".sql") && name.starts_with(|c: char| c.is_ascii_digit())
                })
                .collect();
        on_disk.sort();
        let embedded: Vec<&str> = MIGRATIONS.iter().map(|(name, _)| *name).collect();
        assert_eq!(on_disk, embedded);
    }
}
