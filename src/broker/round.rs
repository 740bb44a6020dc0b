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
use lapin::types::ShortString;
use lapin::{Channel, Confirmation, PublisherConfirm};
use tokio::time::Instant;

use crate::broker::alarm::{Alarm, Cutoff};
use crate::broker::message::{properties, short_strings};
use crate::sql::outbox::Event;

/// The result of one pipelined round.
#[derive(Default)]
pub struct Round {
    pub confirmed: Vec<i64>,
    pub failed: Vec<(i64, String)>,
    /// Row ids with no answer from the broker.
    pub unresolved: HashSet<i64>,
    pub error: Option<anyhow::Error>,
    pub timed_out: bool,
    /// The broker blocked the connection (a resource alarm): the round
    /// stopped waiting at once (see `alarm`).
    pub blocked: bool,
}

/// Publishes in flight at once: enough to keep the socket full, few enough
/// that a large batch does not hold thousands of publish futures and their
/// frames in memory at once.
const PUBLISH_WINDOW: usize = 1000;

/// A round whose publishes are on the wire and whose confirms are not yet
/// awaited: what `await_round` needs to finish it.
pub struct Issued {
    /// Each sent event's position in the round, with its confirm.
    pending: Vec<(usize, PublisherConfirm)>,
    /// What is already known: events that could not be sent, and the
    /// publish error that stopped the round, if one did.
    round: Round,
}

/// Both halves at once, for the rounds that retry part of a batch.
pub async fn publish_round(
    channel: &Channel,
    exchange: &str,
    events: &[&Event],
    deadline: Instant,
    alarm: &Alarm,
) -> Round {
    let issued = issue_round(channel, exchange, events, deadline, alarm).await;
    await_round(issued, events, deadline, alarm).await
}

/// Issues the round's publishes a window at a time, every publish of a
/// window before waiting for any of them, so the round goes out as one
/// stream instead of one io-thread hand-off per message. After the first
/// publish that fails (or times out), that event and every later one are
/// unresolved (left as they were), and nothing after it is sent, exactly as
/// when they went one by one.
pub async fn issue_round(
    channel: &Channel,
    exchange: &str,
    events: &[&Event],
    deadline: Instant,
    alarm: &Alarm,
) -> Issued {
    let mut round = Round::default();
    let mut too_long = Vec::new();
    let mut sendable = Vec::with_capacity(events.len());
    for (position, &event) in events.iter().enumerate() {
        match short_strings(event) {
            Some(strings) => sendable.push((position, event, strings)),
            None => too_long.push(position),
        }
    }
    let mut pending = Vec::with_capacity(sendable.len());
    let mut stopped_at = events.len();
    let mut rest = sendable.into_iter().peekable();
    'windows: while rest.peek().is_some() {
        let window: Vec<_> = rest.by_ref().take(PUBLISH_WINDOW).collect();
        let sent: Vec<usize> = window.iter().map(|(position, _, _)| *position).collect();
        let results = match alarm
            .until(deadline, issue(channel, exchange, window))
            .await
        {
            Ok(results) => results,
            Err(cutoff) => {
                cut_off(&mut round, cutoff, "publishing");
                stopped_at = sent[0];
                round
                    .unresolved
                    .extend(events[stopped_at..].iter().map(|e| e.id));
                break;
            }
        };
        for (position, result) in sent.into_iter().zip(results) {
            match result {
                Ok(confirm) => pending.push((position, confirm)),
                Err(error) => {
                    round.error = Some(error.into());
                    stopped_at = position;
                    round
                        .unresolved
                        .extend(events[position..].iter().map(|e| e.id));
                    break 'windows;
                }
            }
        }
    }
    for position in too_long.into_iter().take_while(|&p| p < stopped_at) {
        round.failed.push((
            events[position].id,
            "event_type or event_id is longer than AMQP's 255 bytes".into(),
        ));
    }
    Issued { pending, round }
}

/// Awaits the confirms of an issued round; `events` must be the ones it was
/// issued with.
pub async fn await_round(
    issued: Issued,
    events: &[&Event],
    deadline: Instant,
    alarm: &Alarm,
) -> Round {
    let Issued { pending, mut round } = issued;
    await_confirms(pending, events, deadline, alarm, &mut round).await;
    round
}

/// Records why the round stopped waiting while `what`; the first error of
/// the round stays the one it reports.
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
    round.error.get_or_insert(error);
}

/// Creates a window's publish futures and drives them together, returning
/// each one's result in order. lapin does all of a publish's work (taking
/// the confirm's delivery tag, queueing its frames for the io thread) in
/// the first poll of its future, so polling them first in order gives
/// delivery tags and wire order in event order.
async fn issue(
    channel: &Channel,
    exchange: &str,
    window: Vec<(usize, &Event, (ShortString, ShortString))>,
) -> Vec<lapin::Result<PublisherConfirm>> {
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    let mut publishes: Vec<_> = window
        .into_iter()
        .map(|(_, event, (routing_key, message_id))| {
            let properties = properties(event, routing_key.clone(), message_id);
            Box::pin(channel.basic_publish(
                exchange.into(),
                routing_key,
                options,
                event.payload.as_bytes(),
                properties,
            ))
        })
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
/// collected first and matched to events by message_id afterwards.
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
                returned.extend(message);
            }
            Ok(Ok(Confirmation::Nack(message))) => {
                round.failed.push((event.id, "nacked by the broker".into()));
                returned.extend(message);
            }
            Ok(Ok(Confirmation::NotRequested)) => {
                round.unresolved.insert(event.id);
                round
                    .error
                    .get_or_insert(anyhow!("the channel is not in confirm mode"));
            }
            Ok(Err(error)) => {
                round.unresolved.insert(event.id);
                round.error.get_or_insert(error.into());
            }
            Err(cutoff) => {
                round.unresolved.insert(event.id);
                cut_off(round, cutoff, "awaiting confirms");
            }
        }
    }
    fail_returned(acked, &returned, round);
}

/// Acked events the broker also returned were unroutable: failed, not
/// published. The rest of the acked are confirmed.
fn fail_returned(acked: Vec<&Event>, returned: &[BasicReturnMessage], round: &mut Round) {
    let returned: Vec<(String, String)> = returned
        .iter()
        .filter_map(|message| {
            let id = message.delivery.properties.message_id().as_ref()?;
            let reason = format!(
                "returned unroutable by the broker: {} {} (no queue is bound for routing key {:?} on exchange {:?})",
                message.reply_code, message.reply_text, message.delivery.routing_key.as_str(), message.delivery.exchange.as_str()
            );
            Some((id.to_string(), reason))
        })
        .collect();
    for event in acked {
        match returned.iter().find(|(id, _)| *id == event.event_id) {
            Some((_, reason)) => round.failed.push((event.id, reason.clone())),
            None => round.confirmed.push(event.id),
        }
    }
}
