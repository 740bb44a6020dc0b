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
use postgres::Client;

use crate::cli::WaitArgs;
use crate::config::Database;
use crate::connect::conninfo::ConnInfo;
use crate::connect::database::STATEMENT_TIMEOUT;
use crate::exit::Exit;
use crate::guard::watchdog::{MARGIN, Watchdog};
use crate::plan::Selection;
use crate::relay::many::most_urgent;
use crate::report::totals::Totals;
use crate::report::{plural, stderr, stdout};
use crate::sql::wait::{self, Horizon, Left};

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

/// `wait` over the outboxes of a selection: every outbox's horizon is
/// taken first, before any is looked at again, so the wait is for the
/// events committed before it started in every outbox (not before the
/// wait reached it); then each outbox with events left is looked at
/// every POLL_INTERVAL against one deadline, --timeout for the whole
/// command. At the timeout, exit 1 with one line per outbox saying what is
/// left in it. An outbox that cannot be read is told on stderr and makes
/// the exit its own; the others are still waited for. `--json`: one
/// object, the totals and, over more than one outbox, `outboxes`.
pub fn run_many(selection: &Selection, json: bool, args: &WaitArgs) -> Result<Exit> {
    let started = Instant::now();
    let watchdog = Watchdog::spawn(|_| {})?;
    let statement = STATEMENT_TIMEOUT + MARGIN;
    // The plan: each database's connect and its few catalog statements.
    let servers = u32::try_from(selection.servers.len()).unwrap_or(u32::MAX);
    let plan_budget = (selection.connect_budget() + statement).saturating_mul(servers.max(1));
    watchdog.arm(plan_budget, "resolving the selection", Totals::default());
    let (all, plan) = super::each(selection)?;
    let mut sessions = Sessions {
        clients: plan
            .clients
            .into_iter()
            .map(|(server, client)| (selection.servers[server].conninfo.clone(), client))
            .collect(),
        most: selection.max_connections.max(1),
    };
    // A connect (when the session is not open) and one statement.
    let step = selection.connect_budget() + statement;
    let mut exits = Vec::new();
    let mut waiting = Vec::new();
    for (database, name) in all {
        watchdog.arm(step, "taking the wait's horizon", Totals::default());
        let horizon = database.and_then(|database| {
            let horizon = sessions.with(&database, |client| wait::start(client, &database.table));
            Ok((database, horizon?))
        });
        match horizon {
            Ok((database, horizon)) => waiting.push(Waiting {
                database,
                horizon,
                left: None,
            }),
            Err(error) => {
                stderr::line(&format!("outbox-poll: error: database {name}: {error:#}"));
                exits.push(Exit::of(&error));
            }
        }
    }
    loop {
        for one in waiting.iter_mut().filter(|one| !one.done()) {
            watchdog.arm(step, "reading what is left to publish", Totals::default());
            let (database, horizon) = (&one.database, &one.horizon);
            let left = sessions.with(database, |client| {
                wait::left(client, &database.table, horizon, database.max_attempts)
            });
            match left {
                Ok(left) => one.left = Some(Ok(left)),
                Err(error) => {
                    stderr::line(&format!(
                        "outbox-poll: error: database {}, table {}: {error:#}",
                        crate::plan::label(&database.conninfo),
                        database.table
                    ));
                    exits.push(Exit::of(&error));
                    one.left = Some(Err(()));
                }
            }
        }
        let out_of_time = args.timeout.is_some_and(|limit| started.elapsed() >= limit);
        if waiting.iter().all(Waiting::done) || out_of_time {
            break;
        }
        let sleep = match args.timeout {
            Some(limit) => POLL_INTERVAL.min(limit.saturating_sub(started.elapsed())),
            None => POLL_INTERVAL,
        };
        std::thread::sleep(sleep);
    }
    watchdog.disarm();
    // The outboxes read to the end, with what is left in each.
    let read: Vec<(&Database, &Left)> = waiting
        .iter()
        .filter_map(|one| match &one.left {
            Some(Ok(left)) => Some((&one.database, left)),
            _ => None,
        })
        .collect();
    for (database, left) in &read {
        if left.events > 0 {
            let place = format!(
                "{} of database {}",
                database.table,
                crate::plan::label(&database.conninfo)
            );
            stderr::line(&format!(
                "outbox-poll: {}",
                timed_out(left, args.timeout, &place)
            ));
            exits.push(Exit::EventsFailed);
        }
    }
    let exit = most_urgent(exits.into_iter());
    if json {
        let total = Left {
            events: read.iter().map(|(_, left)| left.events).sum(),
            due: read.iter().map(|(_, left)| left.due).sum(),
            oldest_age_s: read.iter().filter_map(|(_, left)| left.oldest_age_s).max(),
        };
        let mut object = left_json(&total);
        object["waited_ms"] = (started.elapsed().as_millis() as u64).into();
        object["exit_code"] = exit.code().into();
        if read.len() > 1 {
            let outboxes: Vec<serde_json::Value> = read
                .iter()
                .map(|(database, left)| super::outbox_json(database, &left_json(left)))
                .collect();
            object["outboxes"] = outboxes.into();
        }
        stdout::write(format!("{object}\n").as_bytes()).map_err(stdout::unwritable)?;
    }
    Ok(exit)
}

/// `left`, `due` and `oldest_left_age_s`, the first fields of the summary.
fn left_json(left: &Left) -> serde_json::Value {
    serde_json::json!({
        "left": left.events,
        "due": left.due,
        "oldest_left_age_s": left.oldest_age_s,
    })
}

/// One outbox a wait over many is waiting for.
struct Waiting {
    database: Database,
    horizon: Horizon,
    /// What the last look found; an error ends its wait.
    left: Option<std::result::Result<Left, ()>>,
}

impl Waiting {
    /// Nothing left to wait for in it: none of its events left, or it
    /// could not be read.
    fn done(&self) -> bool {
        match &self.left {
            Some(Ok(left)) => left.events == 0,
            Some(Err(())) => true,
            None => false,
        }
    }
}

/// The sessions of a wait over many outboxes: one per database, at most
/// --max-connections open at once (the one used longest ago is closed to
/// make room: they are kept in the order of their last use). A session
/// whose statement failed is closed: the next look at its database opens
/// another.
struct Sessions {
    clients: Vec<(ConnInfo, Client)>,
    most: usize,
}

impl Sessions {
    fn with<T>(
        &mut self,
        database: &Database,
        statement: impl FnOnce(&mut Client) -> Result<T>,
    ) -> Result<T> {
        let at = match self
            .clients
            .iter()
            .position(|(info, _)| *info == database.conninfo)
        {
            Some(at) => at,
            None => {
                let client = super::connect(database)?;
                if self.clients.len() >= self.most {
                    self.clients.remove(0);
                }
                self.clients.push((database.conninfo.clone(), client));
                self.clients.len() - 1
            }
        };
        let (info, mut client) = self.clients.remove(at);
        let result = statement(&mut client);
        if result.is_ok() {
            self.clients.push((info, client));
        }
        result
    }
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
