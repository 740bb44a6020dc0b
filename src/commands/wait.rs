//! `outbox-poll wait [--timeout D]`: blocks until every event committed
//! before it started is published, dead or expired (see `sql::wait` for which
//! events those are), for CI and integration tests in place of sleeps.
//! Costs the database one query over the pending index per poll interval;
//! needs SELECT on the table and no broker. Exit 0 when none is left; at
//! the timeout, exit 1 with one line saying what is left.
//!
//! `--json` prints `{"left": N, "due": N, "oldest_left_age_s": S or null,
//! "waited_ms": MS, "exit_code": C}` at the end.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::cli::WaitArgs;
use crate::config::Database;
use crate::connect::database::STATEMENT_TIMEOUT;
use crate::exit::Exit;
use crate::guard::watchdog::{MARGIN, Watchdog};
use crate::report::totals::Totals;
use crate::report::{plural, stderr, stdout};
use crate::sql::wait::{self, Left};

/// How often it looks: short against a CI job's seconds, long against one
/// indexed query.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

pub fn run(database: &Database, json: bool, args: &WaitArgs) -> Result<Exit> {
    let started = Instant::now();
    let watchdog = Watchdog::spawn(|_| {})?;
    let statement = STATEMENT_TIMEOUT + MARGIN;
    watchdog.arm(
        database.connect_budget() + statement,
        "connecting to PostgreSQL",
        Totals::default(),
    );
    let mut client = super::connect(database)?;
    let (table, max_attempts) = (&database.table, database.max_attempts);
    watchdog.arm(statement, "taking the wait's horizon", Totals::default());
    let horizon = wait::start(&mut client, table)?;
    let left = loop {
        watchdog.arm(
            statement,
            "reading what is left to publish",
            Totals::default(),
        );
        let left = wait::left(&mut client, table, &horizon, max_attempts)?;
        let out_of_time = args.timeout.is_some_and(|limit| started.elapsed() >= limit);
        if left.events == 0 || out_of_time {
            break left;
        }
        let sleep = match args.timeout {
            Some(limit) => POLL_INTERVAL.min(limit.saturating_sub(started.elapsed())),
            None => POLL_INTERVAL,
        };
        std::thread::sleep(sleep);
    };
    watchdog.disarm();
    let exit = match left.events {
        0 => Exit::Success,
        _ => Exit::EventsFailed,
    };
    if exit != Exit::Success {
        stderr::line(&format!(
            "outbox-poll: {}",
            timed_out(&left, args.timeout, table)
        ));
    }
    if json {
        let object = serde_json::json!({
            "left": left.events,
            "due": left.due,
            "oldest_left_age_s": left.oldest_age_s,
            "waited_ms": started.elapsed().as_millis() as u64,
            "exit_code": exit.code(),
        });
        stdout::write(format!("{object}\n").as_bytes()).map_err(stdout::unwritable)?;
    }
    Ok(exit)
}

/// `timed out after 30s: 3 events committed before the wait are still
/// unpublished in table T (2 due, 1 backing off), the oldest created 42s ago`
fn timed_out(left: &Left, timeout: Option<Duration>, table: &impl std::fmt::Display) -> String {
    let limit = timeout.map(humantime::format_duration);
    let limit = limit.map(|limit| limit.to_string()).unwrap_or_default();
    let (events, s) = (left.events, plural(left.events));
    let oldest = match left.oldest_age_s {
        Some(age) => format!(
            ", the oldest created {} ago",
            humantime::format_duration(Duration::from_secs(age.max(0) as u64))
        ),
        None => String::new(),
    };
    format!(
        "timed out after {limit}: {events} event{s} committed before the wait still unpublished \
         in table {table} ({} due, {} backing off){oldest}; see `outbox-poll status`",
        left.due,
        left.events - left.due
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_line_says_what_is_left() {
        let left = Left {
            events: 3,
            due: 2,
            oldest_age_s: Some(42),
        };
        assert_eq!(
            timed_out(&left, Some(Duration::from_secs(30)), &"app.outbox"),
            "timed out after 30s: 3 events committed before the wait still unpublished in \
             table app.outbox (2 due, 1 backing off), the oldest created 42s ago; see \
             `outbox-poll status`"
        );
    }
}
