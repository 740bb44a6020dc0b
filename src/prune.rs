//! `outbox-poll prune`: delete published events older than --older-than,
//! --batch-size rows per transaction, so no lock is held for long and the
//! relay and producers never wait behind it. Dead events are kept (they
//! are evidence) unless --include-dead, which deletes those created before
//! the same cut-off. --dry-run only counts.
//!
//! `--json` prints `{"published": N, "dead": N or null, "dry_run": bool}`:
//! the rows deleted (or, with --dry-run, that would be), dead ones null
//! without --include-dead.
//!
//! Needs SELECT and DELETE on the table; without DELETE it stops at the
//! first batch with one line saying so (exit 78).

use std::time::Duration;

use anyhow::{Result, anyhow};
use postgres::Client;
use postgres::error::SqlState;

use crate::batch::Totals;
use crate::cli::PruneArgs;
use crate::config::Database;
use crate::db;
use crate::exit;
use crate::status::plural;
use crate::table::TableName;
use crate::watchdog::{self, Watchdog};

/// How long one batch may take. The server's usual 30 s bound is for the
/// relay's by-key statements; the last batch of a prune may have to scan
/// the whole table to find that nothing old is left, and it holds row locks
/// only on rows nobody else wants (published, or dead and old).
const BATCH_TIMEOUT: &str = "15min";
/// The watchdog's budget for one such statement (see watchdog.rs).
const BATCH_BUDGET: Duration = Duration::from_secs(15 * 60 + 30);

/// Which rows one pass deletes. $1: the age in seconds.
#[derive(Clone, Copy)]
enum Kind {
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

    fn name(self) -> &'static str {
        match self {
            Kind::Published => "published",
            Kind::Dead => "dead",
        }
    }
}

pub fn run(database: &Database, json: bool, args: &PruneArgs) -> Result<u8> {
    let watchdog = Watchdog::start(|_| {})?;
    watchdog.arm(
        database.connect_timeout + db::STATEMENT_TIMEOUT + watchdog::MARGIN,
        "connecting to PostgreSQL",
        Totals::default(),
    );
    let mut client = db::connect(
        &database.config,
        database.connect_timeout,
        database.idle_limit(),
    )?;
    // Counting and deleting may scan the whole table (see BATCH_TIMEOUT).
    client
        .batch_execute(&format!("SET statement_timeout = '{BATCH_TIMEOUT}'"))
        .map_err(|error| db::classify(&error, "setting the statement timeout", "try again"))?;
    let age = short_duration(args.older_than);
    let mut kinds = vec![Kind::Published];
    if args.include_dead {
        kinds.push(Kind::Dead);
    }
    let mut counts = Vec::new();
    for kind in kinds {
        let count = if args.dry_run {
            watchdog.arm(BATCH_BUDGET, "counting old events", Totals::default());
            count(&mut client, database, kind, args.older_than)?
        } else {
            delete(&mut client, database, kind, args, &watchdog)?
        };
        if !json {
            let verb = if args.dry_run {
                "would delete"
            } else {
                "deleted"
            };
            println!(
                "{verb} {count} {} event{} older than {age}",
                kind.name(),
                plural(count)
            );
        }
        counts.push(count);
    }
    if json {
        println!(
            "{}",
            serde_json::json!({
                "published": counts[0],
                "dead": counts.get(1),
                "dry_run": args.dry_run,
            })
        );
    }
    Ok(exit::SUCCESS)
}

fn count(client: &mut Client, database: &Database, kind: Kind, age: Duration) -> Result<i64> {
    let table = &database.table;
    let row = client
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE {}",
                table.quoted(),
                kind.condition(database.max_attempts)
            ),
            &[&age.as_secs_f64()],
        )
        .map_err(|error| db::classify_on_table(&error, "counting old events", table))?;
    Ok(row.get(0))
}

/// Batch after batch, each statement its own transaction, until a batch
/// comes back short. The condition is checked again on the row itself: a
/// dead event requeued while this statement waited for its lock is pending
/// again and must not be deleted, and after such a wait PostgreSQL re-checks
/// only the outer condition, not the subquery's. (No SKIP LOCKED: that
/// would need UPDATE, which the pruner role need not have.)
fn delete(
    client: &mut Client,
    database: &Database,
    kind: Kind,
    args: &PruneArgs,
    watchdog: &Watchdog,
) -> Result<i64> {
    let table = &database.table;
    let statement = client
        .prepare(&format!(
            "DELETE FROM {t} WHERE id IN ( \
               SELECT id FROM {t} WHERE {condition} ORDER BY id LIMIT $2) \
             AND {condition}",
            condition = kind.condition(database.max_attempts),
            t = table.quoted()
        ))
        .map_err(|error| privilege_error(&error, table))?;
    let mut total = 0;
    loop {
        watchdog.arm(BATCH_BUDGET, "a prune batch", Totals::default());
        let deleted = client
            .execute(
                &statement,
                &[&args.older_than.as_secs_f64(), &args.batch_size],
            )
            .map_err(|error| privilege_error(&error, table))? as i64;
        total += deleted;
        log::info!("pruned {deleted} {} events (total {total})", kind.name());
        if deleted < args.batch_size {
            return Ok(total);
        }
    }
}

/// A missing DELETE grant is the likely mistake: say so by name.
fn privilege_error(error: &postgres::Error, table: &TableName) -> anyhow::Error {
    if error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        return exit::config(anyhow!(
            "prune needs the DELETE privilege on table {table} ({}): \
             GRANT SELECT, DELETE ON {} TO this role, or prune as a role that has it",
            db::describe(error),
            table.quoted()
        ));
    }
    db::classify_on_table(error, "deleting old events", table)
}

/// 604800 s as `7d`, 90 s as `90s`: the largest whole unit.
pub fn short_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    if duration.subsec_nanos() != 0 || secs == 0 {
        return format!("{}ms", duration.as_millis());
    }
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if secs.is_multiple_of(size) {
            return format!("{}{unit}", secs / size);
        }
    }
    format!("{secs}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_in_their_largest_whole_unit() {
        let cases = [
            (604_800_000, "7d"),
            (7_200_000, "2h"),
            (90_000, "90s"),
            (300_000, "5m"),
            (1_500, "1500ms"),
        ];
        for (millis, text) in cases {
            assert_eq!(short_duration(Duration::from_millis(millis)), text);
        }
    }
}
