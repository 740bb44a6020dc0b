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

use anyhow::Result;
use postgres::Client;

use crate::cli::PruneArgs;
use crate::config::Database;
use crate::connect::database;
use crate::exit::Exit;
use crate::guard::watchdog::{self, Watchdog};
use crate::report::totals::Totals;
use crate::report::{plural, stdout};
use crate::sql::prune::{self, Kind};

/// How long one batch may take. The server's usual 30 s bound is for the
/// relay's by-key statements; the last batch of a prune may have to scan
/// the whole table to find that nothing old is left, and it holds row locks
/// only on rows nobody else wants (published, or dead and old).
const BATCH_TIMEOUT: &str = "15min";
/// The watchdog's budget for one such statement (see guard/watchdog.rs).
const BATCH_BUDGET: Duration = Duration::from_secs(15 * 60 + 30);

pub fn run(database: &Database, json: bool, args: &PruneArgs) -> Result<Exit> {
    let watchdog = Watchdog::spawn(|_| {})?;
    watchdog.arm(
        database.connect_budget() + database::STATEMENT_TIMEOUT + watchdog::MARGIN,
        "connecting to PostgreSQL",
        Totals::default(),
    );
    let mut client = database::connect(
        &database.conninfo,
        database.connect_timeout,
        database.command_idle_limit(),
        None,
    )?;
    // Counting and deleting may scan the whole table (see BATCH_TIMEOUT).
    client
        .batch_execute(&format!("SET statement_timeout = '{BATCH_TIMEOUT}'"))
        .map_err(|error| {
            database::classify(&error, "setting the statement timeout", "try again")
        })?;
    let mut kinds = vec![Kind::Published];
    if args.include_dead {
        kinds.push(Kind::Dead);
    }
    let mut counts = Vec::new();
    for kind in kinds {
        let count = if args.dry_run {
            watchdog.arm(BATCH_BUDGET, "counting old events", Totals::default());
            let (table, max_attempts) = (&database.table, database.max_attempts);
            prune::count(&mut client, table, kind, max_attempts, args.older_than)?
        } else {
            delete(&mut client, database, kind, args, &watchdog)?
        };
        counts.push((kind, count));
    }
    tell(&counts, json, args)?;
    Ok(Exit::Success)
}

/// One line per kind of row, or the JSON object.
fn tell(counts: &[(Kind, i64)], json: bool, args: &PruneArgs) -> Result<()> {
    let text = if json {
        let object = serde_json::json!({
            "published": counts[0].1,
            "dead": counts.get(1).map(|(_, count)| count),
            "dry_run": args.dry_run,
        });
        format!("{object}\n")
    } else {
        let verb = if args.dry_run {
            "would delete"
        } else {
            "deleted"
        };
        let age = short_duration(args.older_than);
        counts
            .iter()
            .map(|(kind, count)| {
                let (name, s) = (kind.name(), plural(*count));
                format!("{verb} {count} {name} event{s} older than {age}\n")
            })
            .collect()
    };
    stdout::write(text.as_bytes()).map_err(stdout::unwritable)
}

/// Batch after batch, each statement its own transaction, until a batch
/// comes back short.
fn delete(
    client: &mut Client,
    database: &Database,
    kind: Kind,
    args: &PruneArgs,
    watchdog: &Watchdog,
) -> Result<i64> {
    let table = &database.table;
    let statement = prune::prepare_delete(client, table, kind, database.max_attempts)?;
    let mut total = 0;
    loop {
        watchdog.arm(BATCH_BUDGET, "a prune batch", Totals::default());
        let deleted =
            prune::delete_batch(client, &statement, table, args.older_than, args.batch_size)?
                as i64;
        total += deleted;
        log::info!("pruned {deleted} {} events (total {total})", kind.name());
        if deleted < args.batch_size {
            return Ok(total);
        }
    }
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
