//! The RabbitMQ side: one connection, one confirm-mode channel, and the
//! publishing of a batch with every outcome attributed to its event.
//!
//! lapin is async only; this module owns a small runtime and hides it, so
//! the rest of the program (and the synchronous postgres client, which
//! panics inside an async context) stays plain blocking code.

use std::collections::HashSet;
use std::task::Poll;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::uri::AMQPUri;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, PublisherConfirm,
};
use tokio::runtime::Runtime;
use tokio::time::{Instant, timeout, timeout_at};

use crate::cli::ExchangeKind;
use crate::exit;
use crate::outbox::Event;
use crate::urls::describe_broker;

/// Closing politely is a courtesy to the broker's logs, not a correctness
/// matter: everything is committed by then. Never let it delay the exit.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where and how to publish.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub uri: AMQPUri,
    pub exchange: String,
    pub declare_exchange: Option<ExchangeKind>,
    pub connect_timeout: Duration,
    pub confirm_timeout: Duration,
}

/// What the broker said about a batch.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Row ids the broker confirmed: mark them published.
    pub confirmed: Vec<i64>,
    /// Row ids the broker nacked or returned, with the reason: count an attempt.
    pub failed: Vec<(i64, String)>,
    /// Set when the connection failed or confirms did not come back in time.
    /// The events neither confirmed nor failed were not the events' fault
    /// and must be left exactly as they were.
    pub outage: Option<anyhow::Error>,
}

pub struct Publisher {
    runtime: Runtime,
    connection: Connection,
    channel: Channel,
    config: BrokerConfig,
}

impl Publisher {
    /// Connects, checks (or declares) the exchange and enables confirms,
    /// all within --connect-timeout: lapin has no connect timeout of its own.
    pub fn connect(config: &BrokerConfig) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("amqp")
            .enable_all()
            .build()
            .context("starting the AMQP runtime")?;
        let broker = describe_broker(&config.uri);
        let (connection, channel) = runtime.block_on(async {
            let properties =
                ConnectionProperties::default().with_connection_name("outbox-poll".into());
            let connection = timeout(
                config.connect_timeout,
                Connection::connect_uri(config.uri.clone(), properties),
            )
            .await
            .map_err(|_| {
                exit::outage(anyhow!(
                    "cannot connect to RabbitMQ at {broker}: no answer within {}; check that \
                         the broker is up and AMQP_URL is right",
                    humantime::format_duration(config.connect_timeout)
                ))
            })?
            .map_err(|error| connect_error(&error, &broker))?;
            let channel = timeout(config.connect_timeout, open_channel(&connection, config))
                .await
                .map_err(|_| {
                    exit::outage(anyhow!(
                        "RabbitMQ at {broker} did not open a channel in time"
                    ))
                })??;
            Ok::<_, anyhow::Error>((connection, channel))
        })?;
        Ok(Publisher {
            runtime,
            connection,
            channel,
            config: config.clone(),
        })
    }

    /// Publishes every event, then awaits all their confirms, within
    /// --confirm-timeout for the whole batch.
    ///
    /// A channel-level error (the broker closes the channel over one bad
    /// message) must count against that message only. Pipelining hides
    /// which message it was, so after such an error the first unresolved
    /// event is published alone on a fresh channel: if it closes the channel
    /// again it is the culprit and fails; otherwise the rest go out pipelined
    /// again. Each round settles at least one event, so this ends.
    pub fn publish(&mut self, events: &[Event]) -> Outcome {
        let deadline = Instant::now() + self.config.confirm_timeout;
        let mut outcome = Outcome::default();
        let mut rest: Vec<&Event> = events.iter().collect();
        let mut alone = false;
        while !rest.is_empty() {
            let round = if alone { &rest[..1] } else { &rest[..] };
            let result = self.runtime.block_on(publish_round(
                &self.channel,
                &self.config.exchange,
                round,
                deadline,
            ));
            outcome.confirmed.extend(result.confirmed);
            outcome.failed.extend(result.failed);
            let Some(error) = result.error else {
                rest.drain(..round.len());
                alone = false;
                continue;
            };
            if result.timed_out || !self.channel_closed_by_broker(&error, alone) {
                outcome.outage = Some(self.outage(error, result.timed_out));
                break;
            }
            let settled: HashSet<i64> = round
                .iter()
                .map(|e| e.id)
                .filter(|id| !result.unresolved.contains(id))
                .collect();
            if alone {
                outcome.failed.push((
                    rest[0].id,
                    format!("the broker closed the channel over this message: {error}"),
                ));
                rest.remove(0);
            } else {
                rest.retain(|event| !settled.contains(&event.id));
            }
            alone = !alone;
            if let Err(error) = self.reopen_channel(deadline) {
                outcome.outage = Some(error);
                break;
            }
        }
        outcome
    }

    /// --ordered: one event at a time, each confirmed before the next is
    /// sent, stopping at the first failure. Pipelining would put events
    /// behind a failed one on the wire before we knew it had failed, and
    /// consumers of an ordered stream must never see them out of order.
    pub fn publish_in_order(&mut self, events: &[Event]) -> Outcome {
        let deadline = Instant::now() + self.config.confirm_timeout;
        let mut outcome = Outcome::default();
        for event in events {
            let result = self.runtime.block_on(publish_round(
                &self.channel,
                &self.config.exchange,
                &[event],
                deadline,
            ));
            outcome.confirmed.extend(result.confirmed);
            let failed = !result.failed.is_empty();
            outcome.failed.extend(result.failed);
            if let Some(error) = result.error {
                if result.timed_out || !self.channel_closed_by_broker(&error, true) {
                    outcome.outage = Some(self.outage(error, result.timed_out));
                } else {
                    outcome.failed.push((
                        event.id,
                        format!("the broker closed the channel over this message: {error}"),
                    ));
                    if let Err(error) = self.reopen_channel(deadline) {
                        outcome.outage = Some(error);
                    }
                }
                break;
            }
            if failed {
                break;
            }
        }
        outcome
    }

    /// Closes the connection cleanly; errors here change nothing.
    pub fn close(self) {
        let connection = self.connection;
        let _ = self
            .runtime
            .block_on(async { timeout(CLOSE_TIMEOUT, connection.close(200, "bye".into())).await });
        // Dropping the runtime would wait for its tasks, and after an outage
        // a task may still be stuck on a dead socket.
        self.runtime.shutdown_background();
    }

    /// Whether `error` is the broker closing our channel (the connection
    /// still up), rather than the connection failing. When a socket dies,
    /// lapin fails the pending publishes before it marks the connection as
    /// lost, so "connected" alone could blame an event for an outage. Before
    /// blaming a single message (`blame`), the error must therefore be the
    /// broker's own channel-level refusal, an AMQP soft error.
    fn channel_closed_by_broker(&self, error: &anyhow::Error, blame: bool) -> bool {
        let soft = error
            .downcast_ref::<lapin::Error>()
            .is_some_and(lapin::Error::is_amqp_soft_error);
        self.connection.status().connected() && (soft || !blame)
    }

    fn reopen_channel(&mut self, deadline: Instant) -> Result<()> {
        // The timer must be made inside the runtime: tokio's timeout_at
        // panics when called outside one, so it goes in the async block.
        let channel = self
            .runtime
            .block_on(async {
                timeout_at(deadline, open_channel(&self.connection, &self.config)).await
            })
            .map_err(|_| self.outage(anyhow!("reopening the channel"), true))??;
        self.channel = channel;
        Ok(())
    }

    fn outage(&self, error: anyhow::Error, timed_out: bool) -> anyhow::Error {
        let broker = describe_broker(&self.config.uri);
        if timed_out {
            exit::outage(anyhow!(
                "RabbitMQ at {broker} did not confirm the batch within {} (--confirm-timeout); \
                 unconfirmed events were left as they were and will be retried",
                humantime::format_duration(self.config.confirm_timeout)
            ))
        } else {
            exit::outage(anyhow!(
                "lost the connection to RabbitMQ at {broker} while publishing: {error}; \
                 unconfirmed events were left as they were and will be retried"
            ))
        }
    }
}

