//! A run over many outboxes (see `plan`): every table a `--table` list or
//! pattern selects, in every database of `--databases`, in this shard.
//!
//! The plan says which outboxes have due events; only those are served.
//! Their batches are taken in turn (round-robin), one batch of each busy
//! outbox per turn and at most one in flight per outbox, so one outbox's
//! backlog delays another's events by one batch per busy outbox at most.
//! The batches are those of a single outbox's run (`batch::open`,
//! `answer`, `commit`, `account`; a plain drain commits on the
//! committer's thread), on sessions pooled per database under
//! --max-connections, which keep each table's statements prepared for
//! its next turn. One broker connection serves them all, opened by the
//! first batch that claims events.
//!
//! An outbox whose database is down, whose table is broken or whose
//! events fail ends alone, with its own result and one line on stderr;
//! the others go on. A failure of the broker itself ends the run: every
//! outbox would meet it. The exit code is the most urgent over the
//! outboxes: 78, then 69, then 1, then 0 (a signal's, as always).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use postgres::Client;

use crate::broker::Broker;
use crate::config::Relay;
use crate::connect::database::STATEMENT_TIMEOUT;
use crate::exit::{self, Exit};
use crate::guard::stop::Stop;
use crate::guard::watchdog::{self, Watchdog};
use crate::plan::{self, Plan, Planned, Selection};
use crate::relay::CLOSE_BUDGET;
use crate::relay::batch::{self, Ended, InFlight, Marks, Opened, Told};
use crate::relay::committer::Committer;
use crate::relay::drain::{Claims, batch_budget};
use crate::relay::session::{self, Session, Uncommitted};
use crate::relay::wake::{LOOK_EVERY, Tables, Wake};
use crate::report::metrics;
use crate::report::stderr;
use crate::report::summary;
use crate::report::totals::{Outcome, Totals};
use crate::report::traces::{Place, Traces};
use crate::sql::outbox::{Order, Start};

/// The longest one wait lasts before the run looks at the signals and
/// --max-duration again: a signal ends a follow within this.
const SLICE: Duration = Duration::from_millis(250);
/// How long after its last batch a follow keeps the broker connection.
const LINGER: Duration = Duration::from_secs(2);

/// One outbox being served.
struct Lane {
    planned: Planned,
    totals: Totals,
    claims: Claims,
    /// Its batch in flight, if any: at most one at a time.
    in_flight: bool,
    /// The failure that ended it.
    error: Option<anyhow::Error>,
    /// What its batches' spans name, when the run exports traces.
    place: Option<Place>,
}

/// A pooled session: as the plan opened it, or with statements prepared.
enum Conn {
    Fresh(Client),
    Ready(Session),
}

impl Conn {
    fn client(&mut self) -> &mut Client {
        match self {
            Conn::Fresh(client) => client,
            Conn::Ready(session) => &mut session.client,
        }
    }
}

/// The run's PostgreSQL sessions, per database, at most --max-connections
/// in all (idle ones here, the others with their batches in flight or
/// with the committer).
struct Pool {
    idle: Vec<(usize, Conn)>,
    open: usize,
    limit: usize,
    /// Databases whose connect failed during the run: their other outboxes
    /// fail at once with the same reason rather than wait for it again.
    down: Vec<(usize, Exit, String)>,
}

impl Pool {
    fn put(&mut self, server: usize, session: Session) {
        // A session whose connection is gone serves no one.
        match session.client.is_closed() {
            true => self.open -= 1,
            false => self.idle.push((server, Conn::Ready(session))),
        }
    }

