//! A minimal consumer for trying outbox-poll by hand (scripts/demo.sh uses it).
//!
//! `peek bind EXCHANGE QUEUE` declares a durable topic exchange and a queue
//! bound to every routing key; `peek take QUEUE` takes every message off the
//! queue and prints one line each: message_id, type and body.

use std::io::Write;

use lapin::options::{
    BasicAckOptions, BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@localhost:5672/%2f".into());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let connection = Connection::connect(&url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["bind", exchange, queue] => bind(&channel, exchange, queue).await?,
            ["take", queue] => take(&channel, queue).await?,
            _ => anyhow::bail!("usage: peek bind EXCHANGE QUEUE | peek take QUEUE"),
        }
        connection.close(200, "bye".into()).await?;
        Ok(())
    })
}

async fn bind(channel: &Channel, exchange: &str, queue: &str) -> anyhow::Result<()> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.into(), durable, FieldTable::default())
        .await?;
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    println!(
        "exchange {exchange} (topic, durable) and queue {queue} (durable) declared; \
         {queue} is bound to every routing key (#)"
    );
    Ok(())
}

/// Each message is acknowledged only once its line is written: a reader
/// that stops early (`| head`) leaves the rest, that one included, queued.
async fn take(channel: &Channel, queue: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let options = BasicGetOptions { no_ack: false };
    while let Some(message) = channel.basic_get(queue.into(), options).await? {
        let properties = &message.delivery.properties;
        let text = |value: &Option<lapin::types::ShortString>| {
            value.as_ref().map_or_else(String::new, ToString::to_string)
        };
        let line = writeln!(
            out,
            "{}  {}  {}",
            text(properties.message_id()),
            text(properties.kind()),
            String::from_utf8_lossy(&message.delivery.data)
        );
        match line {
            Ok(()) => {
                message.delivery.ack(BasicAckOptions::default()).await?;
            }
            Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}
