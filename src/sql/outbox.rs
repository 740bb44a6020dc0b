//! The claim and mark queries: the only SQL a poll run sends about events.
//!
//! Each runs in the batch's transaction, which the caller has opened on
//! the client. Statements are prepared once per connection and reused by
//! every batch of a drain, each when a batch first needs it: an empty run
//! prepares its claim and nothing else. The marks are prepared as soon as a
//! claim returns events, before any is published, and the table's shape is
//! checked at the start: a missing column must stop the run before the
//! broker has the messages, not after.
//!
//! The relay's sessions plan these statements once, generically (see
//! `relay::session`): a plan for the values of one execution may probe
//! the primary key's ends, and after a large prune that probe walks
//! millions of dead index entries on every claim.

use std::time::Duration;

use anyhow::{Result, anyhow};
use clap::ValueEnum;
use postgres::error::SqlState;
use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Client, Statement};

use crate::connect::pg_error::describe;
use crate::exit;
use crate::sql::columns::{self, Columns, Payload};
use crate::sql::names;
use crate::sql::table::TableName;
use crate::sql::table::classify_on_table;

/// Backoff after a failed attempt: `BACKOFF_BASE * 2^attempts`, capped at
/// BACKOFF_CAP, then scaled by a random factor in [0.5, 1) ("equal jitter")
/// so that events that failed together do not all come back together.
/// The waits are 1-2 s, 2-4 s, 4-8 s, ...: with the default --max-attempts
/// of 10 an event is dead after 8.5 to 17 minutes of retries in all.
pub(crate) const BACKOFF_BASE: Duration = Duration::from_secs(2);
pub(crate) const BACKOFF_CAP: Duration = Duration::from_secs(3600);

/// Backoff after a nack, times the same jitter: 15 to 30 s. A nack counts
/// no attempt, so the attempt-keyed backoff would stay at its first step,
/// 1-2 s, for ever: a drain would claim and send the same events every
/// second or two for as long as the broker declines them. The broker
/// declines for reasons of its own (a queue full, a quorum queue without a
/// majority) that pass in minutes, not seconds, and an event gets no nearer
/// to going out by asking again sooner. So a nacked event waits this fixed
/// time, whatever its attempts: during a 10 or 20 minute incident each
/// pending event is offered a few times a minute, never dies of it, and
/// goes out within half a minute of the broker taking messages again.
pub(crate) const NACK_BACKOFF: Duration = Duration::from_secs(30);

/// The "equal jitter" factor, uniform in [0.5, 1).
const JITTER_SQL: &str = "(0.5 + random() / 2)";

/// --on-publish: what a batch does with the events the broker confirmed.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnPublish {
    /// `published_at = now()`: the row stays until `prune` deletes it.
    Mark,
    /// The row is deleted in the batch's transaction: the table holds only
    /// what is still to send (and the dead and backing-off events).
    Delete,
}

/// How a run claims its events (see the README's "Ordering").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Any order: whatever is due and not held by another run.
    Plain,
    /// --ordered: the whole table in (producer_xid, id) order.
    Strict,
    /// --ordered-by-key: each ordering_key's events in (producer_xid, id)
    /// order, one event of a key at a time.
    ByKey,
}

/// Where a claim starts. Only a hint of where the next claimable events
/// are: every claim still considers the whole table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The head of the table.
    Head,
    /// A plain claim: at this id (the drain's last claim ended before it).
    Id(i64),
    /// An --ordered-by-key claim: at the keys after this one, then from
    /// the first key.
    AfterKey(String),
}

/// One claimed row.
#[derive(Debug, Clone, Default)]
pub struct Event {
    pub id: i64,
    pub(crate) event_id: String,
    pub event_type: String,
    /// The message body: the payload's bytes (jsonb as PostgreSQL prints
    /// it, json and text as stored, bytea raw), sent unchanged.
    pub payload: Vec<u8>,
    /// The payload column's type, which gives the default content_type.
    pub(crate) payload_type: Payload,
    /// created_at in whole seconds since the epoch, for the AMQP timestamp:
    /// plus or minus infinity for an infinite created_at, None for a NULL.
    pub(crate) created_at: Option<f64>,
    pub(crate) attempts: i64,
    /// Why this row cannot become a message (a NULL or unreadable column,
    /// which a table without the NOT NULL constraints of docs/src/table.md can hold):
    /// the event fails alone, the rest of the batch goes on.
    pub(crate) unreadable: Option<String>,
    /// The optional columns: None where the row holds NULL or the table
    /// has no such column. `headers` is the jsonb as PostgreSQL prints it.
    pub(crate) headers: Option<String>,
    pub(crate) routing_key: Option<String>,
    pub(crate) ordering_key: Option<String>,
    pub(crate) exchange: Option<String>,
    pub(crate) content_type: Option<String>,
    pub(crate) content_encoding: Option<String>,
    pub(crate) correlation_id: Option<String>,
    /// As stored: a value outside AMQP's 0 to 255 fails the event.
    pub(crate) priority: Option<i32>,
    /// Seconds from the claim to expires_at (infinite for `infinity`);
    /// zero or less: expired, never to be published.
    pub(crate) expires_in: Option<f64>,
    /// The relay's publish span as a W3C traceparent, sent as the
    /// `traceparent` header: set only when traces are exported and the
    /// headers column has no traceparent of the producer's.
    pub(crate) traceparent: Option<String>,
}