    /// A session serving `lane`'s table: one of its database's idle
    /// sessions, or a new one within the limit (closing an idle session of
    /// another database if it must). None: every session has a batch in
    /// flight or committing; settle one first.
    fn get(
        &mut self,
        selection: &Selection,
        relay: &Relay,
        stop: &Stop,
        planned: &Planned,
    ) -> Result<Option<Session>> {
        let server = planned.server;
        if let Some((_, exit, text)) = self.down.iter().find(|(down, _, _)| *down == server) {
            return Err(again(*exit, text));
        }
        let conn = match self.idle.iter().position(|(at, _)| *at == server) {
            Some(at) => self.idle.swap_remove(at).1,
            None => {
                if self.open >= self.limit {
                    if self.idle.is_empty() {
                        return Ok(None);
                    }
                    self.idle.remove(0);
                    self.open -= 1;
                }
                let info = &selection.servers[server].conninfo;
                match session::connect(info, selection.connect_timeout, relay, stop) {
                    Ok(client) => {
                        self.open += 1;
                        Conn::Fresh(client)
                    }
                    Err(error) => {
                        if !exit::is_stop(&error) {
                            let text = format!("{error:#}");
                            self.down.push((server, Exit::of(&error), text));
                        }
                        return Err(error);
                    }
                }
            }
        };
        let ready = match conn {
            Conn::Fresh(client) => Session::with_client(client, &planned.database, relay),
            Conn::Ready(mut session) => match session.serve(&planned.database, relay) {
                Ok(()) => Ok(session),
                Err(error) => {
                    self.put(server, session);
                    return Err(error);
                }
            },
        };
        // A session whose preparing failed is gone with its client.
        ready.map(Some).inspect_err(|_| self.open -= 1)
    }

    /// An idle session of `server`, taken out of the pool (to listen).
    fn take(&mut self, server: usize) -> Option<Client> {
        let at = self.idle.iter().position(|(of, _)| *of == server)?;
        let (_, conn) = self.idle.swap_remove(at);
        self.open -= 1;
        Some(match conn {
            Conn::Fresh(client) => client,
            Conn::Ready(session) => session.client,
        })
    }

    /// Closes idle sessions until at most `limit` are open.
    fn trim(&mut self) {
        while self.open > self.limit && !self.idle.is_empty() {
            self.idle.remove(0);
            self.open -= 1;
        }
    }

    /// Any session of `server`, for a look at its tables.
    fn client_of(&mut self, server: usize) -> Option<&mut Client> {
        let conn = self.idle.iter_mut().find(|(at, _)| *at == server)?;
        Some(conn.1.client())
    }
}

/// The same failure, for another outbox of a database that failed.
fn again(exit: Exit, text: &str) -> anyhow::Error {
    let error = anyhow!("{text}");
    match exit {
        Exit::Config => exit::config(error),
        _ => exit::outage(error),
    }
}

/// The run over many outboxes: the plan, the batches, the results.
pub fn run(json: bool, settings: Result<(Selection, Relay)>) -> Result<Exit> {
    let started = Instant::now();
    let (selection, relay) = match settings {
        Ok(settings) => settings,
        Err(error) => {
            let totals = Totals::default();
            return match json {
                true => summary::after_run(&totals, started, Err(error)),
                false => Err(error),
            };
        }
    };
    let watchdog = Watchdog::spawn(move |totals| {
        if json {
            // The run is being abandoned: a summary that cannot be written
            // changes nothing.
            let _ = summary::print(totals, started, Exit::Unavailable);
        }
    })?;
    let stop = Stop::install()?;
    let mut totals = Totals::default();
    let traces = Traces::from_env(&relay);
    let run = Run {
        selection: &selection,
        relay: &relay,
        watchdog: &watchdog,
        stop: &stop,
        traces: traces.as_ref(),
        started,
    };
    let outcome = serve(&run, &mut totals);
    watchdog.arm(CLOSE_BUDGET, "writing the results", totals);
    let (results, run_exit) = match outcome {
        Ok(results) => {
            let exit = most_urgent(results.iter().map(|result| result.exit));
            (results, Ok(stop.requested().unwrap_or(exit)))
        }
        Err(error) => (Vec::new(), Err(error)),
    };
    let run_exit = metrics::after_many(&relay, &results, &totals, started, run_exit);
    watchdog.disarm();
    // Bounded on its own (traces::FLUSH_BOUND), and never a failure.
    if let Some(traces) = traces {
        traces.finish(Exit::of_result(&run_exit), &totals, started);
    }
    match json {
        true => summary::after_many(&totals, &results, started, run_exit),
        false => run_exit,
    }
}

/// What the whole run shares, from the plan to the results.
struct Run<'a> {
    selection: &'a Selection,
    relay: &'a Relay,
    watchdog: &'a Watchdog,
    stop: &'a Stop,
    traces: Option<&'a Traces>,
    started: Instant,
}

