//! `outbox-poll requeue`: make events eligible again, once whatever made
//! them fail is fixed. attempts goes back to 0, last_error is cleared and
//! available_at is now, so the next run claims them.
//!
//! Only unpublished events are touched: requeueing never re-sends an event
//! the broker already confirmed. Named ids that are unknown or already
//! published are reported on stderr, one line each, and make the exit code 1.
//! `--key KEY` requeues the failed head of each key (`status` lists them);
//! a key without one is reported the same way.

use std::collections::BTreeSet;

use anyhow::Result;

use crate::cli::RequeueArgs;
use crate::config::Database;
use crate::exit::Exit;
use crate::guard::watchdog::Watchdog;
use crate::report::{plural, stderr, stdout};
use crate::sql::columns;
use crate::sql::requeue::{self, Named};

/// What a requeue did.
#[derive(Default)]
struct Report {
    requeued: u64,
    unknown: Vec<String>,
    already_published: Vec<String>,
    /// With --key: the named keys whose head has not failed (or that have
    /// no event left). None otherwise.
    not_held: Option<Vec<String>>,
}

pub fn run(database: &Database, json: bool, args: &RequeueArgs) -> Result<Exit> {
    // One statement updates and reports (a margin of two more).
    let _watchdog = Watchdog::for_command(database.connect_budget(), 3, "requeue")?;
    let mut client = super::connect(database)?;
    let table = &database.table;
    columns::check_mapping(&mut client, table, "requeueing")?;
    let report = if args.dead {
        Report {
            requeued: requeue::dead(&mut client, table, database.max_attempts)?,
            ..Report::default()
        }
    } else if !args.key.is_empty() {
        let keys: BTreeSet<&str> = args.key.iter().map(String::as_str).collect();
        let keys: Vec<&str> = keys.into_iter().collect();
        let by_xid = columns::of_table(&mut client, table, "requeueing")?
            .columns
            .producer_xid;
        let (requeued, not_held) =
            requeue::by_key(&mut client, table, &keys, database.max_attempts, by_xid)?;
        Report {
            requeued,
            not_held: Some(not_held),
            ..Report::default()
        }
    } else {
        let wanted: BTreeSet<&str> = args.event_id.iter().map(String::as_str).collect();
        let wanted: Vec<&str> = wanted.into_iter().collect();
        let mut report = Report::default();
        for (id, named) in requeue::by_event_id(&mut client, table, &wanted)? {
            match named {
                Named::Requeued => report.requeued += 1,
                Named::AlreadyPublished => report.already_published.push(id),
                Named::Unknown => report.unknown.push(id),
            }
        }
        report
    };
    tell(&report, json)?;
    Ok(
        match report.unknown.is_empty()
            && report.already_published.is_empty()
            && report.not_held.as_ref().is_none_or(Vec::is_empty)
        {
            true => Exit::Success,
            false => Exit::EventsFailed,
        },
    )
}

/// Each named id left alone on stderr, the count (or the JSON) on stdout.
fn tell(report: &Report, json: bool) -> Result<()> {
    for id in &report.unknown {
        stderr::line(&format!("outbox-poll: unknown event id: {id}"));
    }
    for id in &report.already_published {
        stderr::line(&format!(
            "outbox-poll: event id {id} is already published; left as it is"
        ));
    }
    for key in report.not_held.iter().flatten() {
        stderr::line(&format!(
            "outbox-poll: ordering key {key:?} has no failed event at its head; left as it is"
        ));
    }
    let line = if json {
        let mut object = serde_json::json!({
            "requeued": report.requeued,
            "unknown": report.unknown,
            "already_published": report.already_published,
        });
        if let Some(keys) = &report.not_held {
            object["keys_not_held"] = keys.clone().into();
        }
        object.to_string()
    } else {
        format!(
            "requeued {} event{}",
            report.requeued,
            plural(report.requeued)
        )
    };
    stdout::line(&line).map_err(stdout::unwritable)
}
