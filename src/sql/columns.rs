//! Which of the columns that migration 0003 adds a table has. A table of
//! the reference article's shape has none of them and keeps working as
//! before: the statements are built once per session from what is there,
//! so such a table is sent exactly the statements it always was.

use anyhow::Result;
use postgres::Client;

use crate::connect::database::classify_on_table;
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

/// The table is named by a bind parameter cast to regclass, never by a
/// name pasted into a literal; a table that does not exist fails here as
/// it would in any statement about it.
const LOOKUP: &str = "SELECT attname::text FROM pg_attribute \
     WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped \
       AND attname IN ('headers', 'routing_key', 'ordering_key', 'producer_xid')";

/// Looks the optional columns up; `what` names the step for the error.
pub fn of_table(client: &mut Client, table: &TableName, what: &str) -> Result<Columns> {
    let rows = client
        .query(LOOKUP, &[&table.quoted()])
        .map_err(|error| classify_on_table(&error, what, table))?;
    let mut columns = Columns::default();
    for row in rows {
        match row.get::<_, &str>(0) {
            "headers" => columns.headers = true,
            "routing_key" => columns.routing_key = true,
            "ordering_key" => columns.ordering_key = true,
            "producer_xid" => columns.producer_xid = true,
            _ => {}
        }
    }
    Ok(columns)
}
