//! `outbox-poll check`: can this configuration relay? It takes a poll's
//! options and looks at everything a run would need, in the order a run
//! needs it, without publishing or changing anything:
//!
//! - `postgresql`: the server is reachable, takes writes, and where (host,
//!   port, TLS or not);
//! - `table`: the table exists (the shape lookup every run starts with);
//! - `columns`: every column the run would use is there: the run's own
//!   claim and marks are prepared (never executed);
//! - `grants`: the role holds SELECT and UPDATE on the columns the run
//!   reads and writes, and DELETE with `--on-publish delete`, as the
//!   catalog says (has_column_privilege, has_table_privilege): nothing is
//!   executed on the table that a trigger could see;
//! - `rabbitmq`: a node of the list accepts the login, and which;
//! - `exchange`: the exchange exists (a passive declare), or the run would
//!   declare it (`--declare-exchange`; check itself declares nothing);
//! - `publish`: the user may write to it (see `broker::probe`: a publish
//!   in a channel transaction, rolled back).
//!
//! One line per check on stdout, then a verdict. The database's checks and
//! the broker's are two chains: within one, a check after a failed one is
//! skipped; the broker's run whatever the database's gave. With many
//! outboxes selected, the database's chain runs for each outbox (on the
//! session the selection's plan opened for its database, where it kept
//! one) and the broker's once. Exit 0 when every check passed, else the
//! most urgent failure's code (78 before 69), that failure named on stderr
//! in one line.

use std::time::Duration;

use anyhow::{Result, anyhow};
use postgres::Client;
use serde_json::{Value, json};

use crate::broker::probe;
use crate::cli::CheckArgs;
use crate::config::{Database, Relay};
use crate::connect::database::STATEMENT_TIMEOUT;
use crate::connect::pg_error::READ_ONLY_ADVICE;
use crate::exit::{self, Exit};
use crate::guard::watchdog::{MARGIN, Watchdog};
use crate::plan::Selection;
use crate::relay::many::most_urgent;
use crate::report::totals::Totals;
use crate::report::{stderr, stdout};
use crate::sql::check::{self as sql, Session};
use crate::sql::columns;
use crate::sql::outbox::{OnPublish, Outbox};

/// The database's checks, in the order they run: each needs the one before.
const DATABASE_CHECKS: [&str; 4] = ["postgresql", "table", "columns", "grants"];

/// The statements of one outbox's checks: the session's settings, the
/// shape lookup (twice: the table check's and the preparation's), the
/// claim and the marks prepared (at most eight statements), the grants.
const STATEMENTS_PER_OUTBOX: u32 = 13;

/// What the steps of the check are called in messages.
const CHECKING: &str = "the check's lookup";

