//! `outbox-poll status`: the backlog in figures, for people (a little
//! table) and for scripts (`--json`, exactly the object docs/src/operating.md gives). Needs
//! no broker. `--fail-if-dead`, `--fail-if-oldest-over` and `--max-age`
//! turn it into a monitoring check: exit 1 when a threshold is crossed.

use std::time::Duration;

use anyhow::Result;

use crate::cli::StatusArgs;
use crate::config::Database;
use crate::exit::Exit;
use crate::guard::watchdog::Watchdog;
use crate::plan::Selection;
use crate::report::{plural, stderr, stdout};
use crate::sql::figures::{self, DeadTuples, Figures, HeldBack, HeldKey, MEANINGFUL_VERSIONS};
use crate::sql::table::TableName;

pub fn run(database: &Database, json: bool, args: &StatusArgs) -> Result<Exit> {
    // The figures (the column lookup, one or by type), the held-back age
    // (the column lookup, a transaction of four statements) and the
    // dead-tuple ratio.
    let _watchdog = Watchdog::for_command(database.connect_budget(), 9, "status")?;
    let mut client = super::connect(database)?;
    let (table, max_attempts) = (&database.table, database.max_attempts);
    let by_type = match args.by_type {
        true => Some(figures::by_type(&mut client, table, max_attempts)?),
        false => None,
    };
    let total = match &by_type {
        Some(types) => Figures::sum(types),
        None => figures::of_table(&mut client, table, max_attempts)?,
    };
    let beyond = Beyond {
        held_back: figures::held_back(&mut client, table, max_attempts)?,
        dead_tuples: figures::dead_tuples(&mut client, table)?,
        held_back_keys: figures::held_back_keys(&mut client, table, max_attempts)?,
        held_keys: figures::held_keys(&mut client, table, max_attempts)?.unwrap_or_default(),
    };
    let text = match json {
        true => json_text(&total, &beyond, by_type.as_deref()),
        false => table_text(table, &total, &beyond, by_type.as_deref()),
    };
    stdout::write(text.as_bytes()).map_err(stdout::unwritable)?;
    let crossed = thresholds_crossed(&total, args);
    for line in &crossed {
        stderr::line(&format!("outbox-poll: {line} in table {table}"));
    }
    Ok(match crossed.is_empty() {
        true => Exit::Success,
        false => Exit::EventsFailed,
    })
}

/// `status` over the outboxes of a selection: each one's figures (as
/// the documented object, in `outboxes` with `--json`), and the totals
/// over them. An outbox that cannot be read is told on stderr and makes
/// the exit its own (69, 78); the others are still reported.
pub fn run_many(selection: &Selection, json: bool, args: &StatusArgs) -> Result<Exit> {
    let outboxes = u32::try_from(selection.servers.len() * 2 + 4).unwrap_or(u32::MAX);
    let _watchdog = Watchdog::for_command(selection.connect_budget(), outboxes, "status")?;
    let (all, mut plan) = super::each(selection)?;
    let mut total = Figures::default();
    let mut each = Vec::new();
    let mut exits = Vec::new();
    for (database, name) in all {
        let figures = database.and_then(|database| {
            let at = plan
                .clients
                .iter()
                .position(|(server, _)| selection.servers[*server].conninfo == database.conninfo);
            let figures = match at {
                Some(at) => figures::of_table(
                    &mut plan.clients[at].1,
                    &database.table,
                    database.max_attempts,
                ),
                None => {
                    let mut client = super::connect(&database)?;
                    figures::of_table(&mut client, &database.table, database.max_attempts)
                }
            };
            Ok((database, figures?))
        });
        match figures {
            Ok((database, figures)) => {
                total = Figures::sum(&[(String::new(), total), (String::new(), figures)]);
                let crossed = thresholds_crossed(&figures, args);
                for line in &crossed {
                    stderr::line(&format!("outbox-poll: {line} in {name}"));
                }
                exits.push(match crossed.is_empty() {
                    true => Exit::Success,
                    false => Exit::EventsFailed,
                });
                each.push((name, database, figures));
            }
            Err(error) => {
                stderr::line(&format!("outbox-poll: error: {name}: {error:#}"));
                exits.push(Exit::of(&error));
            }
        }
    }
    let text = match json {
        true => {
            let mut object = total.to_json();
            object["oldest_due_age_s"] = total.oldest_due_age_s.into();
            if each.len() > 1 {
                let outboxes: Vec<serde_json::Value> = each
                    .iter()
                    .map(|(_, database, figures)| {
                        let mut one = super::outbox_json(database, &figures.to_json());
                        one["oldest_due_age_s"] = figures.oldest_due_age_s.into();
                        one
                    })
                    .collect();
                object["outboxes"] = outboxes.into();
            }
            format!("{object}\n")
        }
        false => {
            let mut text = String::new();
            for (name, _, figures) in &each {
                text.push_str(&format!(
                    "{name}: pending {}, due {}, retrying {}, dead {}, expired {}\n",
                    figures.pending, figures.due, figures.retrying, figures.dead, figures.expired
                ));
            }
            text.push_str(&format!(
                "{}: pending {}, due {}, retrying {}, dead {}, expired {}\n",
                super::total_over(each.len()),
                total.pending,
                total.due,
                total.retrying,
                total.dead,
                total.expired
            ));
            text
        }
    };
    stdout::write(text.as_bytes()).map_err(stdout::unwritable)?;
    Ok(crate::relay::many::most_urgent(exits.into_iter()))
}