impl Event {
    /// Past its expires_at: marked expired, never published.
    pub(crate) fn expired(&self) -> bool {
        self.expires_in.is_some_and(|seconds| seconds <= 0.0)
    }
}

/// The prepared statements for one table on one connection. The marks
/// apply to the batch this Outbox claimed last: on a table partitioned by
/// created_at they look only in the partitions its events were created in.
pub struct Outbox {
    table: TableName,
    max_attempts: i32,
    order: Order,
    /// The optional columns the claim selects, after the fixed six.
    columns: Columns,
    /// The payload column's type: how the claim reads it.
    payload: Payload,
    /// The claim of the run's order; a plain claim from the head of the
    /// table has no range on id (see claim_sql).
    claim: Statement,
    /// A plain claim from an id on, a drain's while a backlog lasts,
    /// prepared at its first use: the ordered modes always consider the
    /// whole table, and a single run claims from the head.
    claim_from: Option<Statement>,
    /// Whether any event is due, for a follow that polls (see any_due),
    /// prepared at its first use: no other run needs it.
    due: Option<Statement>,
    on_publish: OnPublish,
    /// Prepared by the first claim that returns events.
    marks: Option<Marks>,
    /// Only in the ordered modes (see `before_claim`): plain runs need none.
    before_claim: Option<Statement>,
    /// The table is partitioned by created_at: the marks carry the range
    /// of the claimed events' created_at, so PostgreSQL leaves out every
    /// other partition when it executes them (see Created).
    by_created_at: bool,
    /// Where the last claim's events were created.
    claimed: Created,
}

/// The statements that record what the broker said.
struct Marks {
    /// `published_at = now()`, or with --on-publish delete the DELETE.
    published: Statement,
    failed: Statement,
    declined: Statement,
    /// Only on a table with expires_at.
    expired: Option<Statement>,
}

/// The created_at range of a claimed batch, in seconds since the epoch:
/// from the first event's second to just past the last one's. Without it
/// a mark by id on a partitioned table probes the primary key of every
/// partition for every id (60 daily partitions: 6,000 probes for a batch
/// of 100); with it, PostgreSQL prunes at execution to the one or two
/// partitions the batch came from. The claim reads created_at as a float8,
/// exact to the microsecond only near 1970 (a far-future timestamp's
/// float may round past it), so the range runs from a second before the
/// first event's second to two past the last one's: it holds every event
/// of the batch whatever the rounding, and still prunes to their day's
/// partition. The upper bound is inclusive so that an event created at
/// `infinity` (whose bound is infinite) is in it too.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Created {
    from: f64,
    to: f64,
}

impl Created {
    /// Every partition: before a claim, or for an empty one.
    const ALL: Created = Created {
        from: f64::NEG_INFINITY,
        to: f64::INFINITY,
    };

    fn of(events: &[Event]) -> Created {
        let seconds = events.iter().filter_map(|event| event.created_at);
        let first = seconds.clone().reduce(f64::min);
        let last = seconds.reduce(f64::max);
        match (first, last) {
            (Some(first), Some(last)) => Created {
                from: first.floor() - 1.0,
                to: last.floor() + 2.0,
            },
            _ => Created::ALL,
        }
    }
}

impl Outbox {
    /// Looks up which optional columns the table has, then prepares the
    /// statements for them: the claim selects only the columns that exist,
    /// so the per-batch SQL of a table without them is what it always was.
    pub fn prepare(
        client: &mut Client,
        table: &TableName,
        max_attempts: i32,
        order: Order,
        on_publish: OnPublish,
    ) -> Result<Self> {
        let shape = columns::of_table(client, table, PREPARING)?;
        if !shape.last_error {
            // Only the marks write it, so no claim would notice it is
            // missing, and an empty run would succeed on a table that a
            // run with events must refuse.
            return Err(exit::config(anyhow!(
                "{PREPARING} on table {table}: column \"last_error\" does not exist; run \
                 `outbox-poll migrate --table {table}` to create or upgrade the table"
            )));
        }
        let payload = shape.payload(PREPARING, table)?;
        let quoted = table.quoted();
        let selected = selected(&shape.columns, payload);
        let pending = pending(&shape.columns);
        let claim = match order {
            Order::Plain => claim_sql(&quoted, &selected, false),
            Order::Strict => ordered_claim_sql(&quoted, &selected, pending),
            Order::ByKey => by_key_claim_sql(&quoted, &selected, pending),
        };
        let before_claim = match order {
            Order::Strict => Some(prepare(client, LOCK_AND_SEE_SESSIONS_SQL, table)?),
            Order::ByKey => Some(prepare(client, SEE_SESSIONS_SQL, table)?),
            Order::Plain => None,
        };
        let mut outbox = Outbox {
            claim: prepare(client, &claim, table)?,
            claim_from: None,
            due: None,
            on_publish,
            marks: None,
            before_claim,
            table: table.clone(),
            max_attempts,
            order,
            columns: shape.columns,
            payload,
            by_created_at: shape.by_created_at,
            claimed: Created::ALL,
        };
        if on_publish == OnPublish::Delete {
            outbox.prepare_marks(client)?;
            outbox.check_delete(client)?;
        }
        Ok(outbox)
    }

    /// The table these statements are about.
    pub(crate) fn table(&self) -> &TableName {
        &self.table
    }

