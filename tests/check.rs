//! `outbox-poll check`: each check passes on a working configuration and
//! leaves everything as it was (no message in a queue bound to '#', no
//! row touched, no exchange declared), and each failing case exits with
//! its documented code, naming the failing check on stderr in one line.

use crate::common::broker_user::BrokerUser;
use crate::common::scratch::free_port;
use crate::common::{Fixture, Run, assert_one_clear_line, connect_db, database_url};

/// Every check, in the order a single outbox's check prints them.
const CHECKS: [&str; 7] = [
    "postgresql",
    "table",
    "columns",
    "grants",
    "rabbitmq",
    "exchange",
    "publish",
];

/// Each row in full, with the version PostgreSQL wrote it as (xmin): an
/// update that changed no value still shows.
fn snapshot(fx: &mut Fixture) -> Vec<String> {
    let sql = format!(
        "SELECT xmin::text || ' ' || o::text FROM {} o ORDER BY id",
        fx.quoted_table()
    );
    let rows = fx.db.query(&sql, &[]).unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

/// The status each check printed, by name, from the lines on stdout.
fn statuses(run: &Run) -> Vec<(String, String)> {
    run.stdout
        .lines()
        .filter(|line| !line.starts_with("verdict:"))
        .map(|line| {
            let mut words = line.split_whitespace();
            let status = words.next().unwrap_or_default().to_string();
            (words.next().unwrap_or_default().to_string(), status)
        })
        .collect()
}

/// The status `run` printed for the check `name`.
fn status_of(run: &Run, name: &str) -> String {
    statuses(run)
        .into_iter()
        .find(|(check, _)| check == name)
        .unwrap_or_else(|| panic!("no check {name} in: {}", run.stdout))
        .1
}

/// Exit `code`, and one line on stderr naming the failed check and
/// holding each of `named`.
fn assert_failed(run: &Run, code: i32, check: &str, named: &[&str]) {
    assert_eq!(run.code, code, "{}{}", run.stdout, run.stderr);
    assert_one_clear_line(run);
    assert!(
        run.stderr.contains(&format!("check {check} failed")),
        "{}",
        run.stderr
    );
    for name in named {
        assert!(run.stderr.contains(name), "{name:?} in: {}", run.stderr);
    }
    assert_eq!(status_of(run, check), "failed", "{}", run.stdout);
    assert!(
        run.stdout
            .lines()
            .last()
            .is_some_and(|line| line.contains("cannot relay") && line.contains(check)),
        "{}",
        run.stdout
    );
}

/// A login role of the test's own on the fixture's schema, granted
/// `grants` on its table; dropped with it (roles are cluster-wide).
struct Role {
    name: String,
}

impl Role {
    fn with(fx: &mut Fixture, test: &str, grants: &str) -> Role {
        let role = Role {
            name: format!("outbox_check_{}_{test}", std::process::id()),
        };
        role.drop_role();
        fx.db
            .batch_execute(&format!(
                "CREATE ROLE \"{name}\" LOGIN; GRANT USAGE ON SCHEMA \"{schema}\" TO \"{name}\"; \
                 GRANT {grants} ON {table} TO \"{name}\"",
                name = role.name,
                schema = fx.schema,
                table = fx.quoted_table()
            ))
            .unwrap();
        role
    }

    /// The tests' database URL, logged in as this role.
    fn url(&self) -> String {
        let config: postgres::Config = database_url().parse().unwrap();
        let dbname = config.get_dbname().unwrap_or("test");
        let port = config.get_ports()[0];
        format!("postgresql://{}@127.0.0.1:{port}/{dbname}", self.name)
    }

    fn drop_role(&self) {
        let mut db = connect_db();
        let exists = db
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&self.name])
            .unwrap()
            .is_some();
        if exists {
            db.batch_execute(&format!(
                "DROP OWNED BY \"{0}\"; DROP ROLE \"{0}\"",
                self.name
            ))
            .unwrap();
        }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        self.drop_role();
    }
}

