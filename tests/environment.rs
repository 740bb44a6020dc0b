//! Every option's environment variable, as the contract reads it: empty
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
    let fx = Fixture::new("env_subcommand");
    let run = fx.run_with(&[("OUTBOX_BATCH_SIZE", "abc")], &["status"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // A global option's variable is read by every command.
    let run = fx.run_with(&[("OUTBOX_MAX_ATTEMPTS", "abc")], &["status"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}
