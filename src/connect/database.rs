//! The PostgreSQL session: connecting with every phase bounded, and turning
//! the driver's errors into one readable line of the right kind.

use std::error::Error as _;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use postgres::error::SqlState;
use postgres::{Client, NoTls};

use crate::connect::libpq::describe_database;
use crate::exit::{self, classify};
use crate::sql::table::TableName;

/// How long one statement may run. The claim and the marks touch at most one
/// batch of rows by primary key, so anything slower is a sick server, and
/// waiting on it would only hold row locks longer.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to queue for a lock. The claim never waits (SKIP LOCKED); this
/// bounds `migrate` and the advisory locks, so a run never sits behind a
/// long transaction while others queue behind it.
const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens the session.
///
/// The postgres crate's connect_timeout covers only the TCP connect and it
/// has no query timeouts, so the server bounds the rest for us: a statement
/// may not run longer than STATEMENT_TIMEOUT and a transaction may not sit
/// idle (while we wait for the broker) longer than `idle_limit`. Past it the
/// server ends the session and releases the row locks, so a stuck or
/// stopped relay never keeps events from the next run. Bounded transactions
/// also matter to the table itself: an open transaction holds back xmin, and
/// vacuum cannot reclaim the outbox's dead rows behind it.
///
/// The settings travel in the startup packet, costing no round trip.
pub fn connect(
    config: &postgres::Config,
    connect_timeout: Duration,
    idle_limit: Duration,
) -> Result<Client> {
    let mut config = config.clone();
    let ours = format!(
        "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={}",
        STATEMENT_TIMEOUT.as_millis(),
        LOCK_TIMEOUT.as_millis(),
        idle_limit.as_millis()
    );
    let options = match config.get_options() {
        Some(theirs) => format!("{theirs} {ours}"),
        None => ours,
    };
    config
        .options(&options)
        .application_name("outbox-poll")
        .connect_timeout(connect_timeout);
    let what = format!(
        "cannot connect to PostgreSQL at {}",
        describe_database(&config)
    );
    match connect_within(config, connect_timeout)? {
        Some(result) => result.map_err(|error| {
            classify(
                &error,
                &what,
                "check that the server is up and DATABASE_URL (or PGHOST etc.) is right",
            )
        }),
        None => Err(exit::outage(anyhow!(
            "{what}: not connected within {} (--connect-timeout): check that the server \
             is up and reachable (no firewall dropping the connection) and not overloaded, \
             and that DATABASE_URL (or PGHOST etc.) is right",
            humantime::format_duration(connect_timeout)
        ))),
    }
}

/// Connects on a thread of its own and waits at most `limit` for it.
///
/// The driver's connect_timeout bounds only the TCP connect: a server (or a
/// proxy, or a half-dead network) that accepts the connection and then says
/// nothing would keep the startup waiting for ever. None means it did not
/// finish in time; the thread is left behind with its socket, and goes when
/// the process exits, which it is about to do.
fn connect_within(
    config: postgres::Config,
    limit: Duration,
) -> Result<Option<Result<Client, postgres::Error>>> {
    let (sender, receiver) = mpsc::channel();
    thread::Builder::new()
        .name("pg-connect".into())
        .spawn(move || {
            // The receiver is gone only if we gave up waiting.
            let _ = sender.send(config.connect(NoTls));
        })
        .context("starting the PostgreSQL connect thread")?;
    match receiver.recv_timeout(limit) {
        Ok(result) => Ok(Some(result)),
        Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(exit::outage(anyhow!(
            "the PostgreSQL connect thread ended without an answer"
        ))),
    }
}

/// Wraps a driver error as an outage or a configuration problem, with
/// `what` failed and what to do about it.
pub fn classify(error: &postgres::Error, what: &str, advice: &str) -> anyhow::Error {
    let message = anyhow!("{what}: {}; {advice}", describe(error));
    if is_config_problem(error) {
        exit::config(message)
    } else {
        exit::outage(message)
    }
}

/// Wraps an error from a statement on the outbox table: a missing table or
/// column is named, with the command that fixes it.
pub fn classify_on_table(error: &postgres::Error, what: &str, table: &TableName) -> anyhow::Error {
    let advice = match error.code() {
        Some(&SqlState::UNDEFINED_TABLE) | Some(&SqlState::UNDEFINED_COLUMN) => {
            format!("run `outbox-poll migrate --table {table}` to create or upgrade the table")
        }
        Some(&SqlState::INVALID_SCHEMA_NAME) => {
            "create the schema first (CREATE SCHEMA ...), or name another table".into()
        }
        Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            "grant this role the privileges the README's least-privilege section lists".into()
        }
        _ if is_config_problem(error) => "check the table's definition against the README".into(),
        _ => {
            "the run changed nothing that was not committed; try again once PostgreSQL is reachable"
                .into()
        }
    };
    classify(error, &format!("{what} on table {table}"), &advice)
}

/// Errors a rerun cannot fix (see `exit::classify`); an error with no
/// SQLSTATE (I/O, a closed connection) is an outage.
fn is_config_problem(error: &postgres::Error) -> bool {
    error
        .code()
        .is_some_and(|code| classify::postgres(code.code()) == classify::Cause::Config)
}

/// One line: the server's own message for database errors, else the
/// driver's text with its causes.
pub fn describe(error: &postgres::Error) -> String {
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
