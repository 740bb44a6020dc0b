//! One batch: one transaction from claim to commit.

use std::io::Write;

use anyhow::{Context, Result};
use postgres::{Client, Transaction};

use crate::config::Poll;
use crate::db;
use crate::outbox::{Event, Outbox};
use crate::publisher::{BrokerConfig, Publisher};
use crate::stop::Stop;

/// How a batch ended, when it did not fail.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Events were claimed and settled; the drain may go on.
    Settled,
    /// Nothing was due.
    Empty,
    /// --ordered and another run holds the table's lock.
    LockTaken,
    /// --dry-run printed the batch and rolled back.
    DryRun,
    /// A signal came before anything was published; rolled back.
    Stopped,
}

/// Running figures of a whole run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub claimed: u64,
    pub published: u64,
    pub failed: u64,
    pub batches: u64,
}

/// The broker connection, opened on the first batch that has something to
/// publish and reused by the rest of a drain.
pub struct Broker {
    config: BrokerConfig,
    publisher: Option<Publisher>,
}

impl Broker {
    pub fn new(config: BrokerConfig) -> Self {
        Broker {
            config,
            publisher: None,
        }
    }

    fn publisher(&mut self) -> Result<&mut Publisher> {
        let publisher = match self.publisher.take() {
            Some(publisher) => publisher,
            None => Publisher::connect(&self.config)?,
        };
        Ok(self.publisher.insert(publisher))
    }

    pub fn close(self) {
        if let Some(publisher) = self.publisher {
            publisher.close();
        }
    }
}

/// Claims one batch, publishes it, marks the outcome and commits.
///
/// The row locks taken by the claim are what keep concurrent runs apart,
/// so they must be held until the marks are committed: releasing them any
/// earlier would let another run claim and re-send events we have already
/// published. If anything fails before the commit, the transaction is
/// dropped, PostgreSQL rolls it back, and the events are claimed again by
/// a later run: a duplicate at worst, never a loss.
pub fn run(
    client: &mut Client,
    outbox: &Outbox,
    poll: &Poll,
    broker: &mut Broker,
    stop: &Stop,
    totals: &mut Totals,
) -> Result<Ended> {
    let mut tx = client.transaction().map_err(|error| {
        db::classify(
            &error,
            "starting a transaction",
            "try again once PostgreSQL is reachable",
        )
    })?;
    if !outbox.try_lock(&mut tx)? {
        commit(tx)?;
        return Ok(Ended::LockTaken);
    }
    let events = outbox.claim(&mut tx, poll.batch_size)?;
    if events.is_empty() {
        commit(tx)?;
        return Ok(Ended::Empty);
    }
    if poll.dry_run {
        print_events(&events)?;
        totals.claimed += events.len() as u64;
        return Ok(Ended::DryRun); // dropping `tx` rolls back
    }
    if stop.requested().is_some() {
        return Ok(Ended::Stopped);
    }
    let publisher = broker.publisher()?;
    let outcome = if poll.ordered {
        publisher.publish_in_order(&events)
    } else {
        publisher.publish(&events)
    };
    outbox.mark_published(&mut tx, &outcome.confirmed)?;
    outbox.mark_failed(&mut tx, &outcome.failed)?;
    commit(tx)?;
    log_failures(&events, &outcome.failed);
    totals.batches += 1;
    totals.claimed += events.len() as u64;
    totals.published += outcome.confirmed.len() as u64;
    totals.failed += outcome.failed.len() as u64;
    log::info!(
        "batch {}: claimed {}, published {}, failed {}",
        totals.batches,
        events.len(),
        outcome.confirmed.len(),
        outcome.failed.len()
    );
    match outcome.outage {
        Some(outage) => Err(outage),
        None => Ok(Ended::Settled),
    }
}

fn commit(tx: Transaction) -> Result<()> {
    tx.commit().map_err(|error| {
        db::classify(
            &error,
            "committing the batch",
            "nothing was marked; the events will be claimed and sent again by the next run",
        )
    })
}

/// A few lines, not one per event: under cron every line is mailed.
fn log_failures(events: &[Event], failed: &[(i64, String)]) {
    const SHOWN: usize = 5;
    for (id, reason) in failed.iter().take(SHOWN) {
        let event = events.iter().find(|event| event.id == *id);
        let name = event.map_or("?", |event| event.event_id.as_str());
        log::warn!("event {name} (row {id}) failed: {reason}");
    }
    if failed.len() > SHOWN {
        log::warn!("... and {} more failed events", failed.len() - SHOWN);
    }
}

/// --dry-run: the claimed events as JSON lines, payload as a JSON value.
fn print_events(events: &[Event]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for event in events {
        let payload: serde_json::Value =
            serde_json::from_str(&event.payload).context("reading a payload from the table")?;
        let created_at =
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(event.created_at.max(0) as u64);
        let line = serde_json::json!({
            "id": event.id,
            "event_id": event.event_id,
            "event_type": event.event_type,
            "payload": payload,
            "created_at": humantime::format_rfc3339_seconds(created_at).to_string(),
            "attempts": event.attempts,
        });
        writeln!(out, "{line}").context("writing to stdout")?;
    }
    Ok(())
}
