//! The cost of traces: a drain of BENCH_TRACES_EVENTS (50,000) events with
//! no OTLP endpoint against the same drain exporting a span per event to a
//! local collector (a sink that reads each request and answers 200), and
//! the same drain with OTEL_PROPAGATORS=none (the spans, but no traceparent
//! header written into the messages); then the empty run with and without
//! an endpoint, BENCH_EMPTY_RUNS of each. Every trio is interleaved,
//! BENCH_TRACES_ROUNDS (2) drains of each, so a machine getting busier
//! weighs on all alike; the worse round is the figure. Goals: the spans'
//! drain at >= 0.9x the drain without, the empty run at most 1.3x. A
//! header on every message costs the broker itself about a seventh more
//! CPU per message (bench/README.md "Traces"), so the drain that writes
//! one is reported beside the goal's. Also how many spans the sink
//! received, against the events + batches + 1 a run exports.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Instant;

use crate::common::{Fixture, binary, check, env_or, load_average, median};

/// A collector that takes every request and keeps only their sizes.
struct Sink {
    endpoint: String,
    requests: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

impl Sink {
    fn start() -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let (counted, sized) = (requests.clone(), bytes.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (counted, sized) = (counted.clone(), sized.clone());
                thread::spawn(move || {
                    let mut writer = stream.try_clone().unwrap();
                    let mut reader = BufReader::new(stream);
                    loop {
                        let mut length = 0usize;
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        loop {
                            line.clear();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            let header = line.trim_end().to_ascii_lowercase();
                            if header.is_empty() {
                                break;
                            }
                            if let Some(value) = header.strip_prefix("content-length:") {
                                length = value.trim().parse().unwrap_or(0);
                            }
                        }
                        let mut body = vec![0; length];
                        if reader.read_exact(&mut body).is_err() {
                            return;
                        }
                        counted.fetch_add(1, Ordering::Relaxed);
                        sized.fetch_add(length as u64, Ordering::Relaxed);
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if writer.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Sink {
            endpoint,
            requests,
            bytes,
        }
    }
}

/// The section's lines.
pub fn compare(fx: &mut Fixture) -> Vec<String> {
    let events: i64 = env_or("BENCH_TRACES_EVENTS", "50000").parse().unwrap();
    let rounds: usize = env_or("BENCH_TRACES_ROUNDS", "2").parse().unwrap();
    let sink = Sink::start();
    let exporting = vec![(
        "OTEL_EXPORTER_OTLP_ENDPOINT".to_string(),
        sink.endpoint.clone(),
    )];
    let args = ["--drain", "--batch-size", "1000", "--json"];
    let mut lines = vec![format!(
        "traces: drain of {events} events, --batch-size 1000, without an endpoint, \
         exporting to a local collector, and exporting with OTEL_PROPAGATORS=none, \
         {rounds} rounds interleaved:"
    )];
    // Worse rounds of (injecting / no endpoint, not injecting / no endpoint).
    let mut worst = (f64::INFINITY, f64::INFINITY);
    let mut quiet = exporting.clone();
    quiet.push(("OTEL_PROPAGATORS".to_string(), "none".to_string()));
    for round in 1..=rounds {
        let mut rates = Vec::new();
        for (label, env) in [
            ("no endpoint", Vec::new()),
            ("collector", exporting.clone()),
            ("collector, OTEL_PROPAGATORS=none", quiet.clone()),
        ] {
            fx.fill(events, 200);
            fx.env = env;
            let before = sink.requests.load(Ordering::Relaxed);
            let figure = fx.measure(&binary(), format!("traces {label}"), events, 1, &args);
            let requests = sink.requests.load(Ordering::Relaxed) - before;
            lines.push(format!(
                "  round {round}, {label:<32}: {:>8.0} events/s ({:.2} s, load {:.2}){}",
                figure.rate(),
                figure.seconds,
                figure.load,
                match requests {
                    0 => String::new(),
                    n => format!(", {n} export requests"),
                }
            ));
            rates.push(figure.rate());
        }
        fx.env.clear();
        let (injecting, not) = (rates[1] / rates[0], rates[2] / rates[0]);
        worst = (worst.0.min(injecting), worst.1.min(not));
        lines.push(format!(
            "  round {round}: collector / no endpoint {injecting:.2}x, \
             without the traceparent header {not:.2}x"
        ));
    }
    lines.push(format!(
        "  drain, worse round: the spans alone (OTEL_PROPAGATORS=none) {:.2}x (goal: >= 0.9x); \
         spans and a traceparent header on every message {:.2}x (the header costs the broker \
         CPU of its own); {:.1} MB of OTLP received in all",
        worst.1,
        worst.0,
        sink.bytes.load(Ordering::Relaxed) as f64 / 1e6
    ));
    fx.fill(0, 200);
    let runs = fx.settings.empty_runs;
    let (mut off, mut on) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        off.push(empty_run(fx, &[]));
        on.push(empty_run(fx, &exporting));
    }
    let (off, on) = (median(off), median(on));
    lines.push(format!(
        "  empty run, {runs} of each interleaved (load {:.2}): no endpoint median {off:.1} ms, \
         collector {on:.1} ms, {:.2}x (goal: <= 1.3x)",
        load_average(),
        on / off
    ));
    lines
}

/// One empty run, in milliseconds.
fn empty_run(fx: &mut Fixture, env: &[(String, String)]) -> f64 {
    fx.env = env.to_vec();
    let started = Instant::now();
    let status = fx
        .command()
        .stdout(Stdio::null())
        .status()
        .expect("running outbox-poll");
    let millis = started.elapsed().as_secs_f64() * 1000.0;
    fx.env.clear();
    check(!status.success(), "the empty run failed");
    millis
}
