//! The backlog in figures: what `status` prints and the metrics file
//! exports. One pass over the unpublished rows (the partial pending index
//! covers them); published rows, the bulk of an old table, are never read.

use anyhow::Result;
use postgres::Client;

use crate::sql::columns;
use crate::sql::names;
use crate::sql::outbox::{HORIZON, SEE_SESSIONS_SQL};
use crate::sql::table::TableName;
use crate::sql::table::classify_on_table;

/// The backlog of one table (or of one event type in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// Unpublished and not dead.
    pub(crate) pending: i64,
    /// Pending and available now.
    pub(crate) due: i64,
    /// Pending with at least one failed attempt.
    pub(crate) retrying: i64,
    /// Unpublished with attempts >= --max-attempts: never claimed again.
    pub(crate) dead: i64,
    /// Unpublished and past expires_at: never published, and counted in
    /// none of the four above (0 on a table without expires_at).
    pub(crate) expired: i64,
    /// Whole seconds since the oldest pending event was created, among
    /// those whose created_at is finite.
    pub(crate) oldest_pending_age_s: Option<i64>,
    /// The same among the due events: what `status --max-age` checks (an
    /// event backing off is not late yet).
    pub(crate) oldest_due_age_s: Option<i64>,
}

impl Figures {
    /// `status --json`'s object, its five fields in the order
    /// docs/src/operating.md ("status") gives (serde_json's preserve_order
    /// keeps it), then
    /// `expired`.
    pub(crate) fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "pending": self.pending,
            "due": self.due,
            "retrying": self.retrying,
            "dead": self.dead,
            "oldest_pending_age_s": self.oldest_pending_age_s,
            "expired": self.expired,
        })
    }

    /// The table's figures from its per-type ones: no second query.
    pub(crate) fn sum(types: &[(String, Figures)]) -> Figures {
        types
            .iter()
            .fold(Figures::default(), |total, (_, figures)| Figures {
                pending: total.pending + figures.pending,
                due: total.due + figures.due,
                retrying: total.retrying + figures.retrying,
                dead: total.dead + figures.dead,
                expired: total.expired + figures.expired,
                oldest_pending_age_s: total.oldest_pending_age_s.max(figures.oldest_pending_age_s),
                oldest_due_age_s: total.oldest_due_age_s.max(figures.oldest_due_age_s),
            })
    }
}

/// The table's figures, in one query.
pub(crate) fn of_table(
    client: &mut Client,
    table: &TableName,
    max_attempts: i32,
) -> Result<Figures> {
    let rows = query(client, table, max_attempts, false)?;
    Ok(rows
        .first()
        .map(|(_, figures)| *figures)
        .unwrap_or_default())
}

/// The figures of each event type, in event type order, in one query.
pub(crate) fn by_type(
    client: &mut Client,
    table: &TableName,
    max_attempts: i32,
) -> Result<Vec<(String, Figures)>> {
    query(client, table, max_attempts, true)
}

/// The share of dead row versions in the table, as the statistics
/// collector last counted them (n_dead_tup / (n_live_tup + n_dead_tup)),
/// summed over the partitions of a partitioned table; None when it has
/// counted no row at all. A mark or a delete leaves a dead version until
/// vacuum removes it, and every claim walks past the pending index's
/// entries for them: a ratio that keeps rising says vacuum is not keeping
/// up (see the autovacuum settings of migration 0005). The counts are
/// estimates, and when autovacuum is off nothing resets them but a VACUUM.
pub(crate) fn dead_tuple_ratio(client: &mut Client, table: &TableName) -> Result<Option<f64>> {
    Ok(dead_tuples(client, table)?.ratio)
}

/// The dead-tuple ratio with the count of row versions it is taken over.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct DeadTuples {
    pub(crate) ratio: Option<f64>,
    /// Live and dead row versions, as the statistics last counted them.
    pub(crate) versions: i64,
}

/// Below this many row versions the ratio says nothing worth an alarm: a
/// handful of marks on a new table make it 50%, and migrate's autovacuum
/// settings (migration 0005) do not vacuum before 1,000 dead versions.
pub(crate) const MEANINGFUL_VERSIONS: i64 = 1000;

/// `dead_tuple_ratio`, and the row versions counted. The counts are read
/// by oid, for the table and its partitions (pg_partition_tree has no row
/// for a table that is not partitioned), not from pg_stat_all_tables:
/// that view is built over all of pg_class, and the relay's sessions,
/// which run this for the metrics file, plan without sequential scans
/// (relay::session).
pub(crate) fn dead_tuples(client: &mut Client, table: &TableName) -> Result<DeadTuples> {
    let row = client
        .query_one(
            "SELECT (sum(dead) / nullif(sum(live + dead), 0))::float8, \
                    coalesce(sum(live + dead), 0)::int8 \
             FROM (SELECT pg_stat_get_live_tuples(relid) AS live, \
                          pg_stat_get_dead_tuples(relid) AS dead \
                   FROM (SELECT $1::text::regclass AS relid \
                         UNION SELECT relid FROM pg_partition_tree($1::text::regclass)) AS tree) \
                  AS counts",
            &[&table.quoted()],
        )
        .map_err(|error| classify_on_table(&error, "reading the dead-tuple ratio", table))?;
    Ok(DeadTuples {
        ratio: row.get(0),
        versions: row.get(1),
    })
}