/// One check's outcome.
enum Outcome {
    Passed(String),
    Failed(anyhow::Error),
    /// An earlier check of the same chain failed: this one could not run.
    Skipped(&'static str),
}

/// One check, as it is printed.
struct Check {
    name: &'static str,
    /// The outbox a database check is about, with many outboxes selected:
    /// its database (host, port, name: never a password) and its table.
    outbox: Option<(String, String)>,
    outcome: Outcome,
}

/// `check` on the one outbox of `database`.
pub fn run(database: &Database, json: bool, args: &CheckArgs) -> Result<Exit> {
    let relay = Relay::from_args(&args.poll, database)?;
    let watchdog = Watchdog::spawn(|_| {})?;
    let whole = budget(database.connect_budget(), 1, &relay);
    watchdog.arm(whole, "checking", Totals::default());
    let mut passed = Vec::new();
    let failure = database_chain(database, &relay, None, &mut passed).err();
    let mut checks = chain(&DATABASE_CHECKS, passed, failure, None);
    checks.extend(broker_checks(&relay));
    report(&checks, json)
}

/// `check` on each outbox of a selection (see the module's comment).
pub fn run_many(selection: &Selection, json: bool, args: &CheckArgs) -> Result<Exit> {
    let relay = Relay::for_sessions(
        &args.poll,
        selection.connect_timeout,
        selection.connect_budget(),
        selection.most_hosts(),
    )?;
    let watchdog = Watchdog::spawn(|_| {})?;
    let per_connect = selection.connect_budget();
    // The plan: each database's connect and its few catalog statements.
    let servers = u32::try_from(selection.servers.len()).unwrap_or(u32::MAX);
    let plan_budget = per_connect
        .saturating_mul(servers)
        .saturating_add(STATEMENT_TIMEOUT.saturating_mul(servers.saturating_mul(4)))
        .saturating_add(MARGIN);
    watchdog.arm(plan_budget, "resolving the selection", Totals::default());
    let mut plan = super::plan(selection)?;
    let outboxes = plan.outboxes.len() + plan.unread.len();
    // A connect for each outbox whose database the plan kept no session of.
    let connects = per_connect.saturating_mul(u32::try_from(outboxes).unwrap_or(u32::MAX));
    watchdog.arm(
        budget(connects, outboxes, &relay),
        "checking",
        Totals::default(),
    );
    let mut checks = Vec::new();
    for unread in plan.unread.drain(..) {
        // The plan could not read the database, or a table listed by name
        // is not in it: the first check it stopped at failed.
        let (passed, outbox) = match unread.table {
            Some(table) => (vec![format!("{} was read", unread.label)], table),
            None => (Vec::new(), selection.spec.clone()),
        };
        let outbox = Some((unread.label, outbox));
        checks.extend(chain(&DATABASE_CHECKS, passed, Some(unread.error), outbox));
    }
    for planned in &plan.outboxes {
        let database = &planned.database;
        let pooled = plan
            .clients
            .iter_mut()
            .find(|(server, _)| *server == planned.server)
            .map(|(_, client)| client);
        let mut passed = Vec::new();
        let failure = database_chain(database, &relay, pooled, &mut passed).err();
        let outbox = Some((planned.label.clone(), database.table.to_string()));
        checks.extend(chain(&DATABASE_CHECKS, passed, failure, outbox));
    }
    checks.extend(broker_checks(&relay));
    report(&checks, json)
}

/// The budget of the checks, should a server stop answering in the middle
/// of a statement (the driver would wait on it for ever): the database
/// connects, each outbox's statements, and the broker's steps (its
/// connect, then two channels, a declare, tx.select and the publish).
fn budget(connects: Duration, outboxes: usize, relay: &Relay) -> Duration {
    let broker = &relay.broker;
    let statements = u32::try_from(outboxes)
        .unwrap_or(u32::MAX)
        .saturating_mul(STATEMENTS_PER_OUTBOX);
    let broker_steps = broker.connect_budget() + 5 * broker.connect_timeout;
    connects
        .saturating_add(STATEMENT_TIMEOUT.saturating_mul(statements))
        .saturating_add(broker_steps + MARGIN)
}

/// The database's checks on one outbox, in order (DATABASE_CHECKS): the
/// detail of each that passes goes to `passed`; the first that fails ends
/// them with its error. `pooled` is a session already open on the
/// outbox's database, if there is one.
fn database_chain(
    database: &Database,
    relay: &Relay,
    pooled: Option<&mut Client>,
    passed: &mut Vec<String>,
) -> Result<()> {
    let mut own;
    let client = match pooled {
        Some(client) => client,
        None => {
            own = super::connect(database)?;
            &mut own
        }
    };
    let session = sql::session(client)?;
    let place = place(database, &session);
    if session.read_only {
        return Err(exit::outage(anyhow!(
            "PostgreSQL at {place} takes no writes: {READ_ONLY_ADVICE}"
        )));
    }
    passed.push(format!(
        "reachable at {place}, database {} as role {}, {}, PostgreSQL {}",
        session.database,
        session.user,
        match &session.tls {
            Some(version) => format!("TLS ({version})"),
            None => "without TLS".into(),
        },
        session.server_version
    ));
    let table = &database.table;
    let shape = columns::of_table(client, table, CHECKING)?;
    passed.push(format!(
        "table {table} exists (payload {})",
        shape.payload_type.as_deref().unwrap_or("missing")
    ));
    // Prepared as the run prepares them, marks included. With --on-publish
    // delete the run also executes its DELETE on no rows, which a
    // statement trigger would see; the check leaves the DELETE to the
    // grants check, and the marks it prepares read the same columns.
    let order = relay.order();
    let mut outbox = Outbox::prepare(client, table, database.max_attempts, order, OnPublish::Mark)?;
    outbox.prepare_marks(client)?;
    passed.push("every column the run uses is there: its claim and its marks prepare".into());
    sql::grants(
        client,
        table,
        &session.user,
        &shape,
        order,
        relay.on_publish,
    )?;
    passed.push(format!(
        "role {} holds SELECT and UPDATE on the columns the run reads and writes{}",
        session.user,
        match relay.on_publish {
            OnPublish::Delete => ", and DELETE",
            OnPublish::Mark => "",
        }
    ));
    Ok(())
}

/// Where the session is: the host and port the URL names, or the server's
/// own address when the URL lists several.
fn place(database: &Database, session: &Session) -> String {
    let targets = &database.conninfo.targets;
    if let [one] = targets.as_slice() {
        return one.to_string();
    }
    let server = match &session.address {
        Some((address, port)) if address.contains(':') => format!("[{address}]:{port}"),
        Some((address, port)) => format!("{address}:{port}"),
        None => "a local socket".into(),
    };
    format!("{server} (of the {} hosts listed)", targets.len())
}

/// The broker's checks, once.
fn broker_checks(relay: &Relay) -> Vec<Check> {
    let mut passed = Vec::new();
    let failure = probe::run(&relay.broker, &mut passed).err();
    chain(&probe::CHECKS, passed, failure, None)
}

/// A chain's checks from what its run gave: the first `passed.len()`
/// passed, the next one failed with `failure`, the rest were skipped.
fn chain(
    names: &[&'static str],
    passed: Vec<String>,
    failure: Option<anyhow::Error>,
    outbox: Option<(String, String)>,
) -> Vec<Check> {
    let failed_at = passed.len();
    let mut outcomes: Vec<Outcome> = passed.into_iter().map(Outcome::Passed).collect();
    if let Some(error) = failure {
        outcomes.push(Outcome::Failed(error));
        outcomes.resize_with(names.len(), || Outcome::Skipped(names[failed_at]));
    }
    names
        .iter()
        .zip(outcomes)
        .map(|(name, outcome)| Check {
            name,
            outbox: outbox.clone(),
            outcome,
        })
        .collect()
}

/// Prints the checks (lines, or one JSON object) and the verdict; the most
/// urgent failure goes to stderr. Returns the exit.
fn report(checks: &[Check], json: bool) -> Result<Exit> {
    let (exit, worst, failed) = verdict(checks);
    let printed = match json {
        true => stdout::line(&as_json(checks, exit).to_string()),
        false => lines(checks, worst.map(|(check, _)| check), exit),
    };
    printed.map_err(stdout::unwritable)?;
    if let Some((check, error)) = worst {
        let others = match failed - 1 {
            0 => String::new(),
            more => format!(" ({more} more failed: see stdout)"),
        };
        stderr::line(&format!(
            "outbox-poll: error: check {}{} failed: {error:#}{others}",
            check.name,
            at(check)
        ));
    }
    Ok(exit)
}

/// The exit (the most urgent failure's), the first check that failed so,
/// and how many failed.
fn verdict(checks: &[Check]) -> (Exit, Option<(&Check, &anyhow::Error)>, usize) {
    let failures: Vec<(&Check, &anyhow::Error)> = checks
        .iter()
        .filter_map(|check| match &check.outcome {
            Outcome::Failed(error) => Some((check, error)),
            _ => None,
        })
        .collect();
    let exit = most_urgent(failures.iter().map(|(_, error)| Exit::of(error)));
    let worst = failures
        .iter()
        .find(|(_, error)| Exit::of(error) == exit)
        .copied();
    (exit, worst, failures.len())
}

/// How a check's outcome is shown: its status and its detail.
fn shown(outcome: &Outcome) -> (&'static str, String) {
    match outcome {
        Outcome::Passed(detail) => ("ok", detail.clone()),
        Outcome::Failed(error) => ("failed", format!("{error:#}")),
        Outcome::Skipped(after) => ("skipped", format!("not run: {after} failed")),
    }
}

/// ` (database D, table T)` for a database check of many outboxes.
fn at(check: &Check) -> String {
    match &check.outbox {
        Some((database, table)) => format!(" (database {database}, table {table})"),
        None => String::new(),
    }
}

fn lines(checks: &[Check], worst: Option<&Check>, exit: Exit) -> std::io::Result<()> {
    for check in checks {
        let (status, detail) = shown(&check.outcome);
        stdout::line(&format!(
            "{status:<7} {:<10} {detail}{}",
            check.name,
            at(check)
        ))?;
    }
    stdout::line(&match worst {
        None => "verdict: this configuration can relay".into(),
        Some(check) => format!(
            "verdict: this configuration cannot relay: check {}{} failed (exit {})",
            check.name,
            at(check),
            exit.code()
        ),
    })
}

/// `{"checks": [{"name", "status", "detail"}...], "ok", "exit_code"}`; a
/// database check of many outboxes adds its "database" and "table".
fn as_json(checks: &[Check], exit: Exit) -> Value {
    let each: Vec<Value> = checks
        .iter()
        .map(|check| {
            let (status, detail) = shown(&check.outcome);
            let mut one = json!({"name": check.name, "status": status, "detail": detail});
            if let Some((database, table)) = &check.outbox {
                one["database"] = json!(database);
                one["table"] = json!(table);
            }
            one
        })
        .collect();
    json!({"checks": each, "ok": exit == Exit::Success, "exit_code": exit.code()})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(checks: &[Check]) -> Vec<String> {
        checks
            .iter()
            .map(|check| format!("{} {}", check.name, shown(&check.outcome).0))
            .collect()
    }

    #[test]
    fn the_checks_after_a_failed_one_are_skipped() {
        let checks = chain(
            &DATABASE_CHECKS,
            vec!["up".into()],
            Some(anyhow!("no table")),
            None,
        );
        assert_eq!(
            names(&checks),
            [
                "postgresql ok",
                "table failed",
                "columns skipped",
                "grants skipped"
            ]
        );
    }

    #[test]
    fn a_chain_without_failure_passes_every_check() {
        let passed = vec!["a".into(), "b".into(), "c".into()];
        let checks = chain(&probe::CHECKS, passed, None, None);
        assert_eq!(names(&checks), ["rabbitmq ok", "exchange ok", "publish ok"]);
    }

    #[test]
    fn a_configuration_failure_is_more_urgent_than_an_outage_that_came_first() {
        let mut checks = chain(
            &DATABASE_CHECKS,
            Vec::new(),
            Some(exit::outage(anyhow!("down"))),
            None,
        );
        checks.extend(chain(
            &probe::CHECKS,
            vec!["up".into()],
            Some(exit::config(anyhow!("no exchange"))),
            None,
        ));
        let (exit, worst, failed) = verdict(&checks);
        assert_eq!(
            (exit, worst.map(|(check, _)| check.name), failed),
            (Exit::Config, Some("exchange"), 2)
        );
    }

    #[test]
    fn the_json_names_each_check_its_status_and_detail() {
        let checks = chain(
            &probe::CHECKS,
            vec!["up".into()],
            Some(exit::config(anyhow!("no exchange"))),
            None,
        );
        let json = as_json(&checks, Exit::Config);
        assert_eq!(json["exit_code"], 78);
        assert_eq!(json["ok"], false);
        assert_eq!(
            json["checks"][1],
            json!({"name": "exchange", "status": "failed", "detail": "no exchange"})
        );
        assert_eq!(json["checks"][2]["detail"], "not run: exchange failed");
    }
}
