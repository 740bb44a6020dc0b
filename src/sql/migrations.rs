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
pub const MIGRATIONS: [(&str, &str); 6] = [
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
    (
        "0006_message_columns.sql",
        include_str!("../../migrations/0006_message_columns.sql"),
    ),
];

/// Serialises concurrent migrations (two deploys at once), whatever table.
pub(crate) const LOCK: &str = "SELECT pg_advisory_xact_lock(2052318420)";

/// `migrate --notify`: 0004_notify.sql installs its trigger only in a
/// transaction that set this (see the file for why it is opt-in).
pub(crate) const OPT_INTO_NOTIFY: &str = "SELECT set_config('outbox_poll.notify', 'on', true)";

/// Names the table for the migrations' DO blocks, for this transaction:
/// $1 is the quoted table name; they read it with
/// `current_setting('outbox_poll.table', true)::regclass`.
pub const NAME_THE_TABLE: &str = "SELECT set_config('outbox_poll.table', $1, true)";

/// A migration's SQL for `table`: `"outbox"` becomes the quoted table,
/// and each `"outbox_<suffix>"` (an index) the table's own `<name>_<suffix>`
/// (see `object_name`). Index names first: the table's own name may start
/// with `outbox_` too, and must not be rewritten again once it is in.
pub fn for_table(sql: &str, table: &TableName) -> String {
    const PLACEHOLDER: &str = "\"outbox_";
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(start) = rest.find(PLACEHOLDER) {
        let after = &rest[start + PLACEHOLDER.len()..];
        let Some(end) = after.find('"') else { break };
        out.push_str(&rest[..start]);
        out.push_str(&quote(&object_name(table.name(), &after[..end])));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out.replace("\"outbox\"", &table.quoted())
}

/// PostgreSQL keeps the first 63 bytes of an identifier and drops the rest
/// with only a NOTICE: two index names of a long table would then become
/// one, and `CREATE INDEX IF NOT EXISTS` would skip the second without a
/// word.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// `<table>_<suffix>`, or, where that is longer than PostgreSQL keeps, the
/// table's name cut short, a hash of the whole name and the suffix: still
/// distinct for each suffix and each table, and the same at every migrate.
pub(crate) fn object_name(table: &str, suffix: &str) -> String {
    let full = format!("{table}_{suffix}");
    if full.len() <= MAX_IDENTIFIER_BYTES {
        return full;
    }
    let hash = format!("{:08x}", fnv1a(full.as_bytes()));
    let room = MAX_IDENTIFIER_BYTES.saturating_sub(suffix.len() + hash.len() + 2);
    let mut cut = room.min(table.len());
    while !table.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}_{hash}_{suffix}", &table[..cut])
}

/// FNV-1a, 32 bits: a stable hash that needs no dependency (the standard
/// library's may change between releases, and the names must not).
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
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
    fn a_long_tables_index_names_stay_distinct_within_postgresqls_63_bytes() {
        let table = TableName::parse(&"t".repeat(60)).unwrap();
        let names: Vec<String> = MIGRATIONS
            .iter()
            .flat_map(|(_, sql)| {
                let sql = for_table(sql, &table);
                sql.split("INDEX IF NOT EXISTS \"")
                    .skip(1)
                    .map(|rest| rest[..rest.find('"').unwrap()].to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        for name in &names {
            assert!(name.len() <= 63, "{name}");
        }
        let distinct: std::collections::HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        // A name that fits is left as it always was.
        assert_eq!(object_name("outbox", "pending_idx"), "outbox_pending_idx");
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
