//! The AMQP message an event becomes: its exchange and routing key, its
//! properties (docs/src/messages.md, and what the optional
//! columns add or override) and its body, the payload's bytes as read.

use lapin::BasicProperties;
use lapin::types::ShortString;

use crate::broker::headers::Headers;
use crate::broker::headers::TRACEPARENT;
use crate::sql::outbox::Event;

/// The header that carries ordering_key, for consumers that shard by key
/// (RabbitMQ's consistent-hash exchange can hash on a header).
pub(crate) const ORDERING_KEY_HEADER: &str = "x-ordering-key";

/// What a content header frame holds besides the headers table, at most:
/// the frame's own header and end (8 bytes), class, weight, body size and
/// property flags (14), six short strings of up to 256 bytes each
/// (message_id, type, content_type, content_encoding, correlation_id,
/// expiration), delivery_mode and priority (1 each), timestamp (8) and
/// app_id (12).
const OTHER_PROPERTIES: usize = 8 + 14 + 6 * 256 + 1 + 1 + 8 + 12;

/// An event ready to publish.
pub struct Outgoing {
    /// The row's exchange column, None for the run's --exchange.
    pub exchange: Option<ShortString>,
    pub routing_key: ShortString,
    pub properties: BasicProperties,
}

/// The message `event` becomes, or why it cannot be sent (the event's own
/// failure: an attempt is counted): a column that could not be read, a
/// name too long for AMQP, headers that are not an object, a priority
/// outside 0 to 255. `frame_max` is
/// the connection's: a
/// content header frame larger than it would make the broker close the
/// whole connection, an outage for every event of the batch, again at
/// every run.
pub fn outgoing(event: &Event, frame_max: u32) -> Result<Outgoing, String> {
    if let Some(reason) = &event.unreadable {
        return Err(reason.clone());
    }
    let short = |value: &str, column: &str| {
        ShortString::try_new(value).map_err(|_| format!("{column} is longer than AMQP's 255 bytes"))
    };
    let routing_key = match &event.routing_key {
        Some(routing_key) => short(routing_key, "routing_key")?,
        None => short(&event.event_type, "event_type")?,
    };
    let exchange = match &event.exchange {
        Some(exchange) => Some(short(exchange, "exchange")?),
        None => None,
    };
    let content_type = match &event.content_type {
        Some(content_type) => short(content_type, "content_type")?,
        None => event.payload_type.content_type().into(),
    };
    let properties = BasicProperties::default()
        .with_message_id(short(&event.event_id, "event_id")?)
        .with_type(short(&event.event_type, "event_type")?)
        .with_content_type(content_type)
        .with_delivery_mode(2)
        .with_app_id("outbox-poll".into());
    let properties = match &event.content_encoding {
        Some(encoding) => properties.with_content_encoding(short(encoding, "content_encoding")?),
        None => properties,
    };
    let properties = match &event.correlation_id {
        Some(id) => properties.with_correlation_id(short(id, "correlation_id")?),
        None => properties,
    };
    let properties = match event.priority {
        Some(priority) => properties.with_priority(
            u8::try_from(priority)
                .map_err(|_| format!("priority {priority} is outside AMQP's 0 to 255"))?,
        ),
        None => properties,
    };
    let properties = match expiration(event) {
        Some(milliseconds) => properties.with_expiration(milliseconds.to_string().into()),
        None => properties,
    };
    let properties = match timestamp(event) {
        Some(seconds) => properties.with_timestamp(seconds),
        None => properties,
    };
    let properties = match headers(event)? {
        Some(headers) => {
            let room = (frame_max as usize).saturating_sub(OTHER_PROPERTIES);
            if headers.bytes > room {
                return Err(format!(
                    "the headers take {} bytes, more than the {room} that fit in the \
                     broker's frame (frame_max {frame_max})",
                    headers.bytes
                ));
            }
            properties.with_headers(headers.table)
        }
        None => properties,
    };
    Ok(Outgoing {
        exchange,
        routing_key,
        properties,
    })
}

/// The AMQP expiration: the whole milliseconds left before expires_at,
/// rounded up (a message is never dropped before its row expires), at
/// least 1 (RabbitMQ reads 0 as "deliver now or drop"); none for an
/// infinite or absent expires_at. An expired event never gets here.
fn expiration(event: &Event) -> Option<u64> {
    let seconds = event.expires_in.filter(|seconds| seconds.is_finite())?;
    // A float past u64's range saturates: a date centuries ahead.
    Some(((seconds * 1000.0).ceil() as u64).max(1))
}

/// The AMQP timestamp: created_at in whole seconds since the epoch. AMQP's
/// is unsigned, so a created_at before 1970, an infinite one or a NULL
/// has none: the property is omitted, and the event sent all the same.
pub(crate) fn timestamp(event: &Event) -> Option<u64> {
    event
        .created_at
        .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
        // Truncated to whole seconds: never after created_at.
        .map(|seconds| seconds as u64)
}

