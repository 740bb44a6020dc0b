//! The Fixture: a test's own schema (holding its outbox table), exchange
//! and queue, dropped with it. What a test does with them is beside it:
//! the rows in database.rs, the messages in broker.rs, runs of the binary
//! in run.rs.

use postgres::{Client, NoTls};

use super::broker::Amqp;
use super::servers::{connect_db, database_url, database_url_in};

/// A test's own outbox table, exchange and queue.
pub struct Fixture {
    pub schema: String,
    pub table: String,
    pub exchange: String,
    pub queue: String,
    /// The database the table is in (see `isolated`).
    pub database_url: String,
    /// The database this fixture created, dropped with it.
    pub(super) own_database: Option<String>,
    /// Exchanges (each with its queue of the same name) beyond the
    /// fixture's own, deleted with it (see `another_exchange`).
    pub(super) others: Vec<String>,
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
