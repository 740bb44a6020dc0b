//! --follow: a drain that does not end when the backlog is gone. It runs
//! rounds of batches as a drain does (each round ends with a claim that
//! found nothing, so after each batch it claims again before it waits),
//! and between rounds it waits for new events until --max-duration or a
//! signal.
//!
//! While it waits it holds one PostgreSQL session, idle and outside any
//! transaction (no xmin held back, no row locks), LISTENing on the table's
//! channel; once it has been quiet for LINGER it holds nothing else: no
//! broker connection, none of the sessions a backlog opened.
//!
//! With the table's notify trigger (`migrate --notify`), a producer's
//! commit wakes it at once; a notification sent while a batch was in hand
//! waits in the session and ends the next wait at once. It still claims
//! every SAFETY_POLL, for what no insert announces (a backoff that ran
//! out, a requeue, rows a killed run gave back). Without the trigger it
//! polls: it looks for a due event with one cheap statement after a
//! quarter of the time it has been quiet, every FASTEST_POLL while events
//! keep coming, every LINGERING_LOOK at most while it lingers (quiet for
//! less than LINGER since its last batch or its start), every SLOWEST_LOOK
//! at most after,
//! and claims when it sees one. So the first event of a stream that
//! resumes after a pause waits LINGERING_LOOK at most, and one that starts
//! after a long quiet SLOWEST_LOOK at most: never a quiet interval.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use postgres::Client;
use postgres::fallible_iterator::FallibleIterator;

use crate::connect::database::STATEMENT_TIMEOUT;
use crate::connect::pg_error::classify;
use crate::exit;
use crate::guard::watchdog::MARGIN;
use crate::relay::CLOSE_BUDGET;
use crate::relay::drain::Drain;
use crate::relay::session::Session;
use crate::sql::notify;

/// The longest one wait lasts before the run looks at the signals and
/// --max-duration again: a signal ends a follow within a second.
const SLICE: Duration = Duration::from_millis(250);
/// With the notify trigger: how often a quiet follow claims all the same.
/// Retries and requeues are never due to the millisecond.
const SAFETY_POLL: Duration = Duration::from_secs(1);
/// Without it: a follow looks for a due event after a quarter of the time
/// it has been quiet, between these bounds. A look is one statement, a
/// third of the round trips of a claim that finds nothing. The bound was
/// once 250 ms, on claims: the first events of a stream that began after a
/// quiet second waited up to that long, and at 1,000 events/s so many of
/// them did that they made the run's p99. Within LINGER of its last batch
/// (or of its start) the follow expects more events, and after a batch
/// still holds the broker connection for them: it looks every
/// LINGERING_LOOK at most then, so a stream that pauses for a second or
/// two resumes within 25 ms (at most 80 looks per pause). Past LINGER it
/// looks every SLOWEST_LOOK: lower costs more than next to no CPU (at
/// 25 ms an idle follow and its backend each used about 1% of a core; see
/// docs/src/following.md), and the first event after a long quiet pays
/// the broker's reconnect anyway. FASTEST_POLL was 10 ms: at 1,000
/// events/s a batch cycle takes about 2 ms (claim 0.25, RabbitMQ's confirm
/// 0.7, marks and COMMIT 0.9, seen with strace), so about one claim in
/// eight after a batch finds nothing, and the events behind that empty
/// claim waited a whole FASTEST_POLL: p99 8.8-10.5 ms. At 5 ms it was
/// 5.6 ms in two runs; the cost is a look every 5 ms for the first 20 ms
/// of a pause, nothing once the follow is quiet.
const QUIET_SHARE: u32 = 4;
const FASTEST_POLL: Duration = Duration::from_millis(5);
const LINGERING_LOOK: Duration = Duration::from_millis(25);
const SLOWEST_LOOK: Duration = Duration::from_millis(100);
/// A look also sees what no claim takes now: rows another run holds, and
/// events an ordered claim holds back behind an earlier one. Once a claim
/// after a look took nothing, the follow claims without looking, after a
/// quarter of its quiet up to SLOWEST_POLL, until a claim takes events.
const SLOWEST_POLL: Duration = Duration::from_millis(250);
/// How long after its last batch a follow keeps the broker connection and
/// the extra sessions a backlog opened. Events less than this apart reuse
/// them rather than paying a reconnect each (RabbitMQ's handshake, the
/// exchange check and a channel; a PostgreSQL backend and its prepared
/// statements); a quiet follow holds them no longer than this.
const LINGER: Duration = Duration::from_secs(2);

