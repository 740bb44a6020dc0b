//! `--dry-run`: the claimed batch as JSON lines on stdout. Once the reader
//! has gone (`| head -1`) nothing more is printed and the dry run rolls
//! back as always.

use anyhow::Result;

use base64::Engine as _;

use crate::report::stdout;
use crate::sql::columns::Payload;
use crate::sql::outbox::Event;

pub(crate) fn print(events: &[Event]) -> Result<()> {
    for event in events {
        if stdout::is_closed() {
            break;
        }
        stdout::line(&line(event)).map_err(stdout::unwritable)?;
    }
    Ok(())
}

/// One event as a JSON object. A json or jsonb payload goes in as it is,
/// the very bytes the message would carry: always valid JSON, and never
/// parsed here, so that no payload (a number beyond a float's range,
/// nesting deeper than a parser's limit) can stop the dry run; so do the
/// headers, where the row has them. A text payload goes in as a JSON
/// string, a bytea one base64-encoded under `payload_base64`, as an
/// archive writes it. A row that cannot be sent shows its id and why.
fn line(event: &Event) -> String {
    let text = |value: &str| serde_json::Value::from(value).to_string();
    if let Some(reason) = &event.unreadable {
        return format!("{{\"id\":{},\"unreadable\":{}}}", event.id, text(reason));
    }
    let body = String::from_utf8_lossy(&event.payload);
    let payload = match event.payload_type {
        Payload::Jsonb | Payload::Json => format!("\"payload\":{body}"),
        Payload::Text => format!("\"payload\":{}", text(&body)),
        Payload::Bytea => format!(
            "\"payload_base64\":\"{}\"",
            base64::engine::general_purpose::STANDARD.encode(&event.payload)
        ),
    };
    let mut line = format!(
        "{{\"id\":{},\"event_id\":{},\"event_type\":{},{payload},\"created_at\":{},\"attempts\":{}",
        event.id,
        text(&event.event_id),
        text(&event.event_type),
        created_at(event.created_at),
        event.attempts
    );
    // The optional columns, where the row has them.
    if let Some(headers) = &event.headers {
        line.push_str(&format!(",\"headers\":{headers}"));
    }
    if let Some(routing_key) = &event.routing_key {
        line.push_str(&format!(",\"routing_key\":{}", text(routing_key)));
    }
    for (name, value) in [
        ("ordering_key", &event.ordering_key),
        ("exchange", &event.exchange),
        ("content_type", &event.content_type),
        ("content_encoding", &event.content_encoding),
        ("correlation_id", &event.correlation_id),
    ] {
        if let Some(value) = value {
            line.push_str(&format!(",\"{name}\":{}", text(value)));
        }
    }
    if let Some(priority) = event.priority {
        line.push_str(&format!(",\"priority\":{priority}"));
    }
    if event.expired() {
        line.push_str(",\"expired\":true");
    }
    line.push('}');
    line
}

/// created_at as RFC 3339 in UTC, `"infinity"` or `"-infinity"` as
/// PostgreSQL writes those, or null.
fn created_at(seconds: Option<f64>) -> String {
    match seconds {
        None => "null".into(),
        Some(seconds) if seconds == f64::INFINITY => "\"infinity\"".into(),
        Some(seconds) if seconds == f64::NEG_INFINITY => "\"-infinity\"".into(),
        // Floored: a second before 1970 with a fraction is the second before.
        Some(seconds) => format!("\"{}\"", rfc3339(seconds.floor() as i64)),
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for any second PostgreSQL can store, from 4714 BC
/// to 294276 AD (humantime's formatter panics outside 1970 to 9999). Years
/// before 1 are written as ISO 8601 does: 0000 is 1 BC, -0001 is 2 BC. The
/// date is Howard Hinnant's civil_from_days.
fn rfc3339(seconds: i64) -> String {
    let (days, second) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let sign = if year < 0 { "-" } else { "" };
    format!(
        "{sign}{:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        year.abs(),
        second / 3600,
        second / 60 % 60,
        second % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_between_1970_and_9999_read_as_humantime_writes_them() {
        for seconds in [0, 951_782_400, 1_700_000_000, 253_402_300_799] {
            let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(seconds);
            let expected = humantime::format_rfc3339_seconds(time).to_string();
            assert_eq!(rfc3339(seconds as i64), expected, "{seconds}");
        }
    }

    #[test]
    fn dates_outside_them_are_written_too() {
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339(-315_619_200), "1960-01-01T00:00:00Z");
        assert_eq!(rfc3339(253_402_300_800), "10000-01-01T00:00:00Z");
        // The ends of PostgreSQL's range: 4714-11-24 BC (year -4713) and 294276-12-31.
        assert_eq!(rfc3339(-210_866_803_200), "-4713-11-24T00:00:00Z");
        assert_eq!(rfc3339(9_224_318_015_999), "294276-12-31T23:59:59Z");
    }

    #[test]
    fn infinite_and_missing_timestamps_are_named() {
        assert_eq!(created_at(Some(f64::INFINITY)), "\"infinity\"");
        assert_eq!(created_at(Some(f64::NEG_INFINITY)), "\"-infinity\"");
        assert_eq!(created_at(None), "null");
        assert_eq!(created_at(Some(0.0)), "\"1970-01-01T00:00:00Z\"");
    }
}
