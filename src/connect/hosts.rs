//! Connecting to PostgreSQL host by host, following libpq's rules
//! (fe-connect.c, PQconnectPoll), so that a host list that works with psql
//! works here:
//!
//! - the hosts are tried in order, and for a name every address it
//!   resolves to; a host that cannot be reached (no address, refused,
//!   silent, reset) gives way to the next address, then the next host;
//! - a server that answered and refused the login ends the connect (a
//!   wrong password is wrong on every host), except "cannot connect now"
//!   (57P03: starting up, or a standby not ready yet), which gives way to
//!   the next host (see `exit::classify`);
//! - a server that does not suit target_session_attrs gives way to the next
//!   host; prefer-standby makes a second pass taking any server;
//! - sslmode: `prefer` tries TLS and, after a failed handshake or a login
//!   refused over TLS, once more in plain; `allow` tries plain and, after a
//!   refused login, once more with TLS; `require` and the verify modes fail
//!   when TLS fails, which ends the connect (exit 78); a socket never uses
//!   TLS.
//!
//! Each host gets --connect-timeout in all (its name's lookup, every
//! address, the TLS retry), and each of its attempts runs on a thread of
//! its own (see `wait`): the driver's own timeout covers only the TCP
//! connect, and a server that accepts and then says nothing would hold
//! the startup for ever. A signal ends the wait at once.
//!
//! Every error names the host it is about: the one that refused, or each
//! one tried and why none would do.

use std::net::{IpAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use postgres::Client;
use postgres::config::SslMode as DriverSslMode;
use rustls::ClientConfig;

use crate::connect::conninfo::{ConnInfo, Host, SslMode, Target, TargetSessionAttrs};
use crate::connect::pg_error::{classify, describe};
use crate::connect::postgres_tls::{Handshake, Rustls};
use crate::connect::wait::{self, Waited};
use crate::exit::{self, classify as causes};
use crate::guard::stop::Stop;

/// What a connect needs besides the model itself.
pub(crate) struct Request<'a> {
    pub(crate) info: &'a ConnInfo,
    /// The server options of the startup packet (`-c name=value ...`).
    pub(crate) options: String,
    /// How long each host may take, all its attempts together.
    pub(crate) per_host: Duration,
    /// For every TCP host; never used where sslmode is disable.
    pub(crate) tls: Arc<ClientConfig>,
    pub(crate) stop: Option<&'a Stop>,
}

/// What a server says about itself, for target_session_attrs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ServerState {
    in_recovery: bool,
    read_only: bool,
}

/// How one host ended, when it does not end the whole connect.
enum HostEnd {
    Connected(Box<Client>),
    /// Logged in, but the server does not suit target_session_attrs.
    Unsuitable(ServerState),
    /// No address of it would do; why, for the message.
    Unreachable(String),
}

/// How one attempt (one address, one TLS mode) ended.
enum Attempt {
    Connected(Box<Client>, Option<ServerState>),
    /// Nothing answered, or the network failed: the next address.
    Unreachable(String),
    /// The server answered with an error: the login was refused.
    Refused(postgres::Error),
    /// TLS was required and failed (a certificate, or not offered).
    Tls(String),
    /// The server asked for a password and we have none.
    NoPassword,
}

/// What a failure to connect says first when nothing was configured.
const NOTHING_CONFIGURED: &str = "nothing says which PostgreSQL to use (no DATABASE_URL, \
     service or PG* variable), so libpq's defaults were tried: set DATABASE_URL, e.g. \
     postgresql://USER:PASSWORD@HOST:5432/DATABASE, and AMQP_URL, e.g. \
     amqp://USER:PASSWORD@HOST:5672/%2f";

/// Connects to the first host that accepts and suits target_session_attrs.
pub(crate) fn connect(request: &Request) -> Result<Client> {
    let connected = connect_to_any(request);
    if request.info.nothing_configured {
        connected.context(NOTHING_CONFIGURED)
    } else {
        connected
    }
}

