//! The outbox table's name: parsed like PostgreSQL parses an identifier and
//! always emitted quoted, so no SQL is ever built from unchecked input.

use std::fmt;

use postgres::error::SqlState;

use crate::connect::pg_error::{READ_ONLY_ADVICE, classify, is_config_problem};
use crate::exit::classify as causes;

/// PostgreSQL truncates longer identifiers (NAMEDATALEN - 1); we refuse them
/// instead, so the name we quote is the name the server uses.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// A table name, optionally schema-qualified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    /// Parses `name` or `schema.name`. Plain parts fold to lower case, as
    /// PostgreSQL folds unquoted identifiers; `"Quoted"` parts are kept as
    /// written.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut parts = split_parts(text)?;
        let name = parts.pop().ok_or("the name is empty")?;
        let schema = parts.pop();
        if !parts.is_empty() {
            return Err("use `table` or `schema.table`, not more parts".into());
        }
        Ok(TableName { schema, name })
    }

    /// A table as the catalog names it (pg_namespace.nspname,
    /// pg_class.relname): names PostgreSQL itself holds, used in SQL only
    /// through `quoted`.
    pub(crate) fn from_catalog(schema: String, name: String) -> Self {
        TableName {
            schema: Some(schema),
            name,
        }
    }

    /// The bare table name, unquoted (used to derive index names).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The schema, unquoted, when the name has one.
    pub(crate) fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The name as SQL: every part double-quoted.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote(schema), quote(&self.name)),
            None => quote(&self.name),
        }
    }
}

/// As an operator would type it: parts quoted only where they must be, so
/// a name shown in a message can be pasted back into `--table`.
impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{}.{}", as_typed(schema), as_typed(&self.name)),
            None => f.write_str(&as_typed(&self.name)),
        }
    }
}

fn as_typed(part: &str) -> String {
    match plain_part(part) {
        Ok(folded) if folded == part => part.to_string(),
        _ => quote(part),
    }
}

/// One identifier (a column's name), parsed as a part of a table's name
/// is: plain folds to lower case, `"Quoted"` is kept as written.
pub(crate) fn identifier(text: &str) -> Result<String, String> {
    let mut parts = split_parts(text)?;
    match (parts.pop(), parts.is_empty()) {
        (Some(part), true) => Ok(part),
        _ => Err("a column's name has one part, without a dot".into()),
    }
}

/// Quotes one identifier, doubling any double quote in it as PostgreSQL
/// reads them. Parsed parts hold none; the catalog's names may.
pub(crate) fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

fn split_parts(text: &str) -> Result<Vec<String>, String> {
    let mut parts = Vec::new();
    let mut rest = text;
    loop {
        let (part, after) = match rest.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"').ok_or("a quoted part is not closed")?;
                (quoted[..end].to_string(), &quoted[end + 1..])
            }
            None => {
                let end = rest.find('.').unwrap_or(rest.len());
                (plain_part(&rest[..end])?, &rest[end..])
            }
        };
        check_length(&part)?;
        parts.push(part);
        match after.strip_prefix('.') {
            Some(next) => rest = next,
            None if after.is_empty() => return Ok(parts),
            None => return Err(format!("unexpected {after:?} after a quoted part")),
        }
    }
}

fn plain_part(part: &str) -> Result<String, String> {
    let mut chars = part.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    if first_ok && rest_ok {
        Ok(part.to_ascii_lowercase())
    } else {
        Err(format!(
            "{part:?} is not a plain identifier (letters, digits, _ and $, not starting \
             with a digit); double-quote it to use other characters"
        ))
    }
}

fn check_length(part: &str) -> Result<(), String> {
    if part.is_empty() {
        Err("an empty part".into())
    } else if part.len() > MAX_IDENTIFIER_BYTES {
        Err(format!(
            "{part:?} is longer than {MAX_IDENTIFIER_BYTES} bytes"
        ))
    } else if part.contains('\0') {
        Err("a NUL character".into())
    } else {
        Ok(())
    }
}

/// Wraps an error from a statement on the outbox table: a missing table or
/// column is named, with the command that fixes it.
pub(crate) fn classify_on_table(
    error: &postgres::Error,
    what: &str,
    table: &TableName,
) -> anyhow::Error {
    let advice = match error.code() {
        Some(&SqlState::UNDEFINED_TABLE) | Some(&SqlState::UNDEFINED_COLUMN) => {
            format!("run `outbox-poll migrate --table {table}` to create or upgrade the table")
        }
        Some(&SqlState::INVALID_SCHEMA_NAME) => {
            "create the schema first (CREATE SCHEMA ...), or name another table".into()
        }
        Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            "grant this role the privileges the README's least-privilege section lists".into()
        }
        Some(code) if causes::postgres(code.code()) == causes::Cause::Standby => {
            format!("{READ_ONLY_ADVICE}; nothing was marked")
        }
        _ if is_config_problem(error) => "check the table's definition against the README".into(),
        _ => {
            "the run changed nothing that was not committed; try again once PostgreSQL is reachable"
                .into()
        }
    };
    classify(error, &format!("{what} on table {table}"), &advice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quoted(text: &str) -> String {
        TableName::parse(text).unwrap().quoted()
    }

    #[test]
    fn plain_name_is_quoted() {
        assert_eq!(quoted("outbox"), r#""outbox""#);
    }

    #[test]
    fn schema_qualified_name_quotes_each_part() {
        assert_eq!(quoted("app.outbox"), r#""app"."outbox""#);
    }

    #[test]
    fn plain_parts_fold_to_lower_case_like_postgresql() {
        assert_eq!(quoted("App.OutBox"), r#""app"."outbox""#);
    }

    #[test]
    fn quoted_parts_keep_case_dots_and_spaces() {
        assert_eq!(quoted(r#""My App"."Out.box""#), r#""My App"."Out.box""#);
    }

    #[test]
    fn injection_attempts_are_rejected() {
        for bad in [
            "outbox; DROP TABLE users",
            "outbox--",
            "out box",
            r#"outbox" x"#,
            r#""unclosed"#,
            "1outbox",
            "",
            "a..b",
            "a.b.c",
            "ünïcode",
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn names_longer_than_postgresql_keeps_are_rejected() {
        assert!(TableName::parse(&"a".repeat(63)).is_ok());
        assert!(TableName::parse(&"a".repeat(64)).is_err());
    }

    #[test]
    fn display_quotes_only_what_needs_it_and_parses_back() {
        for text in ["app.outbox", r#""My App"."Out.box""#, r#"app."Outbox""#] {
            let table = TableName::parse(text).unwrap();
            assert_eq!(table.to_string(), text);
            assert_eq!(TableName::parse(&table.to_string()).unwrap(), table);
        }
    }

    #[test]
    fn a_catalog_name_with_a_double_quote_is_quoted_as_postgresql_reads_it() {
        let table = TableName::from_catalog("s".into(), r#"a"b"#.into());
        assert_eq!(table.quoted(), r#""s"."a""b""#);
    }

    #[test]
    fn display_is_unquoted_for_messages() {
        let table = TableName::parse("app.outbox").unwrap();
        assert_eq!(table.to_string(), "app.outbox");
        assert_eq!(table.name(), "outbox");
    }
}
