//! The claim and mark queries: the only SQL a poll run sends about events.
//!
//! Each runs in the batch's transaction, which the caller has opened on
//! the client. Statements are prepared once per connection and reused by
//! every batch of a drain. Preparing them all up front also checks the table's shape
//! before anything is claimed or published: a missing column must stop the
//! run at the start, not after the broker has the messages.

use std::time::Duration;

use anyhow::{Result, anyhow};
use postgres::{Client, Statement};

use crate::connect::database::classify_on_table;
use crate::exit;
use crate::sql::columns::{self, Columns};
use crate::sql::table::TableName;

/// Backoff after a failed attempt: `BACKOFF_BASE * 2^attempts`, capped at
/// BACKOFF_CAP, then scaled by a random factor in [0.5, 1) ("equal jitter")
/// so that events that failed together do not all come back together.
/// The waits are 1-2 s, 2-4 s, 4-8 s, ...: with the default --max-attempts
/// of 10 an event is dead after 8.5 to 17 minutes of retries in all.
pub const BACKOFF_BASE: Duration = Duration::from_secs(2);
pub const BACKOFF_CAP: Duration = Duration::from_secs(3600);

/// How a run claims its events (see the README's "Ordering").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Any order: whatever is due and not held by another run.
    Plain,
    /// --ordered: the whole table in (producer_xid, id) order.
    Strict,
    /// --ordered-by-key: each ordering_key's events in (producer_xid, id)
    /// order, one event of a key at a time.
    ByKey,
}

/// One claimed row.
#[derive(Debug, Clone, Default)]
pub struct Event {
    pub id: i64,
    pub event_id: String,
    pub event_type: String,
    /// The jsonb as PostgreSQL prints it: sent as the message body unchanged.
    pub payload: String,
    /// Seconds since the epoch, for the AMQP timestamp.
    pub created_at: i64,
    pub attempts: i32,
    /// The optional columns: None where the row holds NULL or the table
    /// has no such column. `headers` is the jsonb as PostgreSQL prints it.
    pub headers: Option<String>,
    pub routing_key: Option<String>,
    pub ordering_key: Option<String>,
}

/// The prepared statements for one table on one connection.
pub struct Outbox {
    table: TableName,
    max_attempts: i32,
    /// The optional columns the claim selects, after the fixed six.
    columns: Columns,
    claim: Statement,
    mark_published: Statement,
    mark_failed: Statement,
    /// Only in ordered mode: plain runs take no table lock at all.
    try_lock: Option<Statement>,
}

impl Outbox {
    /// Looks up which optional columns the table has, then prepares the
    /// statements for them: the claim selects only the columns that exist,
    /// so the per-batch SQL of a table without them is what it always was.
    pub fn prepare(
        client: &mut Client,
        table: &TableName,
        max_attempts: i32,
        order: Order,
    ) -> Result<Self> {
        const WHAT: &str = "preparing the queries";
        let columns = columns::of_table(client, table, WHAT)?;
        let prepare = |client: &mut Client, sql: &str| {
            client
                .prepare(sql)
                .map_err(|error| classify_on_table(&error, WHAT, table))
        };
        let quoted = table.quoted();
        let selected = selected(&columns);
        let claim_sql = match order {
            Order::Plain => claim_sql(&quoted, &selected),
            Order::Strict => ordered_claim_sql(&quoted, &selected),
            Order::ByKey => by_key_claim_sql(&quoted, &selected),
        };
        Ok(Outbox {
            claim: prepare(client, &claim_sql)?,
            mark_published: prepare(client, &mark_published_sql(&quoted))?,
            mark_failed: prepare(client, &mark_failed_sql(&quoted))?,
            try_lock: match order {
                Order::Strict => Some(prepare(client, TRY_LOCK_SQL)?),
                Order::Plain | Order::ByKey => None,
            },
            table: table.clone(),
            max_attempts,
            columns,
        })
    }

