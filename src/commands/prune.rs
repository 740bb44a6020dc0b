//! `outbox-poll prune`: delete published events older than --older-than,
//! --batch-size rows per transaction, so no lock is held for long and the
//! relay and producers never wait behind it. Dead events are kept (they
//! are evidence) unless --include-dead, which deletes those created before
//! the same cut-off. --dry-run only counts.
//!
//! On a table partitioned by range on created_at, published rows go first
//! by whole partitions: each partition whose range ends before the cut-off
//! and whose rows were all published before it is detached and dropped
//! (see `sql::partitions`), which returns its space at once; the rows left
//! are then deleted batch by batch. The detach never makes the producers
//! wait: concurrent where PostgreSQL allows it, else under a lock taken
//! for at most 50 ms at a time.
//!
//! `--json` prints `{"published": N, "dead": N or null, "dry_run": bool,
//! "partitions_dropped": [NAME, ...]}`: the rows deleted (or, with
//! --dry-run, that would be; those of dropped partitions included), dead
//! ones null without --include-dead, and the partitions dropped (or that
//! would be).
//!
//! Needs SELECT and DELETE on the table; without DELETE it stops at the
//! first batch with one line saying so (exit 78). Dropping partitions
//! needs the table's owner; under any other role prune deletes row by row.

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
use crate::sql::columns;
use crate::sql::partitions::{self, Dropped, Refusal};
use crate::sql::prune::{self, Kind};
use crate::sql::table::TableName;

/// How long one batch may take. The server's usual 30 s bound is for the
/// relay's statements by primary key; the last batch of a prune may have to scan
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
    let mut client = super::connect(database)?;
    // Counting and deleting may scan the whole table (see BATCH_TIMEOUT).
    client
        .batch_execute(&format!("SET statement_timeout = '{BATCH_TIMEOUT}'"))
        .map_err(|error| {
            database::classify(&error, "setting the statement timeout", "try again")
        })?;
    columns::check_mapping(&mut client, &database.table, "pruning")?;
    let mut kinds = vec![Kind::Published];
    if args.include_dead {
        kinds.push(Kind::Dead);
    }
    let dropped = drop_partitions(&mut client, database, args, &watchdog)?;
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
    // The count of a dry run already holds the rows of the partitions it
    // would drop; a prune deleted the rest after dropping them.
    if !args.dry_run {
        counts[0].1 += dropped.rows;
    }
    tell(&counts, &dropped.names, json, args)?;
    Ok(Exit::Success)
}

/// The partitions dropped whole (with --dry-run: that would be), and the
/// published events they held.
#[derive(Default)]
struct DroppedPartitions {
    names: Vec<String>,
    rows: i64,
}

/// How long prune keeps retrying a partition it must detach under the
/// table's lock (a DEFAULT partition, or PostgreSQL before 14), each try
/// waiting at most 50 ms (sql::partitions::DETACH_LOCK_TIMEOUT), before it
/// keeps the partition and deletes its rows instead.
const LOCKED_DETACH_RETRIES: Duration = Duration::from_secs(60);
/// The pause between two such tries: producers get the table between them.
const LOCKED_DETACH_PAUSE: Duration = Duration::from_millis(200);

/// Drops every partition prune may drop; nothing on a table that is not
/// partitioned by created_at, or under a role that does not own it. First
/// finishes any detach an interrupted prune left pending. A partition is
/// detached concurrently where PostgreSQL allows it (waiting, without
/// blocking anyone, for the transactions that still see it), otherwise
/// under the table's lock taken for at most 50 ms at a time, retried. A
/// partition where an unpublished event turned up is kept; so is one the
/// table's traffic kept locked through every retry: its published rows go
/// row by row with the rest.
fn drop_partitions(
    client: &mut Client,
    database: &Database,
    args: &PruneArgs,
    watchdog: &Watchdog,
) -> Result<DroppedPartitions> {
    let table = &database.table;
    let age = args.older_than;
    watchdog.arm(BATCH_BUDGET, "listing partitions", Totals::default());
    let candidates = match partitions::candidates(client, table, age)? {
        Ok(candidates) => candidates,
        Err(Refusal::NotPartitioned) => return Ok(DroppedPartitions::default()),
        Err(Refusal::NotOwner) => {
            log::info!(
                "table {table} is partitioned, but this role does not own it: pruning row by \
                 row (prune as the owner to drop old partitions whole)"
            );
            return Ok(DroppedPartitions::default());
        }
    };
    let mut dropped = DroppedPartitions::default();
    if !args.dry_run {
        finish_pending_detaches(client, table, age, watchdog, &mut dropped)?;
    }
    let concurrently = partitions::concurrent_detach(client, table)?;
    for partition in candidates {
        watchdog.arm(BATCH_BUDGET, "reading a partition", Totals::default());
        let Some(rows) = partitions::droppable_rows(client, table, &partition, age)? else {
            continue;
        };
        if !args.dry_run {
            watchdog.arm(BATCH_BUDGET, "dropping a partition", Totals::default());
            let outcome = if concurrently {
                let bound = partitions::bound(client, table, &partition)?;
                match partitions::detach_concurrently(client, table, &partition)? {
                    true => partitions::drop_detached(client, table, &partition, &bound, age)?,
                    false => Dropped::Busy,
                }
            } else {
                detach_locked(client, table, &partition, rows)?
            };
            match outcome {
                Dropped::Dropped(rows) => log::info!("dropped partition {partition} ({rows} rows)"),
                Dropped::Kept => {
                    log::warn!("partition {partition} received an unpublished event: kept");
                    continue;
                }
                Dropped::Busy => {
                    log::warn!(
                        "partition {partition} of table {table} is kept for now: the table \
                         stayed locked by other transactions (a concurrent detach is left \
                         pending, for the next prune to finish); its other rows are pruned \
                         row by row"
                    );
                    continue;
                }
            }
        }
        dropped.names.push(partition.to_string());
        dropped.rows += rows;
    }
    Ok(dropped)
}