/// The plan, then the batches; every outbox's result, the unread
/// databases' too.
fn serve(run: &Run, totals: &mut Totals) -> Result<Vec<Outcome>> {
    let Run {
        selection,
        relay,
        watchdog,
        stop,
        traces,
        started,
    } = *run;
    let per_server = selection.connect_budget() + 4 * STATEMENT_TIMEOUT;
    let servers = u32::try_from(selection.servers.len()).unwrap_or(u32::MAX);
    watchdog.arm(
        per_server * servers + watchdog::MARGIN,
        "reading the catalog of every database",
        *totals,
    );
    let connect = |info: &_| session::connect(info, selection.connect_timeout, relay, stop);
    let Plan {
        outboxes,
        unread,
        clients,
    } = selection.plan(true, &connect)?;
    let mut results = Vec::new();
    for unread in unread {
        stderr::line(&format!(
            "outbox-poll: error: database {}{}: {:#}",
            unread.label,
            unread
                .table
                .as_ref()
                .map_or(String::new(), |t| format!(", table {t}")),
            unread.error
        ));
        results.push(Outcome {
            database: unread.label,
            table: unread.table.unwrap_or_else(|| selection.spec.clone()),
            totals: Totals::default(),
            exit: Exit::of(&unread.error),
        });
    }
    let busy = outboxes.iter().filter(|planned| planned.due).count();
    log::info!(
        "{} outboxes selected, {busy} with due events, {} database(s) unread",
        outboxes.len(),
        results.len()
    );
    let mut lanes: Vec<Lane> = outboxes
        .into_iter()
        .map(|planned| Lane {
            place: traces.map(|_| Place::new(&planned.label, &planned.database.table)),
            planned,
            totals: Totals::default(),
            claims: Claims::new(),
            in_flight: false,
            error: None,
        })
        .collect();
    let mut pool = Pool {
        open: clients.len(),
        idle: clients
            .into_iter()
            .map(|(server, client)| (server, Conn::Fresh(client)))
            .collect(),
        limit: selection.max_connections,
        down: Vec::new(),
    };
    let mut broker = Broker::new(relay.broker.clone(), stop.clone());
    let mut turns = Turns {
        selection,
        relay,
        watchdog,
        stop,
        broker: &mut broker,
        pool: &mut pool,
        totals,
        started,
        traces,
        halted: false,
    };
    let ring: VecDeque<usize> = (0..lanes.len())
        .filter(|&at| lanes[at].planned.due)
        .collect();
    let served = match relay.follow {
        true => turns.follow(&mut lanes, ring),
        false => {
            turns.drain(&mut lanes, ring);
            Ok(())
        }
    };
    watchdog.arm(CLOSE_BUDGET, "closing the broker connection", *totals);
    broker.close();
    served?;
    for lane in lanes {
        let exit = match &lane.error {
            Some(error) => {
                stderr::line(&format!(
                    "outbox-poll: error: database {}, table {}: {error:#}",
                    lane.planned.label, lane.planned.database.table
                ));
                Exit::of(error)
            }
            None if lane.totals.failed > 0 => Exit::EventsFailed,
            None => Exit::Success,
        };
        results.push(Outcome {
            database: lane.planned.label,
            table: lane.planned.database.table.to_string(),
            totals: lane.totals,
            exit,
        });
    }
    Ok(results)
}

/// The most urgent exit over the outboxes: 78, then 69, then 1, then 0.
pub fn most_urgent(exits: impl Iterator<Item = Exit>) -> Exit {
    let rank = |exit: &Exit| match exit {
        Exit::Config => 4,
        Exit::Unavailable | Exit::Internal => 3,
        Exit::EventsFailed => 2,
        Exit::Interrupted | Exit::Terminated => 1,
        Exit::Success => 0,
    };
    exits.max_by_key(rank).unwrap_or(Exit::Success)
}

/// What the turns over the outboxes share.
struct Turns<'a> {
    selection: &'a Selection,
    relay: &'a Relay,
    watchdog: &'a Watchdog,
    stop: &'a Stop,
    broker: &'a mut Broker,
    pool: &'a mut Pool,
    totals: &'a mut Totals,
    started: Instant,
    traces: Option<&'a Traces>,
    /// The broker failed: no new batch opens.
    halted: bool,
}

/// The batches in flight, oldest first: the lane, its session, the batch.
type Flight = VecDeque<(usize, Session, InFlight)>;

/// The batch the committer is committing: its lane, and what the run
/// counts once the commit is over.
type Committing = (usize, Told);

