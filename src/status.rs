//! `outbox-poll status`: the backlog in figures, for people (a little
//! table) and for scripts (`--json`, exactly CONTRACT.md's object). Needs
//! no broker. `--fail-if-dead` and `--fail-if-oldest-over` turn it into a
//! monitoring check: exit 1 when a threshold is crossed.

use std::time::Duration;

use anyhow::Result;
use postgres::Client;

use crate::cli::StatusArgs;
use crate::config::Database;
use crate::db;
use crate::exit;
use crate::table::TableName;
use crate::watchdog::Watchdog;

/// The backlog of one table (or of one event type in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// Unpublished and not dead.
    pub pending: i64,
    /// Pending and available now.
    pub due: i64,
    /// Pending with at least one failed attempt.
    pub retrying: i64,
    /// Unpublished with attempts >= --max-attempts: never claimed again.
    pub dead: i64,
    /// Whole seconds since the oldest pending event was created.
    pub oldest_pending_age_s: Option<i64>,
}

impl Figures {
    /// CONTRACT.md's object (serde_json's preserve_order keeps the
    /// contract's field order).
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "pending": self.pending,
            "due": self.due,
            "retrying": self.retrying,
            "dead": self.dead,
            "oldest_pending_age_s": self.oldest_pending_age_s,
        })
    }

    /// The table's figures from its per-type ones: no second query.
    fn sum(types: &[(String, Figures)]) -> Figures {
        types
            .iter()
            .fold(Figures::default(), |total, (_, figures)| Figures {
                pending: total.pending + figures.pending,
                due: total.due + figures.due,
                retrying: total.retrying + figures.retrying,
                dead: total.dead + figures.dead,
                oldest_pending_age_s: total.oldest_pending_age_s.max(figures.oldest_pending_age_s),
            })
    }
}

/// One pass over the unpublished rows (the partial pending index covers
/// them); published rows, the bulk of an old table, are never read.
fn figures_sql(table: &str, group: bool) -> String {
    let (key, tail) = if group {
        ("event_type", " GROUP BY event_type ORDER BY event_type")
    } else {
        ("''", "")
    };
    format!(
        "SELECT {key}, \
           count(*) FILTER (WHERE attempts < $1::int), \
           count(*) FILTER (WHERE attempts < $1::int AND available_at <= now()), \
           count(*) FILTER (WHERE attempts < $1::int AND attempts > 0), \
           count(*) FILTER (WHERE attempts >= $1::int), \
           floor(extract(epoch FROM now() - min(created_at) FILTER (WHERE attempts < $1::int)))::bigint \
         FROM {table} WHERE published_at IS NULL{tail}"
    )
}

fn query(
    client: &mut Client,
    table: &TableName,
    max_attempts: i32,
    group: bool,
) -> Result<Vec<(String, Figures)>> {
    let rows = client
        .query(&figures_sql(&table.quoted(), group), &[&max_attempts])
        .map_err(|error| db::classify_on_table(&error, "counting the backlog", table))?;
    Ok(rows
        .iter()
        .map(|row| {
            (
                row.get(0),
                Figures {
                    pending: row.get(1),
                    due: row.get(2),
                    retrying: row.get(3),
                    dead: row.get(4),
                    oldest_pending_age_s: row.get(5),
                },
            )
        })
        .collect())
}

/// The table's figures, in one query.
pub fn figures(client: &mut Client, table: &TableName, max_attempts: i32) -> Result<Figures> {
    let rows = query(client, table, max_attempts, false)?;
    Ok(rows
        .first()
        .map(|(_, figures)| *figures)
        .unwrap_or_default())
}

pub fn run(database: &Database, json: bool, args: &StatusArgs) -> Result<u8> {
    let _watchdog = Watchdog::for_command(database.connect_timeout, "status")?;
    let mut client = db::connect(
        &database.config,
        database.connect_timeout,
        database.idle_limit(),
    )?;
    let by_type = match args.by_type {
        true => Some(query(
            &mut client,
            &database.table,
            database.max_attempts,
            true,
        )?),
        false => None,
    };
    let total = match &by_type {
        Some(types) => Figures::sum(types),
        None => figures(&mut client, &database.table, database.max_attempts)?,
    };
    if json {
        let mut object = total.to_json();
        if let Some(types) = &by_type {
            let types: serde_json::Map<String, serde_json::Value> = types
                .iter()
                .map(|(kind, figures)| (kind.clone(), figures.to_json()))
                .collect();
            object["by_type"] = types.into();
        }
        println!("{object}");
    } else {
        print!(
            "{}",
            table_text(&database.table, &total, by_type.as_deref())
        );
    }
    let crossed = thresholds_crossed(&total, args);
    for line in &crossed {
        eprintln!("outbox-poll: {line} in table {}", database.table);
    }
    Ok(if crossed.is_empty() {
        exit::SUCCESS
    } else {
        exit::PARTIAL_FAILURE
    })
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

pub fn plural(count: i64) -> &'static str {
    if count == 1 { "" } else { "s" }
}

/// The text for people: the totals, then (with --by-type) one line per type.
fn table_text(table: &TableName, total: &Figures, by_type: Option<&[(String, Figures)]>) -> String {
    let oldest = match total.oldest_pending_age_s {
        Some(age) => humantime::format_duration(Duration::from_secs(age.max(0) as u64)).to_string(),
        None => "-".into(),
    };
    let mut text = format!(
        "table           {table}\n\
         pending         {:>w$}\n\
         due             {:>w$}\n\
         retrying        {:>w$}\n\
         dead            {:>w$}\n\
         oldest pending  {oldest}\n",
        total.pending,
        total.due,
        total.retrying,
        total.dead,
        w = [total.pending, total.due, total.retrying, total.dead]
            .iter()
            .map(|n| n.to_string().len())
            .max()
            .unwrap_or(1),
    );
    if let Some(types) = by_type {
        let headers = ["event type", "pending", "due", "retrying", "dead"];
        let cells: Vec<[String; 5]> = types
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
                cells
                    .iter()
                    .map(|row| row[i].chars().count())
                    .chain([headers[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        text.push('\n');
        let line = |row: [&str; 5]| {
            let mut line = format!("{:<w$}", row[0], w = widths[0]);
            for i in 1..5 {
                line.push_str(&format!("  {:>w$}", row[i], w = widths[i]));
            }
            line.push('\n');
            line
        };
        text.push_str(&line(headers));
        for row in &cells {
            text.push_str(&line([&row[0], &row[1], &row[2], &row[3], &row[4]]));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keeps_the_contracts_field_order() {
        let figures = Figures {
            pending: 3,
            due: 2,
            retrying: 1,
            dead: 4,
            oldest_pending_age_s: None,
        };
        assert_eq!(
            figures.to_json().to_string(),
            r#"{"pending":3,"due":2,"retrying":1,"dead":4,"oldest_pending_age_s":null}"#
        );
    }

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
