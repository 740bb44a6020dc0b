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
use crate::plan::Selection;
use crate::relay::many::most_urgent;
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
    let watchdog = Watchdog::spawn(|_| {})?;
    let report = requeue(database, args, &watchdog)?;
    tell(&report, json)?;
    Ok(report.exit())
}

/// `requeue` over the outboxes of a selection, one after the other: one
/// summary, the total and (with `--json`, over more than one outbox)
/// `outboxes`, each with its database, table and count. A named id or
/// key is told once, over them all: an id is unknown only when no outbox
/// has it, already published only when it is published where it is and
/// requeued nowhere, and a key is not held only when it is held in none.
/// An outbox that fails is named on stderr and the others go on; the exit
/// is the most urgent of theirs.
pub fn run_many(selection: &Selection, json: bool, args: &RequeueArgs) -> Result<Exit> {
    let (all, plan) = super::each(selection)?;
    // Each outbox is requeued on a session of its own.
    drop(plan);
    let (mut each, mut exits) = (Vec::new(), Vec::new());
    // One watchdog thread for them all, armed again for each.
    let watchdog = Watchdog::spawn(|_| {})?;
    for (database, name) in all {
        let requeued = database.and_then(|database| {
            let report = requeue(&database, args, &watchdog)?;
            Ok((report, database))
        });
        match requeued {
            Ok((report, database)) => each.push((name, database, report)),
            Err(error) => {
                stderr::line(&format!("outbox-poll: error: database {name}: {error:#}"));
                exits.push(Exit::of(&error));
            }
        }
    }
    watchdog.disarm();
    let reports: Vec<&Report> = each.iter().map(|(_, _, report)| report).collect();
    let total = Report::over(&reports);
    tell_left_alone(&total);
    let line = match json {
        true => {
            let mut object = total.to_json();
            if each.len() > 1 {
                let outboxes: Vec<serde_json::Value> = each
                    .iter()
                    .map(|(_, database, report)| {
                        let fields = serde_json::json!({"requeued": report.requeued});
                        super::outbox_json(database, &fields)
                    })
                    .collect();
                object["outboxes"] = outboxes.into();
            }
            object.to_string()
        }
        false => {
            let mut text = String::new();
            for (name, _, report) in &each {
                text.push_str(&format!("{name}: {}\n", report.count_text()));
            }
            text.push_str(&format!(
                "{}: {}",
                super::total_over(each.len()),
                total.count_text()
            ));
            text
        }
    };
    stdout::line(&line).map_err(stdout::unwritable)?;
    exits.push(total.exit());
    Ok(most_urgent(exits.into_iter()))
}

impl Report {
    /// What the requeues of many outboxes did, as one: the events
    /// requeued in each, and what was named and left alone in all.
    fn over(reports: &[&Report]) -> Report {
        let in_all = |list: fn(&Report) -> Option<&Vec<String>>| -> Option<Vec<String>> {
            let (first, rest) = reports.split_first()?;
            let first = list(first)?;
            let common = first
                .iter()
                .filter(|item| {
                    rest.iter()
                        .all(|other| list(other).is_some_and(|l| l.contains(item)))
                })
                .cloned()
                .collect();
            Some(common)
        };
        let unknown = in_all(|report| Some(&report.unknown)).unwrap_or_default();
        // Published where it is, and requeued in no outbox.
        let mut already_published = Vec::new();
        for report in reports {
            for id in &report.already_published {
                let requeued_somewhere = reports.iter().any(|other| {
                    !other.unknown.contains(id) && !other.already_published.contains(id)
                });
                if !requeued_somewhere && !already_published.contains(id) {
                    already_published.push(id.clone());
                }
            }
        }
        already_published.sort();
        Report {
            requeued: reports.iter().map(|report| report.requeued).sum(),
            unknown,
            already_published,
            not_held: in_all(|report| report.not_held.as_ref()),
        }
    }

    /// 1 when a named id or key was left alone.
    fn exit(&self) -> Exit {
        match self.unknown.is_empty()
            && self.already_published.is_empty()
            && self.not_held.as_ref().is_none_or(Vec::is_empty)
        {
            true => Exit::Success,
            false => Exit::EventsFailed,
        }
    }

    fn to_json(&self) -> serde_json::Value {
        let mut object = serde_json::json!({
            "requeued": self.requeued,
            "unknown": self.unknown,
            "already_published": self.already_published,
        });
        if let Some(keys) = &self.not_held {
            object["keys_not_held"] = keys.clone().into();
        }
        object
    }

    fn count_text(&self) -> String {
        format!("requeued {} event{}", self.requeued, plural(self.requeued))
    }
}

/// Requeues in one outbox, under `watchdog`.
fn requeue(database: &Database, args: &RequeueArgs, watchdog: &Watchdog) -> Result<Report> {
    // One statement updates and reports (a margin of two more).
    watchdog.arm_command(database.connect_budget(), 3, "requeue");
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
    Ok(report)
}

/// Each named id left alone on stderr, the count (or the JSON) on stdout.
fn tell(report: &Report, json: bool) -> Result<()> {
    tell_left_alone(report);
    let line = match json {
        true => report.to_json().to_string(),
        false => report.count_text(),
    };
    stdout::line(&line).map_err(stdout::unwritable)
}

/// Each named id or key left alone, a line each on stderr.
fn tell_left_alone(report: &Report) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(unknown: &[&str], published: &[&str], not_held: Option<&[&str]>) -> Report {
        let owned = |list: &[&str]| list.iter().map(ToString::to_string).collect();
        Report {
            requeued: 1,
            unknown: owned(unknown),
            already_published: owned(published),
            not_held: not_held.map(owned),
        }
    }

    #[test]
    fn over_many_outboxes_a_name_is_left_alone_only_when_every_outbox_left_it() {
        // x is the first outbox's (requeued there), y the second's
        // (published), z nobody's; key k1 is held in the first.
        let first = named(&["y", "z"], &[], Some(&["k2"]));
        let second = named(&["x", "z"], &["y"], Some(&["k1", "k2"]));
        let total = Report::over(&[&first, &second]);
        assert_eq!(total.requeued, 2);
        assert_eq!(total.unknown, ["z"]);
        assert_eq!(total.already_published, ["y"]);
        assert_eq!(total.not_held, Some(vec!["k2".to_string()]));
        assert_eq!(total.exit(), Exit::EventsFailed);
        let none = Report::over(&[]);
        assert!(none.unknown.is_empty() && none.not_held.is_none());
        assert_eq!(none.exit(), Exit::Success);
    }
}
