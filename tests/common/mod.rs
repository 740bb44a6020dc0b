//! The shared harness: each test gets its own schema (holding its outbox
//! table), its own exchange and queue, so tests run in parallel against the
//! real PostgreSQL and RabbitMQ and never see each other's data.
//!
//! TEST_DATABASE_URL and TEST_AMQP_URL point elsewhere than the defaults,
//! which are the local servers scripts/setup.sh starts.

pub mod broker_user;
pub mod certs;
pub mod collector;
pub mod fake_postgres;
pub mod private_postgres;
pub mod private_rabbit;
pub mod proxy;
pub mod scratch;
pub mod tls_terminator;

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use postgres::{Client, NoTls};
use tokio::runtime::Runtime;

pub const BIN: &str = env!("CARGO_BIN_EXE_outbox-poll");

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

/// Checks that each ordering key's messages, named `<key>-<n>`, arrived
/// with n counting up from 0 and carried their key as `x-ordering-key`;
/// returns how many were checked.
pub fn assert_in_order_per_key(messages: &[Message]) -> u32 {
    let mut next: HashMap<String, u32> = HashMap::new();
    for message in messages {
        let key = message.header_text("x-ordering-key").unwrap();
        let (name, n) = message.message_id.split_once('-').unwrap();
        assert_eq!(name, key);
        let expected = next.entry(key.clone()).or_insert(0);
        assert_eq!(
            n.parse::<u32>().unwrap(),
            *expected,
            "key {key} out of order"
        );
        *expected += 1;
    }
    next.values().sum()
}

pub fn connect_db() -> Client {
    Client::connect(&database_url(), NoTls).expect("connecting to the test database")
}

/// A row lock held by another session (Fixture::hold_row).
pub struct HeldRow(Client);

impl HeldRow {
    pub fn release(mut self) {
        self.0.batch_execute("COMMIT").unwrap();
    }
}

/// A message as a consumer sees it.
#[derive(Debug, Clone)]
pub struct Message {
    pub message_id: String,
    pub kind: Option<String>,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub correlation_id: Option<String>,
    pub priority: Option<u8>,
    pub expiration: Option<String>,
    pub delivery_mode: Option<u8>,
    pub timestamp: Option<u64>,
    pub app_id: Option<String>,
    pub headers: Option<FieldTable>,
    pub routing_key: String,
    pub exchange: String,
    pub body: Vec<u8>,
}

impl Message {
    /// The header `name`, if the message has it.
    pub fn header(&self, name: &str) -> Option<&AMQPValue> {
        self.headers.as_ref()?.inner().get(name)
    }

    /// The header `name` as text, if it is a string.
    pub fn header_text(&self, name: &str) -> Option<String> {
        match self.header(name)? {
            AMQPValue::LongString(text) => Some(text.to_string()),
            _ => None,
        }
    }
}

/// One outbox row, as the tests check it.
#[derive(Debug, Clone)]
pub struct Row {
    pub event_id: String,
    pub published: bool,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// Seconds from now until the row is due again (negative: due).
    pub due_in_s: f64,
}

/// Rows left unpublished by an outage or a refusal are exactly as they
/// were inserted: no attempt, no error, due. Neither is the events' fault.
pub fn assert_untouched(rows: &[Row]) {
    for row in rows.iter().filter(|row| !row.published) {
        assert_eq!(
            (row.attempts, row.last_error.as_deref()),
            (0, None),
            "{} was blamed",
            row.event_id
        );
        assert!(row.due_in_s <= 0.0, "{} was pushed back", row.event_id);
    }
}

/// The row of `event_id` among `rows`.
pub fn row<'r>(rows: &'r [Row], event_id: &str) -> &'r Row {
    rows.iter()
        .find(|row| row.event_id == event_id)
        .unwrap_or_else(|| panic!("no row {event_id}"))
}

/// The result of one run of the binary.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// The --json summary's fields.
    pub fn summary(&self) -> serde_json::Value {
        let line = self
            .stdout
            .lines()
            .last()
            .unwrap_or_else(|| panic!("no stdout; stderr: {}", self.stderr));
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    pub fn field(&self, name: &str) -> i64 {
        self.summary()[name]
            .as_i64()
            .unwrap_or_else(|| panic!("no {name} in {}", self.stdout))
    }
}

/// The shape every error must have: one line, no panic, no backtrace.
pub fn assert_one_clear_line(run: &Run) {
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line on stderr, got: {}",
        run.stderr
    );
    assert!(
        lines[0].starts_with("outbox-poll: error: "),
        "{}",
        run.stderr
    );
    for bad in [
        "panicked",
        "backtrace",
        "RUST_BACKTRACE",
        "Error {",
        "Some(",
    ] {
        assert!(!run.stderr.contains(bad), "{bad:?} in: {}", run.stderr);
    }
}

