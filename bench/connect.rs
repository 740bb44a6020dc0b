//! The cost of TLS to PostgreSQL: the empty run (start, connect, claim
//! nothing, exit) with the default sslmode=prefer, which makes a TLS
//! session with a server that has `ssl = on`, against the same run with
//! sslmode=disable, in the same bench run. The two are interleaved, so a
//! machine getting busier weighs on both alike. Goal: prefer within 1.5x
//! of disable (median).
//!
//! The mode is given as PGSSLMODE, which BENCH_DATABASE_URL must not
//! override with an sslmode of its own.

use std::process::Stdio;
use std::time::Instant;

use crate::common::{Fixture, check, load_average};

/// Median, p90 and fastest of one mode's runs, in milliseconds.
pub struct Times {
    pub median: f64,
    pub p90: f64,
    pub min: f64,
}

/// Both modes' figures, `runs` of each, as the lines of their section.
pub fn empty_runs(fx: &mut Fixture) -> Vec<String> {
    fx.fill(0, 200);
    let runs = fx.settings.empty_runs;
    let mut prefer = Vec::with_capacity(runs);
    let mut disable = Vec::with_capacity(runs);
    for _ in 0..runs {
        prefer.push(one_run(fx, "prefer"));
        disable.push(one_run(fx, "disable"));
    }
    lines(runs, &times(prefer), &times(disable))
}

/// One empty run with `sslmode`, in milliseconds.
fn one_run(fx: &Fixture, sslmode: &str) -> f64 {
    let started = Instant::now();
    let status = fx
        .command()
        .env("PGSSLMODE", sslmode)
        .stdout(Stdio::null())
        .status()
        .expect("running outbox-poll");
    let millis = started.elapsed().as_secs_f64() * 1000.0;
    check(
        !status.success(),
        &format!("the empty run with sslmode={sslmode} failed"),
    );
    millis
}

fn times(mut millis: Vec<f64>) -> Times {
    millis.sort_by(f64::total_cmp);
    let at = |q: f64| millis[((millis.len() as f64 - 1.0) * q).round() as usize];
    Times {
        median: at(0.5),
        p90: at(0.9),
        min: millis[0],
    }
}

fn lines(runs: usize, prefer: &Times, disable: &Times) -> Vec<String> {
    let mut lines = vec![format!(
        "empty run by sslmode, {runs} runs each, interleaved (load {:.2}):",
        load_average()
    )];
    for (mode, times) in [("prefer (TLS)", prefer), ("disable", disable)] {
        lines.push(format!(
            "  sslmode={mode:<13} median {:.1} ms, p90 {:.1} ms, min {:.1} ms",
            times.median, times.p90, times.min
        ));
    }
    lines.push(format!(
        "  prefer / disable: median {:.2}x, p90 {:.2}x (goal: median <= 1.5x)",
        prefer.median / disable.median,
        prefer.p90 / disable.p90
    ));
    lines
}
