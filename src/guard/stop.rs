//! SIGINT and SIGTERM: the batch in hand finishes (or, if nothing was
//! published yet, rolls back), no new batch starts, and the exit code says
//! which signal ended the run. A second signal ends the process at once;
//! that is still safe, because PostgreSQL rolls back the open transaction
//! when the connection drops and every unmarked event is claimed again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::flag;

use crate::exit::Exit;

#[derive(Clone)]
pub(crate) struct Stop(Arc<AtomicUsize>);

impl Stop {
    pub(crate) fn install() -> Result<Self> {
        let received = Arc::new(AtomicUsize::new(0));
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for (signal, exit) in [(SIGINT, Exit::Interrupted), (SIGTERM, Exit::Terminated)] {
            // Registered before the flag below: on the second signal `armed`
            // is already set and this one exits the process.
            flag::register_conditional_shutdown(signal, i32::from(exit.code()), Arc::clone(&armed))
                .context("installing signal handlers")?;
            flag::register(signal, Arc::clone(&armed)).context("installing signal handlers")?;
            flag::register_usize(signal, Arc::clone(&received), signal as usize)
                .context("installing signal handlers")?;
        }
        Ok(Stop(received))
    }

    /// A Stop no signal sets, for a command that installs no handler (a
    /// signal ends it at once, see `commands`) but calls a wait that takes
    /// one.
    pub(crate) fn unarmed() -> Self {
        Stop(Arc::new(AtomicUsize::new(0)))
    }

    /// The exit for the signal received, if any.
    pub(crate) fn requested(&self) -> Option<Exit> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            signal if signal == SIGINT as usize => Some(Exit::Interrupted),
            _ => Some(Exit::Terminated),
        }
    }
}