    /// Prepares the marks now rather than at the first claim that returns
    /// events: `check` wants every statement of the run prepared, so that
    /// a missing column shows before an event is due.
    pub(crate) fn prepare_marks(&mut self, client: &mut Client) -> Result<()> {
        if self.marks.is_some() {
            return Ok(());
        }
        let (quoted, partitioned) = (self.table.quoted(), self.by_created_at);
        let published = match self.on_publish {
            OnPublish::Mark => mark_published_sql(&quoted, partitioned),
            OnPublish::Delete => delete_published_sql(&quoted, partitioned),
        };
        self.marks = Some(Marks {
            published: prepare(client, &published, &self.table)?,
            failed: prepare(client, &mark_failed_sql(&quoted, partitioned), &self.table)?,
            declined: prepare(
                client,
                &mark_declined_sql(&quoted, partitioned),
                &self.table,
            )?,
            expired: match self.columns.expires_at {
                true => Some(prepare(
                    client,
                    &mark_expired_sql(&quoted, partitioned),
                    &self.table,
                )?),
                false => None,
            },
        });
        Ok(())
    }

    /// The marks, which every claim that returned events has prepared.
    fn marks(&self) -> Result<&Marks> {
        self.marks
            .as_ref()
            .ok_or_else(|| anyhow!("a batch was marked before its claim prepared the marks"))
    }

