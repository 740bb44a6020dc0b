//! Connecting to RabbitMQ: the first node of the list that accepts, in the
//! order given, each attempt bounded by --connect-timeout (or the URL's
//! smaller connection_timeout) and ended at once by a signal.
//!
//! The socket is made here, not by lapin, through its connector hook:
//! the host is resolved as the URL names it (lapin's URI crate would turn
//! an IPv6 literal into "localhost"), and amqps gets our TLS settings
//! (cacertfile, certfile/keyfile, verify, server_name_indication), which
//! lapin's own TLS cannot express. lapin then speaks AMQP over the socket,
//! honouring the URL's heartbeat, frame_max and channel_max.
//!
//! The run exits 69 only when no node accepts. A refusal no other node
//! would reverse (a refused login, a certificate the settings reject) is
//! 78, since every node of one cluster has the same users and the same CA.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, anyhow};
use lapin::tcp::{AsyncTcpStream, RustlsConnector};
use lapin::{Connection, ConnectionProperties};

use crate::connect::amqp_url::{AmqpNode, describe_broker};
use crate::connect::tls;
use crate::connect::wait::{self, Waited};
use crate::exit::{self, classify};
use crate::guard::stop::Stop;

/// Why one node would not do.
struct NodeFailure {
    broker: String,
    why: String,
    /// Not something a rerun fixes: a refused login, a certificate.
    config: bool,
}

/// The first node of `nodes` that accepts, and which one it was.
pub(crate) async fn connect_first(
    nodes: &[AmqpNode],
    connect_timeout: Duration,
    stop: &Stop,
) -> Result<(Connection, usize)> {
    let mut failures = Vec::new();
    for (index, node) in nodes.iter().enumerate() {
        let broker = describe_broker(&node.uri);
        let limit = node
            .connection_timeout
            .map_or(connect_timeout, |theirs| theirs.min(connect_timeout));
        let tls_failure = Arc::new(Mutex::new(None));
        let connect = connect_node(node, Arc::clone(&tls_failure));
        let failure = match wait::on_future(limit, stop, connect).await {
            Waited::Done(Ok(connection)) => {
                for earlier in &failures {
                    let NodeFailure { broker, why, .. } = earlier;
                    log::info!("RabbitMQ at {broker} was passed over: {why}");
                }
                return Ok((connection, index));
            }
            Waited::Done(Err(error)) => {
                let tls_failure = tls_failure.lock().ok().and_then(|failure| failure.clone());
                node_failure(broker, error, tls_failure)
            }
            Waited::TimedOut => NodeFailure {
                broker,
                why: format!(
                    "no answer within {} (--connect-timeout)",
                    humantime::format_duration(limit)
                ),
                config: false,
            },
            Waited::Stopped(exit) => {
                return Err(wait::stopped_while(
                    exit,
                    &format!(
                        "connecting to RabbitMQ at {broker}; the claimed events were left as \
                         they were"
                    ),
                ));
            }
        };
        failures.push(failure);
    }
    Err(none_accepted(&failures))
}

/// The error when no node accepted: each one named with its reason.
fn none_accepted(failures: &[NodeFailure]) -> anyhow::Error {
    let config = failures.iter().any(|failure| failure.config);
    let tried = match failures {
        [one] => format!("at {}: {}", one.broker, one.why),
        all => {
            let each: Vec<String> = all
                .iter()
                .map(|failure| format!("{}: {}", failure.broker, failure.why))
                .collect();
            format!(
                "(none of the {} nodes accepted): {}",
                all.len(),
                each.join("; ")
            )
        }
    };
    if config {
        exit::config(anyhow!(
            "cannot connect to RabbitMQ {tried}; check the user, password, vhost and TLS \
             settings in AMQP_URL"
        ))
    } else {
        exit::outage(anyhow!(
            "cannot connect to RabbitMQ {tried}; check that the broker is up and AMQP_URL is right"
        ))
    }
}

/// Resolves the node's host as written, connects to its addresses in turn,
/// and for amqps makes the TLS session; lapin does the rest. A TLS failure
/// is recorded in `tls_failure` (lapin's error says only "I/O error").
async fn connect_node(
    node: &AmqpNode,
    tls_failure: Arc<Mutex<Option<String>>>,
) -> Result<Connection, lapin::Error> {
    let host = node.uri.authority.host.clone();
    let port = node.uri.authority.port;
    // ::ffff:a.b.c.d is the IPv4 host a.b.c.d: reached over IPv4, so it
    // works where IPv6 is off too.
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await?
        .map(|address| SocketAddr::new(address.ip().to_canonical(), address.port()))
        .collect();
    let tls = match &node.tls {
        Some(settings) => {
            let config = tls::client_config(&settings.settings).map_err(|error| {
                let why = format!("{error:#}");
                if let Ok(mut failure) = tls_failure.lock() {
                    *failure = Some(why.clone());
                }
                lapin::Error::from(std::io::Error::other(why))
            })?;
            Some((RustlsConnector::from(config), settings.server_name.clone()))
        }
        None => None,
    };
    let runtime = lapin::runtime::default_runtime()?;
    let properties = ConnectionProperties::default().with_connection_name("outbox-poll".into());
    let socket = async move |_uri, runtime| {
        let stream = AsyncTcpStream::connect(&runtime, addresses.clone()).await?;
        let Some((connector, name)) = &tls else {
            return Ok(stream);
        };
        stream.into_rustls(connector, name).await.map_err(|error| {
            let (why, refused) = tls::describe_handshake_error(&error);
            if refused && let Ok(mut failure) = tls_failure.lock() {
                *failure = Some(format!("the TLS handshake failed: {why}"));
            }
            lapin::Error::from(error)
        })
    };
    Connection::connector(node.uri.clone(), runtime, socket, properties).await
}

/// What a failed connect to one node says.
fn node_failure(broker: String, error: lapin::Error, tls_failure: Option<String>) -> NodeFailure {
    if let Some(why) = tls_failure {
        return NodeFailure {
            broker,
            why,
            config: true,
        };
    }
    // Over TLS 1.3 the broker checks our certificate after our side of
    // the handshake is done: its refusal comes as the first read's error.
    if let lapin::ErrorKind::IOError(io) = error.kind()
        && let (why, true) = tls::describe_handshake_error(io)
    {
        return NodeFailure {
            broker,
            why: format!("the broker refused the TLS session: {why}"),
            config: true,
        };
    }
    let refused = matches!(error.kind(), lapin::ErrorKind::AuthProviderError(_))
        || refusal(&error) == Some(classify::Cause::Config);
    NodeFailure {
        broker,
        why: error.to_string(),
        config: refused,
    }
}

/// What the broker's refusal says, by its reply code (see exit::classify);
/// None when the error is not the broker's word at all (a socket, a
/// timeout).
pub(crate) fn refusal(error: &lapin::Error) -> Option<classify::Cause> {
    reply_code(error).map(classify::amqp)
}

/// The reply code of the broker's connection.close or channel.close behind
/// `error`, if it is one.
pub(crate) fn reply_code(error: &lapin::Error) -> Option<u16> {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => Some(amqp.get_id()),
        _ => None,
    }
}
