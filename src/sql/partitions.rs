//! A time-partitioned outbox (`migrations/example_partitioned_outbox.sql`:
//! PARTITION BY RANGE (created_at)), as the relay and `prune` see it.
//!
//! The relay works on such a table unchanged; it only needs to know
//! whether the marks can name the partitions of their batch (see
//! `sql::outbox`). `prune` drops whole partitions whose rows are all
//! published before its cut-off, which takes milliseconds and returns the
//! space at once, where deleting them row by row takes minutes and leaves
//! the space to vacuum.
//!
//! A partition's name comes from the catalog (its schema and its name),
//! and enters SQL only quoted (`TableName::quoted`), as the outbox's own
//! name does.

use std::time::Duration;

use anyhow::Result;
use postgres::Client;
use postgres::error::SqlState;

use crate::connect::database::classify_on_table;
use crate::sql::table::TableName;

/// Whether the relation `t.oid` is partitioned by range on a timestamptz
/// `created_at` alone: then a created_at range names the partitions a
/// batch lives in. An SQL expression, for the statements that ask it
/// beside other questions (`sql::columns`).
pub const BY_CREATED_AT: &str = "EXISTS (SELECT FROM pg_partitioned_table p \
       JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] \
       WHERE p.partrelid = t.oid AND p.partstrat = 'r' \
         AND p.partnatts = 1 AND a.attname = 'created_at' \
         AND a.atttypid = 'timestamptz'::regtype)";

/// Whether `table` is partitioned by range on created_at (BY_CREATED_AT).
pub fn by_created_at(client: &mut Client, table: &TableName) -> Result<bool> {
    let row = client
        .query_one(
            &format!("SELECT {BY_CREATED_AT} FROM (SELECT $1::text::regclass AS oid) t"),
            &[&table.quoted()],
        )
        .map_err(|error| {
            classify_on_table(&error, "reading how the table is partitioned", table)
        })?;
    Ok(row.get(0))
}

/// Why prune drops no partition of a table.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The table is not partitioned by range on created_at.
    NotPartitioned,
    /// This role does not own the table: it cannot detach or drop.
    NotOwner,
}

/// The partitions of `table` whose whole range ends at or before the
/// cut-off, `age` ago, in range order, or why prune drops none. Only leaf
/// partitions of the table itself that this role owns are offered, each
/// with an upper bound: never the DEFAULT partition, nor one that reaches
/// MAXVALUE. Detaching and dropping are the owner's: a role that may only
/// delete rows prunes row by row.
pub fn candidates(
    client: &mut Client,
    table: &TableName,
    age: Duration,
) -> Result<Result<Vec<TableName>, Refusal>> {
    if !by_created_at(client, table)? {
        return Ok(Err(Refusal::NotPartitioned));
    }
    let what = "listing the partitions to drop";
    let owner = client
        .query_one(
            "SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = $1::text::regclass",
            &[&table.quoted()],
        )
        .map_err(|error| classify_on_table(&error, what, table))?;
    if !owner.get::<_, bool>(0) {
        return Ok(Err(Refusal::NotOwner));
    }
    let rows = client
        .query(
            "SELECT schema, name FROM ( \
               SELECT n.nspname::text AS schema, c.relname::text AS name, \
                 (regexp_match(pg_get_expr(c.relpartbound, c.oid), \
                               ' TO \\(''([^'']*)''\\)$'))[1]::timestamptz AS upper \
               FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
               WHERE i.inhparent = $1::text::regclass AND c.relkind = 'r' \
                 AND pg_has_role(c.relowner, 'USAGE')) p \
             WHERE upper <= now() - make_interval(secs => $2) ORDER BY upper",
            &[&table.quoted(), &age.as_secs_f64()],
        )
        .map_err(|error| classify_on_table(&error, what, table))?;
    Ok(Ok(rows
        .iter()
        .map(|row| TableName::from_catalog(row.get(0), row.get(1)))
        .collect()))
}

/// How many rows `partition` holds if prune may drop it: every row in it
/// published before the cut-off, `age` ago (None: it holds a pending or
/// dead event, or one published since). Reads the whole partition, once.
pub fn droppable_rows(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
    age: Duration,
) -> Result<Option<i64>> {
    let row = client
        .query_one(
            &format!(
                "SELECT count(*), count(*) FILTER (WHERE published_at IS NULL \
                   OR published_at >= now() - make_interval(secs => $1)) FROM {}",
                partition.quoted()
            ),
            &[&age.as_secs_f64()],
        )
        .map_err(|error| {
            classify_on_table(&error, &format!("reading partition {partition}"), table)
        })?;
    let (rows, kept): (i64, i64) = (row.get(0), row.get(1));
    Ok((kept == 0).then_some(rows))
}

/// What became of one partition prune set out to drop.
#[derive(Debug, PartialEq, Eq)]
pub enum Dropped {
    Dropped,
    /// An unpublished event turned up in it since it was checked: kept.
    Kept,
    /// The table was busy past the lock timeout: kept for now (its rows
    /// are pruned row by row).
    Busy,
}

/// How long DETACH may wait for the table's lock. It needs the parent's
/// ACCESS EXCLUSIVE lock, and while it waits for the relay's batches and
/// any other transaction on the outbox to end, every new statement on the
/// table (the producers' INSERTs included) queues behind it: the wait must
/// be short. The relay's batches last milliseconds.
const DETACH_LOCK_TIMEOUT: &str = "1s";

/// Detaches and drops `partition` of `table` in one transaction. Checked
/// again under the lock, through the partition's pending index: an event
/// inserted into its range since `droppable_rows` read it keeps it.
/// (Events published since then were unpublished when it was read, so it
/// was not offered.) The check and the drop are one transaction, so a kept
/// partition was never detached as far as anyone else can tell.
pub fn detach_and_drop(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
) -> Result<Dropped> {
    let mut transaction = client
        .transaction()
        .map_err(|error| drop_error(&error, table, partition))?;
    let detached = transaction.batch_execute(&format!(
        "SET LOCAL lock_timeout = '{DETACH_LOCK_TIMEOUT}'; \
         ALTER TABLE {} DETACH PARTITION {}",
        table.quoted(),
        partition.quoted()
    ));
    match detached {
        Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
            return Ok(Dropped::Busy);
        }
        detached => detached.map_err(|error| drop_error(&error, table, partition))?,
    }
    let pending = transaction
        .query_one(
            &format!(
                "SELECT EXISTS (SELECT FROM {} WHERE published_at IS NULL)",
                partition.quoted()
            ),
            &[],
        )
        .map_err(|error| drop_error(&error, table, partition))?;
    if pending.get::<_, bool>(0) {
        return Ok(Dropped::Kept);
    }
    transaction
        .batch_execute(&format!("DROP TABLE {}", partition.quoted()))
        .map_err(|error| drop_error(&error, table, partition))?;
    transaction
        .commit()
        .map_err(|error| drop_error(&error, table, partition))?;
    Ok(Dropped::Dropped)
}

/// A refusal names the partition; a missing privilege is exit 78 (the
/// owner's role is checked first, so only a change of owner meanwhile).
fn drop_error(error: &postgres::Error, table: &TableName, partition: &TableName) -> anyhow::Error {
    classify_on_table(error, &format!("dropping partition {partition}"), table)
}
