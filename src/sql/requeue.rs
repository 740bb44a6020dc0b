//! Making events eligible again: attempts back to 0, last_error cleared,
//! due now. Only unpublished rows are touched, so requeueing never re-sends
//! an event the broker already confirmed.

use anyhow::Result;
use postgres::Client;

use crate::sql::names;
use crate::sql::table::TableName;
use crate::sql::table::classify_on_table;

const RESET: &str = "attempts = 0, last_error = NULL, available_at = now()";

/// What became of one named event id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Named {
    Requeued,
    AlreadyPublished,
    Unknown,
}

/// Requeues every dead event; returns how many.
pub(crate) fn dead(client: &mut Client, table: &TableName, max_attempts: i32) -> Result<u64> {
    client
        .execute(
            &*names::sql(&format!(
                "UPDATE {} SET {RESET} WHERE published_at IS NULL AND attempts >= $1::int",
                table.quoted()
            )),
            &[&max_attempts],
        )
        .map_err(|error| classify_on_table(&error, "requeueing", table))
}

/// Requeues the named events (each once, in id order) and says what became
/// of each: one statement for the update and the report.
pub(crate) fn by_event_id(
    client: &mut Client,
    table: &TableName,
    event_ids: &[&str],
) -> Result<Vec<(String, Named)>> {
    // A mapped event_id may be of any type with a text form (a uuid):
    // the ids given are text, so it is compared as text. The plain
    // table's text column keeps its statement, and its index.
    let (event_id, returned) = match names::current().is_plain() {
        true => ("event_id", "event_id"),
        false => ("event_id::text", "event_id::text AS event_id"),
    };
    let rows = client
        .query(
            &*names::sql(&format!(
                "WITH requeued AS ( \
                   UPDATE {t} SET {RESET} \
                   WHERE {event_id} = ANY($1) AND published_at IS NULL \
                   RETURNING {returned}) \
                 SELECT w.id, r.event_id IS NOT NULL, o.event_id IS NOT NULL \
                 FROM unnest($1::text[]) AS w(id) \
                 LEFT JOIN requeued r ON r.event_id = w.id \
                 LEFT JOIN {t} o ON o.{event_id} = w.id \
                 ORDER BY w.id",
                t = table.quoted()
            )),
            &[&event_ids],
        )
        .map_err(|error| classify_on_table(&error, "requeueing", table))?;
    Ok(rows
        .iter()
        .map(|row| {
            let named = match (row.get::<_, bool>(1), row.get::<_, bool>(2)) {
                (true, _) => Named::Requeued,
                (false, true) => Named::AlreadyPublished,
                (false, false) => Named::Unknown,
            };
            (row.get(0), named)
        })
        .collect())
}

/// Requeues the head of each named ordering key, its first event still to
/// publish in the claim's order, when that head has failed (attempts > 0):
/// the key's events go again from there. Says which keys had no failed
/// head (each once, in key order). One statement.
pub(crate) fn by_key(
    client: &mut Client,
    table: &TableName,
    keys: &[&str],
    max_attempts: i32,
    by_xid: bool,
) -> Result<(u64, Vec<String>)> {
    let order = match by_xid {
        true => "producer_xid, id",
        false => "id",
    };
    let rows = client
        .query(
            &*names::sql(&format!(
                "WITH heads AS ( \
                   SELECT k.key, ( \
                     SELECT id FROM {t} WHERE ordering_key = k.key AND published_at IS NULL \
                       AND attempts < $2::int ORDER BY {order} LIMIT 1) AS id \
                   FROM unnest($1::text[]) AS k(key)), \
                 requeued AS ( \
                   UPDATE {t} SET {RESET} \
                   WHERE id IN (SELECT id FROM heads) AND published_at IS NULL \
                     AND attempts > 0 AND attempts < $2::int \
                   RETURNING id) \
                 SELECT h.key, r.id IS NOT NULL FROM heads h \
                 LEFT JOIN requeued r ON r.id = h.id ORDER BY h.key",
                t = table.quoted()
            )),
            &[&keys, &max_attempts],
        )
        .map_err(|error| classify_on_table(&error, "requeueing", table))?;
    let requeued = rows.iter().filter(|row| row.get::<_, bool>(1)).count() as u64;
    let not_held = rows
        .iter()
        .filter(|row| !row.get::<_, bool>(1))
        .map(|row| row.get(0))
        .collect();
    Ok((requeued, not_held))
}
