//! One batch: one transaction from claim to commit. `open` claims and
//! hands the events to the broker; `answer` awaits the confirms; `commit`
//! marks and commits (on the committer's thread, for a plain drain);
//! `account` counts the batch. A drain may open the next batch, on a
//! session of its own, before this one is answered.
//!
//! An outage ends a batch like any other outcome: what was confirmed is
//! marked and committed, and the events with no answer are left exactly
//! as they were (no attempt counted: the broker failing is not their
//! fault).

use std::time::{Instant, SystemTime};

use anyhow::Result;

use crate::broker::Broker;
use crate::broker::publisher::{Outcome, Sent};
use crate::broker::round::NACKED;
use crate::config::Relay;
use crate::guard::stop::Stop;
use crate::relay::session::{Session, Uncommitted};
use crate::report::dry_run;
use crate::report::totals::Totals;
use crate::report::traces::{BatchTrace, Place, Traces};
use crate::sql::outbox::{Event, Start};

/// Why a batch ended before anything was published.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Nothing was due.
    Empty,
    /// --ordered and another run holds the table's lock.
    LockTaken,
    /// --dry-run printed the batch and rolled back.
    DryRun,
    /// A signal came before anything was published; rolled back.
    Stopped,
}

/// A batch claimed and handed to the broker: its transaction open (its rows
/// locked), its confirms on their way.
pub(crate) struct InFlight {
    /// The events sent.
    events: Vec<Event>,
    /// None when every event claimed had expired: nothing was sent, and
    /// the broker was not even connected to.
    sent: Option<Sent>,
    /// The events claimed past their expires_at, to mark expired.
    expired: Vec<Event>,
    /// The batch's spans, when the run exports traces (boxed: a batch
    /// without them stays small).
    trace: Option<Box<BatchTrace>>,
}

impl InFlight {
    /// Every event the batch claimed, in claim order as far as a drain's
    /// next start needs (see `last_id`, `last_key`).
    fn all(&self) -> impl DoubleEndedIterator<Item = &Event> {
        self.events.iter().chain(&self.expired)
    }

    /// How many events the batch claimed.
    pub(crate) fn claimed(&self) -> usize {
        self.events.len() + self.expired.len()
    }

    /// The last id claimed: the highest, for a plain claim, which is in id
    /// order (and never empty).
    pub(crate) fn last_id(&self) -> i64 {
        self.all().map(|event| event.id).max().unwrap_or(i64::MIN)
    }

    /// The payload bytes the batch holds, for --batch-bytes.
    pub(crate) fn bytes(&self) -> i64 {
        payload_bytes(self.all())
    }

    /// The last key claimed, in the order of an --ordered-by-key claim.
    pub(crate) fn last_key(&self) -> Option<&str> {
        self.events
            .iter()
            .rev()
            .chain(self.expired.iter().rev())
            .find_map(|event| event.ordering_key.as_deref())
    }
}

/// What `open` left. One per batch, moved at once into the drain's flight:
/// boxing the large variant would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Opened {
    InFlight(InFlight),
    /// Nothing to settle: the transaction is already over.
    Ended(Ended),
}

/// Opens the batch's transaction, claims and hands the events to the broker.
///
/// The row locks taken by the claim are what keep concurrent runs apart,
/// so they must be held until the marks are committed: releasing them any
/// earlier would let another run claim and re-send events we have already
/// published. If anything fails before the commit, the transaction is
/// rolled back and the events are claimed again by a later run: a
/// duplicate at worst, never a loss. The claim starts where `start` says,
/// and holds about `bytes` of payloads at most; `traces`, when the run
/// exports them, with the outbox the batch's span names.
#[allow(clippy::too_many_arguments)]
pub(crate) fn open(
    session: &mut Session,
    relay: &Relay,
    broker: &mut Broker,
    stop: &Stop,
    totals: &mut Totals,
    start: &Start,
    bytes: i64,
    traces: Option<(&Traces, &Place)>,
) -> Result<Opened> {
    // The clock is read only when there are spans to time.
    let traced = traces.map(|(traces, place)| Traced {
        traces,
        place,
        began: (SystemTime::now(), Instant::now()),
    });
    session.begin()?;
    let claimed = Claim {
        relay,
        start,
        bytes,
        traces: traced,
    };
    let opened = claim_and_send(session, &claimed, broker, stop, totals);
    match &opened {
        Ok(Opened::InFlight(_)) => {}
        Ok(Opened::Ended(Ended::Empty | Ended::LockTaken)) => {
            if let Err(error) = session.commit() {
                session.roll_back();
                return Err(error);
            }
        }
        Ok(Opened::Ended(_)) | Err(_) => session.roll_back(),
    }
    opened
}