#[test]
fn check_passes_on_a_working_configuration_and_publishes_and_changes_nothing() {
    let mut fx = Fixture::new("check_passes");
    fx.insert("e", 3);
    let before = snapshot(&mut fx);
    let run = fx.run(&["check"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stderr, "");
    let expected: Vec<(String, String)> = CHECKS
        .iter()
        .map(|name| (name.to_string(), "ok".to_string()))
        .collect();
    assert_eq!(statuses(&run), expected, "{}", run.stdout);
    assert_eq!(
        run.stdout.lines().last(),
        Some("verdict: this configuration can relay")
    );
    assert_eq!(
        fx.amqp.queue_length(&fx.queue),
        0,
        "a message was delivered"
    );
    assert_eq!(snapshot(&mut fx), before, "a row was changed");
}

#[test]
fn check_names_an_unreachable_postgresql_and_exits_69() {
    let fx = Fixture::new("check_pg_down");
    let port = free_port();
    let url = format!("postgresql://postgres@127.0.0.1:{port}/test");
    let run = fx.run_with(&[("DATABASE_URL", &url)], &["check"]);
    assert_failed(&run, 69, "postgresql", &[&format!("127.0.0.1:{port}")]);
    for skipped in ["table", "columns", "grants"] {
        assert_eq!(status_of(&run, skipped), "skipped", "{}", run.stdout);
    }
    assert_eq!(
        status_of(&run, "publish"),
        "ok",
        "the broker is checked apart"
    );
}

#[test]
fn check_exits_78_when_the_table_is_missing() {
    let fx = Fixture::bare("check_no_table");
    let run = fx.run(&["check"]);
    assert_failed(&run, 78, "table", &[&fx.table, "does not exist", "migrate"]);
    assert_eq!(status_of(&run, "columns"), "skipped", "{}", run.stdout);
}

#[test]
fn check_names_a_missing_column_and_exits_78() {
    let mut fx = Fixture::new("check_no_column");
    fx.execute("ALTER TABLE {table} DROP COLUMN event_type");
    let run = fx.run(&["check"]);
    assert_failed(&run, 78, "columns", &["\"event_type\"", "migrate"]);
}

#[test]
fn check_names_the_missing_update_grant_and_exits_78() {
    let mut fx = Fixture::new("check_no_update");
    let role = Role::with(&mut fx, "no_update", "SELECT");
    let run = fx.run_with(&[("DATABASE_URL", &role.url())], &["check"]);
    assert_failed(
        &run,
        78,
        "grants",
        &["UPDATE on attempts", "GRANT UPDATE", &role.name],
    );
}

#[test]
fn check_with_on_publish_delete_names_the_missing_delete_grant_and_exits_78() {
    let mut fx = Fixture::new("check_no_delete");
    let role = Role::with(&mut fx, "no_delete", "SELECT, UPDATE");
    let run = fx.run_with(
        &[("DATABASE_URL", &role.url())],
        &["check", "--on-publish", "delete"],
    );
    assert_failed(&run, 78, "grants", &["DELETE", "GRANT DELETE"]);
}

#[test]
fn check_names_an_unreachable_rabbitmq_and_exits_69() {
    let fx = Fixture::new("check_mq_down");
    let port = free_port();
    let url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    let run = fx.run_with(&[("AMQP_URL", &url)], &["check"]);
    assert_failed(&run, 69, "rabbitmq", &[&format!("127.0.0.1:{port}")]);
    assert_eq!(status_of(&run, "exchange"), "skipped", "{}", run.stdout);
    assert_eq!(
        status_of(&run, "grants"),
        "ok",
        "the database is checked apart"
    );
}

#[test]
fn check_exits_78_when_the_exchange_is_missing() {
    let fx = Fixture::new("check_no_exchange");
    let missing = format!("{}_missing", fx.exchange);
    let run = fx.run(&["check", "--exchange", &missing]);
    assert_failed(&run, 78, "exchange", &[&missing, "--declare-exchange"]);
    assert_eq!(status_of(&run, "publish"), "skipped", "{}", run.stdout);
}

#[test]
fn check_with_declare_exchange_passes_on_a_missing_exchange_and_declares_nothing() {
    let fx = Fixture::new("check_would_declare");
    let missing = format!("{}_missing", fx.exchange);
    let run = fx.run(&[
        "check",
        "--exchange",
        &missing,
        "--declare-exchange",
        "topic",
    ]);
    // Deleted at once, should the check have declared it after all.
    let declared = fx.amqp.exchange_exists(&missing);
    fx.amqp.delete_exchange(&missing);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("would declare it (topic"),
        "{}",
        run.stdout
    );
    assert_eq!(status_of(&run, "publish"), "ok", "{}", run.stdout);
    assert!(!declared, "check declared the exchange");
}

#[test]
fn check_exits_78_for_a_broker_user_without_write_permission() {
    let fx = Fixture::new("check_no_write");
    let user = BrokerUser::without_write("check_no_write");
    let run = fx.run_with(&[("AMQP_URL", &user.url())], &["check"]);
    // Not ACCESS_REFUSED itself: on a busy machine the broker may close
    // the channel before lapin can keep its reply code, and the probe
    // then says "refused" without it (src/broker/probe.rs).
    assert_failed(&run, 78, "publish", &["refused user", "write permission"]);
    assert!(!run.stderr.contains("secret"), "{}", run.stderr);
    assert_eq!(status_of(&run, "exchange"), "ok", "{}", run.stdout);
}

