//! Connecting to RabbitMQ (docs/src/connecting.md): a list of nodes
//! tried in order, IPv6 literals that reach exactly the host named, amqps
//! through a test-owned TLS terminator in front of the shared broker with a
//! CA the test makes, the URL's tuning parameters as the broker receives
//! them, a broker that blocks publishers (a private node under a memory
//! alarm), and signals while the connect hangs. No password of any URL is
//! ever printed.
//!
//! A real 3-node cluster takes about a minute to start, so its failover
//! test is ignored by plain `cargo test`: run it with
//! `cargo test --test integration broker_connect:: -- --ignored`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::certs::{ClientAuth, TestCa};
use crate::common::private_rabbit::{RabbitCluster, RabbitNode};
use crate::common::proxy::Proxy;
use crate::common::scratch::free_port;
use crate::common::tls_terminator::TlsTerminator;
use crate::common::{
    Amqp, Fixture, amqp_addr, amqp_url, assert_a_signal_ends_a_hung_connect, assert_one_clear_line,
    assert_untouched,
};

/// A URL no broker answers, with a password no message may show.
fn dead_node(port: u16) -> String {
    format!("amqp://guest:dead-s3cret-{port}@127.0.0.1:{port}/%2f")
}

/// Nothing was published and no row touched: what an outage leaves.
fn assert_nothing_published_or_blamed(fx: &mut Fixture) {
    let rows = fx.rows();
    assert!(rows.iter().all(|row| !row.published), "{rows:?}");
    assert_untouched(&rows);
    assert!(fx.messages().is_empty());
}

#[test]
fn a_dead_first_node_gives_way_to_the_next_in_either_list_form() {
    let mut fx = Fixture::new("amqp_list");
    for (form, separator) in [("comma", ","), ("whitespace", " \n ")] {
        fx.insert(form, 3);
        let list = format!("{}{separator}{}", dead_node(free_port()), amqp_url());
        let run = fx.run_with(&[("AMQP_URL", &list)], &[]);
        assert_eq!(run.code, 0, "{form}: {}", run.stderr);
        assert_eq!(fx.arrivals().len(), 3, "{form}");
    }
    assert_eq!(fx.published_count(), 6);
}

#[test]
fn a_list_where_no_node_answers_exits_69_naming_each_and_no_password() {
    let mut fx = Fixture::new("amqp_none");
    fx.insert("e", 2);
    let ports = [free_port(), free_port(), free_port()];
    let list = format!(
        "{},{} {}",
        dead_node(ports[0]),
        dead_node(ports[1]),
        dead_node(ports[2])
    );
    let run = fx.run_with(&[("AMQP_URL", &list)], &[]);
    assert_eq!(run.code, 69, "{}", run.stderr);
    assert_one_clear_line(&run);
    for port in ports {
        let named = format!("127.0.0.1:{port} (vhost /)");
        assert!(run.stderr.contains(&named), "{named} in {}", run.stderr);
    }
    assert!(!run.stderr.contains("s3cret"), "{}", run.stderr);
    assert_nothing_published_or_blamed(&mut fx);
}

