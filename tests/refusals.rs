//! A refusal from the broker about permissions or configuration (an
//! internal exchange, a user without write permission, an exchange deleted
//! while the run goes on) is the operator's to fix: exit 78, no attempt
//! counted, nothing marked but what the broker confirmed.

use std::process::Stdio;
use std::time::Duration;

use crate::common::broker_user::BrokerUser;
use crate::common::proxy::Proxy;
use crate::common::{
    Fixture, Run, amqp_addr, amqp_url_via, assert_one_clear_line, assert_untouched, wait_until,
};

/// Every row as it was inserted: unpublished, no attempt, no error, due.
fn assert_nothing_published_or_blamed(fx: &mut Fixture) {
    let rows = fx.rows();
    assert!(rows.iter().all(|row| !row.published), "{rows:?}");
    assert_untouched(&rows);
}

/// Exit 78 with one clear line naming the refusal and what to check.
fn assert_refused(run: &Run, reply: &str) {
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(run);
    assert!(run.stderr.contains(reply), "{}", run.stderr);
    assert!(run.stderr.contains("no attempt counted"), "{}", run.stderr);
    assert_eq!(run.field("exit_code"), 78);
}

#[test]
fn publishing_to_an_internal_exchange_exits_78_and_blames_none_of_20000_events() {
    let mut fx = Fixture::new("internal_exchange");
    let internal = format!("{}_internal", fx.exchange);
    fx.amqp.declare_internal(&internal);
    fx.insert("e", 20_000);
    let run = fx.run(&[
        "--exchange",
        &internal,
        "--drain",
        "--batch-size",
        "200",
        "--json",
    ]);
    fx.amqp.delete_exchange(&internal);
    assert_refused(&run, "ACCESS_REFUSED");
    assert_eq!((run.field("published"), run.field("failed")), (0, 0));
    assert_nothing_published_or_blamed(&mut fx);
}

#[test]
fn a_user_without_write_permission_exits_78_and_counts_no_attempt() {
    let mut fx = Fixture::new("no_write_permission");
    let user = BrokerUser::without_write("no_write");
    fx.insert("e", 500);
    let run = fx.run_with(&[("AMQP_URL", &user.url())], &["--drain", "--json"]);
    assert_refused(&run, "ACCESS_REFUSED");
    assert!(!run.stderr.contains("secret"), "{}", run.stderr);
    assert_eq!(run.field("published"), 0);
    assert_nothing_published_or_blamed(&mut fx);
}

#[test]
fn an_exchange_deleted_mid_drain_exits_78_and_marks_only_what_was_confirmed() {
    let mut fx = Fixture::new("exchange_deleted");
    fx.insert("e", 400);
    let broker = Proxy::start(amqp_addr());
    // The first batches go through; the rest wait in the proxy.
    broker.stall_upstream_after(20_000);
    let child = fx
        .command()
        .env("AMQP_URL", amqp_url_via(broker.port()))
        .args(["--drain", "--batch-size", "20", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(broker.wait_for_upstream(20_000, Duration::from_secs(15)));
    assert!(wait_until(Duration::from_secs(15), || {
        fx.amqp.queue_length(&fx.queue) > 0
    }));
    assert!(broker.wait_for_quiet_downstream(Duration::from_millis(500), Duration::from_secs(15)));
    fx.amqp.delete_exchange(&fx.exchange);
    broker.resume();
    let run = Run::from(child.wait_with_output().unwrap());
    assert_refused(&run, "NOT_FOUND");
    let rows = fx.rows();
    let published = rows.iter().filter(|row| row.published).count();
    assert!(published > 0, "the first batches were confirmed");
    assert_eq!(run.field("published"), published as i64);
    assert!(
        rows.iter()
            .all(|row| row.attempts == 0 && row.last_error.is_none()),
        "no event was blamed"
    );
}
