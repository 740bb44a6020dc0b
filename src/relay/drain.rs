//! Batch after batch. A drain that meets a backlog keeps several batches in
//! flight, each a transaction on a PostgreSQL session of its own: while the
//! oldest awaits its confirms, the next are claimed and sent, so the broker
//! is not left idle while PostgreSQL marks and commits.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::broker::Broker;
use crate::config::{Database, Relay};
use crate::connect::database::STATEMENT_TIMEOUT;
use crate::exit::{self, Exit};
use crate::guard::stop::Stop;
use crate::guard::watchdog::{self, Watchdog};
use crate::relay::batch::{self, Ended, InFlight, Marks, Opened, Told};
use crate::relay::committer::Committer;
use crate::relay::session::{Session, Uncommitted};
use crate::report::progress::Progress;
use crate::report::totals::Totals;
use crate::report::traces::{Place, Traces};
use crate::sql::outbox::{Order, Start};

/// What every batch of a run shares.
pub(crate) struct Drain<'a> {
    pub(crate) database: &'a Database,
    pub(crate) relay: &'a Relay,
    pub(crate) watchdog: &'a Watchdog,
    pub(crate) stop: &'a Stop,
    pub(crate) broker: &'a mut Broker,
    pub(crate) progress: &'a mut Progress,
    pub(crate) totals: &'a mut Totals,
    pub(crate) started: Instant,
    /// How many sessions the run may have: one for each batch in flight
    /// and one for the batch a plain drain commits (`Relay::sessions`),
    /// fewer once the server has refused one more. Kept for the whole run,
    /// so that a follow, whose sessions go and come with each burst, tries
    /// and warns only once.
    pub(crate) session_limit: usize,
    /// The run's traces, when it exports them, and the outbox they name.
    pub(crate) traces: Option<(&'a Traces, &'a Place)>,
}

/// The batches in flight, oldest first, each with the index of its session.
type Flight = VecDeque<(usize, InFlight)>;

/// The run's sessions and which of them have no batch. A session is out
/// of its place (None) while its batch commits on the committer's thread.
struct Sessions {
    all: Vec<Option<Session>>,
    idle: Vec<usize>,
}

impl Sessions {
    fn at(&mut self, index: usize) -> &mut Session {
        self.all[index]
            .as_mut()
            .expect("a session is out of its place only while its batch commits")
    }
}

/// The batch whose marks the committer is committing: its session's
/// index, and what the run counts once the commit is over.
type Committing = (usize, Told);

/// What a failure leaves to settle, oldest first: the batch the committer
/// has, the batch whose confirms are in, and the batches in flight.
struct Pending {
    committing: Option<Committing>,
    answered: Option<(usize, Told, Marks)>,
    flight: Flight,
}

impl Pending {
    /// Only the batches in flight.
    fn behind(flight: Flight) -> Self {
        Pending {
            committing: None,
            answered: None,
            flight,
        }
    }
}

/// The failure a drain reports, and those it has told already.
struct Failures {
    reported: anyhow::Error,
    told: Vec<String>,
}

impl Failures {
    fn new(first: anyhow::Error) -> Self {
        Failures {
            told: vec![format!("{first:#}")],
            reported: first,
        }
    }

    /// A later batch's result: a failure is told once; a refusal the
    /// operator must fix is reported over an outage (see
    /// `settle_after_failure`).
    fn add(&mut self, later: Result<()>) {
        let Err(later) = later else { return };
        let text = format!("{later:#}");
        if self.told.contains(&text) {
            return;
        }
        if Exit::of(&later) == Exit::Config && Exit::of(&self.reported) != Exit::Config {
            log::info!("a consequence of the failure below: {:#}", self.reported);
            self.reported = later;
        } else {
            log::warn!("a batch in flight failed too: {text}");
        }
        self.told.push(text);
    }
}

/// How long a row behind the drain's claims may wait while the drain goes
/// on (see Claims).
const HEAD_EVERY: Duration = Duration::from_secs(1);

