//! The outboxes a run serves: every table `--table` names or matches, in
//! every database of `--databases` (or the one of `--database-url`), less
//! those of other shards. Resolved from the catalog at every run, so a
//! tenant created between two runs is served by the next one.
//!
//! Per database the plan costs one catalog statement, which also says
//! which tables have no page at all (never written to, or truncated to
//! nothing by vacuum), and one statement per DUE_CHUNK of the others
//! asking which have a due event: an empty run over a thousand tenants
//! prepares nothing and claims nothing. Only the tables with due events
//! get sessions, statements and claims.

pub(crate) mod pattern;

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, anyhow};
use postgres::Client;

use crate::cli::{DatabaseArgs, Shard};
use crate::config::Database;
use crate::connect::conninfo::{self, Account, ConnInfo, SystemFiles};
use crate::connect::database::{self};
use crate::connect::libpq::Env;
use crate::connect::pg_error::classify;
use crate::connect::secrets;
use crate::exit;
use crate::plan::pattern::Entry;
use crate::sql::names;
use crate::sql::table::TableName;

/// Tables asked about in one statement. Each is opened (and locked
/// against DDL) by the statement's planning, with its indexes: a thousand
/// at once would crowd PostgreSQL's shared lock table
/// (max_locks_per_transaction); a hundred costs a few milliseconds.
const DUE_CHUNK: usize = 100;

/// One database to serve, as a `--databases` line (or `--database-url`)
/// resolved.
#[derive(Debug, Clone)]
pub(crate) struct Server {
    pub(crate) conninfo: ConnInfo,
    /// `host:port/dbname`, never a password: what messages and the JSON
    /// summary call it, and what the shard hash reads.
    pub(crate) label: String,
}

/// What a run over many outboxes selects.
#[derive(Debug, Clone)]
pub struct Selection {
    pub(crate) servers: Vec<Server>,
    pub(crate) entries: Vec<Entry>,
    /// `--table` as given, for messages.
    pub(crate) spec: String,
    pub(crate) shard: Option<Shard>,
    pub(crate) max_connections: usize,
    pub(crate) max_attempts: i32,
    pub connect_timeout: Duration,
}

/// One outbox of the plan.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    /// Its database and its table, for the sessions that serve it.
    pub(crate) database: Database,
    /// Which of the selection's servers.
    pub(crate) server: usize,
    pub(crate) label: String,
    /// Whether the plan saw a due event in it (or could not tell).
    pub(crate) due: bool,
}

/// A database the plan could not read: its outboxes are unknown.
#[derive(Debug)]
pub(crate) struct Unread {
    pub(crate) label: String,
    /// The table, when the database was read but a listed name is not in
    /// it; None when the database itself could not be read.
    pub(crate) table: Option<String>,
    /// That listed table, as `migrate` would create it, with the index of
    /// its database among the selection's servers.
    pub(crate) missing: Option<(usize, TableName)>,
    pub(crate) error: anyhow::Error,
}

/// Every outbox of the selection in this shard, and the databases that
/// could not be read; `clients` holds the sessions the plan opened, for
/// the run to go on with.
pub struct Plan {
    pub(crate) outboxes: Vec<Planned>,
    pub(crate) unread: Vec<Unread>,
    pub(crate) clients: Vec<(usize, Client)>,
}

impl Selection {
    /// The selection of a run over many outboxes, or None when the run
    /// serves one table in one database as it always did (one plain name,
    /// no `--databases`, no `--shard`).
    pub fn from_args(args: &DatabaseArgs, env: Env) -> Result<Option<Selection>> {
        if !pattern::is_many(&args.table) && args.databases.is_none() && args.shard.is_none() {
            return Ok(None);
        }
        let entries = pattern::parse(&args.table).map_err(|why| exit::config(anyhow!(why)))?;
        let from_file = secrets::read(&secrets::DATABASE)?;
        let url = from_file.as_deref().or(args.database_url.as_deref());
        let servers = match &args.databases {
            None => vec![server(url, env, "the database URL")?],
            Some(path) => servers_of_file(path, url, env)?,
        };
        Ok(Some(Selection {
            servers,
            entries,
            spec: args.table.clone(),
            shard: args.shard,
            max_connections: args.max_connections as usize,
            max_attempts: args.max_attempts,
            connect_timeout: args.connect_timeout,
        }))
    }

