//! OpenTelemetry traces over OTLP/HTTP, received by the fake collector of
//! common/collector.rs: the spans of a run, its batches and each publish,
//! the link to the producer's traceparent and the traceparent a consumer
//! gets; a collector that is not there costs at most the flush bound; and
//! without an endpoint nothing is built.

use std::time::{Duration, Instant};

use crate::common::certs::{ClientAuth, TestCa};
use crate::common::collector::{Collector, Silent, closed_port};
use crate::common::tls_terminator::TlsTerminator;
use crate::common::{Extra, Fixture, Run};

/// A producer's trace context, as a producer writes it in the headers column.
const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// The run's flush bound (src/report/traces.rs), and what a run of a few
/// events takes on a loaded machine besides it.
const BOUND: Duration = Duration::from_secs(2);
const MARGIN: Duration = Duration::from_millis(1500);

fn producer_traceparent() -> String {
    format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01")
}

fn run_exporting_to(fx: &Fixture, endpoint: &str, env: &[(&str, &str)]) -> Run {
    let mut all = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)];
    all.extend_from_slice(env);
    fx.run_with(&all, &["--json"])
}

#[test]
fn a_run_exports_its_span_its_batchs_and_one_producer_span_per_published_event() {
    let mut fx = Fixture::new("traces_spans");
    fx.insert("e", 3);
    let collector = Collector::start();
    let run = run_exporting_to(&fx, &collector.endpoint(), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stderr, "", "no warning expected");

    let runs = collector.named("outbox-poll run");
    assert_eq!(runs.len(), 1, "{:#?}", collector.spans());
    let root = &runs[0];
    assert_eq!(root.service, "outbox-poll");
    assert_eq!(root.attribute("outbox_poll.exit_code"), "0");
    assert_eq!(root.attribute("outbox_poll.published"), "3");
    assert_eq!(root.attribute("outbox_poll.batch_size"), "100");
    assert_eq!(root.parent_span_id, "");

    let batches = collector.named("outbox-poll batch");
    assert_eq!(batches.len(), 1);
    let batch = &batches[0];
    assert_eq!(batch.parent_span_id, root.span_id);
    assert_eq!(batch.trace_id, root.trace_id);
    assert_eq!(batch.attribute("outbox_poll.batch.claimed"), "3");
    assert_eq!(batch.attribute("outbox_poll.batch.published"), "3");
    assert_eq!(batch.attribute("outbox_poll.batch.failed"), "0");
    assert_eq!(batch.attribute("outbox_poll.table"), fx.table);
    assert!(
        batch
            .attributes
            .contains_key("outbox_poll.transaction.duration_ms")
    );

    for n in 1..=3 {
        let publish = collector.publish_of(&format!("e-{n}"));
        assert_eq!(publish.name, format!("publish {}", fx.exchange));
        assert_eq!(publish.kind, 4, "SPAN_KIND_PRODUCER");
        assert_eq!(publish.parent_span_id, batch.span_id);
        assert_eq!(publish.status, 1, "STATUS_CODE_OK");
        assert_eq!(publish.attribute("messaging.system"), "rabbitmq");
        assert_eq!(publish.attribute("messaging.operation.type"), "publish");
        assert_eq!(publish.attribute("messaging.destination.name"), fx.exchange);
        assert_eq!(
            publish.attribute("messaging.rabbitmq.destination.routing_key"),
            "order.created"
        );
        let wait: i64 = publish.attribute("outbox_poll.wait_ms").parse().unwrap();
        assert!((0..60_000).contains(&wait), "{wait}");
    }
}

