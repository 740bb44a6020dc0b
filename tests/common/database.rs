//! The database side of a fixture: inserting events, reading the rows
//! back, and holding a row's lock as a concurrent run does.

use postgres::Client;

use super::fixture::Fixture;

/// The optional columns of an inserted event (Fixture::insert_extra).
#[derive(Default, Clone, Copy)]
pub struct Extra<'a> {
    pub ordering_key: Option<&'a str>,
    pub routing_key: Option<&'a str>,
    /// JSON text.
    pub headers: Option<&'a str>,
}

/// One outbox row, as the tests check it.
#[derive(Debug, Clone)]
pub struct Row {
    pub event_id: String,
    pub published: bool,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// Seconds from now until the row is due again (negative: due).
    pub due_in_s: f64,
}

/// Rows left unpublished by an outage or a refusal are exactly as they
/// were inserted: no attempt, no error, due. Neither is the events' fault.
pub fn assert_untouched(rows: &[Row]) {
    for row in rows.iter().filter(|row| !row.published) {
        assert_eq!(
            (row.attempts, row.last_error.as_deref()),
            (0, None),
            "{} was blamed",
            row.event_id
        );
        assert!(row.due_in_s <= 0.0, "{} was pushed back", row.event_id);
    }
}

/// The row of `event_id` among `rows`.
pub fn row<'r>(rows: &'r [Row], event_id: &str) -> &'r Row {
    rows.iter()
        .find(|row| row.event_id == event_id)
        .unwrap_or_else(|| panic!("no row {event_id}"))
}

/// A row lock held by another session (Fixture::hold_row).
pub struct HeldRow(Client);

impl HeldRow {
    pub fn release(mut self) {
        self.0.batch_execute("COMMIT").unwrap();
    }
}

impl Fixture {
    /// Inserts `count` events named `<prefix>-<n>` of type `order.created`.
    pub fn insert(&mut self, prefix: &str, count: i64) {
        self.db
            .execute(
                &format!(
                    "INSERT INTO {} (event_id, event_type, payload) \
                     SELECT $1 || '-' || g, 'order.created', jsonb_build_object('n', g, 'note', repeat('x', 150)) \
                     FROM generate_series(1, $2::bigint) g",
                    self.quoted_table()
                ),
                &[&prefix, &count],
            )
            .unwrap();
    }

    pub fn insert_event(&mut self, event_id: &str, event_type: &str, payload: &str) {
        self.db
            .execute(
                &format!(
                    "INSERT INTO {} (event_id, event_type, payload) VALUES ($1, $2, $3::text::jsonb)",
                    self.quoted_table()
                ),
                &[&event_id, &event_type, &payload],
            )
            .unwrap();
    }

    /// Inserts an event of type `order.created` with the optional columns
    /// `extra` gives (the others NULL).
    pub fn insert_extra(&mut self, event_id: &str, extra: Extra) {
        self.db
            .execute(
                &format!(
                    "INSERT INTO {} (event_id, event_type, payload, ordering_key, routing_key, headers) \
                     VALUES ($1, 'order.created', '{{}}', $2, $3, $4::text::jsonb)",
                    self.quoted_table()
                ),
                &[&event_id, &extra.ordering_key, &extra.routing_key, &extra.headers],
            )
            .unwrap();
    }

    pub fn quoted_table(&self) -> String {
        format!("\"{}\".outbox", self.schema)
    }

    pub fn execute(&mut self, sql: &str) {
        self.db
            .batch_execute(&sql.replace("{table}", &self.quoted_table()))
            .unwrap();
    }

    pub fn rows(&mut self) -> Vec<Row> {
        self.db
            .query(
                &format!(
                    "SELECT event_id, published_at IS NOT NULL, attempts, last_error, \
                     (extract(epoch FROM available_at) - extract(epoch FROM now()))::float8 \
                     FROM {} ORDER BY id",
                    self.quoted_table()
                ),
                &[],
            )
            .unwrap()
            .iter()
            .map(|row| Row {
                event_id: row.get(0),
                published: row.get(1),
                attempts: row.get(2),
                last_error: row.get(3),
                due_in_s: row.get(4),
            })
            .collect()
    }

    /// (event_id, published, attempts) for tables whose column types differ
    /// from those migrate creates, read as text.
    pub fn rows_untyped(&mut self) -> Vec<(String, bool, i64)> {
        let sql = format!(
            "SELECT event_id::text, published_at IS NOT NULL, attempts::bigint FROM {} ORDER BY id",
            self.quoted_table()
        );
        let rows = self.db.query(&sql, &[]).unwrap();
        rows.iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect()
    }

    /// Sends the statistics the fixture's own session has gathered (its
    /// inserts and updates) to the server's shared statistics now, rather
    /// than within the next second or so, so another session reads them.
    pub fn flush_stats(&mut self) {
        self.db
            .batch_execute("SELECT pg_stat_force_next_flush()")
            .unwrap();
    }

    /// The database's clock now.
    pub fn clock(&mut self) -> std::time::SystemTime {
        self.db
            .query_one("SELECT clock_timestamp()", &[])
            .unwrap()
            .get(0)
    }

    /// Another session holding `event_id`'s row lock, as a concurrent run
    /// does between its claim and its commit, until `release`.
    pub fn hold_row(&self, event_id: &str) -> HeldRow {
        let mut other = self.connect();
        let sql = format!(
            "BEGIN; SELECT 1 FROM {} WHERE event_id = '{event_id}' FOR UPDATE",
            self.quoted_table()
        );
        other.batch_execute(&sql).unwrap();
        HeldRow(other)
    }

    pub fn published_count(&mut self) -> usize {
        self.rows().iter().filter(|row| row.published).count()
    }
}
