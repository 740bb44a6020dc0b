//! stdout is one writer's: a reader that went away ends the output quietly
//! (the run still ends as it would have, with its own exit code), and a
//! stdout that cannot be written is one clear line, never a panic.

use std::fs::File;
use std::io::pipe;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{Fixture, Run, assert_one_clear_line, wait_until};

/// Runs the binary with `stdout` as its standard output.
fn run_into(fx: &Fixture, args: &[&str], stdout: impl Into<Stdio>) -> Run {
    let output = fx
        .command()
        .args(args)
        .stdout(stdout)
        .output()
        .expect("running outbox-poll");
    Run::from(output)
}

/// A pipe whose reader is already gone: every write meets EPIPE.
fn closed_pipe() -> impl Into<Stdio> {
    let (reader, writer) = pipe().unwrap();
    drop(reader);
    writer
}

fn dev_full() -> File {
    File::options().write(true).open("/dev/full").unwrap()
}

#[test]
fn status_into_a_closed_pipe_ends_quietly_with_its_own_exit_code() {
    let mut fx = Fixture::new("status_closed_pipe");
    fx.insert("e", 3);
    fx.execute("UPDATE {table} SET attempts = 10 WHERE event_id = 'e-1'");
    let run = run_into(&fx, &["status", "--fail-if-dead"], closed_pipe());
    assert_eq!(
        run.code, 1,
        "the dead event still makes it 1: {}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("dead event"), "{}", run.stderr);
}

#[test]
fn dry_run_into_a_closed_pipe_ends_quietly_and_changes_nothing() {
    let mut fx = Fixture::new("dry_run_closed_pipe");
    fx.insert("e", 50);
    let run = run_into(&fx, &["--dry-run"], closed_pipe());
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert!(
        fx.rows()
            .iter()
            .all(|row| !row.published && row.attempts == 0)
    );
}

#[test]
fn a_json_summary_into_a_closed_pipe_keeps_the_runs_work_and_exit_code() {
    let mut fx = Fixture::new("json_closed_pipe");
    fx.insert("e", 3);
    let run = run_into(&fx, &["--json"], closed_pipe());
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(fx.published_count(), 3);
}

#[test]
fn a_json_summary_onto_a_full_disk_is_one_line_after_the_batch_committed() {
    let mut fx = Fixture::new("json_full_disk");
    fx.insert("e", 3);
    let run = run_into(&fx, &["--json"], dev_full());
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(
        run.stderr.contains("cannot write to stdout"),
        "{}",
        run.stderr
    );
    assert_eq!(fx.published_count(), 3, "the batch was committed first");
}

#[test]
fn status_onto_a_full_disk_is_one_line() {
    let fx = Fixture::new("status_full_disk");
    let run = run_into(&fx, &["status", "--json"], dev_full());
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
}

/// A dry run whose reader never reads blocks in a write, holding stdout;
/// the watchdog must still end the run, its summary or not.
#[test]
fn the_watchdog_ends_a_run_blocked_on_a_stdout_nobody_reads() {
    let mut fx = Fixture::new("stdout_unread");
    fx.insert("e", 2000); // ~500 kB of lines: far more than a pipe holds
    let (reader, writer) = pipe().unwrap();
    let since = Instant::now();
    let args = [
        "--dry-run",
        "--json",
        "--batch-size",
        "2000",
        "--connect-timeout",
        "1s",
        "--confirm-timeout",
        "1s",
    ];
    let mut child = fx
        .command()
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The batch's budget is 2 x connect + confirm + 30 s statement + 5 s.
    let exited = wait_until(Duration::from_secs(60), || {
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        child.kill().unwrap();
    }
    let run = Run::from(child.wait_with_output().unwrap());
    drop(reader);
    assert!(
        exited,
        "still running after {:?}: {}",
        since.elapsed(),
        run.stderr
    );
    assert_eq!(run.code, 69, "{}", run.stderr);
    assert!(
        run.stderr.contains("did not finish within"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

#[test]
fn a_closed_stderr_ends_quietly_with_the_runs_own_exit_code() {
    let mut fx = Fixture::new("stderr_closed_pipe");
    fx.insert("e", 3);
    fx.execute("UPDATE {table} SET attempts = 10 WHERE event_id = 'e-1'");
    // The threshold's line and an error's line both go to a closed stderr.
    let output = fx
        .command()
        .args(["status", "--fail-if-dead"])
        .stderr(closed_pipe())
        .output()
        .expect("running outbox-poll");
    assert_eq!(output.status.code(), Some(1), "the dead event makes it 1");
    let output = fx
        .command()
        .args(["--table", "no_such.outbox"])
        .stderr(closed_pipe())
        .output()
        .expect("running outbox-poll");
    assert_eq!(output.status.code(), Some(78));
}

#[test]
fn the_examples_peek_bind_says_what_it_declared() {
    let fx = Fixture::bare("peek_bind");
    let (exchange, queue) = (
        format!("{}_peek", fx.exchange),
        format!("{}_peek", fx.queue),
    );
    // cargo test builds the examples beside the binary.
    let peek = std::path::Path::new(crate::common::BIN)
        .with_file_name("examples")
        .join("peek");
    let output = std::process::Command::new(&peek)
        .args(["bind", &exchange, &queue])
        .env("AMQP_URL", crate::common::amqp_url())
        .output()
        .expect("running examples/peek (cargo test builds it; else cargo build --examples)");
    fx.amqp.delete_queue(&queue);
    fx.amqp.delete_exchange(&exchange);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!(
            "exchange {exchange} (topic, durable) and queue {queue} (durable) declared; \
             {queue} is bound to every routing key (#)\n"
        )
    );
}
