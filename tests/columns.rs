//! The optional columns: `headers` (a JSON object whose members become
//! AMQP headers of their types), `routing_key` (instead of event_type) and
//! `ordering_key` (sent as x-ordering-key); and a table without them,
//! which works as it always did.

use lapin::types::{AMQPValue, FieldTable, LongString};

use crate::common::{Extra, Fixture, row};

fn with_headers(json: &str) -> Extra<'_> {
    Extra {
        headers: Some(json),
        ..Extra::default()
    }
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

#[test]
fn headers_of_every_json_type_arrive_with_their_amqp_types() {
    let mut fx = Fixture::new("columns_types");
    let json = r#"{"string": "x", "integer": -9007199254740993, "float": 2.5,
                   "whole_float": 3.0, "true": true, "false": false, "null": null,
                   "array": [1, "two", [null]], "object": {"nested": {"n": 1}}}"#;
    fx.insert_extra("e-1", with_headers(json));

    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("published")), (0, 1), "{}", run.stderr);
    let message = fx.messages().remove(0);
    let header = |name| message.header(name).cloned();
    assert_eq!(header("string"), Some(text("x")));
    let integer = AMQPValue::LongLongInt(-9_007_199_254_740_993);
    assert_eq!(header("integer"), Some(integer), "not rounded to a double");
    assert_eq!(header("float"), Some(AMQPValue::Double(2.5)));
    assert_eq!(header("whole_float"), Some(AMQPValue::Double(3.0)));
    assert_eq!(header("true"), Some(AMQPValue::Boolean(true)));
    assert_eq!(header("false"), Some(AMQPValue::Boolean(false)));
    assert_eq!(header("null"), Some(AMQPValue::Void));
    let inner = AMQPValue::FieldArray(vec![AMQPValue::Void].into());
    let array = vec![AMQPValue::LongLongInt(1), text("two"), inner];
    assert_eq!(header("array"), Some(AMQPValue::FieldArray(array.into())));
    let mut nested = FieldTable::default();
    nested.insert("n".into(), AMQPValue::LongLongInt(1));
    let mut object = FieldTable::default();
    object.insert("nested".into(), AMQPValue::FieldTable(nested));
    assert_eq!(header("object"), Some(AMQPValue::FieldTable(object)));
}

