//! The claim and mark queries: the only SQL a poll run sends about events.
//!
//! Each runs in the batch's transaction, which the caller has opened on
//! the client. Statements are prepared once per connection and reused by
//! every batch of a drain. Preparing them all up front also checks the table's shape
//! before anything is claimed or published: a missing column must stop the
//! run at the start, not after the broker has the messages.

use std::time::Duration;

use anyhow::{Result, anyhow};
use postgres::types::ToSql;
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

/// Where a claim starts. Only a hint of where the next claimable events
/// are: every claim still considers the whole table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The head of the table.
    Head,
    /// A plain claim: at this id (the drain's last claim ended before it).
    Id(i64),
    /// An --ordered-by-key claim: at the keys after this one, then from
    /// the first key.
    AfterKey(String),
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
    order: Order,
    /// The optional columns the claim selects, after the fixed six.
    columns: Columns,
    claim: Statement,
    mark_published: Statement,
    mark_failed: Statement,
    /// Only in the ordered modes (see `before_claim`): plain runs need none.
    before_claim: Option<Statement>,
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
            before_claim: match order {
                Order::Strict => Some(prepare(client, LOCK_AND_SEE_SESSIONS_SQL)?),
                Order::ByKey => Some(prepare(client, SEE_SESSIONS_SQL)?),
                Order::Plain => None,
            },
            table: table.clone(),
            max_attempts,
            order,
            columns,
        })
    }

    /// Claims up to `limit` due events, locked until the transaction ends,
    /// starting where `start` says (a start the run's order has no use for
    /// is the head).
    pub fn claim(&self, client: &mut Client, limit: i64, start: &Start) -> Result<Vec<Event>> {
        // The head, for each claim that takes a start: the first id, the
        // first key ('' sorts before any other text).
        let (first_id, first_key) = (i64::MIN, String::new());
        let start: Option<&(dyn ToSql + Sync)> = match (self.order, start) {
            (Order::Plain, Start::Id(id)) => Some(id),
            (Order::Plain, _) => Some(&first_id),
            (Order::ByKey, Start::AfterKey(key)) => Some(key),
            (Order::ByKey, _) => Some(&first_key),
            (Order::Strict, _) => None,
        };
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&self.max_attempts, &limit];
        params.extend(start);
        let rows = client
            .query(&self.claim, &params)
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

    /// Whether this transaction may claim. In --ordered mode it takes the
    /// table's lock for the transaction if it is free, and goes ahead only
    /// then; plain runs need no lock and always go ahead.
    ///
    /// A transaction-level advisory lock rather than a session one: it is
    /// released by the same COMMIT or ROLLBACK that releases the row locks,
    /// and by the server if the connection dies, so it can never leak.
    ///
    /// Both ordered modes also read pg_stat_activity here, before the
    /// claim's snapshot is taken: a transaction reads it once, as of its
    /// first look, so the claim's HORIZON sees the other databases'
    /// transactions as they were before its snapshot. One that ended in
    /// between is then not in the snapshot at all, where seen after the
    /// snapshot it would not be known as another database's and would
    /// hold the claim back for nothing.
    pub fn before_claim(&self, client: &mut Client) -> Result<bool> {
        let Some(statement) = &self.before_claim else {
            return Ok(true);
        };
        let table = self.table.quoted();
        let params: &[&(dyn ToSql + Sync)] = match self.order {
            Order::Strict => &[&table],
            Order::ByKey | Order::Plain => &[],
        };
        let row = client.query_one(statement, params).map_err(|error| {
            classify_on_table(&error, "preparing an ordered claim", &self.table)
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
/// cannot insert into this table. One that pg_stat_activity does not show
/// (it had not started when the transaction first looked, or it is a
/// prepared transaction) counts: the snapshot did not see what it wrote.
/// Any role may read pg_stat_activity's xids and databases.
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
/// (read from the two order indexes, rows without a key and rows with one,
/// merged): the rows before the first that is still backing
/// off or may yet be preceded by a row not committed. Dead rows are not
/// pending, which is how a poison event stops blocking the table. It waits
/// for (rather than skips) a row another transaction holds.
fn ordered_claim_sql(table: &str, selected: &str) -> String {
    let pending = |half: &str| {
        format!(
            "(SELECT id, producer_xid, available_at FROM {table} \
              WHERE {half} AND published_at IS NULL AND attempts < $1::int \
              ORDER BY producer_xid, id LIMIT $2)"
        )
    };
    let (unkeyed, keyed) = (
        pending("ordering_key IS NULL"),
        pending("ordering_key IS NOT NULL"),
    );
    let settled = settled();
    format!(
        "SELECT {selected} FROM {table} \
         WHERE published_at IS NULL AND attempts < $1::int AND available_at <= now() \
           AND id = ANY (ARRAY( \
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
/// yields nothing. Each first event is looked up and locked on its own (a
/// LATERAL subquery, which the planner cannot turn into a join that reads
/// the whole table). Dead events are not pending and block nothing. The scan
/// starts after the key $3 (the last one the drain claimed: the keys right
/// after it are those its batches in flight do not hold) and then goes on
/// from the first key up to $3, so it covers every key. Then, for the rest
/// of the batch, events without a key, as a plain claim takes them.
fn by_key_claim_sql(table: &str, selected: &str) -> String {
    let heads = |name: &str, range: &str| {
        format!(
            "{name}(head_key, head_id) AS ( \
                 (SELECT ordering_key, id FROM {table} \
                  WHERE {range} AND published_at IS NULL AND attempts < $1::int \
                  ORDER BY ordering_key, producer_xid, id LIMIT 1) \
               UNION ALL \
                 SELECT next.ordering_key, next.id FROM {name}, LATERAL ( \
                   SELECT ordering_key, id FROM {table} \
                   WHERE {range} AND ordering_key > {name}.head_key \
                     AND published_at IS NULL AND attempts < $1::int \
                   ORDER BY ordering_key, producer_xid, id LIMIT 1) AS next)"
        )
    };
    let after = heads("after", "ordering_key > $3::text");
    let up_to = heads("up_to", "ordering_key <= $3::text");
    let settled = settled();
    format!(
        "WITH RECURSIVE {after}, {up_to}, \
         keyed AS ( \
             SELECT claimed.* \
             FROM (SELECT * FROM after UNION ALL SELECT * FROM up_to) AS heads, LATERAL ( \
               SELECT {selected} FROM {table} \
               WHERE id = heads.head_id AND published_at IS NULL AND attempts < $1::int \
                 AND available_at <= now() AND {settled} \
               FOR UPDATE SKIP LOCKED) AS claimed \
             LIMIT $2), \
         unkeyed AS ( \
             SELECT {selected} FROM {table} \
             WHERE ordering_key IS NULL AND published_at IS NULL AND attempts < $1::int \
               AND available_at <= now() \
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

/// The --ordered lock, keyed by the table's oid, so two tables never share
/// a lock and two spellings of one table always do; and the first look at
/// pg_stat_activity (see `Outbox::before_claim`).
const LOCK_AND_SEE_SESSIONS_SQL: &str = "SELECT pg_try_advisory_xact_lock(2052318419, $1::text::regclass::oid::int), \
       (SELECT count(*) FROM pg_stat_activity)";

/// --ordered-by-key takes no lock; the first look at pg_stat_activity only.
pub const SEE_SESSIONS_SQL: &str = "SELECT true, (SELECT count(*) FROM pg_stat_activity)";

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
