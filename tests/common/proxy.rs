//! A TCP proxy the tests own, placed between outbox-poll and a server to
//! inject faults without touching the shared servers: count connections
//! (and those still open), cut every connection now, cut each after N
//! bytes either way, stall (sockets stay open, nothing moves), let through
//! only the first N bytes the client sends, or cut a connection once the
//! server has a given message from the client, before its answer gets back.
//! It keeps the first RECORDED bytes the client sent, so a test can read
//! what reached the server (say, AMQP's connection.tune-ok), and it can
//! listen on another loopback address (IPv6's ::1).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

#[derive(Default)]
struct State {
    connections: AtomicUsize,
    /// Connections the client has not closed yet.
    open: AtomicUsize,
    /// The local port of each connection to the server: the client port
    /// the server sees (pg_stat_activity.client_port).
    server_ports: Mutex<Vec<u16>>,
    stalled: AtomicBool,
    /// Bumped by every cut: a pump from an older generation stops, even if
    /// it is stalled and so not reading its socket.
    generation: AtomicU64,
    /// Bytes of each connection's client-to-server stream let through
    /// before that direction stalls; u64::MAX means no limit.
    upstream_limit: AtomicU64,
    /// Bytes of each connection's stream, client to server and server to
    /// client, let through before the connection is cut; u64::MAX: never.
    cut_after: [AtomicU64; 2],
    /// Client bytes that, once sent on to the server, cut their connection
    /// before anything more reaches the client (once, then cleared).
    cut_after_sending: Mutex<Option<Vec<u8>>>,
    /// Bytes the client sent that reached the server, all connections.
    upstream_bytes: AtomicU64,
    /// Bytes the server sent that reached the client, all connections.
    downstream_bytes: AtomicU64,
    /// The first RECORDED bytes the client sent, all connections.
    recorded: Mutex<Vec<u8>>,
    sockets: Mutex<Vec<TcpStream>>,
}

/// How much of what clients send the proxy keeps (see Proxy::upstream_seen).
const RECORDED: usize = 64 * 1024;

pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        Proxy::start_on("127.0.0.1", target)
    }

    /// Listens on a free port of `address` ("::1", say) and forwards to
    /// `target`.
    pub fn start_on(address: &str, target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind((address, 0)).expect("binding the proxy");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream_limit: AtomicU64::new(u64::MAX),
            cut_after: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
            ..State::default()
        });
        let shared = Arc::clone(&state);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                connect_pumps(client, server, &shared);
            }
        });
        Proxy { addr, state }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Connections accepted that the client has not closed.
    pub fn open_connections(&self) -> usize {
        self.state.open.load(Ordering::SeqCst)
    }

    /// The ports the proxy connected to the server from, one for each
    /// connection so far: to find them in pg_stat_activity.
    pub fn server_ports(&self) -> Vec<u16> {
        self.state.server_ports.lock().unwrap().clone()
    }

    /// Client bytes that reached the server so far.
    pub fn upstream_bytes(&self) -> u64 {
        self.state.upstream_bytes.load(Ordering::SeqCst)
    }

    /// The first bytes clients sent that reached the server, in order.
    pub fn upstream_seen(&self) -> Vec<u8> {
        self.state.recorded.lock().unwrap().clone()
    }

    /// Closes every open connection at once, like a broker or network dying.
    pub fn cut(&self) {
        self.state.generation.fetch_add(1, Ordering::SeqCst);
        for socket in self.state.sockets.lock().unwrap().drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    /// Stops moving bytes either way while keeping every socket open.
    pub fn stall(&self) {
        self.state.stalled.store(true, Ordering::SeqCst);
    }

    /// Each connection is cut (both ways, at once) as soon as `bytes` have
    /// passed in `direction`; the bytes past that point never arrive.
    pub fn cut_after(&self, direction: Direction, bytes: u64) {
        self.state.cut_after[direction as usize].store(bytes, Ordering::SeqCst);
    }

    /// The next time the client sends bytes containing `message`, they
    /// reach the server, and then the connection is cut: the server acts
    /// on them, and its answer never reaches the client (a COMMIT whose
    /// reply is lost, say). Once.
    pub fn cut_after_sending(&self, message: &[u8]) {
        *self.state.cut_after_sending.lock().unwrap() = Some(message.to_vec());
    }

    /// Lifts every fault, for the connections to come: no stall, no cut
    /// after a byte count, no cut after a message.
    pub fn heal(&self) {
        self.resume();
        for limit in &self.state.cut_after {
            limit.store(u64::MAX, Ordering::SeqCst);
        }
        *self.state.cut_after_sending.lock().unwrap() = None;
    }

    /// Lets bytes move again, lifting stall() and stall_upstream_after().
    pub fn resume(&self) {
        self.state.upstream_limit.store(u64::MAX, Ordering::SeqCst);
        self.state.stalled.store(false, Ordering::SeqCst);
    }

    /// Waits until the server has sent nothing for `quiet` (say, every
    /// confirm for what got through has come back), at most `limit`.
    pub fn wait_for_quiet_downstream(&self, quiet: Duration, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut last = (
            self.state.downstream_bytes.load(Ordering::SeqCst),
            std::time::Instant::now(),
        );
        while std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
            let now = self.state.downstream_bytes.load(Ordering::SeqCst);
            if now != last.0 {
                last = (now, std::time::Instant::now());
            } else if last.1.elapsed() >= quiet {
                return true;
            }
        }
        false
    }

    /// Waits until the client has sent at least `bytes` (for example: until
    /// a stall_upstream_after(bytes) holds the run mid-batch).
    pub fn wait_for_upstream(&self, bytes: u64, limit: Duration) -> bool {
        super::wait_until(limit, || self.upstream_bytes() >= bytes)
    }

    /// Each connection passes only its first `bytes` client bytes on, then
    /// holds the rest; the server's replies keep flowing.
    pub fn stall_upstream_after(&self, bytes: u64) {
        self.state.upstream_limit.store(bytes, Ordering::SeqCst);
    }
}

