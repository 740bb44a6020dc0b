//! The last bound on a run: a thread with a deadline, re-armed before each
//! phase, that ends the process with exit 69 when the deadline passes.
//!
//! Every phase already has a bound of its own (the connect timeouts, the
//! server's statement_timeout, --confirm-timeout), but the postgres crate
//! has no client-side query timeout: if the network goes silent while a
//! statement is on the wire, the driver waits for ever, and the server's
//! timeouts cannot reach us through a dead network. So each batch also has
//! a budget (every bound of its phases added up, plus a margin) and when it
//! runs out the run is abandoned. That is safe at any point: PostgreSQL
//! rolls back the transaction of a dropped connection (or ends it after
//! idle_in_transaction_session_timeout), so nothing unconfirmed is marked
//! and the row locks go with it; at worst an event is sent again.

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::connect::database::STATEMENT_TIMEOUT;
use crate::exit::Exit;
use crate::report::stderr;
use crate::report::totals::Totals;

/// Added to every budget: the bounds it sums are the servers' and the
/// driver's, and a command that is merely slow must not be taken for a hung
/// one.
pub(crate) const MARGIN: Duration = Duration::from_secs(5);

/// How long `on_fire` may take before the process exits without it: it
/// writes to stdout, and a reader that stopped reading would block it for
/// ever (the main thread may even hold stdout's lock, stuck in a write).
const ON_FIRE_LIMIT: Duration = Duration::from_secs(1);

/// What `on_fire` is told: the figures committed before the phase began.
type OnFire = Arc<dyn Fn(&Totals) + Send + Sync>;

#[derive(Default)]
struct Armed {
    /// When the phase must be over, and how it was described.
    deadline: Option<(Instant, Duration, &'static str)>,
    totals: Totals,
}

pub(crate) struct Watchdog {
    state: Arc<(Mutex<Armed>, Condvar)>,
}

impl Watchdog {
    /// Starts the thread, disarmed. `on_fire` runs just before the exit (it
    /// prints the --json summary, which docs/src/command-line.md promises whatever happens).
    pub(crate) fn spawn(on_fire: impl Fn(&Totals) + Send + Sync + 'static) -> Result<Self> {
        let state = Arc::new((Mutex::new(Armed::default()), Condvar::new()));
        let shared = Arc::clone(&state);
        let on_fire: OnFire = Arc::new(on_fire);
        thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || watch(&shared, &on_fire))
            .context("starting the watchdog thread")?;
        Ok(Watchdog { state })
    }

    /// Gives the phase `what` at most `budget` from now. `totals` are the
    /// figures already committed, reported if the watchdog fires.
    pub(crate) fn arm(&self, budget: Duration, what: &'static str, totals: Totals) {
        let (lock, wake) = &*self.state;
        // A poisoned lock can only mean the watchdog thread died; the run
        // then goes on unguarded rather than failing for it.
        if let Ok(mut armed) = lock.lock() {
            armed.deadline = Some((Instant::now() + budget, budget, what));
            armed.totals = totals;
            wake.notify_one();
        }
    }

    /// One budget for a whole short command (status, requeue): connecting,
    /// then `statements` statements, each bounded by the server's
    /// statement_timeout.
    pub(crate) fn for_command(
        connect_budget: Duration,
        statements: u32,
        what: &'static str,
    ) -> Result<Self> {
        let watchdog = Watchdog::spawn(|_| {})?;
        watchdog.arm_command(connect_budget, statements, what);
        Ok(watchdog)
    }

    /// Arms `for_command`'s budget again: for the next outbox of a short
    /// command over many, on the one watchdog thread.
    pub(crate) fn arm_command(
        &self,
        connect_budget: Duration,
        statements: u32,
        what: &'static str,
    ) {
        let budget = connect_budget + statements * STATEMENT_TIMEOUT + MARGIN;
        self.arm(budget, what, Totals::default());
    }

    /// Nothing left to guard: the run is about to exit on its own.
    pub(crate) fn disarm(&self) {
        if let Ok(mut armed) = self.state.0.lock() {
            armed.deadline = None;
        }
    }
}

fn watch(state: &(Mutex<Armed>, Condvar), on_fire: &OnFire) {
    let (lock, wake) = state;
    let Ok(mut armed) = lock.lock() else { return };
    loop {
        let Some((deadline, budget, what)) = armed.deadline else {
            armed = match wake.wait(armed) {
                Ok(armed) => armed,
                Err(_) => return,
            };
            continue;
        };
        let now = Instant::now();
        if now >= deadline {
            stderr::line(&format!(
                "outbox-poll: error: {what} did not finish within {} (PostgreSQL or RabbitMQ \
                 stopped answering); the run was abandoned: nothing the broker had not confirmed \
                 was marked, and PostgreSQL rolls back a transaction not yet committed, whose \
                 events the next run sends again; check the network and both servers",
                humantime::format_duration(budget)
            ));
            fire(on_fire, armed.totals);
            std::process::exit(i32::from(Exit::Unavailable.code()));
        }
        armed = match wake.wait_timeout(armed, deadline - now) {
            Ok((armed, _)) => armed,
            Err(_) => return,
        };
    }
}

/// Runs `on_fire` on a thread of its own and waits for it at most
/// ON_FIRE_LIMIT: the exit must not hang on the output it reports to.
fn fire(on_fire: &OnFire, totals: Totals) {
    let on_fire = Arc::clone(on_fire);
    let (done, finished) = std::sync::mpsc::channel();
    let spawned = thread::Builder::new()
        .name("watchdog-report".into())
        .spawn(move || {
            on_fire(&totals);
            let _ = done.send(());
        });
    if spawned.is_ok() {
        let _ = finished.recv_timeout(ON_FIRE_LIMIT);
    }
}
