//! A TLS terminator the tests own, in front of a plain server (the shared
//! RabbitMQ, say): it listens on a free loopback port, completes the TLS
//! handshake with the test CA's server certificate (asking for a client
//! certificate if told to), then relays the plain bytes both ways. With it
//! `amqps://` is tested against the real broker, whose own configuration
//! is never touched. It counts the handshakes that succeeded and failed,
//! so a test can tell "refused by the client's verification" from "never
//! tried".

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use rustls::{ServerConfig, ServerConnection, StreamOwned};

/// How long each side is waited on before the other gets its turn: a
/// connection's two directions share one thread, because a rustls session
/// cannot be split between two.
const TURN: Duration = Duration::from_millis(5);

#[derive(Default)]
struct State {
    stopping: AtomicBool,
    handshakes: AtomicUsize,
    failed_handshakes: AtomicUsize,
}

pub struct TlsTerminator {
    port: u16,
    state: Arc<State>,
}

impl TlsTerminator {
    pub fn start(target: SocketAddr, config: Arc<ServerConfig>) -> TlsTerminator {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the TLS terminator");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let shared = Arc::clone(&state);
        thread::spawn(move || {
            for client in listener.incoming() {
                if shared.stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let (config, state) = (Arc::clone(&config), Arc::clone(&shared));
                thread::spawn(move || {
                    let _ = relay(client, target, config, &state);
                });
            }
        });
        TlsTerminator { port, state }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// TLS handshakes completed so far.
    pub fn handshakes(&self) -> usize {
        self.state.handshakes.load(Ordering::SeqCst)
    }

    /// TLS handshakes that failed (a client refusing the certificate, or
    /// not presenting one when it is required).
    pub fn failed_handshakes(&self) -> usize {
        self.state.failed_handshakes.load(Ordering::SeqCst)
    }
}

impl Drop for TlsTerminator {
    fn drop(&mut self) {
        self.state.stopping.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn relay(
    client: TcpStream,
    target: SocketAddr,
    config: Arc<ServerConfig>,
    state: &State,
) -> io::Result<()> {
    let connection = ServerConnection::new(config).map_err(io::Error::other)?;
    let mut tls = StreamOwned::new(connection, client);
    while tls.conn.is_handshaking() {
        if let Err(error) = tls.conn.complete_io(&mut tls.sock) {
            state.failed_handshakes.fetch_add(1, Ordering::SeqCst);
            return Err(error);
        }
    }
    state.handshakes.fetch_add(1, Ordering::SeqCst);
    let mut server = TcpStream::connect(target)?;
    tls.sock.set_read_timeout(Some(TURN))?;
    server.set_read_timeout(Some(TURN))?;
    let mut buffer = [0u8; 16 * 1024];
    while !state.stopping.load(Ordering::SeqCst) {
        match tls.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => server.write_all(&buffer[..read])?,
            Err(error) if waiting(&error) => {}
            Err(error) => return Err(error),
        }
        match server.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => {
                tls.write_all(&buffer[..read])?;
                tls.flush()?;
            }
            Err(error) if waiting(&error) => {}
            Err(error) => return Err(error),
        }
    }
    tls.conn.send_close_notify();
    tls.flush()
}

/// A read that timed out: nothing arrived during this side's turn.
fn waiting(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