    /// The longest connect over every database (see Database::connect_budget).
    pub fn connect_budget(&self) -> Duration {
        self.servers
            .iter()
            .map(|server| database::connect_budget(&server.conninfo, self.connect_timeout))
            .max()
            .unwrap_or_default()
    }

    /// The most hosts any database lists.
    pub fn most_hosts(&self) -> usize {
        let hosts = self.servers.iter().map(|s| s.conninfo.targets.len());
        hosts.max().unwrap_or(1)
    }

    /// The outbox `table` of server `index`, as a Database.
    pub(crate) fn database(&self, index: usize, table: TableName) -> Database {
        Database {
            conninfo: self.servers[index].conninfo.clone(),
            table,
            max_attempts: self.max_attempts,
            connect_timeout: self.connect_timeout,
        }
    }

    /// Resolves the selection in every database and, when `due` is asked
    /// for, which outboxes have a due event. The databases are read in
    /// waves of --max-connections at once, each on a thread and a session
    /// of its own: a run over many databases waits for the slowest of a
    /// wave, not for the sum of them all. The last wave's sessions are kept
    /// in `clients` for the run; earlier waves' are closed before the next
    /// one opens its own, so no more than --max-connections are ever open.
    /// `connect` opens them (the relay's sessions plan generically, on
    /// indexes, and bound their transactions for a batch).
    pub(crate) fn plan(
        &self,
        due: bool,
        connect: &(dyn Fn(&ConnInfo) -> Result<Client> + Sync),
    ) -> Result<Plan> {
        let mut plan = Plan {
            outboxes: Vec::new(),
            unread: Vec::new(),
            clients: Vec::new(),
        };
        let mut matched = 0;
        let width = self.max_connections.max(1);
        let waves = self.servers.len().div_ceil(width);
        for (wave, servers) in self.servers.chunks(width).enumerate() {
            let reads: Vec<Result<Read>> = std::thread::scope(|scope| {
                let threads: Vec<_> = servers
                    .iter()
                    .map(|server| scope.spawn(move || self.read(server, due, connect)))
                    .collect();
                threads
                    .into_iter()
                    .map(|thread| {
                        thread.join().unwrap_or_else(|_| {
                            Err(anyhow!("reading the catalog failed unexpectedly"))
                        })
                    })
                    .collect()
            });
            for (at, read) in reads.into_iter().enumerate() {
                let index = wave * width + at;
                let server = &self.servers[index];
                let read = match read {
                    Ok(read) => read,
                    Err(error) => {
                        plan.unread.push(Unread {
                            label: server.label.clone(),
                            table: None,
                            missing: None,
                            error,
                        });
                        continue;
                    }
                };
                matched += read.matched;
                for name in read.missing {
                    let error = exit::config(anyhow!(
                        "table {name} does not exist (it is listed in --table): run \
                         `outbox-poll migrate --table {name}`, or take it out of the list"
                    ));
                    plan.unread.push(Unread {
                        label: server.label.clone(),
                        table: Some(name.to_string()),
                        missing: Some((index, name)),
                        error,
                    });
                }
                for (table, due) in read.tables.into_iter().zip(read.due) {
                    plan.outboxes.push(Planned {
                        database: self.database(index, table),
                        server: index,
                        label: server.label.clone(),
                        due,
                    });
                }
                if wave + 1 == waves {
                    plan.clients.push((index, read.client));
                }
            }
        }
        if matched == 0 && plan.unread.is_empty() {
            return Err(exit::config(anyhow!(
                "--table {:?} matches no table in {}: check the names and patterns (a pattern \
                 matches the schema-qualified names of tables that exist, e.g. \
                 'tenant_*.outbox'); to create a table, name it: `outbox-poll migrate --table \
                 tenant_new.outbox`",
                self.spec,
                self.databases_text()
            )));
        }
        Ok(plan)
    }

