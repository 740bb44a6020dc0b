//! The `headers` column as AMQP headers: each member of the JSON object
//! becomes a header of the matching AMQP field type, as RabbitMQ reads
//! them. A value the broker cannot carry is the event's own failure, said
//! in words (the reason becomes its last_error).
//!
//! | JSON | AMQP |
//! | --- | --- |
//! | string | long string (`S`) |
//! | integer (no fraction, no exponent) | signed 64-bit integer (`l`) |
//! | other number | double (`d`) |
//! | true, false | boolean (`t`) |
//! | null | void (`V`) |
//! | array | field array (`A`) |
//! | object | field table (`F`) |
//!
//! W3C `traceparent` and `tracestate` are strings, and pass through as
//! such, unchanged.

use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use serde_json::{Number, Value};

/// The W3C trace context header, in the headers column and on the wire.
pub(crate) const TRACEPARENT: &str = "traceparent";

/// A header table and the bytes it takes on the wire (its length prefix
/// included), to check against the broker's frame size before sending.
pub(crate) struct Headers {
    pub(crate) table: FieldTable,
    pub(crate) bytes: usize,
}

/// No headers yet: an empty table still has its length prefix.
impl Default for Headers {
    fn default() -> Self {
        Headers {
            table: FieldTable::default(),
            bytes: 4,
        }
    }
}

impl Headers {
    /// Reads the headers column (jsonb as PostgreSQL prints it).
    pub(crate) fn from_json(text: &str) -> Result<Self, String> {
        let value: Value = serde_json::from_str(text)
            .map_err(|error| format!("the headers column is not valid JSON: {error}"))?;
        let Value::Object(members) = value else {
            return Err(format!(
                "the headers column must be a JSON object, not {}",
                kind(&value)
            ));
        };
        let (table, bytes) = table(&members, "")?;
        Ok(Headers { table, bytes })
    }

    /// Adds (or replaces) a string header. A replaced header's bytes stay
    /// counted: the size is then an upper bound, which is safe.
    pub(crate) fn insert_string(&mut self, name: &str, value: &str) {
        self.bytes += entry_bytes(name, 1 + 4 + value.len());
        self.table.insert(
            ShortString::from(name),
            AMQPValue::LongString(LongString::from(value)),
        );
    }
}

/// A name and a value of `value_bytes` (type tag included) in a table.
fn entry_bytes(name: &str, value_bytes: usize) -> usize {
    1 + name.len() + value_bytes
}

/// An object as a field table; `path` names it in errors ("" at the top).
fn table(
    members: &serde_json::Map<String, Value>,
    path: &str,
) -> Result<(FieldTable, usize), String> {
    let mut table = FieldTable::default();
    let mut bytes = 4;
    for (name, value) in members {
        let inner = format!("{path}{}{name}", if path.is_empty() { "" } else { "." });
        let key = ShortString::try_new(name.as_str())
            .map_err(|_| format!("header name {inner:?} is longer than AMQP's 255 bytes"))?;
        let (field, field_bytes) = field(value, &inner)?;
        bytes += entry_bytes(name, field_bytes);
        table.insert(key, field);
    }
    Ok((table, bytes))
}

/// One JSON value as an AMQP field, with its size (type tag included).
fn field(value: &Value, path: &str) -> Result<(AMQPValue, usize), String> {
    Ok(match value {
        Value::String(text) => (
            AMQPValue::LongString(LongString::from(text.as_str())),
            1 + 4 + text.len(),
        ),
        Value::Number(number) => (self::number(number, path)?, 1 + 8),
        Value::Bool(flag) => (AMQPValue::Boolean(*flag), 1 + 1),
        Value::Null => (AMQPValue::Void, 1),
        Value::Array(items) => {
            let mut array = FieldArray::default();
            let mut bytes = 1 + 4;
            for (index, item) in items.iter().enumerate() {
                let (field, field_bytes) = field(item, &format!("{path}[{index}]"))?;
                bytes += field_bytes;
                array.push(field);
            }
            (AMQPValue::FieldArray(array), bytes)
        }
        Value::Object(members) => {
            let (table, bytes) = table(members, path)?;
            (AMQPValue::FieldTable(table), 1 + bytes)
        }
    })
}

