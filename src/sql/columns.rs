//! The shape of a table: its payload's type, which of the optional columns
//! (those migrations 0003 and 0006 add) it has, whether it has last_error,
//! how it is partitioned. A table of the reference article's shape has
//! none of the optional columns and keeps working as before: the
//! statements are built once per session from what is there, so such a
//! table is sent exactly the statements it always was.

use anyhow::{Result, anyhow};
use postgres::Client;

use crate::exit;
use crate::sql::names::{self, Names};
use crate::sql::partitions;
use crate::sql::table::TableName;
use crate::sql::table::classify_on_table;

/// The optional columns a table has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Columns {
    /// jsonb: an object whose members become AMQP headers.
    pub(crate) headers: bool,
    /// text: the routing key instead of event_type, when not null.
    pub(crate) routing_key: bool,
    /// text: the key of --ordered-by-key, sent as the header x-ordering-key.
    pub(crate) ordering_key: bool,
    /// xid8: the inserting transaction, which the ordered modes need.
    pub(crate) producer_xid: bool,
    /// text: the exchange instead of --exchange, when not null.
    pub(crate) exchange: bool,
    /// text: the AMQP content_type instead of the payload type's default.
    pub(crate) content_type: bool,
    /// text: the AMQP content_encoding.
    pub(crate) content_encoding: bool,
    /// text: the AMQP correlation_id.
    pub(crate) correlation_id: bool,
    /// smallint: the AMQP priority, 0 to 255.
    pub(crate) priority: bool,
    /// timestamptz: never published after it; the AMQP expiration before.
    pub(crate) expires_at: bool,
}

