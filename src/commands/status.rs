//! `outbox-poll status`: the backlog in figures, for people (a little
//! table) and for scripts (`--json`, exactly the contract's object). Needs
//! no broker. `--fail-if-dead` and `--fail-if-oldest-over` turn it into a
//! monitoring check: exit 1 when a threshold is crossed.

use std::time::Duration;

use anyhow::Result;

use crate::cli::StatusArgs;
use crate::config::Database;
use crate::connect::database;
use crate::exit::Exit;
use crate::guard::watchdog::Watchdog;
use crate::report::{plural, stdout};
use crate::sql::figures::{self, Figures};
use crate::sql::table::TableName;

pub fn run(database: &Database, json: bool, args: &StatusArgs) -> Result<Exit> {
    let _watchdog = Watchdog::for_command(database.connect_budget(), "status")?;
    let mut client = database::connect(
        &database.conninfo,
        database.connect_timeout,
        database.command_idle_limit(),
        None,
    )?;
    let (table, max_attempts) = (&database.table, database.max_attempts);
    let by_type = match args.by_type {
        true => Some(figures::by_type(&mut client, table, max_attempts)?),
        false => None,
    };
    let total = match &by_type {
        Some(types) => Figures::sum(types),
        None => figures::of_table(&mut client, table, max_attempts)?,
    };
    let text = match json {
        true => json_text(&total, by_type.as_deref()),
        false => table_text(table, &total, by_type.as_deref()),
    };
    stdout::write(text.as_bytes()).map_err(stdout::unwritable)?;
    let crossed = thresholds_crossed(&total, args);
    for line in &crossed {
        eprintln!("outbox-poll: {line} in table {table}");
    }
    Ok(match crossed.is_empty() {
        true => Exit::Success,
        false => Exit::EventsFailed,
    })
}

/// The contract's object, and with --by-type a `by_type` object keyed by
/// event type, each with the same five fields.
fn json_text(total: &Figures, by_type: Option<&[(String, Figures)]>) -> String {
    let mut object = total.to_json();
    if let Some(types) = by_type {
        let types: serde_json::Map<String, serde_json::Value> = types
            .iter()
            .map(|(kind, figures)| (kind.clone(), figures.to_json()))
            .collect();
        object["by_type"] = types.into();
    }
    format!("{object}\n")
}

/// What --fail-if-dead and --fail-if-oldest-over found, one line each.
fn thresholds_crossed(figures: &Figures, args: &StatusArgs) -> Vec<String> {
    let mut crossed = Vec::new();
    if args.fail_if_dead && figures.dead > 0 {
        crossed.push(format!(
            "{} dead event{} (see `outbox-poll requeue --dead`)",
            figures.dead,
            plural(figures.dead)
        ));
    }
    if let (Some(limit), Some(age)) = (args.fail_if_oldest_over, figures.oldest_pending_age_s)
        && Duration::from_secs(age.max(0) as u64) > limit
    {
        crossed.push(format!(
            "the oldest pending event is {} old, over the {} allowed",
            humantime::format_duration(Duration::from_secs(age.max(0) as u64)),
            humantime::format_duration(limit)
        ));
    }
    crossed
}

/// The text for people: the totals, then (with --by-type) one line per type.
fn table_text(table: &TableName, total: &Figures, by_type: Option<&[(String, Figures)]>) -> String {
    let mut text = totals_text(table, total);
    if let Some(types) = by_type {
        text.push('\n');
        text.push_str(&types_text(types));
    }
    text
}

/// The table's figures, one per line, right-aligned.
fn totals_text(table: &TableName, total: &Figures) -> String {
    let oldest = match total.oldest_pending_age_s {
        Some(age) => humantime::format_duration(Duration::from_secs(age.max(0) as u64)).to_string(),
        None => "-".into(),
    };
    let counts = [total.pending, total.due, total.retrying, total.dead];
    let w = counts
        .iter()
        .map(|n| n.to_string().len())
        .max()
        .unwrap_or(1);
    format!(
        "table           {table}\n\
         pending         {:>w$}\n\
         due             {:>w$}\n\
         retrying        {:>w$}\n\
         dead            {:>w$}\n\
         oldest pending  {oldest}\n",
        counts[0], counts[1], counts[2], counts[3],
    )
}

/// One aligned line per event type, under a header.
fn types_text(types: &[(String, Figures)]) -> String {
    let headers = ["event type", "pending", "due", "retrying", "dead"].map(String::from);
    let rows: Vec<[String; 5]> = types
        .iter()
        .map(|(kind, f)| {
            [
                kind.clone(),
                f.pending.to_string(),
                f.due.to_string(),
                f.retrying.to_string(),
                f.dead.to_string(),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..5)
        .map(|i| {
            rows.iter()
                .chain([&headers])
                .map(|row| row[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = String::new();
    for row in [&headers].into_iter().chain(&rows) {
        text.push_str(&format!("{:<w$}", row[0], w = widths[0]));
        for i in 1..5 {
            text.push_str(&format!("  {:>w$}", row[i], w = widths[i]));
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_aligned() {
        let table = TableName::parse("app.outbox").unwrap();
        let total = Figures {
            pending: 12,
            due: 3,
            retrying: 1,
            dead: 0,
            oldest_pending_age_s: Some(3661),
        };
        let types = [
            ("a".to_string(), total),
            (
                "order.created".to_string(),
                Figures {
                    pending: 1,
                    ..total
                },
            ),
        ];
        assert_eq!(
            table_text(&table, &total, Some(&types)),
            "table           app.outbox\n\
             pending         12\n\
             due              3\n\
             retrying         1\n\
             dead             0\n\
             oldest pending  1h 1m 1s\n\
             \n\
             event type     pending  due  retrying  dead\n\
             a                   12    3         1     0\n\
             order.created        1    3         1     0\n"
        );
    }
}
