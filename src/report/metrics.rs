//! `--metrics-file PATH`: after a poll run, Prometheus text-format gauges
//! for node_exporter's textfile collector: what the run did, and the
//! backlog it left (one status query).
//!
//! The file is written to a temporary of a unique name in the same
//! directory (`.NAME.XXXXXX.tmp`) and renamed over PATH, so the collector
//! never reads half a file (it reads only `*.prom`, so the temporary is
//! never collected) and concurrent runs sharing PATH never collide.
//!
//! The file is written whatever the run's outcome: a failed run's exit code
//! is what an alert wants to see. If the backlog cannot be read the backlog
//! gauges are left out. If the file cannot be written that is a
//! configuration problem: exit 78 when the run was otherwise fine,
//! otherwise the run's own code stands and a warning says why.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use postgres::Client;

use crate::config::{Database, Relay};
use crate::exit::{self, Exit};
use crate::report::stderr;
use crate::report::totals::{Outcome, Totals};
use crate::sql::figures::{self, Figures};

/// What the metrics file tells of the table after the run: the backlog as
/// `status` counts it, and the share of dead row versions.
pub struct Backlog {
    pub figures: Figures,
    /// None when the statistics have counted no row: the gauge is NaN then,
    /// so the series stays (an alert's comparison with NaN is false).
    pub dead_tuple_ratio: Option<f64>,
    /// Keys held back by a failed head; None (no gauge) on a table without
    /// an ordering_key column.
    pub held_back_keys: Option<i64>,
}

/// The backlog for the metrics file, read on the run's own connection
/// (no second connect): `None` when no file is wanted or it cannot be read,
/// for instance after the connection was lost.
pub(crate) fn backlog(client: &mut Client, database: &Database, relay: &Relay) -> Option<Backlog> {
    relay.metrics_file.as_ref()?;
    let figures = match figures::of_table(client, &database.table, database.max_attempts) {
        Ok(figures) => figures,
        Err(error) => {
            log::warn!("metrics without the backlog: {error:#}");
            return None;
        }
    };
    let dead_tuple_ratio = figures::dead_tuple_ratio(client, &database.table)
        .inspect_err(|error| log::warn!("metrics without the dead-tuple ratio: {error:#}"))
        .ok()
        .flatten();
    let held_back_keys = figures::held_back_keys(client, &database.table, database.max_attempts)
        .inspect_err(|error| log::warn!("metrics without the held-back keys: {error:#}"))
        .ok()
        .flatten();
    Some(Backlog {
        figures,
        dead_tuple_ratio,
        held_back_keys,
    })
}

/// Writes the metrics file if --metrics-file asks for one; hands back the
/// run's result, or a configuration error if the file could not be written.
pub(crate) fn after_run(
    database: &Database,
    relay: &Relay,
    totals: &Totals,
    backlog: Option<Backlog>,
    started: Instant,
    result: Result<Exit>,
) -> Result<Exit> {
    let Some(path) = &relay.metrics_file else {
        return result;
    };
    let code = Exit::of_result(&result).code();
    let ended = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let text = render(
        &database.table.to_string(),
        &Run {
            ended,
            code,
            duration_s: started.elapsed().as_secs_f64(),
            totals: *totals,
        },
        backlog.as_ref(),
    );
    match (write_atomically(path, &text), result) {
        (Ok(()), result) => result,
        (Err(error), Ok(Exit::Success)) => Err(exit::config(error)),
        (Err(error), result) => {
            stderr::line(&format!("outbox-poll: warning: {error:#}"));
            result
        }
    }
}

