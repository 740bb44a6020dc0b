//! Making events eligible again: attempts back to 0, last_error cleared,
//! due now. Only unpublished rows are touched, so requeueing never re-sends
//! an event the broker already confirmed.

use anyhow::Result;
use postgres::Client;

use crate::connect::database::classify_on_table;
use crate::sql::table::TableName;

const RESET: &str = "attempts = 0, last_error = NULL, available_at = now()";

/// What became of one named event id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    Requeued,
    AlreadyPublished,
    Unknown,
}

/// Requeues every dead event; returns how many.
pub fn dead(client: &mut Client, table: &TableName, max_attempts: i32) -> Result<u64> {
    client
        .execute(
            &format!(
                "UPDATE {} SET {RESET} WHERE published_at IS NULL AND attempts >= $1::int",
                table.quoted()
            ),
            &[&max_attempts],
        )
        .map_err(|error| classify_on_table(&error, "requeueing", table))
}

/// Requeues the named events (each once, in id order) and says what became
/// of each: one statement for the update and the report.
pub fn by_event_id(
    client: &mut Client,
    table: &TableName,
    event_ids: &[&str],
) -> Result<Vec<(String, Named)>> {
    let rows = client
        .query(
            &format!(
                "WITH requeued AS ( \
                   UPDATE {t} SET {RESET} \
                   WHERE event_id = ANY($1) AND published_at IS NULL \
                   RETURNING event_id) \
                 SELECT w.id, r.event_id IS NOT NULL, o.event_id IS NOT NULL \
                 FROM unnest($1::text[]) AS w(id) \
                 LEFT JOIN requeued r ON r.event_id = w.id \
                 LEFT JOIN {t} o ON o.event_id = w.id \
                 ORDER BY w.id",
                t = table.quoted()
            ),
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
