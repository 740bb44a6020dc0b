//! One archived row, read back as the event the relay sent: its payload's
//! exact bytes and type, its columns, its created_at for replay's filters.
//! A line that cannot be an event says why (the caller adds FILE:LINE).

use std::io;

use base64::Engine as _;
use jiff::Timestamp;
use serde_json::{Map, Value};

use crate::sql::columns::Payload;
use crate::sql::outbox::Event;

/// A timestamptz as PostgreSQL prints it in JSON: a moment, or one of its
/// infinities (which sort before and after every moment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Time {
    MinusInfinity,
    At(Timestamp),
    Infinity,
}

impl Time {
    /// `2026-12-04T20:41:26.123456+00:00`, `infinity`, `-infinity`.
    pub(crate) fn parse(text: &str) -> Result<Time, String> {
        match text {
            "infinity" => Ok(Time::Infinity),
            "-infinity" => Ok(Time::MinusInfinity),
            _ => text
                .parse::<Timestamp>()
                .map(Time::At)
                .map_err(|error| format!("{text:?} is not an RFC 3339 timestamp: {error}")),
        }
    }

    /// Seconds since the epoch, infinite for the infinities.
    fn seconds(self) -> f64 {
        match self {
            Time::MinusInfinity => f64::NEG_INFINITY,
            Time::At(at) => at.as_duration().as_secs_f64(),
            Time::Infinity => f64::INFINITY,
        }
    }
}

/// An archived row.
pub(crate) struct Record {
    /// The event as the relay read it, headers aside.
    event: Event,
    /// The headers column's value, if any.
    headers: Option<Value>,
    pub(crate) created_at: Option<Time>,
    expires_at: Option<Time>,
}

impl Record {
    /// Reads one archive line; `id` identifies the event in the replay's
    /// outcomes (its line number: an archive may hold a row twice).
    pub(crate) fn parse(line: &str, id: i64) -> Result<Record, String> {
        let row = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(row)) => row,
            Ok(_) => return Err("not a JSON object".into()),
            Err(error) => return Err(format!("not JSON: {error}")),
        };
        let event_id = match row.get("event_id") {
            Some(Value::String(id)) => id.clone(),
            // A bigint or numeric event_id (an adopted table's).
            Some(Value::Number(id)) => id.to_string(),
            _ => return Err("no event_id (a string)".into()),
        };
        let event_type = string(&row, "event_type")?.ok_or("no event_type (a string)")?;
        let (payload, payload_type) = payload(&row)?;
        let time = |key: &str| match row.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Time::parse(text)
                .map(Some)
                .map_err(|error| format!("{key}: {error}")),
            Some(_) => Err(format!("{key} is not a timestamp string")),
        };
        let priority = match row.get("priority") {
            None | Some(Value::Null) => None,
            Some(Value::Number(number)) => Some(
                number
                    .as_i64()
                    .and_then(|priority| i32::try_from(priority).ok())
                    .ok_or("priority is not a smallint")?,
            ),
            Some(_) => return Err("priority is not a number".into()),
        };
        let created_at = time("created_at")?;
        let event = Event {
            id,
            event_id,
            event_type,
            payload,
            payload_type,
            created_at: created_at.map(Time::seconds),
            routing_key: string(&row, "routing_key")?,
            ordering_key: string(&row, "ordering_key")?,
            exchange: string(&row, "exchange")?,
            content_type: string(&row, "content_type")?,
            content_encoding: string(&row, "content_encoding")?,
            correlation_id: string(&row, "correlation_id")?,
            priority,
            ..Event::default()
        };
        Ok(Record {
            event,
            headers: row.get("headers").filter(|value| !value.is_null()).cloned(),
            created_at,
            expires_at: time("expires_at")?,
        })
    }

    pub(crate) fn event_id(&self) -> &str {
        &self.event.event_id
    }

    pub(crate) fn event_type(&self) -> &str {
        &self.event.event_type
    }

    /// The event to publish again, `now`: with the header `header` =
    /// `value` beside the row's own headers (a headers value that is not
    /// an object is left as it is: the event fails, as it would have in
    /// the relay), and the expiration left from now.
    pub(crate) fn into_event(self, header: &str, value: &str, now: Timestamp) -> Event {
        let headers = match self.headers {
            Some(Value::Object(mut members)) => {
                members.insert(header.into(), value.into());
                Value::Object(members)
            }
            Some(other) => other,
            None => serde_json::json!({ header: value }),
        };
        let expires_in = self
            .expires_at
            .map(|expires| expires.seconds() - Time::At(now).seconds());
        Event {
            headers: Some(headers.to_string()),
            expires_in,
            ..self.event
        }
    }
}

