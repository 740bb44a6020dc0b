//! The shape of a table: which of the columns that migration 0003 adds it
//! has, whether it has last_error, how it is partitioned. A table of the
//! reference article's shape has none of the optional columns and keeps
//! working as before: the statements are built once per session from what
//! is there, so such a table is sent exactly the statements it always was.

use anyhow::Result;
use postgres::Client;

use crate::connect::database::classify_on_table;
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
}

/// What the relay needs to know of a table before it prepares anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    pub columns: Columns,
    /// last_error, which only the marks write: the claim does not check it.
    pub last_error: bool,
    /// Partitioned by range on created_at (see `sql::partitions`).
    pub by_created_at: bool,
}

/// One statement for the whole shape: each statement a run sends before
/// its first claim is a round trip or two that an empty run pays. The
/// table is named by a bind parameter cast to regclass, never by a name
/// pasted into a literal; a table that does not exist fails here as it
/// would in any statement about it.
fn lookup() -> String {
    format!(
        "SELECT array(SELECT attname::text FROM pg_attribute \
           WHERE attrelid = t.oid AND attnum > 0 AND NOT attisdropped \
             AND attname IN ('headers', 'routing_key', 'ordering_key', 'producer_xid', \
                             'last_error')), \
         {} \
         FROM (SELECT $1::text::regclass AS oid) t",
        partitions::BY_CREATED_AT
    )
}

/// Looks the table's shape up; `what` names the step for the error.
pub fn of_table(client: &mut Client, table: &TableName, what: &str) -> Result<Shape> {
    let row = client
        .query_one(&lookup(), &[&table.quoted()])
        .map_err(|error| classify_on_table(&error, what, table))?;
    let mut shape = Shape {
        by_created_at: row.get(1),
        ..Shape::default()
    };
    for name in row.get::<_, Vec<&str>>(0) {
        match name {
            "headers" => shape.columns.headers = true,
            "routing_key" => shape.columns.routing_key = true,
            "ordering_key" => shape.columns.ordering_key = true,
            "producer_xid" => shape.columns.producer_xid = true,
            "last_error" => shape.last_error = true,
            _ => {}
        }
    }
    Ok(shape)
}
