//! The connection to RabbitMQ, a confirm-mode channel for each batch in
//! flight, and the publishing of a batch with every outcome attributed to
//! its event (the rounds of publishes and confirms themselves are in
//! `round.rs`).
//!
//! lapin is async only; this module owns a small runtime and hides it, so
//! the rest of the program (and the synchronous postgres client, which
//! panics inside an async context) stays plain blocking code.

use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::runtime::Runtime;
use tokio::time::{Instant, timeout, timeout_at};

use crate::broker::alarm::Alarm;
use crate::broker::round::{Issued, await_round, issue_round, publish_round};
use crate::cli::ExchangeKind;
use crate::connect::amqp::{connect_first, refusal};
use crate::connect::amqp_url::{AmqpNode, describe_broker};
use crate::connect::wait::{self, Waited};
use crate::exit::{self, classify};
use crate::guard::stop::Stop;
use crate::sql::outbox::Event;

/// Closing politely is a courtesy to the broker's logs, not a correctness
/// matter: everything is committed by then. Never let it delay the exit.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where and how to publish.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The nodes of the cluster, tried in order.
    pub nodes: Vec<AmqpNode>,
    pub exchange: String,
    pub declare_exchange: Option<ExchangeKind>,
    pub connect_timeout: Duration,
    pub confirm_timeout: Duration,
}

impl BrokerConfig {
    /// The longest the connect can take: --connect-timeout for each node.
    pub fn connect_budget(&self) -> Duration {
        self.connect_timeout * u32::try_from(self.nodes.len()).unwrap_or(u32::MAX)
    }
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
    /// Open channels no batch is using. Each batch in flight has a channel
    /// of its own: returns and channel closes are per channel, so a batch
    /// can never be blamed for another's unroutable or oversized message.
    idle: Vec<Channel>,
    config: BrokerConfig,
    /// The node that accepted, for messages.
    broker: String,
    alarm: Alarm,
}

/// A batch handed to the broker, its confirms not yet awaited.
pub enum Sent {
    /// The first round is on the wire; `outcome` awaits it (and whatever
    /// rounds a channel close makes necessary).
    Pipelined {
        channel: Channel,
        first: Box<Issued>,
        deadline: Instant,
    },
    /// --ordered sends nothing ahead: every event waits for the confirm of
    /// the one before it, so all of its publishing happens in `outcome`.
    Ordered,
}

