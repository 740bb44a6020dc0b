//! `outbox-poll migrate`: create or upgrade the outbox table, in one
//! transaction, under an advisory lock so that two deploys migrating at
//! once do not collide. The SQL is in migrations/ (see `sql::migrations`).

use anyhow::Result;

use crate::cli::MigrateArgs;
use crate::config::Database;
use crate::connect::database::{classify, classify_on_table};
use crate::exit::Exit;
use crate::sql::migrations::{self, MIGRATIONS};

pub fn run(database: &Database, args: &MigrateArgs) -> Result<Exit> {
    let mut client = super::connect(database)?;
    let mut tx = client
        .transaction()
        .map_err(|error| classify(&error, "starting the migration", "try again"))?;
    // An index on a large table may take a while to build; the lock
    // timeout still keeps us from queueing behind a long transaction.
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = 0; {}",
        migrations::LOCK
    ))
    .map_err(|error| classify(&error, "taking the migration lock", "try again"))?;
    // Where a migration needs the table as a value (a regclass), it reads
    // it from this setting, given as a bind parameter: no name is ever
    // pasted into a string literal or a DO block (see sql::migrations).
    tx.execute(migrations::NAME_THE_TABLE, &[&database.table.quoted()])
        .map_err(|error| classify_on_table(&error, "naming the table", &database.table))?;
    if args.notify {
        tx.batch_execute(migrations::OPT_INTO_NOTIFY)
            .map_err(|error| classify(&error, "opting into the notify trigger", "try again"))?;
    }
    for (name, sql) in MIGRATIONS {
        tx.batch_execute(&migrations::for_table(sql, &database.table))
            .map_err(|error| {
                classify_on_table(&error, &format!("applying {name}"), &database.table)
            })?;
    }
    tx.commit()
        .map_err(|error| classify(&error, "committing the migration", "try again"))?;
    log::info!("table {} is up to date", database.table);
    Ok(Exit::Success)
}
