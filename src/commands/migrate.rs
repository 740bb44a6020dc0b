//! `outbox-poll migrate`: create or upgrade the outbox table, in one
//! transaction, under an advisory lock so that two deploys migrating at
//! once do not collide. The SQL is in migrations/ (see `sql::migrations`).

use anyhow::{Result, anyhow};
use postgres::Transaction;

use crate::cli::MigrateArgs;
use crate::config::Database;
use crate::connect::pg_error::classify;
use crate::exit::{self, Exit};
use crate::plan::Selection;
use crate::relay::many::most_urgent;
use crate::report::{stderr, stdout};
use crate::sql::adopt;
use crate::sql::columns::Catalog;
use crate::sql::migrations::{self, MIGRATIONS};
use crate::sql::names;
use crate::sql::table::TableName;
use crate::sql::table::classify_on_table;

pub fn run(database: &Database, args: &MigrateArgs) -> Result<Exit> {
    let report = migrate(database, args)?;
    stdout::line(&report).map_err(stdout::unwritable)?;
    Ok(Exit::Success)
}

/// `migrate` over the outboxes of a selection, one after the other: each
/// table a pattern matches, and each table the list names, created when
/// it is missing (a pattern matches only tables that exist: a new
/// tenant's table is created by naming it). One line per outbox, then the
/// count; an outbox that fails is named on stderr and the others go on.
/// The exit is the most urgent of theirs.
pub fn run_many(selection: &Selection, args: &MigrateArgs) -> Result<Exit> {
    let (all, plan) = super::each_to_create(selection)?;
    // Each migration opens its own session, in its own transaction.
    drop(plan);
    let (mut exits, mut migrated) = (Vec::new(), 0);
    for (database, name) in all {
        let migrated_one = database.and_then(|database| {
            let report = migrate(&database, args)?;
            Ok((crate::plan::label(&database.conninfo), report))
        });
        match migrated_one {
            Ok((label, report)) => {
                stdout::line(&format!("database {label}: {report}")).map_err(stdout::unwritable)?;
                migrated += 1;
                exits.push(Exit::Success);
            }
            Err(error) => {
                stderr::line(&format!("outbox-poll: error: database {name}: {error:#}"));
                exits.push(Exit::of(&error));
            }
        }
    }
    let failed = exits.len() - migrated;
    stdout::line(&format!(
        "{}: {migrated} migrated, {failed} failed",
        super::total_over(exits.len())
    ))
    .map_err(stdout::unwritable)?;
    Ok(most_urgent(exits.into_iter()))
}

/// Creates or upgrades the table; what it did, in one line.
fn migrate(database: &Database, args: &MigrateArgs) -> Result<String> {
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
    let before = Parts::of(&mut tx, &database.table)?;
    let adopted = match args.adopt {
        true => Some(adopt(&mut tx, &database.table)?),
        false => {
            refuse_a_foreign_table(&before, &database.table)?;
            None
        }
    };
    if args.notify {
        tx.batch_execute(migrations::OPT_INTO_NOTIFY)
            .map_err(|error| classify(&error, "opting into the notify trigger", "try again"))?;
    }
    // Adopt runs only the notify trigger's migration, which names no column.
    let migrations = MIGRATIONS
        .iter()
        .filter(|(name, _)| adopted.is_none() || *name == NOTIFY);
    for (name, sql) in migrations {
        tx.batch_execute(&migrations::for_table(sql, &database.table))
            .map_err(|error| {
                classify_on_table(&error, &format!("applying {name}"), &database.table)
            })?;
    }
    let after = Parts::of(&mut tx, &database.table)?;
    tx.commit()
        .map_err(|error| classify(&error, "committing the migration", "try again"))?;
    let mut report = before.report(&after, &database.table);
    if adopted.is_some_and(|plan| plan.rewrites) {
        report.push_str(&format!(
            " (the identity column {} rewrote the table: every row was given its number)",
            names::current().column("id")
        ));
    }
    Ok(report)
}

/// The migration `--adopt --notify` runs.
const NOTIFY: &str = "0004_notify.sql";

