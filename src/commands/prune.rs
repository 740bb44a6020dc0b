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
//! for at most 25 ms at a time.
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
//!
//! `--archive FILE` writes every row first (see the module `archive`):
//! each batch is deleted with RETURNING in a transaction, its rows written
//! as one member of the archive and synced (file, and the directory at
//! creation), and only then committed; a partition's rows are written and
//! synced after its detach and before its drop (attached again if that
//! fails). So a failed write, a full disk or a crash never deletes a row
//! that is not on disk; an interrupted run may leave the rows of its last
//! batch archived but not deleted, and the next prune archives them again:
//! a row may appear in two archives, never be deleted unarchived. A
//! partition that can only be detached under the table's lock (a DEFAULT
//! partition, PostgreSQL before 14) is pruned row by row with --archive:
//! writing its rows under that lock would stall the producers.

use std::time::Duration;

use anyhow::Result;
use postgres::Client;

use crate::archive::writer::Writer;
use crate::cli::PruneArgs;
use crate::config::Database;
use crate::connect::database;
use crate::connect::pg_error;
use crate::exit::Exit;
use crate::guard::watchdog::{self, Watchdog};
use crate::plan::Selection;
use crate::relay::many::most_urgent;
use crate::report::stderr;
use crate::report::totals::Totals;
use crate::report::{plural, stdout};
use crate::sql::columns::{self, Payload};
use crate::sql::partitions::{self, DropOutcome, Refusal};
use crate::sql::prune::{self, Kind};
use crate::sql::table::TableName;

/// How long one batch may take. The server's usual 30 s bound is for the
/// relay's statements by primary key; the last batch of a prune may have to scan
/// the whole table to find that nothing old is left, and it holds row locks
/// only on rows nobody else wants (published, or dead and old).
const BATCH_TIMEOUT: &str = "15min";
/// The watchdog's budget for one such statement (see guard/watchdog.rs).
const BATCH_BUDGET: Duration = Duration::from_secs(15 * 60 + 30);

/// Runs `prune` with its archive, when --archive names one: created
/// (never over an existing file) before anything is deleted, shared by
/// every outbox `prune` serves, and ended after them. A dry run archives
/// nothing and creates no file.
pub fn archived(
    args: &PruneArgs,
    prune: impl FnOnce(Option<&mut Writer>) -> Result<Exit>,
) -> Result<Exit> {
    let path = match (&args.archive, args.dry_run) {
        (Some(path), false) => path,
        _ => return prune(None),
    };
    let mut writer = Writer::create(path)?;
    let exit = prune(Some(&mut writer)).inspect_err(|_| writer.discard_unsynced())?;
    writer.finish()?;
    Ok(exit)
}

/// Where one outbox's rows are archived: the writer, and how its rows are
/// written (by the payload's type).
struct Archive<'a> {
    writer: &'a mut Writer,
    payload: Payload,
}

pub fn run(
    database: &Database,
    json: bool,
    args: &PruneArgs,
    archive: Option<&mut Writer>,
) -> Result<Exit> {
    let to_stderr = archive.as_ref().is_some_and(|writer| writer.is_stdout());
    let watchdog = Watchdog::spawn(|_| {})?;
    let pruned = prune(database, args, &watchdog, archive)?;
    let text = match json {
        true => format!("{}\n", pruned.to_json(args)),
        false => pruned.text(args),
    };
    tell(&text, to_stderr)?;
    Ok(Exit::Success)
}

