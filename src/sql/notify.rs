//! The wake-up of `--follow`: the channel the table's notify trigger
//! (migrations/0004_notify.sql, installed by `migrate --notify`) sends to,
//! and whether the table has that trigger.

use anyhow::Result;
use postgres::Client;

use crate::sql::table::classify_on_table;
use crate::sql::table::{TableName, quote};

/// The channel as the trigger function names it ('outbox_poll_' || TG_RELID),
/// and whether the trigger is there and enabled.
const CHANNEL_SQL: &str = "SELECT 'outbox_poll_' || c.oid::text, \
       EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid \
               AND t.tgname = 'outbox_poll_notify' AND t.tgenabled <> 'D') \
     FROM pg_catalog.pg_class c WHERE c.oid = $1::text::regclass";

/// Whether producers' inserts announce themselves.
pub(crate) struct Listening {
    /// The table has the enabled notify trigger.
    pub(crate) notified: bool,
}

/// LISTENs on the table's channel, on this session, outside any
/// transaction (a LISTEN in a transaction would only start at its commit).
/// Without the trigger nothing will come, but the LISTEN costs nothing and
/// a trigger installed while the run follows starts waking it at once.
pub(crate) fn listen(client: &mut Client, table: &TableName) -> Result<Listening> {
    let what = "finding the table's notify channel";
    let row = client
        .query_one(CHANNEL_SQL, &[&table.quoted()])
        .map_err(|error| classify_on_table(&error, what, table))?;
    let channel: String = row.get(0);
    client
        .batch_execute(&format!("LISTEN {}", quote(&channel)))
        .map_err(|error| classify_on_table(&error, "listening for new events", table))?;
    Ok(Listening {
        notified: row.get(1),
    })
}
