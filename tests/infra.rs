//! The test-owned servers of tests/common work as their documentation
//! says: the fake PostgreSQL is reached by psql and by the postgres crate
//! and records what they sent, the TLS terminator carries amqps to the
//! shared broker with the test CA's certificate, the private PostgreSQL
//! pair has a real standby, and a private RabbitMQ node under a memory
//! alarm blocks publishers. The 3-node cluster takes about a minute, so its
//! test is ignored by plain `cargo test`: run it with
//! `cargo test --test integration infra:: -- --ignored`.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common::certs::{ClientAuth, TestCa};
use crate::common::fake_postgres::{FakePostgres, Login, Outcome, Script, Tls};
use crate::common::private_postgres::PrivatePostgres;
use crate::common::private_rabbit::{RabbitCluster, RabbitNode};
use crate::common::tls_terminator::TlsTerminator;
use futures_util::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties, Event, ExchangeKind};
use postgres::NoTls;

/// psql against the fake server, never prompting for a password.
fn psql(port: u16, conninfo: &str, env: &[(&str, &str)]) -> Output {
    Command::new("psql")
        .arg("-w")
        .arg(format!(
            "host=127.0.0.1 port={port} user=relay dbname=shop {conninfo}"
        ))
        .args(["-c", "select 1"])
        .envs(env.iter().copied())
        .env_remove("PGSERVICE")
        .output()
        .expect("running psql")
}

/// Asserts that psql's error output says `text`.
fn assert_said(run: &Output, text: &str) {
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains(text), "{stderr}");
}

fn failing_password(sqlstate: &str) -> Script {
    Script {
        login: Login::CleartextPassword,
        outcome: Outcome::Fail {
            sqlstate: sqlstate.into(),
            message: "password authentication failed for user \"relay\"".into(),
        },
        ..Script::default()
    }
}

#[test]
fn the_fake_postgres_records_the_password_psql_sends_and_refuses_it_as_told() {
    let server = FakePostgres::start(failing_password("28P01"));
    let run = psql(server.port(), "", &[("PGPASSWORD", "s3cret")]);
    assert!(!run.status.success());
    assert_said(&run, "password authentication failed");
    let received = server.received();
    assert_eq!(received.passwords, ["s3cret"]);
    assert_eq!(received.startups[0]["user"], "relay");
    assert_eq!(received.startups[0]["database"], "shop");
}

#[test]
fn the_fake_postgres_refusing_tls_makes_sslmode_require_give_up() {
    let server = FakePostgres::start(Script::default());
    let run = psql(server.port(), "sslmode=require", &[]);
    assert_said(&run, "server does not support SSL, but SSL was required");
    let received = server.received();
    assert_eq!((received.ssl_requests, received.startups.len()), (1, 0));
}

#[test]
fn the_fake_postgres_lets_the_postgres_crate_in_and_records_its_startup() {
    let server = FakePostgres::start(Script::default());
    let url = format!(
        "postgresql://relay@127.0.0.1:{}/shop?application_name=probe",
        server.port()
    );
    let mut client = postgres::Client::connect(&url, NoTls).expect("connecting to the fake server");
    let error = client
        .simple_query("SHOW transaction_read_only")
        .unwrap_err();
    assert_eq!(error.code().map(|code| code.code()), Some("0A000"));
    let received = server.received();
    assert_eq!(received.startups[0]["application_name"], "probe");
    assert_eq!(received.queries, ["SHOW transaction_read_only"]);
}

/// psql with sslmode=verify-full against a fake server presenting the
/// certificate `ca` issued for `names`, connecting to "localhost".
fn verify_full_against(names: &[&str]) -> (Output, FakePostgres) {
    let ca = TestCa::new(names);
    let server = FakePostgres::start(Script {
        tls: Tls::Accept(ca.server_config(ClientAuth::None)),
        ..Script::default()
    });
    let conninfo = format!(
        "host=localhost sslmode=verify-full sslrootcert={}",
        ca.ca_cert().display()
    );
    (psql(server.port(), &conninfo, &[]), server)
}

#[test]
fn the_fake_postgres_speaks_tls_with_the_test_certificate() {
    let (run, server) = verify_full_against(&["localhost"]);
    // Logged in over TLS; the query itself gets the fake server's error.
    assert_said(&run, "the fake server runs no queries");
    assert_eq!(server.received().tls_startups, 1);
}

#[test]
fn the_test_ca_signs_for_the_names_asked_only() {
    let (run, server) = verify_full_against(&["broker.test"]);
    assert_said(&run, "does not match host name");
    assert_eq!(server.received().tls_startups, 0);
}

/// Connects with lapin through the terminator, TLS-verified against the
/// test CA, and checks the broker answers on a channel.
fn amqps(port: u16, tls: OwnedTLSConfig) -> lapin::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let url = format!("amqps://guest:guest@localhost:{port}/%2f");
        let connection = Connection::connect_with_config(
            &url,
            ConnectionProperties::default(),
            tls,
            lapin::runtime::default_runtime()?,
        )
        .await?;
        let channel = connection.create_channel().await?;
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                "amq.direct".into(),
                ExchangeKind::Direct,
                passive,
                FieldTable::default(),
            )
            .await?;
        connection.close(200, "bye".into()).await
    })
}

/// lapin's TLS settings: trust the test CA, and present its client
/// certificate if `with_client_cert`.
fn trusting(ca: &TestCa, with_client_cert: bool) -> OwnedTLSConfig {
    let read = |path| std::fs::read_to_string(path).unwrap();
    OwnedTLSConfig {
        identity: with_client_cert.then(|| OwnedIdentity::PKCS8 {
            pem: read(ca.client_cert()).into_bytes(),
            key: read(ca.client_key()).into_bytes(),
        }),
        cert_chain: Some(read(ca.ca_cert())),
    }
}