/// `prune` over the outboxes of a selection, one after the other, every
/// row archived to the one archive: one summary, the totals and (with
/// `--json`, more than one outbox pruned) `outboxes`, each with its
/// database and table. An outbox that fails is named on stderr and the
/// others go on; the exit is the most urgent of theirs.
pub fn run_many(
    selection: &Selection,
    json: bool,
    args: &PruneArgs,
    mut archive: Option<&mut Writer>,
) -> Result<Exit> {
    let to_stderr = archive.as_ref().is_some_and(|writer| writer.is_stdout());
    let (all, plan) = super::each(selection)?;
    // Each outbox is pruned on a session of its own, set for long batches.
    drop(plan);
    let watchdog = Watchdog::spawn(|_| {})?;
    let (mut each, mut exits) = (Vec::new(), Vec::new());
    for (database, name) in all {
        let pruned = database.and_then(|database| {
            let pruned = prune(&database, args, &watchdog, archive.as_deref_mut())?;
            Ok((database, pruned))
        });
        match pruned {
            Ok((database, pruned)) => {
                exits.push(Exit::Success);
                each.push((name, database, pruned));
            }
            Err(error) => {
                stderr::line(&format!("outbox-poll: error: database {name}: {error:#}"));
                exits.push(Exit::of(&error));
            }
        }
    }
    watchdog.disarm();
    let total = Pruned::sum(each.iter().map(|(_, _, pruned)| pruned));
    let text = match json {
        true => {
            let mut object = total.to_json(args);
            if each.len() > 1 {
                let outboxes: Vec<serde_json::Value> = each
                    .iter()
                    .map(|(_, database, pruned)| {
                        let mut fields = pruned.to_json(args);
                        // The run's own, said once at the top.
                        if let Some(fields) = fields.as_object_mut() {
                            fields.remove("dry_run");
                        }
                        super::outbox_json(database, &fields)
                    })
                    .collect();
                object["outboxes"] = outboxes.into();
            }
            format!("{object}\n")
        }
        false => {
            let mut text = String::new();
            for (name, _, pruned) in &each {
                for line in pruned.text(args).lines() {
                    text.push_str(&format!("{name}: {line}\n"));
                }
            }
            for line in total.text(args).lines() {
                text.push_str(&format!("{}: {line}\n", super::total_over(each.len())));
            }
            text
        }
    };
    tell(&text, to_stderr)?;
    Ok(most_urgent(exits.into_iter()))
}

/// What prune did to one outbox (or, summed, to many).
#[derive(Default)]
struct Pruned {
    /// Published rows deleted, then (with --include-dead) dead ones.
    counts: Vec<(Kind, i64)>,
    /// The partitions dropped whole.
    dropped: Vec<String>,
}

impl Pruned {
    fn sum<'a>(all: impl Iterator<Item = &'a Pruned>) -> Pruned {
        let mut total = Pruned::default();
        for pruned in all {
            for (at, (kind, count)) in pruned.counts.iter().enumerate() {
                match total.counts.get_mut(at) {
                    Some((_, sum)) => *sum += count,
                    None => total.counts.push((*kind, *count)),
                }
            }
            total.dropped.extend(pruned.dropped.iter().cloned());
        }
        total
    }

    /// The object the module's comment gives.
    fn to_json(&self, args: &PruneArgs) -> serde_json::Value {
        let count = |at: usize| self.counts.get(at).map(|(_, count)| *count);
        serde_json::json!({
            "published": count(0).unwrap_or(0),
            "dead": match args.include_dead {
                true => Some(count(1).unwrap_or(0)),
                false => None,
            },
            "dry_run": args.dry_run,
            "partitions_dropped": self.dropped,
        })
    }

    /// One line per kind of row and one for the partitions dropped.
    fn text(&self, args: &PruneArgs) -> String {
        let (verb, drop) = match args.dry_run {
            true => ("would delete", "would drop"),
            false => ("deleted", "dropped"),
        };
        let age = short_duration(args.older_than);
        let mut kinds = vec![Kind::Published];
        if args.include_dead {
            kinds.push(Kind::Dead);
        }
        let mut text: String = kinds
            .iter()
            .enumerate()
            .map(|(at, kind)| {
                let count = self.counts.get(at).map_or(0, |(_, count)| *count);
                let (name, s) = (kind.name(), plural(count));
                format!("{verb} {count} {name} event{s} older than {age}\n")
            })
            .collect();
        if !self.dropped.is_empty() {
            let (count, s) = (self.dropped.len(), plural(self.dropped.len()));
            let names = self.dropped.join(", ");
            text.push_str(&format!("{drop} {count} partition{s} whole: {names}\n"));
        }
        text
    }
}

