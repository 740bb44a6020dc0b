//! `--table` as a list: names and shell-style patterns (`*`, `?`,
//! `[...]`) over schema-qualified names, turned into what the catalog
//! query matches. A pattern becomes an anchored POSIX regular expression
//! with everything but its wildcards escaped, so no text of the operator's
//! is ever read as SQL or as a regular expression of its own.

use crate::sql::table::TableName;

/// One entry of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A name, found in the search path when it has no schema, as today.
    Name(TableName),
    /// A pattern: over schemas (None: those of the search path) and names.
    Pattern {
        schema: Option<String>,
        name: String,
    },
}

/// Whether `--table` names more than one plain table (a list, or a
/// pattern): such a run resolves its outboxes from the catalog.
pub(crate) fn is_many(spec: &str) -> bool {
    split_list(spec).len() > 1 || has_wildcard(spec)
}

/// Parses the list; a bad entry is named in the error.
pub(crate) fn parse(spec: &str) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    for item in split_list(spec) {
        let item = item.trim();
        let entry = match has_wildcard(item) {
            false => Entry::Name(
                TableName::parse(item)
                    .map_err(|why| format!("invalid table name {item:?}: {why}"))?,
            ),
            true => pattern(item)?,
        };
        if !entries.contains(&entry) {
            entries.push(entry);
        }
    }
    if entries.is_empty() {
        return Err("--table lists no table".into());
    }
    Ok(entries)
}

/// The list's items: split at commas outside double quotes.
fn split_list(spec: &str) -> Vec<&str> {
    let (mut items, mut start, mut quoted) = (Vec::new(), 0, false);
    for (at, c) in spec.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                items.push(&spec[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    items.push(&spec[start..]);
    items
}

/// A wildcard outside double quotes.
fn has_wildcard(text: &str) -> bool {
    let mut quoted = false;
    text.chars().any(|c| {
        if c == '"' {
            quoted = !quoted;
        }
        !quoted && matches!(c, '*' | '?' | '[')
    })
}

fn pattern(item: &str) -> Result<Entry, String> {
    if item.contains('"') {
        return Err(format!(
            "{item:?}: a pattern cannot hold double quotes; list such tables by name"
        ));
    }
    let parts: Vec<&str> = item.split('.').collect();
    let regex = |part: &str| {
        glob_regex(&part.to_ascii_lowercase()).map_err(|why| format!("pattern {item:?}: {why}"))
    };
    match parts.as_slice() {
        [name] => Ok(Entry::Pattern {
            schema: None,
            name: regex(name)?,
        }),
        [schema, name] => Ok(Entry::Pattern {
            schema: Some(regex(schema)?),
            name: regex(name)?,
        }),
        _ => Err(format!(
            "pattern {item:?}: use `table` or `schema.table`, not more parts"
        )),
    }
}

/// A shell pattern as an anchored regular expression: `*` any run of
/// characters, `?` one, `[...]` one of a set (`[!...]` or `[^...]` none
/// of it); every other character stands for itself. Parts fold to lower
/// case, as PostgreSQL folds unquoted identifiers.
pub(crate) fn glob_regex(glob: &str) -> Result<String, String> {
    if glob.is_empty() {
        return Err("an empty part".into());
    }
    let mut regex = String::from("^");
    let mut chars = glob.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => regex.push_str(".*"),
            '?' => regex.push('.'),
            '[' => {
                regex.push('[');
                if matches!(chars.peek(), Some('!' | '^')) {
                    chars.next();
                    regex.push('^');
                }
                let mut closed = false;
                let mut first = true;
                for c in chars.by_ref() {
                    match c {
                        ']' if !first => {
                            closed = true;
                            break;
                        }
                        // Inside a bracket expression only these mean
                        // anything to a POSIX regex; a backslash is taken
                        // literally by the shell's sets too.
                        '\\' | '[' | ']' => {
                            regex.push('\\');
                            regex.push(c);
                        }
                        c => regex.push(c),
                    }
                    first = false;
                }
                if !closed {
                    return Err("a [ set is not closed".into());
                }
                regex.push(']');
            }
            c if c.is_ascii_alphanumeric() || c == '_' => regex.push(c),
            c => {
                regex.push('\\');
                regex.push(c);
            }
        }
    }
    regex.push('$');
    Ok(regex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_plain_name_is_not_many_but_a_list_or_a_pattern_is() {
        assert!(!is_many("app.outbox"));
        assert!(!is_many(r#""a,b".outbox"#));
        assert!(is_many("a.outbox,b.outbox"));
        assert!(is_many("tenant_*.outbox"));
        assert!(!is_many(r#""t*".outbox"#));
    }

    #[test]
    fn shell_wildcards_become_an_anchored_regex_and_the_rest_is_literal() {
        assert_eq!(glob_regex("tenant_*").unwrap(), "^tenant_.*$");
        assert_eq!(glob_regex("t?").unwrap(), "^t.$");
        assert_eq!(glob_regex("t[0-9]").unwrap(), "^t[0-9]$");
        assert_eq!(glob_regex("t[!ab]").unwrap(), "^t[^ab]$");
        assert_eq!(glob_regex("a$b").unwrap(), "^a\\$b$");
        assert!(glob_regex("t[ab").is_err());
    }

    #[test]
    fn a_list_holds_names_and_patterns_once_each() {
        let entries = parse("outbox, tenant_*.Outbox ,outbox").unwrap();
        assert_eq!(
            entries,
            [
                Entry::Name(TableName::parse("outbox").unwrap()),
                Entry::Pattern {
                    schema: Some("^tenant_.*$".into()),
                    name: "^outbox$".into()
                }
            ]
        );
        assert!(parse("a.b.c*").is_err());
        assert!(parse("bad name,x*").is_err());
    }
}
