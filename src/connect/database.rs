//! The PostgreSQL session: connecting with every phase bounded, and turning
//! the driver's errors into one readable line of the right kind.

use std::error::Error as _;
use std::time::Duration;

use anyhow::{Result, anyhow};
use postgres::Client;
use postgres::error::SqlState;

use crate::connect::conninfo::{ConnInfo, RootCert, ServerCheck, TargetSessionAttrs};
use crate::connect::hosts;
use crate::connect::tls::{self, Identity, Trust};
use crate::exit::{self, classify};
use crate::guard::stop::Stop;
use crate::sql::table::TableName;

/// How long one statement may run. The claim and the marks touch at most one
/// batch of rows by primary key, so anything slower is a sick server, and
/// waiting on it would only hold row locks longer.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to queue for a lock. The claim never waits (SKIP LOCKED); this
/// bounds `migrate` and the advisory locks, so a run never sits behind a
/// long transaction while others queue behind it.
const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens the session: the first host of `info` that accepts and suits its
/// target_session_attrs (see `hosts`), each host given `connect_timeout`
/// (or the URL's smaller connect_timeout). `stop`, where the command has
/// one, ends the wait at once when a signal comes.
///
/// The server bounds the rest of the session for us, as the postgres
/// crate has no query timeouts: a statement may not run longer than
/// STATEMENT_TIMEOUT and a transaction may not sit idle (while we wait for
/// the broker) longer than `idle_limit`. Past it the server ends the
/// session and releases the row locks, so a stuck or stopped relay never
/// keeps events from the next run. Bounded transactions also matter to the
/// table itself: an open transaction holds back xmin, and vacuum cannot
/// reclaim the outbox's dead rows behind it.
///
/// The settings travel in the startup packet, costing no round trip.
pub fn connect(
    info: &ConnInfo,
    connect_timeout: Duration,
    idle_limit: Duration,
    stop: Option<&Stop>,
) -> Result<Client> {
    let ours = format!(
        "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={}",
        STATEMENT_TIMEOUT.as_millis(),
        LOCK_TIMEOUT.as_millis(),
        idle_limit.as_millis()
    );
    let options = match &info.options {
        Some(theirs) => format!("{theirs} {ours}"),
        None => ours,
    };
    let tls = tls::client_config(&tls_settings(info)).map_err(|error| {
        exit::config(
            error.context("the TLS settings of the database URL (sslrootcert, sslcert, sslkey)"),
        )
    })?;
    hosts::connect(&hosts::Request {
        info,
        options,
        per_host: per_host(info, connect_timeout),
        tls,
        stop,
    })
}

/// The longest a connect to `info` can take: each host's share, for each
/// pass over the list (prefer-standby makes two). The watchdog's budget
/// for a connect must cover it.
pub fn connect_budget(info: &ConnInfo, connect_timeout: Duration) -> Duration {
    let passes = match info.target_session_attrs {
        TargetSessionAttrs::PreferStandby => 2,
        _ => 1,
    };
    let hosts = u32::try_from(info.targets.len() * passes).unwrap_or(u32::MAX);
    per_host(info, connect_timeout) * hosts
}

/// --connect-timeout, or the URL's connect_timeout where it is smaller.
fn per_host(info: &ConnInfo, connect_timeout: Duration) -> Duration {
    info.connect_timeout
        .map_or(connect_timeout, |theirs| theirs.min(connect_timeout))
}

/// sslmode's checks and certificates as the TLS settings they make.
fn tls_settings(info: &ConnInfo) -> tls::Settings {
    let root = |root: &RootCert| match root {
        RootCert::File(file) => Trust::File(file.clone()),
        RootCert::System => Trust::System,
    };
    let (trust, check_name) = match &info.ssl.server {
        ServerCheck::Nothing => (Trust::Anyone, false),
        ServerCheck::Chain(cert) => (root(cert), false),
        ServerCheck::ChainAndName(cert) => (root(cert), true),
    };
    tls::Settings {
        trust,
        check_name,
        identity: info.ssl.client.as_ref().map(|client| Identity {
            cert: client.cert.clone(),
            key: client.key.clone(),
        }),
        sni: true,
        p256_first: true,
    }
}

/// What to do about a server that takes no writes.
pub const READ_ONLY_ADVICE: &str = "the server is a read-only standby (or the session is \
    read-only): point DATABASE_URL at the primary, or list every host with \
    target_session_attrs=read-write so that the run picks the writable one";

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
        Some(code) if classify::postgres(code.code()) == classify::Cause::Standby => {
            format!("{READ_ONLY_ADVICE}; nothing was marked")
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
