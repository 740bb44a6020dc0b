//! The connection to RabbitMQ, a confirm-mode channel for each batch in
//! flight, and the publishing of a batch with every outcome attributed to
//! its event (the rounds of publishes and confirms themselves are in
//! `round.rs`).
//!
//! lapin is async only; this module owns a small runtime and hides it, so
//! the rest of the program (and the synchronous postgres client, which
//! panics inside an async context) stays plain blocking code.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::ValueEnum;
use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::runtime::Runtime;
use tokio::time::{Instant, timeout};

use crate::broker::alarm::{Alarm, Cutoff};
use crate::broker::round::{
    Exchanges, Issued, Round, await_round, issue_round, missing_exchange, publish_round,
};
use crate::connect::amqp::{connect_first, refusal, reply_code};
use crate::connect::amqp_url::{AmqpNode, describe_broker};
use crate::connect::wait::{self, Waited};
use crate::exit::{self, classify};
use crate::guard::stop::Stop;
use crate::sql::outbox::Event;

/// Closing politely is a courtesy to the broker's logs, not a correctness
/// matter: everything is committed by then. Never let it delay the exit.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// --declare-exchange: the kind of exchange to declare.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

/// Where and how to publish.
#[derive(Debug, Clone)]
pub(crate) struct BrokerConfig {
    /// The nodes of the cluster, tried in order.
    pub(crate) nodes: Vec<AmqpNode>,
    pub(crate) exchange: String,
    pub(crate) declare_exchange: Option<ExchangeKind>,
    pub(crate) connect_timeout: Duration,
    pub(crate) confirm_timeout: Duration,
}

impl BrokerConfig {
    /// The longest the connect can take: --connect-timeout for each node.
    pub(crate) fn connect_budget(&self) -> Duration {
        self.connect_timeout * u32::try_from(self.nodes.len()).unwrap_or(u32::MAX)
    }
}

/// What the broker said about a batch.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Row ids the broker confirmed: mark them published.
    pub(crate) confirmed: Vec<i64>,
    /// Row ids that failed by their own fault (returned unroutable, the
    /// channel closed over them, not sendable at all), with the reason:
    /// count an attempt.
    pub(crate) failed: Vec<(i64, String)>,
    /// Row ids the broker nacked (declined for now): back off, but count no
    /// attempt.
    pub(crate) declined: Vec<i64>,
    /// Set when the batch could not be finished: the connection failed,
    /// confirms did not come back in time, or the broker refused for a
    /// reason of permissions or configuration (the error's kind says which:
    /// exit 69 or 78). The events neither confirmed nor failed were not the
    /// events' fault and must be left exactly as they were.
    pub(crate) outage: Option<anyhow::Error>,
}

impl Outcome {
    /// Adds what a round settled.
    fn absorb(&mut self, round: &mut Round) {
        self.confirmed.append(&mut round.confirmed);
        self.failed.append(&mut round.failed);
        self.declined.append(&mut round.declined);
    }
}

/// What a round that ended in an error (other than a timeout) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The event published alone made the broker close the channel over
    /// its content: the event's own failure.
    Blame,
    /// Some event of a pipelined round may have made the broker close the
    /// channel: only a round of one event can tell which.
    Isolate,
    /// The broker refused for a reason of permissions or configuration,
    /// which no retry gets past (exit 78).
    Refused,
    /// The connection failed, or the broker failed for a reason of its own
    /// (exit 69).
    Outage,
}

/// The runtime lapin runs on: one worker thread of its own, so that the
/// broker's frames are read while the relay waits on PostgreSQL.
pub(crate) fn amqp_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("amqp")
        .enable_all()
        .build()
        .context("starting the AMQP runtime")
}

/// The verdict on a round's error: `refusal` is what the broker's reply
/// code says (None when the error is not the broker's word at all: a
/// socket, a channel already closed), `connected` whether the connection
/// is still up, `alone` whether the round was one event. A message is
/// blamed only on the broker's own refusal of it, with the connection up:
/// when a socket dies, lapin fails the pending publishes before it marks
/// the connection lost, and nothing may be blamed on an event for that.
fn verdict(refusal: Option<classify::Cause>, connected: bool, alone: bool) -> Verdict {
    use classify::Cause;
    match refusal {
        Some(Cause::Config) => Verdict::Refused,
        Some(Cause::Message) if connected && alone => Verdict::Blame,
        Some(Cause::Message) | None if connected && !alone => Verdict::Isolate,
        _ => Verdict::Outage,
    }
}

