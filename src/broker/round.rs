//! One pipelined round: every publish of a list of events sent before any
//! confirm is awaited, then every confirm awaited and matched to its event.
//! The two halves are apart so that a drain can claim its next batch while
//! this one's confirms are on their way. `Publisher` runs rounds and
//! decides what a failed one means.

use std::collections::HashSet;
use std::task::Poll;

use anyhow::anyhow;
use lapin::message::BasicReturnMessage;
use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation, PublisherConfirm};
use tokio::time::Instant;

use crate::broker::alarm::{Alarm, Cutoff};
use crate::broker::message::{Outgoing, outgoing};
use crate::sql::outbox::Event;

/// What a nack records in last_error: the broker declined the message for
/// now, which is no failure of the event's own.
pub(crate) const NACKED: &str = "nacked by the broker (not counted as an attempt): the queue declined \
     the message for now (a queue full with x-overflow=reject-publish, a quorum queue without \
     a majority); it is retried after a backoff";

/// Where a round publishes: the run's --exchange, unless the row's
/// exchange column names another, and the rows' exchanges this run has
/// already found missing, whose events fail without being sent: each
/// publish to a missing exchange costs a channel (the broker closes it)
/// and a round to find the event out.
#[derive(Clone, Copy)]
pub(crate) struct Exchanges<'a> {
    pub(crate) default: &'a str,
    pub(crate) missing: &'a HashSet<String>,
}

/// What last_error says of an event whose own exchange does not exist.
pub(crate) fn missing_exchange(exchange: &str) -> String {
    format!(
        "exchange {exchange:?} (the row's exchange column) does not exist on the broker: \
         create it or correct the row; the event is retried after a backoff"
    )
}

/// The result of one pipelined round.
#[derive(Default)]
pub(crate) struct Round {
    pub(crate) confirmed: Vec<i64>,
    /// The event's own failures (unroutable, or not sendable at all): count
    /// an attempt.
    pub(crate) failed: Vec<(i64, String)>,
    /// Row ids the broker nacked: back off, count no attempt.
    pub(crate) declined: Vec<i64>,
    /// Row ids with no answer from the broker.
    pub(crate) unresolved: HashSet<i64>,
    pub(crate) error: Option<anyhow::Error>,
    pub(crate) timed_out: bool,
    /// The broker blocked the connection (a resource alarm): the round
    /// stopped waiting at once (see `alarm`).
    pub(crate) blocked: bool,
}

impl Round {
    /// Keeps the first error of the round, except that the broker's own
    /// word (an AMQP reply code) replaces one that is not: when the broker
    /// closes the channel, a publish issued after the close fails as "the
    /// channel is closed" before the confirms pending on it fail with the
    /// close's reply code, and the reply code is what says whose fault the
    /// close was.
    fn note(&mut self, error: anyhow::Error) {
        let brokers = |error: &anyhow::Error| {
            error
                .downcast_ref::<lapin::Error>()
                .is_some_and(lapin::Error::is_amqp_error)
        };
        match &self.error {
            Some(kept) if brokers(kept) || !brokers(&error) => {}
            _ => self.error = Some(error),
        }
    }
}

/// Publishes in flight at once: enough to keep the socket full, few enough
/// that a large batch does not hold thousands of publish futures and their
/// frames in memory at once.
const PUBLISH_WINDOW: usize = 1000;

/// A round whose publishes are on the wire and whose confirms are not yet
/// awaited: what `await_round` needs to finish it.
pub(crate) struct Issued {
    /// Each sent event's position in the round, with its confirm.
    pending: Vec<(usize, PublisherConfirm)>,
    /// What is already known: events that could not be sent, and the
    /// publish error that stopped the round, if one did.
    round: Round,
}

/// Both halves at once, for the rounds that retry part of a batch.
pub(crate) async fn publish_round(
    channel: &Channel,
    exchanges: Exchanges<'_>,
    events: &[&Event],
    deadline: Instant,
    frame_max: u32,
    alarm: &Alarm,
) -> Round {
    let issued = issue_round(channel, exchanges, events, deadline, frame_max, alarm).await;
    await_round(issued, events, deadline, alarm).await
}