    /// PostgreSQL checks privileges when a statement runs, not when it is
    /// prepared: run the delete once, on no rows, so that a role without
    /// DELETE stops here, before anything is claimed or published, rather
    /// than at the first batch's marks, after the broker has the messages.
    fn check_delete(&self, client: &mut Client) -> Result<()> {
        let published = &self.marks()?.published;
        let result = match self.by_created_at {
            true => client.execute(published, &[&Vec::<i64>::new(), &0.0, &0.0]),
            false => client.execute(published, &[&Vec::<i64>::new()]),
        };
        result.map(drop).map_err(|error| {
            if error.code() != Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
                return classify_on_table(&error, PREPARING, &self.table);
            }
            exit::config(anyhow!(
                "--on-publish delete needs the DELETE privilege on table {} ({}): \
                 GRANT DELETE ON {} TO this role, or use --on-publish mark",
                self.table,
                describe(&error),
                self.table.quoted()
            ))
        })
    }

    /// Claims up to `limit` due events, locked until the transaction ends,
    /// starting where `start` says (a start the run's order has no use for
    /// is the head), and keeps them while the payload bytes kept so far are
    /// under `bytes`: the first always, however large.
    ///
    /// The rows are read as they arrive, and those past the budget are read
    /// and dropped one at a time: so the batch in memory is the budget (and
    /// one event), whatever --batch-size allows. Those rows stay locked until
    /// the batch's transaction ends, then a later claim takes them.
    ///
    /// The budget is applied here rather than in the claim's SQL: a running
    /// sum over the claimed rows there made every claim take half as long
    /// again on the server, for ordinary batches it never cuts. This way
    /// costs only a claim it cuts, whose server still sends the rows past
    /// the budget (with payloads near the budget, a smaller --batch-size
    /// spares that). They are read, not left in the socket: the server would
    /// wait to send them, the claim still running, until statement_timeout
    /// cancelled it and the batch with it.
    /// Whether an event is due: what a follow that polls looks for between
    /// its claims. One statement, outside any transaction, locking
    /// nothing: a third of the round trips of a claim that finds nothing
    /// (BEGIN, the claim, COMMIT). It sees the rows another run holds and
    /// the events an ordered claim would hold back; the follow allows for
    /// that (relay::follow).
    pub(crate) fn any_due(&mut self, client: &mut Client) -> Result<bool> {
        if self.due.is_none() {
            self.due = Some(prepare(
                client,
                &due_sql(&self.table.quoted()),
                &self.table,
            )?);
        }
        let due = self.due.as_ref().expect("prepared above");
        client
            .query_opt(due, &[&self.max_attempts])
            .map(|row| row.is_some())
            .map_err(|error| classify_on_table(&error, "looking for due events", &self.table))
    }

    pub fn claim(
        &mut self,
        client: &mut Client,
        limit: i64,
        start: &Start,
        bytes: i64,
    ) -> Result<Vec<Event>> {
        if let (Order::Plain, Start::Id(_), None) = (self.order, start, &self.claim_from) {
            let selected = selected(&self.columns, self.payload);
            let sql = claim_sql(&self.table.quoted(), &selected, true);
            self.claim_from = Some(prepare(client, &sql, &self.table)?);
        }
        // The head of a by-key claim: '' sorts before any other key.
        let first_key = String::new();
        let (statement, start): (&Statement, Option<&(dyn ToSql + Sync)>) =
            match (self.order, start, &self.claim_from) {
                (Order::Plain, Start::Id(id), Some(claim_from)) => (claim_from, Some(id)),
                (Order::ByKey, Start::AfterKey(key), _) => (&self.claim, Some(key)),
                (Order::ByKey, _, _) => (&self.claim, Some(&first_key)),
                (Order::Plain | Order::Strict, _, _) => (&self.claim, None),
            };
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&self.max_attempts, &limit];
        params.extend(start);
        let failed = |error| classify_on_table(&error, "claiming a batch", &self.table);
        let mut rows = client.query_raw(statement, params).map_err(failed)?;
        let (mut events, mut held, mut dropped) = (Vec::new(), 0, 0);
        while let Some(row) = rows.next().map_err(failed)? {
            if held >= bytes {
                dropped += 1;
                continue;
            }
            let event = self.event(&row)?;
            held += i64::try_from(event.payload.len()).unwrap_or(i64::MAX);
            events.push(event);
        }
        // Every row is read: the connection is free for other statements.
        drop(rows);
        if dropped > 0 {
            log::info!(
                "the batch holds {} events, {held} payload bytes (--batch-bytes); the {dropped} \
                 claimed after them wait for a later batch",
                events.len()
            );
        }
        self.claimed = Created::of(&events);
        if !events.is_empty() {
            self.prepare_marks(client)?;
        }
        Ok(events)
    }

    /// The SELECT casts every column to the type read here, so no value of
    /// one row can fail to decode but a NULL where the table should forbid
    /// one (or text that is not UTF-8, in a database that does not check
    /// it). Such a row fails alone, with last_error saying which column,
    /// rather than stopping every run on the table; only an unreadable id,
    /// the primary key, leaves nothing to mark it by.
    fn event(&self, row: &postgres::Row) -> Result<Event> {
        let id = row.try_get(0).map_err(|error| {
            exit::config(anyhow!(
                "reading the id of a claimed row of table {}: {error}; the id must be the \
                 bigint primary key `outbox-poll migrate` creates",
                self.table
            ))
        })?;
        let mut unreadable = None;
        let mut text = |index: usize, column: &str| -> String {
            match row.try_get::<_, Option<String>>(index) {
                Ok(Some(text)) => text,
                Ok(None) => {
                    unreadable
                        .get_or_insert(format!("{column} is NULL: this event cannot be sent"));
                    String::new()
                }
                Err(error) => {
                    unreadable.get_or_insert(format!("{column} cannot be read: {error}"));
                    String::new()
                }
            }
        };
        let (event_id, event_type) = (text(1, "event_id"), text(2, "event_type"));
        let payload = match self.payload {
            Payload::Bytea => match row.try_get::<_, Option<Vec<u8>>>(3) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => {
                    unreadable.get_or_insert("payload is NULL: this event cannot be sent".into());
                    Vec::new()
                }
                Err(error) => {
                    unreadable.get_or_insert(format!("payload cannot be read: {error}"));
                    Vec::new()
                }
            },
            _ => text(3, "payload").into_bytes(),
        };
        let created_at = row.try_get(4).unwrap_or_else(|error| {
            unreadable.get_or_insert(format!("created_at cannot be read: {error}"));
            None
        });
        let attempts = row.try_get(5).unwrap_or_else(|error| {
            unreadable.get_or_insert(format!("attempts cannot be read: {error}"));
            0
        });
        // The optional columns follow the fixed six, in this order, each
        // only where the table has it (see `selected`).
        let columns = &self.columns;
        let mut next = Optional {
            row,
            index: 6,
            unreadable: &mut unreadable,
        };
        let headers = next.read(columns.headers, "headers");
        let routing_key = next.read(columns.routing_key, "routing_key");
        let ordering_key = next.read(columns.ordering_key, "ordering_key");
        let exchange = next.read(columns.exchange, "exchange");
        let content_type = next.read(columns.content_type, "content_type");
        let content_encoding = next.read(columns.content_encoding, "content_encoding");
        let correlation_id = next.read(columns.correlation_id, "correlation_id");
        let priority = next.read(columns.priority, "priority");
        let expires_in = next.read(columns.expires_at, "expires_at");
        Ok(Event {
            id,
            event_id,
            event_type,
            payload,
            payload_type: self.payload,
            created_at,
            attempts,
            unreadable,
            headers,
            routing_key,
            ordering_key,
            exchange,
            content_type,
            content_encoding,
            correlation_id,
            priority,
            expires_in,
            traceparent: None,
        })
    }

    /// Whether this transaction may claim. In --ordered mode it takes the
    /// table's lock for the transaction if it is free, and goes ahead only
    /// then; plain runs need no lock and always go ahead.
    ///
    /// A transaction-level advisory lock rather than a session one: it is
    /// released by the same COMMIT or ROLLBACK that releases the row locks,
    /// and by the server if the connection dies, so it can never leak.
    ///
    /// Both ordered modes also read pg_stat_activity here, before the
    /// claim's snapshot is taken: a transaction reads it once, as of its
    /// first look, so the claim's HORIZON sees the other databases'
    /// transactions as they were before its snapshot. One that ended in
    /// between is then not in the snapshot at all, where seen after the
    /// snapshot it would not be known as another database's and would
    /// hold the claim back for nothing.
    pub(crate) fn before_claim(&self, client: &mut Client) -> Result<bool> {
        let Some(statement) = &self.before_claim else {
            return Ok(true);
        };
        let table = self.table.quoted();
        let params: &[&(dyn ToSql + Sync)] = match self.order {
            Order::Strict => &[&table],
            Order::ByKey | Order::Plain => &[],
        };
        let row = client.query_one(statement, params).map_err(|error| {
            classify_on_table(&error, "preparing an ordered claim", &self.table)
        })?;
        Ok(row.get(0))
    }

    /// Marks the broker-confirmed events of the last claim published (with
    /// --on-publish delete: deletes them), in one statement.
    pub fn mark_published(&self, client: &mut Client, ids: &[i64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids: &(dyn ToSql + Sync) = &ids;
        client
            .execute(&self.marks()?.published, &self.with_created(vec![ids]))
            .map_err(|error| classify_on_table(&error, "marking events published", &self.table))?;
        Ok(())
    }

    /// Counts a failed attempt against each event of the last claim, in
    /// one statement.
    pub(crate) fn mark_failed(
        &self,
        client: &mut Client,
        failures: &[(i64, String)],
    ) -> Result<()> {
        if failures.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = failures.iter().map(|(id, _)| *id).collect();
        let errors: Vec<&str> = failures.iter().map(|(_, error)| error.as_str()).collect();
        let (base, cap) = (BACKOFF_BASE.as_secs_f64(), BACKOFF_CAP.as_secs_f64());
        let params: Vec<&(dyn ToSql + Sync)> = vec![&ids, &errors, &base, &cap];
        client
            .execute(&self.marks()?.failed, &self.with_created(params))
            .map_err(|error| classify_on_table(&error, "recording failed attempts", &self.table))?;
        Ok(())
    }

    /// Backs off each event of the last claim the broker nacked, in one
    /// statement, recording `reason` but counting no attempt: a nack is the
    /// broker declining for now, not a failure of the event's own.
    pub(crate) fn mark_declined(
        &self,
        client: &mut Client,
        ids: &[i64],
        reason: &str,
    ) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let wait = NACK_BACKOFF.as_secs_f64();
        let params: Vec<&(dyn ToSql + Sync)> = vec![&ids, &reason, &wait];
        client
            .execute(&self.marks()?.declined, &self.with_created(params))
            .map_err(|error| classify_on_table(&error, "recording nacked events", &self.table))?;
        Ok(())
    }

    /// Records that each of these events of the last claim expired before
    /// it could be published: no attempt counted, never claimed again
    /// (see `mark_expired_sql`).
    pub(crate) fn mark_expired(&self, client: &mut Client, ids: &[i64]) -> Result<()> {
        let Some(statement) = (!ids.is_empty())
            .then(|| self.marks())
            .transpose()?
            .and_then(|marks| marks.expired.as_ref())
        else {
            return Ok(());
        };
        let ids: &(dyn ToSql + Sync) = &ids;
        client
            .execute(statement, &self.with_created(vec![ids]))
            .map_err(|error| classify_on_table(&error, "recording expired events", &self.table))?;
        Ok(())
    }

    /// A mark's parameters, followed on a table partitioned by created_at
    /// by the last claim's created_at range.
    fn with_created<'p>(
        &'p self,
        mut params: Vec<&'p (dyn ToSql + Sync)>,
    ) -> Vec<&'p (dyn ToSql + Sync)> {
        if self.by_created_at {
            params.push(&self.claimed.from);
            params.push(&self.claimed.to);
        }
        params
    }
}