fn connect_to_any(request: &Request) -> Result<Client> {
    let info = request.info;
    let passes: &[TargetSessionAttrs] = match info.target_session_attrs {
        TargetSessionAttrs::PreferStandby => {
            &[TargetSessionAttrs::Standby, TargetSessionAttrs::Any]
        }
        wanted => &[wanted][..],
    };
    let mut unreachable = Vec::new();
    let mut unsuitable = Vec::new();
    // The last pass decides: prefer-standby's second takes any server.
    for &wanted in passes {
        unreachable.clear();
        unsuitable.clear();
        for target in &info.targets {
            match try_host(request, target, wanted)? {
                HostEnd::Connected(client) => return Ok(*client),
                HostEnd::Unsuitable(state) => unsuitable.push((target, state)),
                HostEnd::Unreachable(why) => unreachable.push(format!("{target}: {why}")),
            }
        }
    }
    let who = format!("(database {} as {})", info.dbname, info.user);
    if unsuitable.is_empty() {
        let at = match unreachable.as_slice() {
            [one] => format!("at {one}"),
            all => format!("{who}: {}", all.join("; ")),
        };
        return Err(exit::outage(anyhow!(
            "cannot connect to PostgreSQL {at}; check that the server is up and reachable, \
             and that DATABASE_URL (or PGHOST etc.) is right"
        )));
    }
    let mut seen: Vec<String> = unsuitable
        .iter()
        .map(|(target, state)| format!("{target} is {}", describe_state(*state)))
        .collect();
    seen.extend(unreachable);
    Err(exit::outage(anyhow!(
        "no PostgreSQL server of the list {who} suits target_session_attrs={}: {}; {}",
        attrs_name(info.target_session_attrs),
        seen.join("; "),
        advice_for(info.target_session_attrs)
    )))
}

/// Every address of one host, each with libpq's TLS retries, within the
/// host's share of time.
fn try_host(request: &Request, target: &Target, wanted: TargetSessionAttrs) -> Result<HostEnd> {
    let deadline = Instant::now() + request.per_host;
    let addresses = match &target.host {
        Host::Socket(_) => vec![None],
        Host::Tcp(name) => match resolve(request, name, target.port, deadline)? {
            Ok(addresses) => addresses.into_iter().map(Some).collect(),
            Err(why) => return Ok(HostEnd::Unreachable(why)),
        },
    };
    let mut last = String::new();
    for address in addresses {
        match attempt_with_retries(request, target, address, deadline)? {
            Attempt::Connected(client, state) => {
                return Ok(match state {
                    Some(state) if !suits(wanted, state) => HostEnd::Unsuitable(state),
                    _ => HostEnd::Connected(client),
                });
            }
            Attempt::Unreachable(why) => last = why,
            Attempt::Refused(error) => match error.code() {
                Some(code) if causes::postgres_tries_next_host(code.code()) => {
                    return Ok(HostEnd::Unreachable(describe(&error)));
                }
                _ => return Err(refused(request.info, target, &error)),
            },
            Attempt::Tls(why) => {
                return Err(exit::config(anyhow!(
                    "cannot connect to PostgreSQL at {target}: {why}"
                )));
            }
            Attempt::NoPassword => {
                return Err(exit::config(anyhow!(
                    "PostgreSQL at {target} asks for a password, and none was given: put it in \
                     DATABASE_URL, PGPASSWORD or the password file (~/.pgpass or PGPASSFILE, \
                     mode 0600)"
                )));
            }
        }
    }
    Ok(HostEnd::Unreachable(last))
}

/// The addresses of a name, looked up on a thread (getaddrinfo cannot be
/// interrupted); an IP address is its own. The inner error says why the
/// host is unreachable.
fn resolve(
    request: &Request,
    name: &str,
    port: u16,
    deadline: Instant,
) -> Result<Result<Vec<IpAddr>, String>> {
    if let Ok(address) = name.parse::<IpAddr>() {
        return Ok(Ok(vec![address]));
    }
    let owned = name.to_string();
    let lookup = move || {
        (owned.as_str(), port)
            .to_socket_addrs()
            .map(|found| found.map(|address| address.ip()).collect::<Vec<_>>())
    };
    let left = deadline.saturating_duration_since(Instant::now());
    Ok(
        match wait::on_thread("pg-resolve", left, request.stop, lookup)? {
            Waited::Done(Ok(addresses)) if !addresses.is_empty() => Ok(dedup(addresses)),
            Waited::Done(Ok(_)) => Err("the name has no address".into()),
            Waited::Done(Err(error)) => Err(format!("cannot resolve the name: {error}")),
            Waited::TimedOut => Err(format!(
                "the name was not resolved within {} (--connect-timeout)",
                humantime::format_duration(request.per_host)
            )),
            Waited::Stopped(exit) => {
                return Err(wait::stopped_while(
                    exit,
                    &format!("looking up the PostgreSQL host {name}"),
                ));
            }
        },
    )
}

/// The lookup's addresses, each once, in its order.
fn dedup(addresses: Vec<IpAddr>) -> Vec<IpAddr> {
    let mut unique = Vec::with_capacity(addresses.len());
    for address in addresses {
        if !unique.contains(&address) {
            unique.push(address);
        }
    }
    unique
}