/// The optional columns of an inserted event (Fixture::insert_extra).
#[derive(Default, Clone, Copy)]
pub struct Extra<'a> {
    pub ordering_key: Option<&'a str>,
    pub routing_key: Option<&'a str>,
    /// JSON text.
    pub headers: Option<&'a str>,
}

/// A test's own outbox table, exchange and queue.
pub struct Fixture {
    pub schema: String,
    pub table: String,
    pub exchange: String,
    pub queue: String,
    /// The database the table is in (see `isolated`).
    pub database_url: String,
    /// The database this fixture created, dropped with it.
    own_database: Option<String>,
    /// Exchanges (each with its queue of the same name) beyond the
    /// fixture's own, deleted with it (see `another_exchange`).
    others: Vec<String>,
    pub db: Client,
    pub amqp: Amqp,
}

impl Fixture {
    /// A migrated table `<schema>.outbox`, and a topic exchange whose queue
    /// is bound to every routing key.
    pub fn new(test: &str) -> Fixture {
        let fixture = Fixture::bare(test);
        let run = fixture.run(&["migrate"]);
        assert_eq!(run.code, 0, "migrate failed: {}", run.stderr);
        fixture
    }

    /// Like `new`, but the table is the time-partitioned outbox of
    /// migrations/example_partitioned_outbox.sql, applied as it is in the
    /// fixture's schema (daily partitions from yesterday to 14 days ahead),
    /// then migrated.
    pub fn partitioned(test: &str) -> Fixture {
        const EXAMPLE: &str = include_str!("../../migrations/example_partitioned_outbox.sql");
        let mut fixture = Fixture::bare(test);
        let sql = format!(
            "SET search_path TO \"{}\"; {EXAMPLE}; RESET search_path",
            fixture.schema
        );
        fixture
            .db
            .batch_execute(&sql)
            .expect("applying the example");
        let run = fixture.run(&["migrate"]);
        assert_eq!(run.code, 0, "migrate failed: {}", run.stderr);
        fixture
    }

    /// Like `new`, in a database of its own, dropped with the fixture.
    /// The ordered modes wait for every transaction of their database that
    /// could still insert an event sorting first, so their tests cannot
    /// share one with other tests, which hold transactions open.
    pub fn isolated(test: &str) -> Fixture {
        let fixture = Fixture::bare_isolated(test);
        let run = fixture.run(&["migrate"]);
        assert_eq!(run.code, 0, "migrate failed: {}", run.stderr);
        fixture
    }

    /// The schema, exchange and queue, but no table.
    pub fn bare(test: &str) -> Fixture {
        Fixture::bare_in(test, false)
    }

    /// No table, in a database of its own (see `isolated`).
    pub fn bare_isolated(test: &str) -> Fixture {
        Fixture::bare_in(test, true)
    }

