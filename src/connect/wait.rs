//! Waiting for a server with a bound and an ear for signals.
//!
//! A connect can hang anywhere: on a name lookup, a TCP connect nobody
//! answers, a TLS handshake or a login a half-dead server never finishes.
//! Every such wait is bounded by --connect-timeout, and a run that is asked
//! to stop (SIGINT, SIGTERM) must not sit out the bound first: Kubernetes
//! would SIGKILL it. So the waits here look at the run's `Stop` flag every
//! SLICE and give up at once when a signal came. What is given up on is
//! left behind (a thread, a socket, a future dropped), and goes when the
//! process exits, which it is about to do: nothing was claimed or published
//! on a connection that never opened.

use std::future::Future;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

use crate::exit::{self, Exit};
use crate::guard::stop::Stop;

/// How often a wait looks at the stop flag: well within the second
/// docs/src/timeouts.md allows between a signal and the exit.
pub(crate) const SLICE: Duration = Duration::from_millis(100);

/// How a bounded wait ended.
#[derive(Debug)]
pub(crate) enum Waited<T> {
    Done(T),
    /// The bound passed first.
    TimedOut,
    /// A signal came first; the exit is its code.
    Stopped(Exit),
}

/// Runs blocking `work` (a name lookup, the postgres crate's connect) on a
/// thread of its own and waits for it at most `limit`, looking at `stop`
/// (if the command has one) every SLICE.
pub(crate) fn on_thread<T: Send + 'static>(
    name: &str,
    limit: Duration,
    stop: Option<&Stop>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<Waited<T>> {
    let deadline = Instant::now() + limit;
    let (sender, receiver) = mpsc::channel();
    thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // The receiver is gone only if we gave up waiting.
            let _ = sender.send(work());
        })
        .with_context(|| format!("starting the {name} thread"))?;
    loop {
        if let Some(exit) = stop.and_then(Stop::requested) {
            return Ok(Waited::Stopped(exit));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Waited::TimedOut);
        }
        match receiver.recv_timeout(SLICE.min(deadline - now)) {
            Ok(done) => return Ok(Waited::Done(done)),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(anyhow!("the {name} thread ended without an answer"));
            }
        }
    }
}

/// Awaits `future` at most `limit`, looking at `stop` every SLICE. Must
/// run inside a tokio runtime with its timer enabled.
pub(crate) async fn on_future<F: Future>(
    limit: Duration,
    stop: &Stop,
    future: F,
) -> Waited<F::Output> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut future = std::pin::pin!(future);
    loop {
        if let Some(exit) = stop.requested() {
            return Waited::Stopped(exit);
        }
        let slice = deadline.min(tokio::time::Instant::now() + SLICE);
        match tokio::time::timeout_at(slice, &mut future).await {
            Ok(done) => return Waited::Done(done),
            Err(_) if slice >= deadline => return Waited::TimedOut,
            Err(_) => {}
        }
    }
}

/// The error for a wait a signal ended: "stopped by SIGTERM while `what`".
pub(crate) fn stopped_while(exit: Exit, what: &str) -> anyhow::Error {
    let signal = match exit {
        Exit::Interrupted => "SIGINT",
        _ => "SIGTERM",
    };
    exit::stopped(exit, anyhow!("stopped by {signal} while {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_that_finishes_in_time_is_returned() {
        let waited = on_thread("test", Duration::from_secs(5), None, || 42).unwrap();
        assert!(matches!(waited, Waited::Done(42)), "{waited:?}");
    }

    #[test]
    fn work_that_hangs_times_out_at_the_limit() {
        let started = Instant::now();
        let limit = Duration::from_millis(250);
        let waited = on_thread("test", limit, None, || {
            thread::sleep(Duration::from_secs(30))
        });
        assert!(matches!(waited.unwrap(), Waited::TimedOut));
        let took = started.elapsed();
        assert!(took >= limit && took < Duration::from_secs(5), "{took:?}");
    }
}
