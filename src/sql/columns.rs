//! The shape of a table: its payload's type, which of the optional columns
//! (those migrations 0003 and 0006 add) it has, whether it has last_error,
//! how it is partitioned. A table of the reference article's shape has
//! none of the optional columns and keeps working as before: the
//! statements are built once per session from what is there, so such a
//! table is sent exactly the statements it always was.

use anyhow::{Result, anyhow};
use postgres::Client;

use crate::connect::database::classify_on_table;
use crate::exit;
use crate::sql::partitions;
use crate::sql::table::TableName;

/// The optional columns a table has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Columns {
    /// jsonb: an object whose members become AMQP headers.
    pub headers: bool,
    /// text: the routing key instead of event_type, when not null.
    pub routing_key: bool,
    /// text: the key of --ordered-by-key, sent as the header x-ordering-key.
    pub ordering_key: bool,
    /// xid8: the inserting transaction, which the ordered modes need.
    pub producer_xid: bool,
    /// text: the exchange instead of --exchange, when not null.
    pub exchange: bool,
    /// text: the AMQP content_type instead of the payload type's default.
    pub content_type: bool,
    /// text: the AMQP content_encoding.
    pub content_encoding: bool,
    /// text: the AMQP correlation_id.
    pub correlation_id: bool,
    /// smallint: the AMQP priority, 0 to 255.
    pub priority: bool,
    /// timestamptz: never published after it; the AMQP expiration before.
    pub expires_at: bool,
}

/// The type of the payload column: the message body is its value's bytes
/// (see the README's "Payloads").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Payload {
    /// As PostgreSQL prints it, the default the migrations create.
    #[default]
    Jsonb,
    /// As stored.
    Json,
    /// As stored, UTF-8 (varchar too).
    Text,
    /// The raw bytes.
    Bytea,
}

impl Payload {
    /// The AMQP content_type of a message whose row does not set one.
    pub fn content_type(self) -> &'static str {
        match self {
            Payload::Jsonb | Payload::Json => "application/json",
            Payload::Text => "text/plain; charset=utf-8",
            Payload::Bytea => "application/octet-stream",
        }
    }

    /// The type by its catalog name (a domain's base type), None for a
    /// type the relay cannot send.
    fn named(name: &str) -> Option<Payload> {
        Some(match name {
            "jsonb" => Payload::Jsonb,
            "json" => Payload::Json,
            "text" | "character varying" => Payload::Text,
            "bytea" => Payload::Bytea,
            _ => return None,
        })
    }
}

/// What the relay needs to know of a table before it prepares anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    pub columns: Columns,
    /// The payload column's type (its domain's base type), None when the
    /// table has no such column.
    pub payload_type: Option<String>,
    /// last_error, which only the marks write: the claim does not check it.
    pub last_error: bool,
    /// Partitioned by range on created_at (see `sql::partitions`).
    pub by_created_at: bool,
}

/// One statement for the whole shape: each statement a run sends before
/// its first claim is a round trip or two that an empty run pays. The
/// table is named by a bind parameter cast to regclass, never by a name
/// pasted into a literal; a table that does not exist fails here as it
/// would in any statement about it. The payload's type is its domain's
/// base type where it is a domain.
fn lookup() -> String {
    format!(
        "SELECT array(SELECT attname::text FROM pg_attribute \
           WHERE attrelid = t.oid AND attnum > 0 AND NOT attisdropped \
             AND attname IN ('headers', 'routing_key', 'ordering_key', 'producer_xid', \
                             'exchange', 'content_type', 'content_encoding', 'correlation_id', \
                             'priority', 'expires_at', 'last_error')), \
         {}, \
         (SELECT format_type(CASE WHEN ty.typtype = 'd' THEN ty.typbasetype ELSE ty.oid END, NULL) \
            FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid \
            WHERE a.attrelid = t.oid AND a.attname = 'payload' AND NOT a.attisdropped) \
         FROM (SELECT $1::text::regclass AS oid) t",
        partitions::BY_CREATED_AT
    )
}

impl Shape {
    /// What the payload column's type makes of a message body. A type the
    /// relay cannot send is a configuration problem (78); a missing
    /// payload column is left to the claim's preparation, which names it
    /// as it names any missing column. Only the relay asks: status and the
    /// other commands never read the payload.
    pub fn payload(&self, what: &str, table: &TableName) -> Result<Payload> {
        let Some(name) = &self.payload_type else {
            return Ok(Payload::default());
        };
        Payload::named(name).ok_or_else(|| {
            exit::config(anyhow!(
                "{what} on table {table}: column \"payload\" is of type {name}, which the relay \
                 cannot send; make it jsonb, json, text or bytea"
            ))
        })
    }
}

/// Looks the table's shape up; `what` names the step for the error.
pub fn of_table(client: &mut Client, table: &TableName, what: &str) -> Result<Shape> {
    let row = client
        .query_one(&lookup(), &[&table.quoted()])
        .map_err(|error| classify_on_table(&error, what, table))?;
    let mut shape = Shape {
        by_created_at: row.get(1),
        payload_type: row.get(2),
        ..Shape::default()
    };
    let columns = &mut shape.columns;
    for name in row.get::<_, Vec<&str>>(0) {
        match name {
            "headers" => columns.headers = true,
            "routing_key" => columns.routing_key = true,
            "ordering_key" => columns.ordering_key = true,
            "producer_xid" => columns.producer_xid = true,
            "exchange" => columns.exchange = true,
            "content_type" => columns.content_type = true,
            "content_encoding" => columns.content_encoding = true,
            "correlation_id" => columns.correlation_id = true,
            "priority" => columns.priority = true,
            "expires_at" => columns.expires_at = true,
            "last_error" => shape.last_error = true,
            _ => {}
        }
    }
    Ok(shape)
}
