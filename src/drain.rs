//! Batch after batch: one at a time, or, once a drain meets a backlog, two
//! in flight, the next claimed and sent while the last awaits its confirms.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::batch::{self, Broker, Ended, InFlight, Session, Started, Totals};
use crate::config::{Database, Poll};
use crate::db;
use crate::progress::Progress;
use crate::stop::Stop;
use crate::watchdog::{self, Watchdog};

/// What every batch of a run shares.
pub struct Drain<'a> {
    pub database: &'a Database,
    pub poll: &'a Poll,
    pub watchdog: &'a Watchdog,
    pub stop: &'a Stop,
    pub broker: &'a mut Broker,
    pub progress: &'a mut Progress,
    pub totals: &'a mut Totals,
    pub started: Instant,
}

impl Drain<'_> {
    /// Runs batches until nothing is due, a limit is reached, a signal
    /// comes or one fails. `sessions` holds the run's first session; a
    /// second may be added.
    pub fn run(&mut self, sessions: &mut Vec<Session>) -> Result<()> {
        // Ordered mode may not overlap: the next batch would be published
        // before the last one's failures were known.
        let mut overlap = self.poll.drain && !self.poll.ordered;
        loop {
            self.arm_for_batches();
            let claimed = self.totals.claimed;
            match batch::run(
                &mut sessions[0],
                self.poll,
                self.broker,
                self.stop,
                self.totals,
            )? {
                Ended::Settled if self.may_start(0) => {}
                _ => return Ok(()),
            }
            self.progress.update(self.totals);
            // A full batch says a backlog is waiting: worth a second
            // session. A partial one says the drain is about done.
            let full = self.totals.claimed - claimed == self.poll.batch_size as u64;
            if overlap && full && self.may_start(1) {
                overlap = self.open_second_session(sessions);
                if overlap {
                    return self.two_in_flight(sessions);
                }
            }
        }
    }

    /// While one batch awaits its confirms, the next is claimed and sent on
    /// the other session, so the broker is not left idle while PostgreSQL
    /// marks and commits. Each batch is still a transaction of its own,
    /// holding its rows' locks until its own commit; SKIP LOCKED keeps the
    /// two apart exactly as it keeps two concurrent runs apart, and each
    /// has its own channel, so no return or channel close can be blamed on
    /// the other's events.
    ///
    /// If the earlier batch fails, the later one is on the wire already:
    /// it is still finished, so that what the broker confirmed of it is
    /// marked rather than sent again by the next run.
    fn two_in_flight(&mut self, sessions: &mut [Session]) -> Result<()> {
        // Opening the session took time: --max-duration may have passed.
        if !self.may_start(0) {
            return Ok(());
        }
        self.arm_for_batches();
        let mut lane = 0;
        let Some(mut waiting) = self.start(&mut sessions[lane])? else {
            return Ok(());
        };
        loop {
            let other = 1 - lane;
            self.arm_for_batches();
            let next = match self.may_start(1) {
                true => self.start(&mut sessions[other]),
                false => Ok(None),
            };
            let finished = batch::finish(&mut sessions[lane], waiting, self.broker, self.totals);
            self.progress.update(self.totals);
            match (finished, next) {
                (Ok(_), Ok(Some(batch))) => (waiting, lane) = (batch, other),
                (Ok(_), next) => return next.map(drop),
                (Err(error), Ok(Some(batch))) => {
                    self.arm_for_batches();
                    // The exit reports the first failure. A different
                    // second one (the batches are on different sessions)
                    // is still told; the same outage twice is not.
                    let later =
                        batch::finish(&mut sessions[other], batch, self.broker, self.totals);
                    if let Err(later) = later
                        && format!("{later:#}") != format!("{error:#}")
                    {
                        log::warn!("the batch after it failed too: {later:#}");
                    }
                    return Err(error);
                }
                (Err(error), _) => return Err(error),
            }
        }
    }

    fn start(&mut self, session: &mut Session) -> Result<Option<InFlight>> {
        let started = batch::start(session, self.poll, self.broker, self.stop, self.totals)?;
        Ok(match started {
            Started::InFlight(batch) => Some(batch),
            Started::Ended(_) => None,
        })
    }

    /// A second session is worth having, not worth failing for: a role
    /// with a connection limit, or a server at max_connections, still gets
    /// its drain, one batch at a time.
    fn open_second_session(&mut self, sessions: &mut Vec<Session>) -> bool {
        let budget = self.database.connect_timeout + db::STATEMENT_TIMEOUT + watchdog::MARGIN;
        self.watchdog
            .arm(budget, "opening a second PostgreSQL session", *self.totals);
        match Session::open(self.database, self.poll) {
            Ok(session) => {
                sessions.push(session);
                true
            }
            Err(error) => {
                log::warn!("draining one batch at a time: {error:#}");
                false
            }
        }
    }

    /// Whether another batch may start, with `in_flight` batches started
    /// and not yet finished. No new batch starts once --max-batches or
    /// --max-duration is reached or a signal came; those in hand finish.
    fn may_start(&self, in_flight: u64) -> bool {
        let poll = self.poll;
        let started = self.totals.batches + in_flight;
        poll.drain
            && self.stop.requested().is_none()
            && poll.max_batches.is_none_or(|max| started < max)
            && poll
                .max_duration
                .is_none_or(|max| self.started.elapsed() < max)
    }

    /// One budget covers a batch's start and the finish of the one before
    /// it: the earlier batch's confirm deadline was set before this one's.
    fn arm_for_batches(&self) {
        self.watchdog
            .arm(batch_budget(self.poll), "the batch", *self.totals);
    }
}

/// Every bound a batch can meet, one after the other: connecting to the
/// broker and opening its channel, the confirms, and the batch's SQL, which
/// touches one batch of rows by primary key and so gets one statement's
/// time in all (each statement is also bounded by the server).
fn batch_budget(poll: &Poll) -> Duration {
    2 * poll.broker.connect_timeout
        + poll.broker.confirm_timeout
        + db::STATEMENT_TIMEOUT
        + watchdog::MARGIN
}