    fn bare_in(test: &str, isolated: bool) -> Fixture {
        let mut name: String = format!("t{}_{test}", std::process::id());
        name.truncate(60);
        let own_database = isolated.then(|| {
            // Each its own statement: neither may run in a transaction.
            let mut db = connect_db();
            db.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .unwrap();
            db.batch_execute(&format!("CREATE DATABASE \"{name}\" TEMPLATE template0"))
                .unwrap();
            name.clone()
        });
        let database_url = match &own_database {
            Some(database) => database_url_in(database),
            None => database_url(),
        };
        let mut db = Client::connect(&database_url, NoTls).expect("connecting to the database");
        db.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS \"{name}\" CASCADE; CREATE SCHEMA \"{name}\";"
        ))
        .unwrap();
        let amqp = Amqp::connect();
        amqp.declare(&name, &name, "#");
        Fixture {
            table: format!("{name}.outbox"),
            exchange: name.clone(),
            queue: name.clone(),
            schema: name,
            database_url,
            own_database,
            others: Vec::new(),
            db,
            amqp,
        }
    }

    /// Another session on the fixture's database.
    pub fn connect(&self) -> Client {
        Client::connect(&self.database_url, NoTls).expect("connecting to the database")
    }

    /// The binary, pointed at this fixture's table, exchange and servers,
    /// with nothing inherited from the environment that could change it.
    pub fn command(&self) -> Command {
        self.configured(Command::new(BIN))
    }

    /// A shell (`bash -c SCRIPT`) in the binary's environment, with
    /// `outbox-poll` first on its PATH: for the docs' runnable blocks.
    pub fn shell(&self, script: &str) -> Command {
        let bin = std::path::Path::new(BIN)
            .parent()
            .expect("the binary's directory");
        let path = match std::env::var_os("PATH") {
            Some(path) => format!("{}:{}", bin.display(), path.to_string_lossy()),
            None => bin.display().to_string(),
        };
        let mut command = self.configured(Command::new("bash"));
        command
            .env("PATH", path)
            .args(["-euo", "pipefail", "-c", script]);
        command
    }

    fn configured(&self, mut command: Command) -> Command {
        for (name, _) in std::env::vars() {
            if name.starts_with("PG")
                || name.starts_with("OUTBOX_")
                || name.starts_with("OTEL_")
                || [
                    "DATABASE_URL",
                    "DATABASE_URL_FILE",
                    "AMQP_URL",
                    "AMQP_URL_FILE",
                    "RUST_LOG",
                ]
                .contains(&name.as_str())
            {
                command.env_remove(name);
            }
        }
        command
            .env("RUST_BACKTRACE", "1")
            .env("DATABASE_URL", &self.database_url)
            .env("AMQP_URL", amqp_url())
            .env("OUTBOX_TABLE", &self.table)
            .env("OUTBOX_EXCHANGE", &self.exchange)
            .stdin(Stdio::null());
        command
    }

    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(
            self.command()
                .args(args)
                .output()
                .expect("running outbox-poll"),
        )
    }

    pub fn run_with(&self, env: &[(&str, &str)], args: &[&str]) -> Run {
        let mut command = self.command();
        command.envs(env.iter().copied());
        Run::from(command.args(args).output().expect("running outbox-poll"))
    }

    /// Inserts `count` events named `<prefix>-<n>` of type `order.created`.
    pub fn insert(&mut self, prefix: &str, count: i64) {
        self.db
            .execute(
                &format!(
                    "INSERT INTO {} (event_id, event_type, payload) \
                     SELECT $1 || '-' || g, 'order.created', jsonb_build_object('n', g, 'note', repeat('x', 150)) \
                     FROM generate_series(1, $2::bigint) g",
                    self.quoted_table()
                ),
                &[&prefix, &count],
            )
            .unwrap();
    }

    pub fn insert_event(&mut self, event_id: &str, event_type: &str, payload: &str) {
        self.db
            .execute(
                &format!(
                    "INSERT INTO {} (event_id, event_type, payload) VALUES ($1, $2, $3::text::jsonb)",
                    self.quoted_table()
                ),
                &[&event_id, &event_type, &payload],
            )
            .unwrap();
    }

    /// Inserts an event of type `order.created` with the optional columns
    /// `extra` gives (the others NULL).
    pub fn insert_extra(&mut self, event_id: &str, extra: Extra) {
        self.db
            .execute(
                &format!(
                    "INSERT INTO {} (event_id, event_type, payload, ordering_key, routing_key, headers) \
                     VALUES ($1, 'order.created', '{{}}', $2, $3, $4::text::jsonb)",
                    self.quoted_table()
                ),
                &[&event_id, &extra.ordering_key, &extra.routing_key, &extra.headers],
            )
            .unwrap();
    }

    pub fn quoted_table(&self) -> String {
        format!("\"{}\".outbox", self.schema)
    }

    pub fn execute(&mut self, sql: &str) {
        self.db
            .batch_execute(&sql.replace("{table}", &self.quoted_table()))
            .unwrap();
    }

    pub fn rows(&mut self) -> Vec<Row> {
        self.db
            .query(
                &format!(
                    "SELECT event_id, published_at IS NOT NULL, attempts, last_error, \
                     (extract(epoch FROM available_at) - extract(epoch FROM now()))::float8 \
                     FROM {} ORDER BY id",
                    self.quoted_table()
                ),
                &[],
            )
            .unwrap()
            .iter()
            .map(|row| Row {
                event_id: row.get(0),
                published: row.get(1),
                attempts: row.get(2),
                last_error: row.get(3),
                due_in_s: row.get(4),
            })
            .collect()
    }

    /// (event_id, published, attempts) for tables whose column types differ
    /// from those migrate creates, read as text.
    pub fn rows_untyped(&mut self) -> Vec<(String, bool, i64)> {
        let sql = format!(
            "SELECT event_id::text, published_at IS NOT NULL, attempts::bigint FROM {} ORDER BY id",
            self.quoted_table()
        );
        let rows = self.db.query(&sql, &[]).unwrap();
        rows.iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect()
    }

    /// Sends the statistics the fixture's own session has gathered (its
    /// inserts and updates) to the server's shared statistics now, rather
    /// than within the next second or so, so another session reads them.
    pub fn flush_stats(&mut self) {
        self.db
            .batch_execute("SELECT pg_stat_force_next_flush()")
            .unwrap();
    }

    /// The database's clock now.
    pub fn clock(&mut self) -> std::time::SystemTime {
        self.db
            .query_one("SELECT clock_timestamp()", &[])
            .unwrap()
            .get(0)
    }

    /// Binds the fixture's queue with `binding` instead of `#`: events of
    /// other types become unroutable.
    pub fn route_only(&self, binding: &str) {
        self.amqp.unbind(&self.queue, &self.exchange, "#");
        self.amqp.bind(&self.queue, &self.exchange, binding);
    }

    /// Another session holding `event_id`'s row lock, as a concurrent run
    /// does between its claim and its commit, until `release`.
    pub fn hold_row(&self, event_id: &str) -> HeldRow {
        let mut other = self.connect();
        let sql = format!(
            "BEGIN; SELECT 1 FROM {} WHERE event_id = '{event_id}' FOR UPDATE",
            self.quoted_table()
        );
        other.batch_execute(&sql).unwrap();
        HeldRow(other)
    }

    pub fn published_count(&mut self) -> usize {
        self.rows().iter().filter(|row| row.published).count()
    }

    /// Another topic exchange of this test, `<exchange>.<suffix>`, with a
    /// queue of the same name bound to every routing key; both deleted
    /// with the fixture. Returns the name.
    pub fn another_exchange(&mut self, suffix: &str) -> String {
        let name = format!("{}.{suffix}", self.exchange);
        self.amqp.declare(&name, &name, "#");
        self.others.push(name.clone());
        name
    }

    /// Every message now in the fixture's queue, taken off it.
    pub fn messages(&self) -> Vec<Message> {
        self.amqp.take_all(&self.queue)
    }

    /// How often each event id arrived.
    pub fn arrivals(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for message in self.messages() {
            *counts.entry(message.message_id).or_insert(0) += 1;
        }
        counts
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = match &self.own_database {
            Some(database) => connect_db().batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
            )),
            None => self.db.batch_execute(&format!(
                "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                self.schema
            )),
        };
        self.amqp.delete(&self.exchange, &self.queue);
        for other in &self.others {
            self.amqp.delete(other, other);
        }
    }
}