/// The member `key` as a string: None when absent or null.
fn string(row: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match row.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(format!("{key} is not a string")),
    }
}

/// The payload's bytes and type, by the key that holds it (see the
/// module `archive`).
fn payload(row: &Map<String, Value>) -> Result<(Vec<u8>, Payload), String> {
    if let Some(encoded) = string(row, "payload_base64")? {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_bytes())
            .map_err(|error| format!("payload_base64 is not base64: {error}"))?;
        return Ok((bytes, Payload::Bytea));
    }
    if let Some(text) = string(row, "payload_text")? {
        return Ok((text.into_bytes(), Payload::Text));
    }
    if let Some(text) = string(row, "payload_json")? {
        return Ok((text.into_bytes(), Payload::Json));
    }
    match row.get("payload") {
        Some(value) => Ok((jsonb_text(value), Payload::Jsonb)),
        None => Err("no payload (payload, payload_json, payload_text or payload_base64)".into()),
    }
}

/// A jsonb value as PostgreSQL prints it, the body the relay sent: `, `
/// between members and elements, `: ` after keys, the keys in the order
/// read, numbers as written (serde_json keeps their text), strings escaped
/// as PostgreSQL escapes them (which is serde_json's escaping too).
pub(crate) fn jsonb_text(value: &Value) -> Vec<u8> {
    let mut text = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut text, JsonbFormatter);
    // Writing a Value to memory cannot fail.
    serde::Serialize::serialize(value, &mut serializer).unwrap_or_default();
    text
}

/// serde_json's compact output with jsonb's spacing.
struct JsonbFormatter;

impl serde_json::ser::Formatter for JsonbFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            return Ok(());
        }
        writer.write_all(b", ")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            return Ok(());
        }
        writer.write_all(b", ")
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jsonb_value_prints_as_postgresql_prints_it() {
        let text = r#"{"a": [1, 2.50, {"b": null}], "c": "\"q\"\n\u001f é", "d": {}, "e": []}"#;
        let value: Value = serde_json::from_str(text).unwrap();
        assert_eq!(String::from_utf8(jsonb_text(&value)).unwrap(), text);
    }

    #[test]
    fn the_payloads_key_gives_its_type_and_bytes() {
        let parse = |line: &str| Record::parse(line, 1).unwrap().event;
        let base = r#""event_id": "e", "event_type": "t""#;
        let event = parse(&format!(r#"{{{base}, "payload_base64": "AP8="}}"#));
        assert_eq!(
            (event.payload, event.payload_type),
            (vec![0, 255], Payload::Bytea)
        );
        let event = parse(&format!(r#"{{{base}, "payload_text": "hi"}}"#));
        assert_eq!(
            (event.payload, event.payload_type),
            (b"hi".to_vec(), Payload::Text)
        );
        let event = parse(&format!(r#"{{{base}, "payload_json": "{{ \"a\":1 }}"}}"#));
        assert_eq!(event.payload, b"{ \"a\":1 }".to_vec());
        let event = parse(&format!(r#"{{{base}, "payload": {{"a":1}}}}"#));
        assert_eq!(event.payload, b"{\"a\": 1}".to_vec());
    }

    #[test]
    fn a_line_that_cannot_be_an_event_says_why() {
        let why = |line: &str| Record::parse(line, 1).err().unwrap();
        assert_eq!(why("[1]"), "not a JSON object");
        assert!(why("{").starts_with("not JSON"));
        assert_eq!(
            why(r#"{"event_type": "t", "payload": 1}"#),
            "no event_id (a string)"
        );
        let why = why(r#"{"event_id": "e", "event_type": "t", "payload": 1, "created_at": "x"}"#);
        assert!(why.starts_with("created_at: \"x\" is not"), "{why}");
    }

    #[test]
    fn infinities_sort_around_every_moment() {
        let at = Time::parse("2026-12-04T20:41:26.123456+01:00").unwrap();
        assert!(Time::parse("-infinity").unwrap() < at);
        assert!(at < Time::parse("infinity").unwrap());
        assert_eq!(at, Time::parse("2026-12-04T19:41:26.123456Z").unwrap());
    }
}
