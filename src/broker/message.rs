//! The AMQP message an event becomes: its routing key, its properties
//! (the contract's "Message properties") and its body, the payload's bytes
//! exactly as PostgreSQL prints the jsonb.

use lapin::BasicProperties;
use lapin::types::ShortString;

use crate::sql::outbox::Event;

/// The routing key and the message id as AMQP short strings, or None when
/// either is longer than AMQP's 255 bytes: such an event cannot be sent.
pub fn short_strings(event: &Event) -> Option<(ShortString, ShortString)> {
    let routing_key = ShortString::try_new(event.event_type.as_str()).ok()?;
    let message_id = ShortString::try_new(event.event_id.as_str()).ok()?;
    Some((routing_key, message_id))
}

/// The message properties the contract fixes. `kind` is the event type,
/// already checked to fit a short string.
pub fn properties(event: &Event, kind: ShortString, message_id: ShortString) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(message_id)
        .with_type(kind)
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_timestamp(event.created_at.max(0) as u64)
        .with_app_id("outbox-poll".into())
}