#[test]
fn the_tls_terminator_carries_amqps_to_the_shared_broker() {
    let ca = TestCa::new(&["localhost"]);
    let terminator = TlsTerminator::start(
        crate::common::amqp_addr(),
        ca.server_config(ClientAuth::None),
    );
    amqps(terminator.port(), trusting(&ca, false)).expect("amqps through the terminator");
    assert_eq!(
        (terminator.handshakes(), terminator.failed_handshakes()),
        (1, 0)
    );
}

#[test]
fn the_tls_terminator_can_require_a_client_certificate() {
    let ca = TestCa::new(&["localhost"]);
    let config = ca.server_config(ClientAuth::Required);
    let terminator = TlsTerminator::start(crate::common::amqp_addr(), config);
    assert!(amqps(terminator.port(), trusting(&ca, false)).is_err());
    amqps(terminator.port(), trusting(&ca, true)).expect("amqps with a client certificate");
    assert_eq!(
        (terminator.handshakes(), terminator.failed_handshakes()),
        (1, 1)
    );
}

#[test]
fn a_private_primary_and_standby_answer_as_such() {
    let started = Instant::now();
    let pair = PrivatePostgres::primary_and_standby();
    eprintln!("primary and standby up in {:?}", started.elapsed());
    let state = |port| {
        let mut client = postgres::Client::connect(&pair.url(port), NoTls).unwrap();
        let row = client
            .query_one(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')",
                &[],
            )
            .unwrap();
        (row.get::<_, bool>(0), row.get::<_, String>(1))
    };
    assert_eq!(state(pair.primary_port()), (false, "off".to_string()));
    assert_eq!(state(pair.standby_port()), (true, "on".to_string()));
    let stopped = Instant::now();
    drop(pair);
    eprintln!("both stopped and removed in {:?}", stopped.elapsed());
}

#[test]
fn the_shared_server_in_a_read_only_session_refuses_a_claim_like_a_standby() {
    let mut config: postgres::Config = crate::common::database_url().parse().unwrap();
    config.options("-c default_transaction_read_only=on");
    let mut client = config.connect(NoTls).unwrap();
    let row = client.query_one("SHOW transaction_read_only", &[]).unwrap();
    assert_eq!(row.get::<_, String>(0), "on");
    let error = client
        .simple_query("SELECT 1 FROM pg_class LIMIT 1 FOR UPDATE")
        .unwrap_err();
    assert_eq!(error.code().map(|code| code.code()), Some("25006"));
}

/// The events lapin reports on a connection to `url` after one publish
/// (RabbitMQ blocks a connection only once it publishes), within `limit`.
fn events_after_a_publish(
    url: &str,
    limit: Duration,
    until: impl Fn(&Event) -> bool,
) -> Vec<Event> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .unwrap();
        let mut events = connection.events_listener();
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let _confirm = channel
            .basic_publish(
                "".into(),
                "nowhere".into(),
                BasicPublishOptions::default(),
                b"x",
                BasicProperties::default(),
            )
            .await
            .unwrap();
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + limit;
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.next()).await {
            let done = until(&event);
            seen.push(event);
            if done {
                break;
            }
        }
        seen
    })
}

#[test]
fn a_private_rabbit_node_under_a_memory_alarm_blocks_publishers() {
    let started = Instant::now();
    let node = RabbitNode::start();
    eprintln!(
        "RabbitMQ node {} up in {:?}",
        node.name(),
        started.elapsed()
    );
    node.raise_memory_alarm();
    assert!(node.alarms().contains("memory"), "{}", node.alarms());
    let blocked = |event: &Event| matches!(event, Event::ConnectionBlocked(_));
    let events = events_after_a_publish(&node.url(), Duration::from_secs(15), blocked);
    let reason = events.iter().find_map(|event| match event {
        Event::ConnectionBlocked(reason) => Some(reason.clone()),
        _ => None,
    });
    assert!(
        reason
            .as_deref()
            .is_some_and(|reason| reason.contains("memory")),
        "{events:?}"
    );
    node.clear_memory_alarm();
    assert_eq!(node.alarms(), "[]");
    let stopping = Instant::now();
    drop(node);
    eprintln!("node killed and removed in {:?}", stopping.elapsed());
}

#[test]
#[ignore = "starts a 3-node RabbitMQ cluster (about a minute): cargo test --test infra -- --ignored"]
fn a_three_node_cluster_keeps_serving_when_its_first_node_dies() {
    let started = Instant::now();
    let mut cluster = RabbitCluster::start(3);
    eprintln!("3-node cluster up in {:?}", started.elapsed());
    let status = cluster.nodes()[1].ctl(&["cluster_status", "--formatter", "json"]);
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    for node in cluster.nodes() {
        assert!(status.contains(node.name()), "{status}");
    }
    let publish_to = |url: &str| events_after_a_publish(url, Duration::from_millis(200), |_| false);
    publish_to(&cluster.nodes()[0].url());
    cluster.node_mut(0).kill();
    assert!(std::net::TcpStream::connect(("127.0.0.1", cluster.nodes()[0].port())).is_err());
    publish_to(&cluster.nodes()[1].url());
    let stopping = Instant::now();
    drop(cluster);
    eprintln!("cluster killed and removed in {:?}", stopping.elapsed());
}
