//! The statements of `outbox-poll check` about the database: where the
//! session is and what it may do, and which privileges the run needs that
//! its role lacks. Each reads the catalog or the session's own settings
//! only: nothing is locked, written, or run that a trigger could see.

use anyhow::{Result, anyhow};
use postgres::Client;

use crate::connect::pg_error::classify;
use crate::sql::columns::Shape;
use crate::sql::outbox::{OnPublish, Order};
use crate::sql::table::{TableName, quote};

/// What the session says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// The role the run works as.
    pub(crate) user: String,
    pub(crate) database: String,
    /// The server's own address and port; None over a local socket.
    pub(crate) address: Option<(String, i32)>,
    /// The TLS version in use, None without TLS.
    pub(crate) tls: Option<String>,
    /// The server takes no writes (a hot standby, or a read-only session).
    pub(crate) read_only: bool,
    pub(crate) server_version: String,
}

/// pg_stat_ssl shows every session, its own included, to any role.
const SESSION_SQL: &str = "SELECT current_user::text, current_database()::text, \
       host(inet_server_addr()), inet_server_port(), \
       (SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl), \
       current_setting('transaction_read_only') = 'on', current_setting('server_version')";

/// Reads what the session says about itself.
pub(crate) fn session(client: &mut Client) -> Result<Session> {
    let row = client
        .query_one(SESSION_SQL, &[])
        .map_err(|error| classify(&error, "reading the session's settings", "try again"))?;
    let address: Option<String> = row.get(2);
    let port: Option<i32> = row.get(3);
    Ok(Session {
        user: row.get(0),
        database: row.get(1),
        address: address.zip(port),
        tls: row.get(4),
        read_only: row.get(5),
        server_version: row.get(6),
    })
}

/// The columns every run reads: the claim's select list and its WHERE.
const READ: [&str; 8] = [
    "id",
    "event_id",
    "event_type",
    "payload",
    "created_at",
    "attempts",
    "published_at",
    "available_at",
];

/// What the marks write: a failure's attempts, error and backoff, a
/// nack's error and backoff, an expiry's.
const WRITTEN: [&str; 3] = ["attempts", "last_error", "available_at"];

/// The privileges the run needs on the table, as (privilege, column)
/// pairs: SELECT on what it reads, UPDATE on what it writes (the claim's
/// FOR UPDATE needs UPDATE on a column too). DELETE, which is granted on
/// whole tables only, is asked apart (`lacks_delete`).
fn needed(shape: &Shape, order: Order, on_publish: OnPublish) -> Vec<(&'static str, &'static str)> {
    let columns = &shape.columns;
    let mut read: Vec<&str> = READ.to_vec();
    for (present, column) in [
        (columns.headers, "headers"),
        (columns.routing_key, "routing_key"),
        (columns.ordering_key, "ordering_key"),
        (columns.exchange, "exchange"),
        (columns.content_type, "content_type"),
        (columns.content_encoding, "content_encoding"),
        (columns.correlation_id, "correlation_id"),
        (columns.priority, "priority"),
        (columns.expires_at, "expires_at"),
        // The ordered claims order by it; a plain claim never reads it.
        (
            columns.producer_xid && order != Order::Plain,
            "producer_xid",
        ),
    ] {
        if present {
            read.push(column);
        }
    }
    let mut written = WRITTEN.to_vec();
    if on_publish == OnPublish::Mark {
        written.push("published_at");
    }
    let read = read.into_iter().map(|column| ("SELECT", column));
    read.chain(written.into_iter().map(|column| ("UPDATE", column)))
        .collect()
}

/// Which of the needed (privilege, column) pairs the role lacks.
/// has_column_privilege holds a privilege granted on the whole table as
/// well as one granted on the column alone, as PostgreSQL checks them.
const LACKING_SQL: &str = "SELECT x.privilege, x.col FROM unnest($2::text[], $3::text[]) \
       WITH ORDINALITY AS x(privilege, col, n) \
     WHERE NOT has_column_privilege($1::text::regclass, x.col, x.privilege) ORDER BY x.n";