/// `--adopt`: adds what the table lacks (see `sql::adopt`), in the
/// migration's transaction. Plain CREATE INDEX, not CONCURRENTLY: that
/// cannot run in a transaction, and adopt is all or nothing. An operator
/// of a large table creates the indexes CONCURRENTLY beforehand, by the
/// names the docs give; adopt then finds them.
fn adopt(tx: &mut Transaction, table: &TableName) -> Result<adopt::Plan> {
    const WHAT: &str = "reading the table to adopt";
    let catalog = Catalog::of(tx, table, WHAT)?;
    let keys = tx
        .query_one(adopt::KEYS_SQL, &[&table.quoted()])
        .map_err(|error| classify_on_table(&error, WHAT, table))?;
    let found = adopt::Found {
        catalog,
        primary_key: keys.get(0),
        indexes: keys.get(1),
    };
    let plan = adopt::plan(table, names::current(), &found)?;
    for sql in &plan.statements {
        tx.batch_execute(sql)
            .map_err(|error| classify_on_table(&error, "adopting the table", table))?;
    }
    Ok(plan)
}

/// The columns of the reference article's table that the migrations do
/// not add: a table without one of them was made by its producers for
/// another shape, and running the migrations over it would add the
/// relay's columns and then fail halfway. Adopt is made for it.
const ARTICLE: [&str; 6] = [
    "id",
    "event_id",
    "event_type",
    "payload",
    "created_at",
    "published_at",
];

fn refuse_a_foreign_table(before: &Parts, table: &TableName) -> Result<()> {
    let missing: Vec<&str> = ARTICLE
        .into_iter()
        .filter(|column| !before.columns.iter().any(|have| have == column))
        .collect();
    if !before.exists || missing.is_empty() {
        return Ok(());
    }
    Err(exit::config(anyhow!(
        "table {table} was not created by outbox-poll (it has no column {}): adopt it with \
         `outbox-poll migrate --adopt --table {table}`, adding --column ROLE=NAME for the \
         columns that play the contract's roles under other names",
        missing.join(", ")
    )))
}

/// What the table has, read before and after the migrations so that
/// `migrate` can say what it did: a newcomer running it sees whether it
/// created the table, added columns, or found nothing to do.
struct Parts {
    exists: bool,
    columns: Vec<String>,
    /// Indexes and triggers, by name.
    others: Vec<String>,
}

impl Parts {
    fn of(tx: &mut Transaction, table: &TableName) -> Result<Parts> {
        let row = tx
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL, \
                        ARRAY(SELECT attname::text FROM pg_attribute \
                              WHERE attrelid = to_regclass($1) AND attnum > 0 \
                                AND NOT attisdropped ORDER BY attnum), \
                        ARRAY(SELECT 'index ' || indexrelid::regclass::text FROM pg_index \
                              WHERE indrelid = to_regclass($1) \
                              UNION ALL SELECT 'trigger ' || tgname::text FROM pg_trigger \
                              WHERE tgrelid = to_regclass($1) AND NOT tgisinternal)",
                &[&table.quoted()],
            )
            .map_err(|error| classify_on_table(&error, "reading the table's shape", table))?;
        Ok(Parts {
            exists: row.get(0),
            columns: row.get(1),
            others: row.get(2),
        })
    }

    fn report(&self, after: &Parts, table: &TableName) -> String {
        if !self.exists {
            return format!("created the table {table}");
        }
        let added_columns: Vec<&str> = after
            .columns
            .iter()
            .filter(|column| !self.columns.contains(column))
            .map(String::as_str)
            .collect();
        let mut added = Vec::new();
        if !added_columns.is_empty() {
            added.push(format!("the columns {}", added_columns.join(", ")));
        }
        for (kind, plural) in [("index ", "indexes"), ("trigger ", "triggers")] {
            let names: Vec<&str> = after
                .others
                .iter()
                .filter(|other| !self.others.contains(other))
                .filter_map(|other| other.strip_prefix(kind))
                .collect();
            if !names.is_empty() {
                added.push(format!("the {plural} {}", names.join(", ")));
            }
        }
        if added.is_empty() {
            format!("the table {table} is up to date: nothing to do")
        } else {
            format!("upgraded the table {table}: added {}", added.join("; "))
        }
    }
}
