//! The broker side: the tests' own AMQP client, a message as a consumer
//! sees it, and a fixture's queue and further exchanges.

use std::collections::HashMap;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::runtime::Runtime;

use super::fixture::Fixture;
use super::servers::amqp_url;

/// A message as a consumer sees it.
#[derive(Debug, Clone)]
pub struct Message {
    pub message_id: String,
    pub kind: Option<String>,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub correlation_id: Option<String>,
    pub priority: Option<u8>,
    pub expiration: Option<String>,
    pub delivery_mode: Option<u8>,
    pub timestamp: Option<u64>,
    pub app_id: Option<String>,
    pub headers: Option<FieldTable>,
    pub routing_key: String,
    pub exchange: String,
    pub body: Vec<u8>,
}

impl Message {
    /// The header `name`, if the message has it.
    pub fn header(&self, name: &str) -> Option<&AMQPValue> {
        self.headers.as_ref()?.inner().get(name)
    }

    /// The header `name` as text, if it is a string.
    pub fn header_text(&self, name: &str) -> Option<String> {
        match self.header(name)? {
            AMQPValue::LongString(text) => Some(text.to_string()),
            _ => None,
        }
    }
}

/// The tests' own AMQP client.
pub struct Amqp {
    runtime: Runtime,
    connection: Connection,
    channel: Channel,
}

impl Amqp {
    pub fn connect() -> Amqp {
        Amqp::connect_to(&amqp_url())
    }

    /// A client of another broker (a private node, say).
    pub fn connect_to(url: &str) -> Amqp {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (connection, channel) = runtime.block_on(async {
            let connection = Connection::connect(url, ConnectionProperties::default())
                .await
                .expect("connecting to RabbitMQ");
            let channel = connection.create_channel().await.unwrap();
            (connection, channel)
        });
        Amqp {
            runtime,
            connection,
            channel,
        }
    }

    /// A topic exchange and a durable queue bound to it with `binding`.
    pub fn declare(&self, exchange: &str, queue: &str, binding: &str) {
        self.declare_with(exchange, queue, binding, FieldTable::default());
    }

    /// Like `declare`, with queue arguments (x-max-length and the like).
    pub fn declare_with(&self, exchange: &str, queue: &str, binding: &str, arguments: FieldTable) {
        let options = ExchangeDeclareOptions::default();
        self.runtime
            .block_on(declare_topic(&self.channel, exchange, options))
            .unwrap();
        self.declare_queue(queue, arguments);
        self.bind(queue, exchange, binding);
    }

    /// An internal exchange: clients may not publish to it (the broker
    /// refuses with ACCESS_REFUSED), only bind it to others.
    pub fn declare_internal(&self, exchange: &str) {
        let options = ExchangeDeclareOptions {
            internal: true,
            ..Default::default()
        };
        self.runtime
            .block_on(declare_topic(&self.channel, exchange, options))
            .unwrap();
    }

    pub fn delete(&self, exchange: &str, queue: &str) {
        self.runtime.block_on(async {
            let _ = self
                .channel
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await;
            let _ = self
                .channel
                .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
                .await;
        });
    }

    /// A durable queue with arguments (x-max-length and the like), unbound.
    pub fn declare_queue(&self, queue: &str, arguments: FieldTable) {
        self.runtime.block_on(async {
            self.channel
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    arguments,
                )
                .await
                .unwrap();
        });
    }

    pub fn bind(&self, queue: &str, exchange: &str, binding: &str) {
        self.runtime.block_on(async {
            self.channel
                .queue_bind(
                    queue.into(),
                    exchange.into(),
                    binding.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        });
    }

    pub fn unbind(&self, queue: &str, exchange: &str, binding: &str) {
        self.runtime.block_on(async {
            self.channel
                .queue_unbind(
                    queue.into(),
                    exchange.into(),
                    binding.into(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        });
    }

    pub fn delete_queue(&self, queue: &str) {
        self.runtime.block_on(async {
            let _ = self
                .channel
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await;
        });
    }

    pub fn delete_exchange(&self, exchange: &str) {
        self.runtime.block_on(async {
            self.channel
                .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
                .await
                .unwrap();
        });
    }

    /// Checks with a passive declare, on a channel of its own: a missing
    /// exchange makes the broker close the channel it was asked on.
    pub fn exchange_exists(&self, exchange: &str) -> bool {
        self.runtime.block_on(async {
            let channel = self.connection.create_channel().await.unwrap();
            let options = ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            };
            declare_topic(&channel, exchange, options).await.is_ok()
        })
    }

    /// Takes every message off `queue` (acknowledging it).
    pub fn take_all(&self, queue: &str) -> Vec<Message> {
        self.runtime.block_on(async {
            let mut messages = Vec::new();
            while let Some(message) = self
                .channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get")
            {
                let delivery = message.delivery;
                let properties = &delivery.properties;
                let text = |value: &Option<lapin::types::ShortString>| {
                    value.as_ref().map(|v| v.to_string())
                };
                messages.push(Message {
                    message_id: text(properties.message_id()).unwrap_or_default(),
                    kind: text(properties.kind()),
                    content_type: text(properties.content_type()),
                    content_encoding: text(properties.content_encoding()),
                    correlation_id: text(properties.correlation_id()),
                    priority: *properties.priority(),
                    expiration: text(properties.expiration()),
                    delivery_mode: *properties.delivery_mode(),
                    timestamp: *properties.timestamp(),
                    app_id: text(properties.app_id()),
                    headers: properties.headers().clone(),
                    routing_key: delivery.routing_key.to_string(),
                    exchange: delivery.exchange.to_string(),
                    body: delivery.data,
                });
            }
            messages
        })
    }

    pub fn queue_length(&self, queue: &str) -> u32 {
        self.runtime.block_on(async {
            self.channel
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap()
                .message_count()
        })
    }
}

impl Drop for Amqp {
    fn drop(&mut self) {
        let _ = self
            .runtime
            .block_on(self.connection.close(200, "bye".into()));
    }
}

/// Declares a topic exchange with `options` on `channel`.
async fn declare_topic(
    channel: &Channel,
    exchange: &str,
    options: ExchangeDeclareOptions,
) -> lapin::Result<()> {
    let arguments = FieldTable::default();
    channel
        .exchange_declare(exchange.into(), ExchangeKind::Topic, options, arguments)
        .await
}

impl Fixture {
    /// Binds the fixture's queue with `binding` instead of `#`: events of
    /// other types become unroutable.
    pub fn route_only(&self, binding: &str) {
        self.amqp.unbind(&self.queue, &self.exchange, "#");
        self.amqp.bind(&self.queue, &self.exchange, binding);
    }

    /// Another topic exchange of this test, `<exchange>.<suffix>`, with a
    /// queue of the same name bound to every routing key; both deleted
    /// with the fixture. Returns the name.
    pub fn another_exchange(&mut self, suffix: &str) -> String {
        let name = format!("{}.{suffix}", self.exchange);
        self.amqp.declare(&name, &name, "#");
        self.others.push(name.clone());
        name
    }

    /// Every message now in the fixture's queue, taken off it.
    pub fn messages(&self) -> Vec<Message> {
        self.amqp.take_all(&self.queue)
    }

    /// How often each event id arrived.
    pub fn arrivals(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for message in self.messages() {
            *counts.entry(message.message_id).or_insert(0) += 1;
        }
        counts
    }
}
