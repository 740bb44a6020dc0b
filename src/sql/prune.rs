//! Deleting old rows: published ones older than a cut-off, and (with
//! --include-dead) dead ones created before it. $1 is always the age in
//! seconds. With --archive, each row deleted (or dropped with its
//! partition) is returned first as its archive line (`archived_row`).

use std::time::Duration;

use anyhow::{Result, anyhow};
use postgres::error::SqlState;
use postgres::{Client, Statement};

use crate::connect::pg_error::describe;
use crate::exit;
use crate::sql::columns::Payload;
use crate::sql::names;
use crate::sql::table::TableName;
use crate::sql::table::classify_on_table;

/// Which rows a pass deletes.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Published,
    Dead,
}

impl Kind {
    /// `max_attempts` is an integer clap has checked, safe to write as SQL.
    fn condition(self, max_attempts: i32) -> String {
        match self {
            Kind::Published => "published_at < now() - make_interval(secs => $1)".into(),
            Kind::Dead => format!(
                "published_at IS NULL AND attempts >= {max_attempts} \
                 AND created_at < now() - make_interval(secs => $1)"
            ),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Published => "published",
            Kind::Dead => "dead",
        }
    }
}

/// How many rows a prune would delete.
pub(crate) fn count(
    client: &mut Client,
    table: &TableName,
    kind: Kind,
    max_attempts: i32,
    age: Duration,
) -> Result<i64> {
    let row = client
        .query_one(
            &*names::sql(&format!(
                "SELECT count(*) FROM {} WHERE {}",
                table.quoted(),
                kind.condition(max_attempts)
            )),
            &[&age.as_secs_f64()],
        )
        .map_err(|error| classify_on_table(&error, "counting old events", table))?;
    Ok(row.get(0))
}

/// The delete of one batch, prepared: $1 the age in seconds, $2 the batch
/// size. The condition is checked again on the row itself: a dead event
/// requeued while this statement waited for its lock is pending again and
/// must not be deleted, and after such a wait PostgreSQL re-checks only the
/// outer condition, not the subquery's. (No SKIP LOCKED: that would need
/// UPDATE, which the pruner role need not have.) With `archive` (the
/// payload's type), the statement returns each deleted row's archive line.
pub(crate) fn prepare_delete(
    client: &mut Client,
    table: &TableName,
    kind: Kind,
    max_attempts: i32,
    archive: Option<Payload>,
) -> Result<Statement> {
    let returning = match archive {
        Some(payload) => format!(" RETURNING {}", archived_row(payload)),
        None => String::new(),
    };
    client
        .prepare(&names::sql(&format!(
            "DELETE FROM {t} AS t WHERE id IN ( \
               SELECT id FROM {t} WHERE {condition} ORDER BY id LIMIT $2) \
             AND {condition}{returning}",
            condition = kind.condition(max_attempts),
            t = table.quoted()
        )))
        .map_err(|error| privilege_error(&error, table))
}

/// Deletes one batch with the statement `prepare_delete` made; returns how
/// many rows went.
pub(crate) fn delete_batch(
    client: &mut Client,
    statement: &Statement,
    table: &TableName,
    age: Duration,
    batch_size: i64,
) -> Result<u64> {
    client
        .execute(statement, &[&age.as_secs_f64(), &batch_size])
        .map_err(|error| privilege_error(&error, table))
}

/// Deletes one batch with the archiving statement `prepare_delete` made,
/// in `transaction` (the caller commits once the lines are on disk), and
/// returns the deleted rows' archive lines.
pub(crate) fn delete_archived_batch(
    transaction: &mut postgres::Transaction<'_>,
    statement: &Statement,
    table: &TableName,
    age: Duration,
    batch_size: i64,
) -> Result<Vec<String>> {
    let rows = transaction
        .query(statement, &[&age.as_secs_f64(), &batch_size])
        .map_err(|error| privilege_error(&error, table))?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// The archive line of the row `t` (see the module `archive`): every
/// column as jsonb renders it, the payload under the key of its type.
/// The session's TimeZone is UTC, so every timestamp reads `+00:00`.
pub(crate) fn archived_row(payload: Payload) -> &'static str {
    match payload {
        Payload::Jsonb => "to_jsonb(t)::text",
        Payload::Json => {
            "((to_jsonb(t) - 'payload') || jsonb_build_object('payload_json', t.payload::text))::text"
        }
        Payload::Text => {
            "((to_jsonb(t) - 'payload') || jsonb_build_object('payload_text', t.payload::text))::text"
        }
        // PostgreSQL's base64 breaks lines every 76 characters.
        Payload::Bytea => {
            "((to_jsonb(t) - 'payload') || jsonb_build_object('payload_base64', \
               translate(encode(t.payload, 'base64'), E'\\n', '')))::text"
        }
    }
}

/// A missing DELETE grant is the likely mistake: say so by name.
fn privilege_error(error: &postgres::Error, table: &TableName) -> anyhow::Error {
    if error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        return exit::config(anyhow!(
            "prune needs the DELETE privilege on table {table} ({}): \
             GRANT SELECT, DELETE ON {} TO this role, or prune as a role that has it",
            describe(error),
            table.quoted()
        ));
    }
    classify_on_table(error, "deleting old events", table)
}
