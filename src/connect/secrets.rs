//! Where the URLs' secrets may come from: `DATABASE_URL_FILE` and
//! `AMQP_URL_FILE` name a file holding the URL (the container-secrets
//! convention: a mounted Docker or Kubernetes secret), and a password given
//! on the command line, which every local user can read in the process
//! list, earns a warning.

use anyhow::{Result, anyhow};

use crate::connect::amqp_url::split_urls;
use crate::exit;

/// A URL option with its variable and its file variable.
pub(crate) struct UrlSource {
    /// The clap id of the option (its field name).
    pub(crate) id: &'static str,
    pub(crate) flag: &'static str,
    pub(crate) variable: &'static str,
    pub(crate) file_variable: &'static str,
}

pub(crate) const DATABASE: UrlSource = UrlSource {
    id: "database_url",
    flag: "--database-url",
    variable: "DATABASE_URL",
    file_variable: "DATABASE_URL_FILE",
};

pub(crate) const AMQP: UrlSource = UrlSource {
    id: "amqp_url",
    flag: "--amqp-url",
    variable: "AMQP_URL",
    file_variable: "AMQP_URL_FILE",
};

/// A variable's value, empty counting as unset (docs/src/command-line.md).
fn set(name: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(name).filter(|value| !value.is_empty())
}

/// Why the URL of `source` is given twice (exit 2), if it is: the file
/// variable with the variable, or with the flag (`flag_given`).
pub(crate) fn conflict(source: &UrlSource, flag_given: bool) -> Option<String> {
    set(source.file_variable)?;
    let UrlSource {
        flag,
        variable,
        file_variable,
        ..
    } = source;
    if flag_given {
        return Some(format!(
            "{flag} and {file_variable} both give the URL: drop one of them"
        ));
    }
    set(variable).map(|_| format!("{variable} and {file_variable} are both set: unset one of them"))
}

/// The URL in the file `source`'s file variable names, when it is set,
/// its trailing newline ignored. A file that cannot be read, or holds no
/// URL, is a configuration error (exit 78) naming the file, never its
/// content.
pub(crate) fn read(source: &UrlSource) -> Result<Option<String>> {
    let Some(path) = set(source.file_variable) else {
        return Ok(None);
    };
    let shown = std::path::Path::new(&path).display().to_string();
    let name = source.file_variable;
    let text = std::fs::read_to_string(&path).map_err(|error| {
        exit::config(anyhow!(
            "cannot read {name} {shown}: {error}: check the path and that this user may read it"
        ))
    })?;
    let url = text.strip_suffix('\n').unwrap_or(&text);
    let url = url.strip_suffix('\r').unwrap_or(url);
    if url.trim().is_empty() {
        return Err(exit::config(anyhow!(
            "{name} {shown} is empty: write the URL in it"
        )));
    }
    Ok(Some(url.to_owned()))
}

/// Whether `text` (one URL, a list of AMQP URLs, or a libpq key=value
/// string) carries a password: in a URL's user information or its
/// `password=` query parameter, or a `password` keyword.
pub(crate) fn has_password(text: &str) -> bool {
    if !text.contains("://") {
        return keyword_password(text);
    }
    split_urls(text).into_iter().any(|url| {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let in_userinfo = authority
            .rsplit_once('@')
            .and_then(|(userinfo, _)| userinfo.split_once(':'))
            .is_some_and(|(_, password)| !password.is_empty());
        let in_query = rest.split_once('?').is_some_and(|(_, query)| {
            query.split('&').any(|pair| {
                pair.strip_prefix("password=")
                    .is_some_and(|v| !v.is_empty())
            })
        });
        in_userinfo || in_query
    })
}

/// `password = x` among libpq's key=value pairs (spaces allowed around
/// the `=`, as libpq allows them).
fn keyword_password(text: &str) -> bool {
    let mut rest = text;
    while let Some(at) = rest.find("password") {
        let before = &rest[..at];
        let after = rest[at + "password".len()..].trim_start();
        if (before.is_empty() || before.ends_with(char::is_whitespace))
            && after.strip_prefix('=').is_some_and(|value| {
                let value = value.trim_start();
                !value.is_empty() && !value.starts_with("''")
            })
        {
            return true;
        }
        rest = &rest[at + 1..];
    }
    false
}

/// The one warning for the flags of `given` whose URL holds a password.
pub(crate) fn warning(given: &[&UrlSource]) -> Option<String> {
    if given.is_empty() {
        return None;
    }
    let flags: Vec<&str> = given.iter().map(|source| source.flag).collect();
    let files: Vec<&str> = given.iter().map(|source| source.file_variable).collect();
    Some(format!(
        "outbox-poll: warning: a password given with {} is visible to every local user in \
         the process list: give the URL in {} (or the environment) instead",
        flags.join(" and "),
        files.join(" and ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_found_in_urls_lists_and_keywords() {
        for text in [
            "postgresql://relay:secret@db/app",
            "postgresql://relay@db/app?password=secret",
            "host=db password=secret dbname=app",
            "host=db password = secret",
            "amqp://a@r1 amqp://u:p@r2",
        ] {
            assert!(has_password(text), "{text}");
        }
        for text in [
            "postgresql://relay@db:5432/app",
            "postgresql://db/app?sslmode=require",
            "host=db user=relay passfile=/etc/pgpass",
            "amqp://r1:5672/%2f",
            "postgresql://relay:@db/app",
        ] {
            assert!(!has_password(text), "{text}");
        }
    }
}