/// The headers column's members, x-ordering-key when the event has a key
/// (it replaces a member of that name), and the relay's traceparent when
/// it has one (only where the column has none); None when there are none.
fn headers(event: &Event) -> Result<Option<Headers>, String> {
    let mut headers = match &event.headers {
        Some(json) => Headers::from_json(json)?,
        None if event.ordering_key.is_none() && event.traceparent.is_none() => return Ok(None),
        None => Headers::default(),
    };
    if let Some(key) = &event.ordering_key {
        headers.insert_string(ORDERING_KEY_HEADER, key);
    }
    if let Some(traceparent) = &event.traceparent {
        headers.insert_string(TRACEPARENT, traceparent);
    }
    Ok(Some(headers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::columns::Payload;
    use lapin::types::AMQPValue;

    const FRAME_MAX: u32 = 131_072;

    fn event() -> Event {
        Event {
            event_id: "e-1".into(),
            event_type: "order.created".into(),
            payload: b"{}".to_vec(),
            ..Event::default()
        }
    }

    #[test]
    fn the_default_content_type_is_the_payload_types_and_the_column_overrides_it() {
        for (payload_type, expected) in [
            (Payload::Jsonb, "application/json"),
            (Payload::Json, "application/json"),
            (Payload::Text, "text/plain; charset=utf-8"),
            (Payload::Bytea, "application/octet-stream"),
        ] {
            let event = Event {
                payload_type,
                ..event()
            };
            let message = outgoing(&event, FRAME_MAX).unwrap();
            let content_type = message.properties.content_type().clone().unwrap();
            assert_eq!(content_type.as_str(), expected, "{payload_type:?}");
        }
        let event = Event {
            payload_type: Payload::Bytea,
            content_type: Some("application/x-protobuf".into()),
            ..event()
        };
        let message = outgoing(&event, FRAME_MAX).unwrap();
        let content_type = message.properties.content_type().clone().unwrap();
        assert_eq!(content_type.as_str(), "application/x-protobuf");
    }

    #[test]
    fn a_priority_outside_0_to_255_fails_the_event() {
        for (priority, ok) in [(0, true), (255, true), (256, false), (-1, false)] {
            let event = Event {
                priority: Some(priority),
                ..event()
            };
            let message = outgoing(&event, FRAME_MAX);
            assert_eq!(message.is_ok(), ok, "{priority}");
        }
    }

    #[test]
    fn the_expiration_is_the_milliseconds_left_rounded_up_and_none_for_infinity() {
        let expiring = |seconds| Event {
            expires_in: Some(seconds),
            ..event()
        };
        assert_eq!(expiration(&expiring(1.5)), Some(1500));
        assert_eq!(expiration(&expiring(0.0001)), Some(1));
        assert_eq!(expiration(&expiring(f64::INFINITY)), None);
        assert_eq!(expiration(&event()), None);
    }

    #[test]
    fn without_optional_columns_the_routing_key_is_the_type_and_no_headers() {
        let message = outgoing(&event(), FRAME_MAX).unwrap();
        assert_eq!(message.routing_key.as_str(), "order.created");
        assert_eq!(message.properties.headers(), &None);
    }

    #[test]
    fn routing_key_overrides_the_routing_key_and_leaves_the_type() {
        let event = Event {
            routing_key: Some("eu.orders".into()),
            ..event()
        };
        let message = outgoing(&event, FRAME_MAX).unwrap();
        assert_eq!(message.routing_key.as_str(), "eu.orders");
        let kind = message.properties.kind().as_ref().map(ShortString::as_str);
        assert_eq!(kind, Some("order.created"));
    }

    #[test]
    fn the_ordering_key_column_wins_over_a_header_of_its_name() {
        let event = Event {
            headers: Some(r#"{"x-ordering-key": "forged", "a": 1}"#.into()),
            ordering_key: Some("order-7".into()),
            ..event()
        };
        let message = outgoing(&event, FRAME_MAX).unwrap();
        let headers = message.properties.headers().clone().unwrap();
        let key = &headers.inner()[ORDERING_KEY_HEADER];
        assert_eq!(key, &AMQPValue::LongString("order-7".into()));
        assert_eq!(headers.inner()["a"], AMQPValue::LongLongInt(1));
    }

    #[test]
    fn headers_larger_than_a_frame_fail_the_event() {
        let event = Event {
            headers: Some(format!(r#"{{"big": "{}"}}"#, "x".repeat(5000))),
            ..event()
        };
        assert!(outgoing(&event, 8192).is_ok());
        let error = outgoing(&event, 4096).err().unwrap();
        assert!(error.contains("frame_max 4096"), "{error}");
    }

    #[test]
    fn a_name_too_long_for_amqp_says_which_column() {
        let event = Event {
            routing_key: Some("r".repeat(256)),
            ..event()
        };
        let error = outgoing(&event, FRAME_MAX).err().unwrap();
        assert_eq!(error, "routing_key is longer than AMQP's 255 bytes");
    }
}
