//! TLS for the postgres crate over tokio-rustls: its `MakeTlsConnect` and
//! `TlsConnect`, each connect recording what became of its handshake.
//!
//! The driver reports a failed handshake and a server that refused TLS
//! alike (an error of a private kind), and libpq's sslmode rules need to
//! know which happened: `prefer` retries in plain after a failed handshake,
//! `require` fails with "TLS required but not offered" when the server
//! answers 'N', and a certificate the operator's settings refuse is a
//! configuration problem (exit 78), not an outage. So each attempt shares
//! a `Handshake` record with its connector and reads it afterwards.
//!
//! Ours rather than tokio-postgres-rustls, which compiles ring (a second
//! crypto library beside lapin's aws-lc) and x509-cert for its channel
//! binding.
//!
//! No channel binding: the driver then answers a SCRAM-SHA-256-PLUS offer
//! with plain SCRAM-SHA-256 saying it does not support binding, which
//! servers accept (`channel_binding=require` is refused by conninfo).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use postgres::Socket;
use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::TlsConnector;

/// What became of one attempt's TLS handshake.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Handshake {
    /// None was tried: the server refused TLS ('N'), or it was not asked.
    #[default]
    NotTried,
    Done,
    /// It failed: the reason, and whether TLS itself refused (a
    /// certificate or protocol problem) rather than the network.
    Failed {
        reason: String,
        refused: bool,
    },
}

/// The connector handed to `postgres::Config::connect`.
pub(crate) struct Rustls {
    config: Arc<ClientConfig>,
    handshake: Arc<Mutex<Handshake>>,
}

impl Rustls {
    /// A connector for one attempt, and the record of its handshake.
    pub(crate) fn new(config: Arc<ClientConfig>) -> (Rustls, Arc<Mutex<Handshake>>) {
        let handshake = Arc::new(Mutex::new(Handshake::NotTried));
        let connector = Rustls {
            config,
            handshake: Arc::clone(&handshake),
        };
        (connector, handshake)
    }
}

impl MakeTlsConnect<Socket> for Rustls {
    type Stream = RustlsStream;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    /// `domain` is the host as the operator wrote it: a name, checked
    /// against the certificate's names and sent as SNI, or an IP address,
    /// checked against its IP addresses. The driver asks before it knows
    /// whether TLS will be used at all, with "" for a socket, so a name
    /// TLS cannot check fails only a handshake that is actually tried.
    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let name = ServerName::try_from(domain.to_string())
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error));
        Ok(RustlsConnect {
            config: Arc::clone(&self.config),
            name,
            handshake: Arc::clone(&self.handshake),
        })
    }
}

pub(crate) struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: io::Result<ServerName<'static>>,
    handshake: Arc<Mutex<Handshake>>,
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<RustlsStream>> + Send>>;

impl TlsConnect<Socket> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = io::Error;
    type Future = Connecting;

    fn connect(self, socket: Socket) -> Connecting {
        let RustlsConnect {
            config,
            name,
            handshake,
        } = self;
        Box::pin(async move {
            let result = match name {
                Ok(name) => TlsConnector::from(config).connect(name, socket).await,
                Err(error) => Err(error),
            };
            let outcome = match &result {
                Ok(_) => Handshake::Done,
                Err(error) => {
                    let (reason, refused) = super::tls::describe_handshake_error(error);
                    Handshake::Failed { reason, refused }
                }
            };
            if let Ok(mut record) = handshake.lock() {
                *record = outcome;
            }
            result.map(|stream| RustlsStream(Box::new(stream)))
        })
    }
}

/// The session over TLS, as the driver reads and writes it.
pub(crate) struct RustlsStream(Box<tokio_rustls::client::TlsStream<Socket>>);

impl TlsStream for RustlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for RustlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}
