//! `outbox-poll wait`: which events it waits for, and what is left of them.
//!
//! "Every event committed before it started" is the set of events visible
//! in the snapshot the wait takes first: an event is in it when its
//! producer's transaction (`producer_xid`, the commit-order horizon of the
//! ordered modes) is visible in that snapshot, or when it has no
//! producer_xid (inserted before the column existed: long committed). A
//! table without the column (never migrated for the ordered modes) falls
//! back to the highest id visible then, which waits for at least those
//! events (an event of a lower id committed later is waited for too).
//! Each look is one query over the pending index. An event past its
//! `expires_at` is never published, so it is not waited for either.

use anyhow::Result;
use postgres::Client;

use crate::sql::columns;
use crate::sql::names;
use crate::sql::table::TableName;
use crate::sql::table::classify_on_table;

/// The events the wait is for.
pub(crate) struct Horizon {
    before: Before,
    /// The table has expires_at: expired events are done, not left.
    expires_at: bool,
}

/// The condition of the horizon, with its parameter ($2).
enum Before {
    /// `pg_current_snapshot()` as text, taken when the wait started.
    Snapshot(String),
    /// The highest id visible when the wait started.
    MaxId(i64),
}

/// What is left of the events the wait is for.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Left {
    /// Unpublished and not dead.
    pub(crate) events: i64,
    /// Of them, available now (the others back off after a failure).
    pub(crate) due: i64,
    /// Whole seconds since the oldest was created (finite created_at only).
    pub(crate) oldest_age_s: Option<i64>,
}

const WHAT: &str = "reading what is left to publish";

/// Takes the horizon: now.
pub(crate) fn start(client: &mut Client, table: &TableName) -> Result<Horizon> {
    let columns = columns::of_table(client, table, WHAT)?.columns;
    let by_xid = columns.producer_xid;
    let sql = match by_xid {
        true => "SELECT pg_current_snapshot()::text".to_owned(),
        false => format!(
            "SELECT coalesce(max(id), 0)::bigint FROM {}",
            table.quoted()
        ),
    };
    let row = client
        .query_one(&*names::sql(&sql), &[])
        .map_err(|error| classify_on_table(&error, WHAT, table))?;
    let before = match by_xid {
        true => Before::Snapshot(row.get(0)),
        false => Before::MaxId(row.get(0)),
    };
    Ok(Horizon {
        before,
        expires_at: columns.expires_at,
    })
}

/// What is left of the events before `horizon`: neither published, dead
/// nor expired.
pub(crate) fn left(
    client: &mut Client,
    table: &TableName,
    horizon: &Horizon,
    max_attempts: i32,
) -> Result<Left> {
    let live = match horizon.expires_at {
        true => " AND (expires_at IS NULL OR expires_at > now())",
        false => "",
    };
    let select = |before: &str| {
        format!(
            "SELECT count(*), count(*) FILTER (WHERE available_at <= now()), \
               floor(extract(epoch FROM now() - min(created_at) \
                 FILTER (WHERE isfinite(created_at))))::bigint \
             FROM {} WHERE published_at IS NULL AND attempts < $1::int{live} AND {before}",
            table.quoted()
        )
    };
    let rows = match &horizon.before {
        Before::Snapshot(snapshot) => client.query(
            &*names::sql(&select(
                "(producer_xid IS NULL \
                  OR pg_visible_in_snapshot(producer_xid, $2::text::pg_snapshot))",
            )),
            &[&max_attempts, snapshot],
        ),
        Before::MaxId(max_id) => {
            client.query(&*names::sql(&select("id <= $2")), &[&max_attempts, max_id])
        }
    }
    .map_err(|error| classify_on_table(&error, WHAT, table))?;
    let row = &rows[0];
    Ok(Left {
        events: row.get(0),
        due: row.get(1),
        oldest_age_s: row.get(2),
    })
}
