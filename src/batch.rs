//! One batch: one transaction from claim to commit, in two halves. `start`
//! claims and hands the events to the broker; `finish` awaits the confirms,
//! marks and commits. A drain may start the next batch, on a session of its
//! own, before it finishes this one.

use std::io::Write;

use anyhow::{Context, Result};
use postgres::Client;

use crate::config::{Database, Poll};
use crate::db;
use crate::outbox::{Event, Outbox};
use crate::publisher::{BrokerConfig, Outcome, Publisher, Sent};
use crate::stop::Stop;

/// Why a batch ended before anything was published.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
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

/// One PostgreSQL session with the queries prepared on it. A batch's
/// transaction lives on one session from its claim to its commit.
pub struct Session {
    pub client: Client,
    outbox: Outbox,
}

impl Session {
    pub fn open(database: &Database, poll: &Poll) -> Result<Self> {
        let mut client = db::connect(
            &database.config,
            database.connect_timeout,
            poll.idle_limit(),
        )?;
        let outbox = Outbox::prepare(
            &mut client,
            &database.table,
            database.max_attempts,
            poll.ordered,
        )?;
        Ok(Session { client, outbox })
    }

    fn begin(&mut self) -> Result<()> {
        self.control(
            "BEGIN",
            "starting a transaction",
            "try again once PostgreSQL is reachable",
        )
    }

    fn commit(&mut self) -> Result<()> {
        self.control(
            "COMMIT",
            "committing the batch",
            "nothing was marked; the events will be claimed and sent again by the next run",
        )
    }

    fn control(&mut self, sql: &str, what: &str, advice: &str) -> Result<()> {
        self.client
            .batch_execute(sql)
            .map_err(|error| db::classify(&error, what, advice))
    }

    /// Whatever the reason we give up on a transaction, its row locks must
    /// go now, not when the process exits (other runs are waiting for the
    /// rows), and the session may still be used (the metrics backlog). If
    /// even this fails the connection is gone, and the server has rolled
    /// back.
    fn roll_back(&mut self) {
        let _ = self.client.batch_execute("ROLLBACK");
    }

    /// The marks for what the broker said, in the batch's transaction.
    fn mark(&mut self, outcome: &Outcome) -> Result<()> {
        let outbox = &self.outbox;
        outbox.mark_published(&mut self.client, &outcome.confirmed)?;
        outbox.mark_failed(&mut self.client, &outcome.failed)
    }
}

/// A batch claimed and handed to the broker: its transaction open (its rows
/// locked), its confirms on their way.
pub struct InFlight {
    events: Vec<Event>,
    sent: Sent,
}

impl InFlight {
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// The highest id claimed (the claim is in id order, and never empty).
    pub fn last_id(&self) -> i64 {
        self.events.last().map_or(i64::MIN, |event| event.id)
    }
}

/// What `start` left.
pub enum Started {
    InFlight(InFlight),
    /// Nothing to finish: the transaction is already over.
    Ended(Ended),
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

    /// A batch is sent only on a connected publisher, which stays until
    /// `close`; without one nothing could have been confirmed.
    fn finish(&mut self, sent: Sent, events: &[Event]) -> Outcome {
        match self.publisher.as_mut() {
            Some(publisher) => publisher.finish(sent, events),
            None => Outcome {
                outage: Some(anyhow::anyhow!(
                    "no broker connection to finish the batch on"
                )),
                ..Outcome::default()
            },
        }
    }

    pub fn close(self) {
        if let Some(publisher) = self.publisher {
            publisher.close();
        }
    }
}

/// Opens the batch's transaction, claims and hands the events to the broker.
///
/// The row locks taken by the claim are what keep concurrent runs apart,
/// so they must be held until the marks are committed: releasing them any
/// earlier would let another run claim and re-send events we have already
/// published. If anything fails before the commit, the transaction is
/// rolled back and the events are claimed again by a later run: a
/// duplicate at worst, never a loss. Only rows from id `from` on are
/// claimed (all of them if None).
pub fn start(
    session: &mut Session,
    poll: &Poll,
    broker: &mut Broker,
    stop: &Stop,
    totals: &mut Totals,
    from: Option<i64>,
) -> Result<Started> {
    session.begin()?;
    let started = claim_and_send(session, poll, broker, stop, totals, from);
    match &started {
        Ok(Started::InFlight(_)) => {}
        Ok(Started::Ended(Ended::Empty | Ended::LockTaken)) => {
            if let Err(error) = session.commit() {
                session.roll_back();
                return Err(error);
            }
        }
        Ok(Started::Ended(_)) | Err(_) => session.roll_back(),
    }
    started
}

fn claim_and_send(
    session: &mut Session,
    poll: &Poll,
    broker: &mut Broker,
    stop: &Stop,
    totals: &mut Totals,
    from: Option<i64>,
) -> Result<Started> {
    if !session.outbox.try_lock(&mut session.client)? {
        return Ok(Started::Ended(Ended::LockTaken));
    }
    let events = session
        .outbox
        .claim(&mut session.client, poll.batch_size, from)?;
    if events.is_empty() {
        return Ok(Started::Ended(Ended::Empty));
    }
    if poll.dry_run {
        print_events(&events)?;
        totals.claimed += events.len() as u64;
        return Ok(Started::Ended(Ended::DryRun));
    }
    if stop.requested().is_some() {
        return Ok(Started::Ended(Ended::Stopped));
    }
    let sent = broker.publisher()?.start(&events, poll.ordered)?;
    Ok(Started::InFlight(InFlight { events, sent }))
}

/// Awaits the batch's confirms, marks what the broker said and commits.
///
/// An outage ends the batch like any other outcome: what was confirmed is
/// marked and committed, and the events with no answer are left exactly as
/// they were (no attempt counted: the broker failing is not their fault).
pub fn finish(
    session: &mut Session,
    batch: InFlight,
    broker: &mut Broker,
    totals: &mut Totals,
) -> Result<()> {
    let InFlight { events, sent } = batch;
    let outcome = broker.finish(sent, &events);
    let committed = session.mark(&outcome).and_then(|()| session.commit());
    if committed.is_err() {
        session.roll_back();
    }
    committed?;
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
        None => Ok(()),
    }
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
