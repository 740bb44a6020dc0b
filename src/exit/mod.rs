//! Exit codes, and the one typed error whose kind decides them.
//!
//! Cron lines and CI scripts branch on these numbers (the README's "Exit
//! codes"), so they live here, in one enum, with tests that pin them. A bad
//! command line exits 2 from clap itself, before any of this runs.
//! `classify` holds the tables that say whose fault a server's refusal is.

pub(crate) mod classify;

use std::fmt;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every claimed event was confirmed, there was nothing to do, or
    /// (--ordered) another run holds the table's lock.
    Success,
    /// Some events failed (returned, nacked, or refused over a channel
    /// error), and what the broker said about them was committed.
    EventsFailed,
    /// A server was unreachable, a connection was lost or confirms timed
    /// out: try again later.
    Unavailable,
    /// Configuration or schema problem (BSD sysexits' EX_CONFIG): the
    /// operator must change something first.
    Config,
    /// SIGINT, after the batches in hand were committed or rolled back
    /// (128 + 2, the shell's convention).
    Interrupted,
    /// SIGTERM, likewise (128 + 15).
    Terminated,
    /// An error no layer classified, or a panic: a bug. It exits as an
    /// outage does, because that is the safe reading for cron ("try again
    /// later"): nothing the broker had not confirmed was ever marked, and
    /// PostgreSQL rolls back whatever was not committed.
    Internal,
}

impl Exit {
    pub(crate) fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::EventsFailed => 1,
            Exit::Unavailable | Exit::Internal => 69,
            Exit::Config => 78,
            Exit::Interrupted => 130,
            Exit::Terminated => 143,
        }
    }

    /// The exit for an error that reached the top.
    pub fn of(error: &anyhow::Error) -> Exit {
        error
            .downcast_ref::<Failure>()
            .map_or(Exit::Internal, Failure::exit)
    }

    /// The exit for a run's result.
    pub(crate) fn of_result(result: &anyhow::Result<Exit>) -> Exit {
        match result {
            Ok(exit) => *exit,
            Err(error) => Exit::of(error),
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit.code())
    }
}

/// An error whose kind decides the exit code.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A server or the network failed us. Never the events' fault, so no
    /// attempt is counted against them.
    Outage(anyhow::Error),
    /// Something the operator must fix before a rerun can succeed.
    Config(anyhow::Error),
    /// SIGINT or SIGTERM came while we waited (for a connect, say), and the
    /// run gave up on what it was waiting for: the exit is the signal's.
    Stopped(Exit, anyhow::Error),
}

impl Failure {
    pub(crate) fn exit(&self) -> Exit {
        match self {
            Failure::Outage(_) => Exit::Unavailable,
            Failure::Config(_) => Exit::Config,
            Failure::Stopped(exit, _) => *exit,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Outage(e) | Failure::Config(e) | Failure::Stopped(_, e) => write!(f, "{e:#}"),
        }
    }
}

// No `source()`: the inner chain is already part of the Display above, and
// returning it would print every cause twice under `{:#}`.
impl std::error::Error for Failure {}

/// Wraps an error as an outage (exit 69).
pub(crate) fn outage(error: impl Into<anyhow::Error>) -> anyhow::Error {
    Failure::Outage(error.into()).into()
}

/// Wraps an error as a configuration problem (exit 78).
pub(crate) fn config(error: impl Into<anyhow::Error>) -> anyhow::Error {
    Failure::Config(error.into()).into()
}

/// Wraps what a signal interrupted: the exit is the signal's (130, 143).
pub(crate) fn stopped(exit: Exit, error: impl Into<anyhow::Error>) -> anyhow::Error {
    Failure::Stopped(exit, error.into()).into()
}

/// Whether the error is a signal's stop rather than a failure.
pub fn is_stop(error: &anyhow::Error) -> bool {
    matches!(error.downcast_ref::<Failure>(), Some(Failure::Stopped(..)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::{Context, anyhow};

    #[test]
    fn codes_are_the_contracts() {
        let codes = [
            Exit::Success,
            Exit::EventsFailed,
            Exit::Unavailable,
            Exit::Config,
            Exit::Interrupted,
            Exit::Terminated,
        ]
        .map(Exit::code);
        assert_eq!(codes, [0, 1, 69, 78, 130, 143]);
    }

    #[test]
    fn outage_maps_to_69_through_added_context() {
        let error = Err::<(), _>(outage(anyhow!("connection refused")))
            .context("publishing batch")
            .unwrap_err();
        assert_eq!(Exit::of(&error), Exit::Unavailable);
    }

    #[test]
    fn config_maps_to_78_through_added_context() {
        let error = Err::<(), _>(config(anyhow!("no such table")))
            .context("claiming")
            .unwrap_err();
        assert_eq!(Exit::of(&error), Exit::Config);
    }

    #[test]
    fn a_stop_exits_with_its_signals_code_through_added_context() {
        let error = Err::<(), _>(stopped(Exit::Terminated, anyhow!("connecting")))
            .context("poll")
            .unwrap_err();
        assert_eq!((Exit::of(&error).code(), is_stop(&error)), (143, true));
    }

    #[test]
    fn an_unclassified_error_is_internal_and_exits_as_an_outage() {
        let exit = Exit::of(&anyhow!("surprise"));
        assert_eq!((exit, exit.code()), (Exit::Internal, 69));
    }

    #[test]
    fn message_prints_each_cause_once() {
        let error = Err::<(), _>(outage(anyhow!("refused").context("connecting")))
            .context("poll")
            .unwrap_err();
        assert_eq!(format!("{error:#}"), "poll: connecting: refused");
    }
}
