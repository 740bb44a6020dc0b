//! `migrate --adopt`: what an existing table, created by its producers
//! rather than by the migrations, lacks to be served (see the README's
//! "Adopting an existing table").
//!
//! Only what is missing is added, and nothing of the producers' is ever
//! dropped, retyped or rewritten: the claim order (a bigint identity
//! column) when the table has no integer column for it, created_at when
//! it has none, the relay's own bookkeeping columns, producer_xid and
//! ordering_key for the ordered modes, and the relay's indexes. Every
//! column but the identity is added with a constant default or none, a
//! catalog-only change since PostgreSQL 11; filling an identity column
//! gives every existing row its value, so that one rewrites the table.
//!
//! The statements are written in the roles' names and follow --column
//! through `Names::rewrite`, as the relay's own do; the table's name
//! enters only quoted.

use anyhow::{Result, anyhow};

use crate::exit;
use crate::sql::columns::{Catalog, PRODUCERS, misfit};
use crate::sql::migrations::object_name;
use crate::sql::names::{ADOPTED_ID, Names, ROLES};
use crate::sql::table::{TableName, quote};

/// The table as adopt reads it: its columns, primary key and indexes.
pub(crate) struct Found {
    pub(crate) catalog: Catalog,
    /// The primary key's columns, in no particular order.
    pub(crate) primary_key: Vec<String>,
    /// The names of the table's indexes.
    pub(crate) indexes: Vec<String>,
}

/// The primary key and the indexes of the table named by $1 (the columns
/// come from `Catalog::of`).
pub(crate) const KEYS_SQL: &str = "SELECT \
       ARRAY(SELECT a.attname::text FROM pg_constraint c \
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey) \
             WHERE c.conrelid = to_regclass($1) AND c.contype = 'p'), \
       ARRAY(SELECT i.relname::text FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
             WHERE x.indrelid = to_regclass($1))";

/// What adopt will do: its statements, in order, and whether one of them
/// rewrites the table (the identity column).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) statements: Vec<String>,
    pub(crate) rewrites: bool,
}

/// The relay's own columns, by role, with how each is added: nullable, or
/// with a constant default (now() is the time of the migration for the
/// rows already there, and of each insert after).
const OWN: [(&str, &str); 6] = [
    ("created_at", "timestamptz NOT NULL DEFAULT now()"),
    ("published_at", "timestamptz"),
    ("attempts", "integer NOT NULL DEFAULT 0"),
    ("last_error", "text"),
    ("available_at", "timestamptz NOT NULL DEFAULT now()"),
    ("ordering_key", "text"),
];

/// The relay's indexes, as migrations 0002 and 0003 create them, by the
/// same names, so that a table adopted and then served never gets a
/// second copy of one.
const INDEXES: [(&str, &str); 4] = [
    ("pending_idx", "(id) WHERE published_at IS NULL"),
    (
        "unkeyed_order_idx",
        "(producer_xid, id) WHERE published_at IS NULL AND ordering_key IS NULL",
    ),
    (
        "keyed_order_idx",
        "(producer_xid, id) WHERE published_at IS NULL AND ordering_key IS NOT NULL",
    ),
    (
        "key_order_idx",
        "(ordering_key, producer_xid, id) WHERE published_at IS NULL \
         AND ordering_key IS NOT NULL",
    ),
];