/// What status reports beyond its first five figures.
#[derive(Debug, Default)]
struct Beyond {
    /// How long the ordered modes have been held back (None: they are not).
    held_back: Option<HeldBack>,
    /// Dead row versions over all row versions (None: not counted yet).
    dead_tuples: DeadTuples,
    /// Keys held back by a failed head (None: the table has no
    /// ordering_key column).
    held_back_keys: Option<i64>,
    /// Those keys, the oldest heads first (at most HELD_KEYS_LISTED).
    held_keys: Vec<HeldKey>,
}

/// The five figures' object, then `ordered_held_back_s`, `dead_tuple_ratio`,
/// `oldest_due_age_s` and `held_back_keys` (each null when there is none),
/// and with --by-type, last, a `by_type`
/// object keyed by event type, each with those five fields.
fn json_text(total: &Figures, beyond: &Beyond, by_type: Option<&[(String, Figures)]>) -> String {
    let mut object = total.to_json();
    object["ordered_held_back_s"] = beyond.held_back.as_ref().map(|held| held.age_s).into();
    object["dead_tuple_ratio"] = beyond.dead_tuples.ratio.into();
    object["oldest_due_age_s"] = total.oldest_due_age_s.into();
    object["held_back_keys"] = beyond.held_back_keys.into();
    object["keys_held_back"] = beyond
        .held_keys
        .iter()
        .map(|held| {
            serde_json::json!({
                "key": held.key,
                "waiting": held.waiting,
                "since": held.since,
                "last_error": held.last_error,
            })
        })
        .collect::<Vec<_>>()
        .into();
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
    if let (Some(limit), Some(age)) = (args.max_age, figures.oldest_due_age_s)
        && Duration::from_secs(age.max(0) as u64) > limit
    {
        crossed.push(format!(
            "the oldest due event is {} old, over --max-age {}",
            humantime::format_duration(Duration::from_secs(age.max(0) as u64)),
            humantime::format_duration(limit)
        ));
    }
    crossed
}

/// The text for people: the totals, then (with --by-type) one line per type.
fn table_text(
    table: &TableName,
    total: &Figures,
    beyond: &Beyond,
    by_type: Option<&[(String, Figures)]>,
) -> String {
    let mut text = totals_text(table, total);
    text.push_str(&held_back_line(beyond.held_back.as_ref()));
    if let Some(keys) = beyond.held_back_keys {
        text.push_str(&format!("held-back keys  {keys}\n"));
    }
    for held in &beyond.held_keys {
        let (waiting, s) = (held.waiting, plural(held.waiting));
        let error = held.last_error.as_deref().unwrap_or("-");
        text.push_str(&format!(
            "  key {:?}: {waiting} event{s} waiting since {}, the head's last error: {error}\n",
            held.key, held.since
        ));
    }
    text.push_str(&dead_tuples_line(beyond.dead_tuples));
    if let Some(types) = by_type {
        text.push('\n');
        text.push_str(&types_text(types));
    }
    text
}

