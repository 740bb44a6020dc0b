//! The wake-up of `--follow`: the channel the table's notify trigger
//! (migrations/0004_notify.sql, installed by `migrate --notify`) sends to,
//! and whether the table has that trigger.

use anyhow::{Context, Result};
use postgres::Client;

use crate::sql::table::classify_on_table;
use crate::sql::table::{TableName, quote};

/// The channel as the trigger function names it ('outbox_poll_' || TG_RELID),
/// and whether the trigger is there and enabled.
const CHANNEL_SQL: &str = "SELECT 'outbox_poll_' || c.oid::text, \
       EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid \
               AND t.tgname = 'outbox_poll_notify' AND t.tgenabled <> 'D') \
     FROM pg_catalog.pg_class c WHERE c.oid = $1::text::regclass";

/// The channel and the trigger of each of many tables, in their order:
/// one statement for all of them.
const CHANNELS_SQL: &str = "SELECT 'outbox_poll_' || c.oid::text, \
       EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid \
               AND t.tgname = 'outbox_poll_notify' AND t.tgenabled <> 'D') \
     FROM unnest($1::text[]) WITH ORDINALITY AS n(name, at) \
     JOIN pg_catalog.pg_class c ON c.oid = n.name::regclass ORDER BY n.at";

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

/// One of many tables a session listens for.
pub(crate) struct Channel {
    /// The channel its trigger sends to.
    pub(crate) name: String,
    /// The table has the enabled notify trigger.
    pub(crate) notified: bool,
}

/// LISTENs, on this session and outside any transaction, on the channel
/// of each of `tables` (of one database): two statements, however many
/// tables. As with `listen`, a table without the trigger is listened for
/// too: a trigger installed while the run follows starts waking it.
pub(crate) fn listen_all(client: &mut Client, tables: &[TableName]) -> Result<Vec<Channel>> {
    let names: Vec<String> = tables.iter().map(TableName::quoted).collect();
    let rows = client
        .query(CHANNELS_SQL, &[&names])
        .context("finding the tables' notify channels")?;
    let channels: Vec<Channel> = rows
        .iter()
        .map(|row| Channel {
            name: row.get(0),
            notified: row.get(1),
        })
        .collect();
    let listens: Vec<String> = channels
        .iter()
        .map(|channel| format!("LISTEN {};", quote(&channel.name)))
        .collect();
    client
        .batch_execute(&listens.concat())
        .context("listening for new events")?;
    Ok(channels)
}
