//! `--column ROLE=NAME[,ROLE=NAME...]`: which of the table's columns plays
//! each role of the contract's table (see the README's "Adopting an
//! existing table").
//!
//! Every statement is written in the roles' own names (`id`, `event_id`,
//! ...), which are the columns of a table the migrations created. With a
//! mapping, `Names::rewrite` replaces each role's name in a statement by
//! the mapped column, always as a quoted identifier: so every statement,
//! the relay's and the subcommands', follows the mapping from one place,
//! and without one a statement is sent exactly as it is written (the
//! plain table pays nothing, not even a copy).
//!
//! One mapping per process: the option is global, like --table, and a run
//! over many outboxes applies it to each of them.

use std::borrow::Cow;
use std::sync::OnceLock;

use crate::sql::table::{identifier, quote};

/// Every role a column can be mapped to: the contract's table, then its
/// optional columns.
pub(crate) const ROLES: [&str; 18] = [
    "id",
    "event_id",
    "event_type",
    "payload",
    "created_at",
    "published_at",
    "attempts",
    "last_error",
    "available_at",
    "headers",
    "routing_key",
    "ordering_key",
    "exchange",
    "content_type",
    "content_encoding",
    "correlation_id",
    "priority",
    "expires_at",
];

/// The claim order's column when `id` plays another role (Debezium's
/// `id uuid`, mapped to event_id): the bigint identity column that
/// `migrate --adopt` adds.
pub(crate) const ADOPTED_ID: &str = "outbox_seq";

/// Which column plays each role.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    /// The roles --column gives, in its order.
    given: Vec<(&'static str, String)>,
    /// Every role whose column is not named as the role, with that column.
    renamed: Vec<(&'static str, String)>,
}

impl Names {
    /// Parses the option's value. Each error names the pair at fault.
    pub(crate) fn parse(text: &str) -> Result<Names, String> {
        let mut given: Vec<(&'static str, String)> = Vec::new();
        for pair in text.split(',').map(str::trim) {
            let Some((role, column)) = pair.split_once('=') else {
                return Err(format!("{pair:?} is not ROLE=NAME"));
            };
            let (role, column) = (role.trim(), column.trim());
            let Some(role) = ROLES.iter().copied().find(|known| *known == role) else {
                return Err(format!(
                    "unknown role {role:?} in {pair:?}; the roles are {}",
                    ROLES.join(", ")
                ));
            };
            if given.iter().any(|(seen, _)| *seen == role) {
                return Err(format!("the role {role} is mapped twice"));
            }
            let column =
                identifier(column).map_err(|why| format!("the column of {pair:?}: {why}"))?;
            given.push((role, column));
        }
        let mut renamed = Vec::new();
        for role in ROLES {
            let column = match given.iter().find(|(named, _)| *named == role) {
                Some((_, column)) => column.clone(),
                None => {
                    let default = match role {
                        "id" if given.iter().any(|(_, column)| column == "id") => ADOPTED_ID,
                        _ => role,
                    };
                    // A column cannot play two roles by accident: the one
                    // it was given and the one its name says.
                    if let Some((other, _)) = given.iter().find(|(_, column)| column == default) {
                        return Err(format!(
                            "the column {default} plays {other}, so the role {role} needs a \
                             column of its own: add {role}=NAME"
                        ));
                    }
                    default.to_string()
                }
            };
            if column != role {
                renamed.push((role, column));
            }
        }
        Ok(Names { given, renamed })
    }

    /// Whether every role is played by the column of its own name: the
    /// table the migrations create.
    pub(crate) fn is_plain(&self) -> bool {
        self.renamed.is_empty()
    }

    /// The roles --column names, with their columns.
    pub(crate) fn given(&self) -> &[(&'static str, String)] {
        &self.given
    }

    /// The column that plays `role`.
    pub(crate) fn column<'a>(&'a self, role: &'a str) -> &'a str {
        self.renamed
            .iter()
            .find(|(renamed, _)| *renamed == role)
            .map_or(role, |(_, column)| column)
    }

    /// `sql`, written in the roles' names, in the table's: each word that
    /// is a renamed role becomes its column, quoted. String literals,
    /// quoted identifiers (the table's own name among them), dollar-quoted
    /// bodies, parameters and comments are left as they are. A word is
    /// renamed wherever it stands, a subquery's column alias too, so a
    /// statement stays consistent with itself.
    pub(crate) fn rewrite<'a>(&self, sql: &'a str) -> Cow<'a, str> {
        if self.renamed.is_empty() {
            return Cow::Borrowed(sql);
        }
        let mut out = String::with_capacity(sql.len() + 32);
        let mut rest = sql;
        while let Some(first) = rest.chars().next() {
            let taken = match first {
                '\'' | '"' => closed_by(rest, first),
                '-' if rest.starts_with("--") => rest.find('\n').unwrap_or(rest.len()),
                '$' => dollar(rest),
                c if c.is_ascii_alphabetic() || c == '_' => {
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
                        .unwrap_or(rest.len());
                    let word = &rest[..end];
                    match self.renamed.iter().find(|(role, _)| word == *role) {
                        Some((_, column)) => out.push_str(&quote(column)),
                        None => out.push_str(word),
                    }
                    rest = &rest[end..];
                    continue;
                }
                // A number's digits, with any letters after them.
                c if c.is_ascii_digit() => rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                    .unwrap_or(rest.len()),
                c => c.len_utf8(),
            };
            out.push_str(&rest[..taken]);
            rest = &rest[taken..];
        }
        Cow::Owned(out)
    }
}

/// The length of a literal or quoted identifier opened by `quote` at the
/// start of `text` (a doubled quote inside it is two literals in a row,
/// which comes to the same).
fn closed_by(text: &str, quote: char) -> usize {
    text[1..].find(quote).map_or(text.len(), |end| end + 2)
}

/// A parameter (`$1`) or a dollar-quoted body (`$$ ... $$`, `$tag$ ... $tag$`)
/// at the start of `text`: its length.
fn dollar(text: &str) -> usize {
    let tag_end = text[1..]
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(text.len(), |end| end + 1);
    if !text[tag_end..].starts_with('$')
        || text[1..tag_end].starts_with(|c: char| c.is_ascii_digit())
    {
        return tag_end;
    }
    let tag = &text[..=tag_end];
    text[tag.len()..]
        .find(tag)
        .map_or(text.len(), |end| tag.len() + end + tag.len())
}

static NAMES: OnceLock<Names> = OnceLock::new();

/// Sets the run's mapping, once, from the command line.
pub fn set(names: Names) {
    // A second call would be a bug; the first mapping stays.
    let _ = NAMES.set(names);
}

/// The run's mapping: the plain one when --column is not given.
pub(crate) fn current() -> &'static Names {
    NAMES.get_or_init(Names::default)
}

