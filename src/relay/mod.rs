//! What happens in one run: connect to PostgreSQL, claim a batch, publish
//! it, mark what the broker confirmed, commit; with --drain, batch after
//! batch until nothing is due or a limit is reached; with --follow, on
//! until --max-duration, publishing new events as they commit. Then the
//! summary and the metrics file.
//!
//! `batch` is one transaction (claim and send, then confirms, marks and
//! commit), `drain` the loop over batches with several in flight,
//! `follow` the waits between a follow's rounds of batches, `session` a
//! PostgreSQL session with the relay's statements prepared, `wake` the
//! listeners of a follow over many outboxes.

pub(crate) mod batch;
mod committer;
pub(crate) mod drain;
pub(crate) mod follow;
pub mod many;
pub mod session;
pub(crate) mod wake;

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::broker::Broker;
use crate::config::{Database, Relay};
use crate::connect::database::STATEMENT_TIMEOUT;
use crate::exit::Exit;
use crate::guard::stop::Stop;
use crate::guard::watchdog::{self, Watchdog};
use crate::relay::drain::Drain;
use crate::relay::session::Session;
use crate::report::metrics::{self, Backlog};
use crate::report::progress::Progress;
use crate::report::summary;
use crate::report::totals::Totals;
use crate::report::traces::{Place, Traces};

/// Closing the broker connection is bounded in `Publisher::close`, and
/// writing the metrics file is local; this only catches one that hangs.
pub(crate) const CLOSE_BUDGET: Duration = Duration::from_secs(5);

/// Runs the poll command and returns its exit. With --json the summary is
/// printed whatever the outcome, configuration errors included.
pub fn run(json: bool, settings: Result<(Database, Relay)>) -> Result<Exit> {
    let started = Instant::now();
    let mut totals = Totals::default();
    let result = settings.and_then(|(database, relay)| {
        let watchdog = Watchdog::spawn(move |totals| {
            if json {
                // The run is being abandoned: a summary that cannot be
                // written changes nothing.
                let _ = summary::print(totals, started, Exit::Unavailable);
            }
        })?;
        let traces = Traces::from_env(&relay);
        let place = traces.as_ref().map(|_| Place::of(&database));
        let mut backlog = None;
        let result = run_batches(
            &database,
            &relay,
            &watchdog,
            &mut totals,
            &mut backlog,
            started,
            traces.as_ref().zip(place.as_ref()),
        );
        watchdog.arm(CLOSE_BUDGET, "writing the metrics file", totals);
        let result = metrics::after_run(&database, &relay, &totals, backlog, started, result);
        watchdog.disarm();
        // Bounded on its own (traces::FLUSH_BOUND), and never a failure.
        if let Some(traces) = traces {
            traces.finish(Exit::of_result(&result), &totals, started);
        }
        result
    });
    match json {
        true => summary::after_run(&totals, started, result),
        false => result,
    }
}

/// One batch, or with --drain batch after batch, or with --follow rounds
/// of batches until --max-duration; then the broker closed and
/// the backlog read for the metrics file, on the run's own session.
fn run_batches(
    database: &Database,
    relay: &Relay,
    watchdog: &Watchdog,
    totals: &mut Totals,
    backlog: &mut Option<Backlog>,
    started: Instant,
    traces: Option<(&Traces, &Place)>,
) -> Result<Exit> {
    let stop = Stop::install()?;
    watchdog.arm(
        database.connect_budget() + STATEMENT_TIMEOUT + watchdog::MARGIN,
        "connecting to PostgreSQL and preparing the queries",
        *totals,
    );
    let mut sessions = vec![Session::open(database, relay, &stop)?];
    let mut broker = Broker::new(relay.broker.clone(), stop.clone());
    let mut progress = Progress::new(&mut sessions[0].client, database, relay);
    let mut drain = Drain {
        database,
        relay,
        watchdog,
        stop: &stop,
        broker: &mut broker,
        progress: &mut progress,
        totals,
        started,
        session_limit: relay.sessions(),
        traces,
    };
    let result = match relay.follow {
        true => drain.follow(&mut sessions),
        false => drain.run(&mut sessions),
    };
    progress.done(totals);
    watchdog.arm(CLOSE_BUDGET, "closing the broker connection", *totals);
    broker.close();
    // The figures and the dead-tuple ratio.
    let budget = 2 * STATEMENT_TIMEOUT + watchdog::MARGIN;
    watchdog.arm(budget, "reading the backlog for the metrics file", *totals);
    *backlog = metrics::backlog(&mut sessions[0].client, database, relay);
    result?;
    Ok(match stop.requested() {
        Some(exit) => exit,
        None if totals.failed > 0 => Exit::EventsFailed,
        None => Exit::Success,
    })
}