/// Where the drain's claims stand.
///
/// While a backlog lasts, each claim starts after the last row the drain
/// claimed, so the drain does not walk back, claim after claim, over the
/// index entries of the rows it has marked (vacuum has not removed them
/// yet) and over the rows its other batches hold. Rows can turn up behind
/// it, though: a producer's transaction that committed after later ids
/// did, a backoff that ran out, rows another run gave back. So a claim
/// starts from the head of the table again at least every HEAD_EVERY, after
/// any claim that was not full (the drain has caught up), and before the
/// drain ends: "until none is claimed" still means none at all.
///
/// --ordered-by-key's claims walk the keys instead, and start after the
/// last key the drain claimed: the keys right after it are those its
/// batches in flight do not hold. Each of its claims goes round every key,
/// so none is passed over. --ordered always claims from the head.
pub(super) struct Claims {
    pub(super) from: Option<i64>,
    key: Option<String>,
    head_at: Instant,
    /// The last claim was a full batch: a backlog is waiting, worth another
    /// session. A partial one says the drain is about done.
    backlog: bool,
}

impl Claims {
    pub(super) fn new() -> Self {
        Claims {
            from: None,
            key: None,
            head_at: Instant::now(),
            backlog: false,
        }
    }

    /// Where the next claim starts, in the run's order.
    pub(super) fn next(&self, order: Order) -> Start {
        match order {
            Order::Plain => match self.from.filter(|_| self.head_at.elapsed() < HEAD_EVERY) {
                Some(id) => Start::Id(id),
                None => Start::Head,
            },
            Order::ByKey => self.key.clone().map_or(Start::Head, Start::AfterKey),
            Order::Strict => Start::Head,
        }
    }

    /// After a claim from `start` that returned `batch`.
    pub(super) fn claimed(&mut self, start: &Start, batch: &InFlight, batch_size: i64) {
        if *start == Start::Head {
            self.head_at = Instant::now();
        }
        self.backlog = batch.claimed() as i64 == batch_size;
        self.from = match self.backlog {
            true => batch.last_id().checked_add(1),
            false => None,
        };
        if let Some(key) = batch.last_key() {
            self.key = Some(key.to_string());
        }
    }
}