/// serde_json keeps the number as PostgreSQL printed it (the
/// arbitrary_precision feature), and jsonb prints a number with a
/// fraction only where it has one: digits alone are an integer.
fn number(number: &Number, path: &str) -> Result<AMQPValue, String> {
    if let Some(integer) = number.as_i64() {
        return Ok(AMQPValue::LongLongInt(integer));
    }
    match number.as_f64() {
        Some(float) if number.is_f64() => Ok(AMQPValue::Double(float)),
        _ => Err(format!(
            "header {path:?}: the integer {number} does not fit AMQP's signed 64-bit integer"
        )),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(text: &str, name: &str) -> AMQPValue {
        let headers = Headers::from_json(text).unwrap();
        headers.table.inner()[name].clone()
    }

    #[test]
    fn each_json_type_has_its_amqp_type() {
        let json = r#"{"s": "x", "i": -42, "f": 1.5, "t": true, "n": null,
                      "a": [1, "y"], "o": {"k": false}}"#;
        assert_eq!(header(json, "s"), AMQPValue::LongString("x".into()));
        assert_eq!(header(json, "i"), AMQPValue::LongLongInt(-42));
        assert_eq!(header(json, "f"), AMQPValue::Double(1.5));
        assert_eq!(header(json, "t"), AMQPValue::Boolean(true));
        assert_eq!(header(json, "n"), AMQPValue::Void);
        let array = vec![AMQPValue::LongLongInt(1), AMQPValue::LongString("y".into())];
        assert_eq!(header(json, "a"), AMQPValue::FieldArray(array.into()));
        let mut inner = FieldTable::default();
        inner.insert("k".into(), AMQPValue::Boolean(false));
        assert_eq!(header(json, "o"), AMQPValue::FieldTable(inner));
    }

    #[test]
    fn a_number_with_a_fraction_is_a_double_even_when_whole() {
        assert_eq!(header(r#"{"f": 2.0}"#, "f"), AMQPValue::Double(2.0));
    }

    #[test]
    fn integers_beyond_64_bits_are_refused_not_rounded() {
        let error = Headers::from_json(r#"{"big": 18446744073709551616}"#)
            .err()
            .unwrap();
        assert!(
            error.contains("\"big\"") && error.contains("64-bit"),
            "{error}"
        );
        assert!(Headers::from_json(r#"{"max": 9223372036854775807}"#).is_ok());
    }

    #[test]
    fn a_value_that_is_not_an_object_is_refused_saying_what_it_is() {
        let error = Headers::from_json("[1, 2]").err().unwrap();
        assert_eq!(
            error,
            "the headers column must be a JSON object, not an array"
        );
    }

    #[test]
    fn a_nested_name_too_long_for_amqp_is_named_by_its_path() {
        let json = format!(r#"{{"outer": {{"{}": 1}}}}"#, "n".repeat(256));
        let error = Headers::from_json(&json).err().unwrap();
        assert!(error.starts_with("header name \"outer.nnn"), "{error}");
    }

    #[test]
    fn the_size_is_what_the_encoder_writes() {
        let json = r#"{"s": "xyz", "i": 7, "f": 0.5, "t": false, "n": null,
                      "a": [[1], {"k": "v"}], "o": {"p": {"q": [true, 2.5]}}}"#;
        let mut headers = Headers::from_json(json).unwrap();
        headers.insert_string("x-ordering-key", "order-42");
        let generate = lapin::types::generation::gen_field_table(&headers.table);
        let (encoded, _) = cookie_factory::r#gen(generate, Vec::new()).unwrap();
        assert_eq!(headers.bytes, encoded.len());
    }
}