/// The optional columns of one claimed row, read in turn.
struct Optional<'r> {
    row: &'r postgres::Row,
    /// The next column's position.
    index: usize,
    /// Why the row cannot be sent: the first column that cannot be read.
    unreadable: &'r mut Option<String>,
}

impl Optional<'_> {
    /// The next column, if the table has it (`present`): None for a NULL,
    /// or when it cannot be read (the row then fails, saying which).
    fn read<'a, T: postgres::types::FromSql<'a>>(
        &mut self,
        present: bool,
        column: &str,
    ) -> Option<T>
    where
        Self: 'a,
    {
        if !present {
            return None;
        }
        self.index += 1;
        self.row.try_get(self.index - 1).unwrap_or_else(|error| {
            self.unreadable
                .get_or_insert(format!("{column} cannot be read: {error}"));
            None
        })
    }
}

/// Cast to the types the code reads, so a table of the reference article
/// with `id serial` or `attempts bigint` works instead of failing to decode,
/// and so that no value of one row can make the claim itself fail. The
/// timestamp is read as a float8 of seconds since the epoch, which holds
/// what `extract` gives for an infinite created_at (plus or minus
/// Infinity, where a bigint cast would fail the whole claim) and the
/// microseconds of every timestamp within about 280 years of 1970, so an
/// event's wait is measured in milliseconds; the AMQP timestamp floors it
/// to whole seconds (message.rs).
/// A bytea payload is read as it is, its raw bytes; the others as text.
const SELECTED: &str = "id::bigint, event_id::text, event_type::text, payload::text, \
     extract(epoch FROM created_at)::float8, attempts::bigint";
const SELECTED_BYTEA: &str = "id::bigint, event_id::text, event_type::text, payload, \
     extract(epoch FROM created_at)::float8, attempts::bigint";

/// What the error of a statement that cannot be prepared says was going on.
const PREPARING: &str = "preparing the queries";

/// Prepares `sql`, in the table's column names (`sql::names`); a missing
/// column or table names the command that fixes it.
fn prepare(client: &mut Client, sql: &str, table: &TableName) -> Result<Statement> {
    client
        .prepare(&names::sql(sql))
        .map_err(|error| classify_on_table(&error, PREPARING, table))
}

