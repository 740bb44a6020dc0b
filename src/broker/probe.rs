//! The broker's side of `outbox-poll check`: the node the run would reach,
//! the exchange it would publish to, and its user's permission to write
//! there, found without publishing anything and without declaring anything.
//!
//! Write permission: AMQP has no way to ask for a user's permissions, and
//! RabbitMQ's management API is a separate listener (often off, or
//! firewalled) that a relay needs nowhere else. So the check publishes
//! inside a channel transaction (tx.select), then rolls it back
//! (tx.rollback). RabbitMQ checks write permission (and that the exchange
//! exists and is not internal) when basic.publish arrives, refusing it by
//! closing the channel; but in a transacted channel it only routes the
//! message and holds it until tx.commit, and a rollback (or the channel's
//! close, if the connection drops first) discards it. No queue ever
//! holds it, no consumer ever sees it, and nothing is left behind. The
//! alternatives change something: a publish without a transaction, even
//! mandatory to a routing key nothing is bound to today, is delivered to
//! whatever a topic '#' or a fanout binding routes it to, and
//! declaring an exchange to test configure permission creates it. (What a
//! transacted publish does leave: the broker's message counters, and, with
//! the firehose tracer on, a trace message; neither is a delivery.)

use anyhow::{Result, anyhow};
use lapin::options::{BasicPublishOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use tokio::runtime::Runtime;
use tokio::time::{Instant, timeout};

use crate::broker::alarm::{Alarm, Cutoff};
use crate::broker::publisher::{BrokerConfig, CLOSE_TIMEOUT, amqp_runtime, missing_exchange_error};
use crate::connect::amqp::{connect_first, refusal, reply_code};
use crate::connect::amqp_url::describe_broker;
use crate::exit::{self, classify};
use crate::guard::stop::Stop;

/// The broker's checks, in the order they run: each needs the one before.
pub(crate) const CHECKS: [&str; 3] = ["rabbitmq", "exchange", "publish"];

/// The routing key of the check's publish, which is never delivered: it
/// says what it was, should a broker's trace ever show it.
const ROUTING_KEY: &str = "outbox-poll.check";

/// AMQP's reply code for a missing exchange.
const NOT_FOUND: u16 = 404;

/// Runs the broker's checks (CHECKS) in order: the detail of each that
/// passes goes to `passed`, and the first that fails ends them with its
/// error.
pub(crate) fn run(config: &BrokerConfig, passed: &mut Vec<String>) -> Result<()> {
    let runtime = amqp_runtime()?;
    let checked = runtime.block_on(probe(config, passed, &runtime));
    // Dropping the runtime would wait for its tasks, and a task may still
    // be stuck on a dead socket.
    runtime.shutdown_background();
    checked
}

async fn probe(config: &BrokerConfig, passed: &mut Vec<String>, runtime: &Runtime) -> Result<()> {
    // `check` installs no signal handler: a signal ends it at once.
    let (connection, index) =
        connect_first(&config.nodes, config.connect_timeout, &Stop::unarmed()).await?;
    let node = &config.nodes[index].uri;
    let broker = describe_broker(node);
    let alarm = Alarm::watch(&connection, runtime);
    passed.push(match config.nodes.len() {
        1 => format!(
            "reachable at {broker} as user {}",
            node.authority.userinfo.username
        ),
        all => format!(
            "reachable at {broker} as user {} (node {} of the {all} listed)",
            node.authority.userinfo.username,
            index + 1
        ),
    });
    let probe = Probe {
        connection: &connection,
        config,
        broker: &broker,
        user: &node.authority.userinfo.username,
        alarm: &alarm,
    };
    let checked = probe.exchange_and_publish(passed).await;
    // A broker that blocked us reads nothing, the close included.
    if alarm.reason().is_none() {
        let _ = timeout(CLOSE_TIMEOUT, connection.close(200, "checked".into())).await;
    }
    checked
}

/// What the exchange and publish checks share.
struct Probe<'a> {
    connection: &'a Connection,
    config: &'a BrokerConfig,
    broker: &'a str,
    user: &'a str,
    alarm: &'a Alarm,
}

