//! The default command: claim, publish, mark, commit; with --drain, batch
//! after batch until nothing is due or a limit is reached.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::batch::{Broker, Session, Totals};
use crate::config::{Database, Poll};
use crate::db;
use crate::drain::Drain;
use crate::exit;
use crate::metrics;
use crate::progress::Progress;
use crate::status::Figures;
use crate::stop::Stop;
use crate::watchdog::{self, Watchdog};

/// Closing the broker connection is bounded in `Publisher::close`, and
/// writing the metrics file is local; this only catches one that hangs.
const CLOSE_BUDGET: Duration = Duration::from_secs(5);

/// Runs the poll and returns its exit code. With --json the summary is
/// printed whatever the outcome, configuration errors included.
pub fn run(json: bool, settings: Result<(Database, Poll)>) -> Result<u8> {
    let started = Instant::now();
    let mut totals = Totals::default();
    let result = settings.and_then(|(database, poll)| {
        let watchdog = Watchdog::start(move |totals| {
            if json {
                print_summary(totals, started, exit::UNAVAILABLE);
            }
        })?;
        let mut backlog = None;
        let result = drain(
            &database,
            &poll,
            &watchdog,
            &mut totals,
            &mut backlog,
            started,
        );
        watchdog.arm(CLOSE_BUDGET, "writing the metrics file", totals);
        let result = metrics::after_run(&database, &poll, &totals, backlog, started, result);
        watchdog.disarm();
        result
    });
    if json {
        let code = match &result {
            Ok(code) => *code,
            Err(error) => exit::code_of(error),
        };
        print_summary(&totals, started, code);
    }
    result
}

fn drain(
    database: &Database,
    poll: &Poll,
    watchdog: &Watchdog,
    totals: &mut Totals,
    backlog: &mut Option<Figures>,
    started: Instant,
) -> Result<u8> {
    let stop = Stop::install()?;
    watchdog.arm(
        database.connect_timeout + db::STATEMENT_TIMEOUT + watchdog::MARGIN,
        "connecting to PostgreSQL and preparing the queries",
        *totals,
    );
    let mut sessions = vec![Session::open(database, poll)?];
    let mut broker = Broker::new(poll.broker.clone());
    let mut progress = Progress::start(&mut sessions[0].client, database, poll);
    let result = Drain {
        database,
        poll,
        watchdog,
        stop: &stop,
        broker: &mut broker,
        progress: &mut progress,
        totals,
        started,
    }
    .run(&mut sessions);
    progress.finish(totals);
    watchdog.arm(CLOSE_BUDGET, "closing the broker connection", *totals);
    broker.close();
    let budget = db::STATEMENT_TIMEOUT + watchdog::MARGIN;
    watchdog.arm(budget, "reading the backlog for the metrics file", *totals);
    *backlog = metrics::backlog(&mut sessions[0].client, database, poll);
    result?;
    Ok(match stop.requested() {
        Some(code) => code,
        None if totals.failed > 0 => exit::PARTIAL_FAILURE,
        None => exit::SUCCESS,
    })
}

fn print_summary(totals: &Totals, started: Instant, code: u8) {
    let summary = serde_json::json!({
        "claimed": totals.claimed,
        "published": totals.published,
        "failed": totals.failed,
        "batches": totals.batches,
        "duration_ms": started.elapsed().as_millis() as u64,
        "exit_code": code,
    });
    println!("{summary}");
}