/// The claim's select list: the fixed six, then the optional columns the
/// table has, in the order `Outbox::event` reads them. expires_at is read
/// as the seconds left, by the server's clock (as float8, which holds
/// `infinity`), when the claim runs.
fn selected(columns: &Columns, payload: Payload) -> String {
    let mut list = match payload {
        Payload::Bytea => SELECTED_BYTEA,
        _ => SELECTED,
    }
    .to_string();
    for (present, column) in [
        (columns.headers, ", headers::text"),
        (columns.routing_key, ", routing_key::text"),
        (columns.ordering_key, ", ordering_key::text"),
        (columns.exchange, ", exchange::text"),
        (columns.content_type, ", content_type::text"),
        (columns.content_encoding, ", content_encoding::text"),
        (columns.correlation_id, ", correlation_id::text"),
        (columns.priority, ", priority::int"),
        (
            columns.expires_at,
            ", (extract(epoch FROM expires_at) - extract(epoch FROM clock_timestamp()))::float8",
        ),
    ] {
        if present {
            list.push_str(column);
        }
    }
    list
}

/// From the head of the table (`from` false), the claim has no range on
/// id: a single run, and a drain now and then, claims from the start of
/// the pending index. With `from`, `id >= $3` lets a drain start where its
/// last claim ended: the pending index then begins at the next unclaimed
/// row instead of walking past every row the drain has marked (vacuum has
/// not removed their entries yet) and every row its other batches in
/// flight hold.
///
/// Why two statements rather than `id >= $3` with the lowest id from the
/// head: a range predicate whose value lies outside the column's histogram
/// makes the planner read the primary key's actual end
/// (get_actual_variable_range), and right after a prune of millions of
/// rows, before a vacuum, that end is millions of dead entries: 32 to 50
/// ms of planning for every claim, over a second for the first. The claim
/// from the head has no range to estimate. The claim from an id has one,
/// but the relay plans it generically (plan_cache_mode, set by
/// `relay::session`), and a plan built without the parameter's value has
/// nothing to probe with.
fn claim_sql(table: &str, selected: &str, from: bool) -> String {
    let range = if from { "AND id >= $3::bigint " } else { "" };
    format!(
        "SELECT {selected} FROM {table} \
         WHERE published_at IS NULL AND attempts < $1::int AND available_at <= now() \
           {range}\
         ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED"
    )
}

/// The first due row, read as the plain claim reads it (the pending index
/// in id order; an EXISTS could be planned as a scan of the whole table),
/// without its lock.
fn due_sql(table: &str) -> String {
    format!(
        "SELECT id FROM {table} \
         WHERE published_at IS NULL AND attempts < $1::int AND available_at <= now() \
         ORDER BY id LIMIT 1"
    )
}

/// The oldest transaction of this database that was still running when
/// the statement's snapshot was taken (the snapshot's xmax when none was).
/// The snapshot's running xids are the whole server's; those that
/// pg_stat_activity shows in another database are left out, since they
/// cannot insert into this table. One that pg_stat_activity does not show
/// (it had not started when the transaction first looked, or it is a
/// prepared transaction) counts: the snapshot did not see what it wrote.
/// Any role may read pg_stat_activity's xids and databases.
pub(crate) const HORIZON: &str = "(SELECT coalesce(min(running), pg_snapshot_xmax(pg_current_snapshot())) \
     FROM pg_snapshot_xip(pg_current_snapshot()) AS running \
     WHERE xid(running) NOT IN (SELECT backend_xid FROM pg_stat_activity \
       WHERE backend_xid IS NOT NULL AND datname <> current_database()))";

/// Whether every transaction that could still insert a row sorting before
/// this one (in (producer_xid, id) order) has ended. Rows with a smaller
/// xid were inserted by transactions that have all ended once that xid is
/// below the horizon; rows with the same xid were inserted by the same,
/// committed, transaction; and a transaction still to come gets a larger
/// xid. Plain id order could not be made safe so: ids are taken at
/// insert, so a transaction that got its xid after a committed one may
/// still hold a lower id.
fn settled() -> String {
    format!("producer_xid < {HORIZON}")
}

/// --ordered, over the first $2 pending rows in (producer_xid, id) order
/// (read from the two order indexes, rows without a key and rows with one,
/// merged): the rows before the first that is still backing
/// off or may yet be preceded by a row not committed. Dead rows are not
/// pending, which is how a poison event stops blocking the table. It waits
/// for (rather than skips) a row another transaction holds.
fn ordered_claim_sql(table: &str, selected: &str, live: &str) -> String {
    let pending = |half: &str| {
        format!(
            "(SELECT id, producer_xid, available_at FROM {table} \
              WHERE {half} AND published_at IS NULL AND attempts < $1::int{live} \
              ORDER BY producer_xid, id LIMIT $2)"
        )
    };
    let (unkeyed, keyed) = (
        pending("ordering_key IS NULL"),
        pending("ordering_key IS NOT NULL"),
    );
    let settled = settled();
    format!(
        "SELECT {selected} FROM {table} \
         WHERE published_at IS NULL AND attempts < $1::int AND available_at <= now() \
           AND id = ANY (ARRAY( \
             SELECT id FROM ( \
               SELECT id, bool_and(available_at <= now() AND {settled}) \
                        OVER (ORDER BY producer_xid, id) AS clear \
               FROM ({unkeyed} UNION ALL {keyed}) AS pending \
               ORDER BY producer_xid, id LIMIT $2) AS head \
             WHERE clear)) \
         ORDER BY producer_xid, id FOR UPDATE"
    )
}

