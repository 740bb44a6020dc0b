//! The shared harness: each test gets its own schema (holding its outbox
//! table), its own exchange and queue, so tests run in parallel against the
//! real PostgreSQL and RabbitMQ and never see each other's data.
//!
//! TEST_DATABASE_URL and TEST_AMQP_URL point elsewhere than the defaults,
//! which are the local servers scripts/setup.sh starts.
//!
//! By concern, each re-exported here for the areas (`crate::common::...`):
//! - fixture.rs: the `Fixture`, its schema, exchange and queue;
//! - run.rs: running the binary (`BIN`, `Fixture::run`, `command`,
//!   `shell`) and its `Run`; signals to a running one;
//! - database.rs: a fixture's rows (`insert`, `rows`, `Row`, `hold_row`);
//! - broker.rs: the tests' AMQP client (`Amqp`), the `Message`s a
//!   fixture's queue received;
//! - servers.rs: the servers' URLs and addresses, and URLs through a proxy;
//! - checks.rs: `assert_one_clear_line`, `assert_in_order_per_key`,
//!   `wait_until`;
//! - and the servers and tools a test starts: proxy.rs, fake_postgres.rs,
//!   private_postgres.rs, private_rabbit.rs, tls_terminator.rs, certs.rs,
//!   collector.rs (OTLP), broker_user.rs, scratch.rs.

pub mod broker_user;
pub mod certs;
pub mod collector;
pub mod fake_postgres;
pub mod private_postgres;
pub mod private_rabbit;
pub mod proxy;
pub mod scratch;
pub mod tls_terminator;

mod broker;
mod checks;
mod database;
mod fixture;
mod run;
mod servers;

pub use broker::{Amqp, Message};
pub use checks::{assert_in_order_per_key, assert_one_clear_line, wait_until};
pub use database::{Extra, Row, assert_untouched, row};
pub use fixture::Fixture;
pub use run::{BIN, Run, assert_a_signal_ends_a_hung_connect, signal};
pub use servers::{
    amqp_addr, amqp_url, amqp_url_via, connect_db, database_addr, database_url, database_url_in,
    database_url_via, env_via,
};
