//! `--dry-run`: the claimed batch as JSON lines on stdout, the payload as a
//! JSON value. Once the reader has gone (`| head -1`) nothing more is
//! printed and the dry run rolls back as always.

use anyhow::{Context, Result};

use crate::report::stdout;
use crate::sql::outbox::Event;

pub fn print(events: &[Event]) -> Result<()> {
    for event in events {
        if stdout::is_closed() {
            break;
        }
        let payload: serde_json::Value =
            serde_json::from_str(&event.payload).context("reading a payload from the table")?;
        let created_at =
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(event.created_at.max(0) as u64);
        let mut line = serde_json::json!({
            "id": event.id,
            "event_id": event.event_id,
            "event_type": event.event_type,
            "payload": payload,
            "created_at": humantime::format_rfc3339_seconds(created_at).to_string(),
            "attempts": event.attempts,
        });
        // The optional columns, where the row has them.
        if let Some(headers) = &event.headers {
            line["headers"] =
                serde_json::from_str(headers).context("reading headers from the table")?;
        }
        if let Some(routing_key) = &event.routing_key {
            line["routing_key"] = routing_key.as_str().into();
        }
        if let Some(ordering_key) = &event.ordering_key {
            line["ordering_key"] = ordering_key.as_str().into();
        }
        stdout::line(&line.to_string()).map_err(stdout::unwritable)?;
    }
    Ok(())
}