/// Which way bytes flow through the proxy.
#[derive(Clone, Copy, Debug)]
pub enum Direction {
    /// Client to server.
    Upstream = 0,
    /// Server to client.
    Downstream = 1,
}

fn connect_pumps(client: TcpStream, server: TcpStream, state: &Arc<State>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    state.open.fetch_add(1, Ordering::SeqCst);
    if let Ok(local) = server.local_addr() {
        state.server_ports.lock().unwrap().push(local.port());
    }
    {
        let mut sockets = state.sockets.lock().unwrap();
        sockets.push(client.try_clone().unwrap());
        sockets.push(server.try_clone().unwrap());
    }
    let (client2, server2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    // Set by the upstream pump when cut_after_sending fires: the
    // downstream pump then forwards nothing more.
    let severed = Arc::new(AtomicBool::new(false));
    let (up, up_severed) = (Arc::clone(state), Arc::clone(&severed));
    thread::spawn(move || {
        pump(client, server, &up, &up_severed, true);
        up.open.fetch_sub(1, Ordering::SeqCst);
    });
    let down = Arc::clone(state);
    thread::spawn(move || pump(server2, client2, &down, &severed, false));
}

/// Whether `chunk` (client bytes) holds the message cut_after_sending
/// waits for; if so, the fault is used up.
fn fires_cut_after_sending(state: &State, chunk: &[u8]) -> bool {
    let mut armed = state.cut_after_sending.lock().unwrap();
    let fires = armed.as_ref().is_some_and(|message| {
        chunk
            .windows(message.len())
            .any(|w| w == message.as_slice())
    });
    if fires {
        *armed = None;
    }
    fires
}

/// Copies one direction until either side closes, honouring the faults.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    state: &State,
    severed: &AtomicBool,
    upstream: bool,
) {
    let mut buffer = [0u8; 16 * 1024];
    let mut sent: u64 = 0;
    let generation = state.generation.load(Ordering::SeqCst);
    let cut = || state.generation.load(Ordering::SeqCst) != generation;
    loop {
        if cut() {
            break;
        }
        let allowed = if upstream {
            state
                .upstream_limit
                .load(Ordering::SeqCst)
                .saturating_sub(sent)
        } else {
            u64::MAX
        };
        if state.stalled.load(Ordering::SeqCst) || allowed == 0 {
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        let want = buffer
            .len()
            .min(usize::try_from(allowed).unwrap_or(usize::MAX));
        let read = match from.read(&mut buffer[..want]) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let cut_at = state.cut_after[usize::from(!upstream)].load(Ordering::SeqCst);
        if sent + read as u64 >= cut_at {
            let keep = usize::try_from(cut_at.saturating_sub(sent)).unwrap_or(read);
            let _ = to.write_all(&buffer[..keep]);
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
        while state.stalled.load(Ordering::SeqCst) && !cut() {
            thread::sleep(Duration::from_millis(5));
        }
        if upstream && fires_cut_after_sending(state, &buffer[..read]) {
            // Severed before the server can answer, so that no answer gets
            // past the downstream pump; then the bytes go on (the server
            // reads them, then the end of its input), and the client's
            // side closes.
            severed.store(true, Ordering::SeqCst);
            let _ = to.write_all(&buffer[..read]);
            let _ = to.shutdown(Shutdown::Write);
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
        if severed.load(Ordering::SeqCst) {
            break;
        }
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
        sent += read as u64;
        let counter = if upstream {
            let mut recorded = state.recorded.lock().unwrap();
            let room = RECORDED.saturating_sub(recorded.len()).min(read);
            recorded.extend_from_slice(&buffer[..room]);
            &state.upstream_bytes
        } else {
            &state.downstream_bytes
        };
        counter.fetch_add(read as u64, Ordering::SeqCst);
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