pub(crate) struct Publisher {
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
    /// A signal ends a wait for a channel at once.
    stop: Stop,
    /// The rows' exchanges the broker said (404) do not exist, this run:
    /// later events to them fail without a publish (see `Exchanges`).
    missing: HashSet<String>,
    /// The rows' exchanges a passive declare found, this run.
    present: HashSet<String>,
}

/// A batch handed to the broker, its confirms not yet awaited.
pub(crate) enum Sent {
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
    pub(crate) fn connect(config: &BrokerConfig, stop: &Stop) -> Result<Self> {
        let runtime = amqp_runtime()?;
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
            stop: stop.clone(),
            missing: HashSet::new(),
            present: HashSet::new(),
        })
    }

    /// Hands a batch to the broker: issues every publish and returns
    /// without awaiting a confirm. --confirm-timeout counts from here.
    pub(crate) fn send(&mut self, events: &[Event], ordered: bool) -> Result<Sent> {
        self.check_exchanges(events);
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
            self.exchanges(),
            &all,
            deadline,
            self.frame_max(),
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
    pub(crate) fn outcome(&mut self, sent: Sent, events: &[Event]) -> Outcome {
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
    /// again. Each round settles at least one event, so this ends. A refusal
    /// about permissions or configuration, or an outage, ends the batch.
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
            outcome.absorb(&mut result);
            if let Some(error) = result.error.take() {
                match self.judge(&error, &result, &rest[..sent], alone) {
                    Ok(Verdict::Blame) => {
                        let failure = self.culprit(rest.remove(0), &error);
                        outcome.failed.push(failure);
                        alone = false;
                    }
                    Ok(_) => {
                        // The round was all of `rest`: what it left unresolved remains.
                        rest.retain(|event| result.unresolved.contains(&event.id));
                        alone = true;
                    }
                    Err(stop) => {
                        outcome.outage = Some(stop);
                        return outcome; // the channel is closed, or goes with the connection
                    }
                }
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
                self.exchanges(),
                round,
                deadline,
                self.frame_max(),
                &self.alarm,
            ));
        }
        self.idle.push(channel);
        outcome
    }

    /// --ordered: one event at a time, each confirmed before the next is
    /// sent, stopping at the first failure or nack. Pipelining would put
    /// events behind a failed one on the wire before we knew it had failed,
    /// and consumers of an ordered stream must never see them out of order.
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
            let mut result = self.runtime.block_on(publish_round(
                &channel,
                self.exchanges(),
                &[event],
                deadline,
                self.frame_max(),
                &self.alarm,
            ));
            let stopped = !result.failed.is_empty() || !result.declined.is_empty();
            outcome.absorb(&mut result);
            if let Some(error) = result.error.take() {
                if let Err(stop) = self.judge(&error, &result, &[event], true) {
                    outcome.outage = Some(stop);
                    return outcome;
                }
                let failure = self.culprit(event, &error);
                outcome.failed.push(failure);
                match self.open_channel_by(deadline) {
                    Ok(reopened) => channel = reopened,
                    Err(error) => {
                        outcome.outage = Some(error);
                        return outcome;
                    }
                }
                break;
            }
            if stopped {
                break;
            }
        }
        self.idle.push(channel);
        outcome
    }

    /// Checks each of the rows' exchanges the run has not met yet with a
    /// passive declare, on a channel of its own, before anything of the
    /// batch is published. A publish to a missing exchange makes the
    /// broker close the batch's channel, and the confirms of the events
    /// published before it on that channel are lost with it: those events
    /// would be sent again. Checked first, an event to a missing exchange
    /// fails without being sent, and the others are undisturbed. The
    /// answers are kept for the run: one round trip per exchange, none for
    /// a table whose rows name none. An exchange deleted after its check
    /// is still caught by the broker's 404 (see `judge`); a check that
    /// fails otherwise (a timeout, a refusal) leaves the publish to find out.
    fn check_exchanges(&mut self, events: &[Event]) {
        let unknown: BTreeSet<&str> = events
            .iter()
            .filter_map(|event| event.exchange.as_deref())
            .filter(|name| !self.present.contains(*name) && !self.missing.contains(*name))
            .collect();
        let mut channel = None;
        for name in unknown {
            let checked = self.runtime.block_on(async {
                let limit = self.config.connect_timeout;
                timeout(limit, async {
                    let open = match channel.take() {
                        Some(open) => open,
                        None => self.connection.create_channel().await?,
                    };
                    let passive = ExchangeDeclareOptions {
                        passive: true,
                        ..Default::default()
                    };
                    let kind = lapin::ExchangeKind::Topic;
                    let declared = open
                        .exchange_declare(name.into(), kind, passive, FieldTable::default())
                        .await;
                    // A 404 closes the channel; one that stays open serves the next check.
                    Ok::<_, lapin::Error>(declared.map(|()| open))
                })
                .await
            });
            match checked {
                Ok(Ok(Ok(open))) => {
                    self.present.insert(name.to_string());
                    channel = Some(open);
                }
                Ok(Ok(Err(error))) if reply_code(&error) == Some(404) => {
                    self.missing.insert(name.to_string());
                }
                _ => {}
            }
        }
        if let Some(open) = channel {
            // The timer must be made inside the runtime.
            let _ = self.runtime.block_on(async {
                timeout(CLOSE_TIMEOUT, open.close(200, "checked".into())).await
            });
        }
    }

    /// Where rounds publish (see `Exchanges`).
    fn exchanges(&self) -> Exchanges<'_> {
        Exchanges {
            default: &self.config.exchange,
            missing: &self.missing,
        }
    }

    /// The failure recorded against a message the broker closed the
    /// channel over: a missing exchange of the row's own is named, and
    /// remembered for the rest of the run.
    fn culprit(&mut self, event: &Event, error: &anyhow::Error) -> (i64, String) {
        if let (Some(exchange), Some(404)) = (&event.exchange, reply(error)) {
            self.missing.insert(exchange.clone());
            return (event.id, missing_exchange(exchange));
        }
        let reason = format!("the broker closed the channel over this message: {error}");
        (event.id, reason)
    }

    /// The largest frame the connection may send, as negotiated with the
    /// broker: a message's headers must fit in one.
    fn frame_max(&self) -> u32 {
        self.connection.configuration().frame_max()
    }

    /// Closes the connection cleanly; errors here change nothing. A broker
    /// that blocked us reads nothing, the close included: it is not tried.
    pub(crate) fn close(self) {
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

    /// What a round's error means for the batch (see `verdict`): the
    /// verdict when the batch goes on, or the error that ends it. A round
    /// cut short (its deadline, a broker that blocked publishers) ends it.
    /// `events` are the round's.
    fn judge(
        &self,
        error: &anyhow::Error,
        round: &Round,
        events: &[&Event],
        alone: bool,
    ) -> Result<Verdict> {
        if round.timed_out || round.blocked {
            return Err(self.outage(error, round.timed_out));
        }
        let own_exchange = events.iter().any(|event| event.exchange.is_some());
        let reply = reply(error).map(|code| publish_cause(code, own_exchange));
        let connected = self.connection.status().connected();
        match verdict(reply, connected, alone) {
            Verdict::Refused => Err(self.refused(error)),
            Verdict::Outage => Err(self.outage(error, false)),
            goes_on => Ok(goes_on),
        }
    }

    /// An idle channel, or a new one (each batch in flight has its own),
    /// opened within --connect-timeout.
    fn take_channel(&mut self) -> Result<Channel> {
        if let Some(channel) = self.idle.pop() {
            return Ok(channel);
        }
        let deadline = Instant::now() + self.config.connect_timeout;
        let broker = &self.broker;
        self.open_channel_until(deadline, || {
            exit::outage(anyhow!(
                "RabbitMQ at {broker} did not open a channel in time"
            ))
        })
    }

    /// A fresh channel in place of one the broker closed, by the batch's
    /// confirm deadline.
    fn open_channel_by(&self, deadline: Instant) -> Result<Channel> {
        self.open_channel_until(deadline, || {
            self.outage(&anyhow!("reopening the channel"), true)
        })
    }

    /// Opens a channel by `deadline` (`late` says what missing it means).
    /// A broker that blocks publishers reads nothing more, channel.open
    /// included, so the wait ends at once when it does, as a signal ends it.
    fn open_channel_until(
        &self,
        deadline: Instant,
        late: impl FnOnce() -> anyhow::Error,
    ) -> Result<Channel> {
        let opened = open_channel(&self.connection, &self.config, &self.broker);
        // The timers must be made inside the runtime: tokio's panic when
        // made outside one, so they go in the async block.
        let waited = self.runtime.block_on(async {
            let limit = deadline.saturating_duration_since(Instant::now());
            wait::on_future(limit, &self.stop, self.alarm.until(deadline, opened)).await
        });
        match waited {
            Waited::Done(Ok(channel)) => channel,
            Waited::Done(Err(Cutoff::Blocked)) => {
                Err(self.outage(&anyhow!("opening a channel"), false))
            }
            Waited::Done(Err(Cutoff::Deadline)) | Waited::TimedOut => Err(late()),
            Waited::Stopped(exit) => Err(wait::stopped_while(
                exit,
                &format!("opening a channel on RabbitMQ at {}", self.broker),
            )),
        }
    }

    fn outage(&self, error: &anyhow::Error, timed_out: bool) -> anyhow::Error {
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
        } else if self.connection.status().connected() {
            exit::outage(anyhow!(
                "RabbitMQ at {broker} closed the channel while publishing: {error}; \
                 unconfirmed events were left as they were and will be retried"
            ))
        } else {
            exit::outage(anyhow!(
                "lost the connection to RabbitMQ at {broker} while publishing: {error}; \
                 unconfirmed events were left as they were and will be retried"
            ))
        }
    }

    /// The broker refused the publishes for a reason a rerun cannot get
    /// past: a user without write permission on the exchange, an internal
    /// exchange, an exchange deleted while the run went on.
    fn refused(&self, error: &anyhow::Error) -> anyhow::Error {
        let broker = &self.broker;
        let exchange = &self.config.exchange;
        exit::config(anyhow!(
            "RabbitMQ at {broker} refused the publishes to exchange {exchange:?}: {error}; check \
             that the exchange exists and is not internal, and that the user may write to it; \
             unconfirmed events were left as they were (no attempt counted)"
        ))
    }
}

