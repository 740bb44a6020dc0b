//! A fake PostgreSQL server on a free loopback port, scripted by the test:
//! it answers SSLRequest with 'N' (TLS refused) or 'S' and a TLS handshake
//! with the test's certificate, logs the client in without a password or
//! asks for a cleartext one, then either fails the login with the SQLSTATE
//! the test chose or sends AuthenticationOk and ReadyForQuery. It records
//! what it received (startup parameters, passwords, TLS use, queries), so a
//! test can check what outbox-poll sent, say which .pgpass line it used.
//! Queries get an error: nothing past the login is faked.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use rustls::{ServerConfig, ServerConnection, StreamOwned};

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const PROTOCOL_3: u32 = 196_608;
/// A client that says nothing for this long is gone; its thread ends.
const IDLE: Duration = Duration::from_secs(30);

/// What the server does with each connection.
#[derive(Clone)]
pub struct Script {
    pub tls: Tls,
    pub login: Login,
    pub outcome: Outcome,
}

#[derive(Clone)]
pub enum Tls {
    /// Answer SSLRequest with 'N', as a server without ssl = on does.
    Refuse,
    /// Answer 'S' and complete a TLS handshake with this configuration.
    Accept(Arc<ServerConfig>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Login {
    /// No password asked (like `trust` in pg_hba.conf).
    Trust,
    /// AuthenticationCleartextPassword: the password arrives readable.
    CleartextPassword,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// AuthenticationOk, then ReadyForQuery: the client is connected.
    Ready,
    /// A FATAL ErrorResponse with this SQLSTATE and message, then close
    /// (28P01 is a wrong password, 57P03 a server starting up).
    Fail { sqlstate: String, message: String },
}

impl Default for Script {
    /// Refuses TLS, asks nothing, lets the client in.
    fn default() -> Self {
        Script {
            tls: Tls::Refuse,
            login: Login::Trust,
            outcome: Outcome::Ready,
        }
    }
}

/// What the server has received so far, over every connection.
#[derive(Clone, Debug, Default)]
pub struct Received {
    pub connections: usize,
    pub ssl_requests: usize,
    /// Startup packets that came over TLS (so the handshake succeeded).
    pub tls_startups: usize,
    /// Each startup packet's parameters (user, database, application_name...).
    pub startups: Vec<BTreeMap<String, String>>,
    pub passwords: Vec<String>,
    pub queries: Vec<String>,
}

pub struct FakePostgres {
    port: u16,
    received: Arc<Mutex<Received>>,
    stopping: Arc<AtomicBool>,
}

impl FakePostgres {
    pub fn start(script: Script) -> FakePostgres {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the fake PostgreSQL");
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Received::default()));
        let stopping = Arc::new(AtomicBool::new(false));
        let (shared, stop) = (Arc::clone(&received), Arc::clone(&stopping));
        thread::spawn(move || {
            for socket in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(socket) = socket else { continue };
                shared.lock().unwrap().connections += 1;
                let (script, received) = (script.clone(), Arc::clone(&shared));
                thread::spawn(move || {
                    let _ = serve(socket, &script, &received);
                });
            }
        });
        FakePostgres {
            port,
            received,
            stopping,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn received(&self) -> Received {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for FakePostgres {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag and drops the listener.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

trait Wire: Read + Write + Send {}
impl<T: Read + Write + Send> Wire for T {}

fn serve(socket: TcpStream, script: &Script, received: &Mutex<Received>) -> io::Result<()> {
    socket.set_read_timeout(Some(IDLE))?;
    let mut stream: Box<dyn Wire> = Box::new(socket.try_clone()?);
    let mut over_tls = false;
    let parameters = loop {
        let mut header = [0u8; 8];
        stream.read_exact(&mut header)?;
        let length = u32::from_be_bytes(header[..4].try_into().unwrap()) as usize;
        let code = u32::from_be_bytes(header[4..].try_into().unwrap());
        let mut body = vec![0u8; length.saturating_sub(8)];
        stream.read_exact(&mut body)?;
        match code {
            SSL_REQUEST => {
                received.lock().unwrap().ssl_requests += 1;
                match &script.tls {
                    Tls::Refuse => stream.write_all(b"N")?,
                    Tls::Accept(config) => {
                        stream.write_all(b"S")?;
                        let connection =
                            ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
                        stream = Box::new(StreamOwned::new(connection, socket.try_clone()?));
                        over_tls = true;
                    }
                }
            }
            GSSENC_REQUEST => stream.write_all(b"N")?,
            PROTOCOL_3 => break parse_parameters(&body),
            // A CancelRequest or something that is not PostgreSQL's.
            _ => return Ok(()),
        }
    };
    {
        let mut received = received.lock().unwrap();
        received.startups.push(parameters);
        received.tls_startups += usize::from(over_tls);
    }
    if script.login == Login::CleartextPassword {
        send(&mut stream, b'R', &3u32.to_be_bytes())?;
        let (kind, body) = read_message(&mut stream)?;
        if kind != b'p' {
            return Ok(());
        }
        let password = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(&body));
        received
            .lock()
            .unwrap()
            .passwords
            .push(password.into_owned());
    }
    if let Outcome::Fail { sqlstate, message } = &script.outcome {
        return send_error(&mut stream, "FATAL", sqlstate, message);
    }
    send(&mut stream, b'R', &0u32.to_be_bytes())?;
    for (name, value) in [("server_version", "15.0"), ("client_encoding", "UTF8")] {
        send(&mut stream, b'S', format!("{name}\0{value}\0").as_bytes())?;
    }
    send(&mut stream, b'K', &[0, 0, 0, 1, 0, 0, 0, 2])?;
    send(&mut stream, b'Z', b"I")?;
    loop {
        match read_message(&mut stream)? {
            (b'X', _) => return Ok(()),
            // A simple query, or the Sync ending an extended one.
            (kind @ (b'Q' | b'S'), body) => {
                if kind == b'Q' {
                    let query = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(&body));
                    received.lock().unwrap().queries.push(query.into_owned());
                }
                send_error(
                    &mut stream,
                    "ERROR",
                    "0A000",
                    "the fake server runs no queries",
                )?;
                send(&mut stream, b'Z', b"I")?;
            }
            _ => {}
        }
    }
}

/// The startup packet's key\0value\0 pairs, after the protocol version.
fn parse_parameters(body: &[u8]) -> BTreeMap<String, String> {
    let text = String::from_utf8_lossy(body);
    let fields: Vec<&str> = text.split('\0').collect();
    fields
        .chunks(2)
        .filter(|pair| pair.len() == 2 && !pair[0].is_empty())
        .map(|pair| (pair[0].to_string(), pair[1].to_string()))
        .collect()
}

fn read_message(stream: &mut Box<dyn Wire>) -> io::Result<(u8, Vec<u8>)> {
    let mut header = [0u8; 5];
    stream.read_exact(&mut header)?;
    let length = u32::from_be_bytes(header[1..].try_into().unwrap()) as usize;
    let mut body = vec![0u8; length.saturating_sub(4)];
    stream.read_exact(&mut body)?;
    Ok((header[0], body))
}

fn send(stream: &mut Box<dyn Wire>, kind: u8, body: &[u8]) -> io::Result<()> {
    let mut message = vec![kind];
    message.extend_from_slice(&u32::try_from(body.len() + 4).unwrap().to_be_bytes());
    message.extend_from_slice(body);
    stream.write_all(&message)?;
    stream.flush()
}

fn send_error(
    stream: &mut Box<dyn Wire>,
    severity: &str,
    sqlstate: &str,
    message: &str,
) -> io::Result<()> {
    let body = format!("S{severity}\0V{severity}\0C{sqlstate}\0M{message}\0\0");
    send(stream, b'E', body.as_bytes())
}