/// `sql` in the run's mapping (see `Names::rewrite`).
pub(crate) fn sql(text: &str) -> Cow<'_, str> {
    current().rewrite(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn debezium() -> Names {
        Names::parse("event_id=id,event_type=type,routing_key=aggregatetype").unwrap()
    }

    #[test]
    fn without_a_mapping_a_statement_is_sent_as_written() {
        let sql = "SELECT id::bigint, event_id::text FROM \"s\".\"outbox\" WHERE id = $1";
        assert!(matches!(Names::default().rewrite(sql), Cow::Borrowed(s) if s == sql));
        assert!(Names::parse("event_id=event_id").unwrap().is_plain());
    }

    #[test]
    fn debeziums_mapping_takes_id_for_event_id_and_outbox_seq_for_the_order() {
        let names = debezium();
        assert_eq!(names.column("id"), "outbox_seq");
        assert_eq!(names.column("event_id"), "id");
        assert_eq!(names.column("payload"), "payload");
        assert_eq!(
            names.rewrite(
                "SELECT id::bigint, event_id::text, event_type::text, routing_key::text \
                 FROM \"s\".\"id\" AS o WHERE o.id = f.id AND last_error = 'id' $1 $$id$$"
            ),
            "SELECT \"outbox_seq\"::bigint, \"id\"::text, \"type\"::text, \
             \"aggregatetype\"::text FROM \"s\".\"id\" AS o WHERE o.\"outbox_seq\" = \
             f.\"outbox_seq\" AND last_error = 'id' $1 $$id$$"
        );
    }

    #[test]
    fn words_that_only_contain_a_role_are_left_alone() {
        let names = Names::parse("id=seq,attempts=tries").unwrap();
        assert_eq!(
            names.rewrite("SELECT head_id, ids, id2, attempts FROM t -- id\n WHERE 2id"),
            "SELECT head_id, ids, id2, \"tries\" FROM t -- id\n WHERE 2id"
        );
    }

    #[test]
    fn a_column_name_is_always_quoted_so_it_cannot_break_out() {
        let names = Names::parse(r#"event_type="Kind; DROP TABLE t""#).unwrap();
        assert_eq!(
            names.rewrite("SELECT event_type"),
            r#"SELECT "Kind; DROP TABLE t""#
        );
    }

    #[test]
    fn bad_values_name_the_pair_at_fault() {
        for (value, expected) in [
            ("event_id", "\"event_id\" is not ROLE=NAME"),
            ("evnt_id=id", "unknown role \"evnt_id\""),
            ("event_id=a,event_id=b", "the role event_id is mapped twice"),
            ("event_id=", "the column of \"event_id=\""),
            ("event_id=a.b", "the column of \"event_id=a.b\""),
            ("event_type=payload", "the column payload plays event_type"),
        ] {
            let error = Names::parse(value).unwrap_err();
            assert!(error.contains(expected), "{value}: {error}");
        }
    }
}
