//! `outbox-poll requeue`: make events eligible again, once whatever made
//! them fail is fixed. attempts goes back to 0, last_error is cleared and
//! available_at is now, so the next run claims them.
//!
//! Only unpublished events are touched: requeueing never re-sends an event
//! the broker already confirmed. Named ids that are unknown or already
//! published are reported on stderr, one line each, and make the exit code 1.

use std::collections::BTreeSet;

use anyhow::Result;

use crate::cli::RequeueArgs;
use crate::config::Database;
use crate::db;
use crate::exit;
use crate::status::plural;
use crate::watchdog::Watchdog;

const RESET: &str = "attempts = 0, last_error = NULL, available_at = now()";

pub fn run(database: &Database, json: bool, args: &RequeueArgs) -> Result<u8> {
    let _watchdog = Watchdog::for_command(database.connect_timeout, "requeue")?;
    let mut client = db::connect(
        &database.config,
        database.connect_timeout,
        database.idle_limit(),
    )?;
    let table = &database.table;
    let on_table = |error: postgres::Error| db::classify_on_table(&error, "requeueing", table);
    let (requeued, unknown, published) = if args.dead {
        let count = client
            .execute(
                &format!(
                    "UPDATE {} SET {RESET} WHERE published_at IS NULL AND attempts >= $1::int",
                    table.quoted()
                ),
                &[&database.max_attempts],
            )
            .map_err(on_table)?;
        (count as i64, Vec::new(), Vec::new())
    } else {
        let wanted: Vec<&str> = args
            .event_id
            .iter()
            .map(String::as_str)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // One statement: the update and, for the report, every named row.
        let rows = client
            .query(
                &format!(
                    "WITH requeued AS ( \
                       UPDATE {t} SET {RESET} \
                       WHERE event_id = ANY($1) AND published_at IS NULL \
                       RETURNING event_id) \
                     SELECT w.id, r.event_id IS NOT NULL, o.event_id IS NOT NULL \
                     FROM unnest($1::text[]) AS w(id) \
                     LEFT JOIN requeued r ON r.event_id = w.id \
                     LEFT JOIN {t} o ON o.event_id = w.id \
                     ORDER BY w.id",
                    t = table.quoted()
                ),
                &[&wanted],
            )
            .map_err(on_table)?;
        let mut requeued = 0;
        let (mut unknown, mut published) = (Vec::new(), Vec::new());
        for row in &rows {
            let id: String = row.get(0);
            match (row.get::<_, bool>(1), row.get::<_, bool>(2)) {
                (true, _) => requeued += 1,
                (false, true) => published.push(id),
                (false, false) => unknown.push(id),
            }
        }
        (requeued, unknown, published)
    };
    for id in &unknown {
        eprintln!("outbox-poll: unknown event id: {id}");
    }
    for id in &published {
        eprintln!("outbox-poll: event id {id} is already published; left as it is");
    }
    if json {
        println!(
            "{}",
            serde_json::json!({
                "requeued": requeued,
                "unknown": unknown,
                "already_published": published,
            })
        );
    } else {
        println!("requeued {requeued} event{}", plural(requeued));
    }
    Ok(if unknown.is_empty() && published.is_empty() {
        exit::SUCCESS
    } else {
        exit::PARTIAL_FAILURE
    })
}