/// The tests' own AMQP client.
pub struct Amqp {
    runtime: Runtime,
    connection: Connection,
    channel: Channel,
}

impl Amqp {
    pub fn connect() -> Amqp {
        Amqp::connect_to(&amqp_url())
    }

    /// A client of another broker (a private node, say).
    pub fn connect_to(url: &str) -> Amqp {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (connection, channel) = runtime.block_on(async {
            let connection = Connection::connect(url, ConnectionProperties::default())
                .await
                .expect("connecting to RabbitMQ");
            let channel = connection.create_channel().await.unwrap();
            (connection, channel)
        });
        Amqp {
            runtime,
            connection,
            channel,
        }
    }

    /// A topic exchange and a durable queue bound to it with `binding`.
    pub fn declare(&self, exchange: &str, queue: &str, binding: &str) {
        self.declare_with(exchange, queue, binding, FieldTable::default());
    }

    /// Like `declare`, with queue arguments (x-max-length and the like).
    pub fn declare_with(&self, exchange: &str, queue: &str, binding: &str, arguments: FieldTable) {
        let options = ExchangeDeclareOptions::default();
        self.runtime
            .block_on(declare_topic(&self.channel, exchange, options))
            .unwrap();
        self.declare_queue(queue, arguments);
        self.bind(queue, exchange, binding);
    }

    /// An internal exchange: clients may not publish to it (the broker
    /// refuses with ACCESS_REFUSED), only bind it to others.
    pub fn declare_internal(&self, exchange: &str) {
        let options = ExchangeDeclareOptions {
            internal: true,
            ..Default::default()
        };
        self.runtime
            .block_on(declare_topic(&self.channel, exchange, options))
            .unwrap();
    }

    pub fn delete(&self, exchange: &str, queue: &str) {
        self.runtime.block_on(async {
            let _ = self
                .channel
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await;
            let _ = self
                .channel
                .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
                .await;
        });
    }