impl Probe<'_> {
    async fn exchange_and_publish(&self, passed: &mut Vec<String>) -> Result<()> {
        let exchange = self.config.exchange.as_str();
        let mut channel = self.channel().await?;
        // Whether the exchange is missing and --declare-exchange would make it.
        let mut to_declare = false;
        if exchange.is_empty() {
            passed.push("the default exchange \"\", which always exists".into());
        } else {
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let declared = channel.exchange_declare(
                exchange.into(),
                lapin::ExchangeKind::Topic,
                passive,
                FieldTable::default(),
            );
            match self
                .bounded("the exchange's passive declare", declared)
                .await?
            {
                Ok(()) => passed.push(format!("exchange {exchange:?} exists")),
                Err(error) if reply_code(&error) == Some(NOT_FOUND) => {
                    let Some(kind) = self.config.declare_exchange else {
                        return Err(missing_exchange_error(exchange, self.broker));
                    };
                    passed.push(format!(
                        "exchange {exchange:?} does not exist: the run would declare it ({}, \
                         durable), which needs configure permission on it; check declared \
                         nothing",
                        format!("{kind:?}").to_lowercase()
                    ));
                    to_declare = true;
                    // The broker closed the channel over the 404.
                    channel = self.channel().await?;
                }
                Err(error) => return Err(self.failed(&error, "checking exchange")),
            }
        }
        passed.push(self.publish(&channel, to_declare).await?);
        Ok(())
    }

    /// The transacted publish, rolled back (see the module's comment).
    async fn publish(&self, channel: &Channel, to_declare: bool) -> Result<String> {
        let exchange = self.config.exchange.as_str();
        let selected = channel.tx_select();
        self.bounded("tx.select", selected)
            .await?
            .map_err(|error| self.failed(&error, "starting a channel transaction for"))?;
        let properties = BasicProperties::default()
            .with_app_id("outbox-poll".into())
            .with_message_id("outbox-poll check".into());
        let published = async {
            channel
                .basic_publish(
                    exchange.into(),
                    ROUTING_KEY.into(),
                    BasicPublishOptions::default(),
                    b"",
                    properties,
                )
                .await?;
            channel.tx_rollback().await
        };
        let deadline = Instant::now() + self.config.connect_timeout;
        let rolled_back = match self.alarm.until(deadline, published).await {
            Ok(rolled_back) => rolled_back,
            Err(Cutoff::Blocked) => {
                return Err(exit::outage(anyhow!(
                    "RabbitMQ at {} blocks publishers ({}): a resource alarm, until the broker \
                     has memory or disk space again; a run now would publish nothing",
                    self.broker,
                    self.alarm.reason().unwrap_or_default()
                )));
            }
            Err(Cutoff::Deadline) => return Err(self.late("the check's publish")),
        };
        let written = format!(
            "user {} may publish to exchange {exchange:?} (a publish in a channel transaction, \
             rolled back: nothing was delivered)",
            self.user
        );
        match rolled_back {
            Ok(()) => Ok(written),
            // RabbitMQ checks write permission before it looks the
            // exchange up: a 404 means the user may write there.
            Err(error) if to_declare && reply_code(&error) == Some(NOT_FOUND) => Ok(format!(
                "user {} may publish to exchange {exchange:?} once it is declared (a publish in \
                 a channel transaction, refused only because the exchange is not there yet)",
                self.user
            )),
            Err(error) if refusal(&error) == Some(classify::Cause::Config) => {
                Err(exit::config(anyhow!(
                    "RabbitMQ at {} refused user {} a publish to exchange {exchange:?}: {error}; \
                     give the user write permission on it (rabbitmqctl set_permissions -p VHOST \
                     {} CONFIGURE WRITE READ, with WRITE a pattern matching the exchange), and \
                     check that the exchange is not internal",
                    self.broker,
                    self.user,
                    self.user
                )))
            }
            // The broker closed the channel before tx.rollback could even
            // be issued (the publish is only written, never answered, and a
            // busy machine may be slow to go on): lapin keeps no reply code
            // for a channel once it is closed. The channel did nothing but
            // this publish and the connection is up, so the broker refused
            // the publish: to an exchange that exists (checked above), that
            // is about write permission, or an internal exchange.
            Err(error) if closed_by_the_broker(&error) && self.connection.status().connected() => {
                match to_declare {
                    false => Err(exit::config(anyhow!(
                        "RabbitMQ at {} refused user {} a publish to exchange {exchange:?} (it \
                         closed the channel); give the user write permission on it (rabbitmqctl \
                         set_permissions -p VHOST {} CONFIGURE WRITE READ, with WRITE a pattern \
                         matching the exchange), and check that the exchange is not internal",
                        self.broker,
                        self.user,
                        self.user
                    ))),
                    // Refused for a missing exchange or for permission: the
                    // code that would tell is gone.
                    true => Ok(format!(
                        "user {}: whether it may publish to exchange {exchange:?} shows once \
                         it is declared (RabbitMQ closed the channel before saying why)",
                        self.user
                    )),
                }
            }
            Err(error) => Err(self.failed(&error, "publishing (then rolling back) a check to")),
        }
    }

    /// A channel, within --connect-timeout.
    async fn channel(&self) -> Result<Channel> {
        let created = self.connection.create_channel();
        self.bounded("channel.open", created)
            .await?
            .map_err(|error| {
                exit::outage(anyhow!(
                    "opening a channel on RabbitMQ at {}: {error}",
                    self.broker
                ))
            })
    }

    /// Awaits `future` at most --connect-timeout: lapin has no timeouts.
    async fn bounded<F: Future>(&self, what: &str, future: F) -> Result<F::Output> {
        timeout(self.config.connect_timeout, future)
            .await
            .map_err(|_| self.late(what))
    }

    fn late(&self, what: &str) -> anyhow::Error {
        exit::outage(anyhow!(
            "RabbitMQ at {} did not answer {what} within {} (--connect-timeout)",
            self.broker,
            humantime::format_duration(self.config.connect_timeout)
        ))
    }

    /// The broker's refusal of `what` the exchange, as its reply code says.
    fn failed(&self, error: &lapin::Error, what: &str) -> anyhow::Error {
        let message = anyhow!(
            "{what} exchange {:?} on RabbitMQ at {}: {error}",
            self.config.exchange,
            self.broker
        );
        match refusal(error) {
            Some(classify::Cause::Config) => exit::config(message),
            _ => exit::outage(message),
        }
    }
}

/// Whether `error` says the channel had been closed when the call was
/// made: by the broker, since the probe never closes it itself.
fn closed_by_the_broker(error: &lapin::Error) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::InvalidChannelState(
            lapin::ChannelState::Closing | lapin::ChannelState::Closed,
            _
        )
    )
}