impl Drain<'_> {
    /// Rounds of batches until --max-duration, --max-batches, a signal or
    /// a failure. `sessions` holds the run's first session, which listens.
    pub(crate) fn follow(&mut self, sessions: &mut Vec<Session>) -> Result<()> {
        let budget = 2 * STATEMENT_TIMEOUT + MARGIN;
        self.watchdog
            .arm(budget, "listening for new events", *self.totals);
        let listening = notify::listen(&mut sessions[0].client, &self.database.table)?;
        match listening.notified {
            true => log::info!("following: woken by the table's notify trigger"),
            false => log::info!(
                "following by polling: the table has no notify trigger (`outbox-poll migrate \
                 --notify` installs it; see README, Low latency)"
            ),
        }
        let mut busy_at = Instant::now();
        // Polling: a claim after a look that saw due events took nothing.
        let mut held = false;
        // A follow claims at once when it starts.
        let (mut claim, mut looked) = (true, false);
        loop {
            if claim {
                let claimed = self.totals.claimed;
                self.run(sessions)?;
                match self.totals.claimed > claimed {
                    true => (busy_at, held) = (Instant::now(), false),
                    false => held |= looked,
                }
                if !self.within_limits(self.totals.batches) {
                    return Ok(());
                }
            }
            let quiet = busy_at.elapsed();
            let (poll, next) = next_poll(listening.notified, held, quiet);
            log::trace!(
                "looking at the table again in {} ms, quiet for {} ms",
                poll.as_millis(),
                quiet.as_millis()
            );
            let woken = self.wait(sessions, Instant::now() + poll, busy_at)?;
            // The wait also ends at --max-duration or a signal: no new
            // round then (a run's first batch opens whatever the limits,
            // and a follow may not have opened one yet).
            if !self.within_limits(self.totals.batches) {
                return Ok(());
            }
            looked = !woken && next == Next::Look;
            claim = !looked || self.look(sessions)?;
        }
    }

    /// Whether an event is due, asked on the session that listens.
    fn look(&mut self, sessions: &mut [Session]) -> Result<bool> {
        self.watchdog.arm(
            STATEMENT_TIMEOUT + MARGIN,
            "looking for new events",
            *self.totals,
        );
        sessions[0].any_due()
    }

    /// Waits, in slices of at most SLICE, until a notification, `poll_at`,
    /// --max-duration or a signal; lets go of the broker and the extra
    /// sessions LINGER after `busy_at`, the end of the last batch. True if
    /// a notification ended it.
    fn wait(
        &mut self,
        sessions: &mut Vec<Session>,
        poll_at: Instant,
        busy_at: Instant,
    ) -> Result<bool> {
        let end = self.relay.max_duration.map(|max| self.started + max);
        loop {
            let now = Instant::now();
            let holding = self.broker.is_connected() || sessions.len() > 1;
            if holding && now >= busy_at + LINGER {
                self.let_go(sessions);
                continue;
            }
            if now >= poll_at || !self.within_limits(self.totals.batches) {
                return Ok(false);
            }
            let mut until = poll_at.min(now + SLICE);
            if holding {
                until = until.min(busy_at + LINGER);
            }
            if let Some(end) = end {
                until = until.min(end);
            }
            self.watchdog
                .arm(SLICE + MARGIN, "waiting for new events", *self.totals);
            if notified(&mut sessions[0].client, until - now)? {
                return Ok(true);
            }
        }
    }

    /// What a quiet follow does not need: the broker connection, and every
    /// session but the one that listens.
    fn let_go(&mut self, sessions: &mut Vec<Session>) {
        log::debug!(
            "quiet for {}: closing the broker connection and {} other sessions",
            humantime::format_duration(LINGER),
            sessions.len() - 1
        );
        self.watchdog
            .arm(CLOSE_BUDGET, "closing idle connections", *self.totals);
        self.broker.disconnect();
        sessions.truncate(1);
    }
}