/// --ordered-by-key: the first pending event of each key (a skip scan over
/// the key index, one step per key, taken only as far as the batch
/// needs), claimable when it is due, settled, and not held by another
/// transaction (a batch in flight, another run), so a batch holds at most
/// one event of a key, and a key whose first event is backing off or held
/// yields nothing. Each first event is looked up and locked on its own (a
/// LATERAL subquery, which the planner cannot turn into a join that reads
/// the whole table). Dead events are not pending and block nothing. The scan
/// starts after the key $3 (the last one the drain claimed: the keys right
/// after it are those its batches in flight do not hold) and then goes on
/// from the first key up to $3, so it covers every key. Then, for the rest
/// of the batch, events without a key, as a plain claim takes them.
fn by_key_claim_sql(table: &str, selected: &str, live: &str) -> String {
    let heads = |name: &str, range: &str| {
        format!(
            "{name}(head_key, head_id) AS ( \
                 (SELECT ordering_key, id FROM {table} \
                  WHERE {range} AND published_at IS NULL AND attempts < $1::int{live} \
                  ORDER BY ordering_key, producer_xid, id LIMIT 1) \
               UNION ALL \
                 SELECT next.ordering_key, next.id FROM {name}, LATERAL ( \
                   SELECT ordering_key, id FROM {table} \
                   WHERE {range} AND ordering_key > {name}.head_key \
                     AND published_at IS NULL AND attempts < $1::int{live} \
                   ORDER BY ordering_key, producer_xid, id LIMIT 1) AS next)"
        )
    };
    let after = heads("after", "ordering_key > $3::text");
    let up_to = heads("up_to", "ordering_key <= $3::text");
    let settled = settled();
    format!(
        "WITH RECURSIVE {after}, {up_to}, \
         keyed AS ( \
             SELECT claimed.* \
             FROM (SELECT * FROM after UNION ALL SELECT * FROM up_to) AS heads, LATERAL ( \
               SELECT {selected} FROM {table} \
               WHERE id = heads.head_id AND published_at IS NULL AND attempts < $1::int \
                 AND available_at <= now() AND {settled} \
               FOR UPDATE SKIP LOCKED) AS claimed \
             LIMIT $2), \
         unkeyed AS ( \
             SELECT {selected} FROM {table} \
             WHERE ordering_key IS NULL AND published_at IS NULL AND attempts < $1::int \
               AND available_at <= now() \
             ORDER BY producer_xid, id LIMIT $2 - (SELECT count(*) FROM keyed) \
             FOR UPDATE SKIP LOCKED) \
         SELECT * FROM keyed UNION ALL SELECT * FROM unkeyed"
    )
}

/// What else an event must be to hold back the events after it in the
/// ordered modes, on a table with expires_at: not expired, unless it is
/// due (a due expired event is claimed, to be marked expired, and holds
/// nothing back: it is never published). An expired event backing off, or
/// already marked expired, is left out, as dead events are.
fn pending(columns: &Columns) -> &'static str {
    match columns.expires_at {
        true => " AND (expires_at IS NULL OR expires_at > now() OR available_at <= now())",
        false => "",
    }
}

/// On a table partitioned by created_at, the condition that confines a
/// mark to the claimed events' partitions: `first` and `first + 1` are the
/// numbers of the parameters holding the range (see Created).
fn created_range(alias: &str, by_created_at: bool, first: u8) -> String {
    match by_created_at {
        true => format!(
            " AND {alias}created_at >= to_timestamp(${first}::float8) \
             AND {alias}created_at <= to_timestamp(${}::float8)",
            first + 1
        ),
        false => String::new(),
    }
}

fn mark_published_sql(table: &str, by_created_at: bool) -> String {
    let range = created_range("", by_created_at, 2);
    format!("UPDATE {table} SET published_at = now() WHERE id = ANY($1::bigint[]){range}")
}

/// --on-publish delete: the row goes in the batch's transaction. A delete
/// writes no new row version and no index entry, where the mark writes
/// both (it cannot be a HOT update: published_at is in the pending index's
/// predicate).
fn delete_published_sql(table: &str, by_created_at: bool) -> String {
    let range = created_range("", by_created_at, 2);
    format!("DELETE FROM {table} WHERE id = ANY($1::bigint[]){range}")
}

/// The backoff counts from the failure, clock_timestamp(), not from now(),
/// which is the start of the transaction: a batch that took longer to
/// publish than the first backoff step would otherwise commit a retry time
/// already in the past.
fn mark_failed_sql(table: &str, by_created_at: bool) -> String {
    let range = created_range("o.", by_created_at, 5);
    format!(
        "UPDATE {table} AS o SET attempts = o.attempts + 1, last_error = f.error, \
           available_at = clock_timestamp() + make_interval(secs => \
             least($4::float8, $3::float8 * power(2, least(o.attempts, 30))) \
             * {JITTER_SQL}) \
         FROM unnest($1::bigint[], $2::text[]) AS f(id, error) \
         WHERE o.id = f.id{range}"
    )
}

/// As mark_failed_sql, but the attempts are left alone and the wait is
/// NACK_BACKOFF ($3 seconds) times the jitter.
fn mark_declined_sql(table: &str, by_created_at: bool) -> String {
    let range = created_range("", by_created_at, 4);
    format!(
        "UPDATE {table} SET last_error = $2::text, \
           available_at = clock_timestamp() + make_interval(secs => $3::float8 * {JITTER_SQL}) \
         WHERE id = ANY($1::bigint[]){range}"
    )
}