/// What a claim is made of: where it starts, how many payload bytes it
/// may hold, and the run's traces with when the transaction began.
struct Claim<'a> {
    relay: &'a Relay,
    start: &'a Start,
    bytes: i64,
    traces: Option<Traced<'a>>,
}

/// A claim's tracing: the run's traces, the outbox its span names, and
/// when the transaction began.
struct Traced<'a> {
    traces: &'a Traces,
    place: &'a Place,
    began: (SystemTime, Instant),
}

fn claim_and_send(
    session: &mut Session,
    claim: &Claim,
    broker: &mut Broker,
    stop: &Stop,
    totals: &mut Totals,
) -> Result<Opened> {
    let (relay, start, bytes) = (claim.relay, claim.start, claim.bytes);
    if !session.before_claim()? {
        return Ok(Opened::Ended(Ended::LockTaken));
    }
    let events = session.claim(relay.batch_size, start, bytes)?;
    if events.is_empty() {
        return Ok(Opened::Ended(Ended::Empty));
    }
    if relay.dry_run {
        dry_run::print(&events)?;
        totals.claimed += events.len() as u64;
        return Ok(Opened::Ended(Ended::DryRun));
    }
    if stop.requested().is_some() {
        return Ok(Opened::Ended(Ended::Stopped));
    }
    // An event past its expires_at is never published: it is marked with
    // the others, in this transaction.
    let (expired, mut events): (Vec<Event>, Vec<Event>) =
        events.into_iter().partition(Event::expired);
    // The publish spans start before the send, which carries their
    // context in the messages' traceparent.
    let trace = claim.traces.as_ref().map(|traced| {
        let batch = traced
            .traces
            .publishing(traced.place, traced.began, &mut events);
        Box::new(batch)
    });
    let sent = match events.is_empty() {
        true => None,
        false => Some(broker.send(&events, relay.ordered)?),
    };
    Ok(Opened::InFlight(InFlight {
        events,
        sent,
        expired,
        trace,
    }))
}

/// A batch the broker has answered: the events sent and the batch's
/// spans, which stay with the run, and the marks, which go with the
/// batch's session to its commit (see `commit`).
pub(crate) struct Told {
    events: Vec<Event>,
    trace: Option<Box<BatchTrace>>,
}

impl Told {
    /// The payload bytes the batch still holds, for --batch-bytes.
    pub(crate) fn bytes(&self) -> i64 {
        payload_bytes(self.events.iter())
    }
}