    /// One database's part of the plan: its catalog read, the tables of
    /// this shard, and which have a due event (or, without `due`, all).
    fn read(
        &self,
        server: &Server,
        due: bool,
        connect: &(dyn Fn(&ConnInfo) -> Result<Client> + Sync),
    ) -> Result<Read> {
        let mut client = connect(&server.conninfo)?;
        let (tables, missing) = resolve(&mut client, &self.entries)?;
        let matched = tables.len() + missing.len();
        let (tables, empty): (Vec<TableName>, Vec<bool>) = tables
            .into_iter()
            .filter(|(table, _)| self.in_shard(&server.label, table))
            .unzip();
        // A listed table that is missing belongs to a shard as it will once
        // it exists: only that shard's run reports it (or creates it).
        let missing = missing
            .into_iter()
            .filter(|table| self.in_shard(&server.label, table))
            .collect();
        let due = match due {
            true => due_unless_empty(&mut client, &tables, &empty, self.max_attempts),
            false => vec![true; tables.len()],
        };
        Ok(Read {
            client,
            tables,
            due,
            missing,
            matched,
        })
    }

    fn databases_text(&self) -> String {
        match self.servers.as_slice() {
            [one] => one.label.clone(),
            all => format!("any of the {} databases", all.len()),
        }
    }

    /// Whether this run's shard holds the outbox.
    fn in_shard(&self, label: &str, table: &TableName) -> bool {
        self.shard
            .is_none_or(|shard| shard_of(label, table, shard.count) == shard.index)
    }
}

/// The shard an outbox falls in: FNV-1a (64 bits) of
/// `host:port/dbname/schema.table`, modulo the count. Written out rather
/// than std's hasher, whose seed changes with every process: every run,
/// on every machine and every build, must put an outbox in the same shard.
pub(crate) fn shard_of(label: &str, table: &TableName, count: u32) -> u32 {
    let key = format!("{label}/{table}");
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % u64::from(count)) as u32
}

/// `host:port/dbname` (every host of a list, comma-separated).
pub(crate) fn label(info: &ConnInfo) -> String {
    let hosts: Vec<String> = info.targets.iter().map(ToString::to_string).collect();
    format!("{}/{}", hosts.join(","), info.dbname)
}

/// One connection string resolved as `--database-url` is.
fn server(text: Option<&str>, env: Env, place: &str) -> Result<Server> {
    let account = Account::current(&SystemFiles);
    let conninfo = conninfo::resolve(text, env, &SystemFiles, account.as_ref())
        .map_err(|error| exit::config(error.context(format!("reading {place}"))))?;
    for warning in &conninfo.warnings {
        log::warn!("{warning}");
    }
    Ok(Server {
        label: label(&conninfo),
        conninfo,
    })
}

/// The databases of a `--databases` file: one connection string per
/// line, `#` comments and blank lines ignored. What a line leaves out
/// comes from `--database-url` (as if its keywords were the PG*
/// variables), then the variables themselves.
fn servers_of_file(path: &Path, url: Option<&str>, env: Env) -> Result<Vec<Server>> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        exit::config(anyhow!(
            "cannot read the databases file {} (--databases): {error}",
            path.display()
        ))
    })?;
    let defaults = match url {
        Some(url) => conninfo::as_variables(url)
            .map_err(|error| exit::config(error.context("reading the database URL")))?,
        None => Vec::new(),
    };
    let env = |name: &str| {
        defaults
            .iter()
            .find(|(var, _)| *var == name)
            .map(|(_, value)| value.clone())
            .or_else(|| env(name))
    };
    let mut servers = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let place = format!("{}, line {}", path.display(), number + 1);
        servers.push(server(Some(line), &env, &place)?);
    }
    if servers.is_empty() {
        return Err(exit::config(anyhow!(
            "the databases file {} lists no database: put one connection string per line",
            path.display()
        )));
    }
    Ok(servers)
}

/// What the plan read of one database.
struct Read {
    client: Client,
    tables: Vec<TableName>,
    due: Vec<bool>,
    /// Listed names that are not there, qualified as `migrate` would
    /// create them.
    missing: Vec<TableName>,
    /// Tables named or matched, in every shard.
    matched: usize,
}

/// A table of the catalog, and whether it has no page at all.
type Found = (TableName, bool);