/// One address, in the sslmode's order of tries (see the module's notes).
fn attempt_with_retries(
    request: &Request,
    target: &Target,
    address: Option<IpAddr>,
    deadline: Instant,
) -> Result<Attempt> {
    let mode = match target.host {
        Host::Socket(_) => SslMode::Disable,
        Host::Tcp(_) => request.info.ssl.mode,
    };
    let attempt = |driver_mode| attempt(request, target, address, driver_mode, deadline);
    Ok(match mode {
        SslMode::Disable => attempt(DriverSslMode::Disable)?.0,
        SslMode::Allow => match attempt(DriverSslMode::Disable)?.0 {
            Attempt::Refused(_) => attempt(DriverSslMode::Prefer)?.0,
            other => other,
        },
        SslMode::Prefer => match attempt(DriverSslMode::Prefer)? {
            (Attempt::Refused(_), Handshake::Done) | (_, Handshake::Failed { .. }) => {
                attempt(DriverSslMode::Disable)?.0
            }
            (other, _) => other,
        },
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            attempt(DriverSslMode::Require)?.0
        }
    })
}

/// What the worker thread brings back.
enum Worked {
    LoggedIn(Box<Client>, Option<ServerState>),
    LoginFailed(postgres::Error),
    /// Logged in, but the target_session_attrs query failed.
    CheckFailed(postgres::Error),
}

/// One connect to one address in one TLS mode, and with
/// target_session_attrs the one query that says what the server is.
fn attempt(
    request: &Request,
    target: &Target,
    address: Option<IpAddr>,
    mode: DriverSslMode,
    deadline: Instant,
) -> Result<(Attempt, Handshake)> {
    let info = request.info;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Ok((
            Attempt::Unreachable(timed_out(request)),
            Handshake::NotTried,
        ));
    }
    let mut config = postgres::Config::new();
    match (&target.host, address) {
        (Host::Socket(dir), _) => config.host_path(dir),
        (Host::Tcp(name), Some(address)) => config.host(name).hostaddr(address),
        (Host::Tcp(name), None) => config.host(name),
    };
    config
        .port(target.port)
        .user(&info.user)
        .dbname(&info.dbname)
        .application_name(&info.application_name)
        .options(&request.options)
        .ssl_mode(mode)
        .connect_timeout(left);
    if let Some(password) = &target.password {
        config.password(password.secret());
    }
    let (connector, handshake) = Rustls::new(Arc::clone(&request.tls));
    let check = info.target_session_attrs != TargetSessionAttrs::Any;
    let work = move || match config.connect(connector) {
        Ok(mut client) if check => match server_state(&mut client) {
            Ok(state) => Worked::LoggedIn(Box::new(client), Some(state)),
            Err(error) => Worked::CheckFailed(error),
        },
        Ok(client) => Worked::LoggedIn(Box::new(client), None),
        Err(error) => Worked::LoginFailed(error),
    };
    let worked = match wait::on_thread("pg-connect", left, request.stop, work)? {
        Waited::Done(worked) => worked,
        Waited::TimedOut => {
            let handshake = record(&handshake);
            return Ok((Attempt::Unreachable(timed_out(request)), handshake));
        }
        Waited::Stopped(exit) => {
            return Err(wait::stopped_while(
                exit,
                &format!("connecting to PostgreSQL at {target}; nothing was claimed"),
            ));
        }
    };
    let handshake = record(&handshake);
    let attempt = match worked {
        Worked::LoggedIn(client, state) => Attempt::Connected(client, state),
        Worked::CheckFailed(error) => Attempt::Unreachable(format!(
            "logged in, but asking whether it is a standby failed: {}",
            describe(&error)
        )),
        Worked::LoginFailed(error) => failed(error, &handshake, mode),
    };
    Ok((attempt, handshake))
}

/// What a failed login means, given what became of its handshake.
fn failed(error: postgres::Error, handshake: &Handshake, mode: DriverSslMode) -> Attempt {
    if error.as_db_error().is_some() {
        return Attempt::Refused(error);
    }
    // Over TLS 1.3 the server checks our certificate after our side of
    // the handshake is done: its refusal comes as the first read's error.
    let session_refused = io_source(&error).and_then(|io| {
        let (why, refused) = super::tls::describe_handshake_error(io);
        refused.then_some(why)
    });
    if let (Handshake::Done, Some(why)) = (handshake, session_refused) {
        return Attempt::Tls(format!(
            "the server refused the TLS session: {why}; check sslcert and sslkey (or \
             PGSSLCERT, PGSSLKEY)"
        ));
    }
    match handshake {
        Handshake::Failed {
            reason,
            refused: true,
        } => Attempt::Tls(format!(
            "the TLS handshake failed: {reason}; check sslmode and sslrootcert (or PGSSLMODE, \
             PGSSLROOTCERT) against the server's certificate"
        )),
        Handshake::Failed {
            reason,
            refused: false,
        } => Attempt::Unreachable(format!("the TLS handshake broke off: {reason}")),
        // The driver asked for TLS and never handed us the socket, and no
        // network error stopped it (those carry an io::Error): the server
        // answered the request with 'N'.
        Handshake::NotTried
            if mode == DriverSslMode::Require
                && io_source(&error).is_none()
                && error.to_string().contains("TLS") =>
        {
            Attempt::Tls(
                "the server does not offer TLS, which sslmode requires: turn ssl on in the \
                 server, or use sslmode=prefer"
                    .into(),
            )
        }
        // The driver's only word for it (a configuration error of its own).
        _ if describe(&error).ends_with("password missing") => Attempt::NoPassword,
        _ => Attempt::Unreachable(describe(&error)),
    }
}