impl Drain<'_> {
    /// Runs batches until nothing is due, a limit is reached, a signal
    /// comes or one fails. `sessions` holds the run's first session; more
    /// may be added, up to `Relay::sessions`.
    ///
    /// Each batch is a transaction of its own, holding its rows' locks until
    /// its own commit: SKIP LOCKED keeps batches in flight apart exactly as
    /// it keeps concurrent runs apart. Each has its own channel, so no return
    /// or channel close can be blamed on another batch's events. Batches are
    /// settled in the order they were sent, so a batch's confirm deadline
    /// has always passed or been met before the next one's.
    ///
    /// A plain drain commits each batch on the committer's thread, on one
    /// more session, while it awaits the next batch's confirms (see
    /// relay::committer); the batches are still counted in the order they
    /// were sent. The ordered modes commit on the drain's thread: their
    /// next claim must see the batch before it committed (--ordered's table
    /// lock, --ordered-by-key's keys).
    pub(crate) fn run(&mut self, sessions: &mut Vec<Session>) -> Result<()> {
        let mut pool = Sessions {
            // Session 0 first: with --follow, later rounds find the
            // sessions an earlier backlog opened, all idle.
            idle: (0..sessions.len()).rev().collect(),
            all: sessions.drain(..).map(Some).collect(),
        };
        let mut committer = self.relay.commits_apart().then(Committer::default);
        let result = self.batches(&mut pool, committer.as_mut());
        // Every commit is over by now: each session is in its place.
        sessions.extend(pool.all.into_iter().flatten());
        result
    }

    fn batches(
        &mut self,
        sessions: &mut Sessions,
        mut committer: Option<&mut Committer>,
    ) -> Result<()> {
        let mut flight = Flight::new();
        let mut committing: Option<Committing> = None;
        let mut claims = Claims::new();
        let mut claiming = true;
        let by_key = self.relay.order() == Order::ByKey;
        loop {
            // --batch-bytes bounds the payloads of every batch in flight
            // together: a claim gets what the others leave of it.
            // The batch that commits still holds its events.
            let held = committing.as_ref().map_or(0, |(_, told)| told.bytes());
            let room = |flight: &Flight| self.relay.batch_bytes - held - bytes(flight);
            // A batch that commits still counts for --max-batches; it no
            // longer holds anything at the broker.
            let opened = |flight: &Flight| flight.len() + usize::from(committing.is_some());
            while claiming
                && flight.len() < self.relay.in_flight
                && self.may_open(opened(&flight))
                && room(&flight) > 0
            {
                let Some(index) = self.free_session(sessions, claims.backlog) else {
                    break;
                };
                // Opening a session takes time: --max-duration may have passed.
                if !self.may_open(opened(&flight)) {
                    sessions.idle.push(index);
                    break;
                }
                self.arm_for_batches();
                match self.open_next(sessions.at(index), &mut claims, room(&flight)) {
                    Ok(Some(batch)) => {
                        // --ordered-by-key: a batch that is not full took
                        // every event claimable now; the next events of its
                        // keys become claimable once it has settled.
                        if by_key && (batch.claimed() as i64) < self.relay.batch_size {
                            claiming = false;
                        }
                        flight.push_back((index, batch));
                    }
                    Ok(None) => {
                        sessions.idle.push(index);
                        claiming = false;
                    }
                    Err(error) => {
                        let pending = Pending {
                            committing: committing.take(),
                            ..Pending::behind(flight)
                        };
                        return self.settle_after_failure(sessions, committer, pending, error);
                    }
                }
            }
            let Some((index, batch)) = flight.pop_front() else {
                // Nothing in flight: the drain is over, or its next batch
                // waits for the session of the batch that commits.
                let Some(last) = committing.take() else {
                    return Ok(());
                };
                self.committed(sessions, committer.as_deref_mut(), last)?;
                continue;
            };
            self.arm_for_batches();
            let (told, marks) = batch::answer(batch, self.broker);
            // The batch before this one is counted first.
            if let Some(previous) = committing.take()
                && let Err(error) = self.committed(sessions, committer.as_deref_mut(), previous)
            {
                let pending = Pending {
                    answered: Some((index, told, marks)),
                    ..Pending::behind(flight)
                };
                return self.settle_after_failure(sessions, committer, pending, error);
            }
            match committer.as_deref_mut() {
                // A batch the broker failed opens no other: it is
                // committed here, and ends the drain.
                Some(committer) if !marks.outage() => {
                    let session = sessions.all[index].take().expect("the batch's session");
                    committer.commit(session, marks);
                    committing = Some((index, told));
                }
                _ => {
                    if let Err(error) = self.commit_here(sessions, index, told, marks) {
                        let pending = Pending::behind(flight);
                        return self.settle_after_failure(sessions, committer, pending, error);
                    }
                }
            }
            // --ordered-by-key: a claim that found nothing may have found
            // every key held by the batches in flight, and this one's keys
            // may have their next events claimable now. The drain ends once
            // a claim finds nothing with no batch in flight.
            claiming |= by_key;
        }
    }

    /// Waits for the committer's batch, puts its session back in its
    /// place and counts the batch.
    fn committed(
        &mut self,
        sessions: &mut Sessions,
        committer: Option<&mut Committer>,
        (index, told): Committing,
    ) -> Result<()> {
        let committer = committer.expect("a batch commits on the committer's thread");
        self.arm_for_batches();
        let (session, marks, committed) = committer.wait();
        sessions.all[index] = Some(session);
        sessions.idle.push(index);
        self.count(told, marks, committed)
    }

    /// Marks and commits a batch on the drain's own thread, and counts it.
    fn commit_here(
        &mut self,
        sessions: &mut Sessions,
        index: usize,
        told: Told,
        marks: Marks,
    ) -> Result<()> {
        let committed = batch::commit(sessions.at(index), &marks);
        sessions.idle.push(index);
        self.count(told, marks, committed)
    }

    /// Counts a batch whose commit is over (see batch::account).
    fn count(
        &mut self,
        told: Told,
        marks: Marks,
        committed: Result<(), Uncommitted>,
    ) -> Result<()> {
        let traces = self.traces.map(|(traces, _)| traces);
        let counted = batch::account(told, marks, committed, self.totals, traces);
        self.progress.update(self.totals);
        counted
    }

    /// Opens a batch where the claims stand, and sends it. Returns None
    /// when the drain has nothing more to open.
    fn open_next(
        &mut self,
        session: &mut Session,
        claims: &mut Claims,
        bytes: i64,
    ) -> Result<Option<InFlight>> {
        let relay = self.relay;
        let start = claims.next(relay.order());
        match batch::open(
            session,
            relay,
            self.broker,
            self.stop,
            self.totals,
            &start,
            bytes,
            self.traces,
        )? {
            Opened::InFlight(batch) => {
                claims.claimed(&start, &batch, relay.batch_size);
                Ok(Some(batch))
            }
            // Only a plain claim can pass over rows (those behind where it
            // started): it looks again from the head.
            Opened::Ended(Ended::Empty) if matches!(start, Start::Id(_)) => {
                claims.from = None;
                self.open_next(session, claims, bytes)
            }
            Opened::Ended(_) => Ok(None),
        }
    }

    /// After a failure, settles the batches still in flight: they are on
    /// the wire, and what the broker confirmed of them must be marked rather
    /// than sent again by the next run. The exit reports the first failure,
    /// except that a refusal the operator must fix (exit 78) outranks an
    /// outage: an outage that comes with one is its consequence (RabbitMQ
    /// closes the connection when publishes still queued for a channel it
    /// refused reach it after the close). A different later failure (the
    /// batches are on different sessions) is still told, the same one again
    /// is not.
    fn settle_after_failure(
        &mut self,
        sessions: &mut Sessions,
        committer: Option<&mut Committer>,
        pending: Pending,
        error: anyhow::Error,
    ) -> Result<()> {
        let mut failures = Failures::new(error);
        if let Some(committing) = pending.committing {
            let committed = self.committed(sessions, committer, committing);
            failures.add(committed);
        }
        if let Some((index, told, marks)) = pending.answered {
            failures.add(self.commit_here(sessions, index, told, marks));
        }
        for (index, batch) in pending.flight {
            self.arm_for_batches();
            let (told, marks) = batch::answer(batch, self.broker);
            failures.add(self.commit_here(sessions, index, told, marks));
        }
        Err(failures.reported)
    }

    /// A session for the next batch: an idle one, or, while a backlog is
    /// waiting, a new one. More sessions are worth having, not worth failing
    /// for: a role with a connection limit, or a server at max_connections,
    /// still gets its drain, with fewer batches in flight.
    fn free_session(&mut self, sessions: &mut Sessions, backlog: bool) -> Option<usize> {
        if let Some(index) = sessions.idle.pop() {
            return Some(index);
        }
        if !backlog || sessions.all.len() >= self.session_limit {
            return None;
        }
        let budget = self.database.connect_budget() + STATEMENT_TIMEOUT + watchdog::MARGIN;
        self.watchdog
            .arm(budget, "opening another PostgreSQL session", *self.totals);
        match Session::open(self.database, self.relay, self.stop) {
            Ok(session) => {
                sessions.all.push(Some(session));
                Some(sessions.all.len() - 1)
            }
            // A signal came: no new batch starts, which may_open now says.
            Err(error) if exit::is_stop(&error) => None,
            Err(error) => {
                self.session_limit = sessions.all.len();
                match self.session_limit {
                    1 => log::warn!("draining one batch at a time: {error:#}"),
                    n => log::warn!("draining with {n} batches in flight: {error:#}"),
                }
                None
            }
        }
    }

    /// Whether another batch may open, with `in_flight` batches opened
    /// and not yet settled. A run always opens its first batch; a drain
    /// opens no new one once --max-batches or --max-duration is reached or
    /// a signal came (those in hand are settled).
    fn may_open(&self, in_flight: usize) -> bool {
        let started = self.totals.batches + in_flight as u64;
        started == 0 || (self.relay.drain && self.within_limits(started))
    }

    /// Whether a drain that has started `started` batches may go on: no
    /// signal came, and neither --max-batches nor --max-duration is reached.
    pub(super) fn within_limits(&self, started: u64) -> bool {
        let relay = self.relay;
        self.stop.requested().is_none()
            && relay.max_batches.is_none_or(|max| started < max)
            && relay
                .max_duration
                .is_none_or(|max| self.started.elapsed() < max)
    }

    /// One budget covers each step: opening a batch, or settling it (whose
    /// confirm deadline was set when it was sent).
    fn arm_for_batches(&self) {
        self.watchdog
            .arm(batch_budget(self.relay), "the batch", *self.totals);
    }
}

/// The payload bytes of the batches in flight.
fn bytes(flight: &Flight) -> i64 {
    flight.iter().map(|(_, batch)| batch.bytes()).sum()
}

/// Every bound a batch can meet, one after the other: connecting to the
/// broker (each node of the list in turn) and opening its channel, the
/// confirms, and the batch's SQL, which
/// touches one batch of rows by primary key and so gets one statement's
/// time in all (each statement is also bounded by the server). A start
/// that finds nothing after the drain's last claim claims again from the
/// head; on a healthy server both claims take milliseconds, and one that
/// takes most of a statement timeout to find nothing is what this bound is
/// for.
pub(super) fn batch_budget(relay: &Relay) -> Duration {
    relay.broker.connect_budget()
        + relay.broker.connect_timeout
        + relay.broker.confirm_timeout
        + STATEMENT_TIMEOUT
        + watchdog::MARGIN
}
