//! The subcommands: `status`, `requeue`, `prune`, `migrate`, `wait`,
//! `check`, `replay`, and the generated `completions` and `man`. Each
//! needs PostgreSQL only (or nothing), never the broker, but `check`,
//! which looks at both servers, and `replay`, which needs the broker only,
//! never PostgreSQL.

use anyhow::Result;
use postgres::Client;

use crate::config::Database;
use crate::connect::conninfo::ConnInfo;
use crate::connect::database;
use crate::plan::{Plan, Selection};

pub mod check;
pub mod generate;
pub mod migrate;
pub mod prune;
pub mod replay;
pub mod requeue;
pub mod status;
pub mod wait;

/// A subcommand's session: bounded by --connect-timeout, idle at most the
/// command's limit. A subcommand installs no signal handler: a signal ends
/// it at once and PostgreSQL rolls back what it had not committed, so no
/// wait listens for one.
fn connect(database: &Database) -> Result<Client> {
    database::connect(
        &database.conninfo,
        database.connect_timeout,
        database.command_idle_limit(),
        None,
    )
}

/// The selection resolved for a subcommand, its sessions opened as a
/// subcommand's are.
pub(crate) fn plan(selection: &Selection) -> Result<Plan> {
    let connect = |info: &ConnInfo| {
        database::connect(
            info,
            selection.connect_timeout,
            crate::config::IDLE_MARGIN + selection.connect_timeout,
            None,
        )
    };
    selection.plan(false, &connect)
}

/// One outbox of a selection for a subcommand: its Database or why it
/// could not be read, and its name for messages.
pub(crate) type Each = (Result<Database>, String);

/// Each outbox of a selection, as a subcommand serves it: its Database,
/// or why it could not be read (a database down, a listed table missing),
/// each with its name for messages (database and table, never a
/// password). The sessions the plan opened are handed back with them.
pub fn each(selection: &Selection) -> Result<(Vec<Each>, Plan)> {
    outboxes(selection, false)
}

/// As `each`, but a listed table that is missing is an outbox to serve
/// like the others: what `migrate` creates.
pub(crate) fn each_to_create(selection: &Selection) -> Result<(Vec<Each>, Plan)> {
    outboxes(selection, true)
}

fn outboxes(selection: &Selection, missing_too: bool) -> Result<(Vec<Each>, Plan)> {
    let mut plan = plan(selection)?;
    let mut all = Vec::new();
    for unread in plan.unread.drain(..) {
        let name = match &unread.table {
            Some(table) => format!("{}, table {table}", unread.label),
            None => unread.label,
        };
        let database = match unread.missing {
            Some((server, table)) if missing_too => Ok(selection.database(server, table)),
            _ => Err(unread.error),
        };
        all.push((database, name));
    }
    for planned in &plan.outboxes {
        let name = format!("{}, table {}", planned.label, planned.database.table);
        all.push((Ok(planned.database.clone()), name));
    }
    Ok((all, plan))
}

/// One outbox's object in the `outboxes` of a subcommand's `--json`
/// over a selection: its database (host, port, name: never a password)
/// and table, then its own fields.
pub(crate) fn outbox_json(database: &Database, fields: &serde_json::Value) -> serde_json::Value {
    let mut one = serde_json::json!({
        "database": crate::plan::label(&database.conninfo),
        "table": database.table.to_string(),
    });
    for (key, value) in fields.as_object().into_iter().flatten() {
        one[key] = value.clone();
    }
    one
}

/// "total over 3 outboxes", the last line of a subcommand's text over a
/// selection.
pub(crate) fn total_over(outboxes: usize) -> String {
    format!("total over {outboxes} outbox(es)")
}
