//! Issue 22's goals, each a ratio to a baseline measured beside it in the
//! same run: a bytea payload table against the same events as jsonb, and
//! events spread over 10 per-row exchanges against one exchange. Each
//! shape is drained twice, interleaved with its baseline (A B A B), and
//! the better of each pair is compared, so that a burst of load from
//! elsewhere on a shared machine does not decide the ratio alone.

use lapin::ExchangeKind;
use lapin::options::{ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions};
use lapin::types::FieldTable;

use crate::common::{Figure, Fixture};

/// The batch size of the comparisons: the drains' middle one.
const BATCH: &str = "1000";

/// The exchanges of the per-row comparison.
const EXCHANGES: i64 = 10;

/// The figures and a note with each ratio against its goal.
pub fn payloads(fx: &mut Fixture) -> (Vec<Figure>, Vec<String>) {
    let events = fx.settings.events;
    let mut figures = Vec::new();
    let mut notes = Vec::new();

    // bytea: the same bytes as the jsonb prints, so the bodies and the
    // --batch-bytes budget are the same; only the column's type differs.
    let (mut jsonb, mut bytea) = (0.0f64, 0.0f64);
    for round in 1..=2 {
        let figure = drain(fx, format!("jsonb payload, batch {BATCH} ({round})"), None);
        jsonb = jsonb.max(figure.rate());
        figures.push(figure);
        let figure = drain(
            fx,
            format!("bytea payload, same bytes, batch {BATCH} ({round})"),
            Some(
                "ALTER TABLE {table} ALTER COLUMN payload TYPE bytea \
                  USING convert_to(payload::text, 'UTF8')",
            ),
        );
        bytea = bytea.max(figure.rate());
        figures.push(figure);
        fx.db
            .batch_execute(&format!(
                "ALTER TABLE {} ALTER COLUMN payload TYPE jsonb \
                 USING convert_from(payload, 'UTF8')::jsonb",
                fx.table()
            ))
            .unwrap();
    }
    notes.push(format!(
        "bytea against jsonb, {events} events, best of two each: {:.3}x (goal >= 0.95)",
        bytea / jsonb
    ));

    // Per-row exchanges: the events spread over 10 exchanges, all bound to
    // the bench's queue, so every arrival is verified as in any drain.
    let names: Vec<String> = (0..EXCHANGES)
        .map(|n| format!("{}.x{n}", fx.name))
        .collect();
    declare_bound(fx, &names);
    let spread = format!(
        "UPDATE {{table}} SET exchange = '{}.x' || (id % {EXCHANGES})",
        fx.name
    );
    let (mut single, mut spread_rate) = (0.0f64, 0.0f64);
    for round in 1..=2 {
        let figure = drain(fx, format!("one exchange, batch {BATCH} ({round})"), None);
        single = single.max(figure.rate());
        figures.push(figure);
        let figure = drain(
            fx,
            format!("{EXCHANGES} per-row exchanges, batch {BATCH} ({round})"),
            Some(&spread),
        );
        spread_rate = spread_rate.max(figure.rate());
        figures.push(figure);
    }
    delete(fx, &names);
    notes.push(format!(
        "{EXCHANGES} per-row exchanges against one, {events} events, best of two each: \
         {:.3}x (goal >= 0.9)",
        spread_rate / single
    ));
    (figures, notes)
}

/// A drain of the bench's events at batch 1000, the table first changed by
/// `change` (SQL; `{table}` is the table) after the fill.
fn drain(fx: &mut Fixture, name: String, change: Option<&str>) -> Figure {
    let events = fx.settings.events;
    fx.fill(events, 200);
    if let Some(change) = change {
        let table = fx.table();
        fx.db
            .batch_execute(&format!(
                "{}; ANALYZE {table}",
                change.replace("{table}", &table)
            ))
            .unwrap();
    }
    let args = ["--drain", "--batch-size", BATCH, "--json"];
    fx.measure(&crate::common::binary(), name, events, 1, &args)
}

fn declare_bound(fx: &Fixture, names: &[String]) {
    fx.runtime.block_on(async {
        for name in names {
            let options = ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            };
            let table = FieldTable::default();
            fx.channel
                .exchange_declare(name.as_str().into(), ExchangeKind::Topic, options, table)
                .await
                .unwrap();
            fx.channel
                .queue_bind(
                    fx.name.as_str().into(),
                    name.as_str().into(),
                    "#".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
    });
}

fn delete(fx: &Fixture, names: &[String]) {
    fx.runtime.block_on(async {
        for name in names {
            let _ = fx
                .channel
                .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
    });
}