/// What `table` lacks. Refuses (78) a table that does not exist, a
/// producers' column (event_id, event_type, payload, or an optional one
/// --column names) that is missing, and a column whose type cannot play
/// its role: adopt never changes a column that is there.
pub(crate) fn plan(table: &TableName, names: &Names, found: &Found) -> Result<Plan> {
    let catalog = &found.catalog;
    if catalog.columns.is_empty() {
        return Err(exit::config(anyhow!(
            "adopting table {table}: there is no such table; create it first, or run \
             `outbox-poll migrate` without --adopt to create an outbox-poll table"
        )));
    }
    let added: Vec<&str> = OWN.iter().map(|(role, _)| *role).collect();
    for role in ROLES {
        let column = names.column(role);
        match catalog.type_of(column) {
            Some(type_name) => {
                if let Some(expected) = misfit(role, type_name) {
                    let fix = match role {
                        "id" => format!(
                            "map the role it plays (e.g. --column event_id={column}), and adopt \
                             adds the bigint identity column {ADOPTED_ID}"
                        ),
                        _ => format!("map {role} to another column with --column {role}=NAME"),
                    };
                    return Err(exit::config(anyhow!(
                        "adopting table {table}: the column {column} is of type {type_name}, \
                         which cannot play {role} ({expected}); {fix}"
                    )));
                }
            }
            None if PRODUCERS.contains(&role)
                || (role != "id"
                    && !added.contains(&role)
                    && names.given().iter().any(|(given, _)| *given == role)) =>
            {
                return Err(exit::config(anyhow!(
                    "adopting table {table}: the column {column}, which plays {role}, does not \
                     exist; name the table's column for it with --column {role}=NAME (adopt \
                     adds only the relay's own columns)"
                )));
            }
            None => {}
        }
    }
    let quoted = table.quoted();
    let mut plan = Plan::default();
    let mut columns = Vec::new();
    let id = names.column("id");
    if catalog.type_of(id).is_none() {
        if let [key] = found.primary_key.as_slice()
            && catalog
                .type_of(key)
                .is_some_and(|t| misfit("id", t).is_none())
        {
            return Err(exit::config(anyhow!(
                "adopting table {table}: its integer primary key {key} gives the claim order; \
                 add --column id={key}"
            )));
        }
        columns.push(format!(
            "ADD COLUMN {} bigint GENERATED ALWAYS AS IDENTITY",
            quote(id)
        ));
        plan.rewrites = true;
    }
    for (role, definition) in OWN {
        let column = names.column(role);
        if catalog.type_of(column).is_none() {
            columns.push(format!("ADD COLUMN {} {definition}", quote(column)));
        }
    }
    // As in migration 0003: the constant default first (rows already there
    // are committed, the oldest), then the default for the rows to come.
    let producer_xid = catalog.type_of("producer_xid").is_none();
    if producer_xid {
        columns.push("ADD COLUMN producer_xid xid8 NOT NULL DEFAULT '0'".into());
    }
    if !columns.is_empty() {
        plan.statements
            .push(format!("ALTER TABLE {quoted} {}", columns.join(", ")));
    }
    if producer_xid {
        plan.statements.push(format!(
            "ALTER TABLE {quoted} ALTER COLUMN producer_xid SET DEFAULT pg_current_xact_id()"
        ));
    }
    // The marks and prune find rows by the claim order: an identity column
    // added here needs the unique index that a primary key would have.
    let unique = plan
        .rewrites
        .then_some(("UNIQUE INDEX", "claim_order_key", "(id)"));
    let indexes = INDEXES
        .iter()
        .map(|(suffix, definition)| ("INDEX", *suffix, *definition));
    for (kind, suffix, definition) in unique.into_iter().chain(indexes) {
        let name = object_name(table.name(), suffix);
        // Looked up rather than IF NOT EXISTS: CREATE INDEX locks the table
        // against inserts before it finds the index already there.
        if found.indexes.contains(&name) {
            continue;
        }
        let sql = format!("CREATE {kind} {} ON {quoted} {definition}", quote(&name));
        plan.statements.push(names.rewrite(&sql).into_owned());
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn debezium() -> Found {
        let columns = [
            ("id", "uuid"),
            ("aggregatetype", "character varying"),
            ("aggregateid", "character varying"),
            ("type", "character varying"),
            ("payload", "jsonb"),
        ];
        Found {
            catalog: Catalog {
                columns: columns
                    .iter()
                    .map(|(name, t)| (name.to_string(), t.to_string()))
                    .collect(),
            },
            primary_key: vec!["id".into()],
            indexes: vec!["outbox_pkey".into()],
        }
    }

    #[test]
    fn debeziums_table_gets_an_identity_and_the_relays_columns_and_indexes() {
        let names = Names::parse("event_id=id,event_type=type,routing_key=aggregatetype").unwrap();
        let table = TableName::parse("app.outbox").unwrap();
        let plan = plan(&table, &names, &debezium()).unwrap();
        assert!(plan.rewrites);
        assert_eq!(
            plan.statements[0],
            "ALTER TABLE \"app\".\"outbox\" \
             ADD COLUMN \"outbox_seq\" bigint GENERATED ALWAYS AS IDENTITY, \
             ADD COLUMN \"created_at\" timestamptz NOT NULL DEFAULT now(), \
             ADD COLUMN \"published_at\" timestamptz, \
             ADD COLUMN \"attempts\" integer NOT NULL DEFAULT 0, \
             ADD COLUMN \"last_error\" text, \
             ADD COLUMN \"available_at\" timestamptz NOT NULL DEFAULT now(), \
             ADD COLUMN \"ordering_key\" text, \
             ADD COLUMN producer_xid xid8 NOT NULL DEFAULT '0'"
        );
        assert_eq!(
            plan.statements[2],
            "CREATE UNIQUE INDEX \"outbox_claim_order_key\" ON \"app\".\"outbox\" (\"outbox_seq\")"
        );
        assert_eq!(
            plan.statements[3],
            "CREATE INDEX \"outbox_pending_idx\" ON \"app\".\"outbox\" (\"outbox_seq\") \
             WHERE published_at IS NULL"
        );
        assert_eq!(plan.statements.len(), 7);
    }

    #[test]
    fn a_uuid_id_without_a_mapping_is_refused_with_the_mapping_to_use() {
        let table = TableName::parse("outbox").unwrap();
        let error = plan(&table, &Names::default(), &debezium()).unwrap_err();
        assert!(
            format!("{error}").contains(
                "the column id is of type uuid, which cannot play id (an integer, the claim \
                 order); map the role it plays (e.g. --column event_id=id)"
            ),
            "{error}"
        );
    }
}