/// The tables the entries name or match in this database, each once, in
/// the catalog's order, each with whether it has no page at all: tables
/// and partitioned tables (never one partition alone), outside the system
/// schemas. A name without a schema
/// is found in the search path (to_regclass); a pattern without one
/// matches in the search path's schemas. A listed name that is not there
/// is returned apart: it is not a pattern, and the operator asked for it.
/// Without a schema it is qualified with the one a CREATE TABLE would
/// put it in (current_schema()), so that it hashes to the shard it will
/// be in once it exists.
fn resolve(client: &mut Client, entries: &[Entry]) -> Result<(Vec<Found>, Vec<TableName>)> {
    let mut names = Vec::new();
    let (mut schemas, mut tables) = (Vec::new(), Vec::new());
    for entry in entries {
        match entry {
            Entry::Name(table) => names.push(table.quoted()),
            Entry::Pattern { schema, name } => {
                schemas.push(schema.clone());
                tables.push(name.clone());
            }
        }
    }
    let rows = read_catalog(client, &names, &schemas, &tables).map_err(|error| {
        classify(
            &error,
            "reading the catalog for --table",
            "check that PostgreSQL is reachable and this role may read the catalog",
        )
    })?;
    let (mut found, mut missing): (Vec<Found>, Vec<TableName>) = (Vec::new(), Vec::new());
    for row in rows {
        let (schema, name): (Option<String>, Option<String>) = (row.get(0), row.get(1));
        match (schema, name) {
            (Some(schema), Some(name)) => {
                let table = TableName::from_catalog(schema, name);
                if !found.iter().any(|(seen, _)| *seen == table) {
                    found.push((table, row.get::<_, Option<bool>>(3).unwrap_or(false)));
                }
            }
            _ => {
                let quoted = row.get::<_, Option<String>>(2).unwrap_or_default();
                let listed = entries.iter().find_map(|entry| match entry {
                    Entry::Name(table) if table.quoted() == quoted => Some(table),
                    _ => None,
                });
                let Some(listed) = listed else { continue };
                let current: Option<String> = row.get(4);
                missing.push(match (listed.schema(), current) {
                    (None, Some(schema)) => {
                        TableName::from_catalog(schema, listed.name().to_string())
                    }
                    _ => listed.clone(),
                });
            }
        }
    }
    Ok((found, missing))
}

/// The catalog's rows for `names` and for the patterns (`schemas` and
/// `tables` side by side), found as the parts below say.
///
/// The patterns' part reads all of pg_class, so it is planned with
/// sequential scans allowed. The relay's sessions plan with
/// `enable_seqscan = off` (see relay::session), right for the statements
/// that find a batch's rows by index, wrong for this one: through
/// pg_class's indexes an empty run over 1,000 tenant schemas took 340 ms
/// instead of 48 (the lookup alone 176 ms). That costs two round trips
/// more, and the session's own setting comes back whatever the lookup's
/// outcome. A list of names alone (`--databases` with `--table outbox`,
/// the usual shape of a database per tenant) looks each up by oid, the
/// same plan either way: it needs neither the setting nor the patterns'
/// part, which together cost about 0.5 ms of a database's 1.6 ms lookup
/// in a session just opened, its catalog caches cold (pgbench -C).
fn read_catalog(
    client: &mut Client,
    names: &[String],
    schemas: &[Option<String>],
    tables: &[String],
) -> std::result::Result<Vec<postgres::Row>, postgres::Error> {
    if schemas.is_empty() {
        return client.query(&format!("{NAMES_SQL} {ORDER_SQL}"), &[&names]);
    }
    let sql = format!("{PATTERNS_SQL} UNION ALL {NAMES_SQL} {ORDER_SQL}");
    client.batch_execute("SET enable_seqscan = on")?;
    let rows = client.query(&sql, &[&names, &schemas, &tables]);
    let reset = client.batch_execute("RESET enable_seqscan");
    let rows = rows?;
    reset?;
    Ok(rows)
}

/// The catalog lookup of `--table`'s list, in parts (see read_catalog):
/// the rows of the names and those of what the patterns match, in order
/// of schema and name, names not found first; the fourth column: whether
/// the table has no page at all; the fifth, for a listed name, the schema
/// it would be created in. A table with no page holds no row, not even
/// one a transaction still in progress wrote (its insert extends the file
/// first), so it has no due event: its claim is not asked.
/// pg_relation_size takes and releases each table's lock in turn, so a
/// thousand tables never crowd the lock table. A partitioned table has no
/// pages of its own: never counted as empty.
const PATTERNS_SQL: &str = "\
    SELECT n.nspname::text, c.relname::text, NULL::text, \
           c.relkind = 'r' AND pg_relation_size(c.oid) = 0, NULL::text FROM pg_class c \
      JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition \
       AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
       AND n.nspname NOT LIKE 'pg\\_%' \
       AND EXISTS (SELECT 1 FROM unnest($2::text[], $3::text[]) AS p(s, t) \
                    WHERE c.relname ~ p.t \
                      AND CASE WHEN p.s IS NULL THEN n.nspname = ANY (current_schemas(false)) \
                               ELSE n.nspname ~ p.s END)";
