//! `outbox-poll migrate`: create or upgrade the outbox table.
//!
//! The SQL files in migrations/ are embedded as they are. Each is written
//! for a table named `"outbox"` so that it also runs with psql; here that
//! name (and the `"outbox_` prefix of index names) is replaced by the
//! validated, quoted --table. Every statement is idempotent, so running
//! migrate again, or on a table of the reference article's seven columns,
//! only adds what is missing.

use anyhow::Result;

use crate::config::Database;
use crate::db;
use crate::exit;
use crate::table::{TableName, quote};

const MIGRATIONS: [(&str, &str); 2] = [
    (
        "0001_create_outbox.sql",
        include_str!("../migrations/0001_create_outbox.sql"),
    ),
    (
        "0002_retry_columns.sql",
        include_str!("../migrations/0002_retry_columns.sql"),
    ),
];

/// Serialises concurrent migrations (two deploys at once), whatever table.
const MIGRATE_LOCK: &str = "SELECT pg_advisory_xact_lock(2052318420)";

pub fn run(database: &Database) -> Result<u8> {
    let mut client = db::connect(
        &database.config,
        database.connect_timeout,
        database.idle_limit(),
    )?;
    let mut tx = client
        .transaction()
        .map_err(|error| db::classify(&error, "starting the migration", "try again"))?;
    // An index on a large table may take a while to build; the lock
    // timeout still keeps us from queueing behind a long transaction.
    tx.batch_execute(&format!("SET LOCAL statement_timeout = 0; {MIGRATE_LOCK}"))
        .map_err(|error| db::classify(&error, "taking the migration lock", "try again"))?;
    for (name, sql) in MIGRATIONS {
        tx.batch_execute(&for_table(sql, &database.table))
            .map_err(|error| {
                db::classify_on_table(&error, &format!("applying {name}"), &database.table)
            })?;
    }
    tx.commit()
        .map_err(|error| db::classify(&error, "committing the migration", "try again"))?;
    log::info!("table {} is up to date", database.table);
    Ok(exit::SUCCESS)
}

/// Index names first: the table's own name may start with `outbox_` too,
/// and must not be rewritten again once it is in.
fn for_table(sql: &str, table: &TableName) -> String {
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
            sql.contains(r#"ALTER TABLE "app"."events" ADD COLUMN"#),
            "{sql}"
        );
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
            sql.contains(r#"ALTER TABLE "outbox_archive"."outbox_orders" ADD"#),
            "{sql}"
        );
        assert!(
            sql.contains(r#""outbox_orders_pending_idx" ON "outbox_archive"."outbox_orders""#),
            "{sql}"
        );
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