#[test]
fn check_json_prints_one_object_with_each_checks_name_status_and_detail() {
    let fx = Fixture::bare("check_json");
    let run = fx.run(&["check", "--json"]);
    assert_eq!(run.code, 78, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    let summary = run.summary();
    let checks = summary["checks"].as_array().unwrap();
    let shown: Vec<(&str, &str)> = checks
        .iter()
        .map(|check| {
            (
                check["name"].as_str().unwrap(),
                check["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("postgresql", "ok"),
            ("table", "failed"),
            ("columns", "skipped"),
            ("grants", "skipped"),
            ("rabbitmq", "ok"),
            ("exchange", "ok"),
            ("publish", "ok"),
        ]
    );
    assert!(
        checks[1]["detail"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{summary}"
    );
    assert_eq!(
        (summary["ok"].as_bool(), summary["exit_code"].as_i64()),
        (Some(false), Some(78))
    );
}

#[test]
fn check_over_a_list_of_tables_checks_each_outbox_and_the_broker_once() {
    let fx = Fixture::new("check_many_present");
    let other = Fixture::bare("check_many_missing");
    let tables = format!("{},{}", fx.table, other.table);
    let run = fx.run(&["check", "--table", &tables, "--json"]);
    assert_eq!(run.code, 78, "{}{}", run.stdout, run.stderr);
    assert_one_clear_line(&run);
    assert!(run.stderr.contains(&other.schema), "{}", run.stderr);
    let summary = run.summary();
    let checks = summary["checks"].as_array().unwrap();
    // A table listed but missing is named as the catalog would quote it.
    let of = |schema: &str| -> Vec<&str> {
        checks
            .iter()
            .filter(|check| {
                check["table"]
                    .as_str()
                    .is_some_and(|table| table.contains(schema))
            })
            .map(|check| check["status"].as_str().unwrap())
            .collect()
    };
    assert_eq!(of(&fx.schema), ["ok"; 4], "{summary}");
    assert_eq!(
        of(&other.schema),
        ["ok", "failed", "skipped", "skipped"],
        "{summary}"
    );
    let broker: Vec<&str> = checks
        .iter()
        .filter(|check| check.get("table").is_none())
        .map(|check| check["name"].as_str().unwrap())
        .collect();
    assert_eq!(broker, ["rabbitmq", "exchange", "publish"], "{summary}");
}

#[test]
fn a_poll_option_given_before_check_is_refused_rather_than_left_unchecked() {
    let fx = Fixture::new("check_option_before");
    let run = fx.run(&["--exchange", "elsewhere", "check"]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("outbox-poll check --exchange"),
        "{}",
        run.stderr
    );
}

#[test]
fn check_names_a_column_the_marks_cannot_write_and_exits_78() {
    let mut fx = Fixture::new("check_bad_last_error");
    // Only the marks write last_error: a run would find out after the
    // broker had its first failed batch.
    fx.execute("ALTER TABLE {table} ALTER COLUMN last_error TYPE integer USING NULL");
    let run = fx.run(&["check"]);
    assert_failed(&run, 78, "columns", &["last_error"]);
}

#[test]
fn check_says_where_postgresql_is_and_that_it_is_reached_without_tls() {
    let fx = Fixture::new("check_where");
    let url = format!("{}?sslmode=disable", fx.database_url);
    let run = fx.run_with(&[("DATABASE_URL", &url)], &["check"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let line = run
        .stdout
        .lines()
        .find(|line| line.contains("postgresql"))
        .unwrap_or_default();
    let config: postgres::Config = database_url().parse().unwrap();
    let port = config.get_ports()[0];
    assert!(line.contains(&format!(":{port}")), "{line}");
    assert!(line.contains("without TLS"), "{line}");
}

#[test]
fn check_on_a_read_only_session_exits_69_saying_it_takes_no_writes() {
    let fx = Fixture::new("check_read_only");
    // As a hot standby's sessions are: every transaction read-only.
    let url = format!(
        "{}?options=-c%20default_transaction_read_only%3Don",
        fx.database_url
    );
    let run = fx.run_with(&[("DATABASE_URL", &url)], &["check"]);
    assert_failed(&run, 69, "postgresql", &["takes no writes", "primary"]);
}
