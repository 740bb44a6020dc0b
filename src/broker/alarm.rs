//! A broker that blocks its publishers: RabbitMQ under a resource alarm
//! (memory, disk) stops reading from every connection that publishes and
//! says so with connection.blocked and a reason ("low on memory"). lapin
//! then writes nothing more, so the publishes still queued and every
//! confirm would wait out --confirm-timeout, and a drain would wait it out
//! once for each batch in flight. Instead the run ends at once as an
//! outage (exit 69) naming the broker's reason: what was confirmed before
//! is marked, the rest is left as it was, no attempt counted.
//!
//! lapin reports connection.blocked as an event, sent only to listeners
//! that exist when it comes, so the listener is taken as soon as the
//! connection is open, and a task on the publisher's runtime keeps the
//! reason. The waits of a round look at it between slices of SLICE.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_core::Stream;
use lapin::{Connection, Event};
use tokio::runtime::Runtime;
use tokio::time::{Instant, timeout_at};

/// How often a wait looks at the alarm: a blocked broker ends the batch
/// within this, not after --confirm-timeout.
const SLICE: Duration = Duration::from_millis(50);

/// The broker's reason for blocking us, once it has.
#[derive(Clone, Default)]
pub(crate) struct Alarm(Arc<Mutex<Option<String>>>);

/// Why a wait ended without its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cutoff {
    Deadline,
    Blocked,
}

impl Alarm {
    /// Listens to `connection`'s events on `runtime` from now on. The
    /// reason stays once given: a run the broker blocked ends, even if the
    /// alarm clears meanwhile.
    pub(crate) fn watch(connection: &Connection, runtime: &Runtime) -> Alarm {
        let alarm = Alarm::default();
        let reason = Arc::clone(&alarm.0);
        let events = connection.events_listener();
        runtime.spawn(async move {
            let mut events = pin!(events);
            while let Some(event) = std::future::poll_fn(|cx| events.as_mut().poll_next(cx)).await {
                if let Event::ConnectionBlocked(why) = event
                    && let Ok(mut reason) = reason.lock()
                {
                    reason.get_or_insert(why);
                }
            }
        });
        alarm
    }

    /// The broker's reason, if it blocked the connection.
    pub(crate) fn reason(&self) -> Option<String> {
        self.0.lock().ok().and_then(|reason| reason.clone())
    }

    /// Awaits `future` until `deadline`, or until the broker blocks the
    /// connection, whichever comes first.
    pub(crate) async fn until<F: Future>(
        &self,
        deadline: Instant,
        future: F,
    ) -> Result<F::Output, Cutoff> {
        let mut future = pin!(future);
        loop {
            if self.reason().is_some() {
                return Err(Cutoff::Blocked);
            }
            let slice = deadline.min(Instant::now() + SLICE);
            match timeout_at(slice, &mut future).await {
                Ok(output) => return Ok(output),
                Err(_) if slice >= deadline => return Err(Cutoff::Deadline),
                Err(_) => {}
            }
        }
    }
}