/// As `after_run`, for a run over many outboxes: the run's gauges for
/// each outbox, labelled with its database and table (no backlog: that
/// would be a status query on every table of the selection).
pub(crate) fn after_many(
    relay: &Relay,
    outboxes: &[Outcome],
    totals: &Totals,
    started: Instant,
    result: Result<Exit>,
) -> Result<Exit> {
    let Some(path) = &relay.metrics_file else {
        return result;
    };
    let ended = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let duration_s = started.elapsed().as_secs_f64();
    let runs: Vec<(String, Run)> = outboxes
        .iter()
        .map(|outbox| {
            let label = format!(
                "{{database=\"{}\",table=\"{}\"}}",
                escape_label(&outbox.database),
                escape_label(&outbox.table)
            );
            let run = Run {
                ended,
                code: outbox.exit.code(),
                duration_s,
                totals: outbox.totals,
            };
            (label, run)
        })
        .collect();
    log::debug!(
        "metrics of {} outboxes, {} claimed",
        runs.len(),
        totals.claimed
    );
    let mut text = String::new();
    let all: Vec<[Gauge; 9]> = runs.iter().map(|(_, run)| run_gauges(run)).collect();
    for gauge in 0..9 {
        let Some((name, help, _)) = all.first().map(|gauges| &gauges[gauge]) else {
            break;
        };
        let _ = write!(
            text,
            "# HELP outbox_poll_{name} {help}\n# TYPE outbox_poll_{name} gauge\n"
        );
        for ((label, _), gauges) in runs.iter().zip(&all) {
            let _ = writeln!(text, "outbox_poll_{name}{label} {}", gauges[gauge].2);
        }
    }
    match (write_atomically(path, &text), result) {
        (Ok(()), result) => result,
        (Err(error), Ok(Exit::Success)) => Err(exit::config(error)),
        (Err(error), result) => {
            stderr::line(&format!("outbox-poll: warning: {error:#}"));
            result
        }
    }
}

/// What one run did.
pub struct Run {
    pub ended: f64,
    pub code: u8,
    pub duration_s: f64,
    pub totals: Totals,
}

/// The gauges, each with its HELP and TYPE lines, labelled with the table.
pub fn render(table: &str, run: &Run, backlog: Option<&Backlog>) -> String {
    let label = format!("{{table=\"{}\"}}", escape_label(table));
    let mut text = String::new();
    let gauges = run_gauges(run)
        .into_iter()
        .chain(backlog.map(backlog_gauges).into_iter().flatten());
    for (name, help, value) in gauges {
        let _ = write!(
            text,
            "# HELP outbox_poll_{name} {help}\n\
             # TYPE outbox_poll_{name} gauge\n\
             outbox_poll_{name}{label} {value}\n"
        );
    }
    text
}

/// A gauge: its name after `outbox_poll_`, its help text and its value.
type Gauge = (&'static str, &'static str, String);

/// What the run did.
fn run_gauges(run: &Run) -> [Gauge; 9] {
    let totals = &run.totals;
    [
        (
            "last_run_timestamp_seconds",
            "When the last run ended, in seconds since the epoch.",
            format!("{:.3}", run.ended),
        ),
        (
            "last_run_exit_code",
            "Exit code of the last run (0 done, 1 some events failed, 69 outage, 78 configuration).",
            run.code.to_string(),
        ),
        (
            "last_run_duration_seconds",
            "How long the last run took.",
            format!("{:.3}", run.duration_s),
        ),
        (
            "last_run_batches",
            "Batches the last run committed.",
            totals.batches.to_string(),
        ),
        (
            "last_run_claimed",
            "Events the last run claimed.",
            totals.claimed.to_string(),
        ),
        (
            "last_run_published",
            "Events the last run published (confirmed by the broker).",
            totals.published.to_string(),
        ),
        (
            "last_run_failed",
            "Events that failed in the last run: returned, refused over a channel error or unreadable (an attempt counted each), or nacked (none counted).",
            totals.failed.to_string(),
        ),
        (
            "last_run_unknown",
            "Events of the last run whose batch's COMMIT outcome is unknown (the connection dropped during it): marked or not.",
            totals.unknown.to_string(),
        ),
        (
            "last_run_expired",
            "Events the last run found past their expires_at: marked expired, never published (not a failure).",
            totals.expired.to_string(),
        ),
    ]
}