/// The result of one pipelined round.
#[derive(Default)]
struct Round {
    confirmed: Vec<i64>,
    failed: Vec<(i64, String)>,
    /// Row ids with no answer from the broker.
    unresolved: HashSet<i64>,
    error: Option<anyhow::Error>,
    timed_out: bool,
}

/// Publishes in flight at once: enough to keep the socket full, few enough
/// that a large batch does not hold thousands of publish futures and their
/// frames in memory at once.
const PUBLISH_WINDOW: usize = 1000;

/// Issues the round's publishes a window at a time, every publish of a
/// window before waiting for any of them, so the round goes out as one
/// stream instead of one io-thread hand-off per message; then awaits the
/// confirms. After the first publish that fails (or times out), that event
/// and every later one are unresolved (left as they were), and nothing
/// after it is sent, exactly as when they went one by one.
async fn publish_round(
    channel: &Channel,
    exchange: &str,
    events: &[&Event],
    deadline: Instant,
) -> Round {
    let mut round = Round::default();
    let mut too_long = Vec::new();
    let mut sendable = Vec::with_capacity(events.len());
    for (position, &event) in events.iter().enumerate() {
        match short_strings(event) {
            Some(strings) => sendable.push((position, event, strings)),
            None => too_long.push(position),
        }
    }
    let mut pending: Vec<(&Event, PublisherConfirm)> = Vec::with_capacity(sendable.len());
    let mut stopped_at = events.len();
    let mut rest = sendable.into_iter().peekable();
    'windows: while rest.peek().is_some() {
        let window: Vec<_> = rest.by_ref().take(PUBLISH_WINDOW).collect();
        let sent: Vec<(usize, &Event)> = window.iter().map(|(p, e, _)| (*p, *e)).collect();
        let results = match timeout_at(deadline, issue(channel, exchange, window)).await {
            Ok(results) => results,
            Err(_) => {
                round.timed_out = true;
                round.error = Some(anyhow!("publishing timed out"));
                stopped_at = sent[0].0;
                round
                    .unresolved
                    .extend(events[stopped_at..].iter().map(|e| e.id));
                break;
            }
        };
        for ((position, event), result) in sent.into_iter().zip(results) {
            match result {
                Ok(confirm) => pending.push((event, confirm)),
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
    await_confirms(pending, deadline, &mut round).await;
    round
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
            Box::pin(channel.basic_publish(
                exchange.into(),
                routing_key,
                options,
                event.payload.as_bytes(),
                properties(event, message_id),
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
    pending: Vec<(&Event, PublisherConfirm)>,
    deadline: Instant,
    round: &mut Round,
) {
    let mut acked = Vec::new();
    let mut returned = Vec::new();
    for (event, confirm) in pending {
        if round.timed_out {
            round.unresolved.insert(event.id);
            continue;
        }
        match timeout_at(deadline, confirm).await {
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
            Err(_) => {
                round.unresolved.insert(event.id);
                round.error.get_or_insert(anyhow!("confirms timed out"));
                round.timed_out = true;
            }
        }
    }
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

fn short_strings(event: &Event) -> Option<(ShortString, ShortString)> {
    let routing_key = ShortString::try_new(event.event_type.as_str()).ok()?;
    let message_id = ShortString::try_new(event.event_id.as_str()).ok()?;
    Some((routing_key, message_id))
}

/// The message properties CONTRACT.md fixes.
fn properties(event: &Event, message_id: ShortString) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(message_id)
        .with_type(ShortString::try_new(event.event_type.as_str()).unwrap_or_default())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_timestamp(event.created_at.max(0) as u64)
        .with_app_id("outbox-poll".into())
}

async fn open_channel(connection: &Connection, config: &BrokerConfig) -> Result<Channel> {
    let broker = describe_broker(&config.uri);
    let channel = connection.create_channel().await.map_err(|error| {
        exit::outage(anyhow!(
            "opening a channel on RabbitMQ at {broker}: {error}"
        ))
    })?;
    check_exchange(&channel, config, &broker).await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|error| {
            exit::outage(anyhow!(
                "enabling publisher confirms on RabbitMQ at {broker}: {error}"
            ))
        })?;
    Ok(channel)
}

/// Without --declare-exchange the exchange must exist: declaring it
/// passively checks that without ever creating one with the wrong type.
async fn check_exchange(channel: &Channel, config: &BrokerConfig, broker: &str) -> Result<()> {
    if config.exchange.is_empty() {
        return Ok(()); // the default exchange always exists and cannot be declared
    }
    let (kind, options) = match config.declare_exchange {
        Some(kind) => (
            kind,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
        ),
        None => (
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
        ),
    };
    let lapin_kind = match kind {
        ExchangeKind::Direct => lapin::ExchangeKind::Direct,
        ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
        ExchangeKind::Topic => lapin::ExchangeKind::Topic,
        ExchangeKind::Headers => lapin::ExchangeKind::Headers,
    };
    let exchange = config.exchange.as_str();
    channel
        .exchange_declare(exchange.into(), lapin_kind, options, FieldTable::default())
        .await
        .map_err(|error| {
            if !error.is_amqp_soft_error() {
                return exit::outage(anyhow!(
                    "checking exchange {exchange:?} on RabbitMQ at {broker}: {error}"
                ));
            }
            if options.passive {
                exit::config(anyhow!(
                    "exchange {exchange:?} does not exist on RabbitMQ at {broker}: create it, \
                     or pass --declare-exchange KIND to have outbox-poll declare it"
                ))
            } else {
                exit::config(anyhow!(
                    "cannot declare exchange {exchange:?} on RabbitMQ at {broker}: {error}; \
                     it exists with other settings: match its type or drop --declare-exchange"
                ))
            }
        })
}

/// A refused login or a missing vhost needs the operator; anything else
/// (refused TCP, reset, DNS, a broker shutting down) is an outage.
fn connect_error(error: &lapin::Error, broker: &str) -> anyhow::Error {
    use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
    let refused = match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => matches!(
            amqp.kind(),
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
                | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED)
        ),
        lapin::ErrorKind::AuthProviderError(_) => true,
        _ => false,
    };
    if refused {
        exit::config(anyhow!(
            "cannot connect to RabbitMQ at {broker}: {error}; check the user, password and vhost in AMQP_URL"
        ))
    } else {
        exit::outage(anyhow!(
            "cannot connect to RabbitMQ at {broker}: {error}; check that the broker is up and AMQP_URL is right"
        ))
    }
}
