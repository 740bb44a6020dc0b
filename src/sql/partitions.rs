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
use postgres::fallible_iterator::FallibleIterator;

use crate::sql::names;
use crate::sql::table::TableName;
use crate::sql::table::classify_on_table;

/// Whether the relation `t.oid` is partitioned by range on a timestamptz
/// `created_at` alone: then a created_at range names the partitions a
/// batch lives in. An SQL expression, for the statements that ask it
/// beside other questions (`sql::columns`).
pub(crate) const BY_CREATED_AT: &str = "EXISTS (SELECT FROM pg_partitioned_table p \
       JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] \
       WHERE p.partrelid = t.oid AND p.partstrat = 'r' \
         AND p.partnatts = 1 AND a.attname = 'created_at' \
         AND a.atttypid = 'timestamptz'::regtype)";

/// Whether the partition `i` (a pg_inherits row) is left detaching by an
/// interrupted DETACH ... CONCURRENTLY. Read through to_jsonb so the
/// statement also runs on PostgreSQL before 14, which has no such column.
const DETACH_PENDING: &str = "coalesce((to_jsonb(i) ->> 'inhdetachpending')::bool, false)";

/// Whether `table` is partitioned by range on created_at (BY_CREATED_AT).
pub(crate) fn by_created_at(client: &mut Client, table: &TableName) -> Result<bool> {
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
pub(crate) enum Refusal {
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
pub(crate) fn candidates(
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
            &format!(
                "SELECT schema, name FROM ( \
               SELECT n.nspname::text AS schema, c.relname::text AS name, \
                 (regexp_match(pg_get_expr(c.relpartbound, c.oid), \
                               ' TO \\(''([^'']*)''\\)$'))[1]::timestamptz AS upper \
               FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
               WHERE i.inhparent = $1::text::regclass AND c.relkind = 'r' \
                 AND NOT {DETACH_PENDING} AND pg_has_role(c.relowner, 'USAGE')) p \
             WHERE upper <= now() - make_interval(secs => $2) ORDER BY upper"
            ),
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
pub(crate) fn droppable_rows(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
    age: Duration,
) -> Result<Option<i64>> {
    let row = client
        .query_one(
            &*names::sql(&format!(
                "SELECT count(*), count(*) FILTER (WHERE published_at IS NULL \
                   OR published_at >= now() - make_interval(secs => $1)) FROM {}",
                partition.quoted()
            )),
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
pub(crate) enum DropOutcome {
    /// Dropped, with the rows it held.
    Dropped(i64),
    /// An unpublished event turned up in it since it was checked: kept
    /// (attached again when it had been detached).
    Kept,
    /// The table was busy past the lock timeout: kept for now (its rows
    /// are pruned row by row).
    Busy,
}

/// How prune may detach a partition of `table`: concurrently (PostgreSQL
/// 14 and later, and no DEFAULT partition, which a concurrent detach
/// refuses), or under the parent's ACCESS EXCLUSIVE lock.
pub(crate) fn concurrent_detach(client: &mut Client, table: &TableName) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int >= 140000 \
               AND NOT EXISTS (SELECT FROM pg_partitioned_table \
                 WHERE partrelid = $1::text::regclass AND partdefid <> 0)",
            &[&table.quoted()],
        )
        .map_err(|error| {
            classify_on_table(&error, "reading how the table is partitioned", table)
        })?;
    Ok(row.get(0))
}

/// The partitions of `table` whose concurrent detach an interrupted run
/// (a signal, a lost connection) left pending: the table's queries no
/// longer see them, and nothing can be done to them but FINALIZE. With
/// whether their range ends before the cut-off, `age` ago.
pub(crate) fn pending_detaches(
    client: &mut Client,
    table: &TableName,
    age: Duration,
) -> Result<Vec<(TableName, bool)>> {
    let rows = client
        .query(
            &format!(
                "SELECT n.nspname::text, c.relname::text, \
               coalesce((regexp_match(pg_get_expr(c.relpartbound, c.oid), \
                 ' TO \\(''([^'']*)''\\)$'))[1]::timestamptz \
                 <= now() - make_interval(secs => $2), false) \
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
               JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE i.inhparent = $1::text::regclass AND {DETACH_PENDING}"
            ),
            &[&table.quoted(), &age.as_secs_f64()],
        )
        .map_err(|error| classify_on_table(&error, "listing pending detaches", table))?;
    Ok(rows
        .iter()
        .map(|row| (TableName::from_catalog(row.get(0), row.get(1)), row.get(2)))
        .collect())
}

/// Finishes the pending detach of `partition` (outside any transaction
/// block, as PostgreSQL requires), waiting as a concurrent detach does;
/// false when that wait ran out (still pending: the next prune tries again).
pub(crate) fn finalize(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
) -> Result<bool> {
    waiting_detach(client, table, partition, "FINALIZE")
}

/// How long a concurrent detach (or its FINALIZE) may wait for the
/// transactions that still see the partition: nobody queues behind it, so
/// the session's usual short lock_timeout need not apply; a report open
/// longer leaves the detach pending for the next prune.
const DETACH_WAIT: &str = "10min";

/// `ALTER TABLE table DETACH PARTITION partition {how}` under DETACH_WAIT;
/// false when the wait ran out.
fn waiting_detach(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
    how: &str,
) -> Result<bool> {
    let set = |client: &mut Client, sql: &str| {
        client
            .batch_execute(sql)
            .map_err(|error| drop_error(&error, table, partition))
    };
    set(client, &format!("SET lock_timeout = '{DETACH_WAIT}'"))?;
    let detached = client.batch_execute(&format!(
        "ALTER TABLE {} DETACH PARTITION {} {how}",
        table.quoted(),
        partition.quoted()
    ));
    let done = match detached {
        Ok(()) => true,
        Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => false,
        Err(error) => return Err(drop_error(&error, table, partition)),
    };
    set(client, "RESET lock_timeout")?;
    Ok(done)
}

/// The bound of `partition` (`FOR VALUES FROM (...) TO (...)`), to attach
/// it again if it must be kept after all.
pub(crate) fn bound(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
) -> Result<String> {
    let row = client
        .query_one(
            "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE oid = $1::text::regclass",
            &[&partition.quoted()],
        )
        .map_err(|error| drop_error(&error, table, partition))?;
    Ok(row.get(0))
}

/// Detaches `partition` with DETACH PARTITION ... CONCURRENTLY: it takes
/// only SHARE UPDATE EXCLUSIVE on the table, so the producers' INSERTs and
/// the relay's batches never wait behind it, and it waits (without a
/// timeout: nobody queues behind it) for the transactions that could still
/// see the partition, a drain's batch or a long report, to end (up to
/// DETACH_WAIT; false then). Interrupted or out of time, it leaves the
/// detach pending; the next prune finishes it (`pending_detaches`,
/// `finalize`).
pub(crate) fn detach_concurrently(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
) -> Result<bool> {
    waiting_detach(client, table, partition, "CONCURRENTLY")
}

/// Drops `partition`, detached from `table`, if every row in it was
/// published before the cut-off (`droppable_rows`); otherwise attaches it
/// again with its `bound` (an event inserted into its old range since it
/// was checked, or a detach prune did not choose), so no event leaves the
/// outbox unpublished. `before_drop` runs just before the drop (prune
/// --archive writes the rows there); when it fails, the partition is
/// attached again, its rows kept, and its error returned.
pub(crate) fn drop_detached(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
    bound: &str,
    age: Duration,
    before_drop: &mut dyn FnMut(&mut Client, &TableName) -> Result<()>,
) -> Result<DropOutcome> {
    let Some(rows) = droppable_rows(client, table, partition, age)? else {
        attach(client, table, partition, bound)?;
        return Ok(DropOutcome::Kept);
    };
    if let Err(error) = before_drop(client, partition) {
        attach(client, table, partition, bound)?;
        return Err(error);
    }
    client
        .batch_execute(&format!("DROP TABLE {}", partition.quoted()))
        .map_err(|error| drop_error(&error, table, partition))?;
    Ok(DropOutcome::Dropped(rows))
}

/// Hands each row of `partition` to `each` as the text `row` (an SQL
/// expression over the row `t`) makes of it, by id, streamed: a
/// partition's rows are never all in memory at once.
pub(crate) fn each_row(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
    row: &str,
    each: &mut dyn FnMut(&str) -> Result<()>,
) -> Result<()> {
    let what = format!("reading partition {partition}");
    // By id, as the relay published them (the example's primary key,
    // (id, created_at), serves the order).
    let sql = format!("SELECT {row} FROM {} AS t ORDER BY id", partition.quoted());
    let none: [&str; 0] = [];
    let mut rows = client
        .query_raw(&sql, none)
        .map_err(|error| classify_on_table(&error, &what, table))?;
    while let Some(found) = rows
        .next()
        .map_err(|error| classify_on_table(&error, &what, table))?
    {
        each(found.get(0))?;
    }
    Ok(())
}

/// Attaches the detached `partition` to `table` again with its `bound`
/// (SHARE UPDATE EXCLUSIVE on the table: producers go on).
pub(crate) fn attach(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
    bound: &str,
) -> Result<()> {
    client
        .batch_execute(&format!(
            "ALTER TABLE {} ATTACH PARTITION {} {bound}",
            table.quoted(),
            partition.quoted()
        ))
        .map_err(|error| drop_error(&error, table, partition))
}

/// How long DETACH may wait for the table's lock where it cannot detach
/// concurrently. It needs the parent's ACCESS EXCLUSIVE lock, and while it
/// waits every new statement on the table (the producers' INSERTs
/// included) queues behind it: producers must never wait longer than this.
/// The caller retries.
const DETACH_LOCK_TIMEOUT: &str = "25ms";

/// Detaches and drops `partition` of `table` in one transaction, waiting
/// at most DETACH_LOCK_TIMEOUT for the lock (Busy then). Checked again
/// under the lock, through the partition's pending index: an event
/// inserted into its range since `droppable_rows` read it keeps it.
/// (Events published since then were unpublished when it was read, so it
/// was not offered.) The check and the drop are one transaction, so a kept
/// partition was never detached as far as anyone else can tell.
pub(crate) fn detach_and_drop(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
    rows: i64,
) -> Result<DropOutcome> {
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
            return Ok(DropOutcome::Busy);
        }
        detached => detached.map_err(|error| drop_error(&error, table, partition))?,
    }
    let pending = transaction
        .query_one(
            &*names::sql(&format!(
                "SELECT EXISTS (SELECT FROM {} WHERE published_at IS NULL)",
                partition.quoted()
            )),
            &[],
        )
        .map_err(|error| drop_error(&error, table, partition))?;
    if pending.get::<_, bool>(0) {
        return Ok(DropOutcome::Kept);
    }
    transaction
        .batch_execute(&format!("DROP TABLE {}", partition.quoted()))
        .map_err(|error| drop_error(&error, table, partition))?;
    transaction
        .commit()
        .map_err(|error| drop_error(&error, table, partition))?;
    Ok(DropOutcome::Dropped(rows))
}

/// A refusal names the partition; a missing privilege is exit 78 (the
/// owner's role is checked first, so only a change of owner meanwhile).
fn drop_error(error: &postgres::Error, table: &TableName, partition: &TableName) -> anyhow::Error {
    classify_on_table(error, &format!("dropping partition {partition}"), table)
}
