//! The ordered modes' figures, each a ratio to a baseline measured in the
//! same run:
//!
//! - `ordered`: `--ordered --drain`, this build against BENCH_BEFORE_BIN
//!   (a build from before the commit-order change), alternating, on one
//!   table; without BENCH_BEFORE_BIN, this build alone.
//! - `by_key`: `--ordered-by-key --drain` over events with 1,000 distinct
//!   keys, at batch 100 and 1,000, against the plain `--drain` of the same
//!   events; then over 10 keys, where a batch can hold at most 10 events.
//! - `inserts`: what the producers pay for migration 0003: single-row
//!   INSERTs (each its own transaction) and one large INSERT ... SELECT,
//!   into a table as 0002 left it and into one with 0003's columns and
//!   indexes, with and without an ordering_key.
//!
//! The ordered modes run in a database of their own (see
//! `Fixture::in_own_database`).

use std::time::Instant;

use outbox_poll::sql::migrations::{self, MIGRATIONS};
use outbox_poll::sql::table::TableName;
use postgres::{Client, NoTls};

use crate::common::{Figure, Fixture};

/// Drains `count` events (with `keys` ordering keys, if any) with `args`
/// added to `--drain --json`, by the binary at `bin`, and verifies that
/// every event arrived and every row is marked.
fn drain(
    fx: &mut Fixture,
    bin: &str,
    name: String,
    count: i64,
    keys: Option<i64>,
    args: &[&str],
) -> Figure {
    fx.fill_keyed(count, 200, keys);
    let mut all = vec!["--drain", "--json"];
    all.extend_from_slice(args);
    fx.measure(bin, name, count, 1, &all)
}

/// `--ordered --drain --batch-size 100`: this build and BENCH_BEFORE_BIN,
/// alternating, twice each. Returns the figures and the ratio lines.
pub fn ordered(fx: &mut Fixture) -> (Vec<Figure>, Vec<String>) {
    let count = fx.settings.ordered_events;
    let after = crate::common::binary();
    let before = std::env::var("BENCH_BEFORE_BIN").ok();
    let args = ["--ordered", "--batch-size", "100"];
    let mut figures = Vec::new();
    let mut notes = Vec::new();
    for round in 1..=2 {
        let before_rate = before.as_deref().map(|bin| {
            let name = format!("--ordered --drain, batch 100, before (run {round})");
            let figure = drain(fx, bin, name, count, None, &args);
            let rate = figure.rate();
            figures.push(figure);
            rate
        });
        let name = format!("--ordered --drain, batch 100, this build (run {round})");
        let figure = drain(fx, &after, name, count, None, &args);
        if let Some(before_rate) = before_rate {
            notes.push(format!(
                "--ordered, run {round}: this build / before = {:.2}",
                figure.rate() / before_rate
            ));
        }
        figures.push(figure);
    }
    (figures, notes)
}

/// `--ordered-by-key --drain` against the plain `--drain` of the same
/// events: 1,000 keys at batch 100 and 1,000, then 10 keys at batch 100.
pub fn by_key(fx: &mut Fixture) -> (Vec<Figure>, Vec<String>) {
    let bin = crate::common::binary();
    let events = fx.settings.events;
    let mut figures = Vec::new();
    let mut notes = Vec::new();
    let mut plain_at_100 = None;
    for batch in ["100", "1000"] {
        let name = format!("--drain, batch {batch}, 1,000 keys (plain)");
        let plain = drain(fx, &bin, name, events, Some(1000), &["--batch-size", batch]);
        let name = format!("--ordered-by-key --drain, batch {batch}, 1,000 keys");
        let args = ["--ordered-by-key", "--batch-size", batch];
        let keyed = drain(fx, &bin, name, events, Some(1000), &args);
        notes.push(format!(
            "--ordered-by-key, 1,000 keys, batch {batch}: / plain = {:.2}",
            keyed.rate() / plain.rate()
        ));
        if batch == "100" {
            plain_at_100 = Some(plain.rate());
        }
        figures.extend([plain, keyed]);
    }
    let count = fx.settings.few_keys_events;
    let name = "--ordered-by-key --drain, batch 100, 10 keys".to_string();
    let args = ["--ordered-by-key", "--batch-size", "100"];
    let keyed = drain(fx, &bin, name, count, Some(10), &args);
    if let Some(plain) = plain_at_100 {
        notes.push(format!(
            "--ordered-by-key, 10 keys, batch 100: / plain at 1,000 keys = {:.2} \
             (at most 10 events a batch, by design)",
            keyed.rate() / plain
        ));
    }
    figures.push(keyed);
    (figures, notes)
}