/// What a reply code over a publish says. It can be about the message
/// itself, and a 404 is too when the round sent events to exchanges of
/// their own (`own_exchange`): a missing --exchange stays a refusal,
/// since every event goes there.
fn publish_cause(code: u16, own_exchange: bool) -> classify::Cause {
    match code {
        404 if own_exchange => classify::Cause::Message,
        code => classify::amqp_publish(code),
    }
}

/// The broker's reply code, where the error is the broker's word.
fn reply(error: &anyhow::Error) -> Option<u16> {
    error.downcast_ref::<lapin::Error>().and_then(reply_code)
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
                missing_exchange_error(exchange, broker)
            } else {
                exit::config(anyhow!(
                    "cannot declare exchange {exchange:?} on RabbitMQ at {broker}: {error}; \
                     it exists with other settings: match its type or drop --declare-exchange"
                ))
            }
        })
}

/// The run's exchange is not there and the run may not declare it.
pub(crate) fn missing_exchange_error(exchange: &str, broker: &str) -> anyhow::Error {
    exit::config(anyhow!(
        "exchange {exchange:?} does not exist on RabbitMQ at {broker}: create it, or pass \
         --declare-exchange KIND to have outbox-poll declare it"
    ))
}

#[cfg(test)]
mod tests {
    use super::classify::Cause;
    use super::{Verdict, publish_cause, verdict};