const DELETE_SQL: &str = "SELECT NOT has_table_privilege($1::text::regclass, 'DELETE')";

/// The privileges the run needs on `table` that `user` lacks: one
/// configuration error (78) naming each and the GRANT that gives them.
pub(crate) fn grants(
    client: &mut Client,
    table: &TableName,
    user: &str,
    shape: &Shape,
    order: Order,
    on_publish: OnPublish,
) -> Result<()> {
    let what = format!("reading the privileges of role {user} on table {table}");
    let (privileges, columns): (Vec<&str>, Vec<&str>) =
        needed(shape, order, on_publish).into_iter().unzip();
    // In the table's own column names, under --column.
    let names = crate::sql::names::current();
    let columns: Vec<&str> = columns.into_iter().map(|role| names.column(role)).collect();
    let quoted = table.quoted();
    let lacking = client
        .query(LACKING_SQL, &[&quoted, &privileges, &columns])
        .map_err(|error| classify(&error, &what, "try again"))?;
    let lacking: Vec<(String, String)> =
        lacking.iter().map(|row| (row.get(0), row.get(1))).collect();
    let mut missing = Vec::new();
    for privilege in ["SELECT", "UPDATE"] {
        let of: Vec<&str> = lacking
            .iter()
            .filter(|(held, _)| held == privilege)
            .map(|(_, column)| column.as_str())
            .collect();
        if !of.is_empty() {
            missing.push((privilege, format!("{privilege} on {}", of.join(", "))));
        }
    }
    if on_publish == OnPublish::Delete {
        let lacks: bool = client
            .query_one(DELETE_SQL, &[&quoted])
            .map_err(|error| classify(&error, &what, "try again"))?
            .get(0);
        if lacks {
            missing.push((
                "DELETE",
                "DELETE (--on-publish delete deletes what the broker confirmed)".into(),
            ));
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let (privileges, each): (Vec<&str>, Vec<String>) = missing.into_iter().unzip();
    Err(crate::exit::config(anyhow!(
        "role {user} lacks {} on table {table}: GRANT {} ON {quoted} TO {} (as the table's \
         owner; see migrations/example_least_privilege_role.sql)",
        each.join("; "),
        privileges.join(", "),
        quote(user)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn privileges(shape: &Shape, order: Order, on_publish: OnPublish) -> Vec<String> {
        needed(shape, order, on_publish)
            .into_iter()
            .map(|(privilege, column)| format!("{privilege} {column}"))
            .collect()
    }

    #[test]
    fn a_plain_run_that_marks_needs_update_on_published_at_and_never_reads_producer_xid() {
        let mut shape = Shape::default();
        shape.columns.producer_xid = true;
        let needed = privileges(&shape, Order::Plain, OnPublish::Mark);
        assert!(needed.contains(&"UPDATE published_at".to_string()));
        assert!(!needed.iter().any(|each| each.ends_with("producer_xid")));
    }

    #[test]
    fn a_run_that_deletes_writes_no_published_at_and_an_ordered_one_reads_producer_xid() {
        let mut shape = Shape::default();
        shape.columns.producer_xid = true;
        let needed = privileges(&shape, Order::Strict, OnPublish::Delete);
        assert!(!needed.contains(&"UPDATE published_at".to_string()));
        assert!(needed.contains(&"SELECT producer_xid".to_string()));
    }

    #[test]
    fn the_optional_columns_a_table_has_are_read() {
        let mut shape = Shape::default();
        shape.columns.routing_key = true;
        let needed = privileges(&shape, Order::Plain, OnPublish::Mark);
        assert!(needed.contains(&"SELECT routing_key".to_string()));
        assert!(!needed.contains(&"SELECT headers".to_string()));
    }
}
