//! The PostgreSQL session: connecting with every phase bounded (its errors
//! are told by `pg_error.rs`).

use std::time::Duration;

use anyhow::Result;
use postgres::Client;

use crate::connect::conninfo::{ConnInfo, RootCert, ServerCheck, TargetSessionAttrs};
use crate::connect::hosts;
use crate::connect::tls::{self, Identity, Trust};
use crate::exit;
use crate::guard::stop::Stop;

/// How long one statement may run. The claim and the marks touch at most one
/// batch of rows by primary key, so anything slower is a sick server, and
/// waiting on it would only hold row locks longer.
pub(crate) const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
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
pub(crate) fn connect(
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
pub(crate) fn connect_budget(info: &ConnInfo, connect_timeout: Duration) -> Duration {
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