#[test]
fn an_ipv6_literal_reaches_exactly_the_host_it_names() {
    let mut fx = Fixture::new("amqp_ipv6");
    fx.insert("e", 2);
    let broker = Proxy::start_on("::1", amqp_addr());
    let url = format!("amqp://guest:guest@[::1]:{}/%2f", broker.port());
    let run = fx.run_with(&[("AMQP_URL", &url)], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(broker.connections(), 1);
    assert_eq!(fx.arrivals().len(), 2);
}

#[test]
fn an_ipv6_literal_where_nothing_listens_is_never_read_as_localhost() {
    let mut fx = Fixture::new("amqp_ipv6_none");
    fx.insert("e", 2);
    // A broker on 127.0.0.1 only, at a port of the test's own: whatever the
    // shared broker binds, nothing listens on 127.0.0.2 at that port, and a
    // URL misread as localhost would reach the proxy.
    let broker = Proxy::start(amqp_addr());
    let url = format!(
        "amqp://guest:guest@[::ffff:127.0.0.2]:{}/%2f",
        broker.port()
    );
    let run = fx.run_with(&[("AMQP_URL", &url)], &[]);
    assert_eq!(run.code, 69, "{}", run.stderr);
    let named = format!("[::ffff:127.0.0.2]:{}", broker.port());
    assert!(run.stderr.contains(&named), "{named} in {}", run.stderr);
    assert_eq!(broker.connections(), 0, "the run reached 127.0.0.1");
    assert_nothing_published_or_blamed(&mut fx);
}

/// The values of the connection.tune-ok a client sent (channel_max,
/// frame_max, heartbeat): what the broker holds the connection to.
fn tune_ok(sent: &[u8]) -> Option<(u16, u32, u16)> {
    // A method frame's payload starts with its class (10, connection) and
    // method (31, tune-ok).
    let at = sent.windows(4).position(|w| w == [0, 10, 0, 31])? + 4;
    let field = |from: usize, len: usize| sent.get(at + from..at + from + len);
    let channel_max = u16::from_be_bytes(field(0, 2)?.try_into().ok()?);
    let frame_max = u32::from_be_bytes(field(2, 4)?.try_into().ok()?);
    let heartbeat = u16::from_be_bytes(field(6, 2)?.try_into().ok()?);
    Some((channel_max, frame_max, heartbeat))
}

#[test]
fn heartbeat_frame_max_and_channel_max_of_the_url_reach_the_broker() {
    let mut fx = Fixture::new("amqp_tuning");
    fx.insert("e", 2);
    let broker = Proxy::start(amqp_addr());
    let url = format!(
        "amqp://guest:guest@127.0.0.1:{}/%2f?heartbeat=7&frame_max=8192&channel_max=16",
        broker.port()
    );
    let run = fx.run_with(&[("AMQP_URL", &url)], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(tune_ok(&broker.upstream_seen()), Some((16, 8192, 7)));
}

/// The shared broker behind a TLS terminator presenting a certificate the
/// test's own CA issued for "localhost".
fn amqps_broker(client_auth: ClientAuth) -> (TestCa, TlsTerminator) {
    let ca = TestCa::new(&["localhost"]);
    let terminator = TlsTerminator::start(amqp_addr(), ca.server_config(client_auth));
    (ca, terminator)
}

#[test]
fn amqps_trusts_the_cacertfile_and_checks_the_server_name_given() {
    let mut fx = Fixture::new("amqps_ca");
    fx.insert("e", 2);
    let (ca, terminator) = amqps_broker(ClientAuth::None);
    // Reached by address, the certificate checked for the name given.
    let url = format!(
        "amqps://guest:guest@127.0.0.1:{}/%2f?cacertfile={}&server_name_indication=localhost",
        terminator.port(),
        ca.ca_cert().display()
    );
    let run = fx.run_with(&[("AMQP_URL", &url)], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(fx.arrivals().len(), 2);
    assert_eq!(terminator.handshakes(), 1);
}

#[test]
fn amqps_presents_the_client_certificate_of_certfile_and_keyfile() {
    let mut fx = Fixture::new("amqps_client_cert");
    fx.insert("e", 2);
    let (ca, terminator) = amqps_broker(ClientAuth::Required);
    let url = format!(
        "amqps://guest:guest@localhost:{}/%2f?cacertfile={}",
        terminator.port(),
        ca.ca_cert().display()
    );
    let without = fx.run_with(&[("AMQP_URL", &url)], &[]);
    assert_eq!(without.code, 78, "{}", without.stderr);
    let client = format!(
        "{url}&certfile={}&keyfile={}",
        ca.client_cert().display(),
        ca.client_key().display()
    );
    let with = fx.run_with(&[("AMQP_URL", &client)], &[]);
    assert_eq!(with.code, 0, "{}", with.stderr);
    assert_eq!(fx.arrivals().len(), 2);
    assert_eq!(
        (terminator.handshakes(), terminator.failed_handshakes()),
        (1, 1)
    );
}

#[test]
fn amqps_refuses_an_unknown_issuer_without_cacertfile_with_78() {
    let mut fx = Fixture::new("amqps_unknown");
    fx.insert("e", 2);
    let (_ca, terminator) = amqps_broker(ClientAuth::None);
    let url = format!("amqps://guest:s3cret@localhost:{}/%2f", terminator.port());
    let run = fx.run_with(&[("AMQP_URL", &url)], &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    let host = format!("localhost:{}", terminator.port());
    for said in [host.as_str(), "UnknownIssuer", "TLS"] {
        assert!(run.stderr.contains(said), "{said:?} in {}", run.stderr);
    }
    assert!(!run.stderr.contains("s3cret"), "{}", run.stderr);
    assert_nothing_published_or_blamed(&mut fx);
}

#[test]
fn amqps_with_verify_none_takes_any_certificate() {
    let mut fx = Fixture::new("amqps_verify_none");
    fx.insert("e", 2);
    let (_ca, terminator) = amqps_broker(ClientAuth::None);
    let url = format!(
        "amqps://guest:guest@127.0.0.1:{}/%2f?verify=verify_none",
        terminator.port()
    );
    let run = fx.run_with(&[("AMQP_URL", &url)], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(fx.arrivals().len(), 2);
}

#[test]
fn sigint_while_the_broker_does_not_answer_the_connect_exits_130_at_once() {
    let mut fx = Fixture::new("amqp_hung_sigint");
    fx.insert("e", 3);
    assert_a_signal_ends_a_hung_connect(
        &fx,
        "AMQP_URL",
        |port| format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        (
            "-INT",
            130,
            "stopped by SIGINT while connecting to RabbitMQ",
        ),
    );
    assert_nothing_published_or_blamed(&mut fx);
}

#[test]
fn a_broker_blocking_publishers_ends_a_drain_with_69_at_once_naming_its_reason() {
    let mut fx = Fixture::new("amqp_blocked");
    fx.insert("e", 500);
    let node = RabbitNode::start();
    // The fixture's exchange and queue on the private node: declaring is
    // allowed under an alarm, publishing blocks.
    let on_node = Amqp::connect_to(&node.url());
    on_node.declare(&fx.exchange, &fx.queue, "#");
    node.raise_memory_alarm();
    assert!(node.alarms().contains("memory"), "{}", node.alarms());
    // Batches in flight: the second needs a channel of its own, and a
    // blocked broker reads no channel.open either. The long timeouts show
    // that neither the confirms nor that channel are waited for.
    let url = node.url();
    let args = [
        "--drain",
        "--batch-size",
        "100",
        "--connect-timeout",
        "60s",
        "--confirm-timeout",
        "120s",
        "--json",
    ];
    let started = Instant::now();
    let run = fx.run_with(&[("AMQP_URL", &url)], &args);
    let took = started.elapsed();
    assert_eq!(run.code, 69, "{}", run.stderr);
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_one_clear_line(&run);
    assert!(run.stderr.contains("blocked publishers"), "{}", run.stderr);
    assert!(run.stderr.contains("low on memory"), "{}", run.stderr);
    assert_eq!(run.field("published"), 0);
    assert_nothing_published_or_blamed(&mut fx);
    // Nothing was lost: once the alarm clears, the next run delivers all.
    node.clear_memory_alarm();
    let run = fx.run_with(&[("AMQP_URL", &url)], &args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let delivered: HashSet<String> = on_node
        .take_all(&fx.queue)
        .into_iter()
        .map(|message| message.message_id)
        .collect();
    assert_eq!(delivered.len(), 500);
}

#[test]
#[ignore = "starts a 3-node RabbitMQ cluster (about a minute): \
            cargo test --test integration broker_connect:: -- --ignored"]
fn a_cluster_keeps_publishing_through_the_second_node_when_the_first_dies() {
    let mut fx = Fixture::new("amqp_cluster");
    let mut cluster = RabbitCluster::start(3);
    // The fixture's exchange and queue, on the cluster (its second node:
    // a classic queue lives where it is declared).
    let second = Amqp::connect_to(&cluster.nodes()[1].url());
    second.declare(&fx.exchange, &fx.queue, "#");
    fx.insert("before", 3);
    let run = fx.run_with(&[("AMQP_URL", &cluster.urls())], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    cluster.node_mut(0).kill();
    fx.insert("after", 3);
    let run = fx.run_with(&[("AMQP_URL", &cluster.urls())], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(fx.published_count(), 6);
    assert_eq!(second.take_all(&fx.queue).len(), 6);
}
