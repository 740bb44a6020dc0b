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

/// The routing key and the message id, or why the event cannot be sent at
/// all (a column that could not be read, a name too long for AMQP): the
/// event's own failure, counted against it alone.
pub fn addressed(event: &Event) -> Result<(ShortString, ShortString), String> {
    if let Some(reason) = &event.unreadable {
        return Err(reason.clone());
    }
    short_strings(event)
        .ok_or_else(|| "event_type or event_id is longer than AMQP's 255 bytes".into())
}

/// The AMQP timestamp: created_at in whole seconds since the epoch. AMQP's
/// is unsigned, so a created_at before 1970, an infinite one or a NULL
/// has none: the property is omitted, and the event sent all the same.
pub fn timestamp(event: &Event) -> Option<u64> {
    event
        .created_at
        .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
        .map(|seconds| seconds as u64)
}

/// The message properties the contract fixes. `kind` is the event type,
/// already checked to fit a short string.
pub fn properties(event: &Event, kind: ShortString, message_id: ShortString) -> BasicProperties {
    let properties = BasicProperties::default()
        .with_message_id(message_id)
        .with_type(kind)
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_app_id("outbox-poll".into());
    match timestamp(event) {
        Some(seconds) => properties.with_timestamp(seconds),
        None => properties,
    }
}