/// Prunes one outbox.
fn prune(
    database: &Database,
    args: &PruneArgs,
    watchdog: &Watchdog,
    archive: Option<&mut Writer>,
) -> Result<Pruned> {
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
            pg_error::classify(&error, "setting the statement timeout", "try again")
        })?;
    columns::check_mapping(&mut client, &database.table, "pruning")?;
    let mut archive = match archive {
        Some(writer) => Some(Archive {
            payload: archive_payload(&mut client, &database.table)?,
            writer,
        }),
        None => None,
    };
    let mut kinds = vec![Kind::Published];
    if args.include_dead {
        kinds.push(Kind::Dead);
    }
    let dropped = drop_partitions(&mut client, database, args, watchdog, &mut archive)?;
    let mut counts = Vec::new();
    for kind in kinds {
        let count = if args.dry_run {
            watchdog.arm(BATCH_BUDGET, "counting old events", Totals::default());
            let (table, max_attempts) = (&database.table, database.max_attempts);
            prune::count(&mut client, table, kind, max_attempts, args.older_than)?
        } else {
            delete(&mut client, database, kind, args, watchdog, &mut archive)?
        };
        counts.push((kind, count));
    }
    // The count of a dry run already holds the rows of the partitions it
    // would drop; a prune deleted the rest after dropping them.
    if !args.dry_run {
        counts[0].1 += dropped.rows;
    }
    Ok(Pruned {
        counts,
        dropped: dropped.names,
    })
}

/// The payload's type, which says how its rows are archived, and the
/// session's TimeZone set to UTC, so the archive's timestamps read alike
/// whatever the server's or the role's setting.
fn archive_payload(client: &mut Client, table: &TableName) -> Result<Payload> {
    let what = "reading the table to archive";
    let payload = columns::of_table(client, table, what)?.payload(what, table)?;
    client
        .batch_execute("SET TIME ZONE 'UTC'")
        .map_err(|error| pg_error::classify(&error, "setting the time zone", "try again"))?;
    Ok(payload)
}

