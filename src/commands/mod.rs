//! The subcommands: `status`, `requeue`, `prune`, `migrate`, `wait`, and the
//! generated `completions` and `man`. Each needs PostgreSQL only (or
//! nothing), never the broker.

use anyhow::Result;
use postgres::Client;

use crate::config::Database;
use crate::connect::database;

pub mod generate;
pub mod migrate;
pub mod prune;
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