/// Issues the round's publishes a window at a time, every publish of a
/// window before waiting for any of them, so the round goes out as one
/// stream instead of one io-thread hand-off per message. After the first
/// publish that fails (or times out), that event and every later one are
/// unresolved (left as they were), and nothing after it is sent, exactly as
/// when they went one by one. An event that cannot be a message (see
/// `message::outgoing`; `frame_max` is the connection's), or whose own
/// exchange this run found missing, is not sent and fails.
pub(crate) async fn issue_round(
    channel: &Channel,
    exchanges: Exchanges<'_>,
    events: &[&Event],
    deadline: Instant,
    frame_max: u32,
    alarm: &Alarm,
) -> Issued {
    let mut round = Round::default();
    let mut unsendable = Vec::new();
    let mut sendable = Vec::with_capacity(events.len());
    for (position, &event) in events.iter().enumerate() {
        match outgoing(event, frame_max) {
            Ok(message) => match &message.exchange {
                Some(name) if exchanges.missing.contains(name.as_str()) => {
                    unsendable.push((position, missing_exchange(name.as_str())));
                }
                _ => sendable.push((position, event, message)),
            },
            Err(reason) => unsendable.push((position, reason)),
        }
    }
    let mut pending = Vec::with_capacity(sendable.len());
    let mut stopped_at = events.len();
    let mut rest = sendable.into_iter().peekable();
    'windows: while rest.peek().is_some() {
        let window: Vec<_> = rest.by_ref().take(PUBLISH_WINDOW).collect();
        let sent: Vec<usize> = window.iter().map(|(position, _, _)| *position).collect();
        let results = match alarm
            .until(deadline, issue(channel, exchanges.default, window))
            .await
        {
            Ok(results) => results,
            Err(cutoff) => {
                cut_off(&mut round, cutoff, "publishing");
                stopped_at = sent[0];
                break;
            }
        };
        for (position, result) in sent.into_iter().zip(results) {
            match result {
                Ok(confirm) => pending.push((position, confirm)),
                Err(error) => {
                    round.note(error.into());
                    stopped_at = position;
                    break 'windows;
                }
            }
        }
    }
    account(&mut round, events, unsendable, stopped_at);
    Issued { pending, round }
}

/// The bookkeeping of a round that stopped sending at `stopped_at` (the
/// round's length if nothing stopped it): the events that cannot be sent
/// before that point fail, and every event from it on, sendable or not, is
/// unresolved: nothing after a failed publish may count as answered.
fn account(
    round: &mut Round,
    events: &[&Event],
    unsendable: Vec<(usize, String)>,
    stopped_at: usize,
) {
    round
        .unresolved
        .extend(events[stopped_at..].iter().map(|event| event.id));
    for (position, reason) in unsendable {
        if position < stopped_at {
            round.failed.push((events[position].id, reason));
        }
    }
}

/// Awaits the confirms of an issued round; `events` must be the ones it was
/// issued with.
pub(crate) async fn await_round(
    issued: Issued,
    events: &[&Event],
    deadline: Instant,
    alarm: &Alarm,
) -> Round {
    let Issued { pending, mut round } = issued;
    await_confirms(pending, events, deadline, alarm, &mut round).await;
    round
}

/// Records why the round stopped waiting while `what` (see `Round::note`
/// for which error the round reports).
fn cut_off(round: &mut Round, cutoff: Cutoff, what: &str) {
    let error = match cutoff {
        Cutoff::Deadline => {
            round.timed_out = true;
            anyhow!("{what} timed out")
        }
        Cutoff::Blocked => {
            round.blocked = true;
            anyhow!("the broker blocked the connection while {what}")
        }
    };
    round.note(error);
}