    /// Claims up to `limit` due events with ids from `from` on (the whole
    /// table if None), locked until the transaction ends.
    pub fn claim(&self, client: &mut Client, limit: i64, from: Option<i64>) -> Result<Vec<Event>> {
        let from = from.unwrap_or(i64::MIN);
        let rows = client
            .query(&self.claim, &[&self.max_attempts, &limit, &from])
            .map_err(|error| classify_on_table(&error, "claiming a batch", &self.table))?;
        rows.iter().map(|row| self.event(row)).collect()
    }

    /// The SELECT casts every column to the type read here, so only a NULL
    /// where the table should forbid one can fail, and it must not panic.
    fn event(&self, row: &postgres::Row) -> Result<Event> {
        let read = || -> Result<Event, postgres::Error> {
            // The optional columns follow the fixed six, in this order,
            // each only where the table has it (see `selected`).
            let mut index = 6;
            let mut optional = |present: bool| {
                if !present {
                    return Ok(None);
                }
                index += 1;
                row.try_get(index - 1)
            };
            Ok(Event {
                id: row.try_get(0)?,
                event_id: row.try_get(1)?,
                event_type: row.try_get(2)?,
                payload: row.try_get(3)?,
                created_at: row.try_get(4)?,
                attempts: row.try_get(5)?,
                headers: optional(self.columns.headers)?,
                routing_key: optional(self.columns.routing_key)?,
                ordering_key: optional(self.columns.ordering_key)?,
            })
        };
        read().map_err(|error| {
            exit::config(anyhow!(
                "reading a claimed row of table {}: {error}; the columns must be NOT NULL \
                 as `outbox-poll migrate` creates them",
                self.table
            ))
        })
    }

    /// In ordered mode, takes the table's lock for this transaction if it
    /// is free; plain runs need none and always go ahead.
    ///
    /// A transaction-level advisory lock rather than a session one: it is
    /// released by the same COMMIT or ROLLBACK that releases the row locks,
    /// and by the server if the connection dies, so it can never leak.
    pub fn try_lock(&self, client: &mut Client) -> Result<bool> {
        let Some(statement) = &self.try_lock else {
            return Ok(true);
        };
        let row = client
            .query_one(statement, &[&self.table.quoted()])
            .map_err(|error| {
                classify_on_table(&error, "taking the ordered-mode lock", &self.table)
            })?;
        Ok(row.get(0))
    }

