//! The test servers: PostgreSQL and RabbitMQ at TEST_DATABASE_URL and
//! TEST_AMQP_URL, or the local servers scripts/setup.sh starts; their
//! addresses, for a proxy in front of them, and the URLs through one.

use std::net::{SocketAddr, ToSocketAddrs};

use postgres::{Client, NoTls};

use super::proxy;

pub fn database_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".into())
}

pub fn amqp_url() -> String {
    std::env::var("TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The address of the AMQP server, for a proxy in front of it.
pub fn amqp_addr() -> SocketAddr {
    let uri: lapin::uri::AMQPUri = amqp_url().parse().unwrap();
    (uri.authority.host.as_str(), uri.authority.port)
        .to_socket_addrs()
        .unwrap()
        .next()
        .unwrap()
}

/// The address of the PostgreSQL server, for a proxy in front of it.
pub fn database_addr() -> SocketAddr {
    let config: postgres::Config = database_url().parse().unwrap();
    let host = match &config.get_hosts()[0] {
        postgres::config::Host::Tcp(host) => host.clone(),
        other => panic!("tests need a TCP database host, not {other:?}"),
    };
    (host.as_str(), config.get_ports()[0])
        .to_socket_addrs()
        .unwrap()
        .next()
        .unwrap()
}

/// The database URL with its host and port replaced (to go through a proxy).
pub fn database_url_via(port: u16) -> String {
    let config: postgres::Config = database_url().parse().unwrap();
    let user = config.get_user().unwrap_or("postgres");
    let dbname = config.get_dbname().unwrap_or(user);
    format!("postgresql://{user}@127.0.0.1:{port}/{dbname}")
}

/// The database URL naming another database on the same server.
pub fn database_url_in(dbname: &str) -> String {
    let config: postgres::Config = database_url().parse().unwrap();
    let user = config.get_user().unwrap_or("postgres");
    let (host, port) = match &config.get_hosts()[0] {
        postgres::config::Host::Tcp(host) => (host.clone(), config.get_ports()[0]),
        other => panic!("tests need a TCP database host, not {other:?}"),
    };
    format!("postgresql://{user}@{host}:{port}/{dbname}")
}

pub fn amqp_url_via(port: u16) -> String {
    let uri: lapin::uri::AMQPUri = amqp_url().parse().unwrap();
    let user = &uri.authority.userinfo;
    format!(
        "amqp://{}:{}@127.0.0.1:{port}/%2f",
        user.username, user.password
    )
}

/// The binary's URLs pointed at a proxy in front of the broker, the
/// database, or both.
pub fn env_via(
    broker: Option<&proxy::Proxy>,
    db: Option<&proxy::Proxy>,
) -> Vec<(&'static str, String)> {
    let mut env = Vec::new();
    if let Some(broker) = broker {
        env.push(("AMQP_URL", amqp_url_via(broker.port())));
    }
    if let Some(db) = db {
        env.push(("DATABASE_URL", database_url_via(db.port())));
    }
    env
}

pub fn connect_db() -> Client {
    Client::connect(&database_url(), NoTls).expect("connecting to the test database")
}