/// What a follow does when its wait ends without a notification.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    Claim,
    /// Look for a due event first, and claim if there is one.
    Look,
}

/// How long to wait for a notification, and what to do if none comes,
/// after being `quiet` since the last claim that found events; `held`: a
/// claim after a look that saw due events took nothing since.
fn next_poll(notified: bool, held: bool, quiet: Duration) -> (Duration, Next) {
    let after = |slowest| (quiet / QUIET_SHARE).clamp(FASTEST_POLL, slowest);
    let slowest_look = if quiet < LINGER {
        LINGERING_LOOK
    } else {
        SLOWEST_LOOK
    };
    match (notified, held) {
        (true, _) => (SAFETY_POLL, Next::Claim),
        (false, false) => (after(slowest_look), Next::Look),
        (false, true) => (after(SLOWEST_POLL), Next::Claim),
    }
}

/// Waits at most `limit` for a notification on the session; true if one
/// came. It then takes every other one already there too: one claim
/// answers them all, since each was sent by a commit that came before it.
fn notified(client: &mut Client, limit: Duration) -> Result<bool> {
    let advice = "the events committed meanwhile are sent by the next run";
    let lost = |error: postgres::Error| classify(&error, "waiting for new events", advice);
    {
        let mut notifications = client.notifications();
        if notifications
            .timeout_iter(limit)
            .next()
            .map_err(lost)?
            .is_some()
        {
            while notifications.iter().next().map_err(lost)?.is_some() {}
            return Ok(true);
        }
    }
    // The driver also ends the wait early, with nothing, when the server
    // has gone.
    if client.is_closed() {
        return Err(exit::outage(anyhow!(
            "waiting for new events: the connection to PostgreSQL was lost; {advice}"
        )));
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_looks_after_a_quarter_of_the_quiet_between_5_and_25_ms_while_it_lingers() {
        let looks: Vec<(u128, Next)> = [0, 20, 60, 200, 1000, 1999]
            .into_iter()
            .map(|quiet| next_poll(false, false, Duration::from_millis(quiet)))
            .map(|(poll, next)| (poll.as_millis(), next))
            .collect();
        let at = |ms| (ms, Next::Look);
        assert_eq!(looks, [at(5), at(5), at(15), at(25), at(25), at(25)]);
    }

    #[test]
    fn polling_looks_every_100_ms_once_it_has_let_go_of_the_broker() {
        for quiet in [LINGER, Duration::from_secs(60)] {
            assert_eq!(
                next_poll(false, false, quiet),
                (SLOWEST_LOOK, Next::Look),
                "{quiet:?}"
            );
        }
    }

    #[test]
    fn polling_claims_up_to_every_250_ms_without_looking_while_what_it_sees_is_held() {
        let claims: Vec<(u128, Next)> = [0, 100, 400, 1000, 60_000]
            .into_iter()
            .map(|quiet| next_poll(false, true, Duration::from_millis(quiet)))
            .map(|(poll, next)| (poll.as_millis(), next))
            .collect();
        let at = |ms| (ms, Next::Claim);
        assert_eq!(claims, [at(5), at(25), at(100), at(250), at(250)]);
    }

    #[test]
    fn with_the_trigger_a_follow_claims_once_a_second_all_the_same() {
        for (quiet, held) in [(Duration::ZERO, false), (Duration::from_secs(60), true)] {
            assert_eq!(next_poll(true, held, quiet), (SAFETY_POLL, Next::Claim));
        }
    }
}
