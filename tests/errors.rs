//! Bad input and missing pieces: one clear line on stderr, the documented
//! exit code, no panic or backtrace, never a password, nothing marked.

use crate::common::scratch::free_port;
use crate::common::{Fixture, Run, assert_one_clear_line};

fn assert_no_secret(run: &Run, secret: &str) {
    assert!(
        !run.stderr.contains(secret),
        "password leaked: {}",
        run.stderr
    );
}

#[test]
fn broker_down_exits_69_and_leaves_the_events_untouched() {
    let mut fx = Fixture::new("broker_down");
    fx.insert("e", 3);
    let url = format!("amqp://guest:s3cr3t@127.0.0.1:{}/%2f", free_port());
    let run = fx.run_with(&[("AMQP_URL", &url)], &[]);
    assert_eq!(run.code, 69, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(run.stderr.contains("RabbitMQ"), "{}", run.stderr);
    assert_no_secret(&run, "s3cr3t");
    assert!(
        fx.rows()
            .iter()
            .all(|row| !row.published && row.attempts == 0),
        "an outage counts no attempt"
    );
}

#[test]
fn database_down_exits_69() {
    let fx = Fixture::new("db_down");
    let url = format!(
        "postgresql://postgres:s3cr3t@127.0.0.1:{}/test",
        free_port()
    );
    let run = fx.run_with(&[("DATABASE_URL", &url)], &[]);
    assert_eq!(run.code, 69, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(run.stderr.contains("PostgreSQL"), "{}", run.stderr);
    assert_no_secret(&run, "s3cr3t");
}

#[test]
fn a_login_refused_by_postgresql_exits_78() {
    let mut fx = Fixture::new("no_such_role");
    fx.insert("e", 1);
    // The server refuses the startup: SQLSTATE 28000, role does not exist.
    let url =
        crate::common::database_url().replacen("postgres@", "outbox_poll_no_such_role:s3cr3t@", 1);
    let run = fx.run_with(&[("DATABASE_URL", &url)], &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(
        run.stderr.contains("outbox_poll_no_such_role"),
        "{}",
        run.stderr
    );
    assert_no_secret(&run, "s3cr3t");
    assert!(fx.rows().iter().all(|row| !row.published));
}

#[test]
fn missing_table_exits_78_naming_it_and_migrate() {
    let fx = Fixture::bare("missing_table");
    let run = fx.run(&[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(run.stderr.contains(&fx.table), "{}", run.stderr);
    assert!(run.stderr.contains("outbox-poll migrate"), "{}", run.stderr);
}

/// A run on a table without last_error: 78, one line naming the column
/// and the command that adds it.
fn run_without_last_error(fx: &mut Fixture) {
    fx.execute("ALTER TABLE {table} DROP COLUMN last_error");
    let run = fx.run(&[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(run.stderr.contains("last_error"), "{}", run.stderr);
    assert!(run.stderr.contains("outbox-poll migrate"), "{}", run.stderr);
}

#[test]
fn missing_column_exits_78_naming_it_before_anything_is_published() {
    let mut fx = Fixture::new("missing_column");
    fx.insert("e", 2);
    run_without_last_error(&mut fx);
    assert!(
        fx.messages().is_empty(),
        "nothing may be published for a table we cannot mark"
    );
}

#[test]
fn a_column_only_the_marks_use_missing_fails_even_a_run_with_nothing_due() {
    let mut fx = Fixture::new("missing_column_empty");
    run_without_last_error(&mut fx);
}

#[test]
fn missing_exchange_exits_78_and_marks_nothing() {
    let mut fx = Fixture::new("missing_exchange");
    fx.insert("e", 2);
    let run = fx.run(&["--exchange", "no-such-exchange-anywhere"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(
        run.stderr.contains("no-such-exchange-anywhere"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("--declare-exchange"), "{}", run.stderr);
    assert!(
        fx.rows()
            .iter()
            .all(|row| !row.published && row.attempts == 0)
    );
}

#[test]
fn bad_table_name_exits_78_without_touching_the_database() {
    let fx = Fixture::new("bad_table");
    // No database listens there: a 78 proves the name was refused first.
    let url = format!("postgresql://postgres@127.0.0.1:{}/test", free_port());
    let run = fx.run(&[
        "--database-url",
        &url,
        "--table",
        "outbox; DROP TABLE users",
    ]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(run.stderr.contains("invalid table name"), "{}", run.stderr);
}

#[test]
fn database_url_that_does_not_parse_exits_78_without_its_password() {
    let fx = Fixture::new("bad_db_url");
    let run = fx.run_with(
        &[("DATABASE_URL", "postgresql://u:s3cr3t@host:notaport/db")],
        &[],
    );
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert_no_secret(&run, "s3cr3t");
}

#[test]
fn amqp_url_that_does_not_parse_exits_78_without_its_password() {
    let fx = Fixture::new("bad_amqp_url");
    let run = fx.run_with(&[("AMQP_URL", "amqp://u:s3cr3t@[::1")], &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert_no_secret(&run, "s3cr3t");
}

#[test]
fn wrong_broker_password_exits_78() {
    let mut fx = Fixture::new("bad_broker_login");
    fx.insert("e", 1);
    let port = crate::common::amqp_addr().port();
    let url = format!("amqp://guest:wrong-s3cr3t@127.0.0.1:{port}/%2f");
    let run = fx.run_with(&[("AMQP_URL", &url)], &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert_no_secret(&run, "wrong-s3cr3t");
    assert!(
        fx.rows()
            .iter()
            .all(|row| !row.published && row.attempts == 0)
    );
}

#[test]
fn bad_command_line_exits_2() {
    let fx = Fixture::new("usage");
    for args in [
        &["--batch-size", "0"][..],
        &["--batch-size", "10001"],
        &["--no-such-flag"],
        &["--confirm-timeout", "soon"],
    ] {
        let run = fx.run(args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
}

#[test]
fn json_summary_is_printed_on_failure_too() {
    let mut fx = Fixture::new("json_on_error");
    fx.insert("e", 1);
    let run = fx.run(&["--exchange", "no-such-exchange-anywhere", "--json"]);
    assert_eq!(run.code, 78);
    let summary = run.summary();
    assert_eq!(summary["exit_code"], 78);
    assert_eq!(summary["published"], 0);
}

#[test]
fn a_run_with_nothing_configured_says_so_and_names_the_two_variables() {
    // As an account no PostgreSQL knows (nobody, when the tests run as
    // root), so that libpq's defaults reach no database whatever the
    // machine's pg_hba.conf says; nothing in the environment either (the
    // fixture's command inherits no PG* variable).
    // nobody cannot reach the build under a private home (a fresh root's
    // /root is 0700): it runs a copy in a directory of its own.
    let copy = crate::common::scratch::Scratch::new("nothing_configured");
    let bin = copy.path().join("outbox-poll");
    if is_root() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::copy(crate::common::BIN, &bin).expect("copying the binary");
        std::fs::set_permissions(copy.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let command = |extra: &[(&str, String)]| {
        let mut command = if is_root() {
            let mut runuser = std::process::Command::new("runuser");
            runuser.arg("-u").arg("nobody").arg("--").arg(&bin);
            runuser
        } else {
            std::process::Command::new(crate::common::BIN)
        };
        command
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", "/nonexistent");
        command.envs(extra.iter().map(|(name, value)| (name, value)));
        Run::from(command.output().expect("running outbox-poll"))
    };
    let run = command(&[]);
    assert!([69, 78].contains(&run.code), "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(
        run.stderr.starts_with(
            "outbox-poll: error: nothing says which PostgreSQL to use (no DATABASE_URL, service \
             or PG* variable)"
        ),
        "{}",
        run.stderr
    );
    for named in ["DATABASE_URL, e.g. postgresql://", "AMQP_URL, e.g. amqp://"] {
        assert!(run.stderr.contains(named), "{named} in {}", run.stderr);
    }
    // Any variable at all is a configuration, however wrong: not said then.
    let run = command(&[("PGPORT", free_port().to_string())]);
    assert!([69, 78].contains(&run.code), "{}", run.stderr);
    assert!(!run.stderr.contains("nothing says"), "{}", run.stderr);
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}