    /// A durable queue with arguments (x-max-length and the like), unbound.
    pub fn declare_queue(&self, queue: &str, arguments: FieldTable) {
        self.runtime.block_on(async {
            self.channel
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    arguments,
                )
                .await
                .unwrap();
        });
    }

    pub fn bind(&self, queue: &str, exchange: &str, binding: &str) {
        self.runtime.block_on(async {
            self.channel
                .queue_bind(
                    queue.into(),
                    exchange.into(),
                    binding.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        });
    }

    pub fn unbind(&self, queue: &str, exchange: &str, binding: &str) {
        self.runtime.block_on(async {
            self.channel
                .queue_unbind(
                    queue.into(),
                    exchange.into(),
                    binding.into(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        });
    }

    pub fn delete_queue(&self, queue: &str) {
        self.runtime.block_on(async {
            let _ = self
                .channel
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await;
        });
    }

    pub fn delete_exchange(&self, exchange: &str) {
        self.runtime.block_on(async {
            self.channel
                .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
                .await
                .unwrap();
        });
    }

    /// Checks with a passive declare, on a channel of its own: a missing
    /// exchange makes the broker close the channel it was asked on.
    pub fn exchange_exists(&self, exchange: &str) -> bool {
        self.runtime.block_on(async {
            let channel = self.connection.create_channel().await.unwrap();
            let options = ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            };
            declare_topic(&channel, exchange, options).await.is_ok()
        })
    }

    /// Takes every message off `queue` (acknowledging it).
    pub fn take_all(&self, queue: &str) -> Vec<Message> {
        self.runtime.block_on(async {
            let mut messages = Vec::new();
            while let Some(message) = self
                .channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get")
            {
                let delivery = message.delivery;
                let properties = &delivery.properties;
                let text = |value: &Option<lapin::types::ShortString>| {
                    value.as_ref().map(|v| v.to_string())
                };
                messages.push(Message {
                    message_id: text(properties.message_id()).unwrap_or_default(),
                    kind: text(properties.kind()),
                    content_type: text(properties.content_type()),
                    content_encoding: text(properties.content_encoding()),
                    correlation_id: text(properties.correlation_id()),
                    priority: *properties.priority(),
                    expiration: text(properties.expiration()),
                    delivery_mode: *properties.delivery_mode(),
                    timestamp: *properties.timestamp(),
                    app_id: text(properties.app_id()),
                    headers: properties.headers().clone(),
                    routing_key: delivery.routing_key.to_string(),
                    exchange: delivery.exchange.to_string(),
                    body: delivery.data,
                });
            }
            messages
        })
    }

    pub fn queue_length(&self, queue: &str) -> u32 {
        self.runtime.block_on(async {
            self.channel
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap()
                .message_count()
        })
    }
}

impl Drop for Amqp {
    fn drop(&mut self) {
        let _ = self
            .runtime
            .block_on(self.connection.close(200, "bye".into()));
    }
}

/// Declares a topic exchange with `options` on `channel`.
async fn declare_topic(
    channel: &Channel,
    exchange: &str,
    options: ExchangeDeclareOptions,
) -> lapin::Result<()> {
    let arguments = FieldTable::default();
    channel
        .exchange_declare(exchange.into(), ExchangeKind::Topic, options, arguments)
        .await
}

/// Sends a signal ("-TERM", "-INT") to a running outbox-poll.
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([name, &child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill {name} failed");
}

/// A run whose connect, to the server `variable` names, goes to a port
/// that accepts (the kernel does, for the backlog) and never answers: sent
/// `name` (`-INT`, `-TERM`) once it waits, it must exit with `code` within
/// 2 s, with its summary and one line saying it was `stopped`.
pub fn assert_a_signal_ends_a_hung_connect(
    fx: &Fixture,
    variable: &str,
    url: impl Fn(u16) -> String,
    (name, code, stopped): (&str, i32, &str),
) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let child = fx
        .command()
        .env(variable, url(silent.local_addr().unwrap().port()))
        .args(["--connect-timeout", "60s", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting outbox-poll");
    std::thread::sleep(Duration::from_millis(800));
    let signalled = std::time::Instant::now();
    signal(&child, name);
    let run = Run::from(child.wait_with_output().unwrap());
    let took = signalled.elapsed();
    assert_eq!(run.code, code, "{}", run.stderr);
    assert!(took < Duration::from_secs(2), "took {took:?} after {name}");
    assert_eq!(run.field("exit_code"), i64::from(code));
    assert_eq!(run.stderr.lines().count(), 1, "one line: {}", run.stderr);
    assert!(run.stderr.contains(stopped), "{}", run.stderr);
}

/// Waits until `condition` holds, checking every 20 ms, for at most `limit`.
pub fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}
