//! The `--json` summary of a poll run: one object on stdout at the end,
//! whatever the exit code, its six fields in the order docs/src/command-line.md ("JSON
//! summary") gives, then
//! `unknown`: events whose batch's COMMIT outcome is unknown.

use std::time::Instant;

use anyhow::Result;

use crate::exit::Exit;
use crate::report::stderr;
use crate::report::stdout;
use crate::report::totals::{Outcome, Totals};

/// Prints the summary of a run that ended with `result`. A summary that
/// cannot be written is reported the way an unwritable metrics file is:
/// exit 78 if the run was otherwise fine, else the run's own exit stands
/// and a warning says why.
pub(crate) fn after_run(totals: &Totals, started: Instant, result: Result<Exit>) -> Result<Exit> {
    match (print(totals, started, Exit::of_result(&result)), result) {
        (Ok(()), result) => result,
        (Err(error), Ok(Exit::Success)) => Err(stdout::unwritable(error)),
        (Err(error), result) => {
            stderr::line(&format!(
                "outbox-poll: warning: cannot write the JSON summary to stdout: {error}"
            ));
            result
        }
    }
}

/// As `after_run`, for a run over many outboxes: with more than one, the
/// totals are followed by `outboxes`, one object for each.
pub(crate) fn after_many(
    totals: &Totals,
    outboxes: &[Outcome],
    started: Instant,
    result: Result<Exit>,
) -> Result<Exit> {
    let mut summary = object(totals, started, Exit::of_result(&result));
    if outboxes.len() > 1 {
        let each: Vec<serde_json::Value> = outboxes
            .iter()
            .map(|outbox| {
                let totals = &outbox.totals;
                serde_json::json!({
                    "database": outbox.database,
                    "table": outbox.table,
                    "claimed": totals.claimed,
                    "published": totals.published,
                    "failed": totals.failed,
                    "batches": totals.batches,
                    "exit_code": outbox.exit.code(),
                    "unknown": totals.unknown,
                    "expired": totals.expired,
                })
            })
            .collect();
        summary["outboxes"] = each.into();
    }
    match (stdout::line(&summary.to_string()), result) {
        (Ok(()), result) => result,
        (Err(error), Ok(Exit::Success)) => Err(stdout::unwritable(error)),
        (Err(error), result) => {
            stderr::line(&format!(
                "outbox-poll: warning: cannot write the JSON summary to stdout: {error}"
            ));
            result
        }
    }
}

/// The summary object, as the run ends with `exit`.
pub(crate) fn print(totals: &Totals, started: Instant, exit: Exit) -> std::io::Result<()> {
    stdout::line(&object(totals, started, exit).to_string())
}

/// The totals' fields, in the documented order (docs/src/command-line.md).
fn object(totals: &Totals, started: Instant, exit: Exit) -> serde_json::Value {
    serde_json::json!({
        "claimed": totals.claimed,
        "published": totals.published,
        "failed": totals.failed,
        "batches": totals.batches,
        "duration_ms": started.elapsed().as_millis() as u64,
        "exit_code": exit.code(),
        "unknown": totals.unknown,
        "expired": totals.expired,
    })
}