/// The payload bytes of `events`, for --batch-bytes.
fn payload_bytes<'e>(events: impl Iterator<Item = &'e Event>) -> i64 {
    let bytes: usize = events.map(|event| event.payload.len()).sum();
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// What to mark in a batch's transaction: what the broker said, and the
/// events that had expired (never sent).
pub(crate) struct Marks {
    outcome: Outcome,
    expired: Vec<i64>,
}

impl Marks {
    /// Whether the broker failed the batch: no other batch should open.
    pub(crate) fn outage(&self) -> bool {
        self.outcome.outage.is_some()
    }

    /// How many events the marks cover.
    fn count(&self) -> usize {
        let outcome = &self.outcome;
        outcome.confirmed.len() + outcome.failed.len() + outcome.declined.len() + self.expired.len()
    }
}

/// Awaits the batch's confirms (within the deadline set when it was sent).
pub(crate) fn answer(batch: InFlight, broker: &mut Broker) -> (Told, Marks) {
    let InFlight {
        events,
        sent,
        expired,
        trace,
    } = batch;
    let outcome = match sent {
        Some(sent) => broker.outcome(sent, &events),
        None => Outcome::default(),
    };
    let expired = expired.iter().map(|event| event.id).collect();
    (Told { events, trace }, Marks { outcome, expired })
}

/// Marks what the broker said and commits, in the batch's transaction on
/// its own session; a transaction that could not commit is rolled back.
/// It touches nothing of the run's, so it may run on a thread of its own
/// (see relay::committer).
pub(crate) fn commit(session: &mut Session, marks: &Marks) -> Result<(), Uncommitted> {
    if let Err(error) = session.mark(&marks.outcome, &marks.expired) {
        session.roll_back();
        return Err(Uncommitted::RolledBack(error));
    }
    let committed = session.commit_marks(marks.count());
    if let Err(Uncommitted::RolledBack(_)) = &committed {
        session.roll_back();
    }
    committed
}

/// Counts a batch whose commit is over in the run's totals, ends its
/// spans and tells its failures; an outage, or a commit that did not go
/// through, is the batch's error.
pub(crate) fn account(
    told: Told,
    marks: Marks,
    committed: Result<(), Uncommitted>,
    totals: &mut Totals,
    traces: Option<&Traces>,
) -> Result<()> {
    let Told { events, trace } = told;
    let marked = marks.count();
    let Marks { outcome, expired } = marks;
    if let (Some(traces), Some(trace)) = (traces, trace) {
        traces.settled(*trace, &events, &outcome, expired.len(), committed.is_ok());
    }
    match committed {
        Ok(()) => {}
        Err(Uncommitted::RolledBack(error)) => return Err(error),
        Err(Uncommitted::Unknown(error)) => {
            // Neither published nor failed as far as anyone can tell: the
            // summary and the metrics count these events apart.
            totals.claimed += (events.len() + expired.len()) as u64;
            totals.unknown += marked as u64;
            return Err(error);
        }
    }
    log_failures(&events, &outcome);
    // Exit 1 and the summary's `failed` count nacked events too: they were
    // not published, though no attempt was counted against them.
    let failed = outcome.failed.len() + outcome.declined.len();
    // Expiry is no failure: it leaves the exit code alone.
    totals.batches += 1;
    totals.claimed += (events.len() + expired.len()) as u64;
    totals.published += outcome.confirmed.len() as u64;
    totals.failed += failed as u64;
    totals.expired += expired.len() as u64;
    log::info!(
        "batch {}: claimed {}, published {}, failed {failed} (nacked {}), expired {}",
        totals.batches,
        events.len() + expired.len(),
        outcome.confirmed.len(),
        outcome.declined.len(),
        expired.len()
    );
    match outcome.outage {
        Some(outage) => Err(outage),
        None => Ok(()),
    }
}

/// A few lines, not one per event: under cron every line is mailed.
fn log_failures(events: &[Event], outcome: &Outcome) {
    const SHOWN: usize = 5;
    let failed = outcome
        .failed
        .iter()
        .map(|(id, reason)| (*id, reason.as_str()));
    let nacked = outcome.declined.iter().map(|id| (*id, NACKED));
    let all: Vec<(i64, &str)> = failed.chain(nacked).collect();
    for (id, reason) in all.iter().take(SHOWN) {
        let event = events.iter().find(|event| event.id == *id);
        let name = event.map_or("?", |event| event.event_id.as_str());
        log::warn!("event {name} (row {id}) failed: {reason}");
    }
    if all.len() > SHOWN {
        log::warn!("... and {} more failed events", all.len() - SHOWN);
    }
}