    #[test]
    fn a_missing_exchange_is_an_events_fault_only_when_the_round_named_its_own() {
        assert_eq!(publish_cause(404, true), Cause::Message);
        assert_eq!(publish_cause(404, false), Cause::Config);
        assert_eq!(publish_cause(403, true), Cause::Config);
    }

    #[test]
    fn only_the_brokers_refusal_of_a_message_published_alone_blames_it() {
        assert_eq!(verdict(Some(Cause::Message), true, true), Verdict::Blame);
        for (refusal, connected) in [
            (None, true),
            (Some(Cause::Outage), true),
            (Some(Cause::Message), false),
            (None, false),
        ] {
            assert_eq!(
                verdict(refusal, connected, true),
                Verdict::Outage,
                "{refusal:?}, connected: {connected}"
            );
        }
    }

    #[test]
    fn a_close_in_a_pipelined_round_is_isolated_unless_it_is_a_refusal_or_an_outage() {
        assert_eq!(verdict(Some(Cause::Message), true, false), Verdict::Isolate);
        assert_eq!(verdict(None, true, false), Verdict::Isolate);
        assert_eq!(verdict(Some(Cause::Outage), true, false), Verdict::Outage);
        assert_eq!(verdict(None, false, false), Verdict::Outage);
    }

    #[test]
    fn a_refusal_about_permissions_or_configuration_is_never_an_events_fault() {
        for (connected, alone) in [(true, true), (true, false), (false, true), (false, false)] {
            assert_eq!(
                verdict(Some(Cause::Config), connected, alone),
                Verdict::Refused
            );
        }
    }
}
