//! A randomized fault soak: a producer inserts events while drains run
//! through the tests' proxies, each drain meeting one fault drawn at random
//! (a cut either way at a random byte count, to RabbitMQ or to PostgreSQL,
//! a stalled broker, SIGKILL, SIGTERM, or none); then a clean drain, and
//! the check: every event arrived at least once, every row is marked, and
//! no attempt was counted against any event, since every fault here is an
//! outage.
//!
//! About 30 s in `cargo test` (20 s of faults, then the clean drain and the
//! check); OUTBOX_SOAK_SECONDS=600 for ten minutes of faults. The
//! seed is printed first (shown when the test fails) and is read from
//! OUTBOX_SOAK_SEED, so the same faults can be drawn again (their timing
//! still varies).

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use crate::common::proxy::{Direction, Proxy};
use crate::common::{
    Fixture, amqp_addr, amqp_url_via, connect_db, database_addr, database_url_via, wait_until,
};

/// xorshift64*: enough randomness to draw faults, and replayable.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `low..high`.
    fn within(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.within(0, items.len() as u64) as usize]
    }
}

/// The fault one drain meets.
#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    /// Each connection to RabbitMQ cut after this many bytes one way.
    BrokerCut(Direction, u64),
    /// Each connection to PostgreSQL cut after this many bytes one way.
    DatabaseCut(Direction, u64),
    /// Every connection to RabbitMQ cut at once, this long after the start.
    BrokerDies(Duration),
    /// RabbitMQ hears nothing more after this many bytes, until the
    /// confirms time out.
    BrokerStalls(u64),
    Kill(Duration),
    Terminate(Duration),
}

impl Fault {
    fn draw(rng: &mut Rng) -> Fault {
        let direction = *rng.pick(&[Direction::Upstream, Direction::Downstream]);
        let bytes = rng.within(200, 300_000);
        let after = Duration::from_millis(rng.within(20, 1_500));
        match rng.within(0, 8) {
            0 => Fault::None,
            1 => Fault::BrokerCut(direction, bytes),
            2 => Fault::DatabaseCut(direction, bytes),
            3 => Fault::BrokerDies(after),
            4 => Fault::BrokerStalls(bytes),
            5 => Fault::Kill(after),
            6 => Fault::Terminate(after),
            _ => Fault::DatabaseCut(direction, rng.within(200, 5_000)),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::BrokerCut(Direction::Upstream, _) => "broker cut, upstream",
            Fault::BrokerCut(Direction::Downstream, _) => "broker cut, downstream",
            Fault::DatabaseCut(Direction::Upstream, _) => "database cut, upstream",
            Fault::DatabaseCut(Direction::Downstream, _) => "database cut, downstream",
            Fault::BrokerDies(_) => "broker dies",
            Fault::BrokerStalls(_) => "broker stalls",
            Fault::Kill(_) => "SIGKILL",
            Fault::Terminate(_) => "SIGTERM",
        }
    }
}

/// Inserts small batches of events until stopped; returns how many.
fn producer(fx: &Fixture, stop: Arc<AtomicBool>, seed: u64) -> thread::JoinHandle<i64> {
    let table = fx.quoted_table();
    thread::spawn(move || {
        let mut db = connect_db();
        let mut rng = Rng::new(seed);
        let mut inserted = 0;
        while !stop.load(Ordering::SeqCst) {
            let count = rng.within(1, 10) as i64;
            db.execute(
                &format!(
                    "INSERT INTO {table} (event_id, event_type, payload) \
                     SELECT 'p-' || ($1::bigint + g), 'order.created', \
                       jsonb_build_object('n', $1::bigint + g, 'note', repeat('x', 100)) \
                     FROM generate_series(1, $2::bigint) g"
                ),
                &[&inserted, &count],
            )
            .unwrap();
            inserted += count;
            sleep(Duration::from_millis(rng.within(10, 50)));
        }
        inserted
    })
}

