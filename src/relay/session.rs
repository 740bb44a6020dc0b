//! One PostgreSQL session with the relay's statements prepared on it. A
//! batch's transaction lives on one session from its claim to its commit.
//!
//! The session plans its statements generically: `plan_cache_mode =
//! force_generic_plan`, sent in the startup packet like the timeouts
//! (`connect::database::connect`), so it costs no round trip. A prepared
//! statement's plan is then made once, without the parameters' values, and
//! reused by every batch. By default PostgreSQL plans each of the first
//! five executions for its values, and goes on doing so while that looks
//! cheaper; such a plan estimates the claim's `id >= $3` from the value,
//! and a value beyond the column's histogram makes the planner read the
//! primary key's actual end: right after a prune of millions of rows,
//! before a vacuum, that walks millions of dead index entries, 32 to 50 ms
//! of planning per claim (measured on 5,000,000 rows; see the README's
//! Scaling). A generic plan has no value to probe with. On a partitioned
//! table the plan, made once, also spares each claim the planning of every
//! partition.
//!
//! A plan made once is made for the table as it was then, though, and
//! kept until something invalidates it (an ANALYZE or a VACUUM of the
//! table, DDL). The marks are prepared at the first claim that returns
//! events: for a --follow started on an empty outbox, a table of a few
//! rows, where a sequential scan is the cheapest way to find three ids.
//! That plan stayed while the follow filled the table with marked rows: on
//! a server without autovacuum, every mark of a 1,000 events/s follow read
//! the whole table, 0.7 ms at the start and 3.8 ms (the median) 30 s
//! later, and the latency of every event grew with it (bench/runs,
//! 2026-12-07). So the session also sets `enable_seqscan = off`: every
//! statement it prepares reaches its rows through an index (the claims the
//! pending index or the ordered modes' indexes, the marks the primary
//! key), whatever the table's size when it was planned. The one statement
//! that must read a whole catalog, the lookup of `--table`'s patterns,
//! turns the setting back on for itself (plan::read_catalog).
//!
//! The setting only weighs the planner's costs: a statement with no index
//! to use still scans, with 10^10 added to its cost, and up to PostgreSQL
//! 17 a cost that high makes every execution compile the plan with JIT
//! (inlined and optimized: tens of milliseconds). The relay's statements
//! each touch a batch of rows at most, where JIT never pays, so the
//! session also sets `jit = off`.

use anyhow::Result;
use postgres::Client;

use crate::broker::publisher::Outcome;
use crate::broker::round::NACKED;
use crate::config::{Database, Relay};
use crate::connect::conninfo::ConnInfo;
use crate::connect::database;
use crate::connect::pg_error;
use crate::guard::stop::Stop;
use crate::sql::outbox::{Event, Outbox, Start};

/// Why a batch's COMMIT did not go through.
pub(crate) enum Uncommitted {
    /// The server refused it, or it never reached the server: the
    /// transaction is rolled back, nothing was marked.
    RolledBack(anyhow::Error),
    /// The connection dropped while the COMMIT was on its way: its marks
    /// may have been committed or not.
    Unknown(anyhow::Error),
}

pub(crate) struct Session {
    pub(crate) client: Client,
    outbox: Outbox,
    /// A run over many outboxes: the statements prepared for the other
    /// tables of this database that the session served, kept for their
    /// next turn.
    others: Vec<Outbox>,
}

impl Session {
    /// Connects (a signal ends the wait at once) and prepares the relay's
    /// statements.
    pub(crate) fn open(database: &Database, relay: &Relay, stop: &Stop) -> Result<Self> {
        let client = connect(&database.conninfo, database.connect_timeout, relay, stop)?;
        Session::with_client(client, database, relay)
    }

    /// Prepares the relay's statements for `database`'s table on a session
    /// already open (see `connect`).
    pub(crate) fn with_client(
        mut client: Client,
        database: &Database,
        relay: &Relay,
    ) -> Result<Self> {
        let outbox = prepare(&mut client, database, relay)?;
        Ok(Session {
            client,
            outbox,
            others: Vec::new(),
        })
    }

    /// Makes `database`'s table (in this session's database) the one the
    /// next batch claims from, preparing its statements the first time.
    /// Only between batches: the marks apply to the current table's claim.
    pub(crate) fn serve(&mut self, database: &Database, relay: &Relay) -> Result<()> {
        if *self.outbox.table() == database.table {
            return Ok(());
        }
        let outbox = match self
            .others
            .iter()
            .position(|outbox| *outbox.table() == database.table)
        {
            Some(at) => self.others.swap_remove(at),
            None => prepare(&mut self.client, database, relay)?,
        };
        let previous = std::mem::replace(&mut self.outbox, outbox);
        self.others.push(previous);
        Ok(())
    }

    pub(crate) fn begin(&mut self) -> Result<()> {
        self.control(
            "BEGIN",
            "starting a transaction",
            "try again once PostgreSQL is reachable",
        )
    }

    pub(crate) fn commit(&mut self) -> Result<()> {
        self.control(
            "COMMIT",
            "committing the batch",
            "nothing was marked; the events will be claimed and sent again by the next run",
        )
    }