/// An event past expires_at is never published: last_error says so, no
/// attempt is counted, and available_at = infinity keeps every claim off
/// it (status counts it as expired; `requeue` makes it eligible again,
/// and the next run that meets it marks it again if it is still past).
fn mark_expired_sql(table: &str, by_created_at: bool) -> String {
    let range = created_range("", by_created_at, 2);
    format!(
        "UPDATE {table} SET last_error = 'expired', available_at = 'infinity' \
         WHERE id = ANY($1::bigint[]){range}"
    )
}

/// The --ordered lock, keyed by the table's oid, so two tables never share
/// a lock and two spellings of one table always do; and the first look at
/// pg_stat_activity (see `Outbox::before_claim`).
const LOCK_AND_SEE_SESSIONS_SQL: &str = "SELECT pg_try_advisory_xact_lock(2052318419, $1::text::regclass::oid::int), \
       (SELECT count(*) FROM pg_stat_activity)";

/// --ordered-by-key takes no lock; the first look at pg_stat_activity only.
pub(crate) const SEE_SESSIONS_SQL: &str = "SELECT true, (SELECT count(*) FROM pg_stat_activity)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_claim_from_an_id_has_a_range_on_id() {
        let selected = selected(&Columns::default(), Payload::Jsonb);
        assert!(!claim_sql("t", &selected, false).contains("id >="));
        assert!(claim_sql("t", &selected, true).contains("AND id >= $3::bigint "));
        assert!(!ordered_claim_sql("t", &selected, "").contains("id >="));
    }

    #[test]
    fn marks_on_a_table_partitioned_by_created_at_carry_the_batchs_range() {
        assert!(!mark_published_sql("t", false).contains("created_at"));
        assert!(mark_published_sql("t", true).ends_with(
            "WHERE id = ANY($1::bigint[]) AND created_at >= to_timestamp($2::float8) \
             AND created_at <= to_timestamp($3::float8)"
        ));
        assert!(delete_published_sql("t", true).contains("AND created_at <= to_timestamp($3"));
        assert!(
            mark_declined_sql("t", true).ends_with("AND created_at <= to_timestamp($5::float8)")
        );
        assert!(mark_failed_sql("t", true).ends_with(
            "WHERE o.id = f.id AND o.created_at >= to_timestamp($5::float8) \
             AND o.created_at <= to_timestamp($6::float8)"
        ));
    }

    #[test]
    fn a_batchs_range_holds_every_second_its_events_were_created_in() {
        let event = |created_at| Event {
            created_at,
            ..Event::default()
        };
        assert_eq!(
            Created::of(&[event(Some(20.7)), event(Some(10.5)), event(Some(15.0))]),
            Created {
                from: 9.0,
                to: 22.0
            }
        );
        assert_eq!(
            Created::of(&[event(Some(10.0)), event(Some(f64::INFINITY))]),
            Created {
                from: 9.0,
                to: f64::INFINITY
            }
        );
        assert_eq!(Created::of(&[]), Created::ALL);
    }

    #[test]
    fn a_table_without_the_optional_columns_is_sent_the_claim_it_always_was() {
        let selected = selected(&Columns::default(), Payload::Jsonb);
        let sql = claim_sql(r#""app"."outbox""#, &selected, true);
        assert_eq!(
            sql,
            "SELECT id::bigint, event_id::text, event_type::text, payload::text, \
             extract(epoch FROM created_at)::float8, attempts::bigint \
             FROM \"app\".\"outbox\" \
             WHERE published_at IS NULL AND attempts < $1::int AND available_at <= now() \
               AND id >= $3::bigint \
             ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED"
        );
    }

    #[test]
    fn the_optional_columns_follow_the_fixed_six_in_the_order_they_are_read() {
        let all = Columns {
            headers: true,
            routing_key: true,
            ordering_key: true,
            producer_xid: true,
            exchange: true,
            content_type: true,
            content_encoding: true,
            correlation_id: true,
            priority: true,
            expires_at: true,
        };
        let list = selected(&all, Payload::Jsonb);
        assert!(
            list.contains(
                "attempts::bigint, headers::text, routing_key::text, ordering_key::text, \
                 exchange::text, content_type::text, content_encoding::text, \
                 correlation_id::text, priority::int, (extract(epoch FROM expires_at)"
            ),
            "{list}"
        );
    }

    #[test]
    fn a_bytea_payload_is_selected_as_its_raw_bytes_and_the_rest_as_text() {
        for (payload, expected) in [
            (Payload::Bytea, "event_type::text, payload, extract"),
            (Payload::Json, "event_type::text, payload::text, extract"),
            (Payload::Text, "event_type::text, payload::text, extract"),
        ] {
            let list = selected(&Columns::default(), payload);
            assert!(list.contains(expected), "{payload:?}: {list}");
        }
    }

    #[test]
    fn only_a_table_with_expires_at_has_expired_events_left_out_of_the_ordered_heads() {
        let with = Columns {
            expires_at: true,
            ..Columns::default()
        };
        assert_eq!(pending(&Columns::default()), "");
        let live = pending(&with);
        assert!(ordered_claim_sql("t", "id", live).contains("expires_at > now()"));
        let by_key = by_key_claim_sql("t", "id", live);
        assert_eq!(by_key.matches("expires_at > now()").count(), 4, "{by_key}");
        assert!(!by_key_claim_sql("t", "id", "").contains("expires_at"));
    }
}