/// The table's figures, one per line, right-aligned.
fn totals_text(table: &TableName, total: &Figures) -> String {
    let age = |age: Option<i64>| match age {
        Some(age) => humantime::format_duration(Duration::from_secs(age.max(0) as u64)).to_string(),
        None => "-".into(),
    };
    let (oldest, oldest_due) = (age(total.oldest_pending_age_s), age(total.oldest_due_age_s));
    let counts = [
        total.pending,
        total.due,
        total.retrying,
        total.dead,
        total.expired,
    ];
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
         expired         {:>w$}\n\
         oldest pending  {oldest}\n\
         oldest due      {oldest_due}\n",
        counts[0], counts[1], counts[2], counts[3], counts[4],
    )
}

/// How long the ordered modes have been held back, and by which session.
fn held_back_line(held_back: Option<&HeldBack>) -> String {
    let Some(held) = held_back else {
        return "held back       -\n".into();
    };
    let age = humantime::format_duration(Duration::from_secs(held.age_s.max(0) as u64));
    match held.pid {
        Some(pid) => format!(
            "held back       {age} (the ordered modes wait for the open transaction of pid {pid})\n"
        ),
        None => format!("held back       {age} (the ordered modes wait for an open transaction)\n"),
    }
}

/// The dead-tuple ratio as a percentage, `-` when unknown, and not as a
/// figure at all on a table too small for it to mean anything.
fn dead_tuples_line(dead: DeadTuples) -> String {
    match dead.ratio {
        Some(_) if dead.versions < MEANINGFUL_VERSIONS => format!(
            "dead tuples     - ({} row versions: too few to matter, under {MEANINGFUL_VERSIONS})\n",
            dead.versions
        ),
        Some(ratio) => format!("dead tuples     {:.1}%\n", 100.0 * ratio),
        None => "dead tuples     -\n".into(),
    }
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
            expired: 2,
            oldest_due_age_s: Some(61),
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
        let beyond = Beyond {
            held_back: Some(HeldBack {
                age_s: 125,
                pid: Some(4242),
            }),
            dead_tuples: DeadTuples {
                ratio: Some(0.125),
                versions: 8000,
            },
            held_back_keys: Some(2),
            held_keys: vec![HeldKey {
                key: "order-7".into(),
                waiting: 3,
                since: "2026-12-03T10:00:00+00:00".into(),
                last_error: Some("returned: NO_ROUTE".into()),
            }],
        };
        assert_eq!(
            table_text(&table, &total, &beyond, Some(&types)),
            "table           app.outbox\n\
             pending         12\n\
             due              3\n\
             retrying         1\n\
             dead             0\n\
             expired          2\n\
             oldest pending  1h 1m 1s\n\
             oldest due      1m 1s\n\
             held back       2m 5s (the ordered modes wait for the open transaction of pid 4242)\n\
             held-back keys  2\n\
             \x20 key \"order-7\": 3 events waiting since 2026-12-03T10:00:00+00:00, the head's last error: returned: NO_ROUTE\n\
             dead tuples     12.5%\n\
             \n\
             event type     pending  due  retrying  dead\n\
             a                   12    3         1     0\n\
             order.created        1    3         1     0\n"
        );
    }

    #[test]
    fn json_puts_the_held_back_age_and_the_dead_tuple_ratio_after_the_five_and_by_type_last() {
        let figures = Figures {
            pending: 1,
            ..Figures::default()
        };
        let types = [("a".to_string(), figures)];
        let beyond = Beyond {
            dead_tuples: DeadTuples {
                ratio: Some(0.5),
                versions: 8000,
            },
            ..Beyond::default()
        };
        let text = json_text(&figures, &beyond, Some(&types));
        let keys: Vec<String> =
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&text)
                .unwrap()
                .keys()
                .cloned()
                .collect();
        assert_eq!(
            keys,
            [
                "pending",
                "due",
                "retrying",
                "dead",
                "oldest_pending_age_s",
                "expired",
                "ordered_held_back_s",
                "dead_tuple_ratio",
                "oldest_due_age_s",
                "held_back_keys",
                "keys_held_back",
                "by_type"
            ]
        );
        assert!(text.contains(r#""dead_tuple_ratio":0.5,"#), "{text}");
        let unknown = json_text(&figures, &Beyond::default(), None);
        assert!(unknown.contains(
            r#""ordered_held_back_s":null,"dead_tuple_ratio":null,"oldest_due_age_s":null,"held_back_keys":null,"keys_held_back":[]"#
        ));
    }
}