/// A table `name` in the fixture's schema, migrated up to `upto`
/// migrations, as `outbox-poll migrate` does.
fn table_migrated(fx: &mut Fixture, name: &str, upto: usize) -> String {
    let table = format!("{}.{name}", fx.name);
    let parsed = TableName::parse(&table).expect("the bench's table name");
    let mut tx = fx.db.transaction().unwrap();
    tx.execute(migrations::NAME_THE_TABLE, &[&parsed.quoted()])
        .unwrap();
    for (_, sql) in &MIGRATIONS[..upto] {
        tx.batch_execute(&migrations::for_table(sql, &parsed))
            .unwrap();
    }
    tx.commit().unwrap();
    table
}

/// Inserts/s of single-row INSERTs, each its own transaction, on one
/// connection; then rows/s of one INSERT ... SELECT of as many rows.
fn insert_rates(url: &str, table: &str, count: i64, keyed: bool) -> (f64, f64) {
    let mut client = Client::connect(url, NoTls).expect("connecting to PostgreSQL");
    client.batch_execute(&format!("TRUNCATE {table}")).unwrap();
    let key = if keyed {
        "'key-' || $1::bigint % 1000"
    } else {
        "NULL"
    };
    let key_column = if keyed { ", ordering_key" } else { "" };
    let key_value = if keyed {
        format!(", {key}")
    } else {
        String::new()
    };
    let insert = client
        .prepare(&format!(
            "INSERT INTO {table} (event_id, event_type, payload{key_column}) \
             VALUES ('ev-' || $1::bigint, 'order.created', \
                     jsonb_build_object('order_id', $1::bigint, 'note', repeat('x', 90)){key_value})"
        ))
        .unwrap();
    let started = Instant::now();
    for n in 0..count {
        client.execute(&insert, &[&n]).unwrap();
    }
    let single = count as f64 / started.elapsed().as_secs_f64();
    let key_value = if keyed { ", 'key-' || g % 1000" } else { "" };
    let started = Instant::now();
    client
        .execute(
            &format!(
                "INSERT INTO {table} (event_id, event_type, payload{key_column}) \
                 SELECT 'bulk-' || g, 'order.created', \
                        jsonb_build_object('order_id', g, 'note', repeat('x', 90)){key_value} \
                 FROM generate_series(1, $1::bigint) g"
            ),
            &[&count],
        )
        .unwrap();
    let bulk = count as f64 / started.elapsed().as_secs_f64();
    (single, bulk)
}

/// What producers pay for 0003: inserts into a table as 0002 left it and
/// into one with 0003's columns and indexes (rows without a key, and with
/// one), alternating, twice. Returns the lines to print.
pub fn inserts(fx: &mut Fixture) -> Vec<String> {
    let count = fx.settings.insert_rows;
    let before = table_migrated(fx, "inserts_0002", 2);
    let after = table_migrated(fx, "inserts_0003", 3);
    let url = fx.settings.database_url.clone();
    let mut lines = vec![format!(
        "producer inserts ({count} single-row INSERTs, each its own transaction, on one \
         connection; then one INSERT ... SELECT of {count} rows):"
    )];
    for round in 1..=2 {
        let (single_0002, bulk_0002) = insert_rates(&url, &before, count, false);
        let (single_none, bulk_none) = insert_rates(&url, &after, count, false);
        let (single_key, bulk_key) = insert_rates(&url, &after, count, true);
        lines.push(format!(
            "  run {round}: single-row {single_0002:.0}/s as 0002 left the table; with 0003 \
             {single_none:.0}/s ({:.2}) without a key, {single_key:.0}/s ({:.2}) with one",
            single_none / single_0002,
            single_key / single_0002
        ));
        lines.push(format!(
            "  run {round}: bulk {bulk_0002:.0} rows/s as 0002 left the table; with 0003 \
             {bulk_none:.0} rows/s ({:.2}) without a key, {bulk_key:.0} rows/s ({:.2}) with one",
            bulk_none / bulk_0002,
            bulk_key / bulk_0002
        ));
    }
    lines
}