/// Writes every row of `partition` as one member of the archive, synced.
fn archive_partition(
    client: &mut Client,
    table: &TableName,
    partition: &TableName,
    archive: &mut Archive,
) -> Result<()> {
    let mut member = archive.writer.member()?;
    let row = prune::archived_row(archive.payload);
    partitions::each_row(client, table, partition, row, &mut |line| member.line(line))?;
    let rows = member.commit()?;
    log::info!("archived the {rows} rows of partition {partition}");
    Ok(())
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
/// waiting at most 25 ms (sql::partitions::DETACH_LOCK_TIMEOUT), before it
/// keeps the partition and deletes its rows instead.
const LOCKED_DETACH_RETRIES: Duration = Duration::from_secs(60);
/// The pause between two such tries: producers get the table between them.
const LOCKED_DETACH_PAUSE: Duration = Duration::from_millis(200);

/// Drops every partition prune may drop; nothing on a table that is not
/// partitioned by created_at, or under a role that does not own it. First
/// finishes any detach an interrupted prune left pending. A partition is
/// detached concurrently where PostgreSQL allows it (waiting, without
/// blocking anyone, for the transactions that still see it), otherwise
/// under the table's lock taken for at most 25 ms at a time, retried. A
/// partition where an unpublished event turned up is kept; so is one the
/// table's traffic kept locked through every retry: its published rows go
/// row by row with the rest.
fn drop_partitions(
    client: &mut Client,
    database: &Database,
    args: &PruneArgs,
    watchdog: &Watchdog,
    archive: &mut Option<Archive>,
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
    let mut before_drop = |client: &mut Client, partition: &TableName| match archive {
        Some(archive) => archive_partition(client, table, partition, archive),
        None => Ok(()),
    };
    if !args.dry_run {
        finish_pending_detaches(client, table, age, watchdog, &mut dropped, &mut before_drop)?;
    }
    let concurrently = partitions::concurrent_detach(client, table)?;
    if !concurrently && args.archive.is_some() {
        log::info!(
            "table {table}'s partitions cannot be detached concurrently (a DEFAULT partition, \
             or PostgreSQL before 14): with --archive their rows are pruned row by row"
        );
        return Ok(dropped);
    }
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
                    true => partitions::drop_detached(
                        client,
                        table,
                        &partition,
                        &bound,
                        age,
                        &mut before_drop,
                    )?,
                    false => DropOutcome::Busy,
                }
            } else {
                detach_locked(client, table, &partition, rows)?
            };
            match outcome {
                DropOutcome::Dropped(rows) => {
                    log::info!("dropped partition {partition} ({rows} rows)")
                }
                DropOutcome::Kept => {
                    log::warn!("partition {partition} received an unpublished event: kept");
                    continue;
                }
                DropOutcome::Busy => {
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
    before_drop: &mut dyn FnMut(&mut Client, &TableName) -> Result<()>,
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
            true => partitions::drop_detached(client, table, &partition, &bound, age, before_drop)?,
            false => {
                partitions::attach(client, table, &partition, &bound)?;
                DropOutcome::Kept
            }
        };
        match outcome {
            DropOutcome::Dropped(rows) => {
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
) -> Result<DropOutcome> {
    let deadline = std::time::Instant::now() + LOCKED_DETACH_RETRIES;
    loop {
        let outcome = partitions::detach_and_drop(client, table, partition, rows)?;
        if outcome != DropOutcome::Busy || std::time::Instant::now() >= deadline {
            return Ok(outcome);
        }
        log::debug!("partition {partition}: the table is busy, trying again");
        std::thread::sleep(LOCKED_DETACH_PAUSE);
    }
}

/// What prune did, on stdout, or on stderr when the archive goes to
/// stdout (`to_stderr`), out of its way.
fn tell(text: &str, to_stderr: bool) -> Result<()> {
    if to_stderr {
        stderr::line(text.trim_end());
        return Ok(());
    }
    stdout::write(text.as_bytes()).map_err(stdout::unwritable)
}

/// Batch after batch, each statement its own transaction, until a batch
/// comes back short. With an archive, each batch's rows are written and
/// synced before its transaction commits.
fn delete(
    client: &mut Client,
    database: &Database,
    kind: Kind,
    args: &PruneArgs,
    watchdog: &Watchdog,
    archive: &mut Option<Archive>,
) -> Result<i64> {
    let table = &database.table;
    let payload = archive.as_ref().map(|archive| archive.payload);
    let statement = prune::prepare_delete(client, table, kind, database.max_attempts, payload)?;
    let mut total = 0;
    loop {
        watchdog.arm(BATCH_BUDGET, "a prune batch", Totals::default());
        let (age, size) = (args.older_than, args.batch_size);
        let deleted = match archive {
            None => prune::delete_batch(client, &statement, table, age, size)? as i64,
            Some(archive) => {
                let mut transaction = client.transaction().map_err(|error| {
                    crate::sql::table::classify_on_table(&error, "starting a prune batch", table)
                })?;
                let lines =
                    prune::delete_archived_batch(&mut transaction, &statement, table, age, size)?;
                let mut member = archive.writer.member()?;
                for line in &lines {
                    member.line(line)?;
                }
                member.commit()?;
                // The rows are on disk: their deletion may commit. Its
                // outcome unknown, they may be archived again next time.
                transaction.commit().map_err(|error| {
                    crate::sql::table::classify_on_table(
                        &error,
                        "committing a prune batch (its rows are archived; a row the commit \
                         did not delete is archived again by the next prune)",
                        table,
                    )
                })?;
                lines.len() as i64
            }
        };
        total += deleted;
        log::info!("pruned {deleted} {} events (total {total})", kind.name());
        if deleted < args.batch_size {
            return Ok(total);
        }
    }
}

/// 604800 s as `7d`, 90 s as `90s`: the largest whole unit.
pub(crate) fn short_duration(duration: Duration) -> String {
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