    /// Marks the broker-confirmed events published, in one statement.
    pub fn mark_published(&self, client: &mut Client, ids: &[i64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        client
            .execute(&self.mark_published, &[&ids])
            .map_err(|error| classify_on_table(&error, "marking events published", &self.table))?;
        Ok(())
    }

    /// Counts a failed attempt against each event, in one statement.
    pub fn mark_failed(&self, client: &mut Client, failures: &[(i64, String)]) -> Result<()> {
        if failures.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = failures.iter().map(|(id, _)| *id).collect();
        let errors: Vec<&str> = failures.iter().map(|(_, error)| error.as_str()).collect();
        let (base, cap) = (BACKOFF_BASE.as_secs_f64(), BACKOFF_CAP.as_secs_f64());
        client
            .execute(&self.mark_failed, &[&ids, &errors, &base, &cap])
            .map_err(|error| classify_on_table(&error, "recording failed attempts", &self.table))?;
        Ok(())
    }
}

/// Cast to the types the code reads, so a table of the reference article
/// with `id serial` or `attempts bigint` works instead of failing to decode.
/// The timestamp is floored: AMQP's has whole seconds, and rounding could
/// put it after created_at.
const SELECTED: &str = "id::bigint, event_id::text, event_type::text, payload::text, \
     floor(extract(epoch FROM created_at))::bigint, attempts::int";

/// The claim's select list: the fixed six, then the optional columns the
/// table has, in the order `Outbox::event` reads them.
fn selected(columns: &Columns) -> String {
    let mut list = SELECTED.to_string();
    for (present, column) in [
        (columns.headers, ", headers::text"),
        (columns.routing_key, ", routing_key::text"),
        (columns.ordering_key, ", ordering_key::text"),
    ] {
        if present {
            list.push_str(column);
        }
    }
    list
}

/// `id >= $3` lets a drain start where its last claim ended: the pending
/// index then begins at the next unclaimed row instead of walking past every
/// row the drain has marked (vacuum has not removed their entries yet) and
/// every row its other batches in flight hold.
fn claim_sql(table: &str, selected: &str) -> String {
    format!(
        "SELECT {selected} FROM {table} \
         WHERE published_at IS NULL AND attempts < $1::int AND available_at <= now() \
           AND id >= $3::bigint \
         ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED"
    )
}

/// The oldest transaction of this database that was still running when
/// the statement's snapshot was taken (the snapshot's xmax when none was).
/// The snapshot's running xids are the whole server's; those that
/// pg_stat_activity shows in another database are left out, since they
/// cannot insert into this table. One that has ended since the snapshot,
/// or that no session shows (a prepared transaction), counts: the
/// snapshot did not see what it wrote. Any role may read pg_stat_activity's
/// xids and databases.
pub const HORIZON: &str = "(SELECT coalesce(min(running), pg_snapshot_xmax(pg_current_snapshot())) \
     FROM pg_snapshot_xip(pg_current_snapshot()) AS running \
     WHERE xid(running) NOT IN (SELECT backend_xid FROM pg_stat_activity \
       WHERE backend_xid IS NOT NULL AND datname <> current_database()))";

/// Whether every transaction that could still insert a row sorting before
/// this one (in (producer_xid, id) order) has ended. Rows with a smaller
/// xid were inserted by transactions that have all ended once that xid is
/// below the horizon; rows with the same xid were inserted by the same,
/// committed, transaction; and a transaction still to come gets a larger
/// xid. Plain id order could not be made safe so: ids are taken at
/// insert, so a transaction that got its xid after a committed one may
/// still hold a lower id.
fn settled() -> String {
    format!("producer_xid < {HORIZON}")
}

/// --ordered, over the first $2 pending rows in (producer_xid, id) order
/// (read from the two halves of the ordered index, rows without a key and
/// rows with one, merged): the rows before the first that is still backing
/// off or may yet be preceded by a row not committed. Dead rows are not
/// pending, which is how a poison event stops blocking the table. It waits
/// for (rather than skips) a row another transaction holds. It takes `from`
/// like the plain claim, but an ordered run always claims from the head.
fn ordered_claim_sql(table: &str, selected: &str) -> String {
    let pending = |half: &str| {
        format!(
            "(SELECT id, producer_xid, available_at FROM {table} \
              WHERE {half} AND published_at IS NULL AND attempts < $1::int \
              ORDER BY producer_xid, id LIMIT $2)"
        )
    };
    // `(ordering_key IS NULL) IS FALSE`, not `IS NOT NULL`: the planner
    // matches only that spelling to the index's leading boolean.
    let (unkeyed, keyed) = (
        pending("ordering_key IS NULL"),
        pending("(ordering_key IS NULL) IS FALSE"),
    );
    let settled = settled();
    format!(
        "SELECT {selected} FROM {table} \
         WHERE published_at IS NULL AND attempts < $1::int AND available_at <= now() \
           AND id >= $3::bigint AND id = ANY (ARRAY( \
             SELECT id FROM ( \
               SELECT id, bool_and(available_at <= now() AND {settled}) \
                        OVER (ORDER BY producer_xid, id) AS clear \
               FROM ({unkeyed} UNION ALL {keyed}) AS pending \
               ORDER BY producer_xid, id LIMIT $2) AS head \
             WHERE clear)) \
         ORDER BY producer_xid, id FOR UPDATE"
    )
}

/// --ordered-by-key: the first pending event of each key (a skip scan over
/// the key index, one step per key, taken only as far as the batch
/// needs), claimable when it is due, settled, and not held by another
/// transaction (a batch in flight, another run), so a batch holds at most
/// one event of a key, and a key whose first event is backing off or held
/// yields nothing. Dead events are not pending and block nothing. Then,
/// for the rest of the batch, events without a key, as a plain claim
/// takes them. `from` ($3) is taken as by the other claims; a run in this
/// mode always claims from the head.
fn by_key_claim_sql(table: &str, selected: &str) -> String {
    let settled = settled();
    format!(
        "WITH RECURSIVE heads(head_key, head_id) AS ( \
             (SELECT ordering_key, id FROM {table} \
              WHERE ordering_key IS NOT NULL AND published_at IS NULL AND attempts < $1::int \
              ORDER BY ordering_key, producer_xid, id LIMIT 1) \
           UNION ALL \
             SELECT next.ordering_key, next.id FROM heads, LATERAL ( \
               SELECT ordering_key, id FROM {table} \
               WHERE ordering_key > heads.head_key AND published_at IS NULL \
                 AND attempts < $1::int \
               ORDER BY ordering_key, producer_xid, id LIMIT 1) AS next), \
         keyed AS ( \
             SELECT {selected} FROM heads JOIN {table} AS o ON id = head_id \
             WHERE published_at IS NULL AND attempts < $1::int AND available_at <= now() \
               AND {settled} AND id >= $3::bigint \
             LIMIT $2 FOR UPDATE OF o SKIP LOCKED), \
         unkeyed AS ( \
             SELECT {selected} FROM {table} \
             WHERE ordering_key IS NULL AND published_at IS NULL AND attempts < $1::int \
               AND available_at <= now() AND id >= $3::bigint \
             ORDER BY producer_xid, id LIMIT $2 - (SELECT count(*) FROM keyed) \
             FOR UPDATE SKIP LOCKED) \
         SELECT * FROM keyed UNION ALL SELECT * FROM unkeyed"
    )
}

fn mark_published_sql(table: &str) -> String {
    format!("UPDATE {table} SET published_at = now() WHERE id = ANY($1::bigint[])")
}

/// The backoff counts from the failure, clock_timestamp(), not from now(),
/// which is the start of the transaction: a batch that took longer to
/// publish than the first backoff step would otherwise commit a retry time
/// already in the past.
fn mark_failed_sql(table: &str) -> String {
    format!(
        "UPDATE {table} AS o SET attempts = o.attempts + 1, last_error = f.error, \
           available_at = clock_timestamp() + make_interval(secs => \
             least($4::float8, $3::float8 * power(2, least(o.attempts, 30))) \
             * (0.5 + random() / 2)) \
         FROM unnest($1::bigint[], $2::text[]) AS f(id, error) \
         WHERE o.id = f.id"
    )
}

/// Keyed by the table's oid, so two tables never share a lock and two
/// spellings of one table always do.
const TRY_LOCK_SQL: &str =
    "SELECT pg_try_advisory_xact_lock(2052318419, $1::text::regclass::oid::int)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_without_the_optional_columns_is_sent_the_claim_it_always_was() {
        let sql = claim_sql(r#""app"."outbox""#, &selected(&Columns::default()));
        assert_eq!(
            sql,
            "SELECT id::bigint, event_id::text, event_type::text, payload::text, \
             floor(extract(epoch FROM created_at))::bigint, attempts::int \
             FROM \"app\".\"outbox\" \
             WHERE published_at IS NULL AND attempts < $1::int AND available_at <= now() \
               AND id >= $3::bigint \
             ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED"
        );
    }

    #[test]
    fn the_optional_columns_follow_the_fixed_six_in_the_order_they_are_read() {
        let all = Columns {
            headers: true,
            routing_key: true,
            ordering_key: true,
            producer_xid: true,
        };
        let list = selected(&all);
        assert!(
            list.ends_with("attempts::int, headers::text, routing_key::text, ordering_key::text"),
            "{list}"
        );
    }
}
