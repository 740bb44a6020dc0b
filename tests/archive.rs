//! `prune --archive FILE` and `replay --from FILE`: every pruned row is
//! on disk before its deletion commits, in plain, gzip or zstd JSON Lines,
//! and a replay sends each selected event again as the relay sent it,
//! without ever connecting to PostgreSQL.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use lapin::types::AMQPValue;
use outbox_poll::archive::reader::Reader;

use crate::common::scratch::Scratch;
use crate::common::{Fixture, Message, Run, assert_one_clear_line};
use crate::partitions::aged_partitions;

/// Where a replay looks for PostgreSQL: nothing listens there, so a
/// replay that tried to connect would fail.
const CLOSED_DATABASE: &str = "postgresql://postgres@127.0.0.1:1/test?connect_timeout=1";

/// `count` events `<prefix>-<n>`, published eight days ago.
fn published_long_ago(fx: &mut Fixture, prefix: &str, count: i64) {
    fx.insert(prefix, count);
    fx.execute(&format!(
        "UPDATE {{table}} SET published_at = now() - interval '8 days' \
         WHERE event_id LIKE '{prefix}-%'"
    ));
}

fn prune(fx: &Fixture, archive: &Path, more: &[&str]) -> Run {
    let archive = archive.to_str().unwrap();
    let mut args = vec!["prune", "--older-than", "7d", "--archive", archive];
    args.extend_from_slice(more);
    fx.run(&args)
}

/// `replay --from FILE more...`, with PostgreSQL out of reach.
fn replay(fx: &Fixture, archive: &Path, more: &[&str]) -> Run {
    let archive = archive.to_str().unwrap();
    let mut args = vec!["replay", "--from", archive];
    args.extend_from_slice(more);
    fx.run_with(&[("DATABASE_URL", CLOSED_DATABASE)], &args)
}

/// The archive's lines, decompressed, each a JSON object.
fn archived(path: &Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let mut reader = Reader::open(path).expect("opening the archive");
    let mut rows = Vec::new();
    while let Some(line) = reader.next_line().expect("reading the archive") {
        match serde_json::from_str(line) {
            Ok(serde_json::Value::Object(row)) => rows.push(row),
            other => panic!("not an object: {other:?} in {line}"),
        }
    }
    rows
}

fn archived_ids(path: &Path) -> BTreeSet<String> {
    archived(path)
        .iter()
        .map(|row| row["event_id"].as_str().unwrap().to_string())
        .collect()
}

fn event_ids(fx: &mut Fixture) -> BTreeSet<String> {
    fx.rows().into_iter().map(|row| row.event_id).collect()
}

fn message_ids(messages: &[Message]) -> BTreeSet<String> {
    messages.iter().map(|m| m.message_id.clone()).collect()
}

fn ids(prefix: &str, count: i64) -> BTreeSet<String> {
    (1..=count).map(|n| format!("{prefix}-{n}")).collect()
}

#[test]
fn prune_archives_every_pruned_row_and_replay_sends_each_again_plain_gzip_and_zstd() {
    let mut fx = Fixture::new("archive_round_trip");
    let scratch = Scratch::new("archive_round_trip");
    fx.insert("recent", 1);
    for name in ["plain.jsonl", "gzip.jsonl.gz", "zstd.jsonl.zst"] {
        let prefix = name.split('.').next().unwrap();
        published_long_ago(&mut fx, prefix, 7);
        let path = scratch.path().join(name);
        let run = prune(&fx, &path, &["--batch-size", "3"]);
        assert_eq!(run.code, 0, "{name}: {}", run.stderr);
        assert_eq!(run.stdout, "deleted 7 published events older than 7d\n");
        assert_eq!(event_ids(&mut fx), ids("recent", 1), "{name}: pruned");
        assert_eq!(archived_ids(&path), ids(prefix, 7), "{name}: archived");
        let order: Vec<i64> = archived(&path)
            .iter()
            .map(|row| row["id"].as_i64().unwrap())
            .collect();
        assert!(order.is_sorted(), "{name}: not by id: {order:?}");
        // What zcat and zstdcat read: each format's magic number.
        let magic: &[u8] = match prefix {
            "gzip" => &[0x1f, 0x8b],
            "zstd" => &[0x28, 0xb5, 0x2f, 0xfd],
            _ => b"{\"id\": ",
        };
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(magic), "{name}: {:?}", &bytes[..8]);
        // Every column, in its JSON form.
        let row = &archived(&path)[0];
        for column in [
            "id",
            "event_id",
            "event_type",
            "payload",
            "created_at",
            "published_at",
            "attempts",
            "last_error",
            "available_at",
            "headers",
            "routing_key",
            "exchange",
        ] {
            assert!(row.contains_key(column), "{name}: no {column} in {row:?}");
        }
        assert!(row["payload"].is_object(), "{row:?}");

        let run = replay(&fx, &path, &["--json"]);
        assert_eq!(run.code, 0, "{name}: {}", run.stderr);
        assert_eq!((run.field("published"), run.field("failed")), (7, 0));
        assert_eq!(message_ids(&fx.messages()), ids(prefix, 7), "{name}");
    }
}