/// The backlog the run left, as `status` counts it, and the dead-tuple
/// ratio.
fn backlog_gauges(backlog: &Backlog) -> Vec<Gauge> {
    let figures = &backlog.figures;
    let held_back_keys = backlog.held_back_keys.map(|keys| {
        (
            "held_back_keys",
            "Ordering keys held back by a failed head event (--ordered-by-key): their later events wait.",
            keys.to_string(),
        )
    });
    let mut gauges = vec![
        (
            "pending",
            "Unpublished events that are not dead.",
            figures.pending.to_string(),
        ),
        (
            "due",
            "Pending events available now.",
            figures.due.to_string(),
        ),
        (
            "retrying",
            "Pending events with failed attempts.",
            figures.retrying.to_string(),
        ),
        (
            "dead",
            "Unpublished events at --max-attempts: never claimed again.",
            figures.dead.to_string(),
        ),
        (
            "expired",
            "Unpublished events past their expires_at: never published, counted in none of the above.",
            figures.expired.to_string(),
        ),
        (
            "oldest_pending_age_seconds",
            "Age of the oldest pending event (0 when none is pending).",
            figures.oldest_pending_age_s.unwrap_or(0).to_string(),
        ),
        (
            "oldest_due_age_seconds",
            "Age of the oldest due event, available now (0 when none is due): what status --max-age checks.",
            figures.oldest_due_age_s.unwrap_or(0).to_string(),
        ),
        (
            "dead_tuple_ratio",
            "Dead row versions over all row versions of the table, its partitions summed, as PostgreSQL's statistics last counted them (NaN: none counted).",
            match backlog.dead_tuple_ratio {
                Some(ratio) => format!("{ratio:.4}"),
                None => "NaN".into(),
            },
        ),
    ];
    gauges.extend(held_back_keys);
    gauges
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A temporary file of its own beside PATH (a unique name per writer, so
/// concurrent runs sharing one metrics file never rename each other's file
/// away nor write into one inode), flushed to disk, then renamed over PATH.
/// A temporary left by a failure is removed when it is dropped.
fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(path.file_name().unwrap_or_default());
    prefix.push(".");
    let write = || -> std::io::Result<()> {
        let mut file = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(".tmp")
            .tempfile_in(directory)?;
        file.write_all(text.as_bytes())?;
        file.as_file().sync_all()?;
        file.persist(path).map_err(|error| error.error)?;
        Ok(())
    };
    write().with_context(|| {
        format!(
            "cannot write the metrics file {}: check that its directory exists and is writable",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_have_help_type_and_the_table_label() {
        let run = Run {
            ended: 1_700_000_000.5,
            code: 1,
            duration_s: 0.25,
            totals: Totals {
                claimed: 3,
                published: 2,
                failed: 1,
                batches: 1,
                unknown: 0,
                expired: 0,
            },
        };
        let text = render("app.outbox", &run, None);
        assert!(text.starts_with(
            "# HELP outbox_poll_last_run_timestamp_seconds When the last run ended, in seconds since the epoch.\n\
             # TYPE outbox_poll_last_run_timestamp_seconds gauge\n\
             outbox_poll_last_run_timestamp_seconds{table=\"app.outbox\"} 1700000000.500\n"
        ), "{text}");
        assert!(text.contains("outbox_poll_last_run_failed{table=\"app.outbox\"} 1\n"));
        assert!(
            !text.contains("outbox_poll_pending"),
            "no backlog, no gauge"
        );
    }

    #[test]
    fn the_dead_tuple_ratio_is_a_gauge_nan_when_unknown() {
        let run = Run {
            ended: 0.0,
            code: 0,
            duration_s: 0.0,
            totals: Totals::default(),
        };
        let backlog = |dead_tuple_ratio| Backlog {
            figures: Figures::default(),
            dead_tuple_ratio,
            held_back_keys: None,
        };
        let known = render("t", &run, Some(&backlog(Some(0.25))));
        assert!(
            known.contains(
                "# TYPE outbox_poll_dead_tuple_ratio gauge\n\
                 outbox_poll_dead_tuple_ratio{table=\"t\"} 0.2500\n"
            ),
            "{known}"
        );
        let unknown = render("t", &run, Some(&backlog(None)));
        assert!(
            unknown.contains("outbox_poll_dead_tuple_ratio{table=\"t\"} NaN\n"),
            "{unknown}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c"), "a\\\"b\\\\c");
    }
}
