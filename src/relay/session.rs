//! One PostgreSQL session with the relay's statements prepared on it. A
//! batch's transaction lives on one session from its claim to its commit.

use anyhow::Result;
use postgres::Client;

use crate::broker::publisher::Outcome;
use crate::config::{Database, Relay};
use crate::connect::database;
use crate::guard::stop::Stop;
use crate::sql::outbox::{Event, Outbox};

pub struct Session {
    pub client: Client,
    outbox: Outbox,
}

impl Session {
    /// Connects (a signal ends the wait at once) and prepares the relay's
    /// statements.
    pub fn open(database: &Database, relay: &Relay, stop: &Stop) -> Result<Self> {
        let mut client = database::connect(
            &database.conninfo,
            database.connect_timeout,
            relay.batch_idle_limit(),
            Some(stop),
        )?;
        let outbox = Outbox::prepare(
            &mut client,
            &database.table,
            database.max_attempts,
            relay.ordered,
        )?;
        Ok(Session { client, outbox })
    }

    pub fn begin(&mut self) -> Result<()> {
        self.control(
            "BEGIN",
            "starting a transaction",
            "try again once PostgreSQL is reachable",
        )
    }

    pub fn commit(&mut self) -> Result<()> {
        self.control(
            "COMMIT",
            "committing the batch",
            "nothing was marked; the events will be claimed and sent again by the next run",
        )
    }

    fn control(&mut self, sql: &str, what: &str, advice: &str) -> Result<()> {
        self.client
            .batch_execute(sql)
            .map_err(|error| database::classify(&error, what, advice))
    }

    /// Whatever the reason we give up on a transaction, its row locks must
    /// go now, not when the process exits (other runs are waiting for the
    /// rows), and the session may still be used (the metrics backlog). If
    /// even this fails the connection is gone, and the server has rolled
    /// back.
    pub fn roll_back(&mut self) {
        let _ = self.client.batch_execute("ROLLBACK");
    }

    /// In ordered mode, takes the table's lock for this transaction if it
    /// is free; plain runs need none and always go ahead.
    pub fn try_lock(&mut self) -> Result<bool> {
        self.outbox.try_lock(&mut self.client)
    }

    /// Claims up to `limit` due events from id `from` on (all if None).
    pub fn claim(&mut self, limit: i64, from: Option<i64>) -> Result<Vec<Event>> {
        self.outbox.claim(&mut self.client, limit, from)
    }

    /// The marks for what the broker said, in the batch's transaction.
    pub fn mark(&mut self, outcome: &Outcome) -> Result<()> {
        let outbox = &self.outbox;
        outbox.mark_published(&mut self.client, &outcome.confirmed)?;
        outbox.mark_failed(&mut self.client, &outcome.failed)
    }
}