/// Due events now, for a progress bar's length.
pub(crate) fn due(client: &mut Client, table: &TableName, max_attempts: i32) -> Result<i64> {
    let sql = format!(
        "SELECT count(*) FROM {} \
         WHERE published_at IS NULL AND attempts < $1::int AND available_at <= now()",
        table.quoted()
    );
    let row = client
        .query_one(&*names::sql(&sql), &[&max_attempts])
        .map_err(|error| classify_on_table(&error, "counting the due events", table))?;
    Ok(row.get(0))
}

/// What holds the ordered modes back (see `held_back`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldBack {
    /// Whole seconds since the oldest held-back event was created.
    pub(crate) age_s: i64,
    /// The pid of the session whose transaction holds it back, where
    /// pg_stat_activity shows one.
    pub(crate) pid: Option<i32>,
}

/// How long the ordered modes have been held back: the oldest pending
/// event that a transaction still running could yet precede (its
/// producer_xid is not below the horizon, see `outbox::HORIZON`), and, if
/// any, that transaction's session. None when no event is held back, or
/// when the table has no producer_xid column (no ordered mode can run on
/// it). Needs only SELECT on the table: pg_stat_activity shows every
/// session's pid, database and xid to any role (not when its transaction
/// started: hence the event's age).
pub(crate) fn held_back(
    client: &mut Client,
    table: &TableName,
    max_attempts: i32,
) -> Result<Option<HeldBack>> {
    const WHAT: &str = "reading what holds the ordered modes back";
    if !columns::of_table(client, table, WHAT)?.columns.producer_xid {
        return Ok(None);
    }
    let classify = |error: postgres::Error| classify_on_table(&error, WHAT, table);
    // As a claim does (see `Outbox::before_claim`): pg_stat_activity first,
    // then the statements whose snapshots HORIZON reads, in one transaction.
    let mut tx = client.transaction().map_err(classify)?;
    tx.query_one(SEE_SESSIONS_SQL, &[]).map_err(classify)?;
    // The age counts finite created_at only, as status's oldest pending
    // age does: `now() - '-infinity'` is an error, and one odd row must
    // not break status. Held-back events that are all infinite age 0.
    let sql = format!(
        "SELECT count(*) > 0, floor(extract(epoch FROM now() - \
           min(created_at) FILTER (WHERE isfinite(created_at))))::bigint FROM {} \
         WHERE published_at IS NULL AND attempts < $1::int AND producer_xid >= {HORIZON}",
        table.quoted()
    );
    let row = tx
        .query_one(&*names::sql(&sql), &[&max_attempts])
        .map_err(classify)?;
    if !row.get::<_, bool>(0) {
        return Ok(None);
    }
    let age_s = row.get::<_, Option<i64>>(1).unwrap_or(0);
    let pid = tx
        .query_opt(&holder_sql(), &[])
        .map_err(classify)?
        .map(|row| row.get(0));
    Ok(Some(HeldBack { age_s, pid }))
}

/// How many keys of an --ordered-by-key table are held back by a failed
/// head: their first pending event (in the claim's order) has failed at
/// least once and backs off, so the key's later events wait behind it.
/// Dead events block nothing (see `sql::outbox`). None when the table has
/// no ordering_key column.
pub(crate) fn held_back_keys(
    client: &mut Client,
    table: &TableName,
    max_attempts: i32,
) -> Result<Option<i64>> {
    const WHAT: &str = "counting the held-back keys";
    let columns = columns::of_table(client, table, WHAT)?.columns;
    if !columns.ordering_key {
        return Ok(None);
    }
    let order = match columns.producer_xid {
        true => "ordering_key, producer_xid, id",
        false => "ordering_key, id",
    };
    let sql = format!(
        "SELECT count(*) FILTER (WHERE attempts > 0) FROM ( \
           SELECT DISTINCT ON (ordering_key) attempts FROM {} \
           WHERE ordering_key IS NOT NULL AND published_at IS NULL AND attempts < $1::int \
           ORDER BY {order}) AS heads",
        table.quoted()
    );
    let row = client
        .query_one(&*names::sql(&sql), &[&max_attempts])
        .map_err(|error| classify_on_table(&error, WHAT, table))?;
    Ok(Some(row.get(0)))
}

/// A key held back by a failed head (`held_back_keys`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldKey {
    pub(crate) key: String,
    /// Its events still to publish, the head included.
    pub(crate) waiting: i64,
    /// The head's created_at (RFC 3339): the key has waited since then at
    /// the latest (the head's first failure is not recorded).
    pub(crate) since: String,
    pub(crate) last_error: Option<String>,
}

/// How many held-back keys `status` lists (their count is exact).
pub(crate) const HELD_KEYS_LISTED: i64 = 100;

