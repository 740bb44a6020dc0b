//! PostgreSQL's errors: whose fault each is (an outage, or a problem only
//! the configuration can fix), and the one line that tells it. Below both
//! the session (`database.rs`) and the host list (`hosts.rs`), which
//! classify what they meet the same way.

use std::error::Error as _;

use anyhow::anyhow;

use crate::exit::{self, classify};

/// What to do about a server that takes no writes.
pub(crate) const READ_ONLY_ADVICE: &str = "the server is a read-only standby (or the session is \
    read-only): point DATABASE_URL at the primary, or list every host with \
    target_session_attrs=read-write so that the run picks the writable one";

/// Wraps a driver error as an outage or a configuration problem, with
/// `what` failed and what to do about it.
pub(crate) fn classify(error: &postgres::Error, what: &str, advice: &str) -> anyhow::Error {
    let message = anyhow!("{what}: {}; {advice}", describe(error));
    if is_config_problem(error) {
        exit::config(message)
    } else {
        exit::outage(message)
    }
}

/// Errors a rerun cannot fix (see `exit::classify`); an error with no
/// SQLSTATE (I/O, a closed connection) is an outage.
pub(crate) fn is_config_problem(error: &postgres::Error) -> bool {
    error
        .code()
        .is_some_and(|code| classify::postgres(code.code()) == classify::Cause::Config)
}

/// One line: the server's own message for database errors, else the
/// driver's text with its causes.
pub(crate) fn describe(error: &postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return match db.hint() {
            Some(hint) => format!("{} ({hint})", db.message()),
            None => db.message().to_string(),
        };
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
