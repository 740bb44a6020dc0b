//! Payloads of type jsonb, json, text or bytea: the message body is the
//! value's exact bytes, the content_type the type's default, and every
//! command works whatever the type.

use crate::common::scratch::Scratch;
use crate::common::{Fixture, assert_one_clear_line, row};

/// A migrated table whose payload column is of `type_name`.
fn with_payload(test: &str, type_name: &str) -> Fixture {
    let mut fx = Fixture::new(test);
    fx.execute(&format!(
        "ALTER TABLE {{table}} ALTER COLUMN payload TYPE {type_name} USING payload::text::{type_name}"
    ));
    fx
}

/// Every byte value, and bytes no UTF-8 text could hold.
fn binary() -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..=255).collect();
    bytes.extend_from_slice(&[0xff, 0xfe, 0x00, 0xc3]);
    bytes
}

fn insert_bytes(fx: &mut Fixture, event_id: &str, payload: &[u8]) {
    let sql = format!(
        "INSERT INTO {} (event_id, event_type, payload) VALUES ($1, 'order.created', $2)",
        fx.quoted_table()
    );
    fx.db.execute(&sql, &[&event_id, &payload]).unwrap();
}

#[test]
fn a_bytea_payload_arrives_as_its_raw_bytes_as_application_octet_stream() {
    let mut fx = with_payload("payload_bytea", "bytea");
    insert_bytes(&mut fx, "e-1", &binary());

    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("published")), (0, 1), "{}", run.stderr);
    let message = fx.messages().remove(0);
    assert_eq!(message.body, binary());
    assert_eq!(
        message.content_type.as_deref(),
        Some("application/octet-stream")
    );
}

#[test]
fn a_json_payload_arrives_as_stored_and_a_text_one_as_text_plain() {
    // json keeps its spacing and key order, which jsonb would normalise.
    let json = r#"{"b":  1, "a": [true,  null]}"#;
    let text = "héllo, wörld\n{not json}";
    for (type_name, stored, content_type) in [
        ("json", json, "application/json"),
        ("text", text, "text/plain; charset=utf-8"),
    ] {
        let mut fx = with_payload(&format!("payload_{type_name}"), type_name);
        let sql = format!(
            "INSERT INTO {} (event_id, event_type, payload) \
             VALUES ('e-1', 'order.created', $1::text::{type_name})",
            fx.quoted_table()
        );
        fx.db.execute(&sql, &[&stored]).unwrap();

        let run = fx.run(&[]);
        assert_eq!(run.code, 0, "{type_name}: {}", run.stderr);
        let message = fx.messages().remove(0);
        assert_eq!(message.body, stored.as_bytes(), "{type_name}");
        assert_eq!(
            message.content_type.as_deref(),
            Some(content_type),
            "{type_name}"
        );
    }
}

#[test]
fn a_bytea_payload_larger_than_a_frame_arrives_whole() {
    let mut fx = with_payload("payload_bytea_large", "bytea");
    // RabbitMQ's frame_max is 128 KiB: this body goes in several frames.
    let large: Vec<u8> = (0..600_000u32).map(|n| (n * 7 % 251) as u8).collect();
    insert_bytes(&mut fx, "large", &large);
    insert_bytes(&mut fx, "small", b"\x00\x01");

    let run = fx.run(&["--json"]);
    assert_eq!((run.code, run.field("published")), (0, 2), "{}", run.stderr);
    let messages = fx.messages();
    assert_eq!(messages[0].body, large);
    assert_eq!(messages[1].body, b"\x00\x01");
}

#[test]
fn bytea_payloads_count_against_batch_bytes_by_their_size() {
    let mut fx = with_payload("payload_bytea_budget", "bytea");
    for n in 1..=5 {
        insert_bytes(&mut fx, &format!("e-{n}"), &vec![0u8; 10_000]);
    }
    // 0, 10 and 20 kB come before the first three: under 25 kB.
    let run = fx.run(&["--batch-bytes", "25kB", "--json"]);
    assert_eq!((run.code, run.field("claimed")), (0, 3), "{}", run.stderr);
}

#[test]
fn every_command_works_on_a_bytea_payload() {
    let mut fx = with_payload("payload_bytea_commands", "bytea");
    fx.route_only("order.#");
    insert_bytes(&mut fx, "a", b"\x00\xffbinary");
    let sql = format!(
        "INSERT INTO {} (event_id, event_type, payload) VALUES ('b', 'nobody.listens', '\\x01')",
        fx.quoted_table()
    );
    fx.db.batch_execute(&sql).unwrap();

    let dry = fx.run(&["--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let first: serde_json::Value =
        serde_json::from_str(dry.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(first["payload_base64"], "AP9iaW5hcnk=", "{}", dry.stdout);
    assert_eq!(first.get("payload"), None);

    let dir = Scratch::new("payload_bytea_commands");
    let metrics = dir.path().join("outbox.prom");
    let run = fx.run(&["--json", "--metrics-file", metrics.to_str().unwrap()]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (1, 1));
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert!(text.contains("outbox_poll_retrying{"), "{text}");

    let status = fx.run(&["status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert_eq!(status.summary()["retrying"], 1);
    let requeue = fx.run(&["requeue", "--event-id", "b"]);
    assert_eq!(requeue.code, 0, "{}", requeue.stderr);
    assert_eq!(row(&fx.rows(), "b").attempts, 0);
    fx.execute("UPDATE {table} SET published_at = now() - interval '2 hours'");
    let prune = fx.run(&["prune", "--older-than", "1h"]);
    assert_eq!(prune.code, 0, "{}", prune.stderr);
    assert!(fx.rows().is_empty());
}

#[test]
fn a_payload_of_a_type_the_relay_cannot_send_is_78_naming_the_column_and_type() {
    let mut fx = Fixture::new("payload_xml");
    fx.execute("ALTER TABLE {table} ALTER COLUMN payload TYPE xml USING '<a/>'::xml");
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload) VALUES ('e-1', 'order.created', '<a/>')",
    );

    let run = fx.run(&[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(
        run.stderr.contains("\"payload\" is of type xml") && run.stderr.contains("bytea"),
        "{}",
        run.stderr
    );
    assert!(fx.messages().is_empty());
    // status never reads the payload: it still works.
    assert_eq!(fx.run(&["status"]).code, 0);
}