/// A concurrent detach a signal or a lost connection interrupted leaves
/// the partition detaching, unseen by the table's queries: FINALIZE it,
/// then drop it if prune may (its range is old and its rows published
/// before the cut-off), otherwise attach it again so none of its events
/// leaves the outbox.
fn finish_pending_detaches(
    client: &mut Client,
    table: &TableName,
    age: Duration,
    watchdog: &Watchdog,
    dropped: &mut DroppedPartitions,
) -> Result<()> {
    for (partition, old) in partitions::pending_detaches(client, table, age)? {
        watchdog.arm(BATCH_BUDGET, "finishing a detach", Totals::default());
        let bound = partitions::bound(client, table, &partition)?;
        if !partitions::finalize(client, table, &partition)? {
            log::warn!(
                "partition {partition} of table {table} is still detaching: transactions that \
                 see it stayed open; the next prune finishes it"
            );
            continue;
        }
        log::info!("finished the pending detach of partition {partition}");
        let outcome = match old {
            true => partitions::drop_detached(client, table, &partition, &bound, age)?,
            false => {
                partitions::attach(client, table, &partition, &bound)?;
                Dropped::Kept
            }
        };
        match outcome {
            Dropped::Dropped(rows) => {
                log::info!("dropped partition {partition} ({rows} rows)");
                dropped.names.push(partition.to_string());
                dropped.rows += rows;
            }
            _ => log::warn!("partition {partition} holds events prune keeps: attached again"),
        }
    }
    Ok(())
}

/// Detach under the table's lock, retried for LOCKED_DETACH_RETRIES while
/// the table stays busy.
fn detach_locked(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
    rows: i64,
) -> Result<Dropped> {
    let deadline = std::time::Instant::now() + LOCKED_DETACH_RETRIES;
    loop {
        let outcome = partitions::detach_and_drop(client, table, partition, rows)?;
        if outcome != Dropped::Busy || std::time::Instant::now() >= deadline {
            return Ok(outcome);
        }
        log::debug!("partition {partition}: the table is busy, trying again");
        std::thread::sleep(LOCKED_DETACH_PAUSE);
    }
}

/// One line per kind of row and one for the partitions dropped, or the
/// JSON object.
fn tell(counts: &[(Kind, i64)], dropped: &[String], json: bool, args: &PruneArgs) -> Result<()> {
    let text = if json {
        let object = serde_json::json!({
            "published": counts[0].1,
            "dead": counts.get(1).map(|(_, count)| count),
            "dry_run": args.dry_run,
            "partitions_dropped": dropped,
        });
        format!("{object}\n")
    } else {
        let (verb, drop) = match args.dry_run {
            true => ("would delete", "would drop"),
            false => ("deleted", "dropped"),
        };
        let age = short_duration(args.older_than);
        let mut text: String = counts
            .iter()
            .map(|(kind, count)| {
                let (name, s) = (kind.name(), plural(*count));
                format!("{verb} {count} {name} event{s} older than {age}\n")
            })
            .collect();
        if !dropped.is_empty() {
            let (count, s) = (dropped.len(), plural(dropped.len()));
            let names = dropped.join(", ");
            text.push_str(&format!("{drop} {count} partition{s} whole: {names}\n"));
        }
        text
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
