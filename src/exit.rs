//! Exit codes, and the one typed error whose kind decides them.
//!
//! Cron lines and CI scripts branch on these numbers (see CONTRACT.md), so
//! they live here, in one place, with tests that pin them. A bad command
//! line exits 2 from clap itself, before any of this runs.

use std::fmt;

/// Every claimed event was confirmed, or there was nothing to do.
pub const SUCCESS: u8 = 0;
/// The broker nacked or returned some events; their attempts were counted.
pub const PARTIAL_FAILURE: u8 = 1;
/// A server was unreachable, a connection was lost or confirms timed out.
pub const UNAVAILABLE: u8 = 69;
/// Configuration or schema problem (BSD sysexits' EX_CONFIG).
pub const CONFIG: u8 = 78;
/// Interrupted by SIGINT after a clean commit (128 + 2, the shell's convention).
pub const INTERRUPTED: u8 = 130;
/// Terminated by SIGTERM after a clean commit (128 + 15).
pub const TERMINATED: u8 = 143;

/// An error whose kind decides the exit code.
///
/// Anything else that reaches `main` is a bug or an unclassified failure and
/// exits 69 as well: when in doubt the safe reading is "try again later",
/// since nothing unconfirmed is ever marked.
#[derive(Debug)]
pub enum Failure {
    /// A server or the network failed us. Never the events' fault, so no
    /// attempt is counted against them.
    Outage(anyhow::Error),
    /// Something the operator must fix before a rerun can succeed.
    Config(anyhow::Error),
}

impl Failure {
    pub fn code(&self) -> u8 {
        match self {
            Failure::Outage(_) => UNAVAILABLE,
            Failure::Config(_) => CONFIG,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Outage(e) | Failure::Config(e) => write!(f, "{e:#}"),
        }
    }
}

// No `source()`: the inner chain is already part of the Display above, and
// returning it would print every cause twice under `{:#}`.
impl std::error::Error for Failure {}

/// Wraps an error as an outage (exit 69).
pub fn outage(error: impl Into<anyhow::Error>) -> anyhow::Error {
    Failure::Outage(error.into()).into()
}

/// Wraps an error as a configuration problem (exit 78).
pub fn config(error: impl Into<anyhow::Error>) -> anyhow::Error {
    Failure::Config(error.into()).into()
}

/// The exit code for an error that reached the top.
pub fn code_of(error: &anyhow::Error) -> u8 {
    error
        .downcast_ref::<Failure>()
        .map_or(UNAVAILABLE, Failure::code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::{Context, anyhow};

    #[test]
    fn codes_are_the_contracts() {
        assert_eq!(
            [SUCCESS, PARTIAL_FAILURE, UNAVAILABLE, CONFIG],
            [0, 1, 69, 78]
        );
        assert_eq!([INTERRUPTED, TERMINATED], [130, 143]);
    }

    #[test]
    fn outage_maps_to_69_through_added_context() {
        let error = Err::<(), _>(outage(anyhow!("connection refused")))
            .context("publishing batch")
            .unwrap_err();
        assert_eq!(code_of(&error), 69);
    }

    #[test]
    fn config_maps_to_78_through_added_context() {
        let error = Err::<(), _>(config(anyhow!("no such table")))
            .context("claiming")
            .unwrap_err();
        assert_eq!(code_of(&error), 78);
    }

    #[test]
    fn unclassified_error_is_treated_as_an_outage() {
        assert_eq!(code_of(&anyhow!("surprise")), 69);
    }

    #[test]
    fn message_prints_each_cause_once() {
        let error = Err::<(), _>(outage(anyhow!("refused").context("connecting")))
            .context("poll")
            .unwrap_err();
        assert_eq!(format!("{error:#}"), "poll: connecting: refused");
    }
}