/// The drain of one cycle, through the proxies.
fn drain(fx: &Fixture, broker: &Proxy, db: &Proxy, rng: &mut Rng) -> Child {
    let batch = rng.pick(&["1", "7", "50", "200", "1000"]).to_string();
    let mut command = fx.command();
    command
        .env("AMQP_URL", amqp_url_via(broker.port()))
        .env("DATABASE_URL", database_url_via(db.port()))
        .args(["--drain", "--batch-size", &batch, "--max-duration", "1s"])
        .args([
            "--connect-timeout",
            "2s",
            "--confirm-timeout",
            "2s",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if rng.within(0, 5) == 0 {
        command.arg("--ordered");
    }
    command.spawn().expect("starting outbox-poll")
}

fn signal(child: &Child, name: &str) {
    let _ = Command::new("kill")
        .args([name, &child.id().to_string()])
        .status();
}

/// One drain meeting `fault`; its exit code (None: killed by a signal) and
/// stderr.
fn cycle(
    fx: &Fixture,
    broker: &Proxy,
    db: &Proxy,
    fault: Fault,
    rng: &mut Rng,
) -> (Option<i32>, String) {
    match fault {
        Fault::BrokerCut(direction, bytes) => broker.cut_after(direction, bytes),
        Fault::DatabaseCut(direction, bytes) => db.cut_after(direction, bytes),
        Fault::BrokerStalls(bytes) => broker.stall_upstream_after(bytes),
        _ => {}
    }
    let mut child = drain(fx, broker, db, rng);
    match fault {
        Fault::BrokerDies(after) => {
            sleep(after);
            broker.cut();
        }
        Fault::Kill(after) => {
            sleep(after);
            let _ = child.kill();
        }
        Fault::Terminate(after) => {
            sleep(after);
            signal(&child, "-TERM");
        }
        _ => {}
    }
    // --max-duration 1s, 2 s timeouts: a drain that takes a minute hangs.
    let ended = wait_until(Duration::from_secs(60), || {
        child.try_wait().is_ok_and(|status| status.is_some())
    });
    if !ended {
        let _ = child.kill();
    }
    let output = child.wait_with_output().expect("waiting for outbox-poll");
    assert!(ended, "a drain hung under {fault:?}");
    // The connections of this cycle go, the faults with them.
    broker.heal();
    db.heal();
    broker.cut();
    db.cut();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code(), stderr)
}

#[test]
fn random_faults_lose_no_event_and_blame_none() {
    let seconds: u64 = std::env::var("OUTBOX_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("OUTBOX_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            now.map_or(1, |now| now.as_nanos() as u64)
        });
    eprintln!("soak: seed {seed}, {seconds} s (replay: OUTBOX_SOAK_SEED={seed})");
    let mut rng = Rng::new(seed);
    let mut fx = Fixture::new("soak");
    let (broker, db) = (Proxy::start(amqp_addr()), Proxy::start(database_addr()));
    let stop = Arc::new(AtomicBool::new(false));
    let producing = producer(&fx, Arc::clone(&stop), rng.next());

    let mut arrivals: HashMap<String, usize> = HashMap::new();
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        let fault = Fault::draw(&mut rng);
        *faults.entry(fault.name()).or_insert(0) += 1;
        let (code, stderr) = cycle(&fx, &broker, &db, fault, &mut rng);
        // An outage (69), a signal (143, or killed), or nothing wrong (0):
        // never an event's failure (1) nor a configuration problem (78).
        assert!(
            matches!(code, None | Some(0 | 69 | 143)),
            "seed {seed}: exit {code:?} under {fault:?}: {stderr}"
        );
        for (id, count) in fx.arrivals() {
            *arrivals.entry(id).or_insert(0) += count;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let inserted = producing.join().expect("the producer");

    // A clean drain, straight to the servers, once the killed runs' sessions
    // are gone and their rows free again.
    let delivered = wait_until(Duration::from_secs(60), || {
        let run = fx.run(&["--drain", "--batch-size", "1000"]);
        assert!(matches!(run.code, 0 | 69), "seed {seed}: {}", run.stderr);
        fx.rows().iter().all(|row| row.published)
    });
    for (id, count) in fx.arrivals() {
        *arrivals.entry(id).or_insert(0) += count;
    }
    eprintln!("soak: {inserted} events, faults {faults:?}");
    let rows = fx.rows();
    assert_eq!(rows.len() as i64, inserted);
    assert!(
        delivered,
        "seed {seed}: rows left unmarked after the clean drain"
    );
    let lost: Vec<&str> = rows
        .iter()
        .filter(|row| !arrivals.contains_key(&row.event_id))
        .map(|row| row.event_id.as_str())
        .collect();
    assert_eq!(lost, Vec::<&str>::new(), "seed {seed}: lost events");
    let blamed: Vec<&str> = rows
        .iter()
        .filter(|row| row.attempts != 0 || row.last_error.is_some())
        .map(|row| row.event_id.as_str())
        .collect();
    assert_eq!(
        blamed,
        Vec::<&str>::new(),
        "seed {seed}: an outage was blamed on events"
    );
}
