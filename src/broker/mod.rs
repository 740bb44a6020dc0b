//! The RabbitMQ side of a run: one connection, opened only once a batch
//! has something to publish, a confirm-mode channel for each batch in
//! flight, and every outcome attributed to its event.
//!
//! `publisher` owns the connection and decides what a failure means;
//! `round` is one pipelined round of publishes and confirms; `message`
//! builds the AMQP message from a row, `headers` its headers from the
//! optional headers column; `probe` is `check`'s look at the broker, which
//! publishes nothing.

pub(crate) mod alarm;
pub(crate) mod headers;
pub mod message;
pub(crate) mod probe;
pub(crate) mod publisher;
pub(crate) mod round;

use anyhow::{Result, anyhow};

use crate::broker::publisher::{BrokerConfig, Outcome, Publisher, Sent};
use crate::guard::stop::Stop;
use crate::sql::outbox::Event;

/// The broker connection of a run, opened on the first batch that has
/// something to publish and reused by the rest of a drain: a run with
/// nothing due never connects.
pub(crate) struct Broker {
    config: BrokerConfig,
    publisher: Option<Publisher>,
    /// A signal ends the connect at once.
    stop: Stop,
    /// The broker itself failed the last batch: a send that could not
    /// connect or was refused, or an outage. A run over many outboxes
    /// stops there, rather than fail every outbox for the same reason.
    failed: bool,
}

impl Broker {
    pub(crate) fn new(config: BrokerConfig, stop: Stop) -> Self {
        Broker {
            config,
            publisher: None,
            stop,
            failed: false,
        }
    }

    /// Hands a batch to the broker, connecting first if this is the run's
    /// first batch. --confirm-timeout counts from here.
    pub(crate) fn send(&mut self, events: &[Event], ordered: bool) -> Result<Sent> {
        let publisher = match self.publisher.take() {
            Some(publisher) => publisher,
            None => {
                Publisher::connect(&self.config, &self.stop).inspect_err(|_| self.failed = true)?
            }
        };
        let sent = self.publisher.insert(publisher).send(events, ordered);
        self.failed = sent.is_err();
        sent
    }

    /// Whether the broker itself failed the last batch (see `failed`).
    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    /// What the broker said about a batch `send` handed it. A batch is sent
    /// only on a connected publisher, which stays until `close` (or a
    /// follow's `disconnect`, never with a batch in flight); without one
    /// nothing could have been confirmed.
    pub(crate) fn outcome(&mut self, sent: Sent, events: &[Event]) -> Outcome {
        let outcome = match self.publisher.as_mut() {
            Some(publisher) => publisher.outcome(sent, events),
            None => Outcome {
                outage: Some(anyhow!("no broker connection to finish the batch on")),
                ..Outcome::default()
            },
        };
        self.failed |= outcome.outage.is_some();
        outcome
    }

    pub(crate) fn close(mut self) {
        self.disconnect();
    }

    /// Whether a connection is open.
    pub(crate) fn is_connected(&self) -> bool {
        self.publisher.is_some()
    }

    /// Closes the connection, if one is open; the next `send` connects
    /// again. A follow lets go of the broker while nothing is due.
    pub(crate) fn disconnect(&mut self) {
        if let Some(publisher) = self.publisher.take() {
            publisher.close();
        }
    }
}
