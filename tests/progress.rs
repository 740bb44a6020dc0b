//! The progress bar of a --drain: drawn on a terminal once the drain has
//! run longer than a second, never when stderr is a pipe (cron, CI).

use std::process::Command;

use crate::common::{Fixture, Run};

/// Runs the binary with stdout and stderr on a pseudo-terminal, through
/// util-linux's `script`; None when `script` is not installed.
fn run_on_a_terminal(fx: &Fixture, args: &[&str]) -> Option<(i32, String)> {
    let inner = fx.command();
    let mut line = crate::common::BIN.to_string();
    for arg in args {
        line.push(' ');
        line.push_str(arg);
    }
    let mut command = Command::new("script");
    command.args(["-qec", &line, "/dev/null"]);
    for (name, value) in inner.get_envs() {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    // A dumb terminal (or none named, as under CI) gets no bar: it cannot
    // redraw a line. The terminal `script` gives us can.
    command.env("TERM", "xterm");
    let output = command.output().ok()?;
    Some((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    ))
}

/// One event per batch: 1,500 batches last well over a second.
const SLOW_DRAIN: [&str; 4] = ["--drain", "--batch-size", "1", "--json"];

#[test]
fn long_drain_with_stderr_on_a_pipe_draws_nothing() {
    let mut fx = Fixture::new("progress_pipe");
    fx.insert("e", 1500);
    let run: Run = fx.run(&SLOW_DRAIN);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.field("duration_ms") > 1000,
        "the drain must outlast the grace second for this test to mean anything"
    );
    assert_eq!(run.field("published"), 1500);
    assert_eq!(run.stderr, "", "no progress output without a terminal");
}

#[test]
fn long_drain_on_a_terminal_shows_published_rate_and_remaining() {
    let mut fx = Fixture::new("progress_tty");
    fx.insert("e", 1500);
    let Some((code, screen)) = run_on_a_terminal(&fx, &SLOW_DRAIN) else {
        eprintln!("skipped: no `script` to give the run a terminal");
        return;
    };
    assert_eq!(code, 0, "{screen}");
    assert!(
        screen.contains("1500/1500 published 1500, failed 0, "),
        "the final figures stay on screen: {screen:?}"
    );
    assert!(screen.contains("/s, 0 remaining"), "{screen:?}");
    assert_eq!(fx.published_count(), 1500);
}

#[test]
fn short_drain_on_a_terminal_draws_nothing() {
    let mut fx = Fixture::new("progress_short");
    fx.insert("e", 3);
    let Some((code, screen)) = run_on_a_terminal(&fx, &["--drain"]) else {
        eprintln!("skipped: no `script` to give the run a terminal");
        return;
    };
    assert_eq!((code, screen.as_str()), (0, ""));
}