#[test]
fn a_publish_spans_wait_is_the_milliseconds_since_the_events_exact_created_at() {
    let mut fx = Fixture::new("traces_wait");
    fx.insert("e", 1);
    // One to two seconds ago by the server's clock, at .999 of its second:
    // a wait read in whole seconds would be 999 ms too long.
    let before = fx.clock();
    let since = before.duration_since(std::time::UNIX_EPOCH).unwrap();
    let created = since.as_secs() as f64 - 2.0 + 0.999;
    fx.execute(&format!(
        "UPDATE {{table}} SET created_at = to_timestamp({created})"
    ));
    let collector = Collector::start();
    let run = run_exporting_to(&fx, &collector.endpoint(), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let after = fx.clock().duration_since(std::time::UNIX_EPOCH).unwrap();

    let wait: f64 = collector
        .publish_of("e-1")
        .attribute("outbox_poll.wait_ms")
        .parse()
        .unwrap();
    let least = (since.as_secs_f64() - created) * 1000.0;
    let most = (after.as_secs_f64() - created) * 1000.0;
    assert!(
        (least - 1.0..=most + 1.0).contains(&wait),
        "wait {wait} ms, expected between {least:.0} and {most:.0}"
    );
}

#[test]
fn a_run_over_two_outboxes_exports_one_run_span_and_batch_spans_naming_each_table() {
    let mut fx = Fixture::new("traces_many");
    let other = format!("{}.second", fx.schema);
    let run = fx.run(&["--table", &other, "migrate"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    fx.insert("first", 2);
    fx.execute(&format!(
        "INSERT INTO {other} (event_id, event_type, payload) \
         SELECT 'second-' || g, 'order.created', '{{}}' FROM generate_series(1, 3) g"
    ));
    let collector = Collector::start();
    let tables = format!("{},{other}", fx.table);
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run = fx.run_with(&env, &["--table", &tables, "--json"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);

    let runs = collector.named("outbox-poll run");
    assert_eq!(runs.len(), 1, "{:#?}", collector.spans());
    assert_eq!(runs[0].attribute("outbox_poll.published"), "5");
    let batches = collector.named("outbox-poll batch");
    let mut named: Vec<(String, String)> = batches
        .iter()
        .map(|batch| {
            assert_eq!(batch.parent_span_id, runs[0].span_id);
            let table = batch.attribute("outbox_poll.table").to_string();
            let published = batch.attribute("outbox_poll.batch.published");
            (table, published.to_string())
        })
        .collect();
    named.sort();
    let mut expected = vec![
        (fx.table.clone(), "2".to_string()),
        (other, "3".to_string()),
    ];
    expected.sort();
    assert_eq!(named, expected);
    // One database, named alike in both (hosts and name, never a password).
    let database = batches[0].attribute("outbox_poll.database");
    assert!(!database.is_empty());
    assert_eq!(batches[1].attribute("outbox_poll.database"), database);
    for event in ["first-1", "first-2", "second-1", "second-2", "second-3"] {
        let publish = collector.publish_of(event);
        assert!(
            batches
                .iter()
                .any(|batch| batch.span_id == publish.parent_span_id),
            "{event}: {publish:?}"
        );
    }
}

#[test]
fn a_publish_span_is_linked_to_the_producers_traceparent_which_reaches_the_consumer_unchanged() {
    let mut fx = Fixture::new("traces_link");
    let headers = format!(r#"{{"traceparent": "{}"}}"#, producer_traceparent());
    fx.insert_extra(
        "traced",
        Extra {
            headers: Some(&headers),
            ..Extra::default()
        },
    );
    let collector = Collector::start();
    let run = run_exporting_to(&fx, &collector.endpoint(), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);

    let publish = collector.publish_of("traced");
    assert_eq!(
        publish.links,
        vec![(PRODUCER_TRACE.to_string(), PRODUCER_SPAN.to_string())]
    );
    let messages = fx.messages();
    assert_eq!(
        messages[0].header_text("traceparent"),
        Some(producer_traceparent())
    );
}

#[test]
fn an_event_without_a_traceparent_reaches_the_consumer_with_its_publish_spans() {
    let mut fx = Fixture::new("traces_inject");
    fx.insert_extra(
        "plain",
        Extra {
            headers: Some(r#"{"tenant": "a"}"#),
            ..Extra::default()
        },
    );
    fx.insert_event("bare", "order.created", "{}");
    let collector = Collector::start();
    let run = run_exporting_to(&fx, &collector.endpoint(), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);

    for message in fx.messages() {
        let publish = collector.publish_of(&message.message_id);
        assert!(publish.links.is_empty(), "{publish:?}");
        assert_eq!(
            message.header_text("traceparent"),
            Some(publish.traceparent()),
            "{}",
            message.message_id
        );
    }
}

#[test]
fn with_otel_propagators_none_an_event_without_a_traceparent_is_sent_without_headers() {
    let mut fx = Fixture::new("traces_no_inject");
    fx.insert_event("bare", "order.created", "{}");
    let collector = Collector::start();
    let run = run_exporting_to(&fx, &collector.endpoint(), &[("OTEL_PROPAGATORS", "none")]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    collector.publish_of("bare");
    let messages = fx.messages();
    assert_eq!(messages.len(), 1);
    assert!(messages[0].headers.is_none(), "{:?}", messages[0].headers);
}

#[test]
fn a_propagator_that_is_not_built_in_is_told_once_and_tracecontext_still_written() {
    let mut fx = Fixture::new("traces_b3");
    fx.insert("e", 2);
    let collector = Collector::start();
    let env = [("OTEL_PROPAGATORS", "b3,tracecontext")];
    let run = run_exporting_to(&fx, &collector.endpoint(), &env);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(
        lines[0].starts_with("outbox-poll: warning: OTEL_PROPAGATORS names b3 "),
        "{}",
        lines[0]
    );
    for message in fx.messages() {
        let publish = collector.publish_of(&message.message_id);
        assert_eq!(
            message.header_text("traceparent"),
            Some(publish.traceparent())
        );
    }
}

#[test]
fn spans_go_as_json_with_the_headers_and_service_name_the_variables_give() {
    let mut fx = Fixture::new("traces_json");
    fx.insert("e", 1);
    let collector = Collector::start();
    let run = run_exporting_to(
        &fx,
        &collector.endpoint(),
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=blue"),
            ("OTEL_SERVICE_NAME", "relay-eu"),
        ],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let requests = collector.requests();
    assert!(!requests.is_empty());
    for request in &requests {
        assert_eq!(request.path, "/v1/traces");
        assert_eq!(request.content_type, "application/json");
        assert_eq!(
            request.headers.get("x-tenant").map(String::as_str),
            Some("blue")
        );
    }
    let publish = collector.publish_of("e-1");
    assert_eq!(publish.service, "relay-eu");
    assert_eq!(publish.attribute("messaging.message.id"), "e-1");
}

/// A run of five events exporting to `endpoint`, a collector that is not
/// there, two spans per export request (so that several fail): it must
/// publish all, exit 0, take at most the bound more than a run that
/// exports nothing, and say so in exactly one warning line, which says
/// `why`.
fn assert_costs_at_most_the_bound(fx: &mut Fixture, endpoint: &str, why: &str) {
    fx.insert("e", 5);
    let started = Instant::now();
    let run = fx.run_with(
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2"),
        ],
        &["--json"],
    );
    let took = started.elapsed();
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 5);
    assert!(took < BOUND + MARGIN, "the run took {took:?}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    let told = format!("outbox-poll: warning: traces to {endpoint}: ");
    assert!(lines[0].starts_with(&told), "{}", lines[0]);
    assert!(lines[0].contains(why), "{}", lines[0]);
}

#[test]
fn a_collector_that_never_answers_delays_the_run_by_at_most_the_bound() {
    let mut fx = Fixture::new("traces_silent");
    let silent = Silent::start();
    let endpoint = format!("http://127.0.0.1:{}/v1/traces", silent.port);
    assert_costs_at_most_the_bound(&mut fx, &endpoint, "did not take the last spans within");
}

#[test]
fn a_closed_collector_port_delays_the_run_by_at_most_the_bound() {
    let mut fx = Fixture::new("traces_closed");
    let endpoint = format!("http://127.0.0.1:{}/v1/traces", closed_port());
    assert_costs_at_most_the_bound(&mut fx, &endpoint, "exporting failed");
}

/// A collector behind TLS with the test CA's certificate for 127.0.0.1,
/// asking for a client certificate if told to; its https:// base URL.
fn collector_over_tls(
    collector: &Collector,
    ca: &TestCa,
    auth: ClientAuth,
) -> (TlsTerminator, String) {
    let target = format!("127.0.0.1:{}", collector.port).parse().unwrap();
    let terminator = TlsTerminator::start(target, ca.server_config(auth));
    let endpoint = format!("https://127.0.0.1:{}", terminator.port());
    (terminator, endpoint)
}

#[test]
fn a_collector_over_tls_that_asks_for_a_client_certificate_gets_the_spans() {
    let mut fx = Fixture::new("traces_tls");
    fx.insert("e", 2);
    let collector = Collector::start();
    let ca = TestCa::new(&["127.0.0.1"]);
    let (terminator, endpoint) = collector_over_tls(&collector, &ca, ClientAuth::Required);
    let (root, cert, key) = (ca.ca_cert(), ca.client_cert(), ca.client_key());
    let env = [
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", root.to_str().unwrap()),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            cert.to_str().unwrap(),
        ),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", key.to_str().unwrap()),
    ];
    let run = run_exporting_to(&fx, &endpoint, &env);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    assert_eq!(
        collector.named("outbox-poll run").len(),
        1,
        "{:#?}",
        collector.spans()
    );
    collector.publish_of("e-2");
    assert!(terminator.handshakes() >= 1);
}

#[test]
fn a_collector_whose_certificate_is_not_trusted_gets_nothing_and_the_run_goes_on() {
    let mut fx = Fixture::new("traces_tls_untrusted");
    fx.insert("e", 2);
    let collector = Collector::start();
    let (theirs, ours) = (TestCa::new(&["127.0.0.1"]), TestCa::new(&["127.0.0.1"]));
    let (terminator, endpoint) = collector_over_tls(&collector, &theirs, ClientAuth::None);
    let root = ours.ca_cert();
    let env = [("OTEL_EXPORTER_OTLP_CERTIFICATE", root.to_str().unwrap())];
    let run = run_exporting_to(&fx, &endpoint, &env);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 2);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(
        lines[0].starts_with("outbox-poll: warning: traces to https://"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("invalid peer certificate"),
        "{}",
        lines[0]
    );
    assert!(collector.spans().is_empty());
    assert_eq!(terminator.handshakes(), 0);
}

#[test]
fn a_missing_otlp_certificate_file_is_told_in_one_line_and_the_run_goes_on_without_traces() {
    let mut fx = Fixture::new("traces_tls_nofile");
    fx.insert("e", 1);
    let collector = Collector::start();
    let env = [("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")];
    let run = run_exporting_to(&fx, "https://127.0.0.1:9", &env);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.field("published"), 1);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(
        lines[0].starts_with("outbox-poll: warning: "),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("/nonexistent/ca.pem"), "{}", lines[0]);
    assert!(collector.spans().is_empty());
}

#[test]
fn without_an_endpoint_no_exporter_is_built_and_no_traceparent_is_added() {
    let mut fx = Fixture::new("traces_none");
    fx.insert("e", 1);
    let run = fx.run_with(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""),
            ("RUST_LOG", "outbox_poll::report::traces=debug"),
        ],
        &["--json"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("no exporter built"), "{}", run.stderr);
    assert!(!run.stderr.contains("exporting to"), "{}", run.stderr);
    let messages = fx.messages();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].header("traceparent"), None);
}