impl Turns<'_> {
    /// Batches from the outboxes of `ring` in turn until none has a due
    /// event, a limit is reached, a signal comes or the broker fails.
    ///
    /// A plain drain commits each batch on the committer's thread while it
    /// awaits the next batch's confirms, as a single outbox's drain does
    /// (relay::committer): at the default batch of 100 the commits were
    /// the turns' largest cost on this thread. The ordered modes commit
    /// here: their next claim must see the batch committed.
    fn drain(&mut self, lanes: &mut [Lane], mut ring: VecDeque<usize>) {
        let mut flight = Flight::new();
        let mut committer = self.relay.commits_apart().then(Committer::default);
        let mut committing: Option<Committing> = None;
        // Each batch in flight holds a session; the relay's own bound on
        // batches in flight (see config::in_flight) holds here too.
        let most = self.relay.in_flight.min(self.pool.limit).max(1);
        loop {
            // The batch that commits still holds its session and its
            // events' bytes, and counts for --max-batches.
            let held = committing.as_ref().map_or(0, |(_, told)| told.bytes());
            let opened = |flight: &Flight| flight.len() + usize::from(committing.is_some());
            while flight.len() < most && self.may_open(opened(&flight)) {
                let room = self.relay.batch_bytes - held - bytes(&flight);
                if room <= 0 {
                    break;
                }
                let Some(at) = next_lane(&mut ring, lanes) else {
                    break;
                };
                if !self.open_on(lanes, at, room, &mut flight, &mut ring) {
                    break;
                }
            }
            let Some((at, mut session, batch)) = flight.pop_front() else {
                // Nothing in flight: the drain is over, or its next batch
                // waits for the session of the batch that commits.
                let Some(last) = committing.take() else {
                    return;
                };
                self.committed(lanes, committer.as_mut(), last);
                *self.totals = sum(lanes);
                continue;
            };
            self.arm();
            lanes[at].in_flight = false;
            let (told, marks) = batch::answer(batch, self.broker);
            // The batch before this one is counted first.
            if let Some(previous) = committing.take() {
                self.committed(lanes, committer.as_mut(), previous);
            }
            match committer.as_mut() {
                // A batch the broker failed is committed here: it halts
                // the run's new batches.
                Some(committer) if !marks.outage() => {
                    committer.commit(session, marks);
                    committing = Some((at, told));
                }
                _ => {
                    let committed = batch::commit(&mut session, &marks);
                    self.settled(&mut lanes[at], session, (told, marks, committed));
                }
            }
            *self.totals = sum(lanes);
        }
    }

    /// Waits for the committer's batch and counts it.
    fn committed(
        &mut self,
        lanes: &mut [Lane],
        committer: Option<&mut Committer>,
        (at, told): Committing,
    ) {
        let committer = committer.expect("a batch commits on the committer's thread");
        self.arm();
        let (session, marks, committed) = committer.wait();
        self.settled(&mut lanes[at], session, (told, marks, committed));
    }

    /// A batch whose commit is over: its session back in the pool, the
    /// batch counted on its lane (see batch::account), a failure the lane's.
    fn settled(
        &mut self,
        lane: &mut Lane,
        session: Session,
        (told, marks, committed): (Told, Marks, Result<(), Uncommitted>),
    ) {
        self.pool.put(lane.planned.server, session);
        let counted = batch::account(told, marks, committed, &mut lane.totals, self.traces);
        if let Err(error) = counted {
            self.fail(lane, error);
        }
    }

    /// Opens the next batch of lane `at` (taken off the ring). False when
    /// no session was free: the lane goes back to the front of the ring
    /// and a batch in flight, or the committing one, must settle first.
    fn open_on(
        &mut self,
        lanes: &mut [Lane],
        at: usize,
        room: i64,
        flight: &mut Flight,
        ring: &mut VecDeque<usize>,
    ) -> bool {
        let lane = &mut lanes[at];
        let budget = self.selection.connect_budget() + STATEMENT_TIMEOUT + watchdog::MARGIN;
        self.watchdog
            .arm(budget, "opening a PostgreSQL session", *self.totals);
        let mut session = match self
            .pool
            .get(self.selection, self.relay, self.stop, &lane.planned)
        {
            Ok(Some(session)) => session,
            Ok(None) => {
                ring.push_front(at);
                return false;
            }
            Err(error) => {
                if !exit::is_stop(&error) {
                    self.fail(lane, error);
                }
                return true;
            }
        };
        self.arm();
        let relay = self.relay;
        let mut start = lane.claims.next(relay.order());
        let opened = loop {
            let opened = batch::open(
                &mut session,
                relay,
                self.broker,
                self.stop,
                &mut lane.totals,
                &start,
                room,
                self.traces.zip(lane.place.as_ref()),
            );
            match opened {
                // Only a plain claim can pass over rows (those behind where
                // it started): it looks again from the head.
                Ok(Opened::Ended(Ended::Empty)) if matches!(start, Start::Id(_)) => {
                    lane.claims.from = None;
                    start = Start::Head;
                }
                opened => break opened,
            }
        };
        match opened {
            Ok(Opened::InFlight(batch)) => {
                lane.claims.claimed(&start, &batch, relay.batch_size);
                lane.in_flight = true;
                let full = batch.claimed() as i64 == relay.batch_size;
                flight.push_back((at, session, batch));
                // A drain comes back to it after every other busy outbox,
                // while its claims come back full (a batch that is not
                // took every event due; a follow looks again), and with
                // --ordered-by-key, whose next events of the batch's keys
                // become claimable once it has settled. A single run
                // takes one batch of each.
                if relay.drain && (full || relay.order() == Order::ByKey) {
                    ring.push_back(at);
                }
            }
            // Nothing due, the --ordered lock taken, a dry run printed,
            // or a signal: this outbox is done.
            Ok(Opened::Ended(_)) => self.pool.put(lane.planned.server, session),
            Err(error) => {
                self.pool.put(lane.planned.server, session);
                self.fail(lane, error);
            }
        }
        *self.totals = sum(lanes);
        true
    }

    /// Ends a lane with `error`; a failure of the broker's ends the run's
    /// new batches too.
    fn fail(&mut self, lane: &mut Lane, error: anyhow::Error) {
        log::info!(
            "database {}, table {}: {error:#}",
            lane.planned.label,
            lane.planned.database.table
        );
        if self.broker.failed() {
            self.halted = true;
        }
        lane.error.get_or_insert(error);
    }

    /// Whether another batch may open, with `in_flight` batches opened and
    /// not settled: no signal came, the broker has not failed, and a drain
    /// is within --max-batches and --max-duration.
    fn may_open(&self, in_flight: usize) -> bool {
        let started = self.totals.batches + in_flight as u64;
        !self.halted && self.stop.requested().is_none() && self.within_limits(started)
    }

    fn within_limits(&self, started: u64) -> bool {
        let relay = self.relay;
        self.stop.requested().is_none()
            && relay.max_batches.is_none_or(|max| started < max)
            && relay
                .max_duration
                .is_none_or(|max| self.started.elapsed() < max)
    }

    fn arm(&self) {
        self.watchdog
            .arm(batch_budget(self.relay), "the batch", *self.totals);
    }

    /// --follow over many outboxes: rounds of drains, and between them a
    /// wait for the tables to serve: those the watchers name (see `wake`),
    /// and, for the databases no watcher serves, those a look every
    /// LOOK_EVERY finds on the database's idle session (one statement per
    /// DUE_CHUNK tables), until --max-duration or a signal. Quiet for
    /// LINGER, it lets the broker go.
    fn follow(&mut self, lanes: &mut [Lane], mut ring: VecDeque<usize>) -> Result<()> {
        let mut wake = self.watch(lanes);
        let mut busy_at = Instant::now();
        let mut looked_at = Instant::now();
        loop {
            let claimed = self.totals.claimed;
            self.drain(lanes, ring);
            if self.totals.claimed > claimed {
                busy_at = Instant::now();
            }
            if self.halted || !self.within_limits(self.totals.batches) {
                return Ok(());
            }
            if self.broker.is_connected() && Instant::now() >= busy_at + LINGER {
                self.watchdog
                    .arm(CLOSE_BUDGET, "closing idle connections", *self.totals);
                self.broker.disconnect();
            }
            let unwatched = |server: usize| !wake.watches(server);
            let looks = (0..self.selection.servers.len()).any(unwatched);
            let mut until = Instant::now() + SLICE;
            if looks {
                until = until.min(looked_at + LOOK_EVERY);
            }
            if let Some(max) = self.relay.max_duration {
                until = until.min(self.started + max);
            }
            self.watchdog.arm(
                SLICE + watchdog::MARGIN,
                "waiting for new events",
                *self.totals,
            );
            let told = wake.wait(until);
            if !self.within_limits(self.totals.batches) {
                return Ok(());
            }
            ring = VecDeque::new();
            if looks && Instant::now() >= looked_at + LOOK_EVERY {
                looked_at = Instant::now();
                ring = self.look(lanes, |server| !wake.watches(server));
            }
            for lane in told {
                if lanes[lane].error.is_none() && !ring.contains(&lane) {
                    log::trace!("told to serve {}", lanes[lane].planned.database.table);
                    ring.push_back(lane);
                }
            }
        }
    }

    /// The follow's watchers, one per database while at most half of
    /// --max-connections watches, each on an idle session the run already
    /// holds for that database or a new one; the pool keeps the rest.
    fn watch(&mut self, lanes: &[Lane]) -> Wake {
        let servers = self.selection.servers.len();
        let databases: Vec<Tables> = (0..servers)
            .map(|server| Tables {
                server,
                label: self.selection.servers[server].label.clone(),
                lanes: (0..lanes.len())
                    .filter(|&at| lanes[at].planned.server == server && lanes[at].error.is_none())
                    .map(|at| (at, lanes[at].planned.database.table.clone()))
                    .collect(),
            })
            .filter(|database| !database.lanes.is_empty())
            .collect();
        let budget = self.selection.connect_budget() + 2 * STATEMENT_TIMEOUT;
        let budget = budget * u32::try_from(databases.len()).unwrap_or(u32::MAX);
        self.watchdog.arm(
            budget + watchdog::MARGIN,
            "listening for new events",
            *self.totals,
        );
        let (selection, relay, stop) = (self.selection, self.relay, self.stop);
        let pool = &mut *self.pool;
        let most = pool.limit / 2;
        let max_attempts = selection.max_attempts;
        let wake = Wake::start(databases, servers, most, max_attempts, |server| match pool
            .take(server)
        {
            Some(client) => Ok(client),
            None => {
                let info = &selection.servers[server].conninfo;
                session::connect(info, selection.connect_timeout, relay, stop)
            }
        });
        pool.limit -= wake.sessions();
        pool.trim();
        wake
    }

    /// The lanes with due events now, of the databases `of` selects, each
    /// database asked on an idle session of its own (a lane whose database
    /// has none is claimed from).
    fn look(&mut self, lanes: &[Lane], of: impl Fn(usize) -> bool) -> VecDeque<usize> {
        self.watchdog.arm(
            STATEMENT_TIMEOUT * 4 + watchdog::MARGIN,
            "looking for new events",
            *self.totals,
        );
        let mut ring = VecDeque::new();
        for server in (0..self.selection.servers.len()).filter(|&server| of(server)) {
            let ats: Vec<usize> = (0..lanes.len())
                .filter(|&at| lanes[at].planned.server == server && lanes[at].error.is_none())
                .collect();
            if ats.is_empty() {
                continue;
            }
            let tables: Vec<_> = ats
                .iter()
                .map(|&at| lanes[at].planned.database.table.clone())
                .collect();
            let due = match self.pool.client_of(server) {
                Some(client) => plan::due_tables(client, &tables, self.selection.max_attempts),
                None => vec![true; ats.len()],
            };
            ring.extend(
                ats.into_iter()
                    .zip(due)
                    .filter(|(_, due)| *due)
                    .map(|(at, _)| at),
            );
        }
        ring
    }
}

/// The next lane of the ring with no batch in flight, taken off it; those
/// skipped keep their places, and failed ones leave the ring.
fn next_lane(ring: &mut VecDeque<usize>, lanes: &[Lane]) -> Option<usize> {
    ring.retain(|&at| lanes[at].error.is_none());
    let position = ring.iter().position(|&at| !lanes[at].in_flight)?;
    ring.remove(position)
}

/// The run's totals: every lane's.
fn sum(lanes: &[Lane]) -> Totals {
    let mut totals = Totals::default();
    for lane in lanes {
        totals.add(&lane.totals);
    }
    totals
}

fn bytes(flight: &Flight) -> i64 {
    flight.iter().map(|(_, _, batch)| batch.bytes()).sum()
}