/// The type of the payload column: the message body is its value's bytes
/// (see the README's "Payloads").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Payload {
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
    pub(crate) fn content_type(self) -> &'static str {
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
pub(crate) struct Shape {
    pub(crate) columns: Columns,
    /// The payload column's type (its domain's base type), None when the
    /// table has no such column.
    pub(crate) payload_type: Option<String>,
    /// last_error, which only the marks write: the claim does not check it.
    pub(crate) last_error: bool,
    /// Partitioned by range on created_at (see `sql::partitions`).
    pub(crate) by_created_at: bool,
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
    pub(crate) fn payload(&self, what: &str, table: &TableName) -> Result<Payload> {
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

/// Looks the table's shape up; `what` names the step for the error. With
/// --column, the columns are those the mapping names, checked first (see
/// `check`).
pub(crate) fn of_table(client: &mut Client, table: &TableName, what: &str) -> Result<Shape> {
    let names = names::current();
    if !names.is_plain() {
        return of_mapped_table(client, table, what, names);
    }
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

/// With --column: every column of the table and its type, in one
/// statement as the plain lookup is, and whether it is partitioned.
/// `relation` is the table's oid as an expression of $1.
fn mapped_lookup(relation: &str) -> String {
    format!(
        "SELECT array(SELECT a.attname::text FROM pg_attribute a \
                      WHERE a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped \
                      ORDER BY a.attnum), \
                array(SELECT format_type(CASE WHEN ty.typtype = 'd' THEN ty.typbasetype \
                                              ELSE ty.oid END, NULL) \
                      FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid \
                      WHERE a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped \
                      ORDER BY a.attnum), \
                {} \
         FROM (SELECT {} AS oid) t",
        partitions::BY_CREATED_AT,
        relation
    )
}

/// A table's columns, each with its type (a domain's base type).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Catalog {
    pub(crate) columns: Vec<(String, String)>,
}

impl Catalog {
    /// Reads the columns of `table` (none when it does not exist).
    pub(crate) fn of(
        client: &mut impl postgres::GenericClient,
        table: &TableName,
        what: &str,
    ) -> Result<Catalog> {
        let row = client
            .query_one(&mapped_lookup("to_regclass($1)"), &[&table.quoted()])
            .map_err(|error| classify_on_table(&error, what, table))?;
        Ok(Catalog::from_row(&row))
    }

    fn from_row(row: &postgres::Row) -> Catalog {
        let (names, types): (Vec<String>, Vec<String>) = (row.get(0), row.get(1));
        Catalog {
            columns: names.into_iter().zip(types).collect(),
        }
    }

    /// The type of the column `name`, None when the table has no such column.
    pub(crate) fn type_of(&self, name: &str) -> Option<&str> {
        self.columns
            .iter()
            .find(|(column, _)| column == name)
            .map(|(_, type_name)| type_name.as_str())
    }
}

fn of_mapped_table(
    client: &mut Client,
    table: &TableName,
    what: &str,
    names: &Names,
) -> Result<Shape> {
    let row = client
        .query_one(&mapped_lookup("$1::text::regclass"), &[&table.quoted()])
        .map_err(|error| classify_on_table(&error, what, table))?;
    let catalog = Catalog::from_row(&row);
    check(names, &catalog, table, what)?;
    let has = |role: &str| catalog.type_of(names.column(role)).is_some();
    Ok(Shape {
        columns: Columns {
            headers: has("headers"),
            routing_key: has("routing_key"),
            ordering_key: has("ordering_key"),
            producer_xid: catalog.type_of("producer_xid").is_some(),
            exchange: has("exchange"),
            content_type: has("content_type"),
            content_encoding: has("content_encoding"),
            correlation_id: has("correlation_id"),
            priority: has("priority"),
            expires_at: has("expires_at"),
        },
        payload_type: catalog.type_of(names.column("payload")).map(str::to_owned),
        last_error: has("last_error"),
        by_created_at: row.get(2),
    })
}

/// With --column, checks the mapping against the table (see `check`),
/// for a command that has no other use for its shape; the plain table is
/// asked nothing more.
pub(crate) fn check_mapping(client: &mut Client, table: &TableName, what: &str) -> Result<()> {
    match names::current().is_plain() {
        true => Ok(()),
        false => of_table(client, table, what).map(drop),
    }
}

/// The roles every command reads, which a table must have whatever
/// --column says; the optional ones are checked only where --column
/// names them.
const REQUIRED: [&str; 8] = [
    "id",
    "event_id",
    "event_type",
    "payload",
    "created_at",
    "published_at",
    "attempts",
    "available_at",
];

/// The roles the producers' columns play: `migrate --adopt` cannot add them.
pub(crate) const PRODUCERS: [&str; 3] = ["event_id", "event_type", "payload"];

/// With --column: each required role, and each role --column names, is
/// played by a column that exists and whose type can play it (78 naming
/// the column, its type and the role, otherwise).
pub(crate) fn check(names: &Names, catalog: &Catalog, table: &TableName, what: &str) -> Result<()> {
    let given = names.given().iter().map(|(role, _)| *role);
    for role in REQUIRED.into_iter().chain(given) {
        let column = names.column(role);
        let Some(type_name) = catalog.type_of(column) else {
            let fix = match PRODUCERS.contains(&role) {
                true => format!("name the column that plays it with --column {role}=NAME"),
                false => {
                    "run `outbox-poll migrate --adopt` with the same --column to add it".to_string()
                }
            };
            return Err(exit::config(anyhow!(
                "{what} on table {table}: the column {column}, which plays {role}, does not \
                 exist; {fix}"
            )));
        };
        if let Some(expected) = misfit(role, type_name) {
            return Err(exit::config(anyhow!(
                "{what} on table {table}: the column {column} is of type {type_name}, which \
                 cannot play {role} ({expected}); map {role} to another column with \
                 --column {role}=NAME"
            )));
        }
    }
    Ok(())
}

/// What `role` needs of its column's type, when `type_name` is not that.
pub(crate) fn misfit(role: &str, type_name: &str) -> Option<&'static str> {
    let text = matches!(
        type_name,
        "text" | "character varying" | "character" | "bpchar"
    );
    let integer = matches!(type_name, "smallint" | "integer" | "bigint");
    let timestamp = matches!(
        type_name,
        "timestamp with time zone" | "timestamp without time zone"
    );
    let (fits, expected) = match role {
        // Any type has a text form: a uuid becomes its usual spelling.
        "event_id" => (true, ""),
        "id" => (integer, "an integer, the claim order"),
        "attempts" | "priority" => (integer, "an integer"),
        "payload" => (
            Payload::named(type_name).is_some(),
            "jsonb, json, text or bytea",
        ),
        "headers" => (
            matches!(type_name, "jsonb" | "json"),
            "jsonb or json, an object",
        ),
        "created_at" | "published_at" | "available_at" | "expires_at" => (timestamp, "a timestamp"),
        _ => (text, "text or varchar"),
    };
    (!fits).then_some(expected)
}
