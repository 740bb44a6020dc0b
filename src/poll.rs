//! The default command: claim, publish, mark, commit; with --drain, batch
//! after batch until nothing is due or a limit is reached.

use std::time::Instant;

use anyhow::Result;

use crate::batch::{self, Broker, Ended, Totals};
use crate::config::{Database, Poll};
use crate::db;
use crate::exit;
use crate::metrics;
use crate::outbox::Outbox;
use crate::progress::Progress;
use crate::stop::Stop;

/// Runs the poll and returns its exit code. With --json the summary is
/// printed whatever the outcome, configuration errors included.
pub fn run(json: bool, settings: Result<(Database, Poll)>) -> Result<u8> {
    let started = Instant::now();
    let mut totals = Totals::default();
    let result = settings.and_then(|(database, poll)| {
        let result = drain(&database, &poll, &mut totals, started);
        metrics::after_run(&database, &poll, &totals, started, result)
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

fn drain(database: &Database, poll: &Poll, totals: &mut Totals, started: Instant) -> Result<u8> {
    let stop = Stop::install()?;
    let mut client = db::connect(
        &database.config,
        database.connect_timeout,
        database.idle_limit,
    )?;
    let outbox = Outbox::prepare(
        &mut client,
        &database.table,
        database.max_attempts,
        poll.ordered,
    )?;
    let mut broker = Broker::new(poll.broker.clone());
    let mut progress = Progress::start(&mut client, database, poll);
    let result = loop {
        match batch::run(&mut client, &outbox, poll, &mut broker, &stop, totals) {
            Ok(Ended::Settled) if poll.drain && !limit_reached(poll, totals, started) => {}
            Ok(_) => break Ok(()),
            Err(error) => break Err(error),
        }
        progress.update(totals);
        if stop.requested().is_some() {
            break Ok(());
        }
    };
    progress.finish(totals);
    broker.close();
    result?;
    Ok(match stop.requested() {
        Some(code) => code,
        None if totals.failed > 0 => exit::PARTIAL_FAILURE,
        None => exit::SUCCESS,
    })
}

/// No new batch starts once --max-batches or --max-duration is reached;
/// the batch in hand always finishes.
fn limit_reached(poll: &Poll, totals: &Totals, started: Instant) -> bool {
    poll.max_batches.is_some_and(|max| totals.batches >= max)
        || poll
            .max_duration
            .is_some_and(|max| started.elapsed() >= max)
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