impl Publisher {
    /// Connects to the first node that accepts, then checks (or declares)
    /// the exchange and enables confirms, each within --connect-timeout:
    /// lapin has no connect timeout of its own. A signal ends the wait at
    /// once (`stop`).
    pub fn connect(config: &BrokerConfig, stop: &Stop) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("amqp")
            .enable_all()
            .build()
            .context("starting the AMQP runtime")?;
        let (connection, broker, channel) = runtime.block_on(async {
            let (connection, index) =
                connect_first(&config.nodes, config.connect_timeout, stop).await?;
            let broker = describe_broker(&config.nodes[index].uri);
            let opened = open_channel(&connection, config, &broker);
            let channel = match wait::on_future(config.connect_timeout, stop, opened).await {
                Waited::Done(channel) => channel?,
                Waited::TimedOut => {
                    return Err(exit::outage(anyhow!(
                        "RabbitMQ at {broker} did not open a channel in time"
                    )));
                }
                Waited::Stopped(exit) => {
                    return Err(wait::stopped_while(
                        exit,
                        &format!(
                            "opening a channel on RabbitMQ at {broker}; nothing was published"
                        ),
                    ));
                }
            };
            Ok::<_, anyhow::Error>((connection, broker, channel))
        })?;
        // Taken now: lapin tells only the listeners that exist when
        // connection.blocked comes.
        let alarm = Alarm::watch(&connection, &runtime);
        Ok(Publisher {
            runtime,
            connection,
            idle: vec![channel],
            config: config.clone(),
            broker,
            alarm,
        })
    }

    /// Hands a batch to the broker: issues every publish and returns
    /// without awaiting a confirm. --confirm-timeout counts from here.
    pub fn send(&mut self, events: &[Event], ordered: bool) -> Result<Sent> {
        if ordered {
            return Ok(Sent::Ordered);
        }
        // Opening a channel for another batch in flight has its own bound,
        // not the confirms'.
        let channel = self.take_channel()?;
        let deadline = Instant::now() + self.config.confirm_timeout;
        let all: Vec<&Event> = events.iter().collect();
        let first = self.runtime.block_on(issue_round(
            &channel,
            &self.config.exchange,
            &all,
            deadline,
            &self.alarm,
        ));
        Ok(Sent::Pipelined {
            channel,
            first: Box::new(first),
            deadline,
        })
    }

    /// Awaits the confirms of a batch `send` sent (`events` as given to
    /// it) and says what became of each event.
    pub fn outcome(&mut self, sent: Sent, events: &[Event]) -> Outcome {
        match sent {
            Sent::Pipelined {
                channel,
                first,
                deadline,
            } => self.resolve_rounds(channel, *first, events, deadline),
            Sent::Ordered => self.publish_in_order(events),
        }
    }

    /// Awaits the first round, all of the batch, within --confirm-timeout
    /// for the whole batch.
    ///
    /// A channel-level error (the broker closes the channel over one bad
    /// message) must count against that message only. Pipelining hides
    /// which message it was, so after such an error the first unresolved
    /// event is published alone on a fresh channel: if it closes the channel
    /// again it is the culprit and fails; otherwise the rest go out pipelined
    /// again. Each round settles at least one event, so this ends.
    fn resolve_rounds(
        &mut self,
        mut channel: Channel,
        first: Issued,
        events: &[Event],
        deadline: Instant,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        let mut rest: Vec<&Event> = events.iter().collect();
        let mut result = self
            .runtime
            .block_on(await_round(first, &rest, deadline, &self.alarm));
        let mut sent = rest.len();
        let mut alone = false;
        loop {
            outcome.confirmed.extend(result.confirmed);
            outcome.failed.extend(result.failed);
            if let Some(error) = result.error {
                if result.timed_out
                    || result.blocked
                    || !self.channel_closed_by_broker(&error, alone)
                {
                    outcome.outage = Some(self.outage(error, result.timed_out));
                    return outcome; // the channel goes with the connection
                }
                if alone {
                    outcome.failed.push(culprit(rest.remove(0), &error));
                } else {
                    // The round was all of `rest`: what it left unresolved remains.
                    rest.retain(|event| result.unresolved.contains(&event.id));
                }
                alone = !alone;
                match self.open_channel_by(deadline) {
                    Ok(reopened) => channel = reopened,
                    Err(error) => {
                        outcome.outage = Some(error);
                        return outcome;
                    }
                }
            } else {
                rest.drain(..sent);
                alone = false;
            }
            if rest.is_empty() {
                break;
            }
            let round = if alone { &rest[..1] } else { &rest[..] };
            sent = round.len();
            result = self.runtime.block_on(publish_round(
                &channel,
                &self.config.exchange,
                round,
                deadline,
                &self.alarm,
            ));
        }
        self.idle.push(channel);
        outcome
    }

    /// --ordered: one event at a time, each confirmed before the next is
    /// sent, stopping at the first failure. Pipelining would put events
    /// behind a failed one on the wire before we knew it had failed, and
    /// consumers of an ordered stream must never see them out of order.
    fn publish_in_order(&mut self, events: &[Event]) -> Outcome {
        let deadline = Instant::now() + self.config.confirm_timeout;
        let mut outcome = Outcome::default();
        let mut channel = match self.take_channel() {
            Ok(channel) => channel,
            Err(error) => {
                outcome.outage = Some(error);
                return outcome;
            }
        };
        for event in events {
            let result = self.runtime.block_on(publish_round(
                &channel,
                &self.config.exchange,
                &[event],
                deadline,
                &self.alarm,
            ));
            outcome.confirmed.extend(result.confirmed);
            let failed = !result.failed.is_empty();
            outcome.failed.extend(result.failed);
            if let Some(error) = result.error {
                if result.timed_out
                    || result.blocked
                    || !self.channel_closed_by_broker(&error, true)
                {
                    outcome.outage = Some(self.outage(error, result.timed_out));
                    return outcome;
                }
                outcome.failed.push(culprit(event, &error));
                match self.open_channel_by(deadline) {
                    Ok(reopened) => channel = reopened,
                    Err(error) => {
                        outcome.outage = Some(error);
                        return outcome;
                    }
                }
                break;
            }
            if failed {
                break;
            }
        }
        self.idle.push(channel);
        outcome
    }

    /// Closes the connection cleanly; errors here change nothing. A broker
    /// that blocked us reads nothing, the close included: it is not tried.
    pub fn close(self) {
        let connection = self.connection;
        if self.alarm.reason().is_none() {
            let _ = self.runtime.block_on(async {
                timeout(CLOSE_TIMEOUT, connection.close(200, "bye".into())).await
            });
        }
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

    /// An idle channel, or a new one (each batch in flight has its own),
    /// opened within --connect-timeout.
    fn take_channel(&mut self) -> Result<Channel> {
        if let Some(channel) = self.idle.pop() {
            return Ok(channel);
        }
        let broker = &self.broker;
        // The timer must be made inside the runtime: tokio's timeout
        // panics when called outside one, so it goes in the async block.
        self.runtime
            .block_on(async {
                timeout(
                    self.config.connect_timeout,
                    open_channel(&self.connection, &self.config, broker),
                )
                .await
            })
            .map_err(|_| {
                exit::outage(anyhow!(
                    "RabbitMQ at {broker} did not open a channel in time"
                ))
            })?
    }

    /// A fresh channel in place of one the broker closed, by the batch's
    /// confirm deadline.
    fn open_channel_by(&self, deadline: Instant) -> Result<Channel> {
        self.runtime
            .block_on(async {
                let opened = open_channel(&self.connection, &self.config, &self.broker);
                timeout_at(deadline, opened).await
            })
            .map_err(|_| self.outage(anyhow!("reopening the channel"), true))?
    }

    fn outage(&self, error: anyhow::Error, timed_out: bool) -> anyhow::Error {
        let broker = &self.broker;
        if let Some(reason) = self.alarm.reason() {
            exit::outage(anyhow!(
                "RabbitMQ at {broker} blocked publishers ({reason}): a resource alarm, until \
                 the broker has memory or disk space again; unconfirmed events were left as \
                 they were and will be retried"
            ))
        } else if timed_out {
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

/// The failure recorded against a message the broker closed the channel over.
fn culprit(event: &Event, error: &anyhow::Error) -> (i64, String) {
    let reason = format!("the broker closed the channel over this message: {error}");
    (event.id, reason)
}

async fn open_channel(
    connection: &Connection,
    config: &BrokerConfig,
    broker: &str,
) -> Result<Channel> {
    let channel = connection.create_channel().await.map_err(|error| {
        exit::outage(anyhow!(
            "opening a channel on RabbitMQ at {broker}: {error}"
        ))
    })?;
    check_exchange(&channel, config, broker).await?;
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
            if refusal(&error) != Some(classify::Cause::Config) {
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