/// Creates a window's publish futures and drives them together, returning
/// each one's result in order. lapin does all of a publish's work (taking
/// the confirm's delivery tag, queueing its frames for the io thread) in
/// the first poll of its future, so polling them first in order gives
/// delivery tags and wire order in event order.
async fn issue(
    channel: &Channel,
    default: &str,
    window: Vec<(usize, &Event, Outgoing)>,
) -> Vec<lapin::Result<PublisherConfirm>> {
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    let mut publishes: Vec<_> = window
        .into_iter()
        .map(
            |(
                _,
                event,
                Outgoing {
                    exchange,
                    routing_key,
                    properties,
                },
            )| {
                Box::pin(channel.basic_publish(
                    exchange.unwrap_or_else(|| default.into()),
                    routing_key,
                    options,
                    &event.payload,
                    properties,
                ))
            },
        )
        .collect();
    let mut results: Vec<Option<lapin::Result<PublisherConfirm>>> = std::iter::repeat_with(|| None)
        .take(publishes.len())
        .collect();
    // Every future is polled once, in order; after that, since the io
    // thread writes (and so completes) them in order, a wake-up resumes at
    // the first one still pending instead of re-polling the whole window.
    let mut first_pass = true;
    let mut next = 0;
    std::future::poll_fn(|cx| {
        for index in next..publishes.len() {
            if results[index].is_some() {
                continue;
            }
            match publishes[index].as_mut().poll(cx) {
                Poll::Ready(result) => results[index] = Some(result),
                Poll::Pending if first_pass => {}
                Poll::Pending => break,
            }
        }
        first_pass = false;
        while results.get(next).is_some_and(Option::is_some) {
            next += 1;
        }
        if next == results.len() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    results.into_iter().flatten().collect()
}

/// Awaits each confirm in turn. Returns (unroutable messages) come attached
/// to whichever confirm completes next, not to their own, so they are
/// collected first and matched to events by message_id afterwards; only
/// their ids and reasons are kept, not their bodies.
async fn await_confirms(
    pending: Vec<(usize, PublisherConfirm)>,
    events: &[&Event],
    deadline: Instant,
    alarm: &Alarm,
    round: &mut Round,
) {
    let mut acked = Vec::new();
    let mut returned = Vec::new();
    for (position, confirm) in pending {
        let event = events[position];
        if round.timed_out || round.blocked {
            round.unresolved.insert(event.id);
            continue;
        }
        match alarm.until(deadline, confirm).await {
            Ok(Ok(Confirmation::Ack(message))) => {
                acked.push(event);
                returned.extend(message.and_then(unroutable));
            }
            Ok(Ok(Confirmation::Nack(message))) => {
                round.declined.push(event.id);
                returned.extend(message.and_then(unroutable));
            }
            Ok(Ok(Confirmation::NotRequested)) => {
                round.unresolved.insert(event.id);
                round.note(anyhow!("the channel is not in confirm mode"));
            }
            Ok(Err(error)) => {
                round.unresolved.insert(event.id);
                round.note(error.into());
            }
            Err(cutoff) => {
                round.unresolved.insert(event.id);
                cut_off(round, cutoff, "awaiting confirms");
            }
        }
    }
    for event in acked {
        match returned.iter().find(|(id, _)| *id == event.event_id) {
            Some((_, reason)) => round.failed.push((event.id, reason.clone())),
            None => round.confirmed.push(event.id),
        }
    }
}

/// The message_id of a message the broker returned, with why, for the
/// acked event it names: that event failed, it was not published.
fn unroutable(message: BasicReturnMessage) -> Option<(String, String)> {
    let delivery = &message.delivery;
    let id = delivery.properties.message_id().as_ref()?;
    let reason = format!(
        "returned unroutable by the broker: {} {} (no queue is bound for routing key {:?} on exchange {:?})",
        message.reply_code,
        message.reply_text,
        delivery.routing_key.as_str(),
        delivery.exchange.as_str()
    );
    Some((id.to_string(), reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: i64, event_type: &str) -> Event {
        Event {
            id,
            event_id: format!("e-{id}"),
            event_type: event_type.into(),
            payload: b"{}".to_vec(),
            created_at: Some(0.0),
            ..Event::default()
        }
    }

    /// The round's unsendable events, as issue_round finds them.
    fn unsendable(events: &[&Event]) -> Vec<(usize, String)> {
        events
            .iter()
            .enumerate()
            .filter_map(|(position, event)| Some((position, outgoing(event, 131_072).err()?)))
            .collect()
    }

    #[test]
    fn an_over_long_event_after_a_publish_error_is_left_unresolved_and_one_before_it_fails() {
        let long = "x".repeat(256);
        let owned = [
            event(1, "ok"),
            event(2, &long),
            event(3, "ok"),
            event(4, &long),
            event(5, "ok"),
        ];
        let events: Vec<&Event> = owned.iter().collect();
        let mut round = Round::default();
        // The publish of event 3 failed: nothing from it on was sent.
        account(&mut round, &events, unsendable(&events), 2);
        let failed: Vec<i64> = round.failed.iter().map(|(id, _)| *id).collect();
        assert_eq!(failed, [2]);
        let mut unresolved: Vec<i64> = round.unresolved.into_iter().collect();
        unresolved.sort();
        assert_eq!(unresolved, [3, 4, 5]);
    }

    #[test]
    fn every_unsendable_event_of_a_round_sent_whole_fails() {
        let long = "x".repeat(256);
        let mut unreadable = event(3, "ok");
        unreadable.unreadable = Some("payload is NULL".into());
        let owned = [event(1, &long), event(2, "ok"), unreadable];
        let events: Vec<&Event> = owned.iter().collect();
        let mut round = Round::default();
        account(&mut round, &events, unsendable(&events), events.len());
        assert_eq!(
            round.failed,
            [
                (1, "event_type is longer than AMQP's 255 bytes".into()),
                (3, "payload is NULL".into())
            ]
        );
        assert!(round.unresolved.is_empty());
    }
}