#[test]
fn a_bytea_payload_is_archived_base64_and_replayed_as_its_exact_bytes() {
    let mut fx = Fixture::new("archive_bytea");
    fx.execute("ALTER TABLE {table} ALTER COLUMN payload TYPE bytea USING payload::text::bytea");
    let bytes: Vec<u8> = (0..=255).chain([0xff, 0x00, 0xc3]).collect();
    let sql = format!(
        "INSERT INTO {} (event_id, event_type, payload, published_at) \
         VALUES ('b-1', 'blob', $1, now() - interval '8 days')",
        fx.quoted_table()
    );
    fx.db.execute(&sql, &[&bytes]).unwrap();
    let scratch = Scratch::new("archive_bytea");
    let path = scratch.path().join("bytea.jsonl");
    let run = prune(&fx, &path, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let row = &archived(&path)[0];
    assert!(!row.contains_key("payload"), "{row:?}");
    let encoded = row["payload_base64"].as_str().unwrap();
    assert!(!encoded.contains('\n'), "{encoded}");

    let run = replay(&fx, &path, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let message = fx.messages().remove(0);
    assert_eq!(message.body, bytes);
    assert_eq!(
        message.content_type.as_deref(),
        Some("application/octet-stream")
    );
}

#[test]
fn an_existing_archive_is_never_overwritten_exit_78_and_nothing_is_deleted() {
    let mut fx = Fixture::new("archive_exists");
    published_long_ago(&mut fx, "e", 3);
    let scratch = Scratch::new("archive_exists");
    let path = scratch.write("old.jsonl", "yesterday's archive\n");
    let run = prune(&fx, &path, &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(run.stderr.contains("never overwritten"), "{}", run.stderr);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "yesterday's archive\n"
    );
    assert_eq!(event_ids(&mut fx), ids("e", 3));
}

/// A tmpfs of `options` mounted on a new directory, unmounted on Drop;
/// None (with the reason printed) where this test may not mount.
struct Mount {
    point: PathBuf,
    /// Removed after the unmount.
    _scratch: Scratch,
}

impl Mount {
    fn tmpfs(label: &str, options: &str) -> Option<Mount> {
        let scratch = Scratch::new(label);
        let point = scratch.path().join("mnt");
        std::fs::create_dir(&point).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(&point)
            .output();
        match mounted {
            Ok(output) if output.status.success() => Some(Mount {
                point,
                _scratch: scratch,
            }),
            Ok(output) => {
                let why = String::from_utf8_lossy(&output.stderr);
                println!("skipped: cannot mount a tmpfs here ({})", why.trim());
                None
            }
            Err(error) => {
                println!("skipped: cannot run mount ({error})");
                None
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.point).status();
    }
}

#[test]
fn an_archive_in_a_read_only_directory_is_78_and_nothing_is_deleted() {
    let mut fx = Fixture::new("archive_read_only");
    published_long_ago(&mut fx, "e", 3);
    // The tests run as root, whom file modes do not stop: a read-only
    // file system does.
    let Some(mount) = Mount::tmpfs("archive_read_only", "ro,size=64k") else {
        return;
    };
    let run = prune(&fx, &mount.point.join("a.jsonl.gz"), &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(run.stderr.contains("Read-only"), "{}", run.stderr);
    assert_eq!(event_ids(&mut fx), ids("e", 3));
}

#[test]
fn a_full_file_system_deletes_nothing_that_is_not_archived() {
    let mut fx = Fixture::new("archive_full");
    // About 300 bytes a row archived: 600 rows need three times the 64k.
    published_long_ago(&mut fx, "e", 600);
    let Some(mount) = Mount::tmpfs("archive_full", "size=64k") else {
        return;
    };
    // One batch: the write fails, the delete is rolled back.
    let run = prune(&fx, &mount.point.join("one.jsonl"), &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(run.stderr.contains("No space left"), "{}", run.stderr);
    assert_eq!(event_ids(&mut fx), ids("e", 600), "nothing deleted");
    std::fs::remove_file(mount.point.join("one.jsonl")).unwrap();

    // Batches of 50: those that fit are deleted, and each is archived.
    let path = mount.point.join("batches.jsonl");
    let run = prune(&fx, &path, &["--batch-size", "50"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    let left = event_ids(&mut fx);
    let archived = archived_ids(&path);
    assert!(left.len() < 600 && !archived.is_empty(), "{}", left.len());
    assert!(archived.is_disjoint(&left), "archived rows were deleted");
    let all: BTreeSet<String> = left.union(&archived).cloned().collect();
    assert_eq!(all, ids("e", 600), "a row was deleted without its archive");
}

#[test]
fn an_archive_to_stdout_is_the_json_lines_and_the_report_goes_to_stderr() {
    let mut fx = Fixture::new("archive_stdout");
    published_long_ago(&mut fx, "e", 4);
    let run = fx.run(&["prune", "--older-than", "7d", "--archive", "-"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let ids_out: BTreeSet<String> = run
        .stdout
        .lines()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            row["event_id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(ids_out, ids("e", 4));
    assert!(
        run.stderr
            .contains("deleted 4 published events older than 7d"),
        "{}",
        run.stderr
    );
    assert!(event_ids(&mut fx).is_empty());
}

/// The headers of `message` but x-replayed-at.
fn headers_but_replayed_at(message: &Message) -> Vec<(String, AMQPValue)> {
    let headers = message.headers.clone().unwrap_or_default();
    headers
        .inner()
        .iter()
        .filter(|(name, _)| name.as_str() != "x-replayed-at")
        .map(|(name, value)| (name.to_string(), value.clone()))
        .collect()
}

#[test]
fn replay_sends_the_original_ids_properties_and_bodies_with_x_replayed_at() {
    let mut fx = Fixture::new("replay_properties");
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload, routing_key, headers, \
           correlation_id, content_type, priority, ordering_key, created_at) VALUES \
         ('p-1', 'order.created', '{\"b\": [1, 2.50], \"a\": \"é\\n\"}', 'eu.orders', \
          '{\"traceparent\": \"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\", \"n\": 7}', \
          'c-1', 'application/vnd.order+json', 5, 'k-1', now() - interval '9 days'), \
         ('p-2', 'order.paid', '[]', NULL, NULL, NULL, NULL, NULL, NULL, now() - interval '9 days')",
    );
    let run = fx.run(&[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let originals = fx.messages();
    assert_eq!(originals.len(), 2);
    fx.execute("UPDATE {table} SET published_at = now() - interval '8 days'");
    let scratch = Scratch::new("replay_properties");
    let path = scratch.path().join("a.jsonl.zst");
    let run = prune(&fx, &path, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);

    let before = jiff::Timestamp::now();
    let run = replay(&fx, &path, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stdout,
        format!(
            "replayed 2 of {}: 2 published, 0 failed, 0 expired\n",
            path.display()
        )
    );
    let replayed = fx.messages();
    assert_eq!(replayed.len(), 2);
    for original in &originals {
        let again = replayed
            .iter()
            .find(|m| m.message_id == original.message_id)
            .unwrap();
        let id = &original.message_id;
        assert_eq!(again.body, original.body, "{id}: body");
        assert_eq!(again.routing_key, original.routing_key, "{id}");
        assert_eq!(again.exchange, original.exchange, "{id}");
        assert_eq!(again.kind, original.kind, "{id}");
        assert_eq!(again.content_type, original.content_type, "{id}");
        assert_eq!(again.correlation_id, original.correlation_id, "{id}");
        assert_eq!(again.priority, original.priority, "{id}");
        assert_eq!(again.delivery_mode, Some(2), "{id}");
        assert_eq!(again.timestamp, original.timestamp, "{id}");
        assert_eq!(again.app_id, original.app_id, "{id}");
        assert_eq!(
            headers_but_replayed_at(again),
            headers_but_replayed_at(original),
            "{id}"
        );
        let at = again.header_text("x-replayed-at").expect("x-replayed-at");
        let at: jiff::Timestamp = at.parse().unwrap();
        assert!(at >= before - jiff::SignedDuration::from_secs(1), "{at}");
    }
    let first = replayed.iter().find(|m| m.message_id == "p-1").unwrap();
    assert_eq!(first.routing_key, "eu.orders");
    assert_eq!(
        first.header("x-ordering-key"),
        Some(&AMQPValue::LongString("k-1".into()))
    );
}

#[test]
fn replay_selects_by_since_until_event_type_and_event_id() {
    let mut fx = Fixture::new("replay_filters");
    fx.execute(
        "INSERT INTO {table} (event_id, event_type, payload, created_at, published_at) VALUES \
         ('f-1', 'order.created', '{}', '2026-01-01T00:00:00Z', now() - interval '8 days'), \
         ('f-2', 'order.paid',    '{}', '2026-02-01T00:00:00Z', now() - interval '8 days'), \
         ('f-3', 'invoice.sent',  '{}', '2026-03-01T00:00:00Z', now() - interval '8 days'), \
         ('f-4', 'order.created', '{}', '2026-04-01T00:00:00Z', now() - interval '8 days')",
    );
    let scratch = Scratch::new("replay_filters");
    let path = scratch.path().join("a.jsonl.gz");
    assert_eq!(prune(&fx, &path, &[]).code, 0);
    let selected = |args: &[&str]| {
        let run = replay(&fx, &path, args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        message_ids(&fx.messages())
    };
    let set = |ids: &[&str]| ids.iter().map(|id| id.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        selected(&["--since", "2026-02-01T00:00:00Z"]),
        set(&["f-2", "f-3", "f-4"])
    );
    assert_eq!(
        selected(&["--until", "2026-02-01T01:00:00+01:00"]),
        set(&["f-1"])
    );
    assert_eq!(
        selected(&["--event-type", "order.*"]),
        set(&["f-1", "f-2", "f-4"])
    );
    assert_eq!(
        selected(&["--event-id", "f-3", "f-1"]),
        set(&["f-1", "f-3"])
    );
    assert_eq!(
        selected(&[
            "--event-type",
            "order.*",
            "--since",
            "2026-01-15T00:00:00Z",
            "--until",
            "2026-04-01T00:00:00Z"
        ]),
        set(&["f-2"])
    );
}

#[test]
fn replay_to_a_missing_exchange_exits_78_and_publishes_nothing() {
    let mut fx = Fixture::new("replay_missing_exchange");
    published_long_ago(&mut fx, "e", 2);
    let scratch = Scratch::new("replay_missing_exchange");
    let path = scratch.path().join("a.jsonl");
    assert_eq!(prune(&fx, &path, &[]).code, 0);
    let run = replay(&fx, &path, &["--exchange", "no-such-exchange-here"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(
        run.stderr.contains("no-such-exchange-here"),
        "{}",
        run.stderr
    );
    assert!(fx.messages().is_empty());
}

#[test]
fn a_malformed_line_is_named_by_file_and_line_exit_78_and_nothing_is_published() {
    let fx = Fixture::new("replay_malformed");
    let scratch = Scratch::new("replay_malformed");
    // More good lines than a batch: a replay that published as it read
    // would have sent some before it met the bad one.
    let good = format!(
        "{}\n",
        r#"{"event_id": "g", "event_type": "t", "payload": {}}"#
    );
    let text = format!("{}{{\"event_id\": \"bad\"\n", good.repeat(250));
    let path = scratch.write("a.jsonl", &text);
    let run = replay(&fx, &path, &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    let place = format!("{}:251", path.display());
    assert!(run.stderr.contains(&place), "{}", run.stderr);
    assert!(
        fx.messages().is_empty(),
        "published before the whole file was checked"
    );
}

#[test]
fn replay_never_touches_the_outbox() {
    let mut fx = Fixture::new("replay_no_database");
    published_long_ago(&mut fx, "e", 2);
    let scratch = Scratch::new("replay_no_database");
    let path = scratch.path().join("a.jsonl");
    assert_eq!(prune(&fx, &path, &[]).code, 0);
    fx.insert("kept", 1);
    // DATABASE_URL names a port nothing listens on (see `replay`).
    let run = replay(&fx, &path, &["--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 2);
    let rows = fx.rows();
    assert_eq!((rows.len(), rows[0].published), (1, false));
}

#[test]
fn a_partition_is_archived_before_it_is_dropped_whole() {
    let mut fx = Fixture::partitioned("archive_partitions");
    aged_partitions(&mut fx);
    let scratch = Scratch::new("archive_partitions");
    let path = scratch.path().join("a.jsonl.gz");
    let run = prune(&fx, &path, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("dropped 1 partition whole"),
        "{}",
        run.stdout
    );
    let archived = archived_ids(&path);
    let expected = ["a-1", "a-2", "a-3", "b-1", "c-1", "e-1"];
    assert_eq!(archived, expected.iter().map(|id| id.to_string()).collect());
    let left: Vec<String> = event_ids(&mut fx).into_iter().collect();
    assert_eq!(left, ["b-2", "c-2", "d-1", "f-1"]);
}

#[test]
fn a_partition_whose_archive_fails_is_attached_again_with_its_rows() {
    let mut fx = Fixture::partitioned("archive_partition_full");
    aged_partitions(&mut fx);
    let Some(mount) = Mount::tmpfs("archive_partition_full", "size=64k") else {
        return;
    };
    // Every block taken: the archive is created, its first write fails.
    let _ = std::fs::write(mount.point.join("filler"), vec![0u8; 128 * 1024]);
    let run = prune(&fx, &mount.point.join("a.jsonl.gz"), &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(run.stderr.contains("No space left"), "{}", run.stderr);
    assert_eq!(fx.rows().len(), 10, "nothing deleted");
    let attached: i64 = fx
        .db
        .query_one(
            &format!(
                "SELECT count(*) FROM pg_inherits WHERE inhparent = '{}'::regclass",
                fx.quoted_table()
            ),
            &[],
        )
        .unwrap()
        .get(0);
    let oldest: i64 = fx
        .db
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE event_id LIKE 'a-%'",
                fx.quoted_table()
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        oldest, 3,
        "the oldest partition's rows are seen through the table"
    );
    assert!(attached >= 9, "{attached} partitions");
}

#[test]
fn replay_of_an_unroutable_event_exits_1_and_names_it() {
    let mut fx = Fixture::new("replay_unroutable");
    fx.insert_event("u-1", "invoice.sent", "{}");
    fx.insert_event("u-2", "order.created", "{}");
    fx.execute("UPDATE {table} SET published_at = now() - interval '8 days'");
    let scratch = Scratch::new("replay_unroutable");
    let path = scratch.path().join("a.jsonl");
    assert_eq!(prune(&fx, &path, &[]).code, 0);
    fx.route_only("order.#");
    let run = replay(&fx, &path, &["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("failed")), (1, 1));
    assert!(
        run.stderr
            .contains(&format!("event u-1 ({}:1)", path.display())),
        "{}",
        run.stderr
    );
    assert_eq!(message_ids(&fx.messages()), ids("u", 2).split_off("u-2"));
}

#[test]
fn json_and_text_payloads_are_archived_as_stored_and_replayed_as_their_exact_text() {
    // json keeps its spacing and key order, which a jsonb value would lose.
    let json = r#"{"b":  1, "a": [true,  null]}"#;
    let text = "héllo, wörld\n{not json}";
    for (type_name, stored, key, content_type) in [
        ("json", json, "payload_json", "application/json"),
        ("text", text, "payload_text", "text/plain; charset=utf-8"),
    ] {
        let mut fx = Fixture::new(&format!("archive_{type_name}"));
        fx.execute(&format!(
            "ALTER TABLE {{table}} ALTER COLUMN payload TYPE {type_name} \
             USING payload::text::{type_name}"
        ));
        let sql = format!(
            "INSERT INTO {} (event_id, event_type, payload, published_at) \
             VALUES ('j-1', 't', $1::text::{type_name}, now() - interval '8 days')",
            fx.quoted_table()
        );
        fx.db.execute(&sql, &[&stored]).unwrap();
        let scratch = Scratch::new(&format!("archive_{type_name}"));
        let path = scratch.path().join("a.jsonl");
        let run = prune(&fx, &path, &[]);
        assert_eq!(run.code, 0, "{type_name}: {}", run.stderr);
        assert_eq!(archived(&path)[0][key], stored, "{type_name}");

        let run = replay(&fx, &path, &[]);
        assert_eq!(run.code, 0, "{type_name}: {}", run.stderr);
        let message = fx.messages().remove(0);
        assert_eq!(
            String::from_utf8(message.body).unwrap(),
            stored,
            "{type_name}"
        );
        assert_eq!(message.content_type.as_deref(), Some(content_type));
    }
}