const NAMES_SQL: &str = "\
    SELECT n.nspname::text, c.relname::text, x.name, \
           c.relkind = 'r' AND pg_relation_size(c.oid) = 0, current_schema()::text \
      FROM unnest($1::text[]) \
             WITH ORDINALITY AS x(name, at) \
      LEFT JOIN pg_class c ON c.oid = to_regclass(x.name) \
      LEFT JOIN pg_namespace n ON n.oid = c.relnamespace";
const ORDER_SQL: &str = "ORDER BY 1 NULLS FIRST, 2";

/// Which of `tables` have a due event, those `empty` has no page asked
/// nothing (the lookup's fourth column, see PATTERNS_SQL and NAMES_SQL).
fn due_unless_empty(
    client: &mut Client,
    tables: &[TableName],
    empty: &[bool],
    max_attempts: i32,
) -> Vec<bool> {
    let asked: Vec<TableName> = tables
        .iter()
        .zip(empty)
        .filter(|(_, empty)| !**empty)
        .map(|(table, _)| table.clone())
        .collect();
    let mut answers = due_tables(client, &asked, max_attempts).into_iter();
    empty
        .iter()
        .map(|empty| !empty && answers.next().unwrap_or(true))
        .collect()
}

/// Which of `tables` have a due event, DUE_CHUNK tables a statement: one
/// branch per table, each reading the first due row as the claim reads it
/// (the pending index in id order). A statement that fails (a table the
/// role may not read, one without the relay's columns) is asked again
/// table by table, and a table that still fails counts as due: its own
/// claim then reports what is wrong with it, and only it.
pub(crate) fn due_tables(
    client: &mut Client,
    tables: &[TableName],
    max_attempts: i32,
) -> Vec<bool> {
    let mut due = vec![false; tables.len()];
    for (chunk, names) in tables.chunks(DUE_CHUNK).enumerate() {
        let first = chunk * DUE_CHUNK;
        match any_due(client, names, max_attempts) {
            Ok(found) => found.into_iter().for_each(|at| due[first + at] = true),
            Err(_) => {
                for (at, table) in names.iter().enumerate() {
                    let one = any_due(client, std::slice::from_ref(table), max_attempts);
                    due[first + at] = one.map_or(true, |found| !found.is_empty());
                }
            }
        }
    }
    due
}

/// The positions, among `tables`, of those with a due event.
fn any_due(
    client: &mut Client,
    tables: &[TableName],
    max_attempts: i32,
) -> std::result::Result<Vec<usize>, postgres::Error> {
    let branches: Vec<String> = tables
        .iter()
        .enumerate()
        .map(|(at, table)| {
            format!(
                "(SELECT {at} FROM (SELECT id FROM {} WHERE published_at IS NULL \
                   AND attempts < $1::int AND available_at <= now() ORDER BY id LIMIT 1) AS d)",
                table.quoted()
            )
        })
        .collect();
    let rows = client.query(
        &*names::sql(&branches.join(" UNION ALL ")),
        &[&max_attempts],
    )?;
    Ok(rows
        .iter()
        .map(|row| row.get::<_, i32>(0) as usize)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shard_hash_is_fnv1a_of_database_and_table_and_never_changes() {
        let table = TableName::parse("tenant_a.outbox").unwrap();
        // FNV-1a 64 of "db:5432/app/tenant_a.outbox", by hand: pinned so
        // that no build ever moves an outbox to another shard.
        let key = "db:5432/app/tenant_a.outbox";
        let mut hash: u64 = 0xcbf29ce484222325;
        for byte in key.bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x100000001b3);
        }
        assert_eq!(shard_of("db:5432/app", &table, 7), (hash % 7) as u32);
        assert_eq!(shard_of("db:5432/app", &table, 1), 0);
    }

    #[test]
    fn shards_spread_many_outboxes_over_every_shard() {
        let mut counts = [0; 4];
        for n in 0..400 {
            let table = TableName::parse(&format!("tenant_{n}.outbox")).unwrap();
            counts[shard_of("db:5432/app", &table, 4) as usize] += 1;
        }
        assert!(counts.iter().all(|&count| count > 60), "{counts:?}");
    }
}