    /// Commits a batch whose marks cover `marked` events. The server either
    /// answers (committed, or refused and rolled back), or the connection
    /// drops before its answer arrives: then the COMMIT may have been
    /// carried out or not, and nobody can tell. With nothing marked, either
    /// way leaves the table as it was.
    pub(crate) fn commit_marks(&mut self, marked: usize) -> Result<(), Uncommitted> {
        let Err(error) = self.client.batch_execute("COMMIT") else {
            return Ok(());
        };
        let what = "committing the batch";
        if marked > 0 && error.as_db_error().is_none() {
            Err(Uncommitted::Unknown(pg_error::classify(
                &error,
                what,
                "the commit's outcome is unknown: the batch's events may be marked or not; \
                 if not, the next run sends them again",
            )))
        } else {
            Err(Uncommitted::RolledBack(pg_error::classify(
                &error,
                what,
                "nothing was marked; the events will be claimed and sent again by the next run",
            )))
        }
    }

    fn control(&mut self, sql: &str, what: &str, advice: &str) -> Result<()> {
        self.client
            .batch_execute(sql)
            .map_err(|error| pg_error::classify(&error, what, advice))
    }

    /// Whatever the reason we give up on a transaction, its row locks must
    /// go now, not when the process exits (other runs are waiting for the
    /// rows), and the session may still be used (the metrics backlog). If
    /// even this fails the connection is gone, and the server has rolled
    /// back.
    pub(crate) fn roll_back(&mut self) {
        let _ = self.client.batch_execute("ROLLBACK");
    }

    /// Whether this transaction may claim (see `Outbox::before_claim`): in
    /// --ordered mode, whether the table's lock was free.
    pub(crate) fn before_claim(&mut self) -> Result<bool> {
        self.outbox.before_claim(&mut self.client)
    }

    /// Whether any event is due (see Outbox::any_due), outside any
    /// transaction.
    pub(crate) fn any_due(&mut self) -> Result<bool> {
        self.outbox.any_due(&mut self.client)
    }

    /// Claims up to `limit` due events, starting where `start` says,
    /// holding about `bytes` of payloads at most (see Outbox::claim). The
    /// marks that follow apply to this claim's batch.
    pub(crate) fn claim(&mut self, limit: i64, start: &Start, bytes: i64) -> Result<Vec<Event>> {
        self.outbox.claim(&mut self.client, limit, start, bytes)
    }

    /// The marks for what the broker said, and for the events that had
    /// expired (never sent), in the batch's transaction: one statement per
    /// outcome.
    pub(crate) fn mark(&mut self, outcome: &Outcome, expired: &[i64]) -> Result<()> {
        let outbox = &self.outbox;
        outbox.mark_published(&mut self.client, &outcome.confirmed)?;
        outbox.mark_failed(&mut self.client, &outcome.failed)?;
        outbox.mark_declined(&mut self.client, &outcome.declined, NACKED)?;
        outbox.mark_expired(&mut self.client, expired)
    }
}

/// A relay session, its statements not prepared yet: plans generic and on
/// indexes, each
/// transaction bounded for a batch (a signal ends the connect at once).
pub(crate) fn connect(
    info: &ConnInfo,
    connect_timeout: std::time::Duration,
    relay: &Relay,
    stop: &Stop,
) -> Result<Client> {
    database::connect(
        &relay_plans(info),
        connect_timeout,
        relay.batch_idle_limit(),
        Some(stop),
    )
}

/// A relay session's start-up alone, as `connect` opens one (TLS as the
/// URL's sslmode asks, the relay's settings in the startup packet) but
/// with no signal to end the wait: the benchmark times the start-up of the
/// sessions a run over many databases opens with it (bench/many.rs).
pub fn start_up(
    info: &ConnInfo,
    connect_timeout: std::time::Duration,
    idle_limit: std::time::Duration,
) -> Result<Client> {
    database::connect(&relay_plans(info), connect_timeout, idle_limit, None)
}

fn prepare(client: &mut Client, database: &Database, relay: &Relay) -> Result<Outbox> {
    Outbox::prepare(
        client,
        &database.table,
        database.max_attempts,
        relay.order(),
        relay.on_publish,
    )
}

/// The startup options that make a session plan as the relay's do (see
/// above): generically, and through indexes. (The benchmark's own
/// sessions send them too, to measure the relay's SQL as the relay runs
/// it.)
pub const RELAY_PLANS: &str =
    "-c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c jit=off";

/// The session's settings with the relay's plans added, after any options
/// the database URL gives.
pub(crate) fn relay_plans(info: &ConnInfo) -> ConnInfo {
    let mut info = info.clone();
    info.options = Some(match info.options.take() {
        Some(theirs) => format!("{theirs} {RELAY_PLANS}"),
        None => RELAY_PLANS.to_string(),
    });
    info
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::path::Path;

    use super::*;
    use crate::connect::conninfo::{Account, FileStat, Files};

    /// No file to read: the settings come from the URL alone.
    struct NoFiles;

    impl Files for NoFiles {
        fn read(&self, _: &Path) -> io::Result<Option<String>> {
            Ok(None)
        }

        fn stat(&self, _: &Path) -> io::Result<Option<FileStat>> {
            Ok(None)
        }
    }

    fn info(url: &str) -> ConnInfo {
        let account = Account {
            name: "u".into(),
            home: None,
        };
        crate::connect::conninfo::resolve(Some(url), &|_| None, &NoFiles, Some(&account)).unwrap()
    }

    #[test]
    fn the_relays_plans_follow_the_urls_own_options() {
        let plain = info("host=db");
        assert_eq!(
            relay_plans(&plain).options.as_deref(),
            Some("-c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c jit=off")
        );
        let theirs = info("host=db options='-c work_mem=64MB'");
        assert_eq!(
            relay_plans(&theirs).options.as_deref(),
            Some(
                "-c work_mem=64MB -c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c jit=off"
            )
        );
    }
}