/// The network error under a driver error, if that is what it is.
fn io_source(error: &postgres::Error) -> Option<&std::io::Error> {
    std::error::Error::source(error).and_then(|source| source.downcast_ref::<std::io::Error>())
}

fn timed_out(request: &Request) -> String {
    format!(
        "not connected within {} (--connect-timeout): is it up, reachable (no firewall \
         dropping the connection) and not overloaded?",
        humantime::format_duration(request.per_host)
    )
}

/// What the attempt's handshake came to, once the attempt is over.
fn record(handshake: &Mutex<Handshake>) -> Handshake {
    handshake
        .lock()
        .map(|handshake| handshake.clone())
        .unwrap_or_default()
}

/// The one query target_session_attrs needs, in one round trip: what libpq
/// learns from `SHOW transaction_read_only` and `pg_is_in_recovery()`.
fn server_state(client: &mut Client) -> Result<ServerState, postgres::Error> {
    let rows = client.simple_query(
        "SELECT pg_catalog.pg_is_in_recovery(), \
         pg_catalog.current_setting('transaction_read_only')",
    )?;
    let row = rows.iter().find_map(|message| match message {
        postgres::SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    Ok(ServerState {
        in_recovery: row.and_then(|row| row.get(0)) == Some("t"),
        read_only: row.and_then(|row| row.get(1)) == Some("on"),
    })
}

fn suits(wanted: TargetSessionAttrs, state: ServerState) -> bool {
    match wanted {
        TargetSessionAttrs::Any => true,
        TargetSessionAttrs::ReadWrite => !state.read_only,
        TargetSessionAttrs::ReadOnly => state.read_only,
        TargetSessionAttrs::Primary => !state.in_recovery,
        TargetSessionAttrs::Standby | TargetSessionAttrs::PreferStandby => state.in_recovery,
    }
}

fn describe_state(state: ServerState) -> String {
    match state {
        ServerState {
            in_recovery: true, ..
        } => "a read-only standby".into(),
        ServerState {
            read_only: true, ..
        } => "a primary in read-only mode (default_transaction_read_only is on)".into(),
        _ => "a writable primary".into(),
    }
}

fn attrs_name(attrs: TargetSessionAttrs) -> &'static str {
    match attrs {
        TargetSessionAttrs::Any => "any",
        TargetSessionAttrs::ReadWrite => "read-write",
        TargetSessionAttrs::ReadOnly => "read-only",
        TargetSessionAttrs::Primary => "primary",
        TargetSessionAttrs::Standby => "standby",
        TargetSessionAttrs::PreferStandby => "prefer-standby",
    }
}

fn advice_for(attrs: TargetSessionAttrs) -> &'static str {
    match attrs {
        TargetSessionAttrs::ReadWrite | TargetSessionAttrs::Primary => {
            "list the primary's host too (the hosts are tried in turn), or wait until \
             failover promotes a standby: the next run tries again"
        }
        _ => "list a standby's host too (the hosts are tried in turn)",
    }
}

/// A login the server refused, naming the host that refused it.
fn refused(info: &ConnInfo, target: &Target, error: &postgres::Error) -> anyhow::Error {
    let from_file = target
        .password
        .as_ref()
        .and_then(|password| password.file.as_ref())
        .filter(|_| {
            error
                .code()
                .is_some_and(|code| code.code().starts_with("28"))
        });
    let cause = error.code().map(|code| causes::postgres(code.code()));
    let advice = match from_file {
        Some(file) => format!(
            "the password was read from the password file {}: fix its line for this host",
            file.display()
        ),
        None if cause == Some(causes::Cause::Config) => {
            "check the user, password and database in DATABASE_URL (or PGUSER etc.)".into()
        }
        None => "nothing was claimed; the next run will try again".into(),
    };
    let what = format!(
        "PostgreSQL at {target} refused the login (database {} as {})",
        info.dbname, info.user
    );
    classify(error, &what, &advice)
}