#[test]
fn traceparent_and_tracestate_pass_through_unchanged() {
    let mut fx = Fixture::new("columns_trace");
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let tracestate = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
    let json = format!(r#"{{"traceparent": "{traceparent}", "tracestate": "{tracestate}"}}"#);
    fx.insert_extra("e-1", with_headers(&json));

    assert_eq!(fx.run(&[]).code, 0);
    let message = fx.messages().remove(0);
    assert_eq!(message.header("traceparent"), Some(&text(traceparent)));
    assert_eq!(message.header("tracestate"), Some(&text(tracestate)));
}

#[test]
fn a_headers_value_that_is_not_an_object_fails_only_its_event() {
    let mut fx = Fixture::new("columns_not_object");
    fx.insert_extra("ok-1", with_headers(r#"{"a": 1}"#));
    fx.insert_extra("bad-2", with_headers(r#"["a", 1]"#));
    fx.insert_extra("ok-3", Extra::default());

    let run = fx.run(&["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (2, 1));
    let rows = fx.rows();
    let bad = row(&rows, "bad-2");
    assert_eq!((bad.published, bad.attempts), (false, 1));
    let error = bad.last_error.as_deref().unwrap_or_default();
    assert!(
        error.contains("must be a JSON object, not an array"),
        "{error}"
    );
    let ids: Vec<String> = fx.messages().into_iter().map(|m| m.message_id).collect();
    assert_eq!(ids, ["ok-1", "ok-3"]);
}

#[test]
fn headers_too_large_for_the_brokers_frame_fail_only_their_event() {
    let mut fx = Fixture::new("columns_too_large");
    // RabbitMQ's frame_max is 128 KiB; a header frame over it would make
    // the broker close the connection, an outage at every run.
    let json = format!(r#"{{"blob": "{}"}}"#, "x".repeat(200_000));
    fx.insert_extra("big-1", with_headers(&json));
    fx.insert_extra("ok-2", Extra::default());

    let run = fx.run(&["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (1, 1));
    let rows = fx.rows();
    let error = row(&rows, "big-1").last_error.clone().unwrap_or_default();
    assert!(error.contains("frame_max"), "{error}");
    assert_eq!(fx.messages().len(), 1);
}

#[test]
fn routing_key_replaces_the_routing_key_and_type_stays_the_event_type() {
    let mut fx = Fixture::new("columns_routing_key");
    let extra = Extra {
        routing_key: Some("eu.orders.created"),
        ..Extra::default()
    };
    fx.insert_extra("e-1", extra);
    fx.insert_extra("e-2", Extra::default());

    assert_eq!(fx.run(&[]).code, 0);
    let messages = fx.messages();
    assert_eq!(messages[0].routing_key, "eu.orders.created");
    assert_eq!(messages[0].kind.as_deref(), Some("order.created"));
    assert_eq!(messages[1].routing_key, "order.created");
}

#[test]
fn the_ordering_key_is_sent_as_the_x_ordering_key_header_in_every_mode() {
    let mut fx = Fixture::isolated("columns_ordering_key");
    for mode in [None, Some("--ordered"), Some("--ordered-by-key")] {
        let extra = Extra {
            ordering_key: Some("order-42"),
            headers: Some(r#"{"a": "b"}"#),
            ..Extra::default()
        };
        fx.insert_extra(&format!("keyed-{mode:?}"), extra);
        fx.insert_extra(&format!("plain-{mode:?}"), Extra::default());
        let run = fx.run(mode.as_slice());
        assert_eq!(run.code, 0, "{mode:?}: {}", run.stderr);
        let messages = fx.messages();
        assert_eq!(messages.len(), 2, "{mode:?}");
        for message in messages {
            let key = message.header_text("x-ordering-key");
            match message.message_id.starts_with("keyed") {
                true => {
                    assert_eq!(key.as_deref(), Some("order-42"), "{mode:?}");
                    assert_eq!(message.header("a"), Some(&text("b")), "{mode:?}");
                }
                false => assert_eq!(message.headers, None, "{mode:?}"),
            }
        }
    }
}

/// The nine columns of the first migrations, as a table migrated before the optional
/// columns existed has them: none of headers, routing_key, ordering_key
/// or producer_xid.
fn table_without_the_optional_columns(fx: &mut Fixture) {
    fx.execute(
        "CREATE TABLE {table} (id bigserial PRIMARY KEY, event_id text NOT NULL UNIQUE, \
         event_type text NOT NULL, payload jsonb NOT NULL, \
         created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, \
         attempts integer NOT NULL DEFAULT 0, last_error text, \
         available_at timestamptz NOT NULL DEFAULT now())",
    );
}

#[test]
fn a_table_without_the_optional_columns_works_with_every_command() {
    let mut fx = Fixture::bare("columns_none");
    table_without_the_optional_columns(&mut fx);
    fx.route_only("order.#");
    fx.insert_event("a", "order.created", r#"{"n": 1}"#);
    fx.insert_event("b", "nobody.listens", "{}");

    let dry = fx.run(&["--dry-run"]);
    assert_eq!(
        (dry.code, dry.stdout.lines().count()),
        (0, 2),
        "{}",
        dry.stderr
    );
    let run = fx.run(&["--drain", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (1, 1));
    let message = fx.messages().remove(0);
    assert_eq!(
        (message.routing_key.as_str(), message.headers),
        ("order.created", None)
    );

    let status = fx.run(&["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert_eq!(status.summary()["retrying"], 1);
    assert_eq!(
        status.summary()["ordered_held_back_s"],
        serde_json::Value::Null
    );
    let requeue = fx.run(&["requeue", "--event-id", "b"]);
    assert_eq!(requeue.code, 0, "{}", requeue.stderr);
    assert_eq!(row(&fx.rows(), "b").attempts, 0);
    let prune = fx.run(&["prune", "--older-than", "1h"]);
    assert_eq!(prune.code, 0, "{}", prune.stderr);
}

#[test]
fn the_ordered_modes_on_a_table_without_producer_xid_ask_for_migrate() {
    let mut fx = Fixture::bare("columns_ordered_unmigrated");
    table_without_the_optional_columns(&mut fx);
    for mode in ["--ordered", "--ordered-by-key"] {
        let run = fx.run(&[mode]);
        assert_eq!(run.code, 78, "{mode}: {}", run.stderr);
        crate::common::assert_one_clear_line(&run);
        assert!(run.stderr.contains("outbox-poll migrate"), "{}", run.stderr);
    }
}