/// The keys held back by a failed head, oldest head first, at most
/// HELD_KEYS_LISTED; None when the table has no ordering_key column.
pub(crate) fn held_keys(
    client: &mut Client,
    table: &TableName,
    max_attempts: i32,
) -> Result<Option<Vec<HeldKey>>> {
    const WHAT: &str = "listing the held-back keys";
    let shape = columns::of_table(client, table, WHAT)?;
    if !shape.columns.ordering_key {
        return Ok(None);
    }
    let order = match shape.columns.producer_xid {
        true => "ordering_key, producer_xid, id",
        false => "ordering_key, id",
    };
    let last_error = match shape.last_error {
        true => "last_error",
        false => "NULL::text",
    };
    let sql = format!(
        "SELECT h.ordering_key::text, \
           (SELECT count(*) FROM {t} w WHERE w.ordering_key = h.ordering_key \
              AND w.published_at IS NULL AND w.attempts < $1::int), \
           to_json(h.created_at) #>> '{{}}', h.last_error \
         FROM (SELECT DISTINCT ON (ordering_key) ordering_key, attempts, created_at, \
                 {last_error} AS last_error FROM {t} \
               WHERE ordering_key IS NOT NULL AND published_at IS NULL AND attempts < $1::int \
               ORDER BY {order}) AS h \
         WHERE h.attempts > 0 ORDER BY h.created_at, h.ordering_key LIMIT {HELD_KEYS_LISTED}",
        t = table.quoted()
    );
    let rows = client
        .query(&*names::sql(&sql), &[&max_attempts])
        .map_err(|error| classify_on_table(&error, WHAT, table))?;
    Ok(Some(
        rows.iter()
            .map(|row| HeldKey {
                key: row.get(0),
                waiting: row.get(1),
                since: row.get(2),
                last_error: row.get(3),
            })
            .collect(),
    ))
}

/// The session whose transaction is the horizon (none for a prepared
/// transaction, which has no session, or one that has just ended).
fn holder_sql() -> String {
    format!("SELECT pid FROM pg_stat_activity WHERE backend_xid = xid({HORIZON}) LIMIT 1")
}

fn query(
    client: &mut Client,
    table: &TableName,
    max_attempts: i32,
    group: bool,
) -> Result<Vec<(String, Figures)>> {
    const WHAT: &str = "counting the backlog";
    let expires = columns::of_table(client, table, WHAT)?.columns.expires_at;
    let rows = client
        .query(
            &*names::sql(&figures_sql(&table.quoted(), group, expires)),
            &[&max_attempts],
        )
        .map_err(|error| classify_on_table(&error, WHAT, table))?;
    Ok(rows
        .iter()
        .map(|row| {
            (
                row.get(0),
                Figures {
                    pending: row.get(1),
                    due: row.get(2),
                    retrying: row.get(3),
                    dead: row.get(4),
                    oldest_pending_age_s: row.get(5),
                    expired: match expires {
                        true => row.get(7),
                        false => 0,
                    },
                    oldest_due_age_s: row.get(6),
                },
            )
        })
        .collect())
}

/// The age of the oldest pending event counts only finite created_at
/// values: an event created at '-infinity' (or 'infinity') has no age, and
/// `now()` minus it is an error that would stop `status` and the metrics
/// for the whole table. Such an event still counts as pending.
///
/// On a table with expires_at (`expires`), an event past it counts as
/// expired and in none of the others; without, nothing is expired and the
/// statement is what it always was.
fn figures_sql(table: &str, group: bool, expires: bool) -> String {
    let (key, tail) = if group {
        ("event_type", " GROUP BY event_type ORDER BY event_type")
    } else {
        ("''", "")
    };
    let (live, expired) = match expires {
        true => (
            " AND (expires_at IS NULL OR expires_at > now())",
            ", count(*) FILTER (WHERE expires_at <= now())",
        ),
        false => ("", ""),
    };
    format!(
        "SELECT {key}, \
           count(*) FILTER (WHERE attempts < $1::int{live}), \
           count(*) FILTER (WHERE attempts < $1::int AND available_at <= now(){live}), \
           count(*) FILTER (WHERE attempts < $1::int AND attempts > 0{live}), \
           count(*) FILTER (WHERE attempts >= $1::int{live}), \
           floor(extract(epoch FROM now() - min(created_at) \
             FILTER (WHERE attempts < $1::int AND isfinite(created_at){live})))::bigint, \
           floor(extract(epoch FROM now() - min(created_at) \
             FILTER (WHERE attempts < $1::int AND available_at <= now() \
               AND isfinite(created_at){live})))::bigint\
           {expired} \
         FROM {table} WHERE published_at IS NULL{tail}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keeps_the_contracts_field_order() {
        let figures = Figures {
            pending: 3,
            due: 2,
            retrying: 1,
            dead: 4,
            oldest_pending_age_s: None,
            expired: 5,
            oldest_due_age_s: Some(5),
        };
        assert_eq!(
            figures.to_json().to_string(),
            r#"{"pending":3,"due":2,"retrying":1,"dead":4,"oldest_pending_age_s":null,"expired":5}"#
        );
    }
}
