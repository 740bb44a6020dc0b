//! Every option's environment variable, as docs/src/command-line.md reads it: empty
//! counts as unset, a value that does not parse is named by its variable
//! (exit 2), the flag wins over the variable; and no duration can ask for
//! more than the run can honour.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use crate::common::{Fixture, Run};

/// A usage error (exit 2) that says `what`, touches nothing, never panics.
fn assert_usage_error(fx: &mut Fixture, run: &Run, what: &str) {
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    assert!(run.stderr.contains(what), "{what:?} not in: {}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert_eq!(fx.published_count(), 0);
}

#[test]
fn an_empty_variable_counts_as_unset() {
    let mut fx = Fixture::new("env_empty");
    fx.insert("e", 150);
    let empty = [
        "OUTBOX_BATCH_SIZE",
        "OUTBOX_DRAIN",
        "OUTBOX_MAX_BATCHES",
        "OUTBOX_MAX_DURATION",
        "OUTBOX_ORDERED",
        "OUTBOX_DECLARE_EXCHANGE",
        "OUTBOX_CONFIRM_TIMEOUT",
        "OUTBOX_CONNECT_TIMEOUT",
        "OUTBOX_MAX_ATTEMPTS",
        "OUTBOX_METRICS_FILE",
    ]
    .map(|name| (name, ""));
    let run = fx.run_with(&empty, &["--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // The defaults: one batch of 100, no drain.
    assert_eq!((run.field("claimed"), run.field("batches")), (100, 1));
}

#[test]
fn a_variable_that_does_not_parse_is_named_with_its_value() {
    let mut fx = Fixture::new("env_bad");
    fx.insert("e", 5);
    for (name, value, option) in [
        ("OUTBOX_BATCH_SIZE", "abc", "--batch-size"),
        ("OUTBOX_BATCH_SIZE", " 7", "--batch-size"),
        ("OUTBOX_DRAIN", "maybe", "--drain"),
        ("OUTBOX_DECLARE_EXCHANGE", "lol", "--declare-exchange"),
        ("OUTBOX_CONNECT_TIMEOUT", "soon", "--connect-timeout"),
    ] {
        let run = fx.run_with(&[(name, value)], &[]);
        let named = format!("{name}={value:?} is not a valid {option}");
        assert_usage_error(&mut fx, &run, &named);
    }
}

#[test]
fn a_subcommands_variable_is_read_only_by_that_subcommand() {
    let mut fx = Fixture::new("env_subcommand");
    let bad = [("OUTBOX_PRUNE_BATCH_SIZE", "abc")];
    let run = fx.run_with(&bad, &["status"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = fx.run_with(&bad, &["prune", "--older-than", "1d"]);
    assert_usage_error(&mut fx, &run, "OUTBOX_PRUNE_BATCH_SIZE=\"abc\"");
}

#[test]
fn the_flag_wins_over_a_variable_that_does_not_parse() {
    let mut fx = Fixture::new("env_flag_wins");
    fx.insert("e", 5);
    let run = fx.run_with(
        &[("OUTBOX_BATCH_SIZE", "abc")],
        &["--batch-size", "3", "--json"],
    );
    assert_eq!((run.code, run.field("claimed")), (0, 3), "{}", run.stderr);
}

#[test]
fn a_url_variable_that_does_not_parse_is_named_without_its_value() {
    let mut fx = Fixture::new("env_bad_url");
    fx.insert("e", 1);
    // Not UTF-8: the one way a URL variable fails clap's own parsing.
    let url = OsString::from_vec(b"amqp://guest:s3cr3t@127.0.0.1:5672/\xff".to_vec());
    let run = Run::from(fx.command().env("AMQP_URL", url).output().unwrap());
    assert_usage_error(
        &mut fx,
        &run,
        "AMQP_URL (value not shown) is not a valid --amqp-url",
    );
    assert!(!run.stderr.contains("s3cr3t"), "{}", run.stderr);
}

#[test]
fn a_duration_longer_than_the_run_can_honour_is_a_usage_error_naming_its_maximum() {
    let mut fx = Fixture::new("env_durations");
    fx.insert("e", 1);
    for (args, option, maximum) in [
        (
            &["--connect-timeout", "300000000000years"][..],
            "--connect-timeout",
            "1day",
        ),
        (&["--confirm-timeout", "25d"], "--confirm-timeout", "1day"),
        (
            &["--drain", "--max-duration", "2years"],
            "--max-duration",
            "1year",
        ),
        (
            &["prune", "--older-than", "200years"],
            "--older-than",
            "100years",
        ),
        (
            &["status", "--fail-if-oldest-over", "200years"],
            "--fail-if-oldest-over",
            "100years",
        ),
    ] {
        let run = fx.run(args);
        assert_usage_error(&mut fx, &run, option);
        assert!(run.stderr.contains(maximum), "{args:?}: {}", run.stderr);
    }
    let run = fx.run_with(&[("OUTBOX_CONFIRM_TIMEOUT", "25d")], &[]);
    assert_usage_error(&mut fx, &run, "OUTBOX_CONFIRM_TIMEOUT=\"25d\"");
    // The longest allowed is honoured.
    let run = fx.run(&["--connect-timeout", "1day", "--confirm-timeout", "1day"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(fx.published_count(), 1);
}

#[test]
fn a_boolean_variable_set_to_false_is_an_option_not_given() {
    // In a database of its own, as every ordered mode's test.
    let fx = Fixture::isolated("env_false");
    for (variable, flag) in [
        ("OUTBOX_ORDERED", "--ordered-by-key"),
        ("OUTBOX_ORDERED_BY_KEY", "--ordered"),
    ] {
        for value in ["false", "0", "no", "off"] {
            let run = fx.run_with(&[(variable, value)], &[flag]);
            assert_eq!(run.code, 0, "{variable}={value} {flag}: {}", run.stderr);
        }
    }
    // A follow set by its variable and turned off by --dry-run needs no end.
    let run = fx.run_with(&[("OUTBOX_FOLLOW", "true")], &["--dry-run"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn a_subcommand_reads_no_variable_of_the_poll_run() {
    let fx = Fixture::new("env_subcommand_poll_vars");
    let run = fx.run_with(&[("OUTBOX_BATCH_SIZE", "abc")], &["status"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // A global option's variable is read by every command.
    let run = fx.run_with(&[("OUTBOX_MAX_ATTEMPTS", "abc")], &["status"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

/// A file holding `text`, in a scratch directory removed with it.
fn secret_file(label: &str, text: &str) -> (crate::common::scratch::Scratch, String) {
    let dir = crate::common::scratch::Scratch::new(label);
    let path = dir.path().join("url");
    std::fs::write(&path, text).unwrap();
    (dir, path.to_str().unwrap().to_owned())
}

#[test]
fn the_urls_are_read_from_their_files_trailing_newline_ignored() {
    let mut fx = Fixture::new("env_url_files");
    fx.insert("e", 2);
    let (_db, database) = secret_file("env_url_files_db", &format!("{}\n", fx.database_url));
    let amqp_url = crate::common::amqp_url();
    let (_amqp, amqp) = secret_file("env_url_files_amqp", &format!("{amqp_url}\r\n"));
    let mut command = fx.command();
    command
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env("DATABASE_URL_FILE", &database)
        .env("AMQP_URL_FILE", &amqp);
    let run = Run::from(command.arg("--json").output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 2);
    assert_eq!(run.stderr, "");
}

#[test]
fn an_unreadable_url_file_exits_78_naming_the_file() {
    let mut fx = Fixture::new("env_url_file_unreadable");
    fx.insert("e", 1);
    // A directory cannot be read as a file, whoever runs the test.
    let dir = crate::common::scratch::Scratch::new("env_url_file_unreadable");
    let path = dir.path().to_str().unwrap();
    for variable in ["DATABASE_URL_FILE", "AMQP_URL_FILE"] {
        let mut command = fx.command();
        command.env_remove(variable.trim_end_matches("_FILE"));
        let run = Run::from(command.env(variable, path).output().unwrap());
        assert_eq!(run.code, 78, "{}", run.stderr);
        assert!(
            run.stderr.starts_with(&format!(
                "outbox-poll: error: cannot read {variable} {path}: "
            )),
            "{}",
            run.stderr
        );
        crate::common::assert_one_clear_line(&run);
    }
    assert_eq!(fx.published_count(), 0);
}

#[test]
fn a_url_file_that_does_not_parse_never_shows_its_content() {
    let fx = Fixture::new("env_url_file_bad");
    let (_dir, path) = secret_file("env_url_file_bad", "amqp://relay:s3cr3t@[bad\n");
    let mut command = fx.command();
    command.env_remove("AMQP_URL").env("AMQP_URL_FILE", &path);
    let run = Run::from(command.output().unwrap());
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert!(!run.stderr.contains("s3cr3t"), "{}", run.stderr);
}

#[test]
fn a_url_given_twice_with_its_file_is_a_usage_error() {
    let mut fx = Fixture::new("env_url_file_twice");
    let (_dir, path) = secret_file("env_url_file_twice", "postgresql://x@127.0.0.1/test\n");
    // The variable (the harness sets DATABASE_URL) and its file.
    let run = fx.run_with(&[("DATABASE_URL_FILE", &path)], &[]);
    assert_usage_error(
        &mut fx,
        &run,
        "DATABASE_URL and DATABASE_URL_FILE are both set: unset one of them",
    );
    // The flag and the file.
    let mut command = fx.command();
    command
        .env_remove("AMQP_URL")
        .env("AMQP_URL_FILE", &path)
        .args(["--amqp-url", &crate::common::amqp_url()]);
    let run = Run::from(command.output().unwrap());
    assert_usage_error(
        &mut fx,
        &run,
        "--amqp-url and AMQP_URL_FILE both give the URL: drop one of them",
    );
}

#[test]
fn a_password_on_the_command_line_warns_once_without_showing_it() {
    let mut fx = Fixture::new("env_url_password_flag");
    fx.insert("e", 1);
    // Trust authentication takes any password; the AMQP one is real.
    let database = fx
        .database_url
        .replacen("postgres@", "postgres:pg-s3cr3t@", 1);
    assert_ne!(database, fx.database_url, "the test's URL names its user");
    let amqp = crate::common::amqp_url();
    assert!(amqp.contains(":guest@"), "{amqp}");
    let run = fx.run(&["--database-url", &database, "--amqp-url", &amqp, "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stderr,
        "outbox-poll: warning: a password given with --database-url and --amqp-url is \
         visible to every local user in the process list: give the URL in \
         DATABASE_URL_FILE and AMQP_URL_FILE (or the environment) instead\n"
    );
    assert_eq!(run.field("published"), 1);
    // In the environment, a password is no one else's to read: no warning.
    let run = fx.run_with(&[("DATABASE_URL", &database)], &["status"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
}

#[test]
fn a_poll_option_given_before_a_subcommand_that_does_not_read_it_is_refused() {
    let fx = Fixture::new("env_poll_option_before_status");
    for (flag, subcommand, args) in [
        (
            "--batch-size",
            "status",
            &["--batch-size", "5", "status"][..],
        ),
        (
            "--exchange",
            "prune",
            &["--exchange", "x", "prune", "--older-than", "7d"][..],
        ),
        ("--drain", "requeue", &["--drain", "requeue", "--dead"][..]),
    ] {
        let run = fx.run(args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        let said = format!("{flag} is an option of a poll, which `{subcommand}` does not read");
        assert!(run.stderr.contains(&said), "{args:?}: {}", run.stderr);
    }
    // replay reads the broker's options, given before its name too.
    let run = fx.run(&["--exchange", "x", "replay", "--from", "/nonexistent"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
}
